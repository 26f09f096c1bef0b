//! The mock's model of repeatable executors (`aclSetAclOpExecutorRepeatable` +
//! `aclSetInputTensorAddr` / `aclSetOutputTensorAddr`), through the raw bindings on
//! `aclnnBatchNormStats`: a repeatable executor launches again, after its tensors were rebound
//! to new memory (values checked against an f64 reference); launching it with a tensor whose
//! memory was freed and not rebound, rebinding a non-repeatable executor, or rebinding to an
//! address that does not hold the storage are violations, and so is launching one on a second
//! stream while its launch on the first has not run.
//!
//! The mock checks the `index` of a rebind (real CANN's opapi path ignores it; the mock is stricter
//! so that callers are proven to pass the right one): the tensor must be the index-th *present*
//! input (read-only argument) or output (written argument), in prototype order, absent optional
//! arguments not counted. Rebinds by index on `aclnnBatchNormElemt` without weight and bias and on
//! `aclnnBatchNormReduceBackward` with two outputs masked off launch and match an f64 reference; a
//! wrong index, an index out of range or another executor's tensor is a violation (161002), and so
//! is destroying a repeatable executor while a launch of it is queued and has not run.
#![cfg(feature = "mock")]

mod common;

use std::ffi::c_void;
use std::ptr;

use ascend_sys::symbols::{Operator, BATCH_NORM_ELEMT, BATCH_NORM_REDUCE_BACKWARD, BATCH_NORM_STATS};
use ascend_sys::{aclOpExecutor, aclTensor, aclrtMemMallocPolicy, aclrtMemcpyKind, aclrtStream, Cann, OpApi};

/// Phase 2 of every operator: (workspace, its size, executor, stream) → status.
type Phase2 = unsafe extern "C" fn(*mut c_void, u64, *mut aclOpExecutor, aclrtStream) -> i32;

const N: usize = 6;
const C: usize = 3;
const EPS: f64 = 1e-5;

struct Session {
    c: &'static Cann,
}

/// A call of aclnnBatchNormStats after phase 1: `x` (random, [N, C]) uploaded as input, mean and
/// invstd ([C]) allocated; the workspace size and the executor phase 1 reported.
struct StatsArgs {
    x: Vec<f32>,
    input_mem: *mut c_void,
    mean_mem: *mut c_void,
    invstd_mem: *mut c_void,
    input: *mut aclTensor,
    mean: *mut aclTensor,
    invstd: *mut aclTensor,
    size: u64,
    exec: *mut aclOpExecutor,
}

impl Session {
    /// A test's session: `common::mock::lock` held, the mock context made (initialising ACL),
    /// device 0 bound.
    fn locked() -> (std::sync::MutexGuard<'static, ()>, ascend::Context, Session) {
        let guard = common::mock::lock();
        let ctx = common::mock::context();
        (guard, ctx, Session::new())
    }

    /// [`StatsArgs`] with the input of `random_input(seed)`.
    fn stats_args(&self, seed: u64) -> StatsArgs {
        let x = random_input(seed);
        let (input_mem, mean_mem, invstd_mem) = (self.upload(&x), self.malloc(C * 4), self.malloc(C * 4));
        let input = self.tensor(&[N as i64, C as i64], input_mem);
        let (mean, invstd) = (self.tensor(&[C as i64], mean_mem), self.tensor(&[C as i64], invstd_mem));
        let (size, exec) = self.phase1(input, mean, invstd);
        StatsArgs { x, input_mem, mean_mem, invstd_mem, input, mean, invstd, size, exec }
    }

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
        self.phase1_of(&BATCH_NORM_STATS, |api, size, exec| {
            // SAFETY: live descriptors and valid out-pointers.
            unsafe { api.aclnnBatchNormStatsGetWorkspaceSize(input, EPS, mean, invstd, size, exec) }
        })
    }

    /// Phase 1 of `op`, which must succeed: `call` gets the op library and the out-pointers
    /// (workspace bytes, executor).
    fn phase1_of(
        &self,
        op: &Operator,
        call: impl FnOnce(&OpApi, &mut u64, &mut *mut aclOpExecutor) -> i32,
    ) -> (u64, *mut aclOpExecutor) {
        let (mut size, mut exec) = (0u64, ptr::null_mut());
        let st = call(self.c.operator(op).unwrap(), &mut size, &mut exec);
        assert_eq!(st, 0, "{}: {}", op.phase1, self.err());
        (size, exec)
    }

    /// The thread's aclGetRecentErrMsg (consumed), or "".
    fn err(&self) -> String {
        common::raw_mock::recent_error(self.c)
    }

    /// A workspace of `size` bytes (null for none).
    fn workspace(&self, size: u64) -> *mut c_void {
        if size == 0 {
            ptr::null_mut()
        } else {
            self.malloc(size as usize)
        }
    }

    fn rebind_input(&self, exec: *mut aclOpExecutor, index: usize, t: *mut aclTensor, mem: *mut c_void) -> i32 {
        // SAFETY: the mock validates the executor, the tensor, the index and the address.
        unsafe { self.c.nnopbase.aclSetInputTensorAddr(exec, index, t, mem) }
    }

    fn rebind_output(&self, exec: *mut aclOpExecutor, index: usize, t: *mut aclTensor, mem: *mut c_void) -> i32 {
        // SAFETY: the mock validates the executor, the tensor, the index and the address.
        unsafe { self.c.nnopbase.aclSetOutputTensorAddr(exec, index, t, mem) }
    }

    /// `rebind` of `exec` through aclSetInputTensorAddr or aclSetOutputTensorAddr.
    fn rebind(&self, exec: *mut aclOpExecutor, (side, index, t, mem): Rebind) -> i32 {
        match side {
            Side::Input => self.rebind_input(exec, index, t, mem),
            Side::Output => self.rebind_output(exec, index, t, mem),
        }
    }

    /// A test's end: destroys the executors (each destroy succeeding) and the descriptors, and
    /// frees the device memory (null, a workspace of size 0, skipped).
    fn release(&self, execs: &[*mut aclOpExecutor], tensors: &[*mut aclTensor], mems: &[*mut c_void]) {
        for &exec in execs {
            assert_eq!(self.destroy_executor(exec), 0, "{}", self.err());
        }
        for &t in tensors {
            self.destroy(t);
        }
        for &m in mems.iter().filter(|m| !m.is_null()) {
            self.free(m);
        }
    }

    fn destroy_executor(&self, exec: *mut aclOpExecutor) -> i32 {
        // SAFETY: the mock validates the handle (and refuses to free one with queued launches).
        unsafe { self.c.nnopbase.aclDestroyAclOpExecutor(exec) }
    }

    fn repeatable(&self, exec: *mut aclOpExecutor) {
        // SAFETY: a live executor fresh from phase 1.
        assert_eq!(unsafe { self.c.nnopbase.aclSetAclOpExecutorRepeatable(exec) }, 0);
    }

    /// Phase 1 of aclnnBatchNormElemt without weight and bias: (workspace bytes, executor).
    fn elemt_phase1(
        &self,
        input: *mut aclTensor,
        mean: *mut aclTensor,
        invstd: *mut aclTensor,
        output: *mut aclTensor,
    ) -> (u64, *mut aclOpExecutor) {
        let none = ptr::null();
        self.phase1_of(&BATCH_NORM_ELEMT, |api, size, exec| {
            // SAFETY: live descriptors (weight and bias absent) and valid out-pointers.
            unsafe { api.aclnnBatchNormElemtGetWorkspaceSize(input, none, none, mean, invstd, EPS, output, size, exec) }
        })
    }

    fn elemt_phase2(&self, ws: *mut c_void, size: u64, exec: *mut aclOpExecutor) -> i32 {
        let f = |api: &'static OpApi| api.aclnnBatchNormElemt.as_ref().ok();
        self.phase2_of(&BATCH_NORM_ELEMT, f, (ws, size, exec, ptr::null_mut()))
    }

    /// Phase 1 of aclnnBatchNormReduceBackward without weight, the mask (inputG, weightG, biasG) =
    /// (false, true, true): sumDy and sumDyXmu absent. (workspace bytes, executor).
    fn reduce_backward_phase1(
        &self,
        grad_out: *mut aclTensor,
        input: *mut aclTensor,
        mean: *mut aclTensor,
        invstd: *mut aclTensor,
        grad_weight: *mut aclTensor,
        grad_bias: *mut aclTensor,
    ) -> (u64, *mut aclOpExecutor) {
        let none = ptr::null_mut();
        self.phase1_of(&BATCH_NORM_REDUCE_BACKWARD, |api, size, exec| {
            // SAFETY: live descriptors (weight, sumDy and sumDyXmu absent) and valid out-pointers.
            unsafe {
                api.aclnnBatchNormReduceBackwardGetWorkspaceSize(
                    grad_out,
                    input,
                    mean,
                    invstd,
                    ptr::null(),
                    false,
                    true,
                    true,
                    none,
                    none,
                    grad_weight,
                    grad_bias,
                    size,
                    exec,
                )
            }
        })
    }

    fn reduce_backward_phase2(&self, ws: *mut c_void, size: u64, exec: *mut aclOpExecutor) -> i32 {
        let f = |api: &'static OpApi| api.aclnnBatchNormReduceBackward.as_ref().ok();
        self.phase2_of(&BATCH_NORM_REDUCE_BACKWARD, f, (ws, size, exec, ptr::null_mut()))
    }

    fn phase2(&self, ws: *mut c_void, size: u64, exec: *mut aclOpExecutor) -> i32 {
        self.phase2_on(ws, size, exec, ptr::null_mut())
    }

    fn phase2_on(&self, ws: *mut c_void, size: u64, exec: *mut aclOpExecutor, stream: aclrtStream) -> i32 {
        let f = |api: &'static OpApi| api.aclnnBatchNormStats.as_ref().ok();
        self.phase2_of(&BATCH_NORM_STATS, f, (ws, size, exec, stream))
    }

    /// Phase 2 of `op` (`phase2` picks its function from the op library) with the arguments
    /// (workspace, its size, executor, stream; a null stream is the default one).
    fn phase2_of(
        &self,
        op: &Operator,
        phase2: impl FnOnce(&'static OpApi) -> Option<&'static Phase2>,
        (ws, size, exec, stream): (*mut c_void, u64, *mut aclOpExecutor, aclrtStream),
    ) -> i32 {
        let f = phase2(self.c.operator(op).unwrap()).unwrap();
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

        s.release(&[exec], &[input, mean, invstd], &[input2, mean2, invstd2, ws]);
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
    let (_guard, _ctx, s) = Session::locked();
    let StatsArgs { x: _, input_mem, mean_mem, invstd_mem, input, mean, invstd, size, exec } = s.stats_args(3);
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

    s.release(&[exec], &[input, mean, invstd], &[mean_mem, invstd_mem, ws, small]);
}

/// The launch counters count what the launch path does. With the launch cache off, every
/// `batch_norm_stats_into` makes its three descriptors and runs phase 1; with it on, only the
/// first does: the next ones rebind the cached executor (new output buffers included) and run
/// phase 2, with the same values.
#[test]
fn launch_counters_count_descriptors_and_phase1_calls() {
    common::mock::isolated(|ctx| {
        for cached in [false, true] {
            let s = ctx.new_stream().unwrap();
            if !cached {
                s.set_launch_cache_capacity(0);
            }
            let x = random_input(4);
            let input = ascend::Tensor::from_slice(&s, &x, &[N, C]).unwrap();
            let before = ascend::mock::launch_counters();
            let mut kept = Vec::new();
            for _ in 0..3 {
                // Fresh outputs each time: the cache rebinds them.
                let mut mean = ascend::Tensor::zeros(&s, ascend::DType::F32, &[C]).unwrap();
                let mut invstd = ascend::Tensor::zeros(&s, ascend::DType::F32, &[C]).unwrap();
                ascend::ops::batch_norm_stats_into(&s, &input, EPS, &mut mean, &mut invstd).unwrap();
                kept.push((mean, invstd));
            }
            let after = ascend::mock::launch_counters();
            let (descriptors, phase1) = if cached { (3, 1) } else { (9, 3) };
            assert_eq!(after.tensors_created - before.tensors_created, descriptors, "cached: {cached}");
            assert_eq!(after.phase1_calls - before.phase1_calls, phase1, "cached: {cached}");
            let stats = s.launch_cache_stats();
            assert_eq!((stats.hits, stats.misses), if cached { (2, 1) } else { (0, 0) });
            let (m, v) = reference(&x);
            for (mean, invstd) in &kept {
                assert_close(&mean.to_vec::<f32>(&s).unwrap(), &m, "mean");
                assert_close(&invstd.to_vec::<f32>(&s).unwrap(), &v, "invstd");
            }
        }
    });
}

/// A repeatable executor launched on a second stream while its launch on the first has not run
/// is a violation; once the first stream has drained, launching it on another is fine.
#[test]
fn a_repeatable_executor_on_two_streams_at_once_is_a_violation() {
    let (_guard, _ctx, s) = Session::locked();
    let StatsArgs { x, input_mem, mean_mem, invstd_mem, input, mean, invstd, size, exec } = s.stats_args(5);
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
    // SAFETY: both streams have drained.
    unsafe {
        assert_eq!(s.c.acl.aclrtDestroyStream(a), 0);
        assert_eq!(s.c.acl.aclrtDestroyStream(b), 0);
    }
    s.release(&[exec], &[input, mean, invstd], &[input_mem, mean_mem, invstd_mem, ws]);
}

/// Per-channel statistics to feed the operators: mean in [-1, 1], invstd in [0.5, 2].
fn random_stats(seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = common::Rng::new(seed);
    let mean = (0..C).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
    let invstd = (0..C).map(|_| rng.uniform(0.5, 2.0) as f32).collect();
    (mean, invstd)
}

/// The f64 reference of aclnnBatchNormElemt without weight and bias: (x - mean) * invstd.
fn elemt_reference(x: &[f32], mean: &[f32], invstd: &[f32]) -> Vec<f64> {
    (0..N * C).map(|i| (x[i] as f64 - mean[i % C] as f64) * invstd[i % C] as f64).collect()
}

/// The f64 reference of aclnnBatchNormReduceBackward's (gradWeight, gradBias) per channel, and
/// the magnitude of the sums behind gradWeight (its f32 rounding error scales with it).
fn reduce_backward_reference(dy: &[f32], x: &[f32], mean: &[f32], invstd: &[f32]) -> [Vec<f64>; 3] {
    let at = |v: &[f32], n: usize, c: usize| v[n * C + c] as f64;
    let grad_bias: Vec<f64> = (0..C).map(|c| (0..N).map(|n| at(dy, n, c)).sum()).collect();
    let grad_weight =
        (0..C).map(|c| (0..N).map(|n| at(dy, n, c) * (at(x, n, c) - mean[c] as f64)).sum::<f64>() * invstd[c] as f64);
    let scale = (0..C).map(|c| {
        (0..N).map(|n| (at(dy, n, c) * at(x, n, c)).abs() + (mean[c] as f64 * at(dy, n, c)).abs()).sum::<f64>()
            * invstd[c] as f64
    });
    [grad_weight.collect(), grad_bias, scale.collect()]
}

/// A rebind by index counts only the present arguments: aclnnBatchNormElemt without weight and
/// bias has the inputs input (0), mean (1) and invstd (2), the output output (0). Rebound to new
/// memory (the old freed), it launches again and matches the f64 reference.
#[test]
fn a_rebind_by_index_skips_absent_optional_inputs() {
    common::mock::isolated(|_| {
        let s = Session::new();
        let (x1, (mean1, invstd1)) = (random_input(6), random_stats(7));
        let mem1 = [s.upload(&x1), s.upload(&mean1), s.upload(&invstd1), s.malloc(N * C * 4)];
        let input = s.tensor(&[N as i64, C as i64], mem1[0]);
        let (mean, invstd) = (s.tensor(&[C as i64], mem1[1]), s.tensor(&[C as i64], mem1[2]));
        let output = s.tensor(&[N as i64, C as i64], mem1[3]);
        let (size, exec) = s.elemt_phase1(input, mean, invstd, output);
        s.repeatable(exec);
        let ws = s.workspace(size);
        assert_eq!(s.elemt_phase2(ws, size, exec), 0, "{}", s.err());
        assert_close(&s.download(mem1[3], N * C), &elemt_reference(&x1, &mean1, &invstd1), "output");

        let (x2, (mean2, invstd2)) = (random_input(8), random_stats(9));
        let mem2 = [s.upload(&x2), s.upload(&mean2), s.upload(&invstd2), s.malloc(N * C * 4)];
        for m in mem1 {
            s.free(m);
        }
        for (i, (t, m)) in [(input, mem2[0]), (mean, mem2[1]), (invstd, mem2[2])].into_iter().enumerate() {
            assert_eq!(s.rebind_input(exec, i, t, m), 0, "input {i}: {}", s.err());
        }
        assert_eq!(s.rebind_output(exec, 0, output, mem2[3]), 0, "{}", s.err());
        assert_eq!(s.elemt_phase2(ws, size, exec), 0, "{}", s.err());
        let got = s.download(mem2[3], N * C);
        assert_close(&got, &elemt_reference(&x2, &mean2, &invstd2), "output after rebinding");

        s.release(&[exec], &[input, mean, invstd, output], &[mem2.as_slice(), &[ws]].concat());
    });
}

/// Outputs the mask turns off are absent and not counted: aclnnBatchNormReduceBackward with
/// (inputG, weightG, biasG) = (false, true, true) has the outputs gradWeight (0) and gradBias (1),
/// not 2 and 3. Rebound to new memory, it launches again and matches the f64 reference.
#[test]
fn a_rebind_by_index_skips_outputs_the_mask_turns_off() {
    common::mock::isolated(|_| {
        let s = Session::new();
        let shape = [N as i64, C as i64];
        let values = |seed: u64| (random_input(seed), random_input(seed + 1), random_stats(seed + 2));
        let (dy1, x1, (mean1, invstd1)) = values(10);
        let mem1 =
            [s.upload(&dy1), s.upload(&x1), s.upload(&mean1), s.upload(&invstd1), s.malloc(C * 4), s.malloc(C * 4)];
        let (grad_out, input) = (s.tensor(&shape, mem1[0]), s.tensor(&shape, mem1[1]));
        let (mean, invstd) = (s.tensor(&[C as i64], mem1[2]), s.tensor(&[C as i64], mem1[3]));
        let (grad_weight, grad_bias) = (s.tensor(&[C as i64], mem1[4]), s.tensor(&[C as i64], mem1[5]));
        let (size, exec) = s.reduce_backward_phase1(grad_out, input, mean, invstd, grad_weight, grad_bias);
        s.repeatable(exec);
        let ws = s.workspace(size);
        let check = |mem: &[*mut c_void; 6], [gw, gb, scale]: [Vec<f64>; 3], when: &str| {
            let (got_w, got_b) = (s.download(mem[4], C), s.download(mem[5], C));
            for c in 0..C {
                let tol_w = 1e-5 * (scale[c] + 1.0);
                assert!((got_w[c] as f64 - gw[c]).abs() <= tol_w, "gradWeight[{c}] {when}: {} vs {}", got_w[c], gw[c]);
            }
            assert_close(&got_b, &gb, &format!("gradBias {when}"));
        };
        assert_eq!(s.reduce_backward_phase2(ws, size, exec), 0, "{}", s.err());
        check(&mem1, reduce_backward_reference(&dy1, &x1, &mean1, &invstd1), "");

        let (dy2, x2, (mean2, invstd2)) = values(20);
        let mem2 =
            [s.upload(&dy2), s.upload(&x2), s.upload(&mean2), s.upload(&invstd2), s.malloc(C * 4), s.malloc(C * 4)];
        for m in mem1 {
            s.free(m);
        }
        for (i, t) in [grad_out, input, mean, invstd].into_iter().enumerate() {
            assert_eq!(s.rebind_input(exec, i, t, mem2[i]), 0, "input {i}: {}", s.err());
        }
        assert_eq!(s.rebind_output(exec, 0, grad_weight, mem2[4]), 0, "{}", s.err());
        assert_eq!(s.rebind_output(exec, 1, grad_bias, mem2[5]), 0, "{}", s.err());
        assert_eq!(s.reduce_backward_phase2(ws, size, exec), 0, "{}", s.err());
        check(&mem2, reduce_backward_reference(&dy2, &x2, &mean2, &invstd2), "after rebinding");

        s.release(
            &[exec],
            &[grad_out, input, mean, invstd, grad_weight, grad_bias],
            &[mem2.as_slice(), &[ws]].concat(),
        );
    });
}

/// Which of an executor's arguments a rebind sets: aclSetInputTensorAddr's or
/// aclSetOutputTensorAddr's.
#[derive(Clone, Copy, Debug)]
enum Side {
    Input,
    Output,
}

impl Side {
    fn api(self) -> &'static str {
        match self {
            Side::Input => "aclSetInputTensorAddr",
            Side::Output => "aclSetOutputTensorAddr",
        }
    }
}

/// A rebind: the side, the index among its present arguments, the descriptor and its new address.
type Rebind = (Side, usize, *mut aclTensor, *mut c_void);

/// Asserts that each rebind of `exec` is rejected with 161002, as exactly one violation whose
/// message and error text name the rebind's function and contain every needle.
#[track_caller]
fn expect_rejected(s: &Session, exec: *mut aclOpExecutor, cases: &[(Rebind, &[&str])]) {
    for &(rebind, needles) in cases {
        let (side, index, ..) = rebind;
        let what = format!("{side:?} rebind at index {index}");
        let mut status = 0;
        let v = violations_of(|| status = s.rebind(exec, rebind));
        let err = s.err();
        assert_eq!(status, 161002, "{what}: status; violations {v:?}; error {err}");
        assert_eq!(v.len(), 1, "{what}: {v:?}");
        for needle in [side.api()].iter().chain(needles) {
            assert!(v[0].contains(needle), "{what}: no `{needle}` in the violation {:?}", v[0]);
            assert!(err.contains(needle), "{what}: no `{needle}` in the error text {err:?}");
        }
    }
}

/// A rebind at the wrong index is a violation and rebinds nothing: aclnnBatchNormStats's outputs
/// swapped, an output through aclSetInputTensorAddr; on aclnnBatchNormElemt without weight and
/// bias, mean at index 1 of the inputs as if the absent weight and bias counted (3) is out of
/// range, and invstd at mean's index (1) is the wrong tensor.
#[test]
fn a_rebind_at_the_wrong_index_is_a_violation() {
    let (_guard, _ctx, s) = Session::locked();
    let StatsArgs { x, input_mem, mean_mem, invstd_mem, input, mean, invstd, size, exec } = s.stats_args(30);
    s.repeatable(exec);
    // Memory the rejected rebinds point at: had one been applied, the launch would write there.
    let other = s.malloc(N * C * 4);
    expect_rejected(
        &s,
        exec,
        &[
            ((Side::Output, 0, invstd, other), &["output index 0", "is mean", "invstd (index 1)"]),
            ((Side::Output, 1, mean, other), &["output index 1", "is invstd", "mean (index 0)"]),
            ((Side::Input, 0, mean, other), &["input index 0", "is input", "output mean (index 0)"]),
        ],
    );
    let ws = s.workspace(size);
    assert_eq!(s.phase2(ws, size, exec), 0, "{}", s.err());
    let (m, v) = reference(&x);
    assert_close(&s.download(mean_mem, C), &m, "mean (the rejected rebinds changed nothing)");
    assert_close(&s.download(invstd_mem, C), &v, "invstd (the rejected rebinds changed nothing)");

    // aclnnBatchNormElemt without weight and bias: inputs input, mean, invstd.
    let y_mem = s.malloc(N * C * 4);
    let output = s.tensor(&[N as i64, C as i64], y_mem);
    let (_, eexec) = s.elemt_phase1(input, mean, invstd, output);
    s.repeatable(eexec);
    expect_rejected(
        &s,
        eexec,
        &[
            (
                (Side::Input, 3, mean, mean_mem),
                &["index 3 is out of range", "3 present inputs: input, mean, invstd", "input mean (index 1)"],
            ),
            ((Side::Input, 1, invstd, invstd_mem), &["input index 1", "is mean"]),
        ],
    );
    assert_eq!(s.rebind_input(eexec, 1, mean, mean_mem), 0, "the right index: {}", s.err());

    s.release(&[exec, eexec], &[input, mean, invstd, output], &[input_mem, mean_mem, invstd_mem, other, y_mem, ws]);
}

/// An index past the present inputs or outputs is a violation: aclnnBatchNormStats has one input
/// and two outputs; aclnnBatchNormReduceBackward with sumDy and sumDyXmu masked off has two
/// outputs, so gradBias at its prototype position among the outputs (3) is out of range.
#[test]
fn a_rebind_out_of_range_is_a_violation() {
    let (_guard, _ctx, s) = Session::locked();
    let StatsArgs { x: _, input_mem, mean_mem, invstd_mem, input, mean, invstd, size: _, exec } = s.stats_args(40);
    s.repeatable(exec);
    expect_rejected(
        &s,
        exec,
        &[
            (
                (Side::Input, 1, input, input_mem),
                &["index 1 is out of range", "1 present inputs: input", "input input (index 0)"],
            ),
            (
                (Side::Output, 2, invstd, invstd_mem),
                &["index 2 is out of range", "2 present outputs: mean, invstd", "output invstd (index 1)"],
            ),
            ((Side::Output, usize::MAX, mean, mean_mem), &["is out of range"]),
        ],
    );

    let (gw_mem, gb_mem) = (s.malloc(C * 4), s.malloc(C * 4));
    let (grad_weight, grad_bias) = (s.tensor(&[C as i64], gw_mem), s.tensor(&[C as i64], gb_mem));
    let (_, rexec) = s.reduce_backward_phase1(input, input, mean, invstd, grad_weight, grad_bias);
    s.repeatable(rexec);
    expect_rejected(
        &s,
        rexec,
        &[(
            (Side::Output, 3, grad_bias, gb_mem),
            &["index 3 is out of range", "2 present outputs: gradWeight, gradBias", "output gradBias (index 1)"],
        )],
    );
    assert_eq!(s.rebind_output(rexec, 1, grad_bias, gb_mem), 0, "the right index: {}", s.err());

    let tensors = [input, mean, invstd, grad_weight, grad_bias];
    s.release(&[exec, rexec], &tensors, &[input_mem, mean_mem, invstd_mem, gw_mem, gb_mem]);
}

/// A tensor of another executor, at an index that is valid for the executor, is a violation: it
/// is not that argument (nor any present argument of this executor).
#[test]
fn a_rebind_to_another_executors_tensor_is_a_violation() {
    let (_guard, _ctx, s) = Session::locked();
    let x = random_input(50);
    let mems = [s.upload(&x), s.malloc(C * 4), s.malloc(C * 4), s.upload(&x), s.malloc(C * 4), s.malloc(C * 4)];
    let t: Vec<*mut aclTensor> = mems
        .iter()
        .enumerate()
        .map(|(i, &m)| if i % 3 == 0 { s.tensor(&[N as i64, C as i64], m) } else { s.tensor(&[C as i64], m) })
        .collect();
    let (_, a) = s.phase1(t[0], t[1], t[2]);
    let (_, b) = s.phase1(t[3], t[4], t[5]);
    s.repeatable(a);
    s.repeatable(b);
    let not_mine = "not a present argument of this executor";
    expect_rejected(
        &s,
        a,
        &[
            ((Side::Input, 0, t[3], mems[3]), &["input index 0", "is input", not_mine]),
            ((Side::Output, 1, t[5], mems[5]), &["output index 1", "is invstd", not_mine]),
        ],
    );
    assert_eq!(s.rebind_output(b, 1, t[5], mems[5]), 0, "on its own executor: {}", s.err());

    s.release(&[a, b], &t, &mems);
}

/// Destroying a repeatable executor while launches of it are queued and have not run is a
/// violation (161002) and frees nothing: the queued launches still run, and the destroy after
/// synchronising the stream is clean.
#[test]
fn destroying_a_repeatable_executor_with_a_queued_launch_is_a_violation() {
    let (_guard, _ctx, s) = Session::locked();
    let StatsArgs { x, input_mem, mean_mem, invstd_mem, input, mean, invstd, size, exec } = s.stats_args(60);
    s.repeatable(exec);
    let ws = s.workspace(size);
    let mut stream: aclrtStream = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { s.c.acl.aclrtCreateStream(&mut stream) }, 0);
    assert_eq!(s.phase2_on(ws, size, exec, stream), 0, "{}", s.err());
    assert_eq!(s.phase2_on(ws, size, exec, stream), 0, "{}", s.err());
    let live = ascend::mock::stats().live_executors;
    let mut status = 0;
    let v = violations_of(|| status = s.destroy_executor(exec));
    let err = s.err();
    assert_eq!(status, 161002, "{v:?} {err}");
    assert!(
        v.len() == 1
            && v[0].contains("aclDestroyAclOpExecutor: executor")
            && v[0].contains("of aclnnBatchNormStats is destroyed while 2 launches of it are queued and have not run"),
        "{v:?}"
    );
    assert!(err.contains("aclDestroyAclOpExecutor failed. ERROR: 161002"), "{err}");
    assert_eq!(ascend::mock::stats().live_executors, live, "the executor is not freed");

    // SAFETY: `stream` is live.
    assert_eq!(unsafe { s.c.acl.aclrtSynchronizeStream(stream) }, 0, "the queued launches run");
    let (m, iv) = reference(&x);
    assert_close(&s.download(mean_mem, C), &m, "mean");
    assert_close(&s.download(invstd_mem, C), &iv, "invstd");
    let v = violations_of(|| assert_eq!(s.destroy_executor(exec), 0, "{}", s.err()));
    assert!(v.is_empty(), "after synchronising: {v:?}");
    assert_eq!(ascend::mock::stats().live_executors, live - 1);

    // SAFETY: the stream has drained.
    assert_eq!(unsafe { s.c.acl.aclrtDestroyStream(stream) }, 0);
    s.release(&[], &[input, mean, invstd], &[input_mem, mean_mem, invstd_mem, ws]);
}
