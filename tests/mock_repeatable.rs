//! The mock's model of repeatable executors (`aclSetAclOpExecutorRepeatable` +
//! `aclSetInputTensorAddr` / `aclSetOutputTensorAddr`), through the raw bindings on
//! `aclnnBatchNormStats`: a repeatable executor launches again, after its tensors were rebound
//! to new memory (values checked against an f64 reference); launching it with a tensor whose
//! memory was freed and not rebound, rebinding a non-repeatable executor, or rebinding to an
//! address that does not hold the storage are violations, and so is launching one on a second
//! stream while its launch on the first has not run.
#![cfg(feature = "mock")]

mod common;

use std::ffi::c_void;
use std::ptr;

use ascend_sys::symbols::BATCH_NORM_STATS;
use ascend_sys::{aclOpExecutor, aclTensor, aclrtMemMallocPolicy, aclrtMemcpyKind, aclrtStream, Cann};

const N: usize = 6;
const C: usize = 3;
const EPS: f64 = 1e-5;

struct Session {
    c: &'static Cann,
}

impl Session {
    fn new() -> Session {
        let c = common::raw_mock::cann();
        // SAFETY: device 0 exists on the mock; ACL was initialised by the isolated context.
        assert_eq!(unsafe { c.acl.aclrtSetDevice(0) }, 0);
        Session { c }
    }

    fn malloc(&self, bytes: usize) -> *mut c_void {
        let mut mem = ptr::null_mut();
        // SAFETY: `mem` is a valid out-pointer.
        let st = unsafe { self.c.acl.aclrtMalloc(&mut mem, bytes, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST) };
        assert_eq!(st, 0);
        mem
    }

    fn free(&self, mem: *mut c_void) {
        // SAFETY: `mem` came from aclrtMalloc and the default stream has drained (sync below).
        unsafe {
            assert_eq!(self.c.acl.aclrtSynchronizeStream(ptr::null_mut()), 0);
            assert_eq!(self.c.acl.aclrtFree(mem), 0);
        }
    }

    fn upload(&self, values: &[f32]) -> *mut c_void {
        let mem = self.malloc(values.len() * 4);
        // SAFETY: copies `values.len() * 4` bytes into the fresh allocation of that size.
        let st = unsafe {
            self.c.acl.aclrtMemcpy(
                mem,
                values.len() * 4,
                values.as_ptr().cast(),
                values.len() * 4,
                aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_DEVICE,
            )
        };
        assert_eq!(st, 0);
        mem
    }

    fn download(&self, mem: *mut c_void, n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n];
        // SAFETY: the default stream exists; copies `n * 4` bytes from an allocation of that size.
        unsafe {
            assert_eq!(self.c.acl.aclrtSynchronizeStream(ptr::null_mut()), 0);
            let st = self.c.acl.aclrtMemcpy(
                out.as_mut_ptr().cast(),
                n * 4,
                mem,
                n * 4,
                aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_HOST,
            );
            assert_eq!(st, 0);
        }
        out
    }

    /// A contiguous f32 descriptor of `shape` over `mem`.
    fn tensor(&self, shape: &[i64], mem: *mut c_void) -> *mut aclTensor {
        let t = common::raw_mock::create_tensor(self.c, &common::raw_mock::f32_spec(shape), mem);
        assert!(!t.is_null());
        t
    }

    fn destroy(&self, t: *mut aclTensor) {
        // SAFETY: `t` is a live descriptor, not used after this.
        assert_eq!(unsafe { self.c.nnopbase.aclDestroyTensor(t) }, 0);
    }

    /// Phase 1 of aclnnBatchNormStats over (input, mean, invstd): (workspace bytes, executor).
    fn phase1(&self, input: *mut aclTensor, mean: *mut aclTensor, invstd: *mut aclTensor) -> (u64, *mut aclOpExecutor) {
        let api = self.c.operator(&BATCH_NORM_STATS).unwrap();
        let f = api.aclnnBatchNormStatsGetWorkspaceSize.as_ref().unwrap();
        let (mut size, mut exec) = (0u64, ptr::null_mut());
        // SAFETY: live descriptors and valid out-pointers.
        assert_eq!(unsafe { f(input, EPS, mean, invstd, &mut size, &mut exec) }, 0);
        (size, exec)
    }

    fn phase2(&self, ws: *mut c_void, size: u64, exec: *mut aclOpExecutor) -> i32 {
        self.phase2_on(ws, size, exec, ptr::null_mut())
    }

    fn phase2_on(&self, ws: *mut c_void, size: u64, exec: *mut aclOpExecutor, stream: aclrtStream) -> i32 {
        let api = self.c.operator(&BATCH_NORM_STATS).unwrap();
        let f = api.aclnnBatchNormStats.as_ref().unwrap();
        // SAFETY: the executor is live (or deliberately not, for the violation cases); the
        // workspace holds `size` bytes; `stream` is live or null (the default stream).
        unsafe { f(ws, size, exec, stream) }
    }
}

fn random_input(seed: u64) -> Vec<f32> {
    let mut rng = common::Rng::new(seed);
    (0..N * C).map(|_| rng.uniform(-2.0, 3.0) as f32).collect()
}

/// The f64 reference (mean, invstd) per channel of an (N, C) input.
fn reference(x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let mean: Vec<f64> = (0..C).map(|c| (0..N).map(|n| x[n * C + c] as f64).sum::<f64>() / N as f64).collect();
    let invstd = (0..C)
        .map(|c| {
            let var = (0..N).map(|n| (x[n * C + c] as f64 - mean[c]).powi(2)).sum::<f64>() / N as f64;
            1.0 / (var + EPS).sqrt()
        })
        .collect();
    (mean, invstd)
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g as f64 - w).abs() <= 1e-5 * w.abs().max(1.0), "{what}[{i}]: got {g}, want {w}");
    }
}

#[test]
fn a_repeatable_executor_relaunches_after_rebinding_to_new_memory() {
    common::mock::isolated(|_| {
        let s = Session::new();
        let x1 = random_input(1);
        let (input_mem, mean_mem, invstd_mem) = (s.upload(&x1), s.malloc(C * 4), s.malloc(C * 4));
        let input = s.tensor(&[N as i64, C as i64], input_mem);
        let (mean, invstd) = (s.tensor(&[C as i64], mean_mem), s.tensor(&[C as i64], invstd_mem));
        let (size, exec) = s.phase1(input, mean, invstd);
        // SAFETY: a live executor fresh from phase 1.
        assert_eq!(unsafe { s.c.nnopbase.aclSetAclOpExecutorRepeatable(exec) }, 0);
        let ws = s.malloc(size as usize);
        assert_eq!(s.phase2(ws, size, exec), 0);
        let (m1, v1) = reference(&x1);
        assert_close(&s.download(mean_mem, C), &m1, "mean");
        assert_close(&s.download(invstd_mem, C), &v1, "invstd");

        // New input and outputs; the old memory is freed before the next launch.
        let x2 = random_input(2);
        let (input2, mean2, invstd2) = (s.upload(&x2), s.malloc(C * 4), s.malloc(C * 4));
        for m in [input_mem, mean_mem, invstd_mem] {
            s.free(m);
        }
        // SAFETY: a live repeatable executor and its live descriptors; each address holds the
        // descriptor's storage.
        unsafe {
            assert_eq!(s.c.nnopbase.aclSetInputTensorAddr(exec, 0, input, input2), 0);
            assert_eq!(s.c.nnopbase.aclSetOutputTensorAddr(exec, 0, mean, mean2), 0);
            assert_eq!(s.c.nnopbase.aclSetOutputTensorAddr(exec, 1, invstd, invstd2), 0);
        }
        assert_eq!(s.phase2(ws, size, exec), 0);
        let (m2, v2) = reference(&x2);
        assert_close(&s.download(mean2, C), &m2, "mean after rebinding");
        assert_close(&s.download(invstd2, C), &v2, "invstd after rebinding");

        // SAFETY: the stream has drained (download synchronised); the caller owns the executor.
        assert_eq!(unsafe { s.c.nnopbase.aclDestroyAclOpExecutor(exec) }, 0);
        for t in [input, mean, invstd] {
            s.destroy(t);
        }
        for m in [input2, mean2, invstd2, ws] {
            s.free(m);
        }
    });
}

/// Runs `f` and returns the violations it counted (these cases expect violations, so they run
/// under the mock's lock rather than in `isolated`, which fails on any).
fn violations_of(f: impl FnOnce()) -> Vec<String> {
    let before = ascend::mock::stats().violations;
    f();
    ascend::mock::violations_since(before)
}

#[test]
fn misuse_of_repeatable_executors_is_a_violation() {
    let _guard = common::mock::lock();
    let _ctx = common::mock::context();
    let s = Session::new();
    let x = random_input(3);
    let (input_mem, mean_mem, invstd_mem) = (s.upload(&x), s.malloc(C * 4), s.malloc(C * 4));
    let input = s.tensor(&[N as i64, C as i64], input_mem);
    let (mean, invstd) = (s.tensor(&[C as i64], mean_mem), s.tensor(&[C as i64], invstd_mem));
    let (size, exec) = s.phase1(input, mean, invstd);
    let ws = s.malloc(size as usize);

    // Rebinding a non-repeatable executor.
    let v = violations_of(|| {
        // SAFETY: live handles; the mock rejects the call.
        assert_ne!(unsafe { s.c.nnopbase.aclSetInputTensorAddr(exec, 0, input, input_mem) }, 0);
    });
    assert!(v.len() == 1 && v[0].contains("not repeatable"), "{v:?}");

    // SAFETY: a live executor fresh from phase 1.
    assert_eq!(unsafe { s.c.nnopbase.aclSetAclOpExecutorRepeatable(exec) }, 0);
    assert_eq!(s.phase2(ws, size, exec), 0);

    // An address that does not hold the storage (misaligned, or too small).
    let small = s.malloc(4);
    let v = violations_of(|| {
        // SAFETY: live handles; the mock rejects both addresses.
        unsafe {
            assert_ne!(s.c.nnopbase.aclSetInputTensorAddr(exec, 0, input, input_mem.cast::<u8>().add(4).cast()), 0);
            assert_ne!(s.c.nnopbase.aclSetInputTensorAddr(exec, 0, input, small), 0);
        }
    });
    assert!(v.len() == 2 && v[0].contains("aligned") && v[1].contains("live device allocation"), "{v:?}");

    // Launching again after the input's memory was freed, without rebinding it.
    s.free(input_mem);
    let v = violations_of(|| assert_ne!(s.phase2(ws, size, exec), 0));
    assert!(v.len() == 1 && v[0].contains("was freed"), "{v:?}");

    // SAFETY: the stream has drained; the caller owns the repeatable executor.
    assert_eq!(unsafe { s.c.nnopbase.aclDestroyAclOpExecutor(exec) }, 0);
    for t in [input, mean, invstd] {
        s.destroy(t);
    }
    for m in [mean_mem, invstd_mem, ws, small] {
        s.free(m);
    }
}

/// The launch counters count what the launch path does: today (no launch cache) every
/// `batch_norm_stats_into` makes its three descriptors and runs phase 1, every time.
#[test]
fn launch_counters_count_descriptors_and_phase1_calls() {
    common::mock::isolated(|ctx| {
        let s = ctx.new_stream().unwrap();
        let x = random_input(4);
        let input = ascend::Tensor::from_slice(&s, &x, &[N, C]).unwrap();
        let mut mean = ascend::Tensor::zeros(&s, ascend::DType::F32, &[C]).unwrap();
        let mut invstd = ascend::Tensor::zeros(&s, ascend::DType::F32, &[C]).unwrap();
        let before = ascend::mock::launch_counters();
        for _ in 0..3 {
            ascend::ops::batch_norm_stats_into(&s, &input, EPS, &mut mean, &mut invstd).unwrap();
        }
        let after = ascend::mock::launch_counters();
        assert_eq!(after.tensors_created - before.tensors_created, 9);
        assert_eq!(after.phase1_calls - before.phase1_calls, 3);
        let (m, v) = reference(&x);
        assert_close(&mean.to_vec::<f32>(&s).unwrap(), &m, "mean");
        assert_close(&invstd.to_vec::<f32>(&s).unwrap(), &v, "invstd");
    });
}

/// A repeatable executor launched on a second stream while its launch on the first has not run
/// is a violation; once the first stream has drained, launching it on another is fine.
#[test]
fn a_repeatable_executor_on_two_streams_at_once_is_a_violation() {
    let _guard = common::mock::lock();
    let _ctx = common::mock::context();
    let s = Session::new();
    let x = random_input(5);
    let (input_mem, mean_mem, invstd_mem) = (s.upload(&x), s.malloc(C * 4), s.malloc(C * 4));
    let input = s.tensor(&[N as i64, C as i64], input_mem);
    let (mean, invstd) = (s.tensor(&[C as i64], mean_mem), s.tensor(&[C as i64], invstd_mem));
    let (size, exec) = s.phase1(input, mean, invstd);
    let ws = s.malloc(size as usize);
    let (mut a, mut b): (aclrtStream, aclrtStream) = (ptr::null_mut(), ptr::null_mut());
    // SAFETY: valid out-pointers; a live executor fresh from phase 1.
    unsafe {
        assert_eq!(s.c.acl.aclrtCreateStream(&mut a), 0);
        assert_eq!(s.c.acl.aclrtCreateStream(&mut b), 0);
        assert_eq!(s.c.nnopbase.aclSetAclOpExecutorRepeatable(exec), 0);
    }
    assert_eq!(s.phase2_on(ws, size, exec, a), 0);
    assert_eq!(s.phase2_on(ws, size, exec, a), 0, "again on the same stream: ordered, fine");
    let v = violations_of(|| assert_ne!(s.phase2_on(ws, size, exec, b), 0));
    assert!(v.len() == 1 && v[0].contains("two streams at once"), "{v:?}");
    // SAFETY: `a` is live.
    assert_eq!(unsafe { s.c.acl.aclrtSynchronizeStream(a) }, 0);
    assert_eq!(s.phase2_on(ws, size, exec, b), 0, "after stream a drained");
    let (m, v) = reference(&x);
    // SAFETY: `b` is live.
    assert_eq!(unsafe { s.c.acl.aclrtSynchronizeStream(b) }, 0);
    assert_close(&s.download(mean_mem, C), &m, "mean");
    assert_close(&s.download(invstd_mem, C), &v, "invstd");
    // SAFETY: both streams have drained; the caller owns the executor and descriptors.
    unsafe {
        assert_eq!(s.c.nnopbase.aclDestroyAclOpExecutor(exec), 0);
        assert_eq!(s.c.acl.aclrtDestroyStream(a), 0);
        assert_eq!(s.c.acl.aclrtDestroyStream(b), 0);
    }
    for t in [input, mean, invstd] {
        s.destroy(t);
    }
    for m in [input_mem, mean_mem, invstd_mem, ws] {
        s.free(m);
    }
}
