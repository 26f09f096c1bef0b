/*
 * Mock CANN, libhccl.so: communicators. HcclGetRootInfo, HcclCommInitRootInfo, HcclCommInitAll
 * (one thread per device), HcclCommDestroy, the queries and HcclGetCommAsyncError.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* ---- communicators (process-local; protected by the mock's global lock) -------------------------------- */
static comm *g_comms;
static uint64_t g_next_comm = 1;

static comm *comm_get_locked(HcclComm h, int *state) {
    uint64_t v = (uint64_t)(uintptr_t)h;
    for (comm *c = g_comms; c; c = c->next) {
        if (c->handle == v) {
            *state = ASCEND_MOCK_LIVE;
            return c;
        }
    }
    uint64_t id = (v >> 3) & ((1ULL << 45) - 1);
    *state = ((v >> 48) == COMM_TAG && !(v & 7) && id > 0 && id < g_next_comm) ? ASCEND_MOCK_DESTROYED
                                                                               : ASCEND_MOCK_UNKNOWN;
    return NULL;
}

static const char *comm_state_text(int state) {
    return state == ASCEND_MOCK_DESTROYED ? "already destroyed (use after HcclCommDestroy)"
                                          : "not a communicator this library made";
}

/* Looks a communicator up for `api`: NULL → HCCL_E_PTR; unknown or destroyed → a violation and
 * HCCL_E_PARA. */
HcclResult comm_lookup_locked(const char *api, HcclComm h, comm **out) {
    if (!h) {
        return hfail(HCCL_E_PTR, api, "comm is null.");
    }
    int state;
    *out = comm_get_locked(h, &state);
    if (!*out) {
        return hviolate(HCCL_E_PARA, api, "communicator %p is %s", h, comm_state_text(state));
    }
    return HCCL_SUCCESS;
}

static void comm_free(comm *c) {
    munmap(c->g, c->map_size);
    free(c);
}

/* ---- HcclGetRootInfo ------------------------------------------------------------------------------- */
HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo) {
    static const char api[] = "HcclGetRootInfo";
    MOCK_ENTER(api, NULL);
    if (!rootInfo) {
        return hfail(HCCL_E_PTR, api, "rootInfo is null.");
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    ascend_mock_unlock();
    if (r) {
        return hfail(HCCL_E_RUNTIME, api, "The runtime is not ready (aclInit, then aclrtSetDevice on this thread): ACL error %d.", r);
    }
    make_root_info(rootInfo);
    return HCCL_SUCCESS;
}

/* ---- HcclCommInitRootInfo ------------------------------------------------------------------------------ */
/* Joins rank `rank` of the group of `ri` from the calling thread (its current device). `cancel`
 * (HcclCommInitAll) makes the wait give up when another rank failed. */
static HcclResult init_rank(const char *api, uint32_t nranks, const HcclRootInfo *ri, uint32_t rank, HcclComm *out,
                            const int *cancel, int resets_device) {
    if (!ri) {
        return hfail(HCCL_E_PTR, api, "rootInfo is null.");
    }
    if (!out) {
        return hfail(HCCL_E_PTR, api, "comm is null.");
    }
    *out = NULL;
    if (nranks == 0) {
        return hfail(HCCL_E_PARA, api, "nRanks is 0.");
    }
    if (rank >= nranks) {
        return hfail(HCCL_E_PARA, api, "rank %u is not below nRanks %u.", rank, nranks);
    }
    if (nranks > MAX_RANKS) {
        return hfail(HCCL_E_PARA, api, "nRanks %u: the mock supports at most %d ranks per group.", nranks, MAX_RANKS);
    }
    root_blob rb;
    const char *bad = parse_root_info(ri, &rb);
    if (bad) {
        return hviolate(HCCL_E_PARA, api, "the root info is not one HcclGetRootInfo made: %s", bad);
    }
    if (rb.layout != sizeof(group_hdr)) {
        return hviolate(HCCL_E_PARA, api, "the root info comes from another build of the mock");
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    int device = ascend_mock_current_device_locked();
    HcclResult dup = HCCL_SUCCESS;
    for (comm *c = g_comms; c && !r; c = c->next) {
        if (memcmp(c->id, rb.id, sizeof c->id) == 0) {
            dup = hviolate(HCCL_E_PARA, api,
                           "rank %u joins a group whose %u ranks have all joined already (rank %u of it is alive in "
                           "this process): a rank joined twice?",
                           rank, c->nranks, c->rank);
            break;
        }
    }
    long connect_s = env_long("HCCL_CONNECT_TIMEOUT", CONNECT_DEFAULT_S, 1, 7200);
    long exec_s = env_long("HCCL_EXEC_TIMEOUT", EXEC_DEFAULT_S, 1, 7200);
    ascend_mock_unlock();
    if (r) {
        return hfail(HCCL_E_RUNTIME, api, "The runtime is not ready (aclInit, then aclrtSetDevice on this thread): ACL error %d.", r);
    }
    if (dup) {
        return dup;
    }
    group_hdr *g = NULL;
    int offender = 0;
    char why[512];
    HcclResult code = group_join(&rb, nranks, rank, device, connect_s, cancel, &g, &offender, why, sizeof why);
    if (code) {
        return offender ? hviolate(code, api, "%s", why) : hfail(code, api, "%s", why);
    }
    comm *c = calloc(1, sizeof *c);
    if (!c) {
        fprintf(stderr, "ascend mock CANN: out of host memory\n");
        abort();
    }
    c->rank = rank;
    c->nranks = nranks;
    c->device = device;
    c->resets_device = resets_device;
    c->g = g;
    c->map_size = g->size;
    memcpy(c->id, rb.id, sizeof c->id);
    c->exec_timeout_s = (uint64_t)exec_s;
    ascend_mock_lock();
    c->handle = (COMM_TAG << 48) | (g_next_comm++ << 3);
    c->next = g_comms;
    g_comms = c;
    ascend_mock_count_comms_locked(1);
    ascend_mock_unlock();
    *out = (HcclComm)(uintptr_t)c->handle;
    return HCCL_SUCCESS;
}

HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, HcclComm *comm) {
    static const char api[] = "HcclCommInitRootInfo";
    MOCK_ENTER(api, comm);
    return init_rank(api, nRanks, rootInfo, rank, comm, NULL, 0);
}

/* ---- HcclCommDestroy ------------------------------------------------------------------------------------ */
/* Removes a communicator (lock held); returns it for comm_release. */
static comm *comm_unlink_locked(comm *c) {
    for (comm **p = &g_comms; *p; p = &(*p)->next) {
        if (*p == c) {
            *p = c->next;
            break;
        }
    }
    ascend_mock_count_comms_locked(-1);
    glock(c->g);
    c->g->ranks[c->rank].left = 1; /* its peers' collectives waiting for it fail now */
    pthread_cond_broadcast(&c->g->cv);
    gunlock(c->g);
    return c;
}

/* Frees an unlinked communicator (without the lock: it may reset its device). */
static void comm_release(comm *c) {
    int dev = c->device, reset = c->resets_device;
    comm_free(c);
    if (reset) {
        aclrtResetDevice(dev);
    }
}

HcclResult HcclCommDestroy(HcclComm h) {
    static const char api[] = "HcclCommDestroy";
    MOCK_ENTER(api, NULL);
    if (!h) {
        return HCCL_SUCCESS; /* HCCL warns and succeeds */
    }
    ascend_mock_lock();
    comm *c = NULL;
    HcclResult r = comm_lookup_locked(api, h, &c);
    if (!r && c->queued) {
        r = hviolate(HCCL_E_AGAIN, api,
                     "communicator %p (rank %u of %u) has %llu collective(s) queued on a stream that has not run "
                     "them: synchronize the stream before destroying the communicator (it is still alive)",
                     h, c->rank, c->nranks, (unsigned long long)c->queued);
    }
    if (!r) {
        comm_unlink_locked(c);
    }
    ascend_mock_unlock();
    if (!r) {
        comm_release(c);
    }
    return r;
}

/* ---- HcclCommInitAll --------------------------------------------------------------------------------- */
typedef struct init_all_rank {
    uint32_t ndev, rank;
    int32_t device;
    const HcclRootInfo *ri;
    int *cancel;
    HcclComm comm;
    HcclResult code;
    int cause; /* failed for its own reason (not because another rank did) */
    char why[MSG_MAX];
} init_all_rank;

static void *init_all_thread(void *arg) {
    init_all_rank *a = arg;
    int st = aclrtSetDevice(a->device);
    if (st) {
        a->code = HCCL_E_INTERNAL;
        snprintf(a->why, sizeof a->why, "rank %u: aclrtSetDevice(%d) failed with %d", a->rank, (int)a->device, st);
    } else {
        a->code = init_rank("HcclCommInitAll", a->ndev, a->ri, a->rank, &a->comm, a->cancel, 1);
        if (a->code) {
            const char *msg = aclGetRecentErrMsg();
            snprintf(a->why, sizeof a->why, "rank %u (device %d): %s", a->rank, (int)a->device,
                     msg ? msg : result_name((int)a->code));
            aclrtResetDevice(a->device);
        }
    }
    if (a->code) {
        /* the first rank failing for its own reason is the one HcclCommInitAll reports */
        a->cause = !(a->code == HCCL_E_INTERNAL && __atomic_load_n(a->cancel, __ATOMIC_ACQUIRE));
        __atomic_store_n(a->cancel, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

HcclResult HcclCommInitAll(uint32_t ndev, int32_t *devices, HcclComm *comms) {
    static const char api[] = "HcclCommInitAll";
    MOCK_ENTER(api, NULL);
    ascend_mock_lock();
    int ready = ascend_mock_initialized_locked();
    ascend_mock_unlock();
    if (!ready) {
        return hviolate(HCCL_E_RUNTIME, api, "ACL is not initialized: call aclInit first");
    }
    if (ndev == 0) {
        return hfail(HCCL_E_PARA, api, "ndev is 0.");
    }
    if (!comms) {
        return hfail(HCCL_E_PTR, api, "comms is null.");
    }
    if (!devices) {
        return hfail(HCCL_E_PTR, api, "devices is null.");
    }
    if (ndev > MAX_RANKS) {
        return hfail(HCCL_E_PARA, api, "ndev %u: the mock supports at most %d ranks per group.", ndev, MAX_RANKS);
    }
    for (uint32_t i = 0; i < ndev; i++) {
        for (uint32_t j = 0; j < i; j++) {
            if (devices[i] == devices[j]) {
                return hfail(HCCL_E_PARA, api, "Duplicate device id %d exists in the device list (at %u and %u).",
                             (int)devices[i], j, i);
            }
        }
    }
    for (uint32_t i = 0; i < ndev; i++) {
        comms[i] = NULL;
    }
    HcclRootInfo ri;
    make_root_info(&ri);
    init_all_rank *ranks = calloc(ndev, sizeof *ranks);
    pthread_t *threads = calloc(ndev, sizeof *threads);
    int *started = calloc(ndev, sizeof *started);
    int cancel = 0;
    if (!ranks || !threads || !started) {
        fprintf(stderr, "ascend mock CANN: out of host memory\n");
        abort();
    }
    for (uint32_t i = 0; i < ndev; i++) {
        init_all_rank *a = &ranks[i];
        a->ndev = ndev;
        a->rank = i;
        a->device = devices[i];
        a->ri = &ri;
        a->cancel = &cancel;
        if (pthread_create(&threads[i], NULL, init_all_thread, a) == 0) {
            started[i] = 1;
        } else {
            a->code = HCCL_E_INTERNAL;
            a->cause = 1;
            snprintf(a->why, sizeof a->why, "rank %u: cannot start its thread", i);
            __atomic_store_n(&cancel, 1, __ATOMIC_RELEASE);
        }
    }
    for (uint32_t i = 0; i < ndev; i++) {
        if (started[i]) {
            pthread_join(threads[i], NULL);
        }
    }
    const init_all_rank *failed = NULL;
    for (uint32_t i = 0; i < ndev; i++) {
        if (ranks[i].code && (!failed || (ranks[i].cause && !failed->cause))) {
            failed = &ranks[i];
        }
    }
    HcclResult r = HCCL_SUCCESS;
    if (failed) {
        /* as HCCL does: destroy the communicators made, return HCCL_E_INTERNAL */
        for (uint32_t i = 0; i < ndev; i++) {
            if (ranks[i].comm) {
                ascend_mock_lock();
                int state;
                comm *c = comm_get_locked(ranks[i].comm, &state);
                if (c) {
                    comm_unlink_locked(c);
                }
                ascend_mock_unlock();
                if (c) {
                    comm_release(c);
                }
            }
        }
        r = hfail(HCCL_E_INTERNAL, api, "%s (%s)", failed->why, result_name((int)failed->code));
    } else {
        for (uint32_t i = 0; i < ndev; i++) {
            comms[i] = ranks[i].comm;
        }
    }
    free(ranks);
    free(threads);
    free(started);
    return r;
}

/* ---- queries ------------------------------------------------------------------------------------------ */
/* A query of a live comm: its size (`want_rank` 0) or its rank, into *out. */
static HcclResult comm_query(const char *api, HcclComm h, uint32_t *out, const char *out_name, int want_rank) {
    MOCK_ENTER(api, NULL);
    ascend_mock_lock();
    comm *c = NULL;
    HcclResult r = comm_lookup_locked(api, h, &c);
    if (!r && !out) {
        r = hfail(HCCL_E_PTR, api, "%s is null.", out_name);
    }
    if (!r) {
        *out = want_rank ? c->rank : c->nranks;
    }
    ascend_mock_unlock();
    return r;
}

HcclResult HcclGetRankSize(HcclComm h, uint32_t *rankSize) {
    return comm_query("HcclGetRankSize", h, rankSize, "rankSize", 0);
}

HcclResult HcclGetRankId(HcclComm h, uint32_t *rank) {
    return comm_query("HcclGetRankId", h, rank, "rank", 1);
}

const char *HcclGetErrorString(HcclResult code) {
    int st;
    if (ascend_mock_take_fault("HcclGetErrorString", &st)) {
        return NULL;
    }
    return result_name((int)code);
}

/* Joins rank `rank` of the group `nranks` ranks named by `key` (cluster.c), as HcclCommInitRootInfo
 * does with a root info. */
HcclResult ascend_mock_hccl_join_keyed(const char *api, uint32_t nranks, const uint64_t key[2], uint32_t rank,
                                       HcclComm *out) {
    root_blob rb;
    memset(&rb, 0, sizeof rb);
    memcpy(rb.magic, RI_MAGIC, sizeof rb.magic);
    rb.version = RI_VERSION;
    rb.layout = (uint32_t)sizeof(group_hdr);
    rb.id[0] = key[0];
    rb.id[1] = key[1];
    rb.id[2] = 0; /* never a counter value of make_root_info (those start at 1) */
    snprintf(rb.name, sizeof rb.name, NAME_PREFIX "rt-%llx-%llx", (unsigned long long)key[0],
             (unsigned long long)key[1]);
    HcclRootInfo ri;
    memset(&ri, 0, sizeof ri);
    memcpy(ri.internal, &rb, sizeof rb);
    return init_rank(api, nranks, &ri, rank, out, NULL, 0);
}

/* The mock's model of HCCL's asynchronous error: HCCL_E_REMOTE once the communicator's group is broken (a peer's
 * process exited without destroying its communicator, a collective timed out or did not match), else
 * HCCL_SUCCESS. A peer that vanished is noticed here too, without a collective. The reason is the thread's
 * aclGetRecentErrMsg text. */
HcclResult HcclGetCommAsyncError(HcclComm h, HcclResult *asyncError) {
    static const char api[] = "HcclGetCommAsyncError";
    MOCK_ENTER(api, NULL);
    if (!asyncError) {
        return hfail(HCCL_E_PTR, api, "asyncError is null.");
    }
    ascend_mock_lock();
    comm *c = NULL;
    HcclResult r = comm_lookup_locked(api, h, &c);
    if (!r) {
        group_hdr *g = c->g;
        glock(g);
        for (uint32_t j = 0; j < c->nranks && !g->broken; j++) {
            if (j != c->rank && !g->ranks[j].left && rank_vanished(g, j)) {
                mark_broken(g, "rank %u (process %d) exited without destroying its communicator", j,
                            (int)g->ranks[j].pid);
            }
        }
        *asyncError = g->broken ? HCCL_E_REMOTE : HCCL_SUCCESS;
        if (g->broken) {
            ascend_mock_set_error("communicator %p (rank %u of %u): %s", h, c->rank, c->nranks, g->broken_why);
        }
        gunlock(g);
    }
    ascend_mock_unlock();
    return r;
}

