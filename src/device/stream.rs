//! `aclrtStream` with its enqueue lock and what it guards ([`Enqueue`]: the reusable operator
//! workspace and the launch cache's state).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use ascend_sys::{aclrtMemcpyKind, aclrtStream};

use super::allocator::Order;
use super::capture::Keep;
use super::event::{PooledEvent, WAIT_BATCH};
use super::launch_cache::{self, CacheState, LaunchCache};
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
    /// A borrowed stream whose `Stream` was dropped ([`StreamInner::release`]): synchronised
    /// then, and never touched again (its owner may destroy it). Every holder then treats it as
    /// drained. Read-locked by each use of the handle that does not come through a `&Stream`,
    /// and by a synchronise; write-locked by `begin_capture` (see `synchronize_live`).
    released: RwLock<bool>,
    /// Events that waits queued on this stream refer to since its last guard: handed to the
    /// device's pool with an event recorded after them every [`WAIT_BATCH`] waits (they have run
    /// once it completes), or let go at a synchronise (CANN forbids destroying, and this crate
    /// re-recording, an event a queued wait uses).
    waited: Mutex<Waits>,
    /// Pinned memory for the small uploads the library makes itself ([`StreamInner::upload`]).
    staging: Mutex<Staging>,
    /// The enqueue lock, held by every enqueue on the stream ([`enqueue_using`]), and what it
    /// guards.
    enqueue: Mutex<Enqueue>,
    /// Repeatable executors of launches on this stream (see [`LaunchCache`]; their state is in
    /// [`Enqueue::launches`]).
    pub(crate) launches: LaunchCache,
    /// While the stream is captured: what the graph being captured keeps (see [`Keep`]).
    /// `capturing` says whether it is set (read without the lock).
    capture: Mutex<Option<Arc<Keep>>>,
    capturing: AtomicBool,
}

/// What a stream's enqueue lock guards ([`StreamInner::lock_enqueue`]): every enqueue on the
/// stream holds it ([`enqueue_using`]) and is handed this, so a launch reuses the workspace, or
/// rebinds and launches a cached executor, with no other enqueue on the stream in between.
#[derive(Default)]
pub(crate) struct Enqueue {
    /// The launch cache's entries and counters (see [`LaunchCache`]).
    pub(crate) launches: CacheState,
    /// The workspace reused by operator launches on the stream (grown, never shrunk): see
    /// [`StreamInner::with_workspace`].
    pub(crate) workspace: Option<DeviceAlloc>,
}

/// What a capture set aside on its stream (restored when it ends).
pub(crate) struct Suspended {
    launches: CacheState,
    staging: Staging,
}

/// The events of the waits queued on a stream since its last guard, each with its number on the
/// stream (a synchronise lets go of exactly those queued before it, whatever guards took since).
#[derive(Default)]
struct Waits {
    next: u64,
    list: Vec<(u64, Arc<EventInner>)>,
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
    event: Option<PooledEvent>,
    busy: bool,
}

// SAFETY: an aclrtStream is a handle into the device's default context, which CANN shares by all
// threads of the process that bound the device; every use binds the device on the calling thread
// first. The workspace is behind the stream's enqueue lock.
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
            released: RwLock::new(false),
            waited: Mutex::new(Waits::default()),
            staging: Mutex::new(Staging::default()),
            enqueue: Mutex::new(Enqueue::default()),
            launches: LaunchCache::new(launch_cache::default_capacity()),
            capture: Mutex::new(None),
            capturing: AtomicBool::new(false),
        }
    }

    /// The stream's enqueue lock and what it guards (see [`enqueue_using`]).
    pub(crate) fn lock_enqueue(&self) -> MutexGuard<'_, Enqueue> {
        self.enqueue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`lock_enqueue`](Self::lock_enqueue) if no one holds it now (`None` then).
    pub(crate) fn try_lock_enqueue(&self) -> Option<MutexGuard<'_, Enqueue>> {
        match self.enqueue.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Whether this stream is being captured now.
    #[inline]
    pub(crate) fn capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }

    /// The keep of the graph this stream is being captured into, if any.
    pub(crate) fn capture_keep(&self) -> Option<Arc<Keep>> {
        if !self.capturing() {
            return None;
        }
        self.capture.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The error of `call` (which the crate would make on this stream for its own bookkeeping, or
    /// a wait for another stream) while the stream is captured.
    pub(crate) fn capture_refusal(call: &'static str) -> crate::Error {
        crate::Error::Cann {
            call,
            status: ascend_sys::status::ACL_ERROR_RT_CAPTURE_DEPENDENCY,
            message: Some(format!(
                "refused by this crate: {call} on a stream being captured (work of other streams, and events, \
                 cannot join a capture here: synchronise or order them before Stream::capture)"
            )),
        }
    }

    /// Starts capturing into `keep`: the stream's launch cache (with its workspace) and staging
    /// area are set aside, so the capture's executors, workspace and staged uploads are its own
    /// (kept by the graph, never reused by later eager work); returns them for
    /// [`end_capture`](Self::end_capture). The caller then calls `aclmdlRICaptureBegin`.
    ///
    /// `capturing` is set under the enqueue lock, as every enqueue and every event recorded for
    /// another stream to wait for ([`order_marker`](Self::order_marker)) holds it: each either
    /// comes first (then it is queued before the capture begins) or sees the stream capturing.
    /// Lock order: the enqueue lock, then `released` (write), then `capture`, then the staging
    /// area (as an enqueue that finds the capture's keep, or stages an upload).
    pub(crate) fn begin_capture(&self, keep: Arc<Keep>) -> Result<Suspended> {
        let mut enqueue = self.lock_enqueue();
        // Write-locked: a synchronise (which holds it, read, across its check of `capturing` and
        // its wait, and never takes the enqueue lock) of another thread has ended, or sees the
        // capture.
        let released = self.released.write().unwrap_or_else(|p| p.into_inner());
        if *released {
            return Err(Self::released_error());
        }
        let mut capture = self.capture.lock().unwrap_or_else(|p| p.into_inner());
        if capture.is_some() {
            return Err(crate::Error::invalid("stream", "the stream is already being captured"));
        }
        // The capture launches with the stream's workspace (after the work queued before it);
        // the graph's pool keeps it (released in this stream's order: that work may not have run
        // yet), and eager work after the capture gets a new one.
        let launches = std::mem::take(&mut enqueue.launches);
        let staging = std::mem::take(&mut *self.staging.lock().unwrap_or_else(|p| p.into_inner()));
        *capture = Some(keep);
        self.capturing.store(true, Ordering::Release);
        Ok(Suspended { launches, staging })
    }

    /// Ends the capture (after `aclmdlRICaptureEnd`): what the capture used (its launch cache,
    /// workspace and staging area) goes to its keep, and what [`begin_capture`](Self::begin_capture)
    /// set aside comes back. `capturing` is cleared under the enqueue lock (see `begin_capture`).
    pub(crate) fn end_capture(&self, suspended: Suspended) {
        let mut enqueue = self.lock_enqueue();
        let mut capture = self.capture.lock().unwrap_or_else(|p| p.into_inner());
        let keep = capture.take();
        let launches = std::mem::replace(&mut enqueue.launches, suspended.launches);
        let workspace = enqueue.workspace.take();
        let cache = Enqueue { launches, workspace: None };
        let staging =
            std::mem::replace(&mut *self.staging.lock().unwrap_or_else(|p| p.into_inner()), suspended.staging);
        self.capturing.store(false, Ordering::Release);
        drop(capture);
        drop(enqueue);
        let chunks = CapturedStaging { device: self.device.clone(), chunks: staging.chunks };
        match keep {
            Some(keep) => {
                // (The keep is open: its graph is being made.) The workspace goes to the graph's
                // pool: work queued here before the capture may still use it, so it is released in
                // this stream's order when the graph goes.
                let _ = keep.hold(cache);
                let _ = keep.hold(chunks);
                if let Some(ws) = workspace {
                    let _ = keep.recycle(ws);
                }
            }
            None => drop((cache, chunks, workspace)),
        }
    }

    /// Keeps `item` with the graph being captured on this stream; gives it back when there is none.
    pub(crate) fn keep_if_capturing<T: std::any::Any + Send>(&self, item: T) -> std::result::Result<(), T> {
        match self.capture_keep() {
            Some(keep) => keep.hold(item),
            None => Err(item),
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
    /// then run, so their events go back to the pool (or are released). A no-op on a released
    /// stream (it was synchronised when it was released).
    pub(crate) fn synchronize(&self) -> Result<()> {
        let released = self.released.read().unwrap_or_else(|p| p.into_inner());
        if *released {
            return Ok(());
        }
        self.synchronize_live()
    }

    /// [`synchronize`](Self::synchronize), then drops the foreign owners (DLPack producers'
    /// capsules) whose work it saw complete, after its locks are let go (`Stream::synchronize`:
    /// the caller holds no lock of this crate, and a deleter may use this stream again).
    pub(crate) fn synchronize_then_drop_owners(&self) -> Result<()> {
        let result = self.synchronize();
        self.device.events.drop_ready_owners(self.device.cann);
        result
    }

    /// [`synchronize`](Self::synchronize) of a stream that is not released (the caller holds
    /// `released`, read or write). Owners it makes ready stay parked (see `drop_ready_owners`).
    /// The check of `capturing` and the wait are one step for [`begin_capture`](Self::begin_capture),
    /// which write-locks `released` (it may not take the enqueue lock: some callers hold it).
    fn synchronize_live(&self) -> Result<()> {
        if self.capturing() {
            return Err(crate::Error::Cann {
                call: "aclrtSynchronizeStream",
                status: ascend_sys::status::ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC,
                message: Some(
                    "refused by this crate: the stream is being captured (synchronise it after the capture)".into(),
                ),
            });
        }
        self.device.bind()?;
        // Only what was queued before the wait is known done: the waits queued so far, and the
        // staged uploads (the staging area stays locked across the wait, so no upload of another
        // thread slips in between).
        let queued_waits = self.waited.lock().unwrap_or_else(|p| p.into_inner()).next;
        let mut staging = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `raw` is live while `self` is (not released: the caller holds the lock), and the
        // device is bound on this thread.
        unsafe { acl::synchronize_stream(self.device.cann, self.raw) }?;
        // Every staged upload has run: the whole staging area is free again.
        staging.used = 0;
        for c in &mut staging.chunks {
            c.busy = false;
            if let Some(e) = c.event.take() {
                self.device.events.give_back(self.device.cann, e);
            }
        }
        drop(staging);
        let done: Vec<Arc<EventInner>> = {
            let mut waited = self.waited.lock().unwrap_or_else(|p| p.into_inner());
            // (Another thread's synchronise, or a guard, may have taken some of them already.)
            let n = waited.list.iter().take_while(|(k, _)| *k < queued_waits).count();
            waited.list.drain(..n).map(|(_, e)| e).collect()
        };
        // Their waits have run, so their records have completed: back to the pool.
        done.into_iter().for_each(EventInner::recycle);
        // Pinned blocks dropped while copies were queued here, and (caching off) device blocks,
        // may be free to go now; so may events handed back.
        self.device.reap_host_frees(false);
        self.device.memory.reap_now(self.device.cann, &self.device.events);
        self.device.events.reclaim_all(self.device.cann);
        self.launches.reap(self);
        Ok(())
    }

    /// Ends a borrowed stream's life for this crate (its `Stream` was dropped; see
    /// `Stream::from_raw`): synchronises it and marks it released, after which no holder touches
    /// the handle again (synchronising is a no-op, recording refuses, ordering after it is
    /// skipped: its work has run).
    pub(crate) fn release(&self) {
        if !self.borrowed {
            return;
        }
        {
            let mut released = self.released.write().unwrap_or_else(|p| p.into_inner());
            if *released {
                return;
            }
            if let Err(e) = self.synchronize_live() {
                report_drop_error("aclrtSynchronizeStream (releasing a borrowed stream)", &e);
            }
            *released = true;
        }
        // Once the lock is let go: a deleter may use this stream (and find it released).
        self.device.events.drop_ready_owners(self.device.cann);
    }

    /// Runs `f` with the raw handle unless the stream was released (then `None`): the handle
    /// stays valid while `f` runs. For uses that do not come through a `&Stream`.
    pub(crate) fn if_live<R>(&self, f: impl FnOnce(aclrtStream) -> R) -> Option<R> {
        let released = self.released.read().unwrap_or_else(|p| p.into_inner());
        (!*released).then(|| f(self.raw))
    }

    /// The error of recording on a released stream.
    fn released_error() -> crate::Error {
        crate::Error::internal("an event was to be recorded on a borrowed stream after its Stream was dropped")
    }

    /// An event from the device's pool recorded now on this stream: complete once everything
    /// queued here so far has run; back to the pool when the last `Arc` drops. The caller holds
    /// this stream's enqueue lock (a launch cache retiring entries: its state is behind it), so
    /// the check and the record are one step for [`begin_capture`](Self::begin_capture).
    pub(crate) fn marker(&self) -> Result<Arc<EventInner>> {
        if self.capturing() {
            return Err(Self::capture_refusal("aclrtRecordEvent"));
        }
        self.if_live(|raw| EventInner::pooled_on(&self.device, raw)).unwrap_or_else(|| Err(Self::released_error()))
    }

    /// Returns an event no queued wait refers to (its record has completed, or never happened)
    /// to the pool.
    pub(crate) fn recycle_event(&self, event: Arc<EventInner>) {
        EventInner::recycle(event);
    }

    /// Records `event` on this stream (`aclrtRecordEvent`). Only for the thread that owns the
    /// stream's `Stream` (`Stream::record_event`), the one thread that begins or ends its
    /// captures (`Stream` is not `Sync`): the check below cannot race with them, no lock needed.
    pub(crate) fn record(&self, event: &EventInner) -> Result<()> {
        if self.capturing() {
            return Err(Self::capture_refusal("aclrtRecordEvent"));
        }
        self.device.bind()?;
        self.if_live(|raw| {
            // SAFETY: both handles are live; the device (the same for both, checked by callers)
            // is bound.
            unsafe { acl::record_event(self.device.cann, event.raw(), raw) }
        })
        .unwrap_or_else(|| Err(Self::released_error()))
    }

    /// Makes later work on this stream wait, on the device, for `event`
    /// (`aclrtStreamWaitEvent`); the event is kept alive (and out of the pool) until the wait
    /// has run: see `waited`. Only on the stream of the caller's work (the stream it orders, or
    /// `Stream::wait_event`), whose captures only the calling thread begins or ends: the check
    /// below cannot race with them (see [`record`](Self::record)).
    pub(crate) fn wait(&self, event: Arc<EventInner>) -> Result<()> {
        if self.capturing() {
            return Err(Self::capture_refusal("aclrtStreamWaitEvent"));
        }
        self.device.bind()?;
        let waited = self.if_live(|raw| {
            // SAFETY: both handles are live; the event is kept in `waited` until the wait has
            // run (a guard recorded after it completed, or this stream synchronised).
            unsafe { acl::stream_wait_event(self.device.cann, raw, event.raw()) }?;
            let mut waited = self.waited.lock().unwrap_or_else(|p| p.into_inner());
            let k = waited.next;
            waited.next += 1;
            waited.list.push((k, event));
            if waited.list.len() >= WAIT_BATCH {
                // A guard after the waits: once it completes they have run. (If it cannot be
                // recorded, they stay until a synchronise.)
                if let Ok(guard) = self.device.events.record(self.device.cann, raw) {
                    let list = std::mem::take(&mut waited.list);
                    self.device.events.retire(guard, list.into_iter().map(|(_, e)| e).collect());
                }
            }
            Ok(())
        });
        waited.unwrap_or_else(|| Err(Self::released_error()))
    }

    /// Orders later work on this stream after all work queued so far on `earlier`: an event
    /// from the pool recorded on `earlier` under its enqueue lock ([`order_marker`](Self::order_marker)),
    /// waited for by this stream once that lock is let go (so no thread holds two streams'
    /// enqueue locks). The host never waits. Nothing to do when `earlier` was released (its work
    /// has run). The caller holds no stream's enqueue lock.
    pub(crate) fn order_after(&self, earlier: &StreamInner) -> Result<()> {
        let marker = self.order_marker(earlier, &earlier.lock_enqueue())?;
        marker.map_or(Ok(()), |event| self.wait(event))
    }

    /// The first half of [`order_after`](Self::order_after), for a caller that holds `earlier`'s
    /// enqueue lock (`_held`, what it guards) and passes the event to [`wait`](Self::wait) once it
    /// has let that lock go: an event from the pool recorded now on `earlier`, or `None` when
    /// `earlier` was released (its work has run). Refused when either stream is being captured:
    /// the record would land in `earlier`'s capture and pull this stream, waiting for it, into it
    /// (CANN's capture across streams, which this crate never makes), or this stream's capture
    /// would take a wait for an event recorded outside it. The lock makes the check and the record one step for
    /// [`begin_capture`](Self::begin_capture), which sets `capturing` under it before the caller
    /// begins the capture.
    ///
    /// Under the lock, the event request polls the pool but never drops a parked foreign owner
    /// (their deleters may come back into this crate: see `EventPool::take`).
    pub(crate) fn order_marker(&self, earlier: &StreamInner, _held: &Enqueue) -> Result<Option<Arc<EventInner>>> {
        // (This stream is the caller's: only its thread begins or ends a capture of it.)
        if self.capturing() {
            return Err(Self::capture_refusal("aclrtStreamWaitEvent"));
        }
        if earlier.capturing() {
            return Err(Self::capture_refusal("aclrtRecordEvent"));
        }
        earlier.if_live(|raw| EventInner::pooled_on(&self.device, raw)).transpose()
    }

    /// Runs `f` with a workspace of at least `bytes` (null for 0), reusing the stream's cached
    /// one, `ws` ([`Enqueue::workspace`], under the stream's enqueue lock). Launches on this
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
            let order = if self.capturing() { Order::Capture(self.id) } else { Order::Stream(self.id) };
            // (Under the enqueue lock: parked foreign owners stay parked, see `Allocator::alloc`.)
            let new = DeviceAlloc::new_locked(self.device.clone(), bytes_usize, order)?;
            if let Some(old) = ws.take() {
                // Work already enqueued here may still use it: reusable after that work only (in
                // a capture, the graph's pool takes it, released in this stream's order when the
                // graph goes; its keep is open while it is captured). The caller holds this
                // stream's enqueue lock.
                if let Err((old, keep)) = old.release(&[self], Some(self)) {
                    let _ = keep.recycle(old);
                }
            }
            *ws = Some(new);
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
            // Retire the chunk: free again once an event after its copies has completed (without
            // the event, only a synchronise frees it; in a capture the chunk belongs to the graph).
            if !self.capturing() {
                st.chunks[i].event = self.device.events.record(self.device.cann, self.raw).ok();
            }
            st.chunks[i].busy = true;
            st.current = None;
        }
        let (cann, events) = (self.device.cann, &self.device.events);
        let capturing = self.capturing();
        let free = st.chunks.iter_mut().position(|c| {
            if capturing {
                return false; // (a capture's chunks are each filled once)
            }
            if c.busy && c.event.as_ref().is_some_and(|e| e.is_complete(cann)) {
                c.busy = false;
                if let Some(e) = c.event.take() {
                    events.give_back(cann, e);
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
        let workspace = self.enqueue.get_mut().unwrap_or_else(|p| p.into_inner()).workspace.take();
        let staging = std::mem::take(self.staging.get_mut().unwrap_or_else(|p| p.into_inner()));
        let drained = self.synchronize();
        // Cached executors are destroyed (or, if the stream could not drain, leaked) before the
        // stream and its device go.
        self.launches.teardown(self, drained.is_ok());
        match drained {
            // The workspace and the staging area are idle now that the stream has drained.
            Ok(()) => {
                drop(workspace);
                // Guards recorded here have completed: the waits handed to the pool with them
                // are let go now (they may hold the device), and so are the owners they held.
                self.device.events.reclaim_all(self.device.cann);
                self.device.events.drop_ready_owners(self.device.cann);
                // SAFETY: every copy from the chunks has run (the stream drained).
                unsafe { free_chunks(&self.device, staging.chunks) };
            }
            Err(e) => {
                report_drop_error("aclrtSynchronizeStream", &e);
                // Queued waits may still refer to these events: leak them rather than destroy them.
                for (_, e) in std::mem::take(&mut self.waited.get_mut().unwrap_or_else(|p| p.into_inner()).list) {
                    EventInner::leak(e);
                }
                // (Their events are leaked with them: a `PooledEvent` has no destructor.)
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

/// A capture's staging chunks (pinned memory its captured uploads read on every replay), freed
/// after its graph's model run instance is destroyed.
struct CapturedStaging {
    device: Arc<Device>,
    chunks: Vec<Chunk>,
}

// SAFETY: the chunks are addresses of pinned host memory owned by this value alone; freeing them
// from any thread that binds the device is allowed.
unsafe impl Send for CapturedStaging {}

impl Drop for CapturedStaging {
    fn drop(&mut self) {
        // SAFETY: the graph whose replays read the chunks is destroyed (it drops this after).
        unsafe { free_chunks(&self.device, std::mem::take(&mut self.chunks)) };
    }
}

/// Frees staging chunks (`aclrtFreeHost`), their events back to the pool.
///
/// # Safety
/// No queued copy (nor a replay of a captured one) still reads the chunks.
unsafe fn free_chunks(device: &Device, chunks: Vec<Chunk>) {
    for c in chunks {
        if let Some(e) = c.event {
            device.events.give_back(device.cann, e);
        }
        let result = device.bind().and_then(|()| {
            // SAFETY: from aclrtMallocHost; nothing reads it any more (this function's contract).
            unsafe { acl::free_host(device.cann, c.ptr as *mut std::ffi::c_void) }
        });
        if let Err(e) = result {
            report_drop_error("aclrtFreeHost", &e);
        }
    }
}
