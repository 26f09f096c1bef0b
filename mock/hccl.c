/*
 * Mock CANN: libhccl.so, a strict HCCL over the mock runtime (libascendcl.so, which owns the
 * lock, the device memory, the streams and the diagnostics; see mock_internal.h).
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
 * "waiting tasks" in acl.c); it touches device memory only while holding it.
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
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#pragma GCC visibility push(default)
#include "wrapper.h"
#include "mock_internal.h"
#pragma GCC visibility pop
#include "half.h"

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

/* ---- diagnostics ---------------------------------------------------------------------------------- */
static const char *result_name(int code) {
    static const char *const names[] = {
        "HCCL_SUCCESS",        "HCCL_E_PARA",         "HCCL_E_PTR",          "HCCL_E_MEMORY",
        "HCCL_E_INTERNAL",     "HCCL_E_NOT_SUPPORT",  "HCCL_E_NOT_FOUND",    "HCCL_E_UNAVAIL",
        "HCCL_E_SYSCALL",      "HCCL_E_TIMEOUT",      "HCCL_E_OPEN_FILE_FAILURE", "HCCL_E_TCP_CONNECT",
        "HCCL_E_ROCE_CONNECT", "HCCL_E_TCP_TRANSFER", "HCCL_E_ROCE_TRANSFER", "HCCL_E_RUNTIME",
        "HCCL_E_DRV",          "HCCL_E_PROFILING",    "HCCL_E_CCE",          "HCCL_E_NETWORK",
        "HCCL_E_AGAIN",        "HCCL_E_REMOTE",       "HCCL_E_SUSPENDING",   "HCCL_E_OPRETRY_FAIL",
        "HCCL_E_OOM",
    };
    return (code >= 0 && code < (int)(sizeof names / sizeof names[0])) ? names[code] : "HCCL_E_UNKNOWN";
}

static HcclResult vreport(HcclResult code, int violation, const char *api, const char *fmt, va_list ap) {
    char detail[MSG_MAX];
    vsnprintf(detail, sizeof detail, fmt, ap);
    if (violation) {
        ascend_mock_violation("%s: %s", api, detail);
    }
    ascend_mock_set_error("%s failed. ERROR: %d (%s). %s", api, (int)code, result_name((int)code), detail);
    return code;
}

/* Sets the error text "<api> failed. ERROR: <code> (<name>). <detail>" and returns code. */
static HcclResult hfail(HcclResult code, const char *api, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static HcclResult hfail(HcclResult code, const char *api, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    HcclResult r = vreport(code, 0, api, fmt, ap);
    va_end(ap);
    return r;
}

/* As hfail, and counts a violation "<api>: <detail>". */
static HcclResult hviolate(HcclResult code, const char *api, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static HcclResult hviolate(HcclResult code, const char *api, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    HcclResult r = vreport(code, 1, api, fmt, ap);
    va_end(ap);
    return r;
}

/* ---- time and environment ------------------------------------------------------------------------ */
static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * NS + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* An integer environment variable in [lo, hi], else dflt. */
static long env_long(const char *name, long dflt, long lo, long hi) {
    const char *v = getenv(name);
    if (!v || !*v) {
        return dflt;
    }
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < lo || x > hi) {
        return dflt;
    }
    return x;
}

/* ---- dtypes -------------------------------------------------------------------------------------- */
static uint64_t dtype_size(int dt) {
    switch (dt) {
    case HCCL_DATA_TYPE_INT8:
    case HCCL_DATA_TYPE_UINT8:
        return 1;
    case HCCL_DATA_TYPE_INT16:
    case HCCL_DATA_TYPE_FP16:
    case HCCL_DATA_TYPE_UINT16:
    case HCCL_DATA_TYPE_BFP16:
        return 2;
    case HCCL_DATA_TYPE_INT32:
    case HCCL_DATA_TYPE_FP32:
    case HCCL_DATA_TYPE_UINT32:
        return 4;
    case HCCL_DATA_TYPE_INT64:
    case HCCL_DATA_TYPE_UINT64:
    case HCCL_DATA_TYPE_FP64:
        return 8;
    default:
        return 0; /* INT128 and the unstable values past it are not supported by the mock */
    }
}

static const char *dtype_name(int dt) {
    static const char *const names[] = {"INT8",   "INT16",  "INT32",  "FP16", "FP32", "INT64",
                                        "UINT64", "UINT8",  "UINT16", "UINT32", "FP64", "BFP16", "INT128"};
    return (dt >= 0 && dt < (int)(sizeof names / sizeof names[0])) ? names[dt] : "an unknown HcclDataType";
}

static const char *op_name(int op) {
    static const char *const names[] = {"SUM", "PROD", "MAX", "MIN"};
    return (op >= 0 && op < 4) ? names[op] : "an unknown HcclReduceOp";
}

/* The reductions of the Atlas A2 table (docs/cann/HCCL.md 4.3): int8/16/32/64, fp16/32, bf16; no prod for
 * int16 and bf16. */
static int reduce_dtype_supported(int dt) {
    return dt == HCCL_DATA_TYPE_INT8 || dt == HCCL_DATA_TYPE_INT16 || dt == HCCL_DATA_TYPE_INT32 ||
           dt == HCCL_DATA_TYPE_INT64 || dt == HCCL_DATA_TYPE_FP16 || dt == HCCL_DATA_TYPE_FP32 ||
           dt == HCCL_DATA_TYPE_BFP16;
}

/* ---- root info ------------------------------------------------------------------------------------- */
typedef struct group_hdr group_hdr;

/* The start of HcclRootInfo.internal (the rest is zeros). */
typedef struct root_blob {
    char magic[8];
    uint32_t version;
    uint32_t layout; /* sizeof(group_hdr): only processes of one build share a group */
    uint64_t id[3];  /* pid, CLOCK_REALTIME ns, counter */
    char name[64];   /* the shared-memory segment */
} root_blob;

static uint64_t g_root_counter;

static void make_root_info(HcclRootInfo *ri);

/* Reads and checks a root info; returns 0 or why it is not one HcclGetRootInfo made. */
static const char *parse_root_info(const HcclRootInfo *ri, root_blob *rb) {
    memcpy(rb, ri->internal, sizeof *rb);
    if (memcmp(rb->magic, RI_MAGIC, sizeof rb->magic) != 0) {
        return "it was not made by HcclGetRootInfo of this mock (bad magic)";
    }
    if (rb->version != RI_VERSION) {
        return "it comes from another version of the mock";
    }
    if (!memchr(rb->name, '\0', sizeof rb->name) || strncmp(rb->name, NAME_PREFIX, strlen(NAME_PREFIX)) != 0) {
        return "its segment name is corrupted";
    }
    for (const char *p = rb->name + 1; *p; p++) {
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-')) {
            return "its segment name is corrupted";
        }
    }
    return NULL;
}

/* ---- the group's shared segment ---------------------------------------------------------------------- */
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

static uint8_t *slot(group_hdr *g, uint32_t rank) {
    return (uint8_t *)g + g->data_off + (uint64_t)rank * g->chunk;
}

/* Marks the group broken (with the lock of g held). */
static void mark_broken(group_hdr *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mark_broken(group_hdr *g, const char *fmt, ...) {
    if (!g->broken) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g->broken_why, sizeof g->broken_why, fmt, ap);
        va_end(ap);
        g->broken = 1;
    }
    pthread_cond_broadcast(&g->cv);
}

static void owner_died(group_hdr *g) {
    pthread_mutex_consistent(&g->mu);
    if (!g->complete && !g->setup_failed) {
        g->setup_failed = HCCL_E_INTERNAL;
        snprintf(g->setup_why, sizeof g->setup_why, "a process of the group died while holding the group's lock");
    }
    mark_broken(g, "a process of the group died while holding the group's lock");
}

static void glock(group_hdr *g) {
    if (pthread_mutex_lock(&g->mu) == EOWNERDEAD) {
        owner_died(g);
    }
}

static void gunlock(group_hdr *g) {
    pthread_mutex_unlock(&g->mu);
}

/* Waits on the group's condition until `deadline` (CLOCK_MONOTONIC ns), at most one slice. */
static void gwait(group_hdr *g, uint64_t deadline) {
    uint64_t t = now_ns() + SLICE_NS;
    if (t > deadline) {
        t = deadline;
    }
    struct timespec ts = {(time_t)(t / NS), (long)(t % NS)};
    if (pthread_cond_timedwait(&g->cv, &g->mu, &ts) == EOWNERDEAD) {
        owner_died(g);
    }
}

/* Whether the process of rank j is gone. */
static int rank_vanished(const group_hdr *g, uint32_t j) {
    pid_t pid = (pid_t)g->ranks[j].pid;
    return pid > 0 && pid != getpid() && kill(pid, 0) == -1 && errno == ESRCH;
}

static uint64_t round_up(uint64_t x, uint64_t to) {
    return (x + to - 1) / to * to;
}

/* Creates and initialises the segment `name` (opened O_EXCL as fd). Returns the mapping or NULL. */
static group_hdr *segment_create(int fd, const root_blob *rb, uint32_t nranks, char *why, size_t cap) {
    uint64_t chunk = (uint64_t)env_long("ASCEND_MOCK_HCCL_CHUNK", CHUNK_DEFAULT, 64, 1L << 30) & ~(uint64_t)7;
    uint64_t data_off = round_up(sizeof(group_hdr), 4096);
    uint64_t size = data_off + (uint64_t)nranks * chunk;
    if (ftruncate(fd, (off_t)size) != 0) {
        snprintf(why, cap, "ftruncate of the shared segment %s failed: %s", rb->name, strerror(errno));
        return NULL;
    }
    group_hdr *g = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (g == MAP_FAILED) {
        snprintf(why, cap, "mmap of the shared segment %s failed: %s", rb->name, strerror(errno));
        return NULL;
    }
    memcpy(g->id, rb->id, sizeof g->id);
    g->layout = (uint32_t)sizeof(group_hdr);
    g->nranks = nranks;
    g->chunk = chunk;
    g->data_off = data_off;
    g->size = size;
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&g->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    __atomic_store_n(&g->ready, SEG_READY, __ATOMIC_RELEASE);
    return g;
}

/* Maps a segment another rank created (waiting, until deadline, for it to be initialised). */
static group_hdr *segment_attach(int fd, const root_blob *rb, uint64_t deadline, HcclResult *code, char *why,
                                 size_t cap) {
    struct stat st;
    for (;;) {
        if (fstat(fd, &st) != 0) {
            *code = HCCL_E_SYSCALL;
            snprintf(why, cap, "fstat of the shared segment %s failed: %s", rb->name, strerror(errno));
            return NULL;
        }
        if ((uint64_t)st.st_size >= sizeof(group_hdr)) {
            break;
        }
        if (now_ns() >= deadline) {
            *code = HCCL_E_TIMEOUT;
            snprintf(why, cap, "the rank that created the group's segment never initialised it");
            return NULL;
        }
        sleep_ms(1);
    }
    group_hdr *h = mmap(NULL, sizeof(group_hdr), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) {
        *code = HCCL_E_SYSCALL;
        snprintf(why, cap, "mmap of the shared segment %s failed: %s", rb->name, strerror(errno));
        return NULL;
    }
    while (__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE) != SEG_READY) {
        if (now_ns() >= deadline) {
            munmap(h, sizeof(group_hdr));
            *code = HCCL_E_TIMEOUT;
            snprintf(why, cap, "the rank that created the group's segment never initialised it");
            return NULL;
        }
        sleep_ms(1);
    }
    uint64_t size = h->size;
    int same = h->layout == sizeof(group_hdr) && memcmp(h->id, rb->id, sizeof h->id) == 0;
    munmap(h, sizeof(group_hdr));
    if (!same) {
        *code = HCCL_E_PARA;
        snprintf(why, cap, "the shared segment %s belongs to another group or another build of the mock", rb->name);
        return NULL;
    }
    group_hdr *g = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (g == MAP_FAILED) {
        *code = HCCL_E_SYSCALL;
        snprintf(why, cap, "mmap of the shared segment %s failed: %s", rb->name, strerror(errno));
        return NULL;
    }
    return g;
}

/* Lists the ranks that have not joined, e.g. "1, 3". */
static void missing_ranks(const group_hdr *g, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (uint32_t j = 0; j < g->nranks && n < cap; j++) {
        if (!g->ranks[j].joined) {
            n += (size_t)snprintf(buf + n, cap - n, n ? ", %u" : "%u", j);
        }
    }
}

/* The rendezvous of HcclCommInitRootInfo (called without the mock's lock). On success *out is the
 * group's mapping. On failure, *offender says whether this rank's own arguments broke the group. */
static HcclResult group_join(const root_blob *rb, uint32_t nranks, uint32_t rank, int device, long timeout_s,
                             const int *cancel, group_hdr **out, int *offender, char *why, size_t cap) {
    uint64_t deadline = now_ns() + (uint64_t)timeout_s * NS;
    *offender = 0;
    for (;;) {
        if (cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE)) {
            snprintf(why, cap, "another rank of HcclCommInitAll failed");
            return HCCL_E_INTERNAL;
        }
        if (now_ns() >= deadline) {
            snprintf(why, cap, "rank %u found no group to join within %ld s (HCCL_CONNECT_TIMEOUT)", rank, timeout_s);
            return HCCL_E_TIMEOUT;
        }
        HcclResult code = HCCL_SUCCESS;
        group_hdr *g;
        int fd = shm_open(rb->name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) {
            g = segment_create(fd, rb, nranks, why, cap);
            close(fd);
            if (!g) {
                shm_unlink(rb->name);
                return HCCL_E_SYSCALL;
            }
        } else if (errno == EEXIST) {
            fd = shm_open(rb->name, O_RDWR, 0600);
            if (fd < 0) {
                if (errno == ENOENT) {
                    continue; /* unlinked meanwhile: try again */
                }
                snprintf(why, cap, "shm_open(%s) failed: %s", rb->name, strerror(errno));
                return HCCL_E_SYSCALL;
            }
            g = segment_attach(fd, rb, deadline, &code, why, cap);
            close(fd);
            if (!g) {
                return code;
            }
        } else {
            snprintf(why, cap, "shm_open(%s) failed: %s", rb->name, strerror(errno));
            return HCCL_E_SYSCALL;
        }
        uint64_t size = g->size;
        glock(g);
        if (g->abandoned) { /* every rank of that attempt gave up: start a new one */
            gunlock(g);
            munmap(g, size);
            continue;
        }
        int joined = 0;
        if (g->setup_failed) {
            code = (HcclResult)g->setup_failed;
            snprintf(why, cap, "the group's rendezvous failed: %s", g->setup_why);
        } else if (g->complete) {
            code = HCCL_E_PARA;
            *offender = 1;
            snprintf(why, cap, "rank %u joined a group whose %u ranks have all joined already (a rank joined twice?)",
                     rank, g->nranks);
        } else if (g->nranks != nranks) {
            code = HCCL_E_PARA;
            *offender = 1;
            g->setup_failed = HCCL_E_PARA;
            snprintf(g->setup_why, sizeof g->setup_why,
                     "rank %u passed nRanks %u, but the group was created with nRanks %u", rank, nranks, g->nranks);
            snprintf(why, cap, "%s", g->setup_why);
            pthread_cond_broadcast(&g->cv);
        } else if (g->ranks[rank].joined) {
            code = HCCL_E_PARA;
            *offender = 1;
            g->setup_failed = HCCL_E_PARA;
            snprintf(g->setup_why, sizeof g->setup_why, "rank %u joined twice", rank);
            snprintf(why, cap, "%s", g->setup_why);
            pthread_cond_broadcast(&g->cv);
        } else {
            joined = 1;
            rank_state *rs = &g->ranks[rank];
            memset(rs, 0, sizeof *rs);
            rs->joined = 1;
            rs->pid = (int32_t)getpid();
            rs->device = device;
            g->joined++;
            g->attached++;
            if (g->joined == g->nranks) {
                g->complete = 1;
                shm_unlink(rb->name);
                pthread_cond_broadcast(&g->cv);
            }
            while (!g->complete && !g->setup_failed) {
                if (cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE)) {
                    code = HCCL_E_INTERNAL;
                    snprintf(why, cap, "another rank of HcclCommInitAll failed");
                    break;
                }
                for (uint32_t j = 0; j < g->nranks; j++) {
                    if (g->ranks[j].joined && rank_vanished(g, j)) { /* its slot is free again */
                        g->ranks[j].joined = 0;
                        g->joined--;
                        g->attached--;
                    }
                }
                if (now_ns() >= deadline) {
                    char missing[256];
                    missing_ranks(g, missing, sizeof missing);
                    code = HCCL_E_TIMEOUT;
                    snprintf(why, cap,
                             "rank %u waited %ld s (HCCL_CONNECT_TIMEOUT) for the group's other ranks: %u of %u "
                             "joined; missing: %s",
                             rank, timeout_s, g->joined, g->nranks, missing);
                    break;
                }
                gwait(g, deadline);
            }
            if (g->complete) {
                gunlock(g);
                *out = g;
                return HCCL_SUCCESS;
            }
            if (g->setup_failed && !code) {
                code = (HcclResult)g->setup_failed;
                snprintf(why, cap, "the group's rendezvous failed: %s", g->setup_why);
            }
        }
        /* give up: the last rank to leave an incomplete group unlinks its name */
        if (joined) {
            g->ranks[rank].joined = 0;
            g->joined--;
            g->attached--;
        }
        if (!g->complete && g->attached == 0 && !g->abandoned) {
            g->abandoned = 1;
            shm_unlink(rb->name);
        }
        gunlock(g);
        munmap(g, size);
        return code;
    }
}

/* ---- communicators (process-local; protected by the mock's global lock) -------------------------------- */
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
static HcclResult comm_lookup_locked(const char *api, HcclComm h, comm **out) {
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
static void make_root_info(HcclRootInfo *ri) {
    root_blob rb;
    memset(&rb, 0, sizeof rb);
    memcpy(rb.magic, RI_MAGIC, sizeof rb.magic);
    rb.version = RI_VERSION;
    rb.layout = (uint32_t)sizeof(group_hdr);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    rb.id[0] = (uint64_t)getpid();
    rb.id[1] = (uint64_t)ts.tv_sec * NS + (uint64_t)ts.tv_nsec;
    rb.id[2] = __atomic_add_fetch(&g_root_counter, 1, __ATOMIC_SEQ_CST);
    snprintf(rb.name, sizeof rb.name, NAME_PREFIX "%llu-%llx-%llu", (unsigned long long)rb.id[0],
             (unsigned long long)rb.id[1], (unsigned long long)rb.id[2]);
    memset(ri->internal, 0, sizeof ri->internal);
    memcpy(ri->internal, &rb, sizeof rb);
}

HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo) {
    static const char api[] = "HcclGetRootInfo";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return (HcclResult)st;
    }
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
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        if (comm) {
            *comm = NULL;
        }
        return (HcclResult)st;
    }
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
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return (HcclResult)st;
    }
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
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return (HcclResult)st;
    }
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
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return (HcclResult)st;
    }
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
            if (!ascend_mock_mem_live_locked(k->send_id)) {
                local_failed = 1;
                ascend_mock_violation("%s #%llu (rank %u): the device memory of sendBuf %p was freed while the "
                                      "collective ran",
                                      k->api, (unsigned long long)k->d.seq, c->rank, (void *)k->send);
                snprintf(local, sizeof local, "rank %u's sendBuf was freed while the collective ran", c->rank);
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
            if (!ascend_mock_mem_live_locked(k->recv_id)) {
                local_failed = 1;
                ascend_mock_violation("%s #%llu (rank %u): the device memory of recvBuf %p was freed while the "
                                      "collective ran",
                                      k->api, (unsigned long long)k->d.seq, c->rank, (void *)k->recv);
                snprintf(local, sizeof local, "rank %u's recvBuf was freed while the collective ran", c->rank);
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
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return (HcclResult)st;
    }
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
        k->d.seq = ++c->issued;
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
        ascend_mock_enqueue_waiting_locked(k->api, stream, ranges, n, coll_run, coll_drop, k);
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

/* ==== rank tables and asynchronous errors (issue 19) ============================================================
 * Two entry points for mock/hccl_cluster.c (HcclCommInitClusterInfo), and HcclGetCommAsyncError, which reads the
 * group's state. Kept here because both need the group and communicator internals above. */

/* Joins rank `rank` of the group `nranks` ranks named by `key` (two 64-bit values every rank derives from the same
 * rank table), as HcclCommInitRootInfo does with a root info. Declared in hccl_cluster.c. */
HcclResult ascend_mock_hccl_join_keyed(const char *api, uint32_t nranks, const uint64_t key[2], uint32_t rank,
                                       HcclComm *out);
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
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return (HcclResult)st;
    }
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
