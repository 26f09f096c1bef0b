//! `aclnnBatchNorm` on both backends: BatchNorm's forward pass on one device, training (batch
//! statistics, running statistics updated in place) or inference (running statistics).
//!
//! The public docs are on [`batch_norm`].

mod cpu;

use ascend_sys::{aclnnStatus, symbols, OpApi};

use super::call::{check_streams, entry_points, run_checked};
use super::launch::Phase2;
use super::operator::{Arg, Handles, Operator, ScalarBits};
use super::prepared::Prepared;
use super::validate;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::tensor::Tensor;

/// The statistics a training forward pass saves for its backward pass: the batch mean and a
/// second per-channel statistic, both `[C]` f32.
///
/// **Opaque on purpose.** The tensor CANN names `saveInvstd` holds the batch *variance* on Atlas
/// A2/A3 and Atlas training (910) hardware, and 1/sqrt(var + eps) only on Ascend 950
/// (aclnnBatchNorm.md; `docs/cann/LAYER.md` §2.2). Handing it to an operator that takes invstd
/// (`batch_norm_elemt`, `batch_norm_reduce_backward`, ...) would be silently wrong on one chip or
/// the other, so no accessor exposes it: only [`batch_norm_backward`](super::batch_norm_backward),
/// which reads it as the same chip's forward wrote it, accepts it. An eval-mode forward saves
/// nothing (its backward uses the running statistics).
#[derive(Debug)]
pub struct BatchNormSaved {
    pub(in crate::ops) stats: Option<[Tensor; 2]>,
}

impl BatchNormSaved {
    /// Room for the statistics of `channels` channels on `stream`'s device (two `[C]` f32
    /// tensors), for [`batch_norm_into`].
    pub fn new(stream: &Stream, channels: usize) -> Result<Self> {
        let mean = Tensor::alloc(stream, DType::F32, &[channels], false)?;
        let var = Tensor::alloc(stream, DType::F32, &[channels], false)?;
        Ok(BatchNormSaved { stats: Some([mean, var]) })
    }

    /// The channel count of the saved statistics (`None`: an eval-mode forward saved nothing).
    pub fn channels(&self) -> Option<usize> {
        self.stats.as_ref().map(|[m, _]| m.shape()[0])
    }

    /// The two tensors the forward writes in training (none in eval).
    fn slots(&mut self, training: bool) -> [Option<&mut Tensor>; 2] {
        match (&mut self.stats, training) {
            (Some([m, v]), true) => [Some(m), Some(v)],
            _ => [None, None],
        }
    }
}

/// Phase 1's scalars: `training`, momentum, eps.
#[derive(Clone, Copy, Debug)]
struct Scalars {
    training: bool,
    momentum: f64,
    eps: f64,
}

impl ScalarBits for Scalars {
    fn bits(&self) -> [u64; 4] {
        [u64::from(self.training), self.momentum.to_bits(), self.eps.to_bits(), 0]
    }
}

entry_points! {
    /// BatchNorm's forward pass (`aclnnBatchNorm`): returns the output (the input's shape and
    /// dtype) and the [`BatchNormSaved`] statistics its backward pass takes.
    ///
    /// Per channel `c` (dim 1) of `input` `x`, shape `(N, C, ...)`, with `n` elements per channel:
    /// * `training`: `mean = Σx/n`, `var = Σ(x − mean)²/n` (biased);
    ///   `y = (x − mean)/sqrt(var + eps)·weight + bias`; in place, when given,
    ///   `running_mean ← (1 − momentum)·running_mean + momentum·mean` and
    ///   `running_var ← (1 − momentum)·running_var + momentum·var·n/(n − 1)` (the unbiased
    ///   variance, torch's rule; `n = 1` gives an infinite one, as f32 does);
    /// * inference (`!training`): `y = (x − running_mean)/sqrt(running_var + eps)·weight + bias`,
    ///   nothing else written.
    ///
    /// Absent `weight`, `bias`, `running_mean`, `running_var` act as 1, 0, 0, 1 (CANN's fills).
    ///
    /// # Arguments
    /// * `input`: 2 to 8 dims, `C = shape[1] ≠ 0`, any strides; f32, f16 or bf16. An empty input
    ///   (some dim 0) succeeds: the saved mean is 0 and the saved second statistic NaN, the running
    ///   statistics untouched (CANN's rule).
    /// * `weight`, `bias`, `running_mean`, `running_var`: `[C]`, any stride, each f32/f16/bf16 on
    ///   its own (CANN checks each separately on Atlas A2/A3). The running statistics are written
    ///   in place in training, so no stride 0 over several channels.
    /// * `momentum`, `eps`: finite in f32 (CANN computes with them in f32).
    ///
    /// Errors: [`Error::InvalidArgument`] with aclnn's status 161002 on both backends; a rejected
    /// call writes nothing (the running statistics included).
    ///
    /// # Numerics
    /// Ascend: CANN's kernels (BNTrainingReduce/BNTrainingUpdate or BatchNormV3, BNInfer), in f32.
    /// The mock computes the same formulas in f32 with blocked sums. CPU: the statistics of
    /// [`batch_norm_stats`](super::batch_norm_stats) (two-pass-accurate, merged in f64), the scale
    /// `weight/sqrt(var + eps)` rounded once to f32, then `(x − mean)·scale + bias` in f32 as
    /// [`batch_norm_elemt`](super::batch_norm_elemt) computes it; running statistics in f64,
    /// rounded once. On hardware the op is non-deterministic by default on A2/A3/910 (see
    /// `ctx.set_deterministic`).
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm(
        stream: &Stream,
        input: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        running_mean: Option<&mut Tensor>,
        running_var: Option<&mut Tensor>,
        training: bool,
        momentum: f64,
        eps: f64,
    ) -> Result<(Tensor, BatchNormSaved)> {
        let op = Args { input, weight, bias, training, momentum, eps };
        let plan = op.check_inputs(running_mean.as_deref(), running_var.as_deref())?;
        let running = [(running_mean.as_deref(), "runningMean"), (running_var.as_deref(), "runningVar")];
        check_streams(stream, op.inputs().into_iter().chain(running))?;
        let mut output = output_like(stream, input)?;
        let mut saved = if training {
            BatchNormSaved::new(stream, plan.channels)?
        } else {
            BatchNormSaved { stats: None }
        };
        run_checked(stream, op, plan, ([running_mean, running_var], ([&mut output], saved.slots(training))))?;
        Ok((output, saved))
    }

    /// [`batch_norm`] into the caller-owned `output` (the input's shape and dtype, any strides that
    /// do not overlap themselves) and `saved` (from [`BatchNormSaved::new`] with the input's C;
    /// written only in training).
    ///
    /// On Ascend this is `aclnnBatchNormGetWorkspaceSize` followed by `aclnnBatchNorm` on
    /// `stream`, with the stream's cached workspace; it returns once the work is enqueued.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_into(.., output: &mut Tensor, saved: &mut BatchNormSaved) => (
        Args { input, weight, bias, training, momentum, eps },
        ([running_mean, running_var], ([output], saved.slots(training))),
    );

    /// Phase 1 of the two-phase API of [`batch_norm_into`]: validates the arguments and, on
    /// Ascend, creates the descriptors and the executor (`aclnnBatchNormGetWorkspaceSize`). The
    /// result borrows every tensor until it is launched ([`Prepared::launch`]) or dropped (which
    /// writes nothing).
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_batch_norm(.., ..) -> Prepared;

}

/// What validation established.
#[derive(Clone, Copy, Debug)]
struct Plan {
    channels: usize,
    empty: bool,
}

/// The arguments of a call but the tensors it writes.
struct Args<'a> {
    input: &'a Tensor,
    weight: Option<&'a Tensor>,
    bias: Option<&'a Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
}

impl Args<'_> {
    /// Validates the inputs and the running statistics in CANN's order (dtypes, then shapes),
    /// then what CANN does not check (views inside their storage, the scalars).
    fn check_inputs(&self, running_mean: Option<&Tensor>, running_var: Option<&Tensor>) -> Result<Plan> {
        validate::float_dtype("input", self.input.dtype())?;
        let per_channel =
            [(self.weight, "weight"), (self.bias, "bias"), (running_mean, "runningMean"), (running_var, "runningVar")];
        for (t, name) in per_channel {
            if let Some(t) = t {
                validate::float_dtype(name, t.dtype())?;
            }
        }
        let x = self.input.layout();
        let c = validate::activation("input", &x)?;
        for (t, name) in per_channel {
            if let Some(t) = t {
                if name.starts_with("running") && self.training {
                    validate::per_channel_output(name, &t.layout(), c)?;
                } else {
                    validate::per_channel(name, &t.layout(), c)?;
                }
            }
        }
        let n = validate::in_storage("input", &x)?;
        validate::f32_scalar("momentum", self.momentum)?;
        validate::f32_scalar("eps", self.eps)?;
        Ok(Plan { channels: c, empty: n == 0 })
    }
}

impl<'a> Operator<'a> for Args<'a> {
    const OP: &'static symbols::Operator = &symbols::BATCH_NORM;
    const OUTPUTS: &'static [&'static str] = &["runningMean", "runningVar", "output", "saveMean", "saveInvstd"];
    /// The running statistics (in place), the output, the saved statistics (training only).
    type Outputs = ([Option<&'a mut Tensor>; 2], ([&'a mut Tensor; 1], [Option<&'a mut Tensor>; 2]));
    type Plan = Plan;
    type Scalars = Scalars;

    fn inputs(&self) -> impl IntoIterator<Item = Arg<'a>> {
        [(Some(self.input), "input"), (self.weight, "weight"), (self.bias, "bias")]
    }

    fn check(&self, ([rm, rv], ([output], saved)): &Self::Outputs) -> Result<Plan> {
        let plan = self.check_inputs(rm.as_deref(), rv.as_deref())?;
        validate::like_input("output", &output.layout(), "input", &self.input.layout())?;
        for (t, name) in saved.iter().zip(["saveMean", "saveInvstd"]) {
            match t {
                Some(t) => {
                    validate::float_dtype(name, t.dtype())?;
                    validate::per_channel_output(name, &t.layout(), plan.channels)?;
                }
                None if self.training => {
                    return Err(Error::invalid(
                        name,
                        "a training forward needs room for its saved statistics (BatchNormSaved::new)",
                    ))
                }
                None => {}
            }
        }
        Ok(plan)
    }

    fn scalars(&self) -> Scalars {
        Scalars { training: self.training, momentum: self.momentum, eps: self.eps }
    }

    fn cpu(self, plan: Plan, ([rm, rv], ([output], saved)): Self::Outputs) -> Result<()> {
        cpu::run(&self, plan, [rm, rv], output, saved)
    }

    unsafe fn phase1(api: &OpApi, s: Scalars, h: Handles<'_>) -> Result<aclnnStatus> {
        let f = crate::acl::op_fn(&api.aclnnBatchNormGetWorkspaceSize, Self::OP.phase1)?;
        let [input, weight, bias] = [0, 1, 2].map(|i| h.input(i).cast_const());
        let [running_mean, running_var, output, save_mean, save_var] = [0, 1, 2, 3, 4].map(|i| h.output(i));
        // SAFETY: the signature is the header's (wrapper.h, ops-nn's aclnn_batch_norm.h); the
        // handles are the call's live descriptors in the prototype's order (null where absent:
        // CANN fills weight, bias and the running statistics; the save tensors are present in
        // training, as CANN requires) and the out-pointers are valid (this function's contract).
        Ok(unsafe {
            f(
                input,
                weight,
                bias,
                running_mean,
                running_var,
                s.training,
                s.momentum,
                s.eps,
                output,
                save_mean,
                save_var,
                h.size,
                h.executor,
            )
        })
    }

    fn phase2(api: &OpApi) -> &std::result::Result<Phase2, libloading::Error> {
        &api.aclnnBatchNorm
    }
}

/// The output for `input`: on the CPU in `input`'s memory order (channels-last stays
/// channels-last, as torch keeps it, and the kernel walks both in one order); on Ascend
/// contiguous (A2/A3 and 910 refuse NHWC outputs, `docs/cann/LAYER.md` §2.2).
pub(crate) fn output_like(stream: &Stream, input: &Tensor) -> Result<Tensor> {
    match stream.backend() {
        crate::Backend::Cpu => Tensor::alloc_like(stream, input),
        _ => Tensor::alloc(stream, input.dtype(), input.shape(), false),
    }
}
