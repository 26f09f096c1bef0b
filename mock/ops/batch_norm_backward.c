/*
 * Mock aclnnBatchNormBackward: ops-nn's validation and the A2/A3 compute, emulating Atlas A2/A3
 * (NpuArch DAV_2201: bf16 accepted, not regbase).
 *
 * Phase 1, as hicann/ops-nn @ e5c3fa93 norm/batch_norm_grad_v3/op_host/op_api/aclnn_batch_norm_backward.cpp:
 *   - a NULL gradOut or input: 161001; an empty input or gradOut: success, workspace 0, nothing written;
 *   - outputMask: NULL or of size 0 is 161001 (CheckMaskNotNull, wired to ACLNN_ERR_PARAM_NULLPTR);
 *     A2 reads outputMask[1] and [2] whatever its size, so a size of 1 or 2 is counted as a violation
 *     (and refused with 161001); an output whose mask bit is set must be non-NULL (161001);
 *   - dtypes F32/F16/BF16: gradOut, input (and equal), the masked-on outputs, then weight, runningMean,
 *     runningVar, saveMean, saveInvstd when given (161002);
 *   - formats: input's and (mask[0]) gradInput's equal gradOut's; private refused; NHWC/NDHWC refused
 *     (A2/A3 do not support them, aclnnBatchNormBackward.md:274,280);
 *   - shapes: gradOut and input rank 2..8 and equal, gradInput (mask[0]) equal; weight, runningMean,
 *     runningVar [C] when given. saveMean/saveInvstd and gradWeight/gradBias are checked to be [C] only
 *     on regbase chips by ops-nn; the A2 kernel reads and writes C elements of them, so the mock
 *     refuses any other shape (161002) rather than read or write past them.
 *
 * The compute (BNTrainingUpdateGrad + BNTrainingReduceGrad, every step in f32): with m = saveMean and
 * v = saveInvstd, which on A2/A3/910 is the batch VARIANCE (absent: 0 and 1), r = 1/sqrt(v + eps),
 * x_norm = (x - m)*r (centered, per element), gradWeight = sum(dy*x_norm), gradBias = sum(dy) (sums as
 * the forward's: blocks of 256), gradInput = weight*r*(dy - gradBias/n - x_norm*gradWeight/n).
 * Eval (training = false, BNInferGrad): m, v = runningMean, runningVar (absent: 0, 1), the same
 * gradWeight and gradBias, gradInput = dy*weight*r.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC visibility push(default)
#include "wrapper.h"
#include "mock_internal.h"
#pragma GCC visibility pop
#include "opapi.h"

#define BLOCK 256

enum { T_GRAD, T_INPUT, T_WEIGHT, T_RMEAN, T_RVAR, T_SMEAN, T_SVAR, T_GIN, T_GW, T_GB, NT };
static const char *const k_names[NT] = {"gradOut",  "input",      "weight",    "runningMean", "runningVar",
                                        "saveMean", "saveInvstd", "gradInput", "gradWeight",  "gradBias"};
/* scalars: eps; flags: training, mask[0..3] */

/* Reads outputMask into mask[0..n) as ops-nn's CheckMaskNotNull sees it: 0, or 161001 for a NULL
 * or empty array; a destroyed or foreign handle, or an array shorter than n (A2 reads [1] and [2]
 * whatever the size), is counted as a violation and refused with 161001 too. */
static aclnnStatus read_mask(const char *api, const aclBoolArray *array, int *mask, uint64_t n) {
    if (!array) {
        ascend_mock_set_error("%s failed. ERROR: %d. outputMask is nullptr.", api, ACLNN_ERR_PARAM_NULLPTR);
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    ascend_mock_lock();
    int state;
    ascend_mock_bool_array *a =
        ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_BOOL_ARRAY, (uint64_t)(uintptr_t)array, &state);
    aclnnStatus r = ACLNN_SUCCESS;
    if (!a) {
        ascend_mock_violation("%s: outputMask %p is %s", api, (const void *)array, ascend_mock_state_text(state));
        r = ACLNN_ERR_PARAM_NULLPTR;
    } else if (a->size == 0) {
        ascend_mock_set_error("%s failed. ERROR: %d. outputMask size should not less than 1.", api,
                              ACLNN_ERR_PARAM_NULLPTR);
        r = ACLNN_ERR_PARAM_NULLPTR;
    } else if (a->size < n) {
        ascend_mock_violation("%s: outputMask has %llu values but ops-nn reads %llu of them (past the array)", api,
                              (unsigned long long)a->size, (unsigned long long)n);
        r = ACLNN_ERR_PARAM_NULLPTR;
    } else {
        for (uint64_t i = 0; i < n; i++) {
            mask[i] = a->values[i];
        }
    }
    ascend_mock_unlock();
    return r;
}

static int bnb_run(const mock_op *op, mock_op_call *k) {
    const ascend_mock_tensor *dy = &k->t[T_GRAD], *x = &k->t[T_INPUT];
    int training = k->flags[0];
    const int *mask = &k->flags[1];
    float eps = (float)k->scalars[0];
    int64_t channels = x->dims[1];
    float *buf = calloc((size_t)channels * 7, sizeof *buf);
    uint32_t *cnt = calloc((size_t)channels * 2, sizeof *cnt);
    if (!buf || !cnt) {
        free(buf);
        free(cnt);
        ascend_mock_violation("%s: the mock ran out of host memory", op->phase2);
        return ACL_ERROR_RT_AICORE_EXCEPTION;
    }
    float *mean = buf, *r = buf + channels, *gw = buf + 2 * channels, *gb = buf + 3 * channels,
          *blk_w = buf + 4 * channels, *blk_b = buf + 5 * channels, *w = buf + 6 * channels;
    uint32_t *cnt_w = cnt, *cnt_b = cnt + channels;
    for (int64_t c = 0; c < channels; c++) {
        int im = training ? T_SMEAN : T_RMEAN, iv = training ? T_SVAR : T_RVAR;
        mean[c] = mock_channel_or(k, im, c, 0.0f);
        r[c] = 1.0f / mock_sqrt_f32(mock_channel_or(k, iv, c, 1.0f) + eps);
        w[c] = mock_channel_or(k, T_WEIGHT, c, 1.0f);
    }
    const ascend_mock_tensor *views[] = {dy, x, &k->t[T_GIN]};
    mock_walk it;
    for (mock_walk_init(&it, views, 2); it.left; mock_walk_step(&it)) {
        int64_t c = it.idx[1];
        float g = mock_load(dy, it.pos[0]);
        float xn = (mock_load(x, it.pos[1]) - mean[c]) * r[c];
        blk_w[c] += g * xn;
        blk_b[c] += g;
        if (++cnt_w[c] == BLOCK) {
            gw[c] += blk_w[c];
            blk_w[c] = 0.0f;
            cnt_w[c] = 0;
        }
        if (++cnt_b[c] == BLOCK) {
            gb[c] += blk_b[c];
            blk_b[c] = 0.0f;
            cnt_b[c] = 0;
        }
    }
    for (int64_t c = 0; c < channels; c++) {
        gw[c] += cnt_w[c] ? blk_w[c] : 0.0f;
        gb[c] += cnt_b[c] ? blk_b[c] : 0.0f;
    }
    if (mask[0]) {
        float n = (float)(mock_numel(x) / (uint64_t)channels);
        for (mock_walk_init(&it, views, 3); it.left; mock_walk_step(&it)) {
            int64_t c = it.idx[1];
            float g = mock_load(dy, it.pos[0]);
            float v;
            if (training) {
                float xn = (mock_load(x, it.pos[1]) - mean[c]) * r[c];
                v = w[c] * r[c] * (g - gb[c] / n - xn * gw[c] / n);
            } else {
                v = g * w[c] * r[c];
            }
            mock_store(&k->t[T_GIN], it.pos[2], v);
        }
    }
    for (int64_t c = 0; c < channels; c++) {
        if (mask[1]) {
            mock_store(&k->t[T_GW], mock_channel_pos(&k->t[T_GW], c), gw[c]);
        }
        if (mask[2]) {
            mock_store(&k->t[T_GB], mock_channel_pos(&k->t[T_GB], c), gb[c]);
        }
    }
    free(buf);
    free(cnt);
    return 0;
}

static aclnnStatus same_shape(const mock_op *op, const mock_op_call *call, int a, int b) {
    const ascend_mock_tensor *x = &call->t[a], *y = &call->t[b];
    char s[256], t[256];
    if (x->rank != y->rank || memcmp(x->dims, y->dims, x->rank * sizeof x->dims[0]) != 0) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Expected tensor %s to have shape %s (%s's), but got %s.",
                            k_names[a], mock_shape_text(y, s, sizeof s), k_names[b], mock_shape_text(x, t, sizeof t));
    }
    return ACLNN_SUCCESS;
}

static aclnnStatus bnb_check(const mock_op *op, mock_op_call *call) {
    const ascend_mock_tensor *dy = &call->t[T_GRAD], *x = &call->t[T_INPUT];
    const int *mask = &call->flags[1];
    call->ws_size = 0;
    if (mock_numel(x) == 0 || mock_numel(dy) == 0) {
        call->empty = 1;
        return ACLNN_SUCCESS;
    }
    MOCK_TRY(mock_check_float_arg(op, call, T_GRAD));
    MOCK_TRY(mock_check_float_arg(op, call, T_INPUT));
    if (dy->dtype != x->dtype) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Tensor input dtype %s should be the same as tensor gradOut dtype %s.",
                            ascend_mock_dtype_name(x->dtype), ascend_mock_dtype_name(dy->dtype));
    }
    static const int rest[] = {T_GIN, T_GW, T_GB, T_WEIGHT, T_RMEAN, T_RVAR, T_SMEAN, T_SVAR};
    for (size_t i = 0; i < MOCK_LEN(rest); i++) {
        MOCK_TRY(mock_check_float_arg(op, call, rest[i]));
    }
    if (dy->format != x->format) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Format of gradOut and input should be equal, gradOut [%s], input [%s].",
                            ascend_mock_format_name(dy->format), ascend_mock_format_name(x->format));
    }
    if (mask[0] && call->t[T_GIN].format != dy->format) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                            "Format of gradOut and gradInput should be equal, gradOut [%s], gradInput [%s].",
                            ascend_mock_format_name(dy->format), ascend_mock_format_name(call->t[T_GIN].format));
    }
    MOCK_TRY(mock_check_format_a2(op, dy, "gradOut"));
    MOCK_TRY(mock_check_format_a2(op, x, "input"));
    MOCK_TRY(mock_check_rank_2_to_8(op, call, T_INPUT));
    MOCK_TRY(mock_check_rank_2_to_8(op, call, T_GRAD));
    MOCK_TRY(same_shape(op, call, T_GRAD, T_INPUT));
    if (mask[0]) {
        MOCK_TRY(mock_check_rank_2_to_8(op, call, T_GIN));
        MOCK_TRY(same_shape(op, call, T_GIN, T_GRAD));
    }
    int64_t channels = x->dims[1];
    static const int per_channel[] = {T_WEIGHT, T_RMEAN, T_RVAR, T_SMEAN, T_SVAR, T_GW, T_GB};
    MOCK_TRY(mock_check_per_channel(op, call, per_channel, MOCK_LEN(per_channel), channels));
    return ACLNN_SUCCESS;
}

MOCK_OP_DEFINE(aclnnBatchNormBackward, ACLNN_ERR_PARAM_NULLPTR, bnb_check, bnb_run)

aclnnStatus aclnnBatchNormBackwardGetWorkspaceSize(const aclTensor *gradOut, const aclTensor *input,
                                                   const aclTensor *weight, const aclTensor *runningMean,
                                                   const aclTensor *runningVar, const aclTensor *saveMean,
                                                   const aclTensor *saveInvstd, bool training, double eps,
                                                   const aclBoolArray *outputMask, aclTensor *gradInput,
                                                   aclTensor *gradWeight, aclTensor *gradBias, uint64_t *workspaceSize,
                                                   aclOpExecutor **executor) {
    static const char api[] = "aclnnBatchNormBackwardGetWorkspaceSize";
    const aclTensor *h[NT] = {gradOut, input,      weight,    runningMean, runningVar,
                              saveMean, saveInvstd, gradInput, gradWeight,  gradBias};
    /* The mask is read here, before the shared phase 1, as ops-nn reads it (CheckMaskNotNull runs
     * after the gradOut/input null checks and the empty-input return; a mask that fails is reported
     * only for non-empty inputs, which the shared phase 1 cannot order: the mock reads it first and
     * reports it after the null checks of gradOut and input). */
    int mask[3] = {0, 0, 0};
    int mask_status = read_mask(api, outputMask, mask, 3);
    mock_op_call call = {.nargs = NT, .scalars = {eps}, .flags = {training, mask[0], mask[1], mask[2]}};
    int used[NT] = {1, 1, 1, 1, 1, 1, 1, mask[0], mask[1], mask[2]};
    for (int i = 0; i < NT; i++) {
        call.args[i] = (mock_op_arg){.name = k_names[i], .handle = h[i], .required = i <= T_INPUT || (i >= T_GIN && used[i]),
                                     .used = used[i], .write = i >= T_GIN};
    }
    if (mask_status && gradOut && input) {
        if (workspaceSize) {
            *workspaceSize = 0;
        }
        if (executor) {
            *executor = NULL;
        }
        return mask_status;
    }
    return mock_op_phase1(&k_op, &call, workspaceSize, executor);
}
