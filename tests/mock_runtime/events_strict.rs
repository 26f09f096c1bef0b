//! The mock as strict as CANN about events (runtime `docs/zh/api_ref/07_event_management.md`,
//! `include/external/acl/acl_rt.h`, `docs/zh/design/modules/event/event.md` 4.2): each rule
//! through the raw API, with the status CANN returns and a counted violation where the call is a
//! misuse; and the counters of events made, destroyed and live per device.

use std::ptr;

use ascend::mock;
use ascend_sys::event_flag::{ACL_EVENT_IPC, ACL_EVENT_SYNC, ACL_EVENT_TIME_LINE};
use ascend_sys::{aclrtEvent, aclrtEventRecordedStatus, Cann};

use super::common::raw_mock::*;
use super::Pinned;

const DONE: aclrtEventRecordedStatus = aclrtEventRecordedStatus::ACL_EVENT_RECORDED_STATUS_COMPLETE;
const NOT_READY: aclrtEventRecordedStatus = aclrtEventRecordedStatus::ACL_EVENT_RECORDED_STATUS_NOT_READY;
const PARAM_INVALID: i32 = 107000;
const STREAM_CONTEXT: i32 = 107003;
const FEATURE_NOT_SUPPORT: i32 = 207000;
const NO_EVENT_RESOURCE: i32 = 207007;

fn status(c: &Cann, e: aclrtEvent) -> aclrtEventRecordedStatus {
    let mut st = NOT_READY;
    // SAFETY: a valid out-pointer; the mock checks the handle.
    assert_eq!(unsafe { c.acl.aclrtQueryEventStatus(e, &mut st) }, 0);
    st
}

/// An event made by `create` (0 = aclrtCreateEvent, else ExWithFlag with `flags`).
fn event(c: &Cann, ex: bool, flags: u32) -> aclrtEvent {
    let mut e = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let st = unsafe {
        if ex {
            c.acl.aclrtCreateEventExWithFlag(&mut e, flags)
        } else {
            c.acl.aclrtCreateEvent(&mut e)
        }
    };
    assert_eq!(st, 0);
    e
}

/// A default event is reused through aclrtResetEvent: recording it again without a reset is a
/// violation (refused); after a reset it records again. An ExWithFlag event records again freely,
/// and aclrtResetEvent on it is an error (ACL_ERROR_RT_FEATURE_NOT_SUPPORT).
#[test]
fn default_events_need_a_reset_and_ex_with_flag_events_refuse_one() {
    let (m, s) = Mock::with_stream();
    let c = m.c;
    let d = event(c, false, 0);
    let ex = event(c, true, ACL_EVENT_SYNC);
    // SAFETY: handles from the mock.
    unsafe {
        assert_eq!(c.acl.aclrtRecordEvent(d, s), 0);
        assert_eq!(c.acl.aclrtRecordEvent(d, s), PARAM_INVALID);
        m.expect_violations(1, "recorded again without aclrtResetEvent");
        assert_eq!(m.sync(s), 0);
        assert_eq!(c.acl.aclrtResetEvent(d, s), 0, "{}", m.err());
        assert_eq!(c.acl.aclrtRecordEvent(d, s), 0, "after a reset: {}", m.err());
        for _ in 0..3 {
            assert_eq!(c.acl.aclrtRecordEvent(ex, s), 0, "ExWithFlag events are recorded again");
        }
        assert_eq!(c.acl.aclrtResetEvent(ex, s), FEATURE_NOT_SUPPORT);
        m.expect_violations(2, "which aclrtResetEvent does not support");
        assert_eq!(m.sync(s), 0);
        assert_eq!(c.acl.aclrtDestroyEvent(d), 0);
        assert_eq!(c.acl.aclrtDestroyEvent(ex), 0);
    }
    m.finish(&[], &[s], 2);
}

/// A stream may wait only for an ExWithFlag event with ACL_EVENT_SYNC, and only for a recorded
/// one: a wait on an ExWithFlag event without it, or on a never-recorded (or reset) event, is
/// ACL_ERROR_RT_INVALID_VALUE (the runtime maps it to 107000) and queues nothing.
#[test]
fn waits_need_a_sync_event_that_was_recorded() {
    let m = Mock::new();
    let (a, b) = (m.stream(), m.stream());
    let c = m.c;
    let timing = event(c, true, ACL_EVENT_TIME_LINE);
    let sync = event(c, true, ACL_EVENT_SYNC | ACL_EVENT_TIME_LINE);
    let plain = event(c, false, 0);
    let queued = mock::stats().queued_tasks;
    // SAFETY: handles from the mock.
    unsafe {
        assert_eq!(c.acl.aclrtRecordEvent(timing, a), 0);
        assert_eq!(c.acl.aclrtStreamWaitEvent(b, timing), PARAM_INVALID);
        m.expect_violations(1, "without ACL_EVENT_SYNC");
        assert_eq!(c.acl.aclrtStreamWaitEvent(b, sync), PARAM_INVALID);
        m.expect_violations(2, "has never been recorded");
        assert_eq!(c.acl.aclrtStreamWaitEvent(b, plain), PARAM_INVALID);
        m.expect_violations(3, "has never been recorded");
        assert_eq!(mock::stats().queued_tasks, queued + 1, "only the record is queued");
        assert_eq!(c.acl.aclrtRecordEvent(sync, a), 0);
        assert_eq!(c.acl.aclrtStreamWaitEvent(b, sync), 0, "{}", m.err());
        assert_eq!(c.acl.aclrtRecordEvent(plain, a), 0);
        assert_eq!(c.acl.aclrtStreamWaitEvent(b, plain), 0, "{}", m.err());
        assert_eq!(m.sync(b), 0);
        assert_eq!(m.sync(a), 0);
        assert_eq!(c.acl.aclrtResetEvent(plain, a), 0);
        assert_eq!(c.acl.aclrtStreamWaitEvent(b, plain), PARAM_INVALID, "reset: as never recorded");
        m.expect_violations(4, "has never been recorded");
        for e in [timing, sync, plain] {
            assert_eq!(c.acl.aclrtDestroyEvent(e), 0);
        }
    }
    m.finish(&[], &[a, b], 4);
}

/// An event of one device recorded on, or waited for by, a stream of another device: a
/// violation (ACL_ERROR_RT_STREAM_CONTEXT), nothing queued.
#[test]
fn an_events_device_must_be_the_streams() {
    let m = Mock::new();
    let c = m.c;
    mock::set_device_count(2).expect("two mock devices");
    let e0 = event(c, true, ACL_EVENT_SYNC);
    let s0 = m.stream();
    // SAFETY: handles from the mock; device 1 is bound only for the calls on its stream.
    unsafe {
        assert_eq!(c.acl.aclrtRecordEvent(e0, s0), 0);
        assert_eq!(c.acl.aclrtSetDevice(1), 0);
        let mut s1 = ptr::null_mut();
        assert_eq!(c.acl.aclrtCreateStream(&mut s1), 0);
        let queued = mock::stats().queued_tasks;
        assert_eq!(c.acl.aclrtRecordEvent(e0, s1), STREAM_CONTEXT);
        m.expect_violations(1, "of device 0 recorded on");
        assert_eq!(c.acl.aclrtStreamWaitEvent(s1, e0), STREAM_CONTEXT);
        m.expect_violations(2, "of device 0 waited for by");
        assert_eq!(mock::stats().queued_tasks, queued, "nothing queued");
        assert_eq!(c.acl.aclrtDestroyStream(s1), 0);
        assert_eq!(c.acl.aclrtResetDevice(1), 0);
        // Back on device 0 (the session's binding), its reference count as it was.
        assert_eq!(c.acl.aclrtSetDevice(0), 0);
        assert_eq!(c.acl.aclrtResetDevice(0), 0);
        assert_eq!(m.sync(s0), 0);
        assert_eq!(c.acl.aclrtDestroyEvent(e0), 0);
    }
    mock::set_device_count(1).expect("back to one device");
    m.finish(&[], &[s0], 2);
}

/// At most 65,536 live events per device: the next creation is refused with
/// ACL_ERROR_RT_NO_EVENT_RESOURCE (a counted violation) and stores null; destroying one makes
/// room. The counters follow every creation and destruction.
#[test]
fn a_device_holds_at_most_65536_events_and_they_are_counted() {
    let m = Mock::new();
    let c = m.c;
    let live = mock::live_events_on(0);
    let mut made = Vec::new();
    // SAFETY: valid out-pointers; the events are destroyed below.
    unsafe {
        for i in 0..65_536 - live {
            let mut e = ptr::null_mut();
            let st = if i % 2 == 0 {
                c.acl.aclrtCreateEvent(&mut e)
            } else {
                c.acl.aclrtCreateEventExWithFlag(&mut e, ACL_EVENT_SYNC)
            };
            assert_eq!(st, 0, "event {i}: {}", m.err());
            made.push(e);
        }
        assert_eq!(mock::live_events_on(0), 65_536);
        let mut e: aclrtEvent = 1usize as aclrtEvent;
        assert_eq!(c.acl.aclrtCreateEventExWithFlag(&mut e, ACL_EVENT_SYNC), NO_EVENT_RESOURCE);
        assert!(e.is_null(), "null stored on failure");
        m.expect_violations(1, "already holds 65536 live events");
        assert_eq!(c.acl.aclrtCreateEventWithFlag(&mut e, ACL_EVENT_SYNC), NO_EVENT_RESOURCE);
        m.expect_violations(2, "already holds 65536 live events");
        assert_eq!(c.acl.aclrtDestroyEvent(made.pop().unwrap()), 0);
        assert_eq!(c.acl.aclrtCreateEventWithFlag(&mut e, ACL_EVENT_SYNC), 0, "room again");
        made.push(e);
        let mut bad = ptr::null_mut();
        assert_eq!(c.acl.aclrtCreateEventExWithFlag(&mut bad, ACL_EVENT_IPC | ACL_EVENT_SYNC), 100000);
        assert_eq!(c.acl.aclrtCreateEventExWithFlag(&mut bad, 0x8000_0000), 100000);
        for e in made.drain(..) {
            assert_eq!(c.acl.aclrtDestroyEvent(e), 0);
        }
    }
    let after = mock::stats();
    let n = 65_536 - live + 1;
    assert_eq!(
        (after.events_created - m.base.events_created, after.events_destroyed - m.base.events_destroyed),
        (n, n)
    );
    assert_eq!(after.live_events, m.base.live_events);
    assert_eq!(mock::live_events_on(0), live);
    m.finish(&[], &[], 2);
}

/// The device progresses while the host queries: aclrtQueryEventStatus runs the recorded
/// stream up to the record and no further, so the event completes (its copy has landed) while
/// later work of the stream is still queued; with the progress off, a query runs nothing. A
/// never-recorded ExWithFlag event is complete, a default one NOT_READY (CANN's docs and
/// rtEventQueryStatus).
#[test]
fn a_query_lets_the_device_run_up_to_the_record_only() {
    let (m, s) = Mock::with_stream();
    let c = m.c;
    let d = m.malloc(64);
    // Pinned sources: a copy from pageable memory would run synchronously (as on CANN).
    let first = Pinned::new(c, &(0..64u8).map(|i| i.wrapping_mul(7).wrapping_add(3)).collect::<Vec<u8>>());
    let second = Pinned::new(c, &(0..64u8).map(|i| 200 - i).collect::<Vec<u8>>());
    let e = event(c, true, ACL_EVENT_SYNC);
    let fresh = event(c, false, 0);
    assert_eq!(status(c, e), DONE, "never recorded ExWithFlag: complete");
    assert_eq!(status(c, fresh), NOT_READY, "never recorded default: NOT_READY");
    let mut host = vec![0u8; 64];
    // SAFETY: handles and buffers of this test, alive across the synchronisations below.
    unsafe {
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 64, first.ptr(), 64, H2D, s), 0);
        assert_eq!(c.acl.aclrtRecordEvent(e, s), 0);
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 64, second.ptr(), 64, H2D, s), 0);
        let queued = mock::stats().queued_tasks;
        let progress = mock::set_query_progress(false);
        assert_eq!(status(c, e), NOT_READY, "no progress: the query ran nothing");
        assert_eq!(mock::stats().queued_tasks, queued);
        mock::set_query_progress(progress);
        assert_eq!(status(c, e), DONE, "the device ran up to the record");
        assert_eq!(mock::stats().queued_tasks, queued - 2, "the first copy and the record ran, not the second copy");
        // (A synchronous read now would race with the queued second copy: read after it.)
        assert_eq!(m.sync(s), 0);
        assert_eq!(c.acl.aclrtMemcpy(host.as_mut_ptr().cast(), 64, d, 64, D2H), 0);
        assert_eq!(c.acl.aclrtDestroyEvent(e), 0);
        assert_eq!(c.acl.aclrtDestroyEvent(fresh), 0);
    }
    assert_eq!(host, second.bytes());
    m.finish(&[d], &[s], 0);
}
