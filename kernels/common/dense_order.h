/* kernels/common/dense_order.h — the order in which a dense view's memory runs.
 *
 * A view is dense when its elements fill numel consecutive slots in some order of its dims:
 * C order (contiguous) or any permutation of it (channels-last is N, H, W, C). Read in that
 * order the view is C order, so a copy into it can run as a copy into a contiguous view with
 * the source read in the same order. Host code (both backends' copy); plain C. */
#ifndef NANOAMP_KERNELS_COMMON_DENSE_ORDER_H
#define NANOAMP_KERNELS_COMMON_DENSE_ORDER_H

#include <stdbool.h>
#include <stdint.h>

#include "nanoamp/view.h"

/* perm[0..ndim): t's dims from the largest stride to the smallest (size-1 dims, whose
 * strides do not matter, first). Returns whether t is dense: read in perm's order, C order. */
static inline bool na_dense_order(const na_view *t, int *perm) {
    int nd = t->ndim;
    for (int d = 0; d < nd; d++) { /* insertion sort: at most NA_MAX_DIMS dims */
        int k = d;
        int64_t key = t->shape[d] == 1 ? INT64_MAX : t->stride[d];
        while (k > 0) {
            int p = perm[k - 1];
            int64_t pk = t->shape[p] == 1 ? INT64_MAX : t->stride[p];
            if (pk >= key) break;
            perm[k] = p;
            k--;
        }
        perm[k] = d;
    }
    int64_t expect = 1;
    for (int d = nd - 1; d >= 0; d--) {
        int p = perm[d];
        if (t->shape[p] != 1 && t->stride[p] != expect) return false;
        expect *= t->shape[p];
    }
    return true;
}

/* t with its dims in perm's order (the same elements, read in another order). */
static inline na_view na_view_permuted(const na_view *t, const int *perm) {
    na_view v = *t;
    for (int d = 0; d < t->ndim; d++) {
        v.shape[d] = t->shape[perm[d]];
        v.stride[d] = t->stride[perm[d]];
    }
    return v;
}

/* C order (contiguous), the strides of size-1 dims ignored */
static inline bool na_view_is_c_order(const na_view *t) {
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->stride[d] != expect) return false;
        expect *= t->shape[d];
    }
    return true;
}

static inline bool na_view_same_shape(const na_view *a, const na_view *b) {
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}
#endif
