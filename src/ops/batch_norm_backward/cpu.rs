//! The CPU kernel of [`batch_norm_backward`](super::batch_norm_backward), built from its siblings':
//! the centered sums Σdy and Σdy·(x − m) of `batch_norm_reduce_backward`, then grad_input per
//! element as `batch_norm_elemt_backward` computes it, with `m, v` the saved mean and variance
//! (training) or the running statistics (eval).

use super::{Args, Plan};
use crate::cpu::host;
use crate::error::Result;
use crate::ops::batch_norm_elemt_backward::cpu::grad_input_into;
use crate::ops::batch_norm_reduce_backward::cpu::centered_sums;
use crate::tensor::Tensor;

/// Runs the validated call.
pub(super) fn run(args: &Args<'_>, plan: Plan, [gi, gw, gb]: [Option<&mut Tensor>; 3]) -> Result<()> {
    let c = plan.channels;
    if plan.empty {
        for (t, name) in [(gw, "gradWeight"), (gb, "gradBias")] {
            if let Some(t) = t {
                host::write_vector(t, name, std::iter::repeat_n(0.0, c))?;
            }
        }
        return Ok(());
    }
    let eps = f64::from(args.eps as f32);
    let [sm, sv] = args.save();
    let (mean_t, var_t) = if args.training { (sm, sv) } else { (args.running_mean, args.running_var) };
    let mean = match mean_t {
        Some(t) => host::values(t)?,
        None => host::try_vec(c, 0.0)?,
    };
    let var = match var_t {
        Some(t) => host::values(t)?,
        None => host::try_vec(c, 1.0)?,
    };
    let r: Vec<f64> = host::try_collect(c, var.iter().map(|v| 1.0 / (v + eps).sqrt()))?;
    let mean_f32: Vec<f32> = host::try_collect(c, mean.iter().map(|&m| m as f32))?;
    let sums = centered_sums(args.grad_out, args.input, &mean_f32)?;
    let xmu = sums.sum_dy_xmu.unwrap_or_default();
    let n = (args.input.numel() / c) as f64;
    let weight = args.weight.map(host::values).transpose()?;
    let k: Vec<f64> = host::try_collect(c, (0..c).map(|i| r[i] * weight.as_ref().map_or(1.0, |w| w[i])))?;
    // Everything that may fail comes before the first write but the writes themselves.
    if let Some(gi) = gi {
        let m = host::try_collect(c, mean_f32.iter().map(|&m| f64::from(m)))?;
        let (a, b) = if args.training {
            (
                host::try_collect(c, sums.sum_dy.iter().map(|s| s / n))?,
                host::try_collect(c, (0..c).map(|i| r[i] * r[i] * xmu[i] / n))?,
            )
        } else {
            (host::try_vec(c, 0.0)?, host::try_vec(c, 0.0)?)
        };
        grad_input_into(args.grad_out, args.input, [&m, &a, &b, &k], gi)?;
    }
    if let Some(gw) = gw {
        host::write_vector(gw, "gradWeight", xmu.iter().zip(&r).map(|(s, r)| s * r))?;
    }
    if let Some(gb) = gb {
        host::write_vector(gb, "gradBias", sums.sum_dy.iter().copied())?;
    }
    Ok(())
}
