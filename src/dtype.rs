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

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::f16 {}
    impl Sealed for super::bf16 {}
    impl Sealed for i32 {}
}

/// A Rust element type with a [`DType`]: `f32`, [`struct@f16`], [`struct@bf16`] or `i32`. Sealed.
pub trait Element: Copy + Default + Send + Sync + PartialEq + fmt::Debug + 'static + sealed::Sealed {
    /// The dtype of this type.
    const DTYPE: DType;
    /// Widens to f32 (exact for every element type).
    fn to_f32(self) -> f32;
    /// Narrows from f32, rounding to nearest even.
    fn from_f32(v: f32) -> Self;
    /// Narrows from f64 with one rounding to nearest even.
    fn from_f64(v: f64) -> Self;
    /// Wraps a slice of this type.
    #[doc(hidden)]
    fn slice_ref(s: &[Self]) -> SliceRef<'_>;
    /// Wraps a mutable slice of this type.
    #[doc(hidden)]
    fn slice_mut(s: &mut [Self]) -> SliceMut<'_>;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn slice_ref(s: &[Self]) -> SliceRef<'_> {
        SliceRef::F32(s)
    }
    fn slice_mut(s: &mut [Self]) -> SliceMut<'_> {
        SliceMut::F32(s)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn slice_ref(s: &[Self]) -> SliceRef<'_> {
        SliceRef::F16(s)
    }
    fn slice_mut(s: &mut [Self]) -> SliceMut<'_> {
        SliceMut::F16(s)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    fn slice_ref(s: &[Self]) -> SliceRef<'_> {
        SliceRef::BF16(s)
    }
    fn slice_mut(s: &mut [Self]) -> SliceMut<'_> {
        SliceMut::BF16(s)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

impl Element for i32 {
    const DTYPE: DType = DType::I32;
    fn slice_ref(s: &[Self]) -> SliceRef<'_> {
        SliceRef::I32(s)
    }
    fn slice_mut(s: &mut [Self]) -> SliceMut<'_> {
        SliceMut::I32(s)
    }
    /// Exact up to 2^24 in magnitude, rounded to nearest beyond.
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    /// Rounded to the nearest integer (ties away from zero), saturating; NaN gives 0.
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v.round() as i32
    }
    /// Rounded to the nearest integer (ties away from zero), saturating; NaN gives 0.
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v.round() as i32
    }
}

/// A borrowed host slice of one of the element types.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum SliceRef<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    I32(&'a [i32]),
}

/// A mutably borrowed host slice of one of the three element types.
#[doc(hidden)]
#[derive(Debug)]
pub enum SliceMut<'a> {
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

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` widened to f32. `i` must be in bounds.
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

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stores `v` at `i`, rounding once to the element type. `i` must be in bounds.
    #[inline]
    pub(crate) fn set_f64(&mut self, i: usize, v: f64) {
        match self {
            SliceMut::F32(s) => s[i] = v as f32,
            SliceMut::F16(s) => s[i] = f16::from_f64(v),
            SliceMut::BF16(s) => s[i] = bf16::from_f64(v),
            SliceMut::I32(s) => s[i] = v.round() as i32,
        }
    }
}
