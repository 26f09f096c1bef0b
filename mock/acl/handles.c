/*
 * Mock CANN, libascendcl.so: handles. A small hash table, the handle table of streams, events,
 * tensors and executors (unique, never reused tokens, not addresses, so a stale handle is always
 * told apart from a live one), and the names of dtypes and formats.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

#define HANDLE_TAG 0xA5C0ULL

/* ---- a small hash table (uint64 key != 0 -> pointer), linear probing ---------------------------- */
void *xcalloc(size_t n, size_t size) {
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

void htab_put(htab *h, uint64_t key, void *val) {
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

void *htab_get(const htab *h, uint64_t key) {
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

void *htab_del(htab *h, uint64_t key) {
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
static uint64_t g_next_id[ASCEND_MOCK_KIND_COUNT] = {1, 1, 1, 1, 1, 1};
uint64_t g_live[ASCEND_MOCK_KIND_COUNT];

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

/* A value's name in a table of them, `unknown` for a value the table does not hold. */
typedef struct {
    int value;
    const char *name;
} mock_name;

static const char *name_in(const mock_name *table, size_t n, int value, const char *unknown) {
    for (size_t i = 0; i < n; i++) {
        if (table[i].value == value) {
            return table[i].name;
        }
    }
    return unknown;
}

static const mock_name k_dtype_names[] = {
    {ACL_FLOAT, "DT_FLOAT"},
    {ACL_FLOAT16, "DT_FLOAT16"},
    {ACL_BF16, "DT_BFLOAT16"},
    {ACL_INT8, "DT_INT8"},
    {ACL_INT16, "DT_INT16"},
    {ACL_INT32, "DT_INT32"},
    {ACL_INT64, "DT_INT64"},
    {ACL_UINT8, "DT_UINT8"},
    {ACL_UINT16, "DT_UINT16"},
    {ACL_UINT32, "DT_UINT32"},
    {ACL_UINT64, "DT_UINT64"},
    {ACL_DOUBLE, "DT_DOUBLE"},
    {ACL_BOOL, "DT_BOOL"},
    {ACL_STRING, "DT_STRING"},
    {ACL_COMPLEX64, "DT_COMPLEX64"},
    {ACL_COMPLEX128, "DT_COMPLEX128"},
    {ACL_COMPLEX32, "DT_COMPLEX32"},
    {ACL_DT_UNDEFINED, "DT_UNDEFINED"},
};

const char *ascend_mock_dtype_name(aclDataType dtype) {
    return name_in(k_dtype_names, sizeof k_dtype_names / sizeof *k_dtype_names, (int)dtype, "DT_UNKNOWN");
}

/* The format's name is its enumerator's, less the ACL_FORMAT_ prefix (ACL_FRACTAL_Z_3D has none). */
#define FORMAT_NAME(f) {ACL_FORMAT_##f, #f}
static const mock_name k_format_names[] = {
    FORMAT_NAME(NCHW),
    FORMAT_NAME(NHWC),
    FORMAT_NAME(ND),
    FORMAT_NAME(NC1HWC0),
    FORMAT_NAME(FRACTAL_Z),
    FORMAT_NAME(NC1HWC0_C04),
    FORMAT_NAME(HWCN),
    FORMAT_NAME(NDHWC),
    FORMAT_NAME(FRACTAL_NZ),
    FORMAT_NAME(NCDHW),
    FORMAT_NAME(NDC1HWC0),
    {ACL_FRACTAL_Z_3D, "FRACTAL_Z_3D"},
    FORMAT_NAME(NC),
    FORMAT_NAME(NCL),
    FORMAT_NAME(FRACTAL_NZ_C0_16),
    FORMAT_NAME(FRACTAL_NZ_C0_32),
    FORMAT_NAME(FRACTAL_NZ_C0_2),
    FORMAT_NAME(FRACTAL_NZ_C0_4),
    FORMAT_NAME(FRACTAL_NZ_C0_8),
    FORMAT_NAME(UNDEFINED),
};
#undef FORMAT_NAME

const char *ascend_mock_format_name(aclFormat format) {
    return name_in(k_format_names, sizeof k_format_names / sizeof *k_format_names, (int)format, "UNKNOWN");
}
