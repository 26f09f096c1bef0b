//! `aclnnBatchNormReduceBackward` on both backends: the per-channel reductions of BatchNorm's
//! backward pass and the building block of SyncBatchNorm.
//!
//! Per channel `c` (dim 1) of gradOut `dy` and input `x`, shape `(N, C, ...)`:
//! `sumDy[c] = Σ dy`, `sumDyXmu[c] = Σ dy·(x − mean[c])`, `gradWeight[c] = sumDyXmu[c]·invstd[c]`,
//! `gradBias[c] = sumDy[c]`. `weight` is accepted for API compatibility and never changes a value.

use ascend_sys::symbols::BATCH_NORM_REDUCE_BACKWARD as OP;

use super::launch::{DeviceCall, DevicePrepared};
use super::prepared::Prepared;
use super::validate::Meta;
use validate::Plan;
pub(crate) mod cpu;
pub(crate) mod kernel;
pub(crate) mod validate;
use crate::dtype::DType;
use crate::error::{Error, Result};
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

/// Computes the BatchNorm backward reductions into new tensors.
///
/// Per channel `c` (dim 1) of gradOut `dy` and input `x`, shape `(N, C, ...)`:
/// `sumDy[c] = Σ dy`, `sumDyXmu[c] = Σ dy·(x − mean[c])`, `gradWeight[c] = sumDyXmu[c]·invstd[c]`,
/// `gradBias[c] = sumDy[c]`. `weight` is accepted for API compatibility and never changes a value.
///
/// Arguments are validated first, on both backends alike; a rejected call returns
/// [`Error::InvalidArgument`] with aclnn's status (161002 invalid) and does nothing. On Ascend this
/// allocates the outputs (`aclrtMalloc`) and runs [`batch_norm_reduce_backward_into`]; the work is
/// asynchronous: read results with [`Tensor::to_vec`].
pub fn batch_norm_reduce_backward(
    stream: &Stream,
    grad_out: &Tensor,
    input: &Tensor,
    mean: &Tensor,
    invstd: &Tensor,
    weight: Option<&Tensor>,
    mask: OutputMask,
) -> Result<ReduceBackward> {
    let plan = validate_inputs(stream, grad_out, input, mean, invstd, weight)?;
    let dtype = if input.dtype() == DType::F16 && mean.dtype() == DType::F16 { DType::F16 } else { DType::F32 };
    let on = validate::enabled(mask);
    let mut outs: [Option<Tensor>; 4] = Default::default();
    for (slot, enabled) in outs.iter_mut().zip(on) {
        if enabled {
            *slot = Some(Tensor::alloc(stream, dtype, &[plan.channels], false)?);
        }
    }
    let [mut sum_dy, mut sum_dy_xmu, mut grad_weight, mut grad_bias] = outs;
    batch_norm_reduce_backward_into(
        stream,
        grad_out,
        input,
        mean,
        invstd,
        weight,
        mask,
        ReduceBackwardOut {
            sum_dy: sum_dy.as_mut(),
            sum_dy_xmu: sum_dy_xmu.as_mut(),
            grad_weight: grad_weight.as_mut(),
            grad_bias: grad_bias.as_mut(),
        },
    )?;
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
pub fn batch_norm_reduce_backward_into(
    stream: &Stream,
    grad_out: &Tensor,
    input: &Tensor,
    mean: &Tensor,
    invstd: &Tensor,
    weight: Option<&Tensor>,
    mask: OutputMask,
    out: ReduceBackwardOut<'_>,
) -> Result<()> {
    prepare_batch_norm_reduce_backward(stream, grad_out, input, mean, invstd, weight, mask, out)?.launch(stream, None)
}

/// Phase 1 of the two-phase API: validates the arguments and, on Ascend, creates the tensor
/// descriptors and the executor (`aclnnBatchNormReduceBackwardGetWorkspaceSize`).
///
/// The result borrows every tensor until it is launched or dropped, so none can be freed or
/// read in between. [`PreparedReduceBackward::launch`] runs phase 2; dropping it unlaunched
/// destroys the executor (`aclSetAclOpExecutorRepeatable` + `aclDestroyAclOpExecutor`) and writes
/// nothing.
#[allow(clippy::too_many_arguments)]
pub fn prepare_batch_norm_reduce_backward<'a>(
    stream: &Stream,
    grad_out: &'a Tensor,
    input: &'a Tensor,
    mean: &'a Tensor,
    invstd: &'a Tensor,
    weight: Option<&'a Tensor>,
    mask: OutputMask,
    out: ReduceBackwardOut<'a>,
) -> Result<PreparedReduceBackward<'a>> {
    let outs = validate::keep_enabled(mask, [out.sum_dy, out.sum_dy_xmu, out.grad_weight, out.grad_bias]);
    let plan = {
        let w = weight.map(meta);
        let metas = outs.each_ref().map(|o| o.as_deref().map(meta));
        validate::call(
            [&meta(grad_out), &meta(input), &meta(mean), &meta(invstd)],
            w.as_ref(),
            mask,
            metas.each_ref().map(Option::as_ref),
        )?
    };
    check_streams(stream, grad_out, input, mean, invstd, weight)?;
    for (t, name) in outs.iter().zip(validate::OUTPUT_NAMES) {
        if let Some(t) = t {
            t.check_stream(stream, name)?;
        }
    }

    match stream.ascend() {
        None => {
            let inputs = [grad_out, input, mean, invstd];
            Ok(Prepared::cpu(move || cpu_launch(plan, mask, inputs, outs)))
        }
        Some(_) => {
            ascend_prepare(stream, plan, mask, [grad_out, input, mean, invstd], weight, outs).map(Prepared::ascend)
        }
    }
}

/// The two-phase API's prepared call of this operator (see [`Prepared`]).
pub type PreparedReduceBackward<'a> = Prepared<'a>;

fn meta(t: &Tensor) -> Meta<'_> {
    Meta { dtype: t.dtype(), shape: t.shape(), strides: t.strides(), offset: t.offset(), storage_len: t.storage_len() }
}

/// Validates the inputs of the allocating entry point (whose outputs it makes itself).
fn validate_inputs(
    stream: &Stream,
    grad_out: &Tensor,
    input: &Tensor,
    mean: &Tensor,
    invstd: &Tensor,
    weight: Option<&Tensor>,
) -> Result<Plan> {
    let w = weight.map(meta);
    let plan = validate::inputs(&meta(grad_out), &meta(input), &meta(mean), &meta(invstd), w.as_ref())?;
    check_streams(stream, grad_out, input, mean, invstd, weight)?;
    Ok(plan)
}

/// Checks that every input lives where `stream` runs work.
fn check_streams(
    stream: &Stream,
    grad_out: &Tensor,
    input: &Tensor,
    mean: &Tensor,
    invstd: &Tensor,
    weight: Option<&Tensor>,
) -> Result<()> {
    for (name, t) in [("gradOut", grad_out), ("input", input), ("mean", mean), ("invstd", invstd)] {
        t.check_stream(stream, name)?;
    }
    match weight {
        Some(w) => w.check_stream(stream, "weight"),
        None => Ok(()),
    }
}

fn cpu_launch(plan: Plan, mask: OutputMask, inputs: [&Tensor; 4], outs: [Option<&mut Tensor>; 4]) -> Result<()> {
    let [grad_out, input, mean, invstd] = inputs.map(|t| t.as_host_view());
    let (Some(grad_out), Some(input), Some(mean), Some(invstd)) = (grad_out, input, mean, invstd) else {
        return Err(Error::internal("gradOut: a device tensor reached the CPU backend"));
    };
    let outs = outs.map(|o| o.and_then(|t| t.as_host_view_mut()));
    cpu::run(&plan, mask, grad_out, input, mean, invstd, outs)
}

/// Phase 1 on Ascend: every tensor described through the shared launch path.
fn ascend_prepare<'a>(
    stream: &Stream,
    plan: Plan,
    mask: OutputMask,
    [grad_out, input, mean, invstd]: [&'a Tensor; 4],
    weight: Option<&'a Tensor>,
    outs: [Option<&'a mut Tensor>; 4],
) -> Result<DevicePrepared<'a>> {
    let outs: [Option<&'a Tensor>; 4] = outs.map(|o| o.map(|t| &*t));
    let mut call = DeviceCall::new(stream)?;
    let grad_out = call.tensor(grad_out, "gradOut")?;
    let input = call.tensor(input, "input")?;
    let mean = call.tensor(mean, "mean")?;
    let invstd = call.tensor(invstd, "invstd")?;
    let weight = call.optional(weight, "weight")?;
    let mut out = [std::ptr::null_mut(); 4];
    for ((raw, t), name) in out.iter_mut().zip(outs).zip(validate::OUTPUT_NAMES) {
        *raw = call.optional(t, name)?;
    }
    let zero = if plan.empty { outs.into_iter().flatten().collect() } else { Vec::new() };
    let (input_g, weight_g, bias_g) = (mask.input_g, mask.weight_g, mask.bias_g);
    call.prepare(
        &OP,
        |cann, api| {
            let f = crate::acl::op_fn(&api.aclnnBatchNormReduceBackwardGetWorkspaceSize, OP.phase1)?;
            crate::acl::phase1(cann, OP.phase1, |size, executor| {
                // SAFETY: the signature is the header's (wrapper.h, checked against CANN's
                // headers); every non-null handle is a live descriptor held by `call`, which moves
                // into the prepared call and outlives the executor; the out-pointers are valid.
                unsafe {
                    f(
                        grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g, out[0], out[1], out[2],
                        out[3], size, executor,
                    )
                }
            })
        },
        |api| &api.aclnnBatchNormReduceBackward,
        zero,
    )
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

impl OutputMask {
    /// All four outputs.
    pub const ALL: OutputMask = OutputMask { input_g: true, weight_g: true, bias_g: true };
    /// No output (the call still validates its arguments).
    pub const NONE: OutputMask = OutputMask { input_g: false, weight_g: false, bias_g: false };
}
