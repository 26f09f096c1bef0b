//! Poison (what a skipped task should have written cannot be read as if it had been, issue 8),
//! events, pinned host memory and call counters (issue 16).

use std::ffi::c_void;
use std::ptr;

use ascend::mock::{self, MockStats};
use ascend_sys::{aclrtEvent, aclrtEventRecordedStatus, aclrtStream, Cann};

use super::with_call_totals;
use crate::common::raw_mock::*;
use crate::common::Rng;

// ---------------------------------------------------------------------------------------------
// Poison: what a skipped task should have written cannot be read as if it had been (issue 8)

/// Queues phase 2 of `args` (over `case`) on `s` with a fresh workspace, then frees the case's
/// input before the stream runs it: the synchronize skips the kernel (507015). Two violations
/// (the free while queued, the skip). The input's `mem` is null afterwards (`release` then only
/// destroys its tensor). Returns the workspace, still allocated.
fn skip_launch(m: &Mock, case: &mut Case, args: &Args, s: aclrtStream) -> *mut c_void {
    let (size, ex) = m.phase1_ok(args);
    let ws = m.malloc(size as usize);
    assert_eq!(m.launch(ws, size, ex, s), 0, "phase 2: {}", m.err());
    let input = std::mem::replace(&mut case.devs[1].mem, ptr::null_mut());
    assert_eq!(m.free(input), 0);
    assert_eq!(m.sync(s), 507015, "the kernel is skipped");
    ws
}

/// The end of a poison test: releases `cases`, frees `buffers` and destroys `s` (each must
/// succeed), then expects every object released, all poison gone, `violations` new ones.
#[track_caller]
fn finish(m: &Mock, cases: impl IntoIterator<Item = Case>, buffers: &[*mut c_void], s: aclrtStream, violations: u64) {
    for case in cases {
        case.release(m);
    }
    m.finish(buffers, &[s], violations);
    let after = mock::stats();
    let want = MockStats {
        device_mallocs: after.device_mallocs,
        violations: m.base.violations + violations,
        ..with_call_totals(m.base, &after)
    };
    assert_eq!(after, want);
    assert_eq!(mock::live_events_and_queued_tasks().1, 0);
}

#[test]
fn poison_skipped_kernel_outputs_fail_to_read_until_rewritten() {
    let m = Mock::new();
    assert_eq!(m.base.poisoned_bytes, 0, "an earlier test left poison behind");
    let s = m.stream();
    let mut case = ut_case(&m, F32);
    let args = case.args();
    let ws = skip_launch(&m, &mut case, &args, s);
    m.expect_err(&[
        "aclrtSynchronizeStream failed. ERROR: 507015",
        "(aclnnBatchNormReduceBackward) was skipped: the device memory of input [",
    ]);
    m.expect_violations(2, "was freed before the task ran");
    assert_eq!(m.poisoned_bytes(), 4 * 12 + 32, "four outputs of three f32, and the 32-byte workspace");
    for (slot, name) in [(5, "sumDy"), (6, "sumDyXmu"), (7, "gradWeight"), (8, "gradBias")] {
        m.expect_poisoned(
            case.devs[slot].mem,
            12,
            &[
                &format!("they are bytes of {name} that task #"),
                "(aclnnBatchNormReduceBackward queued on stream 0x",
                "was skipped: the device memory of input [",
                "was freed before it ran. Nothing was copied.",
            ],
        );
    }
    m.expect_poisoned(ws, 32, &["they are bytes of workspace that task #"]);
    m.expect_poisoned(at(case.devs[5].mem, 5), 1, &["they are bytes of sumDy"]);
    m.expect_violations(2, "");
    // freeing an allocation drops its poison
    assert_eq!(m.free(ws), 0);
    assert_eq!(m.poisoned_bytes(), 48);
    // a partial rewrite clears exactly the bytes written: channel 0 by a copy, channel 2 by a memset
    let sum_dy = case.devs[5].mem;
    assert_eq!(m.h2d(sum_dy, &1.5f32.to_le_bytes()), 0);
    assert_eq!(m.poisoned_bytes(), 44);
    assert_eq!(m.d2h(sum_dy, 4), 1.5f32.to_le_bytes());
    m.expect_poisoned(sum_dy, 12, &[&format!("(at {:p})", at(sum_dy, 4))]);
    assert_eq!(m.memset(at(sum_dy, 8), 0, 4), 0);
    assert_eq!(m.poisoned_bytes(), 40);
    assert_eq!(m.d2h(at(sum_dy, 8), 4), [0u8; 4]);
    m.expect_poisoned(at(sum_dy, 4), 4, &["they are bytes of sumDy"]);
    m.expect_poisoned(at(sum_dy, 3), 2, &[&format!("(at {:p})", at(sum_dy, 4))]);
    m.expect_poisoned(at(sum_dy, 7), 2, &[&format!("(at {:p})", at(sum_dy, 7))]);
    // a full rewrite: the read succeeds, with the new values
    assert_eq!(m.h2d(case.devs[6].mem, &encode(F32, &[7.0, 8.0, 9.0])), 0);
    assert_eq!(m.poisoned_bytes(), 28);
    assert_eq!(m.read(&case.devs[6]), [7.0, 8.0, 9.0]);
    // free drops poison; fresh memory (perhaps at the same address) is clean garbage
    let grad_weight = std::mem::replace(&mut case.devs[7].mem, ptr::null_mut());
    assert_eq!(m.free(grad_weight), 0);
    assert_eq!(m.poisoned_bytes(), 16);
    let fresh = m.malloc(12);
    assert_eq!(m.d2h(fresh, 12), [mock::GARBAGE_BYTE; 12]);
    assert_eq!(m.free(fresh), 0);
    m.expect_violations(2, "");
    finish(&m, [case], &[], s, 2);
}

#[test]
fn poison_propagates_through_kernels_and_async_copies() {
    let (m, s) = Mock::with_stream();
    let mut a = ut_case(&m, F32);
    let args_a = a.args();
    let ws_a = skip_launch(&m, &mut a, &args_a, s);
    assert_eq!(m.free(ws_a), 0);
    m.expect_violations(2, "was freed before the task ran");
    assert_eq!(m.poisoned_bytes(), 48);
    // kernel B reads A's sumDy as its mean: skipped, an error status but no new violation...
    let b = ut_case(&m, F32);
    let mut args = b.args();
    args.t[2] = a.devs[5].t;
    let (size, ex) = m.phase1_ok(&args);
    let ws_b = m.malloc(size as usize);
    assert_eq!(m.launch(ws_b, size, ex, s), 0);
    assert_eq!(m.sync(s), 507015);
    m.expect_err(&[
        "aclrtSynchronizeStream failed. ERROR: 507015",
        "(aclnnBatchNormReduceBackward) was skipped: mean [",
        "holds bytes that were never written",
        "they are bytes of sumDy that task #",
    ]);
    m.expect_violations(2, "");
    // ...and poisons what it should have written, naming the chain back to A
    assert_eq!(m.poisoned_bytes(), 48 + 48 + 32);
    m.expect_poisoned(
        b.devs[8].mem,
        12,
        &[
            "they are bytes of gradBias that task #",
            "was skipped: mean [",
            "they are bytes of sumDy that task #",
            "was freed before it ran",
        ],
    );
    assert_eq!(m.free(ws_b), 0);
    // queued copies reading poison are skipped; a device destination is poisoned in turn
    let dst = m.upload(&[0u8; 12]);
    let host = super::Pinned::new(m.c, &[0x11u8; 12]);
    // SAFETY: `host` outlives the synchronization; the mock checks the device ranges.
    unsafe {
        assert_eq!(m.c.acl.aclrtMemcpyAsync(dst, 12, a.devs[8].mem, 12, D2D, s), 0);
        assert_eq!(m.c.acl.aclrtMemcpyAsync(host.ptr(), 12, a.devs[8].mem, 12, D2H, s), 0);
    }
    assert_eq!(m.sync(s), 507053);
    m.expect_err(&[
        "aclrtSynchronizeStream failed. ERROR: 507053",
        "(aclrtMemcpyAsync) was skipped: the copy's source [",
        "they are bytes of gradBias that task #",
    ]);
    assert_eq!(host.bytes(), [0x11u8; 12], "the skipped copy wrote nothing");
    assert_eq!(m.poisoned_bytes(), 96 + 12);
    m.expect_poisoned(
        dst,
        12,
        &[
            "they are bytes of the copy's destination that task #",
            "(aclrtMemcpyAsync queued on stream 0x",
            "they are bytes of gradBias that task #",
        ],
    );
    // a synchronous device-to-device copy from poison fails and leaves its destination alone
    let clean = m.upload(&[5u8; 12]);
    // SAFETY: both ranges are device memory the mock checks.
    assert_eq!(unsafe { m.c.acl.aclrtMemcpy(clean, 12, dst, 12, D2D) }, 507053);
    assert!(m.err().contains("Nothing was copied"));
    assert_eq!(m.d2h(clean, 12), [5u8; 12]);
    assert_eq!(m.poisoned_bytes(), 96 + 12);
    m.expect_violations(2, "");
    // queued copies that run clear what they wrote: dst, and A's sumDy (B's mean)
    let ones = super::Pinned::new(m.c, &encode(F32, &[1.0; 3]));
    // SAFETY: `ones` outlives the synchronization.
    unsafe {
        assert_eq!(m.c.acl.aclrtMemcpyAsync(dst, 12, clean, 12, D2D, s), 0);
        assert_eq!(m.c.acl.aclrtMemcpyAsync(a.devs[5].mem, 12, ones.ptr(), 12, H2D, s), 0);
    }
    assert_eq!(m.sync(s), 0, "{}", m.err());
    assert_eq!(m.d2h(dst, 12), [5u8; 12]);
    assert_eq!(m.poisoned_bytes(), 96 - 12);
    // B relaunched: it runs, clears its outputs, and they hold what a clean run computes
    let (size, ex) = m.phase1_ok(&args);
    assert_eq!(m.launch_sync(size, ex, s), 0, "{}", m.err());
    assert_eq!(m.poisoned_bytes(), 36, "A's three other outputs");
    let v = Rng::new(0x5EED).vec_f32(24, -8.0, 8.0);
    let reference = Case::new(&m, F32, &[2, 3, 1, 4], &v, &v, &[1.0; 3], &[0.125, 0.1, 0.3]);
    m.expect_ok(&reference.args());
    assert_eq!(b.outputs(&m), reference.outputs(&m));
    m.expect_violations(2, "");
    drop((host, ones));
    finish(&m, [a, b, reference], &[dst, clean], s, 2);
}

#[test]
fn poison_covers_exactly_the_elements_of_strided_views() {
    let (m, s) = Mock::with_stream();
    // one allocation, two interleaved [3] views: even elements = sumDy of a kernel that is skipped
    let shared = m.upload(&encode(F32, &[0.0, 10.0, 0.0, 11.0, 0.0, 12.0]));
    let even = m.create_tensor(&Spec::strided(F32, &[3], &[2], 0, 6), shared);
    let odd = m.create_tensor(&Spec::strided(F32, &[3], &[2], 1, 6), shared);
    assert!(!even.is_null() && !odd.is_null());
    let mut a = ut_case(&m, F32);
    let mut args = a.args();
    args.t[5] = even;
    let ws = skip_launch(&m, &mut a, &args, s);
    assert_eq!(m.free(ws), 0);
    assert_eq!(m.poisoned_bytes(), 12 + 3 * 12, "the even elements and the three other outputs");
    for (k, v) in [10.0f32, 11.0, 12.0].into_iter().enumerate() {
        assert_eq!(m.d2h(at(shared, 8 * k + 4), 4), v.to_le_bytes(), "odd element {k} is not poisoned");
        m.expect_poisoned(at(shared, 8 * k), 4, &["they are bytes of sumDy that task #"]);
    }
    m.expect_poisoned(at(shared, 4), 8, &[&format!("(at {:p})", at(shared, 8))]);
    // a kernel reading the odd view runs, though its span covers poisoned even elements
    let b = ut_case(&m, F32);
    let mut args_b = b.args();
    args_b.t[2] = odd;
    m.expect_ok(&args_b);
    assert_eq!(m.poisoned_bytes(), 48);
    // one reading the even view is skipped (and poisons B's outputs)
    let mut args_c = b.args();
    args_c.t[3] = even;
    let (size, ex) = m.phase1_ok(&args_c);
    assert_eq!(m.launch_sync(size, ex, s), 507015);
    assert!(m.err().contains("was skipped: invstd ["));
    m.expect_poisoned(b.devs[6].mem, 12, &["they are bytes of sumDyXmu", "was skipped: invstd ["]);
    assert_eq!(m.poisoned_bytes(), 48 + 48);
    // a kernel writing the even view clears exactly its elements; the odd ones keep their values
    let c = ut_case(&m, F32);
    let mut args_d = c.args();
    args_d.t[5] = even;
    m.expect_ok(&args_d);
    assert_eq!(m.poisoned_bytes(), 36 + 48);
    let v = Rng::new(0x5EED).vec_f32(24, -8.0, 8.0);
    let spec = f32_spec(&[2, 3, 1, 4]);
    let sum_dy = replica(&spec, &v, &spec, &v, &[-2.0, 2.0, 1.0], &[0.125, 0.1, 0.3], 3).0;
    let all = decode(F32, &m.d2h(shared, 24));
    assert_eq!(all, [sum_dy[0], 10.0, sum_dy[1], 11.0, sum_dy[2], 12.0]);
    m.expect_violations(2, "");
    for t in [even, odd] {
        assert_eq!(m.destroy_tensor(t), 0);
    }
    finish(&m, [a, b, c], &[shared], s, 2);
}

// ---------------------------------------------------------------------------------------------
// Events, pinned host memory and call counters (issue 16)

fn query(c: &Cann, e: aclrtEvent) -> (i32, aclrtEventRecordedStatus) {
    let mut status = aclrtEventRecordedStatus::ACL_EVENT_RECORDED_STATUS_COMPLETE;
    // SAFETY: `status` is a valid out-pointer; the mock checks the handle.
    let st = unsafe { c.acl.aclrtQueryEventStatus(e, &mut status) };
    (st, status)
}

/// Events as CANN documents them: a query never blocks (NOT_READY until the record ran, also
/// for an event never recorded), elapsed time needs both events completed, and destroying an
/// event that a queued aclrtStreamWaitEvent still refers to is a violation.
#[test]
fn events_query_elapsed_time_and_destroy_while_waited_on() {
    const DONE: aclrtEventRecordedStatus = aclrtEventRecordedStatus::ACL_EVENT_RECORDED_STATUS_COMPLETE;
    const NOT_READY: aclrtEventRecordedStatus = aclrtEventRecordedStatus::ACL_EVENT_RECORDED_STATUS_NOT_READY;
    let m = Mock::new();
    let (a, b) = (m.stream(), m.stream());
    let c = m.c;
    let d = m.malloc(4096);
    let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut start: aclrtEvent = ptr::null_mut();
    let mut end: aclrtEvent = ptr::null_mut();
    let before = mock::stats();
    // SAFETY: handles from the mock; host buffers outlive the synchronisations below.
    unsafe {
        assert_eq!(c.acl.aclrtCreateEvent(&mut start), 0);
        assert_eq!(c.acl.aclrtCreateEvent(&mut end), 0);
        assert_eq!(query(c, start), (0, NOT_READY), "never recorded");
        assert_eq!(c.acl.aclrtRecordEvent(start, a), 0);
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 4096, src.as_ptr().cast(), 4096, H2D, a), 0);
        assert_eq!(c.acl.aclrtRecordEvent(end, a), 0);
        assert_eq!(query(c, end), (0, NOT_READY), "queued, not run: a query runs nothing");
        let mut ms = -1f32;
        assert_eq!(c.acl.aclrtEventElapsedTime(&mut ms, start, end), 107000, "not completed yet");
        assert_eq!(ms, -1.0, "nothing written on failure");
        assert_eq!(c.acl.aclrtSynchronizeEvent(end), 0);
        assert_eq!(query(c, start), (0, DONE));
        assert_eq!(query(c, end), (0, DONE));
        assert_eq!(c.acl.aclrtEventElapsedTime(&mut ms, start, end), 0, "{}", m.err());
        assert!(ms.is_finite() && ms >= 0.0, "{ms}");
        // a wait queued on b keeps the event in use until b runs it
        assert_eq!(c.acl.aclrtRecordEvent(end, a), 0);
        assert_eq!(c.acl.aclrtStreamWaitEvent(b, end), 0);
        assert_eq!(c.acl.aclrtDestroyEvent(end), 107000);
        m.expect_violations(1, "is still waited for by");
        assert_eq!(m.sync(b), 0);
        assert_eq!(c.acl.aclrtDestroyEvent(end), 0, "{}", m.err());
        assert_eq!(c.acl.aclrtDestroyEvent(start), 0);
    }
    let after = mock::stats();
    assert_eq!(after.event_synchronizes - before.event_synchronizes, 1);
    assert_eq!(after.stream_synchronizes - before.stream_synchronizes, 1);
    assert_eq!(m.d2h(d, 4096), src);
    assert_eq!(m.sync(a), 0);
    m.finish(&[d], &[a, b], 1);
}

/// The cross-stream hazard detector on the raw API: two copies on different streams writing the
/// same device bytes, with nothing ordering them, are a violation; the same pair ordered by an
/// event (record on the first stream, wait on the second) is accepted and the second write wins.
#[test]
fn hazard_detector_catches_an_unordered_pair_and_accepts_an_event_ordered_one() {
    let m = Mock::new();
    let (a, b) = (m.stream(), m.stream());
    let c = m.c;
    let d = m.malloc(256);
    let first: Vec<u8> = (0..256u32).map(|i| (i % 13) as u8 + 1).collect();
    let second: Vec<u8> = (0..256u32).map(|i| (i % 17) as u8 + 100).collect();
    let (first_pinned, second_pinned) = (super::Pinned::new(c, &first), super::Pinned::new(c, &second));
    // SAFETY: handles from the mock; host buffers outlive the synchronisations below.
    unsafe {
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 256, first_pinned.ptr(), 256, H2D, a), 0);
        // overlapping bytes [128, 256), both writing, nothing in between
        assert_eq!(c.acl.aclrtMemcpyAsync(at(d, 128), 128, second_pinned.ptr(), 128, H2D, b), 0);
        m.expect_violations(1, "with no synchronization in between");
        assert_eq!(m.sync(a), 0);
        assert_eq!(m.sync(b), 0);
        // ordered by an event: accepted
        let mut ev: aclrtEvent = ptr::null_mut();
        assert_eq!(c.acl.aclrtCreateEvent(&mut ev), 0);
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 256, first_pinned.ptr(), 256, H2D, a), 0);
        assert_eq!(c.acl.aclrtRecordEvent(ev, a), 0);
        assert_eq!(c.acl.aclrtStreamWaitEvent(b, ev), 0);
        assert_eq!(c.acl.aclrtMemcpyAsync(at(d, 128), 128, second_pinned.ptr(), 128, H2D, b), 0);
        m.expect_violations(1, "");
        assert_eq!(m.sync(b), 0);
        assert_eq!(m.sync(a), 0);
        assert_eq!(c.acl.aclrtDestroyEvent(ev), 0);
    }
    let mut want = first[..128].to_vec();
    want.extend_from_slice(&second[..128]);
    assert_eq!(m.d2h(d, 256), want);
    m.finish(&[d], &[a, b], 1);
}

/// Pinned host memory: aclrtMallocHost blocks are host memory an async copy may use; freeing one
/// while a queued copy still reads it is a violation; a double free is refused. The counters see
/// each allocation, free, blocking copy and synchronise.
#[test]
fn pinned_host_memory_and_call_counters() {
    let (m, s) = Mock::with_stream();
    let c = m.c;
    let d = m.malloc(64);
    let before = mock::stats();
    // SAFETY: pointers from the mock; each copy stays inside its 64-byte block.
    unsafe {
        let mut h: *mut c_void = ptr::null_mut();
        assert_eq!(c.acl.aclrtMallocHost(&mut h, 64), 0);
        let bytes: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5A).collect();
        ptr::copy_nonoverlapping(bytes.as_ptr(), h.cast::<u8>(), 64);
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 64, h, 64, H2D, s), 0);
        assert_eq!(m.sync(s), 0);
        assert_eq!(m.d2h(d, 64), bytes);
        assert_eq!(mock::stats().live_host_allocations, before.live_host_allocations + 1);
        // freed while a queued copy still reads it: refused, the block stays
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 64, h, 64, H2D, s), 0);
        assert_eq!(c.acl.aclrtFreeHost(h), 107000);
        m.expect_violations(1, "still uses this host memory");
        assert_eq!(m.sync(s), 0);
        assert_eq!(c.acl.aclrtFreeHost(h), 0, "{}", m.err());
        assert_eq!(c.acl.aclrtFreeHost(h), 107000);
        m.expect_violations(2, "not a live aclrtMallocHost block");
    }
    let after = mock::stats();
    assert_eq!(after.host_mallocs - before.host_mallocs, 1);
    assert_eq!(after.live_host_allocations, before.live_host_allocations);
    assert_eq!(after.stream_synchronizes - before.stream_synchronizes, 2);
    assert_eq!(after.blocking_copies - before.blocking_copies, 1, "the one aclrtMemcpy of d2h");
    assert_eq!(after.device_frees, before.device_frees);
    assert_eq!(m.free(d), 0);
    assert_eq!(mock::stats().device_frees, before.device_frees + 1);
    assert_eq!(m.destroy_stream(s), 0);
    m.expect_violations(2, "");
}
