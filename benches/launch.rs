//! Host cost of one operator launch on the mock CANN (`cargo bench --features mock --bench launch`).
//!
//! Per steady `batch_norm_stats_into` launch (same shapes every time), printed next to raw C
//! sequences through `ascend-sys` measured in the same run, on the same stream and tensors:
//! - the descriptors created and phase-1 calls per launch (`ascend::mock::launch_counters`), and
//!   the Rust heap allocations per launch (a counting global allocator; the mock's C side is
//!   not counted);
//! - host time of our launch vs the raw uncached sequence (3 × `aclCreateTensor`, phase 1,
//!   phase 2, 3 × `aclDestroyTensor`);
//! - host time of the raw cached sequence a launch cache would run (a repeatable executor:
//!   3 × `aclSet{Input,Output}TensorAddr` + phase 2) and of phase 2 alone, the targets a cache
//!   is measured against.
//!
//! Only enqueueing is timed: the mock runs the kernels when the stream is synchronised, which
//! happens after each timed batch. Every figure is the best of several batches. The raw
//! sequences use their own allocations of the same sizes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::c_void;
use std::hint::black_box;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ascend::ops::batch_norm_stats_into;
use ascend::{DType, Stream, Tensor};
use ascend_sys::symbols::BATCH_NORM_STATS;
use ascend_sys::{aclDataType, aclFormat, aclOpExecutor, aclTensor, aclrtMemMallocPolicy, Cann};
use common::cpu_model;

mod common;

const N: usize = 8;
const C: usize = 4;
const EPS: f64 = 1e-5;
const BATCH: usize = 200;
const REPEATS: usize = 7;

/// The system allocator, counting allocations (for the heap allocations per launch).
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to `System` unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is `GlobalAlloc::alloc`'s, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Best time per launch (ns) of `BATCH` calls of `launch`, synchronising `stream` after each batch.
fn best_ns(stream: &Stream, mut launch: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..REPEATS {
        let t = Instant::now();
        for _ in 0..BATCH {
            launch();
        }
        let ns = t.elapsed().as_nanos() as f64 / BATCH as f64;
        stream.synchronize().unwrap();
        best = best.min(ns);
    }
    best
}

struct RawArgs {
    c: &'static Cann,
    mem: [*mut c_void; 3],
    ws: *mut c_void,
    ws_size: u64,
}

impl RawArgs {
    fn new(c: &'static Cann) -> RawArgs {
        let policy = aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST;
        let mut mem = [ptr::null_mut(); 3];
        for (m, bytes) in mem.iter_mut().zip([N * C * 4, C * 4, C * 4]) {
            // SAFETY: a valid out-pointer; device 0 is bound on this thread.
            assert_eq!(unsafe { c.acl.aclrtMalloc(m, bytes, policy) }, 0);
            // SAFETY: writes `bytes` bytes of the fresh allocation.
            assert_eq!(unsafe { c.acl.aclrtMemset(*m, bytes, 0x3f, bytes) }, 0);
        }
        let mut ws = ptr::null_mut();
        let ws_size = 64;
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { c.acl.aclrtMalloc(&mut ws, ws_size as usize, policy) }, 0);
        RawArgs { c, mem, ws, ws_size }
    }

    fn descriptors(&self) -> [*mut aclTensor; 3] {
        let shapes: [&[i64]; 3] = [&[N as i64, C as i64], &[C as i64], &[C as i64]];
        let strides: [&[i64]; 3] = [&[C as i64, 1], &[1], &[1]];
        std::array::from_fn(|i| {
            // SAFETY: shape and stride arrays of the given rank; the storage is the allocation.
            unsafe {
                self.c.nnopbase.aclCreateTensor(
                    shapes[i].as_ptr(),
                    shapes[i].len() as u64,
                    aclDataType::ACL_FLOAT,
                    strides[i].as_ptr(),
                    0,
                    aclFormat::ACL_FORMAT_ND,
                    shapes[i].as_ptr(),
                    shapes[i].len() as u64,
                    self.mem[i],
                )
            }
        })
    }
}

fn main() {
    let ctx = ascend::mock::context(0).unwrap();
    let s = ctx.new_stream().unwrap();
    let raw_stream = s.as_raw().unwrap();
    let c = ascend_sys::load_from(ascend::mock::toolkit_dir()).unwrap();
    let api = c.operator(&BATCH_NORM_STATS).unwrap();
    let (phase1, phase2) =
        (*api.aclnnBatchNormStatsGetWorkspaceSize.as_ref().unwrap(), *api.aclnnBatchNormStats.as_ref().unwrap());

    let x: Vec<f32> = (0..N * C).map(|i| ((i * 37 % 11) as f32) * 0.25 - 1.0).collect();
    let input = Tensor::from_slice(&s, &x, &[N, C]).unwrap();
    let mut mean = Tensor::zeros(&s, DType::F32, &[C]).unwrap();
    let mut invstd = Tensor::zeros(&s, DType::F32, &[C]).unwrap();
    let raw = RawArgs::new(c);

    println!("CPU: {}", cpu_model());
    println!("batch_norm_stats_into, input [{N}, {C}] f32, on the mock CANN; best of {REPEATS} batches of {BATCH}");

    // Descriptors and phase-1 calls per steady launch.
    batch_norm_stats_into(&s, &input, EPS, &mut mean, &mut invstd).unwrap();
    let before = ascend::mock::launch_counters();
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..BATCH {
        batch_norm_stats_into(&s, &input, EPS, &mut mean, &mut invstd).unwrap();
    }
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - allocations;
    let after = ascend::mock::launch_counters();
    s.synchronize().unwrap();
    println!(
        "per launch: {:.1} aclCreateTensor, {:.1} phase-1 calls, {:.1} Rust heap allocations (no launch cache \
         on this branch)",
        (after.tensors_created - before.tensors_created) as f64 / BATCH as f64,
        (after.phase1_calls - before.phase1_calls) as f64 / BATCH as f64,
        allocations as f64 / BATCH as f64
    );

    let ours = best_ns(&s, || batch_norm_stats_into(&s, &input, EPS, &mut mean, &mut invstd).unwrap());
    let raw_uncached = best_ns(&s, || {
        let t = raw.descriptors();
        let (mut size, mut exec): (u64, *mut aclOpExecutor) = (0, ptr::null_mut());
        // SAFETY: live descriptors over live allocations, valid out-pointers; phase 2 consumes
        // the executor; the descriptors are destroyed after the launch (host metadata only).
        unsafe {
            assert_eq!(phase1(t[0], EPS, t[1], t[2], &mut size, &mut exec), 0);
            assert!(size <= raw.ws_size);
            let ws = if size == 0 { ptr::null_mut() } else { raw.ws };
            assert_eq!(phase2(ws, size, exec, raw_stream), 0);
            for d in t {
                c.nnopbase.aclDestroyTensor(d);
            }
        }
    });

    // A repeatable executor: what a cache hit would run.
    let t = raw.descriptors();
    let (mut size, mut exec): (u64, *mut aclOpExecutor) = (0, ptr::null_mut());
    // SAFETY: as above; the executor is made repeatable before its first launch.
    unsafe {
        assert_eq!(phase1(t[0], EPS, t[1], t[2], &mut size, &mut exec), 0);
        assert_eq!(c.nnopbase.aclSetAclOpExecutorRepeatable(exec), 0);
    }
    let ws = if size == 0 { ptr::null_mut() } else { raw.ws };
    let raw_rebind_phase2 = best_ns(&s, || {
        // SAFETY: a live repeatable executor and its live descriptors over live allocations.
        unsafe {
            assert_eq!(c.nnopbase.aclSetInputTensorAddr(exec, 0, t[0], raw.mem[0]), 0);
            assert_eq!(c.nnopbase.aclSetOutputTensorAddr(exec, 0, t[1], raw.mem[1]), 0);
            assert_eq!(c.nnopbase.aclSetOutputTensorAddr(exec, 1, t[2], raw.mem[2]), 0);
            assert_eq!(phase2(ws, size, exec, raw_stream), 0);
        }
    });
    let raw_phase2 = best_ns(&s, || {
        // SAFETY: as above.
        assert_eq!(unsafe { phase2(ws, size, exec, raw_stream) }, 0);
    });
    s.synchronize().unwrap();
    // SAFETY: the stream has drained; the caller owns the repeatable executor and the descriptors.
    unsafe {
        assert_eq!(c.nnopbase.aclDestroyAclOpExecutor(exec), 0);
        for d in t {
            c.nnopbase.aclDestroyTensor(d);
        }
        for m in raw.mem.into_iter().chain([raw.ws]) {
            c.acl.aclrtFree(m);
        }
    }

    println!("host time per launch:");
    println!("  ours (uncached: descriptors + phase 1 + phase 2)  {ours:>8.0} ns");
    println!(
        "  raw phase 1 + phase 2 (3 descriptors each time)   {raw_uncached:>8.0} ns   ours / raw = {:.2}x",
        ours / raw_uncached
    );
    println!(
        "  raw cached: rebind 3 tensors + phase 2            {raw_rebind_phase2:>8.0} ns   ours / raw = {:.2}x",
        ours / raw_rebind_phase2
    );
    println!(
        "  raw phase 2 alone                                 {raw_phase2:>8.0} ns   ours / raw = {:.2}x",
        ours / raw_phase2
    );
    black_box((&mean, &invstd));
}
