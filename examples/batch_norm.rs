//! A `BatchNorm2d` layer as a training loop runs it: a few training steps (forward, backward,
//! an SGD update of weight and bias) and an eval pass, every value checked against torch's
//! formulas computed here in f64.
//!
//! ```sh
//! cargo run --example batch_norm                            # Ascend device 0 if usable, else the CPU
//! cargo run --example batch_norm --features mock -- --mock  # the mock Ascend device 0
//! ```

mod common;

use ascend::nn::BatchNorm;
use ascend::{Context, Result, Stream, Tensor};

const SHAPE: [usize; 4] = [8, 4, 5, 5];
const STEPS: usize = 3;
const LR: f64 = 0.1;

/// Deterministic inputs: a pseudo-random part scaled per channel, plus (`offset`) a per-channel
/// offset.
fn data(seed: u64, n: usize, offset: bool) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|i| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let r = (state >> 33) as f64 / (1u64 << 31) as f64 - 0.5;
            let c = (i / (SHAPE[2] * SHAPE[3])) % SHAPE[1];
            (if offset { c as f64 * 2.0 } else { 0.0 } + (1.0 + c as f64) * r) as f32
        })
        .collect()
}

/// torch's BatchNorm in f64: y (with the given statistics or the batch's), the batch mean and
/// biased variance per channel.
fn reference(x: &[f64], w: &[f64], b: &[f64], stats: Option<(&[f64], &[f64])>) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (c, inner) = (SHAPE[1], SHAPE[2] * SHAPE[3]);
    let ch = |i: usize| (i / inner) % c;
    let n = (x.len() / c) as f64;
    let (mean, var) = stats.map_or_else(
        || {
            let mut m = vec![0.0; c];
            x.iter().enumerate().for_each(|(i, v)| m[ch(i)] += v / n);
            let mut v = vec![0.0; c];
            x.iter().enumerate().for_each(|(i, e)| v[ch(i)] += (e - m[ch(i)]).powi(2) / n);
            (m, v)
        },
        |(m, v)| (m.to_vec(), v.to_vec()),
    );
    let y = x.iter().enumerate().map(|(i, e)| (e - mean[ch(i)]) / (var[ch(i)] + 1e-5).sqrt() * w[ch(i)] + b[ch(i)]);
    (y.collect(), mean, var)
}

fn read(s: &Stream, t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_vec::<f32>(s)?.into_iter().map(f64::from).collect())
}

fn worst(got: &[f64], want: &[f64]) -> f64 {
    let scale = want.iter().fold(1e-30f64, |a, v| a.max(v.abs()));
    got.iter().zip(want).fold(0.0, |a, (g, w)| a.max((g - w).abs() / scale))
}

fn check(what: &str, got: &[f64], want: &[f64], tol: f64) -> Result<()> {
    let e = worst(got, want);
    println!("  {what:<28} max error {e:.1e} (relative to the largest value; tolerance {tol:.0e})");
    if e > tol {
        return Err(failed(format!("{what} is off by {e:e}")));
    }
    Ok(())
}

fn run() -> Result<()> {
    let ctx = if std::env::args().any(|a| a == "--mock") { mock_context()? } else { Context::auto()? };
    println!("BatchNorm2d({}) on {:?}, input {SHAPE:?} f32", SHAPE[1], ctx.backend());
    let s = ctx.new_stream()?;
    let (c, n) = (SHAPE[1], SHAPE.iter().product::<usize>());
    let mut bn = BatchNorm::new(&s, c)?;
    let (mut w, mut b) = (vec![1.0f64; c], vec![0.0f64; c]);
    let (mut rm, mut rv) = (vec![0.0f64; c], vec![1.0f64; c]);
    let per = (n / c) as f64;
    for step in 0..STEPS {
        println!("training step {}", step + 1);
        let xs = data(step as u64 + 1, n, true);
        let dys = data(step as u64 + 100, n, false);
        let x = Tensor::from_slice(&s, &xs, &SHAPE)?;
        let dy = Tensor::from_slice(&s, &dys, &SHAPE)?;
        let (y, saved) = bn.forward(&s, &x)?;
        let g = bn.backward(&s, &dy, &saved)?;
        // f64 reference: forward, running statistics, gradients.
        let x64: Vec<f64> = xs.iter().map(|&v| f64::from(v)).collect();
        let dy64: Vec<f64> = dys.iter().map(|&v| f64::from(v)).collect();
        let (want_y, mean, var) = reference(&x64, &w, &b, None);
        check("output", &read(&s, &y)?, &want_y, 1e-5)?;
        for k in 0..c {
            rm[k] = 0.9 * rm[k] + 0.1 * mean[k];
            rv[k] = 0.9 * rv[k] + 0.1 * var[k] * per / (per - 1.0);
        }
        check("running_mean", &read(&s, bn.running_mean.as_ref().expect("tracked"))?, &rm, 1e-5)?;
        check("running_var (unbiased)", &read(&s, bn.running_var.as_ref().expect("tracked"))?, &rv, 1e-5)?;
        let inner = SHAPE[2] * SHAPE[3];
        let ch = |i: usize| (i / inner) % c;
        let r: Vec<f64> = var.iter().map(|v| 1.0 / (v + 1e-5).sqrt()).collect();
        let (mut dw, mut db) = (vec![0.0; c], vec![0.0; c]);
        for i in 0..n {
            dw[ch(i)] += dy64[i] * (x64[i] - mean[ch(i)]) * r[ch(i)];
            db[ch(i)] += dy64[i];
        }
        let dx: Vec<f64> = (0..n)
            .map(|i| {
                let k = ch(i);
                w[k] * r[k] * (dy64[i] - db[k] / per - (x64[i] - mean[k]) * r[k] * dw[k] / per)
            })
            .collect();
        check("grad input", &read(&s, &g.input)?, &dx, 1e-4)?;
        let (gw, gb) = (read(&s, g.weight.as_ref().expect("affine"))?, read(&s, g.bias.as_ref().expect("affine"))?);
        check("grad weight", &gw, &dw, 1e-4)?;
        check("grad bias", &gb, &db, 1e-4)?;
        // SGD on the host (what an optimizer would do on the device).
        for k in 0..c {
            w[k] -= LR * gw[k];
            b[k] -= LR * gb[k];
        }
        let to_f32 = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
        bn.weight = Some(Tensor::from_slice(&s, &to_f32(&w), &[c])?);
        bn.bias = Some(Tensor::from_slice(&s, &to_f32(&b), &[c])?);
        w = to_f32(&w).iter().map(|&v| f64::from(v)).collect();
        b = to_f32(&b).iter().map(|&v| f64::from(v)).collect();
    }
    println!("eval pass (running statistics; nothing changes)");
    bn.eval();
    let xs = data(999, n, true);
    let x = Tensor::from_slice(&s, &xs, &SHAPE)?;
    let (y, _) = bn.forward(&s, &x)?;
    let x64: Vec<f64> = xs.iter().map(|&v| f64::from(v)).collect();
    let rm32 = read(&s, bn.running_mean.as_ref().expect("tracked"))?;
    let rv32 = read(&s, bn.running_var.as_ref().expect("tracked"))?;
    let (want_y, _, _) = reference(&x64, &w, &b, Some((&rm32, &rv32)));
    check("eval output", &read(&s, &y)?, &want_y, 1e-5)?;
    check("running_mean unchanged", &rm32, &rm, 1e-5)?;
    println!("num_batches_tracked = {}", bn.num_batches_tracked);
    Ok(())
}

#[cfg(feature = "mock")]
fn mock_context() -> Result<Context> {
    ascend::mock::context(0)
}

#[cfg(not(feature = "mock"))]
fn mock_context() -> Result<Context> {
    Err(failed("--mock needs a build with --features mock".to_string()))
}

/// An error of the example itself (a check that failed, a flag this build lacks).
fn failed(message: String) -> ascend::Error {
    ascend::Error::InvalidArgument { argument: "example", message, status: ascend::STATUS_INVALID }
}

fn main() {
    common::main(run);
}
