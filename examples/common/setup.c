/* What the trainers do before training (see trainer_internal.h): the first images only, the
 * seed, the model, the checks that fail early, the data's per-channel statistics. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "models.h"
#include "trainer_internal.h"

/* Both data sets hold images of the shape the model takes. */
static int check_shapes(const trainer_opts *o, const trainer_job *job) {
    const int64_t *s = job->input_shape;
    const na_dataset *sets[2] = {job->train, job->test};
    for (int i = 0; i < 2; i++) {
        const na_dataset *ds = sets[i];
        if (ds->channels != s[1] || ds->height != s[2] || ds->width != s[3]) {
            fprintf(stderr, "%s: the %s images are %dx%dx%d (CxHxW) but --model %s takes "
                    "%" PRId64 "x%" PRId64 "x%" PRId64 "\n", o->program, i ? "test" : "training",
                    ds->channels, ds->height, ds->width, o->model, s[1], s[2], s[3]);
            return -1;
        }
    }
    return 0;
}

/* --save and --report must be writable: found out now by making and removing a file beside
 * the path, not after the first epoch. */
static int check_writable(const trainer_opts *o, const char *flag, const char *path) {
    struct stat st;
    if (!path) return 0;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: %s %s: is a directory (give a file name)\n", o->program, flag, path);
        return -1;
    }
    size_t len = strlen(path) + sizeof ".XXXXXX";
    char *probe = malloc(len);
    int fd = -1;
    if (probe) {
        snprintf(probe, len, "%s.XXXXXX", path);
        fd = mkstemp(probe);
    }
    if (fd < 0) {
        fprintf(stderr, "%s: %s %s: cannot write a file there: %s\n", o->program, flag, path,
                strerror(probe ? errno : ENOMEM));
    } else {
        close(fd);
        unlink(probe);
    }
    free(probe);
    return fd < 0 ? -1 : 0;
}

void trainer_channel_stats(const na_dataset *ds, float *mean, float *std) {
    int64_t plane = (int64_t)ds->height * ds->width;
    for (int c = 0; c < ds->channels; c++) {
        double s = 0, s2 = 0;
        for (int64_t i = 0; i < ds->n; i++) {
            const uint8_t *p = ds->images + (i * ds->channels + c) * plane;
            for (int64_t j = 0; j < plane; j++) {
                double v = p[j] / 255.0;
                s += v, s2 += v * v;
            }
        }
        double n = (double)ds->n * (double)plane;
        mean[c] = (float)(s / n);
        std[c] = (float)sqrt(fmax(s2 / n - (s / n) * (s / n), 1e-12));
    }
}

int trainer_setup(const trainer_opts *o, trainer_job *job) {
    if (o->limit > 0 && o->limit < job->train->n) job->train->n = o->limit;
    if (o->test_limit > 0 && o->test_limit < job->test->n) job->test->n = o->test_limit;
    if (o->threads && na_set_num_threads(o->threads)) {
        fprintf(stderr, "%s: %s\n", o->program, na_last_error());
        return -1;
    }
    na_manual_seed(o->seed);
    if (!(job->net = model_by_name(o->model, job->input_shape))) {
        fprintf(stderr, "%s: %s\n", o->program, na_last_error());
        return -1;
    }
    if (check_shapes(o, job) || check_writable(o, "--save", o->save_path) ||
        check_writable(o, "--report", o->report_path))
        return -1;
    trainer_channel_stats(job->train, job->mean, job->std);
    for (int c = 0; c < job->train->channels && !o->quiet; c++)
        if (job->std[c] <= 1e-6f) /* the floor of trainer_channel_stats */
            fprintf(stderr, "%s: warning: channel %d of the training images is constant (%g in "
                    "every pixel, std 0): nothing to learn from it; are the files right?\n",
                    o->program, c, 255.0 * job->mean[c]);
    job->batcher.mean = job->mean, job->batcher.std = job->std;
    return 0;
}

/* Ctrl-C: the step under way ends, then the run stops saying where (exit 130); a second
 * Ctrl-C ends the process at once. */
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
    interrupted = 1;
    signal(sig, SIG_DFL);
}
void trainer_catch_interrupt(void) {
    struct sigaction sa;
    if (!sigaction(SIGINT, NULL, &sa) && sa.sa_handler != SIG_IGN) signal(SIGINT, on_sigint);
}
bool trainer_interrupted(void) { return interrupted; }
