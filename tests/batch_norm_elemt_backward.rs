//! Acceptance tests of `ops::batch_norm_elemt_backward` (`aclnnBatchNormElemtBackward`), one body
//! per case run on both backends: `cpu::<case>` always, `mock::<case>` (Ascend over the mock CANN)
//! with `--features mock`, each mock run isolated (serialised, then checked for no leak and no
//! mock violation).
//!
//! Values are checked against an independent f64 reference,
//! `(dy − sumDy/N − (x − mean)·invstd²·sumDyXmu/N)·invstd·weight` with `N = Σ counter`, computed
//! per multi-index through each tensor's strides, with per-element tolerances
//! `|got − exact| ≤ u_out·|exact| + K·u_c·T + tiny(out)`, where `u_out` is half an ulp of the output
//! dtype, `T = (|dy| + |sumDy/N| + |x − mean|·invstd²·|sumDyXmu/N|)·|invstd·weight|` (the terms'
//! magnitudes) and:
//! * CPU (f64, rounded to f32 then to the output dtype): `u_out·|exact| + 2⁻²⁴·|exact|` for
//!   f16/bf16 outputs (the double rounding), no `T` term beyond 2⁻⁴⁰·T;
//! * mock computing in f32 (as CANN does unless all seven inputs are f16): K = 16, `u_c` = 2⁻²⁴;
//! * mock computing in f16 (all seven inputs f16): K = 16, `u_c` = 2⁻¹¹ (about ten f16 roundings).
//!
//! A misread element, a wrong channel, a wrong N (e.g. from a per-channel counter) or a skipped
//! weight is off by far more.

mod common;

use ascend::ops::{
    batch_norm_elemt_backward, batch_norm_elemt_backward_into, prepare_batch_norm_elemt_backward, Prepared,
};
use ascend::{Backend, Context, DType, Result, Stream, Tensor};
use common::*;

type R = Result<()>;

framework_tests!(Case);

on_both_backends!(
    local: [
        every_dtype_combination,
        grad_input_dtypes,
        all_f16,
        counter_shapes_and_dtypes,
        layouts,
        strided_outputs,
        ranks_2_to_8,
        large_inputs_use_the_threaded_path,
        empty_inputs,
        bad_arguments,
        bad_counters,
        deterministic,
        nan_and_inf_propagate,
    ],
    cross: [tensors_from_the_other_backend],
);

// ---------------------------------------------------------------------------------------------
// Fixture and reference

/// The op's inputs as host data.
#[derive(Clone, Debug)]
struct Case {
    dy: Data,
    x: Data,
    mean: Data,
    invstd: Data,
    weight: Option<Data>,
    sum_dy: Data,
    sum_dy_xmu: Data,
    counter: Data,
}

impl Case {
    /// dy ~ N(0, 1) in `gdt`, x ~ N(0.5, 1) in `xdt`; mean ~ U(0.3, 0.7), invstd ~ U(0.5, 2),
    /// sumDy ~ N(0, 30), sumDyXmu ~ N(0, 30) in `sdt`; weight ~ N(1, 0.5) in `wdt` (absent for
    /// None); counter = [40, 25, 35] (N = 100) as `[3]` f32.
    fn random(seed: u64, shape: &[usize], gdt: DType, xdt: DType, sdt: DType, wdt: Option<DType>) -> Case {
        let mut rng = Rng::new(seed);
        let c = shape[1];
        let [dy, x, mean, invstd] = backward_draws(&mut rng, shape, gdt, xdt, sdt);
        Case {
            dy,
            x,
            mean,
            invstd,
            weight: wdt.map(|d| Data::normal(&mut rng, d, &[c], 1.0, 0.5)),
            sum_dy: Data::normal(&mut rng, sdt, &[c], 0.0, 30.0),
            sum_dy_xmu: Data::normal(&mut rng, sdt, &[c], 0.0, 30.0),
            counter: Data::new(DType::F32, &[40.0, 25.0, 35.0], &[3]),
        }
    }

    /// One dtype for everything but the counter.
    fn uniform_dtype(seed: u64, shape: &[usize], dt: DType) -> Case {
        Case::random(seed, shape, dt, dt, dt, Some(dt))
    }

    /// The exact values (row-major) and the bound terms T of each element.
    fn expected(&self) -> (Vec<f64>, Vec<f64>) {
        let n: f64 = self.counter.values().iter().sum();
        let (mean, invstd) = (self.mean.values(), self.invstd.values());
        let (sum_dy, sum_dy_xmu) = (self.sum_dy.values(), self.sum_dy_xmu.values());
        let weight = self.weight.as_ref().map_or(vec![1.0; mean.len()], Data::values);
        let (mut exp, mut terms) = (Vec::new(), Vec::new());
        for_each_index(&self.x.shape, |i| {
            let c = i[1];
            let (a, b) = (sum_dy[c] / n, invstd[c] * invstd[c] * sum_dy_xmu[c] / n);
            let (g, xmu) = (self.dy.get(i), self.x.get(i) - mean[c]);
            let k = invstd[c] * weight[c];
            exp.push((g - a - xmu * b) * k);
            terms.push((g.abs() + a.abs() + (xmu * b).abs()) * k.abs());
        });
        (exp, terms)
    }

    /// Whether CANN computes this case in f16 (all seven float inputs f16; a missing weight
    /// does not count).
    fn computes_in_f16(&self) -> bool {
        let all = [&self.dy, &self.x, &self.mean, &self.invstd, &self.sum_dy, &self.sum_dy_xmu];
        all.iter().all(|d| d.dtype == DType::F16) && self.weight.as_ref().is_none_or(|w| w.dtype == DType::F16)
    }

    fn upload(&self, s: &Stream) -> Result<Up> {
        uploaded!(self, s => Up { dy, x, mean, invstd, sum_dy, sum_dy_xmu, counter; optional: weight })
    }
}

/// `$f` (the allocating, `_into` or prepare form) called on stream `$s` with the inputs of `$up`
/// in the operator's order, then the output if one is given.
macro_rules! with_inputs {
    ($f:ident($s:expr, $up:expr $(, $out:expr)?)) => {
        $f($s, &$up.dy, &$up.x, &$up.mean, &$up.invstd, $up.weight.as_ref(), &$up.sum_dy, &$up.sum_dy_xmu, &$up.counter $(, $out)?)
    };
}

/// Uploaded inputs.
struct Up {
    dy: Tensor,
    x: Tensor,
    mean: Tensor,
    invstd: Tensor,
    weight: Option<Tensor>,
    sum_dy: Tensor,
    sum_dy_xmu: Tensor,
    counter: Tensor,
}

impl Up {
    fn run(&self, s: &Stream) -> Result<Tensor> {
        with_inputs!(batch_norm_elemt_backward(s, self))
    }

    fn run_into(&self, s: &Stream, out: &mut Tensor) -> Result<()> {
        with_inputs!(batch_norm_elemt_backward_into(s, self, out))
    }

    fn prepare<'a>(&'a self, s: &Stream, out: &'a mut Tensor) -> Result<Prepared<'a>> {
        with_inputs!(prepare_batch_norm_elemt_backward(s, self, out))
    }

    /// The three forms (allocating, `_into`, prepare) all rejected with 161002 naming `argument`,
    /// `out` untouched.
    fn expect_invalid(&self, s: &Stream, what: &str, argument: &str, out: &mut Tensor) {
        let before = read(s, out);
        expect_invalid(what, self.run(s), argument);
        expect_invalid(what, self.run_into(s, out), argument);
        expect_invalid(what, self.prepare(s, out).map(|_| ()), argument);
        assert_eq!(read(s, out), before, "{what}: a rejected call wrote gradInput");
    }
}

impl Framework for Case {
    const ACLNN: &'static str = "aclnnBatchNormElemtBackward";
    const MOCK_WORKSPACE: bool = false;

    fn small(seed: u64) -> Case {
        Case::uniform_dtype(seed, &[2, 3, 4], DType::F32)
    }

    fn mixed(seed: u64) -> Case {
        Case::random(seed, &[2, 3, 4, 5], DType::F16, DType::F16, DType::F32, Some(DType::BF16))
    }

    one_output_framework_items!(output_dtype_of: x);
}

/// Asserts that `out` has the case's shape, dtype `dtype` and values within tolerance.
fn check(ctx: &Context, s: &Stream, what: &str, out: &Tensor, dtype: DType, case: &Case) {
    let got = read_checked(s, what, out, &case.x.shape, dtype);
    let (exp, terms) = case.expected();
    let u32_ = unit_roundoff(DType::F32);
    let tol = |i: usize, e: f64| {
        let t = terms[i];
        let compute = match ctx.backend() {
            Backend::Cpu => u32_ * e.abs() * f64::from(u8::from(dtype != DType::F32)) + f64::powi(2.0, -40) * t,
            _ if case.computes_in_f16() => 16.0 * unit_roundoff(DType::F16) * t,
            _ => 16.0 * u32_ * t,
        };
        unit_roundoff(dtype) * e.abs() + compute + tiny(dtype)
    };
    assert_elements(what, dtype, &got, &exp, tol);
}

// ---------------------------------------------------------------------------------------------
// Values

/// Every dtype of gradOut, of input, of the per-channel vectors and of weight (or none), each
/// on its own; the allocating result has input's dtype.
fn every_dtype_combination(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let weights = [None, Some(DType::F32), Some(DType::BF16)];
    for (seed, ([gdt, xdt, sdt], wdt)) in (1..).zip(product(dtype_tuples(), weights)) {
        let case = Case::random(seed, &[2, 3, 4], gdt, xdt, sdt, wdt);
        let out = case.upload(&s)?.run(&s)?;
        check(ctx, &s, &format!("dy {gdt}, x {xdt}, stats {sdt}, weight {wdt:?}"), &out, xdt, &case);
    }
    Ok(())
}

/// `_into` writes gradInput in any float dtype (CANN casts the result to it).
fn grad_input_dtypes(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::random(40, &[2, 3, 5], DType::BF16, DType::BF16, DType::F32, Some(DType::F32));
    let up = case.upload(&s)?;
    for dt in DTYPES {
        let mut out = Tensor::zeros(&s, dt, &case.x.shape)?;
        up.run_into(&s, &mut out)?;
        check(ctx, &s, &format!("gradInput {dt}"), &out, dt, &case);
    }
    Ok(())
}

/// All seven float inputs f16 (CANN computes in f16), with and without weight.
fn all_f16(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::uniform_dtype(41, &[3, 4, 6], DType::F16);
    check(ctx, &s, "all f16", &case.upload(&s)?.run(&s)?, DType::F16, &case);
    let no_weight = Case { weight: None, ..case };
    check(ctx, &s, "all f16, no weight", &no_weight.upload(&s)?.run(&s)?, DType::F16, &no_weight);
    Ok(())
}

/// counter as `[W]` or `[W, 1]` (torch's), f32 or f16, strided: the same N = Σ counter.
fn counter_shapes_and_dtypes(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let base = Case::random(50, &[2, 3, 4], DType::F32, DType::F32, DType::F32, Some(DType::F32));
    let counts = [40.0, 25.0, 35.0];
    let counters = [
        Data::new(DType::F32, &counts, &[3, 1]),
        Data::new(DType::F16, &counts, &[3]),
        Data::new(DType::F16, &counts, &[3, 1]),
        Data::new(DType::F32, &counts, &[3]).spread(3, 2, 1000.0),
        Data::new(DType::F32, &[100.0], &[1]),
        Data::new(DType::F32, &[7.0, 93.0], &[2, 1]),
    ];
    let reference = base.upload(&s)?.run(&s)?;
    check(ctx, &s, "counter [3] f32", &reference, DType::F32, &base);
    for counter in counters {
        let what = format!("counter {:?} {} strides {:?}", counter.shape, counter.dtype, counter.strides);
        let case = Case { counter, ..base.clone() };
        let out = case.upload(&s)?.run(&s)?;
        check(ctx, &s, &what, &out, DType::F32, &case);
        assert_eq!(bits(&s, &out), bits(&s, &reference), "{what}: N = 100 whatever the layout");
    }
    Ok(())
}

/// Inputs in every layout (contiguous, channels-last, transposed, spread, strided vectors), with
/// gradOut and input in different layouts.
fn layouts(ctx: &Context) -> R {
    let base = Case::random(60, &[2, 5, 3, 4], DType::F32, DType::F32, DType::F32, Some(DType::F32));
    let spread_stats = |c: &Case| Case {
        mean: c.mean.spread(3, 1, 99.0),
        invstd: c.invstd.spread(2, 0, 99.0),
        weight: c.weight.as_ref().map(|w| w.spread(2, 5, 99.0)),
        sum_dy: c.sum_dy.spread(4, 2, 99.0),
        sum_dy_xmu: c.sum_dy_xmu.spread(5, 3, 99.0),
        ..c.clone()
    };
    let cl = |c: &Case| Case { dy: c.dy.permuted(&[0, 2, 3, 1]), x: c.x.permuted(&[0, 2, 3, 1]), ..c.clone() };
    let rank3 = Case::random(61, &[3, 4, 5], DType::BF16, DType::F16, DType::F32, Some(DType::F32));
    let cases = [
        ("contiguous", base.clone()),
        ("channels-last", cl(&base)),
        ("dy channels-last, x contiguous", Case { dy: base.dy.permuted(&[0, 2, 3, 1]), ..base.clone() }),
        ("spread", Case { dy: base.dy.spread(2, 3, -5.0), x: base.x.spread(3, 1, 7.0), ..base.clone() }),
        ("strided stats", spread_stats(&base)),
        ("transposed rank 3", Case { dy: rank3.dy.permuted(&[2, 1, 0]), x: rank3.x.permuted(&[1, 2, 0]), ..rank3 }),
    ];
    common::framework::allocating_results(ctx, cases)
}

/// `_into` writes gradInput of any non-overlapping layout; channels-last in, channels-last out.
fn strided_outputs(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::random(70, &[2, 3, 4, 5], DType::F16, DType::F16, DType::F32, Some(DType::F32));
    let cl = Case { dy: case.dy.permuted(&[0, 2, 3, 1]), x: case.x.permuted(&[0, 2, 3, 1]), ..case.clone() };
    let sentinel = Data::filled(DType::F32, &case.x.shape, 777.0);
    for (what, c) in [("contiguous inputs", &case), ("channels-last inputs", &cl)] {
        let up = c.upload(&s)?;
        for (layout, init) in [
            ("channels-last", sentinel.permuted(&[0, 2, 3, 1])),
            ("spread", sentinel.spread(2, 3, 555.0)),
            ("reversed dims", sentinel.permuted(&[3, 2, 1, 0])),
        ] {
            let mut out = init.tensor(&s)?;
            up.run_into(&s, &mut out)?;
            check(ctx, &s, &format!("{what} into {layout}"), &out, DType::F32, c);
        }
    }
    Ok(())
}

/// Ranks 2 to 8 (channels at dim 1 throughout).
fn ranks_2_to_8(ctx: &Context) -> R {
    common::framework::ranks_2_to_8(ctx, |rank, shape| {
        Case::random(80 + rank, shape, DType::F32, DType::F32, DType::F32, Some(DType::F32))
    })
}

/// Inputs above the CPU's threading threshold, contiguous f32 and channels-last bf16.
fn large_inputs_use_the_threaded_path(ctx: &Context) -> R {
    let cases = [(DType::F32, false), (DType::BF16, true)].map(|(dt, cl)| {
        let case = Case::random(90, &[4, 24, 32, 48], dt, dt, DType::F32, Some(DType::F32));
        let case = if cl {
            Case { dy: case.dy.permuted(&[0, 2, 3, 1]), x: case.x.permuted(&[0, 2, 3, 1]), ..case }
        } else {
            case
        };
        (format!("large {dt} channels-last {cl}"), case)
    });
    common::framework::large_inputs(ctx, cases)
}

/// An empty input (batch 0, or an empty spatial dim) computes nothing and succeeds.
fn empty_inputs(ctx: &Context) -> R {
    common::framework::empty_inputs(ctx, |shape| Case::uniform_dtype(100, shape, DType::F32))
}

// ---------------------------------------------------------------------------------------------
// Bad arguments

/// Every invalid argument is 161002 naming it, in the allocating, `_into` and prepare forms, and
/// the rejected calls write nothing.
fn bad_arguments(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::uniform_dtype(110, &[2, 3, 4], DType::F32);
    let mut out = Data::filled(DType::F32, &[2, 3, 4], 777.0).tensor(&s)?;
    let t = |shape: &[usize]| Tensor::zeros(&s, DType::F32, shape);
    let up = || case.upload(&s);
    let cases: Vec<(&str, Up, &str)> = vec![
        ("rank 1 input", Up { x: t(&[6])?, dy: t(&[6])?, ..up()? }, "input"),
        ("rank 9 input", Up { x: t(&[1; 9])?, dy: t(&[1; 9])?, ..up()? }, "input"),
        ("zero channels", Up { x: t(&[2, 0, 4])?, dy: t(&[2, 0, 4])?, ..up()? }, "input"),
        ("gradOut of another shape", Up { dy: t(&[2, 3, 5])?, ..up()? }, "gradOut"),
        ("gradOut of another rank", Up { dy: t(&[6, 4])?, ..up()? }, "gradOut"),
        ("long mean", Up { mean: t(&[4])?, ..up()? }, "mean"),
        ("2-D invstd", Up { invstd: t(&[3, 1])?, ..up()? }, "invstd"),
        ("short weight", Up { weight: Some(t(&[2])?), ..up()? }, "weight"),
        ("long sumDy", Up { sum_dy: t(&[4])?, ..up()? }, "sumDy"),
        ("2-D sumDyXmu", Up { sum_dy_xmu: t(&[3, 1])?, ..up()? }, "sumDyXmu"),
    ];
    for (what, args, argument) in cases {
        args.expect_invalid(&s, what, argument, &mut out);
    }
    // Bad gradInput: another shape, a view that overlaps itself.
    let up = up()?;
    for (what, init) in [
        ("gradInput of another shape", Data::filled(DType::F32, &[2, 3, 5], 777.0)),
        ("gradInput with a stride 0", Data::strided(DType::F32, &[777.0; 12], &[2, 3, 4], &[0, 4, 1], 0)),
        ("gradInput with interleaved strides", Data::strided(DType::F32, &[777.0; 16], &[2, 3, 4], &[1, 4, 2], 0)),
    ] {
        let mut out = init.tensor(&s)?;
        expect_invalid(what, up.run_into(&s, &mut out), "gradInput");
        expect_invalid(what, up.prepare(&s, &mut out).map(|_| ()), "gradInput");
        assert_eq!(read(&s, &out), init.values(), "{what}: a rejected call wrote gradInput");
    }
    Ok(())
}

/// counter must be `[W]` or `[W, 1]` of f32 or f16: a per-channel `[W, C]` counts tensor (which
/// CANN would silently sum into a wrong N), other ranks and bf16 are 161002 naming counter.
fn bad_counters(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::uniform_dtype(120, &[2, 3, 4], DType::F32);
    let mut out = Data::filled(DType::F32, &[2, 3, 4], 777.0).tensor(&s)?;
    let counters = [
        ("per-channel [W, C]", Data::filled(DType::F32, &[2, 3], 50.0)),
        ("[W, 2]", Data::filled(DType::F32, &[2, 2], 50.0)),
        ("[W, 1, 1]", Data::filled(DType::F32, &[2, 1, 1], 50.0)),
        ("rank 0", Data::filled(DType::F32, &[], 100.0)),
        ("bf16", Data::new(DType::BF16, &[40.0, 60.0], &[2])),
    ];
    for (what, counter) in counters {
        let up = Case { counter, ..case.clone() }.upload(&s)?;
        up.expect_invalid(&s, what, "counter", &mut out);
        if what.starts_with("per-channel") {
            let err = up.run(&s).unwrap_err().to_string();
            assert!(err.contains("sums every element"), "the message explains why: {err}");
        }
    }
    Ok(())
}

/// Tensors of the other backend are rejected, naming the argument.
fn tensors_from_the_other_backend(ctx: &Context) -> R {
    let Some(other) = other_backend(ctx) else { return Ok(()) };
    let s = ctx.new_stream()?;
    let so = other.new_stream()?;
    let case = Case::uniform_dtype(130, &[2, 3, 4], DType::F32);
    let up = || case.upload(&s);
    let f = case.upload(&so)?;
    let mut out = Data::filled(DType::F32, &[2, 3, 4], 777.0).tensor(&s)?;
    let cases: Vec<(&str, Up)> = vec![
        ("gradOut", Up { dy: f.dy, ..up()? }),
        ("input", Up { x: f.x, ..up()? }),
        ("mean", Up { mean: f.mean, ..up()? }),
        ("invstd", Up { invstd: f.invstd, ..up()? }),
        ("weight", Up { weight: f.weight, ..up()? }),
        ("sumDy", Up { sum_dy: f.sum_dy, ..up()? }),
        ("sumDyXmu", Up { sum_dy_xmu: f.sum_dy_xmu, ..up()? }),
        ("counter", Up { counter: f.counter, ..up()? }),
    ];
    for (argument, args) in cases {
        args.expect_invalid(&s, argument, argument, &mut out);
    }
    let mut foreign_out = Tensor::zeros(&so, DType::F32, &[2, 3, 4])?;
    expect_invalid("gradInput", up()?.run_into(&s, &mut foreign_out), "gradInput");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Behaviour

/// The same call gives the same bits, through every entry point.
fn deterministic(ctx: &Context) -> R {
    common::framework::deterministic(
        ctx,
        Case::random(140, &[3, 5, 7, 9], DType::BF16, DType::BF16, DType::F32, Some(DType::F32)),
    )
}

/// NaN and ±inf in gradOut or input give NaN and the matching infinity, on both backends.
fn nan_and_inf_propagate(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let mut case = Case::uniform_dtype(152, &[2, 3, 4], DType::F32);
    case.dy = case.dy.with_values_at(&[(1, f64::NAN), (6, f64::INFINITY)]);
    case.x = case.x.with_values_at(&[(9, f64::NEG_INFINITY)]);
    check(ctx, &s, "NaN and inf", &case.upload(&s)?.run(&s)?, DType::F32, &case);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Mock CANN: what the safe API cannot express, and the f16 path

#[cfg(feature = "mock")]
mod mock_only {
    use super::*;
    use common::mock::isolated;
    use common::raw_mock::INVALID;

    /// What the safe API cannot express, checked on the mock through the raw bindings: a null
    /// required tensor is 161001 (weight may be null); CANN accepts an int32 counter (torch's) and
    /// any counter shape, summing every element (so a [W, C] per-channel counts tensor gives
    /// N = Σ of all W·C counts, the trap the safe API rejects); a bf16 counter is 161002.
    #[test]
    fn raw_counters_and_null_arguments() {
        common::raw_mock::isolated(|raw| {
            let (dy_v, x_v) = ([1.0f32, -2.0, 0.5, 3.0], [0.0f32, 1.0, 2.0, -1.0]);
            let (mean_v, invstd_v, sd_v, sdx_v) = ([0.5f32, -0.5], [2.0f32, 0.5], [4.0f32, -8.0], [2.0f32, 6.0]);
            let dy = raw.f32s(&[2, 2], &dy_v);
            let x = raw.f32s(&[2, 2], &x_v);
            let mean = raw.f32s(&[2], &mean_v);
            let invstd = raw.f32s(&[2], &invstd_v);
            let sum_dy = raw.f32s(&[2], &sd_v);
            let sum_dy_xmu = raw.f32s(&[2], &sdx_v);
            let out = raw.f32s(&[2, 2], &[0.0; 4]);
            let api = raw.c.operator(&ascend::sys::symbols::BATCH_NORM_ELEMT_BACKWARD).expect("the mock exports it");
            let null = std::ptr::null_mut();
            let phase1 = |dy, counter, out| {
                let (mut ws, mut ex) = (0u64, std::ptr::null_mut());
                // SAFETY: live handles of this session or null (which the mock checks first); the
                // out-pointers are valid locals.
                let st = unsafe {
                    api.aclnnBatchNormElemtBackwardGetWorkspaceSize(
                        dy, x, mean, invstd, null, sum_dy, sum_dy_xmu, counter, out, &mut ws, &mut ex,
                    )
                };
                (st, ex)
            };
            let run = |raw: &common::raw_mock::Mock, counter, n: f64| {
                let (st, ex) = phase1(dy, counter, out);
                assert_eq!(st, 0);
                // SAFETY: the executor is fresh from phase 1; workspace 0 with null; default stream.
                assert_eq!(unsafe { api.aclnnBatchNormElemtBackward(null.cast(), 0, ex, null.cast()) }, 0);
                let got = raw.read_f32(out);
                for (i, &g) in got.iter().enumerate() {
                    let c = i % 2;
                    let (is, m) = (f64::from(invstd_v[c]), f64::from(mean_v[c]));
                    let a = f64::from(sd_v[c]) / n;
                    let b = is * is * f64::from(sdx_v[c]) / n;
                    let want = (f64::from(dy_v[i]) - a - (f64::from(x_v[i]) - m) * b) * is;
                    assert!((f64::from(g) - want).abs() <= 1e-5 * want.abs().max(1.0), "N = {n}: got {got:?}");
                }
            };
            let counter = raw.f32s(&[2], &[3.0, 5.0]);
            for (what, (st, ex)) in [
                ("gradOut", phase1(null, counter, out)),
                ("counter", phase1(dy, null, out)),
                ("gradInput", phase1(dy, counter, null)),
            ] {
                assert_eq!(st, 161001, "null {what}");
                assert!(ex.is_null());
            }
            let i32_counter = raw.i32s(&[2, 1], &[3, 5]);
            run(raw, i32_counter, 8.0);
            let per_channel = raw.f32s(&[2, 2], &[10.0, 10.0, 10.0, 10.0]);
            run(raw, per_channel, 40.0);
            let bf16_counter = raw.bf16s(&[2], &[3.0, 5.0]);
            assert_eq!(phase1(dy, bf16_counter, out).0, INVALID);
        });
    }

    /// The mock's all-f16 path really computes in f16, as CANN does: its result differs from the
    /// f32 path's for the same values (one input f32), and both are within their tolerances.
    #[test]
    fn f16_compute_differs_from_f32_compute() {
        isolated(|ctx| -> R {
            let s = ctx.new_stream()?;
            let half = Case::uniform_dtype(162, &[4, 3, 40], DType::F16);
            let mixed = Case { mean: half.mean.cast(DType::F32), ..half.clone() };
            let a = half.upload(&s)?.run(&s)?;
            let b = mixed.upload(&s)?.run(&s)?;
            assert_ne!(bits(&s, &a), bits(&s, &b), "all-f16 inputs compute in f16 on the NPU");
            check(ctx, &s, "f16 compute", &a, DType::F16, &half);
            check(ctx, &s, "f32 compute", &b, DType::F16, &mixed);
            Ok(())
        })
        .unwrap();
    }
}
