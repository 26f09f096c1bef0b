/*
 * Mock CANN, libhccl.so: groups. A root info names a group; its ranks (threads or processes) meet
 * in a POSIX shared-memory segment with a robust, process-shared lock and condition.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* ---- root info ------------------------------------------------------------------------------------- */
static uint64_t g_root_counter;

/* Reads and checks a root info; returns 0 or why it is not one HcclGetRootInfo made. */
const char *parse_root_info(const HcclRootInfo *ri, root_blob *rb) {
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
uint8_t *slot(group_hdr *g, uint32_t rank) {
    return (uint8_t *)g + g->data_off + (uint64_t)rank * g->chunk;
}

void mark_broken(group_hdr *g, const char *fmt, ...) {
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

void glock(group_hdr *g) {
    if (pthread_mutex_lock(&g->mu) == EOWNERDEAD) {
        owner_died(g);
    }
}

void gunlock(group_hdr *g) {
    pthread_mutex_unlock(&g->mu);
}

/* Waits on the group's condition until `deadline` (CLOCK_MONOTONIC ns), at most one slice. */
void gwait(group_hdr *g, uint64_t deadline) {
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
int rank_vanished(const group_hdr *g, uint32_t j) {
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
HcclResult group_join(const root_blob *rb, uint32_t nranks, uint32_t rank, int device, long timeout_s,
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

void make_root_info(HcclRootInfo *ri) {
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
