/* The trainers' output: progress bar, epoch lines, the --json line (see report.h). */
#include "report.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#define BAR_MAX 40 /* a wider bar tells no more */

/* tqdm's time: MM:SS, or H:MM:SS from an hour; "?" when unknown */
static void format_time(double s, char *buf, size_t size) {
    if (!isfinite(s) || s < 0) {
        snprintf(buf, size, "?");
        return;
    }
    long t = (long)s; /* whole seconds passed, as tqdm */
    if (t >= 3600) snprintf(buf, size, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, size, "%02ld:%02ld", t / 60, t % 60);
}

char *trainer_progress_format(const trainer_progress *p, int width, char *buf, size_t size) {
    if (!size) return buf;
    double frac = p->steps > 0 ? (double)p->step / (double)p->steps : 1.0;
    char elapsed[32], remaining[32], prefix[64], suffix[192];
    format_time(p->elapsed_s, elapsed, sizeof elapsed);
    format_time(p->step > 0 ? p->elapsed_s / (double)p->step * (double)(p->steps - p->step) : NAN,
                remaining, sizeof remaining);
    snprintf(prefix, sizeof prefix, "epoch %" PRId64 "/%" PRId64 " %3.0f%%", p->epoch, p->epochs,
             100 * frac);
    int n = snprintf(suffix, sizeof suffix, " %" PRId64 "/%" PRId64 " [%s<%s, %.0f img/s, loss %.4f",
                     p->step, p->steps, elapsed, remaining, p->images_per_s, p->loss);
    if (p->scaled && n > 0 && (size_t)n < sizeof suffix)
        n += snprintf(suffix + n, sizeof suffix - (size_t)n, ", scale %g, skipped %" PRId64,
                      p->scale, p->skipped);
    if (n > 0 && (size_t)n < sizeof suffix) snprintf(suffix + n, sizeof suffix - (size_t)n, "]");
    int room = width - 1 - (int)strlen(prefix) - (int)strlen(suffix) - 2; /* 2: the '|'s */
    int bar = room < BAR_MAX ? room : BAR_MAX;
    if (bar >= 3) {
        char cells[BAR_MAX + 1];
        int fill = (int)(frac * bar);
        for (int i = 0; i < bar; i++) cells[i] = i < fill ? '#' : ' ';
        cells[bar] = '\0';
        snprintf(buf, size, "%s|%s|%s", prefix, cells, suffix);
    } else { /* no room for a bar: the numbers, as many whole ones as fit */
        snprintf(buf, size, "%s%s", prefix, suffix);
    }
    size_t fit = width >= 1 ? (size_t)width - 1 : 0;
    if (strlen(buf) > fit && fit < size) {
        buf[fit] = '\0';
        char *comma = strrchr(buf, ',');
        if (comma) *comma = '\0'; /* never a cut number ("scale 65" of 65536) */
    }
    return buf;
}

int trainer_terminal_width(int fd) {
    struct winsize ws;
    if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
    const char *c = getenv("COLUMNS");
    long v = c ? strtol(c, NULL, 10) : 0;
    return v > 0 && v < 10000 ? (int)v : 80;
}

char *trainer_epoch_format(int64_t epoch, int64_t epochs, double train_loss, double test_loss,
                           double test_acc, double seconds, char *buf, size_t size) {
    snprintf(buf, size, "epoch %" PRId64 "/%" PRId64 ": train loss %.4f, test loss %.4f, test "
             "accuracy %.2f%%, %.1f s", epoch, epochs, train_loss, test_loss, 100 * test_acc,
             seconds);
    return buf;
}

/* a JSON number with printf format fmt, or null when v is not finite */
static const char *json_number(double v, const char *fmt, char *buf, size_t size) {
    if (!isfinite(v)) return "null";
    snprintf(buf, size, fmt, v);
    return buf;
}

void trainer_json_print(FILE *f, const trainer_opts *o, const trainer_result *r) {
    char ips[32], time_s[32], acc[32], tloss[32], loss[32], scale[32], diverged[32] = "null";
    char lr[32], wd[32];
    if (r->diverged_at_step > 0) snprintf(diverged, sizeof diverged, "%" PRId64, r->diverged_at_step);
    /* names and modes are the trainers' own words: nothing to escape */
    fprintf(f, "{\"model\": \"%s\", \"device\": \"%s\", \"amp\": \"%s\", \"epochs\": %" PRId64
            ", \"batch\": %" PRId64 ", \"threads\": %d, \"world_size\": %d, "
            "\"allreduce_dtype\": \"%s\", \"train_images_per_s\": %s, \"train_time_s\": %s, "
            "\"test_acc\": %s, \"test_loss\": %s, \"final_loss\": %s, \"params\": %" PRId64
            ", \"seed\": %" PRIu64 ", \"lr\": %s, \"weight_decay\": %s, \"amp_mode\": \"%s\", "
            "\"skipped_steps\": %" PRId64 ", \"graph_steps\": %" PRId64 ", \"channels_last\": %s, \"final_scale\": %s, "
            "\"diverged_at_step\": %s}\n",
            o->model, na_device_name(o->device), o->amp, o->epochs, o->batch, na_get_num_threads(),
            r->world_size > 1 ? r->world_size : 1, o->allreduce_dtype ? o->allreduce_dtype : "f32",
            json_number(r->images_per_s, "%.1f", ips, sizeof ips),
            json_number(r->train_time_s, "%.3f", time_s, sizeof time_s),
            json_number(r->test_acc, "%.4f", acc, sizeof acc),
            json_number(r->test_loss, "%.6f", tloss, sizeof tloss),
            json_number(r->final_loss, "%.6f", loss, sizeof loss), r->params, o->seed,
            json_number(r->lr, "%.9g", lr, sizeof lr),
            json_number(r->weight_decay, "%.9g", wd, sizeof wd), r->amp_mode, r->skipped_steps,
            r->graph_steps, o->channels_last ? "true" : "false",
            json_number(r->final_scale, "%.9g", scale, sizeof scale), diverged);
}
