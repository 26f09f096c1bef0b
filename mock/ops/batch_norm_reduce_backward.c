/*
 * Mock aclnnBatchNormReduceBackward: ops-nn's validation and the hardware's compute.
 *
 * Phase 1 validates the arguments exactly as ops-nn does (docs/cann/SEMANTICS.md 3.1, docs/cann/API.md 7): null checks
 * first (161001), then dtype, format, rank, channel and output-shape checks (161002); empty inputs
 * succeed with a no-op executor. The compute follows the hardware (docs/cann/SEMANTICS.md 0.2): every input
 * read through its view and cast to f32; per channel, sum dy and dy*x in f32 (sequential inside
 * blocks of 256 elements of the channel, block sums added in order), kept in the workspace; then
 * sumDyXmu = sum(dy*x) - mean*sum(dy), gradWeight = sumDyXmu*invstd, gradBias = sum(dy), each cast
 * (round to nearest even) to its output's dtype and written through the output's view.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC visibility push(default)
#include "wrapper.h"
#pragma GCC visibility pop
#include "opapi.h"

#define BLOCK 256

enum { T_GRAD, T_INPUT, T_MEAN, T_INVSTD, T_WEIGHT, T_SUMDY, T_SUMDYXMU, T_GRADW, T_GRADB, NT };
static const char *const k_names[NT] = {"gradOut", "input",    "mean",       "invstd",  "weight",
                                        "sumDy",   "sumDyXmu", "gradWeight", "gradBias"};

/* ---- the compute (a queued task; runs with the toolkit lock held) ------------------------------------ */
static int bn_run(const mock_op *op, mock_op_call *k) {
    const ascend_mock_tensor *dy = &k->t[T_GRAD], *x = &k->t[T_INPUT];
    const ascend_mock_tensor *mean = &k->t[T_MEAN], *invstd = &k->t[T_INVSTD];
    char a[256], b[256];
    if (dy->rank != x->rank || memcmp(dy->dims, x->dims, dy->rank * sizeof dy->dims[0]) != 0) {
        ascend_mock_violation("%s: gradOut has shape %s but input has shape %s; ops-nn does not check this and the "
                              "kernel reads gradOut with input's shape (validate shapes before calling)",
                              op->phase2, mock_shape_text(dy, a, sizeof a), mock_shape_text(x, b, sizeof b));
        return ACL_ERROR_RT_AICORE_EXCEPTION;
    }
    int64_t channels = x->dims[1];
    const ascend_mock_tensor *stats[2] = {mean, invstd};
    for (int i = 0; i < 2; i++) {
        if (mock_numel(stats[i]) < (uint64_t)channels) {
            ascend_mock_violation("%s: %s has shape %s (%llu elements) but the kernel reads %lld (C = input.shape[1]) "
                                  "elements of it, past its view; ops-nn does not check this (validate lengths)",
                                  op->phase2, i ? "invstd" : "mean", mock_shape_text(stats[i], a, sizeof a),
                                  (unsigned long long)mock_numel(stats[i]), (long long)channels);
            return ACL_ERROR_RT_AICORE_EXCEPTION;
        }
    }

    float *blk = calloc((size_t)channels * 2, sizeof *blk);
    uint32_t *cnt = calloc((size_t)channels, sizeof *cnt);
    if (!blk || !cnt) {
        free(blk);
        free(cnt);
        ascend_mock_violation("%s: the mock ran out of host memory", op->phase2);
        return ACL_ERROR_RT_AICORE_EXCEPTION;
    }
    /* workspace: [0, C) running sum(dy), [C, 2C) running sum(dy*x) */
    for (int64_t c = 0; c < 2 * channels; c++) {
        mock_ws_set(k->ws, c, 0.0f);
    }
    const ascend_mock_tensor *views[] = {dy, x};
    mock_walk it;
    for (mock_walk_init(&it, views, 2); it.left; mock_walk_step(&it)) {
        int64_t c = it.idx[1];
        float vd = mock_load(dy, it.pos[0]), vx = mock_load(x, it.pos[1]);
        float prod = vd * vx;
        blk[2 * c] += vd;
        blk[2 * c + 1] += prod;
        if (++cnt[c] == BLOCK) {
            mock_ws_set(k->ws, c, mock_ws_get(k->ws, c) + blk[2 * c]);
            mock_ws_set(k->ws, channels + c, mock_ws_get(k->ws, channels + c) + blk[2 * c + 1]);
            blk[2 * c] = 0.0f;
            blk[2 * c + 1] = 0.0f;
            cnt[c] = 0;
        }
    }
    for (int64_t c = 0; c < channels; c++) {
        if (cnt[c]) {
            mock_ws_set(k->ws, c, mock_ws_get(k->ws, c) + blk[2 * c]);
            mock_ws_set(k->ws, channels + c, mock_ws_get(k->ws, channels + c) + blk[2 * c + 1]);
        }
    }
    free(blk);
    free(cnt);

    for (int64_t c = 0; c < channels; c++) {
        float sum_dy = mock_ws_get(k->ws, c);
        float sum_dyx = mock_ws_get(k->ws, channels + c);
        float m = mock_load(mean, mock_view_pos(mean, (uint64_t)c));
        float s = mock_load(invstd, mock_view_pos(invstd, (uint64_t)c));
        float m_sum = m * sum_dy;
        float sum_dy_xmu = sum_dyx - m_sum;
        float grad_weight = sum_dy_xmu * s;
        if (k->flags[0]) {
            const ascend_mock_tensor *o = &k->t[T_SUMDY];
            mock_store(o, o->offset + c * o->strides[0], sum_dy);
            o = &k->t[T_SUMDYXMU];
            mock_store(o, o->offset + c * o->strides[0], sum_dy_xmu);
        }
        if (k->flags[1]) {
            const ascend_mock_tensor *o = &k->t[T_GRADW];
            mock_store(o, o->offset + c * o->strides[0], grad_weight);
        }
        if (k->flags[2]) {
            const ascend_mock_tensor *o = &k->t[T_GRADB];
            mock_store(o, o->offset + c * o->strides[0], sum_dy);
        }
    }
    return 0;
}

/* Validation once every needed tensor is resolved (t[i] NULL when unused). */
static aclnnStatus bn_check(const mock_op *op, mock_op_call *call) {
    const ascend_mock_tensor *t[NT];
    int on[NT];
    mock_call_tensors(call, t, on);
    static const int inputs[] = {T_GRAD, T_INPUT, T_MEAN, T_INVSTD};
    static const int outputs[] = {T_SUMDY, T_SUMDYXMU, T_GRADW, T_GRADB};
    static const char support[] = "[DT_FLOAT, DT_FLOAT16, DT_BFLOAT16]";
    for (size_t i = 0; i < 4; i++) {
        const ascend_mock_tensor *x = t[inputs[i]];
        if (!mock_dtype_float(x->dtype)) {
            return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Tensor %s not implemented for %s, should be in dtype support list %s.",
                           k_names[inputs[i]], ascend_mock_dtype_name(x->dtype), support);
        }
    }
    if (t[T_GRAD]->dtype != t[T_INPUT]->dtype) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Tensor gradOut dtype %s should be the same as tensor input dtype %s.",
                       ascend_mock_dtype_name(t[T_GRAD]->dtype), ascend_mock_dtype_name(t[T_INPUT]->dtype));
    }
    for (size_t i = 0; i < 4; i++) {
        const ascend_mock_tensor *x = t[outputs[i]];
        if (on[outputs[i]] && !mock_dtype_float(x->dtype)) {
            return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Tensor %s not implemented for %s, should be in dtype support list %s.",
                           k_names[outputs[i]], ascend_mock_dtype_name(x->dtype), support);
        }
    }
    if (t[T_GRAD]->format != t[T_INPUT]->format) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Format of gradOut %s should be the same as format of input %s.",
                       ascend_mock_format_name(t[T_GRAD]->format), ascend_mock_format_name(t[T_INPUT]->format));
    }
    for (int i = 0; i < NT; i++) {
        if (i == T_WEIGHT || !on[i]) {
            continue;
        }
        if (mock_format_private(t[i]->format)) {
            return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                           "Format of %s does not support %s; it should be one of ND, NCHW, NHWC, HWCN, NDHWC, NCDHW.",
                           k_names[i], ascend_mock_format_name(t[i]->format));
        }
    }
    MOCK_TRY(mock_check_rank_2_to_8(op, call, T_GRAD));
    MOCK_TRY(mock_check_rank_2_to_8(op, call, T_INPUT));
    int64_t channels;
    MOCK_TRY(mock_check_channels(op, call, T_INPUT, &channels));
    MOCK_TRY(mock_check_per_channel(op, call, outputs, MOCK_LEN(outputs), channels));
    call->empty = mock_numel(t[T_GRAD]) == 0 || mock_numel(t[T_INPUT]) == 0 || mock_numel(t[T_MEAN]) == 0 ||
                  mock_numel(t[T_INVSTD]) == 0;
    call->ws_size = call->empty ? 0 : ((uint64_t)channels * 2 * sizeof(float) + 31) & ~(uint64_t)31;
    return ACLNN_SUCCESS;
}

MOCK_OP_DEFINE(aclnnBatchNormReduceBackward, ACLNN_ERR_PARAM_NULLPTR, bn_check, bn_run)

aclnnStatus aclnnBatchNormReduceBackwardGetWorkspaceSize(const aclTensor *gradOut, const aclTensor *input,
                                                         const aclTensor *mean, const aclTensor *invstd,
                                                         const aclTensor *weight, const bool inputG, const bool weightG,
                                                         const bool biasG, aclTensor *sumDy, aclTensor *sumDyXmu,
                                                         aclTensor *gradWeight, aclTensor *gradBias,
                                                         uint64_t *workspaceSize, aclOpExecutor **executor) {
    const aclTensor *h[NT] = {gradOut, input, mean, invstd, weight, sumDy, sumDyXmu, gradWeight, gradBias};
    /* used: checked and read or written; weight is read (the kernel's cast) when given, never
     * checked; masked-off outputs are neither checked nor written, even when given */
    int used[NT] = {1, 1, 1, 1, 1, inputG, inputG, weightG, biasG};
    mock_op_call call = {.nargs = NT, .flags = {inputG, weightG, biasG}};
    for (int i = 0; i < NT; i++) {
        call.args[i] = (mock_op_arg){.name = k_names[i], .handle = h[i], .required = used[i] && i != T_WEIGHT,
                                     .used = used[i], .write = i >= T_SUMDY};
    }
    return mock_op_phase1(&k_op, &call, workspaceSize, executor);
}
