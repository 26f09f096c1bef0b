//! The launch cache of a stream: repeatable executors kept by what their phase 1 saw, so that a
//! launch with the same operator, argument metadata and scalars skips phase 1 and the
//! descriptors. A hit rebinds each tensor's device address (`aclSetInputTensorAddr` /
//! `aclSetOutputTensorAddr`) and runs phase 2 only (docs/cann/ASYNC.md §5).
//!
//! * **Per stream.** An entry is launched only on the stream whose cache holds it, so a
//!   repeatable executor is never launched on two streams at once.
//! * **Keyed** by the operator, every tensor argument's dtype, shape, strides, offset and storage
//!   length (absent ones as absent), and the scalars (by their bits, the mask included), compared
//!   word for word on a hit unless the tensor is the one the entry matched last time (the same
//!   [`Key::id`]: unique per tensor made, and a tensor's layout never changes). The caller
//!   (`ops/launch.rs`) reads each tensor into a [`Key`], plain layout data. Calls
//!   with a tensor of more than [`MAX_RANK`] dimensions, an empty storage or an address that is
//!   not 32-byte aligned (CANN's rule for rebinding) are not cached.
//! * **Bounded**: at most `capacity` entries, the least recently used evicted. The capacity of a
//!   new stream is `ASCEND_LAUNCH_CACHE_SIZE` (default [`DEFAULT_CAPACITY`]);
//!   `ASCEND_NO_LAUNCH_CACHE=1` makes it 0 (off); `Stream::set_launch_cache_capacity` changes it.
//! * **Current settings.** Phase 1 reads settings that are not arguments: the device's
//!   `ACL_OPT_DETERMINISTIC` (nnopbase hands it to the executor's tiling). Each entry keeps the
//!   device's configuration epoch ([`config_epoch`]) of its phase 1, which
//!   `Context::set_deterministic` bumps: an entry of an older epoch is not a hit, so the first
//!   launch after a change runs phase 1 again and replaces (retires) it.
//! * **Not repeatable: not cached.** CANN refuses to make some executors repeatable (AI CPU
//!   kernels, DSA tasks, synchronous copies in phase 1: ASYNC.md §5). Such a call is launched
//!   uncached (phase 2 consumes its executor) and its signature remembered (the last
//!   [`REFUSED_SLOTS`] per stream and configuration epoch), so that later calls skip the attempt.
//! * **Locked while launching**: the cache's state ([`CacheState`]) is behind the stream's
//!   enqueue lock ([`Enqueue`](super::Enqueue)), so a hit rebinds and launches its entry with no
//!   other launch in between; it is never held across phase 1.
//! * **Destroyed after its work.** A removed entry (evicted, replaced, or whose rebind or launch
//!   failed) may have a launch queued: its executor and descriptors are destroyed
//!   (`aclDestroyAclOpExecutor`, `aclDestroyTensor`) only once an event recorded on the stream
//!   after that launch has completed (queried, never waited for), or after the stream has been
//!   synchronised; the stream's drop synchronises and destroys them all, before its device goes.
//!
//! Soundness: a cached descriptor keeps the address its last launch used, whose memory may since
//! have been freed. It is never launched that way: before every launch each present tensor is
//! rebound to the current call's buffer, unless the descriptor is bound to that very buffer
//! already (buffer ids are unique in the process and never reused, and a buffer's address never
//! changes), and the call's buffers are recorded on the stream with the enqueue, as for any
//! launch (`enqueue_using`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use ascend_sys::{aclOpExecutor, aclTensor, aclnnStatus, aclrtStream, symbols};

use super::{leaked, report, report_drop_error, Device, DeviceBuffer, EventInner, Leak, StreamInner};
use crate::acl;
use crate::error::Result;
use crate::layout::{mix, Layout, MAX_RANK};

/// Entries per stream unless `ASCEND_LAUNCH_CACHE_SIZE` says otherwise.
pub(crate) const DEFAULT_CAPACITY: usize = 256;
/// Set to `1`, turns the launch cache off for new streams.
pub(crate) const OFF_ENV: &str = "ASCEND_NO_LAUNCH_CACHE";
/// The number of entries per stream.
pub(crate) const SIZE_ENV: &str = "ASCEND_LAUNCH_CACHE_SIZE";

/// Signatures per stream remembered as not repeatable (the oldest forgotten first: it is tried
/// once more).
pub(crate) const REFUSED_SLOTS: usize = 64;

/// Configuration epochs, one per device id (modulo the length; devices that share a slot, or the
/// same id of two toolkits, only re-run phase 1 more often).
static CONFIG_EPOCHS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

fn epoch_slot(device: &Device) -> &'static AtomicU64 {
    &CONFIG_EPOCHS[device.id.unsigned_abs() as usize % CONFIG_EPOCHS.len()]
}

/// The configuration epoch of `device`: changes whenever a setting phase 1 reads does.
#[inline]
pub(crate) fn config_epoch(device: &Device) -> u64 {
    epoch_slot(device).load(Ordering::Acquire)
}

/// Records that a setting phase 1 reads has changed on `device` (after the change): every
/// cached executor of the device is stale from now on.
pub(crate) fn config_changed(device: &Device) {
    epoch_slot(device).fetch_add(1, Ordering::AcqRel);
}

/// The capacity of a new stream's cache, from the environment (read once; an unreadable size is
/// reported and the default used).
pub(crate) fn default_capacity() -> usize {
    static CAPACITY: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CAPACITY.get_or_init(|| {
        if std::env::var(OFF_ENV).is_ok_and(|v| v.trim() == "1") {
            return 0;
        }
        match std::env::var(SIZE_ENV) {
            Err(_) => DEFAULT_CAPACITY,
            Ok(v) => v.trim().parse().unwrap_or_else(|_| {
                report(format_args!(
                    "{SIZE_ENV}={v:?} is not a number of entries; using the default {DEFAULT_CAPACITY}"
                ));
                DEFAULT_CAPACITY
            }),
        }
    })
}

/// Phase 2 of every aclnn operator: `(workspace, workspace bytes, executor, stream)`.
pub(crate) type Phase2 =
    unsafe extern "C" fn(*mut std::ffi::c_void, u64, *mut aclOpExecutor, aclrtStream) -> aclnnStatus;

/// What the cache reads of one tensor argument, as plain data: its layout (everything phase 1
/// sees of it but its address), with the id and hash its tensor was given when it was made.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Key<'a> {
    /// Unique per layout made, and a layout never changes: equal ids mean equal layouts.
    pub(crate) id: u64,
    /// [`layout::hash`](crate::layout::hash) of `layout`.
    pub(crate) hash: u64,
    pub(crate) layout: Layout<'a>,
}

/// The key word of an absent optional tensor (a present one's first word is its dtype and rank,
/// far smaller).
const ABSENT: usize = usize::MAX;

/// Appends what phase 1 saw of `k` to `key`: [`ABSENT`], or its dtype and rank, offset, storage
/// length, shape and strides (the rank first, so no two layouts spell the same words).
fn push_key(key: &mut Vec<usize>, k: Option<&Key<'_>>) {
    match k {
        None => key.push(ABSENT),
        Some(Key { layout: l, .. }) => {
            key.extend([dtype_rank(l), l.offset, l.storage_len]);
            key.extend_from_slice(l.shape);
            key.extend_from_slice(l.strides);
        }
    }
}

fn dtype_rank(l: &Layout<'_>) -> usize {
    l.dtype as usize | (l.shape.len() << 8)
}

/// Whether `key` starts with the words [`push_key`] makes of `k`; returns the rest.
#[inline]
fn strip_key<'k>(key: &'k [usize], k: Option<&Key<'_>>) -> Option<&'k [usize]> {
    let Some(Key { layout: l, .. }) = k else {
        return key.split_first().filter(|(&w, _)| w == ABSENT).map(|(_, rest)| rest);
    };
    let rank = l.shape.len();
    let ([head, offset, storage_len], rest) = key.split_first_chunk::<3>()?;
    if *head != dtype_rank(l) || *offset != l.offset || *storage_len != l.storage_len || rest.len() < 2 * rank {
        return None;
    }
    let (key_shape, rest) = rest.split_at(rank);
    let (key_strides, rest) = rest.split_at(rank);
    // Element by element (ranks are at most MAX_RANK).
    let same = |a: &[usize], b: &[usize]| a.iter().zip(b).all(|(x, y)| x == y);
    (same(key_shape, l.shape) && same(key_strides, l.strides)).then_some(rest)
}

/// The id of the layout `k` (0: absent).
fn id(k: &Option<Key<'_>>) -> u64 {
    k.as_ref().map_or(0, |k| k.id)
}

/// Whether `keys` have the layouts `key` spells ([`push_key`]), `seen` holding the layout id
/// matched last at each place: one matched there before is equal without reading its words. On a
/// match, `seen` takes the ids of `keys`.
#[inline]
fn layouts_match(key: &[usize], seen: &mut [u64], keys: &[Option<Key<'_>>]) -> bool {
    if seen.len() != keys.len() {
        return false;
    }
    if seen.iter().zip(keys).all(|(&seen, k)| seen == id(k)) {
        return true; // the steady case: the very tensors of an earlier call
    }
    let mut rest = key;
    for k in keys {
        match strip_key(rest, k.as_ref()) {
            Some(r) => rest = r,
            None => return false,
        }
    }
    if !rest.is_empty() {
        return false;
    }
    for (seen, k) in seen.iter_mut().zip(keys) {
        *seen = id(k);
    }
    true
}

/// The signature of one call, borrowed from its arguments: what a cache entry must match.
pub(crate) struct Signature<'s> {
    pub(crate) op: &'static symbols::Operator,
    /// The scalars' bits (unused words 0).
    pub(crate) scalars: [u64; 4],
    /// The inputs' then the outputs' keys, each in its prototype's order (`None`: absent).
    pub(crate) keys: &'s [Option<Key<'s>>],
    /// How many of `keys` are inputs.
    pub(crate) inputs: usize,
}

impl Signature<'_> {
    /// A hash of everything the signature holds (each layout hashed once, when it was made:
    /// [`Key::hash`]).
    pub(crate) fn hash(&self) -> u64 {
        let mut h = mix(std::ptr::from_ref(self.op) as u64, self.inputs as u64);
        for s in self.scalars {
            h = mix(h, s);
        }
        for k in self.keys {
            h = mix(h, k.as_ref().map_or(u64::MAX, |k| k.hash));
        }
        h
    }
}

/// A repeatable executor with the descriptors its phase 1 saw, destroyed on drop (executor
/// first: it refers to the descriptors).
pub(crate) struct Entry {
    device: Arc<Device>,
    op: &'static symbols::Operator,
    scalars: [u64; 4],
    /// Every argument's layout, inputs then outputs, as [`push_key`] spells them.
    key: Vec<usize>,
    /// Per argument: its descriptor (null: absent).
    descriptors: Vec<*mut aclTensor>,
    /// Per argument: the id of the buffer its descriptor is bound to now (0: none).
    bound: Vec<u64>,
    /// Per argument: the [`Key::id`] of the last layout matched there (0: absent or none yet); a
    /// layout with that id is the one `key` spells.
    seen: Vec<u64>,
    inputs: usize,
    executor: *mut aclOpExecutor,
    workspace_size: u64,
    phase2: Phase2,
    /// The device's [`config_epoch`] before its phase 1.
    epoch: u64,
}

// SAFETY: the executor and descriptors are host objects of the device's default context, used
// from any thread that binds the device (every use does); an entry is used by one launch at a
// time (under its cache's lock).
unsafe impl Send for Entry {}

impl Entry {
    /// An entry over `executor` (made repeatable) and `descriptors` (one per argument of `sig`,
    /// null for an absent one, bound to `buffers`, `None` where absent), which it owns from now
    /// on; `epoch` is the device's [`config_epoch`] read before its phase 1.
    ///
    /// # Safety
    /// `executor` is a live repeatable executor from phase 1 of `sig.op` over `descriptors`,
    /// which are live; neither is used by anyone else afterwards.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn new(
        device: Arc<Device>,
        sig: &Signature<'_>,
        descriptors: &[*mut aclTensor],
        buffers: &[Option<&DeviceBuffer>],
        executor: *mut aclOpExecutor,
        workspace_size: u64,
        phase2: Phase2,
        epoch: u64,
    ) -> Self {
        // bounded: a few words per argument of one operator (at most 16, rank at most 8), a
        // miss only.
        #[allow(clippy::disallowed_methods)]
        let mut key = Vec::with_capacity(sig.keys.len() * (3 + 2 * MAX_RANK));
        for k in sig.keys {
            push_key(&mut key, k.as_ref());
        }
        // bounded: one per argument, a miss only.
        #[allow(clippy::disallowed_methods)]
        let descriptors = descriptors.to_vec();
        // bounded: one per argument, a miss only.
        #[allow(clippy::disallowed_methods)]
        let bound = buffers.iter().map(|b| b.map_or(0, DeviceBuffer::id)).collect();
        // bounded: one per argument, a miss only.
        #[allow(clippy::disallowed_methods)]
        let seen = sig.keys.iter().map(id).collect();
        Entry {
            device,
            op: sig.op,
            scalars: sig.scalars,
            key,
            descriptors,
            bound,
            seen,
            inputs: sig.inputs,
            executor,
            workspace_size,
            phase2,
            epoch,
        }
    }

    /// Whether `sig` is this entry's call under the device's settings now (configuration epoch
    /// `epoch`): the epoch, the operator, the scalars, and every tensor's layout, compared word by
    /// word unless the tensor is one matched there before (same layout id).
    fn matches(&mut self, sig: &Signature<'_>, epoch: u64) -> bool {
        if self.epoch != epoch
            || !std::ptr::eq(self.op, sig.op)
            || self.scalars != sig.scalars
            || self.inputs != sig.inputs
            || self.seen.len() != sig.keys.len()
        {
            return false;
        }
        layouts_match(&self.key, &mut self.seen, sig.keys)
    }

    /// The workspace phase 2 needs.
    pub(crate) fn workspace_size(&self) -> u64 {
        self.workspace_size
    }

    /// The operator's phase 2.
    pub(crate) fn phase2(&self) -> Phase2 {
        self.phase2
    }

    /// The operator's phase-2 name, for errors.
    pub(crate) fn op_name(&self) -> &'static str {
        self.op.name
    }

    /// The executor, for phase 2 (it stays owned by the entry).
    pub(crate) fn executor(&self) -> *mut aclOpExecutor {
        self.executor
    }

    /// Points every present tensor at its buffer in `buffers` (inputs then outputs): input `k`
    /// (counting present inputs only) with `aclSetInputTensorAddr(k)`, output `k` likewise with
    /// `aclSetOutputTensorAddr` (docs/cann/API.md §2.4). A descriptor already bound to that very
    /// buffer (same id, hence same address) is left as it is. The device is bound.
    ///
    /// # Safety
    /// Each buffer of a present argument holds that argument's storage at its address, 32-byte
    /// aligned, on the entry's device, and outlives the launch that follows.
    #[inline]
    pub(crate) unsafe fn rebind(&mut self, buffers: &[Option<&DeviceBuffer>]) -> Result<()> {
        let id = |b: &Option<&DeviceBuffer>| b.map_or(0, DeviceBuffer::id);
        if self.bound.len() == buffers.len() && self.bound.iter().zip(buffers).all(|(&bound, b)| bound == id(b)) {
            return Ok(()); // the steady case: every descriptor already points at its buffer
        }
        // SAFETY: this function's contract.
        unsafe { self.rebind_changed(buffers) }
    }

    /// [`rebind`](Self::rebind) of the descriptors not bound to their buffer.
    ///
    /// # Safety
    /// As for [`rebind`](Self::rebind).
    #[cold]
    unsafe fn rebind_changed(&mut self, buffers: &[Option<&DeviceBuffer>]) -> Result<()> {
        let cann = self.device.cann;
        let (mut input, mut output) = (0usize, 0usize);
        for (i, ((&d, bound), b)) in self.descriptors.iter().zip(&mut self.bound).zip(buffers).enumerate() {
            if d.is_null() {
                continue;
            }
            let (is_input, index) = if i < self.inputs { (true, &mut input) } else { (false, &mut output) };
            *index += 1;
            let Some(b) = b else {
                return Err(crate::Error::internal("a cached call lacks a tensor its entry was made with"));
            };
            if *bound == b.id() {
                continue;
            }
            let addr = b.ptr();
            // SAFETY: a live repeatable executor and one of its live descriptors, at its index
            // among the present inputs (or outputs); `addr` as this function's contract says.
            let (call, status) = unsafe {
                if is_input {
                    ("aclSetInputTensorAddr", cann.nnopbase.aclSetInputTensorAddr(self.executor, *index - 1, d, addr))
                } else {
                    ("aclSetOutputTensorAddr", cann.nnopbase.aclSetOutputTensorAddr(self.executor, *index - 1, d, addr))
                }
            };
            // Unknown until it succeeds (a failed entry is retired anyway).
            *bound = 0;
            acl::check(cann, call, status)?;
            *bound = b.id();
        }
        Ok(())
    }

    /// Leaks the executor and descriptors (work that could not be waited for may use them).
    fn leak(mut self) {
        leaked(Leak::Executor);
        for _ in self.descriptors.iter().filter(|d| !d.is_null()) {
            leaked(Leak::Tensor);
        }
        self.executor = std::ptr::null_mut();
        self.descriptors.clear();
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Err(e) = self.device.bind() {
            report_drop_error("aclrtSetDevice (destroying a cached executor)", &e);
            return;
        }
        let cann = self.device.cann;
        if !self.executor.is_null() {
            // SAFETY: a live repeatable executor, owned by the entry; every launch of it has run
            // (see `Retired`), and it is never used again.
            let status = unsafe { cann.nnopbase.aclDestroyAclOpExecutor(self.executor) };
            if let Err(e) = acl::check(cann, "aclDestroyAclOpExecutor", status) {
                report_drop_error("aclDestroyAclOpExecutor", &e);
                leaked(Leak::Executor);
            }
        }
        for &d in self.descriptors.iter().filter(|d| !d.is_null()) {
            // SAFETY: a live descriptor owned by the entry; its executor is gone.
            if let Err(e) = unsafe { acl::destroy_tensor(cann, d) } {
                report_drop_error("aclDestroyTensor", &e);
                leaked(Leak::Tensor);
            }
        }
    }
}

/// One place of the cache.
struct Slot {
    hash: u64,
    last_used: u64,
    entry: Entry,
}

/// Entries removed from the cache, destroyed once `event` (recorded on the stream after their
/// last launch) has completed.
struct Retired {
    entries: Vec<Entry>,
    event: Arc<EventInner>,
}

/// What a stream's launch cache holds: [`Enqueue::launches`](super::Enqueue::launches), behind
/// the stream's enqueue lock, which a launch on the stream holds while it enqueues.
#[derive(Default)]
pub(crate) struct CacheState {
    slots: Vec<Slot>,
    index: HashMap<u64, usize, BuildHasherDefault<Identity>>,
    clock: u64,
    retired: Vec<Retired>,
    refused: Refused,
    stats: LaunchCacheStats,
}

/// The signatures whose executors CANN would not make repeatable, by hash mixed with the
/// configuration epoch; the oldest of [`REFUSED_SLOTS`] overwritten first.
struct Refused {
    keys: [u64; REFUSED_SLOTS],
    len: usize,
    next: usize,
}

impl Default for Refused {
    fn default() -> Self {
        Refused { keys: [0; REFUSED_SLOTS], len: 0, next: 0 }
    }
}

impl Refused {
    fn key(hash: u64, epoch: u64) -> u64 {
        mix(hash, epoch)
    }

    fn contains(&self, key: u64) -> bool {
        self.keys[..self.len].contains(&key)
    }

    fn insert(&mut self, key: u64) {
        if self.contains(key) {
            return;
        }
        self.keys[self.next] = key;
        self.next = (self.next + 1) % REFUSED_SLOTS;
        self.len = (self.len + 1).min(REFUSED_SLOTS);
    }
}

/// Counters of a stream's launch cache ([`Stream::launch_cache_stats`](crate::Stream::launch_cache_stats)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchCacheStats {
    /// Launches served by a cached executor (no phase 1, no descriptor made).
    pub hits: u64,
    /// Cacheable launches that ran phase 1 (and made an entry).
    pub misses: u64,
    /// Entries removed: to make room, replaced, by a smaller capacity, or after a failed rebind
    /// or launch.
    pub evictions: u64,
    /// Entries in the cache now.
    pub entries: usize,
    /// The most entries it keeps.
    pub capacity: usize,
}

impl CacheState {
    /// If the entry of `sig` (whose hash is `hash`) is cached, runs `launch` with it (the
    /// stream's enqueue lock held: no other launch rebinds it meanwhile) and returns its result;
    /// an entry whose launch failed is retired. `None` when it is not cached (nothing ran).
    pub(crate) fn launch_hit(
        &mut self,
        stream: &StreamInner,
        hash: u64,
        sig: &Signature<'_>,
        launch: impl FnOnce(&mut Entry) -> Result<()>,
    ) -> Option<Result<()>> {
        let &i = self.index.get(&hash)?;
        if !self.slots[i].entry.matches(sig, config_epoch(&stream.device)) {
            return None;
        }
        self.clock += 1;
        (self.slots[i].last_used, self.stats.hits) = (self.clock, self.stats.hits + 1);
        let result = launch(&mut self.slots[i].entry);
        if result.is_err() {
            let failed = self.remove(i);
            self.retire(stream, [failed]);
        }
        Some(result)
    }

    /// Takes slot `i` out (the last slot moves into its place).
    fn remove(&mut self, i: usize) -> Entry {
        let s = self.slots.swap_remove(i);
        self.index.remove(&s.hash);
        if let Some(moved) = self.slots.get(i) {
            self.index.insert(moved.hash, i);
        }
        s.entry
    }

    /// Destroys `entries` once the work queued on `stream` so far (their launches among it) has
    /// run: an event is recorded now and queried later ([`LaunchCache::reap`]). If it cannot be
    /// recorded, the stream is synchronised first; if that fails too, they are leaked.
    fn retire(&mut self, stream: &StreamInner, entries: impl IntoIterator<Item = Entry>) {
        // bounded: the entries being retired, at most the capacity.
        #[allow(clippy::disallowed_methods)]
        let list: Vec<Entry> = entries.into_iter().collect();
        if list.is_empty() {
            return;
        }
        self.stats.evictions += list.len() as u64;
        // In a capture, the graph keeps them (its replays launch them).
        let Err(mut list) = stream.keep_if_capturing(list) else { return };
        match stream.marker() {
            Ok(event) => self.retired.push(Retired { entries: list, event }),
            Err(e) => {
                report_drop_error("aclrtRecordEvent (retiring cached executors)", &e);
                // (Its reap skips this cache: the caller holds its lock.)
                if let Err(e) = stream.synchronize() {
                    report_drop_error("aclrtSynchronizeStream (retiring cached executors)", &e);
                    list.drain(..).for_each(Entry::leak);
                }
            }
        }
    }
}

/// A stream's cache of repeatable executors (see the module docs): its capacity here, its state
/// ([`CacheState`]) in the stream's [`Enqueue`](super::Enqueue). Each method takes the stream
/// whose cache it is.
///
/// Locking: the state is behind the stream's enqueue lock ([`enqueue_using`](super::enqueue_using)):
/// held across every enqueue on the stream (a hit's rebind and phase 2 among them), never across
/// phase 1, and taken after the buffers' stream lists, never before. A stream's synchronise,
/// which may run under that lock (a failed retire) or under a buffer's list, only tries it
/// ([`LaunchCache::reap`]).
pub(crate) struct LaunchCache {
    capacity: AtomicUsize,
}

impl LaunchCache {
    pub(crate) fn new(capacity: usize) -> Self {
        LaunchCache { capacity: AtomicUsize::new(capacity) }
    }

    /// Whether launches are cached at all.
    pub(crate) fn enabled(&self) -> bool {
        self.capacity.load(Ordering::Relaxed) > 0
    }

    /// Adds a launched entry for a call whose hash is `hash`, replacing the one that had that hash
    /// or, if the cache is full, the least recently used one; counts a miss.
    pub(crate) fn insert(&self, stream: &StreamInner, hash: u64, entry: Entry) {
        let capacity = self.capacity.load(Ordering::Relaxed);
        let mut enqueue = stream.lock_enqueue();
        let st = &mut enqueue.launches;
        st.stats.misses += 1;
        st.clock += 1;
        let clock = st.clock;
        let mut old = None;
        if let Some(&i) = st.index.get(&hash) {
            old = Some(st.remove(i));
        } else if st.slots.len() >= capacity {
            if let Some((i, _)) = st.slots.iter().enumerate().min_by_key(|(_, s)| s.last_used) {
                old = Some(st.remove(i));
            }
        }
        if st.slots.len() < capacity {
            // bounded: at most `capacity` slots, a miss only.
            #[allow(clippy::disallowed_methods)]
            st.slots.reserve(1);
            st.slots.push(Slot { hash, last_used: clock, entry });
            let i = st.slots.len() - 1;
            st.index.insert(hash, i);
            st.retire(stream, old);
        } else {
            st.retire(stream, old.into_iter().chain([entry])); // capacity 0 meanwhile
        }
        drop(enqueue);
        self.reap(stream);
    }

    /// Remembers that CANN refused to make the executor of the call whose hash is `hash`
    /// repeatable under the settings of configuration epoch `epoch` (see the module docs).
    pub(crate) fn refuse(&self, stream: &StreamInner, hash: u64, epoch: u64) {
        stream.lock_enqueue().launches.refused.insert(Refused::key(hash, epoch));
    }

    /// Whether the call whose hash is `hash` was refused under the device's settings now
    /// (configuration epoch `epoch`).
    pub(crate) fn refused(&self, stream: &StreamInner, hash: u64, epoch: u64) -> bool {
        stream.lock_enqueue().launches.refused.contains(Refused::key(hash, epoch))
    }

    /// Destroys `entries` once the work queued on `stream` so far (their launches among it) has
    /// run: see [`CacheState::retire`].
    pub(crate) fn retire(&self, stream: &StreamInner, entries: impl IntoIterator<Item = Entry>) {
        stream.lock_enqueue().launches.retire(stream, entries);
        self.reap(stream);
    }

    /// Destroys the retired entries whose events have completed (never waits); their events go
    /// back to the stream's pool. Does nothing if the cache is locked (a launch is using it).
    pub(crate) fn reap(&self, stream: &StreamInner) {
        // Only tried, and never taken again once let go: a synchronise holds the stream's
        // `released` lock, which an enqueue may take under the enqueue lock (`if_live`).
        let Some(mut enqueue) = stream.try_lock_enqueue() else { return };
        let retired = &mut enqueue.launches.retired;
        if retired.is_empty() {
            return;
        }
        // bounded: the retired lists, a list already in memory.
        #[allow(clippy::disallowed_methods)]
        let (mut done, mut pending) = (Vec::new(), Vec::new());
        for r in retired.drain(..) {
            if r.event.is_complete().unwrap_or(false) {
                done.push(r.entries);
                stream.recycle_event(r.event); // moved out: the pool gets it back
            } else {
                pending.push(r);
            }
        }
        *retired = pending;
        drop(enqueue);
        drop(done); // destroyed outside the lock
    }

    /// Changes the capacity; entries beyond it (least recently used first) are retired.
    pub(crate) fn set_capacity(&self, stream: &StreamInner, capacity: usize) {
        self.capacity.store(capacity, Ordering::Relaxed);
        let mut enqueue = stream.lock_enqueue();
        let st = &mut enqueue.launches;
        // bounded: the entries beyond the new capacity, at most the old one.
        #[allow(clippy::disallowed_methods)]
        let mut removed = Vec::new();
        while st.slots.len() > capacity {
            let Some((i, _)) = st.slots.iter().enumerate().min_by_key(|(_, s)| s.last_used) else { break };
            removed.push(st.remove(i));
        }
        st.retire(stream, removed);
        drop(enqueue);
        self.reap(stream);
    }

    /// The counters of `stream`'s cache.
    pub(crate) fn stats(&self, stream: &StreamInner) -> LaunchCacheStats {
        let st = &stream.lock_enqueue().launches;
        LaunchCacheStats { entries: st.slots.len(), capacity: self.capacity.load(Ordering::Relaxed), ..st.stats }
    }

    /// Everything the cache holds, for the stream's drop: destroyed if the stream has drained
    /// (`drained`), else leaked.
    pub(crate) fn teardown(&self, stream: &StreamInner, drained: bool) {
        let mut enqueue = stream.lock_enqueue();
        let st = &mut enqueue.launches;
        // bounded: the cache's own entries, already in memory.
        #[allow(clippy::disallowed_methods)]
        let mut all: Vec<Entry> = st.slots.drain(..).map(|s| s.entry).collect();
        all.extend(st.retired.drain(..).flat_map(|r| r.entries));
        st.index.clear();
        drop(enqueue);
        if !drained {
            all.into_iter().for_each(Entry::leak);
        }
    }
}

/// A hasher for keys that are already hashes.
#[derive(Default)]
struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix(self.0, u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::contiguous_strides;
    use crate::DType;

    fn words(keys: &[Option<Key<'_>>]) -> Vec<usize> {
        let mut words = Vec::new();
        keys.iter().for_each(|k| push_key(&mut words, k.as_ref()));
        words
    }

    /// The key of a layout made `id`-th (as a tensor's maker numbers them).
    fn key<'a>(id: u64, dtype: DType, shape: &'a [usize], strides: &'a [usize], storage_len: usize) -> Key<'a> {
        let layout = Layout { dtype, shape, strides, offset: 0, storage_len };
        Key { id, hash: crate::layout::hash(&layout), layout }
    }

    /// The words decide, not the ids: new layouts equal to the entry's match (and are then
    /// remembered), a layout that differs does not even where the other places hold the ones
    /// matched before, nor does absent for present or a longer list.
    #[test]
    fn layouts_match_by_words_and_remember_ids() {
        let (s234, s3, s4, s243) = ([2, 3, 4], [3], [4], [2, 4, 3]);
        let (c234, c3, c4, c243) =
            (contiguous_strides(&s234), contiguous_strides(&s3), contiguous_strides(&s4), contiguous_strides(&s243));
        let f32 = DType::F32;
        let (x, m) = (key(1, f32, &s234, &c234, 24), key(2, f32, &s3, &c3, 3));
        let entry = words(&[Some(x), None, Some(m)]);
        let mut seen = [0u64; 3];
        assert!(layouts_match(&entry, &mut seen, &[Some(x), None, Some(m)]), "its own layouts");
        assert_eq!(seen, [1, 0, 2], "the matched ids are remembered");

        let (x2, m2) = (key(3, f32, &s234, &c234, 24), key(4, f32, &s3, &c3, 3));
        assert!(layouts_match(&entry, &mut seen, &[Some(x2), None, Some(m2)]), "new tensors, same layouts");
        assert_eq!(seen, [3, 0, 4]);

        let wider = key(5, f32, &s4, &c4, 4);
        let strided = key(6, f32, &s3, &[2], 6);
        let other = key(7, f32, &s243, &c243, 24);
        for (what, call) in [
            ("a wider vector beside the tensors matched before", [Some(x2), None, Some(wider)]),
            ("a strided vector", [Some(x2), None, Some(strided)]),
            ("another shape of as many elements", [Some(other), None, Some(m2)]),
            ("present where the entry had none", [Some(x2), Some(m2), Some(m2)]),
            ("absent where the entry had one", [Some(x2), None, None]),
        ] {
            let before = seen;
            assert!(!layouts_match(&entry, &mut seen, &call), "{what}");
            assert_eq!(seen, before, "{what}: a mismatch remembers nothing");
        }
        assert!(!layouts_match(&entry, &mut [0; 2], &[Some(x2), None]), "fewer tensors");
        let f16 = key(8, DType::F16, &s3, &c3, 3);
        assert!(!layouts_match(&entry, &mut seen, &[Some(x2), None, Some(f16)]), "another dtype");
    }
}
