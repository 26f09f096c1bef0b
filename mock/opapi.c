/*
 * Mock CANN: libopapi.so, aclnnBatchNormReduceBackward.
 *
 * Phase 1 (GetWorkspaceSize) validates the arguments exactly as ops-nn does (SEMANTICS.md 3.1,
 * API.md 7): null checks first (161001), then dtype, format, rank, channel and output-shape checks
 * (161002); empty inputs succeed with a no-op executor. Phase 2 checks the executor, tensors,
 * workspace and stream, snapshots the tensors and queues the compute on the stream.
 *
 * The compute follows the hardware (SEMANTICS.md 0.2): every input read through its view and cast
 * to f32; per channel, sum dy and dy*x in f32 (sequential inside blocks of 256 elements of the
 * channel, block sums added in order), kept in the workspace; then sumDyXmu = sum(dy*x) -
 * mean*sum(dy), gradWeight = sumDyXmu*invstd, gradBias = sum(dy), each cast (round to nearest
 * even) to its output's dtype and written through the output's view.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC visibility push(default)
#include "wrapper.h"
#include "mock_internal.h"
#pragma GCC visibility pop

enum {
    ACLNN_SUCCESS = 0,
    ACLNN_ERR_PARAM_NULLPTR = 161001,
    ACLNN_ERR_PARAM_INVALID = 161002,
    ACLNN_ERR_RUNTIME_ERROR = 361001,
    ACL_ERROR_RT_AICORE_EXCEPTION = 507015
};

#define BLOCK 256

static const char k_phase1[] = "aclnnBatchNormReduceBackwardGetWorkspaceSize";
static const char k_phase2[] = "aclnnBatchNormReduceBackward";

enum { T_GRAD, T_INPUT, T_MEAN, T_INVSTD, T_WEIGHT, T_SUMDY, T_SUMDYXMU, T_GRADW, T_GRADB, NT };
static const char *const k_names[NT] = {"gradOut", "input",    "mean",       "invstd",  "weight",
                                        "sumDy",   "sumDyXmu", "gradWeight", "gradBias"};

typedef struct bn_executor {
    ascend_mock_executor base;
    uint64_t tensors[NT]; /* 0 when not used (NULL weight, masked-off output) */
    int input_g, weight_g, bias_g;
    int64_t channels;
    uint64_t ws_size;
    int empty;
} bn_executor;

typedef struct bn_task {
    ascend_mock_tensor t[NT];
    int used[NT];
    int input_g, weight_g, bias_g;
    int64_t channels;
    uint8_t *ws;
} bn_task;

/* ---- f16 / bf16 <-> f32 ------------------------------------------------------------------------- */
static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t man = h & 0x3FF;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in f32 */
        float v = (float)man * bits_f32(0x33800000u); /* 2^-24 */
        return bits_f32(f32_bits(v) | sign);
    }
    if (exp == 31) {
        return bits_f32(sign | 0x7F800000u | (man << 13));
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static uint16_t f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t a = x & 0x7FFFFFFFu;
    if (a > 0x7F800000u) { /* NaN: keep it quiet, keep the top payload bits */
        return (uint16_t)(sign | 0x7E00 | ((a >> 13) & 0x3FF));
    }
    if (a >= 0x477FF000u) { /* >= 65520 (halfway past 65504) rounds to infinity; Inf stays Inf */
        return (uint16_t)(sign | 0x7C00);
    }
    if (a < 0x38800000u) { /* below 2^-14: f16 subnormal or zero */
        if (a < 0x33000000u) { /* below 2^-25: rounds to zero */
            return sign;
        }
        uint32_t e = a >> 23;                  /* 102..112 */
        uint32_t m = (a & 0x7FFFFFu) | 0x800000u; /* value = m * 2^(e-150) */
        uint32_t shift = 126 - e;             /* f16 units of 2^-24: m >> shift */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) {
            q++;
        }
        return (uint16_t)(sign | q);
    }
    uint32_t h = ((a >> 23) - 112) << 10 | ((a >> 13) & 0x3FF);
    uint32_t rem = a & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) {
        h++; /* may carry into the exponent: still correct */
    }
    return (uint16_t)(sign | h);
}

static float bf16_to_f32(uint16_t b) {
    return bits_f32((uint32_t)b << 16);
}

static uint16_t f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
        return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    }
    x += 0x7FFFu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* ---- element access -------------------------------------------------------------------------------- */
static float load(const ascend_mock_tensor *t, int64_t pos) {
    const uint8_t *p = (const uint8_t *)t->data + (uint64_t)pos * t->elem_size;
    uint16_t h;
    float f;
    switch ((int)t->dtype) {
    case ACL_FLOAT:
        memcpy(&f, p, sizeof f);
        return f;
    case ACL_FLOAT16:
        memcpy(&h, p, sizeof h);
        return f16_to_f32(h);
    case ACL_BF16:
        memcpy(&h, p, sizeof h);
        return bf16_to_f32(h);
    default:
        return 0.0f;
    }
}

static void store(const ascend_mock_tensor *t, int64_t pos, float v) {
    uint8_t *p = (uint8_t *)t->data + (uint64_t)pos * t->elem_size;
    uint16_t h;
    switch ((int)t->dtype) {
    case ACL_FLOAT:
        memcpy(p, &v, sizeof v);
        break;
    case ACL_FLOAT16:
        h = f32_to_f16(v);
        memcpy(p, &h, sizeof h);
        break;
    case ACL_BF16:
        h = f32_to_bf16(v);
        memcpy(p, &h, sizeof h);
        break;
    default:
        break;
    }
}

static uint64_t numel(const ascend_mock_tensor *t) {
    uint64_t n = 1;
    for (uint64_t i = 0; i < t->rank; i++) {
        n *= (uint64_t)t->dims[i];
    }
    return n;
}

/* Storage position of the linear-th element of the view (row-major order). */
static int64_t view_pos(const ascend_mock_tensor *t, uint64_t linear) {
    int64_t pos = t->offset;
    for (uint64_t k = t->rank; k-- > 0;) {
        uint64_t d = (uint64_t)t->dims[k];
        pos += (int64_t)(linear % d) * t->strides[k];
        linear /= d;
    }
    return pos;
}

static const char *shape_text(const ascend_mock_tensor *t, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (uint64_t i = 0; i < t->rank && n < cap; i++) {
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)t->dims[i]);
    }
    if (n < cap) {
        snprintf(buf + n, cap - n, "]");
    }
    return buf;
}

static float ws_get(const uint8_t *ws, int64_t i) {
    float f;
    memcpy(&f, ws + (uint64_t)i * sizeof f, sizeof f);
    return f;
}

static void ws_set(uint8_t *ws, int64_t i, float f) {
    memcpy(ws + (uint64_t)i * sizeof f, &f, sizeof f);
}

/* ---- the compute (a queued task; runs with the toolkit lock held) ------------------------------------ */
static int bn_run(void *payload) {
    bn_task *k = payload;
    const ascend_mock_tensor *dy = &k->t[T_GRAD], *x = &k->t[T_INPUT];
    const ascend_mock_tensor *mean = &k->t[T_MEAN], *invstd = &k->t[T_INVSTD];
    char a[256], b[256];
    if (dy->rank != x->rank || memcmp(dy->dims, x->dims, dy->rank * sizeof dy->dims[0]) != 0) {
        ascend_mock_violation("%s: gradOut has shape %s but input has shape %s; ops-nn does not check this and the "
                              "kernel reads gradOut with input's shape (validate shapes before calling)",
                              k_phase2, shape_text(dy, a, sizeof a), shape_text(x, b, sizeof b));
        return ACL_ERROR_RT_AICORE_EXCEPTION;
    }
    int64_t channels = k->channels;
    const ascend_mock_tensor *stats[2] = {mean, invstd};
    for (int i = 0; i < 2; i++) {
        if (numel(stats[i]) < (uint64_t)channels) {
            ascend_mock_violation("%s: %s has shape %s (%llu elements) but the kernel reads %lld (C = input.shape[1]) "
                                  "elements of it, past its view; ops-nn does not check this (validate lengths)",
                                  k_phase2, i ? "invstd" : "mean", shape_text(stats[i], a, sizeof a),
                                  (unsigned long long)numel(stats[i]), (long long)channels);
            return ACL_ERROR_RT_AICORE_EXCEPTION;
        }
    }

    float *blk = calloc((size_t)channels * 2, sizeof *blk);
    uint32_t *cnt = calloc((size_t)channels, sizeof *cnt);
    if (!blk || !cnt) {
        free(blk);
        free(cnt);
        ascend_mock_violation("%s: the mock ran out of host memory", k_phase2);
        return ACL_ERROR_RT_AICORE_EXCEPTION;
    }
    /* workspace: [0, C) running sum(dy), [C, 2C) running sum(dy*x) */
    for (int64_t c = 0; c < 2 * channels; c++) {
        ws_set(k->ws, c, 0.0f);
    }
    uint64_t rank = dy->rank, total = numel(dy);
    int64_t idx[ASCEND_MOCK_MAX_RANK] = {0};
    int64_t pd = dy->offset, px = x->offset;
    for (uint64_t e = 0; e < total; e++) {
        int64_t c = idx[1];
        float vd = load(dy, pd), vx = load(x, px);
        float prod = vd * vx;
        blk[2 * c] += vd;
        blk[2 * c + 1] += prod;
        if (++cnt[c] == BLOCK) {
            ws_set(k->ws, c, ws_get(k->ws, c) + blk[2 * c]);
            ws_set(k->ws, channels + c, ws_get(k->ws, channels + c) + blk[2 * c + 1]);
            blk[2 * c] = 0.0f;
            blk[2 * c + 1] = 0.0f;
            cnt[c] = 0;
        }
        for (uint64_t d = rank; d-- > 0;) {
            idx[d]++;
            pd += dy->strides[d];
            px += x->strides[d];
            if (idx[d] < dy->dims[d]) {
                break;
            }
            pd -= dy->strides[d] * dy->dims[d];
            px -= x->strides[d] * x->dims[d];
            idx[d] = 0;
        }
    }
    for (int64_t c = 0; c < channels; c++) {
        if (cnt[c]) {
            ws_set(k->ws, c, ws_get(k->ws, c) + blk[2 * c]);
            ws_set(k->ws, channels + c, ws_get(k->ws, channels + c) + blk[2 * c + 1]);
        }
    }
    free(blk);
    free(cnt);

    for (int64_t c = 0; c < channels; c++) {
        float sum_dy = ws_get(k->ws, c);
        float sum_dyx = ws_get(k->ws, channels + c);
        float m = load(mean, view_pos(mean, (uint64_t)c));
        float s = load(invstd, view_pos(invstd, (uint64_t)c));
        float m_sum = m * sum_dy;
        float sum_dy_xmu = sum_dyx - m_sum;
        float grad_weight = sum_dy_xmu * s;
        if (k->input_g) {
            const ascend_mock_tensor *o = &k->t[T_SUMDY];
            store(o, o->offset + c * o->strides[0], sum_dy);
            o = &k->t[T_SUMDYXMU];
            store(o, o->offset + c * o->strides[0], sum_dy_xmu);
        }
        if (k->weight_g) {
            const ascend_mock_tensor *o = &k->t[T_GRADW];
            store(o, o->offset + c * o->strides[0], grad_weight);
        }
        if (k->bias_g) {
            const ascend_mock_tensor *o = &k->t[T_GRADB];
            store(o, o->offset + c * o->strides[0], sum_dy);
        }
    }
    return 0;
}

static void bn_drop(void *payload) {
    free(payload);
}

static void bn_executor_destroy(ascend_mock_executor *e) {
    free(e);
}

/* ---- phase 1 ------------------------------------------------------------------------------------------ */
static aclnnStatus p1_fail(aclnnStatus code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static aclnnStatus p1_fail(aclnnStatus code, const char *fmt, ...) {
    char detail[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    ascend_mock_set_error("%s failed. ERROR: %d (%s). AclNN_Parameter_Error(EZ1001): %s", k_phase1, code,
                          code == ACLNN_ERR_PARAM_NULLPTR ? "ACLNN_ERR_PARAM_NULLPTR" : "ACLNN_ERR_PARAM_INVALID",
                          detail);
    return code;
}

static int dtype_supported(aclDataType dt) {
    return dt == ACL_FLOAT || dt == ACL_FLOAT16 || dt == ACL_BF16;
}

static int format_private(aclFormat f) {
    switch ((int)f) {
    case ACL_FORMAT_NC1HWC0:
    case ACL_FORMAT_FRACTAL_Z:
    case ACL_FORMAT_NC1HWC0_C04:
    case ACL_FORMAT_FRACTAL_NZ:
    case ACL_FORMAT_NDC1HWC0:
    case ACL_FRACTAL_Z_3D:
    case ACL_FORMAT_FRACTAL_NZ_C0_16:
    case ACL_FORMAT_FRACTAL_NZ_C0_32:
    case ACL_FORMAT_FRACTAL_NZ_C0_2:
    case ACL_FORMAT_FRACTAL_NZ_C0_4:
    case ACL_FORMAT_FRACTAL_NZ_C0_8:
        return 1;
    default:
        return 0;
    }
}

/* Validation once every needed tensor is resolved (t[i] NULL when unused). */
static aclnnStatus p1_check(ascend_mock_tensor *const t[NT], const int on[NT]) {
    static const int inputs[] = {T_GRAD, T_INPUT, T_MEAN, T_INVSTD};
    static const int outputs[] = {T_SUMDY, T_SUMDYXMU, T_GRADW, T_GRADB};
    static const char support[] = "[DT_FLOAT, DT_FLOAT16, DT_BFLOAT16]";
    char a[256];
    for (size_t i = 0; i < 4; i++) {
        const ascend_mock_tensor *x = t[inputs[i]];
        if (!dtype_supported(x->dtype)) {
            return p1_fail(ACLNN_ERR_PARAM_INVALID, "Tensor %s not implemented for %s, should be in dtype support list %s.",
                           k_names[inputs[i]], ascend_mock_dtype_name(x->dtype), support);
        }
    }
    if (t[T_GRAD]->dtype != t[T_INPUT]->dtype) {
        return p1_fail(ACLNN_ERR_PARAM_INVALID, "Tensor gradOut dtype %s should be the same as tensor input dtype %s.",
                       ascend_mock_dtype_name(t[T_GRAD]->dtype), ascend_mock_dtype_name(t[T_INPUT]->dtype));
    }
    for (size_t i = 0; i < 4; i++) {
        const ascend_mock_tensor *x = t[outputs[i]];
        if (on[outputs[i]] && !dtype_supported(x->dtype)) {
            return p1_fail(ACLNN_ERR_PARAM_INVALID, "Tensor %s not implemented for %s, should be in dtype support list %s.",
                           k_names[outputs[i]], ascend_mock_dtype_name(x->dtype), support);
        }
    }
    if (t[T_GRAD]->format != t[T_INPUT]->format) {
        return p1_fail(ACLNN_ERR_PARAM_INVALID, "Format of gradOut %s should be the same as format of input %s.",
                       ascend_mock_format_name(t[T_GRAD]->format), ascend_mock_format_name(t[T_INPUT]->format));
    }
    for (int i = 0; i < NT; i++) {
        if (i == T_WEIGHT || !on[i]) {
            continue;
        }
        if (format_private(t[i]->format)) {
            return p1_fail(ACLNN_ERR_PARAM_INVALID,
                           "Format of %s does not support %s; it should be one of ND, NCHW, NHWC, HWCN, NDHWC, NCDHW.",
                           k_names[i], ascend_mock_format_name(t[i]->format));
        }
    }
    for (int i = T_GRAD; i <= T_INPUT; i++) {
        if (t[i]->rank < 2 || t[i]->rank > 8) {
            return p1_fail(ACLNN_ERR_PARAM_INVALID, "Dim of %s should be in [2, 8], but got %llu.", k_names[i],
                           (unsigned long long)t[i]->rank);
        }
    }
    int64_t channels = t[T_INPUT]->dims[1];
    if (channels == 0) {
        return p1_fail(ACLNN_ERR_PARAM_INVALID, "The channel size of input (input.shape[1]) should not be 0, but got shape %s.",
                       shape_text(t[T_INPUT], a, sizeof a));
    }
    for (size_t i = 0; i < 4; i++) {
        const ascend_mock_tensor *x = t[outputs[i]];
        if (on[outputs[i]] && (x->rank != 1 || x->dims[0] != channels)) {
            return p1_fail(ACLNN_ERR_PARAM_INVALID, "Expected tensor %s to have shape [%lld], but got %s.",
                           k_names[outputs[i]], (long long)channels, shape_text(x, a, sizeof a));
        }
    }
    return ACLNN_SUCCESS;
}

aclnnStatus aclnnBatchNormReduceBackwardGetWorkspaceSize(const aclTensor *gradOut, const aclTensor *input,
                                                         const aclTensor *mean, const aclTensor *invstd,
                                                         const aclTensor *weight, const bool inputG, const bool weightG,
                                                         const bool biasG, aclTensor *sumDy, aclTensor *sumDyXmu,
                                                         aclTensor *gradWeight, aclTensor *gradBias,
                                                         uint64_t *workspaceSize, aclOpExecutor **executor) {
    int st;
    if (ascend_mock_take_fault(k_phase1, &st)) {
        return st;
    }
    const aclTensor *h[NT] = {gradOut, input, mean, invstd, weight, sumDy, sumDyXmu, gradWeight, gradBias};
    /* on: checked and used; weight is used (read by the kernel's cast) when given, never checked */
    int on[NT] = {1, 1, 1, 1, weight != NULL, inputG, inputG, weightG, biasG};
    static const int null_order[] = {T_GRAD, T_INPUT, T_MEAN, T_INVSTD, T_SUMDY, T_SUMDYXMU, T_GRADW, T_GRADB};
    for (size_t i = 0; i < sizeof null_order / sizeof null_order[0]; i++) {
        int k = null_order[i];
        if (on[k] && !h[k]) {
            return p1_fail(ACLNN_ERR_PARAM_NULLPTR, "Expected a proper Tensor but got null for argument %s.",
                           k_names[k]);
        }
    }
    if (!workspaceSize) {
        return p1_fail(ACLNN_ERR_PARAM_NULLPTR, "Expected a proper pointer but got null for argument workspaceSize.");
    }
    if (!executor) {
        return p1_fail(ACLNN_ERR_PARAM_NULLPTR, "Expected a proper pointer but got null for argument executor.");
    }

    ascend_mock_lock();
    aclnnStatus r = ACLNN_SUCCESS;
    ascend_mock_tensor *t[NT] = {0};
    for (int i = 0; i < NT && !r; i++) {
        if (!on[i]) {
            continue;
        }
        int state;
        t[i] = ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_TENSOR, (uint64_t)(uintptr_t)h[i], &state);
        if (!t[i]) {
            ascend_mock_violation("%s: argument %s (%p) is %s", k_phase1, k_names[i], (const void *)h[i],
                                  ascend_mock_state_text(state));
            r = p1_fail(ACLNN_ERR_PARAM_INVALID, "Tensor %s is not a live aclTensor (%s).", k_names[i],
                        ascend_mock_state_text(state));
        }
    }
    if (!r) {
        r = p1_check(t, on);
    }
    if (!r) {
        bn_executor *e = calloc(1, sizeof *e);
        if (!e) {
            r = p1_fail(ACLNN_ERR_PARAM_INVALID, "Out of host memory.");
        } else {
            e->base.op = k_phase2;
            e->base.destroy = bn_executor_destroy;
            for (int i = 0; i < NT; i++) {
                e->tensors[i] = on[i] ? t[i]->handle : 0;
            }
            e->input_g = inputG;
            e->weight_g = weightG;
            e->bias_g = biasG;
            e->channels = t[T_INPUT]->dims[1];
            e->empty = numel(t[T_GRAD]) == 0 || numel(t[T_INPUT]) == 0 || numel(t[T_MEAN]) == 0 ||
                       numel(t[T_INVSTD]) == 0;
            e->ws_size = e->empty ? 0 : ((uint64_t)e->channels * 2 * sizeof(float) + 31) & ~(uint64_t)31;
            e->base.handle = ascend_mock_handle_new_locked(ASCEND_MOCK_KIND_EXECUTOR, e);
            *workspaceSize = e->ws_size;
            *executor = (aclOpExecutor *)(uintptr_t)e->base.handle;
        }
    }
    ascend_mock_unlock();
    return r;
}

/* ---- phase 2 ------------------------------------------------------------------------------------------ */
/* Sets the phase-2 error message (and, with `violation`, counts a violation) and returns `code`. */
static aclnnStatus p2_vreport(aclnnStatus code, int violation, const char *fmt, va_list ap) {
    char detail[768];
    vsnprintf(detail, sizeof detail, fmt, ap);
    if (violation) {
        ascend_mock_violation("%s: %s", k_phase2, detail);
    }
    ascend_mock_set_error("%s failed. ERROR: %d. %s", k_phase2, code, detail);
    return code;
}

static aclnnStatus p2_fail(aclnnStatus code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static aclnnStatus p2_fail(aclnnStatus code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    aclnnStatus r = p2_vreport(code, 0, fmt, ap);
    va_end(ap);
    return r;
}

/* As p2_fail, and counts the violation. */
static aclnnStatus p2_violation(aclnnStatus code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static aclnnStatus p2_violation(aclnnStatus code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    aclnnStatus r = p2_vreport(code, 1, fmt, ap);
    va_end(ap);
    return r;
}

/* Byte range of a tensor's view; 0 when the view is empty. */
static int view_range(const ascend_mock_tensor *t, ascend_mock_range *r) {
    if (numel(t) == 0 || !t->data) {
        return 0;
    }
    uint64_t last = (uint64_t)t->offset;
    for (uint64_t i = 0; i < t->rank; i++) {
        last += (uint64_t)(t->dims[i] - 1) * (uint64_t)t->strides[i];
    }
    r->addr = (uintptr_t)t->data + (uintptr_t)t->offset * t->elem_size;
    r->len = (last + 1 - (uint64_t)t->offset) * t->elem_size;
    r->alloc_id = t->alloc_id;
    return 1;
}

static void consume(bn_executor *e) {
    if (e && !e->base.repeatable) {
        ascend_mock_handle_remove_locked(ASCEND_MOCK_KIND_EXECUTOR, e->base.handle);
        e->base.destroy(&e->base);
    }
}

aclnnStatus aclnnBatchNormReduceBackward(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                         const aclrtStream stream) {
    int st;
    if (ascend_mock_take_fault(k_phase2, &st)) {
        /* phase 2 consumes a non-repeatable executor whether it succeeds or fails */
        ascend_mock_lock();
        consume(ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_EXECUTOR, (uint64_t)(uintptr_t)executor, NULL));
        ascend_mock_unlock();
        return st;
    }
    if (!executor) {
        return p2_fail(ACLNN_ERR_PARAM_NULLPTR, "AclNN_Parameter_Error(EZ1001): executor is null.");
    }
    ascend_mock_lock();
    aclnnStatus r = ACLNN_SUCCESS;
    int state;
    bn_executor *e = ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_EXECUTOR, (uint64_t)(uintptr_t)executor, &state);
    if (!e) {
        r = p2_violation(ACLNN_ERR_PARAM_INVALID,
                         "executor %p is %s: a non-repeatable executor is consumed by its first phase-2 call "
                         "(launched twice?)",
                         (void *)executor, ascend_mock_state_text(state));
        goto out;
    }
    if (ascend_mock_runtime_ready_locked(k_phase2) || ascend_mock_stream_check_locked(k_phase2, stream)) {
        r = p2_fail(ACLNN_ERR_RUNTIME_ERROR, "The runtime rejected the launch: %s",
                    "no device set on this thread, or an invalid stream (see the violation above).");
        goto out;
    }
    bn_task *k = calloc(1, sizeof *k);
    if (!k) {
        r = p2_fail(ACLNN_ERR_RUNTIME_ERROR, "Out of host memory.");
        goto out;
    }
    ascend_mock_range ranges[ASCEND_MOCK_MAX_RANGES];
    size_t nranges = 0;
    for (int i = 0; i < NT && !r; i++) {
        if (!e->tensors[i]) {
            continue;
        }
        ascend_mock_tensor *t = ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_TENSOR, e->tensors[i], &state);
        if (!t) {
            r = p2_violation(ACLNN_ERR_PARAM_INVALID,
                             "tensor %s (%p) was destroyed between GetWorkspaceSize and the launch; aclTensors must "
                             "outlive phase 2",
                             k_names[i], (void *)(uintptr_t)e->tensors[i]);
            break;
        }
        if (t->data && !ascend_mock_mem_live_locked(t->alloc_id)) {
            r = p2_violation(ACLNN_ERR_PARAM_INVALID, "the device memory of tensor %s (%p) was freed", k_names[i],
                             t->data);
            break;
        }
        k->t[i] = *t;
        k->used[i] = 1;
        if (view_range(t, &ranges[nranges])) {
            ranges[nranges].write = i >= T_SUMDY;
            ranges[nranges].name = k_names[i];
            ranges[nranges].view = &k->t[i]; /* the kernel touches the view's elements only */
            nranges++;
        }
    }
    if (!r && (workspace == NULL) != (workspaceSize == 0)) {
        r = p2_violation(ACLNN_ERR_PARAM_INVALID,
                         "workspace %p with workspaceSize %llu: pass NULL exactly when the size is 0", workspace,
                         (unsigned long long)workspaceSize);
    }
    if (!r && workspaceSize < e->ws_size) {
        r = p2_violation(ACLNN_ERR_PARAM_INVALID,
                         "workspaceSize %llu is smaller than the %llu bytes GetWorkspaceSize reported",
                         (unsigned long long)workspaceSize, (unsigned long long)e->ws_size);
    }
    uint64_t ws_alloc = 0;
    if (!r && workspace && !ascend_mock_mem_find_locked(workspace, workspaceSize, &ws_alloc, NULL, NULL)) {
        r = p2_violation(ACLNN_ERR_PARAM_INVALID, "workspace [%p, +%llu) is not inside one live device allocation",
                         workspace, (unsigned long long)workspaceSize);
    }
    if (r || e->empty) {
        free(k);
        goto out;
    }
    ranges[nranges].addr = (uintptr_t)workspace;
    ranges[nranges].len = e->ws_size;
    ranges[nranges].alloc_id = ws_alloc;
    ranges[nranges].write = 1;
    ranges[nranges].name = "workspace";
    ranges[nranges].view = NULL;
    nranges++;
    k->input_g = e->input_g;
    k->weight_g = e->weight_g;
    k->bias_g = e->bias_g;
    k->channels = e->channels;
    k->ws = workspace;
    ascend_mock_enqueue_locked(k_phase2, stream, ranges, nranges, bn_run, bn_drop, k);
    if (e->base.repeatable) {
        e->base.launches++;
    }
out:
    consume(e);
    ascend_mock_unlock();
    return r;
}
