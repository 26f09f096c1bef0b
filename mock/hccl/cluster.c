/*
 * Mock CANN, libhccl.so: HcclCommInitClusterInfo, a communicator from a rank-table file
 * (HCCL docs/zh/user_guide/cluster_info_config/rank_table_config_{910,a2,a3,a5}.md; docs/cann/HCCL.md 4.5.3).
 *
 * The mock reads the table as HCCL does before any link is made, and strictly:
 *   - the path is non-null, shorter than 4096 bytes with its NUL, names a readable regular file of at most 16 MiB;
 *   - the file is JSON (comments are not allowed: HCCL's docs say to delete them);
 *   - version "1.0" or "1.2" (AI Server mode and A3 super-node mode): "status" is "completed", "server_list" is a
 *     non-empty array of servers, each with a "device" array whose entries have "rank_id" and "device_id"
 *     (decimal strings, as in the docs' examples, or numbers); version "2.0" (Ascend 950): "rank_count" and
 *     "rank_list" of entries with "rank_id" and "device_id"; "status", when present, is "completed";
 *   - the rank ids are exactly 0..n-1, each once (n = the world size, at most 64 in the mock), "rank_count" (2.0)
 *     and "server_count" (1.x, when present) agree with the lists; `rank` is one of them;
 *   - the calling thread's current device is that rank's "device_id" (the mock's logical ids are its physical
 *     ids; on real CANN device_id is the physical id of the device the thread set).
 * Every rejection returns HCCL_E_PARA with a message naming the path and what is wrong (aclGetRecentErrMsg).
 * Then the ranks meet as with a root info (ranks may be threads or processes, group.c): the group is named by
 * a hash of the table's bytes and of its real path, so every rank of one table joins the same group.
 */
#define _XOPEN_SOURCE 700

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"

#define CLUSTER_PATH_MAX 4096
#define CLUSTER_FILE_MAX (16u << 20)
#define CLUSTER_MAX_RANKS 64
#define JSON_MAX_DEPTH 32

/* ---- a strict, non-allocating JSON reader over the file's bytes ------------------------------------------- */
typedef struct jr {
    const char *s, *end;
    const char *err; /* first error */
    size_t err_at;
} jr;

static const char *j_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) {
        p++;
    }
    return p;
}

static const char *j_fail(jr *r, const char *p, const char *why) {
    if (!r->err) {
        r->err = why;
        r->err_at = (size_t)(p - r->s);
    }
    return NULL;
}

/* Skips one value starting at p (after whitespace); returns the end of it or NULL. */
static const char *j_skip(jr *r, const char *p, int depth);

static const char *j_string_end(jr *r, const char *p) {
    if (p >= r->end || *p != '"') {
        return j_fail(r, p, "a string was expected");
    }
    for (p++; p < r->end; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch == '"') {
            return p + 1;
        }
        if (ch < 0x20) {
            return j_fail(r, p, "a control character inside a string");
        }
        if (ch == '\\') {
            p++;
            if (p >= r->end || !strchr("\"\\/bfnrtu", *p)) {
                return j_fail(r, p, "a bad escape in a string");
            }
        }
    }
    return j_fail(r, p, "an unterminated string");
}

static const char *j_skip(jr *r, const char *p, int depth) {
    p = j_ws(p, r->end);
    if (p >= r->end) {
        return j_fail(r, p, "a value was expected, the file ended");
    }
    if (depth > JSON_MAX_DEPTH) {
        return j_fail(r, p, "nested too deeply");
    }
    if (*p == '"') {
        return j_string_end(r, p);
    }
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        int object = *p == '{';
        p = j_ws(p + 1, r->end);
        if (p < r->end && *p == close) {
            return p + 1;
        }
        for (;;) {
            if (object) {
                p = j_string_end(r, j_ws(p, r->end));
                if (!p) {
                    return NULL;
                }
                p = j_ws(p, r->end);
                if (p >= r->end || *p != ':') {
                    return j_fail(r, p, "':' was expected after a key");
                }
                p++;
            }
            p = j_skip(r, p, depth + 1);
            if (!p) {
                return NULL;
            }
            p = j_ws(p, r->end);
            if (p < r->end && *p == ',') {
                p++;
                continue;
            }
            if (p < r->end && *p == close) {
                return p + 1;
            }
            return j_fail(r, p, object ? "',' or '}' was expected" : "',' or ']' was expected");
        }
    }
    if (*p == '-' || (*p >= '0' && *p <= '9')) {
        const char *q = p + (*p == '-');
        if (q >= r->end || !(*q >= '0' && *q <= '9')) {
            return j_fail(r, p, "a bad number");
        }
        while (q < r->end && ((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E' || *q == '+' ||
                              *q == '-')) {
            q++;
        }
        return q;
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(r->end - p) >= n && memcmp(p, words[i], n) == 0) {
            return p + n;
        }
    }
    return j_fail(r, p, "not JSON (comments are not allowed in a rank table)");
}

/* The value of `key` in the object at p (already validated), or NULL. */
static const char *j_get(jr *r, const char *p, const char *key) {
    p = j_ws(p, r->end);
    if (p >= r->end || *p != '{') {
        return NULL;
    }
    p = j_ws(p + 1, r->end);
    size_t klen = strlen(key);
    while (p < r->end && *p == '"') {
        const char *kend = j_string_end(r, p);
        int match = (size_t)(kend - p) == klen + 2 && memcmp(p + 1, key, klen) == 0;
        p = j_ws(kend, r->end) + 1; /* the ':' */
        const char *v = j_ws(p, r->end);
        if (match) {
            return v;
        }
        p = j_ws(j_skip(r, v, 0), r->end);
        if (*p == ',') {
            p = j_ws(p + 1, r->end);
        }
    }
    return NULL;
}

/* The i-th element of the array at p (already validated), or NULL; *count gets the length when i < 0. */
static const char *j_index(jr *r, const char *p, long i, long *count) {
    p = j_ws(p, r->end);
    if (p >= r->end || *p != '[') {
        return NULL;
    }
    p = j_ws(p + 1, r->end);
    long n = 0;
    while (p < r->end && *p != ']') {
        if (n == i) {
            return p;
        }
        n++;
        p = j_ws(j_skip(r, p, 0), r->end);
        if (*p == ',') {
            p = j_ws(p + 1, r->end);
        }
    }
    if (count) {
        *count = n;
    }
    return NULL;
}

static int j_is(const char *p, char c) {
    return p && *p == c;
}

/* A non-negative integer: a number or a string of decimal digits. Returns 0 and sets *out, or -1. */
static int j_uint(jr *r, const char *p, long long max, long long *out) {
    if (!p) {
        return -1;
    }
    const char *q = p, *e;
    if (*p == '"') {
        q = p + 1;
        e = j_string_end(r, p) - 1;
    } else {
        e = j_skip(r, p, 0);
    }
    if (!e || q == e || e - q > 18) {
        return -1;
    }
    long long v = 0;
    for (const char *c = q; c < e; c++) {
        if (*c < '0' || *c > '9') {
            return -1;
        }
        v = v * 10 + (*c - '0');
    }
    if (v > max) {
        return -1;
    }
    *out = v;
    return 0;
}

/* Whether the string at p equals `want`. */
static int j_str_eq(jr *r, const char *p, const char *want) {
    if (!j_is(p, '"')) {
        return 0;
    }
    const char *e = j_string_end(r, p);
    size_t n = strlen(want);
    return e && (size_t)(e - p) == n + 2 && memcmp(p + 1, want, n) == 0;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ b[i]) * 0x100000001b3ULL;
    }
    return h;
}

/* ---- the table ------------------------------------------------------------------------------------------ */
typedef struct table {
    uint32_t nranks;
    int32_t device[CLUSTER_MAX_RANKS]; /* by rank id */
} table;

/* Records one entry (rank_id, device_id) of the table; returns NULL or what is wrong. */
static const char *table_add(jr *r, table *t, const char *entry, char *why, size_t cap, const char *where) {
    long long rank, dev;
    if (!j_is(entry, '{')) {
        snprintf(why, cap, "%s is not an object", where);
        return why;
    }
    if (j_uint(r, j_get(r, entry, "rank_id"), CLUSTER_MAX_RANKS - 1, &rank)) {
        snprintf(why, cap, "%s has no \"rank_id\" that is an integer in [0, %d] (the mock's limit)", where,
                 CLUSTER_MAX_RANKS - 1);
        return why;
    }
    if (j_uint(r, j_get(r, entry, "device_id"), 64, &dev)) {
        snprintf(why, cap, "%s (rank_id %lld) has no \"device_id\" that is an integer in [0, 64]", where, rank);
        return why;
    }
    if (t->device[rank] >= 0) {
        snprintf(why, cap, "rank_id %lld appears twice", rank);
        return why;
    }
    t->device[rank] = (int32_t)dev;
    t->nranks++;
    return NULL;
}

/* Reads the table from the file's bytes; returns NULL or what is wrong. */
/* The length of the array at p; 0 when p is not an array (or is empty). */
static long j_len(jr *r, const char *p) {
    long n = 0;
    if (j_is(p, '[')) {
        j_index(r, p, -1, &n);
    }
    return n;
}

/* Adds the n entries of the array `list` to t, the i-th named "<name>[i]" in a refusal. */
static const char *table_add_all(jr *r, table *t, const char *list, long n, const char *name, char *why, size_t cap) {
    char where[96];
    for (long i = 0; i < n; i++) {
        snprintf(where, sizeof where, "%s[%ld]", name, i);
        if (table_add(r, t, j_index(r, list, i, NULL), why, cap, where)) {
            return why;
        }
    }
    return NULL;
}

static const char *table_parse(const char *text, size_t len, table *t, char *why, size_t cap) {
    jr r = {text, text + len, NULL, 0};
    for (int i = 0; i < CLUSTER_MAX_RANKS; i++) {
        t->device[i] = -1;
    }
    t->nranks = 0;
    const char *end = j_skip(&r, text, 0);
    if (end && j_ws(end, r.end) != r.end) {
        j_fail(&r, end, "text after the JSON value");
    }
    if (r.err) {
        snprintf(why, cap, "it is not valid JSON: %s at byte %zu", r.err, r.err_at);
        return why;
    }
    const char *root = j_ws(text, r.end);
    if (!j_is(root, '{')) {
        snprintf(why, cap, "it is not a JSON object");
        return why;
    }
    const char *version = j_get(&r, root, "version");
    const char *status = j_get(&r, root, "status");
    int v2 = j_str_eq(&r, version, "2.0");
    if (!v2 && !j_str_eq(&r, version, "1.0") && !j_str_eq(&r, version, "1.2")) {
        snprintf(why, cap, "\"version\" must be \"1.0\", \"1.2\" or \"2.0\"");
        return why;
    }
    if ((!v2 || status) && !j_str_eq(&r, status, "completed")) {
        snprintf(why, cap, "\"status\" must be \"completed\" (the table is not ready)");
        return why;
    }
    if (v2) {
        const char *list = j_get(&r, root, "rank_list");
        long n = j_len(&r, list);
        if (n == 0) {
            snprintf(why, cap, "version 2.0 needs a non-empty \"rank_list\" array");
            return why;
        }
        if (table_add_all(&r, t, list, n, "rank_list", why, cap)) {
            return why;
        }
        long long count;
        if (j_uint(&r, j_get(&r, root, "rank_count"), 65536, &count) || count != (long long)t->nranks) {
            snprintf(why, cap, "\"rank_count\" must be the number of entries of \"rank_list\" (%u)", t->nranks);
            return why;
        }
    } else {
        const char *servers = j_get(&r, root, "server_list");
        long ns = j_len(&r, servers);
        if (ns == 0) {
            snprintf(why, cap, "a non-empty \"server_list\" array is required");
            return why;
        }
        for (long s = 0; s < ns; s++) {
            const char *server = j_index(&r, servers, s, NULL);
            const char *devices = j_is(server, '{') ? j_get(&r, server, "device") : NULL;
            long nd = j_len(&r, devices);
            if (nd == 0) {
                snprintf(why, cap, "server_list[%ld] has no non-empty \"device\" array", s);
                return why;
            }
            char name[64];
            snprintf(name, sizeof name, "server_list[%ld].device", s);
            if (table_add_all(&r, t, devices, nd, name, why, cap)) {
                return why;
            }
        }
        const char *sc = j_get(&r, root, "server_count");
        long long count;
        if (sc && (j_uint(&r, sc, 1 << 20, &count) || count != ns)) {
            snprintf(why, cap, "\"server_count\" must be the number of entries of \"server_list\" (%ld)", ns);
            return why;
        }
    }
    for (uint32_t i = 0; i < t->nranks; i++) {
        if (t->device[i] < 0) {
            snprintf(why, cap, "the rank ids are not 0..%u: rank_id %u is missing", t->nranks - 1, i);
            return why;
        }
    }
    return NULL;
}

HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank, HcclComm *comm) {
    static const char api[] = "HcclCommInitClusterInfo";
    MOCK_ENTER(api, comm);
    if (!clusterInfo) {
        ascend_mock_set_error("%s failed. ERROR: 2 (HCCL_E_PTR). clusterInfo is null.", api);
        return HCCL_E_PTR;
    }
    if (!comm) {
        ascend_mock_set_error("%s failed. ERROR: 2 (HCCL_E_PTR). comm is null.", api);
        return HCCL_E_PTR;
    }
    *comm = NULL;
    size_t plen = strnlen(clusterInfo, CLUSTER_PATH_MAX);
    if (plen >= CLUSTER_PATH_MAX) {
        ascend_mock_set_error("%s failed. ERROR: 1 (HCCL_E_PARA). The rank table path is %zu bytes or longer; at most "
                              "%d with its NUL.",
                              api, plen, CLUSTER_PATH_MAX);
        return HCCL_E_PARA;
    }
    char real[PATH_MAX];
    struct stat sb;
    errno = 0;
    if (!realpath(clusterInfo, real) || stat(real, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        ascend_mock_set_error("%s failed. ERROR: 1 (HCCL_E_PARA). path %s is not a valid real path (%s).", api,
                              clusterInfo, errno ? strerror(errno) : "not a regular file");
        return HCCL_E_PARA;
    }
    if ((uint64_t)sb.st_size > CLUSTER_FILE_MAX) {
        ascend_mock_set_error("%s failed. ERROR: 1 (HCCL_E_PARA). rank table %s is %lld bytes, over the mock's %u.",
                              api, clusterInfo, (long long)sb.st_size, CLUSTER_FILE_MAX);
        return HCCL_E_PARA;
    }
    FILE *f = fopen(real, "rb");
    char *text = f ? malloc((size_t)sb.st_size + 1) : NULL;
    size_t len = text ? fread(text, 1, (size_t)sb.st_size, f) : 0;
    int read_error = !f || !text || ferror(f);
    if (f) {
        fclose(f);
    }
    if (read_error) {
        free(text);
        ascend_mock_set_error("%s failed. ERROR: 1 (HCCL_E_PARA). rank table %s cannot be read.", api, clusterInfo);
        return HCCL_E_PARA;
    }
    table t;
    char why[256];
    const char *bad = table_parse(text, len, &t, why, sizeof why);
    uint64_t key[2] = {fnv1a(0xcbf29ce484222325ULL, text, len), fnv1a(0xcbf29ce484222325ULL, real, strlen(real))};
    free(text);
    if (bad) {
        ascend_mock_set_error("%s failed. ERROR: 1 (HCCL_E_PARA). rank table %s: %s.", api, clusterInfo, bad);
        return HCCL_E_PARA;
    }
    if (rank >= t.nranks) {
        ascend_mock_set_error("%s failed. ERROR: 1 (HCCL_E_PARA). rank %u is not a rank_id of rank table %s (ranks "
                              "0..%u).",
                              api, rank, clusterInfo, t.nranks - 1);
        return HCCL_E_PARA;
    }
    ascend_mock_lock();
    int ready = ascend_mock_runtime_ready_locked(api);
    int dev = ascend_mock_current_device_locked();
    ascend_mock_unlock();
    if (ready) {
        ascend_mock_set_error("%s failed. ERROR: 15 (HCCL_E_RUNTIME). The runtime is not ready (aclInit, then "
                              "aclrtSetDevice on this thread): ACL error %d.",
                              api, ready);
        return HCCL_E_RUNTIME;
    }
    if (dev != t.device[rank]) {
        ascend_mock_violation("%s: rank %u of rank table %s is on device_id %d, but the calling thread's current "
                              "device is %d",
                              api, rank, clusterInfo, (int)t.device[rank], dev);
        ascend_mock_set_error("%s failed. ERROR: 1 (HCCL_E_PARA). rank %u of rank table %s is on device_id %d, but "
                              "the current device is %d.",
                              api, rank, clusterInfo, (int)t.device[rank], dev);
        return HCCL_E_PARA;
    }
    return ascend_mock_hccl_join_keyed(api, t.nranks, key, rank, comm);
}
