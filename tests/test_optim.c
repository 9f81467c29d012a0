/* Optimizers, schedules and clipping: 1-3 steps of each rule against values worked out by
 * hand, skip and no-grad behaviour, groups, state save/load, schedules vs their formulas. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nanoamp/autograd.h"
#include "nanoamp/error.h"
#include "nanoamp/nn.h"
#include "nanoamp/optim.h"

/* ---- helpers ---------------------------------------------------------------------------------- */

static na_tensor *param(int64_t n, const float *v) {
    na_tensor *p = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(n));
    cr_assert_not_null(p, "%s", na_last_error());
    cr_assert_eq(na_copy_from_host(p, v), NA_OK);
    cr_assert_eq(na_tensor_set_requires_grad(p, true), NA_OK);
    return p;
}

static void set_grad(na_tensor *p, const float *g) {
    if (!p->grad) p->grad = na_tensor_new(p->dtype, p->device, p->ndim, p->shape);
    cr_assert_eq(na_copy_from_host(p->grad, g), NA_OK);
}

static void expect_near(double got, double want, double rtol, const char *what) {
    cr_assert(fabs(got - want) <= rtol * (fabs(want) + 1e-6), "%s: got %.10g, expected %.10g",
              what, got, want);
}

static void teardown(void) { na_step_end(); }
TestSuite(optim, .fini = teardown);

/* Steps opt on the one-element parameter p with gradients g[0..n) and checks p after each
 * step against want[]. */
static void run_scalar(na_optim *opt, na_tensor *p, const float *g, const double *want, int n,
                       double rtol) {
    cr_assert_not_null(opt, "%s", na_last_error());
    for (int t = 0; t < n; t++) {
        set_grad(p, &g[t]);
        cr_assert_eq(na_optim_step(opt, NULL), NA_OK, "%s", na_last_error());
        char what[32];
        snprintf(what, sizeof what, "step %d", t + 1);
        expect_near(na_get(p, 0), want[t], rtol, what);
    }
    na_optim_free(opt);
    na_tensor_free(p);
}

static na_optim *sgd_for(na_tensor *p, na_sgd_cfg c) {
    na_optim *o = na_sgd_new(NA_NO_TENSORS, &c);
    cr_assert_not_null(o, "%s", na_last_error());
    cr_assert_eq(na_optim_add_group(o, NA_TENSORS(p)), 0, "%s", na_last_error());
    return o;
}

static na_optim *adam_for(na_tensor *p, na_adam_cfg c, bool adamw) {
    na_optim *o = adamw ? na_adamw_new(NA_NO_TENSORS, &c) : na_adam_new(NA_NO_TENSORS, &c);
    cr_assert_not_null(o, "%s", na_last_error());
    cr_assert_eq(na_optim_add_group(o, NA_TENSORS(p)), 0, "%s", na_last_error());
    return o;
}

/* gradients 0.5, -1, 2 on p0 = 1 throughout */
static const float G3[3] = {0.5f, -1.0f, 2.0f};

/* ---- SGD ----------------------------------------------------------------------------------- */

Test(optim, sgd_plain) {
    /* p -= 0.1 g: 1 - 0.05, + 0.1, - 0.2 */
    na_tensor *p = param(1, (float[]){1});
    run_scalar(sgd_for(p, (na_sgd_cfg){.lr = 0.1}), p, G3, (double[]){0.95, 1.05, 0.85}, 3, 1e-6);
}

Test(optim, sgd_momentum) {
    /* buf = 0.5 (first step: g); 0.9*0.5 - 1 = -0.55; 0.9*-0.55 + 2 = 1.505.
     * p: 1 - 0.05 = 0.95; 0.95 + 0.055 = 1.005; 1.005 - 0.1505 = 0.8545 */
    na_tensor *p = param(1, (float[]){1});
    run_scalar(sgd_for(p, (na_sgd_cfg){.lr = 0.1, .momentum = 0.9}), p, G3,
               (double[]){0.95, 1.005, 0.8545}, 3, 1e-6);
}

Test(optim, sgd_dampening) {
    /* buf = 0.5 (no dampening on the first step); 0.45 + 0.5*-1 = -0.05; -0.045 + 0.5*2 = 0.955.
     * p: 0.95; 0.95 + 0.005 = 0.955; 0.955 - 0.0955 = 0.8595 */
    na_tensor *p = param(1, (float[]){1});
    run_scalar(sgd_for(p, (na_sgd_cfg){.lr = 0.1, .momentum = 0.9, .dampening = 0.5}), p, G3,
               (double[]){0.95, 0.955, 0.8595}, 3, 1e-6);
}

Test(optim, sgd_nesterov) {
    /* buf: 0.5, -0.55, 1.505; d = g + 0.9 buf: 0.95, -1.495, 3.3545.
     * p: 1 - 0.095 = 0.905; 0.905 + 0.1495 = 1.0545; 1.0545 - 0.33545 = 0.71905 */
    na_tensor *p = param(1, (float[]){1});
    run_scalar(sgd_for(p, (na_sgd_cfg){.lr = 0.1, .momentum = 0.9, .nesterov = true}), p, G3,
               (double[]){0.905, 1.0545, 0.71905}, 3, 1e-6);
}

Test(optim, sgd_weight_decay) {
    /* g' = g + 0.1 p: 0.6 -> p 0.94; -1 + 0.094 = -0.906 -> 1.0306; 2 + 0.10306 -> 0.820294 */
    na_tensor *p = param(1, (float[]){1});
    run_scalar(sgd_for(p, (na_sgd_cfg){.lr = 0.1, .weight_decay = 0.1}), p, G3,
               (double[]){0.94, 1.0306, 0.820294}, 3, 1e-6);
    /* with momentum 0.9: buf 0.6 -> p 0.94; buf 0.54 - 0.906 = -0.366 -> p 0.9766 */
    p = param(1, (float[]){1});
    run_scalar(sgd_for(p, (na_sgd_cfg){.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1}), p, G3,
               (double[]){0.94, 0.9766}, 2, 1e-6);
}

/* ---- Adam / AdamW ------------------------------------------------------------------------------ */

/* The textbook form (Kingma & Ba): mhat = m/bc1, vhat = v/bc2, p -= lr mhat/(sqrt(vhat)+eps),
 * written differently from the kernel's (PyTorch's) form on purpose. */
typedef struct {
    double p, m, v, vmax;
} adam_ref;

static void adam_ref_step(adam_ref *s, double g, int t, double lr, double b1, double b2, double eps,
                          double wd, bool adamw, bool amsgrad) {
    if (adamw) s->p *= 1 - lr * wd;
    else g += wd * s->p;
    s->m = b1 * s->m + (1 - b1) * g;
    s->v = b2 * s->v + (1 - b2) * g * g;
    s->vmax = fmax(s->vmax, s->v);
    double mhat = s->m / (1 - pow(b1, t)), vhat = (amsgrad ? s->vmax : s->v) / (1 - pow(b2, t));
    s->p -= lr * mhat / (sqrt(vhat) + eps);
}

static void adam_case(na_adam_cfg c, bool adamw, const float *g, int n) {
    na_tensor *p = param(1, (float[]){1});
    adam_ref r = {.p = 1};
    double want[3];
    for (int t = 0; t < n; t++) {
        adam_ref_step(&r, g[t], t + 1, c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, adamw, c.amsgrad);
        want[t] = r.p;
    }
    run_scalar(adam_for(p, c, adamw), p, g, want, n, 2e-6);
}

Test(optim, adam_first_step_is_lr_times_sign) {
    /* m = 0.05, v = 0.00025; bias-corrected 0.5 and 0.25: p = 1 - 0.1 * 0.5/0.5 = 0.9 */
    na_adam_cfg c = NA_ADAM_DEFAULTS;
    c.lr = 0.1;
    na_tensor *p = param(1, (float[]){1});
    run_scalar(adam_for(p, c, false), p, G3, (double[]){0.9}, 1, 1e-6);
}

Test(optim, adam_three_steps) {
    na_adam_cfg c = NA_ADAM_DEFAULTS;
    c.lr = 0.1;
    adam_case(c, false, G3, 3);
    c.weight_decay = 0.1; /* L2: g += 0.1 p */
    adam_case(c, false, G3, 3);
    c.beta1 = 0.6, c.beta2 = 0.5, c.eps = 1e-3; /* 1 - beta1 < 0.5: lerp's other branch */
    adam_case(c, false, G3, 3);
}

Test(optim, adamw_decoupled_decay) {
    /* step 1: p = 1 * (1 - 0.1*0.1) = 0.99, then the Adam step of -0.1: 0.89 */
    na_adam_cfg c = NA_ADAMW_DEFAULTS;
    c.lr = 0.1, c.weight_decay = 0.1;
    na_tensor *p = param(1, (float[]){1});
    run_scalar(adam_for(p, c, true), p, G3, (double[]){0.89}, 1, 1e-6);
    adam_case(c, true, G3, 3);
}

Test(optim, amsgrad_uses_the_max_second_moment) {
    na_adam_cfg c = NA_ADAM_DEFAULTS;
    c.lr = 0.1, c.beta2 = 0.5, c.amsgrad = true;
    const float g[3] = {2.0f, 0.1f, 0.1f}; /* v: 2, 1.005, 0.5075: the max is used */
    adam_case(c, false, g, 3);
    adam_case(c, true, g, 3);
    /* and it differs from plain Adam there */
    adam_ref a = {.p = 1}, b = {.p = 1};
    for (int t = 1; t <= 3; t++) {
        adam_ref_step(&a, g[t - 1], t, 0.1, 0.9, 0.5, 1e-8, 0, false, true);
        adam_ref_step(&b, g[t - 1], t, 0.1, 0.9, 0.5, 1e-8, 0, false, false);
    }
    cr_assert(fabs(a.p - b.p) > 1e-4);
}

Test(optim, adam_large_tensor_crosses_chunks) {
    enum { N = 2500 };
    static float v[N], g[N];
    for (int i = 0; i < N; i++) v[i] = sinf((float)i), g[i] = cosf(0.3f * (float)i);
    na_tensor *p = param(N, v);
    na_adam_cfg c = NA_ADAMW_DEFAULTS;
    c.lr = 0.01;
    na_optim *o = adam_for(p, c, true);
    static adam_ref r[N];
    for (int i = 0; i < N; i++) r[i] = (adam_ref){.p = v[i]};
    for (int t = 1; t <= 3; t++) {
        for (int i = 0; i < N; i++) g[i] = cosf(0.3f * (float)i + (float)t);
        set_grad(p, g);
        cr_assert_eq(na_optim_step(o, NULL), NA_OK);
        for (int i = 0; i < N; i++) adam_ref_step(&r[i], g[i], t, 0.01, 0.9, 0.999, 1e-8, 1e-2, true, false);
    }
    for (int i = 0; i < N; i++) expect_near(na_get(p, i), r[i].p, 1e-5, "element");
    na_optim_free(o);
    na_tensor_free(p);
}

/* ---- behaviour ----------------------------------------------------------------------------------- */

Test(optim, step_without_gradients_changes_nothing) {
    na_tensor *p = param(2, (float[]){1, 2});
    na_adam_cfg c = NA_ADAMW_DEFAULTS;
    na_optim *o = adam_for(p, c, true);
    cr_assert_eq(na_optim_step(o, NULL), NA_OK);
    cr_assert_eq(na_get(p, 0), 1.0);
    cr_assert_eq(na_get(p, 1), 2.0);
    na_named_tensors st = {0};
    cr_assert_eq(na_optim_state(o, "", &st), NA_OK);
    cr_assert_eq(na_item(na_named_tensors_find(&st, "state.0.step")), 0.0);
    na_named_tensors_free(&st);
    /* a zero-filled gradient is a step: decoupled decay moves p */
    set_grad(p, (float[]){0, 0});
    cr_assert_eq(na_optim_zero_grad(o), NA_OK);
    cr_assert_not_null(p->grad, "zero_grad fills, it does not free");
    cr_assert_eq(na_optim_step(o, NULL), NA_OK);
    expect_near(na_get(p, 0), 1.0 * (1 - 1e-3 * 1e-2), 1e-7, "decayed");
    na_optim_free(o);
    na_tensor_free(p);
}

Test(optim, param_groups_have_their_own_lr_and_weight_decay) {
    na_tensor *a = param(1, (float[]){1}), *b = param(1, (float[]){1}), *c = param(1, (float[]){1});
    na_optim *o = na_sgd_new(NA_NO_TENSORS, &(na_sgd_cfg){.lr = 0.1});
    cr_assert_eq(na_optim_add_group(o, NA_TENSORS(a)), 0);
    cr_assert_eq(na_optim_add_group(o, NA_TENSORS(b)), 1);
    cr_assert_eq(na_optim_add_group(o, NA_TENSORS(c)), 2);
    cr_assert_eq(na_optim_set_lr(o, 1, 0.01), NA_OK);
    cr_assert_eq(na_optim_set_lr(o, 2, 0.0), NA_OK);
    cr_assert_eq(na_optim_set_weight_decay(o, 0, 0.5), NA_OK);
    for (int i = 0; i < 3; i++) set_grad((na_tensor *[]){a, b, c}[i], (float[]){1});
    cr_assert_eq(na_optim_step(o, NULL), NA_OK);
    expect_near(na_get(a, 0), 1 - 0.1 * (1 + 0.5), 1e-7, "group 0");
    expect_near(na_get(b, 0), 1 - 0.01, 1e-7, "group 1");
    cr_assert_eq(na_get(c, 0), 1.0, "lr 0 does not move");
    cr_assert_eq(na_optim_lr(o, 1), 0.01);
    cr_assert_eq(na_optim_initial_lr(o, 1), 0.1);
    cr_assert(isnan(na_optim_lr(o, 3)));
    cr_assert_eq(na_optim_param_group(o, 2), 2);
    cr_assert_neq(na_optim_set_lr(o, 0, -1), NA_OK);
    cr_assert_neq(na_optim_set_lr(o, 7, 0.1), NA_OK);
    cr_assert_eq(na_optim_set_lr(o, -1, 0.3), NA_OK);
    cr_assert_eq(na_optim_lr(o, 2), 0.3);
    na_optim_free(o);
    na_tensor_free(a), na_tensor_free(b), na_tensor_free(c);
}

Test(optim, add_group_rejects_bad_parameters) {
    na_tensor *a = param(1, (float[]){1});
    na_tensor *frozen = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1));
    na_optim *o = na_sgd_new(NA_NO_TENSORS, NULL);
    cr_assert_eq(na_optim_add_group(o, NA_TENSORS(a)), 0);
    cr_assert_lt(na_optim_add_group(o, NA_TENSORS(a)), 0);
    cr_assert(strstr(na_last_error(), "already in the optimizer"), "%s", na_last_error());
    cr_assert_lt(na_optim_add_group(o, NA_TENSORS(frozen)), 0);
    cr_assert(strstr(na_last_error(), "requires grad"), "%s", na_last_error());
    na_tensor *step = na_zeros(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(1));
    na_tensor_set_requires_grad(step, true);
    cr_assert_lt(na_optim_add_group(o, NA_TENSORS(step)), 0);
    cr_assert_eq(na_optim_num_groups(o), 1);
    cr_assert_eq(na_optim_num_params(o), 1);
    na_optim_free(o);
    na_tensor_free(a), na_tensor_free(frozen);
}

Test(optim, made_from_a_module) {
    na_module *net = NA_SEQUENTIAL(na_linear_new(3, 4, true), na_batch_norm1d_new(4, NULL),
                                   na_linear_new(4, 2, false));
    na_tensor *frozen = na_module_get(net, "1.bias");
    cr_assert_eq(na_tensor_set_requires_grad(frozen, false), NA_OK);
    na_optim *o = na_adamw_new(na_module_parameters(net), NULL);
    cr_assert_not_null(o, "%s", na_last_error());
    na_step_end(); /* the list was a step list: the optimizer keeps its own copy (the forward
                    * below reuses that memory) */
    cr_assert_eq(na_optim_num_params(o), 4, "a frozen parameter is left out");
    cr_assert_eq(na_optim_param(o, 2), na_module_get(net, "1.weight"));
    cr_assert_eq(na_optim_param(o, 3), na_module_get(net, "2.weight"));
    cr_assert_eq(na_optim_kind_of(o), NA_OPTIM_ADAMW);
    cr_assert_eq(na_optim_weight_decay(o, 0), 1e-2);
    na_tensor *y = na_module_forward(net, na_ones(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3, 3)));
    cr_assert_eq(na_backward(na_sum(y), NULL), NA_OK);
    float before = (float)na_get(na_module_get(net, "0.weight"), 0);
    cr_assert_eq(na_optim_step(o, NULL), NA_OK, "%s", na_last_error());
    cr_assert_neq((float)na_get(na_module_get(net, "0.weight"), 0), before);
    na_optim_free(o);
    /* a failed list keeps its maker's message */
    cr_assert_null(na_sgd_new(na_module_parameters(NULL), NULL));
    cr_assert(strstr(na_last_error(), "na_module_parameters: NULL module"), "%s",
              na_last_error());
    cr_assert_null(na_adam_new((na_tensor_list){2, NULL}, NULL));
    cr_assert(strstr(na_last_error(), "na_adam_new"), "%s", na_last_error());
    na_module_free(net);
}

Test(optim, invalid_settings_are_rejected) {
    enum { SGD, ADAM, ADAMW };
    struct {
        int kind;
        na_sgd_cfg s;
        na_adam_cfg a;
        const char *msg;
    } cases[] = {
        {SGD, .s = {.lr = -1}, .msg = "na_sgd_new: invalid learning rate -1 (expected a finite "
                                      "value >= 0)"},
        {SGD, .s = {.lr = INFINITY}, .msg = "invalid learning rate inf"},
        {SGD, .s = {.lr = 0.1, .momentum = 3e38}, .msg = "invalid momentum 3e+38 (expected 0 <= "
                                                         "momentum < 1)"},
        {SGD, .s = {.lr = 0.1, .momentum = INFINITY}, .msg = "invalid momentum inf"},
        {SGD, .s = {.lr = 0.1, .momentum = 1}, .msg = "invalid momentum 1"},
        {SGD, .s = {.lr = 0.1, .weight_decay = INFINITY}, .msg = "invalid weight_decay inf"},
        {SGD, .s = {.lr = 0.1, .momentum = 0.9, .dampening = 2}, .msg = "invalid dampening 2"},
        {ADAMW, .a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .eps = INFINITY},
         .msg = "invalid eps inf"},
        {SGD, .s = {.lr = 0.1, .momentum = -0.5}, .msg = "invalid momentum -0.5"},
        {SGD, .s = {.lr = 0.1, .weight_decay = -1}, .msg = "invalid weight_decay -1"},
        {SGD, .s = {.lr = 0.1, .nesterov = true}, .msg = "nesterov momentum requires a momentum > 0"},
        {SGD, .s = {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true},
         .msg = "zero dampening"},
        {ADAM, .a = {.lr = 1e-3, .beta1 = 1.0, .beta2 = 0.999},
         .msg = "na_adam_new: invalid beta1 1 (expected 0 <= beta1 < 1)"},
        {ADAM, .a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = -0.1}, .msg = "invalid beta2 -0.1"},
        {ADAMW, .a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .eps = -1}, .msg = "invalid eps -1"},
        {ADAMW, .a = {.lr = NAN, .beta1 = 0.9, .beta2 = 0.99}, .msg = "invalid learning rate nan"},
        {ADAM, .a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = -0.1},
         .msg = "invalid weight_decay -0.1"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        na_clear_error();
        na_optim *o = cases[k].kind == SGD    ? na_sgd_new(NA_NO_TENSORS, &cases[k].s)
                      : cases[k].kind == ADAM ? na_adam_new(NA_NO_TENSORS, &cases[k].a)
                                              : na_adamw_new(NA_NO_TENSORS, &cases[k].a);
        cr_assert_null(o, "case %zu accepted", k);
        cr_assert_eq(na_last_status(), NA_EINVAL);
        cr_assert(strstr(na_last_error(), cases[k].msg), "case %zu: '%s' lacks '%s'", k,
                  na_last_error(), cases[k].msg);
    }
}

/* Values loaded through the state list (a checkpoint) are checked at once by na_optim_check,
 * naming the key, and a NaN base lr is an error of the schedule, not a skipped lr update. */
Test(optim, loaded_hyper_parameters_are_checked_naming_the_key) {
    na_tensor *p = param(2, (float[]){1, 2});
    struct {
        const char *key;
        double value;
        const char *msg;
    } cases[] = {
        {"group.0.momentum", 3e38, "optim.group.0.momentum: invalid momentum 3e+38 (expected 0 <= "
                                   "momentum < 1)"},
        {"group.0.momentum", INFINITY, "optim.group.0.momentum: invalid momentum inf"},
        {"group.0.weight_decay", INFINITY, "optim.group.0.weight_decay: invalid weight_decay inf"},
        {"group.0.initial_lr", NAN, "optim.group.0.initial_lr: invalid initial learning rate nan"},
        {"group.0.lr", -1, "optim.group.0.lr: invalid learning rate -1"},
        {"group.0.dampening", 0.5, "optim.group.0: nesterov momentum requires"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        na_optim *o = na_sgd_new(NA_TENSORS(p), &(na_sgd_cfg){.lr = 0.1, .momentum = 0.9,
                                                                .nesterov = true});
        cr_assert_not_null(o, "%s", na_last_error());
        cr_assert_eq(na_optim_check(o, "optim."), NA_OK, "%s", na_last_error());
        na_named_tensors st = {0};
        cr_assert_eq(na_optim_state(o, "", &st), NA_OK);
        na_fill_(na_named_tensors_find(&st, cases[k].key), cases[k].value);
        cr_assert_eq(na_optim_check(o, "optim."), NA_EINVAL, "case %zu accepted", k);
        cr_assert(strstr(na_last_error(), cases[k].msg), "case %zu: '%s' lacks '%s'", k,
                  na_last_error(), cases[k].msg);
        na_named_tensors_free(&st);
        na_optim_free(o);
    }
    /* the schedule says so instead of keeping the old lr */
    na_optim *o = na_sgd_new(NA_TENSORS(p), &(na_sgd_cfg){.lr = 0.1});
    na_named_tensors st = {0};
    cr_assert_eq(na_optim_state(o, "", &st), NA_OK);
    na_fill_(na_named_tensors_find(&st, "group.0.initial_lr"), NAN);
    na_clear_error();
    na_lr_schedule sched = na_lr_constant();
    cr_assert_eq(na_lr_schedule_apply(&sched, o, 0), NA_EINVAL);
    cr_assert(strstr(na_last_error(), "group 0's initial_lr is nan"), "%s", na_last_error());
    cr_assert_neq(na_optim_set_lr(o, 0, INFINITY), NA_OK);
    na_named_tensors_free(&st);
    na_optim_free(o);
    na_tensor_free(p);
}

/* ---- mixed precision hooks ------------------------------------------------------------------------ */

static void snapshot(na_optim *o, na_tensor *p, float *out, int64_t cap, int64_t *n) {
    na_named_tensors st = {0};
    cr_assert_eq(na_optim_state(o, "", &st), NA_OK);
    *n = 0;
    for (int64_t i = 0; i < p->numel; i++) out[(*n)++] = (float)na_get(p, i);
    for (int64_t k = 0; k < st.n; k++)
        for (int64_t i = 0; i < st.items[k].tensor->numel; i++) {
            cr_assert_lt(*n, cap);
            out[(*n)++] = (float)na_get(st.items[k].tensor, i);
        }
    na_named_tensors_free(&st);
}

Test(optim, found_inf_skips_everything) {
    na_tensor *p = param(3, (float[]){1, 2, 3});
    na_adam_cfg c = NA_ADAMW_DEFAULTS;
    c.amsgrad = true;
    na_optim *o = adam_for(p, c, true);
    set_grad(p, (float[]){0.1f, -0.2f, 0.3f});
    cr_assert_eq(na_optim_step(o, NULL), NA_OK);
    float before[64], after[64];
    int64_t nb, na;
    snapshot(o, p, before, 64, &nb);
    na_tensor *inf = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, 0, NULL);
    na_fill_(inf, 1.0);
    set_grad(p, (float[]){INFINITY, 1, 1});
    cr_assert_eq(na_optim_step(o, &(na_optim_step_opts){.found_inf = inf}), NA_OK);
    snapshot(o, p, after, 64, &na);
    cr_assert_eq(na, nb);
    cr_assert_eq(memcmp(before, after, (size_t)nb * sizeof(float)), 0, "nothing changed");
    na_fill_(inf, 0.0);
    set_grad(p, (float[]){0.1f, -0.2f, 0.3f});
    cr_assert_eq(na_optim_step(o, &(na_optim_step_opts){.found_inf = inf}), NA_OK);
    snapshot(o, p, after, 64, &na);
    cr_assert_neq(memcmp(before, after, (size_t)nb * sizeof(float)), 0, "a clean flag steps");
    /* a flag of the wrong kind is an error, not a silent step */
    na_tensor *bad = na_tensor_new(NA_DTYPE_F64, NA_DEVICE_CPU, 0, NULL);
    cr_assert_neq(na_optim_step(o, &(na_optim_step_opts){.found_inf = bad}), NA_OK);
    cr_assert(strstr(na_last_error(), "found_inf"), "%s", na_last_error());
    na_tensor_free(inf), na_tensor_free(bad);
    na_optim_free(o);
    na_tensor_free(p);
}

Test(optim, inv_scale_unscales_gradients) {
    na_tensor *a = param(2, (float[]){1, -1}), *b = param(2, (float[]){1, -1});
    na_sgd_cfg c = {.lr = 0.1, .momentum = 0.9};
    na_optim *oa = sgd_for(a, c), *ob = sgd_for(b, c);
    na_tensor *inv = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, 0, NULL);
    na_fill_(inv, 1.0 / 1024);
    for (int t = 0; t < 2; t++) {
        set_grad(a, (float[]){0.3f, 0.7f});
        set_grad(b, (float[]){0.3f * 1024, 0.7f * 1024});
        cr_assert_eq(na_optim_step(oa, NULL), NA_OK);
        cr_assert_eq(na_optim_step(ob, &(na_optim_step_opts){.inv_scale = inv}), NA_OK);
    }
    cr_assert_eq(memcmp(a->data, b->data, 2 * sizeof(float)), 0);
    na_tensor_free(inv);
    na_optim_free(oa), na_optim_free(ob);
    na_tensor_free(a), na_tensor_free(b);
}

Test(optim, master_weights_take_half_grads_and_write_half_copies) {
    /* f32 master weights, f16 model gradients in, f16 model weights out: Apex O2's step */
    float v[3] = {0.1f, 1.0f / 3, -2.5f}, g[3] = {0.01f, -0.7f, 1.1f};
    na_tensor *master = param(3, v), *ref = param(3, v);
    na_tensor *gh = na_tensor_new(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(3));
    na_tensor *model = na_tensor_new(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(3));
    na_copy_(gh, na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(3), g));
    na_adam_cfg c = NA_ADAM_DEFAULTS;
    na_optim *om = adam_for(master, c, false), *or_ = adam_for(ref, c, false);
    cr_assert_eq(na_optim_step(om, &(na_optim_step_opts){.grads = &gh, .copies = &model}), NA_OK,
                 "%s", na_last_error());
    float gr[3];
    for (int i = 0; i < 3; i++) gr[i] = (float)na_get(gh, i); /* the f16 values, in f32 */
    set_grad(ref, gr);
    cr_assert_eq(na_optim_step(or_, NULL), NA_OK);
    cr_assert_eq(memcmp(master->data, ref->data, 3 * sizeof(float)), 0);
    cr_assert_null(master->grad, "the master's own .grad was not used");
    na_tensor *rounded = na_cast(master, NA_DTYPE_F16);
    for (int i = 0; i < 3; i++) cr_assert_eq(na_get(model, i), na_get(rounded, i));
    na_optim_free(om), na_optim_free(or_);
    na_tensor_free(master), na_tensor_free(ref), na_tensor_free(gh), na_tensor_free(model);
}

/* ---- state save/load ------------------------------------------------------------------------------- */

enum { LS_N = 50 };

static void lockstep_grad(na_tensor *p, int t) {
    float g[LS_N];
    for (int i = 0; i < LS_N; i++) g[i] = sinf(0.37f * (float)i + 1.3f * (float)t) * (1 + (float)(i % 3));
    set_grad(p, g);
}

/* Trains `a` 10 steps, loads its state (by name) into a fresh optimizer `b` over a copy of the
 * parameter, then steps both 10 more times: params and every state tensor stay identical. */
static void lockstep(na_optim *(*make)(na_tensor *)) {
    float v[LS_N];
    for (int i = 0; i < LS_N; i++) v[i] = cosf((float)i);
    na_tensor *pa = param(LS_N, v);
    na_optim *a = make(pa);
    for (int t = 0; t < 10; t++) {
        if (t == 5) na_optim_set_lr(a, 0, na_optim_lr(a, 0) * 0.5); /* also restored */
        lockstep_grad(pa, t);
        cr_assert_eq(na_optim_step(a, NULL), NA_OK, "%s", na_last_error());
    }
    na_tensor *pb = param(LS_N, v);
    cr_assert_eq(na_copy_(pb, pa), NA_OK);
    na_optim *b = make(pb);
    na_named_tensors sa = {0}, sb = {0};
    cr_assert_eq(na_optim_state(a, "", &sa), NA_OK);
    cr_assert_eq(na_optim_state(b, "", &sb), NA_OK);
    cr_assert_eq(sa.n, sb.n);
    for (int64_t k = 0; k < sb.n; k++) { /* what a checkpoint round trip does, by name */
        na_tensor *src = na_named_tensors_find(&sa, sb.items[k].name);
        cr_assert_not_null(src, "%s", sb.items[k].name);
        cr_assert_eq(na_copy_(sb.items[k].tensor, src), NA_OK);
    }
    cr_assert_eq(na_optim_lr(b, 0), na_optim_lr(a, 0));
    for (int t = 10; t < 20; t++) {
        lockstep_grad(pa, t);
        lockstep_grad(pb, t);
        cr_assert_eq(na_optim_step(a, NULL), NA_OK);
        cr_assert_eq(na_optim_step(b, NULL), NA_OK);
        cr_assert_eq(memcmp(pa->data, pb->data, LS_N * sizeof(float)), 0, "step %d", t);
    }
    for (int64_t k = 0; k < sa.n; k++) {
        const na_tensor *x = sa.items[k].tensor, *y = na_named_tensors_find(&sb, sa.items[k].name);
        for (int64_t i = 0; i < x->numel; i++)
            cr_assert_eq(na_get(x, i), na_get(y, i), "%s[%lld]", sa.items[k].name, (long long)i);
    }
    cr_assert_eq(na_item(na_named_tensors_find(&sb, "state.0.step")), 20);
    na_named_tensors_free(&sa), na_named_tensors_free(&sb);
    na_optim_free(a), na_optim_free(b);
    na_tensor_free(pa), na_tensor_free(pb);
}

static na_optim *make_sgd(na_tensor *p) {
    return sgd_for(p, (na_sgd_cfg){.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 1e-3});
}
static na_optim *make_adam(na_tensor *p) {
    na_adam_cfg c = NA_ADAM_DEFAULTS;
    c.amsgrad = true, c.weight_decay = 1e-2;
    return adam_for(p, c, false);
}
static na_optim *make_adamw(na_tensor *p) {
    na_adam_cfg c = NA_ADAMW_DEFAULTS;
    return adam_for(p, c, true);
}

Test(optim, state_save_load_then_lockstep) {
    lockstep(make_sgd);
    lockstep(make_adam);
    lockstep(make_adamw);
}

Test(optim, state_names) {
    na_tensor *ps[2] = {param(2, (float[]){1, 2}), param(1, (float[]){3})};
    na_adam_cfg c = NA_ADAM_DEFAULTS;
    c.amsgrad = true;
    na_optim *o = na_adam_new(NA_NO_TENSORS, &c);
    cr_assert_eq(na_optim_add_group(o, (na_tensor_list){2, ps}), 0);
    na_named_tensors st = {0};
    cr_assert_eq(na_optim_state(o, "", &st), NA_OK);
    const char *names[] = {"state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq",
                           "state.0.max_exp_avg_sq", "state.1.step", "state.1.exp_avg",
                           "state.1.exp_avg_sq", "state.1.max_exp_avg_sq", "group.0.lr",
                           "group.0.weight_decay", "group.0.initial_lr", "group.0.beta1",
                           "group.0.beta2", "group.0.eps"};
    cr_assert_eq(st.n, 14);
    for (int i = 0; i < 14; i++) cr_assert_str_eq(st.items[i].name, names[i]);
    cr_assert_eq(st.items[0].tensor->ndim, 0);
    cr_assert_eq(st.items[0].tensor->dtype, NA_DTYPE_F32);
    cr_assert_eq(st.items[1].tensor->shape[0], 2);
    cr_assert_eq(st.items[8].tensor->dtype, NA_DTYPE_F64);
    cr_assert_eq(na_item(st.items[12].tensor), 0.999);
    na_named_tensors_free(&st);
    na_optim_free(o);

    o = na_sgd_new(NA_NO_TENSORS, &(na_sgd_cfg){.lr = 0.1, .momentum = 0.9});
    cr_assert_eq(na_optim_add_group(o, NA_TENSORS(ps[0])), 0);
    cr_assert_eq(na_optim_state(o, "", &st), NA_OK);
    const char *sgd_names[] = {"state.0.step", "state.0.momentum_buffer", "group.0.lr",
                               "group.0.weight_decay", "group.0.initial_lr", "group.0.momentum",
                               "group.0.dampening"};
    cr_assert_eq(st.n, 7);
    for (int i = 0; i < 7; i++) cr_assert_str_eq(st.items[i].name, sgd_names[i]);
    /* a loaded invalid value is caught at the next step */
    na_fill_(na_named_tensors_find(&st, "group.0.lr"), -1.0);
    set_grad(ps[0], (float[]){1, 1});
    cr_assert_neq(na_optim_step(o, NULL), NA_OK);
    cr_assert(strstr(na_last_error(), "invalid learning rate"), "%s", na_last_error());
    na_named_tensors_free(&st);
    na_optim_free(o);
    na_tensor_free(ps[0]), na_tensor_free(ps[1]);
}

/* ---- schedules ----------------------------------------------------------------------------------- */

static double lr_at(na_lr_schedule s, double base, int64_t t) {
    double lr = na_lr_schedule_lr(&s, base, t);
    cr_assert_not(isnan(lr), "t=%lld: %s", (long long)t, na_last_error());
    return lr;
}

Test(optim, step_and_cosine_and_linear_schedules) {
    const double step_want[7] = {1, 1, 1, 0.1, 0.1, 0.1, 0.01};
    for (int t = 0; t < 7; t++) expect_near(lr_at(na_lr_step(3, 0.1), 1.0, t), step_want[t], 1e-12, "step");
    for (int t = 0; t <= 10; t++)
        expect_near(lr_at(na_lr_cosine(10, 0.1), 1.0, t), 0.1 + 0.9 * (1 + cos(M_PI * t / 10)) / 2,
                    1e-12, "cosine");
    expect_near(lr_at(na_lr_cosine(10, 0.1), 1.0, 5), 0.55, 1e-12, "cosine midpoint");
    expect_near(lr_at(na_lr_cosine(10, 0.1), 1.0, 10), 0.1, 1e-12, "cosine end");
    for (int t = 0; t <= 7; t++)
        expect_near(lr_at(na_lr_linear(1.0 / 3, 1.0, 5), 0.3, t),
                    0.3 * (1.0 / 3 + (2.0 / 3) * (t < 5 ? t : 5) / 5.0), 1e-12, "linear");
    expect_near(lr_at(na_lr_constant(), 0.3, 99), 0.3, 0, "constant");
    na_lr_schedule bad = na_lr_step(0, 0.1);
    cr_assert(isnan(na_lr_schedule_lr(&bad, 1, 1)));
    bad = na_lr_linear(0, 1, 5);
    cr_assert(isnan(na_lr_schedule_lr(&bad, 1, 1)));
}

Test(optim, one_cycle_schedule) {
    na_lr_schedule s = na_lr_one_cycle(100); /* phase 1 ends at 0.3*100 - 1 = 29 */
    double max = 1.0, lo = max / 25, min = lo / 1e4;
    expect_near(lr_at(s, max, 0), lo, 1e-12, "start: max/div_factor");
    expect_near(lr_at(s, max, 29), max, 1e-12, "peak");
    expect_near(lr_at(s, max, 99), min, 1e-9, "end: start/final_div_factor");
    for (int t = 0; t <= 29; t++)
        expect_near(lr_at(s, max, t), max + (lo - max) / 2 * (cos(M_PI * t / 29.0) + 1), 1e-12, "warm");
    for (int t = 30; t <= 99; t++)
        expect_near(lr_at(s, max, t), min + (max - min) / 2 * (cos(M_PI * (t - 29) / 70.0) + 1), 1e-12,
                    "anneal");
    expect_near(lr_at(s, max, 64), (max + min) / 2, 1e-12, "halfway down");
    cr_assert_not(isnan(na_lr_schedule_lr(&s, max, 100)), "t == total_steps is allowed");
    cr_assert(isnan(na_lr_schedule_lr(&s, max, 101)));
    cr_assert(strstr(na_last_error(), "tried to step 101 times"), "%s", na_last_error());

    s.anneal_linear = true;
    expect_near(lr_at(s, max, 10), lo + (max - lo) * 10 / 29.0, 1e-12, "linear warm");
    s.anneal_linear = false;
    s.three_phase = true; /* ends 29, 58, 99 */
    expect_near(lr_at(s, max, 29), max, 1e-12, "3-phase peak");
    expect_near(lr_at(s, max, 58), lo, 1e-12, "3-phase back to start");
    expect_near(lr_at(s, max, 99), min, 1e-9, "3-phase end");
}

Test(optim, schedule_sets_every_group_from_its_initial_lr) {
    na_tensor *a = param(1, (float[]){1}), *b = param(1, (float[]){1});
    na_optim *o = na_sgd_new(NA_NO_TENSORS, &(na_sgd_cfg){.lr = 0.1});
    na_optim_add_group(o, NA_TENSORS(a));
    na_optim_add_group(o, NA_TENSORS(b));
    cr_assert_eq(na_optim_set_initial_lr(o, 1, 0.02), NA_OK); /* group 1's own base lr */
    cr_assert_eq(na_optim_lr(o, 1), 0.02);
    na_lr_schedule s = na_lr_step(2, 0.5);
    cr_assert_eq(na_lr_schedule_apply(&s, o, 3), NA_OK);
    expect_near(na_optim_lr(o, 0), 0.05, 1e-12, "group 0");
    expect_near(na_optim_lr(o, 1), 0.01, 1e-12, "group 1");
    cr_assert_eq(na_lr_schedule_apply(&s, o, 0), NA_OK);
    expect_near(na_optim_lr(o, 0), 0.1, 1e-12, "back to the base");
    na_lr_schedule bad = na_lr_one_cycle(10);
    cr_assert_neq(na_lr_schedule_apply(&bad, o, 11), NA_OK);
    na_optim_free(o);
    na_tensor_free(a), na_tensor_free(b);
}

/* The learning rate read from the device scalar (what a replayed CUDA graph needs) gives the
 * host value's update bit for bit, over a schedule that changes it every step. */
static void lr_on_device_lockstep(na_optim *(*make)(na_tensor *p)) {
    enum { N = 300, STEPS = 25 };
    float v[N], g[N];
    for (int i = 0; i < N; i++) v[i] = sinf((float)i);
    na_tensor *a = param(N, v), *b = param(N, v);
    na_optim *oa = make(a), *ob = make(b);
    cr_assert_eq(na_optim_set_lr_on_device(ob, true), NA_OK, "%s", na_last_error());
    cr_assert(na_optim_lr_on_device(ob) && !na_optim_lr_on_device(oa));
    na_lr_schedule s = na_lr_one_cycle(STEPS);
    for (int t = 0; t < STEPS; t++) {
        cr_assert_eq(na_lr_schedule_apply(&s, oa, t), NA_OK);
        cr_assert_eq(na_lr_schedule_apply(&s, ob, t), NA_OK);
        for (int i = 0; i < N; i++) g[i] = cosf((float)(i * (t + 1)));
        set_grad(a, g), set_grad(b, g);
        cr_assert_eq(na_optim_step(oa, NULL), NA_OK);
        cr_assert_eq(na_optim_step(ob, NULL), NA_OK, "%s", na_last_error());
        cr_assert(!memcmp(a->data, b->data, sizeof v), "step %d: parameters differ", t);
    }
    /* a value loaded into the state list (the host copy) reaches the device copy at the step */
    na_named_tensors l = {0};
    cr_assert_eq(na_optim_state(ob, "", &l), NA_OK);
    for (int64_t i = 0; i < l.n; i++)
        if (!strcmp(l.items[i].name, "group.0.lr")) *(double *)l.items[i].tensor->data = 0;
    na_named_tensors_free(&l);
    memcpy(v, b->data, sizeof v);
    cr_assert_eq(na_optim_step(ob, NULL), NA_OK);
    cr_assert(!memcmp(v, b->data, sizeof v), "lr 0 loaded through the state list: no change");
    cr_assert_eq(na_optim_set_lr_on_device(ob, false), NA_OK);
    cr_assert_not(na_optim_lr_on_device(ob));
    na_optim_free(oa), na_optim_free(ob);
    na_tensor_free(a), na_tensor_free(b);
}
static na_optim *make_nesterov(na_tensor *p) {
    return na_sgd_new(NA_TENSORS(p), &(na_sgd_cfg){.lr = 0.3, .momentum = 0.9, .nesterov = true,
                                                   .weight_decay = 1e-3});
}
static na_optim *make_adamw_lr(na_tensor *p) {
    na_adam_cfg c = NA_ADAMW_DEFAULTS;
    c.lr = 0.01;
    return na_adamw_new(NA_TENSORS(p), &c);
}
Test(optim, lr_on_device_matches_host_lr_over_a_schedule) {
    lr_on_device_lockstep(make_nesterov);
    lr_on_device_lockstep(make_adamw_lr);
}

Test(optim, lr_on_device_covers_groups_added_later) {
    na_tensor *a = param(1, (float[]){1}), *b = param(1, (float[]){1});
    na_optim *o = na_sgd_new(NA_TENSORS(a), &(na_sgd_cfg){.lr = 0.5});
    cr_assert_eq(na_optim_set_lr_on_device(o, true), NA_OK);
    cr_assert_geq(na_optim_add_group(o, NA_TENSORS(b)), 0, "%s", na_last_error());
    cr_assert_eq(na_optim_set_lr(o, 1, 0.25), NA_OK);
    set_grad(a, (float[]){1}), set_grad(b, (float[]){1});
    cr_assert_eq(na_optim_step(o, NULL), NA_OK);
    cr_assert_eq(na_item(a), 0.5);
    cr_assert_eq(na_item(b), 0.75);
    cr_assert_eq(na_optim_set_lr_on_device(NULL, true), NA_EINVAL);
    na_optim_free(o);
    na_tensor_free(a), na_tensor_free(b);
}

/* ---- clipping ------------------------------------------------------------------------------------- */

Test(optim, clip_grad_norm) {
    na_tensor *a = param(2, (float[]){0, 0}), *b = param(1, (float[]){0}), *none = param(1, (float[]){0});
    set_grad(a, (float[]){3, 4});
    set_grad(b, (float[]){12});
    na_tensor *ps[3] = {a, none, b};
    na_tensor *n = na_clip_grad_norm((na_tensor_list){3, ps}, 100.0);
    cr_assert_not_null(n, "%s", na_last_error());
    cr_assert_eq(na_item(n), 13.0, "sqrt(9 + 16 + 144)");
    cr_assert_eq(na_get(a->grad, 0), 3.0, "below max_norm: unchanged");
    n = na_clip_grad_norm((na_tensor_list){3, ps}, 1.3);
    cr_assert_eq(na_item(n), 13.0);
    double coef = (double)(1.3f / (13.0f + 1e-6f));
    expect_near(na_get(a->grad, 0), 3 * coef, 1e-6, "a0");
    expect_near(na_get(a->grad, 1), 4 * coef, 1e-6, "a1");
    expect_near(na_get(b->grad, 0), 12 * coef, 1e-6, "b0");
    expect_near(na_item(na_clip_grad_norm((na_tensor_list){3, ps}, INFINITY)), 1.3, 1e-6, "clipped norm");

    set_grad(b, (float[]){INFINITY});
    set_grad(a, (float[]){3, 4});
    n = na_clip_grad_norm((na_tensor_list){3, ps}, 1.0);
    cr_assert(isinf(na_item(n)), "a non-finite norm is reported");
    cr_assert_eq(na_get(a->grad, 0), 3.0, "and the gradients are left alone");
    set_grad(b, (float[]){NAN});
    cr_assert(isnan(na_item(na_clip_grad_norm((na_tensor_list){3, ps}, 1.0))));
    cr_assert_null(na_clip_grad_norm((na_tensor_list){3, ps}, -1.0));

    /* f16 gradients: the factor is applied in their dtype */
    na_tensor *h = na_tensor_new(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(2));
    na_tensor_set_requires_grad(h, true);
    h->grad = na_tensor_new(NA_DTYPE_F16, NA_DEVICE_CPU, NA_SHAPE(2));
    na_copy_(h->grad, na_from_host(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2), (float[]){6, 8}));
    expect_near(na_item(na_clip_grad_norm(NA_TENSORS(h), 5.0)), 10.0, 0, "f16 norm");
    expect_near(na_get(h->grad, 0), 3.0, 1e-3, "f16 clipped");

    na_optim *o = na_sgd_new(NA_NO_TENSORS, NULL);
    na_optim_add_group(o, NA_TENSORS(a));
    set_grad(a, (float[]){3, 4});
    expect_near(na_item(na_optim_clip_grad_norm(o, 1.0)), 5.0, 1e-7, "optimizer's parameters");
    expect_near(na_get(a->grad, 1), 4 * (double)(1.0f / (5.0f + 1e-6f)), 1e-6, "clipped");
    na_optim_free(o);
    na_tensor_free(a), na_tensor_free(b), na_tensor_free(none), na_tensor_free(h);
}

/* A step writes the parameters in place: a retained graph that saved them (mul reads both
 * inputs) cannot be walked again afterwards, as in PyTorch ("modified by an inplace
 * operation"); before the step it can. */
Test(optim, a_step_invalidates_a_retained_graph_that_saved_the_parameter) {
    na_tensor *p = param(2, (const float[]){1, 2});
    p->name = "w";
    na_optim *o = sgd_for(p, (na_sgd_cfg){.lr = 0.1});
    na_tensor *loss = na_sum(na_mul(p, p));
    cr_assert_not_null(loss, "%s", na_last_error());
    cr_assert_eq(na_backward_retain(loss, NULL), NA_OK, "%s", na_last_error());
    cr_assert_eq(na_optim_step(o, NULL), NA_OK, "%s", na_last_error());
    na_clear_error();
    cr_assert_eq(na_backward(loss, NULL), NA_ESTATE);
    cr_assert(strstr(na_last_error(), "modified by an inplace operation: [2] f32 cpu (w), input 0 "
                     "of mul"), "%s", na_last_error());
    na_optim_free(o);
    na_tensor_free(p);
}
