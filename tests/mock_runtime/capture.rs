//! Graph capture on the mock (`mock/acl/capture.c`) through the raw API: work queued on a captured
//! stream is recorded into the model run instance, not run; `aclmdlRIExecuteAsync` replays it in
//! order on any stream of the device; what CANN forbids during a capture is its error (107041 and
//! the other capture statuses of `rt_error_codes.h:45-62`), with a counted violation; freeing what
//! a live model uses is a violation. Capture across streams (runtime
//! `docs/zh/dev_guide/04-02_cross_stream_capture.md`): streams forked from the origin by events
//! are recorded into the same model and must join back before the capture ends.

use std::ptr;

use ascend::mock;
use ascend_sys::{
    aclDataType, aclmdlRI, aclmdlRICaptureMode, aclmdlRICaptureStatus, aclrtEvent, aclrtStream, AclCapture, Cann,
};

use super::common::raw_mock::*;
use super::Pinned;

const GLOBAL: aclmdlRICaptureMode = aclmdlRICaptureMode::ACL_MODEL_RI_CAPTURE_MODE_GLOBAL;
const RELAXED: aclmdlRICaptureMode = aclmdlRICaptureMode::ACL_MODEL_RI_CAPTURE_MODE_RELAXED;
const DEPENDENCY: i32 = 107024;
const UNJOINED: i32 = 107025;
const STREAM_CAPTURED: i32 = 107027;
const EVENT_CAPTURED: i32 = 107028;
const NOT_CAPTURED: i32 = 107029;
const IMPLICIT: i32 = 107031;
const CONFLICT: i32 = 107032;
const UNMATCHED: i32 = 107036;
const PARAM_INVALID: i32 = 107000;
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

/// For each `(round, stream)`: fills the pinned block with `round`, replays `model` (whose copies
/// take the block to `out`) on the stream and checks `out` holds `round` after it.
fn replays_copy_host(
    m: &Mock,
    model: aclmdlRI,
    host: &Pinned,
    out: *mut std::ffi::c_void,
    rounds: &[(u8, aclrtStream)],
) {
    for &(round, on) in rounds {
        // SAFETY: no queued copy reads the pinned block (the previous replay was synchronised).
        unsafe { ptr::write_bytes(host.ptr().cast::<u8>(), round, 64) };
        assert_eq!(replay(m.c, model, on), 0, "{}", m.err());
        assert_eq!(m.sync(on), 0);
        assert_eq!(m.d2h(out, 64), vec![round; 64], "replay {round}");
    }
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
    replays_copy_host(&m, model, &host, b, &[(1, s), (2, t), (3, t)]);
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

/// Streams joined into captures so far (process-wide).
fn joins() -> u64 {
    mock::capture_stats().joined_streams
}

/// An event of `aclrtCreateEventExWithFlag(ACL_EVENT_SYNC)`, as captures across streams need.
fn sync_event(c: &Cann) -> aclrtEvent {
    let mut e = ptr::null_mut();
    // SAFETY: a valid out-pointer; 1 is ACL_EVENT_SYNC.
    assert_eq!(unsafe { c.acl.aclrtCreateEventExWithFlag(&mut e, 1) }, 0);
    e
}

/// `aclrtRecordEvent(e, on)` then `aclrtStreamWaitEvent(waiter, e)`: the wait's status.
fn link(m: &Mock, e: aclrtEvent, on: aclrtStream, waiter: aclrtStream) -> i32 {
    // SAFETY: the mock checks both handles.
    unsafe {
        assert_eq!(m.c.acl.aclrtRecordEvent(e, on), 0, "{}", m.err());
        m.c.acl.aclrtStreamWaitEvent(waiter, e)
    }
}

/// A device-to-device copy of 64 bytes on `s`.
fn copy(m: &Mock, dst: *mut std::ffi::c_void, src: *mut std::ffi::c_void, s: aclrtStream) -> i32 {
    // SAFETY: both are live 64-byte device buffers.
    unsafe { m.c.acl.aclrtMemcpyAsync(dst, 64, src, 64, D2D, s) }
}

fn destroy_events(c: &Cann, events: &[aclrtEvent]) {
    for &e in events {
        // SAFETY: a live event no queued work or live model uses.
        assert_eq!(unsafe { c.acl.aclrtDestroyEvent(e) }, 0);
    }
}

/// Fork and join: an event recorded on the captured stream and waited for by another stream pulls
/// that stream into the capture (and a stream waiting for it, transitively); their tasks are
/// recorded into the same model, run by no one at the capture, and each replay runs them all in
/// the captured order; once the side streams joined back, the capture ends and they leave it.
#[test]
fn streams_forked_by_events_are_captured_into_the_same_model() {
    let m = Mock::new();
    let c = m.c;
    let (s, t, u, other) = (m.stream(), m.stream(), m.stream(), m.stream());
    let (a, b, d, out) = (m.malloc(64), m.malloc(64), m.malloc(64), m.malloc(64));
    for p in [b, d, out] {
        assert_eq!(m.memset(p, 0, 64), 0);
    }
    let host = Pinned::new(c, &[0u8; 64]);
    let ev: Vec<aclrtEvent> = (0..4).map(|_| sync_event(c)).collect();
    let (j0, (c0, _, l0)) = (joins(), captures());
    assert_eq!(begin(c, s, GLOBAL), 0);
    let (_, model) = status(c, s);
    // SAFETY: the pinned block and the buffers outlive the model.
    assert_eq!(unsafe { c.acl.aclrtMemcpyAsync(a, 64, host.ptr(), 64, H2D, s) }, 0);
    assert_eq!(status(c, t).0, aclmdlRICaptureStatus::ACL_MODEL_RI_CAPTURE_STATUS_NONE);
    // fork: s -> t, then t -> u (u depends on the origin only through t)
    assert_eq!(link(&m, ev[0], s, t), 0, "{}", m.err());
    assert_eq!(status(c, t), (aclmdlRICaptureStatus::ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE, model));
    assert_eq!(copy(&m, b, a, t), 0);
    assert_eq!(link(&m, ev[1], t, u), 0, "{}", m.err());
    assert_eq!(status(c, u), (aclmdlRICaptureStatus::ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE, model));
    assert_eq!(copy(&m, d, b, u), 0);
    assert_eq!(joins(), j0 + 2);
    // a side stream is captured like the origin
    assert_eq!(m.sync(t), BLOCK_ASYNC);
    m.expect_violations(1, "is being captured");
    assert_eq!(m.destroy_stream(u), STREAM_CAPTURED);
    m.expect_violations(2, "end the capture first");
    assert_eq!(end(c, t).0, UNMATCHED, "the capture ends on its origin");
    m.expect_violations(3, "end the capture on");
    assert_eq!(status(c, t).0, aclmdlRICaptureStatus::ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE, "still captured");
    // a stream outside the capture may not record or reset an event of it
    // SAFETY: live handles.
    assert_eq!(unsafe { c.acl.aclrtRecordEvent(ev[1], other) }, EVENT_CAPTURED);
    m.expect_violations(4, "which stream");
    // join: u -> t -> s (indirectly), then the origin's own last task
    assert_eq!(link(&m, ev[2], u, t), 0, "{}", m.err());
    assert_eq!(link(&m, ev[3], t, s), 0, "{}", m.err());
    assert_eq!(copy(&m, out, d, s), 0);
    let (rc, ended) = end(c, s);
    assert_eq!((rc, ended), (0, model), "{}", m.err());
    for x in [s, t, u] {
        assert_eq!(status(c, x).0, aclmdlRICaptureStatus::ACL_MODEL_RI_CAPTURE_STATUS_NONE);
    }
    for x in [s, t, u] {
        assert_eq!(m.sync(x), 0);
    }
    assert_eq!(m.d2h(out, 64), vec![0u8; 64], "nothing ran at the capture");
    // origin, side streams, origin: in the captured order
    replays_copy_host(&m, model, &host, out, &[(5, s), (6, other), (7, other)]);
    assert_eq!(captures(), (c0 + 1, mock::capture_stats().replays, l0 + 1));
    // SAFETY: the events are live.
    assert_eq!(unsafe { c.acl.aclrtDestroyEvent(ev[0]) }, EVENT_CAPTURED, "the model waits for it");
    m.expect_violations(5, "recorded by a live model");
    assert_eq!(destroy(c, model), 0);
    destroy_events(c, &ev);
    drop(host);
    m.finish(&[a, b, d, out], &[s, t, u, other], 5);
}

/// A side stream that does not join back, or queues work after it joined back, fails the end
/// with ACL_ERROR_RT_STREAM_UNJOINED: the capture is terminated (no model, every stream out of
/// it, nothing recorded runs).
#[test]
fn an_unjoined_side_stream_fails_the_end_of_the_capture() {
    let m = Mock::new();
    let c = m.c;
    let (s, t) = (m.stream(), m.stream());
    let (a, b) = (m.malloc(64), m.malloc(64));
    assert_eq!(m.memset(a, 1, 64), 0);
    assert_eq!(m.memset(b, 0, 64), 0);
    let ev: Vec<aclrtEvent> = (0..2).map(|_| sync_event(c)).collect();
    let l0 = captures().2;
    let mut n = 0;
    for after_join in [false, true] {
        assert_eq!(begin(c, s, GLOBAL), 0);
        assert_eq!(link(&m, ev[0], s, t), 0, "{}", m.err());
        assert_eq!(copy(&m, b, a, t), 0);
        if after_join {
            assert_eq!(link(&m, ev[1], t, s), 0, "{}", m.err());
            assert_eq!(copy(&m, b, a, t), 0, "a task after the join");
        }
        let (rc, model) = end(c, s);
        assert_eq!((rc, model), (UNJOINED, ptr::null_mut()));
        n += 1;
        m.expect_violations(n, if after_join { "after it last joined back" } else { "never joined back" });
        m.expect_err(&["107025"]);
        for x in [s, t] {
            assert_eq!(status(c, x).0, aclmdlRICaptureStatus::ACL_MODEL_RI_CAPTURE_STATUS_NONE);
            assert_eq!(m.sync(x), 0);
        }
        assert_eq!(captures().2, l0, "the terminated capture's model is gone");
        assert_eq!(m.d2h(b, 64), vec![0u8; 64], "its tasks never run");
    }
    destroy_events(c, &ev);
    m.finish(&[a, b], &[s, t], n);
}

/// What else a capture across streams refuses: a captured stream waiting for an event recorded
/// outside its capture (107024), a stream of one capture waiting for an event of another
/// (107032), an event of `aclrtCreateEvent` joining a stream (the stricter choice: captures need
/// `aclrtCreateEventExWithFlag(ACL_EVENT_SYNC)` events). Each refused wait joins nothing.
#[test]
fn waits_across_captures_are_refused() {
    let m = Mock::new();
    let c = m.c;
    let (s1, s2, t) = (m.stream(), m.stream(), m.stream());
    let (e1, e2) = (sync_event(c), sync_event(c));
    let mut plain = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { c.acl.aclrtCreateEvent(&mut plain) }, 0);
    let j0 = joins();
    // SAFETY: live handles throughout.
    unsafe {
        assert_eq!(c.acl.aclrtRecordEvent(e2, t), 0);
        assert_eq!(begin(c, s1, GLOBAL), 0);
        assert_eq!(begin(c, s2, GLOBAL), 0);
        assert_eq!(c.acl.aclrtStreamWaitEvent(s1, e2), DEPENDENCY);
        m.expect_violations(1, "whose record is not in the capture");
        assert_eq!(link(&m, e1, s1, s2), CONFLICT);
        m.expect_violations(2, "takes part in another capture");
        assert_eq!(link(&m, plain, s1, t), PARAM_INVALID);
        m.expect_violations(3, "ACL_EVENT_SYNC");
        assert_eq!(status(c, t).0, aclmdlRICaptureStatus::ACL_MODEL_RI_CAPTURE_STATUS_NONE);
    }
    assert_eq!(joins(), j0);
    let (r1, m1) = end(c, s1);
    let (r2, m2) = end(c, s2);
    assert_eq!((r1, r2), (0, 0), "{}", m.err());
    assert_eq!((destroy(c, m1), destroy(c, m2)), (0, 0));
    assert_eq!(m.sync(t), 0);
    destroy_events(c, &[e1, e2, plain]);
    m.finish(&[], &[s1, s2, t], 3);
}
