//! Reused host buffers for the CPU kernels' per-call tables (per-channel constants, partial
//! sums, work tables): a [`Scratch`] takes a block from its thread's free list and gives it back
//! when dropped, so a steady training loop makes no heap allocation after its first steps.
//!
//! Blocks are sized in powers of two (at least [`ALIGN`] bytes, aligned to [`ALIGN`]) and kept
//! per thread, at most [`MAX_BLOCKS`] of them and [`MAX_KEPT_BYTES`] in all; beyond that the
//! least recently returned blocks go back to the system. A buffer dropped on another thread than the one that
//! made it joins that thread's list (the kernels take and drop their tables on one thread).

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// Alignment (and least size) of every block.
const ALIGN: usize = 64;
/// Most free blocks a thread keeps.
const MAX_BLOCKS: usize = 64;
/// Most bytes of free blocks a thread keeps.
const MAX_KEPT_BYTES: usize = 64 << 20;

/// A free block: its address and its size in bytes (a power of two).
#[derive(Clone, Copy)]
struct Block {
    ptr: NonNull<u8>,
    bytes: usize,
}

/// A thread's free blocks.
struct FreeList {
    blocks: Vec<Block>,
    kept: usize,
}

impl Drop for FreeList {
    fn drop(&mut self) {
        for b in self.blocks.drain(..) {
            release(b);
        }
    }
}

thread_local! {
    static FREE: RefCell<FreeList> = const { RefCell::new(FreeList { blocks: Vec::new(), kept: 0 }) };
}

fn layout(bytes: usize) -> Option<Layout> {
    Layout::from_size_align(bytes, ALIGN).ok()
}

/// Gives a block back to the system.
fn release(b: Block) {
    if let Some(l) = layout(b.bytes) {
        // SAFETY: `b` was allocated by `acquire` with this very layout and is no longer used.
        unsafe { alloc::dealloc(b.ptr.as_ptr(), l) }
    }
}

/// A block of exactly `bytes` (a power of two ≥ [`ALIGN`]): a free one of this thread, or a new one.
fn acquire(bytes: usize) -> Option<Block> {
    let reused = FREE
        .try_with(|f| {
            let mut f = f.borrow_mut();
            let i = f.blocks.iter().rposition(|b| b.bytes == bytes)?;
            f.kept -= bytes;
            Some(f.blocks.remove(i))
        })
        .ok()
        .flatten();
    if reused.is_some() {
        return reused;
    }
    let l = layout(bytes)?;
    // SAFETY: `l` has a non-zero size (at least ALIGN bytes).
    let ptr = NonNull::new(unsafe { alloc::alloc(l) })?;
    Some(Block { ptr, bytes })
}

/// Keeps `b` on this thread's free list, or releases it when the list is full (or gone).
fn recycle(b: Block) {
    let kept = FREE
        .try_with(|f| {
            let mut f = f.borrow_mut();
            if b.bytes > MAX_KEPT_BYTES {
                return false;
            }
            if f.blocks.capacity() == 0 && f.blocks.try_reserve_exact(MAX_BLOCKS).is_err() {
                return false;
            }
            // Full: the least recently given back go first (a finished workload's sizes).
            while f.blocks.len() >= MAX_BLOCKS || f.kept + b.bytes > MAX_KEPT_BYTES {
                let old = f.blocks.remove(0);
                f.kept -= old.bytes;
                release(old);
            }
            f.kept += b.bytes;
            f.blocks.push(b);
            true
        })
        .unwrap_or(false);
    if !kept {
        release(b);
    }
}

/// A vector of at most a fixed capacity in a reused block (see the [module](self) docs).
pub(crate) struct Scratch<T> {
    /// The block (or dangling with `block_bytes == 0`); elements `..len` are initialised.
    ptr: NonNull<T>,
    len: usize,
    cap: usize,
    block_bytes: usize,
    owns: PhantomData<T>,
}

// SAFETY: a `Scratch<T>` owns its elements like a `Vec<T>`; its block is plain memory that any
// thread may use or free.
unsafe impl<T: Send> Send for Scratch<T> {}
// SAFETY: shared access gives `&[T]` only.
unsafe impl<T: Sync> Sync for Scratch<T> {}

impl<T> Scratch<T> {
    /// An empty vector with no block.
    pub(crate) const fn new() -> Scratch<T> {
        Scratch { ptr: NonNull::dangling(), len: 0, cap: 0, block_bytes: 0, owns: PhantomData }
    }

    /// An empty vector with room for `n` elements, or [`Error::HostAlloc`].
    pub(crate) fn with_capacity(n: usize) -> Result<Scratch<T>> {
        const { assert!(std::mem::align_of::<T>() <= ALIGN) };
        let size = std::mem::size_of::<T>();
        if n == 0 || size == 0 {
            return Ok(Scratch { cap: if size == 0 { usize::MAX } else { 0 }, ..Scratch::new() });
        }
        let fail = || Error::HostAlloc { bytes: n.saturating_mul(size) };
        let bytes = n.checked_mul(size).and_then(|b| b.max(ALIGN).checked_next_power_of_two()).ok_or_else(fail)?;
        let block = acquire(bytes).ok_or_else(fail)?;
        Ok(Scratch { ptr: block.ptr.cast(), len: 0, cap: bytes / size, block_bytes: bytes, owns: PhantomData })
    }

    /// Appends `v`; a full vector (more than the capacity asked for) drops it instead, which the
    /// callers never do (they push at most the capacity they asked for).
    pub(crate) fn push(&mut self, v: T) {
        debug_assert!(self.len < self.cap, "Scratch::push beyond its capacity");
        if self.len < self.cap {
            // SAFETY: `len < cap`: inside the block, not yet initialised.
            unsafe { self.ptr.as_ptr().add(self.len).write(v) };
            self.len += 1;
        }
    }

    /// Appends the items of `values` while there is room.
    pub(crate) fn extend(&mut self, values: impl IntoIterator<Item = T>) {
        for v in values.into_iter().take(self.cap - self.len) {
            self.push(v);
        }
    }
}

impl<T: Clone> Scratch<T> {
    /// Sets the length to `n` (at most the capacity), filling new elements with `value`.
    pub(crate) fn resize(&mut self, n: usize, value: T) {
        let n = n.min(self.cap);
        self.truncate(n);
        while self.len < n {
            self.push(value.clone());
        }
    }
}

impl<T> Scratch<T> {
    /// Drops the elements from `n` on.
    pub(crate) fn truncate(&mut self, n: usize) {
        while self.len > n {
            self.len -= 1;
            // SAFETY: element `len` was initialised and is now outside the vector.
            unsafe { self.ptr.as_ptr().add(self.len).drop_in_place() };
        }
    }
}

impl<T> Scratch<T> {
    /// Removes and returns the last element.
    pub(crate) fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        // SAFETY: element `len` was initialised; it is now outside the vector (read once).
        Some(unsafe { self.ptr.as_ptr().add(self.len).read() })
    }
}

impl<'a, T> IntoIterator for &'a Scratch<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a, T> IntoIterator for &'a mut Scratch<T> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

impl<T> Default for Scratch<T> {
    fn default() -> Self {
        Scratch::new()
    }
}

impl<T> Deref for Scratch<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: elements `..len` are initialised and owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for Scratch<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: PartialEq> PartialEq for Scratch<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Scratch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T> Drop for Scratch<T> {
    fn drop(&mut self) {
        self.truncate(0);
        if self.block_bytes != 0 {
            recycle(Block { ptr: self.ptr.cast(), bytes: self.block_bytes });
        }
    }
}

/// A vector of at most `N` plain values on the stack: a work item's small tables (no heap).
pub(crate) struct Inline<T: Copy, const N: usize> {
    items: [std::mem::MaybeUninit<T>; N],
    len: usize,
}

impl<T: Copy, const N: usize> Inline<T, N> {
    /// Empty.
    pub(crate) fn new() -> Self {
        Inline { items: [std::mem::MaybeUninit::uninit(); N], len: 0 }
    }

    /// Appends `v` (the callers bound their count by `N`; a value beyond it is dropped).
    pub(crate) fn push(&mut self, v: T) {
        debug_assert!(self.len < N, "Inline::push beyond its capacity");
        if let Some(slot) = self.items.get_mut(self.len) {
            slot.write(v);
            self.len += 1;
        }
    }

    /// Appends the items of `values` while there is room.
    pub(crate) fn extend(&mut self, values: impl IntoIterator<Item = T>) {
        for v in values {
            self.push(v);
        }
    }

    /// Empties it.
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }
}

impl<T: Copy, const N: usize> Deref for Inline<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: items `..len` were written (push) and `T: Copy` has no drop.
        unsafe { std::slice::from_raw_parts(self.items.as_ptr().cast::<T>(), self.len) }
    }
}

impl<'a, T: Copy, const N: usize> IntoIterator for &'a Inline<T, N> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_blocks_and_drops_elements() {
        let a = Scratch::<f64>::with_capacity(100).unwrap();
        let p = a.ptr.as_ptr() as usize;
        drop(a);
        let mut b = Scratch::<f64>::with_capacity(90).unwrap();
        assert_eq!(b.ptr.as_ptr() as usize, p, "the same size class reuses the block");
        b.resize(90, 1.5);
        assert_eq!(b.len(), 90);
        assert!(b.iter().all(|&v| v == 1.5));
        let rc = std::rc::Rc::new(());
        let mut c = Scratch::with_capacity(3).unwrap();
        c.extend([rc.clone(), rc.clone(), rc.clone()]);
        assert_eq!(c.len(), 3);
        assert_eq!(std::rc::Rc::strong_count(&rc), 4);
        drop(c);
        assert_eq!(std::rc::Rc::strong_count(&rc), 1);
        let e = Scratch::<u8>::with_capacity(0).unwrap();
        assert!(e.is_empty());
    }
}
