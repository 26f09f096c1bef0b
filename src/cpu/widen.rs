//! The one slice widening of the CPU kernels: f32, f16, bf16 (and i32) values into f32, exactly,
//! and the block conversions of the channel-wise maps.
//!
//! Every kernel that cannot convert in registers as it reads (the stats kernel's buffers, the
//! channel-wise maps' short blocks, the reduce-backward kernel's portable path) widens through
//! here. f16 takes F16C on x86-64 (8 values per instruction; also on AVX-512 CPUs, where the
//! 512-bit conversion measured slower on AMD Zen 4), bf16 is a 16-bit shift that the compiler
//! vectorises for the chosen instruction set. [`widen_lanes`] and [`narrow_lanes`] convert a
//! whole block of a map with explicit vector code of the kernel's own width (see [`LANES`]). The
//! conversions are exact (narrowing: round to nearest even), so every [`Isa`] gives the same bits.

use half::slice::HalfFloatSliceExt;

use super::isa::Isa;
use crate::dtype::{Element, SliceMut, SliceRef};

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

/// Values per call of [`widen_lanes`] and [`narrow_lanes`]: a block of the channel-wise maps.
/// A kernel widens a block into an array, computes on it and narrows it back; these conversions
/// store and load whole vectors of the kernel's own width (16 f32 on AVX-512, 8 on AVX2), so the
/// kernel's vector loads of the array are forwarded from stores of their own size (a 512-bit
/// load over two 256-bit stores stalls until they leave the store buffer), and bf16 is converted
/// by explicit vector code rather than by a loop the compiler may leave scalar. Measured on an
/// Intel Xeon (AVX-512, 2 vCPUs) one layer step of f16 `[8,256,28,28]`, one thread: 1.85-1.97 ms
/// with the slice conversions, 1.60 ms with these (bf16 1.75-1.80 → 1.61 ms).
pub(crate) const LANES: usize = 256;

/// `$avx2` or `$avx512` (x86-64 lane functions, `unsafe` for their CPU features) for those sets,
/// else `$other`.
macro_rules! by_isa {
    ($isa:expr, $avx2:expr, $avx512:expr, $other:expr) => {
        match $isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only produced after checking AVX2, FMA and F16C.
            Isa::Avx2 => unsafe { $avx2 },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx512` is only produced after checking AVX-512 F/BW/VL on top of those.
            Isa::Avx512 => unsafe { $avx512 },
            _ => $other,
        }
    };
}

/// Widens the [`LANES`] values of `src` from `pos` into `out`, exactly (the bits of [`widen`]).
/// Meant to be inlined into a kernel built for `isa`.
#[inline(always)]
pub(crate) fn widen_lanes(isa: Isa, src: SliceRef<'_>, pos: usize, out: &mut [f32; LANES]) {
    match src {
        SliceRef::F32(s) => out.copy_from_slice(&s[pos..pos + LANES]),
        SliceRef::F16(s) => {
            let s = &s[pos..pos + LANES];
            // Elsewhere `half`'s slice conversion (hardware conversions where it finds them).
            by_isa!(isa, x86::f16_lanes_avx2(s, out), x86::f16_lanes_avx512(s, out), s.convert_to_f32_slice(out))
        }
        SliceRef::BF16(s) => {
            let s = &s[pos..pos + LANES];
            by_isa!(isa, x86::bf16_lanes_avx2(s, out), x86::bf16_lanes_avx512(s, out), bf16_any(s, out))
        }
        SliceRef::I32(s) => out.iter_mut().zip(&s[pos..pos + LANES]).for_each(|(o, &v)| *o = v as f32),
    }
}

/// Narrows `v` into `out` from `pos`, [`LANES`] values: f16 and bf16 rounded to nearest even
/// (NaN stays NaN, quietened: the bits of `f16::from_f32` and [`bf16_bits`]), i32 rounded half
/// away from zero. Meant to be inlined into a kernel built for `isa`.
#[inline(always)]
pub(crate) fn narrow_lanes(isa: Isa, v: &[f32; LANES], out: &mut SliceMut<'_>, pos: usize) {
    match out {
        SliceMut::F32(s) => s[pos..pos + LANES].copy_from_slice(v),
        SliceMut::F16(s) => {
            let d = &mut s[pos..pos + LANES];
            by_isa!(
                isa,
                x86::narrow_f16_lanes_avx2(v, d),
                x86::narrow_f16_lanes_avx512(v, d),
                d.convert_from_f32_slice(v)
            )
        }
        SliceMut::BF16(s) => {
            let d = &mut s[pos..pos + LANES];
            let other =
                |d: &mut [half::bf16]| d.iter_mut().zip(v).for_each(|(o, &v)| *o = half::bf16::from_bits(bf16_bits(v)));
            by_isa!(isa, x86::narrow_bf16_lanes_avx2(v, d), x86::narrow_bf16_lanes_avx512(v, d), other(d))
        }
        SliceMut::I32(s) => s[pos..pos + LANES].iter_mut().zip(v).for_each(|(o, &v)| *o = v.round() as i32),
    }
}

/// `v` rounded to nearest even into bf16 bits (NaN stays NaN, quietened), as `bf16::from_f32`
/// does but without branches, so that loops over it vectorise.
#[inline(always)]
pub(crate) fn bf16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    let rounded = (x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16) as u16;
    let nan = ((x >> 16) | 0x40) as u16;
    if x & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        rounded
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
    use super::LANES;
    use std::arch::x86_64::{
        __m128i, __m256i, __m512i, _mm256_add_epi32, _mm256_and_si256, _mm256_blendv_epi8, _mm256_cmpgt_epi32,
        _mm256_cvtepu16_epi32, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_loadu_si256, _mm256_or_si256,
        _mm256_packus_epi32, _mm256_permute4x64_epi64, _mm256_set1_epi32, _mm256_slli_epi32, _mm256_srli_epi32,
        _mm256_storeu_ps, _mm256_storeu_si256, _mm512_add_epi32, _mm512_and_si512, _mm512_cmpgt_epi32_mask,
        _mm512_cvtepi32_epi16, _mm512_cvtepu16_epi32, _mm512_cvtph_ps, _mm512_cvtps_ph, _mm512_loadu_ps,
        _mm512_loadu_si512, _mm512_mask_blend_epi32, _mm512_or_si512, _mm512_set1_epi32, _mm512_slli_epi32,
        _mm512_srli_epi32, _mm512_storeu_ps, _mm512_storeu_si512, _mm_loadu_si128, _mm_storeu_si128, _MM_FROUND_NO_EXC,
        _MM_FROUND_TO_NEAREST_INT,
    };

    /// `$name(s, d)`: [`LANES`] values of `s` converted into `d`, `$w` at a time by `$step(p, q)`
    /// (convert the `$w` values at `p`, store them at `q`), each with one vector store of the
    /// kernel's width. `unsafe`: the CPU must support `$needs`.
    macro_rules! lanes_fn {
        ($(#[$doc:meta])* $name:ident($s:ty => $d:ty), $w:literal, $needs:literal, $step:expr) => {
            $(#[$doc])*
            ///
            /// # Safety
            #[doc = concat!("The CPU must support ", $needs, ".")]
            #[inline(always)]
            pub(super) unsafe fn $name(s: &[$s], d: &mut [$d]) {
                let (s, d) = (&s[..LANES], &mut d[..LANES]);
                for k in (0..LANES).step_by($w) {
                    // SAFETY: k + $w ≤ LANES: $w values readable from `s` and writable in `d`
                    // at k (unaligned accesses); the CPU features from the caller.
                    unsafe { $step(s.as_ptr().add(k), d.as_mut_ptr().add(k)) }
                }
            }
        };
    }

    lanes_fn!(
        /// f16 to f32, 8 per F16C conversion.
        f16_lanes_avx2(half::f16 => f32), 8, "AVX2 and F16C",
        |p: *const half::f16, q: *mut f32| _mm256_storeu_ps(q, _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>())))
    );
    lanes_fn!(
        /// f16 to f32, 16 per AVX-512 conversion.
        f16_lanes_avx512(half::f16 => f32), 16, "AVX-512 F",
        |p: *const half::f16, q: *mut f32| _mm512_storeu_ps(q, _mm512_cvtph_ps(_mm256_loadu_si256(p.cast::<__m256i>())))
    );
    lanes_fn!(
        /// bf16 to f32 (zero-extended, shifted up), 8 per AVX2 vector.
        bf16_lanes_avx2(half::bf16 => f32), 8, "AVX2",
        |p: *const half::bf16, q: *mut f32| {
            let w = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast::<__m128i>())));
            _mm256_storeu_si256(q.cast::<__m256i>(), w)
        }
    );
    lanes_fn!(
        /// bf16 to f32 (zero-extended, shifted up), 16 per AVX-512 vector.
        bf16_lanes_avx512(half::bf16 => f32), 16, "AVX-512 F",
        |p: *const half::bf16, q: *mut f32| {
            let w = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast::<__m256i>())));
            _mm512_storeu_si512(q.cast::<__m512i>(), w)
        }
    );
    lanes_fn!(
        /// f32 to f16 (round to nearest even), 8 per F16C conversion.
        narrow_f16_lanes_avx2(f32 => half::f16), 8, "AVX2 and F16C",
        |p: *const f32, q: *mut half::f16| {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(p));
            _mm_storeu_si128(q.cast::<__m128i>(), h)
        }
    );
    lanes_fn!(
        /// f32 to f16 (round to nearest even), 16 per AVX-512 conversion.
        narrow_f16_lanes_avx512(f32 => half::f16), 16, "AVX-512 F",
        |p: *const f32, q: *mut half::f16| {
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_loadu_ps(p));
            _mm256_storeu_si256(q.cast::<__m256i>(), h)
        }
    );

    /// f32 bits (8 lanes) to bf16 bits as [`super::bf16_bits`] rounds them, in the low 16 bits
    /// of each lane. An `#[inline(always)]` fn, not a closure: a closure's body is compiled
    /// without the caller's features, and its intrinsics became calls (25 times slower).
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    unsafe fn bf16_bits_avx2(x: __m256i) -> __m256i {
        // SAFETY: AVX2 register operations only; the caller has AVX2.
        unsafe {
            let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
            let rounded =
                _mm256_srli_epi32::<16>(_mm256_add_epi32(x, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))));
            let nan = _mm256_or_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(0x40));
            let abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFF_FFFF));
            let is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F80_0000));
            // Both below 2^16: the 16-bit pack keeps them whole.
            _mm256_and_si256(_mm256_blendv_epi8(rounded, nan, is_nan), _mm256_set1_epi32(0xFFFF))
        }
    }

    /// [`super::LANES`] f32 to bf16 bits as [`super::bf16_bits`] rounds them, 16 per AVX2 pack.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    pub(super) unsafe fn narrow_bf16_lanes_avx2(s: &[f32; LANES], d: &mut [half::bf16]) {
        let d = &mut d[..LANES];
        for k in (0..LANES).step_by(16) {
            // SAFETY: k + 16 ≤ LANES: 16 f32 readable from `s` and 16 bf16 (32 bytes) writable
            // in `d` at k; unaligned accesses. The caller has AVX2.
            unsafe {
                let a = bf16_bits_avx2(_mm256_loadu_si256(s.as_ptr().add(k).cast::<__m256i>()));
                let b = bf16_bits_avx2(_mm256_loadu_si256(s.as_ptr().add(k + 8).cast::<__m256i>()));
                // packus interleaves the 128-bit halves: a0 b0 a1 b1 → a0 a1 b0 b1.
                let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a, b));
                _mm256_storeu_si256(d.as_mut_ptr().add(k).cast::<__m256i>(), p);
            }
        }
    }

    /// [`super::LANES`] f32 to bf16 bits as [`super::bf16_bits`] rounds them, 16 per AVX-512
    /// vector.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[inline(always)]
    pub(super) unsafe fn narrow_bf16_lanes_avx512(s: &[f32; LANES], d: &mut [half::bf16]) {
        let d = &mut d[..LANES];
        for k in (0..LANES).step_by(16) {
            // SAFETY: k + 16 ≤ LANES: 16 f32 readable from `s` and 16 bf16 (32 bytes) writable
            // in `d` at k; unaligned accesses. The caller has AVX-512 F.
            unsafe {
                let x = _mm512_loadu_si512(s.as_ptr().add(k).cast::<__m512i>());
                let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(1));
                let rounded =
                    _mm512_srli_epi32::<16>(_mm512_add_epi32(x, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))));
                let nan = _mm512_or_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(0x40));
                let abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFF_FFFF));
                let is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F80_0000));
                let h = _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, nan));
                _mm256_storeu_si256(d.as_mut_ptr().add(k).cast::<__m256i>(), h);
            }
        }
    }

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

    /// `n` f32 of random bit patterns (xorshift32 from `seed`).
    fn random_bits(mut x: u32, n: usize) -> impl Iterator<Item = f32> {
        (0..n).map(move |_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            f32::from_bits(x)
        })
    }

    /// f32 → f16 gives `f16::from_f32`'s bits on every instruction set and length (ties, the
    /// overflow boundary, subnormals, NaN and random bit patterns).
    #[test]
    fn narrowing_to_f16_is_from_f32_on_every_isa() {
        let values: Vec<f32> = [0.0f32, -0.0, 1.0, 65504.0, 65520.0, 1e-8, -6e-8, f32::INFINITY, f32::NAN]
            .into_iter()
            .chain(random_bits(0x2545_F491, 5000))
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

    /// The block conversions give the slice conversions' bits on every instruction set: every
    /// f16 and bf16 bit pattern widened, and specials, ties, NaNs and random bit patterns
    /// narrowed to f16, bf16 (`bf16::from_f32`), f32 and i32.
    #[test]
    fn lanes_are_the_slice_conversions_on_every_isa() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let h: Vec<f16> = all.iter().map(|&b| f16::from_bits(b)).collect();
        let b: Vec<bf16> = all.iter().map(|&b| bf16::from_bits(b)).collect();
        let values: Vec<f32> = [0.0f32, -0.0, 1.0, 65504.0, 65520.0, 1e-8, -6e-8, 1e-40, f32::INFINITY, f32::NAN]
            .into_iter()
            .chain((0..1 << 10).map(|k| f32::from_bits(0x3F80_8000 + (k << 16)))) // bf16 ties
            .chain((0..1 << 10).map(|k| f32::from_bits(0x3F80_1000 + (k << 13)))) // f16 ties
            .chain(random_bits(0x9E37_79B9, 20_000))
            .collect();
        for isa in Isa::supported() {
            for pos in (0..all.len() - LANES).step_by(LANES - 3) {
                let mut got = [0f32; LANES];
                widen_lanes(isa, SliceRef::F16(&h), pos, &mut got);
                assert_eq!(first_diff(&got, &want_f16(&h[pos..pos + LANES])), None, "{isa:?} f16 at {pos}");
                widen_lanes(isa, SliceRef::BF16(&b), pos, &mut got);
                assert_eq!(first_diff(&got, &want_bf16(&b[pos..pos + LANES])), None, "{isa:?} bf16 at {pos}");
            }
            for v in values.chunks_exact(LANES) {
                let v: &[f32; LANES] = v.try_into().unwrap();
                let (mut hs, mut bs) = (vec![f16::ZERO; LANES + 1], vec![bf16::ZERO; LANES + 1]);
                narrow_lanes(isa, v, &mut SliceMut::F16(&mut hs), 1);
                narrow_lanes(isa, v, &mut SliceMut::BF16(&mut bs), 1);
                for (i, &v) in v.iter().enumerate() {
                    assert_eq!(hs[i + 1].to_bits(), f16::from_f32(v).to_bits(), "{isa:?} f16 {v:e}");
                    assert_eq!(bs[i + 1].to_bits(), bf16::from_f32(v).to_bits(), "{isa:?} bf16 {v:e}");
                }
                assert_eq!((hs[0], bs[0]), (f16::ZERO, bf16::ZERO), "wrote before the position");
                let mut fs = vec![0f32; LANES];
                narrow_lanes(isa, v, &mut SliceMut::F32(&mut fs), 0);
                assert_eq!(first_diff(&fs, v), None);
            }
            let ints: Vec<f32> = (0..LANES).map(|i| i as f32 * 1.5 - 40.0).collect();
            let mut is = vec![0i32; LANES];
            narrow_lanes(isa, ints[..].try_into().unwrap(), &mut SliceMut::I32(&mut is), 0);
            assert!(is.iter().zip(&ints).all(|(&i, &v)| i == v.round() as i32));
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
