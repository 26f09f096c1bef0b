//! Strided host views: [`View`] and [`ViewMut`], shared by every CPU kernel.

use std::borrow::Cow;
use std::ops::Deref;

use super::host;
use crate::dtype::{DType, Element, SliceMut, SliceRef};
use crate::error::Result;
use crate::layout::{self, Layout};
use crate::tensor::HostData;

/// Strides of a view: the caller's, or row-major ones computed in place (no allocation up to
/// rank 8).
#[derive(Clone, Debug)]
enum Strides<'a> {
    Borrowed(&'a [usize]),
    Inline { buf: [usize; layout::MAX_RANK], len: usize },
    Owned(Vec<usize>),
}

impl<'a> Strides<'a> {
    fn contiguous(shape: &[usize]) -> Self {
        if shape.len() > layout::MAX_RANK {
            return Strides::Owned(layout::contiguous_strides(shape));
        }
        let mut buf = [0; layout::MAX_RANK];
        layout::fill_contiguous_strides(shape, &mut buf);
        Strides::Inline { buf, len: shape.len() }
    }
}

impl Deref for Strides<'_> {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        match self {
            Strides::Borrowed(s) => s,
            Strides::Inline { buf, len } => &buf[..*len],
            Strides::Owned(v) => v,
        }
    }
}

/// Where a view's elements are: shape, strides and offset, in elements (shared by [`View`] and
/// [`ViewMut`]).
#[derive(Clone, Debug)]
struct Geometry<'a> {
    shape: &'a [usize],
    strides: Strides<'a>,
    offset: usize,
}

impl<'a> Geometry<'a> {
    fn contiguous(shape: &'a [usize]) -> Self {
        Geometry { shape, strides: Strides::contiguous(shape), offset: 0 }
    }

    fn strided(shape: &'a [usize], strides: &'a [usize], offset: usize) -> Self {
        Geometry { shape, strides: Strides::Borrowed(strides), offset }
    }

    fn layout(&self, dtype: DType, storage_len: usize) -> Layout<'_> {
        Layout { dtype, shape: self.shape, strides: &self.strides, offset: self.offset, storage_len }
    }
}

/// A read-only strided view of host elements (f32, f16 or bf16).
#[derive(Clone, Debug)]
pub struct View<'a> {
    data: SliceRef<'a>,
    geom: Geometry<'a>,
}

impl<'a> View<'a> {
    /// The view's shape.
    pub fn shape(&self) -> &[usize] {
        self.geom.shape
    }

    /// The view's strides, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.geom.strides
    }

    /// The view's offset into its storage, in elements.
    pub(crate) fn offset(&self) -> usize {
        self.geom.offset
    }

    /// The whole storage the view lies in (index it with the view's strides and offset).
    pub(crate) fn storage(&self) -> SliceRef<'a> {
        self.data
    }

    /// Calls `f` with every element (widened to f64, exact for every dtype) in row-major order.
    /// The view must have been bounds-checked.
    pub(crate) fn for_each_f64(&self, mut f: impl FnMut(f64)) {
        let g = &self.geom;
        layout::for_each_index(g.shape, &g.strides, g.offset, |i| f(self.data.get_f64(i)));
    }

    /// Calls `f` with every element (widened to f32; an i32 beyond 2^24 is rounded) in row-major
    /// order. The view must have been bounds-checked.
    pub(crate) fn for_each_f32(&self, mut f: impl FnMut(f32)) {
        let g = &self.geom;
        layout::for_each_index(g.shape, &g.strides, g.offset, |i| f(self.data.get_f32(i)));
    }

    /// The view's elements in row-major order as f32, for per-channel vectors: borrowed when the
    /// view is contiguous f32 already.
    pub(crate) fn to_f32s(&self) -> Result<Cow<'_, [f32]>> {
        let g = &self.geom;
        let n: usize = g.shape.iter().product();
        if let SliceRef::F32(data) = self.data {
            let run = g.offset.checked_add(n).and_then(|end| data.get(g.offset..end));
            if let (true, Some(run)) = (layout::is_contiguous(g.shape, &g.strides), run) {
                return Ok(Cow::Borrowed(run));
            }
        }
        let mut v = host::try_with_capacity(n)?;
        self.for_each_f32(|x| v.push(x));
        Ok(Cow::Owned(v))
    }
}

/// A mutable strided view of host elements (f32, f16 or bf16), for outputs.
#[derive(Debug)]
pub struct ViewMut<'a> {
    data: SliceMut<'a>,
    geom: Geometry<'a>,
}

/// What [`View`] and [`ViewMut`] share: their constructors over `&'a [T]` or `&'a mut [T]` (the
/// storage wrapped by `$slice`, a host tensor's by `$host`), their dtype and their layout.
macro_rules! view_common {
    ($view:ident, $slice:ident, $host:ident, $($mutability:tt)?) => {
        impl<'a> $view<'a> {
            /// A row-major contiguous view of `data` with `shape`.
            pub fn new<T: Element>(data: &'a $($mutability)? [T], shape: &'a [usize]) -> Self {
                $view { data: T::$slice(data), geom: Geometry::contiguous(shape) }
            }

            /// A strided view: element `(i0, i1, ...)` is `data[offset + Σ i_k·strides[k]]`.
            /// Bounds are checked when the view is used.
            pub fn strided<T: Element>(
                data: &'a $($mutability)? [T],
                shape: &'a [usize],
                strides: &'a [usize],
                offset: usize,
            ) -> Self {
                $view { data: T::$slice(data), geom: Geometry::strided(shape, strides, offset) }
            }

            pub(crate) fn from_host(
                h: &'a $($mutability)? HostData,
                shape: &'a [usize],
                strides: &'a [usize],
                offset: usize,
            ) -> Self {
                $view { data: h.$host(), geom: Geometry::strided(shape, strides, offset) }
            }

            /// The element type.
            pub fn dtype(&self) -> DType {
                self.data.dtype()
            }

            pub(crate) fn layout(&self) -> Layout<'_> {
                self.geom.layout(self.dtype(), self.data.len())
            }
        }
    };
}

view_common!(View, slice_ref, as_slice_ref,);
view_common!(ViewMut, slice_mut, as_slice_mut, mut);

impl<'a> ViewMut<'a> {
    /// The whole storage the view lies in (index it with the view's strides and offset).
    pub(crate) fn into_storage(self) -> SliceMut<'a> {
        self.data
    }

    /// Stores `v` (rounded once) at storage index `i`, which the caller has bounds-checked.
    pub(crate) fn set_f64(&mut self, i: usize, v: f64) {
        self.data.set_f64(i, v);
    }

    /// Writes `values[c]` (rounded once) to element `c` of this validated rank-1 view.
    pub(crate) fn write(&mut self, values: impl Iterator<Item = f64>) {
        let (offset, stride) = (self.geom.offset, self.geom.strides[0]);
        // One dtype dispatch per output, not per channel (C can be thousands).
        fn put<T>(s: &mut [T], offset: usize, stride: usize, values: impl Iterator<Item = f64>, f: impl Fn(f64) -> T) {
            for (c, v) in values.enumerate() {
                s[offset + c * stride] = f(v);
            }
        }
        match &mut self.data {
            SliceMut::F32(s) => put(s, offset, stride, values, |v| v as f32),
            SliceMut::F16(s) => put(s, offset, stride, values, crate::dtype::f16_from_f64),
            SliceMut::BF16(s) => put(s, offset, stride, values, crate::dtype::bf16_from_f64),
            SliceMut::I32(s) => put(s, offset, stride, values, |v| v.round() as i32),
        }
    }
}
