//! The block primitives: f32 lanes over at most one block, with a portable implementation,
//! x86-64 AVX2/FMA/F16C and AVX-512 (F/BW/VL) ones chosen at run time, and an aarch64 NEON one
//! (`lanes/neon.rs`). All give bit-identical
//! results: same lane for each element, same operation order, fused multiply-add in all, same f64
//! fold. On AVX-512 CPUs f16 still takes the AVX2 code: a 512-bit half conversion costs two uops
//! on the two 512-bit ports, and that loop measured 10-15% slower than the 256-bit one on three.
//!
//! Two shapes of work:
//! - [`sum_runs`]: contiguous runs of one channel; element `i` of a run goes to lane
//!   `lane_of(i % 32)` (the identity, except for bf16 whose fast widening splits even and odd
//!   elements); the 32 lanes of Σdy and of Σdy·(x − mean) are folded to f64 in a fixed tree.
//! - [`acc_rows`]: rows whose lane `j` belongs to a fixed channel (channels-last); each lane
//!   accumulates its column over the rows in order; the caller folds lanes to f64.

pub(super) use crate::cpu::isa::Isa;
use crate::dtype::{DType, Element};
// The lane tests name the element types through `super::*`.
#[cfg(test)]
use crate::dtype::{bf16, f16};

/// f32 lanes of a [`sum_runs`] block: 4 AVX2 accumulators of 8, or 2 AVX-512 ones of 16.
pub(super) const RUN_LANES: usize = 32;

/// The lane of element `i` (< 32) of each 32-element step of a run. bf16 widens 16 elements at a
/// time as (even elements, odd elements), so its lanes are interleaved that way.
const fn lane_of(dtype: DType, i: usize) -> usize {
    match dtype {
        DType::BF16 => 8 * (2 * (i / 16) + (i & 1)) + (i % 16) / 2,
        DType::F32 | DType::F16 => i,
        DType::I32 => panic!("the float kernels never see i32: callers dispatch on float slices only"),
    }
}

/// A run: `(start in dy.data, start in x.data, length)`.
pub(super) type Run = (usize, usize, usize);

/// The runs of one [`sum_runs`] call, in order.
pub(super) trait Runs: IntoIterator<Item = Run> {}
impl<I: IntoIterator<Item = Run>> Runs for I {}

/// The arguments of one [`sum_runs`] call, as every instruction set's `sum_runs` takes them.
pub(super) struct RunsCall<'a, T, R> {
    /// Software prefetches on (only the x86-64 code prefetches).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pf: bool,
    dy: &'a [T],
    x: &'a [T],
    runs: R,
    mean: f32,
}

/// Calls `$f` of the module of `$isa`'s instruction set with `$call`; on AVX-512, the AVX2 code's
/// when `$avx2` holds (same bits either way).
macro_rules! dispatch {
    ($isa:expr, $f:ident::<$($g:tt),*>($call:expr), avx512_takes_avx2_when: $avx2:expr) => {
        match $isa {
            Isa::Portable => portable::$f::<$($g),*>($call),
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `Isa::Neon` is only produced after checking NEON (in every aarch64 CPU the
            // target supports).
            Isa::Neon => unsafe { neon::$f::<$($g),*>($call) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only produced by `Isa::detect` (or `supported`, tests) after
            // checking avx2, fma and f16c.
            Isa::Avx2 => unsafe { avx2::$f::<$($g),*>($call) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx512` is only produced by `Isa::detect` (or `supported`, tests) after
            // checking avx2, fma, f16c, avx512f, avx512bw and avx512vl.
            Isa::Avx512 => unsafe {
                if $avx2 {
                    avx2::$f::<$($g),*>($call)
                } else {
                    avx512::$f::<$($g),*>($call)
                }
            },
        }
    };
}

/// Σ dy and (when `XMU`) Σ dy·(x − mean) over `runs`, one block: f32 lanes, folded to f64.
pub(super) fn sum_runs<T: Element, const XMU: bool>(
    isa: Isa,
    pf: bool,
    dy: &[T],
    x: &[T],
    runs: impl Runs,
    mean: f32,
) -> (f64, f64) {
    let call = RunsCall { pf, dy, x, runs, mean };
    // f16 on AVX-512: the 256-bit loop is faster than the 512-bit one (see the module docs).
    dispatch!(isa, sum_runs::<T, XMU>(call), avx512_takes_avx2_when: T::DTYPE == DType::F16)
}

/// The rows of one [`acc_rows`] call.
#[derive(Clone, Copy, Debug)]
pub(super) enum Rows<'r> {
    /// `count` rows, the k-th starting at `d + k·stride` in dy and `x + k·stride` in x.
    Strided { d: usize, x: usize, stride: usize, count: usize },
    /// Explicit row starts `(in dy, in x)`.
    List(&'r [(usize, usize)]),
}

/// What `count` strided rows of `len` lanes span in dy and in x, from the first row's start
/// (`d` in dy, `x0` in x) to the last row's end: cut (and bounds-checked) once, the rows are cut
/// from it. `None` for no rows.
#[cfg(target_arch = "x86_64")]
#[inline]
fn strided_span<'a, T>(
    (dy, x): (&'a [T], &'a [T]),
    (d, x0): (usize, usize),
    stride: usize,
    count: usize,
    len: usize,
) -> Option<(&'a [T], &'a [T])> {
    let span = count.checked_sub(1)? * stride + len;
    Some((&dy[d..d + span], &x[x0..x0 + span]))
}

/// The arguments of one [`acc_rows`] call, as every instruction set's `acc_rows` takes them: the
/// lane slices cut to `len` lanes (`acc_m` empty unless `XMU`).
pub(super) struct RowsCall<'a, T> {
    /// Software prefetches on (only the x86-64 code prefetches).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pf: bool,
    dy: &'a [T],
    x: &'a [T],
    rows: Rows<'a>,
    len: usize,
    mean: &'a [f32],
    acc_d: &'a mut [f32],
    acc_m: &'a mut [f32],
}

/// Adds rows to per-lane accumulators: for each row (in order) starting at `(d, x)` and each
/// lane `j < len`: `acc_d[j] += dy[d + j]`, `acc_m[j] = fma(dy[d + j], x[x + j] − mean[j], acc_m[j])`.
/// `mean`, `acc_d` (and `acc_m` when `XMU`) hold at least `len` lanes.
#[allow(clippy::too_many_arguments)]
pub(super) fn acc_rows<T: Element, const XMU: bool>(
    isa: Isa,
    pf: bool,
    dy: &[T],
    x: &[T],
    rows: Rows<'_>,
    len: usize,
    mean: &[f32],
    acc_d: &mut [f32],
    acc_m: &mut [f32],
) {
    let (mean, acc_d) = (&mean[..len], &mut acc_d[..len]);
    let acc_m = if XMU { &mut acc_m[..len] } else { &mut acc_m[..0] };
    let call = RowsCall { pf, dy, x, rows, len, mean, acc_d, acc_m };
    // f16 rows on AVX-512: the 256-bit loop in cache (45 → 53 GB/s on [8,256,28,28]), the
    // 512-bit one without prefetches, i.e. on main memory on AMD (17.8 → 20.0 GB/s on
    // [64,64,128,128]; see `prefetch_policy`).
    dispatch!(isa, acc_rows::<T, XMU>(call), avx512_takes_avx2_when: T::DTYPE == DType::F16 && pf)
}

/// Folds 32 f32 lanes into one f64 in the fixed order the AVX2 code uses:
/// `s[j] = ((a[j]+a[j+4]) + (a[j+8]+a[j+12])) + ((a[j+16]+a[j+20]) + (a[j+24]+a[j+28]))`, then
/// `(s[0]+s[2]) + (s[1]+s[3])`, all in f64.
pub(super) fn fold32(a: &[f32; RUN_LANES]) -> f64 {
    let w = |i: usize| f64::from(a[i]);
    let s: [f64; 4] = std::array::from_fn(|j| {
        ((w(j) + w(j + 4)) + (w(j + 8) + w(j + 12))) + ((w(j + 16) + w(j + 20)) + (w(j + 24) + w(j + 28)))
    });
    (s[0] + s[2]) + (s[1] + s[3])
}

/// Widens `src` into `dst[..src.len()]` (the portable path's buffers).
fn widen<T: Element>(src: &[T], dst: &mut [f32]) {
    crate::cpu::widen::widen(Isa::Portable, src, dst)
}

mod portable {
    use super::{fold32, lane_of, widen, Rows, RowsCall, Runs, RunsCall, RUN_LANES};
    use crate::dtype::Element;

    pub(super) fn sum_runs<T: Element, const XMU: bool>(call: RunsCall<'_, T, impl Runs>) -> (f64, f64) {
        let RunsCall { dy, x, runs, mean, .. } = call;
        let lane: [usize; RUN_LANES] = std::array::from_fn(|i| lane_of(T::DTYPE, i));
        let mut ad = [0f32; RUN_LANES];
        let mut am = [0f32; RUN_LANES];
        let mut bd = [0f32; RUN_LANES];
        let mut bx = [0f32; RUN_LANES];
        for (od, ox, len) in runs {
            let (d, xs) = (&dy[od..od + len], &x[ox..ox + len]);
            for (dc, xc) in d.chunks(RUN_LANES).zip(xs.chunks(RUN_LANES)) {
                let n = dc.len();
                widen(dc, &mut bd);
                for j in 0..n {
                    ad[lane[j]] += bd[j];
                }
                if XMU {
                    widen(xc, &mut bx);
                    for j in 0..n {
                        am[lane[j]] = bd[j].mul_add(bx[j] - mean, am[lane[j]]);
                    }
                }
            }
        }
        (fold32(&ad), if XMU { fold32(&am) } else { 0.0 })
    }

    pub(super) fn acc_rows<T: Element, const XMU: bool>(call: RowsCall<'_, T>) {
        let RowsCall { dy, x, rows, len, mean, acc_d, acc_m, .. } = call;
        let mut bd = [0f32; 256];
        let mut bx = [0f32; 256];
        let mut row = |od: usize, ox: usize| {
            let (d, xs) = (&dy[od..od + len], &x[ox..ox + len]);
            for (k, (dc, xc)) in d.chunks(256).zip(xs.chunks(256)).enumerate() {
                let base = k * 256;
                let n = dc.len();
                widen(dc, &mut bd);
                for (a, v) in acc_d[base..base + n].iter_mut().zip(&bd) {
                    *a += *v;
                }
                if XMU {
                    widen(xc, &mut bx);
                    let am = &mut acc_m[base..base + n];
                    for j in 0..n {
                        am[j] = bd[j].mul_add(bx[j] - mean[base + j], am[j]);
                    }
                }
            }
        };
        match rows {
            Rows::Strided { d, x, stride, count } => (0..count).for_each(|k| row(d + k * stride, x + k * stride)),
            Rows::List(list) => list.iter().for_each(|&(d, x)| row(d, x)),
        }
    }
}

/// Prefetches the line `$at` elements past `$pd` in dy and, when the call reads x (`XMU`), past
/// `$px` in x, with the calling instruction set's `prefetch`.
#[cfg(target_arch = "x86_64")]
macro_rules! prefetch_dy_x {
    ($pd:expr, $px:expr, $at:expr) => {
        prefetch($pd.wrapping_add($at));
        if XMU {
            prefetch($px.wrapping_add($at));
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(test)]
mod tests;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! Every function here requires AVX2, FMA and F16C (checked by `Isa::detect`).

    use super::{lane_of, strided_span, Rows, RowsCall, Runs, RunsCall, RUN_LANES};
    use crate::dtype::{DType, Element};
    use std::arch::x86_64::*;

    /// Software prefetch distance in bytes (the hardware prefetcher alone leaves f16/bf16 and
    /// channels-last at ~75% of a streaming read on main-memory shapes).
    const PREFETCH_BYTES: usize = 2048;

    /// Prefetches the line holding `p` (any address: prefetches never fault).
    ///
    /// # Safety
    /// The CPU must support SSE (always true with AVX2).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    // The intrinsic is safe inside this fn on newer compilers, unsafe on rust-version 1.89.
    #[allow(unused_unsafe)]
    unsafe fn prefetch<T>(p: *const T) {
        // SAFETY: SSE is present (this function's contract); prefetching never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) };
    }

    /// The element index each lane holds (inverse of `lane_of`), for f32/f16 and for bf16.
    const ELEM_IN_ORDER: [i32; RUN_LANES] = elems(DType::F32);
    const ELEM_BF16: [i32; RUN_LANES] = elems(DType::BF16);

    const fn elems(dtype: DType) -> [i32; RUN_LANES] {
        let mut e = [0i32; RUN_LANES];
        let mut i = 0;
        while i < RUN_LANES {
            e[lane_of(dtype, i)] = i as i32;
            i += 1;
        }
        e
    }

    /// Loads 8 elements at `p` widened to f32, in order.
    ///
    /// # Safety
    /// `p..p+8` must be readable elements of `T`; the CPU must support AVX2 and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8<T: Element>(p: *const T) -> __m256 {
        // SAFETY: the caller guarantees 8 readable elements and the features; unaligned loads.
        unsafe {
            match T::DTYPE {
                DType::F32 => _mm256_loadu_ps(p.cast::<f32>()),
                DType::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>())),
                DType::BF16 => {
                    let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast::<__m128i>()));
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
                }
                DType::I32 => unreachable!("the float kernels never see i32: callers dispatch on float slices only"),
            }
        }
    }

    /// Elements per unit of `load_unit`: 16 for bf16 (two vectors), else 8 (one vector).
    const fn unit(dtype: DType) -> usize {
        match dtype {
            DType::BF16 => 16,
            DType::F32 | DType::F16 => 8,
            DType::I32 => panic!("the float kernels never see i32: callers dispatch on float slices only"),
        }
    }

    /// Loads one unit of elements at `p` widened to f32, filling lanes as `lane_of` says: for
    /// bf16 16 elements as (even, odd) (two ALU ops per 16 elements), else 8 elements in order
    /// (the second vector repeats the first).
    ///
    /// # Safety
    /// `p..p + unit(T::DTYPE)` must be readable; the CPU must support AVX2 and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_unit<T: Element>(p: *const T) -> [__m256; 2] {
        // SAFETY: forwarded from the caller.
        unsafe {
            match T::DTYPE {
                DType::BF16 => {
                    let w = _mm256_loadu_si256(p.cast::<__m256i>());
                    let hi = _mm256_set1_epi32(0xFFFF_0000_u32 as i32);
                    [_mm256_castsi256_ps(_mm256_slli_epi32::<16>(w)), _mm256_castsi256_ps(_mm256_and_si256(w, hi))]
                }
                DType::F32 | DType::F16 => {
                    let v = load8(p);
                    [v, v]
                }
                DType::I32 => unreachable!("the float kernels never see i32: callers dispatch on float slices only"),
            }
        }
    }

    /// Folds 4 accumulators (32 lanes) to f64 in the order of `super::fold32`. Register arithmetic
    /// only, so a safe `target_feature` function (Rust 1.86+; the MSRV is 1.89): the AVX2 kernels,
    /// compiled with the same features, call it without `unsafe`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn fold(v: [__m256; 4]) -> f64 {
        let mut p = [_mm256_setzero_pd(); 4];
        for (p, &a) in p.iter_mut().zip(&v) {
            let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(a));
            let hi = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(a));
            *p = _mm256_add_pd(lo, hi);
        }
        let s = _mm256_add_pd(_mm256_add_pd(p[0], p[1]), _mm256_add_pd(p[2], p[3]));
        let h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd::<1>(s));
        _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)))
    }

    /// See `super::sum_runs`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn sum_runs<T: Element, const XMU: bool>(call: RunsCall<'_, T, impl Runs>) -> (f64, f64) {
        let RunsCall { pf, dy, x, runs, mean } = call;
        let size = std::mem::size_of::<T>();
        let dist = PREFETCH_BYTES / size;
        // Element index held by each lane, for masking a partial last step.
        let elem: &[i32; RUN_LANES] = match T::DTYPE {
            DType::BF16 => &ELEM_BF16,
            DType::F32 | DType::F16 => &ELEM_IN_ORDER,
            DType::I32 => unreachable!("the float kernels never see i32: callers dispatch on float slices only"),
        };
        // SAFETY: every load reads whole units inside the run slices `d` and `xs` (s + unit ≤
        // len), or inside the storage `dy`/`x` (checked just before), or from a stack copy;
        // prefetches never fault; features from the caller.
        unsafe {
            let mv = _mm256_set1_ps(mean);
            let mut ad = [_mm256_setzero_ps(); 4];
            let mut am = [_mm256_setzero_ps(); 4];
            for (od, ox, len) in runs {
                let (d, xs) = (&dy[od..od + len], &x[ox..ox + len]);
                let (pd, px) = (d.as_ptr(), xs.as_ptr());
                let mut i = 0;
                while i + RUN_LANES <= len {
                    if pf {
                        prefetch_dy_x!(pd, px, i + dist);
                    }
                    if pf && size == 4 {
                        prefetch_dy_x!(pd, px, i + dist + 16);
                    }
                    // Unit by unit (not all 32 loaded first: fewer live registers for bf16).
                    let unit = unit(T::DTYPE);
                    for u in 0..RUN_LANES / unit {
                        let a = load_unit(pd.add(i + u * unit));
                        let b = if XMU { load_unit(px.add(i + u * unit)) } else { a };
                        for v in 0..unit / 8 {
                            let k = u * (unit / 8) + v;
                            ad[k] = _mm256_add_ps(ad[k], a[v]);
                            if XMU {
                                am[k] = _mm256_fmadd_ps(a[v], _mm256_sub_ps(b[v], mv), am[k]);
                            }
                        }
                        if T::DTYPE == DType::BF16 {
                            // Keeps the next unit's loads below this unit's arithmetic: hoisted,
                            // they needed more than the 16 registers and LLVM spilled an
                            // accumulator, so every step waited on a store-to-load round trip.
                            std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                    i += RUN_LANES;
                }
                // The last step (< 32 elements): whole units (8 elements, or 16 for bf16) as in a
                // full step, then one zero-padded partial unit whose dead lanes keep their bits.
                let rem = len - i;
                let unit = unit(T::DTYPE);
                for u in 0..RUN_LANES / unit {
                    let s = i + u * unit;
                    if s >= len {
                        break;
                    }
                    let (a, b, live) = if s + unit <= len {
                        let a = load_unit(pd.add(s));
                        (a, if XMU { load_unit(px.add(s)) } else { a }, None)
                    } else if od + s + unit <= dy.len() && (!XMU || ox + s + unit <= x.len()) {
                        // The unit overruns the run but not the storage: load it in place, the
                        // lanes past the run are masked out below.
                        let a = load_unit(dy.as_ptr().add(od + s));
                        (
                            a,
                            if XMU { load_unit(x.as_ptr().add(ox + s)) } else { a },
                            Some(_mm256_set1_epi32(rem as i32)),
                        )
                    } else {
                        let mut bd = [T::default(); 16];
                        let mut bx = [T::default(); 16];
                        bd[..len - s].copy_from_slice(&d[s..]);
                        let a = load_unit(bd.as_ptr());
                        let b = if XMU {
                            bx[..len - s].copy_from_slice(&xs[s..]);
                            load_unit(bx.as_ptr())
                        } else {
                            a
                        };
                        (a, b, Some(_mm256_set1_epi32(rem as i32)))
                    };
                    for v in 0..unit / 8 {
                        let k = u * (unit / 8) + v;
                        let (d1, m1) =
                            (_mm256_add_ps(ad[k], a[v]), _mm256_fmadd_ps(a[v], _mm256_sub_ps(b[v], mv), am[k]));
                        match live {
                            None => {
                                ad[k] = d1;
                                if XMU {
                                    am[k] = m1;
                                }
                            }
                            Some(r) => {
                                let e = _mm256_loadu_si256(elem.as_ptr().add(8 * k).cast::<__m256i>());
                                let live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(r, e));
                                ad[k] = _mm256_blendv_ps(ad[k], d1, live);
                                if XMU {
                                    am[k] = _mm256_blendv_ps(am[k], m1, live);
                                }
                            }
                        }
                    }
                }
            }
            (fold(ad), if XMU { fold(am) } else { 0.0 })
        }
    }

    /// See `super::acc_rows`; slices already cut to `len` lanes (`acc_m` empty unless `XMU`).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn acc_rows<T: Element, const XMU: bool>(call: RowsCall<'_, T>) {
        let RowsCall { pf, dy, x, rows, len, mean, acc_d, acc_m } = call;
        let nv = len / 8 * 8;
        let lanes = Lanes { mean, acc_d: acc_d as *mut [f32], acc_m: acc_m as *mut [f32], nv, pf };
        // SAFETY: every row handed to `group`/`tail` is a slice of exactly `len` elements (cut
        // from `dy`/`x` with bounds checks), `nv ≤ len`; features from the caller.
        unsafe {
            match rows {
                Rows::Strided { d, x: x0, stride, count } => {
                    let Some((rd, rx)) = strided_span((dy, x), (d, x0), stride, count, len) else { return };
                    let row = |k: usize| (&rd[k * stride..k * stride + len], &rx[k * stride..k * stride + len]);
                    let mut k = 0;
                    while k + 4 <= count {
                        group::<T, XMU, true>([row(k), row(k + 1), row(k + 2), row(k + 3)], &lanes);
                        k += 4;
                    }
                    while k < count {
                        single::<T, XMU>(row(k), &lanes);
                        k += 1;
                    }
                }
                Rows::List(list) => {
                    let row = |&(od, ox): &(usize, usize)| (&dy[od..od + len], &x[ox..ox + len]);
                    let mut groups = list.chunks_exact(4);
                    for g in &mut groups {
                        group::<T, XMU, false>([row(&g[0]), row(&g[1]), row(&g[2]), row(&g[3])], &lanes);
                    }
                    for r in groups.remainder() {
                        single::<T, XMU>(row(r), &lanes);
                    }
                }
            }
        }
    }

    /// The per-lane state of an `acc_rows` call (raw pointers: `group` writes through them).
    struct Lanes<'a> {
        mean: &'a [f32],
        acc_d: *mut [f32],
        acc_m: *mut [f32],
        nv: usize,
        /// Software prefetches on.
        pf: bool,
    }

    /// Four rows into the lanes: per 8 lanes, the accumulators are loaded once, take the four
    /// rows in order, and are stored once. `EVEN`: rows evenly spaced (prefetch ahead of the
    /// first row, which covers the next rows too), else every row prefetches its own lines.
    ///
    /// # Safety
    /// Each row slice holds `len` elements (the lanes' length); AVX2/FMA/F16C available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<T: Element, const XMU: bool, const EVEN: bool>(r: [(&[T], &[T]); 4], l: &Lanes<'_>) {
        let size = std::mem::size_of::<T>();
        let dist = PREFETCH_BYTES / size;
        let line = 64 / size;
        let pd: [*const T; 4] = std::array::from_fn(|k| r[k].0.as_ptr());
        let px: [*const T; 4] = std::array::from_fn(|k| r[k].1.as_ptr());
        let (pa, pm, pmean) = (l.acc_d.cast::<f32>(), l.acc_m.cast::<f32>(), l.mean.as_ptr());
        // SAFETY: j + 8 ≤ nv ≤ len for every row and every lane array; prefetches never fault.
        unsafe {
            let mut j = 0;
            while j < l.nv {
                if !l.pf {
                } else if EVEN {
                    // The four rows span 4·len elements; walk that span at 4 elements per lane.
                    let ahead = 4 * j + dist;
                    prefetch_dy_x!(pd[0], px[0], ahead);
                    if size == 4 {
                        prefetch_dy_x!(pd[0], px[0], ahead + 16);
                    }
                } else if j % line == 0 {
                    for k in 0..4 {
                        prefetch_dy_x!(pd[k], px[k], j + dist);
                    }
                }
                let a = [load8(pd[0].add(j)), load8(pd[1].add(j)), load8(pd[2].add(j)), load8(pd[3].add(j))];
                let mut s = _mm256_loadu_ps(pa.add(j));
                for v in a {
                    s = _mm256_add_ps(s, v);
                }
                _mm256_storeu_ps(pa.add(j), s);
                if XMU {
                    let mv = _mm256_loadu_ps(pmean.add(j));
                    let mut t = _mm256_loadu_ps(pm.add(j));
                    for k in 0..4 {
                        t = _mm256_fmadd_ps(a[k], _mm256_sub_ps(load8(px[k].add(j)), mv), t);
                    }
                    _mm256_storeu_ps(pm.add(j), t);
                }
                j += 8;
            }
            if l.nv < l.mean.len() {
                for (d, x) in r {
                    tail::<T, XMU>(d, x, l);
                }
            }
        }
    }

    /// One row into the lanes.
    ///
    /// # Safety
    /// The row slices hold `len` elements; AVX2/FMA/F16C available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn single<T: Element, const XMU: bool>((d, x): (&[T], &[T]), l: &Lanes<'_>) {
        let (pd, px) = (d.as_ptr(), x.as_ptr());
        let (pa, pm, pmean) = (l.acc_d.cast::<f32>(), l.acc_m.cast::<f32>(), l.mean.as_ptr());
        // SAFETY: j + 8 ≤ nv ≤ len for the row and every lane array.
        unsafe {
            let mut j = 0;
            while j < l.nv {
                let a = load8(pd.add(j));
                _mm256_storeu_ps(pa.add(j), _mm256_add_ps(_mm256_loadu_ps(pa.add(j)), a));
                if XMU {
                    let xm = _mm256_sub_ps(load8(px.add(j)), _mm256_loadu_ps(pmean.add(j)));
                    _mm256_storeu_ps(pm.add(j), _mm256_fmadd_ps(a, xm, _mm256_loadu_ps(pm.add(j))));
                }
                j += 8;
            }
            tail::<T, XMU>(d, x, l);
        }
    }

    /// Lanes `nv..len` of one row, one at a time: the same operations as the vector lanes.
    ///
    /// # Safety
    /// The row slices hold `len` elements; FMA available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tail<T: Element, const XMU: bool>(d: &[T], x: &[T], l: &Lanes<'_>) {
        let len = l.mean.len();
        for j in l.nv..len {
            // SAFETY: j < len = the length of both lane arrays (acc_m when XMU); the row slices
            // hold len elements; `acc_d`/`acc_m` are not otherwise borrowed during the call.
            unsafe {
                let dv = d[j].to_f32();
                *l.acc_d.cast::<f32>().add(j) += dv;
                if XMU {
                    let m = l.acc_m.cast::<f32>().add(j);
                    *m = dv.mul_add(x[j].to_f32() - l.mean[j], *m);
                }
            }
        }
    }
}
