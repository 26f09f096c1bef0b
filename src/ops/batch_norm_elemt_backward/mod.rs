//! `aclnnBatchNormElemtBackward` on both backends: the input gradient of BatchNorm from the
//! (all-reduced) per-channel sums, the last step of SyncBatchNorm's backward pass.
//!
//! The public docs are on [`batch_norm_elemt_backward`].

pub(in crate::ops) mod cpu;

use ascend_sys::{aclnnStatus, symbols, OpApi};

use super::call::{entry_points, run_into_new_like};
use super::launch::Phase2;
use super::operator::{Arg, Handles, Operator};
use super::prepared::Prepared;
use super::validate;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::stream::Stream;
use crate::tensor::Tensor;

entry_points! {
    /// The input gradient of BatchNorm from the per-channel sums of the whole (global) batch, into a
    /// new tensor of `input`'s shape and dtype.
    ///
    /// Per element of channel `c` (dim 1), with `N = Σ counter` (the global element count per
    /// channel):
    /// `gradInput = (gradOut − sumDy[c]/N − (x − mean[c])·invstd[c]²·sumDyXmu[c]/N)·invstd[c]·weight[c]`;
    /// `weight` defaults to 1. `sumDy` and `sumDyXmu` are the sums of
    /// [`batch_norm_reduce_backward`](super::batch_norm_reduce_backward) added over every rank.
    ///
    /// # Arguments
    /// * `input`: 2 to 8 dims, `C = shape[1] ≠ 0`; `grad_out` and `grad_input` have its shape; any
    ///   strides (`grad_input` must not overlap itself). An empty input (some dim 0) computes
    ///   nothing and succeeds.
    /// * `mean`, `invstd`, `weight`, `sum_dy`, `sum_dy_xmu`: shape `[C]`, any stride.
    /// * `counter`: the element count of each rank, shape `[W]` or `[W, 1]` (torch saves `[W, 1]`).
    ///   CANN sums **every** element of `counter` whatever its shape, so a per-channel `[W, C]` counts
    ///   tensor would silently give a wrong `N`: any other shape is rejected (161002).
    /// * dtypes: `grad_out`, `input`, `mean`, `invstd`, `weight`, `sum_dy`, `sum_dy_xmu` and
    ///   `grad_input` are each f32, f16 or bf16 (Atlas A2/A3; CANN promotes mixed dtypes to f32);
    ///   `counter` is f32, f16 or i32 ([`DType::I32`](crate::DType::I32), what torch passes); bf16 is
    ///   rejected (161002) as CANN rejects it.
    ///
    /// Errors have aclnn's status 161002 (`ACLNN_ERR_PARAM_INVALID`) on both backends; a rejected
    /// call writes nothing.
    ///
    /// # Numerics
    /// * Ascend: CANN sums `counter` in f32, divides `sumDy` and `sumDyXmu` by it in f32, then
    ///   computes in f16 when all of gradOut, input, mean, invstd, weight, sumDy and sumDyXmu are
    ///   f16, else in f32, and rounds into gradInput's dtype. A missing weight is filled with ones as
    ///   an **f32** tensor (ops-nn `FillScalar`), so without weight it computes in f32. The mock CANN
    ///   does the same.
    /// * CPU: `N` and the per-channel coefficients in f64, then per element in f64 from the exact
    ///   inputs: `((dy − sumDy/N) − (x − mean)·invstd²·sumDyXmu/N)·invstd·weight`, rounded to f32 and
    ///   then (for f16/bf16 outputs) to the output dtype: within an ulp of the output dtype of the
    ///   exact value (half an ulp but for double-rounding ties). Deterministic: the same bits on every
    ///   run and for any thread count. Deterministic on Ascend too (documented by CANN).
    ///
    /// # Calling
    /// Arguments are validated first, on both backends alike; a rejected call allocates nothing. On
    /// Ascend the work is asynchronous on `stream`: read the result with [`Tensor::to_vec`].
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_elemt_backward(
        stream: &Stream,
        grad_out: &Tensor,
        input: &Tensor,
        mean: &Tensor,
        invstd: &Tensor,
        weight: Option<&Tensor>,
        sum_dy: &Tensor,
        sum_dy_xmu: &Tensor,
        counter: &Tensor,
    ) -> Result<Tensor> {
        run_into_new_like!(stream, Args { grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, counter }, input)
    }

    /// [`batch_norm_elemt_backward`] into the caller-owned `grad_input` (input's shape, any of
    /// f32/f16/bf16, any strides that do not overlap themselves).
    ///
    /// On Ascend this is `aclnnBatchNormElemtBackwardGetWorkspaceSize` followed by
    /// `aclnnBatchNormElemtBackward` on `stream`, with the stream's cached workspace. The call returns
    /// once the work is enqueued; every tensor may be dropped at once.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_elemt_backward_into(.., grad_input: &mut Tensor) => (
        Args { grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, counter },
        [grad_input],
    );

    /// Phase 1 of the two-phase API: validates the arguments and, on Ascend, creates the tensor
    /// descriptors and the executor (`aclnnBatchNormElemtBackwardGetWorkspaceSize`).
    ///
    /// The result borrows every tensor until it is launched or dropped. [`Prepared::launch`] runs
    /// phase 2; dropping it unlaunched destroys the executor and writes nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_batch_norm_elemt_backward(.., ..) -> Prepared;
}

/// The arguments of a call but its output.
#[derive(Clone, Copy)]
struct Args<'a> {
    grad_out: &'a Tensor,
    input: &'a Tensor,
    mean: &'a Tensor,
    invstd: &'a Tensor,
    weight: Option<&'a Tensor>,
    sum_dy: &'a Tensor,
    sum_dy_xmu: &'a Tensor,
    counter: &'a Tensor,
}

/// The layouts of what a call reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ElemtBackwardInputs<'l> {
    pub grad_out: Layout<'l>,
    pub input: Layout<'l>,
    pub mean: Layout<'l>,
    pub invstd: Layout<'l>,
    pub weight: Option<Layout<'l>>,
    pub sum_dy: Layout<'l>,
    pub sum_dy_xmu: Layout<'l>,
    pub counter: Layout<'l>,
}

impl<'l> ElemtBackwardInputs<'l> {
    /// Each input but counter with its aclnn name, in the prototype's order.
    fn named(&self) -> [(Option<&Layout<'l>>, &'static str); 7] {
        [
            (Some(&self.grad_out), "gradOut"),
            (Some(&self.input), "input"),
            (Some(&self.mean), "mean"),
            (Some(&self.invstd), "invstd"),
            (self.weight.as_ref(), "weight"),
            (Some(&self.sum_dy), "sumDy"),
            (Some(&self.sum_dy_xmu), "sumDyXmu"),
        ]
    }
}

/// Validates the inputs of a call over their layouts, in CANN's order (dtypes, then shapes),
/// then what CANN does not check (counter's shape, views inside their storage); returns whether the input is
/// empty. Checks no stream, allocates nothing: a composite call (`sync_batch_norm`) asks it
/// before its first side effect.
pub(crate) fn check_inputs(inputs: &ElemtBackwardInputs<'_>) -> Result<bool> {
    // Each tensor's dtype on its own (Atlas A2/A3: f32, f16, bf16), then counter's.
    for (m, name) in inputs.named() {
        if let Some(m) = m {
            validate::float_dtype(name, m.dtype)?;
        }
    }
    match inputs.counter.dtype {
        // int32 counters are what torch passes (`count_all.to(torch.int32)`).
        DType::F32 | DType::F16 | DType::I32 => {}
        _ => {
            return Err(Error::invalid(
                "counter",
                "dtype bf16 is not supported (CANN accepts f32, f16 or int32 counters)",
            ))
        }
    }
    let x = &inputs.input;
    let c = validate::activation("input", x)?;
    validate::same_shape("gradOut", &inputs.grad_out, "input", x.shape)?;
    // mean, invstd, weight, sumDy, sumDyXmu.
    for (m, name) in inputs.named().into_iter().skip(2) {
        if let Some(m) = m {
            validate::per_channel(name, m, c)?;
        }
    }
    let counter = &inputs.counter;
    if !matches!(counter.shape, [_] | [_, 1]) {
        return Err(Error::invalid(
            "counter",
            format!(
                "expected shape [W] or [W, 1] (one element count per rank), got {:?}: CANN sums every \
                 element of counter into N, so any other shape (e.g. per-channel counts) would give a \
                 wrong N",
                counter.shape
            ),
        ));
    }
    validate::in_storage("counter", counter)?;
    validate::in_storage("gradOut", &inputs.grad_out)?;
    Ok(validate::in_storage("input", x)? == 0)
}

impl Args<'_> {
    /// [`check_inputs`] of this call's inputs; returns whether the input is empty.
    fn check_inputs(&self) -> Result<bool> {
        check_inputs(&ElemtBackwardInputs {
            grad_out: self.grad_out.layout(),
            input: self.input.layout(),
            mean: self.mean.layout(),
            invstd: self.invstd.layout(),
            weight: self.weight.map(Tensor::layout),
            sum_dy: self.sum_dy.layout(),
            sum_dy_xmu: self.sum_dy_xmu.layout(),
            counter: self.counter.layout(),
        })
    }
}

impl<'a> Operator<'a> for Args<'a> {
    const OP: &'static symbols::Operator = &symbols::BATCH_NORM_ELEMT_BACKWARD;
    const OUTPUTS: &'static [&'static str] = &["gradInput"];
    type Outputs = [&'a mut Tensor; 1];
    /// Whether the input is empty.
    type Plan = bool;
    type Scalars = ();

    /// The floating-point inputs (weight may be absent), then counter.
    fn inputs(&self) -> impl IntoIterator<Item = Arg<'a>> {
        [
            (Some(self.grad_out), "gradOut"),
            (Some(self.input), "input"),
            (Some(self.mean), "mean"),
            (Some(self.invstd), "invstd"),
            (self.weight, "weight"),
            (Some(self.sum_dy), "sumDy"),
            (Some(self.sum_dy_xmu), "sumDyXmu"),
            (Some(self.counter), "counter"),
        ]
    }

    /// The inputs, then gradInput against them.
    fn check(&self, [grad_input]: &Self::Outputs) -> Result<bool> {
        let empty = self.check_inputs()?;
        let out = grad_input.layout();
        validate::float_dtype("gradInput", out.dtype)?;
        validate::same_shape("gradInput", &out, "input", self.input.shape())?;
        validate::in_storage("gradInput", &out)?;
        Ok(empty)
    }

    fn scalars(&self) {}

    fn cpu(self, empty: bool, [grad_input]: Self::Outputs) -> Result<()> {
        if empty {
            return Ok(());
        }
        cpu::run(&self, grad_input)
    }

    unsafe fn phase1(api: &OpApi, (): (), h: Handles<'_>) -> Result<aclnnStatus> {
        let f = crate::acl::op_fn(&api.aclnnBatchNormElemtBackwardGetWorkspaceSize, Self::OP.phase1)?;
        let [grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, counter] =
            [0, 1, 2, 3, 4, 5, 6, 7].map(|i| h.input(i));
        // SAFETY: the signature is the header's (wrapper.h, checked against CANN's headers;
        // counter is non-const there, and CANN only reads it); the handles are the call's live
        // descriptors in the prototype's order and the out-pointers are valid (this function's
        // contract).
        Ok(unsafe {
            f(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, counter, h.output(0), h.size, h.executor)
        })
    }

    fn phase2(api: &OpApi) -> &std::result::Result<Phase2, libloading::Error> {
        &api.aclnnBatchNormElemtBackward
    }
}
