/*
 * Mock CANN: libascendcl.so, the ACL runtime over host memory.
 *
 * This library owns every piece of state of the mock toolkit (libnnopbase.so and libopapi.so link
 * to it and reach the state through mock_internal.h): device memory, streams and their task
 * queues, events, the handle table (streams, events, tensors, executors), statistics, injected
 * faults, the per-thread current device and the per-thread recent error message.
 *
 * Strictness: every misuse CANN would punish (with a crash, corrupted data or an error) counts a
 * violation and prints one line on stderr; see ascend_mock.h for the counters. What a skipped
 * queued task should have written is poisoned: reading it is an error, not stale bytes (see
 * "poison" below).
 */
#define _POSIX_C_SOURCE 200809L

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#pragma GCC visibility push(default)
#include "wrapper.h"
#include "ascend_mock.h"
#include "ascend_mock_apis.h"
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
    ACL_ERROR_RT_MEMORY_ALLOCATION = 207001,
    ACL_ERROR_RT_AICORE_EXCEPTION = 507015,
    ACL_ERROR_RT_DEVICE_MEM_ERROR = 507053
};

#define MAX_DEVICES 64
#define HANDLE_TAG 0xA5C0ULL
#define VIOLATION_RING 1024
#define MESSAGE_MAX 1024

/* ---- locks, diagnostics ------------------------------------------------------------------------ */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER; /* leaf: nothing is locked inside it */
/* Signalled (with g_lock) when a stream stops running a task that releases g_lock, or when a
 * thread stops pinning a stream: see "waiting tasks" below. */
static pthread_cond_t g_idle = PTHREAD_COND_INITIALIZER;

static uint64_t g_violations;
static char g_violation_ring[VIOLATION_RING][MESSAGE_MAX];

static __thread uint64_t tls_violations;
static __thread uint64_t tls_mallocs;
static __thread char tls_msg[MESSAGE_MAX];
static __thread int tls_msg_set;
static __thread char tls_msg_out[MESSAGE_MAX];

void ascend_mock_lock(void) {
    pthread_mutex_lock(&g_lock);
}

void ascend_mock_unlock(void) {
    pthread_mutex_unlock(&g_lock);
}

void ascend_mock_violation(const char *fmt, ...) {
    char buf[MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&g_log_lock);
    uint64_t index = g_violations++;
    memcpy(g_violation_ring[index % VIOLATION_RING], buf, sizeof buf);
    pthread_mutex_unlock(&g_log_lock);
    tls_violations++;
    fprintf(stderr, "ascend mock CANN violation: %s\n", buf);
}

static void set_error_v(const char *fmt, va_list ap) {
    vsnprintf(tls_msg, sizeof tls_msg, fmt, ap);
    tls_msg_set = 1;
}

void ascend_mock_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_error_v(fmt, ap);
    va_end(ap);
}

/* Sets the error text "<api> failed. ERROR: <code>. <detail>" and returns code. */
static int fail(int code, const char *api, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(int code, const char *api, const char *fmt, ...) {
    char detail[MESSAGE_MAX - 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    ascend_mock_set_error("%s failed. ERROR: %d. %s", api, code, detail);
    return code;
}

/* As fail(), and counts a violation "<api>: <detail>". */
static int violate(int code, const char *api, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int violate(int code, const char *api, const char *fmt, ...) {
    char detail[MESSAGE_MAX - 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    ascend_mock_violation("%s: %s", api, detail);
    ascend_mock_set_error("%s failed. ERROR: %d. %s", api, code, detail);
    return code;
}

const char *aclGetRecentErrMsg(void) {
    if (!tls_msg_set) {
        return NULL;
    }
    memcpy(tls_msg_out, tls_msg, sizeof tls_msg_out);
    tls_msg_set = 0;
    return tls_msg_out;
}

/* ---- fault injection ---------------------------------------------------------------------------- */
/* Every function the bindings bind (generated from ascend-sys/src/symbols.rs by build.rs). */
static const char *const k_apis[] = {ASCEND_MOCK_APIS};
#define NAPIS (sizeof k_apis / sizeof k_apis[0])

static int g_fault_armed[NAPIS];
static int g_fault_status[NAPIS];
static int g_faults_armed; /* read without the log lock as a fast path */
static __thread int tls_fault_armed[NAPIS];
static __thread int tls_fault_status[NAPIS];
static __thread int tls_faults_armed;

static int api_index(const char *api) {
    if (!api) {
        return -1;
    }
    for (size_t i = 0; i < NAPIS; i++) {
        if (strcmp(k_apis[i], api) == 0) {
            return (int)i;
        }
    }
    return -1;
}

int ascend_mock_fail_next(const char *api, int status) {
    int i = api_index(api);
    if (i < 0) {
        return -1;
    }
    pthread_mutex_lock(&g_log_lock);
    if (!g_fault_armed[i]) {
        g_fault_armed[i] = 1;
        __atomic_add_fetch(&g_faults_armed, 1, __ATOMIC_SEQ_CST);
    }
    g_fault_status[i] = status;
    pthread_mutex_unlock(&g_log_lock);
    return 0;
}

int ascend_mock_fail_next_thread(const char *api, int status) {
    int i = api_index(api);
    if (i < 0) {
        return -1;
    }
    if (!tls_fault_armed[i]) {
        tls_fault_armed[i] = 1;
        tls_faults_armed++;
    }
    tls_fault_status[i] = status;
    return 0;
}

void ascend_mock_clear_faults(void) {
    pthread_mutex_lock(&g_log_lock);
    memset(g_fault_armed, 0, sizeof g_fault_armed);
    __atomic_store_n(&g_faults_armed, 0, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&g_log_lock);
    memset(tls_fault_armed, 0, sizeof tls_fault_armed);
    tls_faults_armed = 0;
}

int ascend_mock_take_fault(const char *api, int *status) {
    if (!tls_faults_armed && !__atomic_load_n(&g_faults_armed, __ATOMIC_SEQ_CST)) {
        return 0;
    }
    int i = api_index(api);
    if (i < 0) {
        return 0;
    }
    int st;
    if (tls_fault_armed[i]) {
        tls_fault_armed[i] = 0;
        tls_faults_armed--;
        st = tls_fault_status[i];
    } else {
        int hit = 0;
        pthread_mutex_lock(&g_log_lock);
        if (g_fault_armed[i]) {
            g_fault_armed[i] = 0;
            __atomic_sub_fetch(&g_faults_armed, 1, __ATOMIC_SEQ_CST);
            hit = 1;
        }
        st = g_fault_status[i];
        pthread_mutex_unlock(&g_log_lock);
        if (!hit) {
            return 0;
        }
    }
    ascend_mock_set_error("%s failed. ERROR: %d. Failure injected by the ascend mock (fail_next).", api, st);
    *status = st;
    return 1;
}

/* ---- a small hash table (uint64 key != 0 -> pointer), linear probing ---------------------------- */
typedef struct htab {
    uint64_t *keys;
    void **vals;
    size_t cap; /* power of two, or 0 */
    size_t len;
} htab;

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n, size);
    if (!p) {
        fprintf(stderr, "ascend mock CANN: out of host memory\n");
        abort();
    }
    return p;
}

static size_t hslot(uint64_t key, size_t cap) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

static void htab_put(htab *h, uint64_t key, void *val);

static void htab_grow(htab *h) {
    htab bigger = {0};
    bigger.cap = h->cap ? h->cap * 2 : 64;
    bigger.keys = xcalloc(bigger.cap, sizeof *bigger.keys);
    bigger.vals = xcalloc(bigger.cap, sizeof *bigger.vals);
    for (size_t i = 0; i < h->cap; i++) {
        if (h->keys[i]) {
            htab_put(&bigger, h->keys[i], h->vals[i]);
        }
    }
    free(h->keys);
    free(h->vals);
    *h = bigger;
}

static void htab_put(htab *h, uint64_t key, void *val) {
    if ((h->len + 1) * 2 > h->cap) {
        htab_grow(h);
    }
    size_t i = hslot(key, h->cap);
    while (h->keys[i] && h->keys[i] != key) {
        i = (i + 1) & (h->cap - 1);
    }
    if (!h->keys[i]) {
        h->len++;
    }
    h->keys[i] = key;
    h->vals[i] = val;
}

static void *htab_get(const htab *h, uint64_t key) {
    if (!h->cap || !key) {
        return NULL;
    }
    size_t i = hslot(key, h->cap);
    while (h->keys[i]) {
        if (h->keys[i] == key) {
            return h->vals[i];
        }
        i = (i + 1) & (h->cap - 1);
    }
    return NULL;
}

static void *htab_del(htab *h, uint64_t key) {
    if (!h->cap || !key) {
        return NULL;
    }
    size_t mask = h->cap - 1;
    size_t i = hslot(key, h->cap);
    while (h->keys[i] && h->keys[i] != key) {
        i = (i + 1) & mask;
    }
    if (!h->keys[i]) {
        return NULL;
    }
    void *val = h->vals[i];
    /* backward-shift deletion */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!h->keys[j]) {
            break;
        }
        size_t home = hslot(h->keys[j], h->cap);
        /* move entry j into the hole i when its home is not cyclically in (i, j] */
        int in_range = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!in_range) {
            h->keys[i] = h->keys[j];
            h->vals[i] = h->vals[j];
            i = j;
        }
    }
    h->keys[i] = 0;
    h->vals[i] = NULL;
    h->len--;
    return val;
}

/* ---- handles ---------------------------------------------------------------------------------- */
static htab g_handles;
static uint64_t g_next_id[ASCEND_MOCK_KIND_COUNT] = {1, 1, 1, 1, 1};
static uint64_t g_live[ASCEND_MOCK_KIND_COUNT];

uint64_t ascend_mock_handle_new_locked(int kind, void *obj) {
    uint64_t id = g_next_id[kind]++;
    uint64_t handle = (HANDLE_TAG << 48) | ((uint64_t)kind << 44) | (id << 3);
    htab_put(&g_handles, handle, obj);
    g_live[kind]++;
    return handle;
}

static int handle_decode(uint64_t handle, int *kind, uint64_t *id) {
    if ((handle >> 48) != HANDLE_TAG || (handle & 7)) {
        return 0;
    }
    *kind = (int)((handle >> 44) & 0xF);
    *id = (handle >> 3) & ((1ULL << 41) - 1);
    return *kind > 0 && *kind < ASCEND_MOCK_KIND_COUNT;
}

void *ascend_mock_handle_get_locked(int kind, uint64_t handle, int *state) {
    int dummy;
    if (!state) {
        state = &dummy;
    }
    if (!handle) {
        *state = ASCEND_MOCK_NULL;
        return NULL;
    }
    int k;
    uint64_t id;
    if (!handle_decode(handle, &k, &id)) {
        *state = ASCEND_MOCK_UNKNOWN;
        return NULL;
    }
    if (id == 0 || id >= g_next_id[k]) {
        *state = ASCEND_MOCK_UNKNOWN;
        return NULL;
    }
    if (k != kind) {
        *state = ASCEND_MOCK_WRONG_KIND;
        return NULL;
    }
    void *obj = htab_get(&g_handles, handle);
    *state = obj ? ASCEND_MOCK_LIVE : ASCEND_MOCK_DESTROYED;
    return obj;
}

void *ascend_mock_handle_remove_locked(int kind, uint64_t handle) {
    void *obj = htab_del(&g_handles, handle);
    if (obj) {
        g_live[kind]--;
    }
    return obj;
}

const char *ascend_mock_state_text(int state) {
    switch (state) {
    case ASCEND_MOCK_LIVE:
        return "alive";
    case ASCEND_MOCK_NULL:
        return "null";
    case ASCEND_MOCK_DESTROYED:
        return "already destroyed (use after destroy)";
    case ASCEND_MOCK_WRONG_KIND:
        return "a handle of another kind";
    default:
        return "not a handle this toolkit issued";
    }
}

/* ---- dtypes and formats --------------------------------------------------------------------------- */
uint64_t ascend_mock_dtype_size(aclDataType dtype) {
    switch ((int)dtype) {
    case ACL_FLOAT:
    case ACL_INT32:
    case ACL_UINT32:
    case ACL_COMPLEX32:
        return 4;
    case ACL_FLOAT16:
    case ACL_INT16:
    case ACL_UINT16:
    case ACL_BF16:
        return 2;
    case ACL_INT8:
    case ACL_UINT8:
    case ACL_BOOL:
    case ACL_HIFLOAT8:
    case ACL_FLOAT8_E5M2:
    case ACL_FLOAT8_E4M3FN:
    case ACL_FLOAT8_E8M0:
        return 1;
    case ACL_INT64:
    case ACL_UINT64:
    case ACL_DOUBLE:
    case ACL_COMPLEX64:
        return 8;
    case ACL_COMPLEX128:
        return 16;
    default:
        return 0;
    }
}

const char *ascend_mock_dtype_name(aclDataType dtype) {
    switch ((int)dtype) {
    case ACL_FLOAT:
        return "DT_FLOAT";
    case ACL_FLOAT16:
        return "DT_FLOAT16";
    case ACL_BF16:
        return "DT_BFLOAT16";
    case ACL_INT8:
        return "DT_INT8";
    case ACL_INT16:
        return "DT_INT16";
    case ACL_INT32:
        return "DT_INT32";
    case ACL_INT64:
        return "DT_INT64";
    case ACL_UINT8:
        return "DT_UINT8";
    case ACL_UINT16:
        return "DT_UINT16";
    case ACL_UINT32:
        return "DT_UINT32";
    case ACL_UINT64:
        return "DT_UINT64";
    case ACL_DOUBLE:
        return "DT_DOUBLE";
    case ACL_BOOL:
        return "DT_BOOL";
    case ACL_STRING:
        return "DT_STRING";
    case ACL_COMPLEX64:
        return "DT_COMPLEX64";
    case ACL_COMPLEX128:
        return "DT_COMPLEX128";
    case ACL_COMPLEX32:
        return "DT_COMPLEX32";
    case ACL_DT_UNDEFINED:
        return "DT_UNDEFINED";
    default:
        return "DT_UNKNOWN";
    }
}

const char *ascend_mock_format_name(aclFormat format) {
    switch ((int)format) {
    case ACL_FORMAT_NCHW:
        return "NCHW";
    case ACL_FORMAT_NHWC:
        return "NHWC";
    case ACL_FORMAT_ND:
        return "ND";
    case ACL_FORMAT_NC1HWC0:
        return "NC1HWC0";
    case ACL_FORMAT_FRACTAL_Z:
        return "FRACTAL_Z";
    case ACL_FORMAT_NC1HWC0_C04:
        return "NC1HWC0_C04";
    case ACL_FORMAT_HWCN:
        return "HWCN";
    case ACL_FORMAT_NDHWC:
        return "NDHWC";
    case ACL_FORMAT_FRACTAL_NZ:
        return "FRACTAL_NZ";
    case ACL_FORMAT_NCDHW:
        return "NCDHW";
    case ACL_FORMAT_NDC1HWC0:
        return "NDC1HWC0";
    case ACL_FRACTAL_Z_3D:
        return "FRACTAL_Z_3D";
    case ACL_FORMAT_NC:
        return "NC";
    case ACL_FORMAT_NCL:
        return "NCL";
    case ACL_FORMAT_FRACTAL_NZ_C0_16:
        return "FRACTAL_NZ_C0_16";
    case ACL_FORMAT_FRACTAL_NZ_C0_32:
        return "FRACTAL_NZ_C0_32";
    case ACL_FORMAT_FRACTAL_NZ_C0_2:
        return "FRACTAL_NZ_C0_2";
    case ACL_FORMAT_FRACTAL_NZ_C0_4:
        return "FRACTAL_NZ_C0_4";
    case ACL_FORMAT_FRACTAL_NZ_C0_8:
        return "FRACTAL_NZ_C0_8";
    case ACL_FORMAT_UNDEFINED:
        return "UNDEFINED";
    default:
        return "UNKNOWN";
    }
}

/* ---- device memory ------------------------------------------------------------------------------ */
typedef struct poison poison;

typedef struct alloc {
    uintptr_t base;
    uint64_t size;
    uint64_t id;
    int device;
    poison *poison; /* poisoned byte intervals, sorted, disjoint (see "poison" below) */
    size_t npoison, cap_poison;
    uint64_t poisoned; /* bytes in them */
} alloc;

static alloc **g_allocs; /* sorted by base */
static size_t g_nallocs, g_cap_allocs;
static htab g_alloc_by_id;
static uint64_t g_next_alloc_id = 1;
static uint64_t g_device_mallocs;
/* Call counters of host-blocking and allocating runtime calls (ascend_mock_stats). */
static uint64_t g_stream_syncs, g_event_syncs, g_device_syncs, g_device_frees, g_blocking_copies;
static uint64_t g_host_mallocs, g_live_host_allocs;

/* Index of the first allocation whose base is > p. */
static size_t alloc_upper(uintptr_t p) {
    size_t lo = 0, hi = g_nallocs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g_allocs[mid]->base <= p) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

static alloc *alloc_containing(uintptr_t p, uint64_t len) {
    size_t i = alloc_upper(p);
    if (i == 0) {
        return NULL;
    }
    alloc *a = g_allocs[i - 1];
    uint64_t at = p - a->base;
    if (at > a->size || len > a->size - at) {
        return NULL;
    }
    if (len == 0 && at == a->size && i < g_nallocs && g_allocs[i]->base == p) {
        return g_allocs[i];
    }
    return a;
}

/* Whether [p, p+len) overlaps any live allocation (len > 0). */
static int overlaps_any(uintptr_t p, uint64_t len) {
    uintptr_t last = (len - 1 > UINTPTR_MAX - p) ? UINTPTR_MAX : p + (len - 1);
    size_t i = alloc_upper(last);
    if (i == 0) {
        return 0;
    }
    alloc *a = g_allocs[i - 1];
    return a->base + a->size > p;
}

int ascend_mock_mem_find_locked(const void *p, uint64_t len, uint64_t *alloc_id, uintptr_t *base, uint64_t *size) {
    uintptr_t addr = (uintptr_t)p;
    if (!addr || len > UINTPTR_MAX - addr) {
        return 0;
    }
    alloc *a = alloc_containing(addr, len);
    if (!a) {
        return 0;
    }
    if (alloc_id) {
        *alloc_id = a->id;
    }
    if (base) {
        *base = a->base;
    }
    if (size) {
        *size = a->size;
    }
    return 1;
}

int ascend_mock_mem_live_locked(uint64_t alloc_id) {
    return htab_get(&g_alloc_by_id, alloc_id) != NULL;
}

int ascend_mock_mem_device_locked(uint64_t alloc_id) {
    const alloc *a = htab_get(&g_alloc_by_id, alloc_id);
    return a ? a->device : -1;
}

/* ---- poison: device bytes a skipped task should have written --------------------------------------
 *
 * When a queued task is skipped (a range it uses was freed, its kernel failed, or it would read
 * poisoned bytes), the bytes it should have written keep stale contents. Rather than let a later
 * read return them as if they were the task's output, the mock marks them poisoned:
 *   - a synchronous aclrtMemcpy reading poisoned bytes fails (ACL_ERROR_RT_DEVICE_MEM_ERROR) and
 *     copies nothing; its error text says which task was skipped and why;
 *   - a queued copy or kernel reading poisoned bytes is skipped in turn (its synchronize reports
 *     the error) and poisons what it should have written: poison propagates. Reading poison is
 *     an error status, not a new violation (the misuse was counted once, at its origin);
 *   - writing bytes (aclrtMemcpy, aclrtMemset, a queued copy or kernel that ran) clears exactly
 *     the bytes written; aclrtFree drops the allocation's poison.
 * Each allocation keeps its poisoned bytes as sorted, disjoint intervals of offsets, each naming
 * the range of the skipped task it belongs to and a shared, reference-counted cause. With no
 * poison anywhere (g_poisoned_bytes == 0, the normal case) every check is one comparison. */
typedef struct poison_cause {
    uint64_t refs;
    char task[160];            /* "task #N (<what> queued on <stream>)" */
    char why[MESSAGE_MAX / 2]; /* why it was skipped */
} poison_cause;

struct poison {
    uint64_t lo, hi; /* byte offsets in the allocation, lo < hi */
    poison_cause *cause;
    char name[32]; /* the range of the skipped task these bytes belong to, e.g. "sumDy" */
};

static uint64_t g_poisoned_bytes; /* over every live allocation */

static poison_cause *cause_new(void) {
    return xcalloc(1, sizeof(poison_cause));
}

static void cause_release(poison_cause *c) {
    if (c && c->refs-- <= 1) {
        free(c);
    }
}

/* Index of the first interval of `a` ending after offset lo (intervals are sorted and disjoint,
 * so their ends are sorted too). */
static size_t poison_lower(const alloc *a, uint64_t lo) {
    size_t l = 0, h = a->npoison;
    while (l < h) {
        size_t mid = l + (h - l) / 2;
        if (a->poison[mid].hi <= lo) {
            l = mid + 1;
        } else {
            h = mid;
        }
    }
    return l;
}

static void poison_insert_at(alloc *a, size_t i, const poison *p) {
    if (a->npoison == a->cap_poison) {
        a->cap_poison = a->cap_poison ? a->cap_poison * 2 : 4;
        poison *bigger = realloc(a->poison, a->cap_poison * sizeof *bigger);
        if (!bigger) {
            fprintf(stderr, "ascend mock CANN: out of host memory\n");
            abort();
        }
        a->poison = bigger;
    }
    memmove(&a->poison[i + 1], &a->poison[i], (a->npoison - i) * sizeof *a->poison);
    a->poison[i] = *p;
    a->npoison++;
}

static void poison_account(alloc *a, uint64_t added, uint64_t removed) {
    a->poisoned = a->poisoned + added - removed;
    g_poisoned_bytes = g_poisoned_bytes + added - removed;
}

/* Clears the poison of bytes [lo, hi) of `a` (they were written). */
static void poison_cut(alloc *a, uint64_t lo, uint64_t hi) {
    size_t i = poison_lower(a, lo);
    while (i < a->npoison && a->poison[i].lo < hi) {
        poison *p = &a->poison[i];
        if (p->lo < lo && p->hi > hi) { /* split around the hole */
            poison tail = *p;
            tail.lo = hi;
            p->hi = lo;
            tail.cause->refs++;
            poison_account(a, 0, hi - lo);
            poison_insert_at(a, i + 1, &tail);
            return;
        }
        if (p->lo < lo) {
            poison_account(a, 0, p->hi - lo);
            p->hi = lo;
            i++;
        } else if (p->hi > hi) {
            poison_account(a, 0, hi - p->lo);
            p->lo = hi;
            return;
        } else {
            poison_account(a, 0, p->hi - p->lo);
            cause_release(p->cause);
            memmove(p, p + 1, (a->npoison - i - 1) * sizeof *p);
            a->npoison--;
        }
    }
}

static int poison_same(const poison *p, const poison_cause *cause, const char *name) {
    return p->cause == cause && strncmp(p->name, name, sizeof p->name - 1) == 0;
}

/* Poisons bytes [lo, hi) of `a` as the range `name` of the skipped task `cause`. */
static void poison_add(alloc *a, uint64_t lo, uint64_t hi, poison_cause *cause, const char *name) {
    poison_cut(a, lo, hi);
    size_t i = poison_lower(a, lo);
    poison_account(a, hi - lo, 0);
    if (i > 0 && a->poison[i - 1].hi == lo && poison_same(&a->poison[i - 1], cause, name)) {
        a->poison[i - 1].hi = hi; /* extend the previous interval (strided views poison run by run) */
        if (i < a->npoison && a->poison[i].lo == hi && poison_same(&a->poison[i], cause, name)) {
            a->poison[i - 1].hi = a->poison[i].hi;
            cause_release(a->poison[i].cause);
            memmove(&a->poison[i], &a->poison[i + 1], (a->npoison - i - 1) * sizeof *a->poison);
            a->npoison--;
        }
        return;
    }
    if (i < a->npoison && a->poison[i].lo == hi && poison_same(&a->poison[i], cause, name)) {
        a->poison[i].lo = lo;
        return;
    }
    poison p = {lo, hi, cause, {0}};
    snprintf(p.name, sizeof p.name, "%s", name ? name : "range");
    cause->refs++;
    poison_insert_at(a, i, &p);
}

/* The first poisoned interval of `a` overlapping [lo, hi), or NULL. */
static const poison *poison_first(const alloc *a, uint64_t lo, uint64_t hi) {
    size_t i = poison_lower(a, lo);
    return (i < a->npoison && a->poison[i].lo < hi) ? &a->poison[i] : NULL;
}

/* Drops every poisoned interval of `a` (it is being freed). */
static void poison_drop_all(alloc *a) {
    for (size_t i = 0; i < a->npoison; i++) {
        cause_release(a->poison[i].cause);
    }
    poison_account(a, 0, a->poisoned);
    free(a->poison);
    a->poison = NULL;
    a->npoison = a->cap_poison = 0;
}

/* Calls f(a, lo, hi, ctx) on the byte runs [lo, hi) (offsets in `a`) that range `r` touches, in
 * increasing order for a contiguous range, in the view's element order otherwise; stops when f
 * returns nonzero and returns that. */
typedef int (*span_fn)(alloc *a, uint64_t lo, uint64_t hi, void *ctx);

static int range_spans(alloc *a, const ascend_mock_range *r, span_fn f, void *ctx) {
    const ascend_mock_tensor *t = r->view;
    if (!t) {
        uint64_t lo = r->addr - a->base;
        return f(a, lo, lo + r->len, ctx);
    }
    uint64_t data = (uintptr_t)t->data - a->base;
    uint64_t es = t->elem_size;
    if (t->rank == 0) {
        uint64_t lo = data + (uint64_t)t->offset * es;
        return f(a, lo, lo + es, ctx);
    }
    uint64_t last = t->rank - 1;
    /* the innermost dimension is one run when it is contiguous, else one run per element */
    int contiguous = t->strides[last] == 1;
    uint64_t run = contiguous ? (uint64_t)t->dims[last] * es : es;
    int64_t nruns = contiguous ? 1 : t->dims[last];
    int64_t idx[ASCEND_MOCK_MAX_RANK] = {0};
    for (;;) {
        int64_t pos = t->offset;
        for (uint64_t k = 0; k < last; k++) {
            pos += idx[k] * t->strides[k];
        }
        for (int64_t j = 0; j < nruns; j++) {
            uint64_t lo = data + (uint64_t)(pos + j * t->strides[last]) * es;
            int stop = f(a, lo, lo + run, ctx);
            if (stop) {
                return stop;
            }
        }
        uint64_t k = last;
        for (;;) {
            if (k == 0) {
                return 0;
            }
            k--;
            if (++idx[k] < t->dims[k]) {
                break;
            }
            idx[k] = 0;
        }
    }
}

typedef struct poison_hit {
    const poison *p;
    uint64_t at; /* offset of the first poisoned byte found */
} poison_hit;

static int span_find(alloc *a, uint64_t lo, uint64_t hi, void *ctx) {
    const poison *p = poison_first(a, lo, hi);
    if (!p) {
        return 0;
    }
    poison_hit *hit = ctx;
    hit->p = p;
    hit->at = p->lo > lo ? p->lo : lo;
    return 1;
}

static int span_clear(alloc *a, uint64_t lo, uint64_t hi, void *ctx) {
    (void)ctx;
    poison_cut(a, lo, hi);
    return 0;
}

typedef struct poison_mark {
    poison_cause *cause;
    const char *name;
} poison_mark;

static int span_poison(alloc *a, uint64_t lo, uint64_t hi, void *ctx) {
    const poison_mark *m = ctx;
    poison_add(a, lo, hi, m->cause, m->name);
    return 0;
}

/* The allocation of `r` when it is alive and its span overlaps poison, else NULL: the fast path. */
static alloc *range_may_be_poisoned(const ascend_mock_range *r) {
    if (!g_poisoned_bytes || !r->len) {
        return NULL;
    }
    alloc *a = htab_get(&g_alloc_by_id, r->alloc_id);
    if (!a || !a->npoison || !poison_first(a, r->addr - a->base, r->addr - a->base + r->len)) {
        return NULL;
    }
    return a;
}

/* Whether range `r` touches poisoned bytes; if so, describes them in buf: "<r->name> [p, +n)
 * holds bytes that were never written (at q): they are bytes of <name> that task #N (<what> queued
 * on <stream>) should have written, but it was skipped: <why>". */
static int range_poisoned(const ascend_mock_range *r, char *buf, size_t cap) {
    alloc *a = range_may_be_poisoned(r);
    poison_hit hit = {NULL, 0};
    if (!a || !range_spans(a, r, span_find, &hit)) {
        return 0;
    }
    snprintf(buf, cap,
             "%s [%p, +%llu) holds bytes that were never written (at %p): they are bytes of %s that %s should have "
             "written, but it was skipped: %s",
             r->name, (void *)r->addr, (unsigned long long)r->len, (void *)(a->base + hit.at), hit.p->name,
             hit.p->cause->task, hit.p->cause->why);
    return 1;
}

/* Range `r` was written: its bytes are no longer poisoned. */
static void range_written(const ascend_mock_range *r) {
    alloc *a = range_may_be_poisoned(r);
    if (a) {
        range_spans(a, r, span_clear, NULL);
    }
}

/* Range `r` should have been written by the skipped task of `cause`: poisons it (if still alive). */
static void range_poison(const ascend_mock_range *r, poison_cause *cause) {
    alloc *a = r->len ? htab_get(&g_alloc_by_id, r->alloc_id) : NULL;
    if (a) {
        poison_mark m = {cause, r->name};
        range_spans(a, r, span_poison, &m);
    }
}

/* ---- devices, streams, events, tasks ------------------------------------------------------------- */
/* TASK_EVENT_WAIT: the marker aclrtStreamWaitEvent leaves on the waiting stream (a no-op when it
 * runs); while it is queued, destroying its event is a violation. */
enum { TASK_COPY, TASK_OP, TASK_EVENT, TASK_WAIT, TASK_EVENT_WAIT };

typedef struct task task;
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
    void *payload;
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
};

typedef struct event {
    uint64_t handle;
    int device;
    stream *recorded_on; /* valid while a record is pending: a stream is drained before it goes */
    uint64_t recorded_seq, completed_seq;
    double completed_ms; /* CLOCK_MONOTONIC time at which the last completed record ran */
} event;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

typedef struct device {
    int refcount;
    uint64_t gen;
    stream *default_stream;
} device;

static int g_initialized, g_ever_initialized;
static int g_device_count = 1;
static device g_devices[MAX_DEVICES];
static stream *g_streams;
static uint64_t g_queued_tasks;
static uint64_t g_task_seq;
static uint64_t g_event_seq;

static __thread int tls_device = -1;
static __thread uint64_t tls_device_gen;

static int current_device(void) {
    if (tls_device < 0 || tls_device >= g_device_count) {
        return -1;
    }
    device *d = &g_devices[tls_device];
    if (d->refcount <= 0 || d->gen != tls_device_gen) {
        return -1;
    }
    return tls_device;
}

static int init_check(const char *api) {
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

static void stream_link(stream *s) {
    s->prev = NULL;
    s->next = g_streams;
    if (g_streams) {
        g_streams->prev = s;
    }
    g_streams = s;
}

static void stream_unlink(stream *s) {
    if (s->prev) {
        s->prev->next = s->next;
    } else {
        g_streams = s->next;
    }
    if (s->next) {
        s->next->prev = s->prev;
    }
}

static stream *default_stream(int dev) {
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

static int stream_resolve(const char *api, aclrtStream h, stream **out) {
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
static void hazard_check(const char *what, const stream *self, const ascend_mock_range *r, size_t n) {
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

static event *event_get(uint64_t handle) {
    return ascend_mock_handle_get_locked(ASCEND_MOCK_KIND_EVENT, handle, NULL);
}

/* Skipping a task: what it should have written becomes poisoned, as `why` explains. */
static void poison_writes(const char *what, const char *where, uint64_t seq, const ascend_mock_range *ranges,
                          size_t n, const char *why) {
    poison_cause *cause = cause_new();
    snprintf(cause->task, sizeof cause->task, "task #%llu (%s queued on %s)", (unsigned long long)seq, what, where);
    snprintf(cause->why, sizeof cause->why, "%s", why);
    for (size_t i = 0; i < n; i++) {
        if (ranges[i].write) {
            range_poison(&ranges[i], cause);
        }
    }
    if (!cause->refs) {
        free(cause);
    }
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
static int run_head(stream *s, char *why, size_t cap) {
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
static int drain(stream *s, char *why, size_t cap) {
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
static int stream_quiesce(stream *s, char *why, size_t cap) {
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

#define WHY_MAX (MESSAGE_MAX - 128)

static int sync_failed(const char *api, int status, const char *where, const char *why) {
    return fail(status, api, "A task queued on %s failed: %s.", where, why);
}

static void enqueue(stream *s, task *t) {
    t->next = NULL;
    t->seq = ++g_task_seq;
    if (s->tail) {
        s->tail->next = t;
    } else {
        s->head = t;
    }
    s->tail = t;
    g_queued_tasks++;
}

static void enqueue_task(const char *what, aclrtStream h, const ascend_mock_range *ranges, size_t nranges, int kind,
                         ascend_mock_run_fn run, ascend_mock_wait_fn wait, ascend_mock_drop_fn drop, void *payload) {
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
    t->payload = payload;
    enqueue(s, t);
}

void ascend_mock_enqueue_locked(const char *what, aclrtStream h, const ascend_mock_range *ranges, size_t nranges,
                                ascend_mock_run_fn run, ascend_mock_drop_fn drop, void *payload) {
    enqueue_task(what, h, ranges, nranges, TASK_OP, run, NULL, drop, payload);
}

void ascend_mock_enqueue_waiting_locked(const char *what, aclrtStream h, const ascend_mock_range *ranges,
                                        size_t nranges, ascend_mock_wait_fn wait, ascend_mock_drop_fn drop,
                                        void *payload) {
    enqueue_task(what, h, ranges, nranges, TASK_WAIT, NULL, wait, drop, payload);
}

static uint64_t g_live_comms;

void ascend_mock_count_comms_locked(int delta) {
    g_live_comms = (uint64_t)((int64_t)g_live_comms + delta);
}

/* ---- init / finalize -------------------------------------------------------------------------------- */
static void release_device(int dev) {
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

aclError aclInit(const char *configPath) {
    (void)configPath;
    int st;
    if (ascend_mock_take_fault("aclInit", &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = 0;
    if (g_initialized) {
        r = fail(ACL_ERROR_REPEAT_INITIALIZE, "aclInit", "aclInit was already called in this process.");
    } else {
        int count = 1;
        const char *env = getenv("ASCEND_MOCK_DEVICE_COUNT");
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
    ascend_mock_unlock();
    return r;
}

aclError aclFinalize(void) {
    int st;
    if (ascend_mock_take_fault("aclFinalize", &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = 0;
    if (!g_initialized) {
        r = g_ever_initialized
                ? fail(ACL_ERROR_REPEAT_FINALIZE, "aclFinalize", "aclFinalize was already called.")
                : violate(ACL_ERROR_UNINITIALIZE, "aclFinalize", "ACL is not initialized: call aclInit first");
    } else {
        for (stream *s = g_streams; s; s = s->next) {
            drain(s, NULL, 0);
        }
        for (int dev = 0; dev < MAX_DEVICES; dev++) {
            release_device(dev);
        }
        g_initialized = 0;
    }
    ascend_mock_unlock();
    return r;
}

/* ---- devices ---------------------------------------------------------------------------------------- */
aclError aclrtSetDevice(int32_t deviceId) {
    static const char api[] = "aclrtSetDevice";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = init_check(api);
    if (!r && (deviceId < 0 || deviceId >= g_device_count)) {
        r = fail(ACL_ERROR_RT_INVALID_DEVICEID, api, "Device id %d is invalid: this machine has %d device(s).",
                 (int)deviceId, g_device_count);
    }
    if (!r) {
        device *d = &g_devices[deviceId];
        d->refcount++;
        default_stream(deviceId);
        tls_device = deviceId;
        tls_device_gen = d->gen;
    }
    ascend_mock_unlock();
    return r;
}

aclError aclrtResetDevice(int32_t deviceId) {
    static const char api[] = "aclrtResetDevice";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = init_check(api);
    if (!r && (deviceId < 0 || deviceId >= g_device_count)) {
        r = fail(ACL_ERROR_RT_INVALID_DEVICEID, api, "Device id %d is invalid: this machine has %d device(s).",
                 (int)deviceId, g_device_count);
    }
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
    ascend_mock_unlock();
    return r;
}

aclError aclrtGetDevice(int32_t *deviceId) {
    static const char api[] = "aclrtGetDevice";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = init_check(api);
    if (!r && !deviceId) {
        r = fail(ACL_ERROR_INVALID_PARAM, api, "deviceId is null.");
    }
    if (!r) {
        int dev = current_device();
        if (dev < 0) {
            r = fail(ACL_ERROR_RT_CONTEXT_NULL, api, "No device is set on this thread.");
        } else {
            *deviceId = dev;
        }
    }
    ascend_mock_unlock();
    return r;
}

aclError aclrtGetDeviceCount(uint32_t *count) {
    static const char api[] = "aclrtGetDeviceCount";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = init_check(api);
    if (!r && !count) {
        r = fail(ACL_ERROR_INVALID_PARAM, api, "count is null.");
    }
    if (!r) {
        *count = (uint32_t)g_device_count;
    }
    ascend_mock_unlock();
    return r;
}

aclError aclrtSynchronizeDevice(void) {
    static const char api[] = "aclrtSynchronizeDevice";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    if (!r) {
        g_device_syncs++;
        int dev = current_device();
        for (stream *s = g_streams; s; s = s->next) {
            if (s->device == dev) {
                char why[WHY_MAX] = "";
                int sst = drain(s, why, sizeof why);
                if (sst && !r) {
                    r = sync_failed(api, sst, s->name, why);
                }
            }
        }
    }
    ascend_mock_unlock();
    return r;
}

/* ---- streams --------------------------------------------------------------------------------------- */
aclError aclrtCreateStream(aclrtStream *out) {
    static const char api[] = "aclrtCreateStream";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        if (out) {
            *out = NULL;
        }
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    if (!r && !out) {
        r = fail(ACL_ERROR_INVALID_PARAM, api, "stream is null.");
    }
    if (!r) {
        stream *s = xcalloc(1, sizeof *s);
        s->device = current_device();
        s->handle = ascend_mock_handle_new_locked(ASCEND_MOCK_KIND_STREAM, s);
        snprintf(s->name, sizeof s->name, "stream %p", (void *)(uintptr_t)s->handle);
        stream_link(s);
        *out = (aclrtStream)(uintptr_t)s->handle;
    }
    ascend_mock_unlock();
    return r;
}

aclError aclrtDestroyStream(aclrtStream h) {
    static const char api[] = "aclrtDestroyStream";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    if (!r && !h) {
        r = violate(ACL_ERROR_INVALID_PARAM, api, "stream is null (the default stream cannot be destroyed)");
    }
    stream *s = NULL;
    if (!r) {
        r = stream_resolve(api, h, &s);
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
    ascend_mock_unlock();
    return r;
}

aclError aclrtSynchronizeStream(aclrtStream h) {
    static const char api[] = "aclrtSynchronizeStream";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    stream *s = NULL;
    if (!r) {
        r = stream_resolve(api, h, &s);
    }
    if (!r) {
        g_stream_syncs++;
        char why[WHY_MAX] = "";
        int sst = drain(s, why, sizeof why);
        if (sst) {
            r = sync_failed(api, sst, s->name, why);
        }
    }
    ascend_mock_unlock();
    return r;
}

/* ---- memory ------------------------------------------------------------------------------------------ */
aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    static const char api[] = "aclrtMalloc";
    (void)policy;
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        if (devPtr) {
            *devPtr = NULL;
        }
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    if (!r && !devPtr) {
        r = fail(ACL_ERROR_INVALID_PARAM, api, "devPtr is null.");
    }
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
        alloc *a = xcalloc(1, sizeof *a);
        a->base = (uintptr_t)p;
        a->size = size;
        a->id = g_next_alloc_id++;
        a->device = current_device();
        if (g_nallocs == g_cap_allocs) {
            g_cap_allocs = g_cap_allocs ? g_cap_allocs * 2 : 64;
            alloc **bigger = realloc(g_allocs, g_cap_allocs * sizeof *g_allocs);
            if (!bigger) {
                fprintf(stderr, "ascend mock CANN: out of host memory\n");
                abort();
            }
            g_allocs = bigger;
        }
        size_t i = alloc_upper(a->base);
        memmove(&g_allocs[i + 1], &g_allocs[i], (g_nallocs - i) * sizeof *g_allocs);
        g_allocs[i] = a;
        g_nallocs++;
        htab_put(&g_alloc_by_id, a->id, a);
        g_device_mallocs++;
        tls_mallocs++;
        *devPtr = p;
    }
    ascend_mock_unlock();
    return r;
}

aclError aclrtFree(void *devPtr) {
    static const char api[] = "aclrtFree";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    if (!r && !devPtr) {
        r = fail(ACL_ERROR_INVALID_PARAM, api, "devPtr is null.");
    }
    if (!r) {
        uintptr_t p = (uintptr_t)devPtr;
        size_t i = alloc_upper(p);
        alloc *a = (i > 0 && g_allocs[i - 1]->base == p) ? g_allocs[i - 1] : NULL;
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
            g_device_frees++;
            memmove(&g_allocs[i - 1], &g_allocs[i], (g_nallocs - i) * sizeof *g_allocs);
            g_nallocs--;
            htab_del(&g_alloc_by_id, a->id);
            poison_drop_all(a);
            free((void *)a->base);
            free(a);
        }
    }
    ascend_mock_unlock();
    return r;
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
    if (!r) {
        r = copy_side(api, "src", (uintptr_t)src, count, src_dev, k, &ranges[*nranges], nranges);
    }
    return r;
}

aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind) {
    static const char api[] = "aclrtMemcpy";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    ascend_mock_range ranges[2];
    int n = 0;
    if (!r) {
        r = copy_check(api, dst, destMax, src, count, kind, ranges, &n);
    }
    if (!r) {
        g_blocking_copies++;
    }
    if (!r && count) {
        hazard_check(api, NULL, ranges, (size_t)n);
        char detail[MESSAGE_MAX - 64];
        for (int i = 0; i < n && !r; i++) {
            if (!ranges[i].write && range_poisoned(&ranges[i], detail, sizeof detail)) {
                /* not a new violation: the misuse was counted when the task was skipped */
                detail[0] = (char)toupper((unsigned char)detail[0]);
                r = fail(ACL_ERROR_RT_DEVICE_MEM_ERROR, api, "%s. Nothing was copied.", detail);
            }
        }
        if (!r) {
            memmove(dst, src, count);
            for (int i = 0; i < n; i++) {
                if (ranges[i].write) {
                    range_written(&ranges[i]);
                }
            }
        }
    }
    ascend_mock_unlock();
    return r;
}

aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                          aclrtStream h) {
    static const char api[] = "aclrtMemcpyAsync";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    stream *s = NULL;
    if (!r) {
        r = stream_resolve(api, h, &s);
    }
    ascend_mock_range ranges[2];
    int n = 0;
    if (!r) {
        r = copy_check(api, dst, destMax, src, count, kind, ranges, &n);
    }
    if (!r && count) {
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
    ascend_mock_unlock();
    return r;
}

aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count) {
    static const char api[] = "aclrtMemset";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
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
    ascend_mock_unlock();
    return r;
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

aclError aclrtCreateEvent(aclrtEvent *out) {
    static const char api[] = "aclrtCreateEvent";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        if (out) {
            *out = NULL;
        }
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    if (!r && !out) {
        r = fail(ACL_ERROR_INVALID_PARAM, api, "event is null.");
    }
    if (!r) {
        event *e = xcalloc(1, sizeof *e);
        e->device = current_device();
        e->handle = ascend_mock_handle_new_locked(ASCEND_MOCK_KIND_EVENT, e);
        *out = (aclrtEvent)(uintptr_t)e->handle;
    }
    ascend_mock_unlock();
    return r;
}

aclError aclrtDestroyEvent(aclrtEvent h) {
    static const char api[] = "aclrtDestroyEvent";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    event *e = NULL;
    if (!r) {
        r = event_resolve(api, h, &e);
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
        free(e);
    }
    ascend_mock_unlock();
    return r;
}

aclError aclrtRecordEvent(aclrtEvent eh, aclrtStream sh) {
    static const char api[] = "aclrtRecordEvent";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    event *e = NULL;
    stream *s = NULL;
    if (!r) {
        r = event_resolve(api, eh, &e);
    }
    if (!r) {
        r = stream_resolve(api, sh, &s);
    }
    if (!r) {
        task *t = xcalloc(1, sizeof *t);
        t->kind = TASK_EVENT;
        t->what = "event record";
        t->event_handle = e->handle;
        t->event_seq = ++g_event_seq;
        e->recorded_seq = t->event_seq;
        e->recorded_on = s;
        enqueue(s, t);
    }
    ascend_mock_unlock();
    return r;
}

aclError aclrtSynchronizeEvent(aclrtEvent eh) {
    static const char api[] = "aclrtSynchronizeEvent";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    event *e = NULL;
    if (!r) {
        r = event_resolve(api, eh, &e);
    }
    if (!r) {
        g_event_syncs++;
        r = event_wait(api, e->handle);
    }
    ascend_mock_unlock();
    return r;
}

aclError aclrtStreamWaitEvent(aclrtStream sh, aclrtEvent eh) {
    static const char api[] = "aclrtStreamWaitEvent";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    stream *s = NULL;
    event *e = NULL;
    if (!r) {
        r = stream_resolve(api, sh, &s);
    }
    if (!r) {
        r = event_resolve(api, eh, &e);
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
    ascend_mock_unlock();
    return r;
}

aclError aclrtQueryEventStatus(aclrtEvent eh, aclrtEventRecordedStatus *status) {
    static const char api[] = "aclrtQueryEventStatus";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    event *e = NULL;
    if (!r) {
        r = event_resolve(api, eh, &e);
    }
    if (!r && !status) {
        r = fail(ACL_ERROR_INVALID_PARAM, api, "status is null.");
    }
    if (!r) {
        /* Non-blocking: runs nothing. Never recorded = NOT_READY, as rtEventQueryStatus reports. */
        int done = e->recorded_seq != 0 && e->completed_seq >= e->recorded_seq;
        *status = done ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    }
    ascend_mock_unlock();
    return r;
}

aclError aclrtEventElapsedTime(float *ms, aclrtEvent start, aclrtEvent end) {
    static const char api[] = "aclrtEventElapsedTime";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    event *a = NULL, *b = NULL;
    if (!r && !ms) {
        r = fail(ACL_ERROR_INVALID_PARAM, api, "ms is null.");
    }
    if (!r) {
        r = event_resolve(api, start, &a);
    }
    if (!r) {
        r = event_resolve(api, end, &b);
    }
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
    ascend_mock_unlock();
    return r;
}

/* ---- pinned host memory ----------------------------------------------------------------------------- */
static htab g_host_allocs; /* base address -> size (boxed) of aclrtMallocHost blocks */

aclError aclrtMallocHost(void **hostPtr, size_t size) {
    static const char api[] = "aclrtMallocHost";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        if (hostPtr) {
            *hostPtr = NULL;
        }
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    if (!r && !hostPtr) {
        r = fail(ACL_ERROR_INVALID_PARAM, api, "hostPtr is null.");
    }
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
    ascend_mock_unlock();
    return r;
}

aclError aclrtFreeHost(void *hostPtr) {
    static const char api[] = "aclrtFreeHost";
    int st;
    if (ascend_mock_take_fault(api, &st)) {
        return st;
    }
    ascend_mock_lock();
    int r = ascend_mock_runtime_ready_locked(api);
    if (!r && !hostPtr) {
        r = fail(ACL_ERROR_INVALID_PARAM, api, "hostPtr is null.");
    }
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
    ascend_mock_unlock();
    return r;
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
    ascend_mock_unlock();
    out->violations = ascend_mock_violation_count();
}

uint64_t ascend_mock_thread_violations(void) {
    return tls_violations;
}

uint64_t ascend_mock_thread_device_mallocs(void) {
    return tls_mallocs;
}

uint64_t ascend_mock_violation_count(void) {
    pthread_mutex_lock(&g_log_lock);
    uint64_t n = g_violations;
    pthread_mutex_unlock(&g_log_lock);
    return n;
}

size_t ascend_mock_violation_message(uint64_t index, char *buf, size_t cap) {
    size_t needed = 0;
    pthread_mutex_lock(&g_log_lock);
    if (index < g_violations && g_violations - index <= VIOLATION_RING) {
        const char *msg = g_violation_ring[index % VIOLATION_RING];
        needed = strlen(msg) + 1;
        if (buf && cap) {
            size_t n = needed < cap ? needed : cap;
            memcpy(buf, msg, n - 1);
            buf[n - 1] = '\0';
        }
    }
    pthread_mutex_unlock(&g_log_lock);
    return needed;
}
