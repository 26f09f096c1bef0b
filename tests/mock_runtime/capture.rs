//! Graph capture on the mock (`mock/acl/capture.c`) through the raw API: work queued on a captured
//! stream is recorded into the model run instance, not run; `aclmdlRIExecuteAsync` replays it in
//! order on any stream of the device; what CANN forbids during a capture is its error (107041 and
//! the other capture statuses of `rt_error_codes.h:45-62`), with a counted violation; freeing what
//! a live model uses is a violation.

use std::ptr;

use ascend::mock;
use ascend_sys::{aclDataType, aclmdlRI, aclmdlRICaptureMode, aclmdlRICaptureStatus, aclrtStream, AclCapture, Cann};

use super::common::raw_mock::*;
use super::Pinned;

const GLOBAL: aclmdlRICaptureMode = aclmdlRICaptureMode::ACL_MODEL_RI_CAPTURE_MODE_GLOBAL;
const RELAXED: aclmdlRICaptureMode = aclmdlRICaptureMode::ACL_MODEL_RI_CAPTURE_MODE_RELAXED;
const DEPENDENCY: i32 = 107024;
const STREAM_CAPTURED: i32 = 107027;
const EVENT_CAPTURED: i32 = 107028;
const NOT_CAPTURED: i32 = 107029;
const IMPLICIT: i32 = 107031;
const MODEL_RUNNING: i32 = 107037;
const BLOCK_ASYNC: i32 = 107041;

fn api(c: &Cann) -> &'static AclCapture {
    c.capture().expect("the mock exports the capture functions")
}

fn begin(c: &Cann, s: aclrtStream, mode: aclmdlRICaptureMode) -> i32 {
    let begin = *api(c).aclmdlRICaptureBegin.as_ref().expect("aclmdlRICaptureBegin");
    // SAFETY: the mock checks the stream handle.
    unsafe { begin(s, mode) }
}

fn end(c: &Cann, s: aclrtStream) -> (i32, aclmdlRI) {
    let end = *api(c).aclmdlRICaptureEnd.as_ref().expect("aclmdlRICaptureEnd");
    let mut model = ptr::null_mut();
    // SAFETY: a valid out-pointer; the mock checks the stream handle.
    (unsafe { end(s, &mut model) }, model)
}

fn replay(c: &Cann, model: aclmdlRI, s: aclrtStream) -> i32 {
    let exec = *api(c).aclmdlRIExecuteAsync.as_ref().expect("aclmdlRIExecuteAsync");
    // SAFETY: the mock checks both handles.
    unsafe { exec(model, s) }
}

fn destroy(c: &Cann, model: aclmdlRI) -> i32 {
    let destroy = *api(c).aclmdlRIDestroy.as_ref().expect("aclmdlRIDestroy");
    // SAFETY: the mock checks the handle.
    unsafe { destroy(model) }
}

fn status(c: &Cann, s: aclrtStream) -> (aclmdlRICaptureStatus, aclmdlRI) {
    let info = *api(c).aclmdlRICaptureGetInfo.as_ref().expect("aclmdlRICaptureGetInfo");
    let (mut st, mut model) = (aclmdlRICaptureStatus::ACL_MODEL_RI_CAPTURE_STATUS_NONE, ptr::null_mut());
    // SAFETY: valid out-pointers.
    assert_eq!(unsafe { info(s, &mut st, &mut model) }, 0);
    (st, model)
}

fn captures() -> (u64, u64, u64) {
    let s = mock::capture_stats();
    (s.captures, s.replays, s.live_models)
}

/// Copies queued on a captured stream are recorded, not run; each replay (on another stream of the
/// device too) runs them again in order, reading the pinned source as it is then.
#[test]
fn captured_copies_run_only_when_replayed() {
    let m = Mock::new();
    let (s, t) = (m.stream(), m.stream());
    let c = m.c;
    let (a, b) = (m.malloc(64), m.malloc(64));
    assert_eq!(m.memset(b, 0, 64), 0);
    let host = Pinned::new(c, &[7u8; 64]);
    let (c0, r0, l0) = captures();
    assert_eq!(begin(c, s, GLOBAL), 0, "{}", m.err());
    let (st, model) = status(c, s);
    assert_eq!(st, aclmdlRICaptureStatus::ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE);
    assert!(!model.is_null());
    // SAFETY: the buffers and the pinned block outlive the model (destroyed below).
    unsafe {
        assert_eq!(c.acl.aclrtMemcpyAsync(a, 64, host.ptr(), 64, H2D, s), 0, "{}", m.err());
        assert_eq!(c.acl.aclrtMemcpyAsync(b, 64, a, 64, D2D, s), 0, "{}", m.err());
    }
    let (rc, ended) = end(c, s);
    assert_eq!((rc, ended), (0, model), "{}", m.err());
    assert_eq!(status(c, s).0, aclmdlRICaptureStatus::ACL_MODEL_RI_CAPTURE_STATUS_NONE);
    assert_eq!(m.sync(s), 0);
    assert_eq!(m.d2h(b, 64), vec![0u8; 64], "captured copies do not run at the capture");
    for (round, stream) in [(1u8, s), (2, t), (3, t)] {
        // SAFETY: no copy reads the pinned block now (the previous replay was synchronised).
        unsafe { ptr::write_bytes(host.ptr().cast::<u8>(), round, 64) };
        assert_eq!(replay(c, model, stream), 0, "{}", m.err());
        assert_eq!(m.sync(stream), 0);
        assert_eq!(m.d2h(b, 64), vec![round; 64], "replay {round}");
    }
    assert_eq!(captures(), (c0 + 1, r0 + 3, l0 + 1));
    assert_eq!(destroy(c, model), 0);
    assert_eq!(captures().2, l0);
    m.finish(&[a, b], &[s, t], 0);
}

/// A captured operator launch replays with the same kernel, arguments and addresses: each replay
/// writes what an eager launch writes.
#[test]
fn captured_launch_replays_like_an_eager_one() {
    let (m, s) = Mock::with_stream();
    let eager = ut_case(&m, aclDataType::ACL_FLOAT);
    let (size, ex) = m.phase1_ok(&eager.args());
    assert_eq!(m.launch_sync(size, ex, s), 0);
    let want: Vec<Vec<f32>> = eager.devs[5..].iter().map(|d| m.read(d)).collect();
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    let (size, ex) = m.phase1_ok(&case.args());
    let ws = if size > 0 { m.malloc(size as usize) } else { ptr::null_mut() };
    let before: Vec<Vec<f32>> = case.devs[5..].iter().map(|d| m.read(d)).collect();
    assert_ne!(before, want);
    assert_eq!(begin(m.c, s, GLOBAL), 0);
    assert_eq!(m.launch(ws, size, ex, s), 0, "{}", m.err());
    let (rc, model) = end(m.c, s);
    assert_eq!(rc, 0);
    assert_eq!(m.sync(s), 0);
    assert_eq!(case.devs[5..].iter().map(|d| m.read(d)).collect::<Vec<_>>(), before, "not run at the capture");
    for _ in 0..2 {
        for d in &case.devs[5..] {
            assert_eq!(m.memset(d.mem, 0, d.bytes), 0);
        }
        assert_eq!(replay(m.c, model, s), 0, "{}", m.err());
        assert_eq!(m.sync(s), 0);
        assert_eq!(case.devs[5..].iter().map(|d| m.read(d)).collect::<Vec<_>>(), want);
    }
    assert_eq!(destroy(m.c, model), 0);
    if !ws.is_null() {
        assert_eq!(m.free(ws), 0);
    }
    for d in eager.devs.into_iter().chain(case.devs) {
        m.release(d);
    }
    m.finish(&[], &[s], 0);
}

/// Every call CANN forbids during a capture is its error and a violation, and queues nothing;
/// a relaxed thread may make the blocking memory calls.
#[test]
fn forbidden_calls_during_a_capture_are_errors() {
    let m = Mock::new();
    let (s, other) = (m.stream(), m.stream());
    let c = m.c;
    let p = m.malloc(64);
    let spare = m.malloc(64);
    let host = [1u8; 64];
    let mut ev = ptr::null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { c.acl.aclrtCreateEventExWithFlag(&mut ev, 1) }, 0);
    assert_eq!(begin(c, ptr::null_mut(), GLOBAL), IMPLICIT);
    m.expect_violations(1, "the default stream cannot be captured");
    assert_eq!(end(c, s).0, NOT_CAPTURED);
    m.expect_violations(2, "is not being captured");
    assert_eq!(begin(c, s, GLOBAL), 0);
    assert_eq!(begin(c, s, GLOBAL), STREAM_CAPTURED);
    m.expect_violations(3, "already being captured");
    let mut n = 3;
    let mut forbidden = |rc: i32, code: i32, what: &str| {
        n += 1;
        assert_eq!(rc, code, "{what}");
        m.expect_violations(n, "");
        let _ = m.err();
    };
    forbidden(m.sync(s), BLOCK_ASYNC, "aclrtSynchronizeStream");
    // SAFETY: handles and buffers are live; every call below is refused before it touches them.
    unsafe {
        forbidden(c.acl.aclrtSynchronizeDevice(), BLOCK_ASYNC, "aclrtSynchronizeDevice");
        forbidden(m.h2d(p, &host), BLOCK_ASYNC, "aclrtMemcpy");
        forbidden(m.memset(p, 0, 64), BLOCK_ASYNC, "aclrtMemset");
        forbidden(m.free(spare), BLOCK_ASYNC, "aclrtFree");
        forbidden(c.acl.aclrtMemcpyAsync(p, 64, host.as_ptr().cast(), 64, H2D, s), BLOCK_ASYNC, "pageable copy");
        assert_eq!(c.acl.aclrtRecordEvent(ev, other), 0);
        forbidden(c.acl.aclrtStreamWaitEvent(s, ev), DEPENDENCY, "a wait on the captured stream");
        assert_eq!(c.acl.aclrtRecordEvent(ev, s), 0, "a record is captured");
        let mut st = ascend_sys::aclrtEventRecordedStatus::ACL_EVENT_RECORDED_STATUS_NOT_READY;
        forbidden(c.acl.aclrtQueryEventStatus(ev, &mut st), BLOCK_ASYNC, "query of a captured event");
        forbidden(c.acl.aclrtSynchronizeEvent(ev), BLOCK_ASYNC, "sync of a captured event");
        forbidden(c.acl.aclrtDestroyStream(s), STREAM_CAPTURED, "destroying the captured stream");
        // the other stream is not captured: its own synchronisation is allowed
        assert_eq!(m.sync(other), 0);
        // a relaxed thread may make blocking memory calls
        let xchg = *api(c).aclmdlRICaptureThreadExchangeMode.as_ref().unwrap();
        let mut mode = RELAXED;
        assert_eq!(xchg(&mut mode), 0);
        assert_eq!(mode, GLOBAL);
        assert_eq!(m.h2d(p, &host), 0, "relaxed: {}", m.err());
        assert_eq!(xchg(&mut mode), 0);
        assert_eq!(mode, RELAXED);
    }
    let (rc, model) = end(c, s);
    assert_eq!(rc, 0);
    assert_eq!(m.free(spare), 0, "allowed again once the capture ended");
    // SAFETY: the event is live.
    assert_eq!(unsafe { c.acl.aclrtDestroyEvent(ev) }, EVENT_CAPTURED, "a live model records it");
    m.expect_violations(n + 1, "recorded by a live model run instance");
    assert_eq!(destroy(c, model), 0);
    // SAFETY: as above.
    assert_eq!(unsafe { c.acl.aclrtDestroyEvent(ev) }, 0);
    m.finish(&[p], &[s, other], n + 1);
}

/// Freeing memory a live model uses is a violation; so are a replay overlapping the previous one
/// on another stream and destroying a model whose replay is still queued (both refused).
#[test]
fn a_live_model_keeps_its_memory_and_replays_in_order() {
    let m = Mock::new();
    let (s, t) = (m.stream(), m.stream());
    let c = m.c;
    let (a, b) = (m.malloc(64), m.malloc(64));
    assert_eq!(begin(c, s, GLOBAL), 0);
    // SAFETY: both buffers are live device memory.
    assert_eq!(unsafe { c.acl.aclrtMemcpyAsync(b, 64, a, 64, D2D, s) }, 0);
    let (_, model) = end(c, s);
    assert_eq!(replay(c, model, s), 0);
    assert_eq!(replay(c, model, t), MODEL_RUNNING, "the replay on s is still queued");
    m.expect_violations(1, "would overlap it");
    assert_eq!(destroy(c, model), MODEL_RUNNING);
    m.expect_violations(2, "still queued");
    assert_eq!(m.sync(s), 0);
    assert_eq!(replay(c, model, t), 0, "ordered after the previous replay (it ran)");
    assert_eq!(m.sync(t), 0);
    assert_eq!(m.free(a), 0);
    m.expect_violations(3, "captured in a live model run instance uses this memory");
    assert_eq!(destroy(c, model), 0);
    m.finish(&[b], &[s, t], 3);
}
