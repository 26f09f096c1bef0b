//! The CPU kernel of [`batch_norm_backward`](super::batch_norm_backward), built from its siblings':
//! the centered sums Σdy and Σdy·(x − m) of `batch_norm_reduce_backward`, then grad_input per
//! element as `batch_norm_elemt_backward` computes it, with `m, v` the saved mean and variance
//! (training) or the running statistics (eval).
//!
//! Channel-major inputs whose channels fit in cache take the fused path ([`crate::cpu::fused`]):
//! per block of channels, the sums and then grad_input while dy and x are cache-resident (one
//! read of each from memory, one write of grad_input).

use super::{Args, Plan};
use crate::cpu::channelwise::{self, Dst, Src};
use crate::cpu::fused::{self, segment_layout, Blocks, Segments};
use crate::cpu::host;
use crate::error::Result;
use crate::ops::batch_norm_elemt_backward::cpu::{grad_input_into, Coefficients};
use crate::ops::batch_norm_reduce_backward::cpu::{centered_sums, centered_sums_of};
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

/// The fused backward (see the [module](self) docs): writes `gi` and returns Σdy and
/// Σdy·(x − mean) per channel, or `None` (nothing written) when the layout or the channel size
/// does not suit it.
fn fused_backward(args: &Args<'_>, f: &Factors<'_>, gi: &mut Tensor) -> Result<Option<(Vec<f64>, Vec<f64>)>> {
    let (dy_t, x_t) = (args.grad_out, args.input);
    let bytes = x_t.dtype().size_in_bytes();
    let strides = [dy_t.strides(), x_t.strides(), gi.strides()];
    let offsets = [dy_t.offset(), x_t.offset(), gi.offset()];
    let Some((blocks, [pd, px, pg])) = Blocks::plan(x_t.shape(), strides, offsets, 2 * bytes, bytes) else {
        return Ok(None);
    };
    let (dy, x) = (host::view(dy_t, "gradOut")?, host::view(x_t, "input")?);
    let (dy, x) = (dy.storage(), x.storage());
    let dtype = gi.dtype();
    let out = Segments::new(host::view_mut(gi, "gradInput")?.into_storage());
    let sums = fused::run(&blocks, &|range, first, second| {
        let width = range.len();
        let (shape, dy_strides, dy_offset) = blocks.view(pd, &range);
        let (_, x_strides, x_offset) = blocks.view(px, &range);
        let sums = centered_sums_of(
            Src::new(dy, &shape, &dy_strides, dy_offset),
            Src::new(x, &shape, &x_strides, x_offset),
            &f.mean[range.clone()],
            1,
        )?;
        let block_xmu = sums.sum_dy_xmu.unwrap_or_default();
        let mut factors = [(); 4].map(|_| Vec::new());
        for v in &mut factors {
            *v = host::try_vec(width, 0.0)?;
        }
        for i in 0..width {
            (first[i], second[i]) = (sums.sum_dy[i], block_xmu[i]);
            let row = f.of(range.start + i, sums.sum_dy[i], block_xmu[i]);
            for (v, r) in factors.iter_mut().zip(row) {
                v[i] = r;
            }
        }
        let [m, a, bb, k] = &factors;
        let co = Coefficients::new([m, a, bb, k], dtype)?;
        let (seg_shape, seg_strides) = segment_layout(width, blocks.inner);
        let src_shape = [1, width, blocks.inner];
        for n in 0..blocks.batches {
            let srcs = [
                Src::new(dy, &src_shape, &dy_strides, dy_offset + n * dy_strides[0]),
                Src::new(x, &src_shape, &x_strides, x_offset + n * x_strides[0]),
            ];
            // SAFETY: batch n's segment of this block's channels: inside gradInput (validated
            // view) and disjoint from every other (block, batch) segment (channel-major layout,
            // checked by `Blocks::plan`); no other slice of it is alive (one per iteration).
            let seg = unsafe { out.segment(blocks.segment(pg, &range, n)) };
            channelwise::map(srcs, Dst::new(seg, &seg_shape, &seg_strides, 0), 1, &co)?;
        }
        Ok(())
    })?;
    Ok(Some(sums))
}

/// Runs the validated call.
pub(super) fn run(args: &Args<'_>, plan: Plan, [mut gi, gw, gb]: [Option<&mut Tensor>; 3]) -> Result<()> {
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
    let n = (args.input.numel() / c) as f64;
    let weight = args.weight.map(host::values).transpose()?;
    let k: Vec<f64> = host::try_collect(c, (0..c).map(|i| r[i] * weight.as_ref().map_or(1.0, |w| w[i])))?;
    let f = Factors { mean: &mean_f32, r: &r, k: &k, n, training: args.training };
    // Everything that may fail comes before the first write but the writes themselves.
    let fused = match gi {
        Some(ref mut gi) => fused_backward(args, &f, gi)?,
        None => None,
    };
    let (sum_dy, xmu) = match fused {
        Some(sums) => sums,
        None => {
            let sums = centered_sums(args.grad_out, args.input, &mean_f32)?;
            let xmu = sums.sum_dy_xmu.unwrap_or_default();
            if let Some(gi) = gi {
                let mut factors = [(); 4].map(|_| Vec::new());
                for v in &mut factors {
                    *v = host::try_vec(c, 0.0)?;
                }
                for i in 0..c {
                    for (v, x) in factors.iter_mut().zip(f.of(i, sums.sum_dy[i], xmu[i])) {
                        v[i] = x;
                    }
                }
                let [m, a, b, k] = &factors;
                grad_input_into(args.grad_out, args.input, [m, a, b, k], gi)?;
            }
            (sums.sum_dy, xmu)
        }
    };
    if let Some(gw) = gw {
        host::write_vector(gw, "gradWeight", xmu.iter().zip(&r).map(|(s, r)| s * r))?;
    }
    if let Some(gb) = gb {
        host::write_vector(gb, "gradBias", sum_dy.iter().copied())?;
    }
    Ok(())
}
