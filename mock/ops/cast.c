/*
 * Mock aclnnCast: ops-math's validation (Atlas A2/A3, DAV_2201) and the hardware's compute among
 * the float dtypes (docs/cann/SYNCBN.md 3.7; hicann/ops-math math/cast/op_api/aclnn_cast.cpp).
 *
 * Phase 1, in ops-math's order: a NULL self or out is 161001 (CheckNotNull); self's dtype and the
 * `dtype` argument must be in A2/A3's list (FLOAT16, FLOAT, DOUBLE, INT8, UINT8, INT16, INT32,
 * INT64, UINT16, UINT32, UINT64, BOOL, COMPLEX64, COMPLEX128, BFLOAT16), else 161002; self has
 * at most 8 dims and out has self's shape (161002). Then what the header and the doc state and
 * the source enforces later (its ViewCopy into out): out's dtype is `dtype` and out's format is
 * self's (doc: "self的数据格式与out的数据格式不同" is 161002). An empty self gives workspace 0 and
 * an executor that does nothing.
 *
 * The mock computes among FLOAT, FLOAT16 and BFLOAT16 only: a call CANN accepts with any other
 * dtype fails phase 1 here with 161002 naming the mock's limit (the crate binds the float casts
 * alone). Compute: every element read through self's view and widened to f32 (exact), then
 * rounded to nearest even into out's dtype and written through out's view (the rounding of a
 * narrowing cast on hardware is UNCONFIRMED; a widening cast is exact either way).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <string.h>

#pragma GCC visibility push(default)
#include "wrapper.h"
#pragma GCC visibility pop
#include "opapi.h"

enum { T_SELF, T_OUT, NT };
static const char *const k_names[NT] = {"self", "out"};

/* ops-math's DTYPE_SUPPORT_LIST_DEFAULT, the list of DAV_2201 (Atlas A2/A3), for self and dtype. */
static int a2_dtype(aclDataType dt) {
    switch ((int)dt) {
    case ACL_FLOAT16:
    case ACL_FLOAT:
    case ACL_DOUBLE:
    case ACL_INT8:
    case ACL_UINT8:
    case ACL_INT16:
    case ACL_INT32:
    case ACL_INT64:
    case ACL_UINT16:
    case ACL_UINT32:
    case ACL_UINT64:
    case ACL_BOOL:
    case ACL_COMPLEX64:
    case ACL_COMPLEX128:
    case ACL_BF16:
        return 1;
    default:
        return 0;
    }
}

static const char *const k_a2_list = "[DT_FLOAT16, DT_FLOAT, DT_DOUBLE, DT_INT8, DT_UINT8, DT_INT16, DT_INT32, "
                                     "DT_INT64, DT_UINT16, DT_UINT32, DT_UINT64, DT_BOOL, DT_COMPLEX64, "
                                     "DT_COMPLEX128, DT_BFLOAT16]";

/* ---- the compute (a queued task; runs with the toolkit lock held) ------------------------------------ */
static int cast_run(const mock_op *op, mock_op_call *k) {
    (void)op;
    const ascend_mock_tensor *x = &k->t[T_SELF], *y = &k->t[T_OUT];
    const ascend_mock_tensor *views[] = {x, y};
    mock_walk it;
    for (mock_walk_init(&it, views, 2); it.left; mock_walk_step(&it)) {
        mock_store(y, it.pos[1], mock_load(x, it.pos[0]));
    }
    return 0;
}

/* Validation once both tensors are resolved. */
static aclnnStatus cast_check(const mock_op *op, mock_op_call *call) {
    const ascend_mock_tensor *x = &call->t[T_SELF], *y = &call->t[T_OUT];
    aclDataType dtype = (aclDataType)call->flags[0];
    if (!a2_dtype(x->dtype)) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Tensor self not implemented for %s, should be in dtype support list %s.",
                            ascend_mock_dtype_name(x->dtype), k_a2_list);
    }
    if (!a2_dtype(dtype)) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                            "The param dtype not implemented for %s, should be in dtype support list %s.",
                            ascend_mock_dtype_name(dtype), k_a2_list);
    }
    if (x->rank > 8) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Dim of self should be at most 8, but got %llu.",
                            (unsigned long long)x->rank);
    }
    char a[256], b[256];
    if (y->rank != x->rank || memcmp(y->dims, x->dims, x->rank * sizeof x->dims[0]) != 0) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Shape of out %s should be the same as shape of self %s.",
                            mock_shape_text(y, b, sizeof b), mock_shape_text(x, a, sizeof a));
    }
    if (y->dtype != dtype) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Tensor out has dtype %s, but the param dtype is %s.",
                            ascend_mock_dtype_name(y->dtype), ascend_mock_dtype_name(dtype));
    }
    if (y->format != x->format) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Format of out %s should be the same as format of self %s.",
                            ascend_mock_format_name(y->format), ascend_mock_format_name(x->format));
    }
    if (!mock_dtype_float(x->dtype) || !mock_dtype_float(y->dtype)) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                            "The mock computes casts among DT_FLOAT, DT_FLOAT16 and DT_BFLOAT16 only, not %s to %s.",
                            ascend_mock_dtype_name(x->dtype), ascend_mock_dtype_name(y->dtype));
    }
    call->empty = mock_numel(x) == 0;
    call->ws_size = 0;
    return ACLNN_SUCCESS;
}

/* a NULL tensor: 161001 (ops-math's CheckNotNull) */
MOCK_OP_DEFINE(aclnnCast, ACLNN_ERR_PARAM_NULLPTR, cast_check, cast_run)

aclnnStatus aclnnCastGetWorkspaceSize(const aclTensor *self, const aclDataType dtype, aclTensor *out,
                                      uint64_t *workspaceSize, aclOpExecutor **executor) {
    const aclTensor *h[NT] = {self, out};
    mock_op_call call = {.nargs = NT, .flags = {(int)dtype}};
    for (int i = 0; i < NT; i++) {
        call.args[i] = (mock_op_arg){.name = k_names[i], .handle = h[i], .required = 1, .used = 1, .write = i == T_OUT};
    }
    return mock_op_phase1(&k_op, &call, workspaceSize, executor);
}
