//! A cached launch allocates nothing on the host: a counting global allocator (counting only on
//! the thread that opts in) sees zero heap allocations in a steady loop of each operator's
//! `_into` entry once its executor is cached, nor a launch with the cache off (its descriptors
//! live on the stack), while making a rank-9 tensor does (so the counter is live). The mock's C side is
//! not counted.
#![cfg(feature = "mock")]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ascend::ops::{
    batch_norm_elemt_backward_into, batch_norm_elemt_into, batch_norm_gather_stats_with_counts_into,
    batch_norm_reduce_backward_into, batch_norm_stats_into, OutputMask, ReduceBackwardOut,
};
use ascend::{DType, Result, Stream, Tensor};

/// The system allocator, counting the allocations of threads that set `COUNTING`.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the thread-locals may be gone while a thread exits.
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        let _ = ALLOCATIONS.try_with(|a| a.set(a.get() + 1));
    }
}

// SAFETY: forwards every call to `System` unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is `GlobalAlloc::alloc`'s, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Heap allocations made by this thread while `f` runs.
fn allocations(f: impl FnOnce() -> Result<()>) -> u64 {
    ALLOCATIONS.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    r.unwrap();
    ALLOCATIONS.with(Cell::get)
}

fn random(s: &Stream, rng: &mut common::Rng, shape: &[usize], lo: f32, hi: f32) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_slice(s, &rng.vec_f32(n, lo, hi), shape).unwrap()
}

/// Runs `launch` once (a miss), then 20 times (hits, counted): returns the count.
fn steady(s: &Stream, mut launch: impl FnMut() -> Result<()>) -> u64 {
    launch().unwrap();
    s.synchronize().unwrap();
    let n = allocations(|| (0..20).try_for_each(|_| launch()));
    s.synchronize().unwrap();
    n
}

#[test]
fn a_cached_launch_allocates_nothing_on_the_host() {
    common::mock::isolated(|ctx| {
        let s = ctx.new_stream().unwrap();
        let mut rng = common::Rng::new(7);
        let (n, c) = (4, 3);
        let x = random(&s, &mut rng, &[n, c, 5], -2.0, 2.0);
        let dy = random(&s, &mut rng, &[n, c, 5], -1.0, 1.0);
        let mean = random(&s, &mut rng, &[c], -0.5, 0.5);
        let invstd = random(&s, &mut rng, &[c], 0.5, 2.0);
        let weight = random(&s, &mut rng, &[c], 0.5, 1.5);
        let counts = Tensor::from_slice(&s, &[20f32, 20.0], &[2]).unwrap();
        let all_mean = random(&s, &mut rng, &[2, c], -0.5, 0.5);
        let all_invstd = random(&s, &mut rng, &[2, c], 0.5, 2.0);
        let counter = Tensor::from_slice(&s, &[20i32, 20], &[2]).unwrap();
        let zeros = |shape: &[usize]| Tensor::zeros(&s, DType::F32, shape).unwrap();
        let (mut m, mut v, mut y) = (zeros(&[c]), zeros(&[c]), zeros(&[n, c, 5]));
        let (mut rm, mut rv) = (zeros(&[c]), zeros(&[c]));
        let [mut a, mut b, mut g, mut h] = [0; 4].map(|_| zeros(&[c]));

        let counted = [
            ("batch_norm_stats", steady(&s, || batch_norm_stats_into(&s, &x, 1e-5, &mut m, &mut v))),
            (
                "batch_norm_elemt",
                steady(&s, || batch_norm_elemt_into(&s, &x, Some(&weight), None, &mean, &invstd, 1e-5, &mut y)),
            ),
            (
                "batch_norm_gather_stats_with_counts",
                steady(&s, || {
                    batch_norm_gather_stats_with_counts_into(
                        &s,
                        &x,
                        &all_mean,
                        &all_invstd,
                        Some(&mut rm),
                        Some(&mut rv),
                        0.1,
                        1e-5,
                        &counts,
                        &mut m,
                        &mut v,
                    )
                }),
            ),
            (
                "batch_norm_reduce_backward",
                steady(&s, || {
                    let out = ReduceBackwardOut {
                        sum_dy: Some(&mut a),
                        sum_dy_xmu: Some(&mut b),
                        grad_weight: Some(&mut g),
                        grad_bias: Some(&mut h),
                    };
                    batch_norm_reduce_backward_into(&s, &dy, &x, &mean, &invstd, Some(&weight), OutputMask::ALL, out)
                }),
            ),
            (
                "batch_norm_elemt_backward",
                steady(&s, || {
                    batch_norm_elemt_backward_into(&s, &dy, &x, &mean, &invstd, Some(&weight), &a, &b, &counter, &mut y)
                }),
            ),
        ];
        for (op, n) in counted {
            assert_eq!(n, 0, "{op}: {n} heap allocations in 20 cached launches");
        }
        assert_eq!(s.launch_cache_stats().hits, 5 * 20);

        // With the cache off, a launch describes its tensors on the stack: no allocation either.
        s.set_launch_cache_capacity(0);
        let uncached = steady(&s, || batch_norm_stats_into(&s, &x, 1e-5, &mut m, &mut v));
        assert_eq!(uncached, 0, "{uncached} heap allocations in 20 uncached launches");
        assert_eq!(s.launch_cache_stats().hits, 5 * 20, "the cache is off: no more hits");

        // The counter is live: making a tensor of rank 9 allocates (its shape and strides, held
        // in place only up to rank 8).
        let made = allocations(|| (0..20).try_for_each(|_| Tensor::zeros(&s, DType::F32, &[1; 9]).map(drop)));
        assert!(made >= 40, "making a rank-9 tensor allocates: counted {made} in 20");
    });
}
