/* Memory formats: the two dense layouts a 4-d tensor's memory can have.
 *
 * Contiguous is C order (N, C, H, W). Channels-last keeps the shape [N, C, H, W] and stores
 * the elements in N, H, W, C order (strides [C*H*W, 1, W*C, C]), PyTorch's torch.channels_last:
 * the layout in which cuDNN's tensor-core convolutions read their operands without
 * transposing. An op given channels-last input returns channels-last output (conv2d,
 * BatchNorm, pooling, elementwise ops of one shape), so a network whose input is converted
 * once stays channels-last end to end; ops that know only C order make a contiguous copy. */
#include "src/tensor/tensor_internal.h"

/* the strides size-1 dims have do not matter: such a dim is never stepped over */
static bool strides_are(const na_tensor *t, const int64_t *want) {
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] != 1 && t->stride[d] != want[d]) return false;
    return true;
}

static void channels_last_strides(const int64_t *shape, int64_t *stride) {
    stride[1] = 1;
    stride[3] = shape[1];
    stride[2] = shape[3] * shape[1];
    stride[0] = shape[2] * shape[3] * shape[1];
}

bool na_is_channels_last(const na_tensor *t) {
    if (!t || t->ndim != 4) return false;
    int64_t want[4];
    channels_last_strides(t->shape, want);
    return strides_are(t, want);
}

na_memory_format na_memory_format_of(const na_tensor *t) {
    return na_is_channels_last(t) && !na_is_contiguous(t) ? NA_FORMAT_CHANNELS_LAST
                                                           : NA_FORMAT_CONTIGUOUS;
}

na_tensor *na_empty_format(na_dtype dt, na_device dev, int ndim, const int64_t *shape,
                           na_memory_format f) {
    if (f != NA_FORMAT_CONTIGUOUS && f != NA_FORMAT_CHANNELS_LAST) {
        na_set_error(NA_EINVAL, "na_empty_format: unknown memory format %d", (int)f);
        return NULL;
    }
    if (f == NA_FORMAT_CHANNELS_LAST && ndim != 4) {
        na_set_error(NA_ESHAPE, "na_empty_format: channels-last needs 4 dims [N, C, H, W], got "
                     "%d", ndim);
        return NULL;
    }
    na_tensor *t = na_empty(dt, dev, ndim, shape);
    if (t && f == NA_FORMAT_CHANNELS_LAST) channels_last_strides(t->shape, t->stride);
    return t;
}

na_tensor *na_empty_like_format(const na_tensor *t) {
    return na_empty_format(t->dtype, t->device, t->ndim, t->shape, na_memory_format_of(t));
}

/* t's memory as one row of numel elements (t dense: contiguous or channels-last) */
static na_view flat_view(const na_tensor *t) {
    na_view v = t->view;
    v.ndim = 1;
    v.shape[0] = t->numel;
    v.stride[0] = 1;
    return v;
}

int na_binary_on_memory(na_binary_op op, na_tensor *out, const na_tensor *a,
                        const na_tensor *b) {
    na_view fo = flat_view(out), fa = flat_view(a), fb = flat_view(b);
    na_broadcast flat = {.ndim = 1, .shape = {out->numel}, .a_stride = {1}, .b_stride = {1}};
    const na_backend *be = na_be(out);
    return be ? be->binary(op, &fa, &fb, &fo, &flat) : na_last_status();
}

bool na_same_dense_layout(const na_tensor *a, const na_tensor *b) {
    if (!na_same_shape(a, b)) return false;
    na_memory_format f = na_memory_format_of(a);
    return f == na_memory_format_of(b) &&
           (f == NA_FORMAT_CHANNELS_LAST || (na_is_contiguous(a) && na_is_contiguous(b)));
}
