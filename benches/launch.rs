//! Host cost of one operator launch on the mock CANN (`cargo bench --features mock --bench launch`).
//!
//! Per steady `batch_norm_stats_into` launch (same shapes every time), with the stream's launch
//! cache on (the default) and off, printed next to raw C sequences through `ascend-sys` measured
//! in the same run, on the same stream and tensors:
//! - the descriptors created and phase-1 calls per launch (`ascend::mock::launch_counters`), and
//!   the Rust heap allocations per launch (a counting global allocator; the mock's C side is
//!   not counted);
//! - host time of our cached launch on the same tensors vs phase 2 alone (a cached descriptor
//!   already bound to a tensor's buffer is not rebound), and on alternating tensors vs the raw
//!   cached sequence (a repeatable executor: 3 × `aclSet{Input,Output}TensorAddr` + phase 2);
//! - host time of our uncached launch vs the raw uncached sequence (3 × `aclCreateTensor`,
//!   phase 1, phase 2, 3 × `aclDestroyTensor`).
//!
//! `LAUNCH_PROFILE=cached|rebinding|uncached|raw-uncached|raw-rebind|raw-phase2|none` runs one
//! variant 20,000 times for a profiler instead (e.g. `valgrind --tool=callgrind`: the difference
//! of two variants' instruction counts is their host cost difference, free of timing noise).
//!
//! Only enqueueing is timed: the mock runs the kernels when the stream is synchronised, which
//! happens after each timed batch. Every figure is the best of several interleaved batches. The
//! raw sequences use their own tensors of the same sizes, from the same allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::c_void;
use std::hint::black_box;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ascend::ops::batch_norm_stats_into;
use ascend::{DType, Stream, Tensor};
use ascend_sys::symbols::BATCH_NORM_STATS;
use ascend_sys::{aclDataType, aclFormat, aclOpExecutor, aclTensor, Cann};
use common::cpu_model;

mod common;

const N: usize = 8;
const C: usize = 4;
const EPS: f64 = 1e-5;
const BATCH: usize = 200;
const REPEATS: usize = 25;

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

/// The best time per launch (ns) of each variant: `REPEATS` rounds, each timing `BATCH` calls of
/// every variant in turn (interleaved, so drift in the machine's state favours none), its stream
/// synchronised after each batch.
fn best_ns(variants: &mut [(&Stream, &mut dyn FnMut())]) -> Vec<f64> {
    let mut best = vec![f64::INFINITY; variants.len()];
    for _ in 0..REPEATS {
        for ((stream, launch), best) in variants.iter_mut().zip(&mut best) {
            let t = Instant::now();
            for _ in 0..BATCH {
                launch();
            }
            let ns = t.elapsed().as_nanos() as f64 / BATCH as f64;
            stream.synchronize().unwrap();
            *best = best.min(ns);
        }
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
    /// Over the device memory of `input`, `mean`, `invstd` and `ws` (the raw sequences run on
    /// buffers from the same allocator as ours, so the mock's bookkeeping costs the same).
    fn new(c: &'static Cann, [input, mean, invstd, ws]: [&Tensor; 4]) -> RawArgs {
        let mem = [input, mean, invstd].map(|t| t.device_ptr().unwrap());
        let ws_size = (ws.numel() * 4) as u64;
        RawArgs { c, mem, ws: ws.device_ptr().unwrap(), ws_size }
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
    let raw_tensors = [
        Tensor::from_slice(&s, &x, &[N, C]).unwrap(),
        Tensor::zeros(&s, DType::F32, &[C]).unwrap(),
        Tensor::zeros(&s, DType::F32, &[C]).unwrap(),
        Tensor::zeros(&s, DType::F32, &[16]).unwrap(),
    ];
    let raw = RawArgs::new(c, [&raw_tensors[0], &raw_tensors[1], &raw_tensors[2], &raw_tensors[3]]);

    println!("CPU: {}", cpu_model());
    println!("batch_norm_stats_into, input [{N}, {C}] f32, on the mock CANN; best of {REPEATS} batches of {BATCH}");

    // Descriptors, phase-1 calls and heap allocations per steady launch, cached and not.
    let uncached_stream = ctx.new_stream().unwrap();
    uncached_stream.set_launch_cache_capacity(0);
    let per_launch = |s: &Stream, mean: &mut Tensor, invstd: &mut Tensor| {
        batch_norm_stats_into(s, &input, EPS, mean, invstd).unwrap();
        let before = ascend::mock::launch_counters();
        let allocations = ALLOCATIONS.load(Ordering::Relaxed);
        for _ in 0..BATCH {
            batch_norm_stats_into(s, &input, EPS, mean, invstd).unwrap();
        }
        let allocations = ALLOCATIONS.load(Ordering::Relaxed) - allocations;
        let after = ascend::mock::launch_counters();
        s.synchronize().unwrap();
        [after.tensors_created - before.tensors_created, after.phase1_calls - before.phase1_calls, allocations]
            .map(|n| n as f64 / BATCH as f64)
    };
    for (what, stream) in [("cached", &s), ("uncached", &uncached_stream)] {
        let [d, p, a] = per_launch(stream, &mut mean, &mut invstd);
        println!("per launch ({what:>8}): {d:.1} aclCreateTensor, {p:.1} phase-1 calls, {a:.1} Rust heap allocations");
    }

    let mut mean2 = Tensor::zeros(&s, DType::F32, &[C]).unwrap();
    let mut invstd2 = Tensor::zeros(&s, DType::F32, &[C]).unwrap();
    let mut ours = || batch_norm_stats_into(&s, &input, EPS, &mut mean, &mut invstd).unwrap();
    // Two sets of tensors, alternately: every launch rebinds its three tensors.
    let mut sets = [0, 1].map(|_| {
        let t = Tensor::from_slice(&s, &x, &[N, C]).unwrap();
        (t, Tensor::zeros(&s, DType::F32, &[C]).unwrap(), Tensor::zeros(&s, DType::F32, &[C]).unwrap())
    });
    let mut turn = 0;
    let mut ours_rebinding = || {
        turn ^= 1;
        let (x, m, v) = &mut sets[turn];
        batch_norm_stats_into(&s, x, EPS, m, v).unwrap()
    };
    let mut ours_uncached = || batch_norm_stats_into(&uncached_stream, &input, EPS, &mut mean2, &mut invstd2).unwrap();
    let mut raw_uncached = || {
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
    };

    // A repeatable executor: what a cache hit runs.
    let t = raw.descriptors();
    let (mut size, mut exec): (u64, *mut aclOpExecutor) = (0, ptr::null_mut());
    // SAFETY: as above; the executor is made repeatable before its first launch.
    unsafe {
        assert_eq!(phase1(t[0], EPS, t[1], t[2], &mut size, &mut exec), 0);
        assert_eq!(c.nnopbase.aclSetAclOpExecutorRepeatable(exec), 0);
    }
    let ws = if size == 0 { ptr::null_mut() } else { raw.ws };
    let mut raw_rebind_phase2 = || {
        // SAFETY: a live repeatable executor and its live descriptors over live allocations.
        unsafe {
            assert_eq!(c.nnopbase.aclSetInputTensorAddr(exec, 0, t[0], raw.mem[0]), 0);
            assert_eq!(c.nnopbase.aclSetOutputTensorAddr(exec, 0, t[1], raw.mem[1]), 0);
            assert_eq!(c.nnopbase.aclSetOutputTensorAddr(exec, 1, t[2], raw.mem[2]), 0);
            assert_eq!(phase2(ws, size, exec, raw_stream), 0);
        }
    };
    let mut raw_phase2 = || {
        // SAFETY: as above.
        assert_eq!(unsafe { phase2(ws, size, exec, raw_stream) }, 0);
    };
    // For profilers (perf, callgrind): `LAUNCH_PROFILE=<variant>` runs one variant many times and
    // prints nothing else; `none` runs the loop with no launch (the baseline to subtract).
    if let Ok(variant) = std::env::var("LAUNCH_PROFILE") {
        for _ in 0..100 {
            for _ in 0..BATCH {
                match variant.as_str() {
                    "cached" => ours(),
                    "rebinding" => ours_rebinding(),
                    "uncached" => ours_uncached(),
                    "raw-uncached" => raw_uncached(),
                    "raw-rebind" => raw_rebind_phase2(),
                    "raw-phase2" => raw_phase2(),
                    _ => {}
                }
            }
            s.synchronize().unwrap();
            uncached_stream.synchronize().unwrap();
        }
        return;
    }
    let times = best_ns(&mut [
        (&s, &mut ours),
        (&s, &mut ours_rebinding),
        (&uncached_stream, &mut ours_uncached),
        (&s, &mut raw_uncached),
        (&s, &mut raw_rebind_phase2),
        (&s, &mut raw_phase2),
    ]);
    let [ours, ours_rebinding, ours_uncached, raw_uncached, raw_rebind_phase2, raw_phase2] = times[..] else {
        unreachable!()
    };
    s.synchronize().unwrap();
    // SAFETY: the stream has drained; the caller owns the repeatable executor and the descriptors.
    unsafe {
        assert_eq!(c.nnopbase.aclDestroyAclOpExecutor(exec), 0);
        for d in t {
            c.nnopbase.aclDestroyTensor(d);
        }
    }

    println!("host time per launch:");
    println!(
        "  ours, cached, same tensors (phase 2 only)          {ours:>8.0} ns   vs raw phase 2 alone: {:.2}x",
        ours / raw_phase2
    );
    println!("  raw phase 2 alone                                  {raw_phase2:>8.0} ns");
    println!(
        "  ours, cached, other tensors (rebind 3 + phase 2)   {ours_rebinding:>8.0} ns   vs raw rebind + phase 2: {:.2}x",
        ours_rebinding / raw_rebind_phase2
    );
    println!("  raw rebind 3 tensors + phase 2                     {raw_rebind_phase2:>8.0} ns");
    println!(
        "  ours, uncached (descriptors + phase 1 + phase 2)   {ours_uncached:>8.0} ns   vs raw phase 1 + phase 2: {:.2}x",
        ours_uncached / raw_uncached
    );
    println!("  raw phase 1 + phase 2 (3 descriptors each time)    {raw_uncached:>8.0} ns");
    black_box((&mean, &invstd));
}
