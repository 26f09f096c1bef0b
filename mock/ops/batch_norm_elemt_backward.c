/*
 * Mock aclnnBatchNormElemtBackward: ops-nn's validation and the hardware's compute, emulating
 * Atlas A2/A3 (SocVersion 910B / 910_93: bf16 accepted).
 *
 * Phase 1, as ops-nn's aclnn_batch_norm_elemt_backward.cpp: every tensor but weight must be
 * non-NULL (161001). Then dtypes: gradOut, input, mean, invstd, weight, sumDy, sumDyXmu and
 * gradInput each F32, F16 or BF16; counter F32, F16 or INT32 (not BF16). Shapes: input has 2..8
 * dims and input.shape[1] != 0, gradOut and gradInput have input's shape; mean, invstd, sumDy,
 * sumDyXmu and weight are 1-D [C]; counter has at most 8 dims, any shape (all of it is summed);
 * private formats are rejected for gradOut, input and gradInput. An empty input or gradOut gives
 * workspace 0 and an executor that does nothing.
 *
 * The compute follows ops-nn: N = the sum of every element of counter (cast to f32, summed in
 * order in f32); meanDy = sumDy / N and meanDyXmu = sumDyXmu / N in f32; then, in f16 when all of
 * gradOut, input, mean, invstd, weight, sumDy and sumDyXmu are F16 (meanDy and meanDyXmu are then
 * rounded to f16), else in f32. A missing weight is filled with ones as an f32 tensor (ops-nn
 * aclnn_batch_norm_elemt_backward.cpp:313, FillScalar: norm_tensor_util.cpp:190 makes DT_FLOAT),
 * so it computes in f32:
 *   gradInput = (gradOut - meanDy - (input - mean) * (invstd * invstd) * meanDyXmu) * invstd * weight
 * one rounding per operation, in that order, the result rounded into gradInput's dtype and written
 * through its view. Deterministic, as the real op is.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC visibility push(default)
#include "wrapper.h"
#pragma GCC visibility pop
#include "opapi.h"

enum { T_GRAD, T_INPUT, T_MEAN, T_INVSTD, T_WEIGHT, T_SUMDY, T_SUMDYXMU, T_COUNTER, T_GRADIN, NT };
static const char *const k_names[NT] = {"gradOut", "input",    "mean",    "invstd",   "weight",
                                        "sumDy",   "sumDyXmu", "counter", "gradInput"};

/* One operation's result in the compute precision: f32 as is, or rounded to f16. */
static float rnd(int half, float v) {
    return half ? mock_f16_to_f32(mock_f32_to_f16(v)) : v;
}

/* ---- the compute (a queued task; runs with the toolkit lock held) ------------------------------------ */
static int elemt_backward_run(const mock_op *op, mock_op_call *k) {
    const ascend_mock_tensor *dy = &k->t[T_GRAD], *x = &k->t[T_INPUT], *gi = &k->t[T_GRADIN];
    const ascend_mock_tensor *counter = &k->t[T_COUNTER];
    int has_w = k->args[T_WEIGHT].used;
    int half = 1;
    for (int i = T_GRAD; i <= T_SUMDYXMU; i++) {
        /* A missing weight is filled with an f32 ones tensor (ops-nn FillScalar), which promotes the
         * compute to f32. */
        if (k->args[i].used ? k->t[i].dtype != ACL_FLOAT16 : i == T_WEIGHT) {
            half = 0;
        }
    }
    float n = 0.0f;
    uint64_t nc = mock_numel(counter);
    for (uint64_t i = 0; i < nc; i++) {
        n += mock_load(counter, mock_view_pos(counter, i));
    }
    int64_t channels = x->dims[1];
    float *p = calloc((size_t)channels * 5, sizeof *p);
    if (!p) {
        ascend_mock_violation("%s: the mock ran out of host memory", op->phase2);
        return ACL_ERROR_RT_AICORE_EXCEPTION;
    }
    float *mean = p, *invstd = p + channels, *w = p + 2 * channels, *mdy = p + 3 * channels, *mdx = p + 4 * channels;
    for (int64_t c = 0; c < channels; c++) {
        mean[c] = mock_load(&k->t[T_MEAN], mock_channel_pos(&k->t[T_MEAN], c));
        invstd[c] = mock_load(&k->t[T_INVSTD], mock_channel_pos(&k->t[T_INVSTD], c));
        w[c] = has_w ? mock_load(&k->t[T_WEIGHT], mock_channel_pos(&k->t[T_WEIGHT], c)) : 1.0f;
        mdy[c] = rnd(half, mock_load(&k->t[T_SUMDY], mock_channel_pos(&k->t[T_SUMDY], c)) / n);
        mdx[c] = rnd(half, mock_load(&k->t[T_SUMDYXMU], mock_channel_pos(&k->t[T_SUMDYXMU], c)) / n);
    }
    const ascend_mock_tensor *views[] = {x, dy, gi};
    mock_walk it;
    for (mock_walk_init(&it, views, 3); it.left; mock_walk_step(&it)) {
        int64_t c = it.idx[1];
        float xmu = rnd(half, mock_load(x, it.pos[0]) - mean[c]);
        float is2 = rnd(half, invstd[c] * invstd[c]);
        float t = rnd(half, rnd(half, xmu * is2) * mdx[c]);
        float g = rnd(half, rnd(half, mock_load(dy, it.pos[1]) - mdy[c]) - t);
        g = rnd(half, rnd(half, g * invstd[c]) * w[c]);
        mock_store(gi, it.pos[2], g);
    }
    free(p);
    return 0;
}

/* Validation once every given tensor is resolved. */
static aclnnStatus elemt_backward_check(const mock_op *op, mock_op_call *call) {
    MOCK_TRY(mock_check_float_args(op, call, T_COUNTER));
    const ascend_mock_tensor *t[NT];
    int on[NT];
    mock_call_tensors(call, t, on);
    aclDataType cdt = t[T_COUNTER]->dtype;
    if (cdt != ACL_FLOAT && cdt != ACL_FLOAT16 && cdt != ACL_INT32) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                            "Tensor counter not implemented for %s, should be in dtype support list "
                            "[DT_FLOAT, DT_FLOAT16, DT_INT32].",
                            ascend_mock_dtype_name(cdt));
    }
    MOCK_TRY(mock_check_rank_2_to_8(op, call, T_INPUT));
    int64_t channels;
    MOCK_TRY(mock_check_channels(op, call, T_INPUT, &channels));
    const ascend_mock_tensor *x = t[T_INPUT];
    char a[256], b[256];
    static const int same[] = {T_GRAD, T_GRADIN};
    for (size_t i = 0; i < 2; i++) {
        const ascend_mock_tensor *v = t[same[i]];
        if (v->rank != x->rank || memcmp(v->dims, x->dims, x->rank * sizeof x->dims[0]) != 0) {
            return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Expected tensor %s to have shape %s (input's), but got %s.",
                                k_names[same[i]], mock_shape_text(x, a, sizeof a), mock_shape_text(v, b, sizeof b));
        }
    }
    static const int per_channel[] = {T_MEAN, T_INVSTD, T_WEIGHT, T_SUMDY, T_SUMDYXMU};
    MOCK_TRY(mock_check_per_channel(op, call, per_channel, MOCK_LEN(per_channel), channels));
    if (t[T_COUNTER]->rank > 8) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Dim of counter should be at most 8, but got %llu.",
                            (unsigned long long)t[T_COUNTER]->rank);
    }
    static const int activations[] = {T_GRAD, T_INPUT, T_GRADIN};
    for (size_t i = 0; i < 3; i++) {
        const ascend_mock_tensor *v = t[activations[i]];
        if (mock_format_private(v->format)) {
            return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                                "Format of %s does not support %s; it should be one of ND, NCHW, NHWC, HWCN, NDHWC, NCDHW.",
                                k_names[activations[i]], ascend_mock_format_name(v->format));
        }
    }
    call->empty = mock_numel(x) == 0 || mock_numel(t[T_GRAD]) == 0;
    call->ws_size = 0;
    return ACLNN_SUCCESS;
}

MOCK_OP_DEFINE(aclnnBatchNormElemtBackward, ACLNN_ERR_PARAM_NULLPTR, elemt_backward_check, elemt_backward_run)

aclnnStatus aclnnBatchNormElemtBackwardGetWorkspaceSize(const aclTensor *gradOut, const aclTensor *input,
                                                        const aclTensor *mean, const aclTensor *invstd,
                                                        const aclTensor *weight, const aclTensor *sumDy,
                                                        const aclTensor *sumDyXmu, aclTensor *counter,
                                                        aclTensor *gradInput, uint64_t *workspaceSize,
                                                        aclOpExecutor **executor) {
    const aclTensor *h[NT] = {gradOut, input, mean, invstd, weight, sumDy, sumDyXmu, counter, gradInput};
    mock_op_call call = {.nargs = NT};
    for (int i = 0; i < NT; i++) {
        call.args[i] = (mock_op_arg){.name = k_names[i], .handle = h[i], .required = i != T_WEIGHT, .used = 1,
                                     .write = i == T_GRADIN};
    }
    return mock_op_phase1(&k_op, &call, workspaceSize, executor);
}
