//! The CPU kernel of [`batch_norm_backward`](super::batch_norm_backward), built from its siblings':
//! the centered sums Σdy and Σdy·(x − m) of `batch_norm_reduce_backward`, then grad_input per
//! element as `batch_norm_elemt_backward` computes it, with `m, v` the saved mean and variance
//! (training) or the running statistics (eval).

use super::{Args, Plan};
use crate::cpu::host;
use crate::cpu::scratch::Scratch;
use crate::error::Result;
use crate::ops::batch_norm_elemt_backward::cpu::grad_input_into;
use crate::ops::batch_norm_reduce_backward::cpu::centered_sums;
use crate::tensor::Tensor;

/// The per-channel constants of grad_input: `[mean, a, b, k]` from the sums (see the module docs).
struct Factors<'a> {
    mean: &'a [f32],
    r: &'a [f64],
    k: &'a [f64],
    n: f64,
    training: bool,
}

impl Factors<'_> {
    /// `(mean, a, b, k)` of channel `i` with its sums Σdy and Σdy·(x − mean).
    fn of(&self, i: usize, sum_dy: f64, xmu: f64) -> [f64; 4] {
        let (a, b) = if self.training { (sum_dy / self.n, self.r[i] * self.r[i] * xmu / self.n) } else { (0.0, 0.0) };
        [f64::from(self.mean[i]), a, b, self.k[i]]
    }
}

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
        Some(t) => host::scratch_values(t)?,
        None => host::scratch_vec(c, 0.0)?,
    };
    let var = match var_t {
        Some(t) => host::scratch_values(t)?,
        None => host::scratch_vec(c, 1.0)?,
    };
    let r: Scratch<f64> = host::scratch_collect(c, var.iter().map(|v| 1.0 / (v + eps).sqrt()))?;
    let mean_f32: Scratch<f32> = host::scratch_collect(c, mean.iter().map(|&m| m as f32))?;
    let n = (args.input.numel() / c) as f64;
    let weight = args.weight.map(host::scratch_values).transpose()?;
    let k: Scratch<f64> = host::scratch_collect(c, (0..c).map(|i| r[i] * weight.as_ref().map_or(1.0, |w| w[i])))?;
    let f = Factors { mean: &mean_f32, r: &r, k: &k, n, training: args.training };
    // Everything that may fail comes before the first write but the writes themselves.
    let sums = centered_sums(args.grad_out, args.input, &mean_f32)?;
    let xmu = sums.sum_dy_xmu.unwrap_or_default();
    if let Some(gi) = gi {
        let mut factors = [(); 4].map(|_| Scratch::new());
        for v in &mut factors {
            *v = host::scratch_vec(c, 0.0)?;
        }
        for i in 0..c {
            for (v, x) in factors.iter_mut().zip(f.of(i, sums.sum_dy[i], xmu[i])) {
                v[i] = x;
            }
        }
        let [m, a, b, k] = &factors;
        grad_input_into(args.grad_out, args.input, [m, a, b, k], gi)?;
    }
    let sum_dy = sums.sum_dy;
    if let Some(gw) = gw {
        host::write_vector(gw, "gradWeight", xmu.iter().zip(&r).map(|(s, r)| s * r))?;
    }
    if let Some(gb) = gb {
        host::write_vector(gb, "gradBias", sum_dy.iter().copied())?;
    }
    Ok(())
}
