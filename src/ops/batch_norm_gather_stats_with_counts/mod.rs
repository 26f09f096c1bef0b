//! `aclnnBatchNormGatherStatsWithCounts` on both backends: combines the per-rank mean and invstd
//! of SyncBatchNorm (one row per rank, as gathered from every rank) into the global mean and
//! invstd, weighting each rank by its element count, and updates the running statistics in
//! place.
//!
//! With `W` ranks, rank `j` holding `n_j = counts[j]` elements per channel, per channel:
//! `var_j = 1/invstd_j² − eps`, `N = Σ n_j`, `mean = Σ n_j·mean_j / N`,
//! `var_n = Σ n_j·var_j + Σ n_j·(mean_j − mean)²`, `invstd = 1/sqrt(var_n/N + eps)`;
//! `running_mean ← (1 − momentum)·running_mean + momentum·mean` and
//! `running_var ← (1 − momentum)·running_var + momentum·var_n/(N − 1)` (the unbiased variance,
//! as PyTorch's CUDA kernel does; that CANN's closed kernel uses `N − 1` too is unconfirmed, the
//! mock assumes it). The CPU backend computes in f64, the Ascend kernel (and the mock) in f32.

pub(in crate::ops) mod cpu;

use ascend_sys::{aclnnStatus, symbols, OpApi};

use super::call::{check_streams, entry_points, run_checked};
use super::launch::Phase2;
use super::operator::{Arg, Handles, Operator};
use super::prepared::Prepared;
use super::validate;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::stream::Stream;
use crate::tensor::Tensor;

/// The dtypes every tensor argument may have (Atlas A2/A3; the training series lacks bf16 and
/// CANN rejects it there).
const FLOAT_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
const COUNTS_NOTE: &str = "CANN takes counts as a float tensor only (not int32): pass integer counts as f32";

/// What validation established.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// Channels (input dim 1).
    channels: usize,
    /// Ranks (rows of mean and invstd).
    ranks: usize,
}

entry_points! {
    /// Combines per-rank statistics into the global mean and invstd and returns them as new tensors
    /// of shape `[C]`: f16 when `input` and `mean` are both f16, else f32 (op-plugin's rule).
    ///
    /// With `W` ranks, rank `j` holding `n_j = counts[j]` elements per channel, per channel:
    /// `var_j = 1/invstd_j² − eps`, `N = Σ n_j`, `mean = Σ n_j·mean_j / N`,
    /// `var_n = Σ n_j·var_j + Σ n_j·(mean_j − mean)²`, `invstd = 1/sqrt(var_n/N + eps)`, and in place
    /// `running_mean ← (1 − momentum)·running_mean + momentum·mean`,
    /// `running_var ← (1 − momentum)·running_var + momentum·var_n/(N − 1)` (the unbiased variance,
    /// as PyTorch does; that CANN's closed kernel uses `N − 1` too is **unconfirmed**, and the mock
    /// assumes it). The CPU backend computes in f64, the Ascend kernel (and the mock) in f32.
    ///
    /// - `input`: the local activation `(N, C, ...)`, rank 2..=8; only its dtype and C are used.
    /// - `mean`, `invstd`: `[W, C]`, one row per rank (as `batch_norm_stats` gave them on each rank).
    /// - `counts`: `[W]`, the elements per channel of each rank, as a **float** tensor (CANN has no
    ///   int32 counts here: integer counts are passed as f32, exact up to 2^24).
    /// - `running_mean`, `running_var`: `[C]`, updated in place; pass **both or neither** (a call
    ///   with only one is rejected with 161002 on both backends: CANN tests only runningMean before
    ///   writing both, so it would write through a missing runningVar or silently skip it).
    ///
    /// `momentum` and `eps` must be finite in f32 (CANN computes with them in f32): NaN, ±inf or a
    /// value beyond f32's range is rejected with 161002 on both backends.
    ///
    /// Every tensor may be f32, f16 or bf16 and any strided view. `W = 0` (or `C = 0`) gives mean 0
    /// and invstd NaN and leaves the running statistics untouched. A rank with count 0 still enters
    /// the sums (0·its values): NaN or infinite statistics of an empty rank propagate, as in
    /// PyTorch, so leave such ranks out (torch's SyncBatchNorm masks ranks whose count is < 1).
    /// NaN and Inf propagate as IEEE arithmetic does (N = 1 makes the unbiased variance x/0).
    ///
    /// A rejected call returns [`Error::InvalidArgument`] (161002) and writes nothing; the running
    /// statistics are then untouched too. On Ascend the work is asynchronous on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_gather_stats_with_counts(
        stream: &Stream,
        input: &Tensor,
        mean: &Tensor,
        invstd: &Tensor,
        running_mean: Option<&mut Tensor>,
        running_var: Option<&mut Tensor>,
        momentum: f64,
        eps: f64,
        counts: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let op = Args { input, mean, invstd, counts, momentum, eps };
        let plan = op.check_inputs(running_mean.as_deref(), running_var.as_deref())?;
        let running = [(running_mean.as_deref(), "runningMean"), (running_var.as_deref(), "runningVar")];
        check_streams(stream, op.inputs().into_iter().chain(running))?;
        let dtype = if input.dtype() == DType::F16 && mean.dtype() == DType::F16 { DType::F16 } else { DType::F32 };
        let mut mean_all = Tensor::alloc(stream, dtype, &[plan.channels], false)?;
        let mut invstd_all = Tensor::alloc(stream, dtype, &[plan.channels], false)?;
        run_checked(stream, op, plan, ([running_mean, running_var], [&mut mean_all, &mut invstd_all]))?;
        Ok((mean_all, invstd_all))
    }

    /// [`batch_norm_gather_stats_with_counts`] into caller-owned outputs `mean_all` and
    /// `invstd_all`: shape `[C]` (any stride but 0), any of f32/f16/bf16.
    ///
    /// On Ascend this is `aclnnBatchNormGatherStatsWithCountsGetWorkspaceSize` followed by
    /// `aclnnBatchNormGatherStatsWithCounts` on `stream`, with the stream's cached workspace; it
    /// returns once the work is enqueued.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_gather_stats_with_counts_into(.., mean_all: &mut Tensor, invstd_all: &mut Tensor) => (
        Args { input, mean, invstd, counts, momentum, eps },
        ([running_mean, running_var], [mean_all, invstd_all]),
    );

    /// Phase 1 of the two-phase API of [`batch_norm_gather_stats_with_counts_into`]: validates the
    /// arguments and, on Ascend, creates the descriptors and the executor
    /// (`aclnnBatchNormGatherStatsWithCountsGetWorkspaceSize`). The result borrows every tensor
    /// until it is launched ([`Prepared::launch`]) or dropped (which writes nothing).
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_batch_norm_gather_stats_with_counts(.., ..) -> Prepared;
}

/// The arguments of a call but the tensors it writes.
struct Args<'a> {
    input: &'a Tensor,
    mean: &'a Tensor,
    invstd: &'a Tensor,
    counts: &'a Tensor,
    momentum: f64,
    eps: f64,
}

impl<'a> Args<'a> {
    /// Validates the inputs and the running statistics (of the allocating entry, which makes
    /// meanAll and invstdAll itself), then momentum and eps.
    fn check_inputs(&self, running_mean: Option<&'a Tensor>, running_var: Option<&'a Tensor>) -> Result<Plan> {
        let plan = validate_inputs(&GatherInputs::of(self, running_mean, running_var))?;
        check_scalars(self.momentum, self.eps)?;
        Ok(plan)
    }
}

impl<'a> Operator<'a> for Args<'a> {
    const OP: &'static symbols::Operator = &symbols::BATCH_NORM_GATHER_STATS_WITH_COUNTS;
    const OUTPUTS: &'static [&'static str] = &["runningMean", "runningVar", "meanAll", "invstdAll"];
    /// The running statistics (updated in place, both or neither), then meanAll and invstdAll.
    type Outputs = ([Option<&'a mut Tensor>; 2], [&'a mut Tensor; 2]);
    type Plan = Plan;
    /// momentum, eps.
    type Scalars = (f64, f64);

    fn inputs(&self) -> impl IntoIterator<Item = Arg<'a>> {
        [
            (Some(self.input), "input"),
            (Some(self.mean), "mean"),
            (Some(self.invstd), "invstd"),
            (Some(self.counts), "counts"),
        ]
    }

    fn check(&self, ([running_mean, running_var], [mean_all, invstd_all]): &Self::Outputs) -> Result<Plan> {
        let plan = validate_call(
            &GatherInputs::of(self, running_mean.as_deref(), running_var.as_deref()),
            [&mean_all.layout(), &invstd_all.layout()],
        )?;
        check_scalars(self.momentum, self.eps)?;
        Ok(plan)
    }

    fn scalars(&self) -> (f64, f64) {
        (self.momentum, self.eps)
    }

    fn cpu(self, plan: Plan, ([running_mean, running_var], [mean_all, invstd_all]): Self::Outputs) -> Result<()> {
        // CANN's kernel takes momentum and eps as f32 (docs/cann/SYNCBN.md): so does the CPU.
        let (momentum, eps) = (f64::from(self.momentum as f32), f64::from(self.eps as f32));
        let running = running_mean.zip(running_var);
        let shape = [plan.ranks, plan.channels];
        cpu::run(shape, [self.mean, self.invstd, self.counts], running, momentum, eps, mean_all, invstd_all)
    }

    /// For an empty `mean` CANN's executor itself fills meanAll with 0 and invstdAll with NaN, so
    /// nothing is left for the launch to fill.
    unsafe fn phase1(api: &OpApi, (momentum, eps): (f64, f64), h: Handles<'_>) -> Result<aclnnStatus> {
        let f = crate::acl::op_fn(&api.aclnnBatchNormGatherStatsWithCountsGetWorkspaceSize, Self::OP.phase1)?;
        let [input, mean, invstd, counts] = [0, 1, 2, 3].map(|i| h.input(i).cast_const());
        let [running_mean, running_var, mean_all, invstd_all] = [0, 1, 2, 3].map(|i| h.output(i));
        // SAFETY: the signature is the header's (wrapper.h); the handles are the call's live
        // descriptors in the prototype's order and the out-pointers are valid (this function's
        // contract); runningMean and runningVar are both null or both live (validated).
        Ok(unsafe {
            f(
                input,
                mean,
                invstd,
                running_mean,
                running_var,
                momentum,
                eps,
                counts,
                mean_all,
                invstd_all,
                h.size,
                h.executor,
            )
        })
    }

    fn phase2(api: &OpApi) -> &std::result::Result<Phase2, libloading::Error> {
        &api.aclnnBatchNormGatherStatsWithCounts
    }
}

/// Checks momentum and eps: finite in f32, as CANN computes with them in f32 (161002 otherwise,
/// after every check CANN makes; allocates nothing).
pub(crate) fn check_scalars(momentum: f64, eps: f64) -> Result<()> {
    validate::f32_scalar("momentum", momentum)?;
    validate::f32_scalar("eps", eps)
}

/// Rejects runningMean without runningVar and the reverse (161002).
fn running_pair(running_mean: bool, running_var: bool) -> Result<()> {
    match (running_mean, running_var) {
        (true, false) => Err(Error::invalid(
            "runningVar",
            "runningMean was given without runningVar: CANN checks only runningMean before writing both running \
             statistics (it would write through the missing runningVar); pass both or neither",
        )),
        (false, true) => Err(Error::invalid(
            "runningMean",
            "runningVar was given without runningMean: CANN checks only runningMean before writing both running \
             statistics (it would silently leave runningVar unchanged); pass both or neither",
        )),
        _ => Ok(()),
    }
}

/// The layouts of what a call reads (and of the running statistics it updates in place).
#[derive(Clone, Copy, Debug)]
pub(crate) struct GatherInputs<'l> {
    pub input: Layout<'l>,
    pub mean: Layout<'l>,
    pub invstd: Layout<'l>,
    pub running_mean: Option<Layout<'l>>,
    pub running_var: Option<Layout<'l>>,
    pub counts: Layout<'l>,
}

impl<'l> GatherInputs<'l> {
    /// The layouts of a call's tensors.
    fn of(args: &Args<'l>, running_mean: Option<&'l Tensor>, running_var: Option<&'l Tensor>) -> Self {
        GatherInputs {
            input: args.input.layout(),
            mean: args.mean.layout(),
            invstd: args.invstd.layout(),
            running_mean: running_mean.map(Tensor::layout),
            running_var: running_var.map(Tensor::layout),
            counts: args.counts.layout(),
        }
    }
}

/// Validates the inputs of a call over their layouts, in CANN's order (running pair, dtypes,
/// shapes, views), as every entry does first; [`check_scalars`] follows. Checks no stream,
/// allocates nothing: a composite call (`sync_batch_norm`) asks it before its first side effect.
pub(crate) fn check_inputs(inputs: &GatherInputs<'_>) -> Result<()> {
    validate_inputs(inputs).map(|_| ())
}

/// Validates the inputs; returns the plan.
fn validate_inputs(inputs: &GatherInputs<'_>) -> Result<Plan> {
    running_pair(inputs.running_mean.is_some(), inputs.running_var.is_some())?;
    input_dtypes(inputs)?;
    input_shapes(inputs)
}

fn input_dtypes(
    GatherInputs { input, mean, invstd, running_mean, running_var, counts }: &GatherInputs<'_>,
) -> Result<()> {
    for (name, m) in [("input", input), ("mean", mean), ("invstd", invstd)] {
        validate::dtype_in(name, m, &FLOAT_DTYPES, "")?;
    }
    for (name, m) in [("runningMean", running_mean), ("runningVar", running_var)] {
        if let Some(m) = m {
            validate::dtype_in(name, m, &FLOAT_DTYPES, "")?;
        }
    }
    validate::dtype_in("counts", counts, &FLOAT_DTYPES, COUNTS_NOTE)
}

fn input_shapes(
    GatherInputs { input, mean, invstd, running_mean, running_var, counts }: &GatherInputs<'_>,
) -> Result<Plan> {
    validate::rank_2_to_8("input", input)?;
    let c = input.shape[1];
    validate::rank("mean", mean, 2)?;
    validate::rank("invstd", invstd, 2)?;
    validate::rank("counts", counts, 1)?;
    let w = mean.shape[0];
    for (name, m) in [("mean", mean), ("invstd", invstd)] {
        if m.shape != [w, c] {
            return Err(Error::invalid(
                name,
                format!(
                    "expected shape [{w}, {c}] ([ranks, C], C = input.shape[1], ranks = mean.shape[0]), got {:?}",
                    m.shape
                ),
            ));
        }
    }
    if counts.shape != [w] {
        return Err(Error::invalid(
            "counts",
            format!("expected shape [{w}] (one count per rank, ranks = mean.shape[0]), got {:?}", counts.shape),
        ));
    }
    for (name, m) in [("runningMean", running_mean), ("runningVar", running_var)] {
        if let Some(m) = m {
            validate::per_channel_output(name, m, c)?;
        }
    }
    for (name, m) in [("input", input), ("mean", mean), ("invstd", invstd), ("counts", counts)] {
        validate::in_storage(name, m)?;
    }
    Ok(Plan { channels: c, ranks: w })
}

/// Validates a whole call in CANN's order: the running pair, every dtype (outputs included),
/// then shapes and views.
fn validate_call(inputs: &GatherInputs<'_>, [mean_all, invstd_all]: [&Layout<'_>; 2]) -> Result<Plan> {
    running_pair(inputs.running_mean.is_some(), inputs.running_var.is_some())?;
    input_dtypes(inputs)?;
    validate::dtype_in("meanAll", mean_all, &FLOAT_DTYPES, "")?;
    validate::dtype_in("invstdAll", invstd_all, &FLOAT_DTYPES, "")?;
    let plan = input_shapes(inputs)?;
    validate::per_channel_output("meanAll", mean_all, plan.channels)?;
    validate::per_channel_output("invstdAll", invstd_all, plan.channels)?;
    Ok(plan)
}
