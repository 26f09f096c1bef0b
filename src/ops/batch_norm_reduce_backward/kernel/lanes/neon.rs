//! The block primitives on aarch64 Advanced SIMD (NEON, in every aarch64 CPU the target
//! supports): 128-bit vectors of 4 f32 lanes, `fadd`/`fmla` per lane. Bit-identical to the
//! portable code: each element goes to the lane `lane_of` gives (bf16 split into even and odd
//! elements exactly as the x86 code does), each lane takes its values in order with the same
//! operations (`fmla` is the fused multiply-add of `f32::mul_add`), and the lanes are folded by
//! the same `fold32`. A run's last partial step goes lane by lane through the accumulators'
//! array, as in the portable code.

use std::arch::aarch64::*;

use super::{fold32, lane_of, Rows, RowsCall, Runs, RunsCall, RUN_LANES};
use crate::cpu::isa::Isa;
use crate::cpu::widen::{widen, widen_ref};
use crate::dtype::{Element, SliceRef};

/// Vectors of [`RUN_LANES`] lanes.
const VECS: usize = RUN_LANES / 4;

/// Four elements `s[..4]` widened to f32, in order.
#[inline]
#[target_feature(enable = "neon")]
fn load4<T: Element>(s: &[T]) -> float32x4_t {
    let s = &s[..4];
    match T::slice_ref(s) {
        // SAFETY: `s` holds 4 elements (the slicing above checks it); NEON is in the target's
        // baseline. Unaligned loads.
        SliceRef::F32(v) => unsafe { vld1q_f32(v.as_ptr()) },
        // SAFETY: as above; `bf16` is a transparent `u16`. The bits shifted up are the f32.
        SliceRef::BF16(v) => unsafe { vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(v.as_ptr().cast::<u16>()))) },
        other => {
            let mut b = [0f32; 4];
            widen_ref(Isa::Neon, other, &mut b);
            // SAFETY: `b` holds 4 f32.
            unsafe { vld1q_f32(b.as_ptr()) }
        }
    }
}

/// 32 elements `s[..32]` widened to f32 and placed in lane order (`lane_of`): in order, except
/// bf16, whose 16-element units go as (8 even elements, 8 odd ones).
#[inline]
#[target_feature(enable = "neon")]
fn load32<T: Element>(s: &[T]) -> [float32x4_t; VECS] {
    let s = &s[..RUN_LANES];
    match T::slice_ref(s) {
        SliceRef::BF16(v) => {
            let p = v.as_ptr().cast::<u16>();
            let hi = vdupq_n_u32(0xFFFF_0000);
            let mut out = [vdupq_n_f32(0.0); VECS];
            for u in 0..2 {
                // SAFETY: elements 16·u .. 16·u + 16 lie inside the 32 of `s`; `bf16` is a
                // transparent `u16`; unaligned loads. Each 32-bit word holds an even element in
                // its low half and the next odd one in its high half.
                let (q0, q1) = unsafe {
                    (
                        vreinterpretq_u32_u16(vld1q_u16(p.add(16 * u))),
                        vreinterpretq_u32_u16(vld1q_u16(p.add(16 * u + 8))),
                    )
                };
                out[4 * u] = vreinterpretq_f32_u32(vshlq_n_u32::<16>(q0));
                out[4 * u + 1] = vreinterpretq_f32_u32(vshlq_n_u32::<16>(q1));
                out[4 * u + 2] = vreinterpretq_f32_u32(vandq_u32(q0, hi));
                out[4 * u + 3] = vreinterpretq_f32_u32(vandq_u32(q1, hi));
            }
            out
        }
        _ => std::array::from_fn(|k| load4(&s[4 * k..])),
    }
}

/// The lanes as an array.
#[inline]
#[target_feature(enable = "neon")]
fn to_array(v: &[float32x4_t; VECS]) -> [f32; RUN_LANES] {
    let mut a = [0f32; RUN_LANES];
    for (k, v) in v.iter().enumerate() {
        // SAFETY: 4·k + 4 ≤ 32 = a.len().
        unsafe { vst1q_f32(a.as_mut_ptr().add(4 * k), *v) };
    }
    a
}

/// The lanes from an array.
#[inline]
#[target_feature(enable = "neon")]
fn from_array(a: &[f32; RUN_LANES]) -> [float32x4_t; VECS] {
    // SAFETY: 4·k + 4 ≤ 32 = a.len().
    std::array::from_fn(|k| unsafe { vld1q_f32(a.as_ptr().add(4 * k)) })
}

/// See `super::sum_runs`.
#[target_feature(enable = "neon")]
pub(super) fn sum_runs<T: Element, const XMU: bool>(call: RunsCall<'_, T, impl Runs>) -> (f64, f64) {
    let RunsCall { dy, x, runs, mean, .. } = call;
    let lane: [usize; RUN_LANES] = std::array::from_fn(|i| lane_of(T::DTYPE, i));
    let mv = vdupq_n_f32(mean);
    let mut ad = [vdupq_n_f32(0.0); VECS];
    let mut am = [vdupq_n_f32(0.0); VECS];
    for (od, ox, len) in runs {
        let (d, xs) = (&dy[od..od + len], &x[ox..ox + len]);
        let (mut dc, mut xc) = (d.chunks_exact(RUN_LANES), xs.chunks_exact(RUN_LANES));
        for (a, b) in (&mut dc).zip(&mut xc) {
            let va = load32(a);
            let vb = if XMU { load32(b) } else { va };
            for k in 0..VECS {
                ad[k] = vaddq_f32(ad[k], va[k]);
                if XMU {
                    am[k] = vfmaq_f32(am[k], va[k], vsubq_f32(vb[k], mv));
                }
            }
        }
        let (rd, rx) = (dc.remainder(), xc.remainder());
        if !rd.is_empty() {
            // The partial last step, lane by lane as the portable code does it.
            let (mut sd, mut sm) = (to_array(&ad), to_array(&am));
            let mut bd = [0f32; RUN_LANES];
            widen(Isa::Neon, rd, &mut bd);
            for (j, &v) in bd.iter().enumerate().take(rd.len()) {
                sd[lane[j]] += v;
            }
            if XMU {
                let mut bx = [0f32; RUN_LANES];
                widen(Isa::Neon, rx, &mut bx);
                for j in 0..rd.len() {
                    sm[lane[j]] = bd[j].mul_add(bx[j] - mean, sm[lane[j]]);
                }
            }
            (ad, am) = (from_array(&sd), from_array(&sm));
        }
    }
    (fold32(&to_array(&ad)), if XMU { fold32(&to_array(&am)) } else { 0.0 })
}

/// See `super::acc_rows`; slices already cut to `len` lanes (`acc_m` empty unless `XMU`).
#[target_feature(enable = "neon")]
pub(super) fn acc_rows<T: Element, const XMU: bool>(call: RowsCall<'_, T>) {
    let RowsCall { dy, x, rows, len, mean, acc_d, acc_m, .. } = call;
    match rows {
        Rows::Strided { d, x: x0, stride, count } => {
            for k in 0..count {
                let (od, ox) = (d + k * stride, x0 + k * stride);
                row::<T, XMU>(&dy[od..od + len], &x[ox..ox + len], mean, acc_d, acc_m);
            }
        }
        Rows::List(list) => {
            for &(od, ox) in list {
                row::<T, XMU>(&dy[od..od + len], &x[ox..ox + len], mean, acc_d, acc_m);
            }
        }
    }
}

/// One row `d` (and `xs`) of `len = d.len()` lanes into the accumulators.
#[inline]
#[target_feature(enable = "neon")]
fn row<T: Element, const XMU: bool>(d: &[T], xs: &[T], mean: &[f32], acc_d: &mut [f32], acc_m: &mut [f32]) {
    let len = d.len();
    let nv = len / 4 * 4;
    let mut j = 0;
    while j < nv {
        let a = load4(&d[j..]);
        let pa = &mut acc_d[j..j + 4];
        // SAFETY: `pa` holds 4 f32 (the slicing checks it).
        unsafe { vst1q_f32(pa.as_mut_ptr(), vaddq_f32(vld1q_f32(pa.as_ptr()), a)) };
        if XMU {
            let xm = vsubq_f32(load4(&xs[j..]), load4(&mean[j..]));
            let pm = &mut acc_m[j..j + 4];
            // SAFETY: as above.
            unsafe { vst1q_f32(pm.as_mut_ptr(), vfmaq_f32(vld1q_f32(pm.as_ptr()), a, xm)) };
        }
        j += 4;
    }
    // The last lanes (< 4), widened as the portable code widens them.
    let (mut bd, mut bx) = ([0f32; 4], [0f32; 4]);
    widen(Isa::Neon, &d[nv..], &mut bd);
    if XMU {
        widen(Isa::Neon, &xs[nv..], &mut bx);
    }
    for (k, j) in (nv..len).enumerate() {
        acc_d[j] += bd[k];
        if XMU {
            acc_m[j] = bd[k].mul_add(bx[k] - mean[j], acc_m[j]);
        }
    }
}
