//! `ascend::nn::BatchNorm` (and through it `ops::batch_norm` / `ops::batch_norm_backward`) against
//! an independent f64 reference of torch's formulas, on both backends (the CPU always, the mock
//! Ascend with `--features mock`): f32 within 1e-5 relative (forward) and 1e-4 (backward), f16/bf16
//! within a few units of their roundoff; ranks 2..8, strided inputs, training and eval, momentum
//! `None`, affine=False, track_running_stats=False, and rejected calls that change no field.

mod common;

use ascend::nn::BatchNorm;
use ascend::{bf16, f16, Context, Stream, Tensor};
use common::{backends, Rng};

/// torch's BatchNorm in f64 over row-major `x` of `shape`: (y, mean, biased var) per channel.
fn reference(
    x: &[f64],
    shape: &[usize],
    w: &[f64],
    b: &[f64],
    stats: Option<(&[f64], &[f64])>,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let c = shape[1];
    let inner: usize = shape[2..].iter().product();
    let ch = |i: usize| (i / inner) % c;
    let n = (x.len() / c) as f64;
    let (mean, var) = match stats {
        Some((m, v)) => (m.to_vec(), v.to_vec()),
        None => {
            let mut mean = vec![0.0; c];
            x.iter().enumerate().for_each(|(i, v)| mean[ch(i)] += v / n);
            let mut var = vec![0.0; c];
            x.iter().enumerate().for_each(|(i, v)| var[ch(i)] += (v - mean[ch(i)]).powi(2) / n);
            (mean, var)
        }
    };
    let y = x
        .iter()
        .enumerate()
        .map(|(i, v)| (v - mean[ch(i)]) / (var[ch(i)] + eps).sqrt() * w[ch(i)] + b[ch(i)])
        .collect();
    (y, mean, var)
}

/// torch's backward in f64: (dx, dw, db) with batch statistics (`train`) or given ones.
#[allow(clippy::too_many_arguments)]
fn reference_backward(
    x: &[f64],
    dy: &[f64],
    shape: &[usize],
    w: &[f64],
    mean: &[f64],
    var: &[f64],
    eps: f64,
    train: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let c = shape[1];
    let inner: usize = shape[2..].iter().product();
    let ch = |i: usize| (i / inner) % c;
    let n = (x.len() / c) as f64;
    let r: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let (mut dw, mut db) = (vec![0.0; c], vec![0.0; c]);
    for i in 0..x.len() {
        dw[ch(i)] += dy[i] * (x[i] - mean[ch(i)]) * r[ch(i)];
        db[ch(i)] += dy[i];
    }
    let dx = (0..x.len())
        .map(|i| {
            let k = ch(i);
            if train {
                w[k] * r[k] * (dy[i] - db[k] / n - (x[i] - mean[k]) * r[k] * dw[k] / n)
            } else {
                dy[i] * w[k] * r[k]
            }
        })
        .collect();
    (dx, dw, db)
}

fn f32s(s: &Stream, t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        ascend::DType::F16 => t.to_vec::<f16>(s).unwrap().iter().map(|v| f64::from(v.to_f32())).collect(),
        ascend::DType::BF16 => t.to_vec::<bf16>(s).unwrap().iter().map(|v| f64::from(v.to_f32())).collect(),
        _ => t.to_vec::<f32>(s).unwrap().iter().map(|&v| f64::from(v)).collect(),
    }
}

#[track_caller]
fn close(what: &str, got: &[f64], want: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(0.0f64, |a, v| a.max(v.abs())).max(1e-30);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= rel * scale, "{what}[{i}]: got {g}, want {w} (tolerance {rel} of {scale})");
    }
}

/// A random input of `shape` (the values rounded to `dtype`), as a tensor and as f64 values; a
/// strided one is a view that skips every other element of its storage.
fn input(
    s: &Stream,
    rng: &mut Rng,
    shape: &[usize],
    dtype: ascend::DType,
    strided: bool,
    offset: f64,
) -> (Tensor, Vec<f64>) {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| (offset + 2.0 * rng.normal()) as f32).collect();
    let (storage, strides): (Vec<f32>, Vec<usize>) = if strided {
        let mut st = vec![0.0f32; 2 * n];
        v.iter().enumerate().for_each(|(i, &x)| st[2 * i] = x);
        let mut strides = vec![2usize; shape.len()];
        for d in (0..shape.len() - 1).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        (st, strides)
    } else {
        (v.clone(), Vec::new())
    };
    macro_rules! make {
        ($t:ty, $conv:expr) => {{
            let data: Vec<$t> = storage.iter().map(|&x| $conv(x)).collect();
            let t = if strided {
                Tensor::from_slice_strided(s, &data, shape, &strides, 0).unwrap()
            } else {
                Tensor::from_slice(s, &data, shape).unwrap()
            };
            let back: Vec<f64> = v.iter().map(|&x| f64::from(($conv(x) as $t).to_f32())).collect();
            (t, back)
        }};
    }
    trait ToF32 {
        fn to_f32(self) -> f32;
    }
    impl ToF32 for f32 {
        fn to_f32(self) -> f32 {
            self
        }
    }
    match dtype {
        ascend::DType::F16 => make!(f16, f16::from_f32),
        ascend::DType::BF16 => make!(bf16, bf16::from_f32),
        _ => make!(f32, |x: f32| x),
    }
}

fn tolerances(dtype: ascend::DType) -> (f64, f64) {
    match dtype {
        ascend::DType::F16 => (4e-3, 8e-3),
        ascend::DType::BF16 => (3e-2, 6e-2),
        _ => (1e-5, 1e-4),
    }
}

/// Training steps then eval, against the reference: y, running stats (unbiased variance, torch's
/// rule), the counter, the gradients; eval uses and changes nothing.
fn train_then_eval(ctx: &Context, shape: &[usize], dtype: ascend::DType, strided: bool, momentum: Option<f64>) {
    let s = ctx.new_stream().unwrap();
    let mut rng = Rng::new(shape.iter().product::<usize>() as u64 * 31 + strided as u64);
    let c = shape[1];
    let mut bn = BatchNorm::new(&s, c).unwrap();
    bn.momentum = momentum;
    let w: Vec<f32> = (0..c).map(|i| 0.5 + 0.25 * i as f32).collect();
    let b: Vec<f32> = (0..c).map(|i| 0.1 * i as f32 - 0.2).collect();
    bn.weight = Some(Tensor::from_slice(&s, &w, &[c]).unwrap());
    bn.bias = Some(Tensor::from_slice(&s, &b, &[c]).unwrap());
    let (w64, b64): (Vec<f64>, Vec<f64>) =
        (w.iter().map(|&v| v.into()).collect(), b.iter().map(|&v| v.into()).collect());
    let (mut rm, mut rv) = (vec![0.0; c], vec![1.0; c]);
    let (tf, tb) = tolerances(dtype);
    for step in 1..=3u64 {
        let (x, xv) = input(&s, &mut rng, shape, dtype, strided, 3.0);
        let (y, saved) = bn.forward(&s, &x).unwrap();
        let (want_y, mean, var) = reference(&xv, shape, &w64, &b64, None, 1e-5);
        close("y", &f32s(&s, &y), &want_y, tf);
        assert_eq!(y.dtype(), dtype);
        let n = (xv.len() / c) as f64;
        let m = momentum.unwrap_or(1.0 / step as f64);
        for k in 0..c {
            rm[k] = (1.0 - m) * rm[k] + m * mean[k];
            rv[k] = (1.0 - m) * rv[k] + m * var[k] * n / (n - 1.0);
        }
        close("running_mean", &f32s(&s, bn.running_mean.as_ref().unwrap()), &rm, 1e-5);
        close("running_var", &f32s(&s, bn.running_var.as_ref().unwrap()), &rv, tf.max(1e-5));
        assert_eq!(bn.num_batches_tracked, step);
        let (dy, dyv) = input(&s, &mut rng, shape, dtype, false, 0.0);
        let g = bn.backward(&s, &dy, &saved).unwrap();
        let (dx, dw, db) = reference_backward(&xv, &dyv, shape, &w64, &mean, &var, 1e-5, true);
        close("grad input", &f32s(&s, &g.input), &dx, tb);
        close("grad weight", &f32s(&s, g.weight.as_ref().unwrap()), &dw, tb);
        close("grad bias", &f32s(&s, g.bias.as_ref().unwrap()), &db, tb);
        assert_eq!(g.input.dtype(), dtype);
        assert_eq!(g.weight.as_ref().unwrap().dtype(), ascend::DType::F32);
    }
    // Eval: running statistics, nothing changes.
    bn.eval();
    let (x, xv) = input(&s, &mut rng, shape, dtype, strided, 3.0);
    let (y, saved) = bn.forward(&s, &x).unwrap();
    let (want_y, _, _) = reference(&xv, shape, &w64, &b64, Some((&rm, &rv)), 1e-5);
    close("eval y", &f32s(&s, &y), &want_y, tf);
    close("eval running_mean", &f32s(&s, bn.running_mean.as_ref().unwrap()), &rm, 1e-5);
    assert_eq!(bn.num_batches_tracked, 3);
    let (dy, dyv) = input(&s, &mut rng, shape, dtype, false, 0.0);
    let g = bn.backward(&s, &dy, &saved).unwrap();
    let rm32: Vec<f64> = f32s(&s, bn.running_mean.as_ref().unwrap());
    let rv32: Vec<f64> = f32s(&s, bn.running_var.as_ref().unwrap());
    let (dx, dw, db) = reference_backward(&xv, &dyv, shape, &w64, &rm32, &rv32, 1e-5, false);
    close("eval grad input", &f32s(&s, &g.input), &dx, tb);
    close("eval grad weight", &f32s(&s, g.weight.as_ref().unwrap()), &dw, tb);
    close("eval grad bias", &f32s(&s, g.bias.as_ref().unwrap()), &db, tb);
}

#[test]
fn f32_ranks_2_to_8_both_backends() {
    let shapes: [&[usize]; 7] = [
        &[16, 3],
        &[4, 3, 5],
        &[2, 3, 4, 5],
        &[2, 2, 3, 2, 3],
        &[2, 2, 2, 2, 2, 3],
        &[2, 2, 2, 1, 2, 2, 3],
        &[2, 2, 1, 2, 2, 1, 2, 3],
    ];
    for ctx in backends() {
        for shape in shapes {
            train_then_eval(&ctx, shape, ascend::DType::F32, false, Some(0.1));
        }
    }
}

#[test]
fn strided_half_and_cumulative_momentum() {
    for ctx in backends() {
        train_then_eval(&ctx, &[3, 4, 5, 6], ascend::DType::F32, true, None);
        train_then_eval(&ctx, &[4, 3, 7], ascend::DType::F16, false, Some(0.1));
        train_then_eval(&ctx, &[4, 3, 7], ascend::DType::BF16, true, Some(0.3));
    }
}

/// affine=False and track_running_stats=False: no weight/bias gradients; batch statistics even in
/// eval, and no state.
#[test]
fn affine_false_and_untracked() {
    for ctx in backends() {
        let s = ctx.new_stream().unwrap();
        let mut rng = Rng::new(7);
        let shape = [5, 2, 6];
        let mut bn = BatchNorm::new(&s, 2).unwrap();
        (bn.weight, bn.bias, bn.running_mean, bn.running_var) = (None, None, None, None);
        for train in [true, false] {
            if !train {
                bn.eval();
            }
            let (x, xv) = input(&s, &mut rng, &shape, ascend::DType::F32, false, -1.0);
            let (y, saved) = bn.forward(&s, &x).unwrap();
            let (want, mean, var) = reference(&xv, &shape, &[1.0; 2], &[0.0; 2], None, 1e-5);
            close("y", &f32s(&s, &y), &want, 1e-5);
            let (dy, dyv) = input(&s, &mut rng, &shape, ascend::DType::F32, false, 0.0);
            let g = bn.backward(&s, &dy, &saved).unwrap();
            assert!(g.weight.is_none() && g.bias.is_none());
            let (dx, _, _) = reference_backward(&xv, &dyv, &shape, &[1.0; 2], &mean, &var, 1e-5, true);
            close("dx", &f32s(&s, &g.input), &dx, 1e-4);
            assert_eq!(bn.num_batches_tracked, 0);
        }
    }
}

/// A rejected call changes no field: wrong channels, one value per channel in training.
#[test]
fn rejected_calls_change_nothing() {
    for ctx in backends() {
        let s = ctx.new_stream().unwrap();
        let mut bn = BatchNorm::new(&s, 3).unwrap();
        let before = (f32s(&s, bn.running_mean.as_ref().unwrap()), f32s(&s, bn.running_var.as_ref().unwrap()));
        let wrong_c = Tensor::from_slice(&s, &[1.0f32; 8], &[2, 4]).unwrap();
        assert_eq!(bn.forward(&s, &wrong_c).unwrap_err().status(), Some(161002));
        let single = Tensor::from_slice(&s, &[1.0f32, 2.0, 3.0], &[1, 3]).unwrap();
        assert!(bn.forward(&s, &single).is_err());
        assert_eq!(bn.num_batches_tracked, 0);
        let after = (f32s(&s, bn.running_mean.as_ref().unwrap()), f32s(&s, bn.running_var.as_ref().unwrap()));
        assert_eq!(before, after);
        assert!(bn.is_training());
        assert_eq!((bn.momentum, bn.eps), (Some(0.1), 1e-5));
    }
}
