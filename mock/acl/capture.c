/*
 * Mock CANN, libascendcl.so: graph capture into model run instances (aclmdlRI, acl_rt.h:4710-4795;
 * runtime docs/zh/dev_guide/04-01_single_stream_capture.md; docs/cann/CAPTURE.md).
 *
 * Between aclmdlRICaptureBegin and aclmdlRICaptureEnd the tasks queued on the stream are recorded
 * into the model instead of run (enqueue hands them to capture_record). aclmdlRIExecuteAsync
 * queues a replay of every recorded task, in order, on the stream it is given: a copy, an event
 * record, an operator launch with the same kernel, arguments and repeatable executor, a collective
 * issued again on its communicator. aclmdlRIDestroy releases the recorded tasks.
 *
 * What CANN forbids during a capture is an error here (ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC,
 * 107041, with a violation): synchronising or querying the captured stream or its events (every
 * mode), the blocking memory calls (aclrtMemcpy, aclrtMemset, aclrtFree: global mode, and
 * thread-local mode on the thread that began, unless aclmdlRICaptureThreadExchangeMode made the
 * thread relaxed), a pageable asynchronous copy on the captured stream (every mode). Capturing the
 * default stream is ACL_ERROR_RT_STREAM_CAPTURE_IMPLICIT. Freeing memory, or destroying an event,
 * a live model's tasks use is a violation; so is destroying a model whose replay is still queued.
 *
 * Not modelled: capture across streams joined by events. A stream waiting for an event during a
 * capture (or a stream waiting for an event recorded in a capture) is refused with
 * ACL_ERROR_RT_CAPTURE_DEPENDENCY (107024) / ACL_ERROR_RT_EVENT_CAPTURED (107028).
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

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
};

static model *g_models;
static uintptr_t g_next_model = 0x6d000000;
static uint64_t g_replays, g_captures, g_live_models;
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

void capture_record(stream *s, task *t) {
    model *m = s->capturing;
    t->next = NULL;
    if (m->tail) {
        m->tail->next = t;
    } else {
        m->head = t;
    }
    m->tail = t;
}

void capture_task_done(task *t) {
    if (t->owner && t->owner->pending) {
        t->owner->pending--;
    }
}

int capture_forbid_sync(const char *api, const stream *s) {
    int dev = current_device();
    for (model *m = g_models; m; m = m->next) {
        if (m->origin && (m->origin == s || (!s && m->origin->device == dev))) {
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

/* Whether event `handle` is recorded by the tasks of model m. */
static int model_records(const model *m, uint64_t handle) {
    for (task *t = m->head; t; t = t->next) {
        if (t->kind == TASK_EVENT && t->event_handle == handle) {
            return 1;
        }
    }
    return 0;
}

int capture_uses_event(uint64_t handle) {
    for (model *m = g_models; m; m = m->next) {
        if (model_records(m, handle)) {
            return 1;
        }
    }
    return 0;
}

int capture_forbid_event(const char *api, uint64_t handle) {
    for (model *m = g_models; m; m = m->next) {
        if (m->origin && model_records(m, handle)) {
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
    if (!r && s->head) {
        /* The mock device is in order: work queued before the capture runs first (a valid schedule). */
        drain(s, NULL, 0);
    }
    if (!r) {
        model *m = xcalloc(1, sizeof *m);
        m->handle = g_next_model += 0x100;
        m->device = s->device;
        m->origin = s;
        m->mode = (int)mode;
        m->thread = pthread_self();
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
    if (!r && s->capturing->mode != ACL_MODEL_RI_CAPTURE_MODE_RELAXED &&
        !pthread_equal(s->capturing->thread, pthread_self())) {
        r = violate(ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD, api,
                    "the capture of %s began on another thread (only a relaxed capture may end elsewhere)", s->name);
    }
    if (!r) {
        model *m = s->capturing;
        s->capturing = NULL;
        m->origin = NULL;
        *modelRI = (aclmdlRI)m->handle;
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

void ascend_mock_capture_stats(uint64_t *captures, uint64_t *replays, uint64_t *live_models) {
    ascend_mock_lock();
    *captures = g_captures;
    *replays = g_replays;
    *live_models = g_live_models;
    ascend_mock_unlock();
}
