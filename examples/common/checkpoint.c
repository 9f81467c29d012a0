/* The trainers' checkpoints (--save, --resume): see trainer_internal.h. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>

#include "trainer_internal.h"

/* Everything a resumed run needs, as one list: the model's state (no prefix), the
 * optimizer's ("optim.", or for o2 the fp16 optimizer's with its masters and scaler,
 * "fp16."), the GradScaler's ("scaler."; a disabled one adds nothing) and, with monitor and
 * --log, the monitor's ("monitor."). */
static int training_state(na_module *net, const trainer_amp *a, bool monitor,
                          na_named_tensors *out) {
    int rc = na_module_state(net, "", out);
    if (!rc) rc = a->fo ? na_fp16_optimizer_state(a->fo, "fp16.", out)
                        : na_optim_state(a->opt, "optim.", out);
    if (!rc && a->gs) rc = na_grad_scaler_state(a->gs, "scaler.", out);
    if (!rc && monitor && a->mon) rc = na_amp_monitor_state(a->mon, "monitor.", out);
    return rc;
}

int trainer_checkpoint_save(const char *path, na_module *net, const trainer_amp *amp,
                            int64_t epochs_done, uint64_t seed) {
    na_checkpoint *ck = na_checkpoint_new();
    na_named_tensors state = {0};
    int rc = ck ? training_state(net, amp, true, &state) : na_last_status();
    if (!rc) rc = na_checkpoint_add_list(ck, &state);
    char buf[64];
    snprintf(buf, sizeof buf, "%" PRId64, epochs_done);
    if (!rc) rc = na_checkpoint_set_meta(ck, "epochs_done", buf);
    snprintf(buf, sizeof buf, "%" PRIu64, seed);
    if (!rc) rc = na_checkpoint_set_meta(ck, "seed", buf);
    snprintf(buf, sizeof buf, "%" PRIu64, na_rng_offset());
    if (!rc) rc = na_checkpoint_set_meta(ck, "rng_offset", buf);
    if (!rc) rc = na_checkpoint_save(ck, path);
    na_named_tensors_free(&state);
    na_checkpoint_free(ck);
    return rc;
}

/* The metadata value of key as a whole decimal number: an int64 >= 0 (i64) or a uint64. */
static int meta_number(const na_checkpoint *ck, const char *path, const char *key,
                       int64_t *i64, uint64_t *u64) {
    const char *v = na_checkpoint_get_meta(ck, key);
    if (!v)
        return na_set_error(NA_EFORMAT, "%s: not a trainer checkpoint (metadata '%s' missing)",
                            path, key);
    if (i64 ? !trainer_parse_i64(v, 0, INT64_MAX, i64) : !trainer_parse_u64(v, u64))
        return na_set_error(NA_EFORMAT, "%s: metadata '%s' is '%s': expected an integer %s", path,
                            key, v, i64 ? "in [0, 2^63)" : "in [0, 2^64)");
    return NA_OK;
}

int trainer_checkpoint_load(const char *path, na_module *net, const trainer_amp *amp,
                            int64_t *epochs_done) {
    na_checkpoint *ck = na_checkpoint_load(path);
    if (!ck) return na_last_status();
    na_named_tensors state = {0};
    int64_t epochs = 0;
    uint64_t seed = 0, offset = 0;
    /* the metadata first: a file that is no trainer checkpoint says so before its tensors */
    int rc = meta_number(ck, path, "epochs_done", &epochs, NULL);
    if (!rc) rc = meta_number(ck, path, "seed", NULL, &seed);
    if (!rc) rc = meta_number(ck, path, "rng_offset", NULL, &offset);
    /* the monitor's state when the saved run had --log too (else it starts afresh) */
    if (!rc) rc = training_state(net, amp, na_checkpoint_has(ck, "monitor.counters"), &state);
    if (!rc) rc = na_checkpoint_copy_list(ck, &state, false);
    if (!rc) {
        *epochs_done = epochs;
        na_rng_set_state(seed, offset);
    }
    na_named_tensors_free(&state);
    na_checkpoint_free(ck);
    return rc;
}
