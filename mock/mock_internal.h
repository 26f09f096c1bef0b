/*
 * What the mock's libascendcl.so exports for libnnopbase.so and libopapi.so.
 *
 * libascendcl.so owns all the state of the toolkit (one instance per process; the other two
 * libraries link to it): the global lock, the handle table of streams, events, tensors and
 * executors, the device-memory table, the stream queues, statistics, faults and diagnostics.
 *
 * Locking: one global mutex. Functions named *_locked must be called with it held (and never
 * call a locking entry point); ascend_mock_violation, ascend_mock_set_error and
 * ascend_mock_take_fault may be called with or without it (they use a leaf lock of their own).
 */
#ifndef ASCEND_MOCK_INTERNAL_H
#define ASCEND_MOCK_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "wrapper.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ASCEND_MOCK_MAX_RANK 32
#define ASCEND_MOCK_MAX_RANGES 12

/* Handle kinds. Handles are unique, never reused tokens (not addresses), so a stale handle is
 * always told apart from a live one. */
enum {
    ASCEND_MOCK_KIND_STREAM = 1,
    ASCEND_MOCK_KIND_EVENT = 2,
    ASCEND_MOCK_KIND_TENSOR = 3,
    ASCEND_MOCK_KIND_EXECUTOR = 4,
    ASCEND_MOCK_KIND_BOOL_ARRAY = 5,
    ASCEND_MOCK_KIND_COUNT = 6
};

/* An aclBoolArray (aclCreateBoolArray): a copy of the values it was given. */
typedef struct ascend_mock_bool_array {
    uint64_t handle;
    uint64_t size;
    unsigned char values[];
} ascend_mock_bool_array;

/* The aclnn status codes of nnopbase and the operator library (docs/cann/API.md). */
enum {
    ACLNN_SUCCESS = 0,
    ACLNN_ERR_PARAM_NULLPTR = 161001,
    ACLNN_ERR_PARAM_INVALID = 161002,
    ACLNN_ERR_RUNTIME_ERROR = 361001,
    ACLNN_ERR_INNER = 561000,
    ACLNN_ERR_INNER_NULLPTR = 561103
};

/* Result of a handle lookup. */
enum {
    ASCEND_MOCK_LIVE = 0,
    ASCEND_MOCK_NULL = 1,       /* the handle is NULL */
    ASCEND_MOCK_DESTROYED = 2,  /* issued by the mock, no longer alive */
    ASCEND_MOCK_UNKNOWN = 3,    /* never issued by the mock */
    ASCEND_MOCK_WRONG_KIND = 4  /* a live or dead handle of another kind */
};

/* An aclTensor: copies of everything aclCreateTensor was given. */
typedef struct ascend_mock_tensor {
    uint64_t handle;
    uint64_t rank;
    int64_t dims[ASCEND_MOCK_MAX_RANK];
    int64_t strides[ASCEND_MOCK_MAX_RANK];
    int64_t offset;
    aclDataType dtype;
    aclFormat format;
    uint64_t storage_rank;
    int64_t storage_dims[ASCEND_MOCK_MAX_RANK];
    uint64_t storage_numel;
    uint64_t elem_size;
    void *data;
    uint64_t alloc_id; /* the device allocation holding data; 0 when data is NULL */
} ascend_mock_tensor;

/* Common head of every executor (an op's executor struct starts with this). */
typedef struct ascend_mock_executor ascend_mock_executor;
struct ascend_mock_executor {
    uint64_t handle;
    const char *op;
    int repeatable;
    /* aclSetAclOpExecutorRepeatable was called on it and failed (refused, or an injected fault):
     * nnopbase's RepeatMode::Unrepeatable. Phase 2 consumes it; aclDestroyAclOpExecutor frees an
     * unlaunched one (nnopbase deletes any executor it is given). */
    int repeat_refused;
    /* ACL_OPT_DETERMINISTIC of the device when phase 1 made it (nnopbase reads the option in
     * phase 1 and hands it to the tiling; the executor keeps that choice). */
    int64_t deterministic;
    uint64_t launches;
    /* A repeatable executor's launches queued and not yet run or skipped (their tasks look the
     * executor up by handle when they are dropped, and decrement this). */
    uint64_t inflight;
    void (*destroy)(ascend_mock_executor *self); /* frees the struct; called with the lock held */
    /* The index-th present input (output == 0: an argument the kernel only reads) or output
     * (output == 1: one it writes, in-place tensors included) of the executor's phase-1 call,
     * counted in the operator's argument order, absent optional arguments skipped: returns its
     * name and stores its tensor handle in *handle, or returns NULL when index is out of range.
     * Called with the lock held. */
    const char *(*arg_at)(ascend_mock_executor *self, int output, size_t index, uint64_t *handle);
};

/* A device byte range a queued task reads or writes: [addr, addr+len) inside allocation alloc_id.
 * With `view` NULL the task touches every byte of it; else only the bytes of the elements of that
 * tensor view (a snapshot that lives as long as the task's payload), and [addr, addr+len) is the
 * view's span (used for ordering checks). Poison (see acl/memory.c) is tracked on exactly those bytes. */
typedef struct ascend_mock_range {
    uintptr_t addr;
    uint64_t len;
    uint64_t alloc_id;
    int write;
    const char *name;
    const struct ascend_mock_tensor *view;
} ascend_mock_range;

/* A queued task's body: runs with the lock held, after every range was found still alive and no
 * read range holds poisoned bytes. Returns 0 (its write ranges now hold what it wrote), or the
 * status the synchronizing call reports (after counting a violation; its write ranges become
 * poisoned, as for a skipped task). */
typedef int (*ascend_mock_run_fn)(void *payload);
typedef void (*ascend_mock_drop_fn)(void *payload);
/* The body of a waiting task (a collective): called with the lock held when the task reaches the
 * head of its stream, even when the queue skips it (skip_status != 0, with its reason: a range
 * was freed or a read range is poisoned; the body must not touch device memory then, only tell
 * whoever waits for it, and its return value is ignored). It may release the lock
 * (ascend_mock_unlock) while it waits for other threads or processes, and must take it back
 * before returning; while the lock is released it must not touch device memory, and after taking
 * it back it must check that its ranges are still alive (ascend_mock_mem_live_locked). The queue
 * keeps the task at the head of its stream meanwhile (see "waiting tasks" in acl/queue.c). Returns 0,
 * or the status the synchronizing call reports, with the reason in why (its write ranges then
 * become poisoned). Every wait must be bounded. */
/* The payload of a replay of a captured task (a copy of `payload` the replay's drop releases),
 * called with the lock held when aclmdlRIExecuteAsync queues the replay. */
typedef void *(*ascend_mock_clone_fn)(void *payload);
typedef int (*ascend_mock_wait_fn)(void *payload, int skip_status, const char *skip_reason, char *why, size_t cap);

void ascend_mock_lock(void);
void ascend_mock_unlock(void);

/* Counts a violation and prints "ascend mock CANN violation: <message>" on stderr. */
void ascend_mock_violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Sets the calling thread's aclGetRecentErrMsg text. */
void ascend_mock_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A failed call of `api`, as every library words it: formats the detail (at most detail_max - 1
 * characters), counts a violation "<api>: <detail>" when `violation`, and sets the error text
 * "<api> failed. ERROR: <code>. <detail>" ("ERROR: <code> (<code_name>)" when code_name is given). */
void ascend_mock_report_v(int violation, const char *api, int code, const char *code_name, size_t detail_max,
                          const char *fmt, va_list ap) __attribute__((format(printf, 6, 0)));
/* If a fault is armed for `api` (for this thread or globally), disarms it, sets the error text,
 * stores its status and returns 1; else returns 0. */
int ascend_mock_take_fault(const char *api, int *status);

/* Handles. */
uint64_t ascend_mock_handle_new_locked(int kind, void *obj);
void *ascend_mock_handle_get_locked(int kind, uint64_t handle, int *state);
void *ascend_mock_handle_remove_locked(int kind, uint64_t handle);
const char *ascend_mock_state_text(int state);

/* Device memory: whether [p, p+len) lies inside one live allocation (len 0: p inside or at its
 * end). Returns 1 and fills the allocation's id (and base/size when not NULL), else 0. */
int ascend_mock_mem_find_locked(const void *p, uint64_t len, uint64_t *alloc_id, uintptr_t *base, uint64_t *size);
/* Whether the allocation with this id is still alive. */
int ascend_mock_mem_live_locked(uint64_t alloc_id);
/* The device the allocation with this id was made on (the current device of the aclrtMalloc
 * call), or -1 when it is not alive. */
int ascend_mock_mem_device_locked(uint64_t alloc_id);

/* ACL_OPT_DETERMINISTIC of the calling thread's current device (0 without one, as nnopbase reads
 * a failed query): what phase 1 hands to an executor. */
int64_t ascend_mock_deterministic_locked(void);

/* Runtime preconditions of a call that uses the device: aclInit done and a device set on the
 * calling thread. Returns 0, or the ACL error (after counting a violation and setting the
 * error text). */
int ascend_mock_runtime_ready_locked(const char *api);
/* Whether aclInit was called (and aclFinalize not since). */
int ascend_mock_initialized_locked(void);
/* The calling thread's current device, or -1 (no aclInit, or no device set on this thread). */
int ascend_mock_current_device_locked(void);
/* Checks a stream handle (NULL = the default stream of the thread's device) for `api`.
 * Returns 0, or the ACL error (after counting a violation and setting the error text). */
int ascend_mock_stream_check_locked(const char *api, aclrtStream stream);
/* Enqueues a task on a stream already accepted by ascend_mock_stream_check_locked. Ranges that
 * overlap work queued on another stream (one of them writing) count a violation. The queue
 * owns payload from here on: drop(payload) is called after the task ran or was skipped. */
/* Whether `stream` is being captured (its tasks are recorded into a model, not queued). */
int ascend_mock_stream_capturing_locked(aclrtStream stream);

void ascend_mock_enqueue_locked(const char *what, aclrtStream stream, const ascend_mock_range *ranges, size_t nranges,
                                ascend_mock_run_fn run, ascend_mock_drop_fn drop, ascend_mock_clone_fn clone,
                                void *payload);

/* As ascend_mock_enqueue_locked, for a task whose body may release the lock (see
 * ascend_mock_wait_fn). */
void ascend_mock_enqueue_waiting_locked(const char *what, aclrtStream stream, const ascend_mock_range *ranges,
                                        size_t nranges, ascend_mock_wait_fn wait, ascend_mock_drop_fn drop,
                                        ascend_mock_clone_fn clone, void *payload);

/* Live HCCL communicators (kept by libhccl.so, reported in ascend_mock_stats.live_comms). */
void ascend_mock_count_comms_locked(int delta);
/* Counts one collective queued by libhccl.so: kind 1 all-reduce, 2 all-gather, 3 broadcast
 * (ascend_mock_stats). */
void ascend_mock_count_collective_locked(int kind);

/* Stores NULL in *out unless out is NULL (the out handle of a call that failed). */
static inline void ascend_mock_null_out(void **out) {
    if (out) {
        *out = NULL;
    }
}

/* The first statement of an entry point (after the line naming it): when a fault is armed for
 * `api` (ascend_mock_take_fault), stores NULL in *null_out (pass NULL when the call has no out
 * handle) and returns the injected status, before any other check. */
#define MOCK_ENTER(api, null_out)                                                                                   \
    do {                                                                                                            \
        int fault_status_;                                                                                          \
        if (ascend_mock_take_fault((api), &fault_status_)) {                                                        \
            ascend_mock_null_out(null_out);                                                                         \
            return fault_status_;                                                                                   \
        }                                                                                                           \
    } while (0)

/* Element size of a dtype in bytes, or 0 for an unknown or sub-byte dtype. */
uint64_t ascend_mock_dtype_size(aclDataType dtype);
/* CANN's name of a dtype / format (e.g. "DT_FLOAT", "NC1HWC0"). */
const char *ascend_mock_dtype_name(aclDataType dtype);
const char *ascend_mock_format_name(aclFormat format);

#ifdef __cplusplus
}
#endif

#endif /* ASCEND_MOCK_INTERNAL_H */
