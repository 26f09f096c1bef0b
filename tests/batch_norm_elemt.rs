//! Acceptance tests of `ops::batch_norm_elemt` (`aclnnBatchNormElemt`), one body per case run on
//! both backends: `cpu::<case>` always, `mock::<case>` (Ascend over the mock CANN) with
//! `--features mock`, each mock run isolated (serialised, then checked for no leak and no mock
//! violation).
//!
//! Values are checked against an independent f64 reference, `(x − mean)·|invstd|·weight + bias`
//! (CANN rebuilds the variance from invstd², so a negative invstd acts as its magnitude)
//! computed per multi-index through each tensor's strides, with per-element tolerances
//! `|got − exact| ≤ u_out·|exact| + K·2⁻²⁴·T + tiny(out)`, where `u_out` is half an ulp of the
//! output dtype (2⁻²⁴ f32, 2⁻¹¹ f16, 2⁻⁸ bf16) and `T = |x − mean|·|invstd·weight|·(1 + eps·invstd²)
//! + |bias|` bounds the f32 computation:
//! * CPU, K = 6: the documented kernel bound is 4·2⁻²⁴·|x − mean|·|scale| + 2⁻²⁴·|bias|.
//! * mock, K = 16: the NPU's f32 round trip (`var = 1/invstd² − eps`, `1/sqrt(var + eps)`) adds
//!   about six roundings of the scale, plus the cancellation term `eps·invstd²`.
//!
//! A misread element, a wrong channel or a skipped weight is off by O(1): far beyond these.

mod common;

use ascend::ops::{batch_norm_elemt, batch_norm_elemt_into, prepare_batch_norm_elemt, Prepared};
use ascend::{Backend, Context, DType, Result, Stream, Tensor};
use common::*;

type R = Result<()>;

framework_tests!(Case);

on_both_backends!(
    local: [
        every_dtype_combination,
        weight_or_bias_alone,
        layouts,
        strided_outputs,
        ranks_2_to_8,
        large_inputs_use_the_threaded_path,
        empty_inputs,
        bad_arguments,
        bad_eps,
        deterministic,
        eps_round_trip,
        negative_invstd_acts_as_its_magnitude,
        nan_and_inf_propagate,
    ],
    cross: [tensors_from_the_other_backend],
);

// ---------------------------------------------------------------------------------------------
// Fixture and reference

/// The op's inputs as host data.
#[derive(Clone, Debug)]
struct Case {
    x: Data,
    weight: Option<Data>,
    bias: Option<Data>,
    mean: Data,
    invstd: Data,
    eps: f64,
}

impl Case {
    /// x ~ N(0.5, 1) in `xdt`; mean ~ U(0.3, 0.7), invstd ~ U(0.5, 2) in `sdt`; weight ~ N(1, 0.5)
    /// and bias ~ N(0, 1) in `wdt` (absent for None).
    fn random(seed: u64, shape: &[usize], xdt: DType, sdt: DType, wdt: Option<DType>) -> Case {
        let mut rng = Rng::new(seed);
        let c = shape[1];
        Case {
            x: Data::normal(&mut rng, xdt, shape, 0.5, 1.0),
            mean: Data::uniform(&mut rng, sdt, &[c], 0.3, 0.7),
            invstd: Data::uniform(&mut rng, sdt, &[c], 0.5, 2.0),
            weight: wdt.map(|d| Data::normal(&mut rng, d, &[c], 1.0, 0.5)),
            bias: wdt.map(|d| Data::normal(&mut rng, d, &[c], 0.0, 1.0)),
            eps: 1e-5,
        }
    }

    /// The exact values (row-major) and the bound terms T of each element.
    fn expected(&self) -> (Vec<f64>, Vec<f64>) {
        let (mean, invstd) = (self.mean.values(), self.invstd.values());
        let c = mean.len();
        let weight = self.weight.as_ref().map_or(vec![1.0; c], Data::values);
        let bias = self.bias.as_ref().map_or(vec![0.0; c], Data::values);
        let (mut exp, mut terms) = (Vec::new(), Vec::new());
        for_each_index(&self.x.shape, |i| {
            let ch = i[1];
            let xmu = self.x.get(i) - mean[ch];
            let scale = invstd[ch].abs() * weight[ch]; // CANN loses invstd's sign (module docs)
            exp.push(xmu * scale + bias[ch]);
            let round_trip = 1.0 + self.eps * invstd[ch] * invstd[ch];
            terms.push(xmu.abs() * scale.abs() * round_trip + bias[ch].abs());
        });
        (exp, terms)
    }

    fn upload(&self, s: &Stream) -> Result<Up> {
        uploaded!(self, s => Up { x, mean, invstd; optional: weight, bias; copied: eps })
    }
}

/// Uploaded inputs.
struct Up {
    x: Tensor,
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    mean: Tensor,
    invstd: Tensor,
    eps: f64,
}

impl Up {
    fn run(&self, s: &Stream) -> Result<Tensor> {
        batch_norm_elemt(s, &self.x, self.weight.as_ref(), self.bias.as_ref(), &self.mean, &self.invstd, self.eps)
    }

    fn run_into(&self, s: &Stream, out: &mut Tensor) -> Result<()> {
        batch_norm_elemt_into(
            s,
            &self.x,
            self.weight.as_ref(),
            self.bias.as_ref(),
            &self.mean,
            &self.invstd,
            self.eps,
            out,
        )
    }

    fn prepare<'a>(&'a self, s: &Stream, out: &'a mut Tensor) -> Result<Prepared<'a>> {
        let (w, b) = (self.weight.as_ref(), self.bias.as_ref());
        prepare_batch_norm_elemt(s, &self.x, w, b, &self.mean, &self.invstd, self.eps, out)
    }
}

impl Framework for Case {
    const ACLNN: &'static str = "aclnnBatchNormElemt";
    const MOCK_WORKSPACE: bool = false;

    fn small(seed: u64) -> Case {
        Case::random(seed, &[2, 3, 4], DType::F32, DType::F32, Some(DType::F32))
    }

    fn mixed(seed: u64) -> Case {
        Case::random(seed, &[2, 3, 4, 5], DType::F16, DType::F32, Some(DType::BF16))
    }

    one_output_framework_items!(output_dtype_of: x);
}

/// The tolerance factor K of the module docs for `ctx`'s backend.
fn k_factor(ctx: &Context) -> f64 {
    match ctx.backend() {
        Backend::Cpu => 6.0,
        _ => 16.0,
    }
}

/// Asserts that `out` has the case's shape, dtype `dtype` and values within tolerance.
fn check(ctx: &Context, s: &Stream, what: &str, out: &Tensor, dtype: DType, case: &Case) {
    let got = read_checked(s, what, out, &case.x.shape, dtype);
    let (exp, terms) = case.expected();
    let k = k_factor(ctx);
    let tol =
        |i: usize, e: f64| unit_roundoff(dtype) * e.abs() + k * unit_roundoff(DType::F32) * terms[i] + tiny(dtype);
    assert_elements(what, dtype, &got, &exp, tol);
}

// ---------------------------------------------------------------------------------------------
// Values

/// Every dtype of input (and output), of mean/invstd and of weight/bias (or none) on its own:
/// mixed dtypes such as bf16 activations with f32 statistics (what torch passes) included.
fn every_dtype_combination(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let weights = [None, Some(DType::F32), Some(DType::F16), Some(DType::BF16)];
    for (seed, ([xdt, sdt], wdt)) in (1..).zip(product(dtype_tuples(), weights)) {
        let case = Case::random(seed, &[2, 3, 5], xdt, sdt, wdt);
        let out = case.upload(&s)?.run(&s)?;
        check(ctx, &s, &format!("x {xdt}, stats {sdt}, weight/bias {wdt:?}"), &out, xdt, &case);
    }
    Ok(())
}

/// A weight without bias and a bias without weight (defaults 1 and 0).
fn weight_or_bias_alone(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let full = Case::random(20, &[3, 4, 6], DType::F32, DType::F32, Some(DType::F32));
    let weight_only = Case { bias: None, ..full.clone() };
    let bias_only = Case { weight: None, ..full.clone() };
    for (what, case) in [("weight only", &weight_only), ("bias only", &bias_only), ("both", &full)] {
        check(ctx, &s, what, &case.upload(&s)?.run(&s)?, DType::F32, case);
    }
    Ok(())
}

/// Inputs in every layout: contiguous, channels-last, transposed, spread with an offset, strided
/// per-channel vectors; the allocating result is contiguous.
fn layouts(ctx: &Context) -> R {
    let base = Case::random(30, &[2, 5, 3, 4], DType::F32, DType::F32, Some(DType::F32));
    let spread_stats = |c: &Case| Case {
        mean: c.mean.spread(3, 1, 99.0),
        invstd: c.invstd.spread(2, 0, 99.0),
        weight: c.weight.as_ref().map(|w| w.spread(2, 5, 99.0)),
        bias: c.bias.as_ref().map(|b| b.spread(4, 2, 99.0)),
        ..c.clone()
    };
    let rank3 = Case::random(31, &[3, 4, 5], DType::BF16, DType::F32, Some(DType::F16));
    let cases = [
        ("contiguous", base.clone()),
        ("channels-last", Case { x: base.x.permuted(&[0, 2, 3, 1]), ..base.clone() }),
        ("channels-first storage", Case { x: base.x.permuted(&[1, 0, 2, 3]), ..base.clone() }),
        ("spread", Case { x: base.x.spread(3, 7, -5.0), ..base.clone() }),
        ("strided stats", spread_stats(&base)),
        ("transposed rank 3", Case { x: rank3.x.permuted(&[2, 1, 0]), ..rank3.clone() }),
        ("channels-last f16", {
            let c = Case::random(32, &[3, 70, 2, 3], DType::F16, DType::F32, None);
            Case { x: c.x.permuted(&[0, 2, 3, 1]), ..c }
        }),
    ];
    common::framework::allocating_results(ctx, cases)
}

/// `_into` writes outputs of any non-overlapping layout (channels-last, spread, transposed).
fn strided_outputs(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::random(40, &[2, 3, 4, 5], DType::F16, DType::F32, Some(DType::BF16));
    let sentinel = Data::filled(DType::F16, &case.x.shape, 777.0);
    common::framework::strided_outputs(ctx, &case, &sentinel)?;
    // A channels-last input into a channels-last output (the dense same-order path).
    let cl = Case { x: case.x.permuted(&[0, 2, 3, 1]), ..case.clone() };
    let mut out = sentinel.permuted(&[0, 2, 3, 1]).tensor(&s)?;
    cl.upload(&s)?.run_into(&s, &mut out)?;
    check(ctx, &s, "channels-last into channels-last", &out, DType::F16, &cl);
    Ok(())
}

/// Ranks 2 to 8 (channels at dim 1 throughout).
fn ranks_2_to_8(ctx: &Context) -> R {
    common::framework::ranks_2_to_8(ctx, |rank, shape| {
        Case::random(50 + rank, shape, DType::F32, DType::F32, Some(DType::F32))
    })
}

/// Inputs above the CPU's threading threshold (1 MiB read and written), contiguous and
/// channels-last, f32 and f16.
fn large_inputs_use_the_threaded_path(ctx: &Context) -> R {
    let cases = [(DType::F32, false), (DType::F16, true)].map(|(dt, cl)| {
        let case = Case::random(60, &[4, 24, 48, 64], dt, DType::F32, Some(DType::F32));
        let case = if cl { Case { x: case.x.permuted(&[0, 2, 3, 1]), ..case } } else { case };
        (format!("large {dt} channels-last {cl}"), case)
    });
    common::framework::large_inputs(ctx, cases)
}

/// An empty input (batch 0, or an empty spatial dim) computes nothing and succeeds.
fn empty_inputs(ctx: &Context) -> R {
    common::framework::empty_inputs(ctx, |shape| Case::random(70, shape, DType::F32, DType::F32, Some(DType::F32)))
}

// ---------------------------------------------------------------------------------------------
// Bad arguments

/// Every invalid argument is 161002 naming it, in the allocating, `_into` and prepare forms, and
/// the rejected calls write nothing.
fn bad_arguments(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::random(80, &[2, 3, 4], DType::F32, DType::F32, Some(DType::F32));
    let up = case.upload(&s)?;
    let t = |shape: &[usize]| Tensor::zeros(&s, DType::F32, shape);
    let sentinel = Data::filled(DType::F32, &[2, 3, 4], 777.0);
    // (what, input, weight, bias, mean, invstd, the argument named)
    let rank1 = t(&[6])?;
    let rank9 = t(&[1, 3, 1, 1, 1, 1, 1, 1, 1])?;
    let zero_c = t(&[2, 0, 4])?;
    let c4 = t(&[4])?;
    let c3x1 = t(&[3, 1])?;
    let c1 = t(&[1])?;
    type Args<'a> = (&'a str, &'a Tensor, Option<&'a Tensor>, Option<&'a Tensor>, &'a Tensor, &'a Tensor, &'a str);
    let (w, b) = (up.weight.as_ref(), up.bias.as_ref());
    let cases: [Args<'_>; 8] = [
        ("rank 1 input", &rank1, None, None, &up.mean, &up.invstd, "input"),
        ("rank 9 input", &rank9, None, None, &up.mean, &up.invstd, "input"),
        ("zero channels", &zero_c, None, None, &c1, &c1, "input"),
        ("long mean", &up.x, w, b, &c4, &up.invstd, "mean"),
        ("2-D invstd", &up.x, w, b, &up.mean, &c3x1, "invstd"),
        ("short weight", &up.x, Some(&c1), b, &up.mean, &up.invstd, "weight"),
        ("long bias", &up.x, w, Some(&c4), &up.mean, &up.invstd, "bias"),
        ("2-D bias", &up.x, w, Some(&c3x1), &up.mean, &up.invstd, "bias"),
    ];
    for (what, x, w, b, mean, invstd, arg) in cases {
        expect_invalid(what, batch_norm_elemt(&s, x, w, b, mean, invstd, 1e-5), arg);
        let mut out = sentinel.tensor(&s)?;
        expect_invalid(what, batch_norm_elemt_into(&s, x, w, b, mean, invstd, 1e-5, &mut out), arg);
        expect_invalid(what, prepare_batch_norm_elemt(&s, x, w, b, mean, invstd, 1e-5, &mut out).map(|_| ()), arg);
        assert_eq!(read(&s, &out), sentinel.values(), "{what}: a rejected call wrote the output");
    }
    // Bad outputs: another shape, another dtype, a view that overlaps itself.
    let outputs = [
        ("output of another shape", Data::filled(DType::F32, &[2, 3, 5], 777.0)),
        ("output of another rank", Data::filled(DType::F32, &[6, 4], 777.0)),
        ("output of another dtype", Data::filled(DType::F16, &[2, 3, 4], 777.0)),
        ("output with a stride 0", Data::strided(DType::F32, &[777.0; 12], &[2, 3, 4], &[0, 4, 1], 0)),
        ("output with interleaved strides", Data::strided(DType::F32, &[777.0; 16], &[2, 3, 4], &[1, 4, 2], 0)),
    ];
    for (what, init) in outputs {
        let mut out = init.tensor(&s)?;
        expect_invalid(what, up.run_into(&s, &mut out), "output");
        let p = prepare_batch_norm_elemt(&s, &up.x, w, b, &up.mean, &up.invstd, 1e-5, &mut out);
        expect_invalid(what, p.map(|_| ()), "output");
        assert_eq!(read(&s, &out), init.values(), "{what}: a rejected call wrote the output");
    }
    Ok(())
}

/// eps must be finite in f32: NaN, ±inf and 1e300 are 161002 naming eps.
fn bad_eps(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::random(81, &[2, 3, 4], DType::F32, DType::F32, None);
    let up = case.upload(&s)?;
    for eps in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e300] {
        let up = Up { eps, ..case.upload(&s)? };
        expect_invalid("eps", up.run(&s), "eps");
        let mut out = Tensor::zeros(&s, DType::F32, &[2, 3, 4])?;
        expect_invalid("eps", up.run_into(&s, &mut out), "eps");
        assert!(read(&s, &out).iter().all(|&v| v == 0.0));
    }
    // 0 and negative values are fine (CANN's round trip cancels eps).
    for eps in [0.0, -1e-5] {
        let up = Up { eps, ..case.upload(&s)? };
        check(ctx, &s, &format!("eps {eps}"), &up.run(&s)?, DType::F32, &case);
    }
    drop(up);
    Ok(())
}

/// Tensors of the other backend (or a stream of it) are rejected, naming the argument.
fn tensors_from_the_other_backend(ctx: &Context) -> R {
    let Some(other) = other_backend(ctx) else { return Ok(()) };
    let s = ctx.new_stream()?;
    let so = other.new_stream()?;
    let case = Case::random(82, &[2, 3, 4], DType::F32, DType::F32, Some(DType::F32));
    let up = case.upload(&s)?;
    let foreign = case.upload(&so)?;
    let (w, b) = (up.weight.as_ref(), up.bias.as_ref());
    let mut out = Tensor::zeros(&s, DType::F32, &[2, 3, 4])?;
    let e = 1e-5;
    expect_invalid("input", batch_norm_elemt_into(&s, &foreign.x, w, b, &up.mean, &up.invstd, e, &mut out), "input");
    let fw = foreign.weight.as_ref();
    expect_invalid("weight", batch_norm_elemt_into(&s, &up.x, fw, b, &up.mean, &up.invstd, e, &mut out), "weight");
    let fb = foreign.bias.as_ref();
    expect_invalid("bias", batch_norm_elemt_into(&s, &up.x, w, fb, &up.mean, &up.invstd, e, &mut out), "bias");
    expect_invalid("mean", batch_norm_elemt_into(&s, &up.x, w, b, &foreign.mean, &up.invstd, e, &mut out), "mean");
    let r = batch_norm_elemt_into(&s, &up.x, w, b, &up.mean, &foreign.invstd, e, &mut out);
    expect_invalid("invstd", r, "invstd");
    let mut foreign_out = Tensor::zeros(&so, DType::F32, &[2, 3, 4])?;
    expect_invalid("output", up.run_into(&s, &mut foreign_out), "output");
    assert!(read(&s, &out).iter().all(|&v| v == 0.0));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Behaviour

/// The same call gives the same bits, through every entry point.
fn deterministic(ctx: &Context) -> R {
    common::framework::deterministic(ctx, Case::random(90, &[3, 5, 7, 9], DType::BF16, DType::F32, Some(DType::F32)))
}

/// A large eps next to 1/invstd² (eps·invstd² ≈ 1): the CPU ignores eps (same bits for any eps);
/// the NPU's round trip loses about eps·invstd² f32 ulps of the scale, within the tolerance.
fn eps_round_trip(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let mut case = Case::random(110, &[2, 4, 8], DType::F32, DType::F32, Some(DType::F32));
    case.invstd = Data::new(DType::F32, &[3.0, 10.0, 0.1, 1.0], &[4]);
    case.eps = 0.01; // eps·invstd² = 0.09, 1, 1e-4, 0.01
    let up = case.upload(&s)?;
    let out = up.run(&s)?;
    check(ctx, &s, "large eps", &out, DType::F32, &case);
    if ctx.backend() == Backend::Cpu {
        let small = Up { eps: 1e-12, ..case.upload(&s)? };
        assert_eq!(bits(&s, &out), bits(&s, &small.run(&s)?), "the CPU does not use eps");
    }
    Ok(())
}

/// A negative invstd acts as |invstd| on both backends (CANN normalises by 1/sqrt(1/invstd²)):
/// the same values as with the magnitudes given.
fn negative_invstd_acts_as_its_magnitude(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::random(111, &[2, 3, 4], DType::F32, DType::F32, Some(DType::F32));
    let negated = Case {
        invstd: Data::new(DType::F32, &case.invstd.values().iter().map(|v| -v).collect::<Vec<_>>(), &[3]),
        ..case.clone()
    };
    let a = case.upload(&s)?.run(&s)?;
    let b = negated.upload(&s)?.run(&s)?;
    check(ctx, &s, "negative invstd", &b, DType::F32, &negated);
    assert_eq!(bits(&s, &a), bits(&s, &b), "the sign of invstd changes nothing");
    Ok(())
}

/// NaN and ±inf in the input give NaN and the matching infinity, on both backends.
fn nan_and_inf_propagate(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let mut case = Case::random(112, &[2, 3, 4], DType::F32, DType::F32, Some(DType::F32));
    case.weight = Some(Data::new(DType::F32, &[1.5, 0.5, 2.0], &[3]));
    case.x = case.x.with_values_at(&[(1, f64::NAN), (6, f64::INFINITY), (17, f64::NEG_INFINITY)]);
    check(ctx, &s, "NaN and inf", &case.upload(&s)?.run(&s)?, DType::F32, &case);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Mock CANN: what the safe API cannot express

#[cfg(feature = "mock")]
mod mock_only {
    use super::*;
    use common::raw_mock::INVALID;

    /// What the safe API cannot express, checked on the mock through the raw bindings: CANN's
    /// null quirk for this operator (a null input, mean, invstd or output is 161002, not
    /// 161001), and null weight and bias meaning 1 and 0.
    #[test]
    fn raw_null_arguments() {
        common::raw_mock::isolated(|raw| {
            let x = raw.f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
            let mean = raw.f32s(&[3], &[0.5, 1.0, 1.5]);
            let invstd = raw.f32s(&[3], &[2.0, 0.5, 1.0]);
            let out = raw.f32s(&[2, 3], &[0.0; 6]);
            let api = raw.c.operator(&ascend::sys::symbols::BATCH_NORM_ELEMT).expect("the mock exports it");
            let null = std::ptr::null_mut();
            let phase1 = |x, m, i, o| {
                let (mut ws, mut ex) = (0u64, std::ptr::null_mut());
                // SAFETY: live handles of this session or null (which the mock checks first); the
                // out-pointers are valid locals.
                let st =
                    unsafe { api.aclnnBatchNormElemtGetWorkspaceSize(x, null, null, m, i, 1e-5, o, &mut ws, &mut ex) };
                (st, ws, ex)
            };
            for (what, (st, _, ex)) in [
                ("input", phase1(null, mean, invstd, out)),
                ("mean", phase1(x, null, invstd, out)),
                ("invstd", phase1(x, mean, null, out)),
                ("output", phase1(x, mean, invstd, null)),
            ] {
                assert_eq!(st, INVALID, "null {what}");
                assert!(ex.is_null());
            }
            let (st, ws, ex) = phase1(x, mean, invstd, out);
            assert_eq!((st, ws), (0, 0));
            // SAFETY: the executor is fresh from phase 1; workspace size 0 with null; default stream.
            assert_eq!(unsafe { api.aclnnBatchNormElemt(null.cast(), 0, ex, null.cast()) }, 0);
            let got = raw.read_f32(out);
            let want = [1.0f32, 0.5, 1.5, 7.0, 2.0, 4.5]; // (x − mean)·invstd
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "got {got:?}, want {want:?}");
            }
        });
    }
}
