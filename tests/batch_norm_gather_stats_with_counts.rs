//! `ops::batch_norm_gather_stats_with_counts` (aclnnBatchNormGatherStatsWithCounts) on both
//! backends: `cpu::<case>` always, `mock::<case>` (Ascend over the mock CANN, isolated: no leak,
//! no violation) with `--features mock`.
//!
//! Values are checked against an independent f64 reference (PyTorch's combine, written out
//! below). The mock computes in f32 as the NPU does, the CPU in f64; both are held to (u = 2^-24,
//! u_out the output dtype's unit roundoff, W ranks):
//! - meanAll: `2·u_out·|m| + 4·(W + 2)·u·Σ n_j·|mean_j| / N`;
//! - invstdAll: relative `2·u_out + 4·(W + 6)·u` (the spread is summed without cancellation);
//! - runningMean / runningVar: `2·u_out·|r|` plus the same terms scaled by momentum.

mod common;

use ascend::ops::{
    batch_norm_gather_stats_with_counts, batch_norm_gather_stats_with_counts_into, batch_norm_stats,
    prepare_batch_norm_gather_stats_with_counts, Prepared,
};
use ascend::{Context, DType, Result, Stream, Tensor};
use common::*;

type R = Result<()>;

framework_tests!(Case);

on_both_backends!(
    two_ranks_exact,
    values_every_dtype_combination,
    into_strided_outputs_and_running_dtypes,
    chained_with_batch_norm_stats,
    without_running_stats,
    no_rank,
    rejected_calls_write_nothing,
    deterministic,
);

/// Host data of one call.
#[derive(Clone, Debug)]
struct Case {
    input: Data,
    mean: Data,
    invstd: Data,
    counts: Data,
    running_mean: Data,
    running_var: Data,
    momentum: f64,
    eps: f64,
}

/// Expected values in f64.
struct Expected {
    mean: Vec<f64>,
    invstd: Vec<f64>,
    running_mean: Vec<f64>,
    running_var: Vec<f64>,
    /// Σ n_j·|mean_j| / N per channel.
    cond_mean: Vec<f64>,
}

impl Case {
    /// W ranks, C channels: mean_j ~ U(-1, 1), invstd_j ~ U(0.5, 2), counts integers in
    /// [1, 300]; `input` in `dt_in`, the statistics in `dt_stats`.
    fn random(seed: u64, w: usize, c: usize, dt_in: DType, dt_stats: DType) -> Case {
        let mut rng = Rng::new(seed);
        let counts: Vec<f64> = (0..w).map(|_| (1.0 + 300.0 * rng.unit()).floor()).collect();
        Case {
            input: Data::normal(&mut rng, dt_in, &[2, c, 3], 0.0, 1.0),
            mean: Data::uniform(&mut rng, dt_stats, &[w, c], -1.0, 1.0),
            invstd: Data::uniform(&mut rng, dt_stats, &[w, c], 0.5, 2.0),
            counts: Data::new(dt_stats, &counts, &[w]),
            running_mean: Data::uniform(&mut rng, dt_stats, &[c], -0.5, 0.5),
            running_var: Data::uniform(&mut rng, dt_stats, &[c], 0.5, 1.5),
            momentum: 0.1,
            eps: 1e-5,
        }
    }

    fn expected(&self) -> Expected {
        let (w, c) = (self.mean.shape[0], self.mean.shape[1]);
        let counts = self.counts.values();
        let n: f64 = counts.iter().sum();
        let (rm, rv) = (self.running_mean.values(), self.running_var.values());
        let mut e =
            Expected { mean: vec![], invstd: vec![], running_mean: vec![], running_var: vec![], cond_mean: vec![] };
        for ch in 0..c {
            let mj = |j: usize| self.mean.get(&[j, ch]);
            let m = (0..w).map(|j| counts[j] * mj(j)).sum::<f64>() / n;
            let var_n: f64 = (0..w)
                .map(|j| {
                    let inv = self.invstd.get(&[j, ch]);
                    counts[j] * (1.0 / (inv * inv) - self.eps) + counts[j] * (mj(j) - m).powi(2)
                })
                .sum();
            e.mean.push(m);
            e.invstd.push(1.0 / (var_n / n + self.eps).sqrt());
            e.running_mean.push((1.0 - self.momentum) * rm[ch] + self.momentum * m);
            e.running_var.push((1.0 - self.momentum) * rv[ch] + self.momentum * var_n / (n - 1.0));
            e.cond_mean.push((0..w).map(|j| counts[j] * mj(j).abs()).sum::<f64>() / n);
        }
        e
    }
}

/// `$f` (the allocating, `_into` or prepare form) called on stream `$s` with the inputs of `$up`,
/// the running statistics `$rm` and `$rv`, the scalars of `$case`, then the outputs if given.
macro_rules! with_inputs {
    ($f:ident($s:expr, $up:ident, $rm:expr, $rv:expr, $case:expr $(, $out:expr)*)) => {
        $f($s, &$up.input, &$up.mean, &$up.invstd, $rm, $rv, $case.momentum, $case.eps, &$up.counts $(, $out)*)
    };
}

struct Up {
    input: Tensor,
    mean: Tensor,
    invstd: Tensor,
    counts: Tensor,
    running_mean: Tensor,
    running_var: Tensor,
}

impl Up {
    fn run(&mut self, s: &Stream, case: &Case, running: bool) -> Result<(Tensor, Tensor)> {
        let (rm, rv) = if running { (Some(&mut self.running_mean), Some(&mut self.running_var)) } else { (None, None) };
        with_inputs!(batch_norm_gather_stats_with_counts(s, self, rm, rv, case))
    }

    fn run_into(&mut self, s: &Stream, case: &Case, mean_all: &mut Tensor, invstd_all: &mut Tensor) -> R {
        let (rm, rv) = (Some(&mut self.running_mean), Some(&mut self.running_var));
        with_inputs!(batch_norm_gather_stats_with_counts_into(s, self, rm, rv, case, mean_all, invstd_all))
    }
}

impl Framework for Case {
    const ACLNN: &'static str = "aclnnBatchNormGatherStatsWithCounts";
    const MOCK_WORKSPACE: bool = true;
    type Up = Up;
    two_output_framework_items!(channels_of: mean);

    fn small(seed: u64) -> Case {
        Case::random(seed, 3, 5, DType::F32, DType::F32)
    }

    fn mixed(seed: u64) -> Case {
        Case::random(seed, 4, 3, DType::F32, DType::BF16)
    }

    fn upload(&self, s: &Stream) -> Result<Up> {
        uploaded!(self, s => Up { input, mean, invstd, counts, running_mean, running_var })
    }

    fn run(&self, up: &mut Up, s: &Stream) -> Result<(Tensor, Tensor)> {
        up.run(s, self, true)
    }

    fn run_into(&self, up: &mut Up, s: &Stream, (m, v): &mut (Tensor, Tensor)) -> R {
        up.run_into(s, self, m, v)
    }

    fn prepare<'a>(&self, up: &'a mut Up, s: &Stream, (m, v): &'a mut (Tensor, Tensor)) -> Result<Prepared<'a>> {
        let (rm, rv) = (Some(&mut up.running_mean), Some(&mut up.running_var));
        with_inputs!(prepare_batch_norm_gather_stats_with_counts(s, up, rm, rv, self, m, v))
    }

    fn check(&self, _ctx: &Context, s: &Stream, what: &str, (m, v): &(Tensor, Tensor)) {
        check_global(s, what, self, (m, v));
    }

    /// The running statistics, updated in place.
    fn in_place_bits(s: &Stream, up: &Up) -> Vec<Vec<u32>> {
        vec![bits(s, &up.running_mean), bits(s, &up.running_var)]
    }
}

fn check_values(what: &str, w: usize, dtype: DType, got: &[f64], exp: &[f64], abs: &[f64], rel: f64) {
    let u_out = unit_roundoff(dtype);
    assert_eq!(got.len(), exp.len(), "{what}: length");
    for c in 0..exp.len() {
        let tol =
            2.0 * u_out * exp[c].abs() + rel * exp[c].abs() + 4.0 * (w as f64 + 2.0) * 6e-8 * abs[c] + tiny(dtype);
        assert!((got[c] - exp[c]).abs() <= tol, "{what}[{c}] ({dtype}): {} vs {} (tol {tol:e})", got[c], exp[c]);
    }
}

/// Checks the global outputs meanAll and invstdAll.
fn check_global(s: &Stream, what: &str, case: &Case, outs: (&Tensor, &Tensor)) {
    let e = case.expected();
    let w = case.mean.shape[0];
    let rel = 4.0 * (w as f64 + 6.0) * unit_roundoff(DType::F32);
    let zeros = vec![0.0; e.mean.len()];
    for o in [outs.0, outs.1] {
        assert_eq!(o.shape(), [case.mean.shape[1]], "{what}: shape");
    }
    check_values(&format!("{what} meanAll"), w, outs.0.dtype(), &read(s, outs.0), &e.mean, &e.cond_mean, 0.0);
    check_values(&format!("{what} invstdAll"), w, outs.1.dtype(), &read(s, outs.1), &e.invstd, &zeros, rel);
}

/// Checks the global outputs and, when `running`, the updated running statistics.
fn check_all(s: &Stream, what: &str, case: &Case, up: &Up, outs: (&Tensor, &Tensor), running: bool) {
    let e = case.expected();
    let w = case.mean.shape[0];
    let rel = 4.0 * (w as f64 + 6.0) * unit_roundoff(DType::F32);
    let zeros = vec![0.0; e.mean.len()];
    check_global(s, what, case, outs);
    let (rm, rv) = (read(s, &up.running_mean), read(s, &up.running_var));
    if running {
        let (dm, dv) = (case.running_mean.dtype, case.running_var.dtype);
        check_values(&format!("{what} runningMean"), w, dm, &rm, &e.running_mean, &e.cond_mean, 0.0);
        check_values(&format!("{what} runningVar"), w, dv, &rv, &e.running_var, &zeros, rel);
    } else {
        assert_eq!(rm, case.running_mean.values(), "{what}: runningMean must stay untouched");
        assert_eq!(rv, case.running_var.values(), "{what}: runningVar must stay untouched");
    }
}

/// Ranks [1, 2, 3] and [4, 5] (biased variances 2/3 and 1/4, eps 0): the union has mean 3,
/// biased variance 2, unbiased 2.5.
fn two_ranks_exact(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let inv = |v: f64| f64::from((1.0 / v.sqrt()) as f32);
    let case = Case {
        input: Data::filled(DType::F32, &[1, 1], 0.0),
        mean: Data::new(DType::F32, &[2.0, 4.5], &[2, 1]),
        invstd: Data::new(DType::F32, &[inv(2.0 / 3.0), inv(0.25)], &[2, 1]),
        counts: Data::new(DType::F32, &[3.0, 2.0], &[2]),
        running_mean: Data::filled(DType::F32, &[1], 1.0),
        running_var: Data::filled(DType::F32, &[1], 1.0),
        momentum: 0.5,
        eps: 0.0,
    };
    let mut up = case.upload(&s)?;
    let (m, i) = up.run(&s, &case, true)?;
    let close = |got: f32, want: f64| assert!(ulps(got, want as f32) <= 4, "{got} vs {want}");
    close(m.to_vec::<f32>(&s)?[0], 3.0);
    close(i.to_vec::<f32>(&s)?[0], 1.0 / 2f64.sqrt());
    close(up.running_mean.to_vec::<f32>(&s)?[0], 0.5 + 1.5);
    close(up.running_var.to_vec::<f32>(&s)?[0], 0.5 + 1.25);
    Ok(())
}

/// Every dtype of input × statistics; the allocating API's dtype is f16 iff input and mean are.
fn values_every_dtype_combination(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    for (i, dt_in) in DTYPES.into_iter().enumerate() {
        for (k, dt_stats) in DTYPES.into_iter().enumerate() {
            let case = Case::random((i * 3 + k) as u64, 2 + i + k, 3 + k, dt_in, dt_stats);
            let mut up = case.upload(&s)?;
            let (m, v) = up.run(&s, &case, true)?;
            let want = allocating_dtype(dt_in, dt_stats);
            assert_eq!((m.dtype(), v.dtype()), (want, want), "{dt_in}/{dt_stats}");
            assert_eq!(m.shape(), [case.mean.shape[1]]);
            check_all(&s, &format!("{dt_in}/{dt_stats}"), &case, &up, (&m, &v), true);
        }
    }
    Ok(())
}

/// `_into` with bf16/f16 strided outputs and f16 strided running statistics.
fn into_strided_outputs_and_running_dtypes(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let mut case = Case::random(20, 5, 4, DType::F32, DType::F32);
    case.running_mean = case.running_mean.cast(DType::F16).spread(2, 1, 9.0);
    case.running_var = case.running_var.cast(DType::BF16).spread(3, 0, 9.0);
    case.mean = case.mean.permuted(&[1, 0]);
    let mut up = case.upload(&s)?;
    let mut m = Data::filled(DType::BF16, &[4], 9.0).spread(2, 1, 7.0).tensor(&s)?;
    let mut v = Data::filled(DType::F16, &[4], 9.0).spread(3, 2, 7.0).tensor(&s)?;
    up.run_into(&s, &case, &mut m, &mut v)?;
    check_all(&s, "strided", &case, &up, (&m, &v), true);
    Ok(())
}

/// Per-rank stats of slices of one activation, gathered, equal the stats of the whole.
fn chained_with_batch_norm_stats(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let c = 3;
    let sizes = [4usize, 1, 7];
    let whole = Data::normal(&mut Rng::new(21), DType::F32, &[12, c, 10], 2.0, 1.5);
    let vals = whole.values();
    let (mut means, mut invstds, mut counts) = (vec![], vec![], vec![]);
    let mut start = 0;
    for &n in &sizes {
        let part = Data::new(DType::F32, &vals[start * c * 10..(start + n) * c * 10], &[n, c, 10]);
        let (m, i) = batch_norm_stats(&s, &part.tensor(&s)?, 1e-5)?;
        means.extend(m.to_vec::<f32>(&s)?);
        invstds.extend(i.to_vec::<f32>(&s)?);
        counts.push((n * 10) as f32);
        start += n;
    }
    let w = sizes.len();
    let input = whole.tensor(&s)?;
    let mean = Tensor::from_slice(&s, &means, &[w, c])?;
    let invstd = Tensor::from_slice(&s, &invstds, &[w, c])?;
    let counts = Tensor::from_slice(&s, &counts, &[w])?;
    let (gm, gi) = batch_norm_gather_stats_with_counts(&s, &input, &mean, &invstd, None, None, 0.1, 1e-5, &counts)?;
    let (wm, wi) = batch_norm_stats(&s, &input, 1e-5)?;
    for (a, b) in read(&s, &gm).iter().zip(read(&s, &wm)) {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "mean {a} vs {b}");
    }
    for (a, b) in read(&s, &gi).iter().zip(read(&s, &wi)) {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "invstd {a} vs {b}");
    }
    Ok(())
}

fn without_running_stats(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::random(22, 4, 6, DType::F16, DType::F16);
    let mut up = case.upload(&s)?;
    let (m, v) = up.run(&s, &case, false)?;
    assert_eq!(m.dtype(), DType::F16);
    check_all(&s, "no running", &case, &up, (&m, &v), false);
    Ok(())
}

/// W = 0: meanAll 0, invstdAll NaN, the running statistics untouched.
fn no_rank(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let mut case = Case::random(23, 1, 3, DType::F32, DType::F32);
    case.mean = Data::new(DType::F32, &[], &[0, 3]);
    case.invstd = Data::new(DType::F32, &[], &[0, 3]);
    case.counts = Data::new(DType::F32, &[], &[0]);
    let mut up = case.upload(&s)?;
    let (m, v) = up.run(&s, &case, true)?;
    assert_eq!(read(&s, &m), [0.0; 3]);
    assert!(read(&s, &v).iter().all(|x| x.is_nan()));
    assert_eq!(read(&s, &up.running_mean), case.running_mean.values());
    assert_eq!(read(&s, &up.running_var), case.running_var.values());
    Ok(())
}

fn rejected_calls_write_nothing(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::random(24, 3, 4, DType::F32, DType::F32);
    let mut up = case.upload(&s)?;
    let mut m = Data::filled(DType::F32, &[4], 42.0).tensor(&s)?;
    let mut v = Data::filled(DType::F32, &[4], 42.0).tensor(&s)?;
    let untouched = |up: &Up, m: &Tensor, v: &Tensor, what: &str| {
        assert_eq!(read(&s, &up.running_mean), case.running_mean.values(), "{what}: runningMean written");
        assert_eq!(read(&s, &up.running_var), case.running_var.values(), "{what}: runningVar written");
        assert!(read(&s, m).iter().chain(&read(&s, v)).all(|&x| x == 42.0), "{what}: an output written");
    };
    // one running statistic without the other
    for (with_mean, needle) in [(true, "without runningVar"), (false, "without runningMean")] {
        let Up { input, mean, invstd, counts, running_mean, running_var } = &mut up;
        let (rm, rv) = if with_mean { (Some(running_mean), None) } else { (None, Some(running_var)) };
        let err = batch_norm_gather_stats_with_counts_into(
            &s, input, mean, invstd, rm, rv, 0.1, 1e-5, counts, &mut m, &mut v,
        )
        .unwrap_err();
        assert_eq!(err.status(), Some(INVALID), "{err}");
        assert!(err.to_string().contains(needle) && err.to_string().contains("both or neither"), "{err}");
        untouched(&up, &m, &v, needle);
        let Up { input, mean, invstd, counts, running_mean, running_var } = &mut up;
        let (rm, rv) = if with_mean { (Some(running_mean), None) } else { (None, Some(running_var)) };
        let err = batch_norm_gather_stats_with_counts(&s, input, mean, invstd, rm, rv, 0.1, 1e-5, counts);
        assert_eq!(status_of(err), INVALID);
        untouched(&up, &m, &v, needle);
    }
    // bad shapes, each replacing one argument
    let t = |shape: &[usize]| Data::filled(DType::F32, shape, 1.0).tensor(&s);
    let bad: Vec<(&str, usize, Tensor)> = vec![
        ("input rank 1", 0, t(&[4])?),
        ("input rank 9", 0, t(&[1, 4, 1, 1, 1, 1, 1, 1, 1])?),
        ("input C 5", 0, t(&[2, 5])?),
        ("mean rank 1", 1, t(&[12])?),
        ("mean [3, 5]", 1, t(&[3, 5])?),
        ("invstd [2, 4]", 2, t(&[2, 4])?),
        ("invstd rank 3", 2, t(&[3, 4, 1])?),
        ("counts [4]", 3, t(&[4])?),
        ("counts [3, 1]", 3, t(&[3, 1])?),
        ("runningMean [5]", 4, t(&[5])?),
        ("runningVar [1, 4]", 5, t(&[1, 4])?),
        ("meanAll [3]", 6, t(&[3])?),
        ("invstdAll stride 0", 7, Tensor::from_slice_strided(&s, &[42f32], &[4], &[0], 0)?),
    ];
    for (what, slot, mut b) in bad {
        let Up { input, mean, invstd, counts, running_mean, running_var } = &mut up;
        let mut args: (&Tensor, &Tensor, &Tensor, &Tensor) = (input, mean, invstd, counts);
        let (mut rm, mut rv): (&mut Tensor, &mut Tensor) = (running_mean, running_var);
        let (mut mo, mut vo): (&mut Tensor, &mut Tensor) = (&mut m, &mut v);
        match slot {
            0 => args.0 = &b,
            1 => args.1 = &b,
            2 => args.2 = &b,
            3 => args.3 = &b,
            4 => rm = &mut b,
            5 => rv = &mut b,
            6 => mo = &mut b,
            _ => vo = &mut b,
        }
        let r = batch_norm_gather_stats_with_counts_into(
            &s,
            args.0,
            args.1,
            args.2,
            Some(rm),
            Some(rv),
            0.1,
            1e-5,
            args.3,
            mo,
            vo,
        );
        assert_eq!(status_of(r), INVALID, "{what}");
        untouched(&up, &m, &v, what);
    }
    Ok(())
}

/// The same call gives the same bits, through every entry point (the running statistics, updated
/// in place by each call, do not enter meanAll and invstdAll).
fn deterministic(ctx: &Context) -> R {
    common::framework::deterministic(ctx, Case::random(25, 8, 64, DType::F32, DType::F32))
}

/// The mock's own checks of what the safe API never passes: runningMean without runningVar
/// (CANN would write through the null runningVar: a violation and 161002), runningVar without
/// runningMean (CANN silently skips it: a violation, success), int32 counts (161002).
#[cfg(feature = "mock")]
#[test]
fn mock_checks_the_running_pair_and_counts_dtype() {
    use ascend_sys::aclDataType;
    let mut r = common::raw_mock::Mock::new();
    let api = r.c.operator(&ascend_sys::symbols::BATCH_NORM_GATHER_STATS_WITH_COUNTS).expect("exported");
    let f = aclDataType::ACL_FLOAT;
    let input = r.zeros(f, &[2, 3]);
    let (mean, invstd) = (r.zeros(f, &[1, 3]), r.zeros(f, &[1, 3]));
    let (counts, counts_i32) = (r.zeros(f, &[1]), r.zeros(aclDataType::ACL_INT32, &[1]));
    let (rm, rv, mo, io) = (r.zeros(f, &[3]), r.zeros(f, &[3]), r.zeros(f, &[3]), r.zeros(f, &[3]));
    let call = |rm: *mut ascend_sys::aclTensor, rv: *mut ascend_sys::aclTensor, counts: *mut ascend_sys::aclTensor| {
        let (mut ws, mut ex) = (0u64, std::ptr::null_mut());
        // SAFETY: live handles (or null where the operator allows it); valid out-pointers.
        let st = unsafe {
            api.aclnnBatchNormGatherStatsWithCountsGetWorkspaceSize(
                input, mean, invstd, rm, rv, 0.1, 1e-5, counts, mo, io, &mut ws, &mut ex,
            )
        };
        (st, ex)
    };
    let violations = || ascend::mock::stats().violations;
    let v0 = violations();
    assert_eq!(call(rm, std::ptr::null_mut(), counts).0, INVALID);
    assert_eq!(violations(), v0 + 1, "runningMean alone is a violation");
    assert_eq!(call(rm, rv, counts_i32).0, INVALID, "int32 counts");
    assert_eq!(violations(), v0 + 1);
    let (st, ex) = call(std::ptr::null_mut(), rv, counts);
    assert_eq!(st, 0, "CANN accepts runningVar alone");
    assert_eq!(violations(), v0 + 2, "runningVar alone is a violation");
    r.discard(ex);
    let (st, ex) = call(rm, rv, counts);
    assert_eq!((st, violations()), (0, v0 + 2));
    r.discard(ex);
}
