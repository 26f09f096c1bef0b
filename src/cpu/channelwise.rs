//! Element-wise maps whose function depends on the element's channel (dim 1), over strided views:
//! `out[i] = f(in_1[i], ..., in_K[i]; channel of i)`. The engine of the CPU kernels of
//! BatchNorm-style element-wise operators (normalise with per-channel statistics, its backward).
//!
//! The views are walked in the output's storage order, with adjacent dims merged wherever every
//! tensor allows it (never across the channel dim), so the innermost loop is as long as possible:
//! contiguous NCHW gives runs of `H·W` elements of one channel, channels-last gives rows of `C`
//! consecutive channels. Each run is processed in blocks of [`BLOCK`] elements: every input is
//! widened to f32 into a buffer ([`widen`](super::widen): F16C for f16 where present; a whole
//! contiguous block with f16 or bf16 in or out by [`widen_lanes`](super::widen::widen_lanes) and
//! [`narrow_lanes`](super::widen::narrow_lanes), vector code of the kernel's width), `f` maps the
//! buffers to an f32 output block, and the block is narrowed (round to nearest even) into the
//! output. `f` sees whole blocks with the channel pattern of the block: one channel (it
//! hoists that channel's constants) or a window of a [`tile`]d per-channel array (consecutive
//! channels, or short channels-last rows one after the other), so its loop vectorises.
//!
//! Large maps run on several threads ([`pool::run`]) when the output is dense (some permutation of
//! its dims is row-major without gaps): chunks of [`CHUNK`] elements of the output's storage order,
//! each written by one thread. Every element is computed by the same arithmetic whatever the
//! chunking and the thread count, so results are bit-identical for any thread count.

use crate::cpu::scratch::Scratch;
use std::sync::Mutex;

use super::isa::Isa;
use super::{dims, pool, widen};
use crate::dtype::{SliceMut, SliceRef};
use crate::layout::Strided;

/// Elements per block handed to the map function: the chunk of the in-register conversions.
pub(crate) const BLOCK: usize = widen::LANES;
/// Elements per parallel chunk (fixed: the split never depends on the thread count).
pub(crate) const CHUNK: usize = 1 << 15;
/// Below this many bytes read and written, one thread runs the whole map.
pub(crate) const PARALLEL_BYTES: usize = 1 << 20;

/// A strided input view: its whole storage and the view's [`Layout`](crate::layout::Layout). The
/// view must have been checked to lie inside the storage; its shape is the output's.
pub(crate) type Src<'a> = Strided<'a, SliceRef<'a>>;

/// The strided output view, as [`Src`]. It must not overlap itself (checked by validation).
pub(crate) type Dst<'a> = Strided<'a, SliceMut<'a>>;

/// The channels of the elements of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Channels {
    /// Every element is in channel `c`.
    Fixed(usize),
    /// Element `i` of the block is in channel `c + i`.
    Consecutive(usize),
    /// Element `i` of the block is in channel `(first + i) % period` (channels-last rows).
    Cyclic { first: usize, period: usize },
}

/// Where a block's per-channel values are in an array made by [`tile`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Window {
    /// Every element of the block is in channel `c`: use `tiled[c]`.
    Fixed(usize),
    /// Element `i` of the block uses `tiled[start + i]`.
    From(usize),
}

impl Channels {
    /// The block's per-channel values in a [`tile`]d array: one value, or a window of the block's
    /// length (consecutive channels, or rows of channels one after the other).
    pub(crate) fn window(self) -> Window {
        match self {
            Channels::Fixed(c) => Window::Fixed(c),
            Channels::Consecutive(c) => Window::From(c),
            Channels::Cyclic { first, .. } => Window::From(first),
        }
    }
}

/// Per-channel values `v` (one per channel) repeated to `v.len() + BLOCK` values, so that every
/// block's values are one contiguous window (see [`Channels::window`]): `tiled[j] = v[j % C]`.
/// [`Error::HostAlloc`](crate::Error::HostAlloc) when the host cannot hold them (C is the caller's).
pub(crate) fn tile<T: Copy>(v: &[T]) -> crate::Result<Scratch<T>> {
    let n = v.len().saturating_add(BLOCK);
    super::host::scratch_collect(n, v.iter().cycle().take(n).copied())
}

/// The map function: `f(inputs, out, channels)` for one block (every slice of one length). A
/// generic parameter, not a `dyn`: the walk is compiled once per instruction set with `f`
/// inlined ([`run_range`]), so `f`'s loops vectorise with the widest vectors the CPU has (mark
/// what it calls `#[inline(always)]`). Rust never fuses a multiply and an add, so every build
/// gives the same bits.
/// A kernel implements it on its per-channel constants with an `#[inline(always)]` method (a
/// closure's body is not inlined reliably).
pub(crate) trait BlockFn<const K: usize>: Sync {
    /// Maps one block: `out = f(inputs)` with the block's `channels`.
    fn block(&self, inputs: &[&[f32]; K], out: &mut [f32], channels: Channels);
}

impl<const K: usize, F: Fn(&[&[f32]; K], &mut [f32], Channels) + Sync> BlockFn<K> for F {
    #[inline(always)]
    fn block(&self, inputs: &[&[f32]; K], out: &mut [f32], channels: Channels) {
        self(inputs, out, channels)
    }
}

/// One dim of the walk (outermost first), with each tensor's stride along it.
#[derive(Clone, Copy, Debug)]
struct Dim<const K: usize> {
    size: usize,
    channel: bool,
    /// For the innermost dim only: rows of `period` channels, one after the other (channels-last
    /// data with the dim above merged in), or 0.
    period: usize,
    src: [usize; K],
    dst: usize,
}

/// Runs `out = f(inputs)` over every element of the output's shape (see the [module](self) docs), on up to
/// `threads` threads (0: every core) for large dense outputs. `f(inputs, out, channels)` gets
/// blocks of equal length (at most [`BLOCK`]). [`Error::HostAlloc`](crate::Error::HostAlloc) when
/// the host cannot hold the table of parallel chunks (one entry per [`CHUNK`] output elements).
pub(crate) fn map<const K: usize, F: BlockFn<K>>(
    srcs: [Src<'_>; K],
    dst: Dst<'_>,
    threads: usize,
    f: &F,
) -> crate::Result<()> {
    let shape = dst.layout.shape;
    let numel: usize = shape.iter().product();
    if numel == 0 {
        return Ok(());
    }
    let dims = walk_order(shape, &srcs, dst.layout.strides)?;
    let dense = is_dense(&dims);
    let element_bytes =
        srcs.iter().map(|s| s.data.dtype().size_in_bytes()).sum::<usize>() + dst.data.dtype().size_in_bytes();
    let bytes = numel.saturating_mul(element_bytes);
    let dst_offset = dst.layout.offset;
    let m = Map { dims: &dims, srcs: &srcs, dst_offset, f, isa: Isa::detect() };
    if !dense || bytes < PARALLEL_BYTES {
        let mut out = Part { data: dst.data, base: 0 };
        run_range(&m, &mut out, 0, numel);
        return Ok(());
    }
    // Dense output: chunk k writes storage [offset + k·CHUNK, offset + (k+1)·CHUNK), its own slice.
    // The chunk count follows the caller's element count: both tables are fallible.
    let parts = split(dst.data, dst_offset, numel)?;
    pool::run(threads, parts.len(), &|k| {
        let lo = k * CHUNK;
        let hi = numel.min(lo + CHUNK);
        // Each chunk is claimed by exactly one thread, so its lock is never contended.
        let mut part = parts[k].lock().unwrap_or_else(|p| p.into_inner());
        run_range(&m, &mut part, lo, hi);
    });
    Ok(())
}

/// The dims to walk, outermost first: size-1 dims dropped, ordered by the output's strides
/// (largest first, ties in logical order), adjacent non-channel dims merged where every tensor's
/// strides allow it ([`dims::sort_merge`], with the channel as a fence).
fn walk_order<const K: usize>(shape: &[usize], srcs: &[Src<'_>; K], dst: &[usize]) -> crate::Result<Scratch<Dim<K>>> {
    let mut walk = super::host::scratch_with_capacity(shape.len().max(1))?;
    walk.extend((0..shape.len()).filter(|&d| shape[d] != 1).map(|d| Dim {
        size: shape[d],
        channel: d == 1,
        period: 0,
        src: std::array::from_fn(|k| srcs[k].layout.strides[d]),
        dst: dst[d],
    }));
    // Whether `inner` continues `outer` in the output and every input.
    let nests = |outer: &Dim<K>, inner: &Dim<K>| {
        dims::nests(outer.dst, inner.dst, inner.size)
            && (0..K).all(|k| dims::nests(outer.src[k], inner.src[k], inner.size))
    };
    let kept = dims::sort_merge(
        &mut walk,
        |d| d.dst,
        |outer, inner| {
            (!outer.channel && !inner.channel && nests(outer, inner))
                .then(|| Dim { size: outer.size * inner.size, ..*inner })
        },
    );
    let mut merged = walk;
    merged.truncate(kept);
    // Channels-last: the innermost dim is the channel and the dim above steps by whole rows in
    // every tensor: walk both as one dim whose channel cycles (long runs even for small C).
    if let [.., outer, inner] = merged[..] {
        if inner.channel && nests(&outer, &inner) {
            merged.pop();
            let last = merged.len() - 1;
            merged[last] = Dim { size: outer.size * inner.size, period: inner.size, ..inner };
        }
    }
    if merged.is_empty() {
        merged.push(Dim { size: 1, channel: false, period: 0, src: [0; K], dst: 0 });
    }
    Ok(merged)
}

/// Whether the output is row-major without gaps in walk order (so the walk's linear index is its
/// storage position minus the offset).
fn is_dense<const K: usize>(dims: &[Dim<K>]) -> bool {
    let mut expected = 1usize;
    for d in dims.iter().rev() {
        if d.dst != expected {
            return false;
        }
        expected = expected.saturating_mul(d.size);
    }
    true
}

/// One map's walk: its dims, inputs, the output's offset and the function.
struct Map<'m, 'a, const K: usize, F> {
    dims: &'m [Dim<K>],
    srcs: &'m [Src<'a>; K],
    dst_offset: usize,
    f: &'m F,
    /// The instruction set the walk was built for.
    isa: Isa,
}

/// Part of the output storage: `data` holds storage positions `base..base + len`.
struct Part<'a> {
    data: SliceMut<'a>,
    base: usize,
}

/// Splits the dense output `[offset, offset + numel)` into chunks of [`CHUNK`] elements, or
/// [`Error::HostAlloc`](crate::Error::HostAlloc) for a table the host cannot hold.
fn split(data: SliceMut<'_>, offset: usize, numel: usize) -> crate::Result<Scratch<Mutex<Part<'_>>>> {
    fn chunks<'a, T>(
        s: &'a mut [T],
        offset: usize,
        numel: usize,
        wrap: fn(&'a mut [T]) -> SliceMut<'a>,
    ) -> crate::Result<Scratch<Mutex<Part<'a>>>> {
        let parts = s[offset..offset + numel]
            .chunks_mut(CHUNK)
            .enumerate()
            .map(|(k, c)| Mutex::new(Part { data: wrap(c), base: offset + k * CHUNK }));
        super::host::scratch_collect(numel.div_ceil(CHUNK), parts)
    }
    match data {
        SliceMut::F32(s) => chunks(s, offset, numel, SliceMut::F32),
        SliceMut::F16(s) => chunks(s, offset, numel, SliceMut::F16),
        SliceMut::BF16(s) => chunks(s, offset, numel, SliceMut::BF16),
        SliceMut::I32(s) => chunks(s, offset, numel, SliceMut::I32),
    }
}

/// Maps the elements `lo..hi` of the walk (in walk order) into `out`, with the code built for
/// the process's instruction set ([`Isa::detect`]).
fn run_range<const K: usize, F: BlockFn<K>>(m: &Map<'_, '_, K, F>, out: &mut Part<'_>, lo: usize, hi: usize) {
    match Isa::detect() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Isa::detect chose AVX-512 only because this CPU has AVX-512 F, BW, VL and AVX2.
        Isa::Avx512 => unsafe { run_range_avx512(m, out, lo, hi) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Isa::detect chose AVX2 only because this CPU has AVX2, FMA and F16C.
        Isa::Avx2 => unsafe { run_range_avx2(m, out, lo, hi) },
        _ => walk(m, out, lo, hi),
    }
}

/// `$name`: [`walk`] built with the target features `$features`.
macro_rules! walk_for {
    ($name:ident, $features:literal, $doc:literal) => {
        #[doc = $doc]
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<const K: usize, F: BlockFn<K>>(
            m: &Map<'_, '_, K, F>,
            out: &mut Part<'_>,
            lo: usize,
            hi: usize,
        ) {
            walk(m, out, lo, hi)
        }
    };
}
walk_for!(run_range_avx512, "avx512f,avx512bw,avx512vl,avx2,fma,f16c", "[`walk`] built for AVX-512.");
walk_for!(run_range_avx2, "avx2,fma,f16c", "[`walk`] built for AVX2.");

/// The body of [`run_range`], inlined into each instruction set's build.
#[inline(always)]
fn walk<const K: usize, F: BlockFn<K>>(m: &Map<'_, '_, K, F>, out: &mut Part<'_>, lo: usize, hi: usize) {
    let &Map { dims, srcs, dst_offset, f, isa } = m;
    let rank = dims.len();
    let inner = dims[rank - 1];
    let channel_dim = dims.iter().position(|d| d.channel);
    // The multi-index (walk order) of element `lo`.
    // bounded: `dims` has at most one entry per dim of the shape (rank <= MAX_RANK, validated).
    #[allow(clippy::disallowed_methods)]
    let mut idx = [0usize; crate::ops::MAX_RANK];
    let mut rest = lo;
    for (i, d) in dims.iter().enumerate().rev() {
        idx[i] = rest % d.size;
        rest /= d.size;
    }
    let mut bufs = [[0f32; BLOCK]; K];
    let mut result = [0f32; BLOCK];
    // Half precision read or written along contiguous runs: whole blocks are converted by
    // `widen::widen_lanes` / `narrow_lanes` (f32 alone is read and written in place below).
    let is_half = |d: crate::DType| matches!(d, crate::DType::F16 | crate::DType::BF16);
    let float = |d: crate::DType| d != crate::DType::I32;
    let fused = inner.dst == 1
        && float(out.data.dtype())
        && (0..K).all(|k| inner.src[k] == 1 && float(srcs[k].data.dtype()))
        && (is_half(out.data.dtype()) || (0..K).any(|k| is_half(srcs[k].data.dtype())));
    let mut e = lo;
    while e < hi {
        let mut src_pos: [usize; K] = std::array::from_fn(|k| srcs[k].layout.offset);
        let mut dst_pos = dst_offset;
        for (d, &i) in dims.iter().zip(&idx) {
            for (p, s) in src_pos.iter_mut().zip(d.src) {
                *p += i * s;
            }
            dst_pos += i * d.dst;
        }
        let start = idx[rank - 1];
        let run = (inner.size - start).min(hi - e);
        let mut done = 0;
        while done < run {
            let n = BLOCK.min(run - done);
            let channels = match channel_dim {
                Some(c) if c == rank - 1 && inner.period > 0 => {
                    Channels::Cyclic { first: (start + done) % inner.period, period: inner.period }
                }
                Some(c) if c == rank - 1 => Channels::Consecutive(start + done),
                Some(c) => Channels::Fixed(idx[c]),
                None => Channels::Fixed(0),
            };
            let at = dst_pos + done * inner.dst;
            if fused && n == BLOCK {
                // A whole block with half precision in or out: widened and narrowed in vectors
                // of the kernel's own width (see `widen::LANES`).
                for k in 0..K {
                    widen::widen_lanes(isa, srcs[k].data, src_pos[k] + done, &mut bufs[k]);
                }
                f.block(&std::array::from_fn(|k| &bufs[k][..]), &mut result, channels);
                widen::narrow_lanes(isa, &result, &mut out.data, at - out.base);
                done += n;
                continue;
            }
            // Contiguous f32 inputs are read in place, the others widened into their buffer.
            for k in 0..K {
                if direct(srcs[k].data, inner.src[k]).is_none() {
                    load(srcs[k].data, src_pos[k] + done * inner.src[k], inner.src[k], &mut bufs[k][..n]);
                }
            }
            let inputs: [&[f32]; K] = std::array::from_fn(|k| match direct(srcs[k].data, inner.src[k]) {
                Some(s) => &s[src_pos[k] + done..src_pos[k] + done + n],
                None => &bufs[k][..n],
            });
            match &mut out.data {
                // A contiguous f32 output is written in place.
                SliceMut::F32(s) if inner.dst == 1 => {
                    f.block(&inputs, &mut s[at - out.base..at - out.base + n], channels)
                }
                _ => {
                    f.block(&inputs, &mut result[..n], channels);
                    store(&result[..n], out, at, inner.dst);
                }
            }
            done += n;
        }
        e += run;
        // Next run: carry into the outer dims.
        idx[rank - 1] = 0;
        for i in (0..rank - 1).rev() {
            idx[i] += 1;
            if idx[i] < dims[i].size {
                break;
            }
            idx[i] = 0;
        }
    }
}

/// The f32 storage of an input whose innermost stride is 1 (read in place), else `None`.
#[inline(always)]
fn direct<'a>(src: SliceRef<'a>, stride: usize) -> Option<&'a [f32]> {
    match src {
        SliceRef::F32(s) if stride == 1 => Some(s),
        _ => None,
    }
}

/// Widens `out.len()` elements of `src` starting at `pos`, `stride` apart, into `out`.
#[inline(always)]
fn load(src: SliceRef<'_>, pos: usize, stride: usize, out: &mut [f32]) {
    let n = out.len();
    match src {
        SliceRef::F32(s) if stride == 1 => out.copy_from_slice(&s[pos..pos + n]),
        SliceRef::F16(s) if stride == 1 => widen::widen(Isa::detect(), &s[pos..pos + n], out),
        SliceRef::BF16(s) if stride == 1 => widen::widen(Isa::detect(), &s[pos..pos + n], out),
        SliceRef::F32(s) => out.iter_mut().enumerate().for_each(|(i, o)| *o = s[pos + i * stride]),
        SliceRef::F16(s) => out.iter_mut().enumerate().for_each(|(i, o)| *o = s[pos + i * stride].to_f32()),
        SliceRef::BF16(s) => out.iter_mut().enumerate().for_each(|(i, o)| *o = s[pos + i * stride].to_f32()),
        SliceRef::I32(s) => out.iter_mut().enumerate().for_each(|(i, o)| *o = s[pos + i * stride] as f32),
    }
}

/// Narrows `values` (round to nearest even) into `out` at storage positions `pos`, `pos + stride`, ...
#[inline(always)]
fn store(values: &[f32], out: &mut Part<'_>, pos: usize, stride: usize) {
    let n = values.len();
    let at = pos - out.base;
    match &mut out.data {
        SliceMut::F32(s) if stride == 1 => s[at..at + n].copy_from_slice(values),
        SliceMut::F16(s) if stride == 1 => widen::narrow_f16(Isa::detect(), values, &mut s[at..at + n]),
        SliceMut::BF16(s) if stride == 1 => {
            for (o, &v) in s[at..at + n].iter_mut().zip(values) {
                *o = half::bf16::from_bits(widen::bf16_bits(v));
            }
        }
        SliceMut::F32(s) => values.iter().enumerate().for_each(|(i, &v)| s[at + i * stride] = v),
        SliceMut::F16(s) => values.iter().enumerate().for_each(|(i, &v)| s[at + i * stride] = half::f16::from_f32(v)),
        SliceMut::BF16(s) => values.iter().enumerate().for_each(|(i, &v)| s[at + i * stride] = half::bf16::from_f32(v)),
        SliceMut::I32(s) => values.iter().enumerate().for_each(|(i, &v)| s[at + i * stride] = v.round() as i32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::widen::bf16_bits;
    use crate::dtype::{bf16, f16};

    /// y = 10·x + channel over `shape` with the given layouts, on `threads` threads.
    #[allow(clippy::too_many_arguments)]
    fn run(
        shape: &[usize],
        x: &[f32],
        xs: &[usize],
        xo: usize,
        y: &mut [f32],
        ys: &[usize],
        yo: usize,
        threads: usize,
    ) {
        let src = Src::new(SliceRef::F32(x), shape, xs, xo);
        let dst = Dst::new(SliceMut::F32(y), shape, ys, yo);
        let c = shape[1];
        let channel = tile(&(0..c).map(|c| c as f32).collect::<Vec<_>>()).unwrap();
        map([src], dst, threads, &|[x]: &[&[f32]; 1], out: &mut [f32], ch: Channels| match ch.window() {
            Window::Fixed(c) => out.iter_mut().zip(*x).for_each(|(o, &v)| *o = 10.0 * v + channel[c]),
            Window::From(start) => {
                out.iter_mut().zip(*x).zip(&channel[start..]).for_each(|((o, &v), &c)| *o = 10.0 * v + c)
            }
        })
        .unwrap();
    }

    fn strides(shape: &[usize], order: &[usize]) -> Vec<usize> {
        let mut s = vec![0; shape.len()];
        let mut acc = 1;
        for &d in order.iter().rev() {
            s[d] = acc;
            acc *= shape[d];
        }
        s
    }

    /// Every layout pair gives y[n,c,h,w] = 10·x[n,c,h,w] + c, whatever the thread count.
    #[test]
    fn layouts_and_threads() {
        let shape = [3, 5, 100, 90]; // over PARALLEL_BYTES: the threaded path
        let n: usize = shape.iter().product();
        let orders: [&[usize]; 3] = [&[0, 1, 2, 3], &[0, 2, 3, 1], &[3, 1, 2, 0]];
        for xo in orders {
            for yo in orders {
                let xs = strides(&shape, xo);
                let ys = strides(&shape, yo);
                let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.5).collect();
                let mut y1 = vec![-1f32; n + 2];
                let mut y2 = vec![-1f32; n + 2];
                run(&shape, &x, &xs, 0, &mut y1, &ys, 1, 1);
                run(&shape, &x, &xs, 0, &mut y2, &ys, 1, 3);
                assert_eq!(y1, y2, "thread count changed a result ({xo:?} -> {yo:?})");
                assert_eq!((y1[0], y1[n + 1]), (-1.0, -1.0), "wrote outside the view");
                for a in 0..shape[0] {
                    for c in 0..shape[1] {
                        for h in 0..shape[2] {
                            for w in 0..shape[3] {
                                let i = [a, c, h, w];
                                let px: usize = i.iter().zip(&xs).map(|(i, s)| i * s).sum();
                                let py: usize = 1 + i.iter().zip(&ys).map(|(i, s)| i * s).sum::<usize>();
                                assert_eq!(y1[py], 10.0 * x[px] + c as f32, "{i:?} ({xo:?} -> {yo:?})");
                            }
                        }
                    }
                }
            }
        }
    }

    /// A gapped (non-dense) output and a broadcast (stride-0) input run single-threaded, in place.
    #[test]
    fn gaps_and_broadcast() {
        let shape = [4, 3];
        let x = [1.0f32, 2.0, 3.0];
        let mut y = vec![0f32; 24];
        run(&shape, &x, &[0, 1], 0, &mut y, &[6, 2], 0, 2);
        for a in 0..4 {
            for c in 0..3 {
                assert_eq!(y[6 * a + 2 * c], 10.0 * x[c] + c as f32);
                assert_eq!(y[6 * a + 2 * c + 1], 0.0);
            }
        }
    }

    /// The branch-free bf16 rounding agrees with `bf16::from_f32` on every kind of value.
    #[test]
    fn bf16_rounding() {
        let mut x = 0x9E37_79B9u32;
        let specials =
            [0.0f32, -0.0, 1.0, f32::MAX, f32::MIN, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40, -1e-45];
        let ties = (0..1 << 12).map(|k| f32::from_bits(0x3F80_8000 + (k << 16))); // exact halfway cases
        let random = (0..200_000).map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            f32::from_bits(x)
        });
        for v in specials.into_iter().chain(ties).chain(random) {
            assert_eq!(bf16_bits(v), bf16::from_f32(v).to_bits(), "{v:e} ({:#010x})", v.to_bits());
        }
    }

    /// f16 and bf16 inputs widen exactly, outputs round to nearest even.
    #[test]
    fn half_types() {
        let x: Vec<f16> = [1.0f32, 2.5, -3.0].iter().map(|&v| f16::from_f32(v)).collect();
        let mut y = vec![bf16::ZERO; 3];
        let src = Src::new(SliceRef::F16(&x), &[1, 3], &[3, 1], 0);
        let dst = Dst::new(SliceMut::BF16(&mut y), &[1, 3], &[3, 1], 0);
        map([src], dst, 1, &|[x]: &[&[f32]; 1], out: &mut [f32], _: Channels| {
            out.iter_mut().zip(*x).for_each(|(o, &v)| *o = v / 3.0)
        })
        .unwrap();
        let want: Vec<bf16> = [1.0f32, 2.5, -3.0].iter().map(|&v| bf16::from_f32(v / 3.0)).collect();
        assert_eq!(y, want);
    }
}
