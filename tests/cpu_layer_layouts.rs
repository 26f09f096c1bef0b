//! The CPU BatchNorm kernels' layouts (`ops::batch_norm` / `ops::batch_norm_backward` through
//! `nn::BatchNorm`: the statistics pass, then the element-wise pass) against an f64 reference on
//! random data: NCHW, a padded batch stride, channels-last and an element-strided view,
//! f32/f16/bf16, and 1/2/3 threads bit-identical. Tolerances as `tests/nn_batch_norm.rs`: f32 1e-5 (forward) and 1e-4
//! (backward) of the largest magnitude, f16 4e-3 / 8e-3, bf16 3e-2 / 6e-2.

mod common;

use std::sync::Mutex;

use ascend::nn::BatchNorm;
use ascend::{cpu, Context, DType, Tensor};
use common::{assert_scaled, bits, read, Data, Rng};

/// The thread count is process-wide: one case at a time.
static LOCK: Mutex<()> = Mutex::new(());

const EPS: f64 = 1e-5;

/// torch's training step in f64 over row-major `x`, `dy` of `shape` with weight `w`, bias `b`:
/// `[y, dx]` row-major and `[mean, var, dw, db]` per channel.
fn reference(x: &[f64], dy: &[f64], shape: &[usize], w: &[f64], b: &[f64]) -> ([Vec<f64>; 2], [Vec<f64>; 4]) {
    let (c, inner) = (shape[1], shape[2..].iter().product::<usize>());
    let channel = |i: usize| (i / inner) % c;
    let n = (x.len() / c) as f64;
    let mut per = [(); 4].map(|_| vec![0.0; c]);
    x.iter().enumerate().for_each(|(i, v)| per[0][channel(i)] += v / n);
    x.iter().enumerate().for_each(|(i, v)| per[1][channel(i)] += (v - per[0][channel(i)]).powi(2) / n);
    let r: Vec<f64> = per[1].iter().map(|v| 1.0 / (v + EPS).sqrt()).collect();
    for i in 0..x.len() {
        let k = channel(i);
        per[2][k] += dy[i] * (x[i] - per[0][k]) * r[k];
        per[3][k] += dy[i];
    }
    let [mean, _, dw, db] = &per;
    let y = (0..x.len()).map(|i| (x[i] - mean[channel(i)]) * r[channel(i)] * w[channel(i)] + b[channel(i)]);
    let dx = (0..x.len()).map(|i| {
        let k = channel(i);
        w[k] * r[k] * (dy[i] - db[k] / n - (x[i] - mean[k]) * r[k] * dw[k] / n)
    });
    ([y.collect(), dx.collect()], per)
}

/// How a case lays its inputs out.
#[derive(Clone, Copy, Debug)]
enum Layout {
    Nchw,
    /// NCHW with two spare channels' worth of storage between batches.
    PaddedBatch,
    /// Channels-last (the passes).
    ChannelsLast,
    /// Every other element of its storage (the passes).
    Spread,
}

fn lay(d: Data, layout: Layout) -> Data {
    match layout {
        Layout::Nchw => d,
        Layout::ChannelsLast => d.permuted(&[0, 2, 3, 1]),
        Layout::Spread => d.spread(2, 1, 7.0),
        Layout::PaddedBatch => {
            let (c, inner) = (d.shape[1], d.shape[2] * d.shape[3]);
            let batch = (c + 2) * inner;
            let strides = [batch, inner, d.shape[3], 1];
            let mut storage = vec![-9.0; d.shape[0] * batch + 3];
            let v = d.values();
            for (i, &x) in v.iter().enumerate() {
                storage[3 + (i / (c * inner)) * batch + i % (c * inner)] = x;
            }
            Data::strided(d.dtype, &storage, &d.shape, &strides, 3)
        }
    }
}

/// One training step's outputs, as raw bits: `[y, dx, dw, db, running_mean, running_var]`.
type Bits = Vec<Vec<u32>>;

/// One training step of a fresh layer; checks every output against the reference and returns
/// their bits.
fn step(ctx: &Context, shape: &[usize], dtype: DType, layout: Layout, seed: u64) -> Bits {
    let s = ctx.new_stream().unwrap();
    let mut rng = Rng::new(seed);
    let c = shape[1];
    let x = lay(Data::normal(&mut rng, dtype, shape, 3.0, 2.0), layout);
    let dy = lay(Data::normal(&mut rng, dtype, shape, 0.5, 1.0), layout);
    let w: Vec<f32> = (0..c).map(|i| 0.5 + 0.125 * i as f32).collect();
    let b: Vec<f32> = (0..c).map(|i| 0.1 * i as f32 - 0.4).collect();
    let mut bn = BatchNorm::new(&s, c).unwrap();
    bn.weight = Some(Tensor::from_slice(&s, &w, &[c]).unwrap());
    bn.bias = Some(Tensor::from_slice(&s, &b, &[c]).unwrap());
    let (xt, dyt) = (x.tensor(&s).unwrap(), dy.tensor(&s).unwrap());
    let (y, saved) = bn.forward(&s, &xt).unwrap();
    let g = bn.backward(&s, &dyt, &saved).unwrap();
    if let Layout::ChannelsLast = layout {
        // The CPU keeps the input's memory order (one walk order for input and output).
        assert_eq!((y.strides(), g.input.strides()), (xt.strides(), xt.strides()), "channels-last outputs");
    }
    let wide = |v: &[f32]| v.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
    let ([want_y, want_dx], [mean, var, dw, db]) = reference(&x.values(), &dy.values(), shape, &wide(&w), &wide(&b));
    let (tf, tb) = match dtype {
        DType::F16 => (4e-3, 8e-3),
        DType::BF16 => (3e-2, 6e-2),
        _ => (1e-5, 1e-4),
    };
    let what = format!("{dtype:?} {layout:?} {shape:?}");
    assert_scaled(&format!("{what} y"), &read(&s, &y), &want_y, tf);
    assert_scaled(&format!("{what} dx"), &read(&s, &g.input), &want_dx, tb);
    let (gw, gb) = (g.weight.as_ref().unwrap(), g.bias.as_ref().unwrap());
    assert_scaled(&format!("{what} dw"), &read(&s, gw), &dw, tb);
    assert_scaled(&format!("{what} db"), &read(&s, gb), &db, tb);
    let (rm, rv) = (bn.running_mean.as_ref().unwrap(), bn.running_var.as_ref().unwrap());
    let n = (x.numel() / c) as f64;
    let want_rm: Vec<f64> = mean.iter().map(|m| 0.1 * m).collect();
    let want_rv: Vec<f64> = var.iter().map(|v| 0.9 + 0.1 * v * n / (n - 1.0)).collect();
    assert_scaled(&format!("{what} running_mean"), &read(&s, rm), &want_rm, 1e-5);
    assert_scaled(&format!("{what} running_var"), &read(&s, rv), &want_rv, tf.max(1e-5));
    [&y, &g.input, gw, gb, rm, rv].iter().map(|t| bits(&s, t)).collect()
}

/// Every layout of `dtype` on 1, 2 and 3 threads: right, and the same bits for any thread
/// count.
fn check(dtype: DType) {
    let _guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = Context::cpu();
    // 20 channels of 4·12·12 elements: several blocks of 3 channels and one of 2.
    let shape = [4usize, 20, 12, 12];
    let layouts = [Layout::Nchw, Layout::PaddedBatch, Layout::ChannelsLast, Layout::Spread];
    for (k, layout) in layouts.into_iter().enumerate() {
        let mut first: Option<Bits> = None;
        for threads in [1, 2, 3] {
            cpu::set_max_threads(threads);
            let got = step(&ctx, &shape, dtype, layout, 40 + k as u64);
            match &first {
                None => first = Some(got),
                Some(want) => assert!(*want == got, "{dtype:?} {layout:?}: {threads} threads differ"),
            }
        }
    }
    cpu::set_max_threads(0);
}

#[test]
fn layouts_f32() {
    check(DType::F32);
}

#[test]
fn layouts_f16() {
    check(DType::F16);
}

#[test]
fn layouts_bf16() {
    check(DType::BF16);
}

/// A larger channel-major case with odd sizes (runs of 323 elements).
#[test]
fn odd_sizes() {
    let _guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = Context::cpu();
    step(&ctx, &[3usize, 37, 17, 19], DType::F32, Layout::Nchw, 7);
}
