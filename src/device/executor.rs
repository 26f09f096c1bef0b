//! `aclOpExecutor`: made by phase 1, consumed by phase 2 unless made repeatable.

use std::sync::Arc;

use ascend_sys::aclOpExecutor;

use super::{leaked, report_drop_error, Device, Leak};
use crate::acl;
use crate::error::Result;

/// An executor from `aclnn*GetWorkspaceSize`. Launching consumes it (CANN frees it after phase
/// 2), so it can't be launched twice. Dropping one that was never launched makes it repeatable
/// (`aclSetAclOpExecutorRepeatable`, which hands ownership to the caller) and destroys it
/// (`aclDestroyAclOpExecutor`): the documented way to free an executor, so nothing leaks. One
/// made [`repeatable`](Self::make_repeatable) survives its launches and is destroyed on drop.
pub(crate) struct Executor {
    device: Arc<Device>,
    raw: *mut aclOpExecutor,
    repeatable: bool,
}

impl Executor {
    /// Takes ownership of a fresh executor from phase 1.
    pub(crate) fn new(device: Arc<Device>, raw: *mut aclOpExecutor) -> Self {
        Executor { device, raw, repeatable: false }
    }

    /// `aclSetAclOpExecutorRepeatable`: phase 2 no longer consumes it, the caller destroys it.
    pub(crate) fn make_repeatable(&mut self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: `raw` is a live executor from phase 1, not launched yet.
        let status = unsafe { self.device.cann.nnopbase.aclSetAclOpExecutorRepeatable(self.raw) };
        acl::check(self.device.cann, "aclSetAclOpExecutorRepeatable", status)?;
        self.repeatable = true;
        Ok(())
    }

    /// Gives up ownership: to phase 2, which consumes a non-repeatable executor, or to the
    /// owner of a repeatable one.
    pub(crate) fn into_raw(mut self) -> *mut aclOpExecutor {
        std::mem::replace(&mut self.raw, std::ptr::null_mut())
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return; // handed to phase 2, or to the owner of a repeatable executor
        }
        let result = self.device.bind().and_then(|()| {
            if self.repeatable {
                // SAFETY: `raw` is a live repeatable executor, owned here and never launched
                // (a launched one is handed on with `into_raw`).
                let status = unsafe { self.device.cann.nnopbase.aclDestroyAclOpExecutor(self.raw) };
                return acl::check(self.device.cann, "aclDestroyAclOpExecutor", status);
            }
            // SAFETY: `raw` is a live executor that phase 2 never consumed.
            unsafe { acl::destroy_unlaunched_executor(self.device.cann, self.raw) }
        });
        if let Err(e) = result {
            report_drop_error("aclDestroyAclOpExecutor", &e);
            leaked(Leak::Executor);
        }
    }
}
