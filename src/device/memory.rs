//! Device memory.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::allocator::Order;
use super::capture::Keep;
use super::event::After;
use super::stream::Enqueue;
use super::{leaked, report_drop_error, Device, Leak, StreamInner};
use crate::error::Result;

/// A block of device memory from the device's caching allocator (returned to it on drop), or
/// device memory another owner keeps (never freed here).
pub(crate) struct DeviceAlloc {
    device: Arc<Device>,
    ptr: *mut c_void,
    /// The bytes asked for.
    bytes: usize,
    /// The block's size in the allocator (0 for the caller's memory or an empty allocation).
    block: usize,
}

// SAFETY: the pointer is a device address, meaningful from any thread that binds the device
// (which every use does first); the allocation is owned uniquely by this value.
unsafe impl Send for DeviceAlloc {}
// SAFETY: `&DeviceAlloc` only exposes the address and size.
unsafe impl Sync for DeviceAlloc {}

impl DeviceAlloc {
    /// `bytes` of device memory (0 allocates nothing and yields a null pointer) for use as
    /// `order` says (see [`Order`]).
    pub(crate) fn new(device: Arc<Device>, bytes: usize, order: Order) -> Result<Self> {
        Self::with_state(device, bytes, order, false).map(|(a, _)| a)
    }

    /// [`new`](Self::new) for a caller that holds a stream's enqueue lock (a launch's workspace
    /// that grows): no parked foreign owner is dropped meanwhile (see `Allocator::alloc`).
    pub(crate) fn new_locked(device: Arc<Device>, bytes: usize, order: Order) -> Result<Self> {
        Self::with_state(device, bytes, order, true).map(|(a, _)| a)
    }

    /// [`new`](Self::new) (`locked`: [`new_locked`](Self::new_locked)), also telling whether work
    /// queued earlier on the ordering stream may still use the memory.
    fn with_state(device: Arc<Device>, bytes: usize, order: Order, locked: bool) -> Result<(Self, bool)> {
        if bytes == 0 {
            return Ok((DeviceAlloc { device, ptr: std::ptr::null_mut(), bytes, block: 0 }, false));
        }
        device.bind()?;
        let (ptr, block, pending) = device.memory.alloc(device.cann, &device.events, bytes, order, locked)?;
        Ok((DeviceAlloc { device, ptr, bytes, block }, pending))
    }

    /// `bytes` of device memory at `ptr` that another owner allocated and frees.
    ///
    /// # Safety
    /// `ptr` is the start of `bytes` of device memory of `device` that stays allocated until this
    /// value and every piece of work enqueued on it have finished.
    pub(crate) unsafe fn foreign(device: Arc<Device>, ptr: *mut c_void, bytes: usize) -> Self {
        DeviceAlloc { device, ptr, bytes, block: 0 }
    }

    pub(crate) fn ptr(&self) -> *mut c_void {
        self.ptr
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Whether this block serves a request of `bytes` as the allocator would (its size class,
    /// at most a quarter more).
    pub(crate) fn fits(&self, bytes: usize) -> bool {
        let size = super::allocator::round_size(bytes);
        self.owned() && self.block >= size && self.block <= size.saturating_add(size / 4)
    }

    /// The same block, handed out again for a request of `bytes` (it [`fits`](Self::fits)).
    pub(crate) fn reuse(mut self, bytes: usize) -> Self {
        self.device.memory.reaccount(self.bytes, bytes);
        self.bytes = bytes;
        self
    }

    /// Whether dropping this value returns memory to the allocator.
    fn owned(&self) -> bool {
        !self.ptr.is_null() && self.block > 0
    }

    /// Leaks the memory (work that could not be waited for may still use it): the allocator
    /// stops counting it, and the device is let go.
    pub(crate) fn leak(mut self) {
        if self.owned() {
            self.ptr = std::ptr::null_mut();
            self.device.memory.forget(self.block, self.bytes);
            leaked(Leak::Allocation);
        }
    }

    /// Returns the memory to the allocator after the work `users` queued on it (an event recorded
    /// on each, see [`super::event::record_after`]; `held` is the user whose enqueue lock the
    /// caller holds, if any): never waits, except when an event cannot be recorded (then it
    /// synchronises that stream, and if even that fails, leaks the block: queued work may still
    /// use it). The caller's memory is left alone. A user being captured (seen under its enqueue
    /// lock) gives the block back with the graph's keep, nothing done: the caller hands the block,
    /// with what it needs to release it again, to that graph.
    pub(crate) fn release(
        mut self,
        users: &[&StreamInner],
        held: Option<&StreamInner>,
    ) -> std::result::Result<(), (Self, Arc<Keep>)> {
        match self.give_back(users, held) {
            Some(keep) => Err((self, keep)),
            None => Ok(()),
        }
    }

    /// [`release`](Self::release) in place: `Some(keep)` (the memory still held) when a user is
    /// being captured.
    fn give_back(&mut self, users: &[&StreamInner], held: Option<&StreamInner>) -> Option<Arc<Keep>> {
        if !self.owned() {
            return None;
        }
        if let Err(e) = self.device.bind() {
            self.ptr = std::ptr::null_mut();
            report_drop_error("aclrtSetDevice (freeing device memory)", &e);
            leaked(Leak::Allocation);
            return None;
        }
        let what = "aclrtSynchronizeStream (freeing device memory)";
        let events = match super::event::record_after(&self.device, users.iter().copied(), held, what) {
            After::Events(events) => events,
            After::Capturing(keep) => return Some(keep),
            After::Unknown => {
                self.ptr = std::ptr::null_mut();
                super::report(format_args!(
                    "leaking {} bytes of device memory that queued work may still use",
                    self.block
                ));
                self.device.memory.forget(self.block, self.bytes);
                leaked(Leak::Allocation);
                return None;
            }
        };
        let ptr = std::mem::replace(&mut self.ptr, std::ptr::null_mut());
        self.device.memory.free(self.device.cann, &self.device.events, ptr, self.block, self.bytes, events);
        None
    }
}

impl Drop for DeviceAlloc {
    /// Returns the memory to the allocator as idle: the owner guarantees no pending work uses it.
    fn drop(&mut self) {
        // (No user: never `Some`.)
        let _ = self.give_back(&[], None);
    }
}

/// Device memory shared with streams: every stream that enqueued work on it is recorded, and
/// dropping the buffer returns the memory to the allocator after that work (in stream order,
/// through events: it never waits).
pub(crate) struct DeviceBuffer {
    /// `None` only inside `drop`.
    alloc: Option<DeviceAlloc>,
    users: Mutex<Vec<Arc<StreamInner>>>,
    /// The address of the one stream `users` lists when it lists exactly one, else 0: read
    /// without the list's lock by an enqueue that holds that stream's enqueue lock (see
    /// [`enqueue_using`]). Written under the list's lock, with `users`.
    sole: AtomicUsize,
    /// Unique in the process, never reused: tells this buffer from a later one at the same
    /// address (the launch cache skips rebinding a descriptor already bound to this buffer).
    id: u64,
    /// What keeps the caller's memory allocated (e.g. a DLPack producer's capsule): dropped once
    /// every stream that used the memory has passed its last use (events, no host wait: see
    /// [`release_owner`]), or leaked if that cannot be known.
    owner: Option<Owner>,
    /// The captured graphs whose work uses this buffer (see [`Keep`]): while one lives, dropping
    /// the buffer hands it to the graph, work on it is ordered with the graph's replays, and a
    /// host access waits for them. `pinned` says whether the list is not empty (read without it).
    pins: Mutex<Vec<Arc<Keep>>>,
    pinned: AtomicBool,
}

/// The next buffer id.
static NEXT_BUFFER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_buffer_id() -> u64 {
    NEXT_BUFFER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl DeviceBuffer {
    /// A buffer that nothing orders yet (written first by the host): an idle block, which no
    /// queued work uses.
    pub(crate) fn new(device: Arc<Device>, bytes: usize) -> Result<Self> {
        Ok(DeviceBuffer {
            alloc: Some(DeviceAlloc::new(device, bytes, Order::Idle)?),
            users: Mutex::new(Vec::new()),
            sole: AtomicUsize::new(0),
            id: next_buffer_id(),
            owner: None,
            pins: Mutex::new(Vec::new()),
            pinned: AtomicBool::new(false),
        })
    }

    /// A buffer for work on `stream`. Its block may still be in use by work queued earlier on
    /// `stream` (freed in stream order): then `stream` is its first user, so work of another
    /// stream, a host access and the drop are ordered after that work.
    pub(crate) fn on_stream(stream: &Arc<StreamInner>, bytes: usize) -> Result<Self> {
        // (No lock: the caller's stream, whose captures only this thread begins or ends.)
        let pooled = stream.capture_keep().and_then(|keep| keep.take_pooled(bytes));
        let (alloc, pending) = match pooled {
            // (Captured work queued earlier on the stream may use it: the stream is its first user.)
            Some(block) => (block, true),
            None => {
                let order = if stream.capturing() { Order::Capture(stream.id) } else { Order::Stream(stream.id) };
                DeviceAlloc::with_state(stream.device.clone(), bytes, order, false)?
            }
        };
        let users = if pending { vec![stream.clone()] } else { Vec::new() };
        let sole = AtomicUsize::new(sole_of(&users));
        Ok(DeviceBuffer {
            alloc: Some(alloc),
            users: Mutex::new(users),
            sole,
            id: next_buffer_id(),
            owner: None,
            pins: Mutex::new(Vec::new()),
            pinned: AtomicBool::new(false),
        })
    }

    /// A buffer over the caller's device memory (see [`DeviceAlloc::foreign`]): recorded on
    /// streams like any buffer, never freed; dropping it waits for the streams that used it
    /// (the caller frees the memory once it is gone).
    ///
    /// # Safety
    /// As [`DeviceAlloc::foreign`].
    pub(crate) unsafe fn foreign(device: Arc<Device>, ptr: *mut c_void, bytes: usize) -> Self {
        DeviceBuffer {
            // SAFETY: the caller's guarantee, passed on.
            alloc: Some(unsafe { DeviceAlloc::foreign(device, ptr, bytes) }),
            users: Mutex::new(Vec::new()),
            sole: AtomicUsize::new(0),
            id: next_buffer_id(),
            owner: None,
            pins: Mutex::new(Vec::new()),
            pinned: AtomicBool::new(false),
        }
    }

    /// [`foreign`](Self::foreign) memory that `owner` keeps allocated, whose producer's writes
    /// are ordered before work queued on `stream`: `stream` is its first user, so host accesses,
    /// other streams' work and the drop are ordered after it. Dropping the buffer never waits;
    /// `owner` is dropped once every stream that used the memory has passed that use (see
    /// [`release_owner`]), on whichever thread then polls the device's events, or at the
    /// device's teardown.
    ///
    /// # Safety
    /// As [`DeviceAlloc::foreign`] (on `stream`'s device), while `owner` lives; `owner` may be
    /// dropped on any thread.
    pub(crate) unsafe fn foreign_owned(
        stream: &Arc<StreamInner>,
        ptr: *mut c_void,
        bytes: usize,
        owner: Box<dyn Send + Sync>,
    ) -> Self {
        // SAFETY: the caller's guarantee, passed on.
        let mut buffer = unsafe { Self::foreign(stream.device.clone(), ptr, bytes) };
        let users = vec![stream.clone()];
        buffer.sole = AtomicUsize::new(sole_of(&users));
        buffer.users = Mutex::new(users);
        buffer.owner = Some(owner);
        buffer
    }

    #[inline]
    fn alloc(&self) -> &DeviceAlloc {
        self.alloc.as_ref().expect("DeviceBuffer::alloc is Some until drop")
    }

    #[inline]
    pub(crate) fn ptr(&self) -> *mut c_void {
        self.alloc().ptr()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.alloc().bytes()
    }

    /// This buffer's process-unique id.
    #[inline]
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    #[inline]
    pub(crate) fn device(&self) -> &Arc<Device> {
        self.alloc().device()
    }

    fn lock_users(&self) -> MutexGuard<'_, Vec<Arc<StreamInner>>> {
        self.users.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes `users` (this buffer's list, locked by the caller) to enqueues that do not lock
    /// it: see [`DeviceBuffer::sole`].
    fn note(&self, users: &[Arc<StreamInner>]) {
        self.sole.store(sole_of(users), Ordering::Release);
    }

    /// Waits for all work enqueued on this buffer, so the host may read or overwrite it. Holds
    /// the buffer's stream list while it waits, so a launch on another thread cannot slip in
    /// between the wait and the forgetting of a stream. Each stream is forgotten under its
    /// enqueue lock before it is waited for: an enqueue that found it the buffer's only user has
    /// then queued its work (which the wait covers), and later ones lock the list.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let mut users = self.lock_users();
        for keep in self.live_pins() {
            keep.wait_replays()?;
        }
        while let Some(s) = users.last().cloned() {
            let enqueue = s.lock_enqueue();
            users.pop();
            self.note(&users);
            drop(enqueue);
            if let Err(e) = s.synchronize() {
                // Listed again, so drop still waits for it.
                users.push(s);
                self.note(&users);
                return Err(e);
            }
        }
        Ok(())
    }
}

impl DeviceBuffer {
    fn lock_pins(&self) -> MutexGuard<'_, Vec<Arc<Keep>>> {
        self.pins.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The graphs alive that use this buffer.
    fn live_pins(&self) -> Vec<Arc<Keep>> {
        if !self.pinned.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut pins = self.lock_pins();
        pins.retain(|k| k.live());
        pins.clone()
    }

    /// Records that the graph being captured into `keep` uses this buffer.
    fn pin(&self, keep: &Arc<Keep>) {
        let mut pins = self.lock_pins();
        if !pins.iter().any(|k| Arc::ptr_eq(k, keep)) {
            pins.push(keep.clone());
            self.pinned.store(true, Ordering::Release);
        }
    }
}

/// Before `stream` queues work on `buffers` (their lists locked): with a capture going on, each is
/// pinned to its graph; every other live graph using one orders the work after its last replay.
fn order_with_graphs(stream: &Arc<StreamInner>, buffers: &[&DeviceBuffer]) -> Result<()> {
    // (No lock: the caller's stream, whose captures only this thread begins or ends.)
    let capture = stream.capture_keep();
    for b in buffers {
        if let Some(keep) = &capture {
            if !b.alloc().owned() && b.owner.is_none() {
                // The caller frees it once the buffer is gone, but a graph would replay on it.
                return Err(crate::Error::invalid(
                    "tensor",
                    "a view of the caller's device memory (without an owner this crate keeps) cannot be used \
                     inside a capture: a graph may outlive it",
                ));
            }
            b.pin(keep);
        }
        for keep in b.live_pins() {
            if !capture.as_ref().is_some_and(|c| Arc::ptr_eq(c, &keep)) {
                keep.order_eager(stream)?;
            }
        }
    }
    Ok(())
}

/// The [`DeviceBuffer::sole`] word of a stream list.
fn sole_of(users: &[Arc<StreamInner>]) -> usize {
    match users {
        [only] => Arc::as_ptr(only) as usize,
        _ => 0,
    }
}

/// Enqueues work that touches `buffers` on `stream`, as one step: `enqueue` runs with the
/// stream's enqueue lock held, and is handed what it guards ([`Enqueue`]: the workspace and the
/// launch cache's state), and every buffer is
/// recorded on the stream before any lock is released. So no other thread can free a buffer, or
/// enqueue on it from another stream, between the recording and the enqueue: a buffer is freed
/// only after every stream that may use it has finished.
///
/// * **The steady case** (every buffer's list is exactly `stream`, which [`DeviceBuffer::sole`]
///   tells without its lock): only the enqueue lock is taken. This holds because `stream` is
///   forgotten by a list only under `stream`'s enqueue lock (when another stream is ordered after
///   it, or a host wait forgets it): while the lock is held, no one can record an event on
///   `stream` for ordering, or wait for it, before this work is queued.
/// * **Otherwise** every buffer's list is locked (in address order, so two calls never deadlock,
///   and each buffer once however often it is listed); work that other streams queued on a buffer
///   is ordered before this work on the device (an event recorded on each such stream under its
///   enqueue lock, waited for by `stream`: the host does not block), so accesses from different
///   streams never overlap; then the enqueue lock is taken and `enqueue` runs; and `stream` is
///   recorded on every buffer. `stream` is recorded even when `enqueue` fails (it may have queued
///   part of its work; recording too much only costs an event).
///
/// Lock order: buffers' lists, then one stream's enqueue lock at a time. `enqueue` must not
/// enqueue through this function again (the enqueue lock is not reentrant).
///
/// Once `stream` waits for an earlier stream's event, the earlier stream is forgotten: work after
/// `stream`'s (an event recorded on it at drop, a host wait) is after the earlier stream's too.
pub(crate) fn enqueue_using<'b, R, I>(
    stream: &Arc<StreamInner>,
    buffers: I,
    enqueue: impl FnOnce(&mut Enqueue) -> Result<R>,
) -> Result<R>
where
    I: IntoIterator<Item = &'b DeviceBuffer>,
    I::IntoIter: Clone,
{
    let buffers = buffers.into_iter();
    match enqueue_if_sole_user(stream, buffers.clone(), enqueue) {
        Ok(result) => result,
        Err(enqueue) => enqueue_locking(stream, buffers, enqueue)?,
    }
}

/// [`enqueue_using`]'s steady case: runs `enqueue` under `stream`'s enqueue lock if `stream` is
/// the only stream every buffer lists (then nothing needs ordering or recording); else gives
/// `enqueue` back, nothing done.
#[inline]
pub(crate) fn enqueue_if_sole_user<'b, T, F: FnOnce(&mut Enqueue) -> T>(
    stream: &Arc<StreamInner>,
    mut buffers: impl Iterator<Item = &'b DeviceBuffer>,
    enqueue: F,
) -> std::result::Result<T, F> {
    let me = Arc::as_ptr(stream) as usize;
    let mut state = stream.lock_enqueue();
    // (A capture, or a buffer a graph uses, takes the general case.)
    if !stream.capturing() && buffers.all(|b| b.sole.load(Ordering::Acquire) == me && !b.pinned.load(Ordering::Acquire))
    {
        Ok(enqueue(&mut state))
    } else {
        Err(enqueue)
    }
}

/// [`enqueue_using`]'s general case: every buffer's list locked, `stream` ordered after the
/// other streams in them, `enqueue` run under `stream`'s enqueue lock, `stream` recorded on
/// every buffer. `Err` (without running `enqueue`) when the ordering failed.
fn enqueue_locking<'b, T>(
    stream: &Arc<StreamInner>,
    buffers: impl Iterator<Item = &'b DeviceBuffer>,
    enqueue: impl FnOnce(&mut Enqueue) -> T,
) -> Result<T> {
    // On the stack: a launch allocates nothing here. Sorted by address (insertion sort: a
    // handful of buffers), each buffer once.
    let mut buffers = buffers;
    let Some(first) = buffers.next() else { return Ok(enqueue(&mut stream.lock_enqueue())) };
    let mut sorted: [&DeviceBuffer; MAX_BUFFERS] = [first; MAX_BUFFERS];
    let mut n = 1;
    let addr = |b: &DeviceBuffer| std::ptr::from_ref(b) as usize;
    for b in buffers {
        let mut i = n;
        while i > 0 && addr(sorted[i - 1]) > addr(b) {
            i -= 1;
        }
        if i > 0 && std::ptr::eq(sorted[i - 1], b) {
            continue; // listed already
        }
        if n == MAX_BUFFERS {
            return Err(crate::Error::internal(format!("one enqueue lists more than {MAX_BUFFERS} device buffers")));
        }
        sorted.copy_within(i..n, i + 1);
        sorted[i] = b;
        n += 1;
    }
    // A launch lists a handful of buffers: a small array of guards then (dropping one costs a
    // step per place).
    if n <= 4 {
        lock_and_enqueue::<4, T>(stream, &sorted[..n], enqueue)
    } else {
        lock_and_enqueue::<MAX_BUFFERS, T>(stream, &sorted[..n], enqueue)
    }
}

/// Locks every list of `sorted` (at most `K`), in address order (so two enqueues never wait for
/// each other); orders `stream` after the other streams in them; runs `enqueue` under `stream`'s
/// enqueue lock; records `stream` in every list; then releases them.
fn lock_and_enqueue<const K: usize, T>(
    stream: &Arc<StreamInner>,
    sorted: &[&DeviceBuffer],
    enqueue: impl FnOnce(&mut Enqueue) -> T,
) -> Result<T> {
    let mut guards: [Option<MutexGuard<'_, Vec<Arc<StreamInner>>>>; K] = [const { None }; K];
    let mut others = false;
    for (g, b) in guards.iter_mut().zip(sorted) {
        let users = b.lock_users();
        others |= users.iter().any(|s| !Arc::ptr_eq(s, stream));
        *g = Some(users);
    }
    let guards = &mut guards[..sorted.len().min(K)];
    let ordered = if others { order_after_users(stream, sorted, guards) } else { Ok(()) };
    let ordered = ordered.and_then(|()| order_with_graphs(stream, sorted));
    let result = ordered.map(|()| enqueue(&mut stream.lock_enqueue()));
    // Recorded even when the work failed (it may have queued part of it; recording too much only
    // costs an event), and when ordering failed: the streams ordered before `stream` were
    // forgotten, and `stream` waits for them.
    for (users, b) in guards.iter_mut().zip(sorted) {
        let Some(users) = users else { continue };
        if !users.iter().any(|s| Arc::ptr_eq(s, stream)) {
            users.push(stream.clone());
            b.note(users);
        }
    }
    result
}

/// Orders `stream` after every other stream in the locked lists `guards` (of the buffers
/// `sorted`), each stream once however many buffers it used, and forgets them (`stream` waits
/// for them from now on). Each earlier stream's event is recorded, and the stream forgotten, under
/// that stream's enqueue lock (see [`enqueue_using`]; a capture begun on it comes after the
/// record, or refuses it), and waited for by `stream` once that lock is let go. On failure the
/// unordered ones stay listed (listed again if the wait failed), so a buffer's drop still waits
/// for them. Allocates only here, when another stream is involved.
fn order_after_users(
    stream: &Arc<StreamInner>,
    sorted: &[&DeviceBuffer],
    guards: &mut [Option<MutexGuard<'_, Vec<Arc<StreamInner>>>>],
) -> Result<()> {
    let mut ordered: Vec<Arc<StreamInner>> = Vec::new();
    for (users, b) in guards.iter_mut().zip(sorted) {
        let Some(users) = users else { continue };
        while let Some(i) = users.iter().position(|s| !Arc::ptr_eq(s, stream)) {
            let earlier = users[i].clone();
            let enqueue = earlier.lock_enqueue();
            let marker = if ordered.iter().any(|o| Arc::ptr_eq(o, &earlier)) {
                None
            } else {
                Some(stream.order_marker(&earlier, &enqueue)?)
            };
            users.swap_remove(i);
            b.note(users);
            drop(enqueue);
            let Some(marker) = marker else { continue };
            // Waited for once `earlier`'s lock is let go (never two streams' enqueue locks).
            if let Err(e) = marker.map_or(Ok(()), |event| stream.wait(event)) {
                users.push(earlier);
                b.note(users);
                return Err(e);
            }
            ordered.push(earlier);
        }
    }
    Ok(())
}

/// The most buffers one enqueue touches (an operator's at most 16 tensors and its workspace).
const MAX_BUFFERS: usize = 20;

impl Drop for DeviceBuffer {
    /// Owned memory goes back to the allocator after the work of every stream that used it,
    /// ordered by events: no host wait. So does foreign memory's owner (see
    /// [`release_owner`]). Foreign memory without an owner is waited for, so the
    /// caller may free it once the buffer is gone; if that fails it is reported.
    fn drop(&mut self) {
        let pins = std::mem::take(self.pins.get_mut().unwrap_or_else(|p| p.into_inner()));
        let mut live: Vec<Arc<Keep>> = pins.into_iter().filter(|k| k.live()).collect();
        // A stream being captured may have recorded it (its release would record an event into
        // the capture): that graph keeps it too. (Advisory: a capture ended since only keeps it
        // longer; one begun since is seen by the release below, under the stream's enqueue lock.)
        for s in self.users.get_mut().unwrap_or_else(|p| p.into_inner()).iter() {
            if let Some(keep) = s.capture_keep() {
                if !live.iter().any(|k| Arc::ptr_eq(k, &keep)) {
                    live.push(keep);
                }
            }
        }
        // Dropped during a capture, used by the captured stream alone: back to the graph's
        // private pool, for the capture's later allocations. (Advisory: nothing uses the buffer
        // meanwhile, so a capture that ends after this check finds it as if dropped just before.)
        if let [only] = &self.users.get_mut().unwrap_or_else(|p| p.into_inner())[..] {
            if let (Some(keep), true) = (only.capture_keep(), self.owner.is_none()) {
                if live.iter().all(|k| Arc::ptr_eq(k, &keep)) && self.alloc.as_ref().is_some_and(DeviceAlloc::owned) {
                    if let Some(alloc) = self.alloc.take() {
                        if let Err(alloc) = keep.recycle(alloc) {
                            self.alloc = Some(alloc);
                        } else {
                            return;
                        }
                    }
                }
            }
        }
        if !live.is_empty() {
            self.hand_to_graphs(live);
            return;
        }
        let Some(alloc) = self.alloc.take() else { return };
        let users = std::mem::take(self.users.get_mut().unwrap_or_else(|p| p.into_inner()));
        // A capture begun on a user since the check above is seen by the release, under that
        // user's enqueue lock (nothing recorded into it): that graph keeps the buffer after all.
        let kept = {
            let users: Vec<&StreamInner> = users.iter().map(|s| &**s).collect();
            if alloc.owned() {
                alloc.release(&users, None).err().map(|(alloc, keep)| (alloc, None, keep))
            } else if let Some(owner) = self.owner.take() {
                release_owner(alloc.device(), owner, &users).err().map(|(owner, keep)| (alloc, Some(owner), keep))
            } else {
                for s in users {
                    if let Err(e) = s.synchronize() {
                        report_drop_error("aclrtSynchronizeStream (dropping a view of the caller's memory)", &e);
                    }
                }
                None
            }
        };
        if let Some((alloc, owner, keep)) = kept {
            self.alloc = Some(alloc);
            self.owner = owner;
            *self.users.get_mut().unwrap_or_else(|p| p.into_inner()) = users;
            self.hand_to_graphs(vec![keep]);
        }
    }
}

impl DeviceBuffer {
    /// The graphs `keeps` (live, or being captured) may use the memory: they keep it (the same
    /// buffer, unpinned, with its streams) and drop it after their model run instances are
    /// destroyed, when it is released as usual. (A graph that went meanwhile gives it back: the
    /// last clone then drops it as usual.)
    fn hand_to_graphs(&mut self, keeps: Vec<Arc<Keep>>) {
        let moved = Arc::new(DeviceBuffer {
            alloc: self.alloc.take(),
            users: Mutex::new(std::mem::take(self.users.get_mut().unwrap_or_else(|p| p.into_inner()))),
            sole: AtomicUsize::new(0),
            id: self.id,
            owner: self.owner.take(),
            pins: Mutex::new(Vec::new()),
            pinned: AtomicBool::new(false),
        });
        for keep in keeps {
            let _ = keep.hold(moved.clone());
        }
    }
}

/// What keeps foreign memory allocated while the crate uses it (an imported DLPack tensor: its
/// deleter frees the memory).
type Owner = Box<dyn Send + Sync>;

/// Lets go of `owner` (what keeps foreign memory allocated) once the work `users` queued on the
/// memory has run, without a host wait: an event is recorded on each stream and the owner parked
/// with them in the device's event pool, which drops it once they are seen complete (see
/// [`super::event::EventPool::park`]); with no queued work it is dropped at once. A stream on
/// which no event can be recorded (the pool at its bound, a failed record) is synchronised
/// instead; if even that fails, the owner is leaked (queued work may still use the memory) and
/// the leak counted. A user being captured gives the owner back with the graph's keep (see
/// [`DeviceAlloc::release`]).
fn release_owner(
    device: &Arc<Device>,
    owner: Owner,
    users: &[&StreamInner],
) -> std::result::Result<(), (Owner, Arc<Keep>)> {
    let what = "aclrtSynchronizeStream (dropping a view of foreign memory)";
    match super::event::record_after(device, users.iter().copied(), None, what) {
        After::Events(events) if events.is_empty() => drop(owner),
        After::Events(events) => device.events.park(device.cann, events.into_iter().map(|(_, e)| e).collect(), owner),
        After::Capturing(keep) => return Err((owner, keep)),
        After::Unknown => {
            // Queued work may still use the memory: its owner must not free it.
            std::mem::forget(owner);
            leaked(Leak::Allocation);
        }
    }
    Ok(())
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer").field("device", &self.device().id).field("bytes", &self.bytes()).finish()
    }
}
