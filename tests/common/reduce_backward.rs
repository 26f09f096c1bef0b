//! The first operator's fixtures (`ops::batch_norm_reduce_backward`): the f64 reference with
//! its per-channel condition sums, host inputs, uploaded inputs and caller-owned outputs.
#![allow(dead_code)]

use ascend::ops::{
    batch_norm_reduce_backward, batch_norm_reduce_backward_into, prepare_batch_norm_reduce_backward, OutputMask,
    PreparedReduceBackward, ReduceBackward, ReduceBackwardOut,
};
use ascend::{DType, Result, Stream, Tensor};

use super::data::{for_each_index, read, uploaded, Data};
use super::rng::Rng;
use super::tolerance::assert_close;

/// The dtype the allocating API gives (op-plugin's rule): f16 iff input and mean are both f16.
pub fn allocating_dtype(input: DType, mean: DType) -> DType {
    if input == DType::F16 && mean == DType::F16 {
        DType::F16
    } else {
        DType::F32
    }
}

/// The op's outputs in f64, with per-channel condition sums for the tolerances.
#[derive(Clone, Debug)]
pub struct Expected {
    pub channels: usize,
    /// Elements reduced per channel.
    pub r: usize,
    pub sum_dy: Vec<f64>,
    pub sum_dy_xmu: Vec<f64>,
    pub grad_weight: Vec<f64>,
    pub grad_bias: Vec<f64>,
    /// Σ|dy| per channel (condition of sumDy / gradBias).
    pub cond_dy: Vec<f64>,
    /// Σ|dy|·(|x| + |mean|) per channel: bounds the terms of both the direct sum Σdy·(x−mean)
    /// and the Ascend kernel's one-pass Σdy·x − mean·Σdy.
    pub cond_xmu: Vec<f64>,
    /// cond_xmu·|invstd|.
    pub cond_gw: Vec<f64>,
}

impl Expected {
    /// The expected values of output `i` (sumDy, sumDyXmu, gradWeight, gradBias order).
    pub fn output(&self, i: usize) -> (&[f64], &[f64]) {
        match i {
            0 => (&self.sum_dy, &self.cond_dy),
            1 => (&self.sum_dy_xmu, &self.cond_xmu),
            2 => (&self.grad_weight, &self.cond_gw),
            _ => (&self.grad_bias, &self.cond_dy),
        }
    }
}

/// The op computed independently in f64: plain loops over every multi-index of the shape,
/// reading each tensor through its own strides; `sumDyXmu = Σ dy·(x − mean)` summed directly
/// (two-pass: the mean is given, never `Σdy·x − mean·Σdy`), `gradWeight = sumDyXmu·invstd`,
/// `gradBias = sumDy`. weight is not an argument: it never changes a value.
pub fn reference(dy: &Data, x: &Data, mean: &Data, invstd: &Data) -> Expected {
    assert_eq!(dy.shape, x.shape);
    let c = x.shape[1];
    let mean = mean.values();
    let invstd = invstd.values();
    assert_eq!((mean.len(), invstd.len()), (c, c));
    let mut e = Expected {
        channels: c,
        r: x.numel().checked_div(c).unwrap_or(0),
        sum_dy: vec![0.0; c],
        sum_dy_xmu: vec![0.0; c],
        grad_weight: vec![0.0; c],
        grad_bias: vec![0.0; c],
        cond_dy: vec![0.0; c],
        cond_xmu: vec![0.0; c],
        cond_gw: vec![0.0; c],
    };
    for_each_index(&x.shape, |i| {
        let ch = i[1];
        let (g, v) = (dy.get(i), x.get(i));
        e.sum_dy[ch] += g;
        e.sum_dy_xmu[ch] += g * (v - mean[ch]);
        e.cond_dy[ch] += g.abs();
        e.cond_xmu[ch] += g.abs() * (v.abs() + mean[ch].abs());
    });
    for (ch, &inv) in invstd.iter().enumerate() {
        e.grad_weight[ch] = e.sum_dy_xmu[ch] * inv;
        e.grad_bias[ch] = e.sum_dy[ch];
        e.cond_gw[ch] = e.cond_xmu[ch] * inv.abs();
    }
    e
}

pub const OUTPUT_NAMES: [&str; 4] = ["sumDy", "sumDyXmu", "gradWeight", "gradBias"];

/// Which outputs `mask` turns on, in [`OUTPUT_NAMES`] order.
pub fn enabled(mask: OutputMask) -> [bool; 4] {
    [mask.input_g, mask.input_g, mask.weight_g, mask.bias_g]
}

/// All eight masks.
pub fn all_masks() -> Vec<OutputMask> {
    (0..8).map(|m| OutputMask { input_g: m & 1 != 0, weight_g: m & 2 != 0, bias_g: m & 4 != 0 }).collect()
}

/// The four outputs of an allocating call, in [`OUTPUT_NAMES`] order.
pub fn outputs(out: &ReduceBackward) -> [Option<&Tensor>; 4] {
    [out.sum_dy.as_ref(), out.sum_dy_xmu.as_ref(), out.grad_weight.as_ref(), out.grad_bias.as_ref()]
}

/// Checks an allocating call's result: each output present exactly when `mask` asks for it,
/// of shape `[C]` and dtype `dtype`, with values [`close`] to `exp`.
pub fn check_result(stream: &Stream, out: &ReduceBackward, mask: OutputMask, dtype: DType, exp: &Expected) {
    for (i, (t, on)) in outputs(out).into_iter().zip(enabled(mask)).enumerate() {
        let name = OUTPUT_NAMES[i];
        assert_eq!(t.is_some(), on, "{name}: present iff the mask {mask:?} asks for it");
        if let Some(t) = t {
            check_tensor(stream, name, t, dtype, i, exp);
        }
    }
}

/// Checks one output tensor (output `i` in [`OUTPUT_NAMES`] order) against `exp`.
pub fn check_tensor(stream: &Stream, name: &str, t: &Tensor, dtype: DType, i: usize, exp: &Expected) {
    assert_eq!(t.shape(), [exp.channels], "{name}: shape");
    assert_eq!(t.dtype(), dtype, "{name}: dtype");
    let (e, cond) = exp.output(i);
    assert_close(name, dtype, &read(stream, t), e, cond, exp.r);
}

// ---------------------------------------------------------------------------------------------
// Fixtures

/// The op's inputs as host data.
#[derive(Clone, Debug)]
pub struct Inputs {
    pub dy: Data,
    pub x: Data,
    pub mean: Data,
    pub invstd: Data,
    pub weight: Option<Data>,
}

/// The backward operators' common inputs, drawn from `rng` in this order: dy ~ N(0, 1) in `gdt`,
/// x ~ N(0.5, 1) in `xdt`, mean ~ U(0.3, 0.7) (near the data mean, so the one-pass Ascend
/// kernel is accurate) and invstd ~ U(0.5, 2) in `sdt`, per channel (dim 1 of `shape`).
pub fn backward_draws(rng: &mut Rng, shape: &[usize], gdt: DType, xdt: DType, sdt: DType) -> [Data; 4] {
    let c = shape[1];
    [
        Data::normal(rng, gdt, shape, 0.0, 1.0),
        Data::normal(rng, xdt, shape, 0.5, 1.0),
        Data::uniform(rng, sdt, &[c], 0.3, 0.7),
        Data::uniform(rng, sdt, &[c], 0.5, 2.0),
    ]
}

impl Inputs {
    /// dy ~ N(0,1), x ~ N(0.5,1), mean ~ U(0.3,0.7) (near the data mean, so the one-pass Ascend
    /// kernel is accurate), invstd ~ U(0.5,2), weight ~ N(0,1); gradOut/input in `dt`, the
    /// per-channel vectors in `sdt`.
    pub fn normal(seed: u64, dt: DType, sdt: DType, shape: &[usize]) -> Self {
        let mut rng = Rng::new(seed);
        let [dy, x, mean, invstd] = backward_draws(&mut rng, shape, dt, dt, sdt);
        Inputs { dy, x, mean, invstd, weight: Some(Data::normal(&mut rng, sdt, &[shape[1]], 0.0, 1.0)) }
    }

    /// The ATK system tests' distribution: all five tensors U(-10,10) in `dt` (so invstd may be
    /// negative and mean is far from the data mean).
    pub fn atk(seed: u64, dt: DType, shape: &[usize]) -> Self {
        let mut rng = Rng::new(seed);
        let c = shape[1];
        Inputs {
            dy: Data::uniform(&mut rng, dt, shape, -10.0, 10.0),
            x: Data::uniform(&mut rng, dt, shape, -10.0, 10.0),
            mean: Data::uniform(&mut rng, dt, &[c], -10.0, 10.0),
            invstd: Data::uniform(&mut rng, dt, &[c], -10.0, 10.0),
            weight: Some(Data::uniform(&mut rng, dt, &[c], -10.0, 10.0)),
        }
    }

    /// SEMANTICS T02/T03: dy = x = 1.
    pub fn ones(dt: DType, shape: &[usize], mean: &[f64], invstd: &[f64]) -> Self {
        let c = shape[1];
        Inputs {
            dy: Data::filled(dt, shape, 1.0),
            x: Data::filled(dt, shape, 1.0),
            mean: Data::new(dt, mean, &[c]),
            invstd: Data::new(dt, invstd, &[c]),
            weight: Some(Data::filled(dt, &[c], 3.0)),
        }
    }

    /// gradOut and input of `shape` with no elements (f32, no weight), and these statistics.
    pub fn empty(shape: &[usize], mean: &[f64], invstd: &[f64]) -> Self {
        Inputs {
            dy: Data::new(DType::F32, &[], shape),
            x: Data::new(DType::F32, &[], shape),
            mean: Data::new(DType::F32, mean, &[mean.len()]),
            invstd: Data::new(DType::F32, invstd, &[invstd.len()]),
            weight: None,
        }
    }

    pub fn expected(&self) -> Expected {
        reference(&self.dy, &self.x, &self.mean, &self.invstd)
    }

    /// The dtype the allocating API gives for these inputs.
    pub fn out_dtype(&self) -> DType {
        allocating_dtype(self.x.dtype, self.mean.dtype)
    }

    /// The same values with gradOut and input stored in the dim orders `dy` and `x` (see
    /// [`Data::permuted`]).
    pub fn permuted(&self, dy: &[usize], x: &[usize]) -> Inputs {
        Inputs { dy: self.dy.permuted(dy), x: self.x.permuted(x), ..self.clone() }
    }

    /// The inputs uploaded on `s` and run with every output enabled through both forms: the
    /// allocating result, and `_into` outputs of `dtype` (`c` channels, pre-filled) as written.
    pub fn run_both_forms(&self, s: &Stream, dtype: DType, c: usize) -> Result<(ReduceBackward, Outs)> {
        let up = self.upload(s)?;
        let out = up.run(s, OutputMask::ALL)?;
        let mut outs = Outs::filled(s, dtype, c)?;
        up.run_into(s, OutputMask::ALL, outs.all())?;
        Ok((out, outs))
    }

    /// The inputs uploaded on `s`, and their reference: what most cases start from.
    pub fn upload_with_expected(&self, s: &Stream) -> Result<(Up, Expected)> {
        Ok((self.upload(s)?, self.expected()))
    }

    pub fn upload(&self, s: &Stream) -> Result<Up> {
        uploaded!(self, s => Up { dy, x, mean, invstd; optional: weight })
    }
}

/// Uploaded inputs.
#[derive(Debug)]
pub struct Up {
    pub dy: Tensor,
    pub x: Tensor,
    pub mean: Tensor,
    pub invstd: Tensor,
    pub weight: Option<Tensor>,
}

impl Up {
    pub fn run(&self, s: &Stream, mask: OutputMask) -> Result<ReduceBackward> {
        batch_norm_reduce_backward(s, &self.dy, &self.x, &self.mean, &self.invstd, self.weight.as_ref(), mask)
    }

    pub fn run_into(&self, s: &Stream, mask: OutputMask, out: ReduceBackwardOut<'_>) -> Result<()> {
        batch_norm_reduce_backward_into(s, &self.dy, &self.x, &self.mean, &self.invstd, self.weight.as_ref(), mask, out)
    }

    pub fn prepare<'a>(
        &'a self,
        s: &Stream,
        mask: OutputMask,
        out: ReduceBackwardOut<'a>,
    ) -> Result<PreparedReduceBackward<'a>> {
        prepare_batch_norm_reduce_backward(
            s,
            &self.dy,
            &self.x,
            &self.mean,
            &self.invstd,
            self.weight.as_ref(),
            mask,
            out,
        )
    }
}

/// Four caller-owned outputs for the `_into` API, pre-filled with distinct non-zero sentinels
/// (or any layout), remembering what they held.
pub struct Outs {
    pub init: [Data; 4],
    pub t: [Tensor; 4],
}

impl Outs {
    pub fn new(s: &Stream, init: [Data; 4]) -> Result<Self> {
        let t = [init[0].tensor(s)?, init[1].tensor(s)?, init[2].tensor(s)?, init[3].tensor(s)?];
        Ok(Outs { init, t })
    }

    /// Contiguous `[c]` outputs of `dtype` holding 1000 + 10·i + k.
    pub fn filled(s: &Stream, dtype: DType, c: usize) -> Result<Self> {
        Self::new(s, std::array::from_fn(|i| sentinel(dtype, c, i)))
    }

    /// All four outputs.
    pub fn all(&mut self) -> ReduceBackwardOut<'_> {
        let [a, b, c, d] = &mut self.t;
        ReduceBackwardOut { sum_dy: Some(a), sum_dy_xmu: Some(b), grad_weight: Some(c), grad_bias: Some(d) }
    }

    /// Only the outputs `mask` turns on.
    pub fn masked(&mut self, mask: OutputMask) -> ReduceBackwardOut<'_> {
        let [a, b, c, d] = &mut self.t;
        let on = enabled(mask);
        ReduceBackwardOut {
            sum_dy: on[0].then_some(a),
            sum_dy_xmu: on[1].then_some(b),
            grad_weight: on[2].then_some(c),
            grad_bias: on[3].then_some(d),
        }
    }

    /// `_into` of `up` with `mask` into these outputs (all four given, `mask` or not), then
    /// [`Outs::check`] against `exp`.
    pub fn check_run_into(&mut self, s: &Stream, up: &Up, mask: OutputMask, exp: &Expected) -> Result<()> {
        up.run_into(s, mask, self.all())?;
        self.check(s, mask, exp);
        Ok(())
    }

    /// [`Outs::check_run_into`] with only the outputs `mask` turns on given.
    pub fn check_run_into_masked(&mut self, s: &Stream, up: &Up, mask: OutputMask, exp: &Expected) -> Result<()> {
        up.run_into(s, mask, self.masked(mask))?;
        self.check(s, mask, exp);
        Ok(())
    }

    /// The enabled outputs hold the expected values, the others what they held before.
    pub fn check(&self, s: &Stream, mask: OutputMask, exp: &Expected) {
        for (i, on) in enabled(mask).into_iter().enumerate() {
            let name = OUTPUT_NAMES[i];
            if on {
                check_tensor(s, name, &self.t[i], self.init[i].dtype, i, exp);
            } else {
                assert_eq!(read(s, &self.t[i]), self.init[i].values(), "{name} (masked off) must stay untouched");
            }
        }
    }

    pub fn assert_untouched(&self, s: &Stream) {
        for ((t, init), name) in self.t.iter().zip(&self.init).zip(OUTPUT_NAMES) {
            assert_eq!(read(s, t), init.values(), "{name}: a rejected call wrote it");
        }
    }
}

pub fn sentinel(dtype: DType, c: usize, i: usize) -> Data {
    let v: Vec<f64> = (0..c).map(|k| 1000.0 + 10.0 * i as f64 + k as f64).collect();
    Data::new(dtype, &v, &[c])
}
