//! The CPU kernel of [`batch_norm_elemt_backward`](super::batch_norm_elemt_backward): `N` and the
//! per-channel coefficients in f64, then per element in f64 from the exact (widened) inputs
//! `((dy − a[c]) − (x − mean[c])·b[c])·k[c]` with `a = sumDy/N`, `b = invstd²·sumDyXmu/N`,
//! `k = invstd·weight`, rounded to f32 (then to the output dtype); over any strides through
//! [`channelwise::map`]. A half-precision gradInput (f16, bf16) takes the same expression in f32
//! from the coefficients rounded to f32: its error (a few f32 ulps of the terms) stays far below
//! the final rounding to 11 or 8 significant bits, and the f32 loop runs twice the lanes.

use super::Args;
use crate::cpu::channelwise::{self, tile, BlockFn, Channels, Dst, Src, Window};
use crate::cpu::host;
use crate::cpu::scratch::Scratch;
use crate::error::Result;
use crate::tensor::Tensor;

/// The per-channel constants, in f64 (or f32 for a half-precision gradInput), [`tile`]d: the
/// gradient as a [`BlockFn`].
pub(in crate::ops) enum Coefficients {
    /// f64 math (an f32 gradInput).
    Double(Constants<f64>),
    /// f32 math (an f16 or bf16 gradInput).
    Single(Constants<f32>),
}

/// `[mean, a, b, k]` per channel, [`tile`]d.
pub(in crate::ops) struct Constants<T> {
    mean: Scratch<T>,
    /// sumDy/N.
    a: Scratch<T>,
    /// invstd²·sumDyXmu/N.
    b: Scratch<T>,
    /// invstd·weight.
    k: Scratch<T>,
}

impl Coefficients {
    /// The gradient with `[mean, a, b, k]` per channel into a gradInput of `dtype`.
    pub(in crate::ops) fn new([mean, a, b, k]: [&[f64]; 4], dtype: crate::DType) -> Result<Coefficients> {
        Ok(match dtype {
            crate::DType::F16 | crate::DType::BF16 => {
                let narrow = |v: &[f64]| -> Result<Scratch<f32>> {
                    tile(&host::scratch_collect(v.len(), v.iter().map(|&x| x as f32))?)
                };
                Coefficients::Single(Constants { mean: narrow(mean)?, a: narrow(a)?, b: narrow(b)?, k: narrow(k)? })
            }
            _ => Coefficients::Double(Constants { mean: tile(mean)?, a: tile(a)?, b: tile(b)?, k: tile(k)? }),
        })
    }
}

/// Runs the validated, non-empty call.
pub(super) fn run(args: &Args<'_>, grad_input: &mut Tensor) -> Result<()> {
    let c = args.input.shape()[1];
    let wide = |t: &Tensor, name| -> Result<Scratch<f64>> {
        let v = host::view(t, name)?;
        let mut out = host::scratch_with_capacity(t.numel())?;
        v.for_each_f64(|x| out.push(x));
        Ok(out)
    };
    let n = counter_sum(args.counter)?;
    let mean = wide(args.mean, "mean")?;
    let invstd = wide(args.invstd, "invstd")?;
    let sum_dy = wide(args.sum_dy, "sumDy")?;
    let sum_dy_xmu = wide(args.sum_dy_xmu, "sumDyXmu")?;
    let weight = args.weight.map(|w| wide(w, "weight")).transpose()?;
    let k: Scratch<f64> = match weight {
        Some(w) => host::scratch_collect(c, invstd.iter().zip(w.iter()).map(|(i, w)| i * w))?,
        None => host::scratch_collect(c, invstd.iter().copied())?,
    };
    let a: Scratch<f64> = host::scratch_collect(c, sum_dy.iter().map(|s| s / n))?;
    let b: Scratch<f64> = host::scratch_collect(c, invstd.iter().zip(&sum_dy_xmu).map(|(i, s)| i * i * s / n))?;
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
    let co = Coefficients::new([mean, a, b, k], grad_input.dtype())?;
    let (shape, out_strides, rank) = host::layout_of(grad_input)?;
    let out_offset = grad_input.offset();
    let (dy, x) = (host::view(grad_out, "gradOut")?, host::view(input, "input")?);
    let out = host::view_mut(grad_input, "gradInput")?;
    let srcs = [
        Src::new(dy.storage(), grad_out.shape(), grad_out.strides(), grad_out.offset()),
        Src::new(x.storage(), input.shape(), input.strides(), input.offset()),
    ];
    let dst = Dst::new(out.into_storage(), &shape[..rank], &out_strides[..rank], out_offset);
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
        match self {
            Coefficients::Double(co) => gradient(co, dy, x, out, channels, f64::from, |v| v as f32),
            Coefficients::Single(co) => gradient(co, dy, x, out, channels, |v| v, |v| v),
        }
    }
}

/// One block, the same operations (in `T`) for every element whatever the pattern.
#[inline(always)]
fn gradient<T>(
    co: &Constants<T>,
    dy: &[f32],
    x: &[f32],
    out: &mut [f32],
    channels: Channels,
    wide: impl Fn(f32) -> T,
    narrow: impl Fn(T) -> f32,
) where
    T: Copy + std::ops::Sub<Output = T> + std::ops::Mul<Output = T>,
{
    match channels.window() {
        Window::Fixed(c) => {
            let (m, a, b, k) = (co.mean[c], co.a[c], co.b[c], co.k[c]);
            for ((o, &g), &v) in out.iter_mut().zip(dy).zip(x) {
                *o = narrow(((wide(g) - a) - (wide(v) - m) * b) * k);
            }
        }
        Window::From(start) => {
            let w = start..start + out.len();
            let (m, a, b, k) = (&co.mean[w.clone()], &co.a[w.clone()], &co.b[w.clone()], &co.k[w]);
            let coefs = m.iter().zip(a).zip(b).zip(k);
            for (((o, &g), &v), (((&m, &a), &b), &k)) in out.iter_mut().zip(dy).zip(x).zip(coefs) {
                *o = narrow(((wide(g) - a) - (wide(v) - m) * b) * k);
            }
        }
    }
}
