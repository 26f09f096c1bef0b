//! `aclOpExecutor`: made by phase 1, consumed by phase 2 unless made repeatable.

use std::sync::Arc;

use ascend_sys::aclOpExecutor;

use super::{leaked, report_drop_error, Device, Leak};
use crate::acl;
use crate::error::{Error, Result};

/// What `aclSetAclOpExecutorRepeatable` has made of an executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Repeat {
    /// Not asked yet: phase 2 consumes it.
    Fresh,
    /// Repeatable: phase 2 leaves it to its owner, who destroys it.
    Yes,
    /// CANN refused (an executor it cannot repeat): phase 2 consumes it, as a fresh one.
    Refused,
}

/// An executor from `aclnn*GetWorkspaceSize`. Launching consumes it (CANN frees it after phase
/// 2), so it can't be launched twice. Dropping one that was never launched destroys it
/// (`aclDestroyAclOpExecutor`, after `aclSetAclOpExecutorRepeatable` where that was not tried
/// yet: the documented pairing), so nothing leaks, whether or not CANN would make it repeatable.
/// One made [`repeatable`](Self::try_make_repeatable) survives its launches and is destroyed on
/// drop.
pub(crate) struct Executor {
    device: Arc<Device>,
    raw: *mut aclOpExecutor,
    repeat: Repeat,
}

impl Executor {
    /// Takes ownership of a fresh executor from phase 1.
    pub(crate) fn new(device: Arc<Device>, raw: *mut aclOpExecutor) -> Self {
        Executor { device, raw, repeat: Repeat::Fresh }
    }

    /// `aclSetAclOpExecutorRepeatable`: `Ok(true)` when phase 2 no longer consumes it (the
    /// caller destroys it), `Ok(false)` when CANN refused (the status is not an error: CANN
    /// refuses executors it cannot repeat, ASYNC.md §5), after which it is launched as a fresh
    /// one. Only binding the device is an error.
    pub(crate) fn try_make_repeatable(&mut self) -> Result<bool> {
        if self.repeat != Repeat::Fresh {
            return Err(Error::internal("an executor was asked to be made repeatable twice"));
        }
        self.device.bind()?;
        // SAFETY: `raw` is a live executor from phase 1, not launched yet.
        let accepted = unsafe { acl::set_repeatable(self.device.cann, self.raw) }.is_ok();
        self.repeat = if accepted { Repeat::Yes } else { Repeat::Refused };
        Ok(accepted)
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
        let (cann, raw) = (self.device.cann, self.raw);
        let result = self.device.bind().and_then(|()| match self.repeat {
            // SAFETY: `raw` is a live executor, owned here and never launched (a launched one is
            // handed on with `into_raw`); aclSetAclOpExecutorRepeatable was tried on it (accepted
            // or refused), and nnopbase's destroy frees either kind.
            Repeat::Yes | Repeat::Refused => unsafe { acl::destroy_executor(cann, raw) },
            // SAFETY: `raw` is a live executor that phase 2 never consumed.
            Repeat::Fresh => unsafe { acl::destroy_unlaunched_executor(cann, raw) },
        });
        if let Err(e) = result {
            report_drop_error("aclDestroyAclOpExecutor", &e);
            leaked(Leak::Executor);
        }
    }
}
