//! The fused, cache-resident walk of the single-device BatchNorm's CPU kernels: blocks of whole
//! channels small enough to stay in cache between a reduction over the block and the element-wise
//! pass that follows it, so main memory sees one read of each input and one write of the output.
//!
//! It takes channel-major layouts: every tensor's element `(n, c, i)` (`i` the merged dims after
//! the channel, row-major without gaps) at `offset + n·batch + c·inner + i` with `batch ≥ C·inner`
//! (contiguous NCHW, and NCHW with a padded or sliced batch dim). A block is channels
//! `c0..c1`, whose storage is `N` disjoint segments `[n·batch + c0·inner, n·batch + c1·inner)`
//! per tensor. Channels-last and other layouts, and channels larger than the cache, take the
//! separate passes. Blocks depend only on the shape and [`fused_block_bytes`], never on the
//! thread count, and every block's reduction order is fixed, so results are bit-identical for any
//! thread count.
//!
//! Off by default ([`DEFAULT_FUSED_BLOCK_BYTES`] is 0): on the development host (Zen 4 under KVM,
//! 2 vCPUs, 32 MiB L3) the passes measured faster at every benchmarked shape, 1 and 2 threads
//! (e.g. [32,64,56,56] f32 forward 2.1 ms passes vs 3.2 ms fused on one thread): tensors up to
//! tens of MiB stay in L3 between the passes, while a block's channel segments (one per batch,
//! a batch stride apart) stream worse than the passes' linear walks and the block's L2 is shared
//! with the other vCPU. A host with more L2 per thread and less L3 may set it.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::dtype::SliceMut;

/// The default of [`fused_block_bytes`]: 0, the passes (see the module docs for why);
/// about two thirds of the L2 a thread has to itself is the setting that makes sense otherwise
/// (the block's inputs are read twice, the output streams through).
pub const DEFAULT_FUSED_BLOCK_BYTES: usize = 0;

/// Input bytes per block of the fused path (see [`set_fused_block_bytes`]).
static BLOCK_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_FUSED_BLOCK_BYTES);

/// Most bytes of inputs one channel block of the fused BatchNorm kernels reads (forward: x;
/// backward: dy and x); a channel larger than this takes the separate passes (0: always the
/// passes). Returns the previous setting. Results are correct either way; the setting only moves
/// work between the paths. Applies to calls that start afterwards, on every thread.
pub fn set_fused_block_bytes(bytes: usize) -> usize {
    BLOCK_BYTES.swap(bytes, Ordering::Relaxed)
}

/// The setting of [`set_fused_block_bytes`] ([`DEFAULT_FUSED_BLOCK_BYTES`] by default).
pub fn fused_block_bytes() -> usize {
    BLOCK_BYTES.load(Ordering::Relaxed)
}

/// Fewest blocks the channels are cut into when they allow it (so two threads share the work).
const MIN_BLOCKS: usize = 8;
/// Shortest channel segment (bytes) worth a block of its own (shorter ones take the passes).
const MIN_SEGMENT_BYTES: usize = 256;

/// One tensor's place in the channel-major layout: its batch stride and offset.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placement {
    batch: usize,
    offset: usize,
}

/// The channel blocks of a call: `N` batches, `C` channels of `inner` contiguous elements each,
/// `per_block` channels per block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Blocks {
    pub batches: usize,
    pub channels: usize,
    pub inner: usize,
    pub per_block: usize,
}

impl Blocks {
    /// The blocks for `shape` when every tensor (`strides`, `offsets`) is channel-major and a
    /// channel's `read_bytes_per_element` bytes fit in [`fused_block_bytes`]; `None` otherwise.
    pub(crate) fn plan<const K: usize>(
        shape: &[usize],
        strides: [&[usize]; K],
        offsets: [usize; K],
        read_bytes_per_element: usize,
        element_bytes: usize,
    ) -> Option<(Blocks, [Placement; K])> {
        let (&batches, &channels) = (shape.first()?, shape.get(1)?);
        let inner: usize = shape[2..].iter().product();
        if batches == 0 || channels == 0 || inner == 0 || inner.saturating_mul(element_bytes) < MIN_SEGMENT_BYTES {
            return None;
        }
        let mut placements = [Placement { batch: 0, offset: 0 }; K];
        for k in 0..K {
            let s = strides[k];
            // The dims after the channel: row-major without gaps (size-1 dims have any stride).
            let mut expected = 1usize;
            for d in (2..shape.len()).rev() {
                if shape[d] != 1 && s[d] != expected {
                    return None;
                }
                expected *= shape[d];
            }
            if channels > 1 && s[1] != inner {
                return None;
            }
            let batch = if batches > 1 { s[0] } else { channels * inner };
            if batch < channels * inner {
                return None;
            }
            placements[k] = Placement { batch, offset: offsets[k] };
        }
        let channel_bytes = batches.checked_mul(inner)?.checked_mul(read_bytes_per_element)?;
        let budget = fused_block_bytes();
        if channel_bytes > budget {
            return None;
        }
        let per_block = (budget / channel_bytes).clamp(1, channels.div_ceil(MIN_BLOCKS).max(1));
        Some((Blocks { batches, channels, inner, per_block }, placements))
    }

    /// How many blocks.
    pub(crate) fn count(&self) -> usize {
        self.channels.div_ceil(self.per_block)
    }

    /// The channels of block `b`.
    pub(crate) fn channels_of(&self, b: usize) -> Range<usize> {
        let lo = b * self.per_block;
        lo..self.channels.min(lo + self.per_block)
    }

    /// The shape, strides and offset of the view of channels `range` of a tensor placed at `p`:
    /// `[N, c1 − c0, inner]`.
    pub(crate) fn view(&self, p: Placement, range: &Range<usize>) -> ([usize; 3], [usize; 3], usize) {
        let width = range.end - range.start;
        ([self.batches, width, self.inner], [p.batch, self.inner, 1], p.offset + range.start * self.inner)
    }

    /// The storage range of batch `n`'s segment of channels `range` of a tensor placed at `p`.
    pub(crate) fn segment(&self, p: Placement, range: &Range<usize>, n: usize) -> Range<usize> {
        let start = p.offset + n * p.batch + range.start * self.inner;
        start..start + (range.end - range.start) * self.inner
    }
}

/// An output's storage shared by the blocks, each of which writes only its own segments.
pub(crate) struct Segments<'a> {
    /// The storage, borrowed mutably for `'a` (through `ptr` only).
    owner: PhantomData<&'a mut [u8]>,
    ptr: *mut u8,
    len: usize,
    dtype: crate::DType,
}

// SAFETY: `Segments` hands out `&mut` slices of disjoint storage ranges only (see `segment`);
// the element types are plain data, so sending or sharing the pointer between threads is sound.
unsafe impl Send for Segments<'_> {}
// SAFETY: as above.
unsafe impl Sync for Segments<'_> {}

impl<'a> Segments<'a> {
    /// Takes the output's storage for the blocks.
    pub(crate) fn new(mut data: SliceMut<'a>) -> Segments<'a> {
        let dtype = data.dtype();
        let (ptr, len) = match &mut data {
            SliceMut::F32(s) => (s.as_mut_ptr().cast::<u8>(), s.len()),
            SliceMut::F16(s) => (s.as_mut_ptr().cast::<u8>(), s.len()),
            SliceMut::BF16(s) => (s.as_mut_ptr().cast::<u8>(), s.len()),
            SliceMut::I32(s) => (s.as_mut_ptr().cast::<u8>(), s.len()),
        };
        Segments { owner: PhantomData, ptr, len, dtype }
    }

    /// The elements `range` of the storage, writable.
    ///
    /// # Safety
    /// `range` lies inside the storage, and no other slice from this `Segments` that overlaps it
    /// is alive (the blocks' segments are disjoint: distinct channels or batches of a
    /// channel-major output, checked by [`Blocks::plan`] and the operators' no-overlap rule).
    pub(crate) unsafe fn segment(&self, range: Range<usize>) -> SliceMut<'_> {
        debug_assert!(range.start <= range.end && range.end <= self.len);
        let n = range.end - range.start;
        // SAFETY: inside the storage (caller), disjoint from every other live segment (caller);
        // the storage's `&mut` was given up to `self` for `'a`.
        unsafe {
            match self.dtype {
                crate::DType::F32 => {
                    SliceMut::F32(std::slice::from_raw_parts_mut(self.ptr.cast::<f32>().add(range.start), n))
                }
                crate::DType::F16 => {
                    SliceMut::F16(std::slice::from_raw_parts_mut(self.ptr.cast::<half::f16>().add(range.start), n))
                }
                crate::DType::BF16 => {
                    SliceMut::BF16(std::slice::from_raw_parts_mut(self.ptr.cast::<half::bf16>().add(range.start), n))
                }
                _ => SliceMut::I32(std::slice::from_raw_parts_mut(self.ptr.cast::<i32>().add(range.start), n)),
            }
        }
    }
}

/// A contiguous `[1, width, inner]` view of a segment of `len` elements (offset 0).
pub(crate) fn segment_layout(width: usize, inner: usize) -> ([usize; 3], [usize; 3]) {
    ([1, width, inner], [width * inner, inner, 1])
}

/// One block's work: `(channels, first, second)` (see [`run`]).
pub(crate) type BlockWork<'f> = dyn Fn(Range<usize>, &mut [f64], &mut [f64]) -> crate::Result<()> + Sync + 'f;

/// Runs `f(channels, first, second)` for every block on up to [`max_threads`](super::max_threads)
/// threads, where `first` and `second` are the block's channels of two per-channel f64 results
/// (returned, 0 where `f` leaves them); the first error (by block) is returned. Which thread runs
/// a block never changes its bits.
pub(crate) fn run(blocks: &Blocks, f: &BlockWork<'_>) -> crate::Result<(Vec<f64>, Vec<f64>)> {
    let (c, per, count) = (blocks.channels, blocks.per_block, blocks.count());
    let mut first = super::host::try_vec(c, 0.0)?;
    let mut second = super::host::try_vec(c, 0.0)?;
    {
        let slots: Vec<Mutex<(&mut [f64], &mut [f64])>> =
            super::host::try_collect(count, first.chunks_mut(per).zip(second.chunks_mut(per)).map(Mutex::new))?;
        let error: Mutex<Option<(usize, crate::Error)>> = Mutex::new(None);
        super::pool::run(0, count, &|b| {
            let mut slot = slots[b].lock().unwrap_or_else(|p| p.into_inner());
            let (a, s) = &mut *slot;
            if let Err(e) = f(blocks.channels_of(b), a, s) {
                let mut slot = error.lock().unwrap_or_else(|p| p.into_inner());
                if slot.as_ref().is_none_or(|(k, _)| b < *k) {
                    *slot = Some((b, e));
                }
            }
        });
        if let Some((_, e)) = error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
    }
    Ok((first, second))
}
