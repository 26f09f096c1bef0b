/*
 * Mock aclnnBatchNorm: ops-nn's validation and the A2/A3 compute, emulating Atlas A2/A3
 * (SocVersion 910B..910E, NpuArch DAV_2201: bf16 accepted, not regbase).
 *
 * Phase 1, as hicann/ops-nn @ e5c3fa93 norm/batch_norm_v3/op_host/op_api/aclnn_batch_norm.cpp:
 *   - a NULL input or output, and in training a NULL saveMean or saveInvstd: 161001 (CheckNotNull);
 *   - an empty input: success before any other check, saveMean filled with 0 and saveInvstd with
 *     NaN when given (l.288-299), the running statistics untouched;
 *   - dtypes F32/F16/BF16, each tensor on its own: input, output, then (training) saveMean and
 *     saveInvstd, then weight, bias, runningMean, runningVar when given (161002);
 *   - formats: output's equals input's; a 5-D input or output must be NCDHW (l.177-185); private
 *     formats refused; NHWC and NDHWC refused as A2/A3 do not support them (aclnnBatchNorm.md:228,233);
 *   - shapes: input and output of rank 2..8 and equal; weight, bias, runningMean, runningVar [C]
 *     when given; in training saveMean and saveInvstd [C] (161002).
 *
 * The compute, every step in f32 as the NPU's BNTrainingReduce/BNTrainingUpdate and BNInfer:
 *   - training: per channel mean = sum(x)/n and the biased variance var = sum((x-mean)^2)/n (sums in
 *     f32, sequential inside blocks of 256 elements, block sums added in order), then
 *     y = (x - mean)/sqrt(var + eps)*weight + bias; runningMean <- (1-m)*runningMean + m*mean and
 *     runningVar <- (1-m)*runningVar + m*var*n/(n-1) in place; saveMean <- mean and, as on A2/A3/910,
 *     saveInvstd <- var, the batch VARIANCE (aclnnBatchNorm.md:229,234; only Ascend 950 stores
 *     1/sqrt(var+eps) there);
 *   - inference: y = (x - runningMean)/sqrt(runningVar + eps)*weight + bias; nothing else written.
 * Absent weight, bias, runningMean, runningVar act as 1, 0, 0, 1 (l.601-627).
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC visibility push(default)
#include "wrapper.h"
#pragma GCC visibility pop
#include "opapi.h"

#define BLOCK 256

enum { T_INPUT, T_WEIGHT, T_BIAS, T_RMEAN, T_RVAR, T_OUTPUT, T_SMEAN, T_SVAR, NT };
static const char *const k_names[NT] = {"input",  "weight", "bias",     "runningMean",
                                        "runningVar", "output", "saveMean", "saveInvstd"};
/* scalars: momentum, eps; flags: training */

/* Adds `v` to channel c's running block sum, folding the block into total[c] every BLOCK elements. */
static void block_add(float *blk, float *total, uint32_t *cnt, int64_t c, float v) {
    blk[c] += v;
    if (++cnt[c] == BLOCK) {
        total[c] += blk[c];
        blk[c] = 0.0f;
        cnt[c] = 0;
    }
}

static void block_flush(float *blk, float *total, uint32_t *cnt, int64_t channels) {
    for (int64_t c = 0; c < channels; c++) {
        if (cnt[c]) {
            total[c] += blk[c];
        }
        blk[c] = 0.0f;
        cnt[c] = 0;
    }
}

/* ---- the compute (a queued task; runs with the toolkit lock held) ------------------------------------ */
static int bn_run(const mock_op *op, mock_op_call *k) {
    const ascend_mock_tensor *x = &k->t[T_INPUT], *y = &k->t[T_OUTPUT];
    int training = k->flags[0];
    float momentum = (float)k->scalars[0], eps = (float)k->scalars[1];
    int64_t channels = x->dims[1];
    if (mock_numel(x) == 0) {
        /* ops-nn's empty-input branch: saveMean 0, saveInvstd NaN, whatever `training` is. */
        for (int64_t c = 0; c < channels; c++) {
            if (k->args[T_SMEAN].used && k->t[T_SMEAN].rank == 1 && c < k->t[T_SMEAN].dims[0]) {
                mock_store(&k->t[T_SMEAN], mock_channel_pos(&k->t[T_SMEAN], c), 0.0f);
            }
            if (k->args[T_SVAR].used && k->t[T_SVAR].rank == 1 && c < k->t[T_SVAR].dims[0]) {
                mock_store(&k->t[T_SVAR], mock_channel_pos(&k->t[T_SVAR], c), NAN);
            }
        }
        return 0;
    }
    float *buf = calloc((size_t)channels * 5, sizeof *buf);
    uint32_t *cnt = calloc((size_t)channels, sizeof *cnt);
    if (!buf || !cnt) {
        free(buf);
        free(cnt);
        ascend_mock_violation("%s: the mock ran out of host memory", op->phase2);
        return ACL_ERROR_RT_AICORE_EXCEPTION;
    }
    float *mean = buf, *var = buf + channels, *blk = buf + 2 * channels, *scale = buf + 3 * channels,
          *shift = buf + 4 * channels;
    uint64_t n = mock_numel(x) / (uint64_t)channels;
    const ascend_mock_tensor *views[] = {x, y};
    mock_walk it;
    if (training) {
        for (mock_walk_init(&it, views, 1); it.left; mock_walk_step(&it)) {
            block_add(blk, mean, cnt, it.idx[1], mock_load(x, it.pos[0]));
        }
        block_flush(blk, mean, cnt, channels);
        for (int64_t c = 0; c < channels; c++) {
            mean[c] = mean[c] / (float)n;
        }
        for (mock_walk_init(&it, views, 1); it.left; mock_walk_step(&it)) {
            int64_t c = it.idx[1];
            float d = mock_load(x, it.pos[0]) - mean[c];
            block_add(blk, var, cnt, c, d * d);
        }
        block_flush(blk, var, cnt, channels);
        for (int64_t c = 0; c < channels; c++) {
            var[c] = var[c] / (float)n;
        }
    } else {
        for (int64_t c = 0; c < channels; c++) {
            mean[c] = mock_channel_or(k, T_RMEAN, c, 0.0f);
            var[c] = mock_channel_or(k, T_RVAR, c, 1.0f);
        }
    }
    for (int64_t c = 0; c < channels; c++) {
        scale[c] = mock_channel_or(k, T_WEIGHT, c, 1.0f) / mock_sqrt_f32(var[c] + eps);
        shift[c] = mock_channel_or(k, T_BIAS, c, 0.0f);
    }
    for (mock_walk_init(&it, views, 2); it.left; mock_walk_step(&it)) {
        int64_t c = it.idx[1];
        mock_store(y, it.pos[1], (mock_load(x, it.pos[0]) - mean[c]) * scale[c] + shift[c]);
    }
    if (training) {
        float unbias = (float)n / (float)(n - 1); /* n = 1 gives inf, as f32 does */
        for (int64_t c = 0; c < channels; c++) {
            if (k->args[T_RMEAN].used) {
                const ascend_mock_tensor *r = &k->t[T_RMEAN];
                float old = mock_load(r, mock_channel_pos(r, c));
                mock_store(r, mock_channel_pos(r, c), (1.0f - momentum) * old + momentum * mean[c]);
            }
            if (k->args[T_RVAR].used) {
                const ascend_mock_tensor *r = &k->t[T_RVAR];
                float old = mock_load(r, mock_channel_pos(r, c));
                mock_store(r, mock_channel_pos(r, c), (1.0f - momentum) * old + momentum * (var[c] * unbias));
            }
            mock_store(&k->t[T_SMEAN], mock_channel_pos(&k->t[T_SMEAN], c), mean[c]);
            mock_store(&k->t[T_SVAR], mock_channel_pos(&k->t[T_SVAR], c), var[c]); /* the variance (A2/A3) */
        }
    }
    free(buf);
    free(cnt);
    return 0;
}

/* The format rules of input or output `t` (A2/A3): a 5-D one must be NCDHW (l.177-185). */
static aclnnStatus format_ok(const mock_op *op, const ascend_mock_tensor *t, const char *name) {
    if (t->rank == 5 && t->format != ACL_FORMAT_NCDHW) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Format of %s should be NCDHW, when input dim is 5.", name);
    }
    return mock_check_format_a2(op, t, name);
}

static aclnnStatus bn_check(const mock_op *op, mock_op_call *call) {
    const ascend_mock_tensor *x = &call->t[T_INPUT], *y = &call->t[T_OUTPUT];
    int training = call->flags[0];
    char a[256], b[256];
    call->ws_size = 0;
    call->empty = 0; /* an empty input still fills saveMean and saveInvstd */
    if (mock_numel(x) == 0) {
        return ACLNN_SUCCESS;
    }
    static const int first[] = {T_INPUT, T_OUTPUT, T_SMEAN, T_SVAR};
    for (size_t i = 0; i < MOCK_LEN(first); i++) {
        if (first[i] < T_SMEAN || training) {
            MOCK_TRY(mock_check_float_arg(op, call, first[i]));
        }
    }
    static const int others[] = {T_WEIGHT, T_BIAS, T_RMEAN, T_RVAR};
    for (size_t i = 0; i < MOCK_LEN(others); i++) {
        MOCK_TRY(mock_check_float_arg(op, call, others[i]));
    }
    if (x->format != y->format) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                            "Format of input and output should be equal, input [%s], output [%s].",
                            ascend_mock_format_name(x->format), ascend_mock_format_name(y->format));
    }
    MOCK_TRY(format_ok(op, x, "input"));
    MOCK_TRY(format_ok(op, y, "output"));
    MOCK_TRY(mock_check_rank_2_to_8(op, call, T_INPUT));
    MOCK_TRY(mock_check_rank_2_to_8(op, call, T_OUTPUT));
    if (y->rank != x->rank || memcmp(y->dims, x->dims, x->rank * sizeof x->dims[0]) != 0) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Expected tensor output to have shape %s (input's), but got %s.",
                            mock_shape_text(x, a, sizeof a), mock_shape_text(y, b, sizeof b));
    }
    int64_t channels = x->dims[1];
    MOCK_TRY(mock_check_per_channel(op, call, others, MOCK_LEN(others), channels));
    if (training) {
        static const int saved[] = {T_SMEAN, T_SVAR};
        MOCK_TRY(mock_check_per_channel(op, call, saved, MOCK_LEN(saved), channels));
    }
    return ACLNN_SUCCESS;
}

MOCK_OP_DEFINE(aclnnBatchNorm, ACLNN_ERR_PARAM_NULLPTR, bn_check, bn_run)

aclnnStatus aclnnBatchNormGetWorkspaceSize(const aclTensor *input, const aclTensor *weight, const aclTensor *bias,
                                           aclTensor *runningMean, aclTensor *runningVar, bool training,
                                           double momentum, double eps, aclTensor *output, aclTensor *saveMean,
                                           aclTensor *saveInvstd, uint64_t *workspaceSize, aclOpExecutor **executor) {
    const aclTensor *h[NT] = {input, weight, bias, runningMean, runningVar, output, saveMean, saveInvstd};
    mock_op_call call = {.nargs = NT, .scalars = {momentum, eps}, .flags = {training}};
    for (int i = 0; i < NT; i++) {
        int required = i == T_INPUT || i == T_OUTPUT || (training && (i == T_SMEAN || i == T_SVAR));
        /* outputs: the output, the save tensors (an empty input writes them whatever `training`
         * is) and the running statistics, updated in place in training and numbered among the
         * outputs in eval too, as the Rust bindings list them (for aclSetOutputTensorAddr) */
        int write = i >= T_RMEAN;
        call.args[i] = (mock_op_arg){.name = k_names[i], .handle = h[i], .required = required, .used = 1,
                                     .write = write};
    }
    return mock_op_phase1(&k_op, &call, workspaceSize, executor);
}
