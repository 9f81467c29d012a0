/* The training monitor: per-step loss, scale and skips, a CSV log, and health alerts. Host only:
 * it is given numbers (or reads them from a scaler when asked). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanoamp/amp.h"
#include "nanoamp/error.h"
#include "nanoamp/fp8.h"
#include "src/amp/amp_internal.h"

/* The monitor's numbers live in three f64 CPU tensors, so they are its state list as they are
 * (na_amp_monitor_state): the counters below, the skip window ([window, 2]: steps and skips per
 * record) and the scale history ([scale_drop_updates + 1]). Ring positions follow from the
 * record count, so no loaded value is ever an index. */
#define MON_COUNTER_MAP(X)                                                               \
    X(RECORDS)        /* records so far */                                               \
    X(STEPS)          /* optimizer steps they cover */                                   \
    X(SKIPPED)        /* of which skipped */                                             \
    X(EMA)            /* the loss's moving average; NaN before the first finite loss */  \
    X(RISING)         /* records in a row in which the average rose */                   \
    X(LAST_SCALE)     /* as recorded (NaN before the first) */                           \
    X(LAST_FLOOR)                                                                        \
    X(ALERTS)         /* raised by the last record */                                    \
    X(SCALER_UPDATES) /* the scaler's counters at the last record_scaler; -1: none yet */ \
    X(SCALER_SKIPPED)
enum {
#define MON_ENUM_(id) MON_##id,
    MON_COUNTER_MAP(MON_ENUM_)
#undef MON_ENUM_
    MON_COUNT
};

struct na_amp_monitor {
    na_amp_monitor_cfg cfg;
    FILE *csv;
    char *csv_path;
    int csv_errno;                         /* the first failed write's; 0: none */
    na_tensor *counters, *window, *scales; /* f64, CPU */
    double *c, *win, *sc;                  /* their data */
    const na_fp8_model *fp8;               /* its layers' scales and saturations, logged */
};

na_amp_monitor *na_amp_monitor_new(const na_amp_monitor_cfg *cfg) {
    na_amp_monitor_cfg c = cfg ? *cfg : (na_amp_monitor_cfg)NA_AMP_MONITOR_DEFAULTS;
    if (c.window < 1 || c.loss_rise_steps < 1 || !(c.skip_rate_alert >= 0) ||
        !(c.scale_drop_ratio > 0) || c.scale_drop_updates < 1 || !(c.scale_floor >= 0)) {
        na_set_error(NA_EINVAL, "na_amp_monitor_new: need window, loss_rise_steps and "
                     "scale_drop_updates >= 1, skip_rate_alert >= 0, scale_drop_ratio > 0, "
                     "scale_floor >= 0 (start from NA_AMP_MONITOR_DEFAULTS)");
        return NULL;
    }
    na_amp_monitor *m = calloc(1, sizeof *m);
    if (!m) {
        na_set_error(NA_ENOMEM, "na_amp_monitor_new: out of host memory");
        return NULL;
    }
    if (!(m->counters = na_tensor_new(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(MON_COUNT))) ||
        !(m->window = na_tensor_new(NA_DTYPE_F64, NA_DEVICE_CPU, NA_SHAPE(c.window, 2))) ||
        !(m->scales = na_tensor_new(NA_DTYPE_F64, NA_DEVICE_CPU,
                                    NA_SHAPE(c.scale_drop_updates + 1)))) {
        na_amp_monitor_free(m);
        na_set_error(na_last_status(), "na_amp_monitor_new: %s", na_last_error());
        return NULL;
    }
    m->cfg = c;
    m->c = m->counters->data, m->win = m->window->data, m->sc = m->scales->data;
    m->c[MON_EMA] = m->c[MON_LAST_SCALE] = m->c[MON_LAST_FLOOR] = NAN;
    m->c[MON_SCALER_UPDATES] = -1;
    return m;
}

void na_amp_monitor_free(na_amp_monitor *m) {
    if (!m) return;
    if (m->csv) fclose(m->csv);
    free(m->csv_path);
    na_tensor_free(m->counters);
    na_tensor_free(m->window);
    na_tensor_free(m->scales);
    free(m);
}

int na_amp_monitor_state(na_amp_monitor *m, const char *prefix, na_named_tensors *out) {
    if (!m || !out) return na_set_error(NA_EINVAL, "na_amp_monitor_state: NULL monitor or output");
    const char *pf = prefix ? prefix : "";
    int64_t n0 = out->n;
    int rc = na_named_tensors_add(out, m->counters, "%scounters", pf);
    if (!rc) rc = na_named_tensors_add(out, m->window, "%sskip_window", pf);
    if (!rc) rc = na_named_tensors_add(out, m->scales, "%sscale_history", pf);
    if (rc) na_named_tensors_truncate(out, n0);
    return rc;
}

/* A count the monitor may hold: a whole number in [lo, 2^53). */
static bool is_count(double v, double lo) {
    return v >= lo && v < 9007199254740992.0 && v == floor(v);
}

/* The counts must be counts (they place the rings): checked at every record, as the state
 * list lets anyone write them (a few hundred compares on the host). */
static int check_counts(const na_amp_monitor *m) {
    const double *c = m->c;
    bool ok = is_count(c[MON_RECORDS], 0) && is_count(c[MON_STEPS], 0) &&
              is_count(c[MON_SKIPPED], 0) && is_count(c[MON_RISING], 0) &&
              is_count(c[MON_SCALER_UPDATES], -1) && is_count(c[MON_SCALER_SKIPPED], 0);
    for (int64_t i = 0; ok && i < 2 * (int64_t)m->cfg.window; i++) ok = is_count(m->win[i], 0);
    if (!ok)
        return na_set_error(NA_EINVAL, "na_amp_monitor: the monitor's state as loaded or set "
                            "holds a count that is not a whole number >= 0");
    return NA_OK;
}

/* One line, written through; the first failure (a full disk) stops the log and is kept for
 * na_amp_monitor_csv_status. */
static void csv_line(na_amp_monitor *m, const char *fmt, ...) {
    if (!m->csv || m->csv_errno) return;
    va_list ap;
    va_start(ap, fmt);
    errno = 0;
    int n = vfprintf(m->csv, fmt, ap);
    va_end(ap);
    if (n < 0 || fflush(m->csv) != 0) m->csv_errno = errno ? errno : EIO;
}

int na_amp_monitor_csv_status(const na_amp_monitor *m) {
    if (!m || !m->csv_errno) return NA_OK;
    return na_set_error(NA_EIO, "na_amp_monitor: cannot write the CSV log '%s': %s",
                        m->csv_path, strerror(m->csv_errno));
}

/* append: after what the file holds, with the header only when it is empty (a resumed run) */
static int open_csv(const char *fn, na_amp_monitor *m, const char *path, bool append) {
    if (!m || !path) return na_set_error(NA_EINVAL, "%s: NULL argument", fn);
    char *copy = strdup(path);
    FILE *f = copy ? fopen(path, append ? "a" : "w") : NULL;
    if (!f) {
        int err = copy ? errno : ENOMEM;
        free(copy);
        return na_set_error(NA_EIO, "%s: cannot write '%s': %s", fn, path, strerror(err));
    }
    if (m->csv) fclose(m->csv);
    free(m->csv_path);
    m->csv = f, m->csv_path = copy, m->csv_errno = 0;
    if (fseek(f, 0, SEEK_END) || ftell(f) == 0) {
        csv_line(m, "step,loss,scale,skipped");
        for (int i = 0; i < na_fp8_model_layers(m->fp8); i++)
            for (int r = 0; r < NA_FP8_ROLE_COUNT; r++) {
                const char *lp, *role = na_fp8_role_name((na_fp8_role)r);
                na_fp8_model_layer(m->fp8, i, &lp);
                csv_line(m, ",fp8.%s.%s.scale,fp8.%s.%s.saturated", lp, role, lp, role);
            }
        csv_line(m, "\n");
    }
    return na_amp_monitor_csv_status(m);
}
int na_amp_monitor_open_csv(na_amp_monitor *m, const char *path) {
    return open_csv("na_amp_monitor_open_csv", m, path, false);
}
int na_amp_monitor_append_csv(na_amp_monitor *m, const char *path) {
    return open_csv("na_amp_monitor_append_csv", m, path, true);
}

/* A record covering `steps` optimizer steps of which `skips` were skipped; `floor` is the
 * lowest scale the scaler can reach. */
static unsigned record(na_amp_monitor *m, int64_t step, double loss, double scale, double floor,
                       int64_t steps, int64_t skips) {
    if (check_counts(m)) return 0; /* the message says why; nothing is recorded */
    const na_amp_monitor_cfg *cfg = &m->cfg;
    double *c = m->c;
    unsigned a = 0;
    int64_t n = (int64_t)c[MON_RECORDS]; /* this record's index */
    c[MON_RECORDS] += 1;
    c[MON_STEPS] += (double)steps;
    c[MON_SKIPPED] += (double)skips;
    double *w = &m->win[2 * (n % cfg->window)];
    w[0] = (double)steps, w[1] = (double)skips;
    if ((n + 1) * 4 >= cfg->window && na_amp_monitor_skip_rate(m) > cfg->skip_rate_alert)
        a |= NA_AMP_ALERT_SKIP_RATE;

    int span = cfg->scale_drop_updates + 1; /* the ring holds this record and span-1 before it */
    m->sc[n % span] = scale;
    if (n + 1 >= span && scale < cfg->scale_drop_ratio * m->sc[(n + 1) % span]) /* the oldest */
        a |= NA_AMP_ALERT_SCALE_COLLAPSE;
    c[MON_LAST_SCALE] = scale;
    c[MON_LAST_FLOOR] = floor;
    if (scale <= (double)(float)floor) a |= NA_AMP_ALERT_SCALE_FLOOR; /* the scale is an f32 */

    if (!isfinite(loss)) {
        a |= NA_AMP_ALERT_NONFINITE_LOSS;
    } else if (isnan(c[MON_EMA])) {
        c[MON_EMA] = loss;
    } else {
        double e = 0.9 * c[MON_EMA] + 0.1 * loss;
        c[MON_RISING] = e > c[MON_EMA] ? c[MON_RISING] + 1 : 0;
        c[MON_EMA] = e;
        if (c[MON_RISING] >= cfg->loss_rise_steps) a |= NA_AMP_ALERT_LOSS_RISING;
    }
    c[MON_ALERTS] = a;
    csv_line(m, "%lld,%.9g,%.9g,%lld", (long long)step, loss, scale, (long long)skips);
    for (int i = 0; i < na_fp8_model_layers(m->fp8); i++)
        for (int r = 0; r < NA_FP8_ROLE_COUNT; r++) {
            na_fp8_scaling *s = na_fp8_model_layer(m->fp8, i, NULL);
            csv_line(m, ",%.9g,%lld", (double)na_fp8_scaling_scale(s, (na_fp8_role)r),
                     (long long)na_fp8_scaling_saturated_total(s, (na_fp8_role)r));
        }
    csv_line(m, "\n");
    return a;
}

unsigned na_amp_monitor_record(na_amp_monitor *m, int64_t step, double loss, double scale,
                               bool skipped) {
    if (!m) return 0;
    double floor = m->cfg.scale_floor > 0 ? m->cfg.scale_floor : NA_GRAD_SCALER_FLOOR;
    return record(m, step, loss, scale, floor, 1, skipped ? 1 : 0);
}

unsigned na_amp_monitor_record_scaler(na_amp_monitor *m, int64_t step, const na_tensor *loss,
                                      const na_grad_scaler *gs) {
    if (!m) return 0;
    double l = loss ? na_item(loss) : NAN;
    na_grad_scaler_stats st;
    if (!gs || na_grad_scaler_stats_get(gs, &st)) st = (na_grad_scaler_stats){.scale = 1.0};
    int64_t steps = 1, skips = 0;
    if (gs && na_grad_scaler_is_enabled(gs) && !check_counts(m)) {
        double *c = m->c;
        if (c[MON_SCALER_UPDATES] >= 0) {
            steps = st.updates - (int64_t)c[MON_SCALER_UPDATES];
            skips = st.skipped - (int64_t)c[MON_SCALER_SKIPPED];
            if (steps < 1) steps = 1;
            if (skips < 0 || skips > steps) skips = 0; /* not the scaler it counted before */
        } else {
            steps = st.updates > 0 ? st.updates : 1;
            skips = st.skipped;
        }
        c[MON_SCALER_UPDATES] = (double)st.updates;
        c[MON_SCALER_SKIPPED] = (double)st.skipped;
    }
    return record(m, step, l, st.scale, na_grad_scaler_floor_(gs), steps, skips);
}

int64_t na_amp_monitor_steps(const na_amp_monitor *m) { return m ? (int64_t)m->c[MON_STEPS] : 0; }
int64_t na_amp_monitor_skipped(const na_amp_monitor *m) {
    return m ? (int64_t)m->c[MON_SKIPPED] : 0;
}
double na_amp_monitor_scale(const na_amp_monitor *m) { return m ? m->c[MON_LAST_SCALE] : NAN; }
unsigned na_amp_monitor_alerts(const na_amp_monitor *m) {
    return m ? (unsigned)m->c[MON_ALERTS] : 0;
}

/* Records in the skip window (at most cfg.window). */
static int window_count(const na_amp_monitor *m) {
    return m->c[MON_RECORDS] < m->cfg.window ? (int)m->c[MON_RECORDS] : m->cfg.window;
}

double na_amp_monitor_skip_rate(const na_amp_monitor *m) {
    double steps = 0, skips = 0;
    for (int i = 0; m && i < window_count(m); i++)
        steps += m->win[2 * i], skips += m->win[2 * i + 1];
    return steps > 0 ? skips / steps : 0.0;
}

const char *na_amp_monitor_describe(const na_amp_monitor *m, char *buf, size_t size) {
    if (!size) return buf;
    buf[0] = '\0';
    if (!m) return buf;
    size_t k = 0;
    const na_amp_monitor_cfg *c = &m->cfg;
#define ADD(...)                                                                              \
    do {                                                                                      \
        if (k < size) k += (size_t)snprintf(buf + k, size - k, "%s", k ? "; " : "");          \
        if (k < size) k += (size_t)snprintf(buf + k, size - k, __VA_ARGS__);                  \
    } while (0)
    unsigned alerts = na_amp_monitor_alerts(m);
    if (alerts & NA_AMP_ALERT_NONFINITE_LOSS) ADD("the loss is not finite");
    if (alerts & NA_AMP_ALERT_LOSS_RISING)
        ADD("loss rising for %.0f steps (moving average)", m->c[MON_RISING]);
    if (alerts & NA_AMP_ALERT_SKIP_RATE)
        ADD("%.0f%% of the last %d steps skipped (alert above %.0f%%)",
            100.0 * na_amp_monitor_skip_rate(m), window_count(m), 100.0 * c->skip_rate_alert);
    if (alerts & NA_AMP_ALERT_SCALE_COLLAPSE)
        ADD("loss scale %g is below %g x its value %d updates ago", m->c[MON_LAST_SCALE],
            c->scale_drop_ratio, c->scale_drop_updates);
    if (alerts & NA_AMP_ALERT_SCALE_FLOOR)
        ADD("loss scale %g is at its floor %g: the gradients overflow even there (look for "
            "inf/NaN in the data or the model)", m->c[MON_LAST_SCALE], m->c[MON_LAST_FLOOR]);
#undef ADD
    return buf;
}

int na_amp_monitor_watch_fp8(na_amp_monitor *m, const na_fp8_model *fm) {
    if (!m) return na_set_error(NA_EINVAL, "na_amp_monitor_watch_fp8: NULL monitor");
    if (m->csv)
        return na_set_error(NA_ESTATE, "na_amp_monitor_watch_fp8: the CSV log is open already "
                            "(its header names the columns): watch before opening it");
    m->fp8 = fm;
    return NA_OK;
}
