/*
 * Mock CANN, libhccl.so: diagnostics (error text and violations in HCCL's words), time and
 * environment, HcclDataType and HcclReduceOp.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

/* ---- diagnostics ---------------------------------------------------------------------------------- */
const char *result_name(int code) {
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

/* hfail() and hviolate() (internal.h). */
HcclResult hreport(HcclResult code, int violation, const char *api, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ascend_mock_report_v(violation, api, (int)code, result_name((int)code), MSG_MAX, fmt, ap);
    va_end(ap);
    return code;
}

/* ---- time and environment ------------------------------------------------------------------------ */
uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * NS + (uint64_t)ts.tv_nsec;
}

void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* An integer environment variable in [lo, hi], else dflt. */
long env_long(const char *name, long dflt, long lo, long hi) {
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
uint64_t dtype_size(int dt) {
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

const char *dtype_name(int dt) {
    static const char *const names[] = {"INT8",   "INT16",  "INT32",  "FP16", "FP32", "INT64",
                                        "UINT64", "UINT8",  "UINT16", "UINT32", "FP64", "BFP16", "INT128"};
    return (dt >= 0 && dt < (int)(sizeof names / sizeof names[0])) ? names[dt] : "an unknown HcclDataType";
}

const char *op_name(int op) {
    static const char *const names[] = {"SUM", "PROD", "MAX", "MIN"};
    return (op >= 0 && op < 4) ? names[op] : "an unknown HcclReduceOp";
}

/* The reductions of the Atlas A2 table (docs/cann/HCCL.md 4.3): int8/16/32/64, fp16/32, bf16; no prod for
 * int16 and bf16. */
int reduce_dtype_supported(int dt) {
    return dt == HCCL_DATA_TYPE_INT8 || dt == HCCL_DATA_TYPE_INT16 || dt == HCCL_DATA_TYPE_INT32 ||
           dt == HCCL_DATA_TYPE_INT64 || dt == HCCL_DATA_TYPE_FP16 || dt == HCCL_DATA_TYPE_FP32 ||
           dt == HCCL_DATA_TYPE_BFP16;
}

