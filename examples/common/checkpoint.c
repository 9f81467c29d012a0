/* The trainers' checkpoints (--save, --resume): see trainer_internal.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer_internal.h"

/* The optimizer-side state of a checkpoint: "optim." (or, for o2, "fp16." with the masters)
 * and "scaler." for an enabled GradScaler. */
static int amp_state(const trainer_amp *a, na_named_tensors *out) {
    na_named_tensors l = {0};
    *out = (na_named_tensors){0};
    int rc = a->fo ? na_fp16_optimizer_state(a->fo, &l) : na_optim_state(a->opt, &l);
    int64_t n = l.n;
    na_named_tensors sc = {0};
    if (!rc && a->gs && na_grad_scaler_is_enabled(a->gs)) rc = na_grad_scaler_state(a->gs, &sc);
    if (!rc && !(out->items = calloc((size_t)(n + sc.n + 1), sizeof *out->items)))
        rc = na_set_error(NA_ENOMEM, "checkpoint: out of host memory");
    for (int64_t i = 0; !rc && i < n + sc.n; i++) {
        const na_named_tensor *it = i < n ? &l.items[i] : &sc.items[i - n];
        const char *prefix = i >= n ? "scaler." : a->fo ? "fp16." : "optim.";
        size_t len = strlen(prefix) + strlen(it->name) + 1;
        char *name = malloc(len);
        if (!name) rc = na_set_error(NA_ENOMEM, "checkpoint: out of host memory");
        else snprintf(name, len, "%s%s", prefix, it->name);
        out->items[out->n++] = (na_named_tensor){.name = name, .tensor = it->tensor};
    }
    na_named_tensors_free(&l);
    na_named_tensors_free(&sc);
    if (rc) na_named_tensors_free(out);
    return rc;
}

int trainer_checkpoint_save(const char *path, na_module *net, const trainer_amp *amp,
                            int64_t epochs_done, uint64_t seed) {
    na_checkpoint *ck = na_checkpoint_new();
    na_named_tensors model = {0}, state = {0};
    int rc = ck ? NA_OK : na_last_status();
    if (!rc) rc = na_module_named_tensors(net, NA_MODULE_STATE, &model);
    for (int64_t i = 0; !rc && i < model.n; i++)
        rc = na_checkpoint_add(ck, model.items[i].name, model.items[i].tensor);
    if (!rc) rc = amp_state(amp, &state);
    for (int64_t i = 0; !rc && i < state.n; i++)
        rc = na_checkpoint_add(ck, state.items[i].name, state.items[i].tensor);
    char buf[64];
    snprintf(buf, sizeof buf, "%" PRId64, epochs_done);
    if (!rc) rc = na_checkpoint_set_meta(ck, "epochs_done", buf);
    snprintf(buf, sizeof buf, "%" PRIu64, seed);
    if (!rc) rc = na_checkpoint_set_meta(ck, "seed", buf);
    snprintf(buf, sizeof buf, "%" PRIu64, na_rng_offset());
    if (!rc) rc = na_checkpoint_set_meta(ck, "rng_offset", buf);
    if (!rc) rc = na_checkpoint_save(ck, path);
    na_named_tensors_free(&model);
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
    na_named_tensors model = {0}, state = {0};
    int64_t epochs = 0;
    uint64_t seed = 0, offset = 0;
    /* the metadata first: a file that is no trainer checkpoint says so before its tensors */
    int rc = meta_number(ck, path, "epochs_done", &epochs, NULL);
    if (!rc) rc = meta_number(ck, path, "seed", NULL, &seed);
    if (!rc) rc = meta_number(ck, path, "rng_offset", NULL, &offset);
    if (!rc) rc = na_module_named_tensors(net, NA_MODULE_STATE, &model);
    for (int64_t i = 0; !rc && i < model.n; i++)
        rc = na_checkpoint_copy_into(ck, model.items[i].name, model.items[i].tensor);
    if (!rc) rc = amp_state(amp, &state);
    for (int64_t i = 0; !rc && i < state.n; i++)
        rc = na_checkpoint_copy_into(ck, state.items[i].name, state.items[i].tensor);
    if (!rc) {
        *epochs_done = epochs;
        na_rng_set_state(seed, offset);
    }
    na_named_tensors_free(&model);
    na_named_tensors_free(&state);
    na_checkpoint_free(ck);
    return rc;
}
