/* The op table: one row per op of NA_OP_MAP (include/nanoamp/ops.h). The backward named here
 * lives beside the op's forward in src/tensor/ops_*.c or src/nn/ops_*.c. */
#include "src/autograd/graph.h"

const na_op_def na_op_defs[NA_OP_COUNT] = {
#define NA_OP_ROW_(id, nm, rule, diff) [NA_OP_##id] = {nm, rule, diff, na_bw_##id},
    NA_OP_MAP(NA_OP_ROW_)
#undef NA_OP_ROW_
};

const char *na_op_name(na_op op) { return (unsigned)op < NA_OP_COUNT ? na_op_defs[op].name : "?"; }
bool na_op_differentiable(na_op op) {
    return (unsigned)op < NA_OP_COUNT && na_op_defs[op].differentiable;
}
na_amp_rule na_op_default_amp_rule(na_op op) {
    return (unsigned)op < NA_OP_COUNT ? na_op_defs[op].amp_rule : NA_AMP_AS_IS;
}
