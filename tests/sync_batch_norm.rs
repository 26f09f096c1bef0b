//! SyncBatchNorm end to end. The chain of the five BatchNorm operators on one device
//! (stats → gather_stats_with_counts → elemt → reduce_backward → elemt_backward) equals
//! BatchNorm's forward and backward over the batch computed in f64; and `sync_batch_norm` over
//! 1..8 ranks (CPU contexts as threads), with any split of N, equals the same single-device
//! result to f32 accuracy, for f32, f16 and bf16 inputs.

mod common;

use ascend::hccl::Communicator;
use ascend::ops::{self, OutputMask};
use ascend::sync_batch_norm;
use ascend::{Context, DType, Stream, Tensor};
use common::{on_ranks, Data, Rng};

/// BatchNorm over a whole batch in f64: forward output, backward gradients, running stats.
struct Reference {
    y: Vec<f64>,
    dx: Vec<f64>,
    dw: Vec<f64>,
    db: Vec<f64>,
    running_mean: Vec<f64>,
    running_var: Vec<f64>,
}

/// x, dy: contiguous (N, C, S) values; w, b: [C].
#[allow(clippy::too_many_arguments)]
fn reference(
    x: &[f64],
    dy: &[f64],
    shape: [usize; 3],
    w: &[f64],
    b: &[f64],
    rm: &[f64],
    rv: &[f64],
    momentum: f64,
    eps: f64,
) -> Reference {
    let [n, c, s] = shape;
    let m = (n * s) as f64;
    let idx = |i: usize, ch: usize, k: usize| (i * c + ch) * s + k;
    let mut r = Reference {
        y: vec![0.0; x.len()],
        dx: vec![0.0; x.len()],
        dw: vec![0.0; c],
        db: vec![0.0; c],
        running_mean: vec![0.0; c],
        running_var: vec![0.0; c],
    };
    for ch in 0..c {
        let vals = || (0..n).flat_map(move |i| (0..s).map(move |k| idx(i, ch, k)));
        let mu = vals().map(|j| x[j]).sum::<f64>() / m;
        let var = vals().map(|j| (x[j] - mu).powi(2)).sum::<f64>() / m;
        let invstd = 1.0 / (var + eps).sqrt();
        let sum_dy: f64 = vals().map(|j| dy[j]).sum();
        let sum_dy_xmu: f64 = vals().map(|j| dy[j] * (x[j] - mu)).sum();
        for j in vals() {
            r.y[j] = (x[j] - mu) * invstd * w[ch] + b[ch];
            r.dx[j] = w[ch] * invstd * (dy[j] - sum_dy / m - (x[j] - mu) * invstd * invstd * sum_dy_xmu / m);
        }
        r.dw[ch] = sum_dy_xmu * invstd;
        r.db[ch] = sum_dy;
        r.running_mean[ch] = (1.0 - momentum) * rm[ch] + momentum * mu;
        r.running_var[ch] = (1.0 - momentum) * rv[ch] + momentum * var * m / (m - 1.0);
    }
    r
}

fn read(s: &Stream, t: &Tensor) -> Vec<f64> {
    t.to_vec::<f32>(s).unwrap().into_iter().map(f64::from).collect()
}

fn assert_close(what: &str, got: &[f64], exp: &[f64], tol: f64) {
    assert_eq!(got.len(), exp.len(), "{what}: length");
    let scale = exp.iter().fold(1.0f64, |a, v| a.max(v.abs()));
    for (i, (g, e)) in got.iter().zip(exp).enumerate() {
        assert!((g - e).abs() <= tol * scale, "{what}[{i}]: got {g}, expected {e} (tolerance {tol} × {scale})");
    }
}

/// Tolerance relative to the largest expected magnitude, per input dtype: the outputs are
/// rounded to the input's dtype, and the mock (like the NPU) computes in f32 with one-pass sums.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-4,
        DType::F16 => 4e-3,
        _ => 3e-2,
    }
}

/// Eight mock devices (the mock reads the count at aclInit): every test calls this first and
/// holds the guard it returns. The guard serialises the tests of this binary: one of them compares
/// the mock's process-wide counters (live allocations, violations) before and after, which another
/// test allocating on the mock in parallel would change (seen under emulation, where it is slow).
fn setup() -> std::sync::MutexGuard<'static, ()> {
    static ONCE: std::sync::Once = std::sync::Once::new();
    static MOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONCE.call_once(|| std::env::set_var("ASCEND_MOCK_DEVICE_COUNT", "8"));
    // A test that failed while holding it leaves it poisoned; the others still run.
    MOCK.lock().unwrap_or_else(|e| e.into_inner())
}

const EPS: f64 = 1e-5;
const MOMENTUM: f64 = 0.1;

struct Case {
    dtype: DType,
    shape: [usize; 3],
    x: Data,
    dy: Data,
    /// Weight, bias, running mean and running variance: f32 `[C]`.
    w: Data,
    b: Data,
    rm: Data,
    rv: Data,
}

impl Case {
    fn new(seed: u64, dtype: DType, shape: [usize; 3]) -> Case {
        let mut rng = Rng::new(seed);
        let x = Data::normal(&mut rng, dtype, &shape, 0.5, 1.5);
        let dy = Data::normal(&mut rng, dtype, &shape, 0.0, 1.0);
        let mut chan = |lo: f64, hi: f64| Data::uniform(&mut rng, DType::F32, &shape[1..2], lo, hi);
        let (w, b, rm, rv) = (chan(0.5, 1.5), chan(-1.0, 1.0), chan(-0.5, 0.5), chan(0.5, 2.0));
        Case { dtype, shape, x, dy, w, b, rm, rv }
    }

    fn reference(&self) -> Reference {
        let [w, b, rm, rv] = [&self.w, &self.b, &self.rm, &self.rv].map(Data::values);
        reference(&self.x.values(), &self.dy.values(), self.shape, &w, &b, &rm, &rv, MOMENTUM, EPS)
    }

    /// Rows `rows` of dim 0 of `d`, as a tensor of the case's dtype.
    fn rows(&self, s: &Stream, d: &Data, rows: std::ops::Range<usize>) -> Tensor {
        let [_, c, k] = self.shape;
        let v: Vec<f64> = d.values()[rows.start * c * k..rows.end * c * k].to_vec();
        Data::new(self.dtype, &v, &[rows.len(), c, k]).tensor(s).unwrap()
    }
}

/// The five operators chained on one device equal BatchNorm's forward and backward in f64.
#[test]
fn the_operator_chain_on_one_device_is_batch_norm() {
    let _mock = setup();
    for ctx in common::backends() {
        for dtype in [DType::F32, DType::F16] {
            let case = Case::new(7, dtype, [6, 3, 20]);
            let exp = case.reference();
            let s = ctx.new_stream().unwrap();
            let x = case.rows(&s, &case.x, 0..6);
            let dy = case.rows(&s, &case.dy, 0..6);
            let [w, b, mut rm, mut rv] = [&case.w, &case.b, &case.rm, &case.rv].map(|d| d.tensor(&s).unwrap());
            let (mean, invstd) = ops::batch_norm_stats(&s, &x, EPS).unwrap();
            let to_row = |t: &Tensor| Tensor::from_slice(&s, &t.to_vec::<f32>(&s).unwrap(), &[1, 3]).unwrap();
            let (mean_all, invstd_all) = (to_row(&mean), to_row(&invstd));
            let counts = Tensor::from_slice(&s, &[120f32], &[1]).unwrap();
            let (gm, gi) = ops::batch_norm_gather_stats_with_counts(
                &s,
                &x,
                &mean_all,
                &invstd_all,
                Some(&mut rm),
                Some(&mut rv),
                MOMENTUM,
                EPS,
                &counts,
            )
            .unwrap();
            let y = ops::batch_norm_elemt(&s, &x, Some(&w), Some(&b), &gm, &gi, EPS).unwrap();
            let r = ops::batch_norm_reduce_backward(&s, &dy, &x, &gm, &gi, Some(&w), OutputMask::ALL).unwrap();
            let (sum_dy, sum_dy_xmu) = (r.sum_dy.unwrap(), r.sum_dy_xmu.unwrap());
            let dx =
                ops::batch_norm_elemt_backward(&s, &dy, &x, &gm, &gi, Some(&w), &sum_dy, &sum_dy_xmu, &counts).unwrap();
            let tol = tolerance(dtype);
            let what = |n: &str| format!("{:?} {dtype} {n}", ctx.backend());
            assert_close(&what("y"), &read(&s, &y), &exp.y, tol);
            assert_close(&what("dx"), &read(&s, &dx), &exp.dx, tol);
            assert_close(&what("dw"), &read(&s, &r.grad_weight.unwrap()), &exp.dw, tol);
            assert_close(&what("db"), &read(&s, &r.grad_bias.unwrap()), &exp.db, tol);
            assert_close(&what("running_mean"), &read(&s, &rm), &exp.running_mean, tol);
            assert_close(&what("running_var"), &read(&s, &rv), &exp.running_var, tol);
        }
    }
}

/// `sync_batch_norm` over `ranks` ranks (one thread each) with rank r holding rows
/// `splits[r]..splits[r+1]`: every rank's output and input gradient equal the single-device
/// BatchNorm's rows, the weight and bias gradients summed over ranks equal the global ones, and
/// every rank's running statistics equal the global update.
fn sync_case(ctxs: &[Context], dtype: DType, splits: &[usize], seed: u64) {
    let n = *splits.last().unwrap();
    let case = Case::new(seed, dtype, [n, 4, 6]);
    let exp = case.reference();
    let comms = Communicator::init_all(ctxs).unwrap();
    let [_, c, k] = case.shape;
    let results: Vec<_> = on_ranks(comms, ctxs, |r, comm, ctx| {
        let r = r as usize;
        let s = ctx.new_stream().unwrap();
        let rows = splits[r]..splits[r + 1];
        let x = case.rows(&s, &case.x, rows.clone());
        let dy = case.rows(&s, &case.dy, rows.clone());
        let [w, b, mut rm, mut rv] = [&case.w, &case.b, &case.rm, &case.rv].map(|d| d.tensor(&s).unwrap());
        let (y, saved) =
            sync_batch_norm::forward(comm, &s, &x, Some(&w), Some(&b), Some(&mut rm), Some(&mut rv), MOMENTUM, EPS)
                .unwrap();
        let (dx, dw, db) = sync_batch_norm::backward(comm, &s, &dy, &saved, Some(&w), OutputMask::ALL).unwrap();
        (
            rows,
            read(&s, &y),
            read(&s, &dx.unwrap()),
            read(&s, &dw.unwrap()),
            read(&s, &db.unwrap()),
            read(&s, &rm),
            read(&s, &rv),
        )
    });
    let tol = tolerance(dtype);
    let what = format!("{:?} {dtype} splits {splits:?}", ctxs[0].backend());
    let (mut dw, mut db) = (vec![0.0; c], vec![0.0; c]);
    for (rows, y, dx, w, b, rm, rv) in results {
        let span = rows.start * c * k..rows.end * c * k;
        assert_close(&format!("{what} y{rows:?}"), &y, &exp.y[span.clone()], tol);
        assert_close(&format!("{what} dx{rows:?}"), &dx, &exp.dx[span], tol);
        assert_close(&format!("{what} running_mean"), &rm, &exp.running_mean, tol);
        assert_close(&format!("{what} running_var"), &rv, &exp.running_var, tol);
        dw.iter_mut().zip(&w).for_each(|(a, v)| *a += v);
        db.iter_mut().zip(&b).for_each(|(a, v)| *a += v);
    }
    assert_close(&format!("{what} Σ grad_weight"), &dw, &exp.dw, tol);
    assert_close(&format!("{what} Σ grad_bias"), &db, &exp.db, tol);
}

#[test]
fn sync_batch_norm_on_cpu_ranks_equals_batch_norm_over_the_global_batch() {
    let _mock = setup();
    let splits: [&[usize]; 5] = [&[0, 5], &[0, 2, 5], &[0, 1, 1, 3, 5], &[0, 3, 3, 4, 5], &[0, 1, 2, 2, 3, 3, 4, 5, 6]];
    for (i, split) in splits.into_iter().enumerate() {
        let ranks = split.len() - 1;
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            sync_case(&vec![Context::cpu(); ranks], dtype, split, 100 + i as u64);
        }
    }
}

#[cfg(feature = "mock")]
#[test]
fn sync_batch_norm_on_mock_devices_equals_batch_norm_over_the_global_batch() {
    let _mock = setup();
    let before = ascend::mock::stats();
    let splits: [&[usize]; 3] = [&[0, 2, 5], &[0, 1, 1, 3, 5], &[0, 1, 2, 3, 4, 5, 6, 7, 8]];
    for (i, split) in splits.into_iter().enumerate() {
        let ranks = split.len() - 1;
        let ctxs: Vec<Context> = (0..ranks as i32).map(|d| ascend::mock::context(d).unwrap()).collect();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            sync_case(&ctxs, dtype, split, 200 + i as u64);
        }
    }
    let after = ascend::mock::stats();
    assert_eq!(after.violations, before.violations, "{:?}", ascend::mock::violations_since(before.violations));
    assert_eq!((after.live_comms, after.live_allocations), (before.live_comms, before.live_allocations));
}

/// The contexts of a two-rank SyncBatchNorm test: CPU contexts, and with the mock feature mock
/// devices 0 and 1.
fn two_rank_engines() -> Vec<Vec<Context>> {
    #[allow(unused_mut)]
    let mut v = vec![vec![Context::cpu(); 2]];
    #[cfg(feature = "mock")]
    v.push((0..2).map(|d| ascend::mock::context(d).unwrap()).collect());
    v
}

/// Every rank empty (N = 0 on each, audit 4 G01): the step is `Ok`, the running statistics keep
/// their values (bit for bit), the saved statistics are finite, and backward gives empty input
/// gradients and zero weight and bias gradients (not NaN), on both engines.
#[test]
fn an_all_empty_step_leaves_the_running_statistics_unchanged() {
    let _mock = setup();
    for ctxs in two_rank_engines() {
        let case = Case::new(300, DType::F32, [0, 3, 4]);
        let comms = Communicator::init_all(&ctxs).unwrap();
        let what = format!("{:?}", ctxs[0].backend());
        let results = on_ranks(comms, &ctxs, |_, comm, ctx| {
            let s = ctx.new_stream().unwrap();
            let x = case.rows(&s, &case.x, 0..0);
            let dy = case.rows(&s, &case.dy, 0..0);
            let [w, b, mut rm, mut rv] = [&case.w, &case.b, &case.rm, &case.rv].map(|d| d.tensor(&s).unwrap());
            let (y, saved) =
                sync_batch_norm::forward(comm, &s, &x, Some(&w), Some(&b), Some(&mut rm), Some(&mut rv), MOMENTUM, EPS)
                    .unwrap();
            let (mean, invstd) = (read(&s, saved.mean()), read(&s, saved.invstd()));
            let (dx, dw, db) = sync_batch_norm::backward(comm, &s, &dy, &saved, Some(&w), OutputMask::ALL).unwrap();
            let dx = dx.unwrap();
            (y.shape().to_vec(), dx.shape().to_vec(), read(&s, &rm), read(&s, &rv), mean, invstd, dw, db, s)
        });
        for (y, dx, rm, rv, mean, invstd, dw, db, s) in results {
            assert_eq!((y.as_slice(), dx.as_slice()), (&[0, 3, 4][..], &[0, 3, 4][..]), "{what}: shapes");
            assert_eq!(rm, case.rm.values(), "{what}: running_mean changed by an empty step");
            assert_eq!(rv, case.rv.values(), "{what}: running_var changed by an empty step");
            assert!(mean.iter().chain(&invstd).all(|v| v.is_finite()), "{what}: saved mean {mean:?} invstd {invstd:?}");
            let (dw, db) = (read(&s, &dw.unwrap()), read(&s, &db.unwrap()));
            assert_eq!((dw, db), (vec![0.0; 3], vec![0.0; 3]), "{what}: gradients of an empty batch");
        }
    }
}

/// One rank empty and one not, each way round, on both engines: the values equal BatchNorm over
/// the non-empty rank's rows (f64 reference), on the empty rank too.
#[test]
fn one_empty_rank_of_two_equals_batch_norm_over_the_other() {
    let _mock = setup();
    for ctxs in two_rank_engines() {
        for (i, split) in [[0usize, 0, 5], [0, 5, 5]].into_iter().enumerate() {
            for dtype in [DType::F32, DType::F16] {
                sync_case(&ctxs, dtype, &split, 400 + i as u64);
            }
        }
    }
}

/// A failure after the all-gather, before the running statistics are updated (the output's
/// `aclrtMalloc` fails on rank 0): `forward` returns `Err` and rank 0's running statistics are
/// unchanged, since every output is allocated before the gather updates them; the retried step
/// then updates them once (equal to the f64 reference of one step). A warm-up step of a smaller
/// batch, whose output stays alive, leaves its per-channel blocks in the cache for the tested
/// step, so the output's is the step's only `aclrtMalloc`, with nothing cached for the allocator
/// to return and retry with.
#[cfg(feature = "mock")]
#[test]
fn a_failure_after_the_gather_leaves_the_running_statistics_unchanged() {
    let _mock = setup();
    let ctxs: Vec<Context> = (0..2).map(|d| ascend::mock::context(d).unwrap()).collect();
    let case = Case::new(500, DType::F32, [6, 3, 5]);
    let exp = case.reference();
    let comms = Communicator::init_all(&ctxs).unwrap();
    let results = on_ranks(comms, &ctxs, |r, comm, ctx| {
        let s = ctx.new_stream().unwrap();
        let rows = if r == 0 { 0..3 } else { 3..6 };
        let x = case.rows(&s, &case.x, rows.clone());
        let x_warm = case.rows(&s, &case.x, rows.start..rows.start + 1);
        let [w, b, mut rm, mut rv] = [&case.w, &case.b, &case.rm, &case.rv].map(|d| d.tensor(&s).unwrap());
        let (warm_y, _) =
            sync_batch_norm::forward(comm, &s, &x_warm, Some(&w), Some(&b), None, None, MOMENTUM, EPS).unwrap();
        let step = |rm: &mut Tensor, rv: &mut Tensor| {
            sync_batch_norm::forward(comm, &s, &x, Some(&w), Some(&b), Some(rm), Some(rv), MOMENTUM, EPS).map(|_| ())
        };
        if r == 0 {
            ascend::mock::fail_next_on_this_thread("aclrtMalloc", 207_001);
            let e = step(&mut rm, &mut rv).expect_err("the output's allocation was made to fail");
            assert!(e.to_string().contains("aclrtMalloc"), "{e}");
            assert_eq!(read(&s, &rm), case.rm.values(), "running_mean changed by a failed step");
            assert_eq!(read(&s, &rv), case.rv.values(), "running_var changed by a failed step");
            step(&mut rm, &mut rv).unwrap();
        } else {
            step(&mut rm, &mut rv).unwrap();
            // Rank 0's retry: a second step here (its running statistics are not checked).
            let (mut rm2, mut rv2) = (case.rm.tensor(&s).unwrap(), case.rv.tensor(&s).unwrap());
            step(&mut rm2, &mut rv2).unwrap();
        }
        drop(warm_y);
        (read(&s, &rm), read(&s, &rv))
    });
    let (rm, rv) = &results[0];
    assert_close("running_mean after the retry", rm, &exp.running_mean, tolerance(DType::F32));
    assert_close("running_var after the retry", rv, &exp.running_var, tolerance(DType::F32));
}

/// bf16 input on one CPU rank: the local statistics come from the statistics kernel (one pass,
/// no host read); the saved mean and invstd equal the f64 mean and 1/sqrt(var + eps) of the exact
/// bf16 values to f32 accuracy, also when |mean| ≫ std (where Σx² − mean·Σx in f32 would lose
/// every digit of the variance).
#[test]
fn bf16_statistics_on_one_cpu_rank_match_f64() {
    let _mock = setup();
    let ctx = Context::cpu();
    let s = ctx.new_stream().unwrap();
    let comm = Communicator::init_all(std::slice::from_ref(&ctx)).unwrap().remove(0);
    let shape = [6, 3, 700];
    let mut rng = Rng::new(77);
    for (mu, sigma) in [(0.5, 1.5), (300.0, 6.0), (-2.0e4, 90.0)] {
        let x = Data::normal(&mut rng, DType::BF16, &shape, mu, sigma);
        let xt = x.tensor(&s).unwrap();
        let (_, saved) = sync_batch_norm::forward(&comm, &s, &xt, None, None, None, None, MOMENTUM, EPS).unwrap();
        let v = x.values();
        let [n, c, k] = shape;
        for ch in 0..c {
            let vals: Vec<f64> = (0..n).flat_map(|i| (0..k).map(move |j| (i * c + ch) * k + j)).map(|j| v[j]).collect();
            let m = vals.iter().sum::<f64>() / vals.len() as f64;
            let var = vals.iter().map(|x| (x - m).powi(2)).sum::<f64>() / vals.len() as f64;
            let invstd = 1.0 / (var + f64::from(EPS as f32)).sqrt();
            let (gm, gi) = (read(&s, saved.mean())[ch], read(&s, saved.invstd())[ch]);
            assert!((gm - m).abs() <= 2e-7 * m.abs().max(sigma), "mean[{ch}] of N({mu}, {sigma}): {gm} vs {m}");
            assert!((gi - invstd).abs() <= 2e-6 * invstd, "invstd[{ch}] of N({mu}, {sigma}): {gi} vs {invstd}");
        }
    }
}

/// Validation has no side effect: a `forward` or `backward` refused by one of its checks makes no
/// runtime call at all on the mock (no `aclrtMalloc`, no copy, no launch: the operators' rules
/// are asked with layouts, no stand-in tensor is uploaded for them). The refusals cover the
/// first check (eps), an operator's rule (weight, running statistics) and the last check
/// (momentum): a call refused there has run every check a successful call runs, so a successful
/// call's validation makes no runtime call either.
#[cfg(feature = "mock")]
#[test]
fn a_refused_call_makes_no_runtime_call() {
    let _mock = setup();
    let ctx = ascend::mock::context(0).unwrap();
    let s = ctx.new_stream().unwrap();
    let comm = Communicator::init_all(std::slice::from_ref(&ctx)).unwrap().remove(0);
    let case = Case::new(600, DType::F32, [4, 3, 5]);
    let x = case.x.tensor(&s).unwrap();
    let dy = case.dy.tensor(&s).unwrap();
    let [w, b, mut rm, mut rv] = [&case.w, &case.b, &case.rm, &case.rv].map(|d| d.tensor(&s).unwrap());
    let long = Tensor::from_slice(&s, &[1f32; 4], &[4]).unwrap();
    let mut rm_long = Tensor::from_slice(&s, &[0f32; 4], &[4]).unwrap();
    s.synchronize().unwrap();
    // The runtime calls of this thread and the mock's process-wide counters around `f`.
    let counted = |f: &mut dyn FnMut() -> ascend::Result<()>| {
        let (calls, before, launches) =
            (ascend::mock::thread_stats().api_calls, ascend::mock::stats(), ascend::mock::launch_counters());
        let r = f();
        let (after, launches_after) = (ascend::mock::stats(), ascend::mock::launch_counters());
        assert_eq!(
            (after.device_mallocs, after.blocking_copies, after.queued_tasks, launches_after.phase1_calls),
            (before.device_mallocs, before.blocking_copies, before.queued_tasks, launches.phase1_calls),
            "mallocs, blocking copies, queued tasks, phase-1 calls"
        );
        (r, ascend::mock::thread_stats().api_calls - calls)
    };
    type Refusal<'a> = (&'a str, Option<&'a Tensor>, bool, f64, f64);
    let cases: [Refusal; 5] = [
        ("eps NaN", Some(&w), false, MOMENTUM, f64::NAN),
        ("weight of C + 1", Some(&long), false, MOMENTUM, EPS),
        ("runningMean of C + 1", Some(&w), true, MOMENTUM, EPS),
        ("momentum NaN", Some(&w), false, f64::NAN, EPS),
        ("momentum beyond f32", None, false, 1e39, EPS),
    ];
    for (what, weight, bad_running, momentum, eps) in cases {
        let running_mean = if bad_running { &mut rm_long } else { &mut rm };
        let (r, calls) = counted(&mut || {
            let (rm, rv) = (Some(&mut *running_mean), Some(&mut rv));
            sync_batch_norm::forward(&comm, &s, &x, weight, Some(&b), rm, rv, momentum, eps).map(|_| ())
        });
        let e = r.expect_err(what);
        assert_eq!(e.status(), Some(161002), "{what}: {e}");
        assert_eq!(calls, 0, "{what}: runtime calls of a refused forward");
    }
    assert_eq!(read(&s, &rm), case.rm.values(), "running_mean untouched by refused calls");
    // A valid forward runs (and calls the runtime), then a backward refused before its all-reduce.
    let (_, saved) =
        sync_batch_norm::forward(&comm, &s, &x, Some(&w), Some(&b), Some(&mut rm), Some(&mut rv), MOMENTUM, EPS)
            .unwrap();
    s.synchronize().unwrap();
    let (r, calls) =
        counted(&mut || sync_batch_norm::backward(&comm, &s, &dy, &saved, Some(&long), OutputMask::ALL).map(|_| ()));
    let e = r.expect_err("backward with a weight of C + 1");
    assert_eq!(e.status(), Some(161002), "{e}");
    assert_eq!(calls, 0, "runtime calls of a refused backward");
    let before = ascend::mock::thread_stats().api_calls;
    sync_batch_norm::backward(&comm, &s, &dy, &saved, Some(&w), OutputMask::ALL).unwrap();
    assert!(ascend::mock::thread_stats().api_calls > before, "the counter counts this thread's calls");
}
