/*
 * Mock CANN, libascendcl.so: the entry points (acl.h, acl_rt.h; each opens with ACL_ENTER) and
 * the mock's introspection (ascend_mock.h).
 *
 * This library owns every piece of state of the mock toolkit (libnnopbase.so and libopapi.so link
 * to it and reach the state through mock_internal.h): device memory, streams and their task
 * queues, events, the handle table (streams, events, tensors, executors), statistics, injected
 * faults, the per-thread current device and the per-thread recent error message. How its files
 * divide that work: internal.h.
 *
 * Strictness: every misuse CANN would punish (with a crash, corrupted data or an error) counts a
 * violation and prints one line on stderr; see ascend_mock.h for the counters. What a skipped
 * queued task should have written is poisoned: reading it is an error, not stale bytes (see
 * "poison" in memory.c).
 */
#define _POSIX_C_SOURCE 200809L

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Call counters of host-blocking and allocating runtime calls (ascend_mock_stats). */
static uint64_t g_device_mallocs;
static uint64_t g_stream_syncs, g_event_syncs, g_device_syncs, g_device_frees, g_blocking_copies;
static uint64_t g_event_seq;

uint64_t next_event_seq(void) {
    return ++g_event_seq;
}
static uint64_t g_live_comms;
/* Collectives queued by libhccl.so, by kind (1 all-reduce, 2 all-gather, 3 broadcast). */
static uint64_t g_collectives[4];
static __thread uint64_t tls_mallocs;
/* ascend_mock_set_device_count's count, or -1: aclInit reads ASCEND_MOCK_DEVICE_COUNT. */
static int g_device_count_set = -1;

/* ---- init / finalize -------------------------------------------------------------------------------- */
aclError aclInit(const char *configPath) {
    ACL_ENTER("aclInit", NULL, needs_nothing);
    (void)configPath;
    if (g_initialized) {
        r = fail(ACL_ERROR_REPEAT_INITIALIZE, api, "aclInit was already called in this process.");
    } else {
        int count = g_device_count_set >= 0 ? g_device_count_set : 1;
        const char *env = g_device_count_set >= 0 ? NULL : getenv("ASCEND_MOCK_DEVICE_COUNT");
        if (env && *env) {
            char *end;
            long v = strtol(env, &end, 10);
            if (*end == '\0' && v >= 0 && v <= MAX_DEVICES) {
                count = (int)v;
            }
        }
        g_device_count = count;
        g_initialized = 1;
        g_ever_initialized = 1;
    }
    ACL_LEAVE();
}

aclError aclFinalize(void) {
    ACL_ENTER("aclFinalize", NULL, needs_nothing);
    if (!g_initialized) {
        r = g_ever_initialized ? fail(ACL_ERROR_REPEAT_FINALIZE, api, "aclFinalize was already called.")
                               : violate(ACL_ERROR_UNINITIALIZE, api, "ACL is not initialized: call aclInit first");
    } else {
        for (stream *s = g_streams; s; s = s->next) {
            drain(s, NULL, 0);
        }
        for (int dev = 0; dev < MAX_DEVICES; dev++) {
            release_device(dev);
        }
        g_initialized = 0;
    }
    ACL_LEAVE();
}

/* ---- devices ---------------------------------------------------------------------------------------- */
/* The step that refuses a device id this machine does not have (aclrtSetDevice, aclrtResetDevice). */
static int device_id_valid(const char *api, int32_t deviceId) {
    if (deviceId < 0 || deviceId >= g_device_count) {
        return fail(ACL_ERROR_RT_INVALID_DEVICEID, api, "Device id %d is invalid: this machine has %d device(s).",
                    (int)deviceId, g_device_count);
    }
    return 0;
}

/* Runs stream `s`'s queue to its end for a host synchronisation `api`: 0, or the failure of the
 * first task that failed, reported as that synchronisation's error. */
static int drain_reported(const char *api, stream *s) {
    char why[WHY_MAX] = "";
    int sst = drain(s, why, sizeof why);
    if (!sst && s->deferred_status) {
        sst = s->deferred_status;
        snprintf(why, sizeof why, "%s", s->deferred_why);
    }
    s->deferred_status = 0;
    return sst ? sync_failed(api, sst, s->name, why) : 0;
}

aclError aclrtSetDevice(int32_t deviceId) {
    ACL_ENTER("aclrtSetDevice", NULL, needs_init);
    ACL_STEP(device_id_valid(api, deviceId));
    if (!r) {
        device *d = &g_devices[deviceId];
        d->refcount++;
        default_stream(deviceId);
        tls_device = deviceId;
        tls_device_gen = d->gen;
    }
    ACL_LEAVE();
}

aclError aclrtResetDevice(int32_t deviceId) {
    ACL_ENTER("aclrtResetDevice", NULL, needs_init);
    ACL_STEP(device_id_valid(api, deviceId));
    if (!r && g_devices[deviceId].refcount <= 0) {
        r = violate(ACL_ERROR_RT_PARAM_INVALID, api,
                    "device %d is not set (more aclrtResetDevice than aclrtSetDevice calls)", (int)deviceId);
    }
    if (!r && --g_devices[deviceId].refcount == 0) {
        uint64_t live = 0;
        for (stream *s = g_streams; s; s = s->next) {
            if (s->handle && s->device == deviceId) {
                live++;
                drain(s, NULL, 0);
            }
        }
        if (live) {
            ascend_mock_violation("%s(%d): %llu stream(s) created on the device are still alive; destroy streams "
                                  "before resetting their device",
                                  api, (int)deviceId, (unsigned long long)live);
        }
        release_device(deviceId);
    }
    ACL_LEAVE();
}

aclError aclrtGetDevice(int32_t *deviceId) {
    ACL_ENTER("aclrtGetDevice", NULL, needs_init);
    ACL_NOT_NULL(deviceId, "deviceId");
    if (!r) {
        int dev = current_device();
        if (dev < 0) {
            r = fail(ACL_ERROR_RT_CONTEXT_NULL, api, "No device is set on this thread.");
        } else {
            *deviceId = dev;
        }
    }
    ACL_LEAVE();
}

aclError aclrtGetDeviceCount(uint32_t *count) {
    ACL_ENTER("aclrtGetDeviceCount", NULL, needs_init);
    ACL_NOT_NULL(count, "count");
    if (!r) {
        *count = (uint32_t)g_device_count;
    }
    ACL_LEAVE();
}

aclError aclrtSynchronizeDevice(void) {
    ACL_ENTER("aclrtSynchronizeDevice", NULL, needs_device);
    ACL_STEP(capture_forbid_sync(api, NULL));
    if (!r) {
        g_device_syncs++;
        int dev = current_device();
        for (stream *s = g_streams; s; s = s->next) {
            if (s->device == dev) {
                /* every stream is drained; the first failure is the one reported */
                if (r) {
                    drain(s, NULL, 0);
                } else {
                    r = drain_reported(api, s);
                }
            }
        }
    }
    ACL_LEAVE();
}

/* ---- streams --------------------------------------------------------------------------------------- */
aclError aclrtCreateStream(aclrtStream *out) {
    ACL_ENTER("aclrtCreateStream", out, needs_device);
    ACL_NOT_NULL(out, "stream");
    if (!r) {
        stream *s = xcalloc(1, sizeof *s);
        s->device = current_device();
        s->handle = ascend_mock_handle_new_locked(ASCEND_MOCK_KIND_STREAM, s);
        snprintf(s->name, sizeof s->name, "stream %p", (void *)(uintptr_t)s->handle);
        stream_link(s);
        *out = (aclrtStream)(uintptr_t)s->handle;
    }
    ACL_LEAVE();
}

aclError aclrtDestroyStream(aclrtStream h) {
    ACL_ENTER("aclrtDestroyStream", NULL, needs_device);
    if (!r && !h) {
        r = violate(ACL_ERROR_INVALID_PARAM, api, "stream is null (the default stream cannot be destroyed)");
    }
    stream *s = NULL;
    ACL_STEP(stream_resolve(api, h, &s));
    if (!r && s->capturing) {
        r = violate(ACL_ERROR_RT_STREAM_CAPTURED, api, "%s is being captured (end the capture first)", s->name);
    }
    if (!r) {
        char why[WHY_MAX] = "";
        /* no new use through the handle from here; then wait out the threads still using it */
        ascend_mock_handle_remove_locked(ASCEND_MOCK_KIND_STREAM, s->handle);
        int sst = stream_quiesce(s, why, sizeof why);
        stream_unlink(s);
        if (sst) {
            r = sync_failed(api, sst, s->name, why);
        }
        free(s);
    }
    ACL_LEAVE();
}

aclError aclrtSynchronizeStream(aclrtStream h) {
    ACL_ENTER("aclrtSynchronizeStream", NULL, needs_device);
    stream *s = NULL;
    ACL_STEP(stream_resolve(api, h, &s));
    ACL_STEP(capture_forbid_sync(api, s));
    if (!r) {
        g_stream_syncs++;
        r = drain_reported(api, s);
    }
    ACL_LEAVE();
}

/* ---- memory ------------------------------------------------------------------------------------------ */
aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    ACL_ENTER("aclrtMalloc", devPtr, needs_device);
    (void)policy;
    ACL_NOT_NULL(devPtr, "devPtr");
    if (!r && size == 0) {
        r = fail(ACL_ERROR_INVALID_PARAM, api, "size must be greater than 0.");
    }
    void *p = NULL;
    if (!r) {
        size_t rounded = (size + 31) & ~(size_t)31;
        if (rounded < size || posix_memalign(&p, 32, rounded) != 0) {
            p = NULL;
            r = fail(ACL_ERROR_RT_MEMORY_ALLOCATION, api, "Out of device memory: %zu bytes requested.", size);
        }
    }
    if (!r) {
        memset(p, ASCEND_MOCK_GARBAGE_BYTE, size);
        alloc_add(p, size, current_device());
        g_device_mallocs++;
        tls_mallocs++;
        *devPtr = p;
    }
    ACL_LEAVE();
}

aclError aclrtFree(void *devPtr) {
    ACL_ENTER("aclrtFree", NULL, needs_device);
    ACL_NOT_NULL(devPtr, "devPtr");
    ACL_STEP(capture_forbid_blocking(api));
    if (!r) {
        uintptr_t p = (uintptr_t)devPtr;
        alloc *a = alloc_at(p);
        if (!a) {
            alloc *inside = alloc_containing(p, 1);
            if (inside) {
                r = violate(ACL_ERROR_RT_PARAM_INVALID, api,
                            "%p points inside the allocation at %p (+%llu bytes), not at its start", devPtr,
                            (void *)inside->base, (unsigned long long)(p - inside->base));
            } else {
                r = violate(ACL_ERROR_RT_PARAM_INVALID, api,
                            "%p is not a live device allocation (double free, or never allocated by aclrtMalloc)",
                            devPtr);
            }
        } else {
            int reported = 0;
            for (stream *s = g_streams; s && !reported; s = s->next) {
                for (task *t = s->head; t && !reported; t = t->next) {
                    for (size_t k = 0; k < t->nranges; k++) {
                        if (t->ranges[k].alloc_id == a->id) {
                            ascend_mock_violation("%s(%p): a %s queued on %s still uses this memory (%s); "
                                                  "synchronize the stream before freeing",
                                                  api, devPtr, t->what, s->name, t->ranges[k].name);
                            reported = 1;
                            break;
                        }
                    }
                }
            }
            /* As on CANN, aclrtFree neither synchronises nor waits (aclrtFreeWithDevSync is the
             * waiting variant; runtime docs 11-01 device memory): the memory goes at once. A free
             * that queued work still uses (reported above) leaves those tasks to be skipped,
             * poisoning what they should have written. */
            const char *captured = NULL;
            if (!reported && capture_uses_alloc(a->id, &captured)) {
                ascend_mock_violation("%s(%p): a %s captured in a live model run instance uses this memory; "
                                      "destroy the model (aclmdlRIDestroy) before freeing it",
                                      api, devPtr, captured);
            }
            if (!r) {
                g_device_frees++;
                alloc_remove(a);
            }
        }
    }
    ACL_LEAVE();
}

static const char *copy_kind_name(int kind) {
    static const char *const names[] = {
        "ACL_MEMCPY_HOST_TO_HOST",         "ACL_MEMCPY_HOST_TO_DEVICE",         "ACL_MEMCPY_DEVICE_TO_HOST",
        "ACL_MEMCPY_DEVICE_TO_DEVICE",     "ACL_MEMCPY_DEFAULT",                "ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE",
        "ACL_MEMCPY_INNER_DEVICE_TO_DEVICE", "ACL_MEMCPY_INTER_DEVICE_TO_DEVICE",
    };
    return (kind >= 0 && kind < 8) ? names[kind] : "an invalid memcpy kind";
}

/* Checks one side of a copy; fills *range for a device side. */
static int copy_side(const char *api, const char *side, uintptr_t p, size_t count, int on_device, int kind,
                     ascend_mock_range *range, int *nranges) {
    if (on_device) {
        alloc *a = alloc_containing(p, count);
        if (!a) {
            return violate(ACL_ERROR_RT_PARAM_INVALID, api,
                           "%s range [%p, +%zu) of a %s copy is not inside one live device allocation", side,
                           (void *)p, count, copy_kind_name(kind));
        }
        range->addr = p;
        range->len = count;
        range->alloc_id = a->id;
        range->write = strcmp(side, "dst") == 0;
        range->name = range->write ? "the copy's destination" : "the copy's source";
        range->view = NULL;
        (*nranges)++;
    } else if (overlaps_any(p, count)) {
        return violate(ACL_ERROR_RT_PARAM_INVALID, api,
                       "%s range [%p, +%zu) of a %s copy is device memory, but the kind says host memory", side,
                       (void *)p, count, copy_kind_name(kind));
    }
    return 0;
}

/* Validates a copy (sync or async). Fills ranges[] with its device ranges. */
static int copy_check(const char *api, void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                      ascend_mock_range *ranges, int *nranges) {
    *nranges = 0;
    int k = (int)kind;
    if (k < 0 || k > 7) {
        return violate(ACL_ERROR_RT_PARAM_INVALID, api, "kind %d is not an aclrtMemcpyKind", k);
    }
    if (count == 0) {
        return 0;
    }
    if (!dst || !src) {
        return violate(ACL_ERROR_RT_PARAM_INVALID, api, "%s is null", dst ? "src" : "dst");
    }
    if (count > destMax) {
        return violate(ACL_ERROR_RT_PARAM_INVALID, api, "count %zu is greater than destMax %zu", count, destMax);
    }
    int dst_dev, src_dev;
    if (k == ACL_MEMCPY_DEFAULT) {
        dst_dev = overlaps_any((uintptr_t)dst, count);
        src_dev = overlaps_any((uintptr_t)src, count);
    } else {
        dst_dev = k != ACL_MEMCPY_HOST_TO_HOST && k != ACL_MEMCPY_DEVICE_TO_HOST;
        src_dev = k == ACL_MEMCPY_DEVICE_TO_HOST || k == ACL_MEMCPY_DEVICE_TO_DEVICE ||
                  k == ACL_MEMCPY_INNER_DEVICE_TO_DEVICE || k == ACL_MEMCPY_INTER_DEVICE_TO_DEVICE;
    }
    int r = copy_side(api, "dst", (uintptr_t)dst, count, dst_dev, k, &ranges[*nranges], nranges);
    ACL_STEP(copy_side(api, "src", (uintptr_t)src, count, src_dev, k, &ranges[*nranges], nranges));
    return r;
}

/* A copy done now, on the host's time (ranges as copy_check filled them): checked against the work
 * queued on every stream, refused when it reads poisoned bytes; counted as a blocking copy. */
static int copy_now(const char *api, void *dst, const void *src, size_t count, ascend_mock_range *ranges, int n) {
    g_blocking_copies++;
    if (!count) {
        return 0;
    }
    hazard_check(api, NULL, ranges, (size_t)n);
    char detail[MESSAGE_MAX - 64];
    for (int i = 0; i < n; i++) {
        if (!ranges[i].write && range_poisoned(&ranges[i], detail, sizeof detail)) {
            /* not a new violation: the misuse was counted when the task was skipped */
            detail[0] = (char)toupper((unsigned char)detail[0]);
            return fail(ACL_ERROR_RT_DEVICE_MEM_ERROR, api, "%s. Nothing was copied.", detail);
        }
    }
    memmove(dst, src, count);
    for (int i = 0; i < n; i++) {
        if (ranges[i].write) {
            range_written(&ranges[i]);
        }
    }
    return 0;
}

aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind) {
    ACL_ENTER("aclrtMemcpy", NULL, needs_device);
    ACL_STEP(capture_forbid_blocking(api));
    ascend_mock_range ranges[2];
    int n = 0;
    ACL_STEP(copy_check(api, dst, destMax, src, count, kind, ranges, &n));
    ACL_STEP(copy_now(api, dst, src, count, ranges, n));
    ACL_LEAVE();
}

static htab g_host_allocs; /* base address -> size (boxed) of aclrtMallocHost blocks */

/* Whether [p, p+count) lies inside one live aclrtMallocHost block. */
static int host_pinned(const void *p, size_t count) {
    uintptr_t lo = (uintptr_t)p;
    for (size_t i = 0; i < g_host_allocs.cap; i++) {
        uintptr_t base = (uintptr_t)g_host_allocs.keys[i];
        if (base && lo >= base && lo - base <= *(size_t *)g_host_allocs.vals[i] &&
            count <= *(size_t *)g_host_allocs.vals[i] - (lo - base)) {
            return 1;
        }
    }
    return 0;
}

/* aclrtMemcpyAsync. As on CANN (runtime docs 11-03, aclrtMemcpyAsync): a copy between two host
 * buffers is not supported (ACL_ERROR_RT_FEATURE_NOT_SUPPORT, a violation), and a copy whose host
 * side is pageable memory (not from aclrtMallocHost) is synchronous: the host waits for the work
 * queued on the stream, then copies (a blocking copy). A copy from or to pinned memory, or between
 * device buffers, is queued. */
aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                          aclrtStream h) {
    ACL_ENTER("aclrtMemcpyAsync", NULL, needs_device);
    stream *s = NULL;
    ACL_STEP(stream_resolve(api, h, &s));
    ascend_mock_range ranges[2];
    int n = 0;
    ACL_STEP(copy_check(api, dst, destMax, src, count, kind, ranges, &n));
    int dst_host = 1, src_host = 1;
    for (int i = 0; i < n; i++) {
        *(ranges[i].write ? &dst_host : &src_host) = 0;
    }
    if (!r && (kind == ACL_MEMCPY_HOST_TO_HOST || (count && dst_host && src_host))) {
        r = violate(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api,
                    "a copy from host memory %p to host memory %p is not supported (%s)", src, dst,
                    copy_kind_name((int)kind));
    }
    int pageable = (dst_host && !host_pinned(dst, count)) || (src_host && !host_pinned(src, count));
    if (!r && count && pageable && s->capturing) {
        r = violate(ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC, api,
                    "%s is being captured: an asynchronous copy from or to host memory must use aclrtMallocHost "
                    "memory (this one is pageable, so the copy would be synchronous)",
                    s->name);
    }
    if (!r && count && pageable) {
        r = drain_reported(api, s);
        /* the queue may have released the lock: check the copy again */
        ACL_STEP(copy_check(api, dst, destMax, src, count, kind, ranges, &n));
        ACL_STEP(copy_now(api, dst, src, count, ranges, n));
    } else if (!r && count) {
        hazard_check(api, s, ranges, (size_t)n);
        task *t = xcalloc(1, sizeof *t);
        t->kind = TASK_COPY;
        t->what = "aclrtMemcpyAsync";
        t->nranges = (size_t)n;
        memcpy(t->ranges, ranges, (size_t)n * sizeof *ranges);
        t->dst = dst;
        t->src = src;
        t->count = count;
        enqueue(s, t);
    }
    ACL_LEAVE();
}

aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count) {
    ACL_ENTER("aclrtMemset", NULL, needs_device);
    ACL_STEP(capture_forbid_blocking(api));
    if (!r && !devPtr) {
        r = violate(ACL_ERROR_RT_PARAM_INVALID, api, "devPtr is null");
    }
    if (!r && count > maxCount) {
        r = violate(ACL_ERROR_RT_PARAM_INVALID, api, "count %zu is greater than maxCount %zu", count, maxCount);
    }
    if (!r && count) {
        alloc *a = alloc_containing((uintptr_t)devPtr, count);
        if (!a) {
            r = violate(ACL_ERROR_RT_PARAM_INVALID, api, "range [%p, +%zu) is not inside one live device allocation",
                        devPtr, count);
        } else {
            ascend_mock_range range = {(uintptr_t)devPtr, count, a->id, 1, "the memset range", NULL};
            hazard_check(api, NULL, &range, 1);
            memset(devPtr, value & 0xFF, count);
            range_written(&range);
        }
    }
    ACL_LEAVE();
}

/* ---- events ----------------------------------------------------------------------------------------- */
static int event_resolve(const char *api, aclrtEvent h, event **out) {
    int state;
    event *e = ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_EVENT, (uint64_t)(uintptr_t)h, &state);
    if (!e) {
        return violate(ACL_ERROR_RT_INVALID_HANDLE, api, "event %p is %s", h, ascend_mock_state_text(state));
    }
    *out = e;
    return 0;
}

/* Runs the tasks of the stream the event was last recorded on, up to its marker. The event is
 * looked up again after each task: a task may release g_lock (another thread may destroy it). */
static int event_wait(const char *api, uint64_t handle) {
    int r = 0;
    char why[WHY_MAX] = "";
    for (;;) {
        event *e = event_get(handle);
        if (!e || e->completed_seq >= e->recorded_seq || !e->recorded_on || !e->recorded_on->head) {
            break;
        }
        stream *s = e->recorded_on;
        int st = run_head(s, why, sizeof why);
        if (st && !r) {
            r = sync_failed(api, st, s->name, why); /* s is alive: g_lock is held since run_head */
        }
    }
    return r;
}

/* Runs the tasks of the stream the event was last recorded on, up to its record, as the device would while the
 * host does something else: a failure is not reported here (the stream's next synchronize reports it). */
static int g_query_progress = 1; /* ascend_mock_set_query_progress */

static void event_progress(uint64_t handle) {
    while (g_query_progress) {
        event *e = event_get(handle);
        if (!e || e->completed_seq >= e->recorded_seq || !e->recorded_on || !e->recorded_on->head) {
            return;
        }
        stream *s = e->recorded_on;
        char why[WHY_MAX] = "";
        int st = run_head(s, why, sizeof why);
        if (st && !s->deferred_status) { /* s is alive: g_lock is held since run_head */
            s->deferred_status = st;
            snprintf(s->deferred_why, sizeof s->deferred_why, "%s", why);
        }
    }
}

/* Events made, destroyed, and live per device. */
static uint64_t g_events_created, g_events_destroyed, g_device_events[MAX_DEVICES];

/* aclrtCreateEvent, aclrtCreateEventWithFlag, aclrtCreateEventExWithFlag: a new event of the current device,
 * refused with ACL_ERROR_RT_NO_EVENT_RESOURCE when the device holds EVENT_LIMIT live events. (An ExWithFlag
 * event with ACL_EVENT_SYNC takes its resource at its first record on CANN; the mock counts it at creation.) */
static int event_create(const char *api, aclrtEvent *out, int kind, uint32_t flags) {
    int dev = current_device();
    if (flags & ~(uint32_t)(ACL_EVENT_SYNC | ACL_EVENT_CAPTURE_STREAM_PROGRESS | ACL_EVENT_TIME_LINE |
                            ACL_EVENT_DEVICE_USE_ONLY | ACL_EVENT_EXTERNAL | ACL_EVENT_IPC)) {
        *out = NULL;
        return fail(ACL_ERROR_INVALID_PARAM, api, "flag 0x%x has bits that are no ACL_EVENT_* flag.", flags);
    }
    if ((flags & ACL_EVENT_IPC) && flags != ACL_EVENT_IPC) {
        *out = NULL;
        return fail(ACL_ERROR_INVALID_PARAM, api, "ACL_EVENT_IPC cannot be combined with other flags (0x%x).", flags);
    }
    if (g_device_events[dev] >= EVENT_LIMIT) {
        *out = NULL;
        return violate(ACL_ERROR_RT_NO_EVENT_RESOURCE, api,
                       "device %d already holds %d live events, the most it supports: destroy events first", dev,
                       EVENT_LIMIT);
    }
    event *e = xcalloc(1, sizeof *e);
    e->device = dev;
    e->kind = kind;
    e->flags = flags;
    e->handle = ascend_mock_handle_new_locked(ASCEND_MOCK_KIND_EVENT, e);
    g_events_created++;
    g_device_events[dev]++;
    *out = (aclrtEvent)(uintptr_t)e->handle;
    return 0;
}

aclError aclrtCreateEvent(aclrtEvent *out) {
    ACL_ENTER("aclrtCreateEvent", out, needs_device);
    ACL_NOT_NULL(out, "event");
    ACL_STEP(event_create(api, out, EVENT_DEFAULT, 0));
    ACL_LEAVE();
}

aclError aclrtCreateEventWithFlag(aclrtEvent *out, uint32_t flag) {
    ACL_ENTER("aclrtCreateEventWithFlag", out, needs_device);
    ACL_NOT_NULL(out, "event");
    ACL_STEP(event_create(api, out, EVENT_WITH_FLAG, flag));
    ACL_LEAVE();
}

aclError aclrtCreateEventExWithFlag(aclrtEvent *out, uint32_t flag) {
    ACL_ENTER("aclrtCreateEventExWithFlag", out, needs_device);
    ACL_NOT_NULL(out, "event");
    ACL_STEP(event_create(api, out, EVENT_EX_WITH_FLAG, flag));
    ACL_LEAVE();
}

aclError aclrtDestroyEvent(aclrtEvent h) {
    ACL_ENTER("aclrtDestroyEvent", NULL, needs_device);
    event *e = NULL;
    ACL_STEP(event_resolve(api, h, &e));
    if (!r && capture_uses_event(e->handle)) {
        r = violate(ACL_ERROR_RT_EVENT_CAPTURED, api,
                    "event %p is recorded by a live model run instance: destroy the model (aclmdlRIDestroy) first", h);
    }
    for (stream *s = g_streams; s && !r; s = s->next) {
        for (task *t = s->head; t; t = t->next) {
            if (t->kind == TASK_EVENT_WAIT && t->event_handle == e->handle) {
                r = violate(ACL_ERROR_RT_PARAM_INVALID, api,
                            "event %p is still waited for by %s (aclrtStreamWaitEvent queued there has not run): "
                            "synchronize that stream before destroying the event",
                            h, s->name);
                break;
            }
        }
    }
    if (!r) {
        ascend_mock_handle_remove_locked(ASCEND_MOCK_KIND_EVENT, e->handle);
        g_events_destroyed++;
        g_device_events[e->device]--;
        free(e);
    }
    ACL_LEAVE();
}

/* The event's device is the stream's (`what`: "recorded on", "waited for by"): a violation otherwise. */
static int event_device_check(const char *api, aclrtEvent eh, const event *e, const stream *s, const char *what) {
    if (e->device != s->device) {
        return violate(ACL_ERROR_RT_STREAM_CONTEXT, api, "event %p of device %d %s %s of device %d", eh, e->device,
                       what, s->name, s->device);
    }
    return 0;
}

/* The event and the stream of a call that uses them together (`what` as in event_device_check). */
static int event_and_stream(const char *api, aclrtEvent eh, aclrtStream sh, const char *what, event **e, stream **s) {
    int r = event_resolve(api, eh, e);
    if (!r) {
        r = stream_resolve(api, sh, s);
    }
    return r ? r : event_device_check(api, eh, *e, *s, what);
}

aclError aclrtRecordEvent(aclrtEvent eh, aclrtStream sh) {
    ACL_ENTER("aclrtRecordEvent", NULL, needs_device);
    event *e = NULL;
    stream *s = NULL;
    ACL_STEP(event_and_stream(api, eh, sh, "recorded on", &e, &s));
    ACL_STEP(capture_event_outside(api, e->handle, s));
    if (!r && e->kind != EVENT_EX_WITH_FLAG && e->recorded_seq) {
        /* Re-recording overwrites the captured tasks only for aclrtCreateEventExWithFlag events (aclrtRecordEvent,
         * runtime docs/zh/api_ref/07_event_management.md); the others are reused through aclrtResetEvent. */
        r = violate(ACL_ERROR_RT_PARAM_INVALID, api,
                    "event %p (from %s) is recorded again without aclrtResetEvent in between; only events of "
                    "aclrtCreateEventExWithFlag are reused by recording them again",
                    eh, e->kind == EVENT_DEFAULT ? "aclrtCreateEvent" : "aclrtCreateEventWithFlag");
    }
    if (!r) {
        task *t = xcalloc(1, sizeof *t);
        t->kind = TASK_EVENT;
        t->what = "event record";
        t->event_handle = e->handle;
        if (s->capturing) {
            /* recorded into the model: each replay records the event (capture.c) */
        } else {
            t->event_seq = ++g_event_seq;
            e->recorded_seq = t->event_seq;
            e->recorded_on = s;
        }
        enqueue(s, t);
    }
    ACL_LEAVE();
}

aclError aclrtResetEvent(aclrtEvent eh, aclrtStream sh) {
    ACL_ENTER("aclrtResetEvent", NULL, needs_device);
    event *e = NULL;
    stream *s = NULL;
    ACL_STEP(event_and_stream(api, eh, sh, "reset on", &e, &s));
    ACL_STEP(capture_event_outside(api, e->handle, s));
    if (!r && e->kind == EVENT_EX_WITH_FLAG) {
        r = violate(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api,
                    "event %p comes from aclrtCreateEventExWithFlag, which aclrtResetEvent does not support (record "
                    "it again to reuse it)",
                    eh);
    }
    if (!r) {
        /* The mock device is in order: the reset takes effect now (the stream's earlier tasks may still complete
         * the old record, which no longer matches). The event is as new: recordable, never recorded. */
        e->recorded_seq = 0;
        e->completed_seq = 0;
        e->recorded_on = NULL;
    }
    ACL_LEAVE();
}

aclError aclrtSynchronizeEvent(aclrtEvent eh) {
    ACL_ENTER("aclrtSynchronizeEvent", NULL, needs_device);
    event *e = NULL;
    ACL_STEP(event_resolve(api, eh, &e));
    ACL_STEP(capture_forbid_event(api, e->handle));
    if (!r) {
        g_event_syncs++;
        r = event_wait(api, e->handle);
    }
    ACL_LEAVE();
}

aclError aclrtStreamWaitEvent(aclrtStream sh, aclrtEvent eh) {
    ACL_ENTER("aclrtStreamWaitEvent", NULL, needs_device);
    stream *s = NULL;
    event *e = NULL;
    ACL_STEP(event_and_stream(api, eh, sh, "waited for by", &e, &s));
    if (!r && e->kind == EVENT_EX_WITH_FLAG && !(e->flags & ACL_EVENT_SYNC)) {
        r = violate(ACL_ERROR_RT_PARAM_INVALID, api,
                    "event %p comes from aclrtCreateEventExWithFlag without ACL_EVENT_SYNC (flag 0x%x): it cannot be "
                    "waited for by a stream",
                    eh, e->flags);
    }
    if (!r && (s->capturing || capture_in_state(e->handle))) {
        /* A fork into a capture, a join back, or the capture's error (capture.c). */
        r = capture_wait(api, s, e);
        ACL_LEAVE();
    }
    if (!r && !e->recorded_seq) {
        /* ACL_ERROR_RT_INVALID_VALUE of the runtime's event design (docs/zh/design/modules/event/event.md 4.2),
         * which errcode_manage.cc maps to ACL_ERROR_RT_PARAM_INVALID. */
        r = violate(ACL_ERROR_RT_PARAM_INVALID, api, "event %p has never been recorded (since its last reset)", eh);
    }
    if (!r) {
        /* The mock device is in order: running the recorded work now is a valid schedule. The
         * waiting stream keeps a marker until it runs, so destroying the event before then (which
         * CANN forbids) is caught. */
        uint64_t handle = e->handle;
        r = event_wait(api, handle);
        task *t = xcalloc(1, sizeof *t);
        t->kind = TASK_EVENT_WAIT;
        t->what = "event wait";
        t->event_handle = handle;
        enqueue(s, t);
    }
    ACL_LEAVE();
}

aclError aclrtQueryEventStatus(aclrtEvent eh, aclrtEventRecordedStatus *status) {
    ACL_ENTER("aclrtQueryEventStatus", NULL, needs_device);
    event *e = NULL;
    ACL_STEP(event_resolve(api, eh, &e));
    ACL_STEP(capture_forbid_event(api, e->handle));
    ACL_NOT_NULL(status, "status");
    if (!r && e->recorded_seq) {
        /* The device progresses while the host queries: the recorded stream runs its tasks up to the record
         * (and no further), so an event can complete while later work of its stream is still queued. A task
         * that fails here is reported by the stream's next synchronize, as on hardware. */
        uint64_t handle = e->handle;
        event_progress(handle);
        e = event_get(handle);
        if (!e) {
            r = violate(ACL_ERROR_RT_INVALID_HANDLE, api, "event %p was destroyed while it was queried", eh);
        }
    }
    if (!r) {
        /* Never recorded: an ExWithFlag event is complete (aclrtRecordEvent's docs); the others NOT_READY, as
         * rtEventQueryStatus reports. */
        int done = e->recorded_seq ? e->completed_seq >= e->recorded_seq : e->kind == EVENT_EX_WITH_FLAG;
        *status = done ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    }
    ACL_LEAVE();
}

aclError aclrtEventElapsedTime(float *ms, aclrtEvent start, aclrtEvent end) {
    ACL_ENTER("aclrtEventElapsedTime", NULL, needs_device);
    event *a = NULL, *b = NULL;
    ACL_NOT_NULL(ms, "ms");
    ACL_STEP(event_resolve(api, start, &a));
    ACL_STEP(event_resolve(api, end, &b));
    if (!r) {
        const event *pending = (!a->recorded_seq || a->completed_seq < a->recorded_seq) ? a : b;
        if (!pending->recorded_seq || pending->completed_seq < pending->recorded_seq) {
            r = fail(ACL_ERROR_RT_PARAM_INVALID, api,
                     "The %s event %p has not completed (record it and synchronize first).",
                     pending == a ? "start" : "end", pending == a ? start : end);
        } else {
            *ms = (float)(b->completed_ms - a->completed_ms);
        }
    }
    ACL_LEAVE();
}

/* ---- pinned host memory ----------------------------------------------------------------------------- */
static uint64_t g_host_mallocs, g_live_host_allocs;

aclError aclrtMallocHost(void **hostPtr, size_t size) {
    ACL_ENTER("aclrtMallocHost", hostPtr, needs_device);
    ACL_NOT_NULL(hostPtr, "hostPtr");
    if (!r && size == 0) {
        r = fail(ACL_ERROR_INVALID_PARAM, api, "size is 0.");
    }
    if (!r) {
        void *p = malloc(size);
        if (!p) {
            r = fail(ACL_ERROR_RT_MEMORY_ALLOCATION, api, "Cannot allocate %zu bytes of host memory.", size);
            *hostPtr = NULL;
        } else {
            size_t *boxed = xcalloc(1, sizeof *boxed);
            *boxed = size;
            htab_put(&g_host_allocs, (uint64_t)(uintptr_t)p, boxed);
            g_host_mallocs++;
            g_live_host_allocs++;
            *hostPtr = p;
        }
    }
    ACL_LEAVE();
}

aclError aclrtFreeHost(void *hostPtr) {
    ACL_ENTER("aclrtFreeHost", NULL, needs_device);
    ACL_NOT_NULL(hostPtr, "hostPtr");
    size_t *boxed = NULL;
    if (!r) {
        boxed = htab_get(&g_host_allocs, (uint64_t)(uintptr_t)hostPtr);
        if (!boxed) {
            r = violate(ACL_ERROR_RT_PARAM_INVALID, api,
                        "%p is not a live aclrtMallocHost block (double free, or not from aclrtMallocHost)", hostPtr);
        }
    }
    if (!r) {
        uintptr_t lo = (uintptr_t)hostPtr, hi = lo + *boxed;
        for (stream *s = g_streams; s && !r; s = s->next) {
            for (task *t = s->head; t; t = t->next) {
                uintptr_t a = 0;
                if (t->kind == TASK_COPY) {
                    a = (uintptr_t)(t->nranges && t->ranges[0].write ? t->src : t->dst);
                }
                if (a && a < hi && a + t->count > lo) {
                    /* refused (the block stays allocated), so the queued copy stays memory-safe */
                    r = violate(ACL_ERROR_RT_PARAM_INVALID, api,
                                "%p: a %s queued on %s still uses this host memory; synchronize the stream (or an "
                                "event after the copy) before freeing",
                                hostPtr, t->what, s->name);
                    break;
                }
            }
        }
    }
    if (!r) {
        htab_del(&g_host_allocs, (uint64_t)(uintptr_t)hostPtr);
        free(boxed);
        free(hostPtr);
        g_live_host_allocs--;
    }
    ACL_LEAVE();
}

/* ---- introspection ------------------------------------------------------------------------------------ */
void ascend_mock_get_stats(ascend_mock_stats *out) {
    if (!out) {
        return;
    }
    ascend_mock_lock();
    out->live_allocations = g_nallocs;
    out->live_tensors = g_live[ASCEND_MOCK_KIND_TENSOR];
    out->live_executors = g_live[ASCEND_MOCK_KIND_EXECUTOR];
    out->live_streams = g_live[ASCEND_MOCK_KIND_STREAM];
    out->live_events = g_live[ASCEND_MOCK_KIND_EVENT];
    out->device_mallocs = g_device_mallocs;
    out->queued_tasks = g_queued_tasks;
    out->poisoned_bytes = g_poisoned_bytes;
    out->live_comms = g_live_comms;
    out->stream_synchronizes = g_stream_syncs;
    out->event_synchronizes = g_event_syncs;
    out->device_synchronizes = g_device_syncs;
    out->device_frees = g_device_frees;
    out->blocking_copies = g_blocking_copies;
    out->host_mallocs = g_host_mallocs;
    out->live_host_allocations = g_live_host_allocs;
    out->all_reduces = g_collectives[1];
    out->all_gathers = g_collectives[2];
    out->broadcasts = g_collectives[3];
    out->events_created = g_events_created;
    out->events_destroyed = g_events_destroyed;
    ascend_mock_unlock();
    out->violations = ascend_mock_violation_count();
}

int ascend_mock_set_device_count(int count, int *busy_device) {
    if (count < 0 || count > MAX_DEVICES) {
        return -1;
    }
    ascend_mock_lock();
    int busy = -1;
    for (int dev = count; dev < MAX_DEVICES && busy < 0; dev++) {
        if (device_in_use(dev)) {
            busy = dev;
        }
    }
    if (busy < 0) {
        g_device_count_set = count;
        if (g_initialized) {
            g_device_count = count;
        }
    }
    ascend_mock_unlock();
    if (busy >= 0 && busy_device) {
        *busy_device = busy;
    }
    return busy < 0 ? 0 : -2;
}

int ascend_mock_set_query_progress(int on) {
    ascend_mock_lock();
    int was = g_query_progress;
    g_query_progress = on != 0;
    ascend_mock_unlock();
    return was;
}

uint64_t ascend_mock_device_live_events(int device) {
    if (device < 0 || device >= MAX_DEVICES) {
        return 0;
    }
    ascend_mock_lock();
    uint64_t n = g_device_events[device];
    ascend_mock_unlock();
    return n;
}

uint64_t ascend_mock_thread_device_mallocs(void) {
    return tls_mallocs;
}

void ascend_mock_count_comms_locked(int delta) {
    g_live_comms = (uint64_t)((int64_t)g_live_comms + delta);
}

void ascend_mock_count_collective_locked(int kind) {
    if (kind >= 1 && kind <= 3) {
        g_collectives[kind]++;
    }
}
