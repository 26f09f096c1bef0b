/*
 * Mock CANN, libascendcl.so: what its source files share (and nothing else sees).
 *
 * The library is split by concern, in layers that only look down:
 *   api.c      the acl* entry points (each opens with ACL_ENTER) and the mock's introspection
 *   sysparam.c aclrtCtxSetSysParamOpt / aclrtCtxGetSysParamOpt
 *   queue.c    devices, streams, their task queues, waiting tasks, events
 *   memory.c   the device-allocation table and poison (bytes a skipped task should have written)
 *   handles.c  a small hash table, the handle table, dtype and format names
 *   diag.c     the global lock, violations, error text, fault injection
 * What the other libraries of the toolkit reach is declared in ../mock_internal.h.
 *
 * Locking: one global mutex (g_lock, ascend_mock_lock). Every function declared here expects it
 * held, except the diagnostics (fail, violate: they use a leaf lock of their own) and xcalloc.
 * The globals below belong to the file named beside them; others read them with the lock held.
 */
#ifndef ASCEND_MOCK_ACL_INTERNAL_H
#define ASCEND_MOCK_ACL_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* The declarations of these headers are the library's exports (it is built with hidden visibility). */
#pragma GCC visibility push(default)
#include "wrapper.h"
#include "ascend_mock.h"
#include "mock_internal.h"
#pragma GCC visibility pop

/* ---- status codes (docs/cann/API.md section 4) --------------------------------------------------------- */
enum {
    ACL_OK = 0,
    ACL_ERROR_INVALID_PARAM = 100000,
    ACL_ERROR_UNINITIALIZE = 100001,
    ACL_ERROR_REPEAT_INITIALIZE = 100002,
    ACL_ERROR_REPEAT_FINALIZE = 100037,
    ACL_ERROR_RT_PARAM_INVALID = 107000,
    ACL_ERROR_RT_INVALID_DEVICEID = 107001,
    ACL_ERROR_RT_CONTEXT_NULL = 107002,
    ACL_ERROR_RT_STREAM_CONTEXT = 107003,
    ACL_ERROR_RT_INVALID_HANDLE = 107017,
    ACL_ERROR_RT_CAPTURE_DEPENDENCY = 107024,
    ACL_ERROR_RT_STREAM_UNJOINED = 107025,
    ACL_ERROR_RT_STREAM_CAPTURED = 107027,
    ACL_ERROR_RT_EVENT_CAPTURED = 107028,
    ACL_ERROR_RT_STREAM_NOT_CAPTURED = 107029,
    ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT = 107030,
    ACL_ERROR_RT_STREAM_CAPTURE_IMPLICIT = 107031,
    ACL_ERROR_RT_STREAM_CAPTURE_CONFLICT = 107032,
    ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED = 107036,
    ACL_ERROR_RT_MODEL_RUNNING = 107037,
    ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD = 107038,
    ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC = 107041,
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000,
    ACL_ERROR_RT_MEMORY_ALLOCATION = 207001,
    ACL_ERROR_RT_NO_EVENT_RESOURCE = 207007,
    ACL_ERROR_RT_AICORE_EXCEPTION = 507015,
    ACL_ERROR_RT_DEVICE_MEM_ERROR = 507053
};

#define MAX_DEVICES 64
#define MESSAGE_MAX 1024
#define WHY_MAX (MESSAGE_MAX - 128)

/* ---- diag.c: the lock, error text, violations ------------------------------------------------------------ */
extern pthread_mutex_t g_lock;

/* Sets the error text "<api> failed. ERROR: <code>. <detail>" and returns code; with `count`, also
 * counts a violation "<api>: <detail>". Called as fail() and violate(). */
int diag_report(int count, int code, const char *api, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
#define fail(code, api, ...) diag_report(0, (code), (api), __VA_ARGS__)
/* As fail(), and counts a violation "<api>: <detail>". */
#define violate(code, api, ...) diag_report(1, (code), (api), __VA_ARGS__)

/* ---- handles.c: hash table, handle counts ----------------------------------------------------------------- */
/* calloc that aborts when the host is out of memory. */
void *xcalloc(size_t n, size_t size);

/* A small hash table (uint64 key != 0 -> pointer), linear probing. */
typedef struct htab {
    uint64_t *keys;
    void **vals;
    size_t cap; /* power of two, or 0 */
    size_t len;
} htab;

void htab_put(htab *h, uint64_t key, void *val);
void *htab_get(const htab *h, uint64_t key);
void *htab_del(htab *h, uint64_t key);

/* Live handles of each kind (ascend_mock_stats). */
extern uint64_t g_live[ASCEND_MOCK_KIND_COUNT];

/* ---- memory.c: device allocations and poison -------------------------------------------------------------- */
typedef struct poison poison;

typedef struct alloc {
    uintptr_t base;
    uint64_t size;
    uint64_t id;
    int device;
    poison *poison; /* poisoned byte intervals, sorted, disjoint (see "poison" in memory.c) */
    size_t npoison, cap_poison;
    uint64_t poisoned; /* bytes in them */
} alloc;

extern size_t g_nallocs;          /* live allocations */
extern uint64_t g_poisoned_bytes; /* over every live allocation */

/* Records the block [p, p+size) just allocated on `device` and returns its allocation. */
alloc *alloc_add(void *p, uint64_t size, int device);
/* The live allocation starting exactly at p, or NULL. */
alloc *alloc_at(uintptr_t p);
/* The live allocation holding [p, p+len) (len 0: p inside or at its end), or NULL. */
alloc *alloc_containing(uintptr_t p, uint64_t len);
/* Forgets `a` (with its poison) and frees its block. */
void alloc_remove(alloc *a);
/* Whether a live allocation was made on device dev. */
int alloc_on_device(int dev);
/* Whether [p, p+len) overlaps any live allocation (len > 0). */
int overlaps_any(uintptr_t p, uint64_t len);

/* Whether range `r` touches poisoned bytes; if so, says in buf which bytes, of which skipped task, and why. */
int range_poisoned(const ascend_mock_range *r, char *buf, size_t cap);
/* Range `r` was written: its bytes are no longer poisoned. */
void range_written(const ascend_mock_range *r);
/* A task was skipped: what it should have written (its write ranges) becomes poisoned, as `why` explains. */
void poison_writes(const char *what, const char *where, uint64_t seq, const ascend_mock_range *ranges, size_t n,
                   const char *why);

/* ---- queue.c: devices, streams, tasks, events ------------------------------------------------------------- */
/* TASK_EVENT_WAIT: the marker aclrtStreamWaitEvent leaves on the waiting stream (a no-op when it
 * runs); while it is queued, destroying its event is a violation. */
enum { TASK_COPY, TASK_OP, TASK_EVENT, TASK_WAIT, TASK_EVENT_WAIT };

typedef struct task task;
typedef struct model model;
struct task {
    task *next;
    int kind;
    uint64_t seq; /* the task's number (1, 2, ...), named in poison messages */
    const char *what;
    size_t nranges;
    ascend_mock_range ranges[ASCEND_MOCK_MAX_RANGES];
    /* TASK_COPY */
    void *dst;
    const void *src;
    size_t count;
    /* TASK_OP, TASK_WAIT */
    ascend_mock_run_fn run;
    ascend_mock_wait_fn wait;
    ascend_mock_drop_fn drop;
    ascend_mock_clone_fn clone; /* the payload of a replay of the task (capture.c) */
    void *payload;
    /* a replay of a captured task: the model whose replay it is (capture.c counts it done) */
    model *owner;
    /* TASK_EVENT */
    uint64_t event_handle;
    uint64_t event_seq;
};

typedef struct stream stream;
struct stream {
    uint64_t handle; /* 0 for a default stream */
    int device;
    task *head, *tail;
    task *running; /* the head while a TASK_WAIT body runs with g_lock released */
    int pins;      /* threads waiting (g_lock released) for the running task of this stream to end */
    stream *prev, *next; /* g_streams: every stream, default ones included */
    char name[64];
    model *capturing; /* the model this stream's tasks are recorded into (capture.c), or NULL */
    /* The first failure of a task that an event query ran (the device progressing between host calls):
     * reported, then cleared, by the stream's next host synchronisation. */
    int deferred_status;
    char deferred_why[WHY_MAX];
};

/* How an event was made: aclrtCreateEvent / aclrtCreateEventWithFlag (reused through
 * aclrtResetEvent: recorded again only after a reset) or aclrtCreateEventExWithFlag (reused by
 * recording again; no aclrtResetEvent; waitable only with ACL_EVENT_SYNC). */
enum { EVENT_DEFAULT, EVENT_WITH_FLAG, EVENT_EX_WITH_FLAG };

/* The most live events of one device (Atlas A2/A3: 65536, runtime docs/zh/api_ref/07_event_management.md). */
#define EVENT_LIMIT 65536

typedef struct event {
    uint64_t handle;
    int device;
    int kind;       /* EVENT_DEFAULT, EVENT_WITH_FLAG, EVENT_EX_WITH_FLAG */
    uint32_t flags; /* ACL_EVENT_* (0 for aclrtCreateEvent) */
    stream *recorded_on; /* valid while a record is pending: a stream is drained before it goes */
    uint64_t recorded_seq, completed_seq;
    double completed_ms; /* CLOCK_MONOTONIC time at which the last completed record ran */
} event;

typedef struct device {
    int refcount;
    uint64_t gen;
    stream *default_stream;
} device;

extern int g_initialized, g_ever_initialized;
extern int g_device_count;
extern device g_devices[MAX_DEVICES];
extern stream *g_streams;      /* every stream, default ones included */
extern uint64_t g_queued_tasks; /* tasks enqueued and not yet run */
/* The calling thread's device (aclrtSetDevice) and that device's generation when it was set: a
 * reset of the device (gen changes) unsets it on every thread. */
extern __thread int tls_device;
extern __thread uint64_t tls_device_gen;

/* The calling thread's current device, or -1 (the lock is held, aclInit may not be done). */
int current_device(void);
/* Precondition checks: 0, or the ACL error (after counting a violation and setting the error text). */
int init_check(const char *api);
/* Destroys the default stream of a device (after running its tasks) and unsets it on every thread. */
void release_device(int dev);
/* Whether device dev holds live device memory, a created stream, or work queued on its default stream. */
int device_in_use(int dev);

void stream_link(stream *s);
void stream_unlink(stream *s);
/* The default stream of device dev (made on first use). */
stream *default_stream(int dev);
/* The stream of handle h (NULL: the default stream of the current device), or the error. */
int stream_resolve(const char *api, aclrtStream h, stream **out);
/* Counts a violation when a range overlaps work queued on a stream other than `self` (NULL: any
 * stream) and one of the two writes it. */
void hazard_check(const char *what, const stream *self, const ascend_mock_range *r, size_t n);
/* Appends t to the queue of s (numbering it). */
void enqueue(stream *s, task *t);
/* Runs the head task of s (see queue.c); returns its status, the reason in why. */
int run_head(stream *s, char *why, size_t cap);
/* Runs every task queued on s; returns the first failure's status (its reason in why, if given). */
int drain(stream *s, char *why, size_t cap);
/* Runs every task of s and waits until no other thread uses s: after it, s may be freed. */
int stream_quiesce(stream *s, char *why, size_t cap);
/* The error of a synchronizing call whose stream `where` had a failed task. */
int sync_failed(const char *api, int status, const char *where, const char *why);
/* The live event of a handle, or NULL. */
event *event_get(uint64_t handle);

/* ---- capture.c: graph capture into model run instances (aclmdlRI) ----------------------------------------- */
/* Records t (just numbered) into the model s captures instead of queueing it. */
void capture_record(stream *s, task *t);
/* A replayed task of t->owner has run (or was dropped). */
void capture_task_done(task *t);
/* 0, or ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC (a violation) when `api` would synchronise stream s
 * (NULL: any stream of the current device) while it is captured. */
int capture_forbid_sync(const char *api, const stream *s);
/* 0, or ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC when `api` (a blocking memory call: aclrtMemcpy,
 * aclrtMemset, aclrtFree) runs on this thread while a capture forbids it (a global capture
 * anywhere, a thread-local one begun on this thread; not once the thread exchanged its mode to
 * relaxed). */
int capture_forbid_blocking(const char *api);
/* Whether a live model's captured tasks use device allocation `id` (its name in *what). */
int capture_uses_alloc(uint64_t id, const char **what);
/* Whether a live model's captured tasks record or wait for event `handle`. */
int capture_uses_event(uint64_t handle);
/* Whether event `handle` is recorded in a capture going on (it is in capture state). */
int capture_in_state(uint64_t handle);
/* 0, or ACL_ERROR_RT_EVENT_CAPTURED when `api` (a record or reset of event `handle` on stream s)
 * would touch an event in the state of a capture that s is not part of. */
int capture_event_outside(const char *api, uint64_t handle, const stream *s);
/* aclrtStreamWaitEvent(s, e) where s is captured or e is in capture state: pulls s into the
 * capture of e (fork), or joins it back, recording the wait into the model; or the capture error
 * (see capture.c). */
int capture_wait(const char *api, stream *s, const event *e);
/* 0, or ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC when `api` would wait for or query event `handle`,
 * recorded in a capture still going on. */
int capture_forbid_event(const char *api, uint64_t handle);
/* api.c: the number of the next event record. */
uint64_t next_event_seq(void);

/* ---- the entry preamble --------------------------------------------------------------------------------- */
/* An entry point's precondition, run by ACL_ENTER with the lock held: 0, or the ACL error (after
 * counting a violation and setting the error text). */
static inline int needs_nothing(const char *api) {
    (void)api;
    return 0;
}
static inline int needs_init(const char *api) {
    return init_check(api);
}
static inline int needs_device(const char *api) {
    return ascend_mock_runtime_ready_locked(api);
}

/* The first line of every acl* entry point: declares `api` (the name), returns an injected fault
 * at once (MOCK_ENTER; null_out as there), takes the global lock and declares `r`, the status
 * of the precondition `check` (needs_nothing, needs_init: aclInit done, needs_device: and a device
 * set on this thread). The entry goes on while !r and ends with ascend_mock_unlock(); return r. */
#define ACL_ENTER(name, null_out, check)                                                                           \
    static const char api[] = name;                                                                               \
    MOCK_ENTER(api, null_out);                                                                                     \
    ascend_mock_lock();                                                                                            \
    int r = check(api)

/* An entry point's end: releases the lock ACL_ENTER took and returns the entry's status. */
#define ACL_LEAVE()                                                                                                 \
    do {                                                                                                            \
        ascend_mock_unlock();                                                                                       \
        return r;                                                                                                   \
    } while (0)

/* A step of an entry point: runs `call` (which returns a status) only while r is 0, so that the
 * first failure is the one the entry reports. */
#define ACL_STEP(call)                                                                                              \
    do {                                                                                                            \
        if (!r) {                                                                                                   \
            r = (call);                                                                                             \
        }                                                                                                           \
    } while (0)

/* The step that refuses a NULL argument `p`: "<what> is null." (ACL_ERROR_INVALID_PARAM). */
#define ACL_NOT_NULL(p, what) ACL_STEP((p) ? ACL_OK : fail(ACL_ERROR_INVALID_PARAM, api, "%s is null.", (what)))

#endif /* ASCEND_MOCK_ACL_INTERNAL_H */
