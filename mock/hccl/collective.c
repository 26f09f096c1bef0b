/*
 * Mock CANN, libhccl.so: the collectives (HcclAllReduce, HcclAllGather, HcclBroadcast). Checked
 * when called, queued as a waiting task, run in rounds through the group's segment (see internal.h).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "half.h"
#include "internal.h"

/* ---- collectives: the task ------------------------------------------------------------------------------ */
typedef struct coll_task {
    comm *c;
    const char *api;
    coll_desc d;
    uint64_t es;
    uint64_t bytes; /* each rank's contribution: count * es */
    uint8_t *send, *recv;
    uint64_t send_id, recv_id;
    int contributes; /* reads send */
    int writes;      /* writes recv */
} coll_task;

static const char *coll_name(uint32_t kind) {
    return kind == COLL_ALL_REDUCE ? "HcclAllReduce" : kind == COLL_ALL_GATHER ? "HcclAllGather" : "HcclBroadcast";
}

static void desc_text(const coll_desc *d, char *buf, size_t cap) {
    if (d->kind == COLL_ALL_REDUCE) {
        snprintf(buf, cap, "HcclAllReduce(count %llu, %s, %s)", (unsigned long long)d->count, dtype_name((int)d->dtype),
                 op_name((int)d->op));
    } else if (d->kind == COLL_BROADCAST) {
        snprintf(buf, cap, "HcclBroadcast(count %llu, %s, root %u)", (unsigned long long)d->count,
                 dtype_name((int)d->dtype), d->root);
    } else {
        snprintf(buf, cap, "%s(count %llu, %s)", coll_name(d->kind), (unsigned long long)d->count,
                 dtype_name((int)d->dtype));
    }
}

static int desc_equal(const coll_desc *a, const coll_desc *b) {
    return a->kind == b->kind && a->count == b->count && a->dtype == b->dtype &&
           (a->kind != COLL_ALL_REDUCE || a->op == b->op) && (a->kind != COLL_BROADCAST || a->root == b->root);
}

enum { WAIT_DONE, WAIT_ARRIVED };

/* Waits (with the mock's lock released) until every rank's `done` (or `arrived`) reaches R.
 * Returns 0, or the task's failure status (why filled): a timeout, or the group is broken. */
static int wait_all(comm *c, const coll_task *k, int what, uint64_t R, char *why, size_t cap) {
    group_hdr *g = c->g;
    ascend_mock_unlock();
    uint64_t deadline = now_ns() + c->exec_timeout_s * NS;
    int status = 0;
    glock(g);
    for (;;) {
        if (g->broken) {
            status = ACL_ERROR_RT_AICORE_EXCEPTION;
            snprintf(why, cap, "%s #%llu of rank %u cannot run: the communicator's group is broken: %s", k->api,
                     (unsigned long long)k->d.seq, c->rank, g->broken_why);
            break;
        }
        uint32_t missing = c->nranks;
        for (uint32_t j = 0; j < c->nranks; j++) {
            uint64_t v = what == WAIT_DONE ? g->ranks[j].done : g->ranks[j].arrived;
            if (v < R) {
                missing = j;
                break;
            }
        }
        if (missing == c->nranks) {
            break;
        }
        if (g->ranks[missing].left) {
            mark_broken(g, "rank %u destroyed its communicator while rank %u waited for it in %s #%llu", missing,
                        c->rank, k->api, (unsigned long long)k->d.seq);
            continue;
        }
        if (rank_vanished(g, missing)) {
            mark_broken(g, "rank %u (process %d) exited while rank %u waited for it in %s #%llu", missing,
                        (int)g->ranks[missing].pid, c->rank, k->api, (unsigned long long)k->d.seq);
            continue;
        }
        if (now_ns() >= deadline) {
            status = ACL_ERROR_RT_TASK_TIMEOUT;
            snprintf(why, cap,
                     "%s #%llu of rank %u timed out after %llu s (HCCL_EXEC_TIMEOUT) waiting for rank %u, which never "
                     "ran its matching collective (not issued, or its stream was not synchronized)",
                     k->api, (unsigned long long)k->d.seq, c->rank, (unsigned long long)c->exec_timeout_s, missing);
            mark_broken(g, "%s", why);
            break;
        }
        gwait(g, deadline);
    }
    gunlock(g);
    ascend_mock_lock();
    return status;
}

/* Publishes this rank's state for round R. */
static void publish(comm *c, const coll_task *k, uint64_t R, int failed, const char *reason, int done) {
    group_hdr *g = c->g;
    glock(g);
    rank_state *rs = &g->ranks[c->rank];
    if (done) {
        rs->done = R;
    } else {
        rs->desc = k->d;
        rs->failed = failed;
        snprintf(rs->why, sizeof rs->why, "%s", failed ? reason : "");
        rs->arrived = R;
    }
    pthread_cond_broadcast(&g->cv);
    gunlock(g);
}

static float fmax_nan(float a, float b) {
    return (a != a) ? a : (b != b) ? b : (a > b ? a : b);
}

static float fmin_nan(float a, float b) {
    return (a != a) ? a : (b != b) ? b : (a < b ? a : b);
}

static float load_float(int dt, const uint8_t *p) {
    uint16_t h;
    float f;
    if (dt == HCCL_DATA_TYPE_FP32) {
        memcpy(&f, p, sizeof f);
        return f;
    }
    memcpy(&h, p, sizeof h);
    return dt == HCCL_DATA_TYPE_FP16 ? mock_f16_to_f32(h) : mock_bf16_to_f32(h);
}

static void store_float(int dt, uint8_t *p, float f) {
    uint16_t h;
    if (dt == HCCL_DATA_TYPE_FP32) {
        memcpy(p, &f, sizeof f);
        return;
    }
    h = dt == HCCL_DATA_TYPE_FP16 ? mock_f32_to_f16(f) : mock_f32_to_bf16(f);
    memcpy(p, &h, sizeof h);
}

#define REDUCE_INT(T)                                                                                                  \
    for (uint64_t i = 0; i < m; i++) {                                                                                 \
        T a;                                                                                                           \
        memcpy(&a, slot(g, 0) + i * sizeof(T), sizeof a);                                                              \
        for (uint32_t j = 1; j < n; j++) {                                                                             \
            T b;                                                                                                       \
            memcpy(&b, slot(g, j) + i * sizeof(T), sizeof b);                                                          \
            switch (op) {                                                                                              \
            case HCCL_REDUCE_SUM:                                                                                      \
                a = (T)((uint64_t)a + (uint64_t)b);                                                                    \
                break;                                                                                                 \
            case HCCL_REDUCE_PROD:                                                                                     \
                a = (T)((uint64_t)a * (uint64_t)b);                                                                    \
                break;                                                                                                 \
            case HCCL_REDUCE_MAX:                                                                                      \
                a = a > b ? a : b;                                                                                     \
                break;                                                                                                 \
            default:                                                                                                   \
                a = a < b ? a : b;                                                                                     \
                break;                                                                                                 \
            }                                                                                                          \
        }                                                                                                              \
        memcpy(out + i * sizeof(T), &a, sizeof a);                                                                     \
    }

/* out[0..len) = the reduction, in rank order, of every rank's slot (len bytes each). Floats are
 * reduced in f32 and rounded once (fp16/bf16); integers wrap around. */
static void reduce_slots(group_hdr *g, uint32_t n, int dt, int op, uint64_t len, uint8_t *out) {
    switch (dt) {
    case HCCL_DATA_TYPE_INT8: {
        uint64_t m = len;
        REDUCE_INT(int8_t)
        break;
    }
    case HCCL_DATA_TYPE_INT16: {
        uint64_t m = len / 2;
        REDUCE_INT(int16_t)
        break;
    }
    case HCCL_DATA_TYPE_INT32: {
        uint64_t m = len / 4;
        REDUCE_INT(int32_t)
        break;
    }
    case HCCL_DATA_TYPE_INT64: {
        uint64_t m = len / 8;
        REDUCE_INT(int64_t)
        break;
    }
    default: {
        uint64_t es = dtype_size(dt);
        uint64_t m = len / es;
        for (uint64_t i = 0; i < m; i++) {
            float a = load_float(dt, slot(g, 0) + i * es);
            for (uint32_t j = 1; j < n; j++) {
                float b = load_float(dt, slot(g, j) + i * es);
                switch (op) {
                case HCCL_REDUCE_SUM:
                    a = a + b;
                    break;
                case HCCL_REDUCE_PROD:
                    a = a * b;
                    break;
                case HCCL_REDUCE_MAX:
                    a = fmax_nan(a, b);
                    break;
                default:
                    a = fmin_nan(a, b);
                    break;
                }
            }
            store_float(dt, out + i * es, a);
        }
        break;
    }
    }
}

/* Whether k's buffer `what` (allocation `id`, at p) is still alive on c's rank; if it was freed while
 * the collective ran, counts the violation and says so in local. */
static int buffer_alive(const comm *c, const coll_task *k, uint64_t id, const char *what, const uint8_t *p, char *local,
                        size_t cap) {
    if (ascend_mock_mem_live_locked(id)) {
        return 1;
    }
    ascend_mock_violation("%s #%llu (rank %u): the device memory of %s %p was freed while the collective ran", k->api,
                          (unsigned long long)k->d.seq, c->rank, what, (const void *)p);
    snprintf(local, cap, "rank %u's %s was freed while the collective ran", c->rank, what);
    return 0;
}

/* The body of a collective's task (see ascend_mock_wait_fn): the lock is held on entry and exit. */
static int coll_run(void *payload, int skip_status, const char *skip_reason, char *why, size_t cap) {
    coll_task *k = payload;
    comm *c = k->c;
    group_hdr *g = c->g;
    char local[256] = "";
    int local_failed = 0;
    if (skip_status) {
        local_failed = 1;
        snprintf(local, sizeof local, "rank %u's task was skipped: %.200s", c->rank, skip_reason);
    }
    if (c->running) {
        ascend_mock_violation("%s #%llu (rank %u): another collective of this communicator is running on another "
                              "stream at the same time; HCCL requires the collectives of a communicator to be "
                              "issued and run serially (one stream, or streams ordered by events)",
                              k->api, (unsigned long long)k->d.seq, c->rank);
        glock(g);
        mark_broken(g, "rank %u ran two collectives of its communicator at the same time", c->rank);
        gunlock(g);
        snprintf(why, cap, "%s #%llu of rank %u ran while another collective of its communicator was running",
                 k->api, (unsigned long long)k->d.seq, c->rank);
        return ACL_ERROR_RT_AICORE_EXCEPTION;
    }
    c->ran++;
    if (k->d.seq != c->ran) {
        ascend_mock_violation("%s #%llu (rank %u) runs as collective #%llu of its communicator: the collectives of a "
                              "communicator must run in the order they were issued (one stream, or streams ordered "
                              "by events)",
                              k->api, (unsigned long long)k->d.seq, c->rank, (unsigned long long)c->ran);
    }
    c->running = 1;
    uint64_t chunk = g->chunk;
    uint64_t rounds = k->bytes ? (k->bytes + chunk - 1) / chunk : 1;
    int status = 0;
    int peer_failed = 0;
    char peer_why[300] = "";
    for (uint64_t r = 0; r < rounds && !status; r++) {
        uint64_t R = c->round + 1;
        /* everyone has read round R-1: the slots may be overwritten */
        status = wait_all(c, k, WAIT_DONE, R - 1, why, cap);
        if (status) {
            break;
        }
        uint64_t off = r * chunk;
        uint64_t len = k->bytes - off < chunk ? k->bytes - off : chunk;
        if (!local_failed && k->contributes) {
            if (!buffer_alive(c, k, k->send_id, "sendBuf", k->send, local, sizeof local)) {
                local_failed = 1;
            } else {
                memcpy(slot(g, c->rank), k->send + off, len);
            }
        }
        publish(c, k, R, local_failed, local, 0);
        c->round = R;
        status = wait_all(c, k, WAIT_ARRIVED, R, why, cap);
        if (status) {
            break;
        }
        /* every rank's contribution of round R is there and stays until everyone is done with R */
        if (r == 0) {
            for (uint32_t j = 0; j < c->nranks; j++) {
                if (!desc_equal(&g->ranks[j].desc, &k->d)) {
                    char mine[160], theirs[160];
                    desc_text(&k->d, mine, sizeof mine);
                    desc_text(&g->ranks[j].desc, theirs, sizeof theirs);
                    snprintf(why, cap,
                             "collective #%llu of the group does not match across ranks: rank %u runs %s, rank %u "
                             "runs %s (every rank must issue the same collectives, in the same order, with the same "
                             "count, dtype, op and root)",
                             (unsigned long long)k->d.seq, c->rank, mine, j, theirs);
                    status = ACL_ERROR_RT_AICORE_EXCEPTION;
                    break;
                }
            }
            if (status) {
                /* one violation per process (its lowest rank counts it), whatever rank found it */
                int lowest = 1;
                for (uint32_t j = 0; j < c->rank; j++) {
                    lowest &= g->ranks[j].pid != (int32_t)getpid();
                }
                if (lowest) {
                    ascend_mock_violation("%s", why);
                }
                publish(c, k, R, 0, NULL, 1);
                break;
            }
        }
        for (uint32_t j = 0; j < c->nranks && !peer_failed; j++) {
            if (j != c->rank && g->ranks[j].failed) {
                peer_failed = 1;
                snprintf(peer_why, sizeof peer_why, "rank %u's part failed: %.250s", j, g->ranks[j].why);
            }
        }
        if (!local_failed && !peer_failed && k->writes) {
            if (!buffer_alive(c, k, k->recv_id, "recvBuf", k->recv, local, sizeof local)) {
                local_failed = 1;
            } else if (k->d.kind == COLL_ALL_REDUCE) {
                reduce_slots(g, c->nranks, (int)k->d.dtype, (int)k->d.op, len, k->recv + off);
            } else if (k->d.kind == COLL_ALL_GATHER) {
                for (uint32_t j = 0; j < c->nranks; j++) {
                    memcpy(k->recv + (uint64_t)j * k->bytes + off, slot(g, j), len);
                }
            } else {
                memcpy(k->recv + off, slot(g, k->d.root), len);
            }
        }
        publish(c, k, R, 0, NULL, 1);
    }
    c->running = 0;
    if (!status && local_failed) {
        status = ACL_ERROR_RT_AICORE_EXCEPTION;
        snprintf(why, cap, "%s #%llu: %s", k->api, (unsigned long long)k->d.seq, local);
    } else if (!status && peer_failed) {
        status = ACL_ERROR_RT_AICORE_EXCEPTION;
        snprintf(why, cap, "%s #%llu of rank %u failed: %s", k->api, (unsigned long long)k->d.seq, c->rank, peer_why);
    }
    return status;
}

static void coll_drop(void *payload) {
    coll_task *k = payload;
    k->c->queued--;
    free(k);
}

/* A replay of a captured collective: issued again (the next collective of its communicator). */
static void *coll_clone(void *payload) {
    coll_task *k = malloc(sizeof *k);
    if (!k) {
        fprintf(stderr, "ascend mock CANN: out of host memory\n");
        abort();
    }
    *k = *(coll_task *)payload;
    k->d.seq = ++k->c->issued;
    k->c->queued++;
    return k;
}

/* ---- collectives: the calls ------------------------------------------------------------------------------ */
/* Checks that [p, p + bytes) lies in one live allocation of the communicator's device, aligned
 * for the dtype. */
static HcclResult check_buffer(const char *api, const comm *c, const char *name, const void *p, uint64_t bytes,
                               uint64_t es, uint64_t *alloc_id) {
    if (!ascend_mock_mem_find_locked(p, bytes, alloc_id, NULL, NULL)) {
        return hviolate(HCCL_E_PARA, api, "%s [%p, +%llu) is not inside one live device allocation", name, p,
                        (unsigned long long)bytes);
    }
    int dev = ascend_mock_mem_device_locked(*alloc_id);
    if (dev != c->device) {
        return hviolate(HCCL_E_PARA, api, "%s %p is memory of device %d, but the communicator (rank %u) is on device %d",
                        name, p, dev, c->rank, c->device);
    }
    uint64_t align = es < 8 ? es : 8;
    if ((uintptr_t)p % align) {
        return hviolate(HCCL_E_PARA, api, "%s %p is not aligned to %llu bytes, as its dtype requires", name, p,
                        (unsigned long long)align);
    }
    return HCCL_SUCCESS;
}

static HcclResult collective(const char *api, uint32_t kind, void *send, void *recv, uint64_t count, int dt, int op,
                             uint32_t root, HcclComm h, aclrtStream stream) {
    MOCK_ENTER(api, NULL);
    if (count == 0) {
        return HCCL_SUCCESS; /* HCCL returns before any other check, and queues nothing */
    }
    if (!h) {
        return hfail(HCCL_E_PTR, api, "comm is null.");
    }
    if (!send) {
        return hfail(HCCL_E_PTR, api, "%s is null.", kind == COLL_BROADCAST ? "buf" : "sendBuf");
    }
    if (!recv) {
        return hfail(HCCL_E_PTR, api, "recvBuf is null.");
    }
    if (!stream) {
        return hfail(HCCL_E_PTR, api, "stream is null.");
    }
    if (count > SYS_MAX_COUNT) {
        return hfail(HCCL_E_PARA, api, "count %llu is greater than %llu.", (unsigned long long)count, SYS_MAX_COUNT);
    }
    uint64_t es = dtype_size(dt);
    if (kind == COLL_ALL_REDUCE) {
        if (op < HCCL_REDUCE_SUM || op > HCCL_REDUCE_MIN) {
            return hfail(HCCL_E_NOT_SUPPORT, api, "op %d is not supported.", op);
        }
        if (!reduce_dtype_supported(dt)) {
            return hfail(HCCL_E_NOT_SUPPORT, api, "data type %s (%d) is not supported by reductions.", dtype_name(dt),
                         dt);
        }
        if (op == HCCL_REDUCE_PROD && (dt == HCCL_DATA_TYPE_INT16 || dt == HCCL_DATA_TYPE_BFP16)) {
            return hfail(HCCL_E_NOT_SUPPORT, api, "PROD does not support data type %s.", dtype_name(dt));
        }
    } else if (!es) {
        return hfail(HCCL_E_NOT_SUPPORT, api, "data type %s (%d) is not supported.", dtype_name(dt), dt);
    }
    ascend_mock_lock();
    comm *c = NULL;
    HcclResult r = comm_lookup_locked(api, h, &c);
    if (!r && kind == COLL_BROADCAST && root >= c->nranks) {
        r = hfail(HCCL_E_PARA, api, "root %u is not below the rank size %u.", root, c->nranks);
    }
    if (!r) {
        int acl = ascend_mock_runtime_ready_locked(api);
        if (acl) {
            r = hfail(HCCL_E_RUNTIME, api, "The runtime rejected the call: ACL error %d (see the violation).", acl);
        }
    }
    if (!r && ascend_mock_current_device_locked() != c->device) {
        r = hviolate(HCCL_E_PARA, api,
                     "the calling thread's current device is %d, but communicator %p (rank %u) belongs to device %d",
                     ascend_mock_current_device_locked(), h, c->rank, c->device);
    }
    if (!r) {
        int acl = ascend_mock_stream_check_locked(api, stream);
        if (acl) {
            r = hfail(HCCL_E_RUNTIME, api, "The runtime rejected the stream: ACL error %d (see the violation).", acl);
        }
    }
    uint64_t bytes = count * es; /* count <= 2^35, es <= 8: no overflow */
    uint64_t recv_bytes = (!r && kind == COLL_ALL_GATHER) ? bytes * c->nranks : bytes;
    uint64_t send_id = 0, recv_id = 0;
    if (!r) {
        r = check_buffer(api, c, kind == COLL_BROADCAST ? "buf" : "sendBuf", send, bytes, es, &send_id);
    }
    if (!r && kind != COLL_BROADCAST) {
        r = check_buffer(api, c, "recvBuf", recv, recv_bytes, es, &recv_id);
    }
    if (!r) {
        coll_task *k = calloc(1, sizeof *k);
        if (!k) {
            fprintf(stderr, "ascend mock CANN: out of host memory\n");
            abort();
        }
        k->c = c;
        k->api = coll_name(kind);
        k->d.kind = kind;
        k->d.dtype = (uint32_t)dt;
        k->d.op = kind == COLL_ALL_REDUCE ? (uint32_t)op : 0;
        k->d.root = kind == COLL_BROADCAST ? root : 0;
        k->d.count = count;
        /* a captured collective is issued by each replay (coll_clone), not by the capture */
        k->d.seq = ascend_mock_stream_capturing_locked(stream) ? 0 : ++c->issued;
        k->es = es;
        k->bytes = bytes;
        k->send = send;
        k->recv = recv;
        k->send_id = send_id;
        k->recv_id = kind == COLL_BROADCAST ? send_id : recv_id;
        k->contributes = kind != COLL_BROADCAST || root == c->rank;
        k->writes = kind != COLL_BROADCAST || root != c->rank;
        ascend_mock_range ranges[2];
        size_t n = 0;
        if (k->contributes) {
            ranges[n++] = (ascend_mock_range){(uintptr_t)send, bytes, send_id, 0,
                                              kind == COLL_BROADCAST ? "buf" : "sendBuf", NULL};
        }
        if (k->writes) {
            ranges[n++] = (ascend_mock_range){(uintptr_t)recv, recv_bytes, k->recv_id, 1,
                                              kind == COLL_BROADCAST ? "buf" : "recvBuf", NULL};
        }
        c->queued++;
        ascend_mock_count_collective_locked((int)kind);
        ascend_mock_enqueue_waiting_locked(k->api, stream, ranges, n, coll_run, coll_drop, coll_clone, k);
    }
    ascend_mock_unlock();
    return r;
}

HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op,
                         HcclComm comm, aclrtStream stream) {
    return collective("HcclAllReduce", COLL_ALL_REDUCE, sendBuf, recvBuf, count, (int)dataType, (int)op, 0, comm,
                      stream);
}

HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType dataType, HcclComm comm,
                         aclrtStream stream) {
    return collective("HcclAllGather", COLL_ALL_GATHER, sendBuf, recvBuf, sendCount, (int)dataType, 0, 0, comm,
                      stream);
}

HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm,
                         aclrtStream stream) {
    return collective("HcclBroadcast", COLL_BROADCAST, buf, buf, count, (int)dataType, 0, root, comm, stream);
}
