//! Tests of the mock CANN runtime through the raw `ascend-sys` bindings (issue 3), apart from any
//! operator's own checks (the first operator's `ut_*`/`values_*` live with its tests):
//!
//! * each kind of misuse counts a violation (and returns CANN's error) — see the `violation_*` tests;
//! * runtime semantics: streams are queues, events, threads, fault injection.
//!
//! The mock's counters are process-wide, so every test holds the lock of `common::raw_mock::Mock` and compares exact deltas.
#![cfg(feature = "mock")]

mod capture;
#[path = "../common/mod.rs"]
mod common;
mod events_strict;
mod poison_and_events;
mod strict;

use std::ffi::c_void;
use std::ptr;

use ascend::mock::{self, MockStats};
use ascend_sys::{
    aclDataType, aclOpExecutor, aclTensor, aclrtEvent, aclrtMemMallocPolicy, aclrtMemcpyKind, aclrtStream, Cann,
};

use common::raw_mock::*;
use common::{self_exec, Rng};

/// Page-locked host memory (`aclrtMallocHost`) holding a copy of some bytes: an
/// `aclrtMemcpyAsync` from or to it is queued (one from pageable memory runs synchronously, as on
/// CANN). Freed on drop, which must come after the copies that use it have run.
pub struct Pinned {
    c: &'static Cann,
    p: *mut c_void,
    len: usize,
}

impl Pinned {
    pub fn new(c: &'static Cann, bytes: &[u8]) -> Pinned {
        let mut p = ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; the block holds `bytes.len()` bytes, written once.
        unsafe {
            assert_eq!(c.acl.aclrtMallocHost(&mut p, bytes.len()), 0);
            ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast::<u8>(), bytes.len());
        }
        Pinned { c, p, len: bytes.len() }
    }

    pub fn ptr(&self) -> *mut c_void {
        self.p
    }

    /// Its bytes now (read once the copies writing it have run).
    pub fn bytes(&self) -> Vec<u8> {
        // SAFETY: the block holds `len` initialised bytes; no copy writes it meanwhile (the
        // caller synchronised).
        unsafe { std::slice::from_raw_parts(self.p.cast::<u8>(), self.len).to_vec() }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: a live aclrtMallocHost block, freed once.
        let status = unsafe { self.c.acl.aclrtFreeHost(self.p) };
        if !std::thread::panicking() {
            assert_eq!(status, 0, "aclrtFreeHost");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Violations

#[test]
fn violation_free_of_unknown_or_freed_pointer() {
    let m = Mock::new();
    let mut host = [0u8; 64];
    assert_eq!(m.free(host.as_mut_ptr().cast()), 107000);
    m.expect_violations(1, "is not a live device allocation");
    assert!(m.err().contains("aclrtFree failed. ERROR: 107000"));
    let p = m.malloc(64);
    // SAFETY: only used as an address; the mock rejects it without touching memory.
    let inner = unsafe { p.cast::<u8>().add(32) };
    assert_eq!(m.free(inner.cast()), 107000);
    m.expect_violations(2, "points inside the allocation");
    assert_eq!(m.free(p), 0);
    assert_eq!(m.free(p), 107000);
    m.expect_violations(3, "double free");
    assert_eq!(m.free(ptr::null_mut()), 100000);
    m.expect_violations(3, "");
}

#[test]
fn violation_free_while_queued_copy_uses_it() {
    let (m, s) = Mock::with_stream();
    let p = m.malloc(64);
    let host = Pinned::new(m.c, &[1u8; 64]);
    // SAFETY: `host` outlives the stream synchronization below.
    assert_eq!(unsafe { m.c.acl.aclrtMemcpyAsync(p, 64, host.ptr(), 64, H2D, s) }, 0);
    assert_eq!(m.free(p), 0, "the free itself succeeds");
    m.expect_violations(1, "still uses this memory");
    assert_eq!(m.sync(s), 507053, "the queued copy finds its memory gone");
    m.expect_violations(2, "was freed before the task ran");
    assert!(m.err().contains("aclrtSynchronizeStream failed. ERROR: 507053"));
    assert_eq!(m.destroy_stream(s), 0);
}

#[test]
fn violation_launch_reading_freed_memory() {
    let (m, s) = Mock::with_stream();
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    let (size, ex) = m.phase1_ok(&case.args());
    let ws = m.malloc(size as usize);
    assert_eq!(m.launch(ws, size, ex, s), 0);
    // free the input and the workspace before the launch ran
    assert_eq!(m.free(case.devs[1].mem), 0);
    m.expect_violations(1, "still uses this memory (input)");
    assert_eq!(m.free(ws), 0);
    m.expect_violations(2, "still uses this memory (workspace)");
    assert_eq!(m.sync(s), 507015);
    m.expect_violations(3, "device memory of input");
    m.expect_poisoned(case.devs[5].mem, 12, &["they are bytes of sumDy that task #", "was freed before it ran"]);
    m.expect_violations(3, "");
    let mut devs = case.devs;
    let input = devs.remove(1);
    assert_eq!(m.destroy_tensor(input.t), 0);
    for d in devs {
        m.release(d);
    }
    assert_eq!(m.destroy_stream(s), 0);
    // a tensor over freed memory cannot be launched either
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    let (size, ex) = m.phase1_ok(&case.args());
    assert_eq!(m.free(case.devs[2].mem), 0);
    let ws = m.malloc(size as usize);
    assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), INVALID);
    m.expect_violations(4, "the device memory of tensor mean");
    assert_eq!(mock::stats().live_executors, m.base.live_executors, "a failed phase 2 still consumes");
    assert_eq!(m.free(ws), 0);
    let mut devs = case.devs;
    let mean = devs.remove(2);
    assert_eq!(m.destroy_tensor(mean.t), 0);
    for d in devs {
        m.release(d);
    }
    m.expect_violations(4, "");
}

#[test]
fn violation_destroyed_tensor() {
    let m = Mock::new();
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    // destroyed between phase 1 and phase 2
    let (size, ex) = m.phase1_ok(&case.args());
    let extra = m.dev(&f32_spec(&[3]), &[0.0; 3]);
    let mut a = case.args();
    a.t[7] = extra.t;
    let (st2, size2, ex2) = m.phase1(&a);
    assert_eq!(st2, 0);
    assert_eq!(m.destroy_tensor(extra.t), 0);
    let ws = m.malloc(size.max(size2) as usize);
    assert_eq!(m.launch(ws, size2, ex2, ptr::null_mut()), INVALID);
    m.expect_violations(1, "tensor gradWeight");
    assert!(m.err().contains("was destroyed between GetWorkspaceSize and the launch"));
    // destroying tensors right after the launch is fine (op-plugin does it)
    assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), 0);
    for d in &case.devs {
        assert_eq!(m.destroy_tensor(d.t), 0);
    }
    assert_eq!(m.sync(ptr::null_mut()), 0);
    assert_eq!(m.read(&case.devs[5]).len(), 3);
    m.expect_violations(1, "");
    // double destroy
    assert_eq!(m.destroy_tensor(case.devs[0].t), INVALID);
    m.expect_violations(2, "already destroyed");
    assert_eq!(m.destroy_tensor(ptr::null()), NULLPTR);
    // phase 1 with a destroyed tensor
    let (st, _, ex) = m.phase1(&case.args());
    assert_eq!(st, INVALID);
    assert!(ex.is_null());
    m.expect_violations(3, "argument gradOut");
    assert_eq!(m.free(ws), 0);
    assert_eq!(m.free(extra.mem), 0);
    for d in case.devs {
        assert_eq!(m.free(d.mem), 0);
    }
    assert_eq!(mock::stats().live_tensors, m.base.live_tensors);
    m.expect_violations(3, "");
}

#[test]
fn violation_destroyed_or_unknown_stream() {
    let (m, s) = Mock::with_stream();
    assert_eq!(mock::stats().live_streams, m.base.live_streams + 1);
    assert_eq!(m.destroy_stream(s), 0);
    assert_eq!(mock::stats().live_streams, m.base.live_streams);
    assert_eq!(m.sync(s), 107017);
    m.expect_violations(1, "already destroyed");
    assert_eq!(m.destroy_stream(s), 107017);
    m.expect_violations(2, "already destroyed");
    let p = m.malloc(32);
    let host = [0u8; 32];
    // SAFETY: the mock rejects the stream before queueing anything.
    assert_eq!(unsafe { m.c.acl.aclrtMemcpyAsync(p, 32, host.as_ptr().cast(), 32, H2D, s) }, 107017);
    m.expect_violations(3, "already destroyed");
    let bogus = 0x1234_5678usize as aclrtStream;
    assert_eq!(m.sync(bogus), 107017);
    m.expect_violations(4, "not a handle this toolkit issued");
    // phase 2 on a dead stream: the runtime refuses it
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    let (_, size, ex) = m.phase1(&case.args());
    let ws = m.malloc(size as usize);
    assert_eq!(m.launch(ws, size, ex, s), 361001);
    m.expect_violations(5, "already destroyed");
    assert_eq!(m.destroy_stream(ptr::null_mut()), 100000);
    m.expect_violations(6, "the default stream cannot be destroyed");
    assert_eq!(m.free(ws), 0);
    assert_eq!(m.free(p), 0);
    case.release(&m);
    assert_eq!(mock::stats().live_executors, m.base.live_executors);
}

#[test]
fn violation_executor_launched_twice() {
    with_ut_case(aclDataType::ACL_FLOAT, 1, |m, case, _| {
        let (size, ex) = m.phase1_ok(&case.args());
        let ws = m.malloc(size as usize);
        assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), 0);
        assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), INVALID);
        m.expect_violations(1, "launched twice?");
        assert_eq!(m.sync(ptr::null_mut()), 0);
        assert_eq!(m.launch(ws, size, ptr::null_mut(), ptr::null_mut()), NULLPTR);
        assert_eq!(m.free(ws), 0);
    });
}

#[test]
fn violation_wrong_workspace() {
    with_ut_case(aclDataType::ACL_FLOAT, 7, |m, case, _| {
        let a = case.args();
        let (size, ex) = m.phase1_ok(&a);
        assert_eq!(m.launch_sync(size, ex, ptr::null_mut()), 0);
        assert!(size >= 24, "2·C floats");
        let ws = m.malloc(size as usize);
        let small = m.malloc(size as usize - 4);
        let cases: [(*mut c_void, u64, &str); 5] = [
            (ws, size - 4, "is smaller than the"),
            (ptr::null_mut(), size, "pass NULL exactly when the size is 0"),
            (ws, 0, "pass NULL exactly when the size is 0"),
            (small, size, "is not inside one live device allocation"),
            // SAFETY (address only): inside `ws`, the mock checks the range without touching it.
            (unsafe { ws.cast::<u8>().add(4).cast() }, size, "is not inside one live device allocation"),
        ];
        for (i, (ptr_, len, needle)) in cases.into_iter().enumerate() {
            let (_, ex) = m.phase1_ok(&a);
            assert_eq!(m.launch(ptr_, len, ex, ptr::null_mut()), INVALID, "case {i}");
            m.expect_violations(i as u64 + 1, needle);
        }
        // a freed workspace (freed after the launch, before the run)
        let (_, _, ex) = m.phase1(&a);
        assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), 0);
        assert_eq!(m.free(ws), 0);
        m.expect_violations(6, "(workspace)");
        assert_eq!(m.sync(ptr::null_mut()), 507015);
        m.expect_violations(7, "device memory of workspace");
        assert_eq!(m.free(small), 0);
        assert_eq!(mock::stats().live_executors, m.base.live_executors);
    });
}

#[test]
fn violation_bad_tensor_descriptions() {
    let m = Mock::new();
    let p = m.malloc(240);
    let s = f32_spec(&[4, 2]);
    let bad = |spec: &Spec, data: *mut c_void, n: u64, needle: &str| {
        assert!(m.create_tensor(spec, data).is_null(), "{spec:?} must be rejected");
        m.expect_violations(n, needle);
        assert!(m.err().contains("aclCreateTensor failed"));
    };
    // SAFETY (addresses only): never dereferenced by the mock, which rejects them.
    let (p4, p224) = unsafe { (p.cast::<u8>().add(4).cast(), p.cast::<u8>().add(224).cast()) };
    bad(&s, p4, 1, "is not 32-byte aligned");
    bad(&s, p224, 2, "runs past the end of its device allocation");
    let mut host = vec![0u64; 64];
    let host_ptr = host.as_mut_ptr().cast::<u8>();
    let aligned = host_ptr.wrapping_add(host_ptr.align_offset(32)).cast();
    bad(&s, aligned, 3, "is not inside a live device allocation");
    bad(&s, ptr::null_mut(), 4, "tensorData is null but the storage has 8 elements");
    bad(&Spec::strided(aclDataType::ACL_FLOAT, &[4, 2], &[2, 1], 1, 8), p, 5, "exceeds the storage");
    bad(&Spec::strided(aclDataType::ACL_FLOAT, &[4, 2], &[-2, 1], 6, 8), p, 6, "stride 0 is negative");
    bad(&Spec::strided(aclDataType::ACL_FLOAT, &[-4, 2], &[2, 1], 0, 8), p, 7, "view dim 0 is negative");
    bad(&Spec::strided(aclDataType::ACL_FLOAT, &[4, 2], &[2, 1], -1, 8), p, 8, "offset -1 is negative");
    bad(&Spec { storage_dims: vec![-8], ..s.clone() }, p, 9, "storage dim 0 is negative");
    assert_eq!(m.free(p), 0);
    bad(&s, p, 10, "is not inside a live device allocation");
    // accepted: empty storage with null data; a view at the very end of the storage; a broadcast (stride 0)
    let ok = [
        (Spec::strided(aclDataType::ACL_FLOAT, &[0, 2], &[2, 1], 0, 0), ptr::null_mut()),
        (Spec::strided(aclDataType::ACL_FLOAT, &[2, 2], &[2, 1], 4, 8), m.malloc(32)),
        (Spec::strided(aclDataType::ACL_FLOAT, &[4, 2], &[0, 1], 0, 2), m.malloc(8)),
    ];
    for (spec, data) in &ok {
        let t = m.create_tensor(spec, *data);
        assert!(!t.is_null(), "{spec:?}: {}", m.err());
        assert_eq!(m.destroy_tensor(t), 0);
        if !data.is_null() {
            assert_eq!(m.free(*data), 0);
        }
    }
    m.expect_violations(10, "");
}

#[test]
fn violation_device_call_on_a_thread_without_device() {
    let m = Mock::new();
    let c = m.c;
    let (malloc_st, stream_st, get_st) = std::thread::spawn(move || {
        let mut p = ptr::null_mut();
        let mut s = ptr::null_mut();
        let mut dev = -1;
        // SAFETY: valid out-pointers; the thread never called aclrtSetDevice.
        unsafe {
            (
                c.acl.aclrtMalloc(&mut p, 64, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST),
                c.acl.aclrtCreateStream(&mut s),
                c.acl.aclrtGetDevice(&mut dev),
            )
        }
    })
    .join()
    .unwrap();
    assert_eq!((malloc_st, stream_st, get_st), (107002, 107002, 107002));
    m.expect_violations(2, "call aclrtSetDevice on this thread first");
}

#[test]
fn violation_reset_device_with_live_stream() {
    let (m, s) = Mock::with_stream();
    // SAFETY: plain runtime calls.
    unsafe {
        assert_eq!(m.c.acl.aclrtResetDevice(0), 0);
        m.expect_violations(1, "stream(s) created on the device are still alive");
        assert_eq!(m.c.acl.aclrtResetDevice(0), 107000);
        m.expect_violations(2, "more aclrtResetDevice than aclrtSetDevice");
        assert_eq!(m.c.acl.aclrtSetDevice(0), 0);
        let mut dev = -1;
        assert_eq!(m.c.acl.aclrtGetDevice(&mut dev), 0);
        assert_eq!(dev, 0);
    }
    assert_eq!(m.destroy_stream(s), 0);
    m.expect_violations(2, "");
}

#[test]
fn violation_memcpy_and_memset_checks() {
    let m = Mock::new();
    let d = m.malloc(64);
    let d2 = m.malloc(64);
    let mut host = vec![0u8; 64];
    let h = host.as_mut_ptr().cast::<c_void>();
    let c = m.c;
    let mut n = 0;
    let mut expect = |st: i32, needle: &str| {
        n += 1;
        assert_eq!(st, 107000, "{needle}");
        m.expect_violations(n, needle);
    };
    // SAFETY: every call below is rejected by the mock before any byte is copied.
    unsafe {
        expect(c.acl.aclrtMemcpy(h, 64, d, 64, H2D), "dst range");
        expect(c.acl.aclrtMemcpy(d, 64, d2, 64, H2D), "src range");
        expect(c.acl.aclrtMemcpy(d, 64, h, 64, D2H), "dst range");
        expect(c.acl.aclrtMemcpy(d, 64, h, 64, D2D), "src range");
        expect(c.acl.aclrtMemcpy(d, 32, h, 64, H2D), "count 64 is greater than destMax 32");
        expect(c.acl.aclrtMemcpy(d, 128, h, 65, H2D), "not inside one live device allocation");
        expect(c.acl.aclrtMemcpy(d, 64, h, 64, aclrtMemcpyKind(9)), "is not an aclrtMemcpyKind");
        expect(c.acl.aclrtMemset(d, 32, 0, 64), "count 64 is greater than maxCount 32");
        expect(c.acl.aclrtMemset(d, 128, 0, 65), "not inside one live device allocation");
        // accepted: D2D, DEFAULT (kind from provenance), memset, count 0
        assert_eq!(c.acl.aclrtMemset(d, 64, 7, 64), 0);
        assert_eq!(c.acl.aclrtMemcpy(d2, 64, d, 64, D2D), 0);
        assert_eq!(c.acl.aclrtMemcpy(h, 64, d2, 64, aclrtMemcpyKind::ACL_MEMCPY_DEFAULT), 0);
        assert_eq!(c.acl.aclrtMemcpy(d, 64, h, 0, H2D), 0);
    }
    assert_eq!(host, vec![7u8; 64]);
    m.finish(&[d, d2], &[], 9);
}

#[test]
fn violation_unsynchronized_access_to_queued_work() {
    let m = Mock::new();
    let a = m.stream();
    let b = m.stream();
    let d = m.malloc(64);
    let src = Pinned::new(m.c, &[3u8; 64]);
    let mut dst = vec![0u8; 64];
    let pinned_dst = Pinned::new(m.c, &[0u8; 64]);
    let c = m.c;
    // SAFETY: host buffers outlive the synchronizations below.
    unsafe {
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 64, src.ptr(), 64, H2D, a), 0);
        // a synchronous read of memory that queued work will write: reads garbage
        assert_eq!(c.acl.aclrtMemcpy(dst.as_mut_ptr().cast(), 64, d, 64, D2H), 0);
        m.expect_violations(1, "with no synchronization in between");
        assert_eq!(dst, vec![mock::GARBAGE_BYTE; 64], "fresh device memory is garbage, not zeros");
        // another stream reading it without an event
        assert_eq!(c.acl.aclrtMemcpyAsync(pinned_dst.ptr(), 64, d, 64, D2H, b), 0);
        m.expect_violations(2, "queued on stream");
        assert_eq!(m.sync(b), 0);
        // ordered through an event: no violation, and the data arrives
        assert_eq!(c.acl.aclrtMemcpyAsync(d, 64, src.ptr(), 64, H2D, a), 0);
        let mut ev: aclrtEvent = ptr::null_mut();
        assert_eq!(c.acl.aclrtCreateEvent(&mut ev), 0);
        assert_eq!(c.acl.aclrtRecordEvent(ev, a), 0);
        assert_eq!(c.acl.aclrtStreamWaitEvent(b, ev), 0);
        assert_eq!(c.acl.aclrtMemcpyAsync(pinned_dst.ptr(), 64, d, 64, D2H, b), 0);
        assert_eq!(c.acl.aclrtSynchronizeEvent(ev), 0);
        assert_eq!(m.sync(b), 0);
        assert_eq!(pinned_dst.bytes(), src.bytes());
        assert_eq!(c.acl.aclrtDestroyEvent(ev), 0);
        assert_eq!(c.acl.aclrtSynchronizeEvent(ev), 107017);
        m.expect_violations(3, "event");
    }
    assert_eq!(m.sync(a), 0);
    assert_eq!(m.destroy_stream(a), 0);
    assert_eq!(m.destroy_stream(b), 0);
    assert_eq!(m.free(d), 0);
    m.expect_violations(3, "");
}

#[test]
fn violation_unchecked_lengths_caught_when_the_kernel_runs() {
    with_ut_case(aclDataType::ACL_FLOAT, 2, |m, case, extra| {
        // mean of length 2 < C = 3: ops-nn accepts it, the kernel reads past the view
        let mut a = case.args();
        swap(m, &mut a, 2, &f32_spec(&[2]), extra);
        let (st, size, ex) = m.phase1(&a);
        assert_eq!(st, 0, "ops-nn does not check mean's length");
        let ws = m.malloc(size as usize);
        assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), 0);
        assert_eq!(m.sync(ptr::null_mut()), 507015);
        m.expect_violations(1, "mean has shape [2] (2 elements) but the kernel reads 3");
        assert!(m.err().contains("its kernel failed with status 507015"));
        m.expect_poisoned(case.devs[5].mem, 12, &["they are bytes of sumDy that task #", "its kernel failed"]);
        // gradOut of another shape than input
        let mut a = case.args();
        swap(m, &mut a, 0, &f32_spec(&[2, 3, 2, 2]), extra);
        let (st, size2, ex) = m.phase1(&a);
        assert_eq!(st, 0, "ops-nn does not check gradOut's shape");
        assert_eq!(m.launch(ws, size2, ex, ptr::null_mut()), 0);
        assert_eq!(m.sync(ptr::null_mut()), 507015);
        m.expect_violations(2, "gradOut has shape [2, 3, 2, 2] but input has shape [2, 3, 1, 4]");
        assert_eq!(m.free(ws), 0);
    });
}

#[test]
fn violation_executor_destroy_rules_and_repeatable() {
    let m = Mock::new();
    let mut rng = Rng::new(99);
    let dy = rng.vec_f32(24, -1.0, 1.0);
    let x = rng.vec_f32(24, -1.0, 1.0);
    let case = Case::new(&m, aclDataType::ACL_FLOAT, &[2, 3, 1, 4], &dy, &x, &[0.5, 0.0, -0.5], &[1.0, 2.0, 0.5]);
    // SAFETY: the mock validates executor handles.
    unsafe {
        assert_eq!(m.c.nnopbase.aclDestroyAclOpExecutor(ptr::null_mut()), 561103);
        let (_, ex) = m.phase1_ok(&case.args());
        assert_eq!(m.c.nnopbase.aclDestroyAclOpExecutor(ex), 0);
        m.expect_violations(1, "is not repeatable");
        assert_eq!(mock::stats().live_executors, m.base.live_executors, "freed anyway");
        // repeatable: launch twice, then destroy
        let (size, ex) = m.phase1_ok(&case.args());
        assert_eq!(m.c.nnopbase.aclSetAclOpExecutorRepeatable(ex), 0);
        let ws = m.malloc(size as usize);
        assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), 0);
        assert_eq!(m.sync(ptr::null_mut()), 0);
        let first = case.outputs(&m);
        assert_eq!(m.h2d(case.devs[5].mem, &encode(aclDataType::ACL_FLOAT, &[0.0; 3])), 0);
        assert_eq!(m.launch(ws, size, ex, ptr::null_mut()), 0);
        assert_eq!(m.sync(ptr::null_mut()), 0);
        assert_eq!(case.outputs(&m), first, "a repeated launch computes the same");
        assert_eq!(mock::stats().live_executors, m.base.live_executors + 1);
        assert_eq!(m.c.nnopbase.aclDestroyAclOpExecutor(ex), 0);
        assert_eq!(mock::stats().live_executors, m.base.live_executors);
        assert_eq!(m.c.nnopbase.aclDestroyAclOpExecutor(ex), INVALID);
        m.expect_violations(2, "already destroyed");
        assert_eq!(m.free(ws), 0);
    }
    case.release(&m);
    m.expect_violations(2, "");
}

// ---------------------------------------------------------------------------------------------
// Runtime: init, devices (each in a child process, so that the state before aclInit is real)

const CHILD_ENV: &str = "ASCEND_MOCK_TEST_CHILD";

/// Runs the `child_entry` test of this binary in a new process with `scenario`.
fn run_child(scenario: &str, env: &[(&str, &str)]) {
    let mut cmd = self_exec::self_command();
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"]).env(CHILD_ENV, scenario);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn the test binary");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child `{scenario}` failed:\n{text}");
    assert!(text.contains("1 passed"), "child `{scenario}` ran no test:\n{text}");
}

#[test]
fn child_entry() {
    let Ok(scenario) = std::env::var(CHILD_ENV) else { return };
    let c = cann();
    let v = || mock::stats().violations;
    // SAFETY: plain runtime calls with valid out-pointers.
    unsafe {
        match scenario.as_str() {
            "uninit" => {
                let mut p = ptr::null_mut();
                let mut s = ptr::null_mut();
                let mut n = 0u32;
                assert_eq!(c.acl.aclrtSetDevice(0), 100001);
                assert_eq!(c.acl.aclrtMalloc(&mut p, 64, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST), 100001);
                assert_eq!(c.acl.aclrtCreateStream(&mut s), 100001);
                assert_eq!(c.acl.aclrtGetDeviceCount(&mut n), 100001);
                assert_eq!(c.acl.aclFinalize(), 100001);
                assert_eq!(v(), 5, "{:?}", mock::violations_since(0));
                assert!(mock::last_violation().unwrap().contains("call aclInit first"));
                assert_eq!(c.acl.aclInit(ptr::null()), 0);
                assert_eq!(c.acl.aclInit(ptr::null()), 100002);
                assert_eq!(c.acl.aclrtGetDeviceCount(&mut n), 0);
                assert_eq!(n, 1);
                assert_eq!(c.acl.aclrtSetDevice(1), 107001);
                assert_eq!(c.acl.aclrtSetDevice(-1), 107001);
                assert_eq!(c.acl.aclrtSetDevice(0), 0);
                assert_eq!(c.acl.aclrtResetDevice(0), 0);
                assert_eq!(c.acl.aclFinalize(), 0);
                assert_eq!(c.acl.aclFinalize(), 100037);
                assert_eq!(v(), 5, "{:?}", mock::violations_since(0));
                assert_eq!(c.acl.aclrtMalloc(&mut p, 64, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST), 100001);
                assert_eq!(v(), 6);
            }
            "two_devices" => {
                let mut n = 0u32;
                let mut s1 = ptr::null_mut();
                assert_eq!(c.acl.aclInit(ptr::null()), 0);
                assert_eq!(c.acl.aclrtGetDeviceCount(&mut n), 0);
                assert_eq!(n, 2);
                assert_eq!(c.acl.aclrtSetDevice(1), 0);
                assert_eq!(c.acl.aclrtCreateStream(&mut s1), 0);
                assert_eq!(c.acl.aclrtSetDevice(0), 0);
                let mut dev = -1;
                assert_eq!(c.acl.aclrtGetDevice(&mut dev), 0);
                assert_eq!(dev, 0);
                assert_eq!(c.acl.aclrtSynchronizeStream(s1), 107003);
                assert_eq!(v(), 1);
                assert!(mock::last_violation().unwrap().contains("belongs to device 1"));
                assert_eq!(c.acl.aclrtSetDevice(1), 0);
                assert_eq!(c.acl.aclrtDestroyStream(s1), 0);
                assert_eq!(c.acl.aclrtResetDevice(1), 0);
                assert_eq!(c.acl.aclrtResetDevice(1), 0);
                assert_eq!(c.acl.aclrtResetDevice(0), 0);
                assert_eq!(c.acl.aclFinalize(), 0);
                assert_eq!(v(), 1);
            }
            "no_devices" => {
                let mut n = 7u32;
                assert_eq!(c.acl.aclInit(ptr::null()), 0);
                assert_eq!(c.acl.aclrtGetDeviceCount(&mut n), 0);
                assert_eq!(n, 0);
                assert_eq!(c.acl.aclrtSetDevice(0), 107001);
                assert_eq!(v(), 0);
            }
            other => panic!("unknown child scenario {other}"),
        }
    }
}

#[test]
fn violation_runtime_calls_before_acl_init() {
    run_child("uninit", &[]);
}

#[test]
fn runtime_device_count_and_stream_of_another_device() {
    run_child("two_devices", &[("ASCEND_MOCK_DEVICE_COUNT", "2")]);
    run_child("no_devices", &[("ASCEND_MOCK_DEVICE_COUNT", "0")]);
}

// ---------------------------------------------------------------------------------------------
// Runtime: streams are queues, fault injection, threads

#[test]
fn runtime_streams_run_at_synchronize() {
    let (m, s) = Mock::with_stream();
    let d = m.malloc(16);
    let src = Pinned::new(m.c, &[9u8; 16]);
    let dst = Pinned::new(m.c, &[0u8; 16]);
    // SAFETY: host buffers outlive the synchronization.
    unsafe {
        assert_eq!(m.c.acl.aclrtMemcpyAsync(d, 16, src.ptr(), 16, H2D, s), 0);
        assert_eq!(m.c.acl.aclrtMemcpyAsync(dst.ptr(), 16, d, 16, D2H, s), 0);
    }
    assert_eq!(dst.bytes(), [0u8; 16], "nothing runs before the stream is synchronized");
    assert_eq!(mock::live_events_and_queued_tasks().1, 2);
    // SAFETY: plain runtime call.
    assert_eq!(unsafe { m.c.acl.aclrtSynchronizeDevice() }, 0);
    assert_eq!(dst.bytes(), src.bytes());
    // destroy drains first
    let ones = Pinned::new(m.c, &[1u8; 16]);
    // SAFETY: `ones` outlives the stream's destruction, which runs the copy.
    unsafe { assert_eq!(m.c.acl.aclrtMemcpyAsync(d, 16, ones.ptr(), 16, H2D, s), 0) };
    assert_eq!(m.destroy_stream(s), 0);
    assert_eq!(m.d2h(d, 16), vec![1u8; 16]);
    assert_eq!(mock::live_events_and_queued_tasks().1, 0);
    assert_eq!(m.free(d), 0);
    m.expect_violations(0, "");
}

#[test]
fn runtime_fail_next() {
    let m = Mock::new();
    let before = mock::stats();
    let before_thread = mock::thread_stats();
    mock::fail_next("aclrtMalloc", 207001);
    let mut junk = 0u8;
    let mut p: *mut c_void = (&mut junk as *mut u8).cast();
    // SAFETY: valid out-pointer.
    let st = unsafe { m.c.acl.aclrtMalloc(&mut p, 64, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST) };
    assert_eq!(st, 207001);
    assert!(p.is_null());
    assert!(m.err().contains("aclrtMalloc failed. ERROR: 207001"));
    assert_eq!(mock::stats().device_mallocs, before.device_mallocs);
    let p = m.malloc(64);
    assert_eq!(mock::stats().device_mallocs, before.device_mallocs + 1, "only once");
    assert_eq!(mock::thread_stats().device_mallocs, before_thread.device_mallocs + 1);
    // pointer-returning API
    mock::fail_next("aclCreateTensor", 1);
    assert!(m.create_tensor(&f32_spec(&[2]), p).is_null());
    let t = m.create_tensor(&f32_spec(&[2]), p);
    assert!(!t.is_null());
    assert_eq!(m.destroy_tensor(t), 0);
    // phase 1 / phase 2
    let case = ut_case(&m, aclDataType::ACL_FLOAT);
    mock::fail_next("aclnnBatchNormReduceBackwardGetWorkspaceSize", 561002);
    assert_eq!(m.phase1(&case.args()).0, 561002);
    let (size, ex) = m.phase1_ok(&case.args());
    mock::fail_next("aclnnBatchNormReduceBackward", 561003);
    assert_eq!(m.launch(ptr::null_mut(), size, ex, ptr::null_mut()), 561003);
    assert_eq!(mock::stats().live_executors, m.base.live_executors, "a failed phase 2 consumes the executor");
    // thread-local faults only fire on their thread
    mock::fail_next_on_this_thread("aclrtSynchronizeStream", 507046);
    let c = m.c;
    // SAFETY: a thread without device: the call fails on the device check, not on the fault.
    let other = std::thread::spawn(move || unsafe { c.acl.aclrtSynchronizeStream(ptr::null_mut()) }).join().unwrap();
    assert_eq!(other, 107002);
    assert_eq!(m.sync(ptr::null_mut()), 507046);
    assert_eq!(m.sync(ptr::null_mut()), 0);
    // an unknown API name is a test bug: it panics instead of never firing
    assert!(std::panic::catch_unwind(|| mock::fail_next("aclrtMallocc", 1)).is_err());
    assert_eq!(m.free(p), 0);
    case.release(&m);
    m.expect_violations(1, "call aclrtSetDevice on this thread first");
}

#[test]
fn runtime_recent_error_message_is_per_thread_and_consumed() {
    let m = Mock::new();
    let _ = m.err();
    assert_eq!(m.err(), "", "no message after the last one was read");
    assert_eq!(m.free(ptr::null_mut()), 100000);
    let c = m.c;
    // SAFETY: aclGetRecentErrMsg takes no arguments.
    let other = std::thread::spawn(move || unsafe { c.acl.aclGetRecentErrMsg().is_null() }).join().unwrap();
    assert!(other, "another thread has no message");
    assert!(m.err().starts_with("aclrtFree failed. ERROR: 100000"));
    assert_eq!(m.err(), "", "reading the message consumes it");
    m.expect_violations(0, "");
}

#[test]
fn runtime_threads_each_with_a_stream() {
    let m = Mock::new();
    let c = m.c;
    let handles: Vec<_> = (0..4u64)
        .map(|k| {
            std::thread::spawn(move || {
                // SAFETY: each thread binds the device, uses only its own objects and releases them.
                unsafe {
                    assert_eq!(c.acl.aclrtSetDevice(0), 0);
                    let mut s = ptr::null_mut();
                    assert_eq!(c.acl.aclrtCreateStream(&mut s), 0);
                    let mut rng = Rng::new(1000 + k);
                    let shape = [5i64, 4, 3];
                    let dy = rng.vec_f32(60, -1.0, 1.0);
                    let x = rng.vec_f32(60, -1.0, 1.0);
                    let mean = [0.1f32, -0.2, 0.3, 0.0];
                    let inv = [1.0f32, 2.0, 0.5, 1.5];
                    let up = |v: &[f32]| {
                        let b = encode(aclDataType::ACL_FLOAT, v);
                        let mut p = ptr::null_mut();
                        assert_eq!(
                            c.acl.aclrtMalloc(&mut p, b.len(), aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST),
                            0
                        );
                        assert_eq!(c.acl.aclrtMemcpyAsync(p, b.len(), b.as_ptr().cast(), b.len(), H2D, s), 0);
                        assert_eq!(c.acl.aclrtSynchronizeStream(s), 0);
                        p
                    };
                    let mems = [up(&dy), up(&x), up(&mean), up(&inv), up(&[0.0; 4]), up(&[0.0; 4])];
                    let specs = [f32_spec(&shape), f32_spec(&shape), f32_spec(&[4]), f32_spec(&[4]), f32_spec(&[4])];
                    let spec_of = |i: usize| &specs[i.min(4)];
                    let ts: Vec<*mut aclTensor> = (0..6).map(|i| create_tensor(c, spec_of(i), mems[i])).collect();
                    let mut results = Vec::new();
                    for _ in 0..3 {
                        let mut size = 0;
                        let mut ex = ptr::null_mut();
                        let st = phase1_sums(c, &ts, &mut size, &mut ex);
                        assert_eq!(st, 0);
                        let mut ws = ptr::null_mut();
                        assert_eq!(
                            c.acl.aclrtMalloc(&mut ws, size as usize, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST),
                            0
                        );
                        assert_eq!(bnrb(c).aclnnBatchNormReduceBackward(ws, size, ex, s), 0);
                        let mut out = [0f32; 4];
                        assert_eq!(c.acl.aclrtMemcpyAsync(out.as_mut_ptr().cast(), 16, mems[5], 16, D2H, s), 0);
                        assert_eq!(c.acl.aclrtSynchronizeStream(s), 0);
                        assert_eq!(c.acl.aclrtFree(ws), 0);
                        results.push(out);
                    }
                    for t in ts {
                        assert_eq!(c.nnopbase.aclDestroyTensor(t), 0);
                    }
                    for p in mems {
                        assert_eq!(c.acl.aclrtFree(p), 0);
                    }
                    assert_eq!(c.acl.aclrtDestroyStream(s), 0);
                    assert_eq!(c.acl.aclrtResetDevice(0), 0);
                    let spec = f32_spec(&shape);
                    let want = replica(&spec, &dy, &spec, &x, &mean, &inv, 4).1;
                    for r in &results {
                        assert_eq!(r[..], want[..]);
                    }
                    mock::thread_stats().violations
                }
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 0);
    }
    let after = mock::stats();
    assert_eq!(after.live_allocations, m.base.live_allocations);
    assert_eq!(after.live_streams, m.base.live_streams);
    assert_eq!(after.live_tensors, m.base.live_tensors);
    assert_eq!(after.device_mallocs, m.base.device_mallocs + 4 * (6 + 3));
    m.expect_violations(0, "");
}

/// Several threads make every kind of mock call at the same time, many rounds each, on their own
/// streams and memory: results stay bit-exact, only the deliberate violations count, the counters
/// balance. Besides checking thread safety, this is the test in which threads overlap inside the
/// mock (a barrier starts them together; many rounds span many scheduler slices), so that a race
/// in the mock's C shows under valgrind's helgrind (.ci/run); the other threaded tests finish
/// each thread within one slice under valgrind.
#[test]
fn runtime_threads_overlap_in_every_kind_of_call() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 25;
    const GLOBAL_FAULTS: [&str; THREADS] =
        ["aclrtSynchronizeDevice", "aclrtGetDevice", "aclSetAclOpExecutorRepeatable", "aclDestroyAclOpExecutor"];
    let m = Mock::new();
    let c = m.c;
    let start = std::sync::Barrier::new(THREADS);
    let shape = [2i64, 3, 2];
    let spec = f32_spec(&shape);
    let stat = f32_spec(&[3]);
    std::thread::scope(|sc| {
        let threads: Vec<_> = (0..THREADS)
            .map(|k| {
                let (start, spec, stat) = (&start, &spec, &stat);
                sc.spawn(move || {
                    let mut rng = Rng::new(77 + k as u64);
                    let (dy, x) = (rng.vec_f32(12, -1.0, 1.0), rng.vec_f32(12, -1.0, 1.0));
                    let (mean, inv) = ([0.5f32, -0.25, 0.0], [1.0f32, 2.0, 0.5]);
                    let (want_dy, want_xmu, _) = replica(spec, &dy, spec, &x, &mean, &inv, 3);
                    let before = mock::thread_stats();
                    start.wait();
                    // SAFETY: each thread binds the device and uses only its own objects; host
                    // buffers outlive the synchronizations that use them.
                    unsafe {
                        assert_eq!(c.acl.aclrtSetDevice(0), 0);
                        let mut s = ptr::null_mut();
                        assert_eq!(c.acl.aclrtCreateStream(&mut s), 0);
                        let mut ev: aclrtEvent = ptr::null_mut();
                        assert_eq!(
                            c.acl.aclrtCreateEventExWithFlag(&mut ev, ascend_sys::event_flag::ACL_EVENT_SYNC),
                            0
                        );
                        let mut host = [0u8; 8];
                        assert_eq!(c.acl.aclrtFree(host.as_mut_ptr().cast()), 107000, "a deliberate violation");
                        assert!(!c.acl.aclGetRecentErrMsg().is_null());
                        // Valgrind runs one thread at a time: yielding before each call lets it
                        // switch threads there, so that any call may follow another thread's call
                        // with no lock handoff in between (what helgrind needs to see a race).
                        let y = std::thread::yield_now;
                        let malloc = |bytes: usize| {
                            let mut p = ptr::null_mut();
                            y();
                            let st = c.acl.aclrtMalloc(&mut p, bytes, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST);
                            assert_eq!(st, 0);
                            p
                        };
                        let tensor = |sp: &Spec, p: *mut c_void| {
                            y();
                            let t = create_tensor(c, sp, p);
                            assert!(!t.is_null());
                            t
                        };
                        let inputs = [encode(F32, &dy), encode(F32, &x), encode(F32, &mean), encode(F32, &inv)];
                        for round in 0..ROUNDS {
                            let mems: Vec<*mut c_void> = [48, 48, 12, 12, 12, 12].into_iter().map(malloc).collect();
                            for (p, b) in mems.iter().zip(&inputs) {
                                y();
                                assert_eq!(c.acl.aclrtMemcpyAsync(*p, b.len(), b.as_ptr().cast(), b.len(), H2D, s), 0);
                            }
                            y();
                            assert_eq!(c.acl.aclrtMemset(mems[4], 12, 0, 12), 0);
                            let specs = [spec, spec, stat, stat, stat, stat];
                            let ts: Vec<*mut aclTensor> = (0..6).map(|i| tensor(specs[i], mems[i])).collect();
                            let (mut size, mut ex) = (0, ptr::null_mut());
                            y();
                            let st = phase1_sums(c, &ts, &mut size, &mut ex);
                            assert_eq!(st, 0);
                            let ws = malloc(size as usize);
                            y();
                            assert_eq!(bnrb(c).aclnnBatchNormReduceBackward(ws, size, ex, s), 0);
                            let mut out = [0u8; 24];
                            let dst: *mut c_void = out.as_mut_ptr().cast();
                            y();
                            assert_eq!(c.acl.aclrtMemcpyAsync(dst, 12, mems[4], 12, D2H, s), 0);
                            y();
                            assert_eq!(c.acl.aclrtRecordEvent(ev, s), 0);
                            y();
                            if round % 2 == 0 {
                                assert_eq!(c.acl.aclrtSynchronizeEvent(ev), 0);
                            } else {
                                assert_eq!(c.acl.aclrtSynchronizeStream(s), 0);
                            }
                            y();
                            assert_eq!(c.acl.aclrtMemcpy(at(dst, 12), 12, mems[5], 12, D2H), 0);
                            assert_eq!(decode(F32, &out[..12]), want_dy);
                            assert_eq!(decode(F32, &out[12..]), want_xmu);
                            y();
                            assert_eq!(c.acl.aclrtFree(ws), 0);
                            for t in ts {
                                y();
                                assert_eq!(c.nnopbase.aclDestroyTensor(t), 0);
                            }
                            for p in mems {
                                y();
                                assert_eq!(c.acl.aclrtFree(p), 0);
                            }
                            mock::fail_next_on_this_thread("aclrtGetDeviceCount", 507899);
                            let mut n = 0u32;
                            y();
                            assert_eq!(c.acl.aclrtGetDeviceCount(&mut n), 507899);
                            assert!(!c.acl.aclGetRecentErrMsg().is_null());
                            y();
                            assert_eq!(c.acl.aclrtGetDeviceCount(&mut n), 0);
                            // a process-wide fault, on a function only this thread calls: while
                            // armed, every thread's calls take the fault table's locked path
                            mock::fail_next(GLOBAL_FAULTS[k], 507899);
                            y();
                            let st = match k {
                                0 => c.acl.aclrtSynchronizeDevice(),
                                1 => c.acl.aclrtGetDevice(&mut 0),
                                2 => c.nnopbase.aclSetAclOpExecutorRepeatable(ptr::null_mut()),
                                _ => c.nnopbase.aclDestroyAclOpExecutor(ptr::null_mut()),
                            };
                            assert_eq!(st, 507899);
                            y();
                            assert!(mock::stats().live_allocations >= m.base.live_allocations);
                        }
                        assert_eq!(c.acl.aclrtDestroyEvent(ev), 0);
                        assert_eq!(c.acl.aclrtDestroyStream(s), 0);
                        assert_eq!(c.acl.aclrtResetDevice(0), 0);
                    }
                    let after = mock::thread_stats();
                    (after.violations - before.violations, after.device_mallocs - before.device_mallocs)
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), (1, 7 * ROUNDS as u64), "(violations, mallocs) of a thread");
        }
    });
    let after = mock::stats();
    let want = MockStats {
        device_mallocs: m.base.device_mallocs + (THREADS * ROUNDS * 7) as u64,
        violations: m.base.violations + THREADS as u64,
        ..with_call_totals(m.base, &after)
    };
    assert_eq!(after, want);
    assert!(m.messages().iter().all(|v| v.contains("is not a live device allocation")), "{:#?}", m.messages());
}

/// Phase 1 for gradInput's two sums only (weight null, output mask true, false, false): `ts` are
/// gradOut, input, mean, invstd, sumDy and sumDyXmu.
///
/// # Safety
/// The handles in `ts` are live (the mock validates them).
unsafe fn phase1_sums(c: &Cann, ts: &[*mut aclTensor], size: &mut u64, ex: &mut *mut aclOpExecutor) -> i32 {
    bnrb(c).aclnnBatchNormReduceBackwardGetWorkspaceSize(
        ts[0],
        ts[1],
        ts[2],
        ts[3],
        ptr::null(),
        true,
        false,
        false,
        ts[4],
        ts[5],
        ptr::null_mut(),
        ptr::null_mut(),
        size,
        ex,
    )
}

/// `base` with the call totals (synchronises, frees, blocking copies, host allocations) of
/// `after`: they grow with every call, so snapshots compare only the other counters.
fn with_call_totals(base: MockStats, after: &MockStats) -> MockStats {
    MockStats {
        stream_synchronizes: after.stream_synchronizes,
        event_synchronizes: after.event_synchronizes,
        device_synchronizes: after.device_synchronizes,
        device_frees: after.device_frees,
        blocking_copies: after.blocking_copies,
        host_mallocs: after.host_mallocs,
        events_created: after.events_created,
        events_destroyed: after.events_destroyed,
        ..base
    }
}
