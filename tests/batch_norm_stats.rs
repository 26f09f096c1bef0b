//! `ops::batch_norm_stats` (aclnnBatchNormStats) on both backends: `cpu::<case>` always,
//! `mock::<case>` (Ascend over the mock CANN, isolated: no leak, no violation) with `--features
//! mock`.
//!
//! Values are checked against an independent f64 two-pass reference with these tolerances
//! (u = 2^-24, the f32 unit roundoff; n elements per channel; K = 8): the mock computes in f32
//! as the NPU does (block sums of 256), the CPU in f32 lanes merged in f64, so both are held to
//! - mean: `|got − m| ≤ 2u·|m| + K·(√n + 1)·u·mean(|x|)`;
//! - invstd: `|got − s| ≤ s·(2u + K·(√n + 1)·u)` (the variance is summed without cancellation
//!   on both backends, so its relative error is f32 accumulation noise).

mod common;

use ascend::ops::{batch_norm_stats, batch_norm_stats_into, prepare_batch_norm_stats, Prepared};
use ascend::{Context, DType, Result, Stream, Tensor};
use common::*;

type R = Result<()>;

framework_tests!(StatsCase);

on_both_backends!(
    doc_example,
    values_every_rank_and_dtype,
    values_every_layout,
    far_from_zero_mean,
    empty_input,
    into_writes_strided_outputs,
    rejected_calls_write_nothing,
    deterministic,
);

/// Per channel: (mean, invstd, mean |x|) in f64, two-pass.
fn reference(x: &Data, eps: f64) -> Vec<(f64, f64, f64)> {
    let c = x.shape[1];
    let mut vals: Vec<Vec<f64>> = vec![Vec::new(); c];
    for_each_index(&x.shape, |i| vals[i[1]].push(x.get(i)));
    vals.iter()
        .map(|v| {
            let n = v.len() as f64;
            if v.is_empty() {
                return (0.0, f64::NAN, 0.0);
            }
            let m = v.iter().sum::<f64>() / n;
            let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n;
            (m, 1.0 / (var + eps).sqrt(), v.iter().map(|x| x.abs()).sum::<f64>() / n)
        })
        .collect()
}

fn check(what: &str, x: &Data, eps: f64, mean: &[f64], invstd: &[f64]) {
    let exp = reference(x, eps);
    let n = x.numel() / x.shape[1];
    let u = unit_roundoff(DType::F32);
    let acc = ACC_K * ((n as f64).sqrt() + 1.0) * u;
    assert_eq!((mean.len(), invstd.len()), (exp.len(), exp.len()), "{what}: lengths");
    for (c, &(m, s, abs)) in exp.iter().enumerate() {
        let tol_m = 2.0 * u * m.abs() + acc * abs + tiny(DType::F32);
        assert!((mean[c] - m).abs() <= tol_m, "{what}: mean[{c}] = {} vs {m} (tol {tol_m:e})", mean[c]);
        let tol_s = s * (2.0 * u + acc);
        assert!((invstd[c] - s).abs() <= tol_s, "{what}: invstd[{c}] = {} vs {s} (tol {tol_s:e})", invstd[c]);
    }
}

/// One call's host data, for the framework tests.
struct StatsCase {
    x: Data,
    eps: f64,
}

impl Framework for StatsCase {
    const ACLNN: &'static str = "aclnnBatchNormStats";
    const MOCK_WORKSPACE: bool = true;
    type Up = Tensor;
    two_output_framework_items!(channels_of: x);

    fn small(seed: u64) -> StatsCase {
        StatsCase { x: Data::normal(&mut Rng::new(seed), DType::F32, &[5, 3, 7], 0.0, 1.0), eps: 1e-5 }
    }

    fn mixed(seed: u64) -> StatsCase {
        StatsCase { x: Data::normal(&mut Rng::new(seed), DType::F16, &[4, 3, 9], 0.0, 1.0), eps: 1e-5 }
    }

    fn upload(&self, s: &Stream) -> Result<Tensor> {
        self.x.tensor(s)
    }

    fn run(&self, up: &mut Tensor, s: &Stream) -> Result<(Tensor, Tensor)> {
        batch_norm_stats(s, up, self.eps)
    }

    fn run_into(&self, up: &mut Tensor, s: &Stream, (m, v): &mut (Tensor, Tensor)) -> R {
        batch_norm_stats_into(s, up, self.eps, m, v)
    }

    fn prepare<'a>(&self, up: &'a mut Tensor, s: &Stream, (m, v): &'a mut (Tensor, Tensor)) -> Result<Prepared<'a>> {
        prepare_batch_norm_stats(s, up, self.eps, m, v)
    }

    fn check(&self, _ctx: &Context, s: &Stream, what: &str, (m, v): &(Tensor, Tensor)) {
        for o in [m, v] {
            assert_eq!(o.shape(), [self.x.shape[1]], "{what}: shape");
            assert_eq!(o.dtype(), DType::F32, "{what}: dtype");
        }
        check(what, &self.x, self.eps, &read(s, m), &read(s, v));
    }
}

/// Runs the allocating API on `x` and checks shapes, dtypes and values.
fn run_and_check(ctx: &Context, what: &str, x: &Data, eps: f64) -> R {
    let s = ctx.new_stream()?;
    let t = x.tensor(&s)?;
    let (mean, invstd) = batch_norm_stats(&s, &t, eps)?;
    for o in [&mean, &invstd] {
        assert_eq!(o.shape(), [x.shape[1]], "{what}: shape");
        assert_eq!(o.dtype(), DType::F32, "{what}: dtype");
    }
    check(what, x, eps, &read(&s, &mean), &read(&s, &invstd));
    Ok(())
}

/// input [[1, 2], [3, 4], [5, 6]] (N = 3, C = 2): mean [3, 4], biased variance 8/3.
fn doc_example(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let x = Tensor::from_slice(&s, &[1f32, 2., 3., 4., 5., 6.], &[3, 2])?;
    let (mean, invstd) = batch_norm_stats(&s, &x, 0.0)?;
    assert_eq!(mean.to_vec::<f32>(&s)?, [3.0, 4.0]);
    let want = (1.0 / (8.0f64 / 3.0).sqrt()) as f32;
    for v in invstd.to_vec::<f32>(&s)? {
        assert!(ulps(v, want) <= 1, "{v} vs {want}");
    }
    Ok(())
}

fn values_every_rank_and_dtype(ctx: &Context) -> R {
    let shapes: [&[usize]; 7] = [
        &[7, 3],
        &[4, 5, 9],
        &[2, 3, 5, 7],
        &[2, 2, 3, 4, 5],
        &[1, 3, 2, 2, 3, 2],
        &[2, 2, 1, 2, 3, 1, 2],
        &[1, 2, 2, 1, 2, 3, 1, 2],
    ];
    for (i, shape) in shapes.into_iter().enumerate() {
        for dt in [DType::F32, DType::F16] {
            let x = Data::normal(&mut Rng::new(i as u64), dt, shape, 0.7, 1.3);
            run_and_check(ctx, &format!("{shape:?} {dt}"), &x, 1e-5)?;
        }
    }
    // a channel longer than one block of either backend
    let x = Data::normal(&mut Rng::new(99), DType::F32, &[3, 2, 2000, 11], -2.0, 0.5);
    run_and_check(ctx, "long channels", &x, 1e-3)
}

fn values_every_layout(ctx: &Context) -> R {
    let x = Data::normal(&mut Rng::new(5), DType::F32, &[3, 20, 6, 7], 1.0, 2.0);
    run_and_check(ctx, "channels-last C = 20", &x.permuted(&[0, 2, 3, 1]), 1e-5)?;
    let x3 = Data::normal(&mut Rng::new(6), DType::F16, &[5, 3, 8, 9], 1.0, 2.0);
    run_and_check(ctx, "channels-last C = 3 f16", &x3.permuted(&[0, 2, 3, 1]), 1e-5)?;
    run_and_check(ctx, "spread", &x.spread(3, 5, 77.0), 1e-5)?;
    let t = Data::normal(&mut Rng::new(7), DType::F32, &[9, 4, 33], 0.0, 1.0);
    run_and_check(ctx, "transposed", &t.permuted(&[2, 1, 0]), 1e-5)?;
    run_and_check(ctx, "channel outermost", &t.permuted(&[1, 0, 2]), 1e-5)?;
    // a broadcast view: every sample is the same storage (stride 0 over N)
    let storage: Vec<f64> = (0..40).map(|i| f64::from(i * 7 % 13) - 4.0).collect();
    run_and_check(ctx, "broadcast N", &Data::strided(DType::F32, &storage, &[6, 20, 2], &[0, 2, 1], 0), 1e-5)?;
    let wide: Vec<f64> = (0..300).map(|i| f64::from(i % 17) * 0.25).collect();
    run_and_check(ctx, "[1, 300]", &Data::new(DType::F16, &wide, &[1, 300]), 1e-5)
}

/// x = 1000 + N(0, 1): a one-pass Σx² − n·mean² would cancel; both backends are two-pass.
fn far_from_zero_mean(ctx: &Context) -> R {
    let x = Data::normal(&mut Rng::new(8), DType::F32, &[64, 2, 40], 1000.0, 1.0);
    run_and_check(ctx, "mean 1000", &x, 1e-5)
}

/// No element: mean 0, invstd NaN (what CANN fills), allocating and `_into` alike.
fn empty_input(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    for shape in [&[0usize, 3][..], &[2, 3, 0, 4]] {
        let x = Tensor::zeros(&s, DType::F32, shape)?;
        let (mean, invstd) = batch_norm_stats(&s, &x, 1e-5)?;
        assert_eq!(mean.to_vec::<f32>(&s)?, [0.0; 3], "{shape:?}");
        assert!(invstd.to_vec::<f32>(&s)?.iter().all(|v| v.is_nan()), "{shape:?}");
        let mut m = Tensor::from_slice(&s, &[5f32; 3], &[3])?;
        let mut v = Tensor::from_slice(&s, &[5f32; 3], &[3])?;
        batch_norm_stats_into(&s, &x, 1e-5, &mut m, &mut v)?;
        assert_eq!(m.to_vec::<f32>(&s)?, [0.0; 3]);
        assert!(v.to_vec::<f32>(&s)?.iter().all(|v| v.is_nan()));
    }
    Ok(())
}

/// `_into` writes exactly the strided elements of its outputs.
fn into_writes_strided_outputs(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let x = Data::normal(&mut Rng::new(9), DType::F16, &[6, 4, 5], 0.0, 1.0);
    let t = x.tensor(&s)?;
    let mut mean = Tensor::from_slice_strided(&s, &[-1f32; 9], &[4], &[2], 1)?;
    let mut invstd = Tensor::from_slice_strided(&s, &[-1f32; 6], &[4], &[1], 2)?;
    batch_norm_stats_into(&s, &t, 1e-5, &mut mean, &mut invstd)?;
    check("strided outputs", &x, 1e-5, &read(&s, &mean), &read(&s, &invstd));
    let (m2, _) = batch_norm_stats(&s, &t, 1e-5)?;
    assert_eq!(bits(&s, &mean), bits(&s, &m2), "same values as the allocating API");
    Ok(())
}

fn rejected_calls_write_nothing(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let good = Data::normal(&mut Rng::new(10), DType::F32, &[4, 3, 5], 0.0, 1.0).tensor(&s)?;
    let sentinel = |s: &ascend::Stream, dt: DType, n: usize| Data::filled(dt, &[n], 42.0).tensor(s);
    let mut m = sentinel(&s, DType::F32, 3)?;
    let mut v = sentinel(&s, DType::F32, 3)?;
    let expect = |what: &str, input: &Tensor, m: &mut Tensor, v: &mut Tensor, needle: &str| -> R {
        let err = batch_norm_stats_into(&s, input, 1e-5, m, v).unwrap_err();
        assert_eq!(err.status(), Some(INVALID), "{what}: {err}");
        assert!(err.to_string().contains(needle), "{what}: {err}");
        for t in [&*m, &*v] {
            assert!(read(&s, t).iter().all(|&x| x == 42.0), "{what}: a rejected call wrote an output");
        }
        Ok(())
    };
    // bf16 input: rejected on both backends, as Atlas A2/A3 reject it
    let bf = Data::filled(DType::BF16, &[4, 3], 1.0).tensor(&s)?;
    expect("bf16 input", &bf, &mut m, &mut v, "cast the input to f32")?;
    assert_eq!(status_of(batch_norm_stats(&s, &bf, 1e-5)), INVALID);
    // outputs are f32 only
    let mut m16 = sentinel(&s, DType::F16, 3)?;
    expect("f16 mean", &good, &mut m16, &mut v, "f32")?;
    let mut v_bf = sentinel(&s, DType::BF16, 3)?;
    expect("bf16 invstd", &good, &mut m, &mut v_bf, "f32")?;
    // ranks and channels
    for shape in [&[12usize][..], &[1, 1, 1, 1, 1, 1, 1, 1, 3]] {
        let bad = Tensor::zeros(&s, DType::F32, shape)?;
        expect(&format!("rank {}", shape.len()), &bad, &mut m, &mut v, "rank")?;
        assert_eq!(status_of(batch_norm_stats(&s, &bad, 1e-5)), INVALID);
    }
    let c0 = Tensor::zeros(&s, DType::F32, &[4, 0, 2])?;
    expect("C = 0", &c0, &mut m, &mut v, "channel")?;
    assert_eq!(status_of(batch_norm_stats(&s, &c0, 1e-5)), INVALID);
    // output shapes and strides
    let mut short = sentinel(&s, DType::F32, 2)?;
    expect("mean [2]", &good, &mut short, &mut v, "[3]")?;
    let mut two_d = Data::filled(DType::F32, &[1, 3], 42.0).tensor(&s)?;
    expect("invstd [1, 3]", &good, &mut m, &mut two_d, "[3]")?;
    let mut broadcast = Tensor::from_slice_strided(&s, &[42f32], &[3], &[0], 0)?;
    expect("stride 0", &good, &mut m, &mut broadcast, "stride 0")?;
    Ok(())
}

/// The same call twice gives the same bits (several threads on the CPU: 16 MiB of input).
fn deterministic(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let shape: &[usize] = if ctx.backend() == ascend::Backend::Cpu { &[64, 8, 128, 64] } else { &[16, 8, 30, 20] };
    let x = Data::normal(&mut Rng::new(11), DType::F32, shape, 3.0, 2.0).tensor(&s)?;
    let (m1, v1) = batch_norm_stats(&s, &x, 1e-5)?;
    let (m2, v2) = batch_norm_stats(&s, &x, 1e-5)?;
    assert_eq!(bits(&s, &m1), bits(&s, &m2));
    assert_eq!(bits(&s, &v1), bits(&s, &v2));
    Ok(())
}

#[cfg(feature = "mock")]
mod faults {
    use super::*;

    /// A CPU tensor with an Ascend stream (and the reverse) is refused.
    #[test]
    fn backends_do_not_mix() {
        common::mock::isolated(|ctx| -> R {
            let s = ctx.new_stream()?;
            let cpu = Context::cpu().new_stream()?;
            let host = Tensor::zeros(&cpu, DType::F32, &[2, 3])?;
            assert_eq!(status_of(batch_norm_stats(&s, &host, 1e-5)), INVALID);
            let dev = Tensor::zeros(&s, DType::F32, &[2, 3])?;
            assert_eq!(status_of(batch_norm_stats(&cpu, &dev, 1e-5)), INVALID);
            Ok(())
        })
        .unwrap();
    }
}

/// The mock's own dtype checks (Atlas A2/A3), which the safe API never reaches: bf16 input and
/// non-f32 mean/invstd are 161002.
#[cfg(feature = "mock")]
#[test]
fn mock_checks_dtypes_as_a2_a3() {
    use ascend_sys::aclDataType as Dt;
    let mut r = common::raw_mock::Mock::new();
    let api = r.c.operator(&ascend_sys::symbols::BATCH_NORM_STATS).expect("exported");
    let x = [Dt::ACL_FLOAT, Dt::ACL_FLOAT16, Dt::ACL_BF16].map(|d| r.zeros(d, &[4, 3]));
    let m = [Dt::ACL_FLOAT, Dt::ACL_FLOAT16].map(|d| r.zeros(d, &[3]));
    let v = r.zeros(Dt::ACL_FLOAT, &[3]);
    let call = |x: *mut ascend_sys::aclTensor, m: *mut ascend_sys::aclTensor| {
        let (mut ws, mut ex) = (0u64, std::ptr::null_mut());
        // SAFETY: live handles; valid out-pointers.
        let st = unsafe { api.aclnnBatchNormStatsGetWorkspaceSize(x, 1e-5, m, v, &mut ws, &mut ex) };
        (st, ex)
    };
    let v0 = ascend::mock::stats().violations;
    assert_eq!(call(x[2], m[0]).0, INVALID, "bf16 input (Ascend 950 only)");
    assert_eq!(call(x[0], m[1]).0, INVALID, "f16 mean");
    for input in [x[0], x[1]] {
        let (st, ex) = call(input, m[0]);
        assert_eq!(st, 0);
        r.discard(ex);
    }
    assert_eq!(ascend::mock::stats().violations, v0);
}
