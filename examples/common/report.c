/* The trainers' output: progress bar, epoch lines, the --json line (see report.h). */
#include "report.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#define BAR_MAX 40 /* a wider bar tells no more */
#define BAR_MIN 10 /* a narrower one, hardly anything */

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

/* The fields of the progress line, in the order they are dropped when it does not fit. */
enum { F_RATE, F_SCALE, F_REMAINING, F_COUNTS, F_BAR, F_ELAPSED, F_SKIPPED, F_LOSS, F_PERCENT,
       F_EPOCH, F_COUNT };

/* Appends to a line, counting what would be written past its end too. */
typedef struct {
    char *buf;
    size_t size, n;
} line_buf;

__attribute__((format(printf, 2, 3))) static void put(line_buf *l, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(l->buf + (l->n < l->size ? l->n : l->size - 1),
                      l->n < l->size ? l->size - l->n : 1, fmt, ap);
    va_end(ap);
    l->n += k > 0 ? (size_t)k : 0;
}

/* The line with the fields in `keep` (a bit per field) and a bar of `cells` cells; its length. */
static int render(const trainer_progress *p, unsigned keep, int cells, char *buf, size_t size) {
    double frac = p->steps > 0 ? (double)p->step / (double)p->steps : 1.0;
    char elapsed[32], remaining[32];
    format_time(p->elapsed_s, elapsed, sizeof elapsed);
    format_time(p->step > 0 ? p->elapsed_s / (double)p->step * (double)(p->steps - p->step) : NAN,
                remaining, sizeof remaining);
    line_buf l = {buf, size, 0};
    buf[0] = '\0';
#define HAS(f) (keep >> (f) & 1u)
    if (HAS(F_EPOCH)) put(&l, "epoch %" PRId64 "/%" PRId64, p->epoch, p->epochs);
    if (HAS(F_PERCENT)) put(&l, " %3.0f%%", 100 * frac);
    if (HAS(F_BAR)) {
        char bar[BAR_MAX + 1];
        int fill = (int)(frac * cells);
        for (int i = 0; i < cells; i++) bar[i] = i < fill ? '#' : ' ';
        bar[cells] = '\0';
        put(&l, "|%s|", bar);
    }
    if (HAS(F_COUNTS)) put(&l, " %" PRId64 "/%" PRId64, p->step, p->steps);
    const char *sep = " [";
    if (HAS(F_ELAPSED))
        put(&l, "%s%s%s%s", sep, elapsed, HAS(F_REMAINING) ? "<" : "",
            HAS(F_REMAINING) ? remaining : ""), sep = ", ";
    if (HAS(F_RATE)) put(&l, "%s%.0f img/s", sep, p->images_per_s), sep = ", ";
    if (HAS(F_LOSS)) put(&l, "%sloss %.4f", sep, p->loss), sep = ", ";
    if (HAS(F_SCALE)) put(&l, "%sscale %g", sep, p->scale), sep = ", ";
    if (HAS(F_SKIPPED)) put(&l, "%sskipped %" PRId64, sep, p->skipped), sep = ", ";
    if (sep[0] == ',') put(&l, "]");
#undef HAS
    return (int)l.n;
}

/* The fields that fit in width - 1 columns, dropped in enum order, with the widest bar that
 * still fits (a bar narrower than BAR_MIN is dropped as a field). */
static char *layout(const trainer_progress *p, int width, bool bar, char *buf, size_t size) {
    if (!size) return buf;
    int fit = width - 1;
    unsigned keep = (1u << F_COUNT) - 1;
    if (!p->scaled) keep &= ~(1u << F_SCALE | 1u << F_SKIPPED);
    if (!bar) keep &= ~(1u << F_BAR);
    int len = 0;
    for (int f = 0; (len = render(p, keep, BAR_MIN, buf, size)) > fit && f < F_COUNT; f++)
        keep &= ~(1u << f);
    if (len > fit) buf[0] = '\0'; /* not even the epoch fits */
    else if (keep >> F_BAR & 1u)
        render(p, keep, BAR_MIN + (fit - len < BAR_MAX - BAR_MIN ? fit - len : BAR_MAX - BAR_MIN),
               buf, size);
    return buf;
}

char *trainer_progress_format(const trainer_progress *p, int width, char *buf, size_t size) {
    return layout(p, width, true, buf, size);
}

char *trainer_progress_plain(const trainer_progress *p, char *buf, size_t size) {
    return layout(p, TRAINER_PLAIN_WIDTH, false, buf, size);
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

void trainer_summary_print(FILE *f, const trainer_opts *o, const trainer_result *r, bool trained) {
    fprintf(f, "%s: %s on %s, test accuracy %.2f%%", o->program, o->model,
            na_device_name(o->device), 100 * r->test_acc);
    if (trained)
        fprintf(f, ", %.0f images/s, %.1f s training\n", r->images_per_s, r->train_time_s);
    else /* a resumed run with no epoch left: only evaluated */
        fprintf(f, " (nothing trained)\n");
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
            "\"diverged_at_step\": %s, \"fp8_recipe\": %s%s%s, \"fp8_format\": %s%s%s, "
            "\"saturated\": %" PRId64 "}\n",
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
            json_number(r->final_scale, "%.9g", scale, sizeof scale), diverged,
            r->fp8_recipe ? "\"" : "", r->fp8_recipe ? r->fp8_recipe : "null",
            r->fp8_recipe ? "\"" : "", r->fp8_format ? "\"" : "",
            r->fp8_format ? r->fp8_format : "null", r->fp8_format ? "\"" : "", r->saturated);
}
