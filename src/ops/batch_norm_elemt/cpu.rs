//! The CPU kernel of [`batch_norm_elemt`](super::batch_norm_elemt): per element, in f32,
//! `(x − mean[c])·scale[c] + bias[c]` with `scale[c] = r[c]·weight[c]` rounded once from the
//! exact product, where `r[c] = 1/sqrt((1/invstd[c]² − eps) + eps)` in f32 is the factor CANN
//! normalises by (it rebuilds the variance from invstd, `docs/cann/SYNCBN.md`); over any strides through [`channelwise::map`] (runs of one channel for NCHW,
//! rows of consecutive channels for channels-last, several threads for large inputs).

use crate::cpu::channelwise::{self, tile, BlockFn, Channels, Dst, Src, Window};
use crate::cpu::host;
use crate::cpu::scratch::Scratch;
use crate::error::Result;
use crate::tensor::Tensor;

/// The per-channel constants, in f32, [`tile`]d: the normalisation as a [`BlockFn`].
pub(in crate::ops) struct Params {
    mean: Scratch<f32>,
    scale: Scratch<f32>,
    bias: Scratch<f32>,
}

/// Runs a validated, non-empty call over host tensors: `input` `(N, C, ...)`, the optional
/// `[C]` weight and bias, the `[C]` mean and invstd, and `eps` (taken in f32, as CANN uses it).
pub(in crate::ops) fn run(
    input: &Tensor,
    [weight, bias]: [Option<&Tensor>; 2],
    [mean, invstd]: [&Tensor; 2],
    eps: f64,
    output: &mut Tensor,
) -> Result<()> {
    let eps = eps as f32;
    let c = input.shape()[1];
    let mean = channel_values(mean, "mean")?;
    let invstd = channel_values(invstd, "invstd")?;
    let weight = weight.map(|w| channel_values(w, "weight")).transpose()?;
    let bias = bias_values(bias, c)?;
    // CANN rebuilds the variance from invstd² and normalises by 1/sqrt(var + eps), every step in
    // f32 (so a negative invstd acts as its magnitude, and an eps that dwarfs 1/invstd² gives
    // what f32 gives); the same f32 steps here give the same factor, bit for bit. The product of
    // two f32 values is exact in f64: one rounding.
    let factor = |s: f32| 1.0 / ((1.0 / (s * s) - eps) + eps).sqrt();
    let scale: Scratch<f32> = match &weight {
        Some(w) => {
            host::scratch_collect(c, invstd.iter().zip(w).map(|(&i, &w)| (f64::from(factor(i)) * f64::from(w)) as f32))?
        }
        None => host::scratch_collect(c, invstd.iter().map(|&i| factor(i)))?,
    };
    normalize_into(input, &mean, &scale, &bias, output)
}

/// `output = (input − mean[c])·scale[c] + bias[c]` per element in f32, rounded once into the
/// output's dtype, over any strides (also `aclnnBatchNorm`'s CPU kernel).
pub(in crate::ops) fn normalize_into(
    input: &Tensor,
    mean: &[f32],
    scale: &[f32],
    bias: &[f32],
    output: &mut Tensor,
) -> Result<()> {
    let p = Params::new(mean, scale, bias)?;
    let (shape, out_strides, rank) = host::layout_of(output)?;
    let out_offset = output.offset();
    let x = host::view(input, "input")?;
    let y = host::view_mut(output, "output")?;
    let src = Src::new(x.storage(), input.shape(), input.strides(), input.offset());
    let dst = Dst::new(y.into_storage(), &shape[..rank], &out_strides[..rank], out_offset);
    channelwise::map([src], dst, 0, &p)
}

impl Params {
    /// `(x − mean[c])·scale[c] + bias[c]` for channels `0..mean.len()`.
    pub(in crate::ops) fn new(mean: &[f32], scale: &[f32], bias: &[f32]) -> Result<Params> {
        Ok(Params { mean: tile(mean)?, scale: tile(scale)?, bias: tile(bias)? })
    }
}

impl BlockFn<1> for Params {
    #[inline(always)]
    fn block(&self, [x]: &[&[f32]; 1], out: &mut [f32], channels: Channels) {
        normalize(self, x, out, channels)
    }
}

/// One block: `out = (x − mean)·scale + bias` with its channels' constants. The same f32
/// operations for every element whatever the pattern, so any walk gives the same bits.
#[inline(always)]
fn normalize(p: &Params, x: &[f32], out: &mut [f32], channels: Channels) {
    match channels.window() {
        Window::Fixed(c) => {
            let (m, s, b) = (p.mean[c], p.scale[c], p.bias[c]);
            for (o, &v) in out.iter_mut().zip(x) {
                *o = (v - m) * s + b;
            }
        }
        Window::From(start) => {
            let n = out.len();
            let w = start..start + n;
            let (m, s, b) = (&p.mean[w.clone()], &p.scale[w.clone()], &p.bias[w]);
            for ((((o, &v), &m), &s), &b) in out.iter_mut().zip(x).zip(m).zip(s).zip(b) {
                *o = (v - m) * s + b;
            }
        }
    }
}

/// The `[C]` bias widened to f32, or `c` zeros without one (CANN's fill).
pub(in crate::ops) fn bias_values(bias: Option<&Tensor>, c: usize) -> Result<Scratch<f32>> {
    match bias {
        Some(b) => channel_values(b, "bias"),
        None => host::scratch_vec(c, 0.0),
    }
}

/// A validated `[C]` float vector, widened to f32 (exact for f32, f16 and bf16).
pub(crate) fn channel_values(t: &Tensor, name: &'static str) -> Result<Scratch<f32>> {
    let v = host::view(t, name)?;
    let mut out = host::scratch_with_capacity(t.numel())?;
    v.for_each_f32(|x| out.push(x));
    Ok(out)
}
