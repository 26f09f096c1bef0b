//! The operator through the raw bindings on the mock CANN, for what the safe API never passes:
//! * each ops-nn unit case of docs/cann/SEMANTICS.md section 3.2 gets the status ops-nn expects,
//!   with `aclGetRecentErrMsg` text — the `ut_*` tests;
//! * the compute matches a bit-exact replica of the hardware's algorithm and an f64 reference,
//!   for f32/f16/bf16 and strided views — the `values_*` tests.
//!
//! Each test is a session of its own (`common::raw_mock::Mock`: serialised, exact deltas of the
//! mock's process-wide counters).

use std::ptr;

use ascend::mock;
use ascend_sys::{aclDataType, aclFormat};
use half::{bf16, f16};

use crate::common::raw_mock::*;
use crate::common::Rng;

// ---------------------------------------------------------------------------------------------
// The documentation's sample (T01)

#[test]
fn values_doc_example() {
    let m = Mock::new();
    let case = Case::new(
        &m,
        aclDataType::ACL_FLOAT,
        &[4, 2],
        &[1., 1., 1., 2., 2., 2., 3., 3.],
        &[0., 1., 2., 3., 4., 5., 6., 7.],
        &[1., 1.],
        &[1., 1.],
    );
    let (ws, ex) = m.phase1_ok(&case.args());
    assert!(ws > 0, "a non-empty launch reports a workspace");
    assert_eq!(mock::stats().live_executors, m.base.live_executors + 1);
    assert_eq!(m.launch_sync(ws, ex, ptr::null_mut()), 0);
    assert_eq!(mock::stats().live_executors, m.base.live_executors, "phase 2 consumes the executor");
    let [sum_dy, sum_dy_xmu, grad_weight, grad_bias] = case.outputs(&m);
    assert_eq!(sum_dy, [7.0, 8.0]);
    assert_eq!(sum_dy_xmu, [21.0, 30.0]);
    assert_eq!(grad_weight, [21.0, 30.0]);
    assert_eq!(grad_bias, [7.0, 8.0]);
    case.release(&m);
    m.expect_violations(0, "");
}

// ---------------------------------------------------------------------------------------------
// ops-nn unit cases (docs/cann/SEMANTICS.md 3.2): GetWorkspaceSize status and message

#[test]
fn ut_dtypes_f32_f16_bf16_ok() {
    let m = Mock::new();
    for dt in [aclDataType::ACL_FLOAT, aclDataType::ACL_FLOAT16, aclDataType::ACL_BF16] {
        let case = ut_case(&m, dt);
        m.expect_ok(&case.args());
        case.release(&m);
    }
    m.expect_violations(0, "");
}

#[test]
fn ut_int32_grad_and_input_invalid() {
    with_ut_case(aclDataType::ACL_INT32, 0, |m, case, _| {
        m.expect_status(&case.args(), INVALID, "Tensor gradOut not implemented for DT_INT32");
    });
}

#[test]
fn ut_mask_off_output_is_not_checked() {
    with_ut_case(aclDataType::ACL_FLOAT16, 0, |m, case, extra| {
        let mut a = case.args();
        // sumDy int32 with inputG = false: OK, and never written
        swap(m, &mut a, 5, &Spec::contiguous(aclDataType::ACL_INT32, &[3]), extra);
        a.g = [false, true, true];
        m.expect_ok(&a);
        assert_eq!(m.d2h(extra[0].mem, 12), vec![0u8; 12], "a masked-off output is never written");
        assert_eq!(m.read(&case.devs[6]), [SENTINEL; 3], "sumDyXmu is masked off too");
        // NULL masked-off outputs are fine too
        a.t[5] = ptr::null_mut();
        a.t[6] = ptr::null_mut();
        m.expect_ok(&a);
        // gradWeight NC1HWC0 with weightG = false: OK
        let mut b = case.args();
        swap(m, &mut b, 7, &f32_spec(&[3]).with_format(aclFormat::ACL_FORMAT_NC1HWC0), extra);
        b.g = [true, false, true];
        m.expect_ok(&b);
        // ... but with weightG = true it is a private format
        b.g = [true, true, true];
        m.expect_status(&b, INVALID, "Format of gradWeight does not support NC1HWC0");
    });
}

#[test]
fn ut_formats() {
    let m = Mock::new();
    let mut rng = Rng::new(7);
    let v = rng.vec_f32(24, -8.0, 8.0);
    for (format, ok) in [
        (aclFormat::ACL_FORMAT_NCHW, true),
        (aclFormat::ACL_FORMAT_NHWC, true),
        (aclFormat::ACL_FORMAT_HWCN, true),
        (aclFormat::ACL_FORMAT_NDHWC, true),
        (aclFormat::ACL_FORMAT_NCDHW, true),
        (aclFormat::ACL_FORMAT_NC1HWC0, false),
        (aclFormat::ACL_FORMAT_FRACTAL_NZ, false),
    ] {
        let s = f32_spec(&[2, 3, 1, 4]).with_format(format);
        let stat = f32_spec(&[3]);
        let specs =
            [s.clone(), s, stat.clone(), stat.clone(), stat.clone(), stat.clone(), stat.clone(), stat.clone(), stat];
        let case = Case::from_specs(&m, specs, &v, &v, &[-2., 2., 1.], &[0.125, 0.1, 0.3]);
        if ok {
            m.expect_ok(&case.args());
        } else {
            m.expect_status(&case.args(), INVALID, "Format of gradOut does not support");
        }
        case.release(&m);
    }
    m.expect_violations(0, "");
}

#[test]
fn ut_empty_input_succeeds_without_writing() {
    let m = Mock::new();
    let c = 3;
    let stat = f32_spec(&[c]);
    let e = f32_spec(&[2, 3, 0, 4]);
    let specs =
        [e.clone(), e, stat.clone(), stat.clone(), stat.clone(), stat.clone(), stat.clone(), stat.clone(), stat];
    let case = Case::from_specs(&m, specs, &[], &[], &[-2., 2., 1.], &[0.125, 0.1, 0.3]);
    assert!(case.devs[0].mem.is_null(), "an empty storage may have null data");
    let (st, ws, ex) = m.phase1(&case.args());
    assert_eq!((st, ws), (0, 0), "{}", m.err());
    assert_eq!(m.launch_sync(ws, ex, ptr::null_mut()), 0);
    for out in case.outputs(&m) {
        assert_eq!(out, [SENTINEL; 3], "A2/A3 leave the outputs of an empty input unwritten");
    }
    assert_eq!(mock::stats().live_executors, m.base.live_executors);
    case.release(&m);
    m.expect_violations(0, "");
}

#[test]
fn ut_rank_outside_2_to_8_invalid() {
    with_ut_case(aclDataType::ACL_FLOAT, 0, |m, case, extra| {
        let rank9 = f32_spec(&[2, 3, 1, 4, 1, 1, 1, 1, 1]);
        for slot in [0, 1] {
            let mut a = case.args();
            swap(m, &mut a, slot, &rank9, extra);
            let name = ["gradOut", "input"][slot];
            m.expect_status(&a, INVALID, &format!("Dim of {name} should be in [2, 8], but got 9"));
        }
        let mut a = case.args();
        swap(m, &mut a, 0, &f32_spec(&[8]), extra);
        swap(m, &mut a, 1, &f32_spec(&[8]), extra);
        m.expect_status(&a, INVALID, "Dim of gradOut should be in [2, 8], but got 1");
        // rank 8 is accepted (T21)
        let mut rng = Rng::new(21);
        let shape = [2, 3, 2, 2, 2, 2, 2, 2];
        let v = rng.vec_f32(384, -1.0, 1.0);
        let big = Case::new(m, aclDataType::ACL_FLOAT, &shape, &v, &v, &[0.1, 0.2, 0.3], &[1.0, 2.0, 3.0]);
        m.expect_ok(&big.args());
        big.release(m);
    });
}

#[test]
fn ut_mismatches_invalid() {
    with_ut_case(aclDataType::ACL_FLOAT, 0, |m, case, extra| {
        // gradOut f32 with input f16
        let mut a = case.args();
        swap(m, &mut a, 1, &Spec::contiguous(aclDataType::ACL_FLOAT16, &[2, 3, 1, 4]), extra);
        m.expect_status(
            &a,
            INVALID,
            "Tensor gradOut dtype DT_FLOAT should be the same as tensor input dtype DT_FLOAT16",
        );
        // gradOut ND with input NHWC
        let mut a = case.args();
        swap(m, &mut a, 1, &f32_spec(&[2, 3, 1, 4]).with_format(aclFormat::ACL_FORMAT_NHWC), extra);
        m.expect_status(&a, INVALID, "Format of gradOut ND should be the same as format of input NHWC");
        // sumDy of shape [5]: invalid with inputG, OK without
        let mut a = case.args();
        swap(m, &mut a, 5, &f32_spec(&[5]), extra);
        m.expect_status(&a, INVALID, "Expected tensor sumDy to have shape [3], but got [5]");
        a.g = [false, true, true];
        m.expect_ok(&a);
        // mean and invstd may have another (supported) dtype than input; outputs too
        let mut a = case.args();
        swap(m, &mut a, 2, &Spec::contiguous(aclDataType::ACL_BF16, &[3]), extra);
        swap(m, &mut a, 8, &Spec::contiguous(aclDataType::ACL_FLOAT16, &[3]), extra);
        m.expect_ok(&a);
        // an unsupported mean dtype
        let mut a = case.args();
        swap(m, &mut a, 3, &Spec::contiguous(aclDataType::ACL_INT32, &[3]), extra);
        m.expect_status(&a, INVALID, "Tensor invstd not implemented for DT_INT32");
        // channel 0 (T15)
        let mut a = case.args();
        swap(m, &mut a, 0, &f32_spec(&[4, 0, 3]), extra);
        swap(m, &mut a, 1, &f32_spec(&[4, 0, 3]), extra);
        m.expect_status(&a, INVALID, "should not be 0");
    });
}

#[test]
fn ut_null_checks_come_first() {
    with_ut_case(aclDataType::ACL_FLOAT, 0, |m, case, extra| {
        let names = ["gradOut", "input", "mean", "invstd", "", "sumDy", "sumDyXmu", "gradWeight", "gradBias"];
        for slot in [0, 1, 2, 3, 5, 6, 7, 8] {
            let mut a = case.args();
            a.t[slot] = ptr::null_mut();
            let needle = format!("Expected a proper Tensor but got null for argument {}.", names[slot]);
            m.expect_status(&a, NULLPTR, &needle);
        }
        // sumDyXmu NULL while gradOut is NC1HWC0: the null check wins
        let mut a = case.args();
        swap(m, &mut a, 0, &f32_spec(&[2, 3, 1, 4]).with_format(aclFormat::ACL_FORMAT_NC1HWC0), extra);
        a.t[6] = ptr::null_mut();
        m.expect_status(&a, NULLPTR, "got null for argument sumDyXmu");
        // weight may be NULL
        let mut a = case.args();
        a.t[4] = ptr::null_mut();
        m.expect_ok(&a);
        // null workspaceSize / executor pointers
        let a = case.args();
        let mut ws = 0u64;
        let mut ex = ptr::null_mut();
        // SAFETY: deliberately null out-pointers; the mock checks them before writing.
        let (st1, st2) =
            unsafe { (m.phase1_to(&a, ptr::null_mut(), &mut ex), m.phase1_to(&a, &mut ws, ptr::null_mut())) };
        assert_eq!((st1, st2), (NULLPTR, NULLPTR));
        assert!(m.err().contains("argument executor"));
    });
}

#[test]
fn ut_precision_and_contiguous_exact_values() {
    let m = Mock::new();
    // T02: dy = x = 1, [2,3,1,4]
    let ones = vec![1.0; 24];
    let case = Case::new(&m, aclDataType::ACL_FLOAT, &[2, 3, 1, 4], &ones, &ones, &[-2., 2., 1.], &[0.125, 0.1, 0.3]);
    m.expect_ok(&case.args());
    let [sum_dy, xmu, gw, gb] = case.outputs(&m);
    assert_eq!(sum_dy, [8.0; 3]);
    assert_eq!(xmu, [24.0, -8.0, 0.0]);
    assert_eq!(gw, [3.0, -8.0f32 * 0.1, 0.0]);
    assert_eq!(gb, [8.0; 3]);
    case.release(&m);
    // T03: [3,5,3,8], dy = x = 1
    let ones = vec![1.0; 360];
    let mean = [-2., 2., 1., 0., -1.];
    let invstd = [0.125, 0.1, 0.3, 0.05, 0.2];
    let case = Case::new(&m, aclDataType::ACL_FLOAT, &[3, 5, 3, 8], &ones, &ones, &mean, &invstd);
    m.expect_ok(&case.args());
    let [sum_dy, xmu, gw, _] = case.outputs(&m);
    assert_eq!(sum_dy, [72.0; 5]);
    assert_eq!(xmu, [216.0, -72.0, 0.0, 72.0, 144.0]);
    let want: Vec<f32> = xmu.iter().zip(invstd).map(|(a, b)| a * b).collect();
    assert_eq!(gw, want);
    case.release(&m);
    m.expect_violations(0, "");
}

// ---------------------------------------------------------------------------------------------
// Values: replica of the hardware algorithm (bit-exact) and an f64 reference

/// f64 two-pass reference per channel: (Σdy, Σdy·(x−mean), Σ|dy·x| + |mean|·Σ|dy|, Σ|dy|), the
/// last two being the scales of the f32 error bounds of sumDyXmu and sumDy.
fn reference(dys: &Spec, dy: &[f32], xs: &Spec, x: &[f32], mean: &[f32], c: usize) -> Vec<(f64, f64, f64, f64)> {
    let shape = &dys.shape;
    let total: i64 = shape.iter().product();
    let mut acc = vec![(0f64, 0f64, 0f64, 0f64); c];
    let mut idx = vec![0i64; shape.len()];
    for _ in 0..total {
        let ch = idx[1] as usize;
        let vd = dy[dys.pos(&idx)] as f64;
        let vx = x[xs.pos(&idx)] as f64;
        let a = &mut acc[ch];
        a.0 += vd;
        a.1 += vd * (vx - mean[ch] as f64);
        a.2 += (vd * vx).abs();
        a.3 += vd.abs();
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    acc.iter().zip(mean).map(|(a, m)| (a.0, a.1, a.2 + (*m as f64).abs() * a.3, a.3)).collect()
}

#[derive(Clone, Copy, Debug)]
enum Layout {
    Contiguous,
    Reversed,
    Padded,
    ChannelsLast,
}

/// A view of `shape` in the given layout over a storage of its own.
fn layout(dt: aclDataType, shape: &[i64], l: Layout, rng: &mut Rng) -> Spec {
    let r = shape.len();
    match l {
        Layout::Contiguous => Spec::contiguous(dt, shape),
        Layout::Reversed => {
            let rev: Vec<i64> = shape.iter().rev().copied().collect();
            let rs = contiguous_strides(&rev);
            let strides: Vec<i64> = (0..r).map(|i| rs[r - 1 - i]).collect();
            Spec::strided(dt, shape, &strides, 0, shape.iter().product())
        }
        Layout::Padded => {
            let start: Vec<i64> = (0..r).map(|_| rng.below(3) as i64).collect();
            let parent: Vec<i64> = shape.iter().zip(&start).map(|(d, s)| d + s + rng.below(2) as i64).collect();
            let strides = contiguous_strides(&parent);
            let offset = start.iter().zip(&strides).map(|(a, b)| a * b).sum();
            Spec::strided(dt, shape, &strides, offset, parent.iter().product())
        }
        Layout::ChannelsLast => {
            // memory order: dim 0, dims 2.., dim 1 fastest
            let mut order: Vec<usize> = vec![0];
            order.extend(2..r);
            order.push(1);
            let mut strides = vec![0i64; r];
            let mut acc = 1;
            for &d in order.iter().rev() {
                strides[d] = acc;
                acc *= shape[d];
            }
            Spec::strided(dt, shape, &strides, 0, shape.iter().product())
        }
    }
}

/// A [C] vector with stride `stride` and offset `offset` over a storage with one spare element.
fn vec_spec(dt: aclDataType, c: i64, stride: i64, offset: i64) -> Spec {
    Spec::strided(dt, &[c], &[stride], offset, offset + (c - 1) * stride + 2)
}

fn out_eps(dt: aclDataType) -> f64 {
    match dt {
        aclDataType::ACL_FLOAT => 1e-6,
        aclDataType::ACL_FLOAT16 => 2f64.powi(-10),
        _ => 2f64.powi(-7),
    }
}

/// Rounds a replica f32 result to the output dtype, as the mock stores it.
fn to_dtype(dt: aclDataType, v: f32) -> f32 {
    quantize(dt, &[v])[0]
}

fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

struct ValueCase {
    shape: Vec<i64>,
    dt: aclDataType,
    stat_dt: aclDataType,
    out_dt: aclDataType,
    dy_layout: Layout,
    x_layout: Layout,
    stat_stride: i64,
    out_stride: i64,
    mean_range: (f32, f32),
}

fn check_values(m: &Mock, rng: &mut Rng, vc: &ValueCase) {
    let c = vc.shape[1];
    let cu = c as usize;
    let dys = layout(vc.dt, &vc.shape, vc.dy_layout, rng);
    let xs = layout(vc.dt, &vc.shape, vc.x_layout, rng);
    let ms = vec_spec(vc.stat_dt, c, vc.stat_stride, 1);
    let is = vec_spec(vc.stat_dt, c, vc.stat_stride, 0);
    let os = vec_spec(vc.out_dt, c, vc.out_stride, 1);
    let dy = quantize(vc.dt, &rng.vec_f32(dys.storage_numel() as usize, -2.0, 2.0));
    let x = quantize(vc.dt, &rng.vec_f32(xs.storage_numel() as usize, -2.0, 2.0));
    let mean = quantize(vc.stat_dt, &rng.vec_f32(ms.storage_numel() as usize, vc.mean_range.0, vc.mean_range.1));
    let inv = quantize(vc.stat_dt, &rng.vec_f32(is.storage_numel() as usize, 0.1, 2.0));
    let specs =
        [dys.clone(), xs.clone(), ms.clone(), is.clone(), f32_spec(&[c]), os.clone(), os.clone(), os.clone(), os];
    let case = Case::from_specs(m, specs, &dy, &x, &mean, &inv);
    m.expect_ok(&case.args());
    let outs = case.outputs(m);

    let mean_c: Vec<f32> = (0..c).map(|i| mean[ms.pos_linear(i)]).collect();
    let inv_c: Vec<f32> = (0..c).map(|i| inv[is.pos_linear(i)]).collect();
    let (r_dy, r_xmu, r_gw) = replica(&dys, &dy, &xs, &x, &mean_c, &inv_c, cu);
    let refs = reference(&dys, &dy, &xs, &x, &mean_c, cu);
    let os = &case.devs[5].spec;
    let what = format!(
        "{:?} {:?}/{:?}/{:?} dy {:?} x {:?}",
        vc.shape, vc.dt, vc.stat_dt, vc.out_dt, vc.dy_layout, vc.x_layout
    );
    for (k, out) in outs.iter().enumerate() {
        // positions outside the output view keep the sentinel
        for (p, v) in out.iter().enumerate() {
            let in_view = (0..c).any(|i| os.pos_linear(i) == p);
            if !in_view {
                assert_eq!(*v, to_dtype(vc.out_dt, SENTINEL), "{what}: output {k} written outside its view at {p}");
            }
        }
        let got: Vec<f32> = (0..c).map(|i| out[os.pos_linear(i)]).collect();
        let (exact, want_f64): (Vec<f32>, Vec<f64>) = match k {
            0 | 3 => (r_dy.clone(), refs.iter().map(|r| r.0).collect()),
            1 => (r_xmu.clone(), refs.iter().map(|r| r.1).collect()),
            _ => (r_gw.clone(), refs.iter().zip(&inv_c).map(|(r, s)| r.1 * *s as f64).collect()),
        };
        for i in 0..cu {
            let e = to_dtype(vc.out_dt, exact[i]);
            assert!(same_bits(got[i], e), "{what}: output {k}[{i}] = {} but the replica gives {e}", got[i]);
            let scale = if k == 0 || k == 3 { refs[i].3 } else { refs[i].2 };
            let scale = if k == 2 { scale * inv_c[i] as f64 } else { scale };
            let tol = 1e-5 * scale + out_eps(vc.out_dt) * want_f64[i].abs() + 1e-30;
            let err = (got[i] as f64 - want_f64[i]).abs();
            assert!(
                err <= tol,
                "{what}: output {k}[{i}] = {} vs f64 {} (err {err:e} > tol {tol:e})",
                got[i],
                want_f64[i]
            );
        }
    }
    case.release(m);
}

#[test]
fn values_random_dtypes_and_strided_views() {
    let m = Mock::new();
    let mut rng = Rng::new(0xC0FFEE);
    let f32_ = aclDataType::ACL_FLOAT;
    let f16_ = aclDataType::ACL_FLOAT16;
    let bf16_ = aclDataType::ACL_BF16;
    let shapes: [&[i64]; 6] = [&[7, 1], &[1, 21], &[4, 6, 5], &[3, 4, 2, 5], &[2, 3, 2, 2, 3], &[20, 2, 16, 9]];
    let layouts = [Layout::Contiguous, Layout::Reversed, Layout::Padded, Layout::ChannelsLast];
    let dts = [(f32_, f32_, f32_), (f16_, f16_, f16_), (bf16_, bf16_, bf16_), (f16_, f32_, f32_), (bf16_, f16_, bf16_)];
    let mut n = 0;
    for (si, shape) in shapes.iter().enumerate() {
        for (di, &(dt, stat_dt, out_dt)) in dts.iter().enumerate() {
            let vc = ValueCase {
                shape: shape.to_vec(),
                dt,
                stat_dt,
                out_dt,
                dy_layout: layouts[(si + di) % 4],
                x_layout: layouts[(si + 2 * di + 1) % 4],
                stat_stride: 1 + (di as i64 % 3),
                out_stride: 1 + (si as i64 % 2),
                mean_range: (-1.0, 1.0),
            };
            check_values(&m, &mut rng, &vc);
            n += 1;
        }
    }
    assert_eq!(n, 30);
    m.expect_violations(0, "");
}

#[test]
fn values_long_channel_keeps_f32_accuracy() {
    let m = Mock::new();
    let mut rng = Rng::new(42);
    let vc = ValueCase {
        shape: vec![1024, 2, 96],
        dt: aclDataType::ACL_FLOAT,
        stat_dt: aclDataType::ACL_FLOAT,
        out_dt: aclDataType::ACL_FLOAT,
        dy_layout: Layout::Contiguous,
        x_layout: Layout::ChannelsLast,
        stat_stride: 1,
        out_stride: 1,
        mean_range: (-0.5, 0.5),
    };
    check_values(&m, &mut rng, &vc);
    m.expect_violations(0, "");
}

/// Runs the op on dy of shape [1, n] (x = 1, mean = 0) with sumDy and gradBias in `out_dts`;
/// returns (sumDy, gradBias) as raw bytes.
fn per_element(m: &Mock, in_dt: aclDataType, dy_bytes: &[u8], n: i64, out_dts: [aclDataType; 2]) -> [Vec<u8>; 2] {
    let dys = Spec::contiguous(in_dt, &[1, n]);
    let dy_mem = m.upload(dy_bytes);
    let dy_t = m.create_tensor(&dys, dy_mem);
    let x = m.dev(&dys, &vec![1.0; n as usize]);
    let zeros = m.dev(&f32_spec(&[n]), &vec![0.0; n as usize]);
    let ones = m.dev(&f32_spec(&[n]), &vec![1.0; n as usize]);
    let o0 = m.dev(&Spec::contiguous(out_dts[0], &[n]), &vec![0.0; n as usize]);
    let o1 = m.dev(&Spec::contiguous(out_dts[1], &[n]), &vec![0.0; n as usize]);
    let mut a = Args { t: [ptr::null_mut(); 9], g: [false, false, true] };
    a.t[0] = dy_t;
    a.t[1] = x.t;
    a.t[2] = zeros.t;
    a.t[3] = ones.t;
    a.t[8] = o1.t;
    m.expect_ok(&a);
    // sumDy needs inputG (and so sumDyXmu): reuse o1's shape for a throwaway sumDyXmu
    let xmu = m.dev(&f32_spec(&[n]), &vec![0.0; n as usize]);
    let mut b = a;
    b.g = [true, false, false];
    b.t[5] = o0.t;
    b.t[6] = xmu.t;
    b.t[8] = ptr::null_mut();
    m.expect_ok(&b);
    let out = [m.d2h(o0.mem, o0.bytes), m.d2h(o1.mem, o1.bytes)];
    assert_eq!(m.destroy_tensor(dy_t), 0);
    assert_eq!(m.free(dy_mem), 0);
    for d in [x, zeros, ones, o0, o1, xmu] {
        m.release(d);
    }
    out
}

#[test]
fn values_f16_bf16_conversions_exhaustive_and_rounding() {
    let m = Mock::new();
    let n = 1 << 16;
    // every f16 and every bf16 bit pattern, read as input and written out as f32 (sumDy = 0 + dy)
    for in_dt in [aclDataType::ACL_FLOAT16, aclDataType::ACL_BF16] {
        let bytes: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
        let [sum_dy, grad_bias] = per_element(&m, in_dt, &bytes, n, [aclDataType::ACL_FLOAT, aclDataType::ACL_FLOAT]);
        let got = decode(aclDataType::ACL_FLOAT, &sum_dy);
        assert_eq!(sum_dy, grad_bias);
        for (b, g) in (0..=u16::MAX).zip(got) {
            let v = if in_dt == aclDataType::ACL_FLOAT16 {
                f16::from_bits(b).to_f32()
            } else {
                bf16::from_bits(b).to_f32()
            };
            let want = 0.0f32 + v;
            assert!(same_bits(g, want), "{in_dt:?} bits {b:#06x}: got {g} want {want}");
        }
    }
    // f32 -> f16 / bf16 rounding (nearest even) on random bit patterns and edge cases
    let mut rng = Rng::new(0xF16);
    let mut vals: Vec<f32> = (0..n - 32).map(|_| f32::from_bits(rng.next_u64() as u32)).collect();
    vals.extend([
        65504.0,
        65519.99,
        65520.0,
        -65520.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        2f32.powi(-24),
        2f32.powi(-25),
        2f32.powi(-25) * 1.0001,
        3.0 * 2f32.powi(-25),
        2f32.powi(-14) - 2f32.powi(-25),
        5.960_464_5e-8,
        6.103_515_6e-5,
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        f32::MAX,
        f32::MIN_POSITIVE,
        1e-45,
        -0.0,
        0.0,
        3.389_531_4e38,
        3.402_823_4e38,
        -1.0e-40,
        0.333_333_34,
        -2.5,
        1.5,
        0.1,
        7.0,
    ]);
    let bytes = encode(aclDataType::ACL_FLOAT, &vals);
    let [h, b] = per_element(&m, aclDataType::ACL_FLOAT, &bytes, n, [aclDataType::ACL_FLOAT16, aclDataType::ACL_BF16]);
    for (i, v) in vals.iter().enumerate() {
        let s = 0.0f32 + *v;
        let gh = f16::from_le_bytes([h[2 * i], h[2 * i + 1]]);
        let gb = bf16::from_le_bytes([b[2 * i], b[2 * i + 1]]);
        let (wh, wb) = (f16::from_f32(s), bf16::from_f32(s));
        assert!(gh.to_bits() == wh.to_bits() || (gh.is_nan() && wh.is_nan()), "f16({s:e}): {gh} vs {wh}");
        assert!(gb.to_bits() == wb.to_bits() || (gb.is_nan() && wb.is_nan()), "bf16({s:e}): {gb} vs {wb}");
    }
    m.expect_violations(0, "");
}

#[test]
fn values_nan_and_inf_propagate() {
    let m = Mock::new();
    let dy = [1.0, f32::INFINITY, f32::NAN, 1.0, 2.0, 1.0, 1.0, 3.0];
    let x = [1.0, 1.0, 1.0, f32::NAN, 1.0, 1.0, f32::INFINITY, 1.0];
    let case = Case::new(&m, aclDataType::ACL_FLOAT, &[2, 4], &dy, &x, &[0.0; 4], &[1.0; 4]);
    m.expect_ok(&case.args());
    let [sum_dy, xmu, _, _] = case.outputs(&m);
    assert_eq!(sum_dy[0], 3.0);
    assert_eq!(sum_dy[1], f32::INFINITY);
    assert!(sum_dy[2].is_nan());
    assert_eq!(sum_dy[3], 4.0);
    assert!(xmu[1].is_nan(), "inf − 0·inf is NaN: {xmu:?}");
    assert!(xmu[2].is_nan() && xmu[3].is_nan());
    case.release(&m);
    m.expect_violations(0, "");
}
