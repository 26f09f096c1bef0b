//! Acceptance tests of `ops::cast` (`aclnnCast` between f32, f16 and bf16), one body per case run
//! on both backends: `cpu::<case>` always, `mock::<case>` (Ascend over the mock CANN) with
//! `--features mock`, each mock run isolated (serialised, then checked for no leak and no mock
//! violation).
//!
//! The reference is independent: each exact source value (f64) rounded once into the target
//! dtype by the `half` crate (or `as f32`), to nearest, ties to even. Both backends must give it
//! bit for bit (a widening cast is exact; a narrowing one is one rounding of an exact value), NaN
//! as NaN. A misread element, a wrong stride or a double rounding is off by at least one ulp.

mod common;

use ascend::ops::{cast, cast_into, prepare_cast, Prepared};
use ascend::{Context, DType, Result, Stream, Tensor};
use common::*;

type R = Result<()>;

framework_tests!(Case);

on_both_backends!(
    local: [
        every_dtype_pair,
        layouts,
        strided_outputs,
        ranks_1_to_8,
        large_inputs_use_the_threaded_path,
        empty_inputs,
        rounding_overflow_nan_and_inf,
        bad_arguments,
        deterministic,
    ],
    cross: [tensors_from_the_other_backend],
);

// ---------------------------------------------------------------------------------------------
// Fixture and reference

/// The op's input as host data and the target dtype.
#[derive(Clone, Debug)]
struct Case {
    x: Data,
    dtype: DType,
}

impl Case {
    /// x ~ N(0.5, 300) in `xdt` (wide enough that every narrowing rounds), cast to `dtype`.
    fn random(seed: u64, shape: &[usize], xdt: DType, dtype: DType) -> Case {
        Case { x: Data::normal(&mut Rng::new(seed), xdt, shape, 0.5, 300.0), dtype }
    }

    /// The exact result (row-major): each source value rounded once into the target dtype.
    fn expected(&self) -> Vec<f64> {
        self.x.values().into_iter().map(|v| round_to(self.dtype, v)).collect()
    }

    fn upload(&self, s: &Stream) -> Result<Up> {
        Ok(Up { x: self.x.tensor(s)?, dtype: self.dtype })
    }
}

/// Uploaded input.
struct Up {
    x: Tensor,
    dtype: DType,
}

impl Up {
    fn run(&self, s: &Stream) -> Result<Tensor> {
        cast(s, &self.x, self.dtype)
    }

    fn run_into(&self, s: &Stream, out: &mut Tensor) -> Result<()> {
        cast_into(s, &self.x, self.dtype, out)
    }

    fn prepare<'a>(&'a self, s: &Stream, out: &'a mut Tensor) -> Result<Prepared<'a>> {
        prepare_cast(s, &self.x, self.dtype, out)
    }
}

impl Framework for Case {
    const ACLNN: &'static str = "aclnnCast";
    const MOCK_WORKSPACE: bool = false;
    type Up = Up;
    type Out = Tensor;
    type Res = Tensor;

    fn small(seed: u64) -> Case {
        Case::random(seed, &[2, 3, 4], DType::F32, DType::F32)
    }

    fn mixed(seed: u64) -> Case {
        Case::random(seed, &[2, 3, 4, 5], DType::BF16, DType::F32)
    }

    fn upload(&self, s: &Stream) -> Result<Up> {
        Case::upload(self, s)
    }

    fn outputs(&self, s: &Stream) -> Result<Tensor> {
        Data::filled(self.dtype, &self.x.shape, 777.0).tensor(s)
    }

    fn run(&self, up: &mut Up, s: &Stream) -> Result<Tensor> {
        up.run(s)
    }

    fn run_into(&self, up: &mut Up, s: &Stream, out: &mut Tensor) -> Result<()> {
        up.run_into(s, out)
    }

    fn prepare<'a>(&self, up: &'a mut Up, s: &Stream, out: &'a mut Tensor) -> Result<Prepared<'a>> {
        up.prepare(s, out)
    }

    fn check(&self, _ctx: &Context, s: &Stream, what: &str, out: &Tensor) {
        check(s, what, out, self);
    }

    fn check_res(&self, _ctx: &Context, s: &Stream, what: &str, res: &Tensor) {
        check(s, what, res, self);
    }

    fn out_bits(s: &Stream, out: &Tensor) -> Vec<Vec<u32>> {
        vec![bits(s, out)]
    }
}

/// Asserts that `out` has the case's shape, the target dtype and exactly the reference values
/// (NaN where the reference is NaN).
fn check(s: &Stream, what: &str, out: &Tensor, case: &Case) {
    let got = read_checked(s, what, out, &case.x.shape, case.dtype);
    let exp = case.expected();
    assert_eq!(got.len(), exp.len(), "{what}: element count");
    for (i, (g, e)) in got.iter().zip(&exp).enumerate() {
        assert!(g == e || (g.is_nan() && e.is_nan()), "{what}: element {i} is {g}, expected {e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Values

/// Every (input dtype, target dtype) pair, the identity casts included.
fn every_dtype_pair(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    for (seed, [xdt, dtype]) in (1..).zip(dtype_tuples()) {
        let case = Case::random(seed, &[2, 3, 5], xdt, dtype);
        let out = case.upload(&s)?.run(&s)?;
        check(&s, &format!("{xdt} to {dtype}"), &out, &case);
    }
    Ok(())
}

/// Inputs in every layout: contiguous, channels-last, transposed, spread with an offset; the
/// allocating result is contiguous.
fn layouts(ctx: &Context) -> R {
    let base = Case::random(30, &[2, 5, 3, 4], DType::BF16, DType::F32);
    let rank3 = Case::random(31, &[3, 4, 5], DType::F32, DType::BF16);
    let cases = [
        ("contiguous", base.clone()),
        ("channels-last", Case { x: base.x.permuted(&[0, 2, 3, 1]), ..base.clone() }),
        ("channels-first storage", Case { x: base.x.permuted(&[1, 0, 2, 3]), ..base.clone() }),
        ("spread", Case { x: base.x.spread(3, 7, -5.0), ..base.clone() }),
        ("transposed rank 3", Case { x: rank3.x.permuted(&[2, 1, 0]), ..rank3.clone() }),
    ];
    common::framework::allocating_results(ctx, cases)
}

/// `_into` writes outputs of any non-overlapping layout (channels-last, spread, transposed).
fn strided_outputs(ctx: &Context) -> R {
    let case = Case::random(40, &[2, 3, 4, 5], DType::F16, DType::F32);
    let sentinel = Data::filled(DType::F32, &case.x.shape, 777.0);
    common::framework::strided_outputs(ctx, &case, &sentinel)
}

/// Ranks 1 to 8 (CANN takes 0 to 8; the cast has no channel dim).
fn ranks_1_to_8(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::random(50, &[7], DType::F32, DType::BF16);
    check(&s, "rank 1", &case.upload(&s)?.run(&s)?, &case);
    common::framework::ranks_2_to_8(ctx, |rank, shape| Case::random(50 + rank, shape, DType::BF16, DType::F32))
}

/// Inputs above the CPU's threading threshold (1 MiB read and written), contiguous and
/// channels-last.
fn large_inputs_use_the_threaded_path(ctx: &Context) -> R {
    let cases = [(DType::BF16, DType::F32, false), (DType::F32, DType::F16, true)].map(|(xdt, dt, cl)| {
        let case = Case::random(60, &[4, 24, 48, 64], xdt, dt);
        let case = if cl { Case { x: case.x.permuted(&[0, 2, 3, 1]), ..case } } else { case };
        (format!("large {xdt} to {dt}, channels-last {cl}"), case)
    });
    common::framework::large_inputs(ctx, cases)
}

/// An empty input converts nothing and succeeds.
fn empty_inputs(ctx: &Context) -> R {
    common::framework::empty_inputs(ctx, |shape| Case::random(70, shape, DType::BF16, DType::F32))
}

/// Narrowing rounds to nearest, ties to even; beyond the target's range gives ±inf; NaN and ±inf
/// stay what they are.
fn rounding_overflow_nan_and_inf(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    // 1 + 2⁻⁸ (a bf16 tie, to even: 1), 1 + 3·2⁻⁸ (a tie, up), 65520 (f16 overflow), 1e-8 (f16
    // subnormal range), -0, NaN, ±inf.
    let values = [1.0 + 2f64.powi(-8), 1.0 + 3.0 * 2f64.powi(-8), 65520.0, 1e-8, -0.0, f64::NAN, f64::INFINITY];
    let x = Data::new(DType::F32, &values, &[7]);
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        let case = Case { x: x.clone(), dtype };
        check(&s, &format!("f32 to {dtype}"), &case.upload(&s)?.run(&s)?, &case);
    }
    let neg = Case { x: Data::new(DType::BF16, &[f64::NEG_INFINITY, -3.5], &[2]), dtype: DType::F32 };
    check(&s, "bf16 -inf to f32", &neg.upload(&s)?.run(&s)?, &neg);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Bad arguments

/// Every invalid argument is 161002 naming it, in the allocating, `_into` and prepare forms, and
/// the rejected calls write nothing.
fn bad_arguments(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let case = Case::random(80, &[2, 3, 4], DType::BF16, DType::F32);
    let up = case.upload(&s)?;
    let sentinel = Data::filled(DType::F32, &[2, 3, 4], 777.0);
    let ints = Tensor::zeros(&s, DType::I32, &[2, 3, 4])?;
    let rank9 = Tensor::zeros(&s, DType::F32, &[1, 3, 1, 1, 1, 1, 1, 1, 1])?;
    for (what, x, dtype, arg) in [
        ("i32 input", &ints, DType::F32, "input"),
        ("rank 9 input", &rank9, DType::F32, "input"),
        ("i32 target", &up.x, DType::I32, "dtype"),
    ] {
        expect_invalid(what, cast(&s, x, dtype), arg);
        let mut out = sentinel.tensor(&s)?;
        expect_invalid(what, cast_into(&s, x, dtype, &mut out), arg);
        expect_invalid(what, prepare_cast(&s, x, dtype, &mut out).map(|_| ()), arg);
        assert_eq!(read(&s, &out), sentinel.values(), "{what}: a rejected call wrote the output");
    }
    let outputs = [
        ("output of another shape", Data::filled(DType::F32, &[2, 3, 5], 777.0)),
        ("output of another rank", Data::filled(DType::F32, &[6, 4], 777.0)),
        ("output not of the target dtype", Data::filled(DType::F16, &[2, 3, 4], 777.0)),
        ("output with a stride 0", Data::strided(DType::F32, &[777.0; 12], &[2, 3, 4], &[0, 4, 1], 0)),
    ];
    for (what, init) in outputs {
        let mut out = init.tensor(&s)?;
        expect_invalid(what, up.run_into(&s, &mut out), "output");
        expect_invalid(what, up.prepare(&s, &mut out).map(|_| ()), "output");
        assert_eq!(read(&s, &out), init.values(), "{what}: a rejected call wrote the output");
    }
    Ok(())
}

/// Tensors of the other backend (or a stream of it) are rejected, naming the argument.
fn tensors_from_the_other_backend(ctx: &Context) -> R {
    let Some(other) = other_backend(ctx) else { return Ok(()) };
    let (s, so) = (ctx.new_stream()?, other.new_stream()?);
    let case = Case::random(82, &[2, 3, 4], DType::BF16, DType::F32);
    let (up, foreign) = (case.upload(&s)?, case.upload(&so)?);
    let mut out = Tensor::zeros(&s, DType::F32, &[2, 3, 4])?;
    expect_invalid("input", cast_into(&s, &foreign.x, DType::F32, &mut out), "input");
    let mut foreign_out = Tensor::zeros(&so, DType::F32, &[2, 3, 4])?;
    expect_invalid("output", up.run_into(&s, &mut foreign_out), "output");
    assert!(read(&s, &out).iter().all(|&v| v == 0.0));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Behaviour

/// The same call gives the same bits, through every entry point.
fn deterministic(ctx: &Context) -> R {
    common::framework::deterministic(ctx, Case::random(90, &[3, 5, 7, 9], DType::F32, DType::BF16))
}

// ---------------------------------------------------------------------------------------------
// Mock CANN: what the safe API cannot express

#[cfg(feature = "mock")]
mod mock_only {
    use ascend::sys::aclDataType;
    use common::raw_mock::{INVALID, NULLPTR};

    use super::*;

    /// ops-math's checks the safe API cannot reach, through the raw bindings: a null self or out
    /// is 161001; a `dtype` out of A2/A3's list, an out whose dtype is not `dtype`, an out of
    /// another shape are 161002 (with no executor); a valid call widens bf16 exactly.
    #[test]
    fn raw_arguments() {
        common::raw_mock::isolated(|raw| {
            let x = raw.bf16s(&[2, 3], &[1.0, -2.5, 3.0, 0.0078125, 5.0, -6.0]);
            let out = raw.f32s(&[2, 3], &[0.0; 6]);
            let out_f16 = raw.zeros(aclDataType::ACL_FLOAT16, &[2, 3]);
            let out_long = raw.f32s(&[2, 4], &[0.0; 8]);
            let api = raw.c.operator(&ascend::sys::symbols::CAST).expect("the mock exports it");
            let null = std::ptr::null_mut();
            let phase1 = |x, dtype, o| {
                let (mut ws, mut ex) = (0u64, std::ptr::null_mut());
                // SAFETY: live handles of this session or null (which the mock checks first); the
                // out-pointers are valid locals.
                let st = unsafe { api.aclnnCastGetWorkspaceSize(x, dtype, o, &mut ws, &mut ex) };
                (st, ws, ex)
            };
            let f32 = aclDataType::ACL_FLOAT;
            for (what, want, (st, _, ex)) in [
                ("null self", NULLPTR, phase1(null, f32, out)),
                ("null out", NULLPTR, phase1(x, f32, null)),
                ("dtype INT4 (not on A2/A3)", INVALID, phase1(x, aclDataType::ACL_INT4, out)),
                ("out f16 with dtype f32", INVALID, phase1(x, f32, out_f16)),
                ("out of another shape", INVALID, phase1(x, f32, out_long)),
            ] {
                assert_eq!(st, want, "{what}");
                assert!(ex.is_null(), "{what}: an executor");
            }
            let (st, ws, ex) = phase1(x, f32, out);
            assert_eq!((st, ws), (0, 0));
            // SAFETY: the executor is fresh from phase 1; workspace size 0 with null; default stream.
            assert_eq!(unsafe { api.aclnnCast(null.cast(), 0, ex, null.cast()) }, 0);
            assert_eq!(raw.read_f32(out), [1.0, -2.5, 3.0, 0.0078125, 5.0, -6.0]);
        });
    }
}
