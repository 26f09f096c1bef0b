//! The upstream op_api unit cases of aclnnBatchNorm (40, `test_aclnn_batchnorm.cpp`) and
//! aclnnBatchNormBackward (29, `test_aclnn_batchnorm_backward.cpp`), hicann/ops-nn @ e5c3fa93
//! `norm/batch_norm_v3/tests/ut/op_host/op_api/` and `norm/batch_norm_grad_v3/tests/ut/op_host/op_api/`,
//! ported as data (`batch_norm_ut/cases.rs`, generated from the C++ files: every TensorDesc with its
//! shape, dtype, format and strides, every OP_API_UT call, every expectation) and run against the
//! mock's phase 1, which emulates Atlas A2/A3. Upstream cases named `ascend950*` target Ascend 950;
//! where A2/A3's rules differ (or the upstream assertion is commented out), the A2/A3 status is
//! given in [`a2_status`] with the rule that decides it.

#![cfg(feature = "mock")]

use std::ptr;

use ascend_sys::{aclBoolArray, aclOpExecutor, aclTensor};
use ascend_sys::{aclDataType, aclFormat};

#[path = "../common/mod.rs"]
mod common;
use crate::common::raw_mock::{contiguous_strides, Mock, Spec};

const ACL_SUCCESS: i32 = 0;
const ACLNN_ERR_PARAM_NULLPTR: i32 = 161001;
const ACLNN_ERR_PARAM_INVALID: i32 = 161002;

/// An upstream TensorDesc.
pub struct D {
    pub shape: &'static [i64],
    pub dt: aclDataType,
    pub fmt: aclFormat,
    pub strides: Option<&'static [i64]>,
}

/// One OP_API_UT call: the tensors in prototype order (None: nullptr), `training`, the output mask
/// (backward), the status upstream expects, and whether upstream asserts it (some are commented).
pub struct C {
    pub tensors: &'static [Option<D>],
    pub training: bool,
    pub mask: Option<&'static [bool]>,
    pub upstream: i32,
    pub asserted: bool,
}

/// One TEST_F.
pub struct U {
    pub name: &'static str,
    pub calls: &'static [C],
}

#[rustfmt::skip]
mod cases;
use cases::{BACKWARD, FORWARD};

/// The status on Atlas A2/A3 where it differs from the upstream expectation (or upstream asserts
/// none), with the rule; `None`: the upstream expectation holds.
fn a2_status(name: &str, call: usize) -> Option<i32> {
    match (name, call) {
        // ops-nn's backward on regbase (950) checks saveMean/saveInvstd/gradWeight/gradBias shapes
        // (commented out upstream); the A2 kernel reads and writes C elements of them, which the mock
        // refuses for any other shape (mock/ops/batch_norm_backward.c).
        ("ascend950PR_9589_l2_batch_norm_backward_shape_error", _) => Some(ACLNN_ERR_PARAM_INVALID),
        // runningVar [4] for C = 5: CheckOtherShape on every chip.
        ("ascend950PR_9589_l2_batch_norm_backward_infer", 1) => Some(ACLNN_ERR_PARAM_INVALID),
        ("ascend950PR_9589_l2_batch_norm_backward_infer", 0) => Some(ACL_SUCCESS),
        // Commented out upstream; an NCDHW 5-D input in eval passes every A2 check.
        ("l2_batch_norm_backward_infer_5d", 0) => Some(ACL_SUCCESS),
        // Commented out upstream; A2/A3 do not support NHWC (aclnnBatchNorm.md:228).
        ("ascend950PR_9589_l2_batch_norm_float16_NHWC", 0) => Some(ACLNN_ERR_PARAM_INVALID),
        _ => None,
    }
}

fn storage_of(d: &D) -> (Vec<i64>, i64) {
    let strides = d.strides.map_or_else(|| contiguous_strides(d.shape), <[i64]>::to_vec);
    let numel: i64 = d.shape.iter().product();
    let extent = if numel == 0 { 0 } else { 1 + d.shape.iter().zip(&strides).map(|(&n, &s)| (n - 1) * s).sum::<i64>() };
    (strides, extent)
}

/// Makes the device tensors of a call (allocated, unfilled), runs `phase1` and returns its status,
/// releasing everything (an executor made is destroyed unlaunched).
fn run_call(
    m: &Mock,
    call: &C,
    phase1: impl FnOnce(&[*mut aclTensor], *mut u64, *mut *mut aclOpExecutor) -> i32,
) -> i32 {
    let mut handles = Vec::new();
    let mut buffers = Vec::new();
    for t in call.tensors {
        let Some(d) = t else {
            handles.push(ptr::null_mut());
            continue;
        };
        let (strides, extent) = storage_of(d);
        // Phase 1 reads no data: the storage is allocated, not filled (the largest upstream
        // case, 9-D err_shape, holds 20 million elements).
        let bytes =
            extent as usize * if d.dt == aclDataType::ACL_FLOAT16 || d.dt == aclDataType::ACL_BF16 { 2 } else { 4 };
        let mem = if extent == 0 { ptr::null_mut() } else { m.malloc(bytes) };
        let spec =
            Spec { dt: d.dt, shape: d.shape.to_vec(), strides, offset: 0, storage_dims: vec![extent], format: d.fmt };
        let h = m.create_tensor(&spec, mem);
        assert!(!h.is_null(), "aclCreateTensor {spec:?}: {}", m.err());
        handles.push(h);
        buffers.push(mem);
    }
    let (mut ws, mut ex) = (0u64, ptr::null_mut());
    let status = phase1(&handles, &mut ws, &mut ex);
    if !ex.is_null() {
        m.discard(ex);
    }
    for h in handles.into_iter().filter(|h| !h.is_null()) {
        assert_eq!(m.destroy_tensor(h), 0);
    }
    for b in buffers.into_iter().filter(|b| !b.is_null()) {
        assert_eq!(m.free(b), 0);
    }
    status
}

fn expected(u: &U, i: usize, c: &C) -> i32 {
    a2_status(u.name, i).unwrap_or_else(|| {
        assert!(c.asserted, "{} call {i}: upstream asserts nothing here, so the A2 status must be given", u.name);
        c.upstream
    })
}

#[test]
fn ut_batch_norm_forward_cases() {
    assert_eq!(FORWARD.len(), 40, "the 40 TEST_F of test_aclnn_batchnorm.cpp");
    let m = Mock::new();
    let api = m.c.operator(&ascend_sys::symbols::BATCH_NORM).expect("the mock exports aclnnBatchNorm");
    let f = api.aclnnBatchNormGetWorkspaceSize.as_ref().unwrap();
    let mut failures = Vec::new();
    for u in FORWARD {
        for (i, c) in u.calls.iter().enumerate() {
            assert_eq!(c.tensors.len(), 8, "{}", u.name);
            let status = run_call(&m, c, |h, ws, ex| {
                // SAFETY: the prototype's arguments: live descriptors or null, valid out-pointers.
                unsafe { f(h[0], h[1], h[2], h[3], h[4], c.training, 0.1, 1e-5, h[5], h[6], h[7], ws, ex) }
            });
            let want = expected(u, i, c);
            if status != want {
                failures.push(format!("{} call {i}: got {status}, expected {want} ({})", u.name, m.err()));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    m.expect_violations(0, "");
}

fn bool_array(m: &Mock, values: &[bool]) -> *mut aclBoolArray {
    // SAFETY: `values` is live for the call and its length is passed; the mock copies it.
    let a = unsafe { (m.c.nnopbase.aclCreateBoolArray)(values.as_ptr(), values.len() as u64) };
    assert!(!a.is_null());
    a
}

fn destroy_bool_array(m: &Mock, a: *mut aclBoolArray) -> i32 {
    // SAFETY: a handle from aclCreateBoolArray (or, in the misuse test, one already destroyed).
    unsafe { (m.c.nnopbase.aclDestroyBoolArray)(a) }
}

#[test]
fn ut_batch_norm_backward_cases() {
    assert_eq!(BACKWARD.len(), 29, "the 29 TEST_F of test_aclnn_batchnorm_backward.cpp");
    let m = Mock::new();
    let api = m.c.operator(&ascend_sys::symbols::BATCH_NORM_BACKWARD).expect("the mock exports aclnnBatchNormBackward");
    let f = api.aclnnBatchNormBackwardGetWorkspaceSize.as_ref().unwrap();
    let mut failures = Vec::new();
    for u in BACKWARD {
        for (i, c) in u.calls.iter().enumerate() {
            assert_eq!(c.tensors.len(), 10, "{}", u.name);
            let mask = bool_array(&m, c.mask.expect("every backward case has a mask"));
            let status = run_call(&m, c, |h, ws, ex| {
                // SAFETY: the prototype's arguments: live descriptors or null, a live bool array,
                // valid out-pointers.
                unsafe { f(h[0], h[1], h[2], h[3], h[4], h[5], h[6], c.training, 1e-5, mask, h[7], h[8], h[9], ws, ex) }
            });
            assert_eq!(destroy_bool_array(&m, mask), 0);
            let want = expected(u, i, c);
            if status != want {
                failures.push(format!("{} call {i}: got {status}, expected {want} ({})", u.name, m.err()));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    m.expect_violations(0, "");
}

/// A mask shorter than 3 is read past its end by A2's ops-nn: the mock refuses it and counts it; a
/// destroyed mask is a violation; destroying one twice is a violation.
#[test]
fn bool_array_misuse_is_caught() {
    let m = Mock::new();
    let api = m.c.operator(&ascend_sys::symbols::BATCH_NORM_BACKWARD).unwrap();
    let f = api.aclnnBatchNormBackwardGetWorkspaceSize.as_ref().unwrap();
    let d = |shape: &'static [i64]| {
        Some(D { shape, dt: aclDataType::ACL_FLOAT, fmt: aclFormat::ACL_FORMAT_ND, strides: None })
    };
    let tensors = [d(&[4, 2]), d(&[4, 2]), None, None, None, d(&[2]), d(&[2]), d(&[4, 2]), d(&[2]), d(&[2])];
    let call = C { tensors: Box::leak(Box::new(tensors)), training: true, mask: None, upstream: 0, asserted: true };
    for (values, want) in [(&[true, true][..], ACLNN_ERR_PARAM_NULLPTR), (&[true, true, true][..], ACL_SUCCESS)] {
        let mask = bool_array(&m, values);
        let status = run_call(&m, &call, |h, ws, ex| {
            // SAFETY: as in the cases above.
            unsafe { f(h[0], h[1], h[2], h[3], h[4], h[5], h[6], true, 1e-5, mask, h[7], h[8], h[9], ws, ex) }
        });
        assert_eq!(status, want, "mask {values:?}");
        assert_eq!(destroy_bool_array(&m, mask), 0);
    }
    m.expect_violations(1, "past the array");
    let mask = bool_array(&m, &[true, true, true]);
    assert_eq!(destroy_bool_array(&m, mask), 0);
    assert_eq!(destroy_bool_array(&m, mask), ACLNN_ERR_PARAM_INVALID);
    m.expect_violations(2, "double destroy");
}

/// Phase 2 of aclnnBatchNorm on the default stream with a fresh workspace, then a synchronize.
fn launch(m: &Mock, size: u64, ex: *mut aclOpExecutor) -> i32 {
    let api = m.c.operator(&ascend_sys::symbols::BATCH_NORM).unwrap();
    let ws = if size > 0 { m.malloc(size as usize) } else { ptr::null_mut() };
    // SAFETY: a fresh executor from phase 1; the workspace is null with size 0 or live.
    let st = unsafe { (api.aclnnBatchNorm.as_ref().unwrap())(ws, size, ex, ptr::null_mut()) };
    assert_eq!(st, 0, "phase 2: {}", m.err());
    let st = m.sync(ptr::null_mut());
    if !ws.is_null() {
        assert_eq!(m.free(ws), 0);
    }
    st
}

/// The forward writes the batch VARIANCE into saveInvstd (A2/A3), the running statistics in
/// place with the unbiased variance, and an empty input gives saveMean 0 and saveInvstd NaN.
#[test]
fn forward_saves_the_variance_and_fills_empty_inputs() {
    let mut m = Mock::new();
    let api = m.c.operator(&ascend_sys::symbols::BATCH_NORM).unwrap();
    let f = *api.aclnnBatchNormGetWorkspaceSize.as_ref().unwrap();
    // x: [4, 1] = 1, 2, 3, 6: mean 3, biased var 3.5, unbiased 14/3.
    let x = m.f32s(&[4, 1], &[1.0, 2.0, 3.0, 6.0]);
    let y = m.f32s(&[4, 1], &[0.0; 4]);
    let (rm, rv) = (m.f32s(&[1], &[1.0]), m.f32s(&[1], &[2.0]));
    let (sm, sv) = (m.f32s(&[1], &[-7.0]), m.f32s(&[1], &[-7.0]));
    let (mut ws, mut ex) = (0u64, ptr::null_mut());
    let null = ptr::null_mut();
    // SAFETY: live descriptors (weight and bias absent), valid out-pointers.
    let st = unsafe { f(x, null, null, rm, rv, true, 0.25, 1e-5, y, sm, sv, &mut ws, &mut ex) };
    assert_eq!(st, 0, "{}", m.err());
    assert_eq!(launch(&m, ws, ex), 0);
    assert_eq!(m.read_f32(sm), [3.0]);
    assert_eq!(m.read_f32(sv), [3.5], "saveInvstd holds the variance on A2/A3");
    assert_eq!(m.read_f32(rm), [0.75 * 1.0 + 0.25 * 3.0]);
    let want_rv = 0.75f32 * 2.0 + 0.25 * (3.5f32 * (4.0 / 3.0));
    assert!((m.read_f32(rv)[0] - want_rv).abs() < 1e-6);
    let y_vals = m.read_f32(y);
    let inv = 1.0 / (3.5f64 + 1e-5).sqrt();
    for (got, xv) in y_vals.iter().zip([1.0, 2.0, 3.0, 6.0]) {
        assert!((f64::from(*got) - (xv - 3.0) * inv).abs() < 1e-6, "{y_vals:?}");
    }
    // An empty input: saveMean 0, saveInvstd NaN, the running statistics untouched.
    let xe = m.tensor(aclDataType::ACL_FLOAT, &[0, 1], &[]);
    let ye = m.tensor(aclDataType::ACL_FLOAT, &[0, 1], &[]);
    // SAFETY: as above.
    let st = unsafe { f(xe, null, null, rm, rv, true, 0.25, 1e-5, ye, sm, sv, &mut ws, &mut ex) };
    assert_eq!(st, 0, "{}", m.err());
    assert_eq!(launch(&m, ws, ex), 0);
    assert_eq!(m.read_f32(sm), [0.0]);
    assert!(m.read_f32(sv)[0].is_nan());
    assert_eq!(m.read_f32(rm), [1.5]);
    m.expect_violations(0, "");
}
