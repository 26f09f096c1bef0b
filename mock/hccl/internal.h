/*
 * Mock CANN: libhccl.so, a strict HCCL over the mock runtime (libascendcl.so, which owns the
 * lock, the device memory, the streams and the diagnostics; see mock_internal.h). This header is
 * what its files share:
 *   comm.c       communicators and the Hccl* calls that make, query and destroy them
 *   collective.c the collectives: validation, the queued task, the rounds through the segment
 *   cluster.c    HcclCommInitClusterInfo (a communicator from a rank-table file)
 *   group.c      root info, the group's shared segment and its rendezvous
 *   diag.c       error text and violations, time and environment, dtypes
 *
 * Communicators. HcclGetRootInfo makes a 4108-byte root info naming a new group: a magic, a
 * version, a unique id (pid, time, counter) and the name of a POSIX shared-memory segment.
 * HcclCommInitRootInfo is a rendezvous through that segment (process-shared robust mutex and
 * condition variable): the ranks of a group may be threads of one process or separate processes.
 * The first rank to arrive creates the segment; the last one unlinks its name (the group then
 * lives in the ranks' mappings only, so nothing is left in /dev/shm even if a process crashes
 * later). HcclCommInitAll does what HCCL does: a root info, then one thread per device that sets
 * its device and joins as rank i.
 *
 * Collectives are validated when called, then queued on the mock stream as a waiting task
 * (ascend_mock_enqueue_waiting_locked) with their device ranges, so buffers freed before the
 * stream ran, unsynchronized use from other streams and poison are caught as for any task. The
 * data moves when each rank's task runs (at its stream's synchronization), in rounds: each rank
 * copies (at most `chunk` bytes of) its contribution into its slot of the segment, waits for
 * every rank's, then computes its output from all the slots in rank order (deterministic and
 * identical on every rank). While it waits, the task releases the mock's global lock (see
 * "waiting tasks" in acl/queue.c); it touches device memory only while holding it.
 *
 * Strictness: the n-th collective run by each rank must match in kind, count, dtype, op and root
 * (else a violation, and that collective fails on every rank); a rank that never arrives makes
 * the others fail after HCCL_EXEC_TIMEOUT (and the group is broken from then on), never hang.
 *
 * Environment: HCCL_CONNECT_TIMEOUT (seconds, 1..7200, default 5 in the mock; real HCCL accepts
 * 120..7200, default 120), HCCL_EXEC_TIMEOUT (seconds, 1..7200, default 10 in the mock; 0, "never"
 * for real HCCL, means the default here), ASCEND_MOCK_HCCL_CHUNK (bytes per rank and round,
 * 64..2^30, default 1 MiB; read by the rank that creates the group).
 */
#ifndef ASCEND_MOCK_HCCL_INTERNAL_H
#define ASCEND_MOCK_HCCL_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* The declarations of these headers are the library's exports (it is built with hidden visibility). */
#pragma GCC visibility push(default)
#include "wrapper.h"
#include "mock_internal.h"
#pragma GCC visibility pop

/* ---- constants --------------------------------------------------------------------------------- */
enum {
    ACL_ERROR_RT_TASK_TIMEOUT = 107020,     /* a collective's peer never arrived */
    ACL_ERROR_RT_AICORE_EXCEPTION = 507015  /* a collective failed (mismatch, a peer's failure, ...) */
};

#define MAX_RANKS 64
#define RI_MAGIC "AMHCCL\x01"
#define RI_VERSION 1u
#define NAME_PREFIX "/ascend-mock-hccl-"
#define SEG_READY 0x3159444145524343ULL
#define CONNECT_DEFAULT_S 5
#define EXEC_DEFAULT_S 10
#define CHUNK_DEFAULT (1u << 20)
#define SYS_MAX_COUNT 0x7FFFFFFFFULL
#define SLICE_NS 50000000ULL /* waits wake up this often to look for vanished peers */
#define NS 1000000000ULL
#define COMM_TAG 0xCC0AULL
#define MSG_MAX 768

enum { COLL_ALL_REDUCE = 1, COLL_ALL_GATHER = 2, COLL_BROADCAST = 3 };


/* ---- diag.c ------------------------------------------------------------------------------------ */
/* HCCL's name of a result code, e.g. "HCCL_E_PARA". */
const char *result_name(int code);
/* Sets the error text "<api> failed. ERROR: <code> (<name>). <detail>" and returns code; with
 * `violation`, also counts a violation "<api>: <detail>". Called as hfail() and hviolate(). */
HcclResult hreport(HcclResult code, int violation, const char *api, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define hfail(code, api, ...) hreport((code), 0, (api), __VA_ARGS__)
/* As hfail, and counts a violation "<api>: <detail>". */
#define hviolate(code, api, ...) hreport((code), 1, (api), __VA_ARGS__)
/* CLOCK_MONOTONIC in ns. */
uint64_t now_ns(void);
void sleep_ms(long ms);
/* An integer environment variable in [lo, hi], else dflt. */
long env_long(const char *name, long dflt, long lo, long hi);
/* Element size (0: not supported by the mock) and names of HcclDataType / HcclReduceOp values. */
uint64_t dtype_size(int dt);
const char *dtype_name(int dt);
const char *op_name(int op);
/* The reductions of the Atlas A2 table (docs/cann/HCCL.md 4.3). */
int reduce_dtype_supported(int dt);

/* ---- group.c: root info and the group's shared segment -------------------------------------------------- */
typedef struct group_hdr group_hdr;

/* The start of HcclRootInfo.internal (the rest is zeros). */
typedef struct root_blob {
    char magic[8];
    uint32_t version;
    uint32_t layout; /* sizeof(group_hdr): only processes of one build share a group */
    uint64_t id[3];  /* pid, CLOCK_REALTIME ns, counter */
    char name[64];   /* the shared-memory segment */
} root_blob;

typedef struct coll_desc {
    uint32_t kind;
    uint32_t dtype;
    uint32_t op;
    uint32_t root;
    uint64_t count;
    uint64_t seq; /* the collective's number on its communicator (1, 2, ...) */
} coll_desc;

typedef struct rank_state {
    int32_t joined;
    int32_t pid;
    int32_t device;
    int32_t left;      /* destroyed its communicator */
    uint64_t arrived;  /* last round whose contribution it published */
    uint64_t done;     /* last round it finished reading */
    coll_desc desc;    /* the collective of round `arrived` */
    int32_t failed;    /* its task failed: its contribution of round `arrived` is missing */
    char why[256];
} rank_state;

struct group_hdr {
    uint64_t ready; /* SEG_READY once initialised (written last) */
    uint64_t id[3];
    uint32_t layout;
    uint32_t nranks;
    uint64_t chunk;    /* bytes per rank and round */
    uint64_t data_off; /* the slots: nranks * chunk bytes */
    uint64_t size;
    pthread_mutex_t mu; /* robust, process-shared; never taken before the mock's global lock */
    pthread_cond_t cv;  /* process-shared, CLOCK_MONOTONIC; broadcast on every change */
    uint32_t joined;    /* ranks joined */
    uint32_t attached;  /* ranks joined that have not given up */
    int32_t complete;
    int32_t abandoned;    /* every rank gave up and the name was unlinked */
    int32_t setup_failed; /* an HcclResult: the rendezvous fails for every rank */
    char setup_why[256];
    int32_t broken; /* a collective timed out or a rank vanished: every later collective fails */
    char broken_why[512];
    rank_state ranks[MAX_RANKS];
};


/* Reads and checks a root info; returns 0 or why it is not one HcclGetRootInfo made. */
const char *parse_root_info(const HcclRootInfo *ri, root_blob *rb);
/* A root info naming a new group. */
void make_root_info(HcclRootInfo *ri);
/* The rendezvous of HcclCommInitRootInfo (called without the mock's lock). On success *out is the
 * group's mapping. On failure, *offender says whether this rank's own arguments broke the group. */
HcclResult group_join(const root_blob *rb, uint32_t nranks, uint32_t rank, int device, long timeout_s,
                      const int *cancel, group_hdr **out, int *offender, char *why, size_t cap);
/* The segment's slot of a rank (chunk bytes). */
uint8_t *slot(group_hdr *g, uint32_t rank);
/* The group's lock (robust: a dead owner breaks the group) and condition. */
void glock(group_hdr *g);
void gunlock(group_hdr *g);
/* Waits on the group's condition until `deadline` (CLOCK_MONOTONIC ns), at most one slice. */
void gwait(group_hdr *g, uint64_t deadline);
/* Marks the group broken (with the lock of g held). */
void mark_broken(group_hdr *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether the process of rank j is gone. */
int rank_vanished(const group_hdr *g, uint32_t j);

/* ---- comm.c: communicators (process-local; protected by the mock's global lock) ---------------------------- */
typedef struct comm comm;
struct comm {
    uint64_t handle;
    comm *next;
    uint32_t rank, nranks;
    int device;
    int resets_device; /* made by HcclCommInitAll: destroying it releases its device */
    group_hdr *g;
    uint64_t map_size;
    uint64_t id[3];
    uint64_t issued;  /* collectives enqueued */
    uint64_t ran;     /* collectives whose task started */
    uint64_t round;   /* rounds of the group this rank took part in */
    uint64_t queued;  /* tasks queued and not yet finished */
    int running;      /* a task of it is running (maybe with the lock released) */
    uint64_t exec_timeout_s;
};

/* Looks a communicator up for `api`: NULL → HCCL_E_PTR; unknown or destroyed → a violation and
 * HCCL_E_PARA. */
HcclResult comm_lookup_locked(const char *api, HcclComm h, comm **out);
/* Joins rank `rank` of the group `nranks` ranks named by `key` (two 64-bit values every rank
 * derives from the same rank table), as HcclCommInitRootInfo does with a root info. */
HcclResult ascend_mock_hccl_join_keyed(const char *api, uint32_t nranks, const uint64_t key[2], uint32_t rank,
                                       HcclComm *out);

#endif /* ASCEND_MOCK_HCCL_INTERNAL_H */
