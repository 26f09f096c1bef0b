//! SyncBatchNorm across ranks: [`forward`] and [`backward`] chain the BatchNorm operators and the
//! collectives of a [`Communicator`] in the order torch's `SyncBatchNorm` does.
//!
//! Forward (per rank, local input of shape `(N_r, C, ...)`):
//! 1. `batch_norm_stats`: the local mean and invstd per channel (for bf16 input, which
//!    `aclnnBatchNormStats` rejects on Atlas A2/A3, two `batch_norm_reduce_backward` passes give
//!    Σx and Σx·(x − mean) instead, and the host turns them into mean and invstd: one more
//!    synchronisation; two-pass statistics on the CPU, while CANN's reduction kernel sums
//!    Σx² − mean·Σx in f32, which loses accuracy when |mean| ≫ std);
//! 2. all-gather of the local mean, invstd and element count per channel (`N_r·H·W...`) from
//!    every rank (three collectives: this crate has no device-side concatenation);
//! 3. ranks with no elements are left out (their statistics are NaN: this reads the W counts
//!    back to the host, one synchronisation, as torch does);
//! 4. `batch_norm_gather_stats_with_counts`: the global mean and invstd, and the running
//!    statistics updated in place;
//! 5. `batch_norm_elemt`: the normalised output.
//!
//! Backward:
//! 1. `batch_norm_reduce_backward`: the local Σdy and Σdy·(x − mean), and this rank's share of
//!    the weight and bias gradients;
//! 2. all-reduce (sum) of Σdy and Σdy·(x − mean) (run even when the local input is empty, so the
//!    other ranks are not left waiting);
//! 3. `batch_norm_elemt_backward` with the gathered counts: the input gradient, equal (to f32
//!    accuracy) to BatchNorm's over the whole global batch.
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
use crate::ops::validate::Meta;
use crate::ops::{self, checks, OutputMask};
use crate::stream::Stream;
use crate::tensor::Tensor;
use crate::DType;

/// What [`forward`] keeps for [`backward`]: the input (borrowed), the global mean and invstd,
/// and the per-rank element counts of the ranks that had elements.
#[derive(Debug)]
pub struct Saved<'a> {
    input: &'a Tensor,
    mean: Tensor,
    invstd: Tensor,
    counts: Tensor,
}

impl Saved<'_> {
    /// The global mean per channel (f32).
    pub fn mean(&self) -> &Tensor {
        &self.mean
    }

    /// The global invstd per channel (f32).
    pub fn invstd(&self) -> &Tensor {
        &self.invstd
    }
}

/// SyncBatchNorm's forward pass on this rank (see the [module](self) docs): returns the
/// normalised output (shape and dtype of `input`) and what [`backward`] needs. `running_mean` and
/// `running_var` (both or neither, `[C]`) are updated in place with `momentum`.
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
    let (mean, invstd) = local_stats(s, input, c, eps)?;
    let mut mean_all = Tensor::zeros(s, DType::F32, &[world, c])?;
    let mut invstd_all = Tensor::zeros(s, DType::F32, &[world, c])?;
    comm.all_gather(s, &mean, &mut mean_all)?;
    comm.all_gather(s, &invstd, &mut invstd_all)?;
    let count = Tensor::from_slice(s, &[per_channel as f32], &[1])?;
    let mut counts = Tensor::zeros(s, DType::F32, &[world])?;
    comm.all_gather(s, &count, &mut counts)?;
    // Ranks without elements have NaN statistics: leave them out (a host read of W counts).
    let host_counts: Vec<f32> = counts.to_vec(s)?;
    if host_counts.iter().any(|&n| n < 1.0) {
        let keep: Vec<usize> = (0..world).filter(|&r| host_counts[r] >= 1.0).collect();
        let pick = |t: &Tensor| -> Result<Tensor> {
            let v: Vec<f32> = t.to_vec(s)?;
            let rows: Vec<f32> = keep.iter().flat_map(|&r| v[r * c..(r + 1) * c].iter().copied()).collect();
            Tensor::from_slice(s, &rows, &[keep.len(), c])
        };
        mean_all = pick(&mean_all)?;
        invstd_all = pick(&invstd_all)?;
        let kept: Vec<f32> = keep.iter().map(|&r| host_counts[r]).collect();
        counts = Tensor::from_slice(s, &kept, &[keep.len()])?;
    }
    let (mean, invstd) = ops::batch_norm_gather_stats_with_counts(
        s,
        input,
        &mean_all,
        &invstd_all,
        running_mean,
        running_var,
        momentum,
        eps,
        &counts,
    )?;
    let out = ops::batch_norm_elemt(s, input, weight, bias, &mean, &invstd, eps)?;
    Ok((out, Saved { input, mean, invstd, counts }))
}

/// A `[C]` f32 stand-in for a statistic `forward`/`backward` computes (a zero-stride view of one
/// element: what the operators' checks look at is its dtype and shape).
fn per_channel_stand_in(s: &Stream, c: usize) -> Result<Tensor> {
    Tensor::from_slice_strided(s, &[0f32], &[c], &[0], 0)
}

/// Every check the operators of [`forward`] make, before any of them runs: `input` as
/// `batch_norm_stats` (or, for bf16, `batch_norm_elemt`) takes it, `weight`, `bias` and `eps` as
/// `batch_norm_elemt` does, the running statistics as `batch_norm_gather_stats_with_counts`
/// does (with the gathered statistics' shapes: `[world, C]` f32, counts `[world]`).
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
    if input.dtype() != DType::BF16 {
        checks::batch_norm_stats(s, input, eps)?;
    }
    let stat = per_channel_stand_in(s, c)?;
    checks::batch_norm_elemt(s, input, weight, bias, &stat, &stat, eps)?;
    let (rows, row_strides, one) = ([world, c], [0, 0], [world]);
    let gathered = Meta { dtype: DType::F32, shape: &rows, strides: &row_strides, offset: 0, storage_len: 1 };
    let counts = Meta { dtype: DType::F32, shape: &one, strides: &[0], offset: 0, storage_len: 1 };
    checks::batch_norm_gather_stats_with_counts(
        s,
        input,
        [&gathered, &gathered, &counts],
        running_mean,
        running_var,
        momentum,
        eps,
    )
}

/// The local mean and invstd (`[C]` f32) of `input`: `batch_norm_stats`, or for bf16 (which it
/// rejects on Atlas A2/A3) two reduction passes and a host computation.
fn local_stats(s: &Stream, input: &Tensor, c: usize, eps: f64) -> Result<(Tensor, Tensor)> {
    if input.dtype() != DType::BF16 {
        return ops::batch_norm_stats(s, input, eps);
    }
    let n = input.numel() / c;
    let zeros = Tensor::zeros(s, DType::F32, &[c])?;
    let sums = |mean: &Tensor| -> Result<Vec<f64>> {
        let mask = OutputMask { input_g: true, weight_g: false, bias_g: false };
        let r = ops::batch_norm_reduce_backward(s, input, input, mean, &zeros, None, mask)?;
        let Some(t) = r.sum_dy_xmu else {
            return Err(Error::invalid("input", "the reduction gave no sumDyXmu"));
        };
        Ok(t.to_vec::<f32>(s)?.into_iter().map(f64::from).collect())
    };
    // Σ dy with dy = x gives Σx.
    let mask = OutputMask { input_g: false, weight_g: false, bias_g: true };
    let r = ops::batch_norm_reduce_backward(s, input, input, &zeros, &zeros, None, mask)?;
    let sum: Vec<f64> = match r.grad_bias {
        Some(t) => t.to_vec::<f32>(s)?.into_iter().map(f64::from).collect(),
        None => return Err(Error::invalid("input", "no channel")),
    };
    if n == 0 {
        let nan = vec![f32::NAN; c];
        return Ok((Tensor::zeros(s, DType::F32, &[c])?, Tensor::from_slice(s, &nan, &[c])?));
    }
    let mean: Vec<f32> = sum.iter().map(|&v| (v / n as f64) as f32).collect();
    let mean_t = Tensor::from_slice(s, &mean, &[c])?;
    // Σ x·(x − m) = Σ (x − m)² + m·(Σx − n·m): the second term is the rounding of m, removed here.
    let sq = sums(&mean_t)?;
    let invstd: Vec<f32> = (0..c)
        .map(|k| {
            let m = f64::from(mean[k]);
            let var = (sq[k] - m * (sum[k] - n as f64 * m)) / n as f64;
            (1.0 / (var.max(0.0) + eps).sqrt()) as f32
        })
        .collect();
    Ok((mean_t, Tensor::from_slice(s, &invstd, &[c])?))
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
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    if mask.input_g {
        // batch_norm_elemt_backward runs after the all-reduce: check its arguments before it
        // (batch_norm_reduce_backward checks its own before it runs).
        let sums = per_channel_stand_in(s, saved.mean.numel())?;
        checks::batch_norm_elemt_backward(
            s,
            grad_out,
            saved.input,
            &saved.mean,
            &saved.invstd,
            weight,
            &sums,
            &sums,
            &saved.counts,
        )?;
    }
    let r = ops::batch_norm_reduce_backward(s, grad_out, saved.input, &saved.mean, &saved.invstd, weight, mask)?;
    let grad_input = if mask.input_g {
        let (Some(mut sum_dy), Some(mut sum_dy_xmu)) = (r.sum_dy, r.sum_dy_xmu) else {
            return Err(Error::invalid("mask", "input_g computes sumDy and sumDyXmu"));
        };
        comm.all_reduce(s, &mut sum_dy, ReduceOp::Sum)?;
        comm.all_reduce(s, &mut sum_dy_xmu, ReduceOp::Sum)?;
        Some(ops::batch_norm_elemt_backward(
            s,
            grad_out,
            saved.input,
            &saved.mean,
            &saved.invstd,
            weight,
            &sum_dy,
            &sum_dy_xmu,
            &saved.counts,
        )?)
    } else {
        None
    };
    Ok((grad_input, r.grad_weight, r.grad_bias))
}
