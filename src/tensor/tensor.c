/* Tensors: construction, the two lifetimes, moving data, describing (see nanoamp/tensor.h). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dense_order.h"
#include "common/float8.h"
#include "src/tensor/arena.h"
#include "src/tensor/deferred_zero.h"
#include "src/tensor/tensor_internal.h"

/* ---- geometry ------------------------------------------------------------------------ */

int64_t na_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

void na_set_contiguous_strides(na_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i];
    }
}

bool na_is_contiguous(const na_tensor *t) { return na_view_is_c_order(&t->view); }

bool na_same_shape(const na_tensor *a, const na_tensor *b) {
    return na_view_same_shape(&a->view, &b->view);
}

const char *na_tensor_describe(const na_tensor *t, char *buf, size_t size) {
    if (!t) {
        snprintf(buf, size, "(null)");
        return buf;
    }
    size_t k = 0;
    k += (size_t)snprintf(buf + k, size - k, "[");
    for (int i = 0; i < t->ndim && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, i ? ", %" PRId64 : "%" PRId64, t->shape[i]);
    if (k < size)
        snprintf(buf + k, size - k, "] %s %s", na_dtype_name(t->dtype), na_device_name(t->device));
    return buf;
}

const char *na_tensor_describe_named(const na_tensor *t, char *buf, size_t size) {
    na_tensor_describe(t, buf, size);
    size_t k = strlen(buf);
    if (t && t->name && k < size) snprintf(buf + k, size - k, " (%s)", t->name);
    return buf;
}

static bool check_shape(const char *fn, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > NA_MAX_DIMS) {
        na_set_error(NA_ESHAPE, "%s: %d dims requested, at most %d are supported", fn, ndim,
                     NA_MAX_DIMS);
        return false;
    }
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            na_set_error(NA_ESHAPE, "%s: dim %d has negative size %" PRId64, fn, i, shape[i]);
            return false;
        }
        if (shape[i] && n > INT64_MAX / 16 / shape[i]) {
            na_set_error(NA_ESHAPE, "%s: shape too large (overflow at dim %d)", fn, i);
            return false;
        }
        n *= shape[i];
    }
    return true;
}

static bool check_dtype_device(const char *fn, na_dtype dt, na_device dev) {
    if ((unsigned)dt >= NA_DTYPE_COUNT) {
        na_set_error(NA_EDTYPE, "%s: unknown dtype %d", fn, (int)dt);
        return false;
    }
    return na_backend_get(dev) != NULL;
}

/* ---- step tensors ----------------------------------------------------------------------- */

na_tensor *na_tensor_header(na_dtype dt, na_device dev, int ndim, const int64_t *shape) {
    na_tensor *t = na_arena_host_alloc(sizeof *t);
    if (!t) return NULL;
    t->dtype = dt;
    t->device = dev;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->numel = na_shape_numel(ndim, shape);
    na_set_contiguous_strides(t);
    return t;
}

na_tensor *na_tensor_view_header(na_tensor *base) {
    na_tensor *t = na_arena_host_alloc(sizeof *t);
    if (!t) return NULL;
    t->dtype = base->dtype;
    t->device = base->device;
    t->ndim = base->ndim;
    memcpy(t->shape, base->shape, sizeof t->shape);
    memcpy(t->stride, base->stride, sizeof t->stride);
    t->numel = base->numel;
    t->data = base->data;
    t->base = base->base ? base->base : base;
    t->name = base->name;
    return t;
}

na_tensor *na_empty(na_dtype dt, na_device dev, int ndim, const int64_t *shape) {
    if (!check_shape("na_empty", ndim, shape) || !check_dtype_device("na_empty", dt, dev))
        return NULL;
    na_tensor *t = na_tensor_header(dt, dev, ndim, shape);
    if (!t) return NULL;
    t->data = na_arena_data_alloc(dev, (size_t)t->numel * na_dtype_size(dt));
    return t->data ? t : NULL;
}

void na_tensor_release(na_tensor *t) {
    if (!t || t->base || t->persistent || !t->data) return;
    na_arena_data_free(t->device, t->data, (size_t)t->numel * na_dtype_size(t->dtype));
    t->data = NULL;
}

na_tensor *na_full(na_dtype dt, na_device dev, int ndim, const int64_t *shape, double value) {
    na_tensor *t = na_empty(dt, dev, ndim, shape);
    if (!t || na_fill_(t, value) != NA_OK) return NULL;
    return t;
}
na_tensor *na_zeros(na_dtype dt, na_device dev, int ndim, const int64_t *shape) {
    return na_full(dt, dev, ndim, shape, 0.0);
}
na_tensor *na_ones(na_dtype dt, na_device dev, int ndim, const int64_t *shape) {
    return na_full(dt, dev, ndim, shape, 1.0);
}
na_tensor *na_scalar(na_dtype dt, na_device dev, double value) {
    return na_full(dt, dev, 0, NULL, value);
}
na_tensor *na_empty_like(const na_tensor *t) {
    return na_empty(t->dtype, t->device, t->ndim, t->shape);
}
na_tensor *na_zeros_like(const na_tensor *t) {
    return na_zeros(t->dtype, t->device, t->ndim, t->shape);
}

na_tensor *na_arange(na_dtype dt, na_device dev, double start, double stop, double step) {
    if (step == 0 || (stop - start) / step > 1e12) {
        na_set_error(NA_EINVAL, "na_arange: step %g cannot go from %g to %g", step, start, stop);
        return NULL;
    }
    double nf = ceil((stop - start) / step);
    int64_t n = nf > 0 ? (int64_t)nf : 0;
    na_tensor *t = na_empty(dt, dev, NA_SHAPE(n));
    if (!t) return NULL;
    const na_backend *be = na_be(t);
    return be && be->arange(&t->view, start, step) == NA_OK ? t : NULL;
}

static na_tensor *random_fill(const char *fn, na_dtype dt, na_device dev, int ndim,
                              const int64_t *shape, double p0, double p1, bool normal) {
    if (!na_dtype_is_float(dt)) {
        na_set_error(NA_EDTYPE, "%s: random numbers need a float dtype, got %s", fn,
                     na_dtype_name(dt));
        return NULL;
    }
    na_tensor *t = na_empty(dt, dev, ndim, shape);
    if (!t) return NULL;
    const na_backend *be = na_be(t);
    uint64_t seed = na_rng_seed(), offset = na_rng_reserve((uint64_t)t->numel);
    int rc = normal ? be->fill_normal(&t->view, p0, p1, seed, offset)
                    : be->fill_uniform(&t->view, p0, p1, seed, offset);
    return rc == NA_OK ? t : NULL;
}

na_tensor *na_rand(na_dtype dt, na_device dev, int ndim, const int64_t *shape, double lo,
                   double hi) {
    return random_fill("na_rand", dt, dev, ndim, shape, lo, hi, false);
}
na_tensor *na_randn(na_dtype dt, na_device dev, int ndim, const int64_t *shape, double mean,
                    double std) {
    return random_fill("na_randn", dt, dev, ndim, shape, mean, std, true);
}

na_tensor *na_from_host(na_dtype dt, na_device dev, int ndim, const int64_t *shape,
                        const void *host) {
    na_tensor *t = na_empty(dt, dev, ndim, shape);
    if (!t || na_copy_from_host(t, host) != NA_OK) return NULL;
    return t;
}

/* ---- persistent tensors --------------------------------------------------------------- */

na_tensor *na_tensor_new(na_dtype dt, na_device dev, int ndim, const int64_t *shape) {
    if (!check_shape("na_tensor_new", ndim, shape) || !check_dtype_device("na_tensor_new", dt, dev))
        return NULL;
    const na_backend *be = na_backend_get(dev);
    na_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        na_set_error(NA_ENOMEM, "na_tensor_new: out of host memory");
        return NULL;
    }
    t->dtype = dt;
    t->device = dev;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->numel = na_shape_numel(ndim, shape);
    na_set_contiguous_strides(t);
    t->persistent = true;
    size_t bytes = (size_t)t->numel * na_dtype_size(dt);
    t->data = be->alloc(bytes ? bytes : 1);
    if (!t->data || be->fill(&t->view, 0.0) != NA_OK) {
        if (t->data) be->free(t->data);
        free(t);
        return NULL;
    }
    return t;
}

void na_tensor_free(na_tensor *t) {
    if (!t || !t->persistent) return;
    na_tensor_free(t->grad);
    na_zero_forget(t); /* zero_grad's list may name it */
    if (!t->base) {
        const na_backend *be = na_backend_get(t->device);
        if (be) be->free(t->data);
    }
    free(t);
}

static void (*step_hook)(void);
void na_arena_set_step_hook(void (*fn)(void)) { step_hook = fn; }
bool na_step_hook_installed(void) { return step_hook != NULL; }

void na_step_end(void) {
    if (step_hook) step_hook();
    na_arena_reset();
}

/* ---- moving data ------------------------------------------------------------------------ */

const na_backend *na_be(const na_tensor *t) { return na_backend_get(t->device); }

int na_copy_to_host(const na_tensor *t, void *host) {
    if (!na_check_tensor("na_copy_to_host", t, "tensor")) return na_last_status();
    const na_backend *be = na_be(t);
    if (!be) return na_last_status();
    if (na_zero_settle_memory(t)) return na_last_status(); /* a gradient zero_grad marked */
    size_t bytes = (size_t)t->numel * na_dtype_size(t->dtype);
    if (na_is_contiguous(t)) return be->memcpy_d2h(host, t->data, bytes);
    na_tensor *c = na_empty(t->dtype, t->device, t->ndim, t->shape);
    if (!c) return na_last_status();
    int rc = be->copy(&c->view, &t->view);
    return rc ? rc : be->memcpy_d2h(host, c->data, bytes);
}

int na_copy_from_host(na_tensor *t, const void *host) {
    if (!na_check_tensor("na_copy_from_host", t, "destination")) return na_last_status();
    if (!na_is_contiguous(t))
        return na_set_error(NA_EINVAL, "na_copy_from_host: the destination must be contiguous");
    const na_backend *be = na_be(t);
    if (!be) return na_last_status();
    na_tensor_bump_version(t);
    return be->memcpy_h2d(t->data, host, (size_t)t->numel * na_dtype_size(t->dtype));
}

int na_copy_(na_tensor *dst, const na_tensor *src) {
    char a[NA_DESCRIBE_MAX], b[NA_DESCRIBE_MAX];
    if (!na_check_tensor("na_copy_", dst, "dst") || !na_check_tensor("na_copy_", src, "src"))
        return na_last_status();
    if (!na_same_shape(dst, src))
        return na_set_error(NA_ESHAPE, "na_copy_: shapes differ: dst %s, src %s",
                            na_tensor_describe(dst, a, sizeof a),
                            na_tensor_describe(src, b, sizeof b));
    na_tensor_bump_version(dst);
    if (dst->device == src->device) { /* the backend writes any dst (channels-last, a region) */
        const na_backend *be = na_be(dst);
        return be ? be->copy(&dst->view, &src->view) : na_last_status();
    }
    if (!na_is_contiguous(dst))
        return na_set_error(NA_EINVAL, "na_copy_: across devices the destination must be "
                            "contiguous");
    /* across devices: make src contiguous in its dtype, move the bytes, convert on dst */
    const na_backend *sbe = na_be(src), *dbe = na_be(dst);
    if (!sbe || !dbe) return na_last_status();
    size_t bytes = (size_t)src->numel * na_dtype_size(src->dtype);
    na_tensor *staged = na_empty(src->dtype, dst->device, src->ndim, src->shape);
    if (!staged) return na_last_status();
    int rc;
    const na_tensor *s = src;
    if (!na_is_contiguous(src)) {
        na_tensor *c = na_empty(src->dtype, src->device, src->ndim, src->shape);
        if (!c) return na_last_status();
        if ((rc = sbe->copy(&c->view, &src->view))) return rc;
        s = c;
    }
    if (src->device == NA_DEVICE_CPU)
        rc = dbe->memcpy_h2d(staged->data, s->data, bytes);
    else
        rc = sbe->memcpy_d2h(staged->data, s->data, bytes);
    if (rc) return rc;
    return dbe->copy(&dst->view, &staged->view);
}

int na_fill_(na_tensor *t, double value) {
    if (!na_check_tensor("na_fill_", t, "tensor")) return na_last_status();
    if (!na_is_contiguous(t)) return na_set_error(NA_EINVAL, "na_fill_: tensor must be contiguous");
    na_tensor_bump_version(t);
    const na_backend *be = na_be(t);
    return be ? be->fill(&t->view, value) : na_last_status();
}

double na_get(const na_tensor *t, int64_t i) {
    if (!na_check_tensor("na_get", t, "tensor")) return 0.0 / 0.0;
    if (i < 0 || i >= t->numel) {
        na_set_error(NA_EINVAL, "na_get: index %" PRId64 " out of range", i);
        return 0.0 / 0.0;
    }
    /* locate element i of a possibly strided tensor */
    int64_t off = 0, rem = i;
    for (int d = t->ndim - 1; d >= 0; d--) {
        off += (rem % t->shape[d]) * t->stride[d];
        rem /= t->shape[d];
    }
    size_t es = na_dtype_size(t->dtype);
    unsigned char raw[8];
    const na_backend *be = na_be(t);
    if (!be || na_zero_settle_memory(t) || be->memcpy_d2h(raw, (const char *)t->data + off * (int64_t)es, es)) return 0.0 / 0.0;
    switch (t->dtype) {
    case NA_DTYPE_F64: { double v; memcpy(&v, raw, 8); return v; }
    case NA_DTYPE_F32: { float v; memcpy(&v, raw, 4); return v; }
    case NA_DTYPE_F16: { uint16_t v; memcpy(&v, raw, 2); return na_f16_bits_to_f32(v); }
    case NA_DTYPE_BF16: { uint16_t v; memcpy(&v, raw, 2); return na_bf16_bits_to_f32(v); }
    case NA_DTYPE_I32: { int32_t v; memcpy(&v, raw, 4); return v; }
    case NA_DTYPE_U8: return raw[0];
    case NA_DTYPE_F8E4M3: return na_e4m3_bits_to_f32(raw[0]);
    case NA_DTYPE_F8E5M2: return na_e5m2_bits_to_f32(raw[0]);
    default: return 0.0 / 0.0;
    }
}

double na_item(const na_tensor *t) {
    if (!t || t->numel != 1) {
        na_set_error(NA_EINVAL, "na_item: tensor has %" PRId64 " elements, expected 1",
                     t ? t->numel : 0);
        return 0.0 / 0.0;
    }
    return na_get(t, 0);
}

/* ---- checks ------------------------------------------------------------------------ */

bool na_check_tensor(const char *fn, const na_tensor *t, const char *what) {
    if (!t) {
        na_set_error(NA_EINVAL, "%s: %s is NULL (did an earlier op fail? %s)", fn, what,
                     na_last_error());
        return false;
    }
    if (!na_tensor_owner(t)->data) { /* na_tensor_release gave its memory back */
        char b[2 * NA_DESCRIBE_MAX];
        na_set_error(NA_ESTATE, "%s: %s %s was released: na_backward gave its memory back after "
                     "its last use in the graph (an intermediate of a Sequential or Residual, or "
                     "a tensor kept for backward); use it before na_backward, or walk with "
                     "na_backward_retain", fn, what, na_tensor_describe_named(t, b, sizeof b));
        return false;
    }
    return true;
}

bool na_check_float(const char *fn, const na_tensor *t, const char *what) {
    if (!na_check_tensor(fn, t, what)) return false;
    if (na_dtype_is_fp8(t->dtype)) { /* the one place every op front-end turns FP8 away */
        char b[NA_DESCRIBE_MAX];
        na_set_error(NA_EDTYPE, "%s: %s is %s: %s does not support dtype %s (FP8 tensors are "
                     "storage: na_cast them to f32/bf16, or multiply them with na_scaled_mm)",
                     fn, what, na_tensor_describe(t, b, sizeof b), fn, na_dtype_name(t->dtype));
        return false;
    }
    if (!na_dtype_is_float(t->dtype)) {
        char b[NA_DESCRIBE_MAX];
        na_set_error(NA_EDTYPE, "%s: %s must be a float tensor, got %s", fn, what,
                     na_tensor_describe(t, b, sizeof b));
        return false;
    }
    return true;
}

bool na_check_same_device(const char *fn, const na_tensor *a, const na_tensor *b) {
    if (a->device != b->device) {
        char x[NA_DESCRIBE_MAX], y[NA_DESCRIBE_MAX];
        na_set_error(NA_EDEVICE, "%s: tensors on different devices: %s and %s", fn,
                     na_tensor_describe(a, x, sizeof x), na_tensor_describe(b, y, sizeof y));
        return false;
    }
    return true;
}

bool na_check_same_dtype(const char *fn, const na_tensor *a, const na_tensor *b) {
    if (a->dtype != b->dtype) {
        char x[NA_DESCRIBE_MAX], y[NA_DESCRIBE_MAX];
        na_set_error(NA_EDTYPE, "%s: dtypes differ: %s and %s", fn,
                     na_tensor_describe(a, x, sizeof x), na_tensor_describe(b, y, sizeof y));
        return false;
    }
    return true;
}

bool na_check_dim(const char *fn, const na_tensor *t, int *dim) {
    int d = *dim < 0 ? *dim + t->ndim : *dim;
    if (d < 0 || d >= t->ndim) {
        char b[NA_DESCRIBE_MAX];
        na_set_error(NA_EINVAL, "%s: dim %d out of range for %s", fn, *dim,
                     na_tensor_describe(t, b, sizeof b));
        return false;
    }
    *dim = d;
    return true;
}

na_dtype na_promote_float(na_dtype a, na_dtype b) {
    if (a == b) return a;
    if (a == NA_DTYPE_F64 || b == NA_DTYPE_F64) return NA_DTYPE_F64;
    return NA_DTYPE_F32; /* f32 with anything narrower, or f16 with bf16 */
}

na_dtype na_result_float(const na_tensor *a, const na_tensor *b) {
    if ((a->ndim == 0) != (b->ndim == 0)) return a->ndim ? a->dtype : b->dtype;
    return na_promote_float(a->dtype, b->dtype);
}

void na_split_dims(const na_tensor *t, int dim, int64_t *outer, int64_t *r, int64_t *inner) {
    *outer = na_shape_numel(dim, t->shape);
    *r = t->shape[dim];
    *inner = na_shape_numel(t->ndim - dim - 1, t->shape + dim + 1);
}

/* ---- the generator ----------------------------------------------------------------------- */

static uint64_t rng_seed = 0x6e616e6f616d70ULL; /* "nanoamp" */
static uint64_t rng_offset;

void na_manual_seed(uint64_t seed) {
    rng_seed = seed;
    rng_offset = 0;
}
uint64_t na_rng_seed(void) { return rng_seed; }
uint64_t na_rng_offset(void) { return rng_offset; }
void na_rng_set_state(uint64_t seed, uint64_t offset) {
    rng_seed = seed;
    rng_offset = offset;
}
/* Philox's counter holds (element/4, offset): every offset is a stream of its own whatever
 * its length, so each random fill simply takes the next offset. */
uint64_t na_rng_reserve(uint64_t n) {
    (void)n;
    return rng_offset++;
}
