//! Masks, layouts, dtypes, empty and bad arguments, and the call's behaviour (determinism, NaN,
//! phase 1's validation, streams, refills), on both backends.

use super::*;

on_both_backends!(
    local: [
        every_mask_allocating,
        every_mask_into,
        mask_none_still_validates,
        strided_inputs,
        broadcast_input,
        strided_outputs,
        allocating_output_dtype_rule,
        into_writes_callers_dtypes,
        f16_output_overflows_to_inf,
        empty_batch,
        empty_into_zero_fills_prefilled_outputs,
        bad_grad_shape,
        bad_per_channel_inputs,
        bad_output_shapes_and_strides,
        bad_tensor_construction,
        error_reports_argument_and_code,
        deterministic,
        nan_and_inf_propagate,
        two_phase_validates_in_phase_1,
        refill_with_copy_from_slice,
        one_tensor_on_two_streams,
    ],
    cross: [tensors_from_the_other_backend, two_phase_other_stream],
);

// ---------------------------------------------------------------------------------------------
// Masks

/// Every one of the 8 masks, allocating: outputs present exactly when asked, with the right
/// values.
fn every_mask_allocating(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let (up, exp) = Inputs::normal(100, DType::F32, DType::F32, &[3, 4, 5]).upload_with_expected(&s)?;
    for mask in all_masks() {
        check_result(&s, &up.run(&s, mask)?, mask, DType::F32, &exp);
    }
    Ok(())
}

/// Every one of the 8 masks, `_into`: with all four outputs given, the masked-off ones keep
/// their values; with only the enabled ones given, the call succeeds.
fn every_mask_into(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let (up, exp) = Inputs::normal(101, DType::F16, DType::F32, &[3, 4, 5]).upload_with_expected(&s)?;
    for mask in all_masks() {
        let mut outs = Outs::filled(&s, DType::F32, 4)?;
        outs.check_run_into(&s, &up, mask, &exp)?;
        let mut outs = Outs::filled(&s, DType::BF16, 4)?;
        outs.check_run_into_masked(&s, &up, mask, &exp)?;
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
    let st = Inputs {
        mean: base.mean.spread(2, 1, 99.0),
        invstd: base.invstd.spread(3, 4, -99.0),
        weight: base.weight.as_ref().map(|w| w.spread(2, 3, 7.0)),
        ..base.permuted(&[0, 2, 3, 1], &[3, 2, 1, 0])
    };
    assert_eq!(st.mean.strides, [2]);
    assert_eq!(st.mean.offset, 1);
    let b = st.upload(&s)?.run(&s, OutputMask::ALL)?;
    check_against_base(&s, &base, &b)?;
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
    let (up, exp) = Inputs::normal(202, DType::F32, DType::F32, &[4, 6, 3]).upload_with_expected(&s)?;
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
        outs.check_run_into(&s, &up, mask, &exp)?;
    }
    // C = 1: a stride-0 view of one element is fine.
    let one = Inputs::normal(203, DType::F32, DType::F32, &[4, 1, 3]);
    let up1 = one.upload(&s)?;
    let mut outs = Outs::new(&s, std::array::from_fn(|i| Data::strided(DType::F32, &[5.0 + i as f64], &[1], &[0], 0)))?;
    outs.check_run_into(&s, &up1, OutputMask::ALL, &one.expected())?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// dtypes

/// The allocating API's dtype: f16 iff input and mean are both f16, else f32 (bf16 included),
/// whatever invstd/weight are; values close in that dtype.
fn allocating_output_dtype_rule(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    for (seed, [dt, sdt]) in (301..).zip(dtype_tuples()) {
        let mut inputs = Inputs::normal(seed, dt, sdt, &[2, 3, 4]);
        // invstd and weight in yet another dtype: they do not pick the output dtype.
        let other = DTYPES[(seed as usize) % 3];
        inputs.invstd = inputs.invstd.cast(other);
        inputs.weight = inputs.weight.map(|w| w.cast(DTYPES[(seed as usize + 1) % 3]));
        let want = if dt == DType::F16 && sdt == DType::F16 { DType::F16 } else { DType::F32 };
        assert_eq!(inputs.out_dtype(), want, "{dt}/{sdt}");
        let out = inputs.upload(&s)?.run(&s, OutputMask::ALL)?;
        check_result(&s, &out, OutputMask::ALL, want, &inputs.expected());
    }
    Ok(())
}

/// `_into` writes whatever dtype the caller's tensors have, each output its own, for every
/// input dtype.
fn into_writes_callers_dtypes(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    for (k, dt) in DTYPES.into_iter().enumerate() {
        let (up, exp) = Inputs::normal(310 + k as u64, dt, DType::F32, &[3, 5, 4]).upload_with_expected(&s)?;
        for odt in DTYPES {
            let mut outs = Outs::filled(&s, odt, 5)?;
            outs.check_run_into(&s, &up, OutputMask::ALL, &exp)?;
        }
        let mixed = [DType::F16, DType::BF16, DType::F32, DType::F16];
        let mut outs = Outs::new(&s, std::array::from_fn(|i| sentinel(mixed[i], 5, i)))?;
        outs.check_run_into(&s, &up, OutputMask::ALL, &exp)?;
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
    let (out, outs) = inputs.run_both_forms(&s, DType::F32, 2)?;
    for t in outputs(&out) {
        assert_eq!(t.unwrap().dtype(), DType::F16);
        assert_eq!(t.unwrap().to_vec::<f32>(&s)?, [f32::INFINITY; 2]);
    }
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
    let inputs = Inputs::empty(&[2, 3, 0, 4], &[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]);
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
        outs.check_run_into(&s, &up, mask, &exp)?;
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
/// Validation happens in phase 1: a prepare with a bad argument is refused, writing nothing (the
/// rest of the two phases is `framework_tests!`).
fn two_phase_validates_in_phase_1(ctx: &Context) -> R {
    let s = ctx.new_stream()?;
    let inputs = Inputs::normal(700, DType::F32, DType::F32, &[4, 6, 5]);
    let up = inputs.upload(&s)?;
    let long_mean = Tensor::zeros(&s, DType::F32, &[7])?;
    let mut e = Outs::filled(&s, DType::F32, 6)?;
    let r =
        prepare_batch_norm_reduce_backward(&s, &up.dy, &up.x, &long_mean, &up.invstd, None, OutputMask::ALL, e.all());
    assert_eq!(status_of(r), INVALID);
    e.assert_untouched(&s);
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
