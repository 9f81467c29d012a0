/* tests/tmpdir.h — a fresh temporary directory per test (Criterion .init/.fini helpers) for
 * the suites that write files. */
#ifndef NANOAMP_TESTS_TMPDIR_H
#define NANOAMP_TESTS_TMPDIR_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static inline void make_tmpdir(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/na_test_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

/* Removes dir and everything below it (read-only directories made by a test included). */
static inline void rm_rf(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            chmod(p, 0755);
            rm_rf(p);
        } else {
            unlink(p);
        }
    }
    closedir(d);
    rmdir(dir);
}
#endif
