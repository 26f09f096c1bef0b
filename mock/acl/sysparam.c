/*
 * Mock CANN, libascendcl.so: the system parameters of a context (acl_rt.h
 * aclrtCtxSetSysParamOpt / aclrtCtxGetSysParamOpt; docs/cann/ASYNC.md section 3).
 *
 * The context is the default context of the calling thread's current device (the one
 * aclrtSetDevice binds, the only kind of context the mock has), so the mock records each option
 * per device: a value set on one device is seen by every thread bound to it, and not by other
 * devices. Options start at 0 (ACL_OPT_DETERMINISTIC off, CANN's default). Known simplification:
 * real CANN drops the options with the default context when the device's last aclrtResetDevice
 * destroys it; the mock keeps them for the life of the process.
 *
 * Strictness: no aclInit or no current device is a violation (ACL_ERROR_RT_CONTEXT_NULL, as for
 * every runtime call); an unknown option or a value outside the option's range is
 * ACL_ERROR_INVALID_PARAM (ACL_OPT_DETERMINISTIC: 0 off, 1 deterministic, 2 strong consistency,
 * 3 batch consistency; the other options: 0 or 1).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>

#include "internal.h"

#define SYSPARAM_DEVICES MAX_DEVICES
#define SYSPARAM_OPTS 3

static int64_t g_sysparams[SYSPARAM_DEVICES][SYSPARAM_OPTS]; /* protected by the mock's global lock */

/* The current device for `api`, or -1 with *status set (the lock is held). */
static int sysparam_device_locked(const char *api, int *status) {
    *status = ascend_mock_runtime_ready_locked(api);
    if (*status) {
        return -1;
    }
    int dev = ascend_mock_current_device_locked();
    if (dev < 0 || dev >= SYSPARAM_DEVICES) {
        ascend_mock_set_error("%s failed: device %d has no context in the mock.", api, dev);
        *status = ACL_ERROR_INVALID_PARAM;
        return -1;
    }
    return dev;
}

static int sysparam_opt_valid(int opt) {
    return opt >= (int)ACL_OPT_DETERMINISTIC && opt < SYSPARAM_OPTS;
}

aclError aclrtCtxSetSysParamOpt(aclSysParamOpt opt, int64_t value) {
    static const char api[] = "aclrtCtxSetSysParamOpt";
    MOCK_ENTER(api, NULL);
    if (!sysparam_opt_valid((int)opt)) {
        ascend_mock_set_error("%s failed: opt %d is not an aclSysParamOpt.", api, (int)opt);
        return ACL_ERROR_INVALID_PARAM;
    }
    int64_t max = opt == ACL_OPT_DETERMINISTIC ? 3 : 1;
    if (value < 0 || value > max) {
        ascend_mock_set_error("%s failed: value %lld of opt %d is outside [0, %lld].", api, (long long)value,
                              (int)opt, (long long)max);
        return ACL_ERROR_INVALID_PARAM;
    }
    ascend_mock_lock();
    int st;
    int dev = sysparam_device_locked(api, &st);
    if (dev >= 0) {
        g_sysparams[dev][opt] = value;
    }
    ascend_mock_unlock();
    return st;
}

aclError aclrtCtxGetSysParamOpt(aclSysParamOpt opt, int64_t *value) {
    static const char api[] = "aclrtCtxGetSysParamOpt";
    MOCK_ENTER(api, NULL);
    if (!sysparam_opt_valid((int)opt)) {
        ascend_mock_set_error("%s failed: opt %d is not an aclSysParamOpt.", api, (int)opt);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (!value) {
        ascend_mock_set_error("%s failed: value is null.", api);
        return ACL_ERROR_INVALID_PARAM;
    }
    ascend_mock_lock();
    int st;
    int dev = sysparam_device_locked(api, &st);
    if (dev >= 0) {
        *value = g_sysparams[dev][opt];
    }
    ascend_mock_unlock();
    return st;
}

int64_t ascend_mock_deterministic_locked(void) {
    int dev = ascend_mock_current_device_locked();
    return dev >= 0 && dev < SYSPARAM_DEVICES ? g_sysparams[dev][ACL_OPT_DETERMINISTIC] : 0;
}
