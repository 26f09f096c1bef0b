//! `ops::batch_norm` (`aclnnBatchNorm`) and `ops::batch_norm_backward` (`aclnnBatchNormBackward`)
//! on both backends: values against an f64 reference (torch's formulas, per multi-index through
//! each tensor's strides), the launch path's framework tests for each (faults at each CANN call,
//! arguments dropped right after the launch, a prepared call dropped unlaunched, the two phases),
//! the rules both backends share, and the saved statistics' opacity. The layer on top
//! (`nn::BatchNorm`) is tested in `nn_batch_norm.rs`; the mock operators' own upstream cases in
//! `batch_norm_ut/`.
//!
//! Tolerances, relative to the largest magnitude of the expected values: f32 1e-5 (forward) and
//! 1e-4 (backward); f16 4e-3 and 8e-3; bf16 3e-2 and 6e-2 (a few units of the output's roundoff
//! after f32 arithmetic).

mod common;

use ascend::ops::{
    batch_norm, batch_norm_backward, batch_norm_backward_into, batch_norm_into, prepare_batch_norm,
    prepare_batch_norm_backward, BatchNormGradsOut, BatchNormSaved, OutputMask, Prepared,
};
use ascend::{Context, DType, Result, Stream, Tensor};
use common::*;

type R = Result<()>;

mod forward {
    use super::*;
    framework_tests!(Fwd);
}
mod backward {
    use super::*;
    framework_tests!(Bwd);
}

on_both_backends!(
    local: [
        training_and_eval_values,
        backward_values_and_masks,
        empty_inputs,
        rejected_calls_write_nothing,
        saved_statistics_are_checked,
    ],
    cross: [],
);

fn tolerances(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F16 => (4e-3, 8e-3),
        DType::BF16 => (3e-2, 6e-2),
        _ => (1e-5, 1e-4),
    }
}

// ---------------------------------------------------------------------------------------------
// Fixture and reference

/// A forward call as host data.
#[derive(Clone, Debug)]
struct Fwd {
    x: Data,
    weight: Option<Data>,
    bias: Option<Data>,
    running_mean: Option<Data>,
    running_var: Option<Data>,
    training: bool,
    momentum: f64,
    eps: f64,
}

/// Per-channel mean and variance.
type Stats = (Vec<f64>, Vec<f64>);

/// Per channel: mean and biased variance of `x` (training), or the running ones (eval).
fn statistics(x: &Data, stats: Option<Stats>) -> Stats {
    if let Some(s) = stats {
        return s;
    }
    let c = x.shape[1];
    let mut sum = vec![0.0; c];
    for_each_index(&x.shape, |i| sum[i[1]] += x.get(i));
    let n = (x.numel() / c) as f64;
    let mean: Vec<f64> = sum.iter().map(|s| s / n).collect();
    let mut m2 = vec![0.0; c];
    for_each_index(&x.shape, |i| m2[i[1]] += (x.get(i) - mean[i[1]]).powi(2));
    (mean, m2.iter().map(|v| v / n).collect())
}

impl Fwd {
    fn random(seed: u64, shape: &[usize], xdt: DType, training: bool) -> Fwd {
        let mut rng = Rng::new(seed);
        let c = shape[1];
        Fwd {
            x: Data::normal(&mut rng, xdt, shape, 2.0, 1.5),
            weight: Some(Data::normal(&mut rng, DType::F32, &[c], 1.0, 0.3)),
            bias: Some(Data::normal(&mut rng, DType::F32, &[c], 0.0, 1.0)),
            running_mean: Some(Data::uniform(&mut rng, DType::F32, &[c], -1.0, 1.0)),
            running_var: Some(Data::uniform(&mut rng, DType::F32, &[c], 0.5, 2.0)),
            training,
            momentum: 0.1,
            eps: 1e-5,
        }
    }

    /// y (row-major), and the running statistics after the call.
    fn expected(&self) -> (Vec<f64>, Option<Stats>) {
        let c = self.x.shape[1];
        let or = |d: &Option<Data>, v: f64| d.as_ref().map_or(vec![v; c], Data::values);
        let (rm, rv) = (or(&self.running_mean, 0.0), or(&self.running_var, 1.0));
        let (mean, var) = statistics(&self.x, (!self.training).then(|| (rm.clone(), rv.clone())));
        let (w, b) = (or(&self.weight, 1.0), or(&self.bias, 0.0));
        let mut y = Vec::new();
        for_each_index(&self.x.shape, |i| {
            let k = i[1];
            y.push((self.x.get(i) - mean[k]) / (var[k] + self.eps).sqrt() * w[k] + b[k]);
        });
        let n = (self.x.numel() / c) as f64;
        let m = self.momentum;
        let running = (self.training && self.running_mean.is_some()).then(|| {
            (
                (0..c).map(|k| (1.0 - m) * rm[k] + m * mean[k]).collect(),
                (0..c).map(|k| (1.0 - m) * rv[k] + m * var[k] * n / (n - 1.0)).collect(),
            )
        });
        (y, running)
    }

    fn upload(&self, s: &Stream) -> Result<FwdUp> {
        uploaded!(self, s => FwdUp { x; optional: weight, bias, running_mean, running_var; copied: training, momentum, eps })
    }
}

struct FwdUp {
    x: Tensor,
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    running_mean: Option<Tensor>,
    running_var: Option<Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
}

impl FwdUp {
    fn run(&mut self, s: &Stream) -> Result<(Tensor, BatchNormSaved)> {
        let (w, b) = (self.weight.as_ref(), self.bias.as_ref());
        let (rm, rv) = (self.running_mean.as_mut(), self.running_var.as_mut());
        batch_norm(s, &self.x, w, b, rm, rv, self.training, self.momentum, self.eps)
    }
}

impl Framework for Fwd {
    const ACLNN: &'static str = "aclnnBatchNorm";
    const MOCK_WORKSPACE: bool = false;
    type Up = FwdUp;
    type Out = (Tensor, BatchNormSaved);
    type Res = (Tensor, BatchNormSaved);

    fn small(seed: u64) -> Fwd {
        Fwd::random(seed, &[3, 2, 4], DType::F32, true)
    }

    fn mixed(seed: u64) -> Fwd {
        let mut f = Fwd::random(seed, &[2, 3, 2, 3], DType::F16, true);
        f.bias = f.bias.map(|b| b.cast(DType::BF16));
        f
    }

    fn upload(&self, s: &Stream) -> Result<FwdUp> {
        Fwd::upload(self, s)
    }

    fn outputs(&self, s: &Stream) -> Result<(Tensor, BatchNormSaved)> {
        Ok((Data::filled(self.x.dtype, &self.x.shape, 777.0).tensor(s)?, BatchNormSaved::new(s, self.x.shape[1])?))
    }

    fn run(&self, up: &mut FwdUp, s: &Stream) -> Result<(Tensor, BatchNormSaved)> {
        up.run(s)
    }

    fn run_into(&self, up: &mut FwdUp, s: &Stream, (y, saved): &mut (Tensor, BatchNormSaved)) -> R {
        let (w, b) = (up.weight.as_ref(), up.bias.as_ref());
        let (rm, rv) = (up.running_mean.as_mut(), up.running_var.as_mut());
        batch_norm_into(s, &up.x, w, b, rm, rv, up.training, up.momentum, up.eps, y, saved)
    }

    fn prepare<'a>(
        &self,
        up: &'a mut FwdUp,
        s: &Stream,
        (y, saved): &'a mut (Tensor, BatchNormSaved),
    ) -> Result<Prepared<'a>> {
        let (w, b) = (up.weight.as_ref(), up.bias.as_ref());
        let (rm, rv) = (up.running_mean.as_mut(), up.running_var.as_mut());
        prepare_batch_norm(s, &up.x, w, b, rm, rv, up.training, up.momentum, up.eps, y, saved)
    }

    fn check(&self, _ctx: &Context, s: &Stream, what: &str, (y, _): &(Tensor, BatchNormSaved)) {
        let got = read_checked(s, what, y, &self.x.shape, self.x.dtype);
        assert_scaled(what, &got, &self.expected().0, tolerances(self.x.dtype).0);
    }

    fn check_res(&self, ctx: &Context, s: &Stream, what: &str, res: &(Tensor, BatchNormSaved)) {
        self.check(ctx, s, what, res);
    }

    fn out_bits(s: &Stream, (y, _): &(Tensor, BatchNormSaved)) -> Vec<Vec<u32>> {
        vec![bits(s, y)]
    }

    fn in_place_bits(s: &Stream, up: &FwdUp) -> Vec<Vec<u32>> {
        [&up.running_mean, &up.running_var].into_iter().flatten().map(|t| bits(s, t)).collect()
    }
}

/// A backward call as host data: the forward's case (its saved statistics are made on upload)
/// and the incoming gradient.
#[derive(Clone, Debug)]
struct Bwd {
    fwd: Fwd,
    dy: Data,
    mask: OutputMask,
}

impl Bwd {
    fn random(seed: u64, shape: &[usize], xdt: DType, training: bool) -> Bwd {
        let mut rng = Rng::new(seed ^ 0xB0);
        Bwd {
            fwd: Fwd::random(seed, shape, xdt, training),
            dy: Data::normal(&mut rng, xdt, shape, 0.0, 1.0),
            mask: OutputMask::ALL,
        }
    }

    /// (dx row-major, dw, db) in f64.
    fn expected(&self) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let f = &self.fwd;
        let c = f.x.shape[1];
        let or = |d: &Option<Data>, v: f64| d.as_ref().map_or(vec![v; c], Data::values);
        let stats = (!f.training).then(|| (or(&f.running_mean, 0.0), or(&f.running_var, 1.0)));
        let (mean, var) = statistics(&f.x, stats);
        let w = or(&f.weight, 1.0);
        let r: Vec<f64> = var.iter().map(|v| 1.0 / (v + f.eps).sqrt()).collect();
        let (mut dw, mut db) = (vec![0.0; c], vec![0.0; c]);
        for_each_index(&f.x.shape, |i| {
            dw[i[1]] += self.dy.get(i) * (f.x.get(i) - mean[i[1]]) * r[i[1]];
            db[i[1]] += self.dy.get(i);
        });
        let n = (f.x.numel() / c) as f64;
        let mut dx = Vec::new();
        for_each_index(&f.x.shape, |i| {
            let k = i[1];
            let g = self.dy.get(i);
            dx.push(if f.training {
                w[k] * r[k] * (g - db[k] / n - (f.x.get(i) - mean[k]) * r[k] * dw[k] / n)
            } else {
                g * w[k] * r[k]
            });
        });
        (dx, dw, db)
    }
}

/// The backward's tensors: the forward's (after its call, the running statistics untouched: it
/// runs with momentum 0) and the saved statistics.
struct BwdUp {
    f: FwdUp,
    dy: Tensor,
    saved: BatchNormSaved,
    mask: OutputMask,
}

impl BwdUp {
    fn args(&self) -> (Option<&Tensor>, Option<&Tensor>) {
        if self.f.training {
            (None, None)
        } else {
            (self.f.running_mean.as_ref(), self.f.running_var.as_ref())
        }
    }
}

type Grads3 = (Tensor, Tensor, Tensor);

impl Framework for Bwd {
    const ACLNN: &'static str = "aclnnBatchNormBackward";
    const MOCK_WORKSPACE: bool = false;
    type Up = BwdUp;
    type Out = Grads3;
    type Res = ascend::ops::BatchNormGrads;

    fn small(seed: u64) -> Bwd {
        Bwd::random(seed, &[3, 2, 4], DType::F32, true)
    }

    fn mixed(seed: u64) -> Bwd {
        Bwd::random(seed, &[2, 3, 2, 3], DType::BF16, true)
    }

    fn upload(&self, s: &Stream) -> Result<BwdUp> {
        let mut f = Fwd { momentum: 0.0, ..self.fwd.clone() }.upload(s)?;
        // On a stream of its own, so that `s`'s launch cache holds only the backward's entries.
        let (_, saved) = f.run(&s.context().new_stream()?)?;
        Ok(BwdUp { f, dy: self.dy.tensor(s)?, saved, mask: self.mask })
    }

    fn outputs(&self, s: &Stream) -> Result<Grads3> {
        let c = self.fwd.x.shape[1];
        Ok((
            Data::filled(self.fwd.x.dtype, &self.fwd.x.shape, 777.0).tensor(s)?,
            Data::filled(DType::F32, &[c], 777.0).tensor(s)?,
            Data::filled(DType::F32, &[c], 777.0).tensor(s)?,
        ))
    }

    fn run(&self, up: &mut BwdUp, s: &Stream) -> Result<ascend::ops::BatchNormGrads> {
        let (rm, rv) = up.args();
        let f = &up.f;
        batch_norm_backward(s, &up.dy, &f.x, f.weight.as_ref(), rm, rv, &up.saved, f.training, f.eps, up.mask)
    }

    fn run_into(&self, up: &mut BwdUp, s: &Stream, (gi, gw, gb): &mut Grads3) -> R {
        let (rm, rv) = up.args();
        let f = &up.f;
        let out = BatchNormGradsOut { grad_input: Some(gi), grad_weight: Some(gw), grad_bias: Some(gb) };
        batch_norm_backward_into(s, &up.dy, &f.x, f.weight.as_ref(), rm, rv, &up.saved, f.training, f.eps, up.mask, out)
    }

    fn prepare<'a>(&self, up: &'a mut BwdUp, s: &Stream, (gi, gw, gb): &'a mut Grads3) -> Result<Prepared<'a>> {
        let (rm, rv) = up.args();
        let f = &up.f;
        let out = BatchNormGradsOut { grad_input: Some(gi), grad_weight: Some(gw), grad_bias: Some(gb) };
        prepare_batch_norm_backward(
            s,
            &up.dy,
            &f.x,
            f.weight.as_ref(),
            rm,
            rv,
            &up.saved,
            f.training,
            f.eps,
            up.mask,
            out,
        )
    }

    fn check(&self, _ctx: &Context, s: &Stream, what: &str, (gi, gw, gb): &Grads3) {
        let (dx, dw, db) = self.expected();
        let tol = tolerances(self.fwd.x.dtype).1;
        let c = self.fwd.x.shape[1];
        assert_scaled(
            &format!("{what}: grad input"),
            &read_checked(s, what, gi, &self.fwd.x.shape, self.fwd.x.dtype),
            &dx,
            tol,
        );
        assert_scaled(&format!("{what}: grad weight"), &read_checked(s, what, gw, &[c], DType::F32), &dw, tol);
        assert_scaled(&format!("{what}: grad bias"), &read_checked(s, what, gb, &[c], DType::F32), &db, tol);
    }

    fn check_res(&self, ctx: &Context, s: &Stream, what: &str, res: &ascend::ops::BatchNormGrads) {
        let copy = |t: &Option<Tensor>| read_back(s, t.as_ref().expect("every output asked for"));
        self.check(ctx, s, what, &(copy(&res.grad_input), copy(&res.grad_weight), copy(&res.grad_bias)));
    }

    fn out_bits(s: &Stream, (gi, gw, gb): &Grads3) -> Vec<Vec<u32>> {
        vec![bits(s, gi), bits(s, gw), bits(s, gb)]
    }
}

/// A copy of `t` (the same values, dtype and shape).
fn read_back(s: &Stream, t: &Tensor) -> Tensor {
    let v = read(s, t);
    Data::new(t.dtype(), &v, t.shape()).tensor(s).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Cases

/// Training and eval, ranks 2..8, f32/f16/bf16 inputs with f32 parameters, strided inputs: the
/// output and the running statistics.
fn training_and_eval_values(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let shapes: [&[usize]; 7] = [
        &[9, 3],
        &[3, 4, 5],
        &[2, 3, 4, 3],
        &[2, 2, 3, 2, 2],
        &[2, 3, 2, 1, 2, 2],
        &[1, 2, 2, 3, 1, 2, 2],
        &[2, 2, 1, 2, 2, 1, 2, 2],
    ];
    for (seed, shape) in (1..).zip(shapes) {
        for (dt, training) in [(DType::F32, true), (DType::F32, false), (DType::F16, true), (DType::BF16, false)] {
            let case = Fwd::random(seed, shape, dt, training);
            let strided = Fwd { x: case.x.spread(2, 3, -99.0), ..case.clone() };
            for (what, case) in [("contiguous", &case), ("spread", &strided)] {
                let mut up = case.upload(&s)?;
                let (y, saved) = up.run(&s)?;
                let what = format!("{shape:?} {dt} training {training} {what}");
                assert_scaled(&what, &read(&s, &y), &case.expected().0, tolerances(dt).0);
                assert_eq!(saved.channels(), training.then_some(shape[1]), "{what}");
                if let Some((rm, rv)) = case.expected().1 {
                    assert_scaled(
                        &format!("{what}: running_mean"),
                        &read(&s, up.running_mean.as_ref().unwrap()),
                        &rm,
                        1e-5,
                    );
                    assert_scaled(
                        &format!("{what}: running_var"),
                        &read(&s, up.running_var.as_ref().unwrap()),
                        &rv,
                        1e-5,
                    );
                } else {
                    let rm = case.running_mean.as_ref().unwrap().values();
                    assert_eq!(read(&s, up.running_mean.as_ref().unwrap()), rm, "{what}: eval changes nothing");
                }
            }
        }
    }
    // No weight, bias or running statistics: CANN's fills (1, 0, 0, 1).
    let bare = Fwd {
        weight: None,
        bias: None,
        running_mean: None,
        running_var: None,
        ..Fwd::random(9, &[4, 3, 5], DType::F32, true)
    };
    let (y, _) = bare.upload(&s)?.run(&s)?;
    assert_scaled("bare", &read(&s, &y), &bare.expected().0, 1e-5);
    Ok(())
}

/// The backward in training and eval, every mask, channels-last gradients.
fn backward_values_and_masks(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    for (seed, (dt, training)) in
        (20..).zip([(DType::F32, true), (DType::F32, false), (DType::F16, true), (DType::BF16, true)])
    {
        let case = Bwd::random(seed, &[3, 4, 2, 3], dt, training);
        let mut up = case.upload(&s)?;
        let g = case.run(&mut up, &s)?;
        case.check_res(ctx, &s, &format!("{dt} training {training}"), &g);
        for bits in 0..8u8 {
            let mask = OutputMask { input_g: bits & 1 != 0, weight_g: bits & 2 != 0, bias_g: bits & 4 != 0 };
            up.mask = mask;
            let g = case.run(&mut up, &s)?;
            assert_eq!(
                [g.grad_input.is_some(), g.grad_weight.is_some(), g.grad_bias.is_some()],
                [mask.input_g, mask.weight_g, mask.bias_g]
            );
        }
    }
    Ok(())
}

/// An empty input (N = 0): the forward succeeds, leaving the running statistics; the backward
/// gives zero weight and bias gradients.
fn empty_inputs(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Bwd::random(30, &[0, 3, 4], DType::F32, true);
    let mut f = case.fwd.upload(&s)?;
    let before = read(&s, f.running_mean.as_ref().unwrap());
    let (y, saved) = f.run(&s)?;
    assert_eq!(y.shape(), &[0, 3, 4]);
    assert_eq!(read(&s, f.running_mean.as_ref().unwrap()), before);
    let dy = case.dy.tensor(&s)?;
    let g = batch_norm_backward(&s, &dy, &f.x, f.weight.as_ref(), None, None, &saved, true, 1e-5, OutputMask::ALL)?;
    assert_eq!(read(&s, g.grad_weight.as_ref().unwrap()), [0.0; 3]);
    assert_eq!(read(&s, g.grad_bias.as_ref().unwrap()), [0.0; 3]);
    Ok(())
}

/// Bad arguments are refused (161002, the argument named) before anything is written: the
/// running statistics and the outputs keep their values.
fn rejected_calls_write_nothing(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Fwd::random(40, &[3, 2, 4], DType::F32, true);
    let mut up = case.upload(&s)?;
    let before = Fwd::in_place_bits(&s, &up);
    let mut out = Fwd::outputs(&case, &s)?;
    let wrong_w = Data::filled(DType::F32, &[3], 1.0).tensor(&s)?;
    let (rm, rv) = (up.running_mean.as_mut(), up.running_var.as_mut());
    let r = batch_norm_into(&s, &up.x, Some(&wrong_w), None, rm, rv, true, 0.1, 1e-5, &mut out.0, &mut out.1);
    expect_invalid("weight of 3 channels", r, "weight");
    for bad in [f64::NAN, f64::INFINITY, 1e39] {
        let (rm, rv) = (up.running_mean.as_mut(), up.running_var.as_mut());
        expect_invalid("momentum", batch_norm(&s, &up.x, None, None, rm, rv, true, bad, 1e-5).map(drop), "momentum");
    }
    let wrong_dtype = Data::filled(DType::F16, &[3, 2, 4], 0.0).tensor(&s)?;
    let (rm, rv) = (up.running_mean.as_mut(), up.running_var.as_mut());
    let mut small = BatchNormSaved::new(&s, 2)?;
    let mut y16 = wrong_dtype;
    expect_invalid(
        "output dtype",
        batch_norm_into(&s, &up.x, None, None, rm, rv, true, 0.1, 1e-5, &mut y16, &mut small),
        "output",
    );
    assert_eq!(Fwd::in_place_bits(&s, &up), before, "a refused call wrote the running statistics");
    assert_eq!(Fwd::out_bits(&s, &out), vec![bits(&s, &Data::filled(DType::F32, &[3, 2, 4], 777.0).tensor(&s)?)]);
    Ok(())
}

/// The saved statistics go only where they belong: a training backward refuses an eval forward's
/// (which saved nothing) and statistics of another channel count.
fn saved_statistics_are_checked(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Bwd::random(50, &[3, 2, 4], DType::F32, false);
    let up = case.upload(&s)?;
    assert_eq!(up.saved.channels(), None, "an eval forward saves nothing");
    let f = &up.f;
    let r = batch_norm_backward(&s, &up.dy, &f.x, None, None, None, &up.saved, true, 1e-5, OutputMask::ALL);
    expect_invalid("eval statistics in a training backward", r.map(drop), "saved");
    let other = BatchNormSaved::new(&s, 5)?;
    let r = batch_norm_backward(&s, &up.dy, &f.x, None, None, None, &other, true, 1e-5, OutputMask::ALL);
    expect_invalid("statistics of 5 channels", r.map(drop), "saveMean");
    Ok(())
}
