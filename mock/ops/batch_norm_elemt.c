/*
 * Mock aclnnBatchNormElemt: ops-nn's validation and the hardware's compute, emulating Atlas A2/A3
 * (SocVersion 910B..910E: bf16 accepted).
 *
 * Phase 1, as ops-nn's aclnn_batch_norm_elemt.cpp: a NULL input, mean, invstd or output is
 * 161002 (its CheckNotNull is wired to ACLNN_ERR_PARAM_INVALID, not 161001); weight and bias are
 * optional (filled with 1 and 0). Then each tensor's dtype must be F32, F16 or BF16 (checked per
 * tensor: mixed dtypes pass), input has 2..8 dims, output has input's shape and format,
 * input.shape[1] != 0, weight/bias/mean/invstd are 1-D [C]; a private format of input is rejected (only input's is checked). An empty
 * input gives workspace 0 and an executor that does nothing.
 *
 * The compute follows ops-nn: the variance is rebuilt as var = 1/invstd^2 - eps and inference
 * BatchNorm runs, y = (x - mean) / sqrt(var + eps) * weight + bias; every step in f32 (as the
 * NPU computes), every tensor read through its view and widened to f32, the result rounded to
 * nearest even into output's dtype and written through output's view. Deterministic (the real
 * op is not by default on A2/A3: its reductions may be ordered differently run to run).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC visibility push(default)
#include "wrapper.h"
#pragma GCC visibility pop
#include "opapi.h"

enum { T_INPUT, T_WEIGHT, T_BIAS, T_MEAN, T_INVSTD, T_OUTPUT, NT };
static const char *const k_names[NT] = {"input", "weight", "bias", "mean", "invstd", "output"};

/* ---- the compute (a queued task; runs with the toolkit lock held) ------------------------------------ */
static int elemt_run(const mock_op *op, mock_op_call *k) {
    const ascend_mock_tensor *x = &k->t[T_INPUT], *y = &k->t[T_OUTPUT];
    const ascend_mock_tensor *mean = &k->t[T_MEAN], *invstd = &k->t[T_INVSTD];
    int has_w = k->args[T_WEIGHT].used, has_b = k->args[T_BIAS].used;
    float eps = (float)k->scalars[0];
    int64_t channels = x->dims[1];
    float *scale = calloc((size_t)channels * 3, sizeof *scale);
    if (!scale) {
        ascend_mock_violation("%s: the mock ran out of host memory", op->phase2);
        return ACL_ERROR_RT_AICORE_EXCEPTION;
    }
    float *m = scale + channels, *shift = scale + 2 * channels;
    for (int64_t c = 0; c < channels; c++) {
        float s = mock_load(invstd, mock_channel_pos(invstd, c));
        float var = 1.0f / (s * s) - eps; /* the variance rebuilt from invstd */
        scale[c] = 1.0f / mock_sqrt_f32(var + eps);
        m[c] = mock_load(mean, mock_channel_pos(mean, c));
        shift[c] = has_b ? mock_load(&k->t[T_BIAS], mock_channel_pos(&k->t[T_BIAS], c)) : 0.0f;
    }
    const ascend_mock_tensor *w = &k->t[T_WEIGHT];
    const ascend_mock_tensor *views[] = {x, y};
    mock_walk it;
    for (mock_walk_init(&it, views, 2); it.left; mock_walk_step(&it)) {
        int64_t c = it.idx[1];
        float v = (mock_load(x, it.pos[0]) - m[c]) * scale[c];
        if (has_w) {
            v = v * mock_load(w, mock_channel_pos(w, c));
        }
        mock_store(y, it.pos[1], v + shift[c]);
    }
    free(scale);
    return 0;
}

/* Validation once every given tensor is resolved. */
static aclnnStatus elemt_check(const mock_op *op, mock_op_call *call) {
    MOCK_TRY(mock_check_float_args(op, call, -1));
    MOCK_TRY(mock_check_rank_2_to_8(op, call, T_INPUT));
    const ascend_mock_tensor *x = &call->t[T_INPUT], *y = &call->t[T_OUTPUT];
    char a[256], b[256];
    if (y->rank != x->rank || memcmp(y->dims, x->dims, x->rank * sizeof x->dims[0]) != 0) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Expected tensor output to have shape %s (input's), but got %s.",
                            mock_shape_text(x, a, sizeof a), mock_shape_text(y, b, sizeof b));
    }
    if (y->format != x->format) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Format of output %s should be the same as format of input %s.",
                            ascend_mock_format_name(y->format), ascend_mock_format_name(x->format));
    }
    /* Only input's format is checked (and output's equals it): ops-nn aclnn_batch_norm_elemt.cpp:70-79. */
    if (mock_format_private(x->format)) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                            "Format of %s does not support %s; it should be one of ND, NCHW, NHWC, HWCN, NDHWC, NCDHW.",
                            k_names[T_INPUT], ascend_mock_format_name(x->format));
    }
    int64_t channels;
    MOCK_TRY(mock_check_channels(op, call, T_INPUT, &channels));
    static const int per_channel[] = {T_WEIGHT, T_BIAS, T_MEAN, T_INVSTD};
    MOCK_TRY(mock_check_per_channel(op, call, per_channel, MOCK_LEN(per_channel), channels));
    call->empty = mock_numel(x) == 0;
    call->ws_size = 0;
    return ACLNN_SUCCESS;
}

/* a NULL tensor: 161002, as ops-nn's CheckNotNull returns for this op */
MOCK_OP_DEFINE(aclnnBatchNormElemt, ACLNN_ERR_PARAM_INVALID, elemt_check, elemt_run)

aclnnStatus aclnnBatchNormElemtGetWorkspaceSize(const aclTensor *input, const aclTensor *weight, const aclTensor *bias,
                                                aclTensor *mean, aclTensor *invstd, double eps, aclTensor *output,
                                                uint64_t *workspaceSize, aclOpExecutor **executor) {
    const aclTensor *h[NT] = {input, weight, bias, mean, invstd, output};
    mock_op_call call = {.nargs = NT, .scalars = {eps}};
    for (int i = 0; i < NT; i++) {
        call.args[i] = (mock_op_arg){.name = k_names[i], .handle = h[i], .required = i != T_WEIGHT && i != T_BIAS,
                                     .used = 1, .write = i == T_OUTPUT};
    }
    return mock_op_phase1(&k_op, &call, workspaceSize, executor);
}
