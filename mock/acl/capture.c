/*
 * Mock CANN, libascendcl.so: graph capture into model run instances (aclmdlRI, acl_rt.h:4710-4795;
 * runtime docs/zh/dev_guide/04-01_single_stream_capture.md, 04-02_cross_stream_capture.md;
 * docs/cann/CAPTURE.md).
 *
 * Between aclmdlRICaptureBegin and aclmdlRICaptureEnd the tasks queued on the stream are recorded
 * into the model instead of run (enqueue hands them to capture_record). aclmdlRICaptureBegin does
 * not wait for the work queued on the stream before it (nothing in CANN's documentation says it
 * does; torch_npu synchronises before it begins): that work stays queued and runs as any queued
 * work does (before a replay queued later on the same stream), so memory it uses, handed to
 * another stream meanwhile, is a hazard counted as usual. aclmdlRIExecuteAsync queues a replay of
 * every recorded task, in order, on the stream it is given: a copy, an event record, an operator
 * launch with the same kernel, arguments and repeatable executor, a collective issued again on its
 * communicator. aclmdlRIDestroy releases the recorded tasks.
 *
 * What CANN forbids during a capture is an error here (ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC,
 * 107041, with a violation): synchronising or querying a captured stream or an event recorded in
 * a capture (every mode), the blocking memory calls (aclrtMemcpy, aclrtMemset, aclrtFree: global
 * mode, and thread-local mode on the thread that began, unless aclmdlRICaptureThreadExchangeMode
 * made the thread relaxed), a pageable asynchronous copy on a captured stream (every mode).
 * Capturing the default stream is ACL_ERROR_RT_STREAM_CAPTURE_IMPLICIT. Freeing memory, or
 * destroying an event, a live model's tasks use is a violation; so is destroying a model whose
 * replay is still queued.
 *
 * Capture across streams (04-02_cross_stream_capture.md; the statuses are those of runtime
 * include/external/acl/error_codes/rt_error_codes.h:45-62, explained in
 * docs/zh/api_ref/25-01_aclError.md):
 *   - fork: an event recorded on a captured stream enters the capture's state; a stream that
 *     waits for it (aclrtStreamWaitEvent) is pulled into the same capture (a "side stream"), and
 *     so, transitively, is a stream waiting for an event a side stream recorded. From then on the
 *     side stream's tasks are recorded into the same model (in the order the host issues them,
 *     which every replay keeps: the mock device is in order, and the host issues a wait only after
 *     its record, so that order respects every dependency of the capture);
 *   - join: each side stream must come back to the origin stream before aclmdlRICaptureEnd, by
 *     an event recorded on it that the origin waits for, directly or through other side streams,
 *     and must queue nothing after that. Otherwise aclmdlRICaptureEnd fails with
 *     ACL_ERROR_RT_STREAM_UNJOINED (107025, "the capture model contains streams not merged into
 *     the original stream": its last task is not a record the origin waits for). The mock tracks
 *     this with a vector clock per stream of the capture: a record carries its stream's clock, a
 *     wait merges it, and at the end the origin's clock must cover the last task of every side
 *     stream;
 *   - a captured stream waiting for an event whose record is not in its capture is
 *     ACL_ERROR_RT_CAPTURE_DEPENDENCY (107024: "an event wait task has no corresponding event
 *     record task"); an event of one capture waited for by a stream of another capture is
 *     ACL_ERROR_RT_STREAM_CAPTURE_CONFLICT (107032: "the event and the stream belong to different
 *     model run instances");
 *   - recording or resetting an event of a capture going on, from a stream outside that capture,
 *     is ACL_ERROR_RT_EVENT_CAPTURED (107028: "the event is in capture state: end the capture
 *     first");
 *   - aclmdlRICaptureEnd on a side stream is ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED (107036: Begin
 *     and End take the same, origin, stream; the capture goes on);
 *   - a side stream is captured like the origin: synchronising it, replaying on it, destroying it
 *     or beginning a capture on it are the errors above.
 * Where the facts are silent the mock takes the stricter choice (each a violation):
 *   - an event that joins a stream into a capture must come from aclrtCreateEventExWithFlag with
 *     ACL_EVENT_SYNC (the runtime's sample says captures "need" such events; an event of
 *     aclrtCreateEvent is refused with ACL_ERROR_RT_PARAM_INVALID);
 *   - an unjoined aclmdlRICaptureEnd terminates the capture (as cudaStreamEndCapture does with
 *     cudaErrorStreamCaptureUnjoined): every stream of it leaves the capture, the recorded tasks
 *     are discarded and *modelRI is NULL;
 *   - a stream pulled into a capture first runs the work queued on it before, so none of it is in
 *     the model;
 *   - at most CAPTURE_STREAMS streams take part in one capture (ACL_ERROR_RT_PARAM_INVALID past
 *     that; CANN documents no bound).
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The most streams one capture may take part (the origin and the side streams pulled in). */
#define CAPTURE_STREAMS 16

/* An event recorded in a capture going on: the clock of its stream at the record. */
typedef struct captured_event {
    uint64_t handle;
    uint64_t clock[CAPTURE_STREAMS];
} captured_event;

struct model {
    model *next;
    uintptr_t handle; /* the aclmdlRI handed out */
    int device;
    stream *origin; /* the stream being captured, or NULL once the capture ended */
    int mode;       /* aclmdlRICaptureMode */
    pthread_t thread;
    task *head, *tail;  /* the recorded tasks */
    uint64_t pending;   /* replayed tasks queued and not yet run */
    stream *replay_on;  /* the stream of the last replay (while pending) */
    /* While captured: the streams taking part (members[0] is the origin) and their vector
     * clocks: clock[i][j] is the number (task seq) of the last task of members[j] that the next
     * task of members[i] comes after (clock[i][i]: members[i]'s own last task). */
    stream *members[CAPTURE_STREAMS];
    uint64_t clock[CAPTURE_STREAMS][CAPTURE_STREAMS];
    size_t nmembers;
    captured_event *events; /* the events recorded in the capture (their latest record) */
    size_t nevents, cap_events;
};

static model *g_models;
static uintptr_t g_next_model = 0x6d000000;
static uint64_t g_replays, g_captures, g_live_models, g_joins;
/* The calling thread's exchanged mode (aclmdlRICaptureThreadExchangeMode): GLOBAL by default. */
static __thread int tls_mode = ACL_MODEL_RI_CAPTURE_MODE_GLOBAL;

static model *model_get(uintptr_t h) {
    for (model *m = g_models; m; m = m->next) {
        if (m->handle == h) {
            return m;
        }
    }
    return NULL;
}

int ascend_mock_stream_capturing_locked(aclrtStream h) {
    stream *s;
    return h && stream_resolve("capture", h, &s) == 0 && s->capturing;
}

/* The index of s among the streams of the capture m (s takes part in it). */
static size_t member_index(const model *m, const stream *s) {
    for (size_t i = 0; i < m->nmembers; i++) {
        if (m->members[i] == s) {
            return i;
        }
    }
    return 0; /* (unreachable: s->capturing == m) */
}

/* The record of event `handle` in the capture going on that recorded it last, or NULL. */
static captured_event *captured(uint64_t handle, model **in) {
    for (model *m = g_models; m; m = m->next) {
        for (size_t i = 0; m->origin && i < m->nevents; i++) {
            if (m->events[i].handle == handle) {
                *in = m;
                return &m->events[i];
            }
        }
    }
    return NULL;
}

void capture_record(stream *s, task *t) {
    model *m = s->capturing;
    t->next = NULL;
    if (m->tail) {
        m->tail->next = t;
    } else {
        m->head = t;
    }
    m->tail = t;
    size_t i = member_index(m, s);
    m->clock[i][i] = t->seq;
    if (t->kind == TASK_EVENT) {
        /* The event enters the capture's state, carrying its stream's clock (a later record of it
         * in the capture replaces the earlier one, as a re-record does). */
        model *in = NULL;
        captured_event *ce = captured(t->event_handle, &in);
        if (!ce) {
            if (m->nevents == m->cap_events) {
                m->cap_events = m->cap_events ? 2 * m->cap_events : 8;
                captured_event *grown = xcalloc(m->cap_events, sizeof *grown);
                if (m->nevents) {
                    memcpy(grown, m->events, m->nevents * sizeof *grown);
                }
                free(m->events);
                m->events = grown;
            }
            ce = &m->events[m->nevents++];
            ce->handle = t->event_handle;
        }
        memcpy(ce->clock, m->clock[i], sizeof ce->clock);
    }
}

int capture_event_outside(const char *api, uint64_t handle, const stream *s) {
    model *m = NULL;
    if (captured(handle, &m) && s->capturing != m) {
        return violate(ACL_ERROR_RT_EVENT_CAPTURED, api,
                       "event %p is recorded in the capture of %s, which %s is not part of: end the capture "
                       "(aclmdlRICaptureEnd) first",
                       (void *)(uintptr_t)handle, m->origin->name, s->name);
    }
    return 0;
}

int capture_in_state(uint64_t handle) {
    model *m = NULL;
    return captured(handle, &m) != NULL;
}

int capture_wait(const char *api, stream *s, const event *e) {
    if (!s->capturing && s->head) {
        /* Work queued before the stream joins runs first (a valid schedule of the in-order
         * device), so none of it is in the model. (drain may release the lock: look up after.) */
        drain(s, NULL, 0);
    }
    model *m = NULL;
    captured_event *ce = captured(e->handle, &m);
    if (!ce) {
        return violate(ACL_ERROR_RT_CAPTURE_DEPENDENCY, api,
                       "%s is being captured and waits for event %p, whose record is not in the capture (an "
                       "event wait in a capture needs its event record in the same capture; order other work "
                       "before aclmdlRICaptureBegin)",
                       s->name, (void *)(uintptr_t)e->handle);
    }
    if (s->capturing && s->capturing != m) {
        return violate(ACL_ERROR_RT_STREAM_CAPTURE_CONFLICT, api,
                       "event %p is recorded in the capture of %s, but %s takes part in another capture (of %s)",
                       (void *)(uintptr_t)e->handle, m->origin->name, s->name, s->capturing->origin->name);
    }
    if (e->kind != EVENT_EX_WITH_FLAG || !(e->flags & ACL_EVENT_SYNC)) {
        return violate(ACL_ERROR_RT_PARAM_INVALID, api,
                       "event %p joins %s to the capture of %s but does not come from aclrtCreateEventExWithFlag "
                       "with ACL_EVENT_SYNC, which captures across streams need (runtime "
                       "docs/zh/dev_guide/04-02_cross_stream_capture.md)",
                       (void *)(uintptr_t)e->handle, s->name, m->origin->name);
    }
    if (!s->capturing) {
        if (m->nmembers == CAPTURE_STREAMS) {
            return violate(ACL_ERROR_RT_PARAM_INVALID, api,
                           "%s would be the stream number %d of the capture of %s: the mock allows %d", s->name,
                           CAPTURE_STREAMS + 1, m->origin->name, CAPTURE_STREAMS);
        }
        size_t i = m->nmembers++;
        m->members[i] = s;
        memset(m->clock[i], 0, sizeof m->clock[i]);
        s->capturing = m;
        g_joins++;
    }
    size_t i = member_index(m, s);
    for (size_t j = 0; j < CAPTURE_STREAMS; j++) {
        if (ce->clock[j] > m->clock[i][j]) {
            m->clock[i][j] = ce->clock[j];
        }
    }
    task *t = xcalloc(1, sizeof *t);
    t->kind = TASK_EVENT_WAIT;
    t->what = "event wait";
    t->event_handle = e->handle;
    enqueue(s, t);
    return 0;
}

/* The recorded task numbered seq of m (its name), or "task". */
static const char *task_name(const model *m, uint64_t seq) {
    for (const task *t = m->head; t; t = t->next) {
        if (t->seq == seq) {
            return t->what;
        }
    }
    return "task";
}

/* 0, or ACL_ERROR_RT_STREAM_UNJOINED naming the first side stream of m that the origin's last
 * task does not come after. */
static int capture_check_joined(const char *api, const model *m) {
    for (size_t j = 1; j < m->nmembers; j++) {
        uint64_t last = m->clock[j][j], seen = m->clock[0][j];
        if (seen >= last) {
            continue;
        }
        if (!seen) {
            return violate(ACL_ERROR_RT_STREAM_UNJOINED, api,
                           "%s joined the capture of %s through an event but never joined back: record an event "
                           "on it and make %s wait for it before aclmdlRICaptureEnd; the capture is terminated",
                           m->members[j]->name, m->origin->name, m->origin->name);
        }
        return violate(ACL_ERROR_RT_STREAM_UNJOINED, api,
                       "%s queued task #%llu (%s) after it last joined back to %s (nothing may be queued on a "
                       "side stream after its join); the capture is terminated",
                       m->members[j]->name, (unsigned long long)last, task_name(m, last), m->origin->name);
    }
    return 0;
}

/* The capture of m is over: every stream of it leaves the capture. */
static void capture_leave(model *m) {
    for (size_t i = 0; i < m->nmembers; i++) {
        m->members[i]->capturing = NULL;
    }
    m->nmembers = 0;
    m->origin = NULL;
    free(m->events);
    m->events = NULL;
    m->nevents = m->cap_events = 0;
}

void capture_task_done(task *t) {
    if (t->owner && t->owner->pending) {
        t->owner->pending--;
    }
}

int capture_forbid_sync(const char *api, const stream *s) {
    if (s && s->capturing) {
        return violate(ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC, api,
                       "operation not permitted when a stream is capturing: %s is being captured (the capture of %s)",
                       s->name, s->capturing->origin->name);
    }
    int dev = current_device();
    for (model *m = g_models; !s && m; m = m->next) {
        if (m->origin && m->origin->device == dev) {
            return violate(ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC, api,
                           "operation not permitted when a stream is capturing: %s is being captured", m->origin->name);
        }
    }
    return 0;
}

int capture_forbid_blocking(const char *api) {
    if (tls_mode == ACL_MODEL_RI_CAPTURE_MODE_RELAXED) {
        return 0;
    }
    for (model *m = g_models; m; m = m->next) {
        if (!m->origin) {
            continue;
        }
        if (m->mode == ACL_MODEL_RI_CAPTURE_MODE_GLOBAL ||
            (m->mode == ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL && pthread_equal(m->thread, pthread_self()))) {
            return violate(ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC, api,
                           "operation not permitted when a stream is capturing and the specified capture mode is not "
                           "relaxed (%s is being captured)",
                           m->origin->name);
        }
    }
    return 0;
}

int capture_uses_alloc(uint64_t id, const char **what) {
    for (model *m = g_models; m; m = m->next) {
        for (task *t = m->head; t; t = t->next) {
            for (size_t i = 0; i < t->nranges; i++) {
                if (t->ranges[i].alloc_id == id) {
                    *what = t->what;
                    return 1;
                }
            }
        }
    }
    return 0;
}

/* Whether event `handle` is recorded (or, with `waits`, also waited for) by the tasks of model m. */
static int model_uses_event(const model *m, uint64_t handle, int waits) {
    for (task *t = m->head; t; t = t->next) {
        if ((t->kind == TASK_EVENT || (waits && t->kind == TASK_EVENT_WAIT)) && t->event_handle == handle) {
            return 1;
        }
    }
    return 0;
}

int capture_uses_event(uint64_t handle) {
    for (model *m = g_models; m; m = m->next) {
        if (model_uses_event(m, handle, 1)) {
            return 1;
        }
    }
    return 0;
}

int capture_forbid_event(const char *api, uint64_t handle) {
    for (model *m = g_models; m; m = m->next) {
        if (m->origin && model_uses_event(m, handle, 0)) {
            return violate(ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC, api,
                           "operation not permitted when a stream is capturing: event %p is recorded in the capture "
                           "of %s",
                           (void *)(uintptr_t)handle, m->origin->name);
        }
    }
    return 0;
}

static void model_release(model *m) {
    for (model **p = &g_models; *p; p = &(*p)->next) {
        if (*p == m) {
            *p = m->next;
            break;
        }
    }
    task *t = m->head;
    while (t) {
        task *next = t->next;
        if (t->drop) {
            t->drop(t->payload);
        }
        free(t);
        t = next;
    }
    free(m->events);
    free(m);
    g_live_models--;
}

aclError aclmdlRICaptureBegin(aclrtStream sh, aclmdlRICaptureMode mode) {
    ACL_ENTER("aclmdlRICaptureBegin", NULL, needs_device);
    if (!r && !sh) {
        r = violate(ACL_ERROR_RT_STREAM_CAPTURE_IMPLICIT, api, "the default stream cannot be captured");
    }
    stream *s = NULL;
    ACL_STEP(stream_resolve(api, sh, &s));
    if (!r && (mode < ACL_MODEL_RI_CAPTURE_MODE_GLOBAL || mode > ACL_MODEL_RI_CAPTURE_MODE_RELAXED)) {
        r = violate(ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT, api, "capture mode %d is not one of 0, 1, 2", (int)mode);
    }
    if (!r && s->capturing) {
        r = violate(ACL_ERROR_RT_STREAM_CAPTURED, api, "%s is already being captured", s->name);
    }
    if (!r) {
        model *m = xcalloc(1, sizeof *m);
        m->handle = g_next_model += 0x100;
        m->device = s->device;
        m->origin = s;
        m->mode = (int)mode;
        m->thread = pthread_self();
        m->members[0] = s;
        m->nmembers = 1;
        m->next = g_models;
        g_models = m;
        s->capturing = m;
        g_captures++;
        g_live_models++;
    }
    ACL_LEAVE();
}

aclError aclmdlRICaptureGetInfo(aclrtStream sh, aclmdlRICaptureStatus *status, aclmdlRI *modelRI) {
    ACL_ENTER("aclmdlRICaptureGetInfo", NULL, needs_device);
    ACL_NOT_NULL(status, "status");
    ACL_NOT_NULL(modelRI, "modelRI");
    stream *s = NULL;
    ACL_STEP(stream_resolve(api, sh, &s));
    if (!r) {
        *status = s->capturing ? ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE : ACL_MODEL_RI_CAPTURE_STATUS_NONE;
        *modelRI = s->capturing ? (aclmdlRI)s->capturing->handle : NULL;
    }
    ACL_LEAVE();
}

aclError aclmdlRICaptureEnd(aclrtStream sh, aclmdlRI *modelRI) {
    ACL_ENTER("aclmdlRICaptureEnd", modelRI, needs_device);
    ACL_NOT_NULL(modelRI, "modelRI");
    stream *s = NULL;
    ACL_STEP(stream_resolve(api, sh, &s));
    if (!r && !s->capturing) {
        r = violate(ACL_ERROR_RT_STREAM_NOT_CAPTURED, api, "%s is not being captured", s->name);
    }
    if (!r && s->capturing->origin != s) {
        r = violate(ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED, api,
                    "%s joined the capture of %s through an event: end the capture on %s, where it began", s->name,
                    s->capturing->origin->name, s->capturing->origin->name);
    }
    if (!r && s->capturing->mode != ACL_MODEL_RI_CAPTURE_MODE_RELAXED &&
        !pthread_equal(s->capturing->thread, pthread_self())) {
        r = violate(ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD, api,
                    "the capture of %s began on another thread (only a relaxed capture may end elsewhere)", s->name);
    }
    if (!r) {
        model *m = s->capturing;
        r = capture_check_joined(api, m);
        capture_leave(m);
        if (r) {
            *modelRI = NULL;
            model_release(m);
        } else {
            *modelRI = (aclmdlRI)m->handle;
        }
    }
    ACL_LEAVE();
}

aclError aclmdlRICaptureThreadExchangeMode(aclmdlRICaptureMode *mode) {
    ACL_ENTER("aclmdlRICaptureThreadExchangeMode", NULL, needs_init);
    ACL_NOT_NULL(mode, "mode");
    if (!r && (*mode < ACL_MODEL_RI_CAPTURE_MODE_GLOBAL || *mode > ACL_MODEL_RI_CAPTURE_MODE_RELAXED)) {
        r = violate(ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT, api, "capture mode %d is not one of 0, 1, 2", (int)*mode);
    }
    if (!r) {
        int old = tls_mode;
        tls_mode = (int)*mode;
        *mode = (aclmdlRICaptureMode)old;
    }
    ACL_LEAVE();
}

/* The live model of a handle that is not being captured (else the error). */
static int model_resolve(const char *api, aclmdlRI h, model **out) {
    model *m = model_get((uintptr_t)h);
    if (!m) {
        return violate(ACL_ERROR_RT_INVALID_HANDLE, api, "model run instance %p is not live", h);
    }
    if (m->origin) {
        return violate(ACL_ERROR_RT_STREAM_CAPTURED, api, "model run instance %p is still being captured on %s", h,
                       m->origin->name);
    }
    if (m->device != current_device()) {
        return violate(ACL_ERROR_RT_STREAM_CONTEXT, api,
                       "model run instance %p belongs to device %d, but the current device is %d", h, m->device,
                       current_device());
    }
    *out = m;
    return 0;
}

aclError aclmdlRIExecuteAsync(aclmdlRI h, aclrtStream sh) {
    ACL_ENTER("aclmdlRIExecuteAsync", NULL, needs_device);
    model *m = NULL;
    ACL_STEP(model_resolve(api, h, &m));
    stream *s = NULL;
    ACL_STEP(stream_resolve(api, sh, &s));
    if (!r && s->capturing) {
        r = violate(ACL_ERROR_RT_STREAM_CAPTURED, api, "%s is being captured", s->name);
    }
    if (!r && m->pending && m->replay_on != s) {
        r = violate(ACL_ERROR_RT_MODEL_RUNNING, api,
                    "model run instance %p is still running on %s: a replay on %s would overlap it (order it after "
                    "the previous replay with an event)",
                    h, m->replay_on->name, s->name);
    }
    for (task *t = m ? m->head : NULL; !r && t; t = t->next) {
        task *c = xcalloc(1, sizeof *c);
        *c = *t;
        c->owner = m;
        if (t->clone) {
            c->payload = t->clone(t->payload);
        } else if (t->kind == TASK_OP || t->kind == TASK_WAIT) {
            c->drop = NULL; /* (no task of this library is recorded without a clone) */
        }
        if (t->kind == TASK_EVENT) {
            event *e = event_get(t->event_handle);
            if (e) {
                c->event_seq = e->recorded_seq = next_event_seq();
                e->recorded_on = s;
            }
        }
        hazard_check(api, s, c->ranges, c->nranges);
        m->pending++;
        enqueue(s, c);
    }
    if (!r) {
        m->replay_on = s;
        g_replays++;
    }
    ACL_LEAVE();
}

aclError aclmdlRIDestroy(aclmdlRI h) {
    ACL_ENTER("aclmdlRIDestroy", NULL, needs_device);
    model *m = NULL;
    ACL_STEP(model_resolve(api, h, &m));
    if (!r && m->pending) {
        r = violate(ACL_ERROR_RT_MODEL_RUNNING, api,
                    "model run instance %p has %llu replayed task(s) still queued on %s (synchronize first)", h,
                    (unsigned long long)m->pending, m->replay_on->name);
    }
    if (!r) {
        model_release(m);
    }
    ACL_LEAVE();
}

void ascend_mock_capture_stats(uint64_t *captures, uint64_t *replays, uint64_t *live_models, uint64_t *joins) {
    ascend_mock_lock();
    *captures = g_captures;
    *replays = g_replays;
    *live_models = g_live_models;
    *joins = g_joins;
    ascend_mock_unlock();
}
