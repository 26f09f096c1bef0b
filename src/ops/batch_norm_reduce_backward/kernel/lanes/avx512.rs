//! The AVX-512 twin of the `avx2` primitives: every function here requires AVX-512 F, BW and VL
//! (checked by `Isa::detect`).
//!
//! Same bits as the portable code: each f32 lane receives the same values in the same order with
//! the same operations (add, fused multiply-add); only the grouping of lanes into registers
//! differs. `sum_runs` keeps 32 lanes as two 16-lane registers: lanes 0..16 and 16..32 for
//! f32/f16 (element i → lane i), and for bf16 the (even, odd) halves of 32 elements, i.e. lanes
//! `[0..8, 16..24]` and `[8..16, 24..32]` of `lane_of`. Partial steps use masked loads (nothing
//! past the run is read) and masked arithmetic (dead lanes keep their bits).
//!
//! `acc_rows` on evenly spaced rows of 16, 32, 48 or 64 lanes of f16/bf16 (the super-rows of
//! small C) keeps its accumulators in registers for the whole call instead of loading and
//! storing them for every group of four rows; bf16 rows of 32 or 64 lanes are moreover loaded
//! 64 bytes at a time and widened as (even, odd) lanes, the accumulators being permuted into that
//! order once per call. With the store-and-reload loop, bf16 channels-last on main memory ran at
//! 0.70-0.76 of a streaming read or at ~0.9 depending only on where the heap put the small
//! accumulator buffer (same data addresses, same path); now 0.91-0.96 either way.

use super::{strided_span, Rows, RowsCall, Runs, RunsCall, RUN_LANES};
use crate::dtype::{DType, Element};
use std::arch::x86_64::*;

/// Software prefetch distance in bytes (as in the AVX2 code).
const PREFETCH_BYTES: usize = 2048;

/// Prefetches the line holding `p` (any address: a prefetch is a hint that never faults).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn prefetch<T>(p: *const T) {
    // SAFETY: a prefetch only hints the cache and never faults, whatever the address; SSE is
    // part of every x86-64 CPU. (Safe to call from here since Rust 1.94; `unsafe` before.)
    #[allow(unused_unsafe)]
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>())
    };
}

/// The mask of the first `n` of 16 lanes.
#[inline]
fn mask16(n: usize) -> __mmask16 {
    if n >= 16 {
        0xFFFF
    } else {
        (1u16 << n) - 1
    }
}

/// Widens 16 halves (bf16 bits in `w`'s 16-bit lanes, zero-extended) to f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn bf16x16(h: __m256i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
}

/// Loads 16 elements at `p` widened to f32, in order.
///
/// # Safety
/// `p..p+16` must be readable elements of `T`; AVX-512 F/BW/VL available.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load16<T: Element>(p: *const T) -> __m512 {
    // SAFETY: the caller guarantees 16 readable elements; unaligned loads.
    unsafe {
        match T::DTYPE {
            DType::F32 => _mm512_loadu_ps(p.cast::<f32>()),
            DType::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.cast::<__m256i>())),
            DType::BF16 => bf16x16(_mm256_loadu_si256(p.cast::<__m256i>())),
            DType::I32 => unreachable!("the float kernels never see i32: callers dispatch on float slices only"),
        }
    }
}

/// Loads the elements `k < 16` of `p` whose bit `k` is set in `m`, widened to f32 (the others
/// are zero and their memory is not accessed).
///
/// # Safety
/// Every element selected by `m` must be readable; AVX-512 F/BW/VL available.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load16_masked<T: Element>(p: *const T, m: __mmask16) -> __m512 {
    // SAFETY: masked loads access only the selected elements, which the caller guarantees.
    unsafe {
        match T::DTYPE {
            DType::F32 => _mm512_maskz_loadu_ps(m, p.cast::<f32>()),
            DType::F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p.cast::<i16>())),
            DType::BF16 => bf16x16(_mm256_maskz_loadu_epi16(m, p.cast::<i16>())),
            DType::I32 => unreachable!("the float kernels never see i32: callers dispatch on float slices only"),
        }
    }
}

/// The two registers of a 32-element step from the 512 bits of bf16 words `w` (element 2k in the
/// low half of word k): evens (shift) and odds (mask), two ALU ops for 32 elements.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn bf16_even_odd(w: __m512i) -> [__m512; 2] {
    let hi = _mm512_set1_epi32(0xFFFF_0000_u32 as i32);
    [_mm512_castsi512_ps(_mm512_slli_epi32::<16>(w)), _mm512_castsi512_ps(_mm512_and_si512(w, hi))]
}

/// Loads one 32-element step at `p` as the two registers of `sum_runs` (see the module docs).
///
/// # Safety
/// `p..p+32` must be readable; AVX-512 F/BW/VL available.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load32<T: Element>(p: *const T) -> [__m512; 2] {
    // SAFETY: forwarded from the caller (32 elements).
    unsafe {
        match T::DTYPE {
            DType::BF16 => bf16_even_odd(_mm512_loadu_si512(p.cast::<__m512i>())),
            DType::F32 | DType::F16 => [load16(p), load16(p.add(16))],
            DType::I32 => unreachable!("the float kernels never see i32: callers dispatch on float slices only"),
        }
    }
}

/// Loads the first `n` (< 32) elements of a step at `p` as `load32` would, the other lanes zero
/// without touching their memory; also returns each register's live lanes.
///
/// # Safety
/// `p..p+n` must be readable; AVX-512 F/BW/VL available.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load32_partial<T: Element>(p: *const T, n: usize) -> ([__m512; 2], [__mmask16; 2]) {
    debug_assert!(n < RUN_LANES);
    // SAFETY: the masks select exactly elements 0..n, which the caller guarantees readable;
    // `p.add(16)` is only formed when n > 16 (so it stays inside the readable range).
    unsafe {
        match T::DTYPE {
            DType::BF16 => {
                let m: __mmask32 = (1u32 << n) - 1;
                let w = _mm512_maskz_loadu_epi16(m, p.cast::<i16>());
                // Even element 2k lives iff 2k < n, odd element 2k + 1 iff 2k + 1 < n.
                (bf16_even_odd(w), [mask16(n.div_ceil(2)), mask16(n / 2)])
            }
            DType::F32 | DType::F16 => {
                let (m0, m1) = (mask16(n), mask16(n.saturating_sub(16)));
                let lo = load16_masked(p, m0);
                let hi = if n > 16 { load16_masked(p.add(16), m1) } else { _mm512_setzero_ps() };
                ([lo, hi], [m0, m1])
            }
            DType::I32 => unreachable!("the float kernels never see i32: callers dispatch on float slices only"),
        }
    }
}

/// Folds `sum_runs`' two registers to f64 in the order of `super::fold32` (as the AVX2 fold
/// does, on the four octets of lanes `0..8, 8..16, 16..24, 24..32`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn fold<T: Element>(v: [__m512; 2]) -> f64 {
    let lo = |r: __m512| _mm512_castps512_ps256(r);
    let hi = |r: __m512| _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(r)));
    let oct = match T::DTYPE {
        // Evens hold lanes 0..8 and 16..24, odds 8..16 and 24..32.
        DType::BF16 => [lo(v[0]), lo(v[1]), hi(v[0]), hi(v[1])],
        DType::F32 | DType::F16 => [lo(v[0]), hi(v[0]), lo(v[1]), hi(v[1])],
        DType::I32 => unreachable!("the float kernels never see i32: callers dispatch on float slices only"),
    };
    // p[k][j] = a[8k + j] + a[8k + j + 4] (j < 4), in f64.
    let mut p = [_mm256_setzero_pd(); 4];
    for (p, &a) in p.iter_mut().zip(&oct) {
        *p = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(a)), _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(a)));
    }
    let s = _mm256_add_pd(_mm256_add_pd(p[0], p[1]), _mm256_add_pd(p[2], p[3]));
    let h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd::<1>(s));
    _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)))
}

/// Shortest run that `sum_runs` realigns (below, the permutes cost more than the split loads).
const MIN_ALIGNED_RUN: usize = 128;

/// Register position (`16·register + lane`) of `sum_runs`' lanes holding offset `j` (< 32)
/// within a 32-element step: `j` itself, or for bf16 (evens, odds) `16·(j & 1) + j / 2`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn pos_of<T: Element>(j: __m512i) -> __m512i {
    match T::DTYPE {
        DType::BF16 => _mm512_or_si512(
            _mm512_slli_epi32::<4>(_mm512_and_si512(j, _mm512_set1_epi32(1))),
            _mm512_srli_epi32::<1>(j),
        ),
        DType::F32 | DType::F16 => j,
        DType::I32 => unreachable!("the float kernels never see i32: callers dispatch on float slices only"),
    }
}

/// The offsets within a 32-element step held by the positions of register `r`: `16·r + lane`,
/// or for bf16 `2·lane + r`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn offsets<T: Element>(r: i32) -> __m512i {
    let lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    match T::DTYPE {
        DType::BF16 => _mm512_add_epi32(_mm512_slli_epi32::<1>(lane), _mm512_set1_epi32(r)),
        DType::F32 | DType::F16 => _mm512_add_epi32(lane, _mm512_set1_epi32(16 * r)),
        DType::I32 => unreachable!("the float kernels never see i32: callers dispatch on float slices only"),
    }
}

/// Permutes the two registers so that position p takes position `pos_of((offset(p) + s) mod 32)`.
/// With `s` = the shift of a step start, this moves the accumulators from the frame of steps at
/// run offsets ≡ 0 (mod 32) to the frame of steps at offsets ≡ s; with 32 − s, back.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn shift_frame<T: Element>(v: [__m512; 2], s: usize) -> [__m512; 2] {
    let s = _mm512_set1_epi32(s as i32);
    let m = _mm512_set1_epi32(31);
    let idx = |r: i32| pos_of::<T>(_mm512_and_si512(_mm512_add_epi32(offsets::<T>(r), s), m));
    [_mm512_permutex2var_ps(v[0], idx(0), v[1]), _mm512_permutex2var_ps(v[0], idx(1), v[1])]
}

/// One full step into the accumulators.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn step<const XMU: bool>(ad: &mut [__m512; 2], am: &mut [__m512; 2], a: [__m512; 2], b: [__m512; 2], mv: __m512) {
    for k in 0..2 {
        ad[k] = _mm512_add_ps(ad[k], a[k]);
        if XMU {
            am[k] = _mm512_fmadd_ps(a[k], _mm512_sub_ps(b[k], mv), am[k]);
        }
    }
}

/// The first `n` (< 32) elements of a step at `pd`/`px` into the accumulators (the other lanes
/// keep their bits).
///
/// # Safety
/// `pd..pd+n` (and `px..px+n` when `XMU`) readable; AVX-512 F/BW/VL available.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn partial_step<T: Element, const XMU: bool>(
    ad: &mut [__m512; 2],
    am: &mut [__m512; 2],
    pd: *const T,
    px: *const T,
    n: usize,
    mv: __m512,
) {
    // SAFETY: forwarded from the caller (masked loads of n elements).
    let (a, live) = unsafe { load32_partial(pd, n) };
    // SAFETY: as above, for `px`.
    let b = if XMU { unsafe { load32_partial(px, n).0 } } else { a };
    for k in 0..2 {
        ad[k] = _mm512_mask_add_ps(ad[k], live[k], ad[k], a[k]);
        if XMU {
            am[k] = _mm512_mask3_fmadd_ps(a[k], _mm512_sub_ps(b[k], mv), am[k], live[k]);
        }
    }
}

/// See `super::sum_runs`.
///
/// A long run whose dy start is not 64-byte aligned is summed as a head of `s` elements, then
/// 32-element steps from offset `s` (aligned loads: a 64-byte load across two cache lines costs
/// about twice as much from L2), then a tail. The steps from offset `s` put element `s + j` in the
/// register position of offset `j`, so the accumulators are permuted into that frame before them
/// and back after: every lane still sums the same elements in the same order.
///
/// # Safety
/// The CPU must support AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn sum_runs<T: Element, const XMU: bool>(call: RunsCall<'_, T, impl Runs>) -> (f64, f64) {
    let RunsCall { pf, dy, x, runs, mean } = call;
    let size = std::mem::size_of::<T>();
    let dist = PREFETCH_BYTES / size;
    let mv = _mm512_set1_ps(mean);
    let mut ad = [_mm512_setzero_ps(); 2];
    let mut am = [_mm512_setzero_ps(); 2];
    for (od, ox, len) in runs {
        let (d, xs) = (&dy[od..od + len], &x[ox..ox + len]);
        let (pd, px) = (d.as_ptr(), xs.as_ptr());
        // Elements before dy's next 64-byte boundary (< 32: 64-byte steps hold 16 f32 or 32 bf16).
        let s = if len >= MIN_ALIGNED_RUN { (pd as usize).wrapping_neg() % 64 / size } else { 0 };
        // SAFETY: the head reads 0..s < len and the tail i..len through masks; full steps read
        // i..i+32 ≤ len of `d` and `xs`; prefetches never fault; features from the caller.
        unsafe {
            if s > 0 {
                partial_step::<T, XMU>(&mut ad, &mut am, pd, px, s, mv);
                ad = shift_frame::<T>(ad, s);
                if XMU {
                    am = shift_frame::<T>(am, s);
                }
            }
            let mut i = s;
            while i + RUN_LANES <= len {
                if pf {
                    prefetch_dy_x!(pd, px, i + dist);
                }
                if pf && size == 4 {
                    prefetch_dy_x!(pd, px, i + dist + 16);
                }
                let a = load32(pd.add(i));
                let b = if XMU { load32(px.add(i)) } else { a };
                step::<XMU>(&mut ad, &mut am, a, b, mv);
                i += RUN_LANES;
            }
            if i < len {
                partial_step::<T, XMU>(&mut ad, &mut am, pd.add(i), px.add(i), len - i, mv);
            }
            if s > 0 {
                ad = shift_frame::<T>(ad, RUN_LANES - s);
                if XMU {
                    am = shift_frame::<T>(am, RUN_LANES - s);
                }
            }
        }
    }
    (fold::<T>(ad), if XMU { fold::<T>(am) } else { 0.0 })
}

/// See `super::acc_rows`; slices already cut to `len` lanes (`acc_m` empty unless `XMU`).
///
/// # Safety
/// The CPU must support AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn acc_rows<T: Element, const XMU: bool>(call: RowsCall<'_, T>) {
    let RowsCall { pf, dy, x, rows, len, mean, acc_d, acc_m } = call;
    let lanes = Lanes { mean, acc_d: acc_d as *mut [f32], acc_m: acc_m as *mut [f32], pf };
    // SAFETY: every row handed to `group` is a slice of exactly `len` elements (cut from
    // `dy`/`x` with bounds checks), the lane arrays hold `len` lanes; features from the caller.
    unsafe {
        match rows {
            Rows::Strided { d, x: x0, stride, count } => {
                let Some((rd, rx)) = strided_span((dy, x), (d, x0), stride, count, len) else { return };
                // Short rows of 2-byte elements (super-rows of 64 lanes): accumulators in
                // registers for the whole call. (f32 measured no better than `group` on main
                // memory, 0.92-0.97 of a streaming read against 1.00, so it keeps `group`.)
                if T::DTYPE == DType::BF16 {
                    match len {
                        32 => return in_registers_bf16::<T, XMU, 1>(rd, rx, stride, count, &lanes),
                        64 => return in_registers_bf16::<T, XMU, 2>(rd, rx, stride, count, &lanes),
                        _ => {}
                    }
                }
                // Rows of up to 64 lanes in registers. Wider rows are walked by columns of 128 (then
                // 64) lanes, `COLUMN_ROWS` rows at a time, accumulators in registers for each
                // pass: the store-and-reload `group` below ran [256, 1024] f32 (rows 4 KiB apart)
                // at 22 GB/s, columns at 39 (from L3; the loads wait on misses, see the README).
                let ahead = if stride == len { PREFETCH_BYTES / std::mem::size_of::<T>() } else { 8 * stride };
                if len > 64 && count > 1 {
                    let sub = COLUMN_ROWS;
                    let mut r0 = 0;
                    while r0 < count {
                        let n = sub.min(count - r0);
                        let (rd, rx) = (&rd[r0 * stride..], &rx[r0 * stride..]);
                        let mut j = 0;
                        while j + 128 <= len {
                            in_registers::<T, XMU, 8>(&rd[j..], &rx[j..], stride, n, &lanes.sub(j, 128), ahead);
                            j += 128;
                        }
                        while j + 64 <= len {
                            in_registers::<T, XMU, 4>(&rd[j..], &rx[j..], stride, n, &lanes.sub(j, 64), ahead);
                            j += 64;
                        }
                        if j < len {
                            let rest = lanes.sub(j, len - j);
                            let (rd, rx) = (&rd[j..], &rx[j..]);
                            let row = |k: usize| {
                                (&rd[k * stride..k * stride + len - j], &rx[k * stride..k * stride + len - j])
                            };
                            for k in 0..n {
                                group::<T, XMU, true, 1>([row(k)], &rest);
                            }
                        }
                        r0 += n;
                    }
                    return;
                }
                match len {
                    16 => return in_registers::<T, XMU, 1>(rd, rx, stride, count, &lanes, ahead),
                    32 => return in_registers::<T, XMU, 2>(rd, rx, stride, count, &lanes, ahead),
                    48 => return in_registers::<T, XMU, 3>(rd, rx, stride, count, &lanes, ahead),
                    64 => return in_registers::<T, XMU, 4>(rd, rx, stride, count, &lanes, ahead),
                    _ => {}
                }
                let row = |k: usize| (&rd[k * stride..k * stride + len], &rx[k * stride..k * stride + len]);
                let mut k = 0;
                while k + 4 <= count {
                    group::<T, XMU, true, 4>([row(k), row(k + 1), row(k + 2), row(k + 3)], &lanes);
                    k += 4;
                }
                while k < count {
                    group::<T, XMU, true, 1>([row(k)], &lanes);
                    k += 1;
                }
            }
            Rows::List(list) => {
                let row = |&(od, ox): &(usize, usize)| (&dy[od..od + len], &x[ox..ox + len]);
                let mut groups = list.chunks_exact(4);
                for g in &mut groups {
                    group::<T, XMU, false, 4>([row(&g[0]), row(&g[1]), row(&g[2]), row(&g[3])], &lanes);
                }
                for r in groups.remainder() {
                    group::<T, XMU, false, 1>([row(r)], &lanes);
                }
            }
        }
    }
}

/// Rows per pass of the column walk of wide rows (8-32 measured alike, all rows ~5% slower).
const COLUMN_ROWS: usize = 16;

impl Lanes<'_> {
    /// Lanes `j..j + n` (inside this set).
    fn sub(&self, j: usize, n: usize) -> Lanes<'_> {
        let cut = |p: *mut [f32]| std::ptr::slice_from_raw_parts_mut(p.cast::<f32>().wrapping_add(j), n);
        let empty = self.acc_m.len() == 0;
        Lanes {
            mean: &self.mean[j..j + n],
            acc_d: cut(self.acc_d),
            acc_m: if empty { self.acc_m } else { cut(self.acc_m) },
            pf: self.pf,
        }
    }
}

/// `count` rows of `len = 16·V` lanes, the k-th at `k·stride` of `rd` (dy) and `rx` (x), with
/// the accumulators and means held in registers from the first row to the last: the loop stores
/// nothing, so no accumulator store can delay a load (store forwarding, 4K aliasing with the
/// stream or the stack, line-split stores) and each row costs only its loads and arithmetic.
/// Each lane takes the rows in the same order with the same operations as `group`: same bits.
///
/// # Safety
/// `rd` and `rx` hold `(count − 1)·stride + len` elements; `l`'s arrays hold `len` lanes and
/// nothing else accesses them during the call; AVX-512 F/BW/VL available.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn in_registers<T: Element, const XMU: bool, const V: usize>(
    rd: &[T],
    rx: &[T],
    stride: usize,
    count: usize,
    l: &Lanes<'_>,
    ahead: usize,
) {
    let size = std::mem::size_of::<T>();
    let line = 64 / size;
    let (pa, pm, pmean) = (l.acc_d.cast::<f32>(), l.acc_m.cast::<f32>(), l.mean.as_ptr());
    let (pd, px) = (rd.as_ptr(), rx.as_ptr());
    // SAFETY: lane arrays hold 16·V lanes (loaded once, stored once); row k reads
    // k·stride .. k·stride + 16·V ≤ (count − 1)·stride + len of both slices; prefetches never fault.
    unsafe {
        let mut ad = [_mm512_setzero_ps(); V];
        let mut am = [_mm512_setzero_ps(); V];
        let mut mv = [_mm512_setzero_ps(); V];
        for v in 0..V {
            ad[v] = _mm512_loadu_ps(pa.add(16 * v));
            if XMU {
                am[v] = _mm512_loadu_ps(pm.add(16 * v));
                mv[v] = _mm512_loadu_ps(pmean.add(16 * v));
            }
        }
        for k in 0..count {
            let o = k * stride;
            // The rows are evenly spaced: prefetch `ahead` elements past this row's lanes.
            for q in (0..16 * V).step_by(line).filter(|_| l.pf) {
                prefetch_dy_x!(pd, px, o + ahead + q);
            }
            for v in 0..V {
                let a = load16(pd.add(o + 16 * v));
                ad[v] = _mm512_add_ps(ad[v], a);
                if XMU {
                    am[v] = _mm512_fmadd_ps(a, _mm512_sub_ps(load16(px.add(o + 16 * v)), mv[v]), am[v]);
                }
            }
        }
        for v in 0..V {
            _mm512_storeu_ps(pa.add(16 * v), ad[v]);
            if XMU {
                _mm512_storeu_ps(pm.add(16 * v), am[v]);
            }
        }
    }
}

/// As `in_registers` for bf16 rows of `32·U` lanes, loading 32 elements (64 bytes) at a time
/// and widening them as (even, odd) lanes (two ALU ops per 32 elements): the accumulators and
/// means are permuted into that (even, odd) order once before the rows and back once after.
///
/// # Safety
/// As `in_registers` (with `len = 32·U`); `T` is bf16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn in_registers_bf16<T: Element, const XMU: bool, const U: usize>(
    rd: &[T],
    rx: &[T],
    stride: usize,
    count: usize,
    l: &Lanes<'_>,
) {
    let size = std::mem::size_of::<T>();
    let dist = PREFETCH_BYTES / size;
    let (pa, pm, pmean) = (l.acc_d.cast::<f32>(), l.acc_m.cast::<f32>(), l.mean.as_ptr());
    let (pd, px) = (rd.as_ptr(), rx.as_ptr());
    let lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    // (lo, hi) = lanes 0..16, 16..32 of a unit → evens (2i) and odds (2i + 1).
    let to_eo = [_mm512_slli_epi32::<1>(lane), _mm512_add_epi32(_mm512_slli_epi32::<1>(lane), _mm512_set1_epi32(1))];
    // (evens, odds) → lane i of lo (i < 16) / hi (16 + i): even lanes from evens, odd from odds.
    let odd16 = _mm512_slli_epi32::<4>(_mm512_and_si512(lane, _mm512_set1_epi32(1)));
    let half = _mm512_srli_epi32::<1>(lane);
    let from_eo = [_mm512_or_si512(odd16, half), _mm512_or_si512(odd16, _mm512_add_epi32(half, _mm512_set1_epi32(8)))];
    let load_eo = |p: *const f32| {
        // SAFETY: p..p+32 inside a lane array (caller's contract).
        let (lo, hi) = unsafe { (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))) };
        [_mm512_permutex2var_ps(lo, to_eo[0], hi), _mm512_permutex2var_ps(lo, to_eo[1], hi)]
    };
    let store_eo = |p: *mut f32, v: [__m512; 2]| {
        // SAFETY: as above.
        unsafe {
            _mm512_storeu_ps(p, _mm512_permutex2var_ps(v[0], from_eo[0], v[1]));
            _mm512_storeu_ps(p.add(16), _mm512_permutex2var_ps(v[0], from_eo[1], v[1]));
        }
    };
    // SAFETY: lane arrays hold 32·U lanes; row k reads k·stride .. k·stride + 32·U of both
    // slices; prefetches never fault.
    unsafe {
        let z = [_mm512_setzero_ps(); 2];
        let (mut ad, mut am, mut mv) = ([z; U], [z; U], [z; U]);
        for u in 0..U {
            ad[u] = load_eo(pa.add(32 * u));
            if XMU {
                am[u] = load_eo(pm.add(32 * u));
                mv[u] = load_eo(pmean.add(32 * u));
            }
        }
        for k in 0..count {
            let o = k * stride;
            for u in (0..U).filter(|_| l.pf) {
                prefetch_dy_x!(pd, px, o + dist + 32 * u);
            }
            for u in 0..U {
                let a = bf16_even_odd(_mm512_loadu_si512(pd.add(o + 32 * u).cast::<__m512i>()));
                let b = if XMU { bf16_even_odd(_mm512_loadu_si512(px.add(o + 32 * u).cast::<__m512i>())) } else { a };
                for h in 0..2 {
                    ad[u][h] = _mm512_add_ps(ad[u][h], a[h]);
                    if XMU {
                        am[u][h] = _mm512_fmadd_ps(a[h], _mm512_sub_ps(b[h], mv[u][h]), am[u][h]);
                    }
                }
            }
        }
        for u in 0..U {
            store_eo(pa.add(32 * u), ad[u]);
            if XMU {
                store_eo(pm.add(32 * u), am[u]);
            }
        }
    }
}

/// The per-lane state of an `acc_rows` call (raw pointers: `group` writes through them).
struct Lanes<'a> {
    mean: &'a [f32],
    acc_d: *mut [f32],
    acc_m: *mut [f32],
    /// Software prefetches on.
    pf: bool,
}

/// `N` rows into the lanes: per 16 lanes, the accumulators are loaded once, take the rows in
/// order, and are stored once; the last `len % 16` lanes through masks. `EVEN`: rows evenly
/// spaced (prefetch ahead of the first row, which covers the next rows too), else every row
/// prefetches its own lines.
///
/// # Safety
/// Each row slice holds `len` = `l.mean.len()` elements, as do `l.acc_d` and (when `XMU`)
/// `l.acc_m`, which nothing else accesses during the call; AVX-512 F/BW/VL available.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn group<T: Element, const XMU: bool, const EVEN: bool, const N: usize>(r: [(&[T], &[T]); N], l: &Lanes<'_>) {
    let size = std::mem::size_of::<T>();
    let dist = PREFETCH_BYTES / size;
    let line = 64 / size;
    let len = l.mean.len();
    let pd: [*const T; N] = std::array::from_fn(|k| r[k].0.as_ptr());
    let px: [*const T; N] = std::array::from_fn(|k| r[k].1.as_ptr());
    let (pa, pm, pmean) = (l.acc_d.cast::<f32>(), l.acc_m.cast::<f32>(), l.mean.as_ptr());
    // SAFETY: full vectors cover j..j+16 ≤ len of every row and lane array; the partial last
    // vector loads and stores only lanes j..len through masks; prefetches never fault.
    unsafe {
        let mut j = 0;
        while j + 16 <= len {
            if N == 1 || !l.pf {
                // A lone row (at most 3 per call), or prefetches off.
            } else if EVEN {
                // The N rows span N·len elements; walk that span at N elements per lane.
                // Each step consumes 16·N elements of that span: one prefetch per line of them.
                let ahead = N * j + dist;
                for q in (0..16 * N).step_by(line) {
                    prefetch_dy_x!(pd[0], px[0], ahead + q);
                }
            } else if j % line < 16 {
                // A new line of each row (16 lanes are a line of f32, half a line of f16/bf16).
                for k in 0..N {
                    prefetch_dy_x!(pd[k], px[k], j + dist);
                }
            }
            let mut a = [_mm512_setzero_ps(); N];
            for k in 0..N {
                a[k] = load16(pd[k].add(j));
            }
            let mut s = _mm512_loadu_ps(pa.add(j));
            for v in a {
                s = _mm512_add_ps(s, v);
            }
            _mm512_storeu_ps(pa.add(j), s);
            if XMU {
                let mv = _mm512_loadu_ps(pmean.add(j));
                let mut t = _mm512_loadu_ps(pm.add(j));
                for k in 0..N {
                    t = _mm512_fmadd_ps(a[k], _mm512_sub_ps(load16(px[k].add(j)), mv), t);
                }
                _mm512_storeu_ps(pm.add(j), t);
            }
            j += 16;
        }
        if j < len {
            masked::<T, XMU, N>(pd, px, l, j, mask16(len - j));
        }
    }
}

/// The lanes `j + k` (bit k of `m` set) of `N` rows into the lanes, through masks (as `group`).
///
/// # Safety
/// Lanes `j + k` selected by `m` are inside every row and lane array of `group`'s contract.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn masked<T: Element, const XMU: bool, const N: usize>(
    pd: [*const T; N],
    px: [*const T; N],
    l: &Lanes<'_>,
    j: usize,
    m: __mmask16,
) {
    let (pa, pm, pmean) = (l.acc_d.cast::<f32>(), l.acc_m.cast::<f32>(), l.mean.as_ptr());
    // SAFETY: masked loads and stores touch only the selected lanes, which the caller guarantees
    // in bounds; j ≤ len keeps every `add(j)` inside (or one past) its slice.
    unsafe {
        let mut a = [_mm512_setzero_ps(); N];
        for k in 0..N {
            a[k] = load16_masked(pd[k].add(j), m);
        }
        let mut s = _mm512_maskz_loadu_ps(m, pa.add(j));
        for v in a {
            s = _mm512_add_ps(s, v);
        }
        _mm512_mask_storeu_ps(pa.add(j), m, s);
        if XMU {
            let mv = _mm512_maskz_loadu_ps(m, pmean.add(j));
            let mut t = _mm512_maskz_loadu_ps(m, pm.add(j));
            for k in 0..N {
                t = _mm512_fmadd_ps(a[k], _mm512_sub_ps(load16_masked(px[k].add(j), m), mv), t);
            }
            _mm512_mask_storeu_ps(pm.add(j), m, t);
        }
    }
}
