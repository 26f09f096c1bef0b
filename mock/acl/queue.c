/*
 * Mock CANN, libascendcl.so: the device's queues. Devices and the calling thread's current one,
 * streams and their task queues (run in order when a call synchronizes), waiting tasks (a
 * collective of libhccl.so, whose body releases the lock while it waits), hazards between
 * streams, events.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* ---- devices, streams, events, tasks ------------------------------------------------------------- */
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int g_initialized, g_ever_initialized;
int g_device_count = 1;
device g_devices[MAX_DEVICES];
stream *g_streams;
uint64_t g_queued_tasks;
static uint64_t g_task_seq;

__thread int tls_device = -1;
__thread uint64_t tls_device_gen;

/* Signalled (with g_lock) when a stream stops running a task that releases g_lock, or when a
 * thread stops pinning a stream: see "waiting tasks" below. */
static pthread_cond_t g_idle = PTHREAD_COND_INITIALIZER;

int current_device(void) {
    if (tls_device < 0 || tls_device >= g_device_count) {
        return -1;
    }
    device *d = &g_devices[tls_device];
    if (d->refcount <= 0 || d->gen != tls_device_gen) {
        return -1;
    }
    return tls_device;
}

int init_check(const char *api) {
    if (!g_initialized) {
        return violate(ACL_ERROR_UNINITIALIZE, api, "ACL is not initialized: call aclInit first");
    }
    return 0;
}

static int device_check(const char *api) {
    if (current_device() < 0) {
        return violate(ACL_ERROR_RT_CONTEXT_NULL, api,
                       "no device context on this thread: call aclrtSetDevice on this thread first");
    }
    return 0;
}

int ascend_mock_current_device_locked(void) {
    return g_initialized ? current_device() : -1;
}

int ascend_mock_initialized_locked(void) {
    return g_initialized;
}

int ascend_mock_runtime_ready_locked(const char *api) {
    int r = init_check(api);
    return r ? r : device_check(api);
}

void stream_link(stream *s) {
    s->prev = NULL;
    s->next = g_streams;
    if (g_streams) {
        g_streams->prev = s;
    }
    g_streams = s;
}

void stream_unlink(stream *s) {
    if (s->prev) {
        s->prev->next = s->next;
    } else {
        g_streams = s->next;
    }
    if (s->next) {
        s->next->prev = s->prev;
    }
}

stream *default_stream(int dev) {
    device *d = &g_devices[dev];
    if (!d->default_stream) {
        stream *s = xcalloc(1, sizeof *s);
        s->device = dev;
        snprintf(s->name, sizeof s->name, "the default stream of device %d", dev);
        stream_link(s);
        d->default_stream = s;
    }
    return d->default_stream;
}

int stream_resolve(const char *api, aclrtStream h, stream **out) {
    int dev = current_device();
    if (!h) {
        *out = default_stream(dev);
        return 0;
    }
    int state;
    stream *s = ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_STREAM, (uint64_t)(uintptr_t)h, &state);
    if (!s) {
        return violate(ACL_ERROR_RT_INVALID_HANDLE, api, "stream %p is %s", h, ascend_mock_state_text(state));
    }
    if (s->device != dev) {
        return violate(ACL_ERROR_RT_STREAM_CONTEXT, api,
                       "%s belongs to device %d, but the current device of this thread is %d", s->name, s->device,
                       dev);
    }
    *out = s;
    return 0;
}

int ascend_mock_stream_check_locked(const char *api, aclrtStream h) {
    stream *s;
    return stream_resolve(api, h, &s);
}

static int ranges_conflict(const ascend_mock_range *a, const ascend_mock_range *b) {
    return (a->write || b->write) && a->len && b->len && a->addr < b->addr + b->len && b->addr < a->addr + a->len;
}

/* Counts a violation when a range overlaps work queued on a stream other than `self` (NULL: any
 * stream) and one of the two writes it: nothing orders the two. */
void hazard_check(const char *what, const stream *self, const ascend_mock_range *r, size_t n) {
    for (stream *s = g_streams; s; s = s->next) {
        if (s == self) {
            continue;
        }
        for (task *t = s->head; t; t = t->next) {
            for (size_t i = 0; i < n; i++) {
                for (size_t j = 0; j < t->nranges; j++) {
                    if (ranges_conflict(&r[i], &t->ranges[j])) {
                        ascend_mock_violation(
                            "%s: %s [%p, +%llu) %s memory that a %s queued on %s %s, with no synchronization in "
                            "between (synchronize that stream or wait for an event first)",
                            what, r[i].name, (void *)r[i].addr, (unsigned long long)r[i].len,
                            r[i].write ? "writes" : "reads", t->what, s->name,
                            t->ranges[j].write ? "writes" : "reads");
                        return;
                    }
                }
            }
        }
    }
}

event *event_get(uint64_t handle) {
    return ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_EVENT, handle, NULL);
}

/* Runs one task (the head of its stream, marked running). Returns 0 or the status to report;
 * then, when `why` is still empty, says there why the task failed. A task is skipped (not run)
 * when a range it uses was freed (a violation) or a range it reads holds poisoned bytes (an
 * error, not a new violation); a skipped or failed task poisons its write ranges, a task that ran
 * clears them. A TASK_WAIT body is called even when the task is skipped (so that it can tell its
 * peers) and may release g_lock (see "waiting tasks" below). */
static int run_task(stream *s, task *t, char *why, size_t cap) {
    int status = 0;
    char reason[MESSAGE_MAX];
    reason[0] = '\0';
    for (size_t i = 0; i < t->nranges && !status; i++) {
        const ascend_mock_range *r = &t->ranges[i];
        if (!ascend_mock_mem_live_locked(r->alloc_id)) {
            ascend_mock_violation("%s queued on %s: device memory of %s [%p, +%llu) was freed before the task ran; "
                                  "the task is skipped",
                                  t->what, s->name, r->name, (void *)r->addr, (unsigned long long)r->len);
            snprintf(reason, sizeof reason, "the device memory of %s [%p, +%llu) was freed before it ran",
                     r->name, (void *)r->addr, (unsigned long long)r->len);
            status = t->kind == TASK_COPY ? ACL_ERROR_RT_DEVICE_MEM_ERROR : ACL_ERROR_RT_AICORE_EXCEPTION;
        }
    }
    for (size_t i = 0; i < t->nranges && !status; i++) {
        const ascend_mock_range *r = &t->ranges[i];
        char detail[MESSAGE_MAX - 16];
        if (!r->write && range_poisoned(r, detail, sizeof detail)) {
            snprintf(reason, sizeof reason, "%s", detail);
            status = t->kind == TASK_COPY ? ACL_ERROR_RT_DEVICE_MEM_ERROR : ACL_ERROR_RT_AICORE_EXCEPTION;
        }
    }
    if (t->kind == TASK_WAIT) {
        char failed[MESSAGE_MAX - 16];
        failed[0] = '\0';
        int st = t->wait(t->payload, status, status ? reason : NULL, failed, sizeof failed);
        if (!status && st) {
            status = st;
            snprintf(reason, sizeof reason, "%s", failed[0] ? failed : "it failed (see the ascend mock violation)");
        }
    } else if (!status) {
        switch (t->kind) {
        case TASK_COPY:
            memmove(t->dst, t->src, t->count);
            break;
        case TASK_OP:
            status = t->run(t->payload);
            if (status) {
                snprintf(reason, sizeof reason,
                         "its kernel failed with status %d (see the ascend mock violation printed when it ran)",
                         status);
            }
            break;
        case TASK_EVENT: {
            event *e = event_get(t->event_handle);
            if (e && e->recorded_seq == t->event_seq) {
                e->completed_seq = t->event_seq;
                e->completed_ms = now_ms();
                e->recorded_on = NULL;
            }
            break;
        }
        default:
            break;
        }
    }
    if (status) {
        poison_writes(t->what, s->name, t->seq, t->ranges, t->nranges, reason);
        if (why && !why[0]) {
            snprintf(why, cap, "task #%llu (%s) was skipped: %s", (unsigned long long)t->seq, t->what, reason);
        }
    } else {
        for (size_t i = 0; i < t->nranges; i++) {
            if (t->ranges[i].write) {
                range_written(&t->ranges[i]);
            }
        }
    }
    if (t->drop) {
        t->drop(t->payload);
    }
    capture_task_done(t);
    return status;
}

/* ---- waiting tasks --------------------------------------------------------------------------------
 *
 * A TASK_WAIT (a collective of libhccl.so) waits for other threads or processes, so its body
 * releases g_lock while it waits (else the peers in this process could never enqueue or
 * synchronize). While it runs, the task stays at the head of its queue and s->running points to
 * it, so:
 *   - the queue stays in order: another thread draining s (a synchronize, an event wait, a
 *     destroy) first waits on g_idle until s->running is NULL, then re-checks what it was doing;
 *   - the stream is never freed under it: freeing a stream waits until no task of it runs and no
 *     thread pins it (a thread waiting in wait_not_running pins it);
 *   - the running task stays visible to hazard checks and to aclrtFree's "still queued" check;
 *   - the body touches device memory only while it holds g_lock, and re-checks that its ranges
 *     are alive each time it takes g_lock back (aclrtFree may run while it waits).
 * Every wait of a body is bounded (HCCL_EXEC_TIMEOUT), so nothing waits on g_idle forever. */

/* Waits until no other thread runs a task of s. Returns 1 when it waited (g_lock was released, so
 * the caller re-checks its state), 0 when s was idle. */
static int wait_not_running(stream *s) {
    if (!s->running) {
        return 0;
    }
    s->pins++;
    while (s->running) {
        pthread_cond_wait(&g_idle, &g_lock);
    }
    s->pins--;
    pthread_cond_broadcast(&g_idle);
    return 1;
}

/* Runs the head task of s (after waiting for another thread's running one: then it returns 0
 * without running anything, and the caller re-checks). */
int run_head(stream *s, char *why, size_t cap) {
    if (wait_not_running(s)) {
        return 0;
    }
    task *t = s->head;
    if (!t) {
        return 0;
    }
    s->running = t;
    int status = run_task(s, t, why, cap);
    /* t is still the head: nothing removes the head of a running stream */
    s->head = t->next;
    if (!s->head) {
        s->tail = NULL;
    }
    s->running = NULL;
    if (t->kind == TASK_WAIT) {
        pthread_cond_broadcast(&g_idle);
    }
    free(t);
    g_queued_tasks--;
    return status;
}

/* Runs every task queued on s; returns the first failure's status (its reason in why, if given). */
int drain(stream *s, char *why, size_t cap) {
    int status = 0;
    while (s->head) {
        int st = run_head(s, why, cap);
        if (st && !status) {
            status = st;
        }
    }
    return status;
}

/* Runs every task of s and waits until no other thread uses s: after it, s may be freed. */
int stream_quiesce(stream *s, char *why, size_t cap) {
    int status = 0;
    for (;;) {
        int st = drain(s, why, cap);
        if (st && !status) {
            status = st;
        }
        if (!s->head && !s->running && !s->pins) {
            return status;
        }
        if (s->running || s->pins) {
            pthread_cond_wait(&g_idle, &g_lock);
        }
    }
}

int sync_failed(const char *api, int status, const char *where, const char *why) {
    return fail(status, api, "A task queued on %s failed: %s.", where, why);
}

void enqueue(stream *s, task *t) {
    t->next = NULL;
    t->seq = ++g_task_seq;
    if (s->capturing) {
        capture_record(s, t);
        return;
    }
    if (s->tail) {
        s->tail->next = t;
    } else {
        s->head = t;
    }
    s->tail = t;
    g_queued_tasks++;
}

static void enqueue_task(const char *what, aclrtStream h, const ascend_mock_range *ranges, size_t nranges, int kind,
                         ascend_mock_run_fn run, ascend_mock_wait_fn wait, ascend_mock_drop_fn drop,
                         ascend_mock_clone_fn clone, void *payload) {
    stream *s;
    if (nranges > ASCEND_MOCK_MAX_RANGES || stream_resolve(what, h, &s) != 0) {
        ascend_mock_violation("%s: internal: task rejected by the queue", what);
        poison_writes(what, "no stream", ++g_task_seq, ranges, nranges,
                      "the queue rejected it (an internal error of the mock)");
        if (drop) {
            drop(payload);
        }
        return;
    }
    hazard_check(what, s, ranges, nranges);
    task *t = xcalloc(1, sizeof *t);
    t->kind = kind;
    t->what = what;
    t->nranges = nranges;
    memcpy(t->ranges, ranges, nranges * sizeof *ranges);
    t->run = run;
    t->wait = wait;
    t->drop = drop;
    t->clone = clone;
    t->payload = payload;
    enqueue(s, t);
}

void ascend_mock_enqueue_locked(const char *what, aclrtStream h, const ascend_mock_range *ranges, size_t nranges,
                                ascend_mock_run_fn run, ascend_mock_drop_fn drop, ascend_mock_clone_fn clone,
                                void *payload) {
    enqueue_task(what, h, ranges, nranges, TASK_OP, run, NULL, drop, clone, payload);
}

void ascend_mock_enqueue_waiting_locked(const char *what, aclrtStream h, const ascend_mock_range *ranges,
                                        size_t nranges, ascend_mock_wait_fn wait, ascend_mock_drop_fn drop,
                                        ascend_mock_clone_fn clone, void *payload) {
    enqueue_task(what, h, ranges, nranges, TASK_WAIT, NULL, wait, drop, clone, payload);
}

/* Destroys the default stream of a device (after running its tasks) and unsets it on every thread. */
void release_device(int dev) {
    device *d = &g_devices[dev];
    if (d->default_stream) {
        stream_quiesce(d->default_stream, NULL, 0);
        stream_unlink(d->default_stream);
        free(d->default_stream);
        d->default_stream = NULL;
    }
    d->refcount = 0;
    d->gen++;
}

int device_in_use(int dev) {
    for (stream *s = g_streams; s; s = s->next) {
        if (s->device == dev && (s->handle || s->head || s->running)) {
            return 1;
        }
    }
    return alloc_on_device(dev);
}
