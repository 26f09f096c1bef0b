//! Where the mock is as strict as CANN (issue 35, fidelity review 5): executors CANN will not
//! repeat, `aclrtFree` without a wait, the host side of `aclrtMemcpyAsync`, and the deterministic
//! setting an executor is prepared under.

use std::ptr;

use ascend::mock::{self, launch_counters};
use ascend_sys::aclrtMemcpyKind;

use super::Pinned;
use crate::common::raw_mock::*;
use crate::common::self_exec;

const INNER: i32 = 561000;
const FEATURE_NOT_SUPPORT: i32 = 207000;
const OP: &str = "aclnnBatchNormReduceBackward";

/// Refuses `op`'s repeatable executors until dropped.
struct Refuse(&'static str);

impl Refuse {
    fn new(op: &'static str) -> Refuse {
        mock::refuse_repeatable(op, true);
        Refuse(op)
    }
}

impl Drop for Refuse {
    fn drop(&mut self) {
        mock::refuse_repeatable(self.0, false);
    }
}

fn set_repeatable(m: &Mock, ex: *mut ascend_sys::aclOpExecutor) -> i32 {
    // SAFETY: the mock validates the handle before using it.
    unsafe { m.c.nnopbase.aclSetAclOpExecutorRepeatable(ex) }
}

fn destroy(m: &Mock, ex: *mut ascend_sys::aclOpExecutor) -> i32 {
    // SAFETY: the mock validates the handle before using it.
    unsafe { m.c.nnopbase.aclDestroyAclOpExecutor(ex) }
}

/// An operator refused persistently: `aclSetAclOpExecutorRepeatable` returns 561000 with CANN's
/// words and no violation, again on a second try; the refused executor cannot be rebound (a
/// violation); phase 2 consumes it (launching it again is a violation); an unlaunched refused one
/// is destroyed without complaint. Other operators and a cleared refusal are accepted.
#[test]
fn a_refused_executor_is_consumed_by_phase_2_or_destroyed() {
    let (m, s) = Mock::with_stream();
    let case = ut_case(&m, ascend_sys::aclDataType::ACL_FLOAT);
    let before = launch_counters();
    let refuse = Refuse::new(OP);
    let (size, ex) = m.phase1_ok(&case.args());
    assert_eq!(set_repeatable(&m, ex), INNER);
    m.expect_err(&["aclSetAclOpExecutorRepeatable failed. ERROR: 561000", "unrepeatable executor"]);
    assert_eq!(set_repeatable(&m, ex), INNER, "refused for good");
    m.expect_violations(0, "");
    assert_eq!(launch_counters().repeatable_refusals - before.repeatable_refusals, 2);
    // SAFETY: a live descriptor of this executor; the mock refuses the rebind.
    let st = unsafe { m.c.nnopbase.aclSetInputTensorAddr(ex, 0, case.devs[0].t, case.devs[0].mem) };
    assert_eq!(st, 161002);
    m.expect_violations(1, "is not repeatable");
    assert_eq!(m.launch_sync(size, ex, s), 0, "phase 2 of a refused executor: {}", m.err());
    assert_eq!(m.launch(ptr::null_mut(), 0, ex, s), 161002, "consumed by its phase 2");
    m.expect_violations(2, "consumed by its first phase-2 call");
    let (_, unlaunched) = m.phase1_ok(&case.args());
    assert_eq!(set_repeatable(&m, unlaunched), INNER);
    assert_eq!(destroy(&m, unlaunched), 0, "an unlaunched refused executor is destroyed");
    m.expect_violations(2, "");
    drop(refuse);
    let (_, accepted) = m.phase1_ok(&case.args());
    assert_eq!(set_repeatable(&m, accepted), 0, "the refusal is cleared");
    assert_eq!(destroy(&m, accepted), 0);
    let (_, never_tried) = m.phase1_ok(&case.args());
    assert_eq!(destroy(&m, never_tried), 0);
    m.expect_violations(3, "without calling aclSetAclOpExecutorRepeatable first");
    {
        let _all = Refuse::new("*");
        let (_, ex) = m.phase1_ok(&case.args());
        assert_eq!(set_repeatable(&m, ex), INNER, "\"*\" refuses every operator");
        assert_eq!(destroy(&m, ex), 0);
    }
    // an injected fault counts as a refusal: the executor is destroyed without complaint
    let (_, faulted) = m.phase1_ok(&case.args());
    mock::fail_next("aclSetAclOpExecutorRepeatable", INNER);
    assert_eq!(set_repeatable(&m, faulted), INNER);
    assert_eq!(destroy(&m, faulted), 0);
    m.expect_violations(3, "");
    case.release(&m);
    m.finish(&[], &[s], 3);
}

/// `ASCEND_MOCK_REFUSE_REPEATABLE` sets the list a process starts with (in a child process).
#[test]
fn the_environment_refuses_the_operators_it_names() {
    if std::env::var_os("ASCEND_MOCK_REFUSE_REPEATABLE").is_some() {
        let m = Mock::new();
        let case = ut_case(&m, ascend_sys::aclDataType::ACL_FLOAT);
        let (_, ex) = m.phase1_ok(&case.args());
        assert_eq!(set_repeatable(&m, ex), INNER, "refused by the environment");
        assert_eq!(destroy(&m, ex), 0);
        mock::refuse_repeatable(OP, false);
        let (_, ex) = m.phase1_ok(&case.args());
        assert_eq!(set_repeatable(&m, ex), 0, "a later call overrides the environment");
        assert_eq!(destroy(&m, ex), 0);
        case.release(&m);
        m.expect_violations(0, "");
        return;
    }
    let name = "strict::the_environment_refuses_the_operators_it_names";
    let child = self_exec::spawn_self(name, &[("ASCEND_MOCK_REFUSE_REPEATABLE", format!(" aclnnFoo, {OP} "))]);
    self_exec::expect_success("the child under ASCEND_MOCK_REFUSE_REPEATABLE", &child.wait_with_output().unwrap());
}

/// `aclrtFree` neither synchronises nor waits: freeing an idle block leaves the work queued on
/// the device queued (it runs at the synchronise), and a free of memory that queued work uses is
/// still a violation.
#[test]
fn free_does_not_drain_the_device() {
    let (m, s) = Mock::with_stream();
    let (d, idle) = (m.malloc(64), m.malloc(64));
    let src = Pinned::new(m.c, &[7u8; 64]);
    // SAFETY: `src` is pinned and outlives the synchronisation below.
    assert_eq!(unsafe { m.c.acl.aclrtMemcpyAsync(d, 64, src.ptr(), 64, H2D, s) }, 0);
    let queued = mock::live_events_and_queued_tasks().1;
    assert_eq!(m.free(idle), 0);
    assert_eq!(mock::live_events_and_queued_tasks().1, queued, "aclrtFree ran queued work");
    assert_eq!(m.sync(s), 0);
    assert_eq!(m.d2h(d, 64), vec![7u8; 64]);
    // SAFETY: as above.
    assert_eq!(unsafe { m.c.acl.aclrtMemcpyAsync(d, 64, src.ptr(), 64, H2D, s) }, 0);
    assert_eq!(m.free(d), 0);
    m.expect_violations(1, "still uses this memory");
    assert_eq!(m.sync(s), 507053, "the queued copy finds its memory gone");
    m.expect_violations(2, "was freed before the task ran");
    m.finish(&[], &[s], 2);
}

/// `aclrtMemcpyAsync` between host buffers is refused (207000, a violation), with an explicit
/// kind or through `ACL_MEMCPY_DEFAULT`; from or to pageable host memory it runs synchronously
/// (the stream's queued work first, then the copy; a blocking copy), while pinned memory queues.
#[test]
fn async_copies_of_host_memory_are_as_on_cann() {
    let (m, s) = Mock::with_stream();
    let (a, mut b) = ([5u8; 32], [0u8; 32]);
    // SAFETY: host buffers of 32 bytes; the mock refuses the copies without touching them.
    unsafe {
        let h2h = aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_HOST;
        assert_eq!(
            m.c.acl.aclrtMemcpyAsync(b.as_mut_ptr().cast(), 32, a.as_ptr().cast(), 32, h2h, s),
            FEATURE_NOT_SUPPORT
        );
        m.expect_violations(1, "is not supported");
        let default = aclrtMemcpyKind::ACL_MEMCPY_DEFAULT;
        assert_eq!(
            m.c.acl.aclrtMemcpyAsync(b.as_mut_ptr().cast(), 32, a.as_ptr().cast(), 32, default, s),
            FEATURE_NOT_SUPPORT
        );
        m.expect_violations(2, "is not supported");
    }
    assert_eq!(b, [0u8; 32], "nothing copied");
    let d = m.malloc(32);
    let pinned = Pinned::new(m.c, &[3u8; 32]);
    let before = mock::stats();
    // SAFETY: `pinned` outlives the synchronisation; `a` and `b` are written or read at once.
    unsafe {
        assert_eq!(m.c.acl.aclrtMemcpyAsync(d, 32, pinned.ptr(), 32, H2D, s), 0);
        assert_eq!(mock::live_events_and_queued_tasks().1, 1, "a copy from pinned memory is queued");
        assert_eq!(m.c.acl.aclrtMemcpyAsync(b.as_mut_ptr().cast(), 32, d, 32, D2H, s), 0);
        assert_eq!(mock::live_events_and_queued_tasks().1, 0, "a copy to pageable memory waits for the stream");
        assert_eq!(b, [3u8; 32], "and is done when the call returns");
        assert_eq!(m.c.acl.aclrtMemcpyAsync(d, 32, a.as_ptr().cast(), 32, H2D, s), 0);
        assert_eq!(mock::live_events_and_queued_tasks().1, 0, "a copy from pageable memory is done at once");
    }
    assert_eq!(mock::stats().blocking_copies - before.blocking_copies, 2, "the pageable copies block");
    assert_eq!(m.d2h(d, 32), vec![5u8; 32]);
    drop(pinned);
    m.finish(&[d], &[s], 2);
}

/// Phase 1 records the device's `ACL_OPT_DETERMINISTIC`: launches of executors prepared with it
/// on are counted, and a launch after the setting changed (an executor prepared under the old
/// one) is counted as stale.
#[test]
fn phase_1_records_the_deterministic_setting() {
    let (m, s) = Mock::with_stream();
    let case = ut_case(&m, ascend_sys::aclDataType::ACL_FLOAT);
    let set = |on: i64| {
        // SAFETY: plain value arguments on the bound device.
        assert_eq!(unsafe { m.c.acl.aclrtCtxSetSysParamOpt(ascend_sys::aclSysParamOpt::ACL_OPT_DETERMINISTIC, on) }, 0)
    };
    let counts = |before: mock::LaunchCounters| {
        let now = launch_counters();
        (
            now.launches - before.launches,
            now.deterministic_launches - before.deterministic_launches,
            now.stale_deterministic_launches - before.stale_deterministic_launches,
        )
    };
    let before = launch_counters();
    let (size, off) = m.phase1_ok(&case.args());
    assert_eq!(m.launch_sync(size, off, s), 0);
    assert_eq!(counts(before), (1, 0, 0), "prepared and launched with the setting off");
    set(1);
    let before = launch_counters();
    let (size, on) = m.phase1_ok(&case.args());
    assert_eq!(m.launch_sync(size, on, s), 0);
    assert_eq!(counts(before), (1, 1, 0), "prepared and launched with the setting on");
    let (size, prepared_on) = m.phase1_ok(&case.args());
    set(0);
    let before = launch_counters();
    assert_eq!(m.launch_sync(size, prepared_on, s), 0);
    assert_eq!(counts(before), (1, 1, 1), "prepared on, launched after the setting went off: stale");
    case.release(&m);
    m.finish(&[], &[s], 0);
}
