/*
 * Mock CANN, libascendcl.so: diagnostics. The global lock, violations (counted, kept in a ring,
 * printed on stderr), the per-thread recent error message (aclGetRecentErrMsg) and fault
 * injection (ascend_mock_fail_next and friends, consumed by MOCK_ENTER).
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ascend_mock_apis.h"
#include "internal.h"

#define VIOLATION_RING 1024

/* ---- locks, diagnostics ------------------------------------------------------------------------ */
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER; /* leaf: nothing is locked inside it */

static uint64_t g_violations;
static char g_violation_ring[VIOLATION_RING][MESSAGE_MAX];

static __thread uint64_t tls_violations;
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

void ascend_mock_report_v(int violation, const char *api, int code, const char *code_name, size_t detail_max,
                          const char *fmt, va_list ap) {
    char detail[MESSAGE_MAX - 64];
    vsnprintf(detail, detail_max < sizeof detail ? detail_max : sizeof detail, fmt, ap);
    if (violation) {
        ascend_mock_violation("%s: %s", api, detail);
    }
    if (code_name) {
        ascend_mock_set_error("%s failed. ERROR: %d (%s). %s", api, code, code_name, detail);
    } else {
        ascend_mock_set_error("%s failed. ERROR: %d. %s", api, code, detail);
    }
}

/* fail() and violate() (internal.h). */
int diag_report(int count, int code, const char *api, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ascend_mock_report_v(count, api, code, NULL, MESSAGE_MAX - 64, fmt, ap);
    va_end(ap);
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

/* Entry points of the toolkit (ACL, aclnn, HCCL) called on this thread (ascend_mock_thread_api_calls). */
static __thread uint64_t tls_api_calls;

uint64_t ascend_mock_thread_api_calls(void) {
    return tls_api_calls;
}

int ascend_mock_take_fault(const char *api, int *status) {
    tls_api_calls++;
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

uint64_t ascend_mock_thread_violations(void) {
    return tls_violations;
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
