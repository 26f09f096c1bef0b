//! The CPU kernel of [`batch_norm`](super::batch_norm), built from its siblings': the per-channel
//! moments of `batch_norm_stats` (training), then the normalisation of `batch_norm_elemt` with
//! `scale = weight/sqrt(var + eps)` rounded once to f32; the running statistics in f64, rounded
//! once. The saved second statistic is the biased batch variance, as Atlas A2/A3 store it.
//!
//! In training, channel-major inputs whose channels fit in cache take the fused path
//! ([`crate::cpu::fused`]): per block of channels, the moments and then the normalisation while
//! the block is cache-resident (one read of x from memory, one write of y); the same per-element
//! arithmetic as the passes.

use super::{Args, Plan};
use crate::cpu::channelwise::{self, Dst, Src};
use crate::cpu::fused::{self, segment_layout, Blocks, Segments};
use crate::cpu::host;
use crate::error::Result;
use crate::ops::batch_norm_elemt::cpu::{bias_values, channel_values, normalize_into, Params};
use crate::ops::batch_norm_gather_stats_with_counts::cpu::update_running;
use crate::ops::batch_norm_stats::cpu::{channel_moments, Input};
use crate::tensor::Tensor;

/// The fused training forward (see the [module](self) docs): writes `output` and returns the
/// batch mean and biased variance per channel, or `None` (nothing written) when the layout or
/// the channel size does not suit it.
fn fused_forward(
    input: &Tensor,
    weight: Option<&[f32]>,
    bias: &[f32],
    eps: f64,
    output: &mut Tensor,
) -> Result<Option<(Vec<f64>, Vec<f64>)>> {
    let bytes = input.dtype().size_in_bytes();
    let strides = [input.strides(), output.strides()];
    let Some((blocks, [px, py])) =
        Blocks::plan(input.shape(), strides, [input.offset(), output.offset()], bytes, bytes)
    else {
        return Ok(None);
    };
    let x = host::view(input, "input")?;
    let data = x.storage();
    let y = Segments::new(host::view_mut(output, "output")?.into_storage());
    let sums = fused::run(&blocks, &|range, first, second| {
        let width = range.len();
        let (shape, strides, offset) = blocks.view(px, &range);
        let moments = channel_moments(Input::new(data, &shape, &strides, offset), 1)?;
        let (mut mean_f32, mut scale) = (host::try_vec(width, 0f32)?, host::try_vec(width, 0f32)?);
        for (i, m) in moments.iter().enumerate() {
            let (mu, v) = m.mean_var();
            (first[i], second[i]) = (mu, v);
            mean_f32[i] = mu as f32;
            scale[i] = (weight.map_or(1.0, |w| f64::from(w[range.start + i])) / (v + eps).sqrt()) as f32;
        }
        let p = Params::new(&mean_f32, &scale, &bias[range.clone()])?;
        let (seg_shape, seg_strides) = segment_layout(width, blocks.inner);
        let src_shape = [1, width, blocks.inner];
        for n in 0..blocks.batches {
            let src = Src::new(data, &src_shape, &strides, offset + n * strides[0]);
            // SAFETY: batch n's segment of this block's channels: inside the output (validated
            // view) and disjoint from every other (block, batch) segment (channel-major layout,
            // checked by `Blocks::plan`); no other slice of it is alive (one per iteration).
            let out = unsafe { y.segment(blocks.segment(py, &range, n)) };
            channelwise::map([src], Dst::new(out, &seg_shape, &seg_strides, 0), 1, &p)?;
        }
        Ok(())
    })?;
    Ok(Some(sums))
}

/// Runs the validated call.
pub(super) fn run(
    args: &Args<'_>,
    plan: Plan,
    [running_mean, running_var]: [Option<&mut Tensor>; 2],
    output: &mut Tensor,
    [save_mean, save_var]: [Option<&mut Tensor>; 2],
) -> Result<()> {
    let c = plan.channels;
    // CANN computes with eps and momentum in f32: so does the CPU.
    let (eps, momentum) = (f64::from(args.eps as f32), f64::from(args.momentum as f32));
    if plan.empty {
        // CANN's empty-input rule: saved mean 0, second statistic NaN, nothing else.
        if let Some(m) = save_mean {
            host::write_vector(m, "saveMean", std::iter::repeat_n(0.0, c))?;
        }
        if let Some(v) = save_var {
            host::write_vector(v, "saveInvstd", std::iter::repeat_n(f64::NAN, c))?;
        }
        return Ok(());
    }
    let weight = args.weight.map(|w| channel_values(w, "weight")).transpose()?;
    let bias = bias_values(args.bias, c)?;
    // Everything that may fail before the first write but the writes themselves.
    let old = if args.training {
        let old_m = running_mean.as_deref().map(host::values).transpose()?;
        let old_v = running_var.as_deref().map(host::values).transpose()?;
        Some((old_m, old_v))
    } else {
        None
    };
    // The elements per channel of the view (the moments may visit a broadcast dim once).
    let n = (args.input.numel() / c) as f64;
    let fused = if args.training { fused_forward(args.input, weight.as_deref(), &bias, eps, output)? } else { None };
    let written = fused.is_some();
    let (mean, var) = match fused {
        Some(stats) => stats,
        None if args.training => {
            let input = args.input;
            let data = host::view(input, "input")?.storage();
            let moments = channel_moments(Input::new(data, input.shape(), input.strides(), input.offset()), 0)?;
            let mean = host::try_collect(c, moments.iter().map(|m| m.mean_var().0))?;
            let var = host::try_collect(c, moments.iter().map(|m| m.mean_var().1))?;
            (mean, var)
        }
        None => {
            let or = |t: &Option<&mut Tensor>, v: f64| match t {
                Some(t) => host::values(t),
                None => host::try_vec(c, v),
            };
            (or(&running_mean, 0.0)?, or(&running_var, 1.0)?)
        }
    };
    if !written {
        let scale: Vec<f32> = host::try_collect(
            c,
            var.iter()
                .enumerate()
                .map(|(i, v)| (weight.as_ref().map_or(1.0, |w| f64::from(w[i])) / (v + eps).sqrt()) as f32),
        )?;
        let mean_f32: Vec<f32> = host::try_collect(c, mean.iter().map(|&m| m as f32))?;
        normalize_into(args.input, &mean_f32, &scale, &bias, output)?;
    }
    if let Some((old_m, old_v)) = old {
        if let (Some(rm), Some(old)) = (running_mean, old_m) {
            update_running(rm, "runningMean", &old, mean.iter().copied(), momentum)?;
        }
        let unbias = n / (n - 1.0);
        if let (Some(rv), Some(old)) = (running_var, old_v) {
            update_running(rv, "runningVar", &old, var.iter().map(|v| v * unbias), momentum)?;
        }
        if let Some(m) = save_mean {
            host::write_vector(m, "saveMean", mean.iter().copied())?;
        }
        if let Some(v) = save_var {
            host::write_vector(v, "saveInvstd", var.iter().copied())?;
        }
    }
    Ok(())
}
