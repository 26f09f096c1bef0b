//! `aclnnBatchNormStats` on both backends: the per-channel mean and inverse standard deviation
//! of an activation (the first step of SyncBatchNorm's forward pass).

use ascend_sys::symbols::BATCH_NORM_STATS as OP;

use super::launch::{DeviceCall, DevicePrepared};
use super::prepared::Prepared;
use super::validate::{self, Meta};
use crate::cpu::host;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::tensor::Tensor;

mod cpu;

/// The dtypes `input` may have. CANN takes bf16 input only on Ascend 950; Atlas A2/A3 and the
/// training series reject it, so both backends do.
const INPUT_DTYPES: [DType; 2] = [DType::F32, DType::F16];
const INPUT_NOTE: &str = "aclnnBatchNormStats takes bf16 input only on Ascend 950, not on Atlas A2/A3 or the \
                          training series, and this crate applies that rule on every backend: cast the input to f32";
/// The dtype of `mean` and `invstd`, on every product.
const STATS_DTYPES: [DType; 1] = [DType::F32];
const STATS_NOTE: &str = "aclnnBatchNormStats writes mean and invstd as f32 only";

/// Computes the per-channel mean and invstd of `input` into two new f32 tensors of shape `[C]`.
///
/// `input` has shape `(N, C, ...)`, rank 2..=8, `C > 0`, dtype f32 or f16 (bf16 is rejected with
/// 161002 on both backends, as on Atlas A2/A3: cast it to f32), and may be any strided view.
/// Per channel `c` (dim 1), over the `n` elements of every other dim:
/// `mean = Σx/n` and `invstd = 1/sqrt(Σ(x − mean)²/n + eps)` (the biased variance).
/// An empty input (N or a spatial dim 0) gives `mean = 0` and `invstd = NaN` on both backends.
/// `eps` must be finite in f32 (CANN computes with it in f32): NaN, ±inf or a value beyond f32's
/// range is rejected with 161002 on both backends.
///
/// A rejected call returns [`Error::InvalidArgument`] with aclnn's status (161002) and does
/// nothing. On Ascend the work is asynchronous on `stream`: read results with
/// [`Tensor::to_vec`]. Results are deterministic (the same bits every run, whatever the thread
/// count).
pub fn batch_norm_stats(stream: &Stream, input: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    let c = validate_input(&meta(input), eps)?;
    input.check_stream(stream, "input")?;
    let mut mean = Tensor::alloc(stream, DType::F32, &[c], false)?;
    let mut invstd = Tensor::alloc(stream, DType::F32, &[c], false)?;
    batch_norm_stats_into(stream, input, eps, &mut mean, &mut invstd)?;
    Ok((mean, invstd))
}

/// [`batch_norm_stats`] into caller-owned outputs: `mean` and `invstd` of shape `[C]` (any
/// stride but 0), dtype f32 (any other is rejected with 161002, as CANN does).
///
/// On Ascend this is `aclnnBatchNormStatsGetWorkspaceSize` followed by `aclnnBatchNormStats` on
/// `stream`, with the stream's cached workspace; it returns once the work is enqueued.
pub fn batch_norm_stats_into(
    stream: &Stream,
    input: &Tensor,
    eps: f64,
    mean: &mut Tensor,
    invstd: &mut Tensor,
) -> Result<()> {
    prepare_batch_norm_stats(stream, input, eps, mean, invstd)?.launch(stream, None)
}

/// Phase 1 of the two-phase API of [`batch_norm_stats_into`]: validates the arguments and, on
/// Ascend, creates the descriptors and the executor (`aclnnBatchNormStatsGetWorkspaceSize`).
/// The result borrows every tensor until it is launched ([`Prepared::launch`]) or dropped
/// (which writes nothing).
pub fn prepare_batch_norm_stats<'a>(
    stream: &Stream,
    input: &'a Tensor,
    eps: f64,
    mean: &'a mut Tensor,
    invstd: &'a mut Tensor,
) -> Result<Prepared<'a>> {
    validate_call(&meta(input), &meta(mean), &meta(invstd), eps)?;
    input.check_stream(stream, "input")?;
    mean.check_stream(stream, "mean")?;
    invstd.check_stream(stream, "invstd")?;
    match stream.ascend() {
        // CANN's kernel takes eps as f32 (docs/cann/SYNCBN.md): so does the CPU.
        None => Ok(Prepared::cpu(move || cpu_launch(input, f64::from(eps as f32), mean, invstd))),
        Some(_) => ascend_prepare(stream, input, eps, mean, invstd).map(Prepared::ascend),
    }
}

fn meta(t: &Tensor) -> Meta<'_> {
    Meta { dtype: t.dtype(), shape: t.shape(), strides: t.strides(), offset: t.offset(), storage_len: t.storage_len() }
}

/// Validates `input` (dtype, rank, channels, view) and eps; returns C.
fn validate_input(input: &Meta<'_>, eps: f64) -> Result<usize> {
    validate::dtype_in("input", input, &INPUT_DTYPES, INPUT_NOTE)?;
    let c = validate::activation("input", input)?;
    validate::in_storage("input", input)?;
    validate::f32_scalar("eps", eps)?;
    Ok(c)
}

/// Validates the input of a [`batch_norm_stats`] call as it does, launching nothing.
pub(crate) fn validate_args(stream: &Stream, input: &Tensor, eps: f64) -> Result<()> {
    validate_input(&meta(input), eps)?;
    input.check_stream(stream, "input")
}

/// Validates a whole call, in CANN's order: dtypes (input, mean, invstd), then shapes, then what
/// CANN does not check but would misread (views inside their storage, stride-0 outputs) or
/// computes with in f32 (eps must be finite in f32).
fn validate_call(input: &Meta<'_>, mean: &Meta<'_>, invstd: &Meta<'_>, eps: f64) -> Result<usize> {
    validate::dtype_in("input", input, &INPUT_DTYPES, INPUT_NOTE)?;
    validate::dtype_in("mean", mean, &STATS_DTYPES, STATS_NOTE)?;
    validate::dtype_in("invstd", invstd, &STATS_DTYPES, STATS_NOTE)?;
    let c = validate::activation("input", input)?;
    validate::per_channel_output("mean", mean, c)?;
    validate::per_channel_output("invstd", invstd, c)?;
    validate::in_storage("input", input)?;
    validate::f32_scalar("eps", eps)?;
    Ok(c)
}

fn cpu_launch(input: &Tensor, eps: f64, mean: &mut Tensor, invstd: &mut Tensor) -> Result<()> {
    let Some(data) = host::storage(input) else {
        return Err(Error::internal("input: a device tensor reached the CPU backend"));
    };
    let view = cpu::Input::new(data, input.shape(), input.strides(), input.offset());
    let moments = cpu::channel_moments(view, 0)?;
    host::write_vector(mean, "mean", moments.iter().map(|m| m.mean_invstd(eps).0))?;
    host::write_vector(invstd, "invstd", moments.iter().map(|m| m.mean_invstd(eps).1))
}

/// Phase 1 on Ascend. For an empty input CANN's executor itself fills mean with 0 and invstd
/// with NaN, so nothing is left for the launch to fill.
fn ascend_prepare<'a>(
    stream: &Stream,
    input: &'a Tensor,
    eps: f64,
    mean: &'a Tensor,
    invstd: &'a Tensor,
) -> Result<DevicePrepared<'a>> {
    let mut call = DeviceCall::new(stream)?;
    let input = call.tensor(input, "input")?.cast_const();
    let mean = call.tensor(mean, "mean")?;
    let invstd = call.tensor(invstd, "invstd")?;
    call.prepare(
        &OP,
        |cann, api| {
            let f = crate::acl::op_fn(&api.aclnnBatchNormStatsGetWorkspaceSize, OP.phase1)?;
            crate::acl::phase1(cann, OP.phase1, |size, executor| {
                // SAFETY: the signature is the header's (wrapper.h); the three handles are live
                // descriptors held by `call`, which moves into the prepared call and outlives the
                // executor; the out-pointers are valid for the call.
                unsafe { f(input, eps, mean, invstd, size, executor) }
            })
        },
        |api| &api.aclnnBatchNormStats,
        Vec::new(),
    )
}
