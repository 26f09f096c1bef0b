/*
 * Mock aclnnBatchNormGatherStatsWithCounts: ops-nn's validation (Atlas A2/A3 rules) and the
 * hardware's compute.
 *
 * Phase 1: null checks of input, mean, invstd, counts, meanAll, invstdAll (161001, by the shared
 * helper; runningMean and runningVar are optional), then every tensor's dtype in FLOAT, FLOAT16,
 * BFLOAT16 (counts included: int32 counts are rejected), private formats of input, mean, invstd and counts, input rank 2..8, mean
 * and invstd 2-D [W, C] with C = input.shape[1], counts 1-D [W], the running statistics and both
 * outputs [C] (161002).
 * CANN tests only runningMean before writing both running statistics: runningMean without
 * runningVar would write through NULL (the mock counts a violation and fails with 161002), and
 * runningVar without runningMean is silently not updated (the mock counts a violation and leaves
 * it untouched). The safe API never passes either.
 * Compute, in f32 as the NPU does, every tensor read through its view (PyTorch's reference math;
 * that the closed kernel uses N - 1 for the running variance is assumed, not confirmed):
 * N = sum counts; mean = sum(n_j mean_j) / N; var_n = sum n_j (1/invstd_j^2 - eps) +
 * sum n_j (mean_j - mean)^2; invstd = 1/sqrt(var_n/N + eps); runningMean = (1-m) rm + m mean;
 * runningVar = (1-m) rv + m var_n/(N-1). An empty mean (W or C = 0) gives meanAll 0 and
 * invstdAll NaN, the running statistics untouched.
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

enum { T_INPUT, T_MEAN, T_INVSTD, T_RMEAN, T_RVAR, T_COUNTS, T_MEANALL, T_INVSTDALL, NT };
static const char *const k_names[NT] = {"input",  "mean",   "invstd",  "runningMean",
                                        "runningVar", "counts", "meanAll", "invstdAll"};

/* Element (j, c) of a [W, C] view. */
static float at2(const ascend_mock_tensor *t, int64_t j, int64_t c) {
    return mock_load(t, t->offset + j * t->strides[0] + c * t->strides[1]);
}

static float at1(const ascend_mock_tensor *t, int64_t i) {
    return mock_load(t, t->offset + i * t->strides[0]);
}

static void put1(const ascend_mock_tensor *t, int64_t i, float v) {
    mock_store(t, t->offset + i * t->strides[0], v);
}

static int gather_run(const mock_op *op, mock_op_call *k) {
    (void)op;
    const ascend_mock_tensor *mean = &k->t[T_MEAN], *invstd = &k->t[T_INVSTD], *counts = &k->t[T_COUNTS];
    const ascend_mock_tensor *mean_all = &k->t[T_MEANALL], *invstd_all = &k->t[T_INVSTDALL];
    int64_t w = mean->dims[0], channels = mean->dims[1];
    if (w == 0 || channels == 0) {
        for (int64_t c = 0; c < mean_all->dims[0]; c++) {
            put1(mean_all, c, 0.0f);
            put1(invstd_all, c, NAN);
        }
        return 0;
    }
    float eps = (float)k->scalars[1], momentum = (float)k->scalars[0];
    int running = k->args[T_RMEAN].used && k->args[T_RVAR].used;
    float n = 0.0f;
    for (int64_t j = 0; j < w; j++) {
        n += at1(counts, j);
    }
    for (int64_t c = 0; c < channels; c++) {
        float s = 0.0f;
        for (int64_t j = 0; j < w; j++) {
            s += at1(counts, j) * at2(mean, j, c);
        }
        float m = s / n;
        float var_n = 0.0f;
        for (int64_t j = 0; j < w; j++) {
            float nj = at1(counts, j), inv = at2(invstd, j, c), dm = at2(mean, j, c) - m;
            float var_j = 1.0f / (inv * inv) - eps;
            var_n += nj * var_j + nj * dm * dm;
        }
        put1(mean_all, c, m);
        put1(invstd_all, c, 1.0f / mock_sqrt_f32(var_n / n + eps));
        if (running) {
            const ascend_mock_tensor *rm = &k->t[T_RMEAN], *rv = &k->t[T_RVAR];
            put1(rm, c, (1.0f - momentum) * at1(rm, c) + momentum * m);
            put1(rv, c, (1.0f - momentum) * at1(rv, c) + momentum * (var_n / (n - 1.0f)));
        }
    }
    return 0;
}

static aclnnStatus gather_check(const mock_op *op, mock_op_call *call) {
    const ascend_mock_tensor *t[NT];
    for (int i = 0; i < NT; i++) {
        t[i] = call->args[i].used ? &call->t[i] : NULL;
    }
    if (t[T_RMEAN] && !t[T_RVAR]) {
        ascend_mock_violation("%s: runningMean given without runningVar: CANN tests only runningMean before writing "
                              "both running statistics and would write through the null runningVar",
                              op->phase1);
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "runningVar is null while runningMean is not.");
    }
    if (t[T_RVAR] && !t[T_RMEAN]) {
        ascend_mock_violation("%s: runningVar given without runningMean: CANN silently leaves runningVar unchanged",
                              op->phase1);
        call->args[T_RVAR].used = 0;
        t[T_RVAR] = NULL;
    }
    for (int i = 0; i < NT; i++) {
        if (t[i] && !mock_dtype_float(t[i]->dtype)) {
            return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                                "Tensor %s not implemented for %s, should be in dtype support list [DT_FLOAT, "
                                "DT_FLOAT16, DT_BFLOAT16].",
                                k_names[i], ascend_mock_dtype_name(t[i]->dtype));
        }
    }
    /* The formats of input, mean, invstd and counts only (ops-nn
     * aclnn_batch_norm_gather_stats_with_counts.cpp:115-119): meanAll, invstdAll and the running
     * statistics are not checked. */
    static const int formatted[] = {T_INPUT, T_MEAN, T_INVSTD, T_COUNTS};
    for (size_t k = 0; k < sizeof formatted / sizeof formatted[0]; k++) {
        int i = formatted[k];
        if (t[i] && mock_format_private(t[i]->format)) {
            return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Format of %s does not support %s.", k_names[i],
                                ascend_mock_format_name(t[i]->format));
        }
    }
    const ascend_mock_tensor *x = t[T_INPUT], *mean = t[T_MEAN], *invstd = t[T_INVSTD], *counts = t[T_COUNTS];
    MOCK_TRY(mock_check_rank_2_to_8(op, call, T_INPUT));
    if (mean->rank != 2 || invstd->rank != 2) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Dim of mean and invstd should be 2, but got %llu and %llu.",
                            (unsigned long long)mean->rank, (unsigned long long)invstd->rank);
    }
    if (counts->rank != 1) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Dim of counts should be 1, but got %llu.",
                            (unsigned long long)counts->rank);
    }
    if (mean->dims[0] != invstd->dims[0] || mean->dims[0] != counts->dims[0]) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                            "mean.shape[0], invstd.shape[0] and counts.shape[0] should be equal, but got %lld, %lld "
                            "and %lld.",
                            (long long)mean->dims[0], (long long)invstd->dims[0], (long long)counts->dims[0]);
    }
    int64_t channels = x->dims[1];
    if (mean->dims[1] != channels || invstd->dims[1] != channels) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                            "mean.shape[1] and invstd.shape[1] should equal input.shape[1] %lld, but got %lld and %lld.",
                            (long long)channels, (long long)mean->dims[1], (long long)invstd->dims[1]);
    }
    static const int vectors[] = {T_RMEAN, T_RVAR, T_MEANALL, T_INVSTDALL};
    MOCK_TRY(mock_check_per_channel(op, call, vectors, MOCK_LEN(vectors), channels));
    /* the kernel keeps the broadcast global mean in the workspace */
    call->ws_size = mock_numel(mean) == 0 ? 0 : ((uint64_t)channels * sizeof(float) + 31) & ~(uint64_t)31;
    return ACLNN_SUCCESS;
}

MOCK_OP_DEFINE(aclnnBatchNormGatherStatsWithCounts, ACLNN_ERR_PARAM_NULLPTR, gather_check, gather_run)

aclnnStatus aclnnBatchNormGatherStatsWithCountsGetWorkspaceSize(
    const aclTensor *input, const aclTensor *mean, const aclTensor *invstd, aclTensor *runningMean,
    aclTensor *runningVar, double momentum, double eps, const aclTensor *counts, aclTensor *meanAll,
    aclTensor *invstdAll, uint64_t *workspaceSize, aclOpExecutor **executor) {
    const aclTensor *h[NT] = {input, mean, invstd, runningMean, runningVar, counts, meanAll, invstdAll};
    mock_op_call call = {.nargs = NT, .scalars = {momentum, eps}};
    for (int i = 0; i < NT; i++) {
        int optional = i == T_RMEAN || i == T_RVAR;
        int write = i == T_RMEAN || i == T_RVAR || i == T_MEANALL || i == T_INVSTDALL;
        call.args[i] = (mock_op_arg){.name = k_names[i], .handle = h[i], .required = !optional, .used = 1, .write = write};
    }
    return mock_op_phase1(&k_op, &call, workspaceSize, executor);
}
