/* The training monitor: per-step loss, scale and skips, a CSV log, and health alerts. Host only:
 * it is given numbers (or reads them from a scaler when asked). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanoamp/amp.h"
#include "nanoamp/error.h"
#include "src/amp/amp_internal.h"

typedef struct {
    int64_t steps, skips;
} window_entry;

struct na_amp_monitor {
    na_amp_monitor_cfg cfg;
    FILE *csv;
    int64_t records, steps, skipped;
    window_entry *win; /* the last cfg.window records */
    int win_pos, win_count;
    double *scales; /* the last cfg.scale_drop_updates + 1 scales */
    int sc_pos, sc_count;
    double ema, last_scale, last_floor;
    bool have_ema;
    int rising;
    unsigned alerts;
    bool have_ctr;
    int64_t ctr_updates, ctr_skipped; /* the scaler's counters at the last record_scaler */
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
    if (m) {
        m->cfg = c;
        m->win = calloc((size_t)c.window, sizeof *m->win);
        m->scales = calloc((size_t)c.scale_drop_updates + 1, sizeof *m->scales);
    }
    if (!m || !m->win || !m->scales) {
        na_amp_monitor_free(m);
        na_set_error(NA_ENOMEM, "na_amp_monitor_new: out of host memory");
        return NULL;
    }
    m->last_scale = NAN;
    return m;
}

void na_amp_monitor_free(na_amp_monitor *m) {
    if (!m) return;
    if (m->csv) fclose(m->csv);
    free(m->win);
    free(m->scales);
    free(m);
}

int na_amp_monitor_open_csv(na_amp_monitor *m, const char *path) {
    if (!m || !path) return na_set_error(NA_EINVAL, "na_amp_monitor_open_csv: NULL argument");
    FILE *f = fopen(path, "w");
    if (!f) return na_set_error(NA_EIO, "na_amp_monitor_open_csv: cannot write '%s'", path);
    if (m->csv) fclose(m->csv);
    m->csv = f;
    fprintf(f, "step,loss,scale,skipped\n");
    fflush(f);
    return NA_OK;
}

/* A record covering `steps` optimizer steps of which `skips` were skipped; `floor` is the
 * lowest scale the scaler can reach. */
static unsigned record(na_amp_monitor *m, int64_t step, double loss, double scale, double floor,
                       int64_t steps, int64_t skips) {
    const na_amp_monitor_cfg *c = &m->cfg;
    unsigned a = 0;
    m->records++;
    m->steps += steps;
    m->skipped += skips;
    m->win[m->win_pos] = (window_entry){steps, skips};
    m->win_pos = (m->win_pos + 1) % c->window;
    if (m->win_count < c->window) m->win_count++;
    if (m->win_count * 4 >= c->window && na_amp_monitor_skip_rate(m) > c->skip_rate_alert)
        a |= NA_AMP_ALERT_SKIP_RATE;

    int span = c->scale_drop_updates + 1; /* the ring holds this record and span-1 before it */
    m->scales[m->sc_pos] = scale;
    m->sc_pos = (m->sc_pos + 1) % span;
    if (m->sc_count < span) m->sc_count++;
    if (m->sc_count == span && scale < c->scale_drop_ratio * m->scales[m->sc_pos])
        a |= NA_AMP_ALERT_SCALE_COLLAPSE; /* sc_pos now points at the oldest */
    m->last_scale = scale;
    m->last_floor = floor;
    if (scale <= (double)(float)floor) a |= NA_AMP_ALERT_SCALE_FLOOR; /* the scale is an f32 */

    if (!isfinite(loss)) {
        a |= NA_AMP_ALERT_NONFINITE_LOSS;
    } else if (!m->have_ema) {
        m->ema = loss;
        m->have_ema = true;
    } else {
        double e = 0.9 * m->ema + 0.1 * loss;
        m->rising = e > m->ema ? m->rising + 1 : 0;
        m->ema = e;
        if (m->rising >= c->loss_rise_steps) a |= NA_AMP_ALERT_LOSS_RISING;
    }
    m->alerts = a;
    if (m->csv) {
        fprintf(m->csv, "%lld,%.9g,%.9g,%lld\n", (long long)step, loss, scale, (long long)skips);
        fflush(m->csv);
    }
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
    if (gs && na_grad_scaler_is_enabled(gs)) {
        if (m->have_ctr) {
            steps = st.updates - m->ctr_updates;
            skips = st.skipped - m->ctr_skipped;
            if (steps < 1) steps = 1;
        } else {
            steps = st.updates > 0 ? st.updates : 1;
            skips = st.skipped;
        }
        m->have_ctr = true;
        m->ctr_updates = st.updates;
        m->ctr_skipped = st.skipped;
    }
    return record(m, step, l, st.scale, na_grad_scaler_floor_(gs), steps, skips);
}

int64_t na_amp_monitor_steps(const na_amp_monitor *m) { return m ? m->steps : 0; }
int64_t na_amp_monitor_skipped(const na_amp_monitor *m) { return m ? m->skipped : 0; }
double na_amp_monitor_scale(const na_amp_monitor *m) { return m ? m->last_scale : NAN; }
unsigned na_amp_monitor_alerts(const na_amp_monitor *m) { return m ? m->alerts : 0; }

double na_amp_monitor_skip_rate(const na_amp_monitor *m) {
    if (!m || !m->win_count) return 0.0;
    int64_t steps = 0, skips = 0;
    for (int i = 0; i < m->win_count; i++) steps += m->win[i].steps, skips += m->win[i].skips;
    return steps ? (double)skips / (double)steps : 0.0;
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
    if (m->alerts & NA_AMP_ALERT_NONFINITE_LOSS) ADD("the loss is not finite");
    if (m->alerts & NA_AMP_ALERT_LOSS_RISING)
        ADD("loss rising for %d steps (moving average)", m->rising);
    if (m->alerts & NA_AMP_ALERT_SKIP_RATE)
        ADD("%.0f%% of the last %d steps skipped (alert above %.0f%%)",
            100.0 * na_amp_monitor_skip_rate(m), m->win_count, 100.0 * c->skip_rate_alert);
    if (m->alerts & NA_AMP_ALERT_SCALE_COLLAPSE)
        ADD("loss scale %g is below %g x its value %d updates ago", m->last_scale,
            c->scale_drop_ratio, c->scale_drop_updates);
    if (m->alerts & NA_AMP_ALERT_SCALE_FLOOR)
        ADD("loss scale %g is at its floor %g: the gradients overflow even there (look for "
            "inf/NaN in the data or the model)", m->last_scale, m->last_floor);
#undef ADD
    return buf;
}
