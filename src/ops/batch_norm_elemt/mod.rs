//! `aclnnBatchNormElemt` on both backends: BatchNorm's normalisation with given statistics,
//! the last step of SyncBatchNorm's forward pass.
//!
//! The public docs are on [`batch_norm_elemt`].

pub(in crate::ops) mod cpu;

use ascend_sys::symbols::BATCH_NORM_ELEMT as OP;

use super::launch::{DeviceCall, DevicePrepared};
use super::prepared::Prepared;
use super::validate::{self, Meta};
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::tensor::Tensor;

/// Normalises `input` with the given per-channel statistics into a new tensor of `input`'s shape
/// and dtype.
///
/// Per element of channel `c` (dim 1) of `input` `x`, shape `(N, C, ...)`:
/// `output = (x − mean[c])·|invstd[c]|·weight[c] + bias[c]`; `weight` defaults to 1 and `bias` to
/// 0 (invstd is positive for real statistics; see Numerics for why the magnitude).
///
/// # Arguments
/// * `input` and `output`: 2 to 8 dims, the same shape, `C = shape[1] ≠ 0`; any strides (the
///   output must not overlap itself). An empty input (some dim 0) computes nothing and succeeds.
/// * `weight`, `bias`, `mean`, `invstd`: shape `[C]`, any stride.
/// * dtypes: each of `input`, `weight`, `bias`, `mean`, `invstd` is f32, f16 or bf16 on its own
///   (CANN checks each tensor's dtype separately on Atlas A2/A3, so bf16/f16 activations with f32
///   statistics, which is what torch passes, are accepted); `output` must have `input`'s dtype
///   (op-plugin's rule; whether CANN computes a differing output dtype correctly is unconfirmed).
///   Whether CANN computes mixed dtypes correctly on hardware is **unconfirmed**: both backends
///   here widen every tensor to f32 and round the result once into the output dtype.
/// * `eps` is used only by CANN's implementation (see below); it must be finite in f32.
///
/// Errors have aclnn's status 161002 (`ACLNN_ERR_PARAM_INVALID`) on both backends; a rejected
/// call writes nothing. (CANN returns 161002, not 161001, for a null input, mean, invstd or
/// output: that case cannot arise here, every one of them is a reference.)
///
/// # Numerics
/// * Ascend: CANN rebuilds the variance `var = 1/invstd² − eps` and runs inference BatchNorm,
///   `(x − mean)/sqrt(var + eps)·weight + bias`. The round trip costs a few f32 ulps of the scale,
///   and more when `eps` is large next to `1/invstd²` (the subtraction cancels: the relative error
///   of the scale grows like `eps·invstd²·2⁻²⁴`; `eps·invstd² ≤ 1` whenever invstd came from
///   statistics computed with the same eps). It also loses invstd's sign: **a negative invstd
///   acts as `|invstd|`** (and an invstd whose square overflows or underflows f32 gives an
///   infinite or zero scale). The mock CANN computes exactly this, in f32.
/// * CPU: `scale[c] = |invstd[c]|·weight[c]` (the magnitude, as on Ascend) rounded once to f32 (the
///   product of two f32 values is exact in f64), then per element in f32
///   `(x − mean[c])·scale[c] + bias[c]`, rounded once into the output dtype. `eps` is not used
///   (the round trip cancels it). Error: at most about `4·2⁻²⁴·|x − mean|·|scale| + 2⁻²⁴·|bias|` before the
///   final rounding (half an ulp of the output dtype). Deterministic: the same bits on every run
///   and for any thread count; runs at memory speed on contiguous and channels-last data.
///
/// # Determinism on hardware
/// On real Atlas A2/A3 and Atlas training (910) hardware, aclnnBatchNormElemt is documented as
/// **non-deterministic by default**: its results may differ from run to run (in the last bits).
/// It is deterministic when the context's deterministic option is set, i.e. CANN's
/// `aclrtCtxSetSysParamOpt(ACL_OPT_DETERMINISTIC, 1)` (or the process-wide
/// `aclrtSetSysParamOpt(ACL_OPT_DETERMINISTIC, 1)`) from `libascendcl.so`, which this crate does
/// not bind: call it through your own FFI on the thread whose context runs the stream. It is
/// deterministic on Ascend 950. The CPU backend and the mock are always deterministic.
///
/// # Calling
/// Arguments are validated first, on both backends alike; a rejected call returns
/// [`Error::InvalidArgument`] (161002) and allocates nothing. On Ascend the work is asynchronous on
/// `stream`: read the result with [`Tensor::to_vec`].
pub fn batch_norm_elemt(
    stream: &Stream,
    input: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    mean: &Tensor,
    invstd: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    validate_inputs(input, weight, bias, mean, invstd, eps)?;
    check_streams(stream, input, weight, bias, mean, invstd)?;
    let mut output = Tensor::alloc(stream, input.dtype(), input.shape(), false)?;
    batch_norm_elemt_into(stream, input, weight, bias, mean, invstd, eps, &mut output)?;
    Ok(output)
}

/// [`batch_norm_elemt`] into the caller-owned `output` (same shape and dtype as `input`, any
/// strides that do not overlap themselves).
///
/// On Ascend this is `aclnnBatchNormElemtGetWorkspaceSize` followed by `aclnnBatchNormElemt` on
/// `stream`, with the stream's cached workspace. The call returns once the work is enqueued; every
/// tensor may be dropped at once (its memory is freed after the stream has finished with it).
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_elemt_into(
    stream: &Stream,
    input: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    mean: &Tensor,
    invstd: &Tensor,
    eps: f64,
    output: &mut Tensor,
) -> Result<()> {
    prepare_batch_norm_elemt(stream, input, weight, bias, mean, invstd, eps, output)?.launch(stream, None)
}

/// Phase 1 of the two-phase API: validates the arguments and, on Ascend, creates the tensor
/// descriptors and the executor (`aclnnBatchNormElemtGetWorkspaceSize`).
///
/// The result borrows every tensor until it is launched or dropped. [`Prepared::launch`] runs
/// phase 2; dropping it unlaunched destroys the executor and writes nothing.
#[allow(clippy::too_many_arguments)]
pub fn prepare_batch_norm_elemt<'a>(
    stream: &Stream,
    input: &'a Tensor,
    weight: Option<&'a Tensor>,
    bias: Option<&'a Tensor>,
    mean: &'a Tensor,
    invstd: &'a Tensor,
    eps: f64,
    output: &'a mut Tensor,
) -> Result<Prepared<'a>> {
    let empty = validate_inputs(input, weight, bias, mean, invstd, eps)?;
    validate_output(input, &meta(output))?;
    check_streams(stream, input, weight, bias, mean, invstd)?;
    output.check_stream(stream, "output")?;
    match stream.ascend() {
        None => Ok(Prepared::cpu(move || {
            if empty {
                return Ok(());
            }
            cpu::run(input, weight, bias, mean, invstd, eps as f32, output)
        })),
        Some(_) => ascend_prepare(stream, input, weight, bias, mean, invstd, eps, output).map(Prepared::ascend),
    }
}

pub(crate) fn meta(t: &Tensor) -> Meta<'_> {
    Meta { dtype: t.dtype(), shape: t.shape(), strides: t.strides(), offset: t.offset(), storage_len: t.storage_len() }
}

/// Validates the inputs in CANN's order (dtypes, then shapes), then what CANN does not check
/// (views inside their storage, eps). Returns whether the input is empty.
fn validate_inputs(
    input: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    mean: &Tensor,
    invstd: &Tensor,
    eps: f64,
) -> Result<bool> {
    // Each tensor's dtype on its own (Atlas A2/A3: f32, f16, bf16).
    for (name, t) in
        [("input", Some(input)), ("weight", weight), ("bias", bias), ("mean", Some(mean)), ("invstd", Some(invstd))]
    {
        if let Some(t) = t {
            validate::float_dtype(name, t.dtype())?;
        }
    }
    let x = meta(input);
    let c = validate::activation("input", &x)?;
    for (name, t) in [("weight", weight), ("bias", bias), ("mean", Some(mean)), ("invstd", Some(invstd))] {
        if let Some(t) = t {
            validate::per_channel(name, &meta(t), c)?;
        }
    }
    let n = validate::in_storage("input", &x)?;
    validate::f32_scalar("eps", eps)?;
    Ok(n == 0)
}

/// Validates the output against the (validated) input.
fn validate_output(input: &Tensor, out: &Meta<'_>) -> Result<()> {
    if out.dtype != input.dtype() {
        return Err(Error::invalid(
            "output",
            format!("dtype must equal input's ({}), got {}", input.dtype(), out.dtype),
        ));
    }
    validate::same_shape("output", out, "input", input.shape())?;
    validate::in_storage("output", out)?;
    validate::distinct_elements("output", out)
}

/// Checks that every input lives where `stream` runs work.
fn check_streams(
    stream: &Stream,
    input: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    mean: &Tensor,
    invstd: &Tensor,
) -> Result<()> {
    for (name, t) in
        [("input", Some(input)), ("weight", weight), ("bias", bias), ("mean", Some(mean)), ("invstd", Some(invstd))]
    {
        if let Some(t) = t {
            t.check_stream(stream, name)?;
        }
    }
    Ok(())
}

/// Validates the arguments of a [`batch_norm_elemt`] call as it does, launching nothing (for a
/// composite call that must refuse a bad argument before its first side effect).
pub(crate) fn validate_args(
    stream: &Stream,
    input: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    mean: &Tensor,
    invstd: &Tensor,
    eps: f64,
) -> Result<()> {
    validate_inputs(input, weight, bias, mean, invstd, eps)?;
    check_streams(stream, input, weight, bias, mean, invstd)
}

/// Phase 1 on Ascend: every tensor described through the shared launch path.
#[allow(clippy::too_many_arguments)]
fn ascend_prepare<'a>(
    stream: &Stream,
    input: &'a Tensor,
    weight: Option<&'a Tensor>,
    bias: Option<&'a Tensor>,
    mean: &'a Tensor,
    invstd: &'a Tensor,
    eps: f64,
    output: &'a Tensor,
) -> Result<DevicePrepared<'a>> {
    let mut call = DeviceCall::new(stream)?;
    let input = call.tensor(input, "input")?;
    let weight = call.optional(weight, "weight")?;
    let bias = call.optional(bias, "bias")?;
    let mean = call.tensor(mean, "mean")?;
    let invstd = call.tensor(invstd, "invstd")?;
    let output = call.tensor(output, "output")?;
    call.prepare(
        &OP,
        |cann, api| {
            let f = crate::acl::op_fn(&api.aclnnBatchNormElemtGetWorkspaceSize, OP.phase1)?;
            crate::acl::phase1(cann, OP.phase1, |size, executor| {
                // SAFETY: the signature is the header's (wrapper.h, checked against CANN's
                // headers; mean and invstd are non-const there, and CANN only reads them); every
                // non-null handle is a live descriptor held by `call`, which moves into the
                // prepared call and outlives the executor; the out-pointers are valid.
                unsafe { f(input, weight, bias, mean, invstd, eps, output, size, executor) }
            })
        },
        |api| &api.aclnnBatchNormElemt,
        Vec::new(),
    )
}
