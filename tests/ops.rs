//! Acceptance tests of the public API (docs/DESIGN.md "Public API contract"), one body per case run
//! on both backends: `cpu::<case>` always, `mock::<case>` (Ascend over the mock CANN) with
//! `--features mock`. Each mock run holds a lock and checks afterwards that the case left no
//! live device allocation, tensor descriptor, executor or stream behind and counted no
//! violation.
//!
//! Values are checked against the independent f64 reference of `common` with the tolerances
//! stated there (`common::tolerance`: one rounding into the output dtype plus f32 reduction
//! noise scaled with √R and the terms' magnitudes), or exactly where docs/cann/SEMANTICS.md §5 gives exact
//! values. Cases T01–T34 are docs/cann/SEMANTICS.md §5.

mod common;

use ascend::ops::{
    batch_norm_reduce_backward, batch_norm_reduce_backward_into, prepare_batch_norm_reduce_backward, OutputMask,
    PreparedReduceBackward, ReduceBackward, ReduceBackwardOut, Workspace,
};
use ascend::{bf16, f16, Backend, Context, DType, Error, Result, Stream, Tensor};
use common::*;

/// aclnn's codes (ACLNN_ERR_PARAM_NULLPTR / ACLNN_ERR_PARAM_INVALID), written out independently.
const NULLPTR: i32 = 161001;
const INVALID: i32 = 161002;

type R = Result<()>;

/// Expands each case `fn name(ctx: &Context) -> R` into `cpu::name` and, with the mock feature,
/// `mock::name` (run isolated: serialised, with the leak/violation check of `common::mock`).
/// The `cross` cases use both backends at once; their CPU run is serialised with the mock runs
/// too.
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
        // docs/cann/SEMANTICS.md §5
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
        // masks
        every_mask_allocating,
        every_mask_into,
        mask_none_still_validates,
        // layouts
        strided_inputs,
        broadcast_input,
        strided_outputs,
        // dtypes
        allocating_output_dtype_rule,
        into_writes_callers_dtypes,
        f16_output_overflows_to_inf,
        // empty inputs
        empty_batch,
        empty_into_zero_fills_prefilled_outputs,
        // bad arguments
        bad_grad_shape,
        bad_per_channel_inputs,
        bad_output_shapes_and_strides,
        bad_tensor_construction,
        error_reports_argument_and_code,
        // behaviour
        deterministic,
        nan_and_inf_propagate,
        two_phase,
        two_phase_dropped_unlaunched,
        to_vec_conversions,
        tensor_metadata,
        context_and_streams,
        refill_with_copy_from_slice,
        one_tensor_on_two_streams,
    ],
    cross: [tensors_from_the_other_backend, two_phase_other_stream],
);

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

/// T04: T02 in f16. input and mean f16 → f16 outputs, holding T02's values rounded to f16
/// (gradWeight[1] = -8·f16(0.1) = -0.7998046875, exact); also the opbase f16 check. The `_into`
/// form with f16 outputs gives the same bits.
fn t04_f16(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let inputs = Inputs::ones(DType::F16, &[2, 3, 1, 4], &[-2.0, 2.0, 1.0], &[0.125, 0.1, 0.3]);
    let up = inputs.upload(&s)?;
    let out = up.run(&s, OutputMask::ALL)?;
    let want: [[f32; 3]; 4] = [[8.0; 3], [24.0, -8.0, 0.0], [3.0, -0.799_804_7, 0.0], [8.0; 3]];
    let exp = inputs.expected();
    let mut outs = Outs::filled(&s, DType::F16, 3)?;
    up.run_into(&s, OutputMask::ALL, outs.all())?;
    for (i, t) in outputs(&out).into_iter().enumerate() {
        let t = t.unwrap();
        assert_eq!(t.dtype(), DType::F16, "{}", OUTPUT_NAMES[i]);
        let got: Vec<f16> = t.to_vec::<f16>(&s)?;
        let want: Vec<f16> = want[i].iter().map(|&v| f16::from_f32(v)).collect();
        assert_eq!(got, want, "{}", OUTPUT_NAMES[i]);
        assert_eq!(bits(&s, t), bits(&s, &outs.t[i]), "{}: allocating vs _into", OUTPUT_NAMES[i]);
        assert_opbase(OUTPUT_NAMES[i], DType::F16, &read(&s, t), exp.output(i).0);
    }
    assert_eq!(want[2][1], f16::from_f64(-0.7998046875).to_f32());
    Ok(())
}

/// T05: T02 in bf16. The allocating API gives f32 (op-plugin: f16 only for f16+f16), holding
/// exactly T02's values on bf16 inputs (gradWeight[1] = -8·bf16(0.1) = -0.80078125); `_into`
/// with bf16 outputs writes the same values in bf16.
fn t05_bf16(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let inputs = Inputs::ones(DType::BF16, &[2, 3, 1, 4], &[-2.0, 2.0, 1.0], &[0.125, 0.1, 0.3]);
    let up = inputs.upload(&s)?;
    let out = up.run(&s, OutputMask::ALL)?;
    let want: [[f32; 3]; 4] = [[8.0; 3], [24.0, -8.0, 0.0], [3.0, -0.800_781_25, 0.0], [8.0; 3]];
    let mut outs = Outs::filled(&s, DType::BF16, 3)?;
    up.run_into(&s, OutputMask::ALL, outs.all())?;
    let exp = inputs.expected();
    for (i, t) in outputs(&out).into_iter().enumerate() {
        let t = t.unwrap();
        assert_eq!(t.dtype(), DType::F32, "{}: bf16 input gives f32 outputs", OUTPUT_NAMES[i]);
        assert_eq!(t.to_vec::<f32>(&s)?, want[i], "{}", OUTPUT_NAMES[i]);
        assert_eq!(outs.t[i].dtype(), DType::BF16);
        let got: Vec<bf16> = outs.t[i].to_vec::<bf16>(&s)?;
        assert_eq!(got, want[i].iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>(), "{}", OUTPUT_NAMES[i]);
        assert_opbase(OUTPUT_NAMES[i], DType::BF16, &read(&s, &outs.t[i]), exp.output(i).0);
    }
    Ok(())
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
    for gdt in DTYPES {
        for idt in DTYPES {
            if gdt == idt {
                continue;
            }
            let dy = base.dy.cast(gdt).tensor(&s)?;
            let x = base.x.cast(idt).tensor(&s)?;
            let t = [&dy, &x, &up.mean, &up.invstd];
            expect_rejected(&s, t, up.weight.as_ref(), OutputMask::ALL, &mut outs, INVALID, &["gradOut", "input"]);
        }
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
    up.run_into(&s, mask, outs.all())?;
    outs.check(&s, mask, &inputs.expected());
    Ok(())
}

/// T12: f16, mask [0,1,1]: sumDy given with a wrong shape and dtype, sumDyXmu not given → OK;
/// sumDy untouched, gradWeight/gradBias correct.
fn t12_mask_off_outputs_ignored(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let inputs = Inputs::normal(12, DType::F16, DType::F16, &[2, 3, 1, 4]);
    let up = inputs.upload(&s)?;
    let exp = inputs.expected();
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
    up.run_into(&s, mask, outs.masked(mask))?;
    outs.check(&s, mask, &exp);
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
    let inputs = Inputs {
        dy: Data::new(DType::F32, &[], &[2, 3, 0, 4]),
        x: Data::new(DType::F32, &[], &[2, 3, 0, 4]),
        mean: Data::new(DType::F32, &[-2.0, 2.0, 1.0], &[3]),
        invstd: Data::new(DType::F32, &[0.125, 0.1, 0.3], &[3]),
        weight: None,
    };
    let up = inputs.upload(&s)?;
    let out = up.run(&s, OutputMask::ALL)?;
    for t in outputs(&out) {
        assert_eq!(t.unwrap().to_vec::<f32>(&s)?, [0.0; 3]);
    }
    let mut outs = Outs::filled(&s, DType::F32, 3)?;
    up.run_into(&s, OutputMask::ALL, outs.all())?;
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
    let mut nhwc = nchw.clone();
    nhwc.dy = nchw.dy.permuted(&[0, 2, 3, 1]);
    nhwc.x = nchw.x.permuted(&[0, 2, 3, 1]);
    assert_eq!(nhwc.x.strides, [6400, 1, 800, 100]);
    let exp = nchw.expected();
    let a = nchw.upload(&s)?.run(&s, OutputMask::ALL)?;
    let up = nhwc.upload(&s)?;
    assert!(!up.x.is_contiguous());
    let b = up.run(&s, OutputMask::ALL)?;
    check_result(&s, &b, OutputMask::ALL, DType::F32, &exp);
    for (i, (ta, tb)) in outputs(&a).into_iter().zip(outputs(&b)).enumerate() {
        let (ga, gb) = (read(&s, ta.unwrap()), read(&s, tb.unwrap()));
        let (e, cond) = exp.output(i);
        assert_close(OUTPUT_NAMES[i], DType::F32, &gb, &ga, cond, exp.r);
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
    let mut tr = base.clone();
    tr.dy = base.dy.permuted(&[2, 1, 0]);
    tr.x = base.x.permuted(&[2, 1, 0]);
    assert_eq!(tr.x.strides, [1, 4, 24]);
    let exp = base.expected();
    let a = base.upload(&s)?.run(&s, OutputMask::ALL)?;
    let b = tr.upload(&s)?.run(&s, OutputMask::ALL)?;
    check_result(&s, &b, OutputMask::ALL, DType::F32, &exp);
    for (i, (ta, tb)) in outputs(&a).into_iter().zip(outputs(&b)).enumerate() {
        let (_, cond) = exp.output(i);
        assert_close(OUTPUT_NAMES[i], DType::F32, &read(&s, tb.unwrap()), &read(&s, ta.unwrap()), cond, exp.r);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Masks

/// Every one of the 8 masks, allocating: outputs present exactly when asked, with the right
/// values.
fn every_mask_allocating(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let inputs = Inputs::normal(100, DType::F32, DType::F32, &[3, 4, 5]);
    let up = inputs.upload(&s)?;
    let exp = inputs.expected();
    for mask in all_masks() {
        check_result(&s, &up.run(&s, mask)?, mask, DType::F32, &exp);
    }
    Ok(())
}

/// Every one of the 8 masks, `_into`: with all four outputs given, the masked-off ones keep
/// their values; with only the enabled ones given, the call succeeds.
fn every_mask_into(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let inputs = Inputs::normal(101, DType::F16, DType::F32, &[3, 4, 5]);
    let up = inputs.upload(&s)?;
    let exp = inputs.expected();
    for mask in all_masks() {
        let mut outs = Outs::filled(&s, DType::F32, 4)?;
        up.run_into(&s, mask, outs.all())?;
        outs.check(&s, mask, &exp);
        let mut outs = Outs::filled(&s, DType::BF16, 4)?;
        up.run_into(&s, mask, outs.masked(mask))?;
        outs.check(&s, mask, &exp);
    }
    Ok(())
}

/// With no output asked for, the call still validates its inputs.
fn mask_none_still_validates(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let up = Inputs::normal(102, DType::F32, DType::F32, &[3, 4]).upload(&s)?;
    let out = up.run(&s, OutputMask::NONE)?;
    assert!(outputs(&out).iter().all(Option::is_none));
    up.run_into(&s, OutputMask::NONE, ReduceBackwardOut::default())?;
    let long_mean = Tensor::zeros(&s, DType::F32, &[5])?;
    let mut outs = Outs::filled(&s, DType::F32, 4)?;
    let t = [&up.dy, &up.x, &long_mean, &up.invstd];
    expect_rejected(&s, t, None, OutputMask::NONE, &mut outs, INVALID, &["mean"]);
    assert_eq!(OutputMask::default(), OutputMask::NONE);
    assert_eq!(OutputMask::ALL, OutputMask { input_g: true, weight_g: true, bias_g: true });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Layouts

/// Non-contiguous everything: gradOut channels-last, input transposed, mean/invstd/weight
/// strided with offsets; equal to the reference and to the contiguous result.
fn strided_inputs(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let base = Inputs::normal(200, DType::F32, DType::F16, &[3, 5, 4, 2]);
    let mut st = base.clone();
    st.dy = base.dy.permuted(&[0, 2, 3, 1]);
    st.x = base.x.permuted(&[3, 2, 1, 0]);
    st.mean = base.mean.spread(2, 1, 99.0);
    st.invstd = base.invstd.spread(3, 4, -99.0);
    st.weight = base.weight.as_ref().map(|w| w.spread(2, 3, 7.0));
    assert_eq!(st.mean.strides, [2]);
    assert_eq!(st.mean.offset, 1);
    let exp = base.expected();
    let a = base.upload(&s)?.run(&s, OutputMask::ALL)?;
    let b = st.upload(&s)?.run(&s, OutputMask::ALL)?;
    check_result(&s, &b, OutputMask::ALL, DType::F32, &exp);
    for (i, (ta, tb)) in outputs(&a).into_iter().zip(outputs(&b)).enumerate() {
        let (_, cond) = exp.output(i);
        assert_close(OUTPUT_NAMES[i], DType::F32, &read(&s, tb.unwrap()), &read(&s, ta.unwrap()), cond, exp.r);
    }
    Ok(())
}

/// A broadcast view (stride 0 along N) is a valid input.
fn broadcast_input(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let mut rng = Rng::new(201);
    let row = Data::normal(&mut rng, DType::F32, &[3], 0.0, 1.0);
    let mut inputs = Inputs::normal(201, DType::F32, DType::F32, &[6, 3]);
    inputs.dy = Data::strided(DType::F32, &row.storage, &[6, 3], &[0, 1], 0);
    let out = run_and_check(ctx, &inputs, OutputMask::ALL, false)?;
    let sum_dy = read(&s, out.sum_dy.as_ref().unwrap());
    for (got, v) in sum_dy.iter().zip(&row.storage) {
        assert!((got - 6.0 * v).abs() <= 1e-5 * (1.0 + v.abs()), "{got} vs 6·{v}");
    }
    Ok(())
}

/// Strided outputs (stride 2, offset 1; stride 3, offset 2; in f32, f16, bf16): the view's
/// elements get the values. A stride-0 output is allowed when C = 1.
fn strided_outputs(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let inputs = Inputs::normal(202, DType::F32, DType::F32, &[4, 6, 3]);
    let up = inputs.upload(&s)?;
    let exp = inputs.expected();
    let init = [
        sentinel(DType::F32, 6, 0).spread(2, 1, -1.0),
        sentinel(DType::F16, 6, 1).spread(3, 2, -2.0),
        sentinel(DType::BF16, 6, 2).spread(2, 0, -3.0),
        sentinel(DType::F32, 6, 3).spread(5, 4, -4.0),
    ];
    assert_eq!((init[0].strides[0], init[0].offset), (2, 1));
    for mask in all_masks() {
        let mut outs = Outs::new(&s, init.clone())?;
        assert!(!outs.t[0].is_contiguous());
        up.run_into(&s, mask, outs.all())?;
        outs.check(&s, mask, &exp);
    }
    // C = 1: a stride-0 view of one element is fine.
    let one = Inputs::normal(203, DType::F32, DType::F32, &[4, 1, 3]);
    let up1 = one.upload(&s)?;
    let mut outs = Outs::new(&s, std::array::from_fn(|i| Data::strided(DType::F32, &[5.0 + i as f64], &[1], &[0], 0)))?;
    up1.run_into(&s, OutputMask::ALL, outs.all())?;
    outs.check(&s, OutputMask::ALL, &one.expected());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// dtypes

/// The allocating API's dtype: f16 iff input and mean are both f16, else f32 (bf16 included),
/// whatever invstd/weight are; values close in that dtype.
fn allocating_output_dtype_rule(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let mut seed = 300;
    for dt in DTYPES {
        for sdt in DTYPES {
            seed += 1;
            let mut inputs = Inputs::normal(seed, dt, sdt, &[2, 3, 4]);
            // invstd and weight in yet another dtype: they do not pick the output dtype.
            let other = DTYPES[(seed as usize) % 3];
            inputs.invstd = inputs.invstd.cast(other);
            inputs.weight = inputs.weight.map(|w| w.cast(DTYPES[(seed as usize + 1) % 3]));
            let want = if dt == DType::F16 && sdt == DType::F16 { DType::F16 } else { DType::F32 };
            assert_eq!(inputs.out_dtype(), want);
            let out = inputs.upload(&s)?.run(&s, OutputMask::ALL)?;
            check_result(&s, &out, OutputMask::ALL, want, &inputs.expected());
        }
    }
    Ok(())
}

/// `_into` writes whatever dtype the caller's tensors have, each output its own, for every
/// input dtype.
fn into_writes_callers_dtypes(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    for (k, dt) in DTYPES.into_iter().enumerate() {
        let inputs = Inputs::normal(310 + k as u64, dt, DType::F32, &[3, 5, 4]);
        let up = inputs.upload(&s)?;
        let exp = inputs.expected();
        for odt in DTYPES {
            let mut outs = Outs::filled(&s, odt, 5)?;
            up.run_into(&s, OutputMask::ALL, outs.all())?;
            outs.check(&s, OutputMask::ALL, &exp);
        }
        let mixed = [DType::F16, DType::BF16, DType::F32, DType::F16];
        let mut outs = Outs::new(&s, std::array::from_fn(|i| sentinel(mixed[i], 5, i)))?;
        up.run_into(&s, OutputMask::ALL, outs.all())?;
        outs.check(&s, OutputMask::ALL, &exp);
    }
    Ok(())
}

/// f16 outputs overflow to inf as a cast from f32 does (SEMANTICS §4.3); f32 outputs of the
/// same f16 data hold the exact sums.
fn f16_output_overflows_to_inf(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let inputs = Inputs {
        dy: Data::filled(DType::F16, &[4, 2], 40000.0),
        x: Data::filled(DType::F16, &[4, 2], 1.0),
        mean: Data::filled(DType::F16, &[2], 0.0),
        invstd: Data::filled(DType::F16, &[2], 1.0),
        weight: None,
    };
    let up = inputs.upload(&s)?;
    let out = up.run(&s, OutputMask::ALL)?;
    for t in outputs(&out) {
        assert_eq!(t.unwrap().dtype(), DType::F16);
        assert_eq!(t.unwrap().to_vec::<f32>(&s)?, [f32::INFINITY; 2]);
    }
    let mut outs = Outs::filled(&s, DType::F32, 2)?;
    up.run_into(&s, OutputMask::ALL, outs.all())?;
    for t in &outs.t {
        assert_eq!(t.to_vec::<f32>(&s)?, [160000.0; 2]);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Empty inputs

/// N = 0 (and a zero spatial dim): success, each enabled output zeros of length C, for every
/// mask and dtype rule.
fn empty_batch(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    for (shape, dt) in [([0usize, 3, 4], DType::F32), ([2, 3, 0], DType::F16), ([0, 3, 0], DType::BF16)] {
        let inputs = Inputs {
            dy: Data::new(dt, &[], &shape),
            x: Data::new(dt, &[], &shape),
            mean: Data::new(dt, &[1.0, 2.0, 3.0], &[3]),
            invstd: Data::new(dt, &[1.0, 2.0, 3.0], &[3]),
            weight: Some(Data::new(dt, &[1.0, 2.0, 3.0], &[3])),
        };
        let up = inputs.upload(&s)?;
        for mask in all_masks() {
            let out = up.run(&s, mask)?;
            for (t, on) in outputs(&out).into_iter().zip(enabled(mask)) {
                assert_eq!(t.is_some(), on);
                if let Some(t) = t {
                    assert_eq!(t.dtype(), inputs.out_dtype());
                    assert_eq!(t.to_vec::<f32>(&s)?, [0.0; 3], "{shape:?} {mask:?}");
                }
            }
        }
    }
    Ok(())
}

/// Empty input with `_into` outputs pre-filled with non-zeros (contiguous and strided, every
/// dtype): the enabled ones become zeros, the others keep their values.
fn empty_into_zero_fills_prefilled_outputs(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let inputs = Inputs {
        dy: Data::new(DType::F32, &[], &[2, 3, 0, 4]),
        x: Data::new(DType::F32, &[], &[2, 3, 0, 4]),
        mean: Data::new(DType::F32, &[1.0, 2.0, 3.0], &[3]),
        invstd: Data::new(DType::F32, &[1.0, 2.0, 3.0], &[3]),
        weight: None,
    };
    let up = inputs.upload(&s)?;
    let exp = inputs.expected();
    assert_eq!(exp.sum_dy, [0.0; 3]);
    for mask in all_masks() {
        let init = [
            sentinel(DType::F32, 3, 0),
            sentinel(DType::F16, 3, 1).spread(2, 1, 5.0),
            sentinel(DType::BF16, 3, 2),
            sentinel(DType::F32, 3, 3).spread(3, 2, 6.0),
        ];
        let mut outs = Outs::new(&s, init)?;
        up.run_into(&s, mask, outs.all())?;
        outs.check(&s, mask, &exp);
        for (i, on) in enabled(mask).into_iter().enumerate() {
            if on {
                assert_eq!(read(&s, &outs.t[i]), [0.0; 3]);
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Bad arguments

/// gradOut shape ≠ input shape (other size, other C, other rank) → 161002.
fn bad_grad_shape(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let up = Inputs::normal(400, DType::F32, DType::F32, &[4, 3, 5]).upload(&s)?;
    let mut outs = Outs::filled(&s, DType::F32, 3)?;
    let w = up.weight.as_ref();
    for shape in [vec![4, 3, 2], vec![4, 2, 5], vec![4, 3, 5, 1], vec![3, 4, 5], vec![4, 3, 6]] {
        let dy = Tensor::zeros(&s, DType::F32, &shape)?;
        let t = [&dy, &up.x, &up.mean, &up.invstd];
        expect_rejected(&s, t, w, OutputMask::ALL, &mut outs, INVALID, &["gradOut", "input"]);
        let t = [&up.x, &dy, &up.mean, &up.invstd];
        let mut o = Outs::filled(&s, DType::F32, shape[1])?;
        expect_rejected(&s, t, None, OutputMask::ALL, &mut o, INVALID, &["gradOut", "input", "mean", "invstd"]);
    }
    Ok(())
}

/// mean/invstd/weight of length ≠ C or rank ≠ 1 → 161002 naming the argument.
fn bad_per_channel_inputs(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let up = Inputs::normal(401, DType::F32, DType::F32, &[4, 3, 5]).upload(&s)?;
    let mut outs = Outs::filled(&s, DType::F32, 3)?;
    let bad: Vec<Tensor> = [vec![4], vec![2], vec![1], vec![0], vec![3, 1], vec![1, 3], vec![]]
        .iter()
        .map(|shape| Tensor::zeros(&s, DType::F32, shape))
        .collect::<Result<_>>()?;
    for b in &bad {
        for mask in [OutputMask::ALL, OutputMask { input_g: false, weight_g: false, bias_g: true }] {
            let w = up.weight.as_ref();
            expect_rejected(&s, [&up.dy, &up.x, b, &up.invstd], w, mask, &mut outs, INVALID, &["mean"]);
            expect_rejected(&s, [&up.dy, &up.x, &up.mean, b], w, mask, &mut outs, INVALID, &["invstd"]);
            expect_rejected(&s, [&up.dy, &up.x, &up.mean, &up.invstd], Some(b), mask, &mut outs, INVALID, &["weight"]);
        }
    }
    Ok(())
}

/// Outputs the mask turns on with shape ≠ [C] (one bad among good ones), or stride 0 with C > 1
/// → 161002, nothing written.
fn bad_output_shapes_and_strides(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let up = Inputs::normal(402, DType::F32, DType::F32, &[4, 3, 5]).upload(&s)?;
    let t = [&up.dy, &up.x, &up.mean, &up.invstd];
    let bad_shapes: [&[usize]; 6] = [&[4], &[2], &[0], &[1, 3], &[3, 1], &[]];
    for which in 0..4 {
        for shape in bad_shapes {
            let n: usize = shape.iter().product();
            let bad = Data::new(DType::F32, &vec![77.0; n], shape);
            let mut init: [Data; 4] = std::array::from_fn(|i| sentinel(DType::F32, 3, i));
            init[which] = bad.clone();
            let mut outs = Outs::new(&s, init)?;
            expect_rejected(&s, t, None, OutputMask::ALL, &mut outs, INVALID, &[OUTPUT_NAMES[which]]);
        }
        let mut init: [Data; 4] = std::array::from_fn(|i| sentinel(DType::F32, 3, i));
        init[which] = Data::strided(DType::F32, &[1.0, 2.0], &[3], &[0], 1);
        let mut outs = Outs::new(&s, init)?;
        expect_rejected(&s, t, None, OutputMask::ALL, &mut outs, INVALID, &[OUTPUT_NAMES[which]]);
    }
    Ok(())
}

/// A tensor of the other backend, in any argument (or as an output) → 161002, nothing written.
/// (Without the mock feature there is no other backend and this case checks nothing.)
fn tensors_from_the_other_backend(ctx: &Context) -> R {
    let Some(other) = other_backend(ctx) else { return Ok(()) };
    let s = ctx.new_stream()?;
    let so = other.new_stream()?;
    let inputs = Inputs::normal(403, DType::F32, DType::F32, &[4, 3, 5]);
    let up = inputs.upload(&s)?;
    let foreign = inputs.upload(&so)?;
    let w = up.weight.as_ref();
    let mut outs = Outs::filled(&s, DType::F32, 3)?;
    let any = ["gradOut", "input", "mean", "invstd", "weight"];
    let cases: [([&Tensor; 4], Option<&Tensor>); 5] = [
        ([&foreign.dy, &up.x, &up.mean, &up.invstd], w),
        ([&up.dy, &foreign.x, &up.mean, &up.invstd], w),
        ([&up.dy, &up.x, &foreign.mean, &up.invstd], w),
        ([&up.dy, &up.x, &up.mean, &foreign.invstd], w),
        ([&up.dy, &up.x, &up.mean, &up.invstd], foreign.weight.as_ref()),
    ];
    for (t, w) in cases {
        expect_rejected(&s, t, w, OutputMask::ALL, &mut outs, INVALID, &any);
    }
    // all inputs foreign: the stream is the odd one out
    let t = [&foreign.dy, &foreign.x, &foreign.mean, &foreign.invstd];
    expect_rejected(&s, t, None, OutputMask::ALL, &mut outs, INVALID, &any);
    // an output from the other backend
    for which in 0..4 {
        let mut outs = Outs::filled(&s, DType::F32, 3)?;
        let mut foreign_out = sentinel(DType::F32, 3, which).tensor(&so)?;
        let [a, b, c, d] = &mut outs.t;
        let mut slots = [Some(a), Some(b), Some(c), Some(d)];
        slots[which] = Some(&mut foreign_out);
        let [a, b, c, d] = slots;
        let out = ReduceBackwardOut { sum_dy: a, sum_dy_xmu: b, grad_weight: c, grad_bias: d };
        let err = up.run_into(&s, OutputMask::ALL, out).unwrap_err();
        assert_eq!(err.status(), Some(INVALID), "{err}");
        outs.assert_untouched(&s);
        assert_eq!(read(&so, &foreign_out), sentinel(DType::F32, 3, which).values());
    }
    // reading a tensor through the other backend's stream
    assert_eq!(status_of(up.dy.to_vec::<f32>(&so)), INVALID);
    Ok(())
}

/// Tensor construction rejects what would read outside the data: from_slice with a length ≠
/// the shape's, strided views reaching past the storage, strides of the wrong rank, zeros of an
/// unaddressable size → 161002.
fn bad_tensor_construction(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let data = [1f32, 2., 3., 4., 5., 6.];
    assert_eq!(status_of(Tensor::from_slice(&s, &data, &[4, 2])), INVALID);
    assert_eq!(status_of(Tensor::from_slice(&s, &data, &[5])), INVALID);
    assert_eq!(status_of(Tensor::from_slice(&s, &data[..0], &[1])), INVALID);
    assert_eq!(status_of(Tensor::from_slice(&s, &data, &[usize::MAX, 2])), INVALID);
    // zeros of a size no memory can hold: the same error on both backends, never a panic
    for n in [usize::MAX, 1 << 62, 1 << 61] {
        assert_eq!(status_of(Tensor::zeros(&s, DType::F32, &[n])), INVALID);
    }
    assert_eq!(status_of(Tensor::zeros(&s, DType::F16, &[usize::MAX, 2])), INVALID);
    // strided views
    assert_eq!(status_of(Tensor::from_slice_strided(&s, &data, &[2, 3], &[3, 1], 1)), INVALID);
    assert_eq!(status_of(Tensor::from_slice_strided(&s, &data, &[3, 2], &[1, 3], 1)), INVALID);
    assert_eq!(status_of(Tensor::from_slice_strided(&s, &data, &[4], &[2], 0)), INVALID);
    assert_eq!(status_of(Tensor::from_slice_strided(&s, &data, &[1], &[1], 6)), INVALID);
    assert_eq!(status_of(Tensor::from_slice_strided(&s, &data, &[2, 3], &[3], 0)), INVALID);
    assert_eq!(status_of(Tensor::from_slice_strided(&s, &data, &[2], &[usize::MAX], 0)), INVALID);
    assert_eq!(status_of(Tensor::from_slice_strided(&s, &data, &[0, 2], &[2, 1], 7)), INVALID);
    // the edges that are inside
    let t = Tensor::from_slice_strided(&s, &data, &[3], &[2], 1)?;
    assert_eq!(t.to_vec::<f32>(&s)?, [2.0, 4.0, 6.0]);
    let t = Tensor::from_slice_strided(&s, &data, &[2, 2], &[0, 5], 0)?;
    assert_eq!(t.to_vec::<f32>(&s)?, [1.0, 6.0, 1.0, 6.0]);
    let t = Tensor::from_slice_strided(&s, &data, &[0, 2], &[2, 1], 6)?;
    assert_eq!(t.to_vec::<f32>(&s)?, Vec::<f32>::new());
    Ok(())
}

/// Errors say which argument, what was expected, and the code with its name.
fn error_reports_argument_and_code(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let up = Inputs::normal(404, DType::F32, DType::F32, &[4, 3, 5]).upload(&s)?;
    let long_mean = Tensor::zeros(&s, DType::F32, &[4])?;
    let err = batch_norm_reduce_backward(&s, &up.dy, &up.x, &long_mean, &up.invstd, None, OutputMask::ALL).unwrap_err();
    assert!(matches!(&err, Error::InvalidArgument { argument: "mean", status: INVALID, .. }), "{err:?}");
    assert_eq!(err.status(), Some(INVALID));
    assert_eq!(err.status_name(), Some("ACLNN_ERR_PARAM_INVALID"));
    let text = err.to_string();
    for needle in ["mean", "161002", "ACLNN_ERR_PARAM_INVALID", "[3]", "[4]"] {
        assert!(text.contains(needle), "`{text}` should mention {needle}");
    }
    let err = up.run_into(&s, OutputMask::ALL, ReduceBackwardOut::default()).unwrap_err();
    assert_eq!(err.status(), Some(NULLPTR));
    assert_eq!(err.status_name(), Some("ACLNN_ERR_PARAM_NULLPTR"));
    assert!(err.to_string().contains("sumDy") && err.to_string().contains("161001"), "{err}");
    assert_eq!((ascend::STATUS_NULLPTR, ascend::STATUS_INVALID), (NULLPTR, INVALID));
    let e: Box<dyn std::error::Error + Send + Sync> = Box::new(err);
    assert!(!e.to_string().is_empty());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Behaviour

/// The same inputs give bit-identical outputs across runs, streams, masks and API forms.
fn deterministic(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let s2 = ctx.new_stream()?;
    let mut inputs = Inputs::normal(500, DType::F32, DType::F32, &[6, 5, 7, 3]);
    inputs.mean = Data::uniform(&mut Rng::new(5000), DType::F32, &[5], -2.0, 2.0);
    let up = inputs.upload(&s)?;
    let all: Vec<Vec<u32>> = outputs(&up.run(&s, OutputMask::ALL)?).into_iter().map(|t| bits(&s, t.unwrap())).collect();
    for _ in 0..3 {
        let again: Vec<Vec<u32>> =
            outputs(&up.run(&s, OutputMask::ALL)?).into_iter().map(|t| bits(&s, t.unwrap())).collect();
        assert_eq!(again, all);
    }
    let up2 = inputs.upload(&s2)?;
    let other: Vec<Vec<u32>> =
        outputs(&up2.run(&s2, OutputMask::ALL)?).into_iter().map(|t| bits(&s2, t.unwrap())).collect();
    assert_eq!(other, all, "another stream");
    assert_eq!(all[0], all[3], "gradBias = sumDy bit for bit");
    for mask in all_masks() {
        let out = up.run(&s, mask)?;
        for (i, t) in outputs(&out).into_iter().enumerate() {
            if let Some(t) = t {
                assert_eq!(bits(&s, t), all[i], "{} under {mask:?}", OUTPUT_NAMES[i]);
            }
        }
        let mut outs = Outs::filled(&s, DType::F32, 5)?;
        up.run_into(&s, mask, outs.masked(mask))?;
        for (i, on) in enabled(mask).into_iter().enumerate() {
            if on {
                assert_eq!(bits(&s, &outs.t[i]), all[i], "_into {} under {mask:?}", OUTPUT_NAMES[i]);
            }
        }
    }
    let mut outs = Outs::filled(&s, DType::F32, 5)?;
    up.prepare(&s, OutputMask::ALL, outs.all())?.launch(&s, None)?;
    let two_phase: Vec<Vec<u32>> = outs.t.iter().map(|t| bits(&s, t)).collect();
    assert_eq!(two_phase, all, "two-phase");
    check_result(&s, &up.run(&s, OutputMask::ALL)?, OutputMask::ALL, DType::F32, &inputs.expected());
    Ok(())
}

/// NaN and Inf propagate as IEEE arithmetic does, channel by channel (other channels stay
/// exact): NaN in dy → all NaN; +Inf in x with dy > 0 → sumDyXmu = +Inf; +Inf and −Inf in one
/// channel → NaN; dy = 0 at x = Inf → NaN (0·Inf); invstd = Inf → gradWeight ±Inf; NaN mean →
/// sumDyXmu NaN but sumDy finite; a clean channel stays finite and correct.
fn nan_and_inf_propagate(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let (n, c, w) = (4, 8, 3);
    let shape = [n, c, w];
    let mut rng = Rng::new(600);
    let mut dy = Data::uniform(&mut rng, DType::F32, &shape, 0.5, 1.5); // all positive
    let mut x = Data::normal(&mut rng, DType::F32, &shape, 0.0, 1.0);
    let mut mean = Data::uniform(&mut rng, DType::F32, &[c], -0.5, 0.5);
    let mut invstd = Data::uniform(&mut rng, DType::F32, &[c], 0.5, 2.0);
    let at = |d: &Data, i: [usize; 3]| d.index(&i);
    let k = at(&dy, [1, 0, 2]);
    dy.storage[k] = f64::NAN; // channel 0
    let k = at(&x, [2, 1, 0]);
    x.storage[k] = f64::INFINITY; // channel 1
    let (k1, k2) = (at(&x, [0, 2, 1]), at(&x, [3, 2, 2]));
    x.storage[k1] = f64::INFINITY; // channel 2
    x.storage[k2] = f64::NEG_INFINITY;
    let (k1, k2) = (at(&x, [1, 3, 1]), at(&dy, [1, 3, 1]));
    x.storage[k1] = f64::INFINITY; // channel 3
    dy.storage[k2] = 0.0;
    invstd.storage[4] = f64::INFINITY; // channel 4
    invstd.storage[5] = f64::NEG_INFINITY; // channel 5
    mean.storage[6] = f64::NAN; // channel 6; channel 7 stays clean
    let inputs = Inputs { dy, x, mean, invstd, weight: None };
    let exp = inputs.expected();
    assert!(exp.sum_dy[0].is_nan() && exp.sum_dy_xmu[0].is_nan());
    assert_eq!(exp.sum_dy_xmu[1], f64::INFINITY);
    assert!(exp.sum_dy_xmu[2].is_nan() && exp.sum_dy_xmu[3].is_nan() && exp.sum_dy_xmu[6].is_nan());
    assert!(exp.grad_weight[4].is_infinite() && exp.grad_weight[5].is_infinite());
    assert!(exp.sum_dy[1..].iter().all(|v| v.is_finite()));
    assert!(exp.sum_dy_xmu[7].is_finite() && exp.grad_weight[7].is_finite());
    let out = inputs.upload(&s)?.run(&s, OutputMask::ALL)?;
    check_result(&s, &out, OutputMask::ALL, DType::F32, &exp);
    // f16 and bf16 too (Inf/NaN survive the casts)
    for dt in [DType::F16, DType::BF16] {
        let mut cast = inputs.clone();
        cast.dy = cast.dy.cast(dt);
        cast.x = cast.x.cast(dt);
        let out = cast.upload(&s)?.run(&s, OutputMask::ALL)?;
        check_result(&s, &out, OutputMask::ALL, DType::F32, &cast.expected());
    }
    Ok(())
}

/// The two-phase API: prepare → workspace_size → launch with `None` and with a caller-owned
/// `Workspace` of exactly that size; a too-small workspace → 161002, nothing written.
fn two_phase(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let inputs = Inputs::normal(700, DType::F32, DType::F32, &[4, 6, 5]);
    let up = inputs.upload(&s)?;
    let exp = inputs.expected();
    let mut a = Outs::filled(&s, DType::F32, 6)?;
    let p = up.prepare(&s, OutputMask::ALL, a.all())?;
    let size = p.workspace_size();
    if ctx.backend() == Backend::Cpu {
        assert_eq!(size, 0);
    }
    p.launch(&s, None)?;
    a.check(&s, OutputMask::ALL, &exp);

    let mut b = Outs::filled(&s, DType::F32, 6)?;
    let p = up.prepare(&s, OutputMask::ALL, b.all())?;
    assert_eq!(p.workspace_size(), size, "same call, same workspace size");
    let ws = Workspace::new(&s, size)?;
    assert_eq!(ws.size(), size);
    p.launch(&s, Some(&ws))?;
    for i in 0..4 {
        assert_eq!(bits(&s, &a.t[i]), bits(&s, &b.t[i]));
    }
    // A larger workspace is fine; reusing one is fine.
    let big = Workspace::new(&s, size + 4096)?;
    for _ in 0..2 {
        let mut c = Outs::filled(&s, DType::F32, 6)?;
        up.prepare(&s, OutputMask::ALL, c.all())?.launch(&s, Some(&big))?;
        c.check(&s, OutputMask::ALL, &exp);
    }
    if size > 0 {
        let small = Workspace::new(&s, size - 1)?;
        let mut d = Outs::filled(&s, DType::F32, 6)?;
        let err = up.prepare(&s, OutputMask::ALL, d.all())?.launch(&s, Some(&small)).unwrap_err();
        assert_eq!(err.status(), Some(INVALID), "{err}");
        d.assert_untouched(&s);
        let zero = Workspace::new(&s, 0)?;
        let err = up.prepare(&s, OutputMask::ALL, d.all())?.launch(&s, Some(&zero)).unwrap_err();
        assert_eq!(err.status(), Some(INVALID), "{err}");
        d.assert_untouched(&s);
    }
    // Validation happens in phase 1.
    let long_mean = Tensor::zeros(&s, DType::F32, &[7])?;
    let mut e = Outs::filled(&s, DType::F32, 6)?;
    let r =
        prepare_batch_norm_reduce_backward(&s, &up.dy, &up.x, &long_mean, &up.invstd, None, OutputMask::ALL, e.all());
    assert_eq!(status_of(r), INVALID);
    e.assert_untouched(&s);
    Ok(())
}

/// A prepared call dropped without launch writes nothing.
fn two_phase_dropped_unlaunched(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let up = Inputs::normal(701, DType::F32, DType::F32, &[4, 6, 5]).upload(&s)?;
    let mut a = Outs::filled(&s, DType::F32, 6)?;
    let p = up.prepare(&s, OutputMask::ALL, a.all())?;
    let _ = format!("{p:?}");
    drop(p);
    s.synchronize()?;
    a.assert_untouched(&s);
    Ok(())
}

/// Phase 2 on another stream of the same context works; on a stream of the other backend it is
/// rejected (161002) and writes nothing.
fn two_phase_other_stream(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let s2 = ctx.new_stream()?;
    let inputs = Inputs::normal(702, DType::F32, DType::F32, &[4, 6, 5]);
    let up = inputs.upload(&s)?;
    let mut a = Outs::filled(&s, DType::F32, 6)?;
    up.prepare(&s, OutputMask::ALL, a.all())?.launch(&s2, None)?;
    a.check(&s2, OutputMask::ALL, &inputs.expected());
    a.check(&s, OutputMask::ALL, &inputs.expected());
    if let Some(other) = other_backend(ctx) {
        let so = other.new_stream()?;
        let mut b = Outs::filled(&s, DType::F32, 6)?;
        let err = up.prepare(&s, OutputMask::ALL, b.all())?.launch(&so, None).unwrap_err();
        assert_eq!(err.status(), Some(INVALID), "{err}");
        b.assert_untouched(&s);
        // A workspace of the other backend. A CPU launch needs no workspace, so ignoring an
        // Ascend one is harmless; an Ascend launch that needs workspace memory must not accept a
        // CPU workspace (it holds none, so the kernel would get a null pointer).
        let mut c = Outs::filled(&s, DType::F32, 6)?;
        let p = up.prepare(&s, OutputMask::ALL, c.all())?;
        let needed = p.workspace_size();
        let ws = Workspace::new(&so, needed.max(64))?;
        match p.launch(&s, Some(&ws)) {
            Ok(()) => {
                assert!(ctx.backend() == Backend::Cpu || needed == 0, "a CPU workspace given for {needed} bytes");
                c.check(&s, OutputMask::ALL, &inputs.expected());
            }
            Err(e) => {
                assert_eq!(e.status(), Some(INVALID), "{e}");
                c.assert_untouched(&s);
            }
        }
    }
    Ok(())
}

/// `to_vec` converts between dtypes (exact widening, round-to-nearest narrowing, inf on f16
/// overflow) and reads views in row-major order.
fn to_vec_conversions(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let vals = [1.0f32, 1.0 / 3.0, 65520.0, 1e-8, -2.5, 0.1, f32::INFINITY, -0.0];
    let t = Tensor::from_slice(&s, &vals, &[2, 4])?;
    assert_eq!(t.to_vec::<f32>(&s)?, vals);
    let h: Vec<f16> = t.to_vec(&s)?;
    assert_eq!(h, vals.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>());
    assert_eq!(h[2], f16::INFINITY);
    let b: Vec<bf16> = t.to_vec(&s)?;
    assert_eq!(b, vals.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>());
    let hv: Vec<f16> = vals.iter().map(|&v| f16::from_f32(v)).collect();
    let th = Tensor::from_slice(&s, &hv, &[8])?;
    assert_eq!(th.dtype(), DType::F16);
    assert_eq!(th.to_vec::<f32>(&s)?, hv.iter().map(|v| v.to_f32()).collect::<Vec<_>>());
    assert_eq!(th.to_vec::<f16>(&s)?, hv);
    let tb = Tensor::from_slice(&s, &b, &[8])?;
    assert_eq!(tb.to_vec::<f32>(&s)?, b.iter().map(|v| v.to_f32()).collect::<Vec<_>>());
    assert_eq!(tb.to_vec::<f16>(&s)?, b.iter().map(|v| f16::from_f32(v.to_f32())).collect::<Vec<_>>());
    // NaN survives
    let tn = Tensor::from_slice(&s, &[f32::NAN], &[1])?;
    assert!(tn.to_vec::<f16>(&s)?[0].is_nan() && tn.to_vec::<bf16>(&s)?[0].is_nan());
    // views: transpose of a 2x3 storage, and a strided one with an offset
    let st = [0f32, 1., 2., 3., 4., 5.];
    let tt = Tensor::from_slice_strided(&s, &st, &[3, 2], &[1, 3], 0)?;
    assert_eq!(tt.to_vec::<f32>(&s)?, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    let tv = Tensor::from_slice_strided(&s, &st, &[2, 2], &[3, 1], 1)?;
    assert_eq!(tv.to_vec::<f16>(&s)?, [1.0f32, 2., 4., 5.].map(f16::from_f32));
    // empty and zeros
    let z = Tensor::zeros(&s, DType::BF16, &[2, 0, 3])?;
    assert!(z.to_vec::<f32>(&s)?.is_empty());
    let z = Tensor::zeros(&s, DType::F16, &[3])?;
    assert_eq!(z.to_vec::<f32>(&s)?, [0.0; 3]);
    Ok(())
}

/// Shape, strides, offset, dtype, numel and contiguity as given.
fn tensor_metadata(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let t = Tensor::from_slice(&s, &[0f32; 24], &[2, 3, 4])?;
    assert_eq!((t.shape(), t.strides(), t.offset(), t.dtype()), (&[2, 3, 4][..], &[12, 4, 1][..], 0, DType::F32));
    assert_eq!((t.numel(), t.storage_len(), t.is_contiguous()), (24, 24, true));
    let v = Tensor::from_slice_strided(&s, &[bf16::ZERO; 30], &[4, 3], &[1, 8], 5)?;
    assert_eq!((v.shape(), v.strides(), v.offset(), v.dtype()), (&[4, 3][..], &[1, 8][..], 5, DType::BF16));
    assert_eq!((v.numel(), v.storage_len(), v.is_contiguous()), (12, 30, false));
    let z = Tensor::zeros(&s, DType::F16, &[5, 0, 2])?;
    assert_eq!((z.shape(), z.dtype(), z.numel()), (&[5, 0, 2][..], DType::F16, 0));
    assert_eq!(t.is_device(), ctx.backend() == Backend::Ascend);
    assert!(!format!("{t:?}").is_empty());
    Ok(())
}

/// Context basics, and a clone of it used from another thread.
fn context_and_streams(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    assert_eq!(s.backend(), ctx.backend());
    assert_eq!(s.context().backend(), ctx.backend());
    match ctx.backend() {
        Backend::Cpu => {
            assert_eq!(ctx.device_id(), None);
            assert!(s.as_raw().is_none());
        }
        Backend::Ascend => {
            assert_eq!(ctx.device_id(), Some(0));
            assert!(s.as_raw().is_some_and(|p| !p.is_null()));
        }
    }
    s.synchronize()?;
    let c2 = ctx.clone();
    let handle = std::thread::spawn(move || -> Result<Vec<f32>> {
        let s = c2.new_stream()?;
        let dy = Tensor::from_slice(&s, &[1f32, 1., 1., 2., 2., 2., 3., 3.], &[4, 2])?;
        let x = Tensor::from_slice(&s, &[0f32, 1., 2., 3., 4., 5., 6., 7.], &[4, 2])?;
        let ones = Tensor::from_slice(&s, &[1f32, 1.], &[2])?;
        let out = batch_norm_reduce_backward(&s, &dy, &x, &ones, &ones, None, OutputMask::ALL)?;
        out.sum_dy_xmu.unwrap().to_vec(&s)
    });
    assert_eq!(handle.join().expect("thread")?, [21.0, 30.0]);
    // A stream (Send) moved to another thread, and tensors shared by reference (Sync).
    let up = Inputs::normal(800, DType::F32, DType::F32, &[3, 2]).upload(&s)?;
    let shared = &up;
    let sum = std::thread::scope(|sc| {
        sc.spawn(move || -> Result<Vec<f32>> {
            let out = shared.run(&s, OutputMask::ALL)?;
            out.sum_dy.unwrap().to_vec(&s)
        })
        .join()
        .expect("thread")
    })?;
    assert_eq!(sum.len(), 2);
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

/// Compile-time properties of the public types (docs/DESIGN.md "Public API contract").
#[test]
fn static_properties() {
    fn clone_send_sync<T: Clone + Send + Sync>() {}
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    fn copy<T: Copy>() {}
    fn debug<T: std::fmt::Debug>() {}
    fn error<T: std::error::Error + Send + Sync + 'static>() {}
    clone_send_sync::<Context>();
    send::<Stream>();
    send_sync::<Tensor>();
    send_sync::<ReduceBackward>();
    send::<Workspace>();
    copy::<OutputMask>();
    copy::<DType>();
    copy::<Backend>();
    error::<Error>();
    debug::<Context>();
    debug::<Backend>();
    debug::<Stream>();
    debug::<Tensor>();
    debug::<DType>();
    debug::<Error>();
    debug::<OutputMask>();
    debug::<ReduceBackward>();
    debug::<ReduceBackwardOut<'static>>();
    debug::<PreparedReduceBackward<'static>>();
    debug::<Workspace>();
    debug::<ascend::cpu::View<'static>>();
    debug::<ascend::cpu::ViewMut<'static>>();
    debug::<ascend::cpu::Outputs<'static>>();

    // Stream is Send but deliberately not Sync (one thread enqueues at a time): this line would
    // not compile (ambiguous impl) if Stream were Sync.
    trait AmbiguousIfSync<A> {
        fn some_item() {}
    }
    impl<T: ?Sized> AmbiguousIfSync<()> for T {}
    impl<T: ?Sized + Sync> AmbiguousIfSync<u8> for T {}
    <Stream as AmbiguousIfSync<_>>::some_item();
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

/// `copy_from_slice` refills a tensor in place (contiguous fast path, strided view, converting
/// dtype), the next launch sees the new values, and a length mismatch is 161002.
fn refill_with_copy_from_slice(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let mut dy = Tensor::from_slice(&s, &[1f32; 8], &[4, 2])?;
    // x as a transposed (non-contiguous) view of a [2, 4] storage.
    let mut x = Tensor::from_slice_strided(&s, &[0f32; 8], &[4, 2], &[1, 4], 0)?;
    let ones = Tensor::from_slice(&s, &[1f32, 1.], &[2])?;
    let mut sum_dy = Tensor::zeros(&s, DType::F32, &[2])?;
    let mut sum_dy_xmu = Tensor::zeros(&s, DType::F16, &[2])?;
    for step in 0..3u8 {
        let k = f32::from(step) + 1.0;
        let dy_vals: Vec<f32> = [1f32, 1., 1., 2., 2., 2., 3., 3.].iter().map(|v| v * k).collect();
        dy.copy_from_slice(&s, &dy_vals)?;
        // x given as f64-rounded bf16 values: converted into the f32 tensor exactly.
        let x_vals: Vec<bf16> = (0..8).map(|v| bf16::from_f32(v as f32)).collect();
        x.copy_from_slice(&s, &x_vals)?;
        let mask = OutputMask { input_g: true, weight_g: false, bias_g: false };
        let out =
            ReduceBackwardOut { sum_dy: Some(&mut sum_dy), sum_dy_xmu: Some(&mut sum_dy_xmu), ..Default::default() };
        batch_norm_reduce_backward_into(&s, &dy, &x, &ones, &ones, None, mask, out)?;
        assert_eq!(sum_dy.to_vec::<f32>(&s)?, [7.0 * k, 8.0 * k], "step {step}");
        assert_eq!(sum_dy_xmu.to_vec::<f32>(&s)?, [21.0 * k, 30.0 * k], "step {step}");
        assert_eq!(x.to_vec::<f32>(&s)?, [0f32, 1., 2., 3., 4., 5., 6., 7.]);
    }
    assert_eq!(status_of(dy.copy_from_slice(&s, &[1f32; 7])), 161002);
    assert_eq!(dy.to_vec::<f32>(&s)?, [3f32, 3., 3., 6., 6., 6., 9., 9.], "a rejected refill wrote nothing");
    Ok(())
}

/// A tensor written on one stream and read on another: the second launch waits for the first, so
/// it reads the finished values (on the mock, an unordered cross-stream access is a violation).
fn one_tensor_on_two_streams(ctx: &Context) -> R {
    let (a, b) = (ctx.new_stream()?, ctx.new_stream()?);
    let mut rng = Rng::new(77);
    let shape = [6, 3, 5];
    let inp = Inputs::normal(rng.next_u64(), DType::F32, DType::F32, &shape);
    let up = inp.upload(&a)?;
    let mut sums = Tensor::zeros(&a, DType::F32, &[3])?;
    let mut xmu = Tensor::zeros(&a, DType::F32, &[3])?;
    let mask = OutputMask { input_g: true, weight_g: false, bias_g: false };
    for s in [&a, &b, &a] {
        let out = ReduceBackwardOut { sum_dy: Some(&mut sums), sum_dy_xmu: Some(&mut xmu), ..Default::default() };
        batch_norm_reduce_backward_into(s, &up.dy, &up.x, &up.mean, &up.invstd, None, mask, out)?;
    }
    let exp = reference(&inp.dy, &inp.x, &inp.mean, &inp.invstd);
    let r = shape[0] * shape[2];
    let (e, cond) = exp.output(0);
    assert_close("sumDy", DType::F32, &read(&b, &sums), e, cond, r);
    let (e, cond) = exp.output(1);
    assert_close("sumDyXmu", DType::F32, &read(&b, &xmu), e, cond, r);
    Ok(())
}
