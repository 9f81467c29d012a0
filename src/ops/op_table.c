/* The op table: one row per op of NA_OP_MAP (include/nanoamp/ops.h), its columns turned into
 * the values the ops layer looks up. Each op's backward, na_bw_<ID>, lives beside its forward
 * in src/ops. */
#include "src/ops/ops_internal.h"

#define ASKS true
#define FIXED false
#define ACC true
#define NOACC false
/* the reads column: bits of na_graph_op.reads (src/autograd/graph.h) */
#define NA_READS_NONE 0u
#define NA_READS_IN0 1u
#define NA_READS_IN01 3u
#define NA_READS_IN1_OUT (2u | NA_READS_OUT)
#define NA_READS_IN01_OUT (3u | NA_READS_OUT)

const na_op_def na_op_defs[NA_OP_COUNT] = {
#define NA_OP_ROW_(ID, NAME, RULE, AUTOCAST, UNARY, SUMS, DIFF, READS)                         \
    [NA_OP_##ID] = {.graph = {.id = NA_OP_##ID, .name = NAME,                                   \
                              .backward = DIFF ? na_bw_##ID : NULL, .reads = NA_READS_##READS}, \
                    .rule = NA_AMP_##RULE, .asks_autocast = AUTOCAST, .accumulates = SUMS,     \
                    .unary = NA_UNARY_##UNARY},
    NA_OP_MAP(NA_OP_ROW_)
#undef NA_OP_ROW_
};

/* The table and the backend's unary kernels stay in step: every NA_UNARY_ kernel is named by
 * exactly one row (the bits cover them all, the count allows no second row). */
#define UNARY_BIT_(id, nm, rule, autocast, unary, ...) \
    | (NA_UNARY_##unary == NA_UNARY_NONE ? 0ull : 1ull << NA_UNARY_##unary)
#define UNARY_ROW_(id, nm, rule, autocast, unary, ...) +(NA_UNARY_##unary != NA_UNARY_NONE)
_Static_assert(NA_UNARY_COUNT < 64, "the check below counts kernels in a 64-bit mask");
_Static_assert((0ull NA_OP_MAP(UNARY_BIT_)) == (1ull << NA_UNARY_COUNT) - 1 &&
                   (0 NA_OP_MAP(UNARY_ROW_)) == NA_UNARY_COUNT,
               "NA_OP_MAP's unary column and na_unary_op (kernels/backend.h) disagree");
#undef UNARY_BIT_
#undef UNARY_ROW_

/* A FIXED op never asks autocast, so a rule other than AS_IS would be a lie in the table. */
#define FIXED_AS_IS_(id, nm, rule, autocast, ...) &&(autocast || NA_AMP_##rule == NA_AMP_AS_IS)
_Static_assert(1 NA_OP_MAP(FIXED_AS_IS_), "a FIXED op's rule must be AS_IS in NA_OP_MAP");
#undef FIXED_AS_IS_

static bool known(na_op op) { return (unsigned)op < NA_OP_COUNT; }

const char *na_op_name(na_op op) { return known(op) ? na_op_defs[op].graph.name : "?"; }
bool na_op_differentiable(na_op op) { return known(op) && na_op_defs[op].graph.backward; }
na_amp_rule na_op_default_amp_rule(na_op op) {
    return known(op) ? na_op_defs[op].rule : NA_AMP_AS_IS;
}
bool na_op_asks_autocast(na_op op) { return known(op) && na_op_defs[op].asks_autocast; }
