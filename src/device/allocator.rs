//! The stream-ordered caching allocator of one device: the design of PyTorch's CUDA allocator and
//! torch_npu's NPUCachingAllocator (docs/cann/ASYNC.md 4), with size classes instead of split
//! segments.
//!
//! * A request is rounded up to its size class (multiples of 512 bytes up to 1 MiB, then four
//!   classes per power of two: at most 25% rounding) and served by the smallest cached block of
//!   at least that size and at most a quarter more, else by a new `aclrtMalloc`.
//! * Freeing never waits. An event is recorded on every stream that used the block (after its
//!   last use there), and the block goes back to the cache with those events. It may be handed
//!   out again for work on stream `S` once every event recorded on a stream other than `S` has
//!   completed (`aclrtQueryEventStatus`, never a host wait): stream order covers the uses on `S`
//!   itself, so a block freed on `S` is reusable on `S` at once and on other streams once `S` has
//!   passed its last use. A request that no stream orders (host-synchronous writes, buffers
//!   without a stream) takes only idle blocks, whose events have all completed.
//! * When `aclrtMalloc` fails, every cached block is returned to the device (waiting for its
//!   events first: out-of-memory recovery may block) and the call is retried once; a second
//!   failure is an error naming the sizes.
//! * [`CACHE_ENV`] turns caching off: every block is an exact `aclrtMalloc`, and a freed one is
//!   passed to `aclrtFree` as soon as its events have completed (queried at the next allocation,
//!   free or stream synchronise of the device; waited for at teardown or `empty_cache`), so the
//!   mock's use-after-free checks see every free.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

use ascend_sys::Cann;

use super::capture::Keep;
use super::event::{EventPool, PooledEvent};
use super::{leaked, report, Leak, StreamInner};
use crate::acl;
use crate::error::{Error, Result};

/// Environment variable that turns the caching allocator off when set to `1` (read when a
/// context is made): device memory is then freed (`aclrtFree`) once the work that used it has
/// completed, so the mock's use-after-free checks see every free.
pub(crate) const CACHE_ENV: &str = "ASCEND_NO_MEMORY_CACHING";

/// Requests up to this size are rounded to multiples of [`MIN_BLOCK`].
const SMALL: usize = 1 << 20;
/// The smallest block and the rounding of small requests.
const MIN_BLOCK: usize = 512;

/// The size class of a request of `bytes` (> 0): see the module docs.
pub(crate) fn round_size(bytes: usize) -> usize {
    let granule = if bytes <= SMALL { MIN_BLOCK } else { 1usize << (usize::BITS - 1 - bytes.leading_zeros() - 2) };
    bytes.checked_next_multiple_of(granule).unwrap_or(bytes)
}

/// A block in the cache (or, with caching off, waiting to be freed).
struct Cached {
    /// The `aclrtMalloc` size of the block.
    size: usize,
    /// `(stream id, event)`: an event recorded after the block's last use on each stream that
    /// used it, not yet seen complete.
    events: Vec<(u64, PooledEvent)>,
}

/// What [`Allocator::record`] made of a stream.
pub(crate) enum Recorded {
    /// An event recorded after the work queued on the stream so far.
    Event(PooledEvent),
    /// The stream was released: its work has run.
    Released,
    /// The stream is being captured into the graph this keeps: nothing was recorded.
    Capturing(Arc<Keep>),
}

/// Who will use a block handed out: decides which cached blocks qualify.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Order {
    /// Work on the stream with this id, in its order.
    Stream(u64),
    /// Nothing orders the first use (a host-synchronous write, or a buffer without a stream):
    /// only idle blocks qualify.
    Idle,
    /// Work captured on the stream with this id: as `Stream`, from cached blocks only (no
    /// `aclrtMalloc` inside a capture, except in relaxed mode, where CANN allows it).
    Capture(u64),
}

#[derive(Default)]
struct State {
    /// Cached blocks by (size, address) (with caching off: blocks waiting for their events).
    blocks: BTreeMap<(usize, usize), Cached>,
    /// Bytes asked for by the blocks handed out now (before rounding), and the largest value seen.
    allocated: usize,
    peak: usize,
    /// Bytes held from `aclrtMalloc` now (handed out, cached or waiting to be freed).
    reserved: usize,
    /// `aclrtMalloc` calls made.
    device_allocations: u64,
}

/// Bytes and calls of one device's allocator (see `Context::memory_stats`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Stats {
    pub(crate) allocated: usize,
    pub(crate) reserved: usize,
    pub(crate) peak_allocated: usize,
    pub(crate) device_allocations: u64,
}

/// The allocator of one device. Every method expects the device bound on the calling thread.
pub(crate) struct Allocator {
    caching: bool,
    state: Mutex<State>,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator").field("caching", &self.caching).field("stats", &self.stats()).finish()
    }
}

/// Whether every event of `c` recorded on a stream other than `stream` (all of them for `None`)
/// has completed; completed events go back to the device's pool. A failed query counts as not
/// complete.
fn settle(cann: &Cann, c: &mut Cached, stream: Option<u64>, pool: &EventPool) -> bool {
    let mut i = 0;
    while i < c.events.len() {
        if c.events[i].1.is_complete(cann) {
            pool.give_back(cann, c.events.swap_remove(i).1);
        } else {
            i += 1;
        }
    }
    c.events.iter().all(|(s, _)| Some(*s) == stream)
}

impl Allocator {
    /// An empty allocator; caching unless [`CACHE_ENV`] is `1`.
    pub(crate) fn from_env() -> Self {
        let off = std::env::var(CACHE_ENV).is_ok_and(|v| v.trim() == "1");
        Allocator { caching: !off, state: Mutex::new(State::default()) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn stats(&self) -> Stats {
        let st = self.lock();
        Stats {
            allocated: st.allocated,
            reserved: st.reserved,
            peak_allocated: st.peak,
            device_allocations: st.device_allocations,
        }
    }

    /// A block of at least `bytes` (> 0) for use as `order` says: returns its address, its size
    /// and whether work queued earlier on the ordering stream may still use it (then that stream
    /// must be the block's first user). `locked`: the caller holds a stream's enqueue lock, so no
    /// parked foreign owner is dropped here (its deleter may drop a tensor, whose release takes
    /// that lock).
    pub(crate) fn alloc(
        &self,
        cann: &Cann,
        pool: &EventPool,
        bytes: usize,
        order: Order,
        locked: bool,
    ) -> Result<(*mut c_void, usize, bool)> {
        // Events handed back whose work has run become spare (PyTorch polls its events on every
        // allocation likewise).
        pool.reclaim(cann, !locked);
        let mut st = self.lock();
        let size = if self.caching { round_size(bytes) } else { bytes };
        if self.caching {
            if let Some((ptr, block, pending)) = Self::take_cached(cann, pool, &mut st, size, order) {
                Self::hand_out(&mut st, bytes);
                return Ok((ptr, block, pending));
            }
        } else {
            Self::reap_quietly(cann, pool, &mut st);
        }
        if let Order::Capture(_) = order {
            // Refused (naming aclrtMalloc) unless the capture is relaxed.
            crate::acl::capture::refuse("aclrtMalloc", true).map_err(|e| match e {
                Error::Cann { call, status, message } => Error::Cann {
                    call,
                    status,
                    message: Some(format!(
                        "{}; no cached block of {size} bytes was free for the capture: run the captured work once \
                         before capturing it, so the caching allocator holds its blocks",
                        message.unwrap_or_default()
                    )),
                },
                other => other,
            })?;
        }
        let ptr = match acl::malloc(cann, size) {
            Ok(p) => p,
            Err(first) => {
                // Out of memory (or a failure like it): give every cached block back, then retry
                // once (pointless when nothing was cached).
                let released = Self::release_all(cann, pool, &mut st);
                if released == 0 {
                    return Err(first);
                }
                acl::malloc(cann, size).map_err(|e| match e {
                    Error::Cann { call, status, message } => Error::Cann {
                        call,
                        status,
                        message: Some(format!(
                            "{size} bytes (a request of {bytes} bytes, rounded) could not be allocated, also after \
                             returning {released} cached bytes to the device and retrying; this context holds \
                             {} bytes in tensors and {} bytes from the device (the first failure: {first}){}",
                            st.allocated,
                            st.reserved,
                            message.map(|m| format!("; {m}")).unwrap_or_default()
                        )),
                    },
                    other => other,
                })?
            }
        };
        st.device_allocations += 1;
        st.reserved += size;
        Self::hand_out(&mut st, bytes);
        Ok((ptr, size, false))
    }

    /// Counts `bytes` asked for as handed out.
    fn hand_out(st: &mut State, bytes: usize) {
        st.allocated += bytes;
        st.peak = st.peak.max(st.allocated);
    }

    /// The smallest cached block of `size..=size + size / 4` that `order` may use.
    fn take_cached(
        cann: &Cann,
        pool: &EventPool,
        st: &mut State,
        size: usize,
        order: Order,
    ) -> Option<(*mut c_void, usize, bool)> {
        let limit = size.saturating_add(size / 4);
        let stream = match order {
            Order::Stream(id) | Order::Capture(id) => Some(id),
            Order::Idle => None,
        };
        let key = st
            .blocks
            .range_mut((size, 0)..=(limit, usize::MAX))
            .find_map(|(key, c)| settle(cann, c, stream, pool).then_some(*key))?;
        let c = st.blocks.remove(&key)?;
        // Events of `stream` itself may still be pending (stream order makes the reuse safe):
        // the pool records them again only once seen complete.
        let pending = !c.events.is_empty();
        for (_, e) in c.events {
            pool.retire(e, Vec::new());
        }
        Some((key.1 as *mut c_void, c.size, pending))
    }

    /// Returns a block handed out by [`alloc`](Self::alloc) (`size` as it returned, `bytes` as
    /// asked) to the cache with `events`: `(stream id, event)` recorded after the block's last use
    /// on each stream whose queued work may still use it ([`super::event::record_after`]). Never
    /// waits.
    pub(crate) fn free(
        &self,
        cann: &Cann,
        pool: &EventPool,
        ptr: *mut c_void,
        size: usize,
        bytes: usize,
        events: Vec<(u64, PooledEvent)>,
    ) {
        let mut st = self.lock();
        st.allocated -= bytes;
        st.blocks.insert((size, ptr as usize), Cached { size, events });
        if !self.caching {
            Self::reap_quietly(cann, pool, &mut st);
        }
    }

    /// Frees the blocks whose events have completed, reporting a failed `aclrtFree`.
    fn reap_quietly(cann: &Cann, pool: &EventPool, st: &mut State) {
        if let (_, Some(e)) = Self::reap(cann, pool, st, false) {
            super::report_drop_error("aclrtFree", &e);
        }
    }

    /// A block handed out for `old` bytes now holds `new` (a capture's private pool reused it).
    pub(crate) fn reaccount(&self, old: usize, new: usize) {
        let mut st = self.lock();
        st.allocated -= old;
        Self::hand_out(&mut st, new);
    }

    /// A block handed out is leaked by its owner (queued work may still use it): no longer counted.
    pub(crate) fn forget(&self, size: usize, bytes: usize) {
        let mut st = self.lock();
        st.allocated -= bytes;
        st.reserved -= size;
    }

    /// An event of the device's pool recorded now on `s` (`Recorded::Event`), or `Released` when
    /// `s` was released (its work has run: nothing to wait for), or the keep of the graph `s` is
    /// being captured into (`Capturing`: an event of the pool must never be recorded into a graph;
    /// the caller hands what it frees to that graph instead). When the pool is at its bound, the
    /// cached blocks' completed events are given back first and the request retried.
    ///
    /// The check and the record are one step under `s`'s enqueue lock (taken here unless `held`
    /// is `s`: the caller holds it), under which `begin_capture` marks a capture begun: a capture
    /// another thread begins meanwhile comes after the record, or is seen. Under the lock the
    /// event request only polls the pool (no parked owner is dropped, so no DLPack deleter runs).
    pub(crate) fn record(
        &self,
        cann: &Cann,
        pool: &EventPool,
        s: &StreamInner,
        held: Option<&StreamInner>,
    ) -> Result<Recorded> {
        let _enqueue = match held {
            Some(h) if std::ptr::eq(h, s) => None,
            _ => Some(s.lock_enqueue()),
        };
        if let Some(keep) = s.capture_keep() {
            return Ok(Recorded::Capturing(keep));
        }
        let recorded = match s.if_live(|raw| pool.record(cann, raw)) {
            Some(Err(_)) => {
                let mut st = self.lock();
                for c in st.blocks.values_mut() {
                    settle(cann, c, None, pool);
                }
                drop(st);
                s.if_live(|raw| pool.record(cann, raw)).transpose()
            }
            other => other.transpose(),
        };
        Ok(recorded?.map_or(Recorded::Released, Recorded::Event))
    }

    /// With caching off: frees the blocks whose events have all completed (never waits). With
    /// caching on this does nothing.
    pub(crate) fn reap_now(&self, cann: &Cann, pool: &EventPool) {
        if !self.caching {
            Self::reap_quietly(cann, pool, &mut self.lock());
        }
    }

    /// Frees every block in `blocks` whose events have completed (all of them, after waiting,
    /// with `wait`); returns the bytes freed and the first error (its block stays cached).
    fn reap(cann: &Cann, pool: &EventPool, st: &mut State, wait: bool) -> (usize, Option<Error>) {
        let State { blocks, reserved, .. } = st;
        let mut freed = 0;
        let mut first: Option<Error> = None;
        blocks.retain(|&(_, ptr), c| {
            if wait {
                for (_, e) in &c.events {
                    // Waiting is this call's purpose (teardown, out of memory, empty_cache).
                    if let Err(err) = e.synchronize(cann) {
                        first.get_or_insert(err);
                        return true; // still in use as far as anyone knows: keep it
                    }
                }
            }
            if !settle(cann, c, None, pool) {
                return true;
            }
            // SAFETY: `ptr` came from aclrtMalloc, is not handed out, and every stream that used
            // it has passed the event recorded after that use.
            match unsafe { acl::free(cann, ptr as *mut c_void) } {
                Ok(()) => {
                    *reserved -= c.size;
                    freed += c.size;
                    false
                }
                Err(err) => {
                    first.get_or_insert(err);
                    true
                }
            }
        });
        (freed, first)
    }

    /// Waits for the events of every cached block and frees them all; returns the bytes freed.
    fn release_all(cann: &Cann, pool: &EventPool, st: &mut State) -> usize {
        let (freed, err) = Self::reap(cann, pool, st, true);
        if let Some(e) = err {
            super::report_drop_error("returning the memory cache (out of memory)", &e);
        }
        freed
    }

    /// `Context::empty_cache`: returns every cached block to the device, waiting for the work
    /// that used them (a host wait the caller asked for). A block whose wait or `aclrtFree`
    /// fails stays cached, and the first such error is returned. Refused on a thread that is
    /// capturing a stream, whether or not anything is cached (it waits and frees).
    pub(crate) fn empty_cache(&self, cann: &Cann, pool: &EventPool) -> Result<()> {
        crate::acl::capture::refuse("Context::empty_cache", false)?;
        match Self::reap(cann, pool, &mut self.lock(), true).1 {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Teardown (the device is going away, every stream has finished): frees every block (its
    /// events go back to the pool).
    pub(crate) fn teardown(&mut self, cann: &Cann, pool: &EventPool) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let (_, Some(e)) = Self::reap(cann, pool, st, true) {
            super::report_drop_error("freeing the memory cache", &e);
        }
        let left: usize = st.blocks.values().map(|c| c.size).sum();
        if left > 0 {
            report(format_args!("leaking {left} bytes of cached device memory whose work could not be waited for"));
            for (_, c) in std::mem::take(&mut st.blocks) {
                leaked(Leak::Allocation);
                std::mem::forget(c.events);
            }
        }
    }
}
