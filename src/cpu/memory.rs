//! Host memory of the CPU backend, cached like device memory: each CPU [`Context`](crate::Context)
//! keeps the blocks of dropped tensors in size classes (those of the device allocator,
//! [`round_size`]) and hands them out again, so a training loop stops asking the system for
//! memory after its first step: no fresh pages to fault in and clear, no heap trimmed at every
//! free.
//!
//! * Every byte of a block is always initialised: a new block comes from `alloc_zeroed` (for large
//!   blocks the system maps zero pages lazily, so the first write of each page, by whichever
//!   thread of a kernel writes it, faults it in; nothing clears it beforehand), and a reused
//!   block holds the values of an earlier tensor. So a slice over a block is sound whatever was
//!   written; the crate hands out a tensor whose block is not zeroed only from an allocating
//!   entry, after its kernel has written every element (`Tensor::alloc`, crate-private).
//! * Bounded: the cache keeps at most [`CACHE_LIMIT`] bytes of idle blocks; a block freed beyond
//!   that goes back to the system. When the system refuses a block, the cache is emptied and the
//!   request retried once. `Context::empty_cache` returns every idle block to the system.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::device::allocator::round_size;
use crate::error::{Error, Result};

/// The alignment of every block: a cache line, and a whole AVX-512 vector.
pub(crate) const ALIGN: usize = 64;

/// The most bytes of idle blocks one context keeps.
pub(crate) const CACHE_LIMIT: usize = 1 << 30;

/// Bytes and calls of one context's host memory (see `Context::memory_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    /// Bytes asked for by the blocks in use now (before rounding), and the largest value seen.
    pub(crate) allocated: usize,
    pub(crate) peak_allocated: usize,
    /// Bytes held from the system now (in use or cached).
    pub(crate) reserved: usize,
    /// Blocks asked of the system.
    pub(crate) system_allocations: u64,
}

#[derive(Default)]
struct State {
    /// Idle blocks sorted by size (bytes), then address: a vector, whose room stays once grown,
    /// so that a steady loop (blocks taken and given back) makes no heap allocation (a B-tree
    /// frees and makes nodes as it empties and fills).
    idle: Vec<((usize, usize), Block)>,
    idle_bytes: usize,
    stats: Stats,
}

/// The host memory of one CPU context (see the [module](self) docs).
pub(crate) struct HostMemory {
    state: Mutex<State>,
    /// The most bytes of idle blocks kept ([`CACHE_LIMIT`]).
    limit: usize,
}

impl Default for HostMemory {
    fn default() -> Self {
        HostMemory { state: Mutex::default(), limit: CACHE_LIMIT }
    }
}

impl HostMemory {
    /// Memory that caches nothing: a block goes back to the system when dropped (an Ascend
    /// context's host copies, which no step reuses).
    pub(crate) fn uncached() -> Self {
        HostMemory { state: Mutex::default(), limit: 0 }
    }
}

impl std::fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMemory").field("stats", &self.stats()).finish()
    }
}

/// A block of `size` bytes from the system, aligned to [`ALIGN`], every byte initialised. Not
/// freed on drop: [`HostMemory`] and [`HostBlock`] free it.
struct Block {
    ptr: NonNull<u8>,
    size: usize,
}

// SAFETY: a Block owns its memory exclusively (a plain heap allocation); moving it between threads
// moves that ownership.
unsafe impl Send for Block {}

impl Block {
    /// `size` (> 0) zeroed bytes, or `None` when the system refuses them.
    fn new(size: usize) -> Option<Block> {
        let layout = Layout::from_size_align(size, ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size (callers pass size > 0).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        NonNull::new(ptr).map(|ptr| Block { ptr, size })
    }

    fn free(self) {
        // SAFETY: allocated by `Block::new` with this size and alignment (valid then, so valid now),
        // and owned by `self`, which is consumed.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.size, ALIGN)) }
    }
}

impl HostMemory {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned one still holds consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes and calls so far.
    pub(crate) fn stats(&self) -> Stats {
        self.lock().stats
    }

    /// A block of at least `bytes`: the smallest idle block of its size class up to a quarter
    /// larger, else a new zeroed one from the system (after emptying the cache and retrying once
    /// when the system refuses). [`Error::HostAlloc`] when even that fails. With `zeroed` every
    /// byte of the first `bytes` is 0; else they hold zeros or an earlier tensor's values.
    pub(crate) fn alloc(self: &Arc<Self>, bytes: usize, zeroed: bool) -> Result<HostBlock> {
        if bytes == 0 {
            return Ok(HostBlock::empty());
        }
        let size = round_size(bytes);
        let mut st = self.lock();
        let first = st.idle.partition_point(|(k, _)| *k < (size, 0));
        let fits = st.idle.get(first).is_some_and(|(k, _)| k.0 <= size.saturating_add(size / 4));
        let (block, fresh) = match fits.then(|| st.idle.remove(first).1) {
            Some(b) => {
                st.idle_bytes -= b.size;
                (b, false)
            }
            None => {
                let b = match Block::new(size) {
                    Some(b) => b,
                    None => {
                        let released = Self::release(&mut st);
                        drop(st);
                        let b = (released > 0).then(|| Block::new(size)).flatten();
                        st = self.lock();
                        b.ok_or(Error::HostAlloc { bytes })?
                    }
                };
                st.stats.reserved += b.size;
                st.stats.system_allocations += 1;
                (b, true)
            }
        };
        st.stats.allocated += bytes;
        st.stats.peak_allocated = st.stats.peak_allocated.max(st.stats.allocated);
        drop(st);
        if zeroed && !fresh {
            // SAFETY: the block holds `block.size >= bytes` bytes, owned here.
            unsafe { block.ptr.as_ptr().write_bytes(0, bytes) };
        }
        let Block { ptr, size } = block;
        Ok(HostBlock { ptr, size, bytes, memory: Some(self.clone()) })
    }

    /// Takes back a block handed out for `bytes`: cached while the cache holds at most
    /// [`CACHE_LIMIT`] bytes, else freed.
    fn give_back(&self, block: Block, bytes: usize) {
        let mut st = self.lock();
        st.stats.allocated -= bytes;
        if st.idle_bytes + block.size <= self.limit {
            st.idle_bytes += block.size;
            let key = (block.size, block.ptr.as_ptr() as usize);
            let at = st.idle.partition_point(|(k, _)| *k < key);
            st.idle.insert(at, (key, block));
            return;
        }
        st.stats.reserved -= block.size;
        drop(st);
        block.free();
    }

    /// Frees every idle block; returns the bytes freed.
    fn release(st: &mut State) -> usize {
        let freed = st.idle_bytes;
        for (_, b) in std::mem::take(&mut st.idle) {
            b.free();
        }
        st.idle_bytes = 0;
        st.stats.reserved -= freed;
        freed
    }

    /// Returns every idle block to the system (`Context::empty_cache`).
    pub(crate) fn empty_cache(&self) {
        Self::release(&mut self.lock());
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // Every block in use holds an Arc of this memory: only idle ones are left.
        Self::release(self.state.get_mut().unwrap_or_else(|e| e.into_inner()));
    }
}

/// A type with [`ALIGN`]: its dangling pointer is the address of an empty block.
#[repr(align(64))]
struct Aligned;

/// A block in use by one tensor's storage: `bytes` (as asked) of `size`, initialised, aligned to
/// [`ALIGN`]. Dropping it gives the block back to its [`HostMemory`].
pub(crate) struct HostBlock {
    ptr: NonNull<u8>,
    size: usize,
    bytes: usize,
    /// `None` for an empty block (no memory).
    memory: Option<Arc<HostMemory>>,
}

// SAFETY: a HostBlock owns its bytes exclusively (shared access goes through `&self`, mutable
// through `&mut self`, as for a `Vec<u8>`); the Arc'd HostMemory is Sync (a mutex).
unsafe impl Send for HostBlock {}
// SAFETY: as above: `&HostBlock` only gives shared reads of initialised bytes.
unsafe impl Sync for HostBlock {}

impl std::fmt::Debug for HostBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBlock").field("bytes", &self.bytes).field("size", &self.size).finish()
    }
}

impl HostBlock {
    /// A block of no bytes (no memory).
    pub(crate) fn empty() -> HostBlock {
        HostBlock { ptr: NonNull::<Aligned>::dangling().cast(), size: 0, bytes: 0, memory: None }
    }

    /// The block's first `bytes` bytes, as `n` values of `T` (`n·size_of::<T>() <= bytes`).
    pub(crate) fn as_slice<T: Pod>(&self, n: usize) -> &[T] {
        assert!(n * std::mem::size_of::<T>() <= self.bytes && std::mem::align_of::<T>() <= ALIGN);
        // SAFETY: the bytes are initialised (see the module docs), aligned for T, owned by self
        // and borrowed for as long as `&self`; every bit pattern is a valid T (Pod).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<T>(), n) }
    }

    /// As [`as_slice`](Self::as_slice), mutably.
    pub(crate) fn as_mut_slice<T: Pod>(&mut self, n: usize) -> &mut [T] {
        assert!(n * std::mem::size_of::<T>() <= self.bytes && std::mem::align_of::<T>() <= ALIGN);
        // SAFETY: as in `as_slice`, borrowed exclusively for as long as `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast::<T>(), n) }
    }

    /// The memory this block came from (`None` for an empty block).
    pub(crate) fn memory(&self) -> Option<&Arc<HostMemory>> {
        self.memory.as_ref()
    }
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        if let Some(memory) = self.memory.take() {
            memory.give_back(Block { ptr: self.ptr, size: self.size }, self.bytes);
        }
    }
}

/// Plain values every bit pattern of which is valid, without padding: what a block may be viewed
/// as.
///
/// # Safety
/// Implement only for such types.
pub(crate) unsafe trait Pod: Copy {}
// SAFETY: plain numbers without padding; every bit pattern is a value.
unsafe impl Pod for f32 {}
// SAFETY: as above.
unsafe impl Pod for i32 {}
// SAFETY: as above (a u16 wrapper).
unsafe impl Pod for half::f16 {}
// SAFETY: as above (a u16 wrapper).
unsafe impl Pod for half::bf16 {}
// SAFETY: as above.
unsafe impl Pod for u8 {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dropped block is handed out again for a request of its size class, without a new
    /// system allocation; a larger class gets a new block.
    #[test]
    fn reuses_blocks_of_a_size_class() {
        let m = Arc::new(HostMemory::default());
        let a = m.alloc(100_000, false).unwrap();
        let pa = a.ptr;
        drop(a);
        let b = m.alloc(99_000, false).unwrap();
        assert_eq!(b.ptr, pa, "reused");
        assert_eq!(m.stats().system_allocations, 1);
        let c = m.alloc(400_000, false).unwrap();
        assert_ne!(c.ptr, pa);
        assert_eq!(m.stats().system_allocations, 2);
        assert_eq!(m.stats().allocated, 499_000);
    }

    /// A reused block asked for zeroed is zeroed; one asked for unzeroed keeps initialised values.
    #[test]
    fn zeroed_reuse_clears() {
        let m = Arc::new(HostMemory::default());
        let mut a = m.alloc(4096, false).unwrap();
        a.as_mut_slice::<f32>(1024).fill(3.5);
        drop(a);
        let b = m.alloc(4096, false).unwrap();
        assert!(b.as_slice::<f32>(1024).iter().all(|&v| v == 3.5));
        drop(b);
        let c = m.alloc(4096, true).unwrap();
        assert!(c.as_slice::<f32>(1024).iter().all(|&v| v == 0.0));
    }

    /// Uncached memory gives every dropped block back to the system.
    #[test]
    fn uncached_keeps_nothing() {
        let m = Arc::new(HostMemory::uncached());
        drop(m.alloc(100_000, false).unwrap());
        assert_eq!((m.stats().reserved, m.stats().allocated), (0, 0));
        drop(m.alloc(100_000, false).unwrap());
        assert_eq!(m.stats().system_allocations, 2);
    }

    /// Idle blocks beyond the limit go back to the system; empty_cache returns the rest.
    #[test]
    fn bounded_and_emptied() {
        let limit = 8 << 20;
        let m = Arc::new(HostMemory { state: Mutex::default(), limit });
        let big = limit / 2 + (1 << 20);
        let (a, b) = (m.alloc(big, false).unwrap(), m.alloc(big, false).unwrap());
        let block = round_size(big);
        assert_eq!(m.stats().reserved, 2 * block);
        drop(a);
        drop(b);
        assert_eq!(m.stats().reserved, block, "one idle block kept, the other over the limit freed");
        assert_eq!(m.stats().allocated, 0);
        m.empty_cache();
        assert_eq!(m.stats().reserved, 0);
    }
}
