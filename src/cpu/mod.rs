//! The CPU backend: the operator over host memory, in pure Rust.
//!
//! [`batch_norm_reduce_backward`] here is the zero-copy entry: it reads caller-owned slices
//! through [`View`]s (shape, strides and offset in elements) and writes into [`ViewMut`]s, so a
//! CPU user never copies gigabytes just to call the op. It validates exactly as the
//! [`ops`](crate::ops) entry points do (same errors, same status codes).
//!
//! Sums are two-pass (`Σ dy·(x − mean)`, never `Σ dy·x − mean·Σ dy`), accumulated in f32 lanes
//! over bounded blocks combined in f64, on all cores for large inputs; results are bit-identical
//! whatever the thread count or the mask.

use std::borrow::Cow;
use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) mod channelwise;
pub(crate) mod host;
pub(crate) mod kernel;
pub(crate) mod pool;

use crate::dtype::{DType, Element, SliceMut, SliceRef};
use crate::error::Result;
use crate::layout;
use crate::ops::validate::{self, Meta, Plan};
use crate::ops::OutputMask;
use crate::tensor::HostData;

/// Most threads per call; 0 = one per core.
static MAX_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Sets the most threads one call of the CPU backend uses (the caller's thread included;
/// 0 = one per core, the default) and returns the previous setting. Results are bit-identical
/// whatever the setting; small inputs use fewer threads anyway. Applies to calls that start
/// afterwards, on every thread.
pub fn set_max_threads(threads: usize) -> usize {
    MAX_THREADS.swap(threads, Ordering::Relaxed)
}

/// The setting of [`set_max_threads`] (0 = one per core).
pub fn max_threads() -> usize {
    MAX_THREADS.load(Ordering::Relaxed)
}

/// The instruction set the CPU kernel uses: `"avx512"`, `"avx2"` or `"portable"`. It is the best
/// this CPU supports unless the environment variable `ASCEND_CPU_ISA` (`avx2` or `portable`,
/// read once) asks for a lesser one; every choice gives the same bits.
pub fn instruction_set() -> &'static str {
    kernel::isa_name()
}

/// Strides of a view: the caller's, or row-major ones computed in place (no allocation up to
/// rank 8).
#[derive(Clone, Debug)]
enum Strides<'a> {
    Borrowed(&'a [usize]),
    Inline { buf: [usize; crate::ops::MAX_RANK], len: usize },
    Owned(Vec<usize>),
}

impl<'a> Strides<'a> {
    fn contiguous(shape: &[usize]) -> Self {
        if shape.len() > crate::ops::MAX_RANK {
            return Strides::Owned(layout::contiguous_strides(shape));
        }
        let mut buf = [0; crate::ops::MAX_RANK];
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

    fn meta(&self, dtype: DType, storage_len: usize) -> Meta<'_> {
        Meta { dtype, shape: self.shape, strides: &self.strides, offset: self.offset, storage_len }
    }
}

/// A read-only strided view of host elements (f32, f16 or bf16).
#[derive(Clone, Debug)]
pub struct View<'a> {
    data: SliceRef<'a>,
    geom: Geometry<'a>,
}

impl<'a> View<'a> {
    /// A row-major contiguous view of `data` with `shape`.
    pub fn new<T: Element>(data: &'a [T], shape: &'a [usize]) -> Self {
        View { data: T::slice_ref(data), geom: Geometry::contiguous(shape) }
    }

    /// A strided view: element `(i0, i1, ...)` is `data[offset + Σ i_k·strides[k]]`.
    /// Bounds are checked when the view is used.
    pub fn strided<T: Element>(data: &'a [T], shape: &'a [usize], strides: &'a [usize], offset: usize) -> Self {
        View { data: T::slice_ref(data), geom: Geometry::strided(shape, strides, offset) }
    }

    pub(crate) fn from_host(h: &'a HostData, shape: &'a [usize], strides: &'a [usize], offset: usize) -> Self {
        View { data: h.as_slice_ref(), geom: Geometry::strided(shape, strides, offset) }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

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

    pub(crate) fn meta(&self) -> Meta<'_> {
        self.geom.meta(self.dtype(), self.data.len())
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
    fn to_f32s(&self) -> Result<Cow<'_, [f32]>> {
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

    fn kernel_view<T: Element>(&self, data: &'a [T]) -> kernel::StridedView<'_, T> {
        let g = &self.geom;
        kernel::StridedView { data, shape: g.shape, strides: &g.strides, offset: g.offset }
    }
}

/// A mutable strided view of host elements (f32, f16 or bf16), for outputs.
#[derive(Debug)]
pub struct ViewMut<'a> {
    data: SliceMut<'a>,
    geom: Geometry<'a>,
}

impl<'a> ViewMut<'a> {
    /// A row-major contiguous view of `data` with `shape`.
    pub fn new<T: Element>(data: &'a mut [T], shape: &'a [usize]) -> Self {
        ViewMut { data: T::slice_mut(data), geom: Geometry::contiguous(shape) }
    }

    /// A strided view: element `(i0, ...)` is `data[offset + Σ i_k·strides[k]]`.
    pub fn strided<T: Element>(data: &'a mut [T], shape: &'a [usize], strides: &'a [usize], offset: usize) -> Self {
        ViewMut { data: T::slice_mut(data), geom: Geometry::strided(shape, strides, offset) }
    }

    pub(crate) fn from_host(h: &'a mut HostData, shape: &'a [usize], strides: &'a [usize], offset: usize) -> Self {
        ViewMut { data: h.as_slice_mut(), geom: Geometry::strided(shape, strides, offset) }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    pub(crate) fn meta(&self) -> Meta<'_> {
        self.geom.meta(self.dtype(), self.data.len())
    }

    /// The whole storage the view lies in (index it with the view's strides and offset).
    pub(crate) fn into_storage(self) -> SliceMut<'a> {
        self.data
    }

    /// Stores `v` (rounded once) at storage index `i`, which the caller has bounds-checked.
    pub(crate) fn set_f64(&mut self, i: usize, v: f64) {
        self.data.set_f64(i, v);
    }

    /// Writes `values[c]` (rounded once) to element `c` of this validated rank-1 view.
    fn write(&mut self, values: impl Iterator<Item = f64>) {
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

/// Output views for [`batch_norm_reduce_backward`]; those the mask turns on are required.
#[derive(Debug, Default)]
pub struct Outputs<'a> {
    /// Receives Σ dy (`inputG`).
    pub sum_dy: Option<ViewMut<'a>>,
    /// Receives Σ dy·(x − mean) (`inputG`).
    pub sum_dy_xmu: Option<ViewMut<'a>>,
    /// Receives sumDyXmu·invstd (`weightG`).
    pub grad_weight: Option<ViewMut<'a>>,
    /// Receives Σ dy (`biasG`).
    pub grad_bias: Option<ViewMut<'a>>,
}

/// The operator over caller-owned host memory, without copying it (see the [module](self)
/// docs). Validates like [`ops::batch_norm_reduce_backward_into`](crate::ops::batch_norm_reduce_backward_into)
/// and writes nothing when it rejects the call.
pub fn batch_norm_reduce_backward(
    grad_out: View<'_>,
    input: View<'_>,
    mean: View<'_>,
    invstd: View<'_>,
    weight: Option<View<'_>>,
    mask: OutputMask,
    out: Outputs<'_>,
) -> Result<()> {
    let outs = validate::keep_enabled(mask, [out.sum_dy, out.sum_dy_xmu, out.grad_weight, out.grad_bias]);
    let plan = {
        let w = weight.as_ref().map(View::meta);
        let metas = outs.each_ref().map(|o| o.as_ref().map(ViewMut::meta));
        validate::call(
            [&grad_out.meta(), &input.meta(), &mean.meta(), &invstd.meta()],
            w.as_ref(),
            mask,
            metas.each_ref().map(Option::as_ref),
        )?
    };
    run(&plan, mask, grad_out, input, mean, invstd, outs)
}

/// Runs the validated operator: the sums, then each enabled output rounded once from f64. A work
/// table the host cannot hold (a huge broadcast view) is [`Error::HostAlloc`](crate::Error::HostAlloc),
/// before any output is written.
pub(crate) fn run(
    plan: &Plan,
    mask: OutputMask,
    grad_out: View<'_>,
    input: View<'_>,
    mean: View<'_>,
    invstd: View<'_>,
    mut outs: [Option<ViewMut<'_>>; 4],
) -> Result<()> {
    let c = plan.channels;
    let with_xmu = mask.input_g || mask.weight_g;
    if !(with_xmu || mask.bias_g) {
        return Ok(());
    }
    let sums = if plan.empty {
        kernel::ChannelSums {
            sum_dy: host::try_vec(c, 0.0)?,
            sum_dy_xmu: with_xmu.then(|| host::try_vec(c, 0.0)).transpose()?,
        }
    } else {
        let mean = mean.to_f32s()?;
        match (grad_out.data, input.data) {
            (SliceRef::F32(dy), SliceRef::F32(x)) => {
                kernel::channel_sums(grad_out.kernel_view(dy), input.kernel_view(x), &mean, with_xmu, max_threads())
            }
            (SliceRef::F16(dy), SliceRef::F16(x)) => {
                kernel::channel_sums(grad_out.kernel_view(dy), input.kernel_view(x), &mean, with_xmu, max_threads())
            }
            (SliceRef::BF16(dy), SliceRef::BF16(x)) => {
                kernel::channel_sums(grad_out.kernel_view(dy), input.kernel_view(x), &mean, with_xmu, max_threads())
            }
            // Validation guarantees gradOut and input share a dtype.
            _ => return Ok(()),
        }?
    };
    let xmu = sums.sum_dy_xmu.as_deref().unwrap_or(&[]);
    let [sum_dy, sum_dy_xmu, grad_weight, grad_bias] = &mut outs;
    if let Some(o) = sum_dy {
        o.write(sums.sum_dy.iter().copied());
    }
    if let Some(o) = sum_dy_xmu {
        o.write(xmu.iter().copied());
    }
    if let Some(o) = grad_weight {
        let invstd = invstd.to_f32s()?;
        // Empty input: +0 whatever invstd holds (0·(−1) would be −0, 0·NaN NaN), as on Ascend.
        let empty = plan.empty;
        o.write(xmu.iter().zip(invstd.iter()).map(|(&s, &i)| if empty { 0.0 } else { s * f64::from(i) }));
    }
    if let Some(o) = grad_bias {
        o.write(sums.sum_dy.iter().copied());
    }
    Ok(())
}
