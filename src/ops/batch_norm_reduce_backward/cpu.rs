//! The CPU entry of `batch_norm_reduce_backward`: the zero-copy public entry
//! ([`crate::cpu::batch_norm_reduce_backward`], [`crate::cpu::Outputs`]) and the runner both
//! backends' CPU path calls.
//!
//! Sums are two-pass (`Σ dy·(x − mean)`, never `Σ dy·x − mean·Σ dy`), accumulated in f32 lanes
//! over bounded blocks combined in f64, on all cores for large inputs; results are bit-identical
//! whatever the thread count or the mask.

use super::kernel;
use super::validate::{self, Plan};
use super::OutputMask;
use crate::cpu::{host, max_threads, View, ViewMut};
use crate::dtype::{Element, SliceRef};
use crate::error::Result;
use crate::layout::Strided;
use crate::tensor::Tensor;

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

/// The operator over caller-owned host memory, without copying it (see the [module](crate::cpu)
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
        let w = weight.as_ref().map(View::layout);
        let metas = outs.each_ref().map(|o| o.as_ref().map(ViewMut::layout));
        validate::call(
            [&grad_out.layout(), &input.layout(), &mean.layout(), &invstd.layout()],
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
            sum_dy: host::scratch_vec(c, 0.0)?,
            sum_dy_xmu: with_xmu.then(|| host::scratch_vec(c, 0.0)).transpose()?,
        }
    } else {
        let mean = mean.to_f32s()?;
        match (grad_out.storage(), input.storage()) {
            (SliceRef::F32(dy), SliceRef::F32(x)) => {
                kernel::channel_sums(kernel_view(&grad_out, dy), kernel_view(&input, x), &mean, with_xmu, max_threads())
            }
            (SliceRef::F16(dy), SliceRef::F16(x)) => {
                kernel::channel_sums(kernel_view(&grad_out, dy), kernel_view(&input, x), &mean, with_xmu, max_threads())
            }
            (SliceRef::BF16(dy), SliceRef::BF16(x)) => {
                kernel::channel_sums(kernel_view(&grad_out, dy), kernel_view(&input, x), &mean, with_xmu, max_threads())
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

/// Σ dy and Σ dy·(x − mean) per channel of host tensors `grad_out` and `input` (validated: same
/// shape, one dtype), summed as this operator sums them (also `aclnnBatchNormBackward`'s CPU
/// kernel).
pub(in crate::ops) fn centered_sums(grad_out: &Tensor, input: &Tensor, mean: &[f32]) -> Result<kernel::ChannelSums> {
    let (dy, x) = (host::view(grad_out, "gradOut")?, host::view(input, "input")?);
    let dy = Strided::new(dy.storage(), dy.shape(), dy.strides(), dy.offset());
    let x = Strided::new(x.storage(), x.shape(), x.strides(), x.offset());
    centered_sums_of(dy, x, mean, max_threads())
}

/// [`centered_sums`] of validated views (same shape, one dtype) on up to `threads` threads.
pub(in crate::ops) fn centered_sums_of(
    dy: Strided<'_, SliceRef<'_>>,
    x: Strided<'_, SliceRef<'_>>,
    mean: &[f32],
    threads: usize,
) -> Result<kernel::ChannelSums> {
    let (dl, xl) = (dy.layout, x.layout);
    match (dy.data, x.data) {
        (SliceRef::F32(d), SliceRef::F32(v)) => {
            kernel::channel_sums(layout_view(d, &dl), layout_view(v, &xl), mean, true, threads)
        }
        (SliceRef::F16(d), SliceRef::F16(v)) => {
            kernel::channel_sums(layout_view(d, &dl), layout_view(v, &xl), mean, true, threads)
        }
        (SliceRef::BF16(d), SliceRef::BF16(v)) => {
            kernel::channel_sums(layout_view(d, &dl), layout_view(v, &xl), mean, true, threads)
        }
        _ => Err(crate::error::Error::internal("gradOut and input reached the CPU kernel with different dtypes")),
    }
}

/// The kernel's view of `data` at layout `l`.
fn layout_view<'v, T: Element>(data: &'v [T], l: &crate::layout::Layout<'v>) -> kernel::StridedView<'v, T> {
    kernel::StridedView::new(data, l.shape, l.strides, l.offset)
}

/// The kernel's view of `v`'s elements `data` (its storage, of the matching dtype).
fn kernel_view<'v, T: Element>(v: &'v View<'_>, data: &'v [T]) -> kernel::StridedView<'v, T> {
    kernel::StridedView::new(data, v.shape(), v.strides(), v.offset())
}
