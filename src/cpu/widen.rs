//! The one slice widening of the CPU kernels: f32, f16, bf16 (and i32) values into f32, exactly.
//!
//! Every kernel that cannot convert in registers as it reads (the stats kernel's buffers, the
//! channel-wise maps' blocks, the reduce-backward kernel's portable path) widens through here.
//! f16 takes F16C on x86-64 (8 values per instruction; also on AVX-512 CPUs, where the 512-bit
//! conversion measured slower), bf16 is a 16-bit shift that the compiler vectorises for the
//! chosen instruction set. The conversions are exact, so every [`Isa`] gives the same bits.

use half::slice::HalfFloatSliceExt;

use super::isa::Isa;
use crate::dtype::{Element, SliceRef};

/// Widens `src` into `dst[..src.len()]` with the instruction set `isa`. `dst` must hold at least
/// `src.len()` values (only that many are written).
#[inline]
pub(crate) fn widen<T: Element>(isa: Isa, src: &[T], dst: &mut [f32]) {
    widen_ref(isa, T::slice_ref(src), dst)
}

/// [`widen`] of a slice of any element type.
#[inline]
pub(crate) fn widen_ref(isa: Isa, src: SliceRef<'_>, dst: &mut [f32]) {
    match src {
        SliceRef::F32(s) => dst[..s.len()].copy_from_slice(s),
        SliceRef::F16(s) => f16(isa, s, &mut dst[..s.len()]),
        SliceRef::BF16(s) => bf16(isa, s, &mut dst[..s.len()]),
        // Exact up to 2^24. Validation rejects i32 input to the float operators; this keeps the
        // kernels total over every element type.
        SliceRef::I32(s) => dst.iter_mut().zip(s).for_each(|(d, &v)| *d = v as f32),
    }
}

/// f16 → f32, `s.len() == d.len()`.
#[inline]
fn f16(isa: Isa, s: &[half::f16], d: &mut [f32]) {
    match isa {
        // `half`'s slice conversion, which takes the CPU's conversion instructions where it has
        // them (F16C on x86-64, FP16 on aarch64), else converts in software: exact either way.
        Isa::Portable => s.convert_to_f32_slice(d),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => s.convert_to_f32_slice(d),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only produced after checking AVX2 and F16C.
        Isa::Avx2 | Isa::Avx512 => unsafe { x86::f16_f16c(s, d) },
    }
}

/// f32 → f16 rounded to nearest even (NaN stays NaN, quietened), `s.len() == d.len()`: the
/// bits of `f16::from_f32`.
#[inline]
pub(crate) fn narrow_f16(isa: Isa, s: &[f32], d: &mut [half::f16]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only produced after checking AVX2 and F16C.
        Isa::Avx2 | Isa::Avx512 => unsafe { x86::narrow_f16c(s, d) },
        _ => d.convert_from_f32_slice(s),
    }
}

/// bf16 → f32 (the bits shifted up), `s.len() == d.len()`.
#[inline]
fn bf16(isa: Isa, s: &[half::bf16], d: &mut [f32]) {
    match isa {
        Isa::Portable => bf16_any(s, d),
        // NEON is in the aarch64 baseline: the loop compiles to `ushll`/`shl` on 128-bit vectors.
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => bf16_any(s, d),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only produced after checking AVX2.
        Isa::Avx2 => unsafe { x86::bf16_avx2(s, d) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` is only produced after checking AVX-512 F/BW/VL.
        Isa::Avx512 => unsafe { x86::bf16_avx512(s, d) },
    }
}

/// The bf16 shift as a plain loop (vectorised by the compiler for the enclosing features).
#[inline(always)]
fn bf16_any(s: &[half::bf16], d: &mut [f32]) {
    for (d, s) in d.iter_mut().zip(s) {
        *d = f32::from_bits(u32::from(s.to_bits()) << 16);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_storeu_ps, _mm_loadu_si128,
        _mm_storeu_si128, _MM_FROUND_TO_NEAREST_INT,
    };

    /// f32 → f16 with F16C (round to nearest even), 8 values per step, then one by one.
    ///
    /// # Safety
    /// The CPU must support AVX and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn narrow_f16c(s: &[f32], d: &mut [half::f16]) {
        let n = s.len().min(d.len());
        let (ps, pd) = (s.as_ptr(), d.as_mut_ptr());
        let mut i = 0;
        // SAFETY: every access is at i + 8 ≤ n: 8 f32 readable from `s` and 8 f16 (16 bytes)
        // writable in `d` there; unaligned loads and stores.
        unsafe {
            while i + 8 <= n {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(ps.add(i)));
                _mm_storeu_si128(pd.add(i).cast::<__m128i>(), h);
                i += 8;
            }
        }
        for (d, &s) in d[i..n].iter_mut().zip(&s[i..n]) {
            *d = half::f16::from_f32(s);
        }
    }

    /// f16 → f32 with F16C, 32 values per step, then 8, then one by one.
    ///
    /// # Safety
    /// The CPU must support AVX and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn f16_f16c(s: &[half::f16], d: &mut [f32]) {
        let n = s.len().min(d.len());
        let (ps, pd) = (s.as_ptr(), d.as_mut_ptr());
        let mut i = 0;
        // SAFETY: every access below is at i + 8·k + 8 ≤ n, so 8 f16 (16 bytes) are readable from
        // `s` and 8 f32 writable in `d` there; the loads and stores are unaligned ones.
        unsafe {
            while i + 32 <= n {
                let h: [__m128i; 4] = std::array::from_fn(|k| _mm_loadu_si128(ps.add(i + 8 * k).cast::<__m128i>()));
                for (k, h) in h.into_iter().enumerate() {
                    _mm256_storeu_ps(pd.add(i + 8 * k), _mm256_cvtph_ps(h));
                }
                i += 32;
            }
            while i + 8 <= n {
                _mm256_storeu_ps(pd.add(i), _mm256_cvtph_ps(_mm_loadu_si128(ps.add(i).cast::<__m128i>())));
                i += 8;
            }
        }
        for (d, s) in d[i..n].iter_mut().zip(&s[i..n]) {
            *d = s.to_f32();
        }
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn bf16_avx2(s: &[half::bf16], d: &mut [f32]) {
        super::bf16_any(s, d)
    }

    /// # Safety
    /// The CPU must support AVX-512 F and BW (and AVX2).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
    pub(super) unsafe fn bf16_avx512(s: &[half::bf16], d: &mut [f32]) {
        super::bf16_any(s, d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{bf16, f16};

    /// The index and both bit patterns of the first difference, if any.
    fn first_diff(got: &[f32], want: &[f32]) -> Option<(usize, u32, u32)> {
        got.iter()
            .zip(want)
            .enumerate()
            .find(|(_, (g, w))| g.to_bits() != w.to_bits())
            .map(|(i, (g, w))| (i, g.to_bits(), w.to_bits()))
    }

    /// f16 as `half` widens it; bf16 as its bits shifted up (exact, NaN payloads kept).
    fn want_f16(h: &[f16]) -> Vec<f32> {
        h.iter().map(|v| v.to_f32()).collect()
    }
    fn want_bf16(b: &[bf16]) -> Vec<f32> {
        b.iter().map(|v| f32::from_bits(u32::from(v.to_bits()) << 16)).collect()
    }

    /// f32 → f16 gives `f16::from_f32`'s bits on every instruction set and length (ties, the
    /// overflow boundary, subnormals, NaN and random bit patterns).
    #[test]
    fn narrowing_to_f16_is_from_f32_on_every_isa() {
        let mut x = 0x2545_F491u32;
        let values: Vec<f32> = [0.0f32, -0.0, 1.0, 65504.0, 65520.0, 1e-8, -6e-8, f32::INFINITY, f32::NAN]
            .into_iter()
            .chain((0..5000).map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                f32::from_bits(x)
            }))
            .collect();
        let want: Vec<u16> = values.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
        for isa in Isa::supported() {
            for len in [0, 1, 7, 8, 9, 31, values.len()] {
                let mut got = vec![f16::ZERO; len];
                narrow_f16(isa, &values[..len], &mut got);
                let got: Vec<u16> = got.iter().map(|h| h.to_bits()).collect();
                assert_eq!(got, want[..len], "{isa:?}, {len} values");
            }
        }
    }

    /// Every instruction set widens every f16 and bf16 bit pattern exactly, at every length and
    /// alignment (the vector bodies and the scalar tails).
    #[test]
    fn exact_on_every_isa_length_and_offset() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let h: Vec<f16> = all.iter().map(|&b| f16::from_bits(b)).collect();
        let b: Vec<bf16> = all.iter().map(|&b| bf16::from_bits(b)).collect();
        for isa in Isa::supported() {
            let mut d = vec![0f32; all.len()];
            widen(isa, &h, &mut d);
            assert_eq!(first_diff(&d, &want_f16(&h)), None, "{isa:?} f16");
            widen(isa, &b, &mut d);
            assert_eq!(first_diff(&d, &want_bf16(&b)), None, "{isa:?} bf16");
            for start in 0..9 {
                for len in 0..80 {
                    let (h, b) = (&h[1000 + start..1000 + start + len], &b[1000 + start..1000 + start + len]);
                    let mut d = vec![-1f32; len + 3];
                    widen(isa, h, &mut d);
                    assert_eq!(first_diff(&d[..len], &want_f16(h)), None, "{isa:?} f16 {start}+{len}");
                    assert!(d[len..].iter().all(|&v| v == -1.0), "wrote past the values");
                    widen(isa, b, &mut d);
                    assert_eq!(first_diff(&d[..len], &want_bf16(b)), None, "{isa:?} bf16 {start}+{len}");
                }
            }
            let (f, i) = ([1.5f32, -0.0, f32::NAN], [3i32, -7, 1 << 24]);
            let mut d = [0f32; 3];
            widen(isa, &f, &mut d);
            assert_eq!(first_diff(&d, &f), None);
            widen(isa, &i, &mut d);
            assert_eq!(d, [3.0, -7.0, 16_777_216.0]);
        }
    }
}
