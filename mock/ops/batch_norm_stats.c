/*
 * Mock aclnnBatchNormStats: ops-math's validation (Atlas A2/A3 rules) and the hardware's compute.
 *
 * Phase 1: null checks (161001, by the shared helper), then dtypes (input FLOAT or FLOAT16:
 * BFLOAT16 only on Ascend 950, which this mock does not emulate; mean and invstd FLOAT only),
 * private formats, input rank 2..8 with a non-zero channel dim 1, mean and invstd 1-D of length
 * C (161002).
 * Compute, in f32 as the NPU does: every element read through its view; per channel, sum x
 * (sequential inside blocks of 256 elements of the channel, block sums added in order, kept in
 * the workspace), mean = sum / n; then the same for (x - mean)^2, invstd = 1 / sqrt(sum / n + eps)
 * with eps as a float. An empty input gives mean 0 and invstd NaN (ops-math fills them).
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h> /* NAN (no libm function is used: the mock links nothing but libc) */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC visibility push(default)
#include "wrapper.h"
#pragma GCC visibility pop
#include "opapi.h"

#define BLOCK 256

enum { T_INPUT, T_MEAN, T_INVSTD, NT };
static const char *const k_names[NT] = {"input", "mean", "invstd"};

/* Per channel, into ws[0, C): the f32 sum of x (shift NULL) or of (x - shift[c])^2, in blocks of
 * BLOCK elements of the channel (row-major order). Returns 0, or -1 when out of host memory. */
static int channel_sums(const ascend_mock_tensor *x, const float *shift, uint8_t *ws) {
    int64_t channels = x->dims[1];
    float *blk = calloc((size_t)channels, sizeof *blk);
    uint32_t *cnt = calloc((size_t)channels, sizeof *cnt);
    if (!blk || !cnt) {
        free(blk);
        free(cnt);
        return -1;
    }
    for (int64_t c = 0; c < channels; c++) {
        mock_ws_set(ws, c, 0.0f);
    }
    mock_walk it;
    for (mock_walk_init(&it, &x, 1); it.left; mock_walk_step(&it)) {
        int64_t c = it.idx[1];
        float v = mock_load(x, it.pos[0]);
        if (shift) {
            float d = v - shift[c];
            v = d * d;
        }
        blk[c] += v;
        if (++cnt[c] == BLOCK) {
            mock_ws_set(ws, c, mock_ws_get(ws, c) + blk[c]);
            blk[c] = 0.0f;
            cnt[c] = 0;
        }
    }
    for (int64_t c = 0; c < channels; c++) {
        if (cnt[c]) {
            mock_ws_set(ws, c, mock_ws_get(ws, c) + blk[c]);
        }
    }
    free(blk);
    free(cnt);
    return 0;
}

static int stats_run(const mock_op *op, mock_op_call *k) {
    const ascend_mock_tensor *x = &k->t[T_INPUT], *mean = &k->t[T_MEAN], *invstd = &k->t[T_INVSTD];
    int64_t channels = x->dims[1];
    uint64_t total = mock_numel(x);
    if (total == 0) {
        for (int64_t c = 0; c < channels; c++) {
            mock_store(mean, mock_view_pos(mean, (uint64_t)c), 0.0f);
            mock_store(invstd, mock_view_pos(invstd, (uint64_t)c), NAN);
        }
        return 0;
    }
    float n = (float)(total / (uint64_t)channels);
    float eps = (float)k->scalars[0];
    float *m = calloc((size_t)channels, sizeof *m);
    if (!m || channel_sums(x, NULL, k->ws) != 0) {
        free(m);
        ascend_mock_violation("%s: the mock ran out of host memory", op->phase2);
        return ACL_ERROR_RT_AICORE_EXCEPTION;
    }
    for (int64_t c = 0; c < channels; c++) {
        m[c] = mock_ws_get(k->ws, c) / n;
    }
    if (channel_sums(x, m, k->ws) != 0) {
        free(m);
        ascend_mock_violation("%s: the mock ran out of host memory", op->phase2);
        return ACL_ERROR_RT_AICORE_EXCEPTION;
    }
    for (int64_t c = 0; c < channels; c++) {
        float var = mock_ws_get(k->ws, c) / n;
        mock_store(mean, mock_view_pos(mean, (uint64_t)c), m[c]);
        mock_store(invstd, mock_view_pos(invstd, (uint64_t)c), 1.0f / mock_sqrt_f32(var + eps));
    }
    free(m);
    return 0;
}

static aclnnStatus stats_check(const mock_op *op, mock_op_call *call) {
    const ascend_mock_tensor *x = &call->t[T_INPUT];
    if (x->dtype != ACL_FLOAT && x->dtype != ACL_FLOAT16) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                            "Tensor input not implemented for %s, should be in dtype support list [DT_FLOAT, DT_FLOAT16].",
                            ascend_mock_dtype_name(x->dtype));
    }
    for (int i = T_MEAN; i <= T_INVSTD; i++) {
        if (call->t[i].dtype != ACL_FLOAT) {
            return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                                "Tensor %s not implemented for %s, should be in dtype support list [DT_FLOAT].",
                                k_names[i], ascend_mock_dtype_name(call->t[i].dtype));
        }
    }
    for (int i = 0; i < NT; i++) {
        if (mock_format_private(call->t[i].format)) {
            return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Format of %s does not support %s.", k_names[i],
                                ascend_mock_format_name(call->t[i].format));
        }
    }
    MOCK_TRY(mock_check_rank_2_to_8(op, call, T_INPUT));
    int64_t channels;
    MOCK_TRY(mock_check_channels(op, call, T_INPUT, &channels));
    static const int per_channel[] = {T_MEAN, T_INVSTD};
    MOCK_TRY(mock_check_per_channel(op, call, per_channel, MOCK_LEN(per_channel), channels));
    /* the kernel's per-channel running sums live in the workspace */
    call->ws_size = mock_numel(x) == 0 ? 0 : ((uint64_t)channels * sizeof(float) + 31) & ~(uint64_t)31;
    return ACLNN_SUCCESS;
}

MOCK_OP_DEFINE(aclnnBatchNormStats, ACLNN_ERR_PARAM_NULLPTR, stats_check, stats_run)

aclnnStatus aclnnBatchNormStatsGetWorkspaceSize(const aclTensor *input, double eps, aclTensor *mean, aclTensor *invstd,
                                                uint64_t *workspaceSize, aclOpExecutor **executor) {
    const aclTensor *h[NT] = {input, mean, invstd};
    mock_op_call call = {.nargs = NT, .scalars = {eps}};
    for (int i = 0; i < NT; i++) {
        call.args[i] = (mock_op_arg){.name = k_names[i], .handle = h[i], .required = 1, .used = 1, .write = i != T_INPUT};
    }
    return mock_op_phase1(&k_op, &call, workspaceSize, executor);
}
