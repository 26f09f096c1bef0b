//! `aclOpExecutor`: made by phase 1, consumed by phase 2.

use std::sync::Arc;

use ascend_sys::aclOpExecutor;

use super::{leaked, report_drop_error, Device, Leak};
use crate::acl;

/// An executor from `aclnn*GetWorkspaceSize`. Launching consumes it (CANN frees it after phase
/// 2), so it can't be launched twice. Dropping one that was never launched makes it repeatable
/// (`aclSetAclOpExecutorRepeatable`, which hands ownership to the caller) and destroys it
/// (`aclDestroyAclOpExecutor`): the documented way to free an executor, so nothing leaks.
pub(crate) struct Executor {
    device: Arc<Device>,
    raw: *mut aclOpExecutor,
}

impl Executor {
    /// Takes ownership of a fresh executor from phase 1.
    pub(crate) fn new(device: Arc<Device>, raw: *mut aclOpExecutor) -> Self {
        Executor { device, raw }
    }

    /// Gives up ownership for phase 2, which consumes it.
    pub(crate) fn into_raw(mut self) -> *mut aclOpExecutor {
        std::mem::replace(&mut self.raw, std::ptr::null_mut())
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return; // handed to phase 2
        }
        let result = self.device.bind().and_then(|()| {
            // SAFETY: `raw` is a live executor that phase 2 never consumed.
            unsafe { acl::destroy_unlaunched_executor(self.device.cann, self.raw) }
        });
        if let Err(e) = result {
            report_drop_error("aclDestroyAclOpExecutor", &e);
            leaked(Leak::Executor);
        }
    }
}
