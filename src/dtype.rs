//! Element types: [`DType`] names them at run time, [`Element`] is the Rust type of each.

use std::fmt;

pub use half::{bf16, f16};

/// The element type of a [`Tensor`](crate::Tensor): the three float dtypes the operators compute
/// in, and `i32` for counts (e.g. `batch_norm_elemt_backward`'s counter, as torch passes it).
/// More may come: match with a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// IEEE-754 binary32 (`ACL_FLOAT`).
    F32,
    /// IEEE-754 binary16 (`ACL_FLOAT16`).
    F16,
    /// bfloat16 (`ACL_BF16`).
    BF16,
    /// 32-bit signed integer (`ACL_INT32`), for counts.
    I32,
}

impl DType {
    /// Size of one element in bytes.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// The short name used in messages: `f32`, `f16`, `bf16`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The crate's side of [`Element`]: the conversions between typed slices and [`SliceRef`] /
/// [`SliceMut`], which stay crate-internal. No one outside can name or implement this trait, so
/// its methods (reachable only through `Element`'s bound) hand out nothing a caller can name:
/// hence the allowed `private_interfaces`.
#[allow(private_interfaces)]
mod sealed {
    use super::{SliceMut, SliceRef};

    pub trait Sealed: Sized {
        /// Wraps a slice of this type.
        fn slice_ref(s: &[Self]) -> SliceRef<'_>;
        /// Wraps a mutable slice of this type.
        fn slice_mut(s: &mut [Self]) -> SliceMut<'_>;
        /// The slice as this type, when it holds this type (`None` for another dtype).
        fn of_slice_ref(s: SliceRef<'_>) -> Option<&[Self]>;
        /// The mutable slice as this type, when it holds this type (`None` for another dtype).
        fn of_slice_mut<'a>(s: &'a mut SliceMut<'_>) -> Option<&'a mut [Self]>;
    }

    /// One element type's conversions: `$t` is held by variant `$v` of both slice enums.
    macro_rules! sealed {
        ($($t:ty => $v:ident),*) => {$(
            impl Sealed for $t {
                fn slice_ref(s: &[Self]) -> SliceRef<'_> {
                    SliceRef::$v(s)
                }
                fn slice_mut(s: &mut [Self]) -> SliceMut<'_> {
                    SliceMut::$v(s)
                }
                fn of_slice_ref(s: SliceRef<'_>) -> Option<&[Self]> {
                    match s {
                        SliceRef::$v(s) => Some(s),
                        _ => None,
                    }
                }
                fn of_slice_mut<'a>(s: &'a mut SliceMut<'_>) -> Option<&'a mut [Self]> {
                    match s {
                        SliceMut::$v(s) => Some(s),
                        _ => None,
                    }
                }
            }
        )*};
    }
    sealed!(f32 => F32, super::f16 => F16, super::bf16 => BF16, i32 => I32);
}

/// A Rust element type with a [`DType`]: `f32`, [`struct@f16`], [`struct@bf16`] or `i32`. Sealed.
pub trait Element: Copy + Default + Send + Sync + PartialEq + fmt::Debug + 'static + sealed::Sealed {
    /// The dtype of this type.
    const DTYPE: DType;
    /// Widens to f32: exact for f32, f16 and bf16; an i32 beyond 2^24 in magnitude is rounded to
    /// nearest (use [`to_f64`](Element::to_f64) for an exact conversion).
    fn to_f32(self) -> f32;
    /// Widens to f64 (exact for every element type).
    fn to_f64(self) -> f64;
    /// Narrows from f32, rounding to nearest even.
    fn from_f32(v: f32) -> Self;
    /// Narrows from f64 with one rounding to nearest even.
    fn from_f64(v: f64) -> Self;
}

/// The [`Element`] impl of each element type: its dtype and its four conversions, each written as
/// a closure over `self` (widening) or `v` (narrowing).
macro_rules! elements {
    ($(
        $t:ident = $dtype:expr,
        to_f64: |$a:ident| $to_f64:expr,
        to_f32: |$b:ident| $to_f32:expr,
        from_f32: |$c:ident| $from_f32:expr,
        from_f64: |$d:ident| $from_f64:expr;
    )*) => {$(
        impl Element for $t {
            const DTYPE: DType = $dtype;
            #[inline(always)]
            fn to_f64(self) -> f64 {
                let $a = self;
                $to_f64
            }
            #[inline(always)]
            fn to_f32(self) -> f32 {
                let $b = self;
                $to_f32
            }
            #[inline(always)]
            fn from_f32($c: f32) -> Self {
                $from_f32
            }
            #[inline(always)]
            fn from_f64($d: f64) -> Self {
                $from_f64
            }
        }
    )*};
}

// The 16-bit floats: the `half` crate's widenings and f32 narrowing, and the one-rounding f64
// narrowing. i32: `to_f32` is exact up to 2^24 in magnitude and rounded to nearest beyond; the
// narrowings round to the nearest integer (ties away from zero), saturating, NaN giving 0.
elements! {
    f32 = DType::F32,
        to_f64: |x| f64::from(x),
        to_f32: |x| x,
        from_f32: |v| v,
        from_f64: |v| v as f32;
    f16 = DType::F16,
        to_f64: |x| f16::to_f64(x),
        to_f32: |x| f16::to_f32(x),
        from_f32: |v| f16::from_f32(v),
        from_f64: |v| f16_from_f64(v);
    bf16 = DType::BF16,
        to_f64: |x| bf16::to_f64(x),
        to_f32: |x| bf16::to_f32(x),
        from_f32: |v| bf16::from_f32(v),
        from_f64: |v| bf16_from_f64(v);
    i32 = DType::I32,
        to_f64: |x| f64::from(x),
        to_f32: |x| x as f32,
        from_f32: |v| v.round() as i32,
        from_f64: |v| v.round() as i32;
}

/// `v` rounded to f32 toward zero, with the lowest significand bit set when that is inexact
/// (rounding to odd). Rounding the result once more, to nearest even, into a format of at most 22
/// significand bits (f16: 11, bf16: 8) gives the correctly rounded `v` (Boldo and Melquiond,
/// "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd", 2008).
#[inline]
fn f32_round_to_odd(v: f64) -> f32 {
    let f = v as f32;
    if v.is_nan() || f64::from(f) == v {
        return f;
    }
    let mut bits = f.to_bits();
    if f64::from(f).abs() > v.abs() {
        // Rounded away from zero (to infinity at most): one step back toward zero.
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// `v` rounded once, to nearest even, into f16. (`half`'s own `f16::from_f64` drops the low 32
/// significand bits first, so a value just above a tie can round down.)
#[inline]
pub(crate) fn f16_from_f64(v: f64) -> f16 {
    f16::from_f32(f32_round_to_odd(v))
}

/// `v` rounded once, to nearest even, into bf16 (see [`f16_from_f64`]).
#[inline]
pub(crate) fn bf16_from_f64(v: f64) -> bf16 {
    bf16::from_f32(f32_round_to_odd(v))
}

/// A borrowed host slice of one of the element types.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SliceRef<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    I32(&'a [i32]),
}

/// A mutably borrowed host slice of one of the element types.
#[derive(Debug)]
pub(crate) enum SliceMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    BF16(&'a mut [bf16]),
    I32(&'a mut [i32]),
}

impl SliceRef<'_> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            SliceRef::F32(_) => DType::F32,
            SliceRef::F16(_) => DType::F16,
            SliceRef::BF16(_) => DType::BF16,
            SliceRef::I32(_) => DType::I32,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            SliceRef::F32(s) => s.len(),
            SliceRef::F16(s) => s.len(),
            SliceRef::BF16(s) => s.len(),
            SliceRef::I32(s) => s.len(),
        }
    }

    /// Element `i` widened to f64 (exact for every dtype). `i` must be in bounds.
    #[inline]
    pub(crate) fn get_f64(&self, i: usize) -> f64 {
        match self {
            SliceRef::F32(s) => f64::from(s[i]),
            SliceRef::F16(s) => s[i].to_f64(),
            SliceRef::BF16(s) => s[i].to_f64(),
            SliceRef::I32(s) => f64::from(s[i]),
        }
    }

    /// Element `i` widened to f32 (an i32 beyond 2^24 is rounded). `i` must be in bounds.
    #[inline]
    pub(crate) fn get_f32(&self, i: usize) -> f32 {
        match self {
            SliceRef::F32(s) => s[i],
            SliceRef::F16(s) => s[i].to_f32(),
            SliceRef::BF16(s) => s[i].to_f32(),
            SliceRef::I32(s) => s[i] as f32,
        }
    }
}

impl SliceMut<'_> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            SliceMut::F32(_) => DType::F32,
            SliceMut::F16(_) => DType::F16,
            SliceMut::BF16(_) => DType::BF16,
            SliceMut::I32(_) => DType::I32,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            SliceMut::F32(s) => s.len(),
            SliceMut::F16(s) => s.len(),
            SliceMut::BF16(s) => s.len(),
            SliceMut::I32(s) => s.len(),
        }
    }

    /// Stores `v` at `i`, rounding once to the element type. `i` must be in bounds.
    #[inline]
    pub(crate) fn set_f64(&mut self, i: usize, v: f64) {
        match self {
            SliceMut::F32(s) => s[i] = v as f32,
            SliceMut::F16(s) => s[i] = f16_from_f64(v),
            SliceMut::BF16(s) => s[i] = bf16_from_f64(v),
            SliceMut::I32(s) => s[i] = v.round() as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f64 → f16/bf16 rounds once to nearest even, also for a value just above a tie whose
    /// distinguishing bit lies in the low 32 significand bits of the f64.
    #[test]
    fn narrowing_from_f64_rounds_once() {
        // Powers of two built from their bits: `powi` may be off by an ulp (Miri models that).
        let pow2 = |e: i32| f64::from_bits(u64::try_from(1023 + e).unwrap() << 52);
        let tie = f64::from((1u32 << 24) + (1 << 16)); // a bf16 tie between 2^24 and 2^24 + 2^17
        assert_eq!(bf16_from_f64(tie).to_f64(), 16_777_216.0);
        assert_eq!(bf16_from_f64(tie + 1.0).to_f64(), 16_908_288.0);
        assert_eq!(bf16_from_f64(-(tie + 1.0)).to_f64(), -16_908_288.0);
        let h = 1.0 + pow2(-11); // an f16 tie between 1 and 1 + 2^-10
        assert_eq!(f16_from_f64(h).to_f64(), 1.0);
        assert_eq!(f16_from_f64(h + pow2(-40)).to_f64(), 1.0 + pow2(-10));
        assert_eq!(f16_from_f64(h - pow2(-40)).to_f64(), 1.0);
        for v in [0.0, -0.0, 1.0, 65504.0, 65520.0, 1e300, -1e300, 1e-300, f64::INFINITY, 5.960464477539063e-8] {
            assert_eq!(f16_from_f64(v).to_bits(), f16::from_f32(v as f32).to_bits(), "{v:e}");
            assert_eq!(bf16_from_f64(v).to_bits(), bf16::from_f32(v as f32).to_bits(), "{v:e}");
        }
        assert!(f16_from_f64(f64::NAN).is_nan() && bf16_from_f64(f64::NAN).is_nan());
        // Underflow: below half the smallest subnormal gives zero, just above it the subnormal.
        let min = pow2(-24);
        assert_eq!(f16_from_f64(min / 2.0).to_bits(), 0);
        assert_eq!(f16_from_f64(min / 2.0 * (1.0 + pow2(-40))).to_bits(), 1);
        assert_eq!(f16_from_f64(-min / 2.0 * (1.0 + pow2(-40))).to_bits(), 0x8001);
        assert_eq!(bf16_from_f64(1e-300).to_bits(), 0);
    }

    /// Widening to f64 is exact for every element type, i32 included.
    #[test]
    fn widening_to_f64_is_exact() {
        for v in [16_777_217i32, -16_777_219, i32::MIN, i32::MAX] {
            assert_eq!(v.to_f64() as i64, i64::from(v));
            assert_eq!(SliceRef::I32(&[v]).get_f64(0) as i64, i64::from(v));
        }
    }
}
