//! Acceptance tests of `ops::batch_norm_reduce_backward` (docs/DESIGN.md "Public API contract"), one
//! body per case run on both backends: `cpu::<case>` always, `mock::<case>` (Ascend over the mock CANN) with
//! `--features mock`. Each mock run holds a lock and checks afterwards that the case left no
//! live device allocation, tensor descriptor, executor or stream behind and counted no
//! violation.
//!
//! Values are checked against the independent f64 reference of `common` with the tolerances
//! stated there (`common::tolerance`: one rounding into the output dtype plus f32 reduction
//! noise scaled with √R and the terms' magnitudes), or exactly where docs/cann/SEMANTICS.md §5 gives exact
//! values. Cases T01–T34 are docs/cann/SEMANTICS.md §5, here; masks, layouts, dtypes, empty and
//! bad arguments and the call's behaviour are in `cases`; the mock operator through the raw
//! bindings (ops-nn's unit cases, a bit-exact replica of its algorithm) in `raw`; the launch path
//! is `framework_tests!`.

mod cases;
#[path = "../common/mod.rs"]
mod common;
#[cfg(feature = "mock")]
mod raw;

use ascend::ops::{
    batch_norm_reduce_backward, batch_norm_reduce_backward_into, prepare_batch_norm_reduce_backward, OutputMask,
    PreparedReduceBackward, ReduceBackward, ReduceBackwardOut, Workspace,
};
use ascend::{bf16, f16, Backend, Context, DType, Error, Result, Stream, Tensor};
use common::*;

type R = Result<()>;

framework_tests!(Inputs);

on_both_backends!(
    t01_doc_example,
    t02_ones_exact,
    t03_contiguous_exact,
    t04_f16,
    t05_bf16,
    t09_grad_dtype_differs_from_input,
    t10_rank_outside_2_to_8,
    t11_output_shape,
    t12_mask_off_outputs_ignored,
    t13_missing_outputs,
    t14_empty_spatial_dim,
    t15_zero_channels,
    t16_atk_c1_f32,
    t17_atk_r1_f32,
    t18_atk_long_channel_f16,
    t19_atk_rank6_f16,
    t20_atk_negative_invstd_f16,
    t21_rank8,
    t22_diopi_f32,
    t23_mask_input_g_only,
    t24_mask_weight_bias_only,
    t25_channels_last,
    t33_weight_never_changes_values,
    t34_transposed_view,
);

impl Framework for Inputs {
    const ACLNN: &'static str = "aclnnBatchNormReduceBackward";
    const MOCK_WORKSPACE: bool = true;
    type Up = Up;
    type Out = Outs;
    type Res = ReduceBackward;

    fn small(seed: u64) -> Inputs {
        Inputs::normal(seed, DType::F32, DType::F32, &[4, 6, 5])
    }

    fn mixed(seed: u64) -> Inputs {
        Inputs::normal(seed, DType::F16, DType::F16, &[2, 3, 4, 5])
    }

    fn upload(&self, s: &Stream) -> Result<Up> {
        Inputs::upload(self, s)
    }

    fn outputs(&self, s: &Stream) -> Result<Outs> {
        Outs::filled(s, self.out_dtype(), self.x.shape[1])
    }

    fn run(&self, up: &mut Up, s: &Stream) -> Result<ReduceBackward> {
        up.run(s, OutputMask::ALL)
    }

    fn run_into(&self, up: &mut Up, s: &Stream, out: &mut Outs) -> R {
        up.run_into(s, OutputMask::ALL, out.all())
    }

    fn prepare<'a>(&self, up: &'a mut Up, s: &Stream, out: &'a mut Outs) -> Result<PreparedReduceBackward<'a>> {
        up.prepare(s, OutputMask::ALL, out.all())
    }

    fn check(&self, _ctx: &Context, s: &Stream, _what: &str, out: &Outs) {
        out.check(s, OutputMask::ALL, &self.expected());
    }

    fn check_res(&self, _ctx: &Context, s: &Stream, _what: &str, res: &ReduceBackward) {
        check_result(s, res, OutputMask::ALL, self.out_dtype(), &self.expected());
    }

    fn out_bits(s: &Stream, out: &Outs) -> Vec<Vec<u32>> {
        out.t.iter().map(|t| bits(s, t)).collect()
    }
}

/// Asserts that an op call with these arguments is rejected with `code`, naming one of
/// `arguments`, in all three forms (allocating, for input errors; `_into`; prepare), and that the rejected `_into`
/// and prepare calls wrote nothing into four pre-filled `[c_out]` outputs.
#[allow(clippy::too_many_arguments)]
fn expect_rejected(
    s: &Stream,
    t: [&Tensor; 4],
    weight: Option<&Tensor>,
    mask: OutputMask,
    outs: &mut Outs,
    code: i32,
    arguments: &[&str],
) {
    let [dy, x, mean, invstd] = t;
    let check = |what: &str, r: Result<()>| match r {
        Err(Error::InvalidArgument { argument, status, message }) => {
            assert_eq!(status, code, "{what}: status for `{argument}`: {message}");
            assert!(arguments.contains(&argument), "{what}: argument `{argument}`, expected one of {arguments:?}");
        }
        other => panic!("{what}: expected InvalidArgument {code} naming one of {arguments:?}, got {other:?}"),
    };
    if code != NULLPTR && !arguments.iter().all(|a| OUTPUT_NAMES.contains(a)) {
        // The allocating form supplies every output itself: only input errors apply to it.
        check("allocating", batch_norm_reduce_backward(s, dy, x, mean, invstd, weight, mask).map(|_| ()));
    }
    check("_into", batch_norm_reduce_backward_into(s, dy, x, mean, invstd, weight, mask, outs.all()));
    outs.assert_untouched(s);
    check("prepare", prepare_batch_norm_reduce_backward(s, dy, x, mean, invstd, weight, mask, outs.all()).map(|_| ()));
    outs.assert_untouched(s);
}

fn f32s(s: &Stream, t: &Option<Tensor>) -> Result<Vec<f32>> {
    t.as_ref().expect("output present").to_vec::<f32>(s)
}

// ---------------------------------------------------------------------------------------------
// docs/cann/SEMANTICS.md §5

/// T01: the documentation's example, exact.
fn t01_doc_example(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let dy = Tensor::from_slice(&s, &[1f32, 1., 1., 2., 2., 2., 3., 3.], &[4, 2])?;
    let x = Tensor::from_slice(&s, &[0f32, 1., 2., 3., 4., 5., 6., 7.], &[4, 2])?;
    let ones = Tensor::from_slice(&s, &[1f32, 1.], &[2])?;
    let out = batch_norm_reduce_backward(&s, &dy, &x, &ones, &ones, Some(&ones), OutputMask::ALL)?;
    assert_eq!(f32s(&s, &out.sum_dy)?, [7.0, 8.0]);
    assert_eq!(f32s(&s, &out.sum_dy_xmu)?, [21.0, 30.0]);
    assert_eq!(f32s(&s, &out.grad_weight)?, [21.0, 30.0]);
    assert_eq!(f32s(&s, &out.grad_bias)?, [7.0, 8.0]);
    for t in outputs(&out) {
        assert_eq!(t.unwrap().dtype(), DType::F32);
        assert_eq!(t.unwrap().shape(), [2]);
    }
    Ok(())
}

/// `b`, the result with every output of `base`'s values in other layouts: right against `base`'s
/// reference, and equal to `base`'s own (contiguous) result within f32 reduction noise. Returns
/// the reference for a case's further checks.
fn check_against_base(s: &Stream, base: &Inputs, b: &ReduceBackward) -> Result<Expected> {
    let exp = base.expected();
    let a = base.upload(s)?.run(s, OutputMask::ALL)?;
    check_result(s, b, OutputMask::ALL, DType::F32, &exp);
    for (i, (ta, tb)) in outputs(&a).into_iter().zip(outputs(b)).enumerate() {
        let (_, cond) = exp.output(i);
        assert_close(OUTPUT_NAMES[i], DType::F32, &read(s, tb.unwrap()), &read(s, ta.unwrap()), cond, exp.r);
    }
    Ok(exp)
}

/// Asserts `got` within one f32 ulp of each `want`.
fn assert_ulp1(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(ulps(*g, *w) <= 1, "{what}: got {got:?}, want {want:?} within 1 ulp");
    }
}

/// T02: dy = x = 1, [2,3,1,4]: exact, gradWeight within 1 f32 ulp.
fn t02_ones_exact(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let up = Inputs::ones(DType::F32, &[2, 3, 1, 4], &[-2.0, 2.0, 1.0], &[0.125, 0.1, 0.3]).upload(&s)?;
    let out = up.run(&s, OutputMask::ALL)?;
    assert_eq!(f32s(&s, &out.sum_dy)?, [8.0; 3]);
    assert_eq!(f32s(&s, &out.sum_dy_xmu)?, [24.0, -8.0, 0.0]);
    assert_ulp1("gradWeight", &f32s(&s, &out.grad_weight)?, &[3.0, -0.8, 0.0]);
    assert_eq!(f32s(&s, &out.grad_bias)?, [8.0; 3]);
    Ok(())
}

/// T03: dy = x = 1, [3,5,3,8]: exact, gradWeight within 1 f32 ulp.
fn t03_contiguous_exact(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let inputs = Inputs::ones(DType::F32, &[3, 5, 3, 8], &[-2.0, 2.0, 1.0, 0.0, -1.0], &[0.125, 0.1, 0.3, 0.05, 0.2]);
    let out = inputs.upload(&s)?.run(&s, OutputMask::ALL)?;
    assert_eq!(f32s(&s, &out.sum_dy)?, [72.0; 5]);
    assert_eq!(f32s(&s, &out.sum_dy_xmu)?, [216.0, -72.0, 0.0, 72.0, 144.0]);
    assert_ulp1("gradWeight", &f32s(&s, &out.grad_weight)?, &[27.0, -7.2, 0.0, 3.6, 28.8]);
    assert_eq!(f32s(&s, &out.grad_bias)?, [72.0; 5]);
    Ok(())
}

/// T02's inputs in `dt` (f16 or bf16) through the allocating form and the `_into` form (into
/// `dt` outputs): `check(name, allocating, into, want, exact)` for each output, where `want` is
/// T02's values with gradWeight[1] = `grad_weight_1` (-8·dt(0.1)) and `exact` the reference;
/// what T04 and T05 check, each against its dtype's rule.
fn t02_in_half(
    s: &Stream,
    dt: DType,
    grad_weight_1: f32,
    check: impl Fn(&str, &Tensor, &Tensor, &[f32; 3], &[f64]) -> R,
) -> R {
    let inputs = Inputs::ones(dt, &[2, 3, 1, 4], &[-2.0, 2.0, 1.0], &[0.125, 0.1, 0.3]);
    let (out, outs) = inputs.run_both_forms(s, dt, 3)?;
    let want = [[8.0; 3], [24.0, -8.0, 0.0], [3.0, grad_weight_1, 0.0], [8.0; 3]];
    let exp = inputs.expected();
    for (i, t) in outputs(&out).into_iter().enumerate() {
        check(OUTPUT_NAMES[i], t.unwrap(), &outs.t[i], &want[i], exp.output(i).0)?;
    }
    Ok(())
}

/// T04: T02 in f16. input and mean f16 → f16 outputs, holding T02's values rounded to f16
/// (gradWeight[1] = -8·f16(0.1) = -0.7998046875, exact); also the opbase f16 check. The `_into`
/// form with f16 outputs gives the same bits.
fn t04_f16(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let grad_weight_1 = -0.799_804_7;
    t02_in_half(&s, DType::F16, grad_weight_1, |name, t, into, want, exact| {
        assert_eq!(t.dtype(), DType::F16, "{name}");
        let got: Vec<f16> = t.to_vec::<f16>(&s)?;
        let want: Vec<f16> = want.iter().map(|&v| f16::from_f32(v)).collect();
        assert_eq!(got, want, "{name}");
        assert_eq!(bits(&s, t), bits(&s, into), "{name}: allocating vs _into");
        assert_opbase(name, DType::F16, &read(&s, t), exact);
        Ok(())
    })?;
    assert_eq!(grad_weight_1, f16::from_f64(-0.7998046875).to_f32());
    Ok(())
}

/// T05: T02 in bf16. The allocating API gives f32 (op-plugin: f16 only for f16+f16), holding
/// exactly T02's values on bf16 inputs (gradWeight[1] = -8·bf16(0.1) = -0.80078125); `_into`
/// with bf16 outputs writes the same values in bf16.
fn t05_bf16(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    t02_in_half(&s, DType::BF16, -0.800_781_25, |name, t, into, want, exact| {
        assert_eq!(t.dtype(), DType::F32, "{name}: bf16 input gives f32 outputs");
        assert_eq!(t.to_vec::<f32>(&s)?, want, "{name}");
        assert_eq!(into.dtype(), DType::BF16);
        let got: Vec<bf16> = into.to_vec::<bf16>(&s)?;
        assert_eq!(got, want.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>(), "{name}");
        assert_opbase(name, DType::BF16, &read(&s, into), exact);
        Ok(())
    })
}

// T08 (gradOut/input int32 → 161002) cannot be written: `Tensor` only holds f32/f16/bf16 (the
// `Element` trait is sealed and `DType` has exactly those three), so the type system rules out
// unsupported dtypes. Its neighbour, gradOut dtype ≠ input dtype, is T09.

/// T09: gradOut dtype ≠ input dtype → 161002, for every unequal pair.
fn t09_grad_dtype_differs_from_input(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let base = Inputs::normal(9, DType::F32, DType::F32, &[2, 3, 1, 4]);
    let up = base.upload(&s)?;
    let mut outs = Outs::filled(&s, DType::F32, 3)?;
    for [gdt, idt] in dtype_tuples().filter(|[gdt, idt]| gdt != idt) {
        let dy = base.dy.cast(gdt).tensor(&s)?;
        let x = base.x.cast(idt).tensor(&s)?;
        let t = [&dy, &x, &up.mean, &up.invstd];
        expect_rejected(&s, t, up.weight.as_ref(), OutputMask::ALL, &mut outs, INVALID, &["gradOut", "input"]);
    }
    Ok(())
}

/// T10: gradOut or input rank 9, both rank 9, rank 1 and rank 0 → 161002; rank 2 and rank 8
/// are accepted (T21 checks values at rank 8).
fn t10_rank_outside_2_to_8(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let mut rng = Rng::new(10);
    let base = Inputs::normal(10, DType::F32, DType::F32, &[2, 3, 1, 4]);
    let up = base.upload(&s)?;
    let mut outs = Outs::filled(&s, DType::F32, 3)?;
    let t9 = Data::normal(&mut rng, DType::F32, &[2, 3, 1, 4, 9, 5, 2, 4, 7], 0.0, 1.0).tensor(&s)?;
    let small9 = Data::normal(&mut rng, DType::F32, &[2, 3, 1, 1, 1, 1, 1, 1, 2], 0.0, 1.0).tensor(&s)?;
    let w = up.weight.as_ref();
    let both = ["gradOut", "input"];
    expect_rejected(&s, [&t9, &up.x, &up.mean, &up.invstd], w, OutputMask::ALL, &mut outs, INVALID, &both);
    expect_rejected(&s, [&up.dy, &t9, &up.mean, &up.invstd], w, OutputMask::ALL, &mut outs, INVALID, &both);
    expect_rejected(&s, [&small9, &small9, &up.mean, &up.invstd], w, OutputMask::ALL, &mut outs, INVALID, &both);
    // rank 1: [3] (dim 1 does not even exist) and rank 0.
    let r1 = Tensor::from_slice(&s, &[1f32, 2., 3.], &[3])?;
    expect_rejected(&s, [&r1, &r1, &up.mean, &up.invstd], w, OutputMask::ALL, &mut outs, INVALID, &both);
    let r0 = Tensor::from_slice(&s, &[1f32], &[])?;
    expect_rejected(&s, [&r0, &r0, &up.mean, &up.invstd], w, OutputMask::ALL, &mut outs, INVALID, &both);
    // rank 2 works
    let d2 = Inputs::normal(11, DType::F32, DType::F32, &[5, 3]);
    let out = d2.upload(&s)?.run(&s, OutputMask::ALL)?;
    check_result(&s, &out, OutputMask::ALL, DType::F32, &d2.expected());
    Ok(())
}

/// T11: a masked-on output of shape [5] (C = 3) → 161002; the same tensor as a masked-off
/// output is ignored and stays untouched.
fn t11_output_shape(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let inputs = Inputs::normal(11, DType::F32, DType::F32, &[2, 3, 1, 4]);
    let up = inputs.upload(&s)?;
    let mut outs = Outs::new(
        &s,
        [
            sentinel(DType::F32, 5, 0),
            sentinel(DType::F32, 3, 1),
            sentinel(DType::F32, 3, 2),
            sentinel(DType::F32, 3, 3),
        ],
    )?;
    let t = [&up.dy, &up.x, &up.mean, &up.invstd];
    expect_rejected(&s, t, up.weight.as_ref(), OutputMask::ALL, &mut outs, INVALID, &["sumDy"]);
    let mask = OutputMask { input_g: false, weight_g: true, bias_g: true };
    outs.check_run_into(&s, &up, mask, &inputs.expected())?;
    Ok(())
}

/// T12: f16, mask [0,1,1]: sumDy given with a wrong shape and dtype, sumDyXmu not given → OK;
/// sumDy untouched, gradWeight/gradBias correct.
fn t12_mask_off_outputs_ignored(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let (up, exp) = Inputs::normal(12, DType::F16, DType::F16, &[2, 3, 1, 4]).upload_with_expected(&s)?;
    let mask = OutputMask { input_g: false, weight_g: true, bias_g: true };
    let mut bogus = Tensor::from_slice(&s, &[5f32; 7], &[7])?;
    let mut gw = sentinel(DType::F16, 3, 2).tensor(&s)?;
    let mut gb = sentinel(DType::F16, 3, 3).tensor(&s)?;
    up.run_into(
        &s,
        mask,
        ReduceBackwardOut {
            sum_dy: Some(&mut bogus),
            sum_dy_xmu: None,
            grad_weight: Some(&mut gw),
            grad_bias: Some(&mut gb),
        },
    )?;
    assert_eq!(bogus.to_vec::<f32>(&s)?, [5.0; 7]);
    check_tensor(&s, "gradWeight", &gw, DType::F16, 2, &exp);
    check_tensor(&s, "gradBias", &gb, DType::F16, 3, &exp);
    // The same outputs with nothing for the masked-off slots.
    let mut outs = Outs::filled(&s, DType::F16, 3)?;
    outs.check_run_into_masked(&s, &up, mask, &exp)?;
    Ok(())
}

/// T13: a missing output the mask turns on → 161001, for each of the four; reported before an
/// invalid output shape or invalid inputs (CANN's null checks come first). (gradOut/input/mean/invstd "NULL" cannot be
/// written: they are references.)
fn t13_missing_outputs(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let up = Inputs::normal(13, DType::F32, DType::F32, &[2, 3, 1, 4]).upload(&s)?;
    for missing in 0..4 {
        let mut outs = Outs::filled(&s, DType::F32, 3)?;
        let [a, b, c, d] = &mut outs.t;
        let mut slots = [Some(a), Some(b), Some(c), Some(d)];
        slots[missing] = None;
        let [a, b, c, d] = slots;
        let out = ReduceBackwardOut { sum_dy: a, sum_dy_xmu: b, grad_weight: c, grad_bias: d };
        let err = up.run_into(&s, OutputMask::ALL, out).unwrap_err();
        assert_eq!(err.status(), Some(NULLPTR), "{} missing: {err}", OUTPUT_NAMES[missing]);
        assert!(
            matches!(&err, Error::InvalidArgument { argument, .. } if *argument == OUTPUT_NAMES[missing]),
            "{err:?}"
        );
        outs.assert_untouched(&s);
        // the same through prepare
        let [a, b, c, d] = &mut outs.t;
        let mut slots = [Some(a), Some(b), Some(c), Some(d)];
        slots[missing] = None;
        let [a, b, c, d] = slots;
        let out = ReduceBackwardOut { sum_dy: a, sum_dy_xmu: b, grad_weight: c, grad_bias: d };
        assert_eq!(status_of(up.prepare(&s, OutputMask::ALL, out)), NULLPTR);
        outs.assert_untouched(&s);
    }
    // sumDyXmu missing and sumDy of a wrong shape: the null is reported.
    let mut bad = Tensor::zeros(&s, DType::F32, &[5])?;
    let mut outs = Outs::filled(&s, DType::F32, 3)?;
    let [_, _, c, d] = &mut outs.t;
    let out = ReduceBackwardOut { sum_dy: Some(&mut bad), sum_dy_xmu: None, grad_weight: Some(c), grad_bias: Some(d) };
    assert_eq!(status_of(up.run_into(&s, OutputMask::ALL, out)), NULLPTR);
    // No outputs at all with the mask on.
    assert_eq!(status_of(up.run_into(&s, OutputMask::ALL, ReduceBackwardOut::default())), NULLPTR);
    // A missing output is reported before invalid inputs (CANN checks every null first), in
    // _into and prepare alike.
    let rank9 = Tensor::zeros(&s, DType::F32, &[2, 3, 1, 1, 1, 1, 1, 1, 2])?;
    let long_mean = Tensor::zeros(&s, DType::F32, &[4])?;
    let f16_dy = Tensor::zeros(&s, DType::F16, &[2, 3, 1, 4])?;
    for (dy, x, mean) in [(&rank9, &rank9, &up.mean), (&up.dy, &up.x, &long_mean), (&f16_dy, &up.x, &up.mean)] {
        let mut outs = Outs::filled(&s, DType::F32, 3)?;
        let [a, _, c, d] = &mut outs.t;
        let out = ReduceBackwardOut { sum_dy: Some(a), sum_dy_xmu: None, grad_weight: Some(c), grad_bias: Some(d) };
        let r = batch_norm_reduce_backward_into(&s, dy, x, mean, &up.invstd, None, OutputMask::ALL, out);
        assert_eq!(status_of(r), NULLPTR);
        let r = prepare_batch_norm_reduce_backward(
            &s,
            dy,
            x,
            mean,
            &up.invstd,
            None,
            OutputMask::ALL,
            ReduceBackwardOut::default(),
        );
        assert_eq!(status_of(r), NULLPTR);
        outs.assert_untouched(&s);
    }
    Ok(())
}

/// T14: [2,3,0,4] → success, every enabled output zeros(3), allocating and `_into` (outputs
/// pre-filled with non-zeros).
fn t14_empty_spatial_dim(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let inputs = Inputs::empty(&[2, 3, 0, 4], &[-2.0, 2.0, 1.0], &[0.125, 0.1, 0.3]);
    let (out, outs) = inputs.run_both_forms(&s, DType::F32, 3)?;
    for t in outputs(&out) {
        assert_eq!(t.unwrap().to_vec::<f32>(&s)?, [0.0; 3]);
    }
    for t in &outs.t {
        assert_eq!(t.to_vec::<f32>(&s)?, [0.0; 3]);
    }
    Ok(())
}

/// T15: [4,0,3] (C = 0) → 161002; also with N = 0 too.
fn t15_zero_channels(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let mut outs = Outs::filled(&s, DType::F32, 1)?;
    let none = Tensor::zeros(&s, DType::F32, &[0])?;
    for shape in [[4usize, 0, 3], [0, 0, 3]] {
        let t = Tensor::zeros(&s, DType::F32, &shape)?;
        expect_rejected(&s, [&t, &t, &none, &none], None, OutputMask::ALL, &mut outs, INVALID, &["input", "gradOut"]);
    }
    Ok(())
}

/// Runs `inputs` with every output on, checks the values against the reference (close) and,
/// when `opbase`, the opbase MERE/MARE standard for the output dtype.
fn run_and_check(ctx: &Context, inputs: &Inputs, mask: OutputMask, opbase: bool) -> Result<ReduceBackward> {
    let s = ctx.new_stream()?;
    let out = inputs.upload(&s)?.run(&s, mask)?;
    let exp = inputs.expected();
    check_result(&s, &out, mask, inputs.out_dtype(), &exp);
    if opbase {
        for (i, t) in outputs(&out).into_iter().enumerate() {
            if let Some(t) = t {
                assert_opbase(OUTPUT_NAMES[i], inputs.out_dtype(), &read(&s, t), exp.output(i).0);
            }
        }
    }
    Ok(out)
}

/// T16: [7,1] f32, ATK U(-10,10); opbase f32.
fn t16_atk_c1_f32(ctx: &Context) -> R {
    run_and_check(ctx, &Inputs::atk(16, DType::F32, &[7, 1]), OutputMask::ALL, true).map(|_| ())
}

/// T17: [1,21] f32, R = 1: sumDy and gradBias equal dy exactly.
fn t17_atk_r1_f32(ctx: &Context) -> R {
    let inputs = Inputs::atk(17, DType::F32, &[1, 21]);
    let out = run_and_check(ctx, &inputs, OutputMask::ALL, true)?;
    let s = ctx.new_stream()?;
    let dy: Vec<f64> = inputs.dy.values();
    assert_eq!(read(&s, out.sum_dy.as_ref().unwrap()), dy);
    assert_eq!(read(&s, out.grad_bias.as_ref().unwrap()), dy);
    Ok(())
}

/// T18: [20,1,16,9] f16 (C = 1, R = 2880), ATK; opbase f16.
fn t18_atk_long_channel_f16(ctx: &Context) -> R {
    run_and_check(ctx, &Inputs::atk(18, DType::F16, &[20, 1, 16, 9]), OutputMask::ALL, true).map(|_| ())
}

/// T19: [7,1,1,21,1,8] f16 (rank 6), ATK; opbase f16.
fn t19_atk_rank6_f16(ctx: &Context) -> R {
    run_and_check(ctx, &Inputs::atk(19, DType::F16, &[7, 1, 1, 21, 1, 8]), OutputMask::ALL, true).map(|_| ())
}

/// T20: [1,8,1,7] f16, ATK with negative invstd: gradWeight's sign follows invstd.
fn t20_atk_negative_invstd_f16(ctx: &Context) -> R {
    let inputs = Inputs::atk(20, DType::F16, &[1, 8, 1, 7]);
    let invstd = inputs.invstd.values();
    assert!(invstd.iter().any(|&v| v < 0.0) && invstd.iter().any(|&v| v > 0.0), "seed gives both signs");
    let out = run_and_check(ctx, &inputs, OutputMask::ALL, true)?;
    let s = ctx.new_stream()?;
    let xmu = read(&s, out.sum_dy_xmu.as_ref().unwrap());
    let gw = read(&s, out.grad_weight.as_ref().unwrap());
    for c in 0..8 {
        if xmu[c] != 0.0 && gw[c] != 0.0 {
            assert_eq!(gw[c].signum(), xmu[c].signum() * invstd[c].signum(), "channel {c}");
        }
    }
    Ok(())
}

/// T21: rank 8 [2,3,2,2,2,2,2,2] f32 N(0,1): accepted, correct.
fn t21_rank8(ctx: &Context) -> R {
    let mut inputs = Inputs::normal(21, DType::F32, DType::F32, &[2, 3, 2, 2, 2, 2, 2, 2]);
    inputs.x = Data::normal(&mut Rng::new(2121), DType::F32, &[2, 3, 2, 2, 2, 2, 2, 2], 0.0, 1.0);
    run_and_check(ctx, &inputs, OutputMask::ALL, true).map(|_| ())
}

/// T22: [2,64,32,32] f32, all randn (mean too); DIOPI's atol 1e-3 + rtol 1e-4 on top of the
/// reference check. (DIOPI also runs f64 on the CPU path: this API has no f64.)
fn t22_diopi_f32(ctx: &Context) -> R {
    let shape = [2, 64, 32, 32];
    let mut rng = Rng::new(22);
    let inputs = Inputs {
        dy: Data::normal(&mut rng, DType::F32, &shape, 0.0, 1.0),
        x: Data::normal(&mut rng, DType::F32, &shape, 0.0, 1.0),
        mean: Data::normal(&mut rng, DType::F32, &[64], 0.0, 1.0),
        invstd: Data::normal(&mut rng, DType::F32, &[64], 0.0, 1.0),
        weight: Some(Data::normal(&mut rng, DType::F32, &[64], 0.0, 1.0)),
    };
    let out = run_and_check(ctx, &inputs, OutputMask::ALL, false)?;
    let s = ctx.new_stream()?;
    let exp = inputs.expected();
    for (i, t) in outputs(&out).into_iter().enumerate() {
        let got = read(&s, t.unwrap());
        for (c, (g, e)) in got.iter().zip(exp.output(i).0).enumerate() {
            assert!((g - e).abs() <= 1e-3 + 1e-4 * e.abs(), "{}[{c}]: {g} vs {e}", OUTPUT_NAMES[i]);
        }
    }
    Ok(())
}

/// T23: [2,96,28] mask [1,0,0]: only sumDy and sumDyXmu.
fn t23_mask_input_g_only(ctx: &Context) -> R {
    let mask = OutputMask { input_g: true, weight_g: false, bias_g: false };
    let out = run_and_check(ctx, &Inputs::normal(23, DType::F32, DType::F32, &[2, 96, 28]), mask, false)?;
    assert!(out.sum_dy.is_some() && out.sum_dy_xmu.is_some() && out.grad_weight.is_none() && out.grad_bias.is_none());
    Ok(())
}

/// T24: [2,16] mask [0,1,1]: only gradWeight and gradBias (unlike PyTorch's 2-D path).
fn t24_mask_weight_bias_only(ctx: &Context) -> R {
    let mask = OutputMask { input_g: false, weight_g: true, bias_g: true };
    let out = run_and_check(ctx, &Inputs::normal(24, DType::F32, DType::F32, &[2, 16]), mask, false)?;
    assert!(out.sum_dy.is_none() && out.sum_dy_xmu.is_none() && out.grad_weight.is_some() && out.grad_bias.is_some());
    Ok(())
}

/// T25: [8,100,8,8] channels-last (NHWC strides): correct, abs 1e-2 of the reference, and equal
/// to the NCHW-contiguous result within f32 reduction noise.
fn t25_channels_last(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let nchw = Inputs::normal(25, DType::F32, DType::F32, &[8, 100, 8, 8]);
    let nhwc = nchw.permuted(&[0, 2, 3, 1], &[0, 2, 3, 1]);
    assert_eq!(nhwc.x.strides, [6400, 1, 800, 100]);
    let up = nhwc.upload(&s)?;
    assert!(!up.x.is_contiguous());
    let b = up.run(&s, OutputMask::ALL)?;
    let exp = check_against_base(&s, &nchw, &b)?;
    for (i, tb) in outputs(&b).into_iter().enumerate() {
        let (gb, (e, _)) = (read(&s, tb.unwrap()), exp.output(i));
        for c in 0..100 {
            assert!((gb[c] - e[c]).abs() <= 1e-2, "{}[{c}]", OUTPUT_NAMES[i]);
        }
    }
    Ok(())
}

/// T33: weight never changes a value: None, ones and random weights give bit-identical outputs
/// (allocating and `_into`).
fn t33_weight_never_changes_values(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let inputs = Inputs::normal(33, DType::F32, DType::F32, &[3, 4, 5]);
    let up = inputs.upload(&s)?;
    let ones = Tensor::from_slice(&s, &[1f32; 4], &[4])?;
    let random = inputs.weight.as_ref().unwrap().tensor(&s)?;
    let huge = Tensor::from_slice(&s, &[f32::NAN, f32::INFINITY, -1e30, 0.0], &[4])?;
    let t = [&up.dy, &up.x, &up.mean, &up.invstd];
    let mut results = vec![];
    for w in [None, Some(&ones), Some(&random), Some(&huge)] {
        let out = batch_norm_reduce_backward(&s, t[0], t[1], t[2], t[3], w, OutputMask::ALL)?;
        let mut outs = Outs::filled(&s, DType::F32, 4)?;
        batch_norm_reduce_backward_into(&s, t[0], t[1], t[2], t[3], w, OutputMask::ALL, outs.all())?;
        let b: Vec<Vec<u32>> = outputs(&out).into_iter().map(|o| bits(&s, o.unwrap())).collect();
        let c: Vec<Vec<u32>> = outs.t.iter().map(|o| bits(&s, o)).collect();
        assert_eq!(b, c, "allocating vs _into");
        results.push(b);
    }
    for r in &results[1..] {
        assert_eq!(r, &results[0], "weight changed a value");
    }
    check_result(&s, &up.run(&s, OutputMask::ALL)?, OutputMask::ALL, DType::F32, &inputs.expected());
    Ok(())
}

/// T34: gradOut and input [4,6,5] given as the transpose of a [5,6,4] storage: equal to the
/// contiguous copy within f32 reduction noise, and to the reference.
fn t34_transposed_view(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let mut rng = Rng::new(34);
    let shape = [4, 6, 5];
    let base = Inputs {
        dy: Data::normal(&mut rng, DType::F32, &shape, 0.0, 1.0),
        x: Data::normal(&mut rng, DType::F32, &shape, 0.0, 1.0),
        mean: Data::normal(&mut rng, DType::F32, &[6], 0.0, 0.1),
        invstd: Data::uniform(&mut rng, DType::F32, &[6], 0.5, 2.0),
        weight: None,
    };
    let tr = base.permuted(&[2, 1, 0], &[2, 1, 0]);
    assert_eq!(tr.x.strides, [1, 4, 24]);
    let b = tr.upload(&s)?.run(&s, OutputMask::ALL)?;
    check_against_base(&s, &base, &b)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tests that are not per backend

/// `Context::auto()` honours `ASCEND_BACKEND` (cpu, ascend, anything else → error). The
/// environment is process-global: this is the only test that touches it (and, with the mock
/// feature, it holds the mock lock and points the default search at the mock toolkit).
#[test]
fn auto_honours_ascend_backend() {
    #[cfg(feature = "mock")]
    let _guard = common::mock::lock();
    assert_eq!(ascend::BACKEND_ENV, "ASCEND_BACKEND");
    let saved = std::env::var_os("ASCEND_BACKEND");
    let saved_home = std::env::var_os("ASCEND_TOOLKIT_HOME");

    std::env::set_var("ASCEND_BACKEND", "cpu");
    let ctx = Context::auto().expect("cpu forced");
    assert_eq!(ctx.backend(), Backend::Cpu);
    t01_doc_example(&ctx).unwrap();

    std::env::set_var("ASCEND_BACKEND", "gpu");
    let err = Context::auto().unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(err.to_string().contains("gpu"), "{err}");

    #[cfg(feature = "mock")]
    std::env::set_var("ASCEND_TOOLKIT_HOME", ascend::mock::toolkit_dir());
    std::env::set_var("ASCEND_BACKEND", "ascend");
    match Context::auto() {
        Ok(ctx) => {
            assert_eq!(ctx.backend(), Backend::Ascend);
            t01_doc_example(&ctx).unwrap();
        }
        // Without CANN (and without the mock) forcing ascend is an error, never a panic.
        Err(e) => {
            if cfg!(feature = "mock") {
                panic!("the mock toolkit should load: {e}");
            }
        }
    }
    std::env::remove_var("ASCEND_BACKEND");
    let ctx = Context::auto().expect("auto never fails without the variable");
    if cfg!(feature = "mock") {
        assert_eq!(ctx.backend(), Backend::Ascend, "CANN (the mock) loads and device 0 answers");
    }
    t01_doc_example(&ctx).unwrap();
    // Context::ascend never panics, whatever the device.
    for id in [-1, 7, i32::MAX] {
        assert!(Context::ascend(id).is_err());
    }

    match saved {
        Some(v) => std::env::set_var("ASCEND_BACKEND", v),
        None => std::env::remove_var("ASCEND_BACKEND"),
    }
    match saved_home {
        Some(v) => std::env::set_var("ASCEND_TOOLKIT_HOME", v),
        None => std::env::remove_var("ASCEND_TOOLKIT_HOME"),
    }
}

/// The CPU backend's zero-copy entry (`ascend::cpu::batch_norm_reduce_backward`) over caller
/// slices: strided outputs get their elements, the gaps between them stay untouched (the safe
/// `Tensor` API offers no way to read a view's gaps, so they are checked here), and a rejected
/// call writes nothing.
#[test]
fn cpu_zero_copy_strided_outputs_keep_gaps() {
    use ascend::cpu::{batch_norm_reduce_backward as cpu_op, Outputs, View, ViewMut};
    let inputs = Inputs::normal(900, DType::F32, DType::F32, &[3, 4, 5]);
    let exp = inputs.expected();
    let f = |d: &Data| d.storage.iter().map(|&v| v as f32).collect::<Vec<f32>>();
    let (dy, x) = (f(&inputs.dy), f(&inputs.x));
    let (mean, invstd) = (f(&inputs.mean), f(&inputs.invstd));
    let shape = [3usize, 4, 5];
    let c = [4usize];
    let mut bufs = vec![vec![-7f32; 10]; 4];
    {
        let [a, b, cc, d] = &mut bufs[..] else { unreachable!() };
        cpu_op(
            View::new(&dy[..], &shape),
            View::new(&x[..], &shape),
            View::new(&mean[..], &c),
            View::new(&invstd[..], &c),
            None,
            OutputMask::ALL,
            Outputs {
                sum_dy: Some(ViewMut::strided(&mut a[..], &c, &[2], 1)),
                sum_dy_xmu: Some(ViewMut::strided(&mut b[..], &c, &[2], 1)),
                grad_weight: Some(ViewMut::strided(&mut cc[..], &c, &[2], 1)),
                grad_bias: Some(ViewMut::strided(&mut d[..], &c, &[2], 1)),
            },
        )
        .unwrap();
    }
    for (i, buf) in bufs.iter().enumerate() {
        let (e, cond) = exp.output(i);
        let got: Vec<f64> = (0..4).map(|k| f64::from(buf[1 + 2 * k])).collect();
        assert_close(OUTPUT_NAMES[i], DType::F32, &got, e, cond, exp.r);
        for k in [0, 2, 4, 6, 8, 9] {
            assert_eq!(buf[k], -7.0, "{} gap {k}", OUTPUT_NAMES[i]);
        }
    }
    // rejected: mean too long; nothing written
    let mut out = vec![-7f32; 4];
    let long = [0f32; 5];
    let err = cpu_op(
        View::new(&dy[..], &shape),
        View::new(&x[..], &shape),
        View::new(&long[..], &[5]),
        View::new(&invstd[..], &c),
        None,
        OutputMask { input_g: false, weight_g: false, bias_g: true },
        Outputs { grad_bias: Some(ViewMut::new(&mut out[..], &c)), ..Default::default() },
    )
    .unwrap_err();
    assert_eq!(err.status(), Some(INVALID));
    assert_eq!(out, [-7.0; 4]);
}
