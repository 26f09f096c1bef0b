//! The operators' edges: exact element conversions, host allocations sized by a huge zero-stride
//! view, the scalar rule of eps/momentum and the sign of an empty counter's sum; then three rules
//! read in CANN's ops-nn sources that the mock once had wrong. Each began as a regression test of
//! a finding of audit 3 (`shared/reviews/audit-3.md`, F10-F16; the test names keep the number).
//!
//! Each runs on both backends where the call is cheap on both (the huge broadcast views run on the
//! CPU only: the mock, like CANN, would walk every one of their 2^40..2^50 elements).

mod common;

use ascend::ops::{self, OutputMask};
use ascend::{bf16, f16, Context, DType, Error, Result, Stream, Tensor};

const INVALID: i32 = 161002;

/// Holds the lock of the tests that read the mock's process-wide counters (`common::mock::isolated`
/// takes it too), so a test allocating on the mock never runs inside another's before/after snapshot.
fn serial() -> Option<std::sync::MutexGuard<'static, ()>> {
    #[cfg(feature = "mock")]
    return Some(common::mock::lock());
    #[cfg(not(feature = "mock"))]
    None
}

/// An i32 beyond 2^24 whose rounding to bf16 differs when it goes through f32 first: it rounds to
/// the f32 2^24 + 2^16, a bf16 tie that goes to even (2^24), while the exact value lies above the
/// tie and rounds up to 2^24 + 2^17.
const DOUBLE_ROUNDING: i32 = (1 << 24) + (1 << 16) + 1;

#[test]
fn f10_i32_tensors_round_trip_exactly_on_both_backends() {
    let _serial = serial();
    let v = [16_777_217i32, -16_777_219, 2_000_000_001, i32::MIN + 1, i32::MAX, DOUBLE_ROUNDING];
    for ctx in common::backends() {
        let s = ctx.new_stream().unwrap();
        let b = ctx.backend();
        let mut t = Tensor::from_slice(&s, &v, &[3, 2]).unwrap();
        assert_eq!(t.to_vec::<i32>(&s).unwrap(), v, "{b:?}: to_vec");
        let rev: Vec<i32> = v.iter().rev().copied().collect();
        t.copy_from_slice(&s, &rev).unwrap();
        assert_eq!(t.to_vec::<i32>(&s).unwrap(), rev, "{b:?}: contiguous copy_from_slice");
        // The transposed view of a [3, 2] storage: the strided read and the read-update-write.
        let mut tt = Tensor::from_slice_strided(&s, &v, &[2, 3], &[1, 2], 0).unwrap();
        assert_eq!(tt.to_vec::<i32>(&s).unwrap(), [v[0], v[2], v[4], v[1], v[3], v[5]], "{b:?}: strided to_vec");
        tt.copy_from_slice(&s, &v).unwrap();
        assert_eq!(tt.to_vec::<i32>(&s).unwrap(), v, "{b:?}: strided copy_from_slice");
        // Across dtypes: one rounding from the exact value.
        let want = bf16::from_f32(16_908_288.0);
        let one = Tensor::from_slice(&s, &[DOUBLE_ROUNDING], &[1]).unwrap();
        assert_eq!(one.to_vec::<bf16>(&s).unwrap(), [want], "{b:?}: i32 -> bf16 rounds once");
        let mut tb = Tensor::zeros(&s, DType::BF16, &[1]).unwrap();
        tb.copy_from_slice(&s, &[DOUBLE_ROUNDING]).unwrap();
        assert_eq!(tb.to_vec::<bf16>(&s).unwrap(), [want], "{b:?}: copy_from_slice::<i32> into bf16 rounds once");
        let mut ti = Tensor::zeros(&s, DType::I32, &[3]).unwrap();
        ti.copy_from_slice(&s, &[16_777_216f32, -2_147_483_648.0, 3.5]).unwrap();
        assert_eq!(ti.to_vec::<i32>(&s).unwrap(), [16_777_216, i32::MIN, 4], "{b:?}: f32 -> i32");
    }
}

/// A same-dtype copy is a byte copy: signalling NaNs with payloads survive `from_slice`,
/// `to_vec` and `copy_from_slice`, contiguous and strided, for every float dtype.
#[test]
fn f10_same_dtype_copies_keep_every_bit() {
    let _serial = serial();
    let f32s = [f32::from_bits(0x7f80_0001), f32::from_bits(0xff80_1234), 1.5, -0.0];
    let f16s = [f16::from_bits(0x7c01), f16::from_bits(0xfd55), f16::from_bits(0x0001), f16::NEG_ZERO];
    let bf16s = [bf16::from_bits(0x7f81), bf16::from_bits(0xff95), bf16::from_bits(0x0001), bf16::NEG_ZERO];
    for ctx in common::backends() {
        let s = ctx.new_stream().unwrap();
        let b = ctx.backend();
        fn check<T: ascend::Element>(s: &Stream, v: &[T; 4], bits: impl Fn(&T) -> u32, what: &str) {
            let want: Vec<u32> = v.iter().map(&bits).collect();
            let got = |t: &Tensor| -> Vec<u32> { t.to_vec::<T>(s).unwrap().iter().map(&bits).collect() };
            let mut t = Tensor::from_slice(s, v, &[2, 2]).unwrap();
            assert_eq!(got(&t), want, "{what}: from_slice + to_vec");
            let rev: Vec<T> = v.iter().rev().copied().collect();
            t.copy_from_slice(s, &rev).unwrap();
            assert_eq!(got(&t), want.iter().rev().copied().collect::<Vec<_>>(), "{what}: copy_from_slice");
            let mut tt = Tensor::from_slice_strided(s, v, &[2, 2], &[1, 2], 0).unwrap();
            assert_eq!(got(&tt), [want[0], want[2], want[1], want[3]], "{what}: strided to_vec");
            tt.copy_from_slice(s, v).unwrap();
            assert_eq!(got(&tt), want, "{what}: strided copy_from_slice");
        }
        check(&s, &f32s, |v| v.to_bits(), &format!("{b:?} f32"));
        check(&s, &f16s, |v| u32::from(v.to_bits()), &format!("{b:?} f16"));
        check(&s, &bf16s, |v| u32::from(v.to_bits()), &format!("{b:?} bf16"));
    }
}

/// A call on a huge broadcast view must return, either with the right values or with
/// [`Error::HostAlloc`]; the old code aborted the process ("memory allocation of ... failed").
fn returned<T>(r: Result<T>, what: &str) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(Error::HostAlloc { .. }) => None,
        Err(e) => panic!("{what}: expected Ok or Error::HostAlloc, got {e}"),
    }
}

/// 2^40 ranks, all the same row (stride 0 in mean, invstd and counts).
#[test]
fn f11_gather_stats_with_a_huge_broadcast_rank_dim_returns_instead_of_aborting() {
    let _serial = serial();
    let s = Context::cpu().new_stream().unwrap();
    let w = 1usize << 40;
    let input = Tensor::from_slice(&s, &[1f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let mean = Tensor::from_slice_strided(&s, &[0.5f32, -1.5], &[w, 2], &[0, 1], 0).unwrap();
    let invstd = Tensor::from_slice_strided(&s, &[2f32, 0.25], &[w, 2], &[0, 1], 0).unwrap();
    let counts = Tensor::from_slice_strided(&s, &[3f32], &[w], &[0], 0).unwrap();
    let mut rm = Tensor::from_slice(&s, &[0.25f32, 1.0], &[2]).unwrap();
    let mut rv = Tensor::from_slice(&s, &[2f32, 0.5], &[2]).unwrap();
    let (eps, momentum) = (1e-5, 0.1);
    let r = ops::batch_norm_gather_stats_with_counts(
        &s,
        &input,
        &mean,
        &invstd,
        Some(&mut rm),
        Some(&mut rv),
        momentum,
        eps,
        &counts,
    );
    if let Some((m, i)) = returned(r, "gather") {
        // Every rank alike: the global mean and invstd are one rank's.
        let close = |got: f32, want: f64| (f64::from(got) - want).abs() <= 1e-6 * want.abs();
        let (m, i) = (m.to_vec::<f32>(&s).unwrap(), i.to_vec::<f32>(&s).unwrap());
        assert!(close(m[0], 0.5) && close(m[1], -1.5), "meanAll {m:?}");
        assert!(close(i[0], 2.0) && close(i[1], 0.25), "invstdAll {i:?}");
        let n = 3.0 * w as f64;
        let unbiased = |inv: f64| (1.0 / (inv * inv) - eps) * n / (n - 1.0);
        let (rm, rv) = (rm.to_vec::<f32>(&s).unwrap(), rv.to_vec::<f32>(&s).unwrap());
        assert!(close(rm[0], 0.9 * 0.25 + 0.1 * 0.5) && close(rm[1], 0.9 - 0.15), "runningMean {rm:?}");
        assert!(close(rv[0], 0.9 * 2.0 + 0.1 * unbiased(2.0)), "runningVar {rv:?}");
        assert!(close(rv[1], 0.9 * 0.5 + 0.1 * unbiased(0.25)), "runningVar {rv:?}");
    }
}

/// A counter of 2^40 ranks over one element (stride 0): nothing ties W to the input.
#[test]
fn f12_elemt_backward_with_a_huge_broadcast_counter_returns_instead_of_aborting() {
    let _serial = serial();
    let s = Context::cpu().new_stream().unwrap();
    let w = 1usize << 40;
    let mut rng = common::Rng::new(12);
    let shape = [3, 2, 4];
    let dy = common::Data::normal(&mut rng, DType::F32, &shape, 0.0, 1.0).tensor(&s).unwrap();
    let x = common::Data::normal(&mut rng, DType::F32, &shape, 0.5, 1.0).tensor(&s).unwrap();
    let c = |v: [f32; 2]| Tensor::from_slice(&s, &v, &[2]).unwrap();
    let (mean, invstd, sum_dy, sum_dy_xmu) = (c([0.4, -0.5]), c([1.5, 0.7]), c([3e12, -1e12]), c([2e12, 5e11]));
    let counter = Tensor::from_slice_strided(&s, &[2f32], &[w], &[0], 0).unwrap();
    // N = 2^41, exactly an f32: the same call with a one-element counter holding N.
    let one = Tensor::from_slice(&s, &[(2 * w) as f32], &[1]).unwrap();
    let run = |counter: &Tensor| {
        ops::batch_norm_elemt_backward(&s, &dy, &x, &mean, &invstd, None, &sum_dy, &sum_dy_xmu, counter)
    };
    if let Some(got) = returned(run(&counter), "elemt_backward") {
        let want = run(&one).unwrap();
        assert_eq!(common::bits(&s, &got), common::bits(&s, &want));
    }
}

/// 2^50 positions of one element.
#[test]
fn f13_batch_norm_stats_of_a_huge_broadcast_input_returns_instead_of_aborting() {
    let _serial = serial();
    let s = Context::cpu().new_stream().unwrap();
    let input = Tensor::from_slice_strided(&s, &[1.5f32], &[1 << 50, 1], &[0, 0], 0).unwrap();
    let eps = 1e-5;
    if let Some((m, i)) = returned(ops::batch_norm_stats(&s, &input, eps), "batch_norm_stats") {
        assert_eq!(m.to_vec::<f32>(&s).unwrap(), [1.5]);
        // CANN's kernel takes eps as f32, and so does the CPU backend.
        assert_eq!(i.to_vec::<f32>(&s).unwrap(), [(1.0 / f64::from(eps as f32).sqrt()) as f32]);
    }
    // Broadcast over a spatial dim of a real [2, 3] input: the same moments as the input itself.
    let v = [1f32, -2.0, 3.5, 0.25, 7.0, -1.0];
    let plain = Tensor::from_slice(&s, &v, &[2, 3, 1]).unwrap();
    let wide = Tensor::from_slice_strided(&s, &v, &[2, 3, 1 << 45], &[3, 1, 0], 0).unwrap();
    let (pm, pi) = ops::batch_norm_stats(&s, &plain, eps).unwrap();
    if let Some((wm, wi)) = returned(ops::batch_norm_stats(&s, &wide, eps), "batch_norm_stats") {
        let close = |a: Vec<f32>, b: Vec<f32>| a.iter().zip(&b).all(|(a, b)| (a - b).abs() <= 1e-6 * b.abs());
        assert!(close(wm.to_vec(&s).unwrap(), pm.to_vec(&s).unwrap()), "mean");
        assert!(close(wi.to_vec(&s).unwrap(), pi.to_vec(&s).unwrap()), "invstd");
    }
}

/// 2^50 positions of one element through the reduction kernel.
#[test]
fn f14_reduce_backward_of_a_huge_broadcast_input_returns_instead_of_aborting() {
    let _serial = serial();
    let s = Context::cpu().new_stream().unwrap();
    let dy = Tensor::from_slice_strided(&s, &[0.5f32], &[1 << 50, 1], &[0, 0], 0).unwrap();
    let x = Tensor::from_slice_strided(&s, &[2f32], &[1 << 50, 1], &[0, 0], 0).unwrap();
    let one = Tensor::from_slice(&s, &[1f32], &[1]).unwrap();
    let r = ops::batch_norm_reduce_backward(&s, &dy, &x, &one, &one, None, OutputMask::ALL);
    if let Some(out) = returned(r, "batch_norm_reduce_backward") {
        let want = 0.5 * (1u64 << 50) as f64;
        let got = common::read(&s, out.sum_dy.as_ref().unwrap());
        assert!((got[0] - want).abs() <= 1e-6 * want, "sumDy {got:?}");
    }
}

/// eps and momentum must be finite in f32 (CANN computes with them in f32), in every operator
/// that takes them; at the edge (f32::MAX) they are accepted on both backends alike.
#[test]
fn f15_eps_and_momentum_beyond_f32_give_the_same_outcome_on_both_backends() {
    let _serial = serial();
    let beyond = [1e39, -1e39, f64::INFINITY, f64::NAN, f64::MAX];
    for ctx in common::backends() {
        let s = ctx.new_stream().unwrap();
        let b = ctx.backend();
        let x = Tensor::from_slice(&s, &[1f32, 2.0, 3.0, 5.0], &[2, 2]).unwrap();
        let rows = Tensor::from_slice(&s, &[1f32, 2.0], &[1, 2]).unwrap();
        let counts = Tensor::from_slice(&s, &[4f32], &[1]).unwrap();
        let ones = Tensor::from_slice(&s, &[1f32, 1.0], &[2]).unwrap();
        let status = |r: Result<()>| r.err().and_then(|e| e.status());
        let mut rm = Tensor::from_slice(&s, &[0.5f32, 0.25], &[2]).unwrap();
        let mut rv = Tensor::from_slice(&s, &[1f32, 2.0], &[2]).unwrap();
        let gather = |rm: &mut Tensor, rv: &mut Tensor, momentum: f64, eps: f64| {
            ops::batch_norm_gather_stats_with_counts(&s, &x, &rows, &rows, Some(rm), Some(rv), momentum, eps, &counts)
        };
        for v in beyond {
            assert_eq!(status(ops::batch_norm_stats(&s, &x, v).map(drop)), Some(INVALID), "{b:?} stats eps {v}");
            let eps_status = status(gather(&mut rm, &mut rv, 0.1, v).map(drop));
            assert_eq!(eps_status, Some(INVALID), "{b:?} gather eps {v}");
            let momentum_status = status(gather(&mut rm, &mut rv, v, 1e-5).map(drop));
            assert_eq!(momentum_status, Some(INVALID), "{b:?} gather momentum {v}");
            assert_eq!(
                status(ops::batch_norm_elemt(&s, &x, None, None, &ones, &ones, v).map(drop)),
                Some(INVALID),
                "{b:?} elemt eps {v}"
            );
        }
        // Nothing was written by the rejected calls.
        assert_eq!(rm.to_vec::<f32>(&s).unwrap(), [0.5, 0.25], "{b:?}");
        assert_eq!(rv.to_vec::<f32>(&s).unwrap(), [1.0, 2.0], "{b:?}");
        // The edge: the largest f32 is accepted everywhere (the values are infinite or NaN).
        let edge = f64::from(f32::MAX);
        assert!(ops::batch_norm_stats(&s, &x, edge).is_ok(), "{b:?}");
        let r = gather(&mut rm, &mut rv, edge, edge);
        assert!(r.is_ok(), "{b:?}: {r:?}");
        assert!(ops::batch_norm_elemt(&s, &x, None, None, &ones, &ones, edge).is_ok(), "{b:?}");
    }
}

/// An empty counter sums to +0 (as CANN's f32 sum starting at 0.0), not Rust's float `Sum`
/// identity −0: N = +0 makes sumDy/N = +inf, so the gradients are −inf (and NaN where x = mean).
#[test]
fn f16_an_empty_counter_gives_the_same_values_on_both_backends() {
    let _serial = serial();
    let mut got = Vec::new();
    for ctx in common::backends() {
        let s = ctx.new_stream().unwrap();
        let t = Tensor::from_slice(&s, &[1f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
        let one = Tensor::from_slice(&s, &[1f32, 1.0], &[2]).unwrap();
        for counter in
            [Tensor::from_slice(&s, &[0f32; 0], &[0]).unwrap(), Tensor::from_slice(&s, &[0i32; 0], &[0, 1]).unwrap()]
        {
            let gi = ops::batch_norm_elemt_backward(&s, &t, &t, &one, &one, None, &one, &one, &counter).unwrap();
            let v = gi.to_vec::<f32>(&s).unwrap();
            assert!(v[0].is_nan() && v[1..] == [f32::NEG_INFINITY; 3], "{:?}: {v:?}", ctx.backend());
            got.push(common::bits(&s, &gi));
        }
    }
    assert!(got.windows(2).all(|w| w[0][1..] == w[1][1..]), "{got:?}");
}

// ---------------------------------------------------------------------------------------------
// The mock against CANN's own sources (ops-nn)

/// `aclnnBatchNormElemtBackward` without weight fills an f32 ones weight (ops-nn `FillScalar`,
/// `norm/norm_common/op_host/op_api/norm_tensor_util.cpp`), so f16 inputs compute in f32: the
/// result is the one with an explicit f32 ones weight, bit for bit, on both backends.
#[test]
fn cann_rule_elemt_backward_without_weight_computes_f16_inputs_in_f32() {
    let _serial = serial();
    for ctx in common::backends() {
        let s = ctx.new_stream().unwrap();
        let mut rng = common::Rng::new(29);
        let shape = [16, 2, 4];
        let h = |rng: &mut common::Rng, shape: &[usize], mu: f64, sigma: f64| {
            common::Data::normal(rng, DType::F16, shape, mu, sigma).tensor(&s).unwrap()
        };
        let (dy, x) = (h(&mut rng, &shape, 0.0, 1.0), h(&mut rng, &shape, 0.3, 1.5));
        let (mean, sum_dy, sum_dy_xmu) =
            (h(&mut rng, &[2], 0.3, 0.2), h(&mut rng, &[2], 3.0, 4.0), h(&mut rng, &[2], -5.0, 4.0));
        let invstd = common::Data::uniform(&mut rng, DType::F16, &[2], 0.5, 1.5).tensor(&s).unwrap();
        let counter = Tensor::from_slice(&s, &[48f32, 80.0], &[2]).unwrap();
        let ones = Tensor::from_slice(&s, &[1f32, 1.0], &[2]).unwrap();
        let run = |w: Option<&Tensor>| {
            let gi =
                ops::batch_norm_elemt_backward(&s, &dy, &x, &mean, &invstd, w, &sum_dy, &sum_dy_xmu, &counter).unwrap();
            common::bits(&s, &gi)
        };
        assert_eq!(run(None), run(Some(&ones)), "{:?}", ctx.backend());
    }
}

#[cfg(feature = "mock")]
mod raw_formats {
    use super::INVALID;
    use crate::common::raw_mock::Mock;
    use ascend::sys::{aclFormat, symbols};

    const PRIVATE: aclFormat = aclFormat::ACL_FORMAT_NC1HWC0;
    const ND: aclFormat = aclFormat::ACL_FORMAT_ND;

    /// `aclnnBatchNormElemt` checks the format of input only (private: 161002) and that output's
    /// equals it (ops-nn `norm/batch_norm_elemt/op_host/op_api/aclnn_batch_norm_elemt.cpp`,
    /// `CheckFormat(input, output)`): a private format on mean, invstd, weight or bias is accepted.
    #[test]
    fn cann_rule_elemt_checks_only_the_input_format() {
        crate::common::raw_mock::isolated(|raw| {
            let api = raw.c.operator(&symbols::BATCH_NORM_ELEMT).expect("the mock exports it");
            let x_v = [1f32, -2.0, 0.5, 3.0];
            let phase1 = |raw: &mut Mock, fx, fstat| {
                let x = raw.f32s_in(fx, &[2, 2], &x_v);
                let out = raw.f32s_in(fx, &[2, 2], &[0.0; 4]);
                let mean = raw.f32s_in(fstat, &[2], &[0.5, -0.5]);
                let invstd = raw.f32s_in(fstat, &[2], &[2.0, 0.5]);
                let weight = raw.f32s_in(fstat, &[2], &[1.5, 1.0]);
                let bias = raw.f32s_in(fstat, &[2], &[0.25, 0.0]);
                let (mut ws, mut ex) = (0u64, std::ptr::null_mut());
                // SAFETY: live handles of this session; the out-pointers are valid locals.
                let st = unsafe {
                    api.aclnnBatchNormElemtGetWorkspaceSize(x, weight, bias, mean, invstd, 1e-5, out, &mut ws, &mut ex)
                };
                (st, ex, out)
            };
            let (st, ex, out) = phase1(raw, ND, PRIVATE);
            assert_eq!(st, 0, "a private format on mean, invstd, weight and bias is accepted");
            let null = std::ptr::null_mut();
            // SAFETY: the executor is fresh from phase 1; workspace 0 with null; default stream.
            assert_eq!(unsafe { api.aclnnBatchNormElemt(null, 0, ex, null) }, 0);
            let got = raw.read_f32(out);
            let want = [(1.0 - 0.5) * 2.0 * 1.5 + 0.25, (-2.0 + 0.5) * 0.5, (0.5 - 0.5) * 3.0 + 0.25, 3.5 * 0.5];
            assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() <= 1e-5), "{got:?}");
            let (st, ex, _) = phase1(raw, PRIVATE, ND);
            assert_eq!((st, ex.is_null()), (INVALID, true), "a private input format is refused");
        });
    }

    /// `aclnnBatchNormGatherStatsWithCounts` checks the formats of input, mean, invstd and counts
    /// only (ops-nn `norm/sync_batch_norm_gather_stats_with_counts/op_host/op_api/
    /// aclnn_batch_norm_gather_stats_with_counts.cpp`, `CheckFormat`): a private format on
    /// meanAll, invstdAll, runningMean or runningVar is accepted.
    #[test]
    fn cann_rule_gather_checks_only_the_formats_of_input_mean_invstd_and_counts() {
        crate::common::raw_mock::isolated(|raw| {
            let api = raw.c.operator(&symbols::BATCH_NORM_GATHER_STATS_WITH_COUNTS).expect("the mock exports it");
            let phase1 = |raw: &mut Mock, fin, fout| {
                let x = raw.f32s_in(fin, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
                let mean = raw.f32s_in(fin, &[1, 2], &[0.5, -1.5]);
                let invstd = raw.f32s_in(fin, &[1, 2], &[2.0, 0.25]);
                let counts = raw.f32s_in(fin, &[1], &[3.0]);
                let rm = raw.f32s_in(fout, &[2], &[0.0, 0.0]);
                let rv = raw.f32s_in(fout, &[2], &[1.0, 1.0]);
                let mean_all = raw.f32s_in(fout, &[2], &[0.0, 0.0]);
                let invstd_all = raw.f32s_in(fout, &[2], &[0.0, 0.0]);
                let (mut ws, mut ex) = (0u64, std::ptr::null_mut());
                // SAFETY: live handles of this session; the out-pointers are valid locals.
                let st = unsafe {
                    api.aclnnBatchNormGatherStatsWithCountsGetWorkspaceSize(
                        x, mean, invstd, rm, rv, 0.1, 1e-5, counts, mean_all, invstd_all, &mut ws, &mut ex,
                    )
                };
                (st, ws, ex, mean_all)
            };
            let (st, ws, ex, mean_all) = phase1(raw, ND, PRIVATE);
            assert_eq!(st, 0, "a private format on meanAll, invstdAll, runningMean and runningVar is accepted");
            let mut mem = std::ptr::null_mut();
            if ws > 0 {
                let policy = ascend::sys::aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST;
                // SAFETY: `mem` is a valid out-pointer.
                assert_eq!(unsafe { raw.c.acl.aclrtMalloc(&mut mem, ws as usize, policy) }, 0);
            }
            // SAFETY: the executor is fresh from phase 1 with a workspace of its size; default stream.
            assert_eq!(unsafe { api.aclnnBatchNormGatherStatsWithCounts(mem, ws, ex, std::ptr::null_mut()) }, 0);
            assert_eq!(raw.read_f32(mean_all), [0.5, -1.5]);
            if !mem.is_null() {
                // SAFETY: the allocation above, no longer used (read_f32 synchronised the stream).
                unsafe { raw.c.acl.aclrtFree(mem) };
            }
            let (st, _, ex, _) = phase1(raw, PRIVATE, ND);
            assert_eq!(
                (st, ex.is_null()),
                (INVALID, true),
                "a private format on input, mean, invstd or counts is refused"
            );
        });
    }
}
