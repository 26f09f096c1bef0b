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
#[cfg(feature = "mock")]
#[path = "common/raw_mock.rs"]
mod raw_mock;

use ascend::ops::{batch_norm_elemt, batch_norm_elemt_into, prepare_batch_norm_elemt, Workspace};
use ascend::{Backend, Context, DType, Error, Result, Stream, Tensor};
use common::*;

const INVALID: i32 = 161002;

type R = Result<()>;

/// Expands each case `fn name(ctx: &Context) -> R` into `cpu::name` and, with the mock feature,
/// `mock::name` (isolated). The `cross` cases use both backends at once.
macro_rules! on_both_backends {
    (local: [$($name:ident),* $(,)?], cross: [$($cross:ident),* $(,)?] $(,)?) => {
        mod cpu {
            $( #[test] fn $name() { super::$name(&ascend::Context::cpu()).unwrap(); } )*
            $( #[test] fn $cross() { crate::common::on_cpu_touching_mock(|ctx| super::$cross(ctx)).unwrap(); } )*
        }
        #[cfg(feature = "mock")]
        mod mock {
            $( #[test] fn $name() { crate::common::mock::isolated(|ctx| super::$name(ctx)).unwrap(); } )*
            $( #[test] fn $cross() { crate::common::mock::isolated(|ctx| super::$cross(ctx)).unwrap(); } )*
        }
    };
}

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
        two_phase,
        two_phase_dropped_unlaunched,
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
        let opt = |d: &Option<Data>| d.as_ref().map(|d| d.tensor(s)).transpose();
        Ok(Up {
            x: self.x.tensor(s)?,
            weight: opt(&self.weight)?,
            bias: opt(&self.bias)?,
            mean: self.mean.tensor(s)?,
            invstd: self.invstd.tensor(s)?,
            eps: self.eps,
        })
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
    assert_eq!(out.shape(), &case.x.shape[..], "{what}: shape");
    assert_eq!(out.dtype(), dtype, "{what}: dtype");
    let got = read(s, out);
    let (exp, terms) = case.expected();
    let k = k_factor(ctx);
    for (i, ((&g, &e), &t)) in got.iter().zip(&exp).zip(&terms).enumerate() {
        if !e.is_finite() {
            // NaN where NaN is expected, the same infinity where one is expected.
            assert!(e.is_nan() && g.is_nan() || g == e, "{what} ({dtype}) element {i}: got {g:e}, expected {e:e}");
            continue;
        }
        let tol = unit_roundoff(dtype) * e.abs() + k * unit_roundoff(DType::F32) * t + tiny(dtype);
        assert!(
            (g - e).abs() <= tol,
            "{what} ({dtype}) element {i}: got {g:e}, expected {e:e} (|diff| {:e} > tol {tol:e})",
            (g - e).abs()
        );
    }
}

/// Asserts an `InvalidArgument` error with status 161002 naming `argument`.
fn expect_invalid<T: std::fmt::Debug>(what: &str, r: Result<T>, argument: &str) {
    match r {
        Err(Error::InvalidArgument { argument: a, status, message }) => {
            assert_eq!(status, INVALID, "{what}: status for `{a}`: {message}");
            assert_eq!(a, argument, "{what}: argument ({message})");
        }
        other => panic!("{what}: expected InvalidArgument 161002 naming `{argument}`, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Values

/// Every dtype of input (and output), of mean/invstd and of weight/bias (or none) on its own:
/// mixed dtypes such as bf16 activations with f32 statistics (what torch passes) included.
fn every_dtype_combination(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let mut seed = 0;
    for xdt in DTYPES {
        for sdt in DTYPES {
            for wdt in [None, Some(DType::F32), Some(DType::F16), Some(DType::BF16)] {
                seed += 1;
                let case = Case::random(seed, &[2, 3, 5], xdt, sdt, wdt);
                let out = case.upload(&s)?.run(&s)?;
                check(ctx, &s, &format!("x {xdt}, stats {sdt}, weight/bias {wdt:?}"), &out, xdt, &case);
            }
        }
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
    let s = ctx.new_stream()?;
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
    for (what, case) in cases {
        let out = case.upload(&s)?.run(&s)?;
        assert!(out.is_contiguous(), "{what}: the allocating result is contiguous");
        check(ctx, &s, what, &out, case.x.dtype, &case);
    }
    Ok(())
}

/// `_into` writes outputs of any non-overlapping layout (channels-last, spread, transposed).
fn strided_outputs(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::random(40, &[2, 3, 4, 5], DType::F16, DType::F32, Some(DType::BF16));
    let up = case.upload(&s)?;
    let sentinel = Data::filled(DType::F16, &case.x.shape, 777.0);
    let layouts = [
        ("channels-last", sentinel.permuted(&[0, 2, 3, 1])),
        ("spread", sentinel.spread(2, 3, 555.0)),
        ("reversed dims", sentinel.permuted(&[3, 2, 1, 0])),
    ];
    for (what, init) in layouts {
        let mut out = init.tensor(&s)?;
        up.run_into(&s, &mut out)?;
        check(ctx, &s, what, &out, DType::F16, &case);
    }
    // A channels-last input into a channels-last output (the dense same-order path).
    let cl = Case { x: case.x.permuted(&[0, 2, 3, 1]), ..case.clone() };
    let mut out = sentinel.permuted(&[0, 2, 3, 1]).tensor(&s)?;
    cl.upload(&s)?.run_into(&s, &mut out)?;
    check(ctx, &s, "channels-last into channels-last", &out, DType::F16, &cl);
    Ok(())
}

/// Ranks 2 to 8 (channels at dim 1 throughout).
fn ranks_2_to_8(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    for rank in 2..=8 {
        let shape: Vec<usize> = (0..rank).map(|d| [3, 4, 2, 1, 3, 2, 1, 2][d]).collect();
        let case = Case::random(50 + rank as u64, &shape, DType::F32, DType::F32, Some(DType::F32));
        check(ctx, &s, &format!("rank {rank}"), &case.upload(&s)?.run(&s)?, DType::F32, &case);
    }
    Ok(())
}

/// Inputs above the CPU's threading threshold (1 MiB read and written), contiguous and
/// channels-last, f32 and f16.
fn large_inputs_use_the_threaded_path(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    for (dt, cl) in [(DType::F32, false), (DType::F16, true)] {
        let case = Case::random(60, &[4, 24, 48, 64], dt, DType::F32, Some(DType::F32));
        let case = if cl { Case { x: case.x.permuted(&[0, 2, 3, 1]), ..case } } else { case };
        let up = case.upload(&s)?;
        let out = up.run(&s)?;
        check(ctx, &s, &format!("large {dt} channels-last {cl}"), &out, dt, &case);
        // The same bits again (any thread interleaving).
        assert_eq!(bits(&s, &out), bits(&s, &up.run(&s)?));
    }
    Ok(())
}

/// An empty input (batch 0, or an empty spatial dim) computes nothing and succeeds.
fn empty_inputs(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    for shape in [[0, 3, 4], [2, 3, 0]] {
        let case = Case::random(70, &shape, DType::F32, DType::F32, Some(DType::F32));
        let up = case.upload(&s)?;
        let out = up.run(&s)?;
        assert_eq!(out.shape(), &shape[..]);
        assert!(out.to_vec::<f32>(&s)?.is_empty());
        let mut into = Tensor::zeros(&s, DType::F32, &shape)?;
        up.run_into(&s, &mut into)?;
        let mut into = Tensor::zeros(&s, DType::F32, &shape)?;
        let p = prepare_batch_norm_elemt(
            &s,
            &up.x,
            up.weight.as_ref(),
            up.bias.as_ref(),
            &up.mean,
            &up.invstd,
            up.eps,
            &mut into,
        )?;
        assert_eq!(p.workspace_size(), 0);
        p.launch(&s, None)?;
    }
    Ok(())
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
    let s = ctx.new_stream()?;
    let case = Case::random(90, &[3, 5, 7, 9], DType::BF16, DType::F32, Some(DType::F32));
    let up = case.upload(&s)?;
    let a = up.run(&s)?;
    let b = up.run(&s)?;
    let mut c = Tensor::zeros(&s, DType::BF16, &case.x.shape)?;
    up.run_into(&s, &mut c)?;
    assert_eq!(bits(&s, &a), bits(&s, &b));
    assert_eq!(bits(&s, &a), bits(&s, &c));
    Ok(())
}

/// prepare → workspace_size → launch, with the stream's workspace and with a caller's.
fn two_phase(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::random(100, &[2, 3, 4], DType::F32, DType::F16, Some(DType::F32));
    let up = case.upload(&s)?;
    let (w, b) = (up.weight.as_ref(), up.bias.as_ref());
    let mut out = Tensor::zeros(&s, DType::F32, &[2, 3, 4])?;
    let p = prepare_batch_norm_elemt(&s, &up.x, w, b, &up.mean, &up.invstd, up.eps, &mut out)?;
    let size = p.workspace_size();
    if ctx.backend() == Backend::Cpu {
        assert_eq!(size, 0);
    }
    p.launch(&s, None)?;
    check(ctx, &s, "launch(None)", &out, DType::F32, &case);
    let mut out2 = Tensor::zeros(&s, DType::F32, &[2, 3, 4])?;
    let ws = Workspace::new(&s, size)?;
    prepare_batch_norm_elemt(&s, &up.x, w, b, &up.mean, &up.invstd, up.eps, &mut out2)?.launch(&s, Some(&ws))?;
    assert_eq!(bits(&s, &out), bits(&s, &out2));
    Ok(())
}

/// A prepared call dropped without launch writes nothing.
fn two_phase_dropped_unlaunched(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::random(101, &[2, 3, 4], DType::F32, DType::F32, None);
    let up = case.upload(&s)?;
    let mut out = Tensor::zeros(&s, DType::F32, &[2, 3, 4])?;
    let p = prepare_batch_norm_elemt(&s, &up.x, None, None, &up.mean, &up.invstd, up.eps, &mut out)?;
    let _ = format!("{p:?}");
    drop(p);
    s.synchronize()?;
    assert!(read(&s, &out).iter().all(|&v| v == 0.0));
    Ok(())
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
    let mut v = case.x.values();
    v[1] = f64::NAN;
    v[6] = f64::INFINITY;
    v[17] = f64::NEG_INFINITY;
    case.x = Data::new(DType::F32, &v, &[2, 3, 4]);
    check(ctx, &s, "NaN and inf", &case.upload(&s)?.run(&s)?, DType::F32, &case);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Mock CANN: faults and lifetimes

#[cfg(feature = "mock")]
mod mock_only {
    use super::*;
    use ascend::mock::{fail_next_on_this_thread, stats};
    use common::mock::isolated;

    /// The live counters once `ctx`'s cached blocks are returned (a cached block is not a leak).
    fn live(ctx: &Context) -> [u64; 4] {
        ctx.empty_cache().expect("empty_cache");
        let s = stats();
        [s.live_allocations, s.live_tensors, s.live_executors, s.live_streams]
    }

    /// A fault injected at each CANN call the op makes fails the call with that status (or
    /// NullHandle for aclCreateTensor), leaks nothing, writes nothing, and the next call works.
    #[test]
    fn faults_at_each_cann_call() {
        isolated(|ctx| -> R {
            let s = ctx.new_stream()?;
            let case = Case::random(120, &[2, 3, 4], DType::F32, DType::F32, Some(DType::F32));
            let up = case.upload(&s)?;
            let mut out = Tensor::zeros(&s, DType::F32, &[2, 3, 4])?;
            up.run_into(&s, &mut out)?; // the stream's workspace cache exists from here on
            let mut out = Tensor::zeros(&s, DType::F32, &[2, 3, 4])?;
            let base = live(ctx);
            for (api, status) in [
                ("aclCreateTensor", 0),
                ("aclnnBatchNormElemtGetWorkspaceSize", 561103),
                ("aclnnBatchNormElemt", 361001),
            ] {
                fail_next_on_this_thread(api, status);
                let err = up.run_into(&s, &mut out).unwrap_err();
                if status == 0 {
                    assert!(matches!(&err, Error::NullHandle { call: "aclCreateTensor", .. }), "{err:?}");
                } else {
                    assert_eq!(err.status(), Some(status), "{api}: {err:?}");
                    assert!(err.to_string().contains(api), "{err}");
                }
                assert_eq!(live(ctx), base, "{api}: leaked");
                assert!(read(&s, &out).iter().all(|&v| v == 0.0), "{api}: wrote the output");
                // The allocating form frees the output it made.
                fail_next_on_this_thread(api, status);
                assert!(up.run(&s).is_err());
                assert_eq!(live(ctx), base, "{api} (allocating): leaked");
            }
            fail_next_on_this_thread("aclrtMalloc", 207001);
            assert_eq!(up.run(&s).unwrap_err().status(), Some(207001));
            assert_eq!(live(ctx), base, "aclrtMalloc: leaked");
            up.run_into(&s, &mut out)?;
            check(ctx, &s, "after the faults", &out, DType::F32, &case);
            Ok(())
        })
        .unwrap();
    }

    /// A fault armed at every CANN function the crate binds (but those that destroy or free,
    /// whose failure is a reported leak by design) before one `_into` and one allocating call:
    /// each call either succeeds with the right values or fails, writing nothing; nothing leaks
    /// and the mock counts no violation (checked by `isolated`).
    #[test]
    fn a_fault_at_any_cann_call() {
        use ascend::mock::clear_faults;
        use ascend::sys::symbols::{ASCENDCL_SYMBOLS, NNOPBASE_SYMBOLS};
        let skip = ["Destroy", "Free", "Finalize", "Reset", "GetRecentErrMsg"];
        let apis: Vec<&str> = ASCENDCL_SYMBOLS
            .iter()
            .chain(NNOPBASE_SYMBOLS)
            .copied()
            .chain(["aclnnBatchNormElemtGetWorkspaceSize", "aclnnBatchNormElemt"])
            .filter(|a| !skip.iter().any(|k| a.contains(k)))
            .collect();
        isolated(|ctx| -> R {
            let s = ctx.new_stream()?;
            let case = Case::random(122, &[2, 3, 4], DType::F32, DType::F32, Some(DType::F32));
            let up = case.upload(&s)?;
            let mut failed = Vec::new();
            for api in apis {
                let mut out = Tensor::zeros(&s, DType::F32, &case.x.shape)?;
                fail_next_on_this_thread(api, 507899);
                let r = up.run_into(&s, &mut out);
                clear_faults();
                match r {
                    Ok(()) => check(ctx, &s, api, &out, DType::F32, &case),
                    Err(e) => {
                        failed.push(api);
                        assert!(read(&s, &out).iter().all(|&v| v == 0.0), "{api}: failed ({e}) but wrote output");
                    }
                }
                fail_next_on_this_thread(api, 507899);
                let r = up.run(&s);
                clear_faults();
                if let Ok(out) = r {
                    check(ctx, &s, api, &out, DType::F32, &case);
                }
            }
            for api in ["aclCreateTensor", "aclnnBatchNormElemtGetWorkspaceSize", "aclnnBatchNormElemt"] {
                assert!(failed.contains(&api), "a fault at {api} must fail the call (failed: {failed:?})");
            }
            Ok(())
        })
        .unwrap();
    }

    /// What the safe API cannot express, checked on the mock through the raw bindings: CANN's
    /// null quirk for this operator (a null input, mean, invstd or output is 161002, not
    /// 161001), and null weight and bias meaning 1 and 0.
    #[test]
    fn raw_null_arguments() {
        isolated(|_ctx| -> R {
            let mut raw = raw_mock::Raw::new();
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
            Ok(())
        })
        .unwrap();
    }

    /// Every argument (inputs, output, stream) dropped right after the launch, before the queued
    /// work ran: no violation, and the allocating result is right.
    #[test]
    fn arguments_dropped_right_after_the_launch() {
        isolated(|ctx| -> R {
            let case = Case::random(121, &[2, 3, 4, 5], DType::F16, DType::F32, Some(DType::BF16));
            let s = ctx.new_stream()?;
            let up = case.upload(&s)?;
            let out = up.run(&s)?;
            drop(up);
            check(ctx, &s, "inputs dropped", &out, DType::F16, &case);

            let s2 = ctx.new_stream()?;
            let up = case.upload(&s2)?;
            let mut out = Tensor::zeros(&s2, DType::F16, &case.x.shape)?;
            up.run_into(&s2, &mut out)?;
            drop(up);
            drop(out);
            drop(s2);
            Ok(())
        })
        .unwrap();
    }
}
