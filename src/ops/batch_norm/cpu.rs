//! The CPU kernel of [`batch_norm`](super::batch_norm), built from its siblings': the per-channel
//! moments of `batch_norm_stats` (training), then the normalisation of `batch_norm_elemt` with
//! `scale = weight/sqrt(var + eps)` rounded once to f32; the running statistics in f64, rounded
//! once. The saved second statistic is the biased batch variance, as Atlas A2/A3 store it.

use super::{Args, Plan};
use crate::cpu::host;
use crate::error::Result;
use crate::ops::batch_norm_elemt::cpu::{bias_values, channel_values, normalize_into};
use crate::ops::batch_norm_gather_stats_with_counts::cpu::update_running;
use crate::ops::batch_norm_stats::cpu::{channel_moments, Input};
use crate::tensor::Tensor;

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
        let old_m = running_mean.as_deref().map(host::scratch_values).transpose()?;
        let old_v = running_var.as_deref().map(host::scratch_values).transpose()?;
        Some((old_m, old_v))
    } else {
        None
    };
    // The elements per channel of the view (the moments may visit a broadcast dim once).
    let n = (args.input.numel() / c) as f64;
    let (mean, var) = if args.training {
        let input = args.input;
        let data = host::view(input, "input")?.storage();
        let moments = channel_moments(Input::new(data, input.shape(), input.strides(), input.offset()), 0)?;
        let mean = host::scratch_collect(c, moments.iter().map(|m| m.mean_var().0))?;
        let var = host::scratch_collect(c, moments.iter().map(|m| m.mean_var().1))?;
        (mean, var)
    } else {
        let or = |t: &Option<&mut Tensor>, v: f64| match t {
            Some(t) => host::scratch_values(t),
            None => host::scratch_vec(c, v),
        };
        (or(&running_mean, 0.0)?, or(&running_var, 1.0)?)
    };
    let scale = host::scratch_collect(
        c,
        var.iter()
            .enumerate()
            .map(|(i, v)| (weight.as_ref().map_or(1.0, |w| f64::from(w[i])) / (v + eps).sqrt()) as f32),
    )?;
    let mean_f32 = host::scratch_collect(c, mean.iter().map(|&m| m as f32))?;
    normalize_into(args.input, &mean_f32, &scale, &bias, output)?;
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
