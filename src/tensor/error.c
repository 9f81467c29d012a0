/* Thread-local last-error state (see include/nanoamp/error.h). */
#include "nanoamp/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_message[1024];
static _Thread_local int last_status;

const char *na_status_str(int status) {
    switch (status) {
    case NA_OK: return "ok";
#define NA_STATUS_CASE_(name, value, text) \
    case NA_##name: return text;
        NA_STATUS_MAP(NA_STATUS_CASE_)
#undef NA_STATUS_CASE_
    default: return "unknown status";
    }
}

const char *na_last_error(void) { return last_message; }
int na_last_status(void) { return last_status; }

void na_clear_error(void) {
    last_message[0] = '\0';
    last_status = NA_OK;
}

int na_set_error(int status, const char *fmt, ...) {
    /* Format into a local buffer first: callers often pass na_last_error() as an argument to
     * wrap the previous message ("backward of mul failed: %s"), and formatting straight into
     * last_message would overwrite that argument while reading it. */
    char msg[sizeof last_message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_message, msg, sizeof msg);
    last_status = status;
    return status;
}
