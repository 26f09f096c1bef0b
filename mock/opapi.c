/*
 * Mock CANN, libopapi.so: the two phases every operator shares (see opapi.h), and the element
 * helpers the operators' checks and kernels use. The operators are the files in mock/ops/.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opapi.h"
#include "ascend_mock.h"

/* ---- element access -------------------------------------------------------------------------------- */
float mock_load(const ascend_mock_tensor *t, int64_t pos) {
    const uint8_t *p = (const uint8_t *)t->data + (uint64_t)pos * t->elem_size;
    uint16_t h;
    float f;
    switch ((int)t->dtype) {
    case ACL_FLOAT:
        memcpy(&f, p, sizeof f);
        return f;
    case ACL_FLOAT16:
        memcpy(&h, p, sizeof h);
        return mock_f16_to_f32(h);
    case ACL_BF16:
        memcpy(&h, p, sizeof h);
        return mock_bf16_to_f32(h);
    case ACL_INT32: {
        int32_t i;
        memcpy(&i, p, sizeof i);
        return (float)i;
    }
    default:
        return 0.0f;
    }
}

void mock_store(const ascend_mock_tensor *t, int64_t pos, float v) {
    uint8_t *p = (uint8_t *)t->data + (uint64_t)pos * t->elem_size;
    uint16_t h;
    switch ((int)t->dtype) {
    case ACL_FLOAT:
        memcpy(p, &v, sizeof v);
        break;
    case ACL_FLOAT16:
        h = mock_f32_to_f16(v);
        memcpy(p, &h, sizeof h);
        break;
    case ACL_BF16:
        h = mock_f32_to_bf16(v);
        memcpy(p, &h, sizeof h);
        break;
    case ACL_INT32: {
        int32_t i = (int32_t)v;
        memcpy(p, &i, sizeof i);
        break;
    }
    default:
        break;
    }
}

uint64_t mock_numel(const ascend_mock_tensor *t) {
    uint64_t n = 1;
    for (uint64_t i = 0; i < t->rank; i++) {
        n *= (uint64_t)t->dims[i];
    }
    return n;
}

/* Storage position of the linear-th element of the view (row-major order). */
int64_t mock_view_pos(const ascend_mock_tensor *t, uint64_t linear) {
    int64_t pos = t->offset;
    for (uint64_t k = t->rank; k-- > 0;) {
        uint64_t d = (uint64_t)t->dims[k];
        pos += (int64_t)(linear % d) * t->strides[k];
        linear /= d;
    }
    return pos;
}

void mock_walk_init(mock_walk *w, const ascend_mock_tensor *const *views, int n) {
    memset(w, 0, sizeof *w);
    w->n = n;
    w->left = mock_numel(views[0]);
    for (int i = 0; i < n; i++) {
        w->views[i] = views[i];
        w->pos[i] = views[i]->offset;
    }
}

void mock_walk_step(mock_walk *w) {
    const ascend_mock_tensor *t = w->views[0];
    w->left--;
    for (uint64_t d = t->rank; d-- > 0;) {
        w->idx[d]++;
        for (int i = 0; i < w->n; i++) {
            w->pos[i] += w->views[i]->strides[d];
        }
        if (w->idx[d] < t->dims[d]) {
            break;
        }
        for (int i = 0; i < w->n; i++) {
            w->pos[i] -= w->views[i]->strides[d] * w->views[i]->dims[d];
        }
        w->idx[d] = 0;
    }
}

const char *mock_shape_text(const ascend_mock_tensor *t, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (uint64_t i = 0; i < t->rank && n < cap; i++) {
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)t->dims[i]);
    }
    if (n < cap) {
        snprintf(buf + n, cap - n, "]");
    }
    return buf;
}

/* ---- arithmetic ---------------------------------------------------------------------------------------- */
/* sqrt in f32, correctly rounded, without libm (the mock links nothing but libc): Newton in
 * double, then the f32 neighbour whose rounding interval holds x (exact tests: the squares of
 * f32 midpoints are exact in double). */
float mock_sqrt_f32(float x) {
    if (!(x > 0.0f) || x > 3.4028235e38f) {
        return x == 0.0f || x > 3.4028235e38f ? x : (x - x) / (x - x); /* 0, inf, or NaN */
    }
    double d = x, g;
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    bits = (bits >> 1) + (UINT64_C(1023) << 51);
    memcpy(&g, &bits, sizeof g);
    for (int i = 0; i < 6; i++) {
        g = 0.5 * (g + d / g);
    }
    float r = (float)g;
    uint32_t rb;
    memcpy(&rb, &r, sizeof rb);
    float up, down;
    uint32_t ub = rb + 1, db = rb - 1;
    memcpy(&up, &ub, sizeof up);
    memcpy(&down, &db, sizeof down);
    double mid_up = ((double)r + (double)up) / 2, mid_down = ((double)r + (double)down) / 2;
    if (d >= mid_up * mid_up) {
        return up;
    }
    if (d < mid_down * mid_down) {
        return down;
    }
    return r;
}

/* ---- checks ---------------------------------------------------------------------------------------- */
void mock_call_tensors(const mock_op_call *call, const ascend_mock_tensor **t, int *on) {
    for (int i = 0; i < call->nargs; i++) {
        t[i] = &call->t[i];
        on[i] = call->args[i].used;
    }
}

int mock_dtype_float(aclDataType dt) {
    return dt == ACL_FLOAT || dt == ACL_FLOAT16 || dt == ACL_BF16;
}

aclnnStatus mock_check_float_arg(const mock_op *op, const mock_op_call *call, int i) {
    if (call->args[i].used && !mock_dtype_float(call->t[i].dtype)) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                            "Tensor %s not implemented for %s, should be in dtype support list %s.",
                            call->args[i].name, ascend_mock_dtype_name(call->t[i].dtype),
                            "[DT_FLOAT, DT_FLOAT16, DT_BFLOAT16]");
    }
    return ACLNN_SUCCESS;
}

aclnnStatus mock_check_float_args(const mock_op *op, const mock_op_call *call, int skip) {
    for (int i = 0; i < call->nargs; i++) {
        if (i != skip) {
            MOCK_TRY(mock_check_float_arg(op, call, i));
        }
    }
    return ACLNN_SUCCESS;
}

aclnnStatus mock_check_format_a2(const mock_op *op, const ascend_mock_tensor *t, const char *name) {
    if (t->format == ACL_FORMAT_NHWC || t->format == ACL_FORMAT_NDHWC) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                            "Format of %s is %s; Atlas A2/A3 support NC, NCL, NCHW, NCDHW and ND, not NHWC or NDHWC.",
                            name, ascend_mock_format_name(t->format));
    }
    if (mock_format_private(t->format)) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Format only support NC, NCL, NCHW, NCDHW.");
    }
    return ACLNN_SUCCESS;
}

float mock_channel_or(const mock_op_call *call, int i, int64_t c, float dflt) {
    return call->args[i].used ? mock_load(&call->t[i], mock_channel_pos(&call->t[i], c)) : dflt;
}

aclnnStatus mock_check_rank_2_to_8(const mock_op *op, const mock_op_call *call, int i) {
    const ascend_mock_tensor *t = &call->t[i];
    if (t->rank < 2 || t->rank > 8) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Dim of %s should be in [2, 8], but got %llu.",
                            call->args[i].name, (unsigned long long)t->rank);
    }
    return ACLNN_SUCCESS;
}

aclnnStatus mock_check_channels(const mock_op *op, const mock_op_call *call, int i, int64_t *channels) {
    const ascend_mock_tensor *t = &call->t[i];
    char a[256];
    *channels = t->dims[1];
    if (*channels == 0) {
        const char *name = call->args[i].name;
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID,
                            "The channel size of %s (%s.shape[1]) should not be 0, but got shape %s.", name, name,
                            mock_shape_text(t, a, sizeof a));
    }
    return ACLNN_SUCCESS;
}

aclnnStatus mock_check_per_channel(const mock_op *op, const mock_op_call *call, const int *which, size_t n,
                                   int64_t channels) {
    char a[256];
    for (size_t k = 0; k < n; k++) {
        const ascend_mock_tensor *v = &call->t[which[k]];
        if (call->args[which[k]].used && (v->rank != 1 || v->dims[0] != channels)) {
            return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Expected tensor %s to have shape [%lld], but got %s.",
                                call->args[which[k]].name, (long long)channels, mock_shape_text(v, a, sizeof a));
        }
    }
    return ACLNN_SUCCESS;
}

int mock_format_private(aclFormat f) {
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

aclnnStatus mock_op_fail(const mock_op *op, aclnnStatus code, const char *fmt, ...) {
    char detail[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    ascend_mock_set_error("%s failed. ERROR: %d (%s). AclNN_Parameter_Error(EZ1001): %s", op->phase1, code,
                          code == ACLNN_ERR_PARAM_NULLPTR ? "ACLNN_ERR_PARAM_NULLPTR" : "ACLNN_ERR_PARAM_INVALID",
                          detail);
    return code;
}

/* ---- executors and tasks ------------------------------------------------------------------------------ */
typedef struct op_executor {
    ascend_mock_executor base; /* first: the toolkit's executor head */
    const mock_op *op;
    mock_op_call call;
    /* A repeatable executor: the stream of its launches queued and not yet run or skipped
     * (base.inflight of them; a repeatable executor must not be launched on two streams at once). */
    aclrtStream stream;
} op_executor;

typedef struct op_task {
    const mock_op *op;
    mock_op_call call;
    uint64_t executor; /* the repeatable executor's handle (0: not repeatable) */
} op_task;

static op_executor *op_executor_get(const mock_op *op, aclOpExecutor *executor, int *state);

static void op_executor_destroy(ascend_mock_executor *e) {
    free(e);
}

/* ascend_mock_executor.arg_at: inputs are the used arguments the kernel only reads, outputs the
 * used ones it writes, each in the operator's argument order (as the Rust bindings number them
 * for aclSetInputTensorAddr / aclSetOutputTensorAddr). An unused argument (an absent optional
 * one, or an output the operator's mask turns off) is not part of the executor and not counted. */
static const char *op_executor_arg_at(ascend_mock_executor *base, int output, size_t index, uint64_t *handle) {
    const mock_op_call *c = &((op_executor *)base)->call;
    for (int i = 0; i < c->nargs; i++) {
        const mock_op_arg *a = &c->args[i];
        if (!a->used || !a->write != !output) {
            continue;
        }
        if (index-- == 0) {
            *handle = (uint64_t)(uintptr_t)a->handle;
            return a->name;
        }
    }
    return NULL;
}

static int op_task_run(void *payload) {
    op_task *k = payload;
    return k->op->run(k->op, &k->call);
}

static void op_task_drop(void *payload) {
    op_task *k = payload;
    if (k->executor) {
        int state;
        op_executor *e = op_executor_get(k->op, (aclOpExecutor *)(uintptr_t)k->executor, &state);
        if (e && e->base.inflight) {
            e->base.inflight--;
        }
    }
    free(payload);
}

/* A replay of a captured launch: the same kernel, arguments and executor (held in flight by the
 * replay as by the launch). */
static void *op_task_clone(void *payload) {
    op_task *k = malloc(sizeof *k);
    if (!k) {
        fprintf(stderr, "ascend mock CANN: out of host memory\n");
        abort();
    }
    *k = *(op_task *)payload;
    if (k->executor) {
        int state;
        op_executor *e = op_executor_get(k->op, (aclOpExecutor *)(uintptr_t)k->executor, &state);
        if (e) {
            e->base.inflight++;
        } else {
            k->executor = 0;
        }
    }
    return k;
}

/* ---- phase 1 ------------------------------------------------------------------------------------------- */
/* Phase-1 calls of every operator, successful or not (ascend_mock_phase1_calls); phase-2 calls that
 * queued a kernel, of which those whose executor phase 1 made under ACL_OPT_DETERMINISTIC != 0,
 * and those whose executor phase 1 made under another ACL_OPT_DETERMINISTIC than the device has at
 * the launch (ascend_mock_launches). */
static uint64_t g_phase1_calls;
static uint64_t g_launches, g_deterministic_launches, g_stale_deterministic_launches;

__attribute__((visibility("default"))) uint64_t ascend_mock_phase1_calls(void) {
    return __atomic_load_n(&g_phase1_calls, __ATOMIC_RELAXED);
}

__attribute__((visibility("default"))) void ascend_mock_launches(uint64_t *launches, uint64_t *deterministic,
                                                                 uint64_t *stale_deterministic) {
    ascend_mock_lock();
    *launches = g_launches;
    *deterministic = g_deterministic_launches;
    *stale_deterministic = g_stale_deterministic_launches;
    ascend_mock_unlock();
}

aclnnStatus mock_op_phase1(const mock_op *op, const mock_op_call *in, uint64_t *workspaceSize,
                           aclOpExecutor **executor) {
    __atomic_fetch_add(&g_phase1_calls, 1, __ATOMIC_RELAXED);
    int st;
    if (ascend_mock_take_fault(op->phase1, &st)) {
        return st;
    }
    for (int i = 0; i < in->nargs; i++) {
        if (in->args[i].required && !in->args[i].handle) {
            return mock_op_fail(op, op->null_code, "Expected a proper Tensor but got null for argument %s.",
                                in->args[i].name);
        }
    }
    if (!workspaceSize) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_NULLPTR,
                            "Expected a proper pointer but got null for argument workspaceSize.");
    }
    if (!executor) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_NULLPTR, "Expected a proper pointer but got null for argument executor.");
    }
    op_executor *e = calloc(1, sizeof *e);
    if (!e) {
        return mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Out of host memory.");
    }
    e->op = op;
    e->call = *in;
    mock_op_call *c = &e->call;
    ascend_mock_lock();
    aclnnStatus r = ACLNN_SUCCESS;
    for (int i = 0; i < c->nargs && !r; i++) {
        mock_op_arg *a = &c->args[i];
        if (!a->handle) {
            a->used = 0; /* an optional argument left out */
        }
        if (!a->used) {
            continue;
        }
        int state;
        ascend_mock_tensor *t =
            ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_TENSOR, (uint64_t)(uintptr_t)a->handle, &state);
        if (!t) {
            ascend_mock_violation("%s: argument %s (%p) is %s", op->phase1, a->name, (const void *)a->handle,
                                  ascend_mock_state_text(state));
            r = mock_op_fail(op, ACLNN_ERR_PARAM_INVALID, "Tensor %s is not a live aclTensor (%s).", a->name,
                             ascend_mock_state_text(state));
            break;
        }
        c->t[i] = *t;
    }
    if (!r) {
        c->ws_size = 0;
        c->empty = 0;
        r = op->check(op, c);
    }
    if (!r) {
        e->base.op = op->phase2;
        e->base.destroy = op_executor_destroy;
        e->base.arg_at = op_executor_arg_at;
        /* nnopbase's InitL2Phase1Context reads the option here; the executor keeps it */
        e->base.deterministic = ascend_mock_deterministic_locked();
        e->base.handle = ascend_mock_handle_new_locked(ASCEND_MOCK_KIND_EXECUTOR, e);
        *workspaceSize = c->ws_size;
        *executor = (aclOpExecutor *)(uintptr_t)e->base.handle;
    } else {
        free(e);
    }
    ascend_mock_unlock();
    return r;
}

/* ---- phase 2 ------------------------------------------------------------------------------------------- */
/* Sets the phase-2 error message (and, with `violation`, counts a violation) and returns `code`.
 * Called as p2_fail() and p2_violation(). */
static aclnnStatus p2_report(const mock_op *op, aclnnStatus code, int violation, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static aclnnStatus p2_report(const mock_op *op, aclnnStatus code, int violation, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ascend_mock_report_v(violation, op->phase2, code, NULL, 768, fmt, ap);
    va_end(ap);
    return code;
}
#define p2_fail(op, code, ...) p2_report((op), (code), 0, __VA_ARGS__)
/* As p2_fail, and counts the violation. */
#define p2_violation(op, code, ...) p2_report((op), (code), 1, __VA_ARGS__)

/* Byte range of a tensor's view; 0 when the view is empty. */
static int view_range(const ascend_mock_tensor *t, ascend_mock_range *r) {
    if (mock_numel(t) == 0 || !t->data) {
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

static void consume(op_executor *e) {
    if (e && !e->base.repeatable) {
        ascend_mock_handle_remove_locked(ASCEND_MOCK_KIND_EXECUTOR, e->base.handle);
        e->base.destroy(&e->base);
    }
}

/* The executor behind a handle when it belongs to `op` (NULL otherwise, with `state` set). */
static op_executor *op_executor_get(const mock_op *op, aclOpExecutor *executor, int *state) {
    op_executor *e = ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_EXECUTOR, (uint64_t)(uintptr_t)executor, state);
    if (e && e->op != op) {
        *state = ASCEND_MOCK_WRONG_KIND;
        return NULL;
    }
    return e;
}

aclnnStatus mock_op_phase2(const mock_op *op, void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                           aclrtStream stream) {
    int st;
    if (ascend_mock_take_fault(op->phase2, &st)) {
        /* phase 2 consumes a non-repeatable executor whether it succeeds or fails */
        ascend_mock_lock();
        int state;
        consume(op_executor_get(op, executor, &state));
        ascend_mock_unlock();
        return st;
    }
    if (!executor) {
        return p2_fail(op, ACLNN_ERR_PARAM_NULLPTR, "AclNN_Parameter_Error(EZ1001): executor is null.");
    }
    ascend_mock_lock();
    aclnnStatus r = ACLNN_SUCCESS;
    int state;
    op_executor *e = op_executor_get(op, executor, &state);
    if (!e) {
        r = p2_violation(op, ACLNN_ERR_PARAM_INVALID,
                         "executor %p is %s: a non-repeatable executor is consumed by its first phase-2 call "
                         "(launched twice?)",
                         (void *)executor, ascend_mock_state_text(state));
        goto out;
    }
    if (ascend_mock_runtime_ready_locked(op->phase2) || ascend_mock_stream_check_locked(op->phase2, stream)) {
        r = p2_fail(op, ACLNN_ERR_RUNTIME_ERROR, "The runtime rejected the launch: %s",
                    "no device set on this thread, or an invalid stream (see the violation above).");
        goto out;
    }
    op_task *k = calloc(1, sizeof *k);
    if (!k) {
        r = p2_fail(op, ACLNN_ERR_RUNTIME_ERROR, "Out of host memory.");
        goto out;
    }
    k->op = op;
    k->call = e->call;
    ascend_mock_range ranges[ASCEND_MOCK_MAX_RANGES];
    size_t nranges = 0;
    for (int i = 0; i < e->call.nargs && !r; i++) {
        const mock_op_arg *a = &e->call.args[i];
        if (!a->used) {
            continue;
        }
        uint64_t handle = e->call.t[i].handle;
        ascend_mock_tensor *t = ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_TENSOR, handle, &state);
        if (!t) {
            r = p2_violation(op, ACLNN_ERR_PARAM_INVALID,
                             "tensor %s (%p) was destroyed between GetWorkspaceSize and the launch; aclTensors must "
                             "outlive phase 2",
                             a->name, (void *)(uintptr_t)handle);
            break;
        }
        if (t->data && !ascend_mock_mem_live_locked(t->alloc_id)) {
            r = p2_violation(op, ACLNN_ERR_PARAM_INVALID, "the device memory of tensor %s (%p) was freed", a->name,
                             t->data);
            break;
        }
        k->call.t[i] = *t;
        if (view_range(t, &ranges[nranges])) {
            ranges[nranges].write = a->write;
            ranges[nranges].name = a->name;
            ranges[nranges].view = &k->call.t[i]; /* the kernel touches the view's elements only */
            nranges++;
        }
    }
    if (!r && (workspace == NULL) != (workspaceSize == 0)) {
        r = p2_violation(op, ACLNN_ERR_PARAM_INVALID,
                         "workspace %p with workspaceSize %llu: pass NULL exactly when the size is 0", workspace,
                         (unsigned long long)workspaceSize);
    }
    if (!r && workspaceSize < e->call.ws_size) {
        r = p2_violation(op, ACLNN_ERR_PARAM_INVALID,
                         "workspaceSize %llu is smaller than the %llu bytes GetWorkspaceSize reported",
                         (unsigned long long)workspaceSize, (unsigned long long)e->call.ws_size);
    }
    uint64_t ws_alloc = 0;
    if (!r && workspace && !ascend_mock_mem_find_locked(workspace, workspaceSize, &ws_alloc, NULL, NULL)) {
        r = p2_violation(op, ACLNN_ERR_PARAM_INVALID, "workspace [%p, +%llu) is not inside one live device allocation",
                         workspace, (unsigned long long)workspaceSize);
    }
    if (r || e->call.empty) {
        free(k);
        goto out;
    }
    if (e->call.ws_size) {
        ranges[nranges].addr = (uintptr_t)workspace;
        ranges[nranges].len = e->call.ws_size;
        ranges[nranges].alloc_id = ws_alloc;
        ranges[nranges].write = 1;
        ranges[nranges].name = "workspace";
        ranges[nranges].view = NULL;
        nranges++;
    }
    k->call.ws = e->call.ws_size ? workspace : NULL;
    if (e->base.repeatable) {
        if (e->base.inflight && e->stream != stream) {
            free(k);
            r = p2_violation(op, ACLNN_ERR_PARAM_INVALID,
                             "repeatable executor %p is launched on stream %p while its launch on stream %p has not "
                             "run yet: a repeatable executor must not be launched on two streams at once",
                             (void *)executor, (void *)stream, (void *)e->stream);
            goto out;
        }
        e->base.inflight++;
        e->stream = stream;
        k->executor = e->base.handle;
    }
    ascend_mock_enqueue_locked(op->phase2, stream, ranges, nranges, op_task_run, op_task_drop, op_task_clone, k);
    g_launches++;
    g_deterministic_launches += e->base.deterministic != 0;
    g_stale_deterministic_launches += e->base.deterministic != ascend_mock_deterministic_locked();
    if (e->base.repeatable) {
        e->base.launches++;
    }
out:
    consume(e);
    ascend_mock_unlock();
    return r;
}
