/*
 * Mock CANN, libascendcl.so: device memory. The table of live aclrtMalloc blocks (sorted by
 * address, and by id), and poison: the bytes a skipped task should have written.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- device memory ------------------------------------------------------------------------------ */
static alloc **g_allocs; /* sorted by base */
size_t g_nallocs;
static size_t g_cap_allocs;
static htab g_alloc_by_id;
static uint64_t g_next_alloc_id = 1;

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

alloc *alloc_containing(uintptr_t p, uint64_t len) {
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

int overlaps_any(uintptr_t p, uint64_t len) {
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

alloc *alloc_add(void *p, uint64_t size, int device) {
    alloc *a = xcalloc(1, sizeof *a);
    a->base = (uintptr_t)p;
    a->size = size;
    a->id = g_next_alloc_id++;
    a->device = device;
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
    return a;
}

int alloc_on_device(int dev) {
    for (size_t i = 0; i < g_nallocs; i++) {
        if (g_allocs[i]->device == dev) {
            return 1;
        }
    }
    return 0;
}

alloc *alloc_at(uintptr_t p) {
    size_t i = alloc_upper(p);
    return (i > 0 && g_allocs[i - 1]->base == p) ? g_allocs[i - 1] : NULL;
}

static void poison_drop_all(alloc *a);

void alloc_remove(alloc *a) {
    size_t i = alloc_upper(a->base);
    memmove(&g_allocs[i - 1], &g_allocs[i], (g_nallocs - i) * sizeof *g_allocs);
    g_nallocs--;
    htab_del(&g_alloc_by_id, a->id);
    poison_drop_all(a);
    free((void *)a->base);
    free(a);
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

uint64_t g_poisoned_bytes;

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
int range_poisoned(const ascend_mock_range *r, char *buf, size_t cap) {
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
void range_written(const ascend_mock_range *r) {
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

/* Skipping a task: what it should have written becomes poisoned, as `why` explains. */
void poison_writes(const char *what, const char *where, uint64_t seq, const ascend_mock_range *ranges, size_t n,
                   const char *why) {
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
