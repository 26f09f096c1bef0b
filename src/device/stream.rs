//! `aclrtStream` with its reusable operator workspace.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ascend_sys::{aclrtMemcpyKind, aclrtStream};

use super::allocator::Order;
use super::launch_cache::{self, LaunchCache};
use super::{enqueue_using, leaked, report_drop_error, Device, DeviceAlloc, DeviceBuffer, EventInner, Leak};
use crate::acl;
use crate::error::Result;

/// A live `aclrtStream`. Dropping it synchronises the stream, frees the workspace and destroys
/// the stream; a buffer that enqueued work on it holds an `Arc` to it, so it outlives that work.
pub(crate) struct StreamInner {
    pub(crate) device: Arc<Device>,
    /// Unique in the process (the allocator tells streams apart by it).
    pub(crate) id: u64,
    raw: aclrtStream,
    /// Made by the caller ([`StreamInner::borrowed`]): synchronised on drop, never destroyed.
    borrowed: bool,
    /// Events that waits queued on this stream refer to: kept alive until the stream has been
    /// synchronised (CANN forbids destroying an event a queued wait uses).
    waited: Mutex<Vec<Arc<EventInner>>>,
    /// The pool of events for ordering other streams before this one: events whose waits have
    /// run (recycled from `waited` at each synchronise), recorded again on the next use.
    spare_events: Mutex<Vec<Arc<EventInner>>>,
    /// Pinned memory for the small uploads the library makes itself ([`StreamInner::upload`]).
    staging: Mutex<Staging>,
    /// Repeatable executors of launches on this stream (see [`LaunchCache`]).
    pub(crate) launches: LaunchCache,
}

/// The next stream id (0 is never used).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Uploads up to this size go through a stream's staging area.
pub(crate) const STAGING_MAX: usize = 4096;
/// The size of a staging chunk of pinned memory.
const CHUNK: usize = 64 * 1024;
/// The alignment of each staged upload in its chunk.
const SLOT_ALIGN: usize = 64;

/// A stream's staging area: chunks of pinned memory filled front to back by uploads queued on
/// the stream. A chunk left behind is retired with an event recorded after its copies, and
/// filled again once that event has completed (queried, never waited for); after a stream
/// synchronise every chunk is free again.
#[derive(Default)]
struct Staging {
    chunks: Vec<Chunk>,
    /// The chunk being filled and how many of its bytes are taken.
    current: Option<usize>,
    used: usize,
}

struct Chunk {
    /// Address of `aclrtMallocHost` memory and its size.
    ptr: usize,
    cap: usize,
    /// Recorded after the chunk's copies when it was retired; `busy` until seen complete.
    event: Option<Arc<EventInner>>,
    busy: bool,
}

// SAFETY: an aclrtStream is a handle into the device's default context, which CANN shares by all
// threads of the process that bound the device; every use binds the device on the calling thread
// first. The workspace is behind the launch cache's Mutex (the stream's enqueue lock).
unsafe impl Send for StreamInner {}
// SAFETY: as above; `&StreamInner` only enqueues, synchronises or locks its mutexes.
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
        Ok(Arc::new(StreamInner::with(device, raw, false)))
    }

    fn with(device: Arc<Device>, raw: aclrtStream, borrowed: bool) -> Self {
        StreamInner {
            device,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            raw,
            borrowed,
            waited: Mutex::new(Vec::new()),
            spare_events: Mutex::new(Vec::new()),
            staging: Mutex::new(Staging::default()),
            launches: LaunchCache::new(launch_cache::default_capacity()),
        }
    }

    /// A stream the caller created and owns: used and synchronised like any other, never
    /// destroyed by this crate.
    ///
    /// # Safety
    /// `raw` is a live `aclrtStream` of `device` that outlives the returned value.
    pub(crate) unsafe fn borrowed(device: Arc<Device>, raw: aclrtStream) -> Arc<Self> {
        Arc::new(StreamInner::with(device, raw, true))
    }

    /// The raw handle, valid while `self` lives.
    pub(crate) fn raw(&self) -> aclrtStream {
        self.raw
    }

    /// Blocks until all work enqueued on this stream has completed; the waits it queued have
    /// then run, so their events go back to the pool (or are released).
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // Only what was queued before the wait is known done: the waits queued so far, and the
        // staged uploads (the staging area stays locked across the wait, so no upload of another
        // thread slips in between).
        let queued_waits = self.waited.lock().unwrap_or_else(|p| p.into_inner()).len();
        let mut staging = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `raw` is live while `self` is, and the device is bound on this thread.
        unsafe { acl::synchronize_stream(self.device.cann, self.raw) }?;
        // Every staged upload has run: the whole staging area is free again.
        staging.used = 0;
        staging.chunks.iter_mut().for_each(|c| c.busy = false);
        drop(staging);
        let done: Vec<Arc<EventInner>> = {
            let mut waited = self.waited.lock().unwrap_or_else(|p| p.into_inner());
            // (Another thread's synchronise may have taken some of them already.)
            let n = queued_waits.min(waited.len());
            waited.drain(..n).collect()
        };
        let mut spare = self.spare_events.lock().unwrap_or_else(|p| p.into_inner());
        // Pool events (no one else holds them) are kept for reuse; a user's `Event` is let go.
        spare.extend(done.into_iter().filter(|e| Arc::strong_count(e) == 1));
        drop(spare);
        // Pinned blocks dropped while copies were queued here, and (caching off) device blocks,
        // may be free to go now.
        self.device.reap_host_frees(false);
        self.device.memory.reap_now(self.device.cann);
        self.launches.reap(self);
        Ok(())
    }

    /// An event recorded now on this stream (from the pool): complete once everything queued
    /// here so far has run.
    pub(crate) fn marker(&self) -> Result<Arc<EventInner>> {
        let pooled = self.spare_events.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let event = match pooled {
            Some(e) => e,
            None => EventInner::new(self.device.clone())?,
        };
        match self.record(&event) {
            Ok(()) => Ok(event),
            Err(e) => {
                self.recycle_event(event);
                Err(e)
            }
        }
    }

    /// Returns an event no queued wait refers to (its record has completed, or never happened)
    /// to the pool.
    pub(crate) fn recycle_event(&self, event: Arc<EventInner>) {
        if Arc::strong_count(&event) == 1 {
            self.spare_events.lock().unwrap_or_else(|p| p.into_inner()).push(event);
        }
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
            self.recycle_event(event);
            return Err(e);
        }
        self.wait(event)
    }

    /// Runs `f` with a workspace of at least `bytes` (null for 0), reusing the stream's cached
    /// one, `ws` (the launch cache's, under the stream's enqueue lock). Launches on this
    /// stream are ordered, so reuse is safe; an outgrown workspace goes back to the allocator in
    /// this stream's order (no host wait).
    pub(crate) fn with_workspace<R>(
        &self,
        ws: &mut Option<DeviceAlloc>,
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
        if ws.as_ref().is_none_or(|a| a.bytes() < bytes_usize) {
            if let Some(old) = ws.take() {
                // Work already enqueued here may still use it: reusable after that work only.
                old.release(&[self]);
            }
            *ws = Some(DeviceAlloc::new(self.device.clone(), bytes_usize, Order::Stream(self.id))?);
        }
        let ptr = ws.as_ref().map_or(std::ptr::null_mut(), |a| a.ptr());
        f(ptr)
    }
}

impl StreamInner {
    /// Copies `data` (at most [`STAGING_MAX`] bytes) into `dst` at byte `offset`, queued on this
    /// stream (`aclrtMemcpyAsync` from the stream's pinned staging area): the host never waits,
    /// and `data` may change as soon as this returns. `dst` is recorded on the stream.
    pub(crate) fn upload(self: &Arc<Self>, dst: &DeviceBuffer, offset: usize, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if data.len() > STAGING_MAX || offset.checked_add(data.len()).is_none_or(|end| end > dst.bytes()) {
            return Err(crate::Error::internal(format!(
                "a staged upload of {} bytes at byte {offset} of a {}-byte buffer",
                data.len(),
                dst.bytes()
            )));
        }
        let device = &self.device;
        let dst_ptr = dst.ptr().cast::<u8>().wrapping_add(offset).cast::<std::ffi::c_void>();
        enqueue_using(self, [dst], |_| {
            // Locked until the copy is queued, so a synchronise frees the staging area only for
            // uploads queued before it. Lock order: a buffer's stream list, then the staging area
            // (as `DeviceBuffer::synchronize`, which synchronises streams under its list).
            let mut staging = self.staging.lock().unwrap_or_else(|p| p.into_inner());
            let src = self.staging_slot(&mut staging, data.len())?;
            // SAFETY: `src` is `data.len()` bytes of pinned memory of the staging area that no
            // queued copy uses (a slot is handed out once until the copies before it are known
            // complete).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), src as *mut u8, data.len()) };
            device.bind()?;
            // SAFETY: [dst_ptr, +len) lies inside `dst` (checked above), recorded on this stream by
            // `enqueue_using`; the staging slot stays untouched and allocated until the copy ran
            // (the chunk is refilled only after a later event or a synchronise of this stream,
            // and freed only when the stream is dropped, after it synchronised).
            unsafe {
                acl::memcpy_async(
                    device.cann,
                    dst_ptr,
                    src as *const std::ffi::c_void,
                    data.len(),
                    aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_DEVICE,
                    self.raw,
                )
            }
        })
    }

    /// The address of `len` free bytes of staging memory, taken (the staging area locked).
    fn staging_slot(&self, st: &mut Staging, len: usize) -> Result<usize> {
        if let Some(i) = st.current {
            let start = st.used.next_multiple_of(SLOT_ALIGN);
            if start + len <= st.chunks[i].cap {
                st.used = start + len;
                return Ok(st.chunks[i].ptr + start);
            }
            // Retire the chunk: free again once an event after its copies has completed.
            let event = match st.chunks[i].event.take() {
                Some(e) => e,
                None => EventInner::new(self.device.clone())?,
            };
            let recorded = self.record(&event);
            st.chunks[i].event = Some(event);
            if recorded.is_err() {
                // Without the event, only a synchronise frees the chunk.
                st.chunks[i].event = None;
            }
            st.chunks[i].busy = true;
            st.current = None;
        }
        let free = st.chunks.iter_mut().position(|c| {
            if c.busy {
                if let Some(e) = &c.event {
                    c.busy = !e.is_complete().unwrap_or(false);
                }
            }
            !c.busy && c.cap >= len
        });
        let i = match free {
            Some(i) => i,
            None => {
                self.device.bind()?;
                let ptr = acl::malloc_host(self.device.cann, CHUNK)? as usize;
                st.chunks.push(Chunk { ptr, cap: CHUNK, event: None, busy: false });
                st.chunks.len() - 1
            }
        };
        st.current = Some(i);
        st.used = len;
        Ok(st.chunks[i].ptr)
    }
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        let workspace = self.launches.state().workspace.take();
        let staging = std::mem::take(self.staging.get_mut().unwrap_or_else(|p| p.into_inner()));
        let drained = self.synchronize();
        // Cached executors are destroyed (or, if the stream could not drain, leaked) before the
        // stream and its device go.
        self.launches.teardown(drained.is_ok());
        match drained {
            // The workspace and the staging area are idle now that the stream has drained.
            Ok(()) => {
                drop(workspace);
                for c in staging.chunks {
                    let result = self.device.bind().and_then(|()| {
                        // SAFETY: from aclrtMallocHost; every copy from it has run.
                        unsafe { acl::free_host(self.device.cann, c.ptr as *mut std::ffi::c_void) }
                    });
                    if let Err(e) = result {
                        report_drop_error("aclrtFreeHost", &e);
                    }
                }
            }
            Err(e) => {
                report_drop_error("aclrtSynchronizeStream", &e);
                // Queued waits may still refer to these events: leak them rather than destroy them.
                for e in std::mem::take(self.waited.get_mut().unwrap_or_else(|p| p.into_inner())) {
                    EventInner::leak(e);
                }
                // Work may still be using the workspace and the staging area: leak them (the
                // device itself is let go, with its memory cache).
                drop(staging.chunks);
                if let Some(w) = workspace {
                    w.leak();
                }
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
