/* The trainers' checkpoints (--save, --resume): see trainer_internal.h. A resumed run continues
 * the saved one: the flags left out take the checkpoint's values, a flag given either takes
 * effect or is refused with the checkpoint's value, never ignored. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "trainer_internal.h"

/* Everything a resumed run needs, as one list: the model's state (no prefix), the
 * optimizer's ("optim.", or for o2 the fp16 optimizer's with its masters and scaler,
 * "fp16."), the GradScaler's ("scaler."; a disabled one adds nothing), for fp8 the FP8
 * layers' scaling state ("fp8.<layer>.amax_history" ...) and, with monitor and --log, the
 * monitor's ("monitor."). */
static int training_state(na_module *net, const trainer_amp *a, bool monitor,
                          na_named_tensors *out) {
    int rc = na_module_state(net, "", out);
    if (!rc) rc = a->fo ? na_fp16_optimizer_state(a->fo, "fp16.", out)
                        : na_optim_state(a->opt, "optim.", out);
    if (!rc && a->gs) rc = na_grad_scaler_state(a->gs, "scaler.", out);
    if (!rc && a->fp8) rc = na_fp8_model_state(a->fp8, "fp8.", out);
    if (!rc && monitor && a->mon) rc = na_amp_monitor_state(a->mon, "monitor.", out);
    return rc;
}

static int set_meta(na_checkpoint *ck, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int set_meta(na_checkpoint *ck, const char *key, const char *fmt, ...) {
    char buf[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return na_checkpoint_set_meta(ck, key, buf);
}

/* fp8: the recipe, which --resume continues (the history's length is its state's shape) */
static int save_fp8_recipe(na_checkpoint *ck, const na_fp8_recipe_cfg *c) {
    bool delayed = c->kind == NA_FP8_RECIPE_DELAYED;
    int rc = set_meta(ck, "fp8_recipe", "%s", na_fp8_recipe_kind_name(c->kind));
    if (!rc) rc = set_meta(ck, "fp8_format", "%s", na_fp8_formats_name(c->formats));
    if (!rc && delayed) rc = set_meta(ck, "fp8_history", "%" PRId64, c->amax_history_len);
    if (!rc && delayed) rc = set_meta(ck, "fp8_margin", "%d", c->margin);
    return rc;
}

int trainer_checkpoint_save(const char *path, na_module *net, const trainer_amp *amp,
                            const trainer_opts *o, const trainer_saved_run *run) {
    na_checkpoint *ck = na_checkpoint_new();
    na_named_tensors state = {0};
    int rc = ck ? training_state(net, amp, true, &state) : na_last_status();
    if (!rc) rc = na_checkpoint_add_list(ck, &state);
    if (!rc) rc = set_meta(ck, "epochs_done", "%" PRId64, run->epochs_done);
    if (!rc) rc = set_meta(ck, "seed", "%" PRIu64, o->seed);
    if (!rc) rc = set_meta(ck, "rng_offset", "%" PRIu64, na_rng_offset());
    /* the run it belongs to: what --resume continues */
    if (!rc) rc = set_meta(ck, "epochs", "%" PRId64, o->epochs);
    if (!rc) rc = set_meta(ck, "batch", "%" PRId64, o->batch);
    if (!rc) rc = set_meta(ck, "schedule", "%s", o->schedule);
    if (!rc) rc = set_meta(ck, "amp", "%s", amp->mode);
    if (!rc) rc = set_meta(ck, "label_smoothing", "%.17g", o->label_smoothing);
    if (!rc) rc = set_meta(ck, "steps_per_epoch", "%" PRId64, run->steps_per_epoch);
    if (!rc) rc = set_meta(ck, "world_size", "%d", run->world_size);
    if (!rc && amp->fp8) rc = save_fp8_recipe(ck, &amp->fp8_cfg);
    if (!rc) rc = na_checkpoint_save(ck, path);
    na_named_tensors_free(&state);
    na_checkpoint_free(ck);
    return rc;
}

/* ---- resuming -------------------------------------------------------------------------- */

/* The metadata value of key as a whole decimal number: an int64 >= 0 (i64) or a uint64.
 * optional: a key older checkpoints lack (absent: NA_OK, the value untouched). */
static int meta_number(const na_checkpoint *ck, const char *key, bool optional, int64_t *i64,
                       uint64_t *u64) {
    const char *v = na_checkpoint_get_meta(ck, key);
    if (!v && optional) return NA_OK;
    if (!v)
        return na_set_error(NA_EFORMAT, "not a trainer checkpoint (metadata '%s' missing)", key);
    if (i64 ? !trainer_parse_i64(v, 0, INT64_MAX, i64) : !trainer_parse_u64(v, u64))
        return na_set_error(NA_EFORMAT, "metadata '%s' is '%s': expected an integer %s", key, v,
                            i64 ? "in [0, 2^63)" : "in [0, 2^64)");
    return NA_OK;
}

/* The word of list ("a|b") that the metadata value of key is: its static copy into *out. */
static int meta_word(const na_checkpoint *ck, const char *key, const char *const *list,
                     const char **out) {
    const char *v = na_checkpoint_get_meta(ck, key);
    for (int i = 0; v && list[i]; i++)
        if (!strcmp(v, list[i])) return *out = list[i], NA_OK;
    return v ? na_set_error(NA_EFORMAT, "metadata '%s' is '%s'", key, v) : NA_OK;
}

static const char *const schedules[] = {"constant", "onecycle", NULL};
static const char *const amp_modes[] = {"off", "fp16", "bf16", "o2", "fp8", NULL};
static const char *const fp8_recipes[] = {"delayed", "current", NULL};
static const char *const fp8_formats[] = {"hybrid", "e4m3", NULL};

/* fp8's flags left out take the saved run's recipe (keys absent: not an fp8 checkpoint) */
static int resume_fp8_recipe(const na_checkpoint *ck, trainer_opts *o) {
    int rc = NA_OK;
    if (!trainer_flag_given(o, "--fp8-recipe"))
        rc = meta_word(ck, "fp8_recipe", fp8_recipes, &o->fp8_recipe);
    if (!rc && !trainer_flag_given(o, "--fp8-format"))
        rc = meta_word(ck, "fp8_format", fp8_formats, &o->fp8_format);
    if (!rc && !trainer_flag_given(o, "--fp8-history"))
        rc = meta_number(ck, "fp8_history", true, &o->fp8_history, NULL);
    if (!rc && !trainer_flag_given(o, "--fp8-margin"))
        rc = meta_number(ck, "fp8_margin", true, &o->fp8_margin, NULL);
    return rc;
}

int trainer_resume_open(trainer_opts *o, trainer_resume *rs) {
    *rs = (trainer_resume){0};
    if (!(rs->ck = na_checkpoint_load(o->resume_path))) return na_last_status();
    const na_checkpoint *ck = rs->ck;
    uint64_t seed = 0;
    const char *schedule = NULL, *amp = NULL, *smoothing = NULL;
    /* the metadata first: a file that is no trainer checkpoint says so before its tensors */
    int rc = meta_number(ck, "epochs_done", false, &rs->epochs_done, NULL);
    if (!rc) rc = meta_number(ck, "seed", false, NULL, &seed);
    if (!rc) rc = meta_number(ck, "rng_offset", false, NULL, &rs->rng_offset);
    /* left out: the saved run's value; given: below, at load or in trainer_resume_check_run */
    if (!rc && !trainer_flag_given(o, "--epochs"))
        rc = meta_number(ck, "epochs", true, &o->epochs, NULL);
    if (!rc && !trainer_flag_given(o, "--batch"))
        rc = meta_number(ck, "batch", true, &o->batch, NULL);
    if (!rc) rc = meta_word(ck, "schedule", schedules, &schedule);
    if (!rc) rc = meta_word(ck, "amp", amp_modes, &amp);
    if (!rc && !trainer_flag_given(o, "--label-smoothing") &&
        (smoothing = na_checkpoint_get_meta(ck, "label_smoothing")) &&
        (!trainer_parse_f64(smoothing, &o->label_smoothing) || o->label_smoothing < 0 ||
         o->label_smoothing > 1))
        rc = na_set_error(NA_EFORMAT, "metadata 'label_smoothing' is '%s'", smoothing);
    if (!rc) rc = resume_fp8_recipe(ck, o);
    if (rc) return rc;
    if (!trainer_flag_given(o, "--amp") && amp) o->amp = amp;
    /* the random streams and the schedule cannot change mid-run */
    if (!trainer_flag_given(o, "--seed")) o->seed = seed;
    else if (o->seed != seed)
        return na_set_error(NA_EINVAL, "--seed %" PRIu64 ": the checkpoint's run has seed %" PRIu64
                            " (a resumed run continues its random streams: leave --seed out)",
                            o->seed, seed);
    if (schedule && !trainer_flag_given(o, "--schedule")) o->schedule = schedule;
    else if (schedule && strcmp(o->schedule, schedule))
        return na_set_error(NA_EINVAL, "--schedule %s: the checkpoint's run has --schedule %s "
                            "(the learning rate would jump: leave --schedule out)", o->schedule,
                            schedule);
    return NA_OK;
}

/* Whether the state item `name` is what a flag given on the command line sets: the checkpoint's
 * value is then not loaded, and the flag's (which made the object) takes effect. --lr and
 * --weight-decay: every group's; --loss-scale, --growth-interval: the scaler's rule and its
 * trackers, as a fresh run builds them, and with --loss-scale N its scale (the counts of
 * updates and skipped steps go on). */
static bool group_key(const trainer_amp *a, const char *name) { /* an optimizer group's */
    const char *group = a->fo ? "fp16.optimizer.group." : "optim.group.";
    return !strncmp(name, group, strlen(group));
}
static bool set_by_flag(const trainer_opts *o, const trainer_amp *a, const char *name) {
    const char *scaler = a->fo ? "fp16.scaler." : "scaler.";
    const char *key = strrchr(name, '.') ? strrchr(name, '.') + 1 : name;
    if (group_key(a, name))
        return (trainer_flag_given(o, "--lr") &&
                (!strcmp(key, "lr") || !strcmp(key, "initial_lr"))) ||
               (trainer_flag_given(o, "--weight-decay") && !strcmp(key, "weight_decay"));
    if (strncmp(name, scaler, strlen(scaler))) return false;
    key = name + strlen(scaler);
    if (!strcmp(key, "updates") || !strcmp(key, "skipped_steps")) return false;
    if (!strcmp(key, "scale"))
        return trainer_flag_given(o, "--loss-scale") && strcmp(o->loss_scale, "dynamic");
    /* the rule, and its trackers (a tracker past the new interval would never grow) */
    return trainer_flag_given(o, "--loss-scale") || trainer_flag_given(o, "--growth-interval");
}

int trainer_resume_load(const trainer_opts *o, const trainer_resume *rs, na_module *net,
                        const trainer_amp *amp) {
    const na_checkpoint *ck = rs->ck;
    /* the recipe's state cannot carry over to another one (an fp16 scaler under bf16 would be
     * dropped); older checkpoints say it by their tensors */
    const char *saved = na_checkpoint_get_meta(ck, "amp");
    if (!saved) saved = na_checkpoint_has(ck, "fp16.scaler.scale") ? "o2"
                        : na_checkpoint_has(ck, "scaler.scale") ? "fp16" : amp->mode;
    if (strcmp(saved, amp->mode))
        return na_set_error(NA_EINVAL, "the checkpoint was trained with --amp %s and this run "
                            "has --amp %s (the precision recipe cannot change mid-run: leave "
                            "--amp out)", saved, amp->mode);
    na_named_tensors state = {0}, load = {0};
    /* the monitor's state when the saved run had --log too (else it starts afresh) */
    int rc = training_state(net, amp, na_checkpoint_has(ck, "monitor.counters"), &state);
    for (int64_t i = 0; i < state.n && !rc; i++) {
        const char *name = state.items[i].name;
        if (set_by_flag(o, amp, name)) continue;
        rc = na_named_tensors_add(&load, state.items[i].tensor, "%s", name);
        /* a diverged run's NaN weights, statistics, moments or masters would train to NaN
         * (the monitor's moving average is NaN before its first finite loss; the groups'
         * hyper-parameters are na_optim_check's) */
        if (!rc && strncmp(name, "monitor.", 8) && !group_key(amp, name) &&
            na_checkpoint_has(ck, name) &&
            na_checkpoint_check_finite(ck, name))
            rc = na_set_error(NA_EINVAL, "%s (the saved run had diverged: resume from an earlier "
                              "checkpoint)", na_last_error());
    }
    if (!rc) rc = na_checkpoint_copy_list(ck, &load, false);
    if (!rc) rc = na_optim_check(amp->opt, amp->fo ? "fp16.optimizer." : "optim.");
    if (!rc) na_rng_set_state(o->seed, rs->rng_offset);
    na_named_tensors_free(&load);
    na_named_tensors_free(&state);
    return rc;
}

int trainer_resume_check_run(const trainer_opts *o, const trainer_resume *rs, int64_t steps,
                             int world) {
    int64_t saved_world = 0, saved_steps = 0, saved_epochs = 0;
    int rc = meta_number(rs->ck, "world_size", true, &saved_world, NULL);
    if (!rc) rc = meta_number(rs->ck, "steps_per_epoch", true, &saved_steps, NULL);
    if (!rc) rc = meta_number(rs->ck, "epochs", true, &saved_epochs, NULL);
    if (rc) return rc;
    if (saved_world && saved_world != world && !o->quiet)
        fprintf(stderr, "%s: note: %s was saved by %" PRId64 " rank(s) and this run has %d: each "
                "epoch's shards, and so the order of images, differ from the saved run's\n",
                o->program, o->resume_path, saved_world, world);
    if (strcmp(o->schedule, "onecycle") || rs->epochs_done >= o->epochs) return NA_OK;
    /* the one-cycle schedule spans the whole run: another length moves every step's lr */
    if (!saved_steps || !saved_epochs)
        return na_set_error(NA_EINVAL, "the checkpoint does not record its one-cycle schedule's "
                            "length (saved by an older trainer)");
    if (saved_epochs != o->epochs)
        return na_set_error(NA_EINVAL, "--epochs %" PRId64 ": the checkpoint's one-cycle "
                            "schedule spans %" PRId64 " epochs (its length cannot change "
                            "mid-run: leave --epochs out)", o->epochs, saved_epochs);
    if (saved_steps != steps)
        return na_set_error(NA_EINVAL, "the checkpoint's one-cycle schedule has %" PRId64
                            " steps per epoch and this run %" PRId64 " (--batch, --limit or the "
                            "number of ranks differ; its length cannot change mid-run)",
                            saved_steps, steps);
    return NA_OK;
}

void trainer_resume_close(trainer_resume *rs) {
    na_checkpoint_free(rs->ck);
    *rs = (trainer_resume){0};
}
