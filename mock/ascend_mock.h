/*
 * Introspection and fault injection of the mock CANN toolkit.
 *
 * Exported by the mock's libascendcl.so next to the CANN symbols of wrapper.h. Tests (and the
 * Rust module `ascend::mock`) load them with dlsym from the same libascendcl.so the CANN bindings
 * were loaded from, so they see the one state of the whole toolkit.
 *
 * Every function here is thread-safe and may be called at any time, before aclInit too.
 */
#ifndef ASCEND_MOCK_H
#define ASCEND_MOCK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The byte every fresh aclrtMalloc block is filled with (never zeros). */
#define ASCEND_MOCK_GARBAGE_BYTE 0xA5

/* Process-wide counters. The live_* fields count objects alive now; device_mallocs and violations
 * are totals since the library was loaded. The layout is fixed (twenty-two uint64_t; fields are
 * only ever appended). */
typedef struct ascend_mock_stats {
    uint64_t live_allocations; /* aclrtMalloc blocks not yet freed */
    uint64_t live_tensors;     /* aclCreateTensor handles not yet destroyed */
    uint64_t live_executors;   /* executors from phase 1 neither consumed by phase 2 nor destroyed */
    uint64_t live_streams;     /* aclrtCreateStream streams not yet destroyed (default streams excluded) */
    uint64_t live_events;      /* events (of every kind) not yet destroyed */
    uint64_t device_mallocs;   /* total successful aclrtMalloc calls */
    uint64_t violations;       /* total violations (each also printed on stderr) */
    uint64_t queued_tasks;     /* tasks enqueued on streams and not yet run */
    uint64_t poisoned_bytes;   /* device bytes of live allocations that a skipped task should have
                                  written and nothing wrote since: reading them is an error */
    uint64_t live_comms;       /* HCCL communicators (libhccl.so) made and not yet destroyed */
    uint64_t stream_synchronizes; /* total aclrtSynchronizeStream calls that passed their checks */
    uint64_t event_synchronizes;  /* total aclrtSynchronizeEvent calls that passed their checks */
    uint64_t device_synchronizes; /* total aclrtSynchronizeDevice calls that passed their checks */
    uint64_t device_frees;        /* total successful aclrtFree calls */
    uint64_t blocking_copies;     /* total aclrtMemcpy (host-blocking) calls that passed their checks */
    uint64_t host_mallocs;        /* total successful aclrtMallocHost calls */
    uint64_t live_host_allocations; /* aclrtMallocHost blocks not yet freed */
    uint64_t all_reduces;           /* total HcclAllReduce calls that queued a collective */
    uint64_t all_gathers;           /* total HcclAllGather calls that queued a collective */
    uint64_t broadcasts;            /* total HcclBroadcast calls that queued a collective */
    uint64_t events_created;        /* total events made (aclrtCreateEvent, ...WithFlag, ...ExWithFlag) */
    uint64_t events_destroyed;      /* total aclrtDestroyEvent calls that destroyed an event */
} ascend_mock_stats;

/* Whether aclrtQueryEventStatus lets the device progress (runs the recorded stream's tasks up to the
 * queried record, so the event completes while later work of its stream stays queued): on by default.
 * Off, a query runs nothing and an event completes only when something drains its stream (a
 * synchronize, a wait for it). Returns the previous setting. */
int ascend_mock_set_query_progress(int on);

/* Live events of device `device` (0 for a device out of range); at most 65536, as on Atlas A2/A3. */
uint64_t ascend_mock_device_live_events(int device);

/* Graph capture (mock/acl/capture.c): captures begun, replays queued (aclmdlRIExecuteAsync),
 * model run instances alive, and streams pulled into a capture by an event wait (side streams). */
void ascend_mock_capture_stats(uint64_t *captures, uint64_t *replays, uint64_t *live_models, uint64_t *joins);

/* Fills *out with the current counters. */
void ascend_mock_get_stats(ascend_mock_stats *out);

/* Per-thread totals: violations detected by calls made on the calling thread (including tasks a
 * synchronize call on this thread ran), and successful aclrtMalloc calls made on it. */
uint64_t ascend_mock_thread_violations(void);
uint64_t ascend_mock_thread_device_mallocs(void);
/* Entry points of the toolkit's libraries (acl*, aclnn*, Hccl*) called on the calling thread. */
uint64_t ascend_mock_thread_api_calls(void);

/* The next call of `api` (a function name of wrapper.h, e.g. "aclrtMalloc") on any thread returns
 * `status` without doing anything else (functions returning a pointer return NULL and ignore
 * `status`; aclrtMalloc/aclrtCreateStream/aclrtCreateEvent also store NULL in their out pointer),
 * and sets the thread's aclGetRecentErrMsg text. Arming the same API again replaces the status.
 * Returns 0, or -1 when `api` is not a function of the mock. */
int ascend_mock_fail_next(const char *api, int status);

/* As ascend_mock_fail_next, but only a call made on the calling thread consumes it (tests that
 * run in parallel threads use this one). A thread-local fault is consumed before a global one. */
int ascend_mock_fail_next_thread(const char *api, int status);

/* Disarms every global fault and the calling thread's faults. */
void ascend_mock_clear_faults(void);

/* Total number of violations so far (the same as stats.violations). */
uint64_t ascend_mock_violation_count(void);

/* Copies the message of violation number `index` (0-based, in the order detected) into buf
 * (NUL-terminated, truncated to cap). Only the last 1024 messages are kept. Returns the message's
 * length plus one, or 0 when that message is not (or no longer) kept. */
size_t ascend_mock_violation_message(uint64_t index, char *buf, size_t cap);

/* Sets how many devices the mock has (0..64) from now on, instead of ASCEND_MOCK_DEVICE_COUNT
 * (which aclInit reads when this was never called; default 1). It takes effect at once
 * (aclrtGetDeviceCount, aclrtSetDevice, aclrtResetDevice) and outlives aclFinalize; before aclInit
 * it is remembered for it. Shrinking is refused while a device that would go away is in use: it
 * holds live device memory, a stream made by aclrtCreateStream, or work queued on its default
 * stream. A device that goes away while merely set on some thread keeps its state, hidden: on
 * that thread the runtime calls fail as with no device set, until the count covers it again.
 * Returns 0; -1 (count out of range) or -2 (a device at or above count is in use, stored in
 * *busy_device when not NULL), changing nothing. */
int ascend_mock_set_device_count(int count, int *busy_device);

/* Launch-path counters, for measuring what a steady loop costs on the host. Exported by the
 * library that owns each (not by libascendcl.so): libnnopbase.so counts aclTensor descriptors
 * created (successful aclCreateTensor calls), libopapi.so counts phase-1 calls
 * (aclnn*GetWorkspaceSize, successful or not). Process-wide totals since load. */
uint64_t ascend_mock_tensors_created(void);
uint64_t ascend_mock_phase1_calls(void);

/* libopapi.so: phase-2 calls that queued a kernel (*launches); of them, those whose executor phase
 * 1 made with ACL_OPT_DETERMINISTIC != 0 on its device (*deterministic), and those whose executor
 * phase 1 made under another ACL_OPT_DETERMINISTIC value than the device has at the launch
 * (*stale_deterministic: on CANN such a launch runs the kernel and tiling chosen under the old
 * setting). Process-wide totals since load. */
void ascend_mock_launches(uint64_t *launches, uint64_t *deterministic, uint64_t *stale_deterministic);

/* libnnopbase.so: executors CANN will not repeat. From now on aclSetAclOpExecutorRepeatable
 * refuses (on != 0) or accepts again (on == 0) the executors of operator `op` (its phase-2 name,
 * e.g. "aclnnBatchNormStats", or "*" for every operator) with ACLNN_ERR_INNER (561000), as
 * nnopbase refuses executors whose phase 1 used an AI CPU kernel, a DSA task or a synchronous
 * copy. Not a violation. The environment variable ASCEND_MOCK_REFUSE_REPEATABLE (a
 * comma-separated list of such names) is read at the first call of either function. Returns 0, or
 * -1 when op is NULL, empty, 64 bytes or longer, or the list (32 names) is full. */
int ascend_mock_refuse_repeatable(const char *op, int on);
/* Failed aclSetAclOpExecutorRepeatable calls so far (refusals and injected faults). */
uint64_t ascend_mock_repeatable_refusals(void);

#ifdef __cplusplus
}
#endif

#endif /* ASCEND_MOCK_H */
