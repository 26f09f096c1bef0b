//! SyncBatchNorm across ranks: [`forward`] and [`backward`] chain the BatchNorm operators and the
//! collectives of a [`Communicator`] in the order torch's `SyncBatchNorm` does.
//!
//! Forward (per rank, local input of shape `(N_r, C, ...)`):
//! 1. this rank's `[mean | invstd | count]` (`[2C + 1]` f32) in one buffer: `batch_norm_stats_into`
//!    on views of it, and the element count per channel (`N_r·H·W...`) uploaded through the
//!    stream's pinned staging area (no host wait). For bf16 input, which `aclnnBatchNormStats`
//!    rejects on Atlas A2/A3: on the CPU backend the statistics kernel itself (it takes bf16;
//!    one pass, no host read); on Ascend `aclnnCast` widens the input to an f32 temporary from
//!    the stream-ordered caching allocator and `aclnnBatchNormStats` takes its statistics (two
//!    launches, no host read, no host wait). Why this chain (docs/cann/SYNCBN.md 3.1, 3.7,
//!    docs/cann/LAYER.md 2.2): bf16 → f32 is exact, so the statistics are the f32 path's, by the
//!    same operator; `aclnnBatchNorm` does take bf16 on A2/A3, but its `saveInvstd` there is the
//!    batch variance (1/sqrt(var + eps) only on Ascend 950), which would need a reciprocal square
//!    root that no bound operator takes, and it would also write a full-size output and the
//!    running statistics it does not need. The cost is the temporary (4 bytes per element) and
//!    one extra pass over the input. A rank with no elements sends mean 0, invstd 1, count 0:
//!    finite statistics that the gather weights to nothing (docs/cann/SYNCBN.md 3.2);
//! 2. one all-gather of the `[W, 2C + 1]` rows (as torch does);
//! 3. `batch_norm_gather_stats_with_counts` on strided views of the rows: the global mean and
//!    invstd, and the running statistics updated in place;
//! 4. `batch_norm_elemt`: the normalised output.
//!
//! Every output is allocated before step 3, so a forward that fails in validation, allocation,
//! the local statistics or the all-gather changes nothing; only a runtime failure of step 4's
//! launch (validated arguments: on hardware such faults surface asynchronously anyway) leaves the
//! running statistics updated, as torch's. Committing them after step 4 would cost a second
//! gather launch every step (tried: 3 → 4 launches per forward).
//!
//! When no rank has an element (every rank's N is 0) the global statistics would be 0/0: the
//! running statistics are left as they were and the saved statistics are mean 0, invstd 1. A rank
//! with elements knows that N > 0 without reading anything; only an empty rank reads the gathered
//! counts (a host wait in that degenerate step alone), so every rank decides the same.
//!
//! Backward:
//! 1. `batch_norm_reduce_backward_into`: the local Σdy and Σdy·(x − mean) into the two halves of
//!    one `[2C]` buffer, and this rank's share of the weight and bias gradients;
//! 2. one all-reduce (sum) of that buffer (run even when the local input is empty, so the other
//!    ranks are not left waiting);
//! 3. `batch_norm_elemt_backward` with the gathered counts: the input gradient, equal (to f32
//!    accuracy) to BatchNorm's over the whole global batch.
//!
//! On Ascend a steady step (f32, f16 or bf16 input) makes no host wait (unless this rank's input is
//! empty) and, with the caching allocator warm, no `aclrtMalloc`/`aclrtFree`: one all-gather and
//! one all-reduce.
//!
//! Both validate every argument first, with the rules of the operators they chain, before the
//! first collective and the first write: a bad argument fails on its own rank before any peer
//! waits, and a rejected call changes nothing (the running statistics included).
//!
//! grad_weight and grad_bias are this rank's share, as torch returns them: summed over ranks they
//! give the global gradient (data-parallel training all-reduces them with the other parameter
//! gradients).

use crate::error::{Error, Result};
use crate::hccl::{Communicator, ReduceOp};
use crate::layout::Layout;
use crate::ops::checks::{self, ElemtBackwardInputs, ElemtInputs, GatherInputs};
use crate::ops::{self, OutputMask, ReduceBackwardOut};
use crate::stream::Stream;
use crate::tensor::Tensor;
use crate::DType;

/// What [`forward`] keeps for [`backward`]: the input (borrowed), the global mean and invstd,
/// and the per-rank element counts (a view of the gathered rows; 0 for an empty rank).
#[derive(Debug)]
pub struct Saved<'a> {
    input: &'a Tensor,
    mean: Tensor,
    invstd: Tensor,
    counts: Tensor,
}

impl Saved<'_> {
    /// The global mean per channel (f32; 0 when no rank had an element).
    pub fn mean(&self) -> &Tensor {
        &self.mean
    }

    /// The global invstd per channel (f32; 1 when no rank had an element).
    pub fn invstd(&self) -> &Tensor {
        &self.invstd
    }
}

/// SyncBatchNorm's forward pass on this rank (see the [module](self) docs): returns the
/// normalised output (shape and dtype of `input`) and what [`backward`] needs. `running_mean` and
/// `running_var` (both or neither, `[C]`) are updated in place with `momentum`; a step in which no
/// rank has an element leaves them as they were, and so does an `Err` from anything but a runtime
/// failure of the normalisation's launch (see the [module](self) docs).
#[allow(clippy::too_many_arguments)]
pub fn forward<'a>(
    comm: &Communicator,
    s: &Stream,
    input: &'a Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    running_mean: Option<&mut Tensor>,
    running_var: Option<&mut Tensor>,
    momentum: f64,
    eps: f64,
) -> Result<(Tensor, Saved<'a>)> {
    let shape = input.shape();
    if shape.len() < 2 {
        return Err(Error::invalid("input", format!("rank must be at least 2 (N, C, ...), got shape {shape:?}")));
    }
    let c = shape[1];
    let per_channel = input.numel().checked_div(c).unwrap_or(0);
    if per_channel <= 1 && comm.size() < 2 {
        return Err(Error::invalid(
            "input",
            format!("expected more than 1 value per channel when training, got shape {shape:?} on one rank"),
        ));
    }
    let world = comm.size() as usize;
    validate_forward(s, input, c, world, weight, bias, running_mean.as_deref(), running_var.as_deref(), momentum, eps)?;
    // One all-gather of every rank's [mean | invstd | count] (as torch does), read back as views.
    let rows = Gathered::new(world, c);
    let packed = local_packed(s, input, c, per_channel, eps)?;
    let mut gathered = Tensor::alloc(s, DType::F32, &[rows.len()], false)?;
    comm.all_gather(s, &packed, &mut gathered)?;
    let [mean_all, invstd_all, counts] = rows.views(&gathered)?;
    // With no element on any rank the global statistics are 0/0: nothing to normalise with and
    // nothing to update the running statistics with. A rank with elements knows that N > 0
    // without reading; only an empty rank reads the gathered counts, so every rank decides the same.
    if per_channel == 0 && no_rank_has_elements(s, &counts)? {
        // Every row is then an empty rank's: mean 0, invstd 1 (row 0 serves).
        let (mean, invstd) = (gathered.view(&[c], &[1], 0)?, gathered.view(&[c], &[1], c)?);
        let out = ops::batch_norm_elemt(s, input, weight, bias, &mean, &invstd, eps)?;
        return Ok((out, Saved { input, mean, invstd, counts }));
    }
    // Every output is allocated before the running statistics change, so a failed allocation
    // changes nothing; after the gather only the normalisation's launch can still fail (its
    // arguments are validated: a runtime failure of the enqueue, which on hardware is also how a
    // device fault surfaces, asynchronously). torch's order and launch count: the running
    // statistics are updated by the one gather.
    let (mut mean, mut invstd) =
        (Tensor::alloc(s, DType::F32, &[c], false)?, Tensor::alloc(s, DType::F32, &[c], false)?);
    // In input's memory order (channels-last stays channels-last, as torch's layers keep it).
    let mut out = Tensor::alloc_like(s, input)?;
    ops::batch_norm_gather_stats_with_counts_into(
        s,
        input,
        &mean_all,
        &invstd_all,
        running_mean,
        running_var,
        momentum,
        eps,
        &counts,
        &mut mean,
        &mut invstd,
    )?;
    ops::batch_norm_elemt_into(s, input, weight, bias, &mean, &invstd, eps, &mut out)?;
    Ok((out, Saved { input, mean, invstd, counts }))
}

/// Whether the gathered `counts` (`[W]` f32) are all 0: a host read, made only by an empty rank.
fn no_rank_has_elements(s: &Stream, counts: &Tensor) -> Result<bool> {
    Ok(counts.to_vec::<f32>(s)?.iter().all(|&n| n == 0.0))
}

/// This rank's `[mean | invstd | count]` (`[2C + 1]` f32), written on the stream without a host
/// read: the statistics by `batch_norm_stats_into` on views of the buffer, the count through the
/// stream's staging area. A rank without elements contributes count 0 with the finite statistics
/// mean 0, invstd 1, which the gather weights to nothing (docs/cann/SYNCBN.md 3.2).
fn local_packed(s: &Stream, input: &Tensor, c: usize, n: usize, eps: f64) -> Result<Tensor> {
    let host_packed = |mean: &[f32], invstd: &[f32]| -> Result<Tensor> {
        let mut v = Vec::new();
        v.try_reserve_exact(2 * c + 1).map_err(|_| Error::HostAlloc { bytes: (2 * c + 1) * 4 })?;
        v.extend_from_slice(mean);
        v.extend_from_slice(invstd);
        v.push(n as f32);
        Tensor::from_slice(s, &v, &[2 * c + 1])
    };
    if n == 0 {
        return host_packed(&vec![0.0; c], &vec![1.0; c]);
    }
    let mut packed = Tensor::alloc(s, DType::F32, &[2 * c + 1], false)?;
    let mut mean = packed.view(&[c], &[1], 0)?;
    let mut invstd = packed.view(&[c], &[1], c)?;
    if input.dtype() == DType::BF16 {
        bf16_stats(s, input, eps, &mut mean, &mut invstd)?;
    } else {
        ops::batch_norm_stats_into(s, input, eps, &mut mean, &mut invstd)?;
    }
    packed.absorb(&mean)?;
    packed.absorb(&invstd)?;
    packed.stage(s, 2 * c, &[n as f32])?;
    Ok(packed)
}

/// Where the statistics lie in the gathered `[W, 2C + 1]` f32 buffer (one `[mean | invstd |
/// count]` row per rank): `forward` takes its views from here, and its validation checks the
/// operators' rules against the same layouts before the buffer exists.
struct Gathered {
    c: usize,
    /// mean and invstd: `[W, C]`, rows `2C + 1` apart.
    stats: ([usize; 2], [usize; 2]),
    /// counts: `[W]`, `2C + 1` apart.
    counts: ([usize; 1], [usize; 1]),
}

impl Gathered {
    fn new(world: usize, c: usize) -> Gathered {
        let row = 2 * c + 1;
        Gathered { c, stats: ([world, c], [row, 1]), counts: ([world], [row]) }
    }

    /// The buffer's length in elements.
    fn len(&self) -> usize {
        self.counts.0[0] * self.counts.1[0]
    }

    /// The layouts of the gathered mean, invstd and counts.
    fn layouts(&self) -> [Layout<'_>; 3] {
        let (len, (shape, strides), (n, n_strides)) = (self.len(), &self.stats, &self.counts);
        let at = |shape, strides, offset| Layout { dtype: DType::F32, shape, strides, offset, storage_len: len };
        [at(shape, strides, 0), at(shape, strides, self.c), at(n, n_strides, 2 * self.c)]
    }

    /// The gathered mean, invstd and counts: views of `gathered`.
    fn views(&self, gathered: &Tensor) -> Result<[Tensor; 3]> {
        let [mean, invstd, counts] = self.layouts().map(|l| gathered.view(l.shape, l.strides, l.offset));
        Ok([mean?, invstd?, counts?])
    }
}

/// The layout of a new `[C]` f32 statistic (`Tensor::alloc`'s: contiguous), as `forward` makes
/// the global mean and invstd.
fn statistic(c: &[usize; 1]) -> Layout<'_> {
    Layout { dtype: DType::F32, shape: c, strides: &[1], offset: 0, storage_len: c[0] }
}

/// Every check the operators of [`forward`] make, in their order, before any of them runs, over
/// layouts (nothing is allocated, uploaded or enqueued): `input` as `batch_norm_stats` (or, for
/// bf16, `batch_norm_elemt`) takes it, `weight`, `bias` and `eps` as `batch_norm_elemt` does (with
/// new `[C]` f32 statistics), the running statistics as `batch_norm_gather_stats_with_counts`
/// does (with the gathered statistics' layouts, [`Gathered`]).
#[allow(clippy::too_many_arguments)]
fn validate_forward(
    s: &Stream,
    input: &Tensor,
    c: usize,
    world: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    momentum: f64,
    eps: f64,
) -> Result<()> {
    let x = input.layout();
    if input.dtype() != DType::BF16 {
        checks::batch_norm_stats(&x, eps)?;
        checks::streams(s, [(Some(input), "input")])?;
    }
    let (weight_l, bias_l) = (weight.map(Tensor::layout), bias.map(Tensor::layout));
    let channels = [c];
    let stat = statistic(&channels);
    let inputs = ElemtInputs { input: x, weight: weight_l, bias: bias_l, mean: stat, invstd: stat };
    checks::batch_norm_elemt(&inputs, eps)?;
    checks::streams(s, [(Some(input), "input"), (weight, "weight"), (bias, "bias")])?;
    let rows = Gathered::new(world, c);
    let [mean, invstd, counts] = rows.layouts();
    let (running_mean_l, running_var_l) = (running_mean.map(Tensor::layout), running_var.map(Tensor::layout));
    checks::batch_norm_gather_stats_with_counts(&GatherInputs {
        input: x,
        mean,
        invstd,
        running_mean: running_mean_l,
        running_var: running_var_l,
        counts,
    })?;
    checks::streams(s, [(Some(input), "input"), (running_mean, "runningMean"), (running_var, "runningVar")])?;
    checks::gather_scalars(momentum, eps)
}

/// The local mean and invstd of a bf16 `input` (`n` > 0 elements per channel) into the `[C]`
/// f32 views `mean` and `invstd`, on the stream without a host read. `aclnnBatchNormStats`
/// rejects bf16 on Atlas A2/A3, so on Ascend `aclnnCast` first widens the input (exactly) into an
/// f32 temporary of the stream-ordered caching allocator (returned to it behind the stream's work
/// when it drops here), whose statistics `aclnnBatchNormStats` then computes: the f32 path's
/// operator and numerics. On the CPU backend the statistics kernel takes bf16 itself (one pass).
fn bf16_stats(s: &Stream, input: &Tensor, eps: f64, mean: &mut Tensor, invstd: &mut Tensor) -> Result<()> {
    if s.ascend().is_none() {
        return ops::host_stats_into(input, eps, mean, invstd);
    }
    let wide = ops::cast(s, input, DType::F32)?;
    ops::batch_norm_stats_into(s, &wide, eps, mean, invstd)
}

/// SyncBatchNorm's backward pass on this rank (see the [module](self) docs): the gradients of
/// the input, weight and bias, each `Some` when `mask` asks for it (`input_g`, `weight_g`,
/// `bias_g`).
pub fn backward(
    comm: &Communicator,
    s: &Stream,
    grad_out: &Tensor,
    saved: &Saved<'_>,
    weight: Option<&Tensor>,
    mask: OutputMask,
) -> Result<Grads> {
    backward_over(comm, s, grad_out, [saved.input, &saved.mean], saved, weight, mask)
}

/// The input and weight gradients.
type Grads = (Option<Tensor>, Option<Tensor>, Option<Tensor>);

/// [`backward`] with Σdy·(x − mean) summed from `x − mean` formed on the device first (one more
/// element-wise launch, `batch_norm_elemt` with invstd 1 and eps 0, which CANN computes exactly
/// as `x − mean` rounded once; and a temporary of the input's size), then reduced with mean 0:
/// CANN's reduction forms Σdy·x − mean·Σdy, which cancels when |mean| ≫ std
/// (`docs/cann/LAYER.md` §6). The values are the same formulas; the input gradient too is
/// formed from the centered input.
pub(crate) fn backward_centered(
    comm: &Communicator,
    s: &Stream,
    grad_out: &Tensor,
    saved: &Saved<'_>,
    weight: Option<&Tensor>,
    mask: OutputMask,
) -> Result<Grads> {
    let c = saved.mean.numel();
    let one = Tensor::uploaded(s, &[1f32], &[c], &[0], 0, true)?;
    let centered = ops::batch_norm_elemt(s, saved.input, None, None, &saved.mean, &one, 0.0)?;
    let zero = Tensor::uploaded(s, &[0f32], &[c], &[0], 0, true)?;
    backward_over(comm, s, grad_out, [&centered, &zero], saved, weight, mask)
}

/// [`backward`] over `input` and `mean` (the saved ones, or the centered input and 0) with the
/// saved invstd and counts.
fn backward_over(
    comm: &Communicator,
    s: &Stream,
    grad_out: &Tensor,
    [input, mean]: [&Tensor; 2],
    saved: &Saved<'_>,
    weight: Option<&Tensor>,
    mask: OutputMask,
) -> Result<Grads> {
    if !mask.input_g {
        let r = ops::batch_norm_reduce_backward(s, grad_out, input, mean, &saved.invstd, weight, mask)?;
        return Ok((None, r.grad_weight, r.grad_bias));
    }
    // [sumDy | sumDyXmu] in one buffer, written through views, reduced by one all-reduce.
    let (c, channels) = (mean.numel(), [mean.numel()]);
    let dtype = if input.dtype() == DType::F16 && mean.dtype() == DType::F16 { DType::F16 } else { DType::F32 };
    let half = |offset| Layout { dtype, shape: &channels, strides: &[1], offset, storage_len: 2 * c };
    // batch_norm_elemt_backward runs after the all-reduce: check its arguments before it, with
    // the sums' layouts (batch_norm_reduce_backward checks its own before it runs).
    let inputs = ElemtBackwardInputs {
        grad_out: grad_out.layout(),
        input: input.layout(),
        mean: mean.layout(),
        invstd: saved.invstd.layout(),
        weight: weight.map(Tensor::layout),
        sum_dy: half(0),
        sum_dy_xmu: half(c),
        counter: saved.counts.layout(),
    };
    checks::batch_norm_elemt_backward(&inputs)?;
    checks::streams(
        s,
        [
            (Some(grad_out), "gradOut"),
            (Some(input), "input"),
            (Some(mean), "mean"),
            (Some(&saved.invstd), "invstd"),
            (weight, "weight"),
            (Some(&saved.counts), "counter"),
        ],
    )?;
    let mut sums = Tensor::alloc(s, dtype, &[2 * c], false)?;
    let view = |sums: &Tensor, l: Layout<'_>| sums.view(l.shape, l.strides, l.offset);
    let (mut sum_dy, mut sum_dy_xmu) = (view(&sums, inputs.sum_dy)?, view(&sums, inputs.sum_dy_xmu)?);
    let per_channel = |on: bool| on.then(|| Tensor::alloc(s, dtype, &[c], false)).transpose();
    let (mut grad_weight, mut grad_bias) = (per_channel(mask.weight_g)?, per_channel(mask.bias_g)?);
    ops::batch_norm_reduce_backward_into(
        s,
        grad_out,
        input,
        mean,
        &saved.invstd,
        weight,
        mask,
        ReduceBackwardOut {
            sum_dy: Some(&mut sum_dy),
            sum_dy_xmu: Some(&mut sum_dy_xmu),
            grad_weight: grad_weight.as_mut(),
            grad_bias: grad_bias.as_mut(),
        },
    )?;
    sums.absorb(&sum_dy)?;
    sums.absorb(&sum_dy_xmu)?;
    comm.all_reduce(s, &mut sums, ReduceOp::Sum)?;
    // Views taken after the all-reduce (on the CPU a view holds a copy).
    let (sum_dy, sum_dy_xmu) = (view(&sums, inputs.sum_dy)?, view(&sums, inputs.sum_dy_xmu)?);
    let mut grad_input = Tensor::alloc_like(s, saved.input)?;
    ops::batch_norm_elemt_backward_into(
        s,
        grad_out,
        input,
        mean,
        &saved.invstd,
        weight,
        &sum_dy,
        &sum_dy_xmu,
        &saved.counts,
        &mut grad_input,
    )?;
    Ok((Some(grad_input), grad_weight, grad_bias))
}
