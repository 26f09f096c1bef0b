//! The CPU kernel of `aclnnBatchNormStats`: per channel (dim 1), the element count, the mean and
//! Σ(x − mean)², from which the operator takes `mean` and `invstd = 1/sqrt(Σ(x − mean)²/n + eps)`.
//!
//! # Numerics
//! Deviations are always taken from a mean of the data itself, never `Σx² − n·mean²`, and main
//! memory is read once:
//! - A *block* is at most [`BLOCK`] elements of one channel (or, channels-last, at most
//!   [`ROWS_PER_BLOCK`] values of each lane), small enough to stay in L1/L2. It is summed in one
//!   pass as `Σd` and `Σd²` with `d = x − k`, in f32 lanes (at most 256 values per lane) folded
//!   to f64, where the shift `k` is the mean of the block's first [`SHIFT_SAMPLE`] values (of
//!   each lane's first [`SHIFT_ROWS`] rows). The block's moments are then `n_b`, its mean
//!   `k + Σd/n_b` and `M2_b = Σd² − (Σd)²/n_b`.
//! - That subtraction cancels only when `k` is far from the block mean; the block is accepted
//!   when `(Σd)²/n_b ≤ ¾·Σd²` (at most two bits of the lane sums lost) and every sum is finite.
//!   Otherwise (sorted or drifting data, NaN, ±Inf) the block, still in cache, is summed
//!   *two-pass*: pass 1 takes its mean `m_b`, pass 2 sums `x − m_b` and its square. So every
//!   block is as accurate as a two-pass sum (within a factor 4 of its error bound).
//! - Blocks are merged in f64 with Chan et al.'s pairwise update
//!   (`M2 = M2_a + M2_b + δ²·n_a·n_b/n`, `δ = mean_b − mean_a`), exact to f64 rounding.
//! - NaN or ±Inf in a channel make its plain sum non-finite: the mean is then that sum / n (as
//!   `Σx/n` gives) and invstd NaN.
//!
//! # Layouts
//! The reduction dims (all but the channel) are sorted by stride and merged where contiguous.
//! Then: channel by channel over contiguous runs read in place (f32) or converted as read (f16),
//! the lanes following the data so that a block's bits do not depend on how it is cut into runs;
//! short runs with the channel between them and the outer dims (NCHW with a small H·W) copied in
//! memory order, [`TILE_CHANNELS`] channels at a time; channels-last rows (channel stride 1) with
//! one lane per channel, re-cut into wider super-rows when the `[R, C]` matrix is contiguous;
//! anything else gathered element by element.
//!
//! # Determinism
//! The work is cut into items whose boundaries depend only on the shape and strides (a channel's
//! run of blocks, a tile of short runs, or a tile of channels-last rows); each item writes its
//! own partial moments and partials are merged per channel in item order after the join. Any
//! thread count gives the same bits. The portable, AVX2 and AVX-512 builds of the block
//! primitives do the same operations in the same order per lane (no fused multiply-add), so they
//! give the same bits too, and an f16 input gives exactly the bits of its f32 widening.

use crate::cpu::scratch::{Inline, Scratch};
use std::sync::OnceLock;

use crate::cpu::isa::Isa;
use crate::cpu::{dims, host, pool, widen};
use crate::dtype::{Element, SliceRef};
use crate::error::Result;
use crate::layout::Strided;

/// f32 lanes of a block of one channel.
const LANES: usize = 32;
/// Most elements of one channel per block (64 per lane; a block of f32 and its copy stay in L1).
const BLOCK: usize = 2048;
/// Blocks per work item of the channel-major path.
const ITEM_BLOCKS: usize = 8;
/// Shortest contiguous inner run copied run by run (shorter ones are gathered element by element).
const MIN_RUN: usize = 16;
/// Shortest run read in place when the channel dim lies between the runs and the outer dims
/// (shorter ones, e.g. NCHW with a small H·W, are copied in memory order: see `short_runs`).
const DIRECT_RUN: usize = 256;
/// Rows per block of the channels-last path (each lane sums at most this many values in f32).
const ROWS_PER_BLOCK: usize = 256;
/// Widest chunk of lanes of the channels-last path.
const MAX_ROW_LANES: usize = 256;
/// Fewest lanes of a super-row (a contiguous `[R, C]` matrix re-cut into wider rows).
const MIN_ROW_LANES: usize = 64;
/// Widest super-row.
const MAX_SUPER_ROW: usize = 1024;
/// About this many elements per work item of the channels-last path.
const ROW_TILE_ELEMS: usize = 1 << 18;
/// Fewest input bytes each thread must get before another thread is used. The persistent pool's
/// helpers join a call within microseconds, so a half-precision `[8,256,28,28]` (3 MiB) or
/// `[16,64,56,56]` (6 MiB) input is worth two threads (it took one below 4 MiB per thread).
pub(crate) const MIN_BYTES_PER_THREAD: usize = 512 << 10;
/// Most contiguous pieces of one block of the channel-major path (runs of at least [`MIN_RUN`]).
const BLOCK_SEGMENTS: usize = BLOCK / MIN_RUN + 2;
/// Channels per item of the short-runs path.
const TILE_CHANNELS: usize = 16;

thread_local! {
    /// The short-runs path's per-channel buffers (kept by each thread, grown when needed).
    static TILE_BUFFER: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The rows path's block buffer (made once per thread at its largest size).
    static ROW_BUFFER: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A validated input view: rank 2..=8, channel = dim 1, every element inside `data`.
pub(crate) type Input<'a> = Strided<'a, SliceRef<'a>>;

/// The moments of a set of values, in f64: count, mean, Σ(x − mean)², and the plain sum (which
/// tells whether a NaN or an infinity was met).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Moments {
    pub n: f64,
    pub mean: f64,
    pub m2: f64,
    pub sum: f64,
}

impl Moments {
    /// The moments of a block from its two passes: `n` values, their f32-lane `sum`, the
    /// `shift` subtracted in pass 2, and the sums of `d = x − shift` and of `d²`.
    fn from_block(n: usize, sum: f64, shift: f32, sum_d: f64, sum_d2: f64) -> Moments {
        let n = n as f64;
        let m2 = sum_d2 - sum_d * sum_d / n;
        // Rounding may leave a hair below zero; NaN stays NaN.
        let m2 = if m2 < 0.0 { 0.0 } else { m2 };
        Moments { n, mean: f64::from(shift) + sum_d / n, m2, sum }
    }

    /// Both sets together (Chan et al.'s pairwise update).
    fn merge(self, b: Moments) -> Moments {
        if b.n == 0.0 {
            return self;
        }
        if self.n == 0.0 {
            return b;
        }
        let n = self.n + b.n;
        let delta = b.mean - self.mean;
        Moments {
            n,
            mean: self.mean + delta * (b.n / n),
            m2: self.m2 + b.m2 + delta * delta * (self.n * (b.n / n)),
            sum: self.sum + b.sum,
        }
    }

    /// The operator's outputs: `(mean, invstd)` with the biased variance; no element gives
    /// `(0, NaN)`; a NaN or infinity gives `(Σx/n, NaN)`.
    pub(crate) fn mean_invstd(&self, eps: f64) -> (f64, f64) {
        if self.n == 0.0 {
            return (0.0, f64::NAN);
        }
        if !self.sum.is_finite() {
            return (self.sum / self.n, f64::NAN);
        }
        (self.mean, 1.0 / (self.m2 / self.n + eps).sqrt())
    }

    /// The mean and the biased variance of `n > 0` values (also `batch_norm`'s batch
    /// statistics); a NaN or infinity among them gives `(Σx/n, NaN)`.
    pub(crate) fn mean_var(&self) -> (f64, f64) {
        if self.sum.is_finite() {
            (self.mean, self.m2 / self.n)
        } else {
            (self.sum / self.n, f64::NAN)
        }
    }
}

/// Per-channel moments of `input`, on up to `threads` threads (0: every core, but one thread per
/// [`MIN_BYTES_PER_THREAD`] bytes at most). Bit-identical for any `threads`.
pub(crate) fn channel_moments(input: Input<'_>, threads: usize) -> Result<Scratch<Moments>> {
    channel_moments_with(Isa::detect(), input, threads, MIN_BYTES_PER_THREAD)
}

fn channel_moments_with(isa: Isa, input: Input<'_>, threads: usize, min_bytes: usize) -> Result<Scratch<Moments>> {
    match input.data {
        SliceRef::F32(s) => Kernel::new(isa, input, s, Some, None).run(threads, min_bytes),
        SliceRef::F16(s) => Kernel::new(isa, input, s, |_| None, Some(runs_one_pass_f16)).run(threads, min_bytes),
        SliceRef::BF16(s) => Kernel::new(isa, input, s, |_| None, Some(runs_one_pass_bf16)).run(threads, min_bytes),
        SliceRef::I32(s) => Kernel::new(isa, input, s, |_| None, None).run(threads, min_bytes),
    }
}

/// One reduction dim: size and stride.
type Dim = dims::Dim<1>;
/// Walks reduction positions, tracking the storage index (`pos[0]`).
type Odometer<'a> = dims::Odometer<'a, 1>;

/// The two ways of walking the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// Channel by channel: blocks of positions of one channel.
    ChannelMajor,
    /// Channels-last rows of `w` lanes, lane j ↔ channel j mod C. `flat`: the `[R, C]` matrix is
    /// contiguous and re-cut into super-rows of `w` (a multiple of C) lanes; else one row per
    /// position, `w == C`.
    Rows { w: usize, flat: bool },
}

/// A one pass over contiguous runs of `T` that converts as it reads (see [`runs_one_pass_f16`]).
type FusedRuns<T> = fn(Isa, &[&[T]]) -> Option<Moments>;

struct Kernel<'a, T> {
    isa: Isa,
    data: &'a [T],
    direct: fn(&'a [T]) -> Option<&'a [f32]>,
    /// A one pass over runs of `T` converting as it reads, when there is one.
    fused: Option<FusedRuns<T>>,
    c: usize,
    cs: usize,
    offset: usize,
    dims: dims::Dims<1>,
    /// Positions per channel.
    r: usize,
    /// Whether the input has no element.
    empty: bool,
}

impl<'a, T: Element> Kernel<'a, T> {
    fn new(
        isa: Isa,
        input: Input<'a>,
        data: &'a [T],
        direct: fn(&'a [T]) -> Option<&'a [f32]>,
        fused: Option<FusedRuns<T>>,
    ) -> Self {
        let (shape, strides) = (input.layout.shape, input.layout.strides);
        // A dim of stride 0 repeats the same elements: the mean and the biased variance are
        // those without it, so it is not walked (a broadcast view costs O(its storage)).
        let dims = dims::Dims::reduction(shape, [strides], |d| d.s[0] != 0);
        let r = dims.positions();
        Kernel {
            isa,
            data,
            direct,
            fused,
            c: shape.get(1).copied().unwrap_or(0),
            cs: strides.get(1).copied().unwrap_or(0),
            offset: input.layout.offset,
            dims,
            r,
            empty: shape.contains(&0),
        }
    }

    fn dims(&self) -> &[Dim] {
        self.dims.as_slice()
    }

    /// Widens `src` into `dst[..src.len()]` (exactly; see [`widen`]).
    #[inline]
    fn widen(&self, src: &[T], dst: &mut [f32]) {
        widen::widen(self.isa, src, dst)
    }

    fn path(&self) -> Path {
        if self.c > 1 && self.cs == 1 {
            let flat = match self.dims() {
                [] => true,
                [d] => d.s == [self.c],
                _ => false,
            };
            let base = lcm8(self.c);
            if flat && base <= MAX_SUPER_ROW {
                return Path::Rows { w: base * MIN_ROW_LANES.div_ceil(base), flat: true };
            }
            if self.c >= 16 {
                return Path::Rows { w: self.c, flat: false };
            }
        }
        Path::ChannelMajor
    }

    fn run(&self, threads: usize, min_bytes: usize) -> Result<Scratch<Moments>> {
        if self.c == 0 || self.empty {
            return host::scratch_vec(self.c, Moments::default());
        }
        // 0: the process's limit (`cpu::set_max_threads`), itself 0 for every core.
        let threads = match (threads, crate::cpu::max_threads()) {
            (0, 0) => pool::cores(),
            (0, m) => m,
            (t, _) => t,
        };
        let bytes = self.r.saturating_mul(self.c).saturating_mul(std::mem::size_of::<T>());
        let threads = threads.min((bytes / min_bytes.max(1)).max(1));
        match self.path() {
            Path::ChannelMajor => self.channel_major(threads),
            Path::Rows { w, flat } => self.rows(threads, w, flat),
        }
    }

    /// Channel-major path. Positions of a channel are cut into blocks that never split a
    /// contiguous inner run shorter than a block (long runs are cut into equal segments); an
    /// item is up to [`ITEM_BLOCKS`] consecutive blocks of one channel.
    fn channel_major(&self, threads: usize) -> Result<Scratch<Moments>> {
        let dims = self.dims();
        let (l, inner_contiguous) = match dims.last() {
            Some(d) => (d.n, d.s == [1]),
            None => (1, true),
        };
        let (outer, _) = dims.split_at(dims.len().saturating_sub(1));
        if inner_contiguous
            && (MIN_RUN..DIRECT_RUN).contains(&l)
            && self.c > 1
            && outer.last().is_some_and(|d| self.cs < d.s[0])
        {
            return self.short_runs(l, outer, threads);
        }
        let nruns = self.r / l;
        // Block b covers positions [start, start + len).
        let (nseg, seg, per) = if l > BLOCK {
            let seg = l.div_ceil(l.div_ceil(BLOCK)).next_multiple_of(LANES);
            (l.div_ceil(seg), seg, 1)
        } else {
            (1, l, (BLOCK / l).max(1))
        };
        let nb = if nseg > 1 { nruns * nseg } else { nruns.div_ceil(per) };
        let block = |b: usize| -> (usize, usize) {
            if nseg > 1 {
                let (run, s) = (b / nseg, b % nseg);
                (run * l + s * seg, seg.min(l - s * seg))
            } else {
                (b * per * l, per.min(nruns - b * per) * l)
            }
        };
        let ipc = nb.div_ceil(ITEM_BLOCKS);
        let n_parts = self.c.saturating_mul(ipc);
        let parts: Scratch<OnceLock<Moments>> = host::scratch_collect(n_parts, (0..n_parts).map(|_| OnceLock::new()))?;
        let in_place = inner_contiguous && l >= MIN_RUN;
        let all_f32 = (self.direct)(self.data);
        pool::run(threads, parts.len(), &|item| {
            let (ch, k) = (item / ipc, item % ipc);
            let base = self.offset + ch * self.cs;
            // A block is at most BLOCK + LANES positions in runs of at least MIN_RUN (or one
            // piece of a longer run): bounded tables on the stack.
            let mut segs: Inline<(usize, usize), BLOCK_SEGMENTS> = Inline::new();
            let mut slices: Inline<&[f32], BLOCK_SEGMENTS> = Inline::new();
            let mut runs: Inline<&[T], BLOCK_SEGMENTS> = Inline::new();
            // The buffer of the blocks that are widened before they are summed, zeroed when the
            // item first needs it (zeroing 8 KiB per item cost a third of the f16 pass at
            // [8,256,28,28], where no block needs it).
            let mut buffer: Option<[f32; BLOCK + LANES]> = None;
            let mut acc = Moments::default();
            for b in k * ITEM_BLOCKS..nb.min((k + 1) * ITEM_BLOCKS) {
                let (start, len) = block(b);
                let m = if in_place {
                    // Whole runs (or one piece of a run), each contiguous in storage: read in
                    // place (f32), converted as read (f16), else widened into one buffer; the
                    // lanes follow the concatenation, so all three give the same bits.
                    segs.clear();
                    let mut o = Odometer::new(outer, start / l, [base]);
                    let (mut p, mut left) = (start % l, len);
                    while left > 0 {
                        let take = left.min(l - p);
                        segs.push((o.pos[0] + p, take));
                        left -= take;
                        p = 0;
                        o.advance();
                    }
                    match all_f32 {
                        Some(d) => {
                            slices.clear();
                            slices.extend(segs.iter().map(|&(s, n)| &d[s..s + n]));
                            runs_block(self.isa, &slices)
                        }
                        None => {
                            let fused = self.fused.and_then(|f| {
                                runs.clear();
                                runs.extend(segs.iter().map(|&(s, n)| &self.data[s..s + n]));
                                f(self.isa, &runs)
                            });
                            match fused {
                                Some(m) => m,
                                None => {
                                    let buf = &mut buffer.get_or_insert([0f32; BLOCK + LANES])[..len];
                                    let mut done = 0;
                                    for &(s, n) in &segs {
                                        self.widen(&self.data[s..s + n], &mut buf[done..done + n]);
                                        done += n;
                                    }
                                    runs_block(self.isa, &[buf])
                                }
                            }
                        }
                    }
                } else {
                    let buf = &mut buffer.get_or_insert([0f32; BLOCK + LANES])[..len];
                    let mut o = Odometer::new(dims, start, [base]);
                    for v in buf.iter_mut() {
                        *v = self.data[o.pos[0]].to_f32();
                        o.advance();
                    }
                    runs_block(self.isa, &[buf])
                };
                acc = acc.merge(m);
            }
            // Each item is run exactly once.
            let _ = parts[item].set(acc);
        });
        let channels = (0..self.c).map(|ch| {
            parts[ch * ipc..(ch + 1) * ipc]
                .iter()
                .fold(Moments::default(), |a, p| a.merge(p.get().copied().unwrap_or_default()))
        });
        host::scratch_collect(self.c, channels)
    }

    /// Short contiguous runs with the channel dim between them and the outer dims (NCHW with a
    /// small H·W): items are (block of whole runs, chunk of [`TILE_CHANNELS`] channels); the
    /// runs are copied in memory order (run by run across the chunk's channels) into one buffer
    /// per channel, and each channel's buffer is summed as one block.
    fn short_runs(&self, l: usize, outer: &[Dim], threads: usize) -> Result<Scratch<Moments>> {
        let nruns = self.r / l;
        let per = (BLOCK / l).max(1);
        let nb = nruns.div_ceil(per);
        let cb = TILE_CHANNELS.min(self.c);
        let nchunks = self.c.div_ceil(cb);
        let n_parts = nb.saturating_mul(nchunks);
        let parts: Scratch<OnceLock<[Moments; TILE_CHANNELS]>> =
            host::scratch_collect(n_parts, (0..n_parts).map(|_| OnceLock::new()))?;
        pool::run(threads, parts.len(), &|item| {
            let (b, k) = (item / nchunks, item % nchunks);
            let (c0, nc) = (k * cb, cb.min(self.c - k * cb));
            let (r0, r1) = (b * per, nruns.min((b + 1) * per));
            let len = (r1 - r0) * l;
            TILE_BUFFER.with_borrow_mut(|buf| {
                // nc <= TILE_CHANNELS (16) channels of len <= BLOCK (2048) positions: the
                // buffer is made once per thread at its largest size.
                if buf.len() < TILE_CHANNELS * BLOCK {
                    // bounded: TILE_CHANNELS * BLOCK (32 Ki) values, once per thread.
                    #[allow(clippy::disallowed_methods)]
                    buf.resize(TILE_CHANNELS * BLOCK, 0.0);
                }
                let mut o = Odometer::new(outer, r0, [self.offset + c0 * self.cs]);
                for i in 0..r1 - r0 {
                    for ci in 0..nc {
                        let (src, dst) = (o.pos[0] + ci * self.cs, ci * len + i * l);
                        self.widen(&self.data[src..src + l], &mut buf[dst..dst + l]);
                    }
                    o.advance();
                }
                let mut out = [Moments::default(); TILE_CHANNELS];
                for (o, ch) in out.iter_mut().zip(buf[..nc * len].chunks_exact(len)) {
                    *o = runs_block(self.isa, &[ch]);
                }
                let _ = parts[item].set(out);
            });
        });
        let channels = (0..self.c).map(|ch| {
            (0..nb).fold(Moments::default(), |a, b| {
                a.merge(parts[b * nchunks + ch / cb].get().map_or(Moments::default(), |p| p[ch % cb]))
            })
        });
        host::scratch_collect(self.c, channels)
    }

    /// Channels-last path: rows of `w` lanes (see [`Path::Rows`]); items are (row tile, chunk
    /// of lanes), tile-major; each writes one partial per lane.
    fn rows(&self, threads: usize, w: usize, flat: bool) -> Result<Scratch<Moments>> {
        let c = self.c;
        let total = self.r * c;
        let nrows = if flat { total.div_ceil(w) } else { self.r };
        let nchunks = w.div_ceil(MAX_ROW_LANES);
        let cw = w.div_ceil(nchunks).next_multiple_of(8).min(w);
        let nchunks = w.div_ceil(cw);
        let tile_rows = ROWS_PER_BLOCK * (ROW_TILE_ELEMS / (ROWS_PER_BLOCK * cw)).max(1);
        let ntiles = nrows.div_ceil(tile_rows);
        let n_parts = ntiles.saturating_mul(nchunks);
        let parts: Scratch<OnceLock<[Moments; MAX_ROW_LANES]>> =
            host::scratch_collect(n_parts, (0..n_parts).map(|_| OnceLock::new()))?;
        let dims = self.dims();
        // The f32 data, read in place when the matrix is contiguous.
        let direct = if flat { (self.direct)(self.data) } else { None };
        pool::run(threads, parts.len(), &|item| {
            let (t, k) = (item / nchunks, item % nchunks);
            let (l0, lanes) = (k * cw, cw.min(w - k * cw));
            // lanes <= cw <= MAX_ROW_LANES (256): on the stack.
            let mut out = [Moments::default(); MAX_ROW_LANES];
            let out_lanes = &mut out[..lanes];
            let mut scratch = RowScratch::new();
            ROW_BUFFER.with_borrow_mut(|buf| {
                if buf.len() < ROWS_PER_BLOCK * MAX_ROW_LANES {
                    // bounded: ROWS_PER_BLOCK * MAX_ROW_LANES (64 Ki) values, once per thread.
                    #[allow(clippy::disallowed_methods)]
                    buf.resize(ROWS_PER_BLOCK * MAX_ROW_LANES, 0.0);
                }
                let r1 = nrows.min((t + 1) * tile_rows);
                let mut r0 = t * tile_rows;
                let mut odo = Odometer::new(dims, r0, [self.offset + l0]);
                while r0 < r1 {
                    let rb = r1.min(r0 + ROWS_PER_BLOCK);
                    // Valid lanes of row r of this chunk (only the last super-row may be partial).
                    let valid =
                        |r: usize| if flat { (total - r * w).min(w).saturating_sub(l0).min(lanes) } else { lanes };
                    let last = valid(rb - 1);
                    let full = if last < lanes { rb - 1 - r0 } else { rb - r0 };
                    let last = if last < lanes { last } else { 0 };
                    if full == 0 && last == 0 {
                        // A chunk of lanes past the end of a short last super-row: nothing to read.
                        r0 = rb;
                        continue;
                    }
                    let block = match direct {
                        Some(d) => RowBlock { m: &d[self.offset + r0 * w + l0..], stride: w, lanes, full, last },
                        None => {
                            // ROWS_PER_BLOCK (256) rows of lanes <= MAX_ROW_LANES (256).
                            let buf = &mut buf[..(rb - r0) * lanes];
                            if flat && lanes == w {
                                // Whole super-rows: one contiguous stretch, widened at once.
                                let (start, n) = (self.offset + r0 * w, ((rb - r0) * w).min(total - r0 * w));
                                self.widen(&self.data[start..start + n], &mut buf[..n]);
                            } else {
                                for (i, row) in buf.chunks_exact_mut(lanes).enumerate() {
                                    let r = r0 + i;
                                    let n = valid(r);
                                    let start = if flat { self.offset + r * w + l0 } else { odo.pos[0] };
                                    if n > 0 {
                                        self.widen(&self.data[start..start + n], &mut row[..n]);
                                    }
                                    if !flat {
                                        odo.advance();
                                    }
                                }
                            }
                            RowBlock { m: buf, stride: lanes, lanes, full, last }
                        }
                    };
                    rows_block(self.isa, block, &mut scratch, out_lanes);
                    r0 = rb;
                }
            });
            let _ = parts[item].set(out);
        });
        // Channel ch: its lanes ch, ch + C, ... of each tile, in order.
        let channels = (0..c).map(|ch| {
            let mut acc = Moments::default();
            for t in 0..ntiles {
                for j in (ch..w).step_by(c) {
                    if let Some(p) = parts[t * nchunks + j / cw].get() {
                        acc = acc.merge(p[j % cw]);
                    }
                }
            }
            acc
        });
        host::scratch_collect(c, channels)
    }
}

/// lcm(c, 8).
fn lcm8(c: usize) -> usize {
    let g = 8 >> (c.trailing_zeros().min(3));
    c.saturating_mul(g)
}

// ---------------------------------------------------------------------------------------------
// The block primitives and their instruction sets

/// Defines `fn $name(isa: Isa, args..)`: `$portable(args..)` on the portable set and on NEON (in
/// the aarch64 baseline: the fixed-lane loops compile to 128-bit vector code), and `$x86(args..)`
/// in a copy compiled with the target features of each x86-64 set. Both bodies are
/// `#[inline(always)]`, so every set gets its own build of the loops; all give the same bits.
macro_rules! isa_dispatch {
    (
        $(#[$meta:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;
        portable: $portable:path;
        x86_64: $x86:path, avx2 = $avx2:literal, avx512 = $avx512:literal;
    ) => {
        $(#[$meta])*
        fn $name(isa: Isa, $($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = $avx2)]
            fn avx2($($arg: $ty),*) $(-> $ret)? {
                $x86($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = $avx512)]
            fn avx512($($arg: $ty),*) $(-> $ret)? {
                $x86($($arg),*)
            }
            match isa {
                Isa::Portable => $portable($($arg),*),
                #[cfg(target_arch = "aarch64")]
                Isa::Neon => $portable($($arg),*),
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::Avx2` comes from a run-time check that the CPU has AVX2, FMA and F16C.
                Isa::Avx2 => unsafe { avx2($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::Avx512` comes from a run-time check that the CPU has AVX-512F/BW/VL
                // on top of AVX2, FMA and F16C.
                Isa::Avx512 => unsafe { avx512($($arg),*) },
            }
        }
    };
}

isa_dispatch! {
    /// The moments of one block of one channel, given as contiguous slices.
    fn runs_block(slices: &[&[f32]]) -> Moments;
    portable: runs_any;
    x86_64: runs_any, avx2 = "avx2", avx512 = "avx512f,avx2";
}

/// Values the shift of the one-pass path is taken from (the mean of a block's first ones).
const SHIFT_SAMPLE: usize = 64;
/// Rows the shift of the one-pass rows path is taken from.
const SHIFT_ROWS: usize = 16;

/// Whether a one-pass block is as good as a two-pass one: every sum finite, and the shift close
/// enough to the block mean that `Σd² − (Σd)²/n` keeps at least a quarter of `Σd²`
/// (`(Σd)²/n ≤ ¾·Σd²`): at most two bits of the f32 lane sums' accuracy are lost.
#[inline(always)]
fn one_pass_ok(n: usize, shift: f32, sum_d: f64, sum_d2: f64) -> bool {
    shift.is_finite() && sum_d.is_finite() && sum_d2.is_finite() && sum_d * sum_d / n as f64 <= 0.75 * sum_d2
}

/// A block of one channel: one pass when [`one_pass_ok`], else the two passes of [`runs_core`].
#[inline(always)]
fn runs_any(slices: &[&[f32]]) -> Moments {
    runs_one_pass(slices).unwrap_or_else(|| runs_core(slices))
}

/// One pass over a block with the mean of its first [`SHIFT_SAMPLE`] values as the shift: Σd and
/// Σd² (d = x − shift) in the lanes of [`runs_core`]; `None` when not [`one_pass_ok`].
#[inline(always)]
fn runs_one_pass(slices: &[&[f32]]) -> Option<Moments> {
    runs_one_pass_with(slices, |v| v, |c, t| t.copy_from_slice(c))
}

/// [`runs_one_pass`] over slices of any element type: `one` widens one value, `chunk` widens
/// [`LANES`] of them (both exactly, so every instruction set gives the same bits).
#[inline(always)]
fn runs_one_pass_with<T: Copy>(
    slices: &[&[T]],
    one: impl Fn(T) -> f32,
    chunk: impl Fn(&[T], &mut [f32; LANES]),
) -> Option<Moments> {
    // The shift: the mean of the block's first values, in 8 independent partial sums (value i
    // of the concatenation to sum i mod 8).
    let mut k_acc = [0f32; 8];
    let mut k_n = 0;
    match slices.first() {
        // The common case, vectorised: the first slice holds the whole sample.
        Some(first) if first.len() >= SHIFT_SAMPLE => {
            for c in first[..SHIFT_SAMPLE].chunks_exact(8) {
                for (a, &v) in k_acc.iter_mut().zip(c) {
                    *a += one(v);
                }
            }
            k_n = SHIFT_SAMPLE;
        }
        _ => {
            for s in slices {
                for &v in s.iter().take(SHIFT_SAMPLE - k_n) {
                    k_acc[k_n % 8] += one(v);
                    k_n += 1;
                }
                if k_n == SHIFT_SAMPLE {
                    break;
                }
            }
        }
    }
    if k_n == 0 {
        return Some(Moments::default());
    }
    let shift = k_acc.iter().sum::<f32>() / k_n as f32;
    let n: usize = slices.iter().map(|s| s.len()).sum();
    let mut st = ([0f32; LANES], [0f32; LANES]);
    lane_chunks(
        slices,
        &mut st,
        &one,
        |st, c| {
            let mut x = [0f32; LANES];
            chunk(c, &mut x);
            deviations(st, &x, shift)
        },
        |st, x, cnt| deviations(st, &x[..cnt], shift),
    );
    let (sd, sq) = st;
    let (sum_d, sum_d2) = (fold(&sd), fold(&sq));
    if !one_pass_ok(n, shift, sum_d, sum_d2) {
        return None;
    }
    Some(Moments::from_block(n, n as f64 * f64::from(shift) + sum_d, shift, sum_d, sum_d2))
}

isa_dispatch! {
    /// One pass over f16 runs, converting as it reads (so the loads of main memory overlap the
    /// sums); `None` when not [`one_pass_ok`] (the caller then widens the block and sums it again).
    fn runs_one_pass_f16(slices: &[&[half::f16]]) -> Option<Moments>;
    portable: runs_f16_portable;
    x86_64: runs_f16_f16c, avx2 = "avx2,f16c", avx512 = "avx512f,avx2,f16c";
}

isa_dispatch! {
    /// One pass over bf16 runs, widening as it reads (a shift per value, vectorised for each
    /// instruction set); `None` when not [`one_pass_ok`], as [`runs_one_pass_f16`].
    fn runs_one_pass_bf16(slices: &[&[half::bf16]]) -> Option<Moments>;
    portable: runs_bf16_any;
    x86_64: runs_bf16_any, avx2 = "avx2", avx512 = "avx512f,avx512bw,avx2";
}

/// [`runs_one_pass_bf16`]: the bits of each value shifted up (exact).
#[inline(always)]
fn runs_bf16_any(slices: &[&[half::bf16]]) -> Option<Moments> {
    let one = |v: half::bf16| f32::from_bits(u32::from(v.to_bits()) << 16);
    runs_one_pass_with(slices, one, |c, t| {
        prefetch_ahead(c);
        for (t, &c) in t.iter_mut().zip(c) {
            *t = one(c);
        }
    })
}

/// Asks for the cache line `PREFETCH_BYTES` (2 KiB) past the chunk `c` (x86-64; past the end of a
/// run that is the next channel's run, which the same thread reads next on NCHW data): the
/// runs of a channel are short and far apart, which the hardware prefetcher follows badly.
#[inline(always)]
fn prefetch_ahead<T>(c: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        /// Bytes ahead of a one-pass chunk that the prefetch asks for.
        const PREFETCH_BYTES: usize = 2048;
        let p = c.as_ptr().cast::<i8>().wrapping_add(PREFETCH_BYTES);
        // The intrinsic is safe on newer compilers, unsafe on rust-version 1.89.
        #[allow(unused_unsafe)]
        // SAFETY: SSE is in the x86-64 baseline; a prefetch never faults, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p)
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = c;
}

/// [`runs_one_pass_f16`] converting one value at a time.
#[inline(always)]
fn runs_f16_portable(slices: &[&[half::f16]]) -> Option<Moments> {
    runs_one_pass_with(slices, half::f16::to_f32, |c, t| {
        for (t, c) in t.iter_mut().zip(c) {
            *t = c.to_f32();
        }
    })
}

/// [`runs_one_pass_f16`] converting [`LANES`] values at a time with F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn runs_f16_f16c(slices: &[&[half::f16]]) -> Option<Moments> {
    runs_one_pass_with(slices, one_f16c, cvt32_f16c)
}

/// One f16 to f32 with F16C (exact): the values a run leaves over a whole number of [`LANES`]
/// (`half`'s `to_f32` checks the CPU on every call, which made those few values a fifth of the
/// pass for `[8,256,28,28]`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn one_f16c(v: half::f16) -> f32 {
    use std::arch::x86_64::{_mm_cvtph_ps, _mm_cvtsi32_si128, _mm_cvtss_f32};
    // SAFETY: register operations only; only inlined into functions compiled with F16C.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(v.to_bits())))) }
}

/// 32 f16 to f32 with F16C (exact).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn cvt32_f16c(c: &[half::f16], t: &mut [f32; LANES]) {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let c = &c[..LANES];
    prefetch_ahead(c);
    for k in 0..LANES / 8 {
        // SAFETY: `c` holds 32 f16, so 8 (16 bytes) are readable at 8·k; `t` holds 32 f32, so 8
        // are writable at 8·k; the accesses are unaligned ones. Only inlined into functions
        // compiled with F16C (and AVX).
        unsafe {
            let h = _mm_loadu_si128(c.as_ptr().add(8 * k).cast::<__m128i>());
            _mm256_storeu_ps(t.as_mut_ptr().add(8 * k), _mm256_cvtph_ps(h));
        }
    }
}

/// Lanes of a register tile of the one-pass rows path.
const TILE: usize = 32;

/// One block of rows: `full` rows of `lanes` values at `m[r·stride..]`, then (if `last > 0`) a
/// row with only its first `last` values.
#[derive(Clone, Copy)]
struct RowBlock<'m> {
    m: &'m [f32],
    stride: usize,
    lanes: usize,
    full: usize,
    last: usize,
}

/// A block of rows: one pass when every lane is [`one_pass_ok`], else the two passes of
/// [`rows_core`].
#[inline(always)]
fn rows_any(b: RowBlock<'_>, s: &mut RowScratch, out: &mut [Moments]) {
    if !rows_one_pass(b, s, out) {
        rows_core(b, s, out)
    }
}

/// One pass over a block of whole rows, lane j shifted by the mean of its first [`SHIFT_ROWS`]
/// values, accumulated [`TILE`] lanes at a time in registers; merges into `out` and returns
/// true when every lane is [`one_pass_ok`], else leaves `out` alone and returns false.
#[inline(always)]
fn rows_one_pass(
    RowBlock { m, stride, lanes, full, last }: RowBlock<'_>,
    s: &mut RowScratch,
    out: &mut [Moments],
) -> bool {
    if last != 0 || full == 0 {
        return false;
    }
    let (shift, sd, sq) = (&mut s.shift[..lanes], &mut s.sd[..lanes], &mut s.sq[..lanes]);
    let row = |r: usize| &m[r * stride..r * stride + lanes];
    let k_rows = full.min(SHIFT_ROWS);
    shift.fill(0.0);
    for r in 0..k_rows {
        for (k, &v) in shift.iter_mut().zip(row(r)) {
            *k += v;
        }
    }
    for k in shift.iter_mut() {
        *k /= k_rows as f32;
    }
    let mut j0 = 0;
    while j0 + TILE <= lanes {
        let mut k = [0f32; TILE];
        k.copy_from_slice(&shift[j0..j0 + TILE]);
        let mut a = [0f32; TILE];
        let mut q = [0f32; TILE];
        for r in 0..full {
            let x = &m[r * stride + j0..r * stride + j0 + TILE];
            for (((a, q), &k), &v) in a.iter_mut().zip(q.iter_mut()).zip(k.iter()).zip(x) {
                let d = v - k;
                *a += d;
                *q += d * d;
            }
        }
        sd[j0..j0 + TILE].copy_from_slice(&a);
        sq[j0..j0 + TILE].copy_from_slice(&q);
        j0 += TILE;
    }
    if j0 < lanes {
        let (sd, sq, shift) = (&mut sd[j0..], &mut sq[j0..], &shift[j0..]);
        sd.fill(0.0);
        sq.fill(0.0);
        for r in 0..full {
            for (((a, q), &k), &v) in sd.iter_mut().zip(sq.iter_mut()).zip(shift).zip(&row(r)[j0..]) {
                let d = v - k;
                *a += d;
                *q += d * d;
            }
        }
    }
    if !(0..lanes).all(|j| one_pass_ok(full, shift[j], f64::from(sd[j]), f64::from(sq[j]))) {
        return false;
    }
    let n = full as f64;
    for (j, o) in out.iter_mut().enumerate().take(lanes) {
        let (k, a, q) = (shift[j], f64::from(sd[j]), f64::from(sq[j]));
        *o = o.merge(Moments::from_block(full, n * f64::from(k) + a, k, a, q));
    }
    true
}

/// Folds f32 lanes into f64, in lane order.
#[inline(always)]
fn fold(a: &[f32]) -> f64 {
    a.iter().fold(0.0, |s, &v| s + f64::from(v))
}

/// Pass 1 (Σx in 32 f32 lanes: element i of each slice to lane i mod 32), the block mean as the
/// shift, pass 2 (Σd, Σd² with d = x − shift, same lanes); at most [`BLOCK`] values.
#[inline(always)]
fn runs_core(slices: &[&[f32]]) -> Moments {
    let n: usize = slices.iter().map(|s| s.len()).sum();
    if n == 0 {
        return Moments::default();
    }
    let mut acc = [0f32; LANES];
    lane_chunks(
        slices,
        &mut acc,
        |v| v,
        |acc, c| {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += v;
            }
        },
        |acc, x, cnt| {
            for (a, &v) in acc.iter_mut().zip(&x[..cnt]) {
                *a += v;
            }
        },
    );
    let sum = fold(&acc);
    let shift = (sum / n as f64) as f32;
    let mut st = ([0f32; LANES], [0f32; LANES]);
    lane_chunks(
        slices,
        &mut st,
        |v| v,
        |st, c| deviations(st, c, shift),
        |st, x, cnt| deviations(st, &x[..cnt], shift),
    );
    Moments::from_block(n, sum, shift, fold(&st.0), fold(&st.1))
}

/// Adds `d = x[j] − shift` and `d²` to lanes `j` of `(Σd, Σd²)`, for `j < x.len()` (≤ [`LANES`]).
#[inline(always)]
fn deviations((sd, sq): &mut ([f32; LANES], [f32; LANES]), x: &[f32], shift: f32) {
    for ((a, q), &v) in sd.iter_mut().zip(sq.iter_mut()).zip(x) {
        let d = v - shift;
        *a += d;
        *q += d * d;
    }
}

/// Walks the concatenation of `slices` in chunks of [`LANES`] values: `full(state, chunk)` for a
/// chunk inside one slice (exactly [`LANES`] values), `part(state, x, cnt)` for a chunk that
/// crosses slice ends (widened value by value with `one`) or the last, shorter one (`cnt` values).
/// Element i of the concatenation is lane i mod [`LANES`], so a block gives the same bits
/// however it is cut into slices.
#[inline(always)]
fn lane_chunks<T: Copy, S>(
    slices: &[&[T]],
    state: &mut S,
    one: impl Fn(T) -> f32,
    full: impl Fn(&mut S, &[T]),
    part: impl Fn(&mut S, &[f32; LANES], usize),
) {
    let mut x = [0f32; LANES];
    let mut fill = 0;
    for s in slices {
        let mut s: &[T] = s;
        if fill > 0 {
            let take = (LANES - fill).min(s.len());
            for (d, &v) in x[fill..fill + take].iter_mut().zip(&s[..take]) {
                *d = one(v);
            }
            fill += take;
            s = &s[take..];
            if fill < LANES {
                continue;
            }
            part(state, &x, LANES);
        }
        let chunks = s.chunks_exact(LANES);
        let rem = chunks.remainder();
        for c in chunks {
            full(state, c);
        }
        for (d, &v) in x.iter_mut().zip(rem) {
            *d = one(v);
        }
        fill = rem.len();
    }
    if fill > 0 {
        part(state, &x, fill);
    }
}

/// Per-lane accumulators of [`rows_block`].
struct RowScratch {
    acc: [f32; MAX_ROW_LANES],
    shift: [f32; MAX_ROW_LANES],
    sd: [f32; MAX_ROW_LANES],
    sq: [f32; MAX_ROW_LANES],
}

impl RowScratch {
    /// On the stack: lanes <= MAX_ROW_LANES (256).
    fn new() -> Self {
        RowScratch {
            acc: [0.0; MAX_ROW_LANES],
            shift: [0.0; MAX_ROW_LANES],
            sd: [0.0; MAX_ROW_LANES],
            sq: [0.0; MAX_ROW_LANES],
        }
    }
}

isa_dispatch! {
    /// One block of rows; lane j's moments are merged into `out[j]`.
    fn rows_block(b: RowBlock<'_>, s: &mut RowScratch, out: &mut [Moments]);
    portable: rows_any;
    x86_64: rows_any, avx2 = "avx2", avx512 = "avx512f,avx2";
}

#[inline(always)]
fn rows_core(RowBlock { m, stride, lanes, full, last }: RowBlock<'_>, s: &mut RowScratch, out: &mut [Moments]) {
    let (acc, shift, sd, sq) = (&mut s.acc[..lanes], &mut s.shift[..lanes], &mut s.sd[..lanes], &mut s.sq[..lanes]);
    acc.fill(0.0);
    sd.fill(0.0);
    sq.fill(0.0);
    let row = |r: usize, len: usize| &m[r * stride..r * stride + len];
    for r in 0..full {
        for (a, &v) in acc.iter_mut().zip(row(r, lanes)) {
            *a += v;
        }
    }
    if last > 0 {
        for (a, &v) in acc.iter_mut().zip(row(full, last)) {
            *a += v;
        }
    }
    let count = |j: usize| full + usize::from(j < last);
    for (j, (sh, &a)) in shift.iter_mut().zip(acc.iter()).enumerate() {
        let n = count(j);
        *sh = if n == 0 { 0.0 } else { (f64::from(a) / n as f64) as f32 };
    }
    for r in 0..full {
        for (((a, q), &sh), &v) in sd.iter_mut().zip(sq.iter_mut()).zip(shift.iter()).zip(row(r, lanes)) {
            let d = v - sh;
            *a += d;
            *q += d * d;
        }
    }
    if last > 0 {
        for (((a, q), &sh), &v) in sd.iter_mut().zip(sq.iter_mut()).zip(shift.iter()).zip(row(full, last)) {
            let d = v - sh;
            *a += d;
            *q += d * d;
        }
    }
    for (j, o) in out.iter_mut().enumerate().take(lanes) {
        let n = count(j);
        if n > 0 {
            *o = o.merge(Moments::from_block(n, f64::from(acc[j]), shift[j], f64::from(sd[j]), f64::from(sq[j])));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{bf16, f16};

    /// Row-major strides.
    fn strides(shape: &[usize]) -> Vec<usize> {
        crate::layout::contiguous_strides(shape)
    }

    /// f64 two-pass over every index, for comparison.
    fn exact(data: &[f32], shape: &[usize], st: &[usize], off: usize) -> Vec<(f64, f64)> {
        let c = shape[1];
        let mut vals: Vec<Vec<f64>> = vec![Vec::new(); c];
        let mut idx = vec![0usize; shape.len()];
        let n: usize = shape.iter().product();
        for _ in 0..n {
            let pos = off + idx.iter().zip(st).map(|(i, s)| i * s).sum::<usize>();
            vals[idx[1]].push(f64::from(data[pos]));
            for k in (0..shape.len()).rev() {
                idx[k] += 1;
                if idx[k] < shape[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        vals.iter()
            .map(|v| {
                let m = v.iter().sum::<f64>() / v.len() as f64;
                (m, v.iter().map(|x| (x - m) * (x - m)).sum::<f64>())
            })
            .collect()
    }

    fn data(n: usize, seed: u64, mean: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                mean + ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
            })
            .collect()
    }

    /// Every path (runs in place, copied blocks, super-rows, rows, gathered), every instruction
    /// set and several thread counts: the same bits, close to f64.
    #[test]
    fn paths_isas_and_threads_agree_and_are_accurate() {
        let cases: Vec<(Vec<usize>, Vec<usize>)> = vec![
            (vec![4, 3, 100, 101], strides(&[4, 3, 100, 101])),     // runs, long
            (vec![64, 5, 7, 7], strides(&[64, 5, 7, 7])),           // short runs, copied
            (vec![3, 2, 20000], strides(&[3, 2, 20000])),           // runs cut in segments
            (vec![40, 3, 30, 31], vec![3 * 30 * 31, 1, 31 * 3, 3]), // channels-last, C = 3 (super-rows)
            (vec![50, 40, 33], vec![40 * 33, 1, 40]),               // channels-last, C = 40
            (vec![20, 24, 9, 9], vec![24 * 9 * 9 * 2, 1, 9 * 24 * 2, 24 * 2]), // spread rows
            (vec![33, 5, 17], vec![1, 33 * 17, 33]),                // transposed: gathered
            (vec![1, 7], vec![7, 1]),
            (vec![1, 300], vec![300, 1]), // one short super-row, empty chunks
            (vec![3, 300], vec![300, 1]),
            (vec![5, 1000], vec![1000, 1]), // super-rows in four chunks
        ];
        for (shape, st) in cases {
            let len = 1 + shape.iter().zip(&st).map(|(d, s)| (d - 1) * s).sum::<usize>();
            let d = data(len, shape.iter().sum::<usize>() as u64, 1000.0);
            let input = Input::new(SliceRef::F32(&d), &shape, &st, 0);
            let want = exact(&d, &shape, &st, 0);
            let base = channel_moments_with(Isa::Portable, input, 1, 1).unwrap();
            for (ch, (m, (em, em2))) in base.iter().zip(&want).enumerate() {
                assert!((m.mean - em).abs() <= 1e-9 * em.abs(), "{shape:?} ch {ch}: mean {} vs {em}", m.mean);
                assert!((m.m2 - em2).abs() <= 1e-5 * em2, "{shape:?} ch {ch}: m2 {} vs {em2}", m.m2);
            }
            for isa in Isa::supported() {
                for threads in [1, 2, 3, 7] {
                    let got = channel_moments_with(isa, input, threads, 1).unwrap();
                    assert_eq!(got, base, "{shape:?} {isa:?} threads {threads}");
                }
            }
        }
    }

    /// Random shapes, storage orders, spreads and offsets: every path against f64, every
    /// instruction set and thread count giving the same bits.
    #[test]
    fn random_layouts() {
        let mut seed = 0x5eed_u64;
        let mut next = |m: usize| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as usize % m
        };
        for case in 0..300 {
            let rank = 2 + next(4);
            let mut shape: Vec<usize> = (0..rank).map(|_| 1 + next(6)).collect();
            shape[1] = match next(4) {
                0 => 1,
                1 => 3,
                2 => 17 + next(30),
                _ => 1 + next(8),
            };
            if next(5) == 0 {
                shape[rank - 1] = 40 + next(300);
            }
            // storage order: a random permutation of the dims, then a spread and an offset
            let mut order: Vec<usize> = (0..rank).collect();
            for i in (1..rank).rev() {
                order.swap(i, next(i + 1));
            }
            let spread = 1 + next(2);
            let mut st = vec![0; rank];
            let mut acc = spread;
            for &k in order.iter().rev() {
                st[k] = acc;
                acc *= shape[k];
            }
            let off = next(4);
            let len = off + 1 + shape.iter().zip(&st).map(|(d, s)| (d - 1) * s).sum::<usize>();
            let d = data(len, case, if next(2) == 0 { 0.0 } else { 500.0 });
            let input = Input::new(SliceRef::F32(&d), &shape, &st, off);
            let want = exact(&d, &shape, &st, off);
            let base = channel_moments_with(Isa::Portable, input, 1, 1).unwrap();
            for (ch, (m, (em, em2))) in base.iter().zip(&want).enumerate() {
                let what = format!("case {case} {shape:?} {st:?} +{off} ch {ch}");
                let scale = em.abs() + (em2 / m.n).sqrt();
                assert!((m.mean - em).abs() <= 1e-7 * scale, "{what}: mean {} vs {em}", m.mean);
                assert!((m.m2 - em2).abs() <= 1e-5 * em2 + 1e-9, "{what}: m2 {} vs {em2}", m.m2);
            }
            for isa in Isa::supported() {
                assert_eq!(channel_moments_with(isa, input, 1 + next(3), 1).unwrap(), base, "case {case} {isa:?}");
            }
            // f16 (converted as read, or widened into buffers) gives its f32 widening's bits
            let h: Vec<f16> = d.iter().map(|&v| f16::from_f32(v)).collect();
            let w: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
            let hi = input.with_data(SliceRef::F16(&h));
            let wi = input.with_data(SliceRef::F32(&w));
            for isa in Isa::supported() {
                let a = channel_moments_with(isa, hi, 2, 1).unwrap();
                assert_eq!(a, channel_moments_with(isa, wi, 1, 1).unwrap(), "case {case} {shape:?} {st:?} f16 {isa:?}");
            }
        }
    }

    #[test]
    fn f16_is_its_f32_widening() {
        let shape = [6, 3, 50, 9];
        let st = strides(&shape);
        let d = data(shape.iter().product(), 9, 2.0);
        let h: Vec<f16> = d.iter().map(|&v| f16::from_f32(v)).collect();
        let w: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
        let a = channel_moments(Input::new(SliceRef::F16(&h), &shape, &st, 0), 2).unwrap();
        let b = channel_moments(Input::new(SliceRef::F32(&w), &shape, &st, 0), 2).unwrap();
        // the fused f16 pass gives the same bits on every instruction set
        let input = Input::new(SliceRef::F16(&h), &shape, &st, 0);
        let base = channel_moments_with(Isa::Portable, input, 1, 1).unwrap();
        for isa in Isa::supported() {
            assert_eq!(channel_moments_with(isa, input, 3, 1).unwrap(), base, "{isa:?}");
        }
        // in place (f32), converted as read (f16): the lanes follow the data, so the same bits
        assert_eq!(a, b);
        // bf16 likewise (its one pass widens as it reads too)
        let h: Vec<bf16> = d.iter().map(|&v| bf16::from_f32(v)).collect();
        let w: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
        let input = Input::new(SliceRef::BF16(&h), &shape, &st, 0);
        let b = channel_moments(Input::new(SliceRef::F32(&w), &shape, &st, 0), 2).unwrap();
        assert_eq!(channel_moments(input, 2).unwrap(), b);
        for isa in Isa::supported() {
            assert_eq!(channel_moments_with(isa, input, 3, 1).unwrap(), b, "{isa:?}");
        }
    }

    /// A block gives the same bits however it is cut into slices (one pass and two passes).
    #[test]
    fn slicing_never_changes_a_block() {
        let d = data(1000, 5, 3.0);
        let cuts: [&[f32]; 4] = [&d[..17], &d[17..49], &d[49..50], &d[50..]];
        assert_eq!(runs_any(&cuts), runs_any(&[&d]));
        assert_eq!(runs_core(&cuts), runs_core(&[&d]));
        assert!(runs_one_pass(&cuts).is_some());
    }

    /// A block whose first values are far from its mean is redone two-pass, and stays accurate.
    #[test]
    fn a_bad_shift_falls_back_to_two_passes() {
        let mut d = data(2000, 3, 1000.0);
        d[..64].iter_mut().for_each(|v| *v = 0.0);
        assert_eq!(runs_one_pass(&[&d]), None, "the shift is 1000 away from the block mean");
        let shape = [1, 1, 2000];
        let want = exact(&d, &shape, &[2000, 2000, 1], 0)[0];
        let got = runs_any(&[&d]);
        assert!((got.mean - want.0).abs() <= 1e-9 * want.0, "{got:?} vs {want:?}");
        assert!((got.m2 - want.1).abs() <= 1e-6 * want.1, "{got:?} vs {want:?}");
        // a good shift is accepted
        let d = data(2000, 4, 1000.0);
        assert!(runs_one_pass(&[&d]).is_some());
    }

    #[test]
    fn empty_and_non_finite() {
        let shape = [0, 2, 3];
        let m = channel_moments(Input::new(SliceRef::F32(&[]), &shape, &[6, 3, 1], 0), 1).unwrap();
        assert_eq!(m.len(), 2);
        assert!(m.iter().all(|m| m.mean_invstd(1e-5).0 == 0.0 && m.mean_invstd(1e-5).1.is_nan()));
        let d = [1.0, f32::INFINITY, 2.0, 3.0];
        let m = channel_moments(Input::new(SliceRef::F32(&d), &[2, 2], &[2, 1], 0), 1).unwrap();
        let (mean, inv) = m[0].mean_invstd(0.0);
        assert_eq!(mean, 1.5);
        assert_eq!(inv, 1.0 / 0.25f64.sqrt());
        let (mean, inv) = m[1].mean_invstd(0.0);
        assert_eq!(mean, f64::INFINITY);
        assert!(inv.is_nan());
    }
}
