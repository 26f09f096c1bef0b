//! `aclnnBatchNormReduceBackward` on both backends: the per-channel reductions of BatchNorm's
//! backward pass and the building block of SyncBatchNorm.
//!
//! Per channel `c` (dim 1) of gradOut `dy` and input `x`, shape `(N, C, ...)`:
//! `sumDy[c] = Σ dy`, `sumDyXmu[c] = Σ dy·(x − mean[c])`, `gradWeight[c] = sumDyXmu[c]·invstd[c]`,
//! `gradBias[c] = sumDy[c]`. `weight` is accepted for API compatibility and never changes a value.

pub(crate) mod cpu;
pub(crate) mod kernel;
pub(crate) mod validate;

use ascend_sys::{aclnnStatus, symbols, OpApi};

use self::validate::Plan;
use super::call::{check_streams, entry_points, run_checked};
use super::launch::Phase2;
use super::operator::{Arg, Handles, Operator};
use super::prepared::Prepared;
use crate::cpu::host;
use crate::cpu::ViewMut;
use crate::dtype::DType;
use crate::error::Result;
use crate::stream::Stream;
use crate::tensor::Tensor;

/// The outputs of [`batch_norm_reduce_backward`]: each `Some` exactly when the mask asked for it,
/// each of shape `[C]`, f16 when input and mean are both f16, else f32 (op-plugin's rule).
#[derive(Debug, Default)]
pub struct ReduceBackward {
    /// Σ dy per channel (`inputG`).
    pub sum_dy: Option<Tensor>,
    /// Σ dy·(x − mean) per channel (`inputG`).
    pub sum_dy_xmu: Option<Tensor>,
    /// sumDyXmu·invstd per channel (`weightG`).
    pub grad_weight: Option<Tensor>,
    /// Σ dy per channel (`biasG`).
    pub grad_bias: Option<Tensor>,
}

/// Caller-owned outputs for [`batch_norm_reduce_backward_into`]: shape `[C]` (any stride), any of
/// f32/f16/bf16. Those the mask turns on are required; the others are ignored and left untouched.
#[derive(Debug, Default)]
pub struct ReduceBackwardOut<'a> {
    /// Receives Σ dy (`inputG`).
    pub sum_dy: Option<&'a mut Tensor>,
    /// Receives Σ dy·(x − mean) (`inputG`).
    pub sum_dy_xmu: Option<&'a mut Tensor>,
    /// Receives sumDyXmu·invstd (`weightG`).
    pub grad_weight: Option<&'a mut Tensor>,
    /// Receives Σ dy (`biasG`).
    pub grad_bias: Option<&'a mut Tensor>,
}

entry_points! {
    /// Computes the BatchNorm backward reductions into new tensors.
    ///
    /// Per channel `c` (dim 1) of gradOut `dy` and input `x`, shape `(N, C, ...)`:
    /// `sumDy[c] = Σ dy`, `sumDyXmu[c] = Σ dy·(x − mean[c])`, `gradWeight[c] = sumDyXmu[c]·invstd[c]`,
    /// `gradBias[c] = sumDy[c]`. `weight` is accepted for API compatibility and never changes a value.
    ///
    /// Arguments are validated first, on both backends alike; a rejected call returns
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) with aclnn's status (161002 invalid)
    /// and does nothing. On Ascend this allocates the outputs (`aclrtMalloc`) and runs
    /// [`batch_norm_reduce_backward_into`]; the work is asynchronous: read results with
    /// [`Tensor::to_vec`].
    pub fn batch_norm_reduce_backward(
        stream: &Stream,
        grad_out: &Tensor,
        input: &Tensor,
        mean: &Tensor,
        invstd: &Tensor,
        weight: Option<&Tensor>,
        mask: OutputMask,
    ) -> Result<ReduceBackward> {
        let op = Args { grad_out, input, mean, invstd, weight, mask };
        let plan = op.check_inputs()?;
        check_streams(stream, op.inputs())?;
        let dtype = if input.dtype() == DType::F16 && mean.dtype() == DType::F16 { DType::F16 } else { DType::F32 };
        let mut outs: [Option<Tensor>; 4] = Default::default();
        for (slot, enabled) in outs.iter_mut().zip(validate::enabled(mask)) {
            if enabled {
                *slot = Some(Tensor::alloc(stream, dtype, &[plan.channels], false)?);
            }
        }
        let [mut sum_dy, mut sum_dy_xmu, mut grad_weight, mut grad_bias] = outs;
        let outs = [sum_dy.as_mut(), sum_dy_xmu.as_mut(), grad_weight.as_mut(), grad_bias.as_mut()];
        run_checked(stream, op, plan, outs)?;
        Ok(ReduceBackward { sum_dy, sum_dy_xmu, grad_weight, grad_bias })
    }

    /// Computes the BatchNorm backward reductions into caller-owned tensors (any of f32/f16/bf16,
    /// shape `[C]`, any stride). The outputs the mask turns on must be given (else 161001).
    ///
    /// On Ascend this is `aclnnBatchNormReduceBackwardGetWorkspaceSize` followed by
    /// `aclnnBatchNormReduceBackward` on `stream`, with the stream's cached workspace (no allocation in
    /// a steady loop of same-size calls). The call returns once the work is enqueued; every tensor may
    /// be dropped at once (its memory is freed after the stream has finished with it).
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_reduce_backward_into(.., out: ReduceBackwardOut<'_>) => (
        Args { grad_out, input, mean, invstd, weight, mask },
        validate::keep_enabled(mask, [out.sum_dy, out.sum_dy_xmu, out.grad_weight, out.grad_bias]),
    );

    /// Phase 1 of the two-phase API: validates the arguments and, on Ascend, creates the tensor
    /// descriptors and the executor (`aclnnBatchNormReduceBackwardGetWorkspaceSize`).
    ///
    /// The result borrows every tensor until it is launched or dropped, so none can be freed or
    /// read in between. [`PreparedReduceBackward::launch`] runs phase 2; dropping it unlaunched
    /// destroys the executor (`aclSetAclOpExecutorRepeatable` + `aclDestroyAclOpExecutor`) and writes
    /// nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_batch_norm_reduce_backward(.., ..) -> PreparedReduceBackward;
}

/// The two-phase API's prepared call of this operator (see [`Prepared`]).
pub type PreparedReduceBackward<'a> = Prepared<'a>;

/// The arguments of a call but its outputs.
struct Args<'a> {
    grad_out: &'a Tensor,
    input: &'a Tensor,
    mean: &'a Tensor,
    invstd: &'a Tensor,
    weight: Option<&'a Tensor>,
    mask: OutputMask,
}

impl Args<'_> {
    /// Validates the inputs (of the allocating entry, which makes its outputs itself).
    fn check_inputs(&self) -> Result<Plan> {
        let w = self.weight.map(Tensor::layout);
        validate::inputs(
            &self.grad_out.layout(),
            &self.input.layout(),
            &self.mean.layout(),
            &self.invstd.layout(),
            w.as_ref(),
        )
    }
}

impl<'a> Operator<'a> for Args<'a> {
    const OP: &'static symbols::Operator = &symbols::BATCH_NORM_REDUCE_BACKWARD;
    const OUTPUTS: &'static [&'static str] = &validate::OUTPUT_NAMES;
    /// Those the mask turns off are `None` ([`validate::keep_enabled`]).
    type Outputs = [Option<&'a mut Tensor>; 4];
    type Plan = Plan;
    type Scalars = OutputMask;

    fn inputs(&self) -> impl IntoIterator<Item = Arg<'a>> {
        [
            (Some(self.grad_out), "gradOut"),
            (Some(self.input), "input"),
            (Some(self.mean), "mean"),
            (Some(self.invstd), "invstd"),
            (self.weight, "weight"),
        ]
    }

    fn check(&self, outs: &Self::Outputs) -> Result<Plan> {
        let w = self.weight.map(Tensor::layout);
        let metas = outs.each_ref().map(|o| o.as_deref().map(Tensor::layout));
        validate::call(
            [&self.grad_out.layout(), &self.input.layout(), &self.mean.layout(), &self.invstd.layout()],
            w.as_ref(),
            self.mask,
            metas.each_ref().map(Option::as_ref),
        )
    }

    fn scalars(&self) -> OutputMask {
        self.mask
    }

    fn cpu(self, plan: Plan, outs: Self::Outputs) -> Result<()> {
        let (grad_out, input) = (host::view(self.grad_out, "gradOut")?, host::view(self.input, "input")?);
        let (mean, invstd) = (host::view(self.mean, "mean")?, host::view(self.invstd, "invstd")?);
        let mut views: [Option<ViewMut<'_>>; 4] = Default::default();
        for ((view, out), name) in views.iter_mut().zip(outs).zip(validate::OUTPUT_NAMES) {
            *view = out.map(|t| host::view_mut(t, name)).transpose()?;
        }
        cpu::run(&plan, self.mask, grad_out, input, mean, invstd, views)
    }

    unsafe fn phase1(api: &OpApi, mask: OutputMask, h: Handles<'_>) -> Result<aclnnStatus> {
        let f = crate::acl::op_fn(&api.aclnnBatchNormReduceBackwardGetWorkspaceSize, Self::OP.phase1)?;
        let [grad_out, input, mean, invstd, weight] = [0, 1, 2, 3, 4].map(|i| h.input(i));
        let [sum_dy, sum_dy_xmu, grad_weight, grad_bias] = [0, 1, 2, 3].map(|i| h.output(i));
        let (input_g, weight_g, bias_g) = (mask.input_g, mask.weight_g, mask.bias_g);
        // SAFETY: the signature is the header's (wrapper.h, checked against CANN's headers); the
        // handles are the call's live descriptors in the prototype's order and the out-pointers
        // are valid (this function's contract).
        Ok(unsafe {
            f(
                grad_out,
                input,
                mean,
                invstd,
                weight,
                input_g,
                weight_g,
                bias_g,
                sum_dy,
                sum_dy_xmu,
                grad_weight,
                grad_bias,
                h.size,
                h.executor,
            )
        })
    }

    fn phase2(api: &OpApi) -> &std::result::Result<Phase2, libloading::Error> {
        &api.aclnnBatchNormReduceBackward
    }

    /// CANN's kernel leaves the outputs of an empty input unwritten: they are zeros.
    fn zero_after_launch(plan: &Plan) -> bool {
        plan.empty
    }
}

/// Which outputs to compute: `input_g` → sumDy and sumDyXmu, `weight_g` → gradWeight,
/// `bias_g` → gradBias (aclnn's `inputG`, `weightG`, `biasG`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct OutputMask {
    /// Compute sumDy and sumDyXmu.
    pub input_g: bool,
    /// Compute gradWeight.
    pub weight_g: bool,
    /// Compute gradBias.
    pub bias_g: bool,
}

impl super::operator::ScalarBits for OutputMask {
    fn bits(&self) -> [u64; 4] {
        [u64::from(self.input_g) | u64::from(self.weight_g) << 1 | u64::from(self.bias_g) << 2, 0, 0, 0]
    }
}

impl OutputMask {
    /// All four outputs.
    pub const ALL: OutputMask = OutputMask { input_g: true, weight_g: true, bias_g: true };
    /// No output (the call still validates its arguments).
    pub const NONE: OutputMask = OutputMask { input_g: false, weight_g: false, bias_g: false };
}
