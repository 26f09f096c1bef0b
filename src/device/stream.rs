//! `aclrtStream` with its reusable operator workspace.

use std::sync::{Arc, Mutex};

use ascend_sys::aclrtStream;

use super::{leaked, report_drop_error, Device, DeviceAlloc, EventInner, Leak};
use crate::acl;
use crate::error::Result;

/// A live `aclrtStream`. Dropping it synchronises the stream, frees the workspace and destroys
/// the stream; a buffer that enqueued work on it holds an `Arc` to it, so it outlives that work.
pub(crate) struct StreamInner {
    pub(crate) device: Arc<Device>,
    raw: aclrtStream,
    /// Made by the caller ([`StreamInner::borrowed`]): synchronised on drop, never destroyed.
    borrowed: bool,
    /// The workspace reused by operator launches on this stream (grown, never shrunk).
    workspace: Mutex<Option<DeviceAlloc>>,
    /// Events that waits queued on this stream refer to: kept alive until the stream has been
    /// synchronised (CANN forbids destroying an event a queued wait uses).
    waited: Mutex<Vec<Arc<EventInner>>>,
    /// The pool of events for ordering other streams before this one: events whose waits have
    /// run (recycled from `waited` at each synchronise), recorded again on the next use.
    spare_events: Mutex<Vec<Arc<EventInner>>>,
}

// SAFETY: an aclrtStream is a handle into the device's default context, which CANN shares by all
// threads of the process that bound the device; every use binds the device on the calling thread
// first. The workspace is behind a Mutex.
unsafe impl Send for StreamInner {}
// SAFETY: as above; `&StreamInner` only enqueues, synchronises or locks the workspace mutex.
unsafe impl Sync for StreamInner {}

impl std::fmt::Debug for StreamInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("device", &self.device.id).field("raw", &self.raw).finish()
    }
}

impl StreamInner {
    /// `aclrtCreateStream` on `device`.
    pub(crate) fn new(device: Arc<Device>) -> Result<Arc<Self>> {
        device.bind()?;
        let raw = acl::create_stream(device.cann)?;
        Ok(Arc::new(StreamInner {
            device,
            raw,
            borrowed: false,
            workspace: Mutex::new(None),
            waited: Mutex::new(Vec::new()),
            spare_events: Mutex::new(Vec::new()),
        }))
    }

    /// A stream the caller created and owns: used and synchronised like any other, never
    /// destroyed by this crate.
    ///
    /// # Safety
    /// `raw` is a live `aclrtStream` of `device` that outlives the returned value.
    pub(crate) unsafe fn borrowed(device: Arc<Device>, raw: aclrtStream) -> Arc<Self> {
        Arc::new(StreamInner {
            device,
            raw,
            borrowed: true,
            workspace: Mutex::new(None),
            waited: Mutex::new(Vec::new()),
            spare_events: Mutex::new(Vec::new()),
        })
    }

    /// The raw handle, valid while `self` lives.
    pub(crate) fn raw(&self) -> aclrtStream {
        self.raw
    }

    /// Blocks until all work enqueued on this stream has completed; the waits it queued have
    /// then run, so their events go back to the pool (or are released).
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: `raw` is live while `self` is, and the device is bound on this thread.
        unsafe { acl::synchronize_stream(self.device.cann, self.raw) }?;
        let done = std::mem::take(&mut *self.waited.lock().unwrap_or_else(|p| p.into_inner()));
        let mut spare = self.spare_events.lock().unwrap_or_else(|p| p.into_inner());
        // Pool events (no one else holds them) are kept for reuse; a user's `Event` is let go.
        spare.extend(done.into_iter().filter(|e| Arc::strong_count(e) == 1));
        drop(spare);
        // Pinned blocks dropped while copies were queued here may be free to go now.
        self.device.reap_host_frees(false);
        Ok(())
    }

    /// Records `event` on this stream (`aclrtRecordEvent`).
    pub(crate) fn record(&self, event: &EventInner) -> Result<()> {
        self.device.bind()?;
        // SAFETY: both handles are live; the device (the same for both, checked by callers) is bound.
        unsafe { acl::record_event(self.device.cann, event.raw(), self.raw) }
    }

    /// Makes later work on this stream wait, on the device, for `event`
    /// (`aclrtStreamWaitEvent`); the stream keeps the event alive until the wait has run.
    pub(crate) fn wait(&self, event: Arc<EventInner>) -> Result<()> {
        self.device.bind()?;
        // SAFETY: both handles are live; the event is kept in `waited` until this stream has
        // been synchronised (or dropped, which synchronises first).
        unsafe { acl::stream_wait_event(self.device.cann, self.raw, event.raw()) }?;
        self.waited.lock().unwrap_or_else(|p| p.into_inner()).push(event);
        Ok(())
    }

    /// Orders later work on this stream after all work queued so far on `earlier`: an event
    /// from the pool recorded on `earlier`, waited for by this stream. The host never waits.
    pub(crate) fn order_after(&self, earlier: &StreamInner) -> Result<()> {
        let pooled = self.spare_events.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let event = match pooled {
            Some(e) => e,
            None => EventInner::new(self.device.clone())?,
        };
        if let Err(e) = earlier.record(&event) {
            self.spare_events.lock().unwrap_or_else(|p| p.into_inner()).push(event);
            return Err(e);
        }
        self.wait(event)
    }

    /// Runs `f` with a workspace of at least `bytes` (null for 0), reusing the stream's cached
    /// one. Launches on this stream are ordered, so reuse is safe; an outgrown workspace is freed
    /// only after the stream has synchronised.
    pub(crate) fn with_workspace<R>(
        &self,
        bytes: u64,
        f: impl FnOnce(*mut std::ffi::c_void) -> Result<R>,
    ) -> Result<R> {
        if bytes == 0 {
            return f(std::ptr::null_mut());
        }
        let bytes_usize = usize::try_from(bytes).map_err(|_| {
            crate::Error::internal(format!(
                "phase 1 asked for a workspace of {bytes} bytes, which does not fit this machine's address space"
            ))
        })?;
        let mut ws = self.workspace.lock().unwrap_or_else(|p| p.into_inner());
        if ws.as_ref().is_none_or(|a| a.bytes() < bytes_usize) {
            if ws.is_some() {
                // Work already enqueued may still use the old workspace: it is freed only once
                // the stream has drained. If that fails, it stays cached (and in use) as it was.
                self.synchronize()?;
                *ws = None;
            }
            *ws = Some(DeviceAlloc::new(self.device.clone(), bytes_usize)?);
        }
        let ptr = ws.as_ref().map_or(std::ptr::null_mut(), |a| a.ptr());
        f(ptr)
    }
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        let workspace = self.workspace.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        match self.synchronize() {
            // The workspace is idle now that the stream has drained.
            Ok(()) => drop(workspace),
            Err(e) => {
                report_drop_error("aclrtSynchronizeStream", &e);
                // Queued waits may still refer to these events: leak them rather than destroy them.
                std::mem::forget(std::mem::take(self.waited.get_mut().unwrap_or_else(|p| p.into_inner())));
                // Work may still be using the workspace: leak it rather than free it.
                if workspace.as_ref().is_some_and(|w| !w.ptr().is_null()) {
                    leaked(Leak::Allocation);
                }
                std::mem::forget(workspace);
            }
        }
        if self.borrowed {
            return; // the caller's stream: it destroys it
        }
        let result = self.device.bind().and_then(|()| {
            // SAFETY: `raw` is live and never used after this.
            unsafe { acl::destroy_stream(self.device.cann, self.raw) }
        });
        if let Err(e) = result {
            report_drop_error("aclrtDestroyStream", &e);
            leaked(Leak::Stream);
        }
    }
}
