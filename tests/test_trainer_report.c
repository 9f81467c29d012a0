/* The example trainers' pieces that need no terminal and no data files: the progress bar's
 * layout and arithmetic (examples/common/report.c), the strict number parsers, and evaluation
 * reporting a failure instead of NaN (examples/common/trainer.c). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../examples/common/models.h"
#include "../examples/common/report.h"
#include "../examples/common/trainer_internal.h"
#include "nanoamp.h"

static trainer_progress sample(void) {
    return (trainer_progress){.epoch = 1, .epochs = 2, .step = 54, .steps = 118,
                              .elapsed_s = 3.2, .images_per_s = 1834.4, .loss = 0.51234,
                              .scaled = true, .scale = 65536, .skipped = 3};
}

Test(progress, tqdm_layout_with_every_number) {
    trainer_progress p = sample();
    char buf[512];
    trainer_progress_format(&p, 150, buf, sizeof buf);
    cr_assert(strstr(buf, "epoch 1/2  46%|") == buf, "%s", buf);
    /* 54 steps in 3.2 s: the 64 left take 3.8 s (whole seconds shown, as tqdm) */
    cr_assert(strstr(buf, "| 54/118 [00:03<00:03, 1834 img/s, loss 0.5123, scale 65536, "
                          "skipped 3]"), "%s", buf);
    p.scaled = false;
    trainer_progress_format(&p, 150, buf, sizeof buf);
    cr_assert(strstr(buf, "loss 0.5123]") && !strstr(buf, "scale"), "%s", buf);
}

Test(progress, remaining_time_is_this_epochs) {
    trainer_progress p = sample();
    char buf[512];
    p.step = 10, p.steps = 100, p.elapsed_s = 10; /* 1 s a step, 90 left */
    trainer_progress_format(&p, 150, buf, sizeof buf);
    cr_assert(strstr(buf, "[00:10<01:30,"), "%s", buf);
    p.step = 1, p.steps = 20000, p.elapsed_s = 2; /* hours */
    trainer_progress_format(&p, 150, buf, sizeof buf);
    cr_assert(strstr(buf, "[00:02<11:06:38,"), "%s", buf);
    p.step = 0, p.elapsed_s = 0; /* no rate yet */
    trainer_progress_format(&p, 150, buf, sizeof buf);
    cr_assert(strstr(buf, "[00:00<?,"), "%s", buf);
}

Test(progress, never_wider_than_the_terminal) {
    trainer_progress p = sample();
    char buf[512];
    for (int width = 1; width <= 300; width++) {
        trainer_progress_format(&p, width, buf, sizeof buf);
        cr_assert_lt((int)strlen(buf), width, "width %d: '%s'", width, buf);
        cr_assert_null(strchr(buf, '\n'));
        const char *scale = strstr(buf, "scale ");
        cr_assert(!scale || !strncmp(scale, "scale 65536", 11), "a cut number: '%s'", buf);
    }
    trainer_progress_format(&p, 100, buf, sizeof buf);
    cr_assert(strchr(buf, '#'), "a bar where there is room: %s", buf);
}

/* Fields are dropped whole in the stated order (img/s, scale, remaining time, step counts,
 * bar, elapsed, skipped, loss): the bar and the skipped count survive 80 columns, the loss 30;
 * the bracket is always closed. */
Test(progress, narrow_terminals_drop_whole_fields_in_order) {
    trainer_progress p = sample();
    char buf[512];
    struct { int width; const char *want; } cases[] = {
        {120, "epoch 1/2  46%|###############                  | 54/118 [00:03<00:03, 1834 "
              "img/s, loss 0.5123, scale 65536, skipped 3]"},
        {80, "epoch 1/2  46%|########          | 54/118 [00:03<00:03, loss 0.5123, skipped 3]"},
        {60, "epoch 1/2  46%|#####      | [00:03, loss 0.5123, skipped 3]"},
        {30, "epoch 1/2  46% [loss 0.5123]"},
        {20, "epoch 1/2  46%"},
        {5, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        trainer_progress_format(&p, cases[i].width, buf, sizeof buf);
        cr_assert_str_eq(buf, cases[i].want, "width %d", cases[i].width);
    }
    for (int width = 1; width <= 300; width++) { /* brackets balanced, numbers whole */
        trainer_progress_format(&p, width, buf, sizeof buf);
        cr_assert_eq(!strchr(buf, '['), !strchr(buf, ']'), "width %d: '%s'", width, buf);
        const char *loss = strstr(buf, "loss ");
        cr_assert(!loss || !strncmp(loss, "loss 0.5123", 11), "width %d: '%s'", width, buf);
        cr_assert(!strstr(buf, "<0") || strstr(buf, "<00:03"), "width %d: '%s'", width, buf);
    }
    p.scaled = false; /* an unscaled run keeps img/s at 80 */
    trainer_progress_format(&p, 80, buf, sizeof buf);
    cr_assert_str_eq(buf, "epoch 1/2  46%|#######          | 54/118 [00:03<00:03, 1834 img/s, "
                          "loss 0.5123]");
}

/* Without a terminal (a log, mpirun's stderr): no bar, under 80 columns. */
Test(progress, plain_lines_fit_80_columns) {
    trainer_progress p = sample();
    char buf[512];
    trainer_progress_plain(&p, buf, sizeof buf);
    cr_assert_str_eq(buf, "epoch 1/2  46% 54/118 [00:03<00:03, loss 0.5123, scale 65536, "
                          "skipped 3]");
    p.step = 123456, p.steps = 999999, p.images_per_s = 1e6, p.epoch = 100, p.epochs = 100;
    p.elapsed_s = 40000;
    trainer_progress_plain(&p, buf, sizeof buf);
    cr_assert_lt(strlen(buf), TRAINER_PLAIN_WIDTH, "%s", buf);
    cr_assert(strstr(buf, "skipped 3]"), "%s", buf);
    p = sample(), p.scaled = false;
    trainer_progress_plain(&p, buf, sizeof buf);
    cr_assert(strstr(buf, "1834 img/s, loss 0.5123]"), "%s", buf);
}

Test(progress, terminal_width_from_columns_without_a_tty) {
    FILE *f = tmpfile(); /* not a terminal */
    cr_assert_not_null(f);
    setenv("COLUMNS", "97", 1);
    cr_assert_eq(trainer_terminal_width(fileno(f)), 97);
    unsetenv("COLUMNS");
    cr_assert_eq(trainer_terminal_width(fileno(f)), 80);
    fclose(f);
}

Test(report, epoch_line) {
    char buf[256];
    trainer_epoch_format(1, 2, 0.51234, 0.45678, 0.842, 12.34, buf, sizeof buf);
    cr_assert_str_eq(buf, "epoch 1/2: train loss 0.5123, test loss 0.4568, test accuracy "
                          "84.20%, 12.3 s");
}

/* trainer_json_print's line for o and r, into buf */
static void json_of(const trainer_opts *o, const trainer_result *r, char *buf, size_t size) {
    memset(buf, 0, size);
    FILE *f = fmemopen(buf, size - 1, "w");
    cr_assert_not_null(f);
    trainer_json_print(f, o, r);
    fclose(f);
}

Test(report, json_names_the_fp8_recipe) {
    trainer_opts o = trainer_defaults("mlp");
    trainer_result r = {.amp_mode = "fp8", .fp8_recipe = "current", .fp8_format = "e4m3",
                        .saturated = 12};
    char buf[1024];
    json_of(&o, &r, buf, sizeof buf);
    cr_assert(strstr(buf, "\"fp8_recipe\": \"current\", \"fp8_format\": \"e4m3\", "
                          "\"saturated\": 12}\n"), "%s", buf);
}

Test(report, json_writes_null_for_what_is_not_finite) {
    trainer_opts o = trainer_defaults("mlp");
    trainer_result r = {.amp_mode = "fp16", .images_per_s = INFINITY, .train_time_s = 1.5,
                        .test_acc = NAN, .test_loss = NAN, .final_loss = -NAN,
                        .final_scale = NAN, .diverged_at_step = 7, .lr = NAN,
                        .weight_decay = 0.01};
    char buf[1024];
    json_of(&o, &r, buf, sizeof buf);
    cr_assert(strstr(buf, "\"train_images_per_s\": null, \"train_time_s\": 1.500, \"test_acc\": "
                          "null, \"test_loss\": null, \"final_loss\": null"), "%s", buf);
    cr_assert(strstr(buf, "\"final_scale\": null, \"diverged_at_step\": 7, \"fp8_recipe\": null, "
                          "\"fp8_format\": null, \"saturated\": 0}\n"), "%s", buf);
    cr_assert(!strstr(buf, "nan") && !strstr(buf, "inf"), "%s", buf);
    cr_assert(strstr(buf, "\"channels_last\": false,"), "%s", buf);
    cr_assert(strstr(buf, "\"lr\": null, \"weight_decay\": 0.01,"), "%s", buf);
}

Test(parse, channels_last_flag_reaches_the_options_and_the_json) {
    trainer_opts o = trainer_defaults("cnn");
    char *argv[] = {"mnist-train", "--channels-last", NULL};
    cr_assert_eq(trainer_parse_args(&o, 2, argv, NULL), 0, "%s", na_last_error());
    cr_assert(o.channels_last);
    trainer_result r = {.amp_mode = "off"};
    char buf[1024];
    json_of(&o, &r, buf, sizeof buf);
    cr_assert(strstr(buf, "\"channels_last\": true,"), "%s", buf);
}

Test(parse, whole_strings_in_range_only) {
    int64_t i = 42;
    uint64_t u = 42;
    double d = 42;
    const char *bad_ints[] = {"", " 1", "1 ", "+1", "1x", "1.5", "abc", "-", "99999999999999999999"};
    for (size_t k = 0; k < sizeof bad_ints / sizeof *bad_ints; k++) {
        cr_assert_not(trainer_parse_i64(bad_ints[k], INT64_MIN, INT64_MAX, &i), "'%s'", bad_ints[k]);
        cr_assert_not(trainer_parse_u64(bad_ints[k], &u), "'%s'", bad_ints[k]);
    }
    cr_assert_not(trainer_parse_i64("-5", 0, 10, &i));
    cr_assert_not(trainer_parse_i64("11", 0, 10, &i));
    cr_assert_not(trainer_parse_u64("-1", &u));
    cr_assert_eq(i, 42);
    cr_assert_eq(u, 42);
    cr_assert(trainer_parse_i64("-5", -10, 10, &i) && i == -5);
    cr_assert(trainer_parse_u64("18446744073709551615", &u) && u == UINT64_MAX);
    const char *bad_reals[] = {"", " 1", "1e", "nan", "inf", "1e999", "0x", "1,5"};
    for (size_t k = 0; k < sizeof bad_reals / sizeof *bad_reals; k++)
        cr_assert_not(trainer_parse_f64(bad_reals[k], &d), "'%s'", bad_reals[k]);
    cr_assert(trainer_parse_f64("1e-3", &d) && d == 1e-3);
}

/* A model given images it cannot take: evaluation fails with the library's message and leaves
 * the results alone (the trainer stops and says so once). */
Test(evaluate, reports_a_failure_instead_of_nan) {
    na_dataset *ds = na_dataset_new(20, 1, 56, 14, 10);
    cr_assert_not_null(ds, "%s", na_last_error());
    na_module *net = model_by_name("cnn", NULL);
    cr_assert_not_null(net);
    float mean = 0.5f, std = 0.25f;
    double acc = -1, loss = -1;
    cr_assert_lt(trainer_evaluate(net, ds, &mean, &std, NA_DEVICE_CPU, NA_DTYPE_F32, &acc, &loss),
                 0);
    cr_assert_neq(na_last_error()[0], '\0');
    cr_assert(acc == -1 && loss == -1);
    na_module_free(net);
    na_dataset_free(ds);
}

Test(evaluate, accuracy_and_mean_cross_entropy) {
    na_dataset *ds = na_dataset_new(30, 1, 28, 28, 10);
    cr_assert_not_null(ds);
    for (int64_t i = 0; i < ds->n; i++) ds->labels[i] = (int32_t)(i % 10);
    na_module *net = model_by_name("mlp", NULL);
    cr_assert_not_null(net);
    na_named_tensors params = {0};
    cr_assert_eq(na_module_named_tensors(net, NA_MODULE_PARAMS, "", &params), NA_OK);
    for (int64_t k = 0; k < params.n; k++) /* every logit equal: accuracy of class 0, ln 10 */
        cr_assert_eq(na_fill_(params.items[k].tensor, 0.0), NA_OK);
    float mean = 0.5f, std = 0.25f;
    double acc = -1, loss = -1;
    cr_assert_eq(trainer_evaluate(net, ds, &mean, &std, NA_DEVICE_CPU, NA_DTYPE_F32, &acc, &loss),
                 NA_OK, "%s", na_last_error());
    cr_assert_float_eq(acc, 0.1, 1e-12);
    cr_assert_float_eq(loss, log(10.0), 1e-6);
    na_named_tensors_free(&params);
    na_module_free(net);
    na_dataset_free(ds);
}

/* --resume fills in the flags left out: the parser says which were given (a default value is
 * not "given", a value equal to the default is). */
Test(parse, flags_given_are_told_from_defaults) {
    trainer_opts o = trainer_defaults("mlp");
    char *argv[] = {"mnist-train", "--seed", "1", "--lr=0.1", "--quiet", NULL};
    cr_assert_eq(trainer_parse_args(&o, 5, argv, "mlp|cnn"), 0, "%s", na_last_error());
    cr_assert(trainer_flag_given(&o, "--seed") && trainer_flag_given(&o, "--lr"));
    cr_assert(!trainer_flag_given(&o, "--epochs") && !trainer_flag_given(&o, "--amp"));
    cr_assert(!trainer_flag_given(&o, "--no-such-flag"));
}
