//! The CPU kernel of [`batch_norm_elemt_backward`](super::batch_norm_elemt_backward): `N` and the
//! per-channel coefficients in f64, then per element in f64 from the exact (f32-widened) inputs
//! `((dy − a[c]) − (x − mean[c])·b[c])·k[c]` with `a = sumDy/N`, `b = invstd²·sumDyXmu/N`,
//! `k = invstd·weight`, rounded to f32 (then to the output dtype); over any strides through
//! [`channelwise::map`].

use super::Args;
use crate::cpu::channelwise::{self, tile, Channels, Dst, Src, Window};
use crate::error::{Error, Result};
use crate::ops::batch_norm_elemt::cpu::channel_values;
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
    let wide =
        |t: &Tensor, name| -> Result<Vec<f64>> { Ok(channel_values(t, name)?.into_iter().map(f64::from).collect()) };
    // N: every element of counter (validated to be [W] or [W, 1]), summed in f64: exact for
    // integer counts below 2^53.
    let n: f64 = wide(args.counter, "counter")?.iter().sum();
    let mean = wide(args.mean, "mean")?;
    let invstd = wide(args.invstd, "invstd")?;
    let sum_dy = wide(args.sum_dy, "sumDy")?;
    let sum_dy_xmu = wide(args.sum_dy_xmu, "sumDyXmu")?;
    let weight = args.weight.map(|w| wide(w, "weight")).transpose()?;
    let k: Vec<f64> = match weight {
        Some(w) => invstd.iter().zip(w).map(|(i, w)| i * w).collect(),
        None => invstd.clone(),
    };
    let a: Vec<f64> = sum_dy.iter().map(|s| s / n).collect();
    let b: Vec<f64> = invstd.iter().zip(&sum_dy_xmu).map(|(i, s)| i * i * s / n).collect();
    let co = Coefficients { mean: tile(&mean), a: tile(&a), b: tile(&b), k: tile(&k) };
    let (shape, out_strides, out_offset) =
        (grad_input.shape().to_vec(), grad_input.strides().to_vec(), grad_input.offset());
    let (Some(dy), Some(x)) = (args.grad_out.as_host_view(), args.input.as_host_view()) else {
        return Err(Error::invalid("input", "a device tensor reached the CPU backend"));
    };
    let Some(out) = grad_input.as_host_view_mut() else {
        return Err(Error::invalid("gradInput", "a device tensor reached the CPU backend"));
    };
    let srcs = [
        Src { data: dy.storage(), strides: args.grad_out.strides(), offset: args.grad_out.offset() },
        Src { data: x.storage(), strides: args.input.strides(), offset: args.input.offset() },
    ];
    let dst = Dst { data: out.into_storage(), strides: &out_strides, offset: out_offset };
    channelwise::map(&shape, srcs, dst, 0, &|[dy, x], out, channels| gradient(&co, dy, x, out, channels));
    Ok(())
}

/// One block, the same f64 operations for every element whatever the pattern.
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
