//! `aclnnBatchNormStats` on both backends: the per-channel mean and inverse standard deviation
//! of an activation (the first step of SyncBatchNorm's forward pass).

use ascend_sys::{aclnnStatus, symbols, OpApi};

use super::call::{check_streams, entry_points, run_checked};
use super::launch::Phase2;
use super::operator::{Arg, Handles, Operator};
use super::prepared::Prepared;
use super::validate;
use crate::cpu::host;
use crate::dtype::DType;
use crate::error::Result;
use crate::layout::Layout;
use crate::stream::Stream;
use crate::tensor::Tensor;

pub(in crate::ops) mod cpu;

/// The dtypes `input` may have. CANN takes bf16 input only on Ascend 950; Atlas A2/A3 and the
/// training series reject it, so both backends do.
const INPUT_DTYPES: [DType; 2] = [DType::F32, DType::F16];
const INPUT_NOTE: &str = "aclnnBatchNormStats takes bf16 input only on Ascend 950, not on Atlas A2/A3 or the \
                          training series, and this crate applies that rule on every backend: cast the input to f32";
/// The dtype of `mean` and `invstd`, on every product.
const STATS_DTYPES: [DType; 1] = [DType::F32];
const STATS_NOTE: &str = "aclnnBatchNormStats writes mean and invstd as f32 only";

entry_points! {
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
    /// A rejected call returns [`Error::InvalidArgument`](crate::Error::InvalidArgument) with aclnn's
    /// status (161002) and does nothing. On Ascend the work is asynchronous on `stream`: read results with
    /// [`Tensor::to_vec`]. Results are deterministic (the same bits every run, whatever the thread
    /// count).
    pub fn batch_norm_stats(
        stream: &Stream,
        input: &Tensor,
        eps: f64,
    ) -> Result<(Tensor, Tensor)> {
        let op = Args { input, eps };
        let c = op.check_inputs()?;
        check_streams(stream, op.inputs())?;
        let mut mean = Tensor::alloc(stream, DType::F32, &[c], false)?;
        let mut invstd = Tensor::alloc(stream, DType::F32, &[c], false)?;
        run_checked(stream, op, c, [&mut mean, &mut invstd])?;
        Ok((mean, invstd))
    }

    /// [`batch_norm_stats`] into caller-owned outputs: `mean` and `invstd` of shape `[C]` (any
    /// stride but 0), dtype f32 (any other is rejected with 161002, as CANN does).
    ///
    /// On Ascend this is `aclnnBatchNormStatsGetWorkspaceSize` followed by `aclnnBatchNormStats` on
    /// `stream`, with the stream's cached workspace; it returns once the work is enqueued.
    pub fn batch_norm_stats_into(.., mean: &mut Tensor, invstd: &mut Tensor) => (Args { input, eps }, [mean, invstd]);

    /// Phase 1 of the two-phase API of [`batch_norm_stats_into`]: validates the arguments and, on
    /// Ascend, creates the descriptors and the executor (`aclnnBatchNormStatsGetWorkspaceSize`).
    /// The result borrows every tensor until it is launched ([`Prepared::launch`]) or dropped
    /// (which writes nothing).
    pub fn prepare_batch_norm_stats(.., ..) -> Prepared;
}

/// Validates the input of a call over its layout and eps, as every entry does before anything
/// else (dtype, rank, channels, view, then eps); returns C. Checks no stream, allocates nothing:
/// a composite call (`sync_batch_norm`) asks it before its first side effect.
pub(crate) fn check_inputs(input: &Layout<'_>, eps: f64) -> Result<usize> {
    validate::dtype_in("input", input, &INPUT_DTYPES, INPUT_NOTE)?;
    let c = validate::activation("input", input)?;
    validate::in_storage("input", input)?;
    validate::f32_scalar("eps", eps)?;
    Ok(c)
}

/// The CPU kernel's mean and invstd of a host `input` of any float dtype, bf16 included (which the
/// operator refuses, after CANN's rule on Atlas A2/A3): `sync_batch_norm`'s local statistics on
/// the CPU backend, in one pass and without a host read. The caller validated `input` as an
/// activation and `mean`/`invstd` as `[C]` f32 host tensors.
pub(crate) fn host_stats_into(input: &Tensor, eps: f64, mean: &mut Tensor, invstd: &mut Tensor) -> Result<()> {
    validate::activation("input", &input.layout())?;
    cpu_stats_into(input, eps, [mean, invstd])
}

/// The CPU backend's call: the channel moments of the host `input` (validated) into `mean` and
/// `invstd`, with `eps` taken in f32 as CANN's kernel takes it (docs/cann/SYNCBN.md).
fn cpu_stats_into(input: &Tensor, eps: f64, [mean, invstd]: [&mut Tensor; 2]) -> Result<()> {
    let data = host::view(input, "input")?.storage();
    let view = cpu::Input::new(data, input.shape(), input.strides(), input.offset());
    let moments = cpu::channel_moments(view, 0)?;
    let eps = f64::from(eps as f32);
    host::write_vector(mean, "mean", moments.iter().map(|m| m.mean_invstd(eps).0))?;
    host::write_vector(invstd, "invstd", moments.iter().map(|m| m.mean_invstd(eps).1))
}

/// The arguments of a call but its outputs.
struct Args<'a> {
    input: &'a Tensor,
    eps: f64,
}

impl Args<'_> {
    /// [`check_inputs`] of this call's input and eps; returns C.
    fn check_inputs(&self) -> Result<usize> {
        check_inputs(&self.input.layout(), self.eps)
    }
}

impl<'a> Operator<'a> for Args<'a> {
    const OP: &'static symbols::Operator = &symbols::BATCH_NORM_STATS;
    const OUTPUTS: &'static [&'static str] = &["mean", "invstd"];
    type Outputs = [&'a mut Tensor; 2];
    /// C.
    type Plan = usize;
    /// eps.
    type Scalars = f64;

    fn inputs(&self) -> impl IntoIterator<Item = Arg<'a>> {
        [(Some(self.input), "input")]
    }

    /// Validates a whole call, in CANN's order: dtypes (input, mean, invstd), then shapes, then
    /// what CANN does not check but would misread (views inside their storage, stride-0 outputs)
    /// or computes with in f32 (eps must be finite in f32).
    fn check(&self, [mean, invstd]: &Self::Outputs) -> Result<usize> {
        let (input, mean, invstd) = (self.input.layout(), mean.layout(), invstd.layout());
        validate::dtype_in("input", &input, &INPUT_DTYPES, INPUT_NOTE)?;
        validate::dtype_in("mean", &mean, &STATS_DTYPES, STATS_NOTE)?;
        validate::dtype_in("invstd", &invstd, &STATS_DTYPES, STATS_NOTE)?;
        let c = validate::activation("input", &input)?;
        validate::per_channel_output("mean", &mean, c)?;
        validate::per_channel_output("invstd", &invstd, c)?;
        validate::in_storage("input", &input)?;
        validate::f32_scalar("eps", self.eps)?;
        Ok(c)
    }

    fn scalars(&self) -> f64 {
        self.eps
    }

    fn cpu(self, _c: usize, outputs: Self::Outputs) -> Result<()> {
        cpu_stats_into(self.input, self.eps, outputs)
    }

    /// For an empty input CANN's executor itself fills mean with 0 and invstd with NaN, so
    /// nothing is left for the launch to fill.
    unsafe fn phase1(api: &OpApi, eps: f64, h: Handles<'_>) -> Result<aclnnStatus> {
        let f = crate::acl::op_fn(&api.aclnnBatchNormStatsGetWorkspaceSize, Self::OP.phase1)?;
        // SAFETY: the signature is the header's (wrapper.h); the handles are the call's live
        // descriptors in the prototype's order and the out-pointers are valid (this function's
        // contract).
        Ok(unsafe { f(h.input(0).cast_const(), eps, h.output(0), h.output(1), h.size, h.executor) })
    }

    fn phase2(api: &OpApi) -> &std::result::Result<Phase2, libloading::Error> {
        &api.aclnnBatchNormStats
    }
}
