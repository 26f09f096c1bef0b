//! `ascend::nn::BatchNorm` (and through it `ops::batch_norm` / `ops::batch_norm_backward`) against
//! an independent f64 reference of torch's formulas, on both backends (the CPU always, the mock
//! Ascend with `--features mock`): f32 within 1e-5 relative (forward) and 1e-4 (backward), f16/bf16
//! within a few units of their roundoff; ranks 2..8, strided inputs, training and eval, momentum
//! `None`, affine=False, track_running_stats=False, and rejected calls that change no field.

mod common;

use ascend::nn::BatchNorm;
use ascend::{bf16, f16, Context, Stream, Tensor};
use common::{assert_scaled, backends, Rng};

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
        assert_scaled("y", &f32s(&s, &y), &want_y, tf);
        assert_eq!(y.dtype(), dtype);
        let n = (xv.len() / c) as f64;
        let m = momentum.unwrap_or(1.0 / step as f64);
        for k in 0..c {
            rm[k] = (1.0 - m) * rm[k] + m * mean[k];
            rv[k] = (1.0 - m) * rv[k] + m * var[k] * n / (n - 1.0);
        }
        assert_scaled("running_mean", &f32s(&s, bn.running_mean.as_ref().unwrap()), &rm, 1e-5);
        assert_scaled("running_var", &f32s(&s, bn.running_var.as_ref().unwrap()), &rv, tf.max(1e-5));
        assert_eq!(bn.num_batches_tracked, step);
        let (dy, dyv) = input(&s, &mut rng, shape, dtype, false, 0.0);
        let g = bn.backward(&s, &dy, &saved).unwrap();
        let (dx, dw, db) = reference_backward(&xv, &dyv, shape, &w64, &mean, &var, 1e-5, true);
        assert_scaled("grad input", &f32s(&s, &g.input), &dx, tb);
        assert_scaled("grad weight", &f32s(&s, g.weight.as_ref().unwrap()), &dw, tb);
        assert_scaled("grad bias", &f32s(&s, g.bias.as_ref().unwrap()), &db, tb);
        assert_eq!(g.input.dtype(), dtype);
        assert_eq!(g.weight.as_ref().unwrap().dtype(), ascend::DType::F32);
    }
    // Eval: running statistics, nothing changes.
    bn.eval();
    let (x, xv) = input(&s, &mut rng, shape, dtype, strided, 3.0);
    let (y, saved) = bn.forward(&s, &x).unwrap();
    let (want_y, _, _) = reference(&xv, shape, &w64, &b64, Some((&rm, &rv)), 1e-5);
    assert_scaled("eval y", &f32s(&s, &y), &want_y, tf);
    assert_scaled("eval running_mean", &f32s(&s, bn.running_mean.as_ref().unwrap()), &rm, 1e-5);
    assert_eq!(bn.num_batches_tracked, 3);
    let (dy, dyv) = input(&s, &mut rng, shape, dtype, false, 0.0);
    let g = bn.backward(&s, &dy, &saved).unwrap();
    let rm32: Vec<f64> = f32s(&s, bn.running_mean.as_ref().unwrap());
    let rv32: Vec<f64> = f32s(&s, bn.running_var.as_ref().unwrap());
    let (dx, dw, db) = reference_backward(&xv, &dyv, shape, &w64, &rm32, &rv32, 1e-5, false);
    assert_scaled("eval grad input", &f32s(&s, &g.input), &dx, tb);
    assert_scaled("eval grad weight", &f32s(&s, g.weight.as_ref().unwrap()), &dw, tb);
    assert_scaled("eval grad bias", &f32s(&s, g.bias.as_ref().unwrap()), &db, tb);
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
            assert_scaled("y", &f32s(&s, &y), &want, 1e-5);
            let (dy, dyv) = input(&s, &mut rng, &shape, ascend::DType::F32, false, 0.0);
            let g = bn.backward(&s, &dy, &saved).unwrap();
            assert!(g.weight.is_none() && g.bias.is_none());
            let (dx, _, _) = reference_backward(&xv, &dyv, &shape, &[1.0; 2], &mean, &var, 1e-5, true);
            assert_scaled("dx", &f32s(&s, &g.input), &dx, 1e-4);
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
        let running_var = bn.running_var.take();
        let x = Tensor::from_slice(&s, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
        assert_eq!(bn.forward(&s, &x).unwrap_err().status(), Some(161002), "running_mean without running_var");
        bn.running_var = running_var;
        assert_eq!(bn.num_batches_tracked, 0);
        let after = (f32s(&s, bn.running_mean.as_ref().unwrap()), f32s(&s, bn.running_var.as_ref().unwrap()));
        assert_eq!(before, after);
        assert!(bn.is_training());
        assert_eq!((bn.momentum, bn.eps), (Some(0.1), 1e-5));
    }
}

/// The tests over ranks, one at a time (the mock's device count is process-wide).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The contexts of `ranks` (≤ 2) ranks on each backend: CPU contexts, and mock devices 0..ranks.
fn rank_contexts(ranks: usize) -> Vec<Vec<Context>> {
    #[allow(unused_mut)]
    let mut v = vec![vec![Context::cpu(); ranks]];
    #[cfg(feature = "mock")]
    {
        ascend::mock::set_device_count(2).unwrap();
        v.push((0..ranks as i32).map(|d| ascend::mock::context(d).unwrap()).collect());
    }
    v
}

/// forward_sync/backward_sync over 2 ranks equal BatchNorm over the global batch (f64 reference):
/// the output, the running statistics on every rank, grad_input; each rank's weight and bias
/// gradients are its share (summed over ranks they give the global ones).
#[test]
fn sync_over_two_ranks_is_batch_norm_of_the_global_batch() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (c, rows) = (3usize, [3usize, 5]);
    let shape = |r: usize| [rows[r], c, 4];
    let mut rng = Rng::new(11);
    let data: Vec<(Vec<f32>, Vec<f32>)> = (0..2)
        .map(|r| {
            let n = rows[r] * c * 4;
            (rng.vec_f32(n, -3.0, 5.0), rng.vec_f32(n, -1.0, 1.0))
        })
        .collect();
    // The global batch, row-major [8, C, 4]: rank 0's rows then rank 1's.
    let x64: Vec<f64> = data.iter().flat_map(|(x, _)| x.iter().map(|&v| f64::from(v))).collect();
    let dy64: Vec<f64> = data.iter().flat_map(|(_, d)| d.iter().map(|&v| f64::from(v))).collect();
    let global = [8, c, 4];
    let (w, b) = (vec![1.0; c], vec![0.0; c]);
    let (want_y, mean, var) = reference(&x64, &global, &w, &b, None, 1e-5);
    let (want_dx, want_dw, want_db) = reference_backward(&x64, &dy64, &global, &w, &mean, &var, 1e-5, true);
    for ctxs in rank_contexts(2) {
        let comms = ascend::hccl::Communicator::init_all(&ctxs).unwrap();
        let results = common::on_ranks(comms, &ctxs, |r, comm, ctx| {
            let r = r as usize;
            let s = ctx.new_stream().unwrap();
            let x = Tensor::from_slice(&s, &data[r].0, &shape(r)).unwrap();
            let dy = Tensor::from_slice(&s, &data[r].1, &shape(r)).unwrap();
            let mut bn = BatchNorm::new(&s, c).unwrap();
            let (y, saved) = bn.forward_sync(comm, &s, &x).unwrap();
            let g = bn.backward_sync(comm, &s, &dy, &saved).unwrap();
            let rm = f32s(&s, bn.running_mean.as_ref().unwrap());
            let rv = f32s(&s, bn.running_var.as_ref().unwrap());
            assert_eq!(bn.num_batches_tracked, 1);
            // Eval over the ranks: the single-device path, bit for bit, and no collective.
            bn.eval();
            let (ye, se) = bn.forward_sync(comm, &s, &x).unwrap();
            let ge = bn.backward_sync(comm, &s, &dy, &se).unwrap();
            let (y1, s1) = bn.forward(&s, &x).unwrap();
            let g1 = bn.backward(&s, &dy, &s1).unwrap();
            assert_eq!(f32s(&s, &ye), f32s(&s, &y1));
            assert_eq!(f32s(&s, &ge.input), f32s(&s, &g1.input));
            assert_eq!(bn.num_batches_tracked, 1);
            // Eval without running statistics: local batch statistics on each rank (torch's
            // SyncBatchNorm syncs only in training).
            let (rm_t, rv_t) = (bn.running_mean.take(), bn.running_var.take());
            let (ye, _) = bn.forward_sync(comm, &s, &x).unwrap();
            let (y1, _) = bn.forward(&s, &x).unwrap();
            assert_eq!(f32s(&s, &ye), f32s(&s, &y1));
            (bn.running_mean, bn.running_var) = (rm_t, rv_t);
            (
                f32s(&s, &y),
                f32s(&s, &g.input),
                f32s(&s, g.weight.as_ref().unwrap()),
                f32s(&s, g.bias.as_ref().unwrap()),
                rm,
                rv,
            )
        });
        let split = 3 * c * 4;
        let mut dw = vec![0.0; c];
        let mut db = vec![0.0; c];
        for (r, (y, dx, gw, gb, rm, rv)) in results.iter().enumerate() {
            let range = if r == 0 { 0..split } else { split..want_y.len() };
            assert_scaled("sync y", y, &want_y[range.clone()], 1e-5);
            assert_scaled("sync dx", dx, &want_dx[range], 1e-4);
            let want_rm: Vec<f64> = mean.iter().map(|m| 0.1 * m).collect();
            let want_rv: Vec<f64> = var.iter().map(|v| 0.9 + 0.1 * v * 32.0 / 31.0).collect();
            assert_scaled("sync running_mean", rm, &want_rm, 1e-5);
            assert_scaled("sync running_var", rv, &want_rv, 1e-5);
            dw.iter_mut().zip(gw).for_each(|(a, b)| *a += b);
            db.iter_mut().zip(gb).for_each(|(a, b)| *a += b);
        }
        assert_scaled("sync dw summed over ranks", &dw, &want_dw, 1e-4);
        assert_scaled("sync db summed over ranks", &db, &want_db, 1e-4);
    }
}

/// With one rank, or in eval, forward_sync/backward_sync are exactly forward/backward: the same
/// bits, and no collective.
#[test]
fn sync_with_one_rank_or_in_eval_is_the_single_device_path() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for ctxs in rank_contexts(1) {
        let ctx = &ctxs[0];
        let comm = ascend::hccl::Communicator::init_all(&ctxs).unwrap().pop().unwrap();
        let s = ctx.new_stream().unwrap();
        let mut rng = Rng::new(5);
        let (x, _) = input(&s, &mut rng, &[4, 3, 5], ascend::DType::F32, false, 1.0);
        let (dy, _) = input(&s, &mut rng, &[4, 3, 5], ascend::DType::F32, false, 0.0);
        let (mut a, mut b) = (BatchNorm::new(&s, 3).unwrap(), BatchNorm::new(&s, 3).unwrap());
        for eval in [false, true] {
            if eval {
                a.eval();
                b.eval();
            }
            let (ya, sa) = a.forward(&s, &x).unwrap();
            let (yb, sb) = b.forward_sync(&comm, &s, &x).unwrap();
            let ga = a.backward(&s, &dy, &sa).unwrap();
            let gb = b.backward_sync(&comm, &s, &dy, &sb).unwrap();
            for (p, q) in
                [(&ya, &yb), (&ga.input, &gb.input), (ga.weight.as_ref().unwrap(), gb.weight.as_ref().unwrap())]
            {
                assert_eq!(p.to_vec::<f32>(&s).unwrap(), q.to_vec::<f32>(&s).unwrap());
            }
            assert_eq!(
                a.running_var.as_ref().unwrap().to_vec::<f32>(&s).unwrap(),
                b.running_var.as_ref().unwrap().to_vec::<f32>(&s).unwrap()
            );
        }
    }
}

/// The sync backward's accuracy at x = 1000 + N(0, 1) over 2 ranks, centered (the default) and
/// not, against the f64 reference: printed, and the centered form within f32's 1e-4 on both
/// backends. On the mock the uncentered form is CANN's Σdy·x − mean·Σdy (the CPU backend's
/// reduction is centered either way).
#[test]
fn centered_sync_backward_keeps_f32_accuracy_at_a_large_mean() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (c, rows) = (2usize, 64usize);
    let shape = [rows, c, 8];
    let mut rng = Rng::new(77);
    let n = rows * c * 8;
    let data: Vec<(Vec<f32>, Vec<f32>)> = (0..2)
        .map(|_| {
            let x = (0..n).map(|_| (1000.0 + rng.normal()) as f32).collect();
            (x, rng.vec_f32(n, -1.0, 1.0))
        })
        .collect();
    let x64: Vec<f64> = data.iter().flat_map(|(x, _)| x.iter().map(|&v| f64::from(v))).collect();
    let dy64: Vec<f64> = data.iter().flat_map(|(_, d)| d.iter().map(|&v| f64::from(v))).collect();
    let global = [2 * rows, c, 8];
    let (w, _) = (vec![1.0; c], ());
    let (_, mean, var) = reference(&x64, &global, &w, &[0.0; 2], None, 1e-5);
    let (want_dx, want_dw, _) = reference_backward(&x64, &dy64, &global, &w, &mean, &var, 1e-5, true);
    let worst = |got: &[f64], want: &[f64]| {
        let scale = want.iter().fold(1e-30f64, |a, v| a.max(v.abs()));
        got.iter().zip(want).fold(0.0f64, |a, (g, w)| a.max((g - w).abs() / scale))
    };
    for ctxs in rank_contexts(2) {
        let backend = ctxs[0].backend();
        for centered in [true, false] {
            let comms = ascend::hccl::Communicator::init_all(&ctxs).unwrap();
            let results = common::on_ranks(comms, &ctxs, |r, comm, ctx| {
                let s = ctx.new_stream().unwrap();
                let x = Tensor::from_slice(&s, &data[r as usize].0, &shape).unwrap();
                let dy = Tensor::from_slice(&s, &data[r as usize].1, &shape).unwrap();
                let mut bn = BatchNorm::new(&s, c).unwrap();
                bn.centered_sync = centered;
                let (_, saved) = bn.forward_sync(comm, &s, &x).unwrap();
                let g = bn.backward_sync(comm, &s, &dy, &saved).unwrap();
                (f32s(&s, &g.input), f32s(&s, g.weight.as_ref().unwrap()))
            });
            let dx: Vec<f64> = results.iter().flat_map(|(dx, _)| dx.clone()).collect();
            let mut dw = vec![0.0; c];
            results.iter().for_each(|(_, gw)| dw.iter_mut().zip(gw).for_each(|(a, b)| *a += b));
            let (ex, ew) = (worst(&dx, &want_dx), worst(&dw, &want_dw));
            println!("{backend:?} centered_sync {centered}: grad_weight error {ew:.2e}, grad_input error {ex:.2e}");
            if centered {
                assert!(ew <= 1e-4 && ex <= 1e-4, "{backend:?}: centered errors {ew:e}, {ex:e}");
            }
        }
    }
}

/// The public API as `docs/DESIGN.md` "Next 3" writes it (compile-time shapes of the fields and
/// methods), and its traits.
#[test]
fn the_layer_api_is_the_design_s() {
    use ascend::nn::{BatchNormSaved, Grads};
    fn debug_send_sync<T: std::fmt::Debug + Send + Sync>() {}
    debug_send_sync::<BatchNorm>();
    debug_send_sync::<Grads>();
    debug_send_sync::<BatchNormSaved<'static>>();
    let ctx = Context::cpu();
    let stream = ctx.new_stream().unwrap();
    let mut bn = BatchNorm::new(&stream, 2).unwrap();
    let _: (&Option<Tensor>, &Option<Tensor>, &Option<Tensor>, &Option<Tensor>) =
        (&bn.weight, &bn.bias, &bn.running_mean, &bn.running_var);
    let _: (u64, Option<f64>, f64) = (bn.num_batches_tracked, bn.momentum, bn.eps);
    assert_eq!((bn.num_batches_tracked, bn.momentum, bn.eps, bn.is_training()), (0, Some(0.1), 1e-5, true));
    let defaults: Vec<Vec<f32>> = [&bn.weight, &bn.bias, &bn.running_mean, &bn.running_var]
        .iter()
        .map(|t| t.as_ref().unwrap().to_vec::<f32>(&stream).unwrap())
        .collect();
    assert_eq!(defaults, [vec![1.0; 2], vec![0.0; 2], vec![0.0; 2], vec![1.0; 2]]);
    bn.eval();
    assert!(!bn.is_training());
    bn.train();
    let x = Tensor::from_slice(&stream, &[1.0f32, 2.0, 3.0, 5.0], &[2, 2]).unwrap();
    let (y, saved): (Tensor, BatchNormSaved) = bn.forward(&stream, &x).unwrap();
    let g: Grads = bn.backward(&stream, &y, &saved).unwrap();
    let _: (Tensor, Option<Tensor>, Option<Tensor>) = (g.input, g.weight, g.bias);
}
