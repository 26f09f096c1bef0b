//! `aclrtEvent`: a marker in a stream, used to order streams on the device without host waits.

use std::sync::Arc;

use ascend_sys::aclrtEvent;

use super::{report_drop_error, Device};
use crate::acl;
use crate::error::Result;

/// A live `aclrtEvent`, destroyed on drop. A stream that queued a wait on it holds an `Arc` to
/// it until that wait has run (CANN forbids destroying an event a queued wait refers to).
pub(crate) struct EventInner {
    pub(crate) device: Arc<Device>,
    raw: aclrtEvent,
}

// SAFETY: an aclrtEvent is a handle of the device's default context, shared by every thread of
// the process that binds the device (each use binds it first); CANN's event calls are
// thread-safe.
unsafe impl Send for EventInner {}
// SAFETY: as above; `&EventInner` only records, queries, waits or reads the handle.
unsafe impl Sync for EventInner {}

impl std::fmt::Debug for EventInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").field("device", &self.device.id).field("raw", &self.raw).finish()
    }
}

impl EventInner {
    /// `aclrtCreateEvent` on `device`.
    pub(crate) fn new(device: Arc<Device>) -> Result<Arc<Self>> {
        device.bind()?;
        let raw = acl::create_event(device.cann)?;
        Ok(Arc::new(EventInner { device, raw }))
    }

    /// The raw handle, valid while `self` lives.
    pub(crate) fn raw(&self) -> aclrtEvent {
        self.raw
    }

    /// Whether the last record has run (`aclrtQueryEventStatus`, never blocks).
    pub(crate) fn is_complete(&self) -> Result<bool> {
        self.device.bind()?;
        // SAFETY: `raw` is live while `self` is; the device is bound.
        unsafe { acl::event_is_complete(self.device.cann, self.raw) }
    }

    /// Blocks the host until the last record has run (`aclrtSynchronizeEvent`).
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: as in `is_complete`.
        unsafe { acl::synchronize_event(self.device.cann, self.raw) }
    }

    /// Leaks the event (a queued wait may still refer to it, so it must not be destroyed) without
    /// keeping its device alive: a leaked device would keep its memory cache too.
    pub(crate) fn leak(this: Arc<Self>) {
        if let Ok(e) = Arc::try_unwrap(this) {
            let e = std::mem::ManuallyDrop::new(e);
            // SAFETY: `e` is never used or dropped again; only its device handle is moved out
            // and dropped, the raw event is leaked.
            drop(unsafe { std::ptr::read(&e.device) });
        }
    }

    /// Milliseconds from `start`'s record to this event's (`aclrtEventElapsedTime`).
    pub(crate) fn elapsed_ms_since(&self, start: &EventInner) -> Result<f32> {
        self.device.bind()?;
        // SAFETY: both handles are live while the references are.
        unsafe { acl::event_elapsed_ms(self.device.cann, start.raw, self.raw) }
    }
}

impl Drop for EventInner {
    fn drop(&mut self) {
        let result = self.device.bind().and_then(|()| {
            // SAFETY: `raw` is live; every stream that queued a wait on it held an `Arc` to it
            // until that wait ran, so none refers to it any more.
            unsafe { acl::destroy_event(self.device.cann, self.raw) }
        });
        if let Err(e) = result {
            report_drop_error("aclrtDestroyEvent", &e);
        }
    }
}
