//! The CPU kernel of [`batch_norm_elemt_backward`](super::batch_norm_elemt_backward): `N` and the
//! per-channel coefficients in f64, then per element in f64 from the exact (widened) inputs
//! `((dy − a[c]) − (x − mean[c])·b[c])·k[c]` with `a = sumDy/N`, `b = invstd²·sumDyXmu/N`,
//! `k = invstd·weight`, rounded to f32 (then to the output dtype); over any strides through
//! [`channelwise::map`].

use super::Args;
use crate::cpu::channelwise::{self, tile, BlockFn, Channels, Dst, Src, Window};
use crate::cpu::host;
use crate::error::Result;
use crate::tensor::Tensor;

/// The per-channel constants, in f64, [`tile`]d.
struct Coefficients {
    mean: Vec<f64>,
    /// sumDy/N.
    a: Vec<f64>,
    /// invstd²·sumDyXmu/N.
    b: Vec<f64>,
    /// invstd·weight.
    k: Vec<f64>,
}

/// Runs the validated, non-empty call.
pub(super) fn run(args: &Args<'_>, grad_input: &mut Tensor) -> Result<()> {
    let c = args.input.shape()[1];
    let wide = |t: &Tensor, name| -> Result<Vec<f64>> {
        let v = host::view(t, name)?;
        let mut out = host::try_with_capacity(t.numel())?;
        v.for_each_f64(|x| out.push(x));
        Ok(out)
    };
    let n = counter_sum(args.counter)?;
    let mean = wide(args.mean, "mean")?;
    let invstd = wide(args.invstd, "invstd")?;
    let sum_dy = wide(args.sum_dy, "sumDy")?;
    let sum_dy_xmu = wide(args.sum_dy_xmu, "sumDyXmu")?;
    let weight = args.weight.map(|w| wide(w, "weight")).transpose()?;
    let k: Vec<f64> = match weight {
        Some(w) => host::try_collect(c, invstd.iter().zip(w).map(|(i, w)| i * w))?,
        None => host::try_collect(c, invstd.iter().copied())?,
    };
    let a: Vec<f64> = host::try_collect(c, sum_dy.iter().map(|s| s / n))?;
    let b: Vec<f64> = host::try_collect(c, invstd.iter().zip(&sum_dy_xmu).map(|(i, s)| i * i * s / n))?;
    grad_input_into(args.grad_out, args.input, [&mean, &a, &b, &k], grad_input)
}

/// `gradInput = ((dy − a[c]) − (x − mean[c])·b[c])·k[c]` per element in f64 from the widened
/// inputs, rounded to f32 then into gradInput's dtype, over any strides (also
/// `aclnnBatchNormBackward`'s CPU kernel). `[mean, a, b, k]` are per channel.
pub(in crate::ops) fn grad_input_into(
    grad_out: &Tensor,
    input: &Tensor,
    [mean, a, b, k]: [&[f64]; 4],
    grad_input: &mut Tensor,
) -> Result<()> {
    let co = Coefficients { mean: tile(mean)?, a: tile(a)?, b: tile(b)?, k: tile(k)? };
    let (shape, out_strides, out_offset) =
        (grad_input.shape().to_vec(), grad_input.strides().to_vec(), grad_input.offset());
    let (dy, x) = (host::view(grad_out, "gradOut")?, host::view(input, "input")?);
    let out = host::view_mut(grad_input, "gradInput")?;
    let srcs = [
        Src::new(dy.storage(), grad_out.shape(), grad_out.strides(), grad_out.offset()),
        Src::new(x.storage(), input.shape(), input.strides(), input.offset()),
    ];
    let dst = Dst::new(out.into_storage(), &shape, &out_strides, out_offset);
    channelwise::map(srcs, dst, 0, &co)
}

/// N: every element of counter (validated to be `[W]` or `[W, 1]`), widened exactly and summed in
/// f64 from +0 (an empty counter gives +0, as CANN's sum; Rust's float `Sum` would give −0): exact
/// for integer counts below 2^53. A counter broadcast over its W ranks (stride 0) is W times its
/// element, without walking W elements (nothing ties W to the input).
fn counter_sum(counter: &Tensor) -> Result<f64> {
    let v = host::view(counter, "counter")?;
    let w = counter.shape()[0];
    if w > 1 && counter.strides()[0] == 0 {
        let data = v.storage();
        // From +0 as the sum is: W·(−0) is −0, 0 + W·(−0) is +0.
        return Ok(0.0 + w as f64 * data.get_f64(counter.offset()));
    }
    let mut n = 0.0;
    v.for_each_f64(|x| n += x);
    Ok(n)
}

impl BlockFn<2> for Coefficients {
    #[inline(always)]
    fn block(&self, [dy, x]: &[&[f32]; 2], out: &mut [f32], channels: Channels) {
        gradient(self, dy, x, out, channels)
    }
}

/// One block, the same f64 operations for every element whatever the pattern.
#[inline(always)]
fn gradient(co: &Coefficients, dy: &[f32], x: &[f32], out: &mut [f32], channels: Channels) {
    match channels.window() {
        Window::Fixed(c) => {
            let (m, a, b, k) = (co.mean[c], co.a[c], co.b[c], co.k[c]);
            for ((o, &g), &v) in out.iter_mut().zip(dy).zip(x) {
                *o = (((f64::from(g) - a) - (f64::from(v) - m) * b) * k) as f32;
            }
        }
        Window::From(start) => {
            let w = start..start + out.len();
            let (m, a, b, k) = (&co.mean[w.clone()], &co.a[w.clone()], &co.b[w.clone()], &co.k[w]);
            let coefs = m.iter().zip(a).zip(b).zip(k);
            for (((o, &g), &v), (((&m, &a), &b), &k)) in out.iter_mut().zip(dy).zip(x).zip(coefs) {
                *o = (((f64::from(g) - a) - (f64::from(v) - m) * b) * k) as f32;
            }
        }
    }
}
