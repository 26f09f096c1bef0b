/*
 * Mock CANN, libopapi.so: what every operator file in mock/ops/ builds on.
 *
 * An operator supplies only its arguments, its validation and its compute (one C file in
 * mock/ops/); the two phases are shared (opapi.c):
 *   - phase 1 (mock_op_phase1): injected fault, null checks in argument order, the out-pointers,
 *     live-handle checks, then the operator's `check` (which may set the workspace size and mark
 *     the call empty), then a fresh executor remembering the call;
 *   - phase 2 (mock_op_phase2): injected fault (consumes the executor), executor, runtime and
 *     stream checks, every tensor still alive with its memory, the workspace rule (NULL exactly
 *     when the size is 0, at least the size phase 1 reported, inside one live allocation), then a
 *     task on the stream reading and writing exactly the tensors' views (and the workspace), which
 *     runs the operator's `run` when the stream is synchronised. The executor is consumed.
 */
#ifndef ASCEND_MOCK_OPAPI_H
#define ASCEND_MOCK_OPAPI_H

#include <stdint.h>
#include <string.h>

#include "half.h"
#include "mock_internal.h"
#include "wrapper.h"

enum {
    ACL_ERROR_RT_AICORE_EXCEPTION = 507015 /* a task that failed on the device */
};

#define MOCK_OP_MAX_ARGS 11
#define MOCK_OP_MAX_SCALARS 4

/* One tensor argument of a call. */
typedef struct mock_op_arg {
    const char *name;
    const aclTensor *handle; /* as given (NULL: absent) */
    int required;            /* a NULL handle fails phase 1 with the operator's null code */
    int used;                /* resolved, checked and snapshotted (e.g. 0 for a masked-off output) */
    int write;               /* the kernel writes it (an output, or a tensor updated in place) */
} mock_op_arg;

/* A call: its arguments and scalars as phase 1 saw them; in a task, `t` holds snapshots of the
 * used tensors (with their device memory) and `ws` the workspace. */
typedef struct mock_op_call {
    int nargs;
    mock_op_arg args[MOCK_OP_MAX_ARGS];
    ascend_mock_tensor t[MOCK_OP_MAX_ARGS];
    double scalars[MOCK_OP_MAX_SCALARS]; /* eps, momentum, ... as the operator numbers them */
    int flags[MOCK_OP_MAX_SCALARS];      /* masks, ... */
    uint64_t ws_size;                    /* set by `check` (default 0) */
    int empty;                           /* set by `check`: phase 2 queues nothing */
    uint8_t *ws;                         /* in a task: the workspace (NULL when ws_size is 0) */
} mock_op_call;

typedef struct mock_op {
    const char *phase1; /* e.g. "aclnnBatchNormStatsGetWorkspaceSize" */
    const char *phase2; /* e.g. "aclnnBatchNormStats" */
    int null_code;      /* the status of a required NULL tensor (161001; Elemt uses 161002) */
    /* Validation, with every used argument resolved (call->t[i] filled for used args). Returns 0
     * or mock_op_fail(...). May set call->ws_size and call->empty. Runs with the lock held. */
    aclnnStatus (*check)(const struct mock_op *op, mock_op_call *call);
    /* The compute, in a task (lock held), over call->t and call->ws. Returns 0, or a status after
     * counting a violation. */
    int (*run)(const struct mock_op *op, mock_op_call *call);
} mock_op;

/* Phase 1 of `op` for `call` (arguments filled in by the operator). */
aclnnStatus mock_op_phase1(const mock_op *op, const mock_op_call *call, uint64_t *workspaceSize,
                           aclOpExecutor **executor);
/* Phase 2 of `op`. */
aclnnStatus mock_op_phase2(const mock_op *op, void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                           aclrtStream stream);

/* An operator file's `k_op` (phase 1 is `name`GetWorkspaceSize, a NULL required tensor fails it
 * with `null_code`) and its phase-2 entry point `name`, which is mock_op_phase2 of it; the file
 * writes phase 1 itself (only it knows its arguments), calling mock_op_phase1(&k_op, ...). */
#define MOCK_OP_DEFINE(name, null_code_, check_, run_)                                                              \
    static const mock_op k_op = {                                                                                   \
        .phase1 = #name "GetWorkspaceSize",                                                                         \
        .phase2 = #name,                                                                                            \
        .null_code = (null_code_),                                                                                  \
        .check = (check_),                                                                                          \
        .run = (run_),                                                                                              \
    };                                                                                                              \
    aclnnStatus name(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, const aclrtStream stream) {  \
        return mock_op_phase2(&k_op, workspace, workspaceSize, executor, stream);                                   \
    }

/* A phase-1 failure: sets aclGetRecentErrMsg as ops-nn words it and returns `code`. */
aclnnStatus mock_op_fail(const mock_op *op, aclnnStatus code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- helpers for checks and kernels ---- */
/* A check's view of its call: t[i] the resolved tensor i (filled only when used), on[i] whether
 * argument i is used, for i < call->nargs. */
void mock_call_tensors(const mock_op_call *call, const ascend_mock_tensor **t, int *on);
int mock_dtype_float(aclDataType dt);         /* F32, F16 or BF16 */
/* ops-nn's dtype check of every used tensor argument but `skip` (-1: none): F32, F16 or BF16, in
 * argument order. Returns 0 or mock_op_fail(...). */
aclnnStatus mock_check_float_args(const mock_op *op, const mock_op_call *call, int skip);
/* The same check of argument `i` alone (when ops-nn checks the arguments in another order). */
aclnnStatus mock_check_float_arg(const mock_op *op, const mock_op_call *call, int i);
/* Atlas A2/A3's format rule for an activation `t` (argument `name`) of the BatchNorm operators:
 * not NHWC or NDHWC (aclnnBatchNorm.md:228, aclnnBatchNormBackward.md:274), not a private format. */
aclnnStatus mock_check_format_a2(const mock_op *op, const ascend_mock_tensor *t, const char *name);
/* In a kernel: element c of the per-channel argument i, or `dflt` when it is absent (CANN's fills). */
float mock_channel_or(const mock_op_call *call, int i, int64_t c, float dflt);
/* ops-nn's shared shape rules, each returning 0 or mock_op_fail(...) with ops-nn's words:
 * argument `i` has rank 2 to 8; argument `i`'s dim 1 (its channels, stored in *channels) is not 0;
 * each used argument of `which` (n of them) is [channels]. */
aclnnStatus mock_check_rank_2_to_8(const mock_op *op, const mock_op_call *call, int i);
aclnnStatus mock_check_channels(const mock_op *op, const mock_op_call *call, int i, int64_t *channels);
aclnnStatus mock_check_per_channel(const mock_op *op, const mock_op_call *call, const int *which, size_t n,
                                   int64_t channels);
/* The number of elements of the array `a`. */
#define MOCK_LEN(a) (sizeof(a) / sizeof((a)[0]))
/* In a check: returns the status of `step` (a call returning aclnnStatus) unless it is 0. */
#define MOCK_TRY(step)                                                                                              \
    do {                                                                                                            \
        aclnnStatus mock_try_st_ = (step);                                                                          \
        if (mock_try_st_) {                                                                                         \
            return mock_try_st_;                                                                                    \
        }                                                                                                           \
    } while (0)
int mock_format_private(aclFormat f);         /* NC1HWC0, FRACTAL_Z, ... */
uint64_t mock_numel(const ascend_mock_tensor *t);
/* Storage position of the linear-th element of the view (row-major order). */
int64_t mock_view_pos(const ascend_mock_tensor *t, uint64_t linear);
/* Storage position of element c of a 1-D view (a per-channel vector). */
static inline int64_t mock_channel_pos(const ascend_mock_tensor *t, int64_t c) {
    return t->offset + c * t->strides[0];
}

/* A walk over the elements of up to MOCK_WALK_MAX views of one shape, in row-major order (the
 * last dimension fastest), the order every mock kernel reads and accumulates in:
 *     const ascend_mock_tensor *views[] = {x, y};
 *     mock_walk w;
 *     for (mock_walk_init(&w, views, 2); w.left; mock_walk_step(&w)) {
 *         ... w.idx[1] is the channel, w.pos[0] the element's position in x's storage ...
 *     }
 * The shape is the first view's; the others must have it. */
#define MOCK_WALK_MAX 4
typedef struct mock_walk {
    int n;
    uint64_t left;                   /* elements not yet visited, the current one included */
    const ascend_mock_tensor *views[MOCK_WALK_MAX];
    int64_t idx[ASCEND_MOCK_MAX_RANK]; /* the current element's multi-index */
    int64_t pos[MOCK_WALK_MAX];        /* its storage position in each view */
} mock_walk;
void mock_walk_init(mock_walk *w, const ascend_mock_tensor *const *views, int n);
void mock_walk_step(mock_walk *w);

/* f32 element i of an operator's workspace. */
static inline float mock_ws_get(const uint8_t *ws, int64_t i) {
    float f;
    memcpy(&f, ws + (uint64_t)i * sizeof f, sizeof f);
    return f;
}

static inline void mock_ws_set(uint8_t *ws, int64_t i, float f) {
    memcpy(ws + (uint64_t)i * sizeof f, &f, sizeof f);
}

/* Element `pos` of the storage, converted to f32 (F32/F16/BF16; I32 converted exactly as far as
 * f32 goes). */
float mock_load(const ascend_mock_tensor *t, int64_t pos);
/* Stores `v` at storage position `pos`, rounding to nearest even for F16/BF16. */
void mock_store(const ascend_mock_tensor *t, int64_t pos, float v);
const char *mock_shape_text(const ascend_mock_tensor *t, char *buf, size_t cap);
/* sqrt in f32, correctly rounded (the mock links nothing but libc). */
float mock_sqrt_f32(float x);

#endif /* ASCEND_MOCK_OPAPI_H */
