/*
 * Mock CANN: libnnopbase.so, aclnn tensors and executors.
 *
 * An aclTensor is host metadata: a handle onto a copy of what aclCreateTensor was given. Its data
 * must be 32-byte aligned and lie inside a live device allocation that holds the whole storage,
 * and the view must lie inside the storage. All state lives in libascendcl.so (mock_internal.h).
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
#include "ascend_mock.h"

static int g_aclnn_initialized;
/* Successful aclCreateTensor calls (ascend_mock_tensors_created). */
static uint64_t g_tensors_created;

__attribute__((visibility("default"))) uint64_t ascend_mock_tensors_created(void) {
    return __atomic_load_n(&g_tensors_created, __ATOMIC_RELAXED);
}

/* Counts a violation, sets the error text and returns NULL (aclCreateTensor's failure). */
static aclTensor *reject(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static aclTensor *reject(const char *fmt, ...) {
    char detail[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    ascend_mock_violation("aclCreateTensor: %s", detail);
    ascend_mock_set_error("aclCreateTensor failed. ERROR: %d. AclNN_Parameter_Error(EZ1001): %s",
                          ACLNN_ERR_PARAM_INVALID, detail);
    return NULL;
}

static int mul_overflows(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}

aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType, const int64_t *stride,
                           int64_t offset, aclFormat format, const int64_t *storageDims, uint64_t storageDimsNum,
                           void *tensorData) {
    int st;
    if (ascend_mock_take_fault("aclCreateTensor", &st)) {
        return NULL;
    }
    if (viewDimsNum > ASCEND_MOCK_MAX_RANK || storageDimsNum > ASCEND_MOCK_MAX_RANK) {
        return reject("rank %llu (view) / %llu (storage) exceeds the mock's limit of %d",
                      (unsigned long long)viewDimsNum, (unsigned long long)storageDimsNum, ASCEND_MOCK_MAX_RANK);
    }
    if (viewDimsNum && (!viewDims || !stride)) {
        return reject("viewDims or stride is null while viewDimsNum is %llu", (unsigned long long)viewDimsNum);
    }
    if (storageDimsNum && !storageDims) {
        return reject("storageDims is null while storageDimsNum is %llu", (unsigned long long)storageDimsNum);
    }
    uint64_t es = ascend_mock_dtype_size(dataType);
    if (!es) {
        return reject("data type %d (%s) is not supported by the mock", (int)dataType,
                      ascend_mock_dtype_name(dataType));
    }
    if (offset < 0) {
        return reject("offset %lld is negative", (long long)offset);
    }
    uint64_t view_numel = 1;
    for (uint64_t i = 0; i < viewDimsNum; i++) {
        if (viewDims[i] < 0) {
            return reject("view dim %llu is negative (%lld)", (unsigned long long)i, (long long)viewDims[i]);
        }
        if (stride[i] < 0) {
            return reject("stride %llu is negative (%lld)", (unsigned long long)i, (long long)stride[i]);
        }
        if (mul_overflows(view_numel, (uint64_t)viewDims[i], &view_numel)) {
            return reject("the view's element count overflows");
        }
    }
    uint64_t storage_numel = 1;
    for (uint64_t i = 0; i < storageDimsNum; i++) {
        if (storageDims[i] < 0) {
            return reject("storage dim %llu is negative (%lld)", (unsigned long long)i, (long long)storageDims[i]);
        }
        if (mul_overflows(storage_numel, (uint64_t)storageDims[i], &storage_numel)) {
            return reject("the storage's element count overflows");
        }
    }
    if (view_numel > 0) {
        /* last element of the view: offset + sum (dim - 1) * stride */
        uint64_t last = (uint64_t)offset;
        for (uint64_t i = 0; i < viewDimsNum; i++) {
            uint64_t step;
            if (mul_overflows((uint64_t)(viewDims[i] - 1), (uint64_t)stride[i], &step) ||
                __builtin_add_overflow(last, step, &last)) {
                return reject("the view's extent overflows");
            }
        }
        if (last >= storage_numel) {
            return reject("the view (offset %lld, last element at %llu) exceeds the storage of %llu elements",
                          (long long)offset, (unsigned long long)last, (unsigned long long)storage_numel);
        }
    }
    uint64_t storage_bytes;
    if (mul_overflows(storage_numel, es, &storage_bytes)) {
        return reject("the storage's byte size overflows");
    }
    if (!tensorData && storage_numel > 0) {
        return reject("tensorData is null but the storage has %llu elements", (unsigned long long)storage_numel);
    }
    if (((uintptr_t)tensorData & 31) != 0) {
        return reject("tensorData %p is not 32-byte aligned", tensorData);
    }

    ascend_mock_lock();
    uint64_t alloc_id = 0;
    if (tensorData) {
        uintptr_t base;
        uint64_t size;
        if (!ascend_mock_mem_find_locked(tensorData, storage_bytes, &alloc_id, &base, &size)) {
            int inside = ascend_mock_mem_find_locked(tensorData, 0, NULL, &base, &size);
            ascend_mock_unlock();
            if (inside) {
                return reject("the storage [%p, +%llu bytes) runs past the end of its device allocation [%p, +%llu)",
                              tensorData, (unsigned long long)storage_bytes, (void *)base, (unsigned long long)size);
            }
            return reject("tensorData %p is not inside a live device allocation (freed, or host memory)", tensorData);
        }
    }
    ascend_mock_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        ascend_mock_unlock();
        return reject("out of host memory");
    }
    t->rank = viewDimsNum;
    for (uint64_t i = 0; i < viewDimsNum; i++) {
        t->dims[i] = viewDims[i];
        t->strides[i] = stride[i];
    }
    t->offset = offset;
    t->dtype = dataType;
    t->format = format;
    t->storage_rank = storageDimsNum;
    for (uint64_t i = 0; i < storageDimsNum; i++) {
        t->storage_dims[i] = storageDims[i];
    }
    t->storage_numel = storage_numel;
    t->elem_size = es;
    t->data = tensorData;
    t->alloc_id = alloc_id;
    t->handle = ascend_mock_handle_new_locked(ASCEND_MOCK_KIND_TENSOR, t);
    __atomic_fetch_add(&g_tensors_created, 1, __ATOMIC_RELAXED);
    aclTensor *h = (aclTensor *)(uintptr_t)t->handle;
    ascend_mock_unlock();
    return h;
}

aclnnStatus aclDestroyTensor(const aclTensor *tensor) {
    static const char api[] = "aclDestroyTensor";
    MOCK_ENTER(api, NULL);
    if (!tensor) {
        ascend_mock_set_error("%s failed. ERROR: %d. AclNN_Parameter_Error(EZ1001): tensor is null.", api,
                              ACLNN_ERR_PARAM_NULLPTR);
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    ascend_mock_lock();
    int state;
    uint64_t h = (uint64_t)(uintptr_t)tensor;
    ascend_mock_tensor *t = ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_TENSOR, h, &state);
    int r = ACLNN_SUCCESS;
    if (!t) {
        ascend_mock_violation("%s: tensor %p is %s (double destroy?)", api, (const void *)tensor,
                              ascend_mock_state_text(state));
        ascend_mock_set_error("%s failed. ERROR: %d. tensor %p is %s.", api, ACLNN_ERR_PARAM_INVALID,
                              (const void *)tensor, ascend_mock_state_text(state));
        r = ACLNN_ERR_PARAM_INVALID;
    } else {
        ascend_mock_handle_remove_locked(ASCEND_MOCK_KIND_TENSOR, h);
        free(t);
    }
    ascend_mock_unlock();
    return r;
}

/* Looks up an executor for api; counts a violation for a dead or foreign handle. */
static ascend_mock_executor *executor_get(const char *api, aclOpExecutor *executor, int *status) {
    int state;
    ascend_mock_executor *e =
        ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_EXECUTOR, (uint64_t)(uintptr_t)executor, &state);
    if (!e) {
        ascend_mock_violation("%s: executor %p is %s (a non-repeatable executor is consumed by its phase-2 call)",
                              api, (void *)executor, ascend_mock_state_text(state));
        ascend_mock_set_error("%s failed. ERROR: %d. executor %p is %s.", api, ACLNN_ERR_PARAM_INVALID,
                              (void *)executor, ascend_mock_state_text(state));
        *status = ACLNN_ERR_PARAM_INVALID;
    }
    return e;
}

/* The first lines of an entry point on an executor: returns an injected fault, fails with
 * `null_code` when `null_what` names a NULL argument ("<api> failed. ERROR: <code>. <what> is
 * null."), then takes the lock and declares `r` (ACLNN_SUCCESS) and `e`, the executor (NULL, with
 * r set and a violation counted, for a dead one). The entry ends with ascend_mock_unlock(). */
#define EXECUTOR_ENTER(api, executor, null_code, null_what)                                                            \
    MOCK_ENTER(api, NULL);                                                                                          \
    if (null_what) {                                                                                                \
        ascend_mock_set_error("%s failed. ERROR: %d. %s is null.", (api), (null_code), (null_what));               \
        return (null_code);                                                                                         \
    }                                                                                                               \
    ascend_mock_lock();                                                                                             \
    int r = ACLNN_SUCCESS;                                                                                          \
    ascend_mock_executor *e = executor_get((api), (executor), &r)

/* ---- executors CANN will not repeat ------------------------------------------------------------------- */
/* nnopbase's SetRepeatable returns ACLNN_ERR_INNER (561000) for an executor whose phase 1 used an
 * AI CPU kernel, a DSA task, a synchronous copy to the device or output-shape arguments, or a
 * huge-page pool (hicann/opbase op_executor.cpp SetRepeatable and its AbandonCache(true) calls). The
 * mock refuses persistently for the operators named here (phase-2 names, e.g.
 * "aclnnBatchNormStats", or "*" for every operator): set with ascend_mock_refuse_repeatable, or at
 * the first aclSetAclOpExecutorRepeatable of the process from ASCEND_MOCK_REFUSE_REPEATABLE (a
 * comma-separated list of such names). Guarded by the mock's global lock. */
#define REFUSE_MAX 32
#define REFUSE_NAME_MAX 64
static char g_refused[REFUSE_MAX][REFUSE_NAME_MAX];
static int g_refused_env_read;
/* Failed aclSetAclOpExecutorRepeatable calls: refusals and injected faults
 * (ascend_mock_repeatable_refusals). */
static uint64_t g_refusals;

__attribute__((visibility("default"))) uint64_t ascend_mock_repeatable_refusals(void) {
    return __atomic_load_n(&g_refusals, __ATOMIC_RELAXED);
}

/* Adds (on) or removes (!on) `name` (len bytes) from the refused list; -1 when it does not fit. */
static int refuse_locked(const char *name, size_t len, int on) {
    int free_slot = -1;
    for (int i = 0; i < REFUSE_MAX; i++) {
        if (!g_refused[i][0]) {
            free_slot = free_slot < 0 ? i : free_slot;
        } else if (strlen(g_refused[i]) == len && memcmp(g_refused[i], name, len) == 0) {
            if (!on) {
                g_refused[i][0] = '\0';
            }
            return 0;
        }
    }
    if (!on) {
        return 0;
    }
    if (len == 0 || len >= REFUSE_NAME_MAX || free_slot < 0) {
        return -1;
    }
    memcpy(g_refused[free_slot], name, len);
    g_refused[free_slot][len] = '\0';
    return 0;
}

static void refuse_read_env_locked(void) {
    if (g_refused_env_read) {
        return;
    }
    g_refused_env_read = 1;
    const char *env = getenv("ASCEND_MOCK_REFUSE_REPEATABLE");
    while (env && *env) {
        size_t len = strcspn(env, ",");
        size_t start = 0;
        while (start < len && env[start] == ' ') {
            start++;
        }
        size_t end = len;
        while (end > start && env[end - 1] == ' ') {
            end--;
        }
        if (end > start && refuse_locked(env + start, end - start, 1) != 0) {
            fprintf(stderr, "ascend mock CANN: ASCEND_MOCK_REFUSE_REPEATABLE: cannot hold the name %.*s (at most %d "
                            "names of fewer than %d bytes)\n",
                    (int)(end - start), env + start, REFUSE_MAX, REFUSE_NAME_MAX);
        }
        env += len + (env[len] == ',');
    }
}

__attribute__((visibility("default"))) int ascend_mock_refuse_repeatable(const char *op, int on) {
    if (!op) {
        return -1;
    }
    ascend_mock_lock();
    refuse_read_env_locked(); /* the variable first, so that a later call overrides it */
    int r = refuse_locked(op, strlen(op), on);
    ascend_mock_unlock();
    return r;
}

static int refused_locked(const char *op) {
    refuse_read_env_locked();
    for (int i = 0; i < REFUSE_MAX; i++) {
        if (g_refused[i][0] && (strcmp(g_refused[i], "*") == 0 || strcmp(g_refused[i], op) == 0)) {
            return 1;
        }
    }
    return 0;
}

/* aclSetAclOpExecutorRepeatable. Refused with ACLNN_ERR_INNER (no violation: CANN does this for
 * executors it cannot repeat) for an operator on the refused list, and for an executor refused
 * before (nnopbase's Unrepeatable mode is final). A refused executor (an injected fault counts as
 * a refusal) stays what phase 1 made: phase 2 consumes it, or aclDestroyAclOpExecutor frees it. */
aclnnStatus aclSetAclOpExecutorRepeatable(aclOpExecutor *executor) {
    static const char api[] = "aclSetAclOpExecutorRepeatable";
    int fault;
    if (ascend_mock_take_fault(api, &fault)) {
        ascend_mock_lock();
        int state;
        ascend_mock_executor *e =
            ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_EXECUTOR, (uint64_t)(uintptr_t)executor, &state);
        if (e && !e->repeatable) {
            e->repeat_refused = 1;
        }
        g_refusals++;
        ascend_mock_unlock();
        return fault;
    }
    EXECUTOR_ENTER(api, executor, ACLNN_ERR_INNER_NULLPTR, executor ? NULL : "executor");
    if (e && !e->repeatable && (e->repeat_refused || refused_locked(e->op))) {
        e->repeat_refused = 1;
        g_refusals++;
        ascend_mock_set_error("%s failed. ERROR: %d. unrepeatable executor %p of %s (an AI CPU kernel, a DSA task "
                              "or a synchronous copy in its phase 1), find keyword MarkOpCacheInvalid in log.",
                              api, ACLNN_ERR_INNER, (void *)executor, e->op);
        r = ACLNN_ERR_INNER;
    } else if (e) {
        e->repeatable = 1;
    }
    ascend_mock_unlock();
    return r;
}

/* Counts a rebind violation of `api`, sets its error text and returns 161002. */
static aclnnStatus rebind_reject(const char *api, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static aclnnStatus rebind_reject(const char *api, const char *fmt, ...) {
    char detail[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    ascend_mock_violation("%s: %s", api, detail);
    ascend_mock_set_error("%s failed. ERROR: %d. AclNN_Parameter_Error(EZ1001): %s", api, ACLNN_ERR_PARAM_INVALID,
                          detail);
    return ACLNN_ERR_PARAM_INVALID;
}

/* What `h` is to executor e, for a rebind error: "which is input mean (index 1)", "which is output
 * meanAll (index 0)" or "which is not a present argument of this executor". */
static const char *arg_text(ascend_mock_executor *e, uint64_t h, char *buf, size_t cap) {
    for (int output = 0; output < 2; output++) {
        uint64_t at;
        const char *name;
        for (size_t i = 0; (name = e->arg_at(e, output, i, &at)) != NULL; i++) {
            if (at == h) {
                snprintf(buf, cap, "which is %s %s (index %zu)", output ? "output" : "input", name, i);
                return buf;
            }
        }
    }
    return "which is not a present argument of this executor";
}

/* The present inputs (or outputs) of e, for a rebind error: "3 present inputs: input, mean, invstd". */
static const char *args_text(ascend_mock_executor *e, int output, char *buf, size_t cap) {
    char names[256] = "";
    size_t n = 0, len = 0;
    uint64_t at;
    const char *name;
    for (; (name = e->arg_at(e, output, n, &at)) != NULL; n++) {
        if (len < sizeof names) {
            len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", n ? ", " : "", name);
        }
    }
    snprintf(buf, cap, "%zu present %s%s%s", n, output ? "outputs" : "inputs", n ? ": " : "", names);
    return buf;
}

/* aclSetInputTensorAddr / aclSetOutputTensorAddr: rebinds the device address of a tensor of a
 * repeatable executor. As the opapi (aclnn operator) path of nnopbase does, the address is set on the
 * aclTensor itself, so the executor's next phase-2 call uses it.
 * `index` is checked, which real CANN's opapi path does not do (it ignores the index; only the
 * nnopbase custom-op path uses it, see docs/cann/API.md 2.4): the mock is stricter on purpose, so
 * that a caller (the Rust launch cache) is proven to pass the right index for the right tensor, as
 * an executor of the other path needs. The tensor must be the index-th *present* input (an argument
 * the kernel only reads), resp. output (one it writes, in-place tensors included), of the
 * executor's phase-1 call, counted in the operator's argument order; absent optional arguments are
 * not counted (ascend_mock_executor.arg_at).
 * Rejected (violation): a dead or non-repeatable executor, a dead tensor, an index out of range or
 * whose argument is another tensor, an address that is not 32-byte aligned or whose storage does not
 * lie inside one live device allocation. */
static aclnnStatus set_tensor_addr(const char *api, int output, aclOpExecutor *executor, size_t index,
                                   aclTensor *tensor, void *addr) {
    EXECUTOR_ENTER(api, executor, ACLNN_ERR_INNER_NULLPTR, !executor ? "executor" : !tensor ? "tensor" : NULL);
    if (!e) {
        ascend_mock_unlock();
        return r;
    }
    if (!e->repeatable) {
        ascend_mock_violation("%s: executor %p of %s is not repeatable (call aclSetAclOpExecutorRepeatable first)",
                              api, (void *)executor, e->op);
        ascend_mock_set_error("%s failed. ERROR: %d. executor %p is not repeatable.", api, ACLNN_ERR_PARAM_INVALID,
                              (void *)executor);
        ascend_mock_unlock();
        return ACLNN_ERR_PARAM_INVALID;
    }
    int state;
    uint64_t h = (uint64_t)(uintptr_t)tensor;
    ascend_mock_tensor *t = ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_TENSOR, h, &state);
    if (!t) {
        ascend_mock_violation("%s: tensor %p is %s", api, (void *)tensor, ascend_mock_state_text(state));
        ascend_mock_set_error("%s failed. ERROR: %d. tensor %p is %s.", api, ACLNN_ERR_PARAM_INVALID, (void *)tensor,
                              ascend_mock_state_text(state));
        ascend_mock_unlock();
        return ACLNN_ERR_PARAM_INVALID;
    }
    const char *kind = output ? "output" : "input";
    uint64_t expected = 0;
    const char *name = e->arg_at(e, output, index, &expected);
    char given[128], list[320];
    if (!name) {
        r = rebind_reject(api,
                          "index %zu is out of range: executor %p of %s has %s (absent optional arguments are not "
                          "counted); given tensor %p, %s",
                          index, (void *)executor, e->op, args_text(e, output, list, sizeof list), (void *)tensor,
                          arg_text(e, h, given, sizeof given));
        ascend_mock_unlock();
        return r;
    }
    if (expected != h) {
        r = rebind_reject(api, "%s index %zu of executor %p of %s is %s (tensor %p), but tensor %p was given, %s",
                          kind, index, (void *)executor, e->op, name, (void *)(uintptr_t)expected, (void *)tensor,
                          arg_text(e, h, given, sizeof given));
        ascend_mock_unlock();
        return r;
    }
    uint64_t bytes = t->storage_numel * t->elem_size;
    uint64_t alloc_id = 0;
    const char *why = NULL;
    if (((uintptr_t)addr & 31) != 0) {
        why = "is not 32-byte aligned";
    } else if (!addr && bytes > 0) {
        why = "is null but the storage is not empty";
    } else if (addr && !ascend_mock_mem_find_locked(addr, bytes, &alloc_id, NULL, NULL)) {
        why = "does not hold the tensor's storage inside one live device allocation";
    }
    if (why) {
        ascend_mock_violation("%s: address %p for tensor %p %s", api, addr, (void *)tensor, why);
        ascend_mock_set_error("%s failed. ERROR: %d. address %p %s.", api, ACLNN_ERR_PARAM_INVALID, addr, why);
        ascend_mock_unlock();
        return ACLNN_ERR_PARAM_INVALID;
    }
    t->data = addr;
    t->alloc_id = alloc_id;
    ascend_mock_unlock();
    return ACLNN_SUCCESS;
}

aclnnStatus aclSetInputTensorAddr(aclOpExecutor *executor, const size_t index, aclTensor *tensor, void *addr) {
    return set_tensor_addr("aclSetInputTensorAddr", 0, executor, index, tensor, addr);
}

aclnnStatus aclSetOutputTensorAddr(aclOpExecutor *executor, const size_t index, aclTensor *tensor, void *addr) {
    return set_tensor_addr("aclSetOutputTensorAddr", 1, executor, index, tensor, addr);
}

/* aclDestroyAclOpExecutor. A repeatable executor with launches queued that have not run yet is not
 * freed (a violation, 161002): the caller must synchronise the stream first. (The queued tasks hold
 * copies of the call and look the executor up by handle only when they are dropped, so they would
 * survive a destroyed one; refusing keeps the mistake visible and the caller's handle valid for
 * the destroy it must retry.) An unlaunched executor that aclSetAclOpExecutorRepeatable refused is
 * freed without complaint: nnopbase's aclDestroyAclOpExecutor deletes any executor it is given
 * (hicann/opbase src/nnopbase/common/api/acl_op_api.cpp), and the documented pairing was tried.
 * One on which aclSetAclOpExecutorRepeatable was never called is freed too, but counts a
 * violation: the documentation pairs the destroy with that call. */
aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor) {
    static const char api[] = "aclDestroyAclOpExecutor";
    EXECUTOR_ENTER(api, executor, ACLNN_ERR_INNER_NULLPTR, executor ? NULL : "executor");
    if (e && e->inflight) {
        ascend_mock_violation("%s: executor %p of %s is destroyed while %llu launches of it are queued and have not "
                              "run (synchronise the stream first; not freed)",
                              api, (void *)executor, e->op, (unsigned long long)e->inflight);
        ascend_mock_set_error("%s failed. ERROR: %d. executor %p has %llu launches queued that have not run.", api,
                              ACLNN_ERR_PARAM_INVALID, (void *)executor, (unsigned long long)e->inflight);
        r = ACLNN_ERR_PARAM_INVALID;
    } else if (e) {
        if (!e->repeatable && !e->repeat_refused) {
            ascend_mock_violation("%s: executor %p of %s is not repeatable: CANN frees it in the phase-2 call, and "
                                  "destroying it without calling aclSetAclOpExecutorRepeatable first is undocumented "
                                  "(freed anyway)",
                                  api, (void *)executor, e->op);
        }
        ascend_mock_handle_remove_locked(ASCEND_MOCK_KIND_EXECUTOR, e->handle);
        e->destroy(e);
    }
    ascend_mock_unlock();
    return r;
}

aclnnStatus aclnnInit(const char *configPath) {
    (void)configPath;
    MOCK_ENTER("aclnnInit", NULL);
    ascend_mock_lock();
    if (g_aclnn_initialized) {
        ascend_mock_violation("aclnnInit: called more than once in this process (allowed only once)");
    }
    g_aclnn_initialized = 1;
    ascend_mock_unlock();
    return ACLNN_SUCCESS;
}

/* aclCreateBoolArray: a handle onto a copy of `size` values (NULL values with size 0 is an empty
 * array); NULL for NULL values with a non-zero size. */
aclBoolArray *aclCreateBoolArray(const bool *value, uint64_t size) {
    int st;
    if (ascend_mock_take_fault("aclCreateBoolArray", &st)) {
        return NULL; /* a constructor's failure is a NULL handle */
    }
    if ((!value && size) || size > (1u << 20)) {
        ascend_mock_set_error("aclCreateBoolArray failed. ERROR: %d. value is null or size %llu is too large.",
                              ACLNN_ERR_PARAM_NULLPTR, (unsigned long long)size);
        return NULL;
    }
    ascend_mock_bool_array *a = malloc(sizeof *a + size);
    if (!a) {
        return NULL;
    }
    a->size = size;
    for (uint64_t i = 0; i < size; i++) {
        a->values[i] = value[i] ? 1 : 0;
    }
    ascend_mock_lock();
    a->handle = ascend_mock_handle_new_locked(ASCEND_MOCK_KIND_BOOL_ARRAY, a);
    ascend_mock_unlock();
    return (aclBoolArray *)(uintptr_t)a->handle;
}

aclnnStatus aclDestroyBoolArray(const aclBoolArray *array) {
    static const char api[] = "aclDestroyBoolArray";
    MOCK_ENTER(api, NULL);
    if (!array) {
        ascend_mock_set_error("%s failed. ERROR: %d. array is null.", api, ACLNN_ERR_PARAM_NULLPTR);
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    ascend_mock_lock();
    int state;
    uint64_t h = (uint64_t)(uintptr_t)array;
    ascend_mock_bool_array *a = ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_BOOL_ARRAY, h, &state);
    int r = ACLNN_SUCCESS;
    if (!a) {
        ascend_mock_violation("%s: array %p is %s (double destroy?)", api, (const void *)array,
                              ascend_mock_state_text(state));
        ascend_mock_set_error("%s failed. ERROR: %d. array %p is %s.", api, ACLNN_ERR_PARAM_INVALID,
                              (const void *)array, ascend_mock_state_text(state));
        r = ACLNN_ERR_PARAM_INVALID;
    } else {
        ascend_mock_handle_remove_locked(ASCEND_MOCK_KIND_BOOL_ARRAY, h);
        free(a);
    }
    ascend_mock_unlock();
    return r;
}
