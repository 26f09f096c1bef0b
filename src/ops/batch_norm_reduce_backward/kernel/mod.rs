//! The CPU reduction kernel: per-channel Σdy and Σdy·(x − mean) over host memory.
//!
//! # Design
//! - **Accuracy.** Every value is summed in f32 lanes over a bounded *block* (at most
//!   [`LANE_SUMS`] = 256 values per lane), blocks are folded to f64 in a fixed order, and block results are summed in f64 in
//!   a fixed order. Σdy·(x − mean) is two-pass (`fma(dy, x − mean, acc)` per element).
//! - **Layouts.** The reduction dims (N and the spatial dims) are sorted by dy's stride (outermost
//!   first), size-1 dims dropped and neighbours that are contiguous in both views merged. Then:
//!   - *runs* (NCHW-style): the innermost dim has stride 1 in both views and at least
//!     [`MIN_RUN`] elements: each channel is a set of contiguous runs; a block is up to
//!     [`BLOCK`] elements of one channel (a piece of a long run, or several short runs).
//!   - *rows* (channels-last): the channel stride is 1 in both views: each reduction position is a
//!     row of C contiguous values, lane j of the accumulators belongs to channel j. When the whole
//!     `[R, C]` matrix is contiguous, rows are re-cut into *super-rows* of W = a multiple of
//!     lcm(C, 8) (≥ 64) lanes, lane j belonging to channel j mod C, so small C stays vectorised.
//!     A block is [`ROWS_PER_BLOCK`] rows; C is cut into chunks of at most [`MAX_ROW_LANES`].
//!   - *gather* (anything else: mixed layouts, transposed or broadcast views, short runs): tiles
//!     of up to [`GATHER_CHANNELS`] channels × [`GATHER_POSITIONS`] positions are copied into
//!     contiguous per-channel buffers and summed like runs.
//! - **Threads.** The work is cut into items (blocks or tiles) whose boundaries depend only on
//!   the shape and strides; each item writes its own f64 partials, and partials are combined per
//!   channel in item order after the join. So the results are bit-identical for any thread
//!   count, and Σdy's bits do not depend on `with_xmu`. Items are grouped into chunks of about
//!   [`CHUNK_BYTES`] ([`MEMORY_CHUNK_BYTES`] for inputs larger than [`CACHED_BYTES`]) that the
//!   caller and the persistent helpers of [`pool`] claim as they come free; a helper is only
//!   used for each further [`MIN_BYTES_PER_THREAD`] bytes of dy + x.
//!   Inputs of at most [`TINY_ELEMS`] elements take a scalar path (no SIMD set-up).
//! - **Instruction sets.** AVX-512 (F/BW/VL; f32 and bf16, with 64-byte-aligned loads on long
//!   runs) or AVX2+FMA+F16C on x86-64 when the CPU has them (checked at run time), NEON on
//!   aarch64, else portable Rust; all give the same bits ([`crate::cpu::isa`]).

use std::ops::Range;
use std::sync::{Mutex, OnceLock};

use crate::dtype::Element;
use crate::error::Result;
use crate::layout::Strided;

mod lanes;
use crate::cpu::scratch::{Inline, Scratch};
use crate::cpu::{dims, host, pool};
#[cfg(test)]
mod tests;

use lanes::{Isa, Rows, Run};

/// A read-only strided view over host memory. The caller has validated it: `shape.len() ==
/// strides.len()` (2..=8), channel = dim 1, and every element's index
/// `offset + Σ i_k·strides[k]` lies inside `data`.
pub(crate) type StridedView<'a, T> = Strided<'a, &'a [T]>;

/// Per-channel sums, each accumulated without cancellation and returned in f64 so that the
/// caller rounds exactly once into the output dtype.
#[derive(Debug, PartialEq)]
pub(crate) struct ChannelSums {
    /// Σ dy per channel.
    pub sum_dy: Scratch<f64>,
    /// Σ dy·(x − mean[c]) per channel, when asked for.
    pub sum_dy_xmu: Option<Scratch<f64>>,
}

/// Most values an f32 lane sums before its block is folded to f64.
const LANE_SUMS: usize = 256;
/// Most elements of one channel in one block of the runs path (256 per lane of 32).
const BLOCK: usize = 8192;
/// Shortest innermost contiguous dim the runs path takes (shorter runs are gathered).
const MIN_RUN: usize = 16;
/// Rows per block of the rows path: each f32 lane sums this many values before its f64 flush.
const ROWS_PER_BLOCK: usize = LANE_SUMS;
/// Widest chunk of lanes in the rows path (the f32 accumulators stay in L1).
const MAX_ROW_LANES: usize = 1024;
/// Fewest lanes of a super-row (enough independent accumulators to hide add latency).
const MIN_ROW_LANES: usize = 64;
/// Inputs of at most this many elements (C × positions) take the scalar tiny path.
const TINY_ELEMS: usize = 256;
/// Fewest items the rows path makes when it can (by cutting wide rows into lane chunks).
const MIN_ROW_ITEMS: usize = 8;
/// About this many elements per work item of the rows path.
const ROW_TILE_ELEMS: usize = 1 << 16;
/// Channels per gather tile.
const GATHER_CHANNELS: usize = 16;
/// Reduction positions per gather tile (one block per channel).
const GATHER_POSITIONS: usize = 512;
/// Fewest bytes of dy + x each thread must get before another thread is woken.
const MIN_BYTES_PER_THREAD: usize = 256 << 10;
/// About this many bytes of dy + x per chunk of work the threads claim (small enough that a
/// thread arriving late, or slowed by other load on its core, delays the call by little).
const CHUNK_BYTES: usize = 256 << 10;
/// The same for inputs larger than [`CACHED_BYTES`] (read from main memory, a call takes
/// milliseconds): each thread streams longer stretches before it claims the next. Measured on
/// AMD Zen 4 (EPYC, 2-core VM), two threads, chunk sizes alternated call by call in one process
/// (`CPU_REDUCE_PROFILE`), best GB/s against 256 KiB chunks: NCHW f16 [1,4,4096,4096] and
/// [64,64,128,128] 1.12-1.16x, bf16 1.03-1.05x, channels-last f16 1.05x and bf16 1.27x, f32 no
/// change; 1-16 MiB all did about as well, and a whole channel per chunk (64 MiB) less well on
/// average (a late thread waits longer).
const MEMORY_CHUNK_BYTES: usize = 4 << 20;

/// Computes the per-channel sums of `dy` (and of `dy·(x − mean)` when `with_xmu`), where
/// `dy` and `x` have the same shape (possibly different strides) and `mean.len() == C`.
/// `threads` is the most worker threads to use (0 = all cores). Results are bit-identical
/// whatever `threads` and `with_xmu` are.
pub(crate) fn channel_sums<T: Element>(
    dy: StridedView<'_, T>,
    x: StridedView<'_, T>,
    mean: &[f32],
    with_xmu: bool,
    threads: usize,
) -> Result<ChannelSums> {
    channel_sums_with(Isa::detect(), MIN_BYTES_PER_THREAD, TINY_ELEMS, dy, x, mean, with_xmu, threads)
}

/// [`channel_sums`] on a given instruction set, thread threshold and tiny-path limit (the tests
/// vary all three).
#[allow(clippy::too_many_arguments)]
fn channel_sums_with<T: Element>(
    isa: Isa,
    min_bytes_per_thread: usize,
    tiny_elems: usize,
    dy: StridedView<'_, T>,
    x: StridedView<'_, T>,
    mean: &[f32],
    with_xmu: bool,
    threads: usize,
) -> Result<ChannelSums> {
    let (dl, xl) = (&dy.layout, &x.layout);
    let c = dl.shape.get(1).copied().unwrap_or(0);
    let zeros = || -> Result<ChannelSums> {
        Ok(ChannelSums {
            sum_dy: host::scratch_vec(c, 0.0)?,
            sum_dy_xmu: with_xmu.then(|| host::scratch_vec(c, 0.0)).transpose()?,
        })
    };
    let rank = dl.shape.len();
    // Outside the validated contract (rank, strides, shapes) there is nothing sound to read.
    if !(2..=dims::MAX_DIMS).contains(&rank)
        || dl.strides.len() != rank
        || xl.shape != dl.shape
        || xl.strides.len() != rank
        || dl.shape.contains(&0)
    {
        return zeros();
    }
    let padded;
    let mean: &[f32] = if mean.len() >= c {
        &mean[..c]
    } else {
        padded = host::scratch_collect(c, (0..c).map(|i| mean.get(i).copied().unwrap_or(f32::NAN)))?;
        &padded
    };
    let geo = Geometry::new(&dy, &x);
    let threads = match threads {
        0 => pool::cores(),
        n => n,
    };
    let bytes = c.saturating_mul(geo.r).saturating_mul(2 * std::mem::size_of::<T>());
    let threads = threads.min((bytes / min_bytes_per_thread.max(1)).max(1));
    let chunk_bytes = if bytes > CACHED_BYTES { MEMORY_CHUNK_BYTES } else { CHUNK_BYTES };
    let chunks = if threads > 1 { (bytes / chunk_bytes).max(2 * threads) } else { 1 };
    let (pf_runs, pf_rows) = prefetch_policy(bytes);
    let k = Kernel { isa, geo: &geo, dy: dy.data, x: x.data, mean, threads, chunks, pf_runs, pf_rows };
    let tiny = c.saturating_mul(geo.r) <= tiny_elems;
    match (tiny, with_xmu) {
        (true, true) => k.tiny::<true>(),
        (true, false) => k.tiny::<false>(),
        (false, true) => k.run::<true>(),
        (false, false) => k.run::<false>(),
    }
}

/// One reduction dim: size and the strides in dy and in x.
type Dim = dims::Dim<2>;
/// Walks reduction positions, tracking the index in dy (`pos[0]`) and in x (`pos[1]`).
type Odometer<'a> = dims::Odometer<'a, 2>;

/// The shape seen by the kernel: channels, and the reduction dims sorted by dy's stride
/// (outermost first), size-1 dims dropped, contiguous neighbours merged.
#[derive(Clone, Debug)]
struct Geometry {
    c: usize,
    csd: usize,
    csx: usize,
    od: usize,
    ox: usize,
    dims: dims::Dims<2>,
    /// Reduction positions per channel (N × spatial).
    r: usize,
}

impl Geometry {
    fn new<T>(dy: &StridedView<'_, T>, x: &StridedView<'_, T>) -> Geometry {
        let (dy, x) = (&dy.layout, &x.layout);
        let dims = dims::Dims::reduction(dy.shape, [dy.strides, x.strides], |_| true);
        let r = dims.positions();
        Geometry { c: dy.shape[1], csd: dy.strides[1], csx: x.strides[1], od: dy.offset, ox: x.offset, dims, r }
    }

    fn dims(&self) -> &[Dim] {
        self.dims.as_slice()
    }

    /// Which path sums this geometry (see the module docs).
    fn path(&self) -> Path {
        let dims = self.dims();
        if self.c > 1 && self.csd == 1 && self.csx == 1 {
            let flat = match dims {
                [] => true,
                [d] => d.s == [self.c, self.c],
                _ => false,
            };
            let base = lcm8(self.c);
            if flat && base <= MAX_ROW_LANES {
                return Path::Rows(Some(base * MIN_ROW_LANES.div_ceil(base)));
            }
            if self.c >= GATHER_CHANNELS {
                return Path::Rows(None);
            }
        }
        match dims.last() {
            Some(inner) if inner.s == [1, 1] && inner.n >= MIN_RUN => Path::Runs,
            _ => Path::Gather,
        }
    }
}

/// The three ways of walking the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// Contiguous runs of one channel (NCHW-style).
    Runs,
    /// Channels-last rows; `Some(w)`: super-rows of `w` lanes over a contiguous `[R, C]` matrix.
    Rows(Option<usize>),
    /// Tiles copied into per-channel buffers.
    Gather,
}

/// Everything a path needs.
struct Kernel<'a, T> {
    isa: Isa,
    geo: &'a Geometry,
    dy: &'a [T],
    x: &'a [T],
    mean: &'a [f32],
    threads: usize,
    /// Most pieces the items are cut into for the threads to claim.
    chunks: usize,
    /// Software prefetches on the runs and the rows paths (see [`prefetch_policy`]).
    pf_runs: bool,
    pf_rows: bool,
}

impl<T: Element> Kernel<'_, T> {
    fn run<const XMU: bool>(&self) -> Result<ChannelSums> {
        match self.geo.path() {
            Path::Runs => self.runs::<XMU>(),
            Path::Rows(super_row) => self.rows::<XMU>(super_row),
            Path::Gather => self.gather::<XMU>(),
        }
    }

    /// Tiny inputs (at most [`TINY_ELEMS`] elements, so at most 256 positions per channel): one
    /// f32 lane per channel, positions in order, then f64 (one block: the same error bound as
    /// the other paths). No allocation but the results, no SIMD set-up: a [4, 2] call is mostly
    /// validation.
    fn tiny<const XMU: bool>(&self) -> Result<ChannelSums> {
        let g = self.geo;
        let mut sum_dy = host::scratch_with_capacity(g.c)?;
        let mut sum_m = host::scratch_with_capacity(if XMU { g.c } else { 0 })?;
        for (ch, &mean) in self.mean.iter().enumerate().take(g.c) {
            let mut o = Odometer::new(g.dims(), 0, [g.od + ch * g.csd, g.ox + ch * g.csx]);
            let (mut a, mut m) = (0f32, 0f32);
            for _ in 0..g.r {
                let d = self.dy[o.pos[0]].to_f32();
                a += d;
                if XMU {
                    m = d.mul_add(self.x[o.pos[1]].to_f32() - mean, m);
                }
                o.advance();
            }
            sum_dy.push(f64::from(a));
            if XMU {
                sum_m.push(f64::from(m));
            }
        }
        Ok(ChannelSums { sum_dy, sum_dy_xmu: XMU.then_some(sum_m) })
    }

    /// Runs path: items are blocks `(channel, b)`; one partial per item.
    fn runs<const XMU: bool>(&self) -> Result<ChannelSums> {
        let g = self.geo;
        let (outer, inner) = g.dims().split_at(g.dims().len() - 1);
        let l = inner[0].n;
        let nruns = g.r / l;
        // Long runs are cut into `nseg` segments of `seg` (a multiple of 32) elements; short ones
        // are grouped `per` to a block.
        // Element i of a run goes to lane i mod 32, so a run adds ⌈l/32⌉ values to a lane.
        let (nseg, seg, per) = if l > BLOCK {
            let seg = l.div_ceil(l.div_ceil(BLOCK)).next_multiple_of(32);
            (l.div_ceil(seg), seg, 1)
        } else {
            (1, l, (LANE_SUMS / l.div_ceil(32)).max(1))
        };
        let nb = if nseg > 1 { nruns * nseg } else { nruns.div_ceil(per) };
        let n_items = g.c * nb;
        // Items (and their partials) are numbered in memory order so that each thread streams
        // through a contiguous stretch: channel-major when the channel is the outermost dim,
        // else (run group, channel, segment), e.g. (n, c, piece of h·w) for NCHW.
        let chan_major = match outer.first() {
            Some(d) => g.csd >= d.s[0],
            None => true,
        };
        let item_of = |ch: usize, b: usize| {
            if chan_major {
                ch * nb + b
            } else {
                (b / nseg * g.c + ch) * nseg + b % nseg
            }
        };
        let block_of = |i: usize| {
            if chan_major {
                (i / nb, i % nb)
            } else {
                ((i / nseg) % g.c, i / (nseg * g.c) * nseg + i % nseg)
            }
        };
        let mut parts = host::scratch_vec(if XMU { n_items.saturating_mul(2) } else { n_items }, 0.0)?;
        let (pd, pm) = parts.split_at_mut(n_items);
        parallel(
            n_items,
            self.threads,
            self.chunks,
            |i| i,
            pd,
            pm,
            |items, pd, pm| {
                for (k, item) in items.enumerate() {
                    let (ch, b) = block_of(item);
                    let (bd, bx) = (g.od + ch * g.csd, g.ox + ch * g.csx);
                    let (isa, dy, x, mean) = (self.isa, self.dy, self.x, self.mean[ch]);
                    let (sd, sm) = if nseg > 1 {
                        let o = Odometer::new(outer, b / nseg, [bd, bx]);
                        let start = b % nseg * seg;
                        let run: Run = (o.pos[0] + start, o.pos[1] + start, seg.min(l - start));
                        lanes::sum_runs::<T, XMU>(isa, self.pf_runs, dy, x, [run], mean)
                    } else {
                        let m0 = b * per;
                        let mut o = Odometer::new(outer, m0, [bd, bx]);
                        let runs = (m0..nruns.min(m0 + per)).map(|_| {
                            let run: Run = (o.pos[0], o.pos[1], l);
                            o.advance();
                            run
                        });
                        lanes::sum_runs::<T, XMU>(isa, self.pf_runs, dy, x, runs, mean)
                    };
                    pd[k] = sd;
                    if XMU {
                        pm[k] = sm;
                    }
                }
            },
        )?;
        // Each channel's blocks in block order, whatever the item numbering.
        let (pd, pm) = parts.split_at(n_items);
        let fold =
            |p: &[f64]| host::scratch_collect(g.c, (0..g.c).map(|ch| (0..nb).fold(0.0, |a, b| a + p[item_of(ch, b)])));
        Ok(ChannelSums { sum_dy: fold(pd)?, sum_dy_xmu: XMU.then(|| fold(pm)).transpose()? })
    }

    /// Rows path. `super_row = Some(w)`: the `[R, C]` matrix is contiguous and is cut into
    /// super-rows of `w` lanes (lane j ↔ channel j mod C); `None`: one row per reduction
    /// position, lane j ↔ channel j. Items are `(row tile, lane chunk)`, tile-major; each writes
    /// one f64 partial per lane.
    fn rows<const XMU: bool>(&self, super_row: Option<usize>) -> Result<ChannelSums> {
        let g = self.geo;
        let c = g.c;
        let dims = g.dims();
        // Lanes per row, number of rows, elements in the whole matrix (flat case).
        let (w, nrows, total) = match super_row {
            Some(w) => (w, (g.r * c).div_ceil(w), g.r * c),
            None => (c, g.r, 0),
        };
        let nchunks = w.div_ceil(MAX_ROW_LANES);
        let cw = w.div_ceil(nchunks).next_multiple_of(8).min(w);
        let tile_rows = ROWS_PER_BLOCK * (ROW_TILE_ELEMS / (ROWS_PER_BLOCK * cw)).max(1);
        let ntiles = nrows.div_ceil(tile_rows);
        // Few tiles of wide rows (e.g. [256, 1024]: one tile) and several threads: cut the lanes
        // finer, down to 128 per chunk, so that the threads have several items to share (one
        // thread reads whole rows: [256, 1024] f32 45 GB/s, against 40 in 128-lane chunks).
        // Lanes are independent sums, so this changes no bit.
        let mut cw = cw;
        while self.threads > 1 && ntiles * w.div_ceil(cw) < MIN_ROW_ITEMS && cw >= 256 {
            cw = (cw / 2).next_multiple_of(64);
        }
        let nchunks = w.div_ceil(cw);
        let n_items = ntiles * nchunks;
        // Lane j's mean: channel j mod C (super-rows) or channel j.
        let super_means: Scratch<f32> = match super_row {
            Some(_) => host::scratch_collect(w, self.mean.iter().copied().cycle())?,
            None => Scratch::new(),
        };
        let mean_lanes: &[f32] = if super_row.is_some() { &super_means } else { self.mean };
        let off = |i: usize| (i / nchunks) * w + (i % nchunks) * cw;
        let n_parts = ntiles * w;
        let mut parts = host::scratch_vec(if XMU { n_parts.saturating_mul(2) } else { n_parts }, 0.0)?;
        let (pd, pm) = parts.split_at_mut(n_parts);
        parallel(n_items, self.threads, self.chunks, off, pd, pm, |items, pd, pm| {
            let base = off(items.start);
            // At most 2·MAX_ROW_LANES lanes and ROWS_PER_BLOCK rows: on the stack.
            let mut acc = [0f32; 2 * MAX_ROW_LANES];
            let (acc_d, acc_m) = acc[..if XMU { 2 * cw } else { cw }].split_at_mut(cw);
            let mut rows: Inline<(usize, usize), ROWS_PER_BLOCK> = Inline::new();
            for item in items {
                let (t, k) = (item / nchunks, item % nchunks);
                let (l0, lanes) = (k * cw, cw.min(w - k * cw));
                let o = off(item) - base;
                let (part_d, part_m) = (&mut pd[o..o + lanes], if XMU { &mut pm[o..o + lanes] } else { &mut [][..] });
                let r1 = nrows.min((t + 1) * tile_rows);
                let mut r0 = t * tile_rows;
                let mut odo = Odometer::new(dims, r0, [g.od + l0, g.ox + l0]);
                while r0 < r1 {
                    let rb = r1.min(r0 + ROWS_PER_BLOCK);
                    let (md, ad, am) = (&mean_lanes[l0..l0 + lanes], &mut acc_d[..], &mut acc_m[..]);
                    match super_row {
                        Some(_) => {
                            // Super-rows are contiguous; the very last one may be partial.
                            let full = rb.min(total / w);
                            let (d, x) = (g.od + r0 * w + l0, g.ox + r0 * w + l0);
                            let rows = Rows::Strided { d, x, stride: w, count: full.saturating_sub(r0) };
                            lanes::acc_rows::<T, XMU>(self.isa, self.pf_rows, self.dy, self.x, rows, lanes, md, ad, am);
                            // Lanes of this chunk inside the partial super-row.
                            let tail = (total - full * w).saturating_sub(l0).min(lanes);
                            if full < rb && tail > 0 {
                                let (d, x) = (g.od + full * w + l0, g.ox + full * w + l0);
                                let rows = Rows::Strided { d, x, stride: w, count: 1 };
                                lanes::acc_rows::<T, XMU>(
                                    self.isa,
                                    self.pf_rows,
                                    self.dy,
                                    self.x,
                                    rows,
                                    tail,
                                    md,
                                    ad,
                                    am,
                                );
                            }
                        }
                        None => {
                            rows.clear();
                            for _ in r0..rb {
                                rows.push((odo.pos[0], odo.pos[1]));
                                odo.advance();
                            }
                            let rows = Rows::List(&rows[..]);
                            lanes::acc_rows::<T, XMU>(self.isa, self.pf_rows, self.dy, self.x, rows, lanes, md, ad, am);
                        }
                    }
                    flush(part_d, &mut acc_d[..lanes]);
                    if XMU {
                        flush(part_m, &mut acc_m[..lanes]);
                    }
                    r0 = rb;
                }
            }
        })?;
        let (pd, pm) = parts.split_at(n_parts);
        // Channel ch: its lanes ch, ch + C, ... (w is a multiple of C) of each tile in order.
        let fold = |p: &[f64]| -> Result<Scratch<f64>> {
            let mut out = host::scratch_vec(c, 0.0)?;
            for seg in p.chunks_exact(c) {
                for (o, v) in out.iter_mut().zip(seg) {
                    *o += v;
                }
            }
            Ok(out)
        };
        Ok(ChannelSums { sum_dy: fold(pd)?, sum_dy_xmu: XMU.then(|| fold(pm)).transpose()? })
    }

    /// Gather path: items are `(position block, channel chunk)`, block-major; each writes one
    /// partial per channel of its chunk.
    fn gather<const XMU: bool>(&self) -> Result<ChannelSums> {
        let g = self.geo;
        let c = g.c;
        let dims = g.dims();
        let nblocks = g.r.div_ceil(GATHER_POSITIONS);
        let cb = c.min(GATHER_CHANNELS);
        let nchunks = c.div_ceil(cb);
        let n_items = nblocks * nchunks;
        let off = |i: usize| (i / nchunks) * c + (i % nchunks) * cb;
        let n_parts = nblocks * c;
        let mut parts = host::scratch_vec(if XMU { n_parts.saturating_mul(2) } else { n_parts }, 0.0)?;
        let (pd, pm) = parts.split_at_mut(n_parts);
        // Per view: walk channels innermost when its channel stride is the smaller one, else
        // positions innermost (so each view is read along its shorter stride).
        let inner = dims.last().copied().unwrap_or(Dim { n: 1, s: [0, 0] });
        let (d_chan_inner, x_chan_inner) = (g.csd < inner.s[0], g.csx < inner.s[1]);
        // Buffer rows are padded so that channel rows do not alias in L1.
        let row = GATHER_POSITIONS + 16;
        parallel(n_items, self.threads, self.chunks, off, pd, pm, |items, pd, pm| {
            let base = off(items.start);
            // Tiles of at most GATHER_CHANNELS × (GATHER_POSITIONS + 16): fixed sizes, on the
            // stack (cb <= GATHER_CHANNELS, row = GATHER_POSITIONS + 16).
            let mut tiles = [T::default(); 2 * GATHER_CHANNELS * (GATHER_POSITIONS + 16)];
            let (bufd, bufx) = tiles.split_at_mut(GATHER_CHANNELS * (GATHER_POSITIONS + 16));
            let (bufd, bufx) = (&mut bufd[..cb * row], &mut bufx[..if XMU { cb * row } else { 0 }]);
            let mut offs = [(0usize, 0usize); GATHER_POSITIONS];
            for item in items {
                let (p, k) = (item / nchunks, item % nchunks);
                let (c0, nc) = (k * cb, cb.min(c - k * cb));
                let p0 = p * GATHER_POSITIONS;
                let lp = GATHER_POSITIONS.min(g.r - p0);
                let mut odo = Odometer::new(dims, p0, [g.od + c0 * g.csd, g.ox + c0 * g.csx]);
                for o in &mut offs[..lp] {
                    *o = (odo.pos[0], odo.pos[1]);
                    odo.advance();
                }
                let offs = &offs[..lp];
                gather_tile(self.dy, offs.iter().map(|o| o.0), g.csd, nc, bufd, row, d_chan_inner);
                if XMU {
                    gather_tile(self.x, offs.iter().map(|o| o.1), g.csx, nc, bufx, row, x_chan_inner);
                }
                let xs = if XMU { &bufx[..] } else { &bufd[..] };
                let o = off(item) - base;
                for ci in 0..nc {
                    let run = [(ci * row, ci * row, lp)];
                    let (sd, sm) = lanes::sum_runs::<T, XMU>(self.isa, false, bufd, xs, run, self.mean[c0 + ci]);
                    pd[o + ci] = sd;
                    if XMU {
                        pm[o + ci] = sm;
                    }
                }
            }
        })?;
        let (pd, pm) = parts.split_at(n_parts);
        let fold =
            |p: &[f64]| host::scratch_collect(c, (0..c).map(|ch| p[ch..].iter().step_by(c).fold(0.0, |a, &v| a + v)));
        Ok(ChannelSums { sum_dy: fold(pd)?, sum_dy_xmu: XMU.then(|| fold(pm)).transpose()? })
    }
}

/// Copies a tile: `buf[ci·row + q] = src[offs[q] + ci·stride]` for `ci < nc` and every
/// position `q`, channels innermost (`chan_inner`) or positions innermost.
fn gather_tile<T: Copy>(
    src: &[T],
    offs: impl ExactSizeIterator<Item = usize> + Clone,
    stride: usize,
    nc: usize,
    buf: &mut [T],
    row: usize,
    chan_inner: bool,
) {
    if chan_inner {
        for (q, o) in offs.enumerate() {
            if stride == 0 {
                let v = src[o];
                buf[q..].iter_mut().step_by(row).take(nc).for_each(|d| *d = v);
            } else {
                // One bounds check per position.
                let col = &src[o..=o + (nc - 1) * stride];
                for (d, v) in buf[q..].iter_mut().step_by(row).zip(col.iter().step_by(stride)) {
                    *d = *v;
                }
            }
        }
    } else {
        for (ci, dst) in buf.chunks_mut(row).take(nc).enumerate() {
            for (d, o) in dst.iter_mut().zip(offs.clone()) {
                *d = src[o + ci * stride];
            }
        }
    }
}

/// Adds f32 lane accumulators into f64 partials and clears them.
fn flush(part: &mut [f64], acc: &mut [f32]) {
    for (p, a) in part.iter_mut().zip(acc.iter_mut()) {
        *p += f64::from(*a);
        *a = 0.0;
    }
}

/// Largest input (bytes of dy + x) that counts as cache-resident for [`prefetch_policy`] and
/// the chunk size.
const CACHED_BYTES: usize = 32 << 20;

/// Whether the runs and the rows paths issue software prefetches, for `bytes` of dy + x.
///
/// Measured on AMD Zen 4 (EPYC, 2-core VM), one thread, best of many calls: on main memory
/// every path is faster without them (NCHW f16 [1,4,4096,4096] 18.5 → 22.9 GB/s, bf16 17.6 →
/// 23.3, f32 21.7 → 24.5; channels-last f16 14.7 → 18.5, f32 19.7 → 21.6: the hardware
/// prefetcher streams better alone), and NCHW in cache does not care, but channels-last rows in
/// cache need them (f32 [8,256,28,28] 54 → 29 GB/s without). On the machine the kernel was
/// first tuned on (the README's earlier numbers), they lifted main-memory f16/bf16 and
/// channels-last from ~0.75 to 0.96 of a streaming read, so other vendors keep them.
fn prefetch_policy(bytes: usize) -> (bool, bool) {
    let amd = cpu_is_amd();
    (!amd, !amd || bytes <= CACHED_BYTES)
}

/// Whether the CPU is AMD's (or Hygon's, same cores), asked once.
fn cpu_is_amd() -> bool {
    static AMD: OnceLock<bool> = OnceLock::new();
    *AMD.get_or_init(|| {
        // Miri runs no inline assembly (CPUID): there the policy is the other vendors'.
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        {
            // SAFETY: CPUID leaf 0 is available on every x86-64 CPU and only reads registers.
            // (Safe to call since Rust 1.94; `unsafe` before.)
            #[allow(unused_unsafe)]
            let r = unsafe { std::arch::x86_64::__cpuid(0) };
            // bounded: the 12 bytes of the CPUID vendor string.
            #[allow(clippy::disallowed_methods)]
            let vendor: Vec<u8> = [r.ebx, r.edx, r.ecx].iter().flat_map(|w| w.to_le_bytes()).collect();
            vendor == b"AuthenticAMD" || vendor == b"HygonGenuine"
        }
        #[cfg(any(not(target_arch = "x86_64"), miri))]
        false
    })
}

/// lcm(c, 8).
fn lcm8(c: usize) -> usize {
    let g = 8 >> (c.trailing_zeros().min(3));
    c.saturating_mul(g)
}

/// Runs `work` over items `0..n_items` cut into at most `chunks` ranges `n·k/chunks ..
/// n·(k+1)/chunks`, on up to `threads` threads (the caller's included, see [`pool`]); each range
/// gets the partials `off(start)..off(end)` of `pd` (and of `pm` unless it is empty). `off` is
/// non-decreasing with `off(n_items) == pd.len()`. Which thread runs a range never changes a
/// result.
fn parallel<O, W>(
    n_items: usize,
    threads: usize,
    chunks: usize,
    off: O,
    pd: &mut [f64],
    pm: &mut [f64],
    work: W,
) -> Result<()>
where
    O: Fn(usize) -> usize,
    W: Fn(Range<usize>, &mut [f64], &mut [f64]) + Sync,
{
    let chunks = chunks.clamp(1, n_items.max(1));
    if threads <= 1 || chunks == 1 {
        work(0..n_items, pd, pm);
        return Ok(());
    }
    type Chunk<'a> = Mutex<Option<(Range<usize>, &'a mut [f64], &'a mut [f64])>>;
    let (mut rest_d, mut rest_m) = (pd, pm);
    let jobs: Scratch<Chunk<'_>> = host::scratch_collect(
        chunks,
        (0..chunks).map(|t| {
            let (i0, i1) = (n_items * t / chunks, n_items * (t + 1) / chunks);
            let len = off(i1) - off(i0);
            let (d, rd) = std::mem::take(&mut rest_d).split_at_mut(len);
            rest_d = rd;
            let m_len = if rest_m.is_empty() { 0 } else { len };
            let (m, rm) = std::mem::take(&mut rest_m).split_at_mut(m_len);
            rest_m = rm;
            Mutex::new(Some((i0..i1, d, m)))
        }),
    )?;
    // Each chunk is claimed once by the pool; the lock is never contended (a poisoned one still
    // holds valid data).
    pool::run(threads, chunks, &|k| {
        let taken = jobs[k].lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((r, d, m)) = taken {
            work(r, d, m);
        }
    });
    Ok(())
}
