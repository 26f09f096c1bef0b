//! CPU backend throughput of `batch_norm_elemt` and `batch_norm_elemt_backward`.
//!
//! `cargo bench --bench batch_norm_elemt` (a few seconds after the build). Each kernel goes
//! through the public `_into` entry on the CPU backend with a preallocated output. GB/s = bytes
//! read (input; gradOut and input for the backward) plus bytes written (the output) per second,
//! next to a streaming copy of the same byte counts (`copy_from_slice`, the same number of
//! threads, measured in the same run; one thread for the cache-resident rows, which the kernels
//! run on one thread too). Every timing is the best of several repetitions,
//! interleaved kernel/stream, because other work on the machine only ever makes a run slower.

use std::hint::black_box;
use std::time::Instant;

use ascend::ops::{batch_norm_elemt_backward_into, batch_norm_elemt_into};
use ascend::{bf16, f16, Context, Element, Stream, Tensor};
use common::{cpu_model, random, strides, threads};

mod common;

const REPS: usize = 15;

/// A CPU tensor of `shape` in the given layout holding values in [lo, hi).
fn tensor<T: Element>(s: &Stream, shape: &[usize], cl: bool, seed: u64, lo: f64, hi: f64) -> Tensor {
    let data: Vec<T> = random(shape.iter().product(), seed, lo, hi);
    Tensor::from_slice_strided(s, &data, shape, &strides(shape, cl), 0).expect("tensor")
}

fn best(mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// The streaming reference: `read` bytes read and `written` bytes written (`written ≤ read`), on
/// `threads` threads: each copies its piece of the first `written` bytes of `src` into `dst`
/// (`copy_from_slice`, i.e. memcpy) and sums its piece of the rest of `src`.
fn stream(src: &[u8], dst: &mut [u8], threads: usize) -> u64 {
    let w = dst.len();
    let (copied, rest) = src.split_at(w);
    let (pc, pr) = (w.div_ceil(threads), rest.len().div_ceil(threads).max(8));
    std::thread::scope(|sc| {
        let handles: Vec<_> = dst
            .chunks_mut(pc)
            .zip(copied.chunks(pc))
            .zip(rest.chunks(pr).map(Some).chain(std::iter::repeat(None)))
            .map(|((d, s), r)| {
                sc.spawn(move || {
                    d.copy_from_slice(black_box(s));
                    r.map_or(0, |r| {
                        r.chunks_exact(8)
                            .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
                            .fold(0u64, u64::wrapping_add)
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).fold(0, u64::wrapping_add)
    })
}

/// Times `kernel` (moving `read + written` bytes) against [`stream`] of the same bytes; prints
/// one row.
fn row(name: &str, read: usize, written: usize, mut kernel: impl FnMut()) {
    // Inputs below the kernels' threading threshold (1 MiB moved) run on one thread: so does
    // their stream.
    let threads = if read + written < 1 << 20 { 1 } else { threads() };
    let src = vec![1u8; read];
    let mut dst = vec![0u8; written];
    let (mut tk, mut ts) = (f64::INFINITY, f64::INFINITY);
    kernel(); // warm up (page faults of the output, thread start-up)
    black_box(stream(&src, &mut dst, threads));
    for _ in 0..REPS {
        tk = tk.min(best(&mut kernel));
        ts = ts.min(best(|| {
            black_box(stream(&src, &mut dst, threads));
        }));
    }
    let bytes = (read + written) as f64;
    println!(
        "{name:<52} {:>7.2} GB/s   stream {:>7.2} GB/s   ({:>5.1}% of stream, {:.2} ms)",
        bytes / tk / 1e9,
        bytes / ts / 1e9,
        100.0 * ts / tk,
        tk * 1e3
    );
}

fn elemt<T: Element>(s: &Stream, shape: &[usize], cl: bool) {
    let c = shape[1];
    let x = tensor::<T>(s, shape, cl, 1, -2.0, 2.0);
    let mut y = tensor::<T>(s, shape, cl, 2, 0.0, 0.0);
    let mean = tensor::<f32>(s, &[c], false, 3, -0.5, 0.5);
    let invstd = tensor::<f32>(s, &[c], false, 4, 0.5, 2.0);
    let weight = tensor::<f32>(s, &[c], false, 5, 0.5, 1.5);
    let bias = tensor::<f32>(s, &[c], false, 6, -1.0, 1.0);
    let bytes = x.numel() * T::DTYPE.size_in_bytes();
    let name = format!("elemt {} {:?}{}", T::DTYPE, shape, if cl { " channels-last" } else { "" });
    row(&name, bytes, bytes, || {
        batch_norm_elemt_into(s, &x, Some(&weight), Some(&bias), &mean, &invstd, 1e-5, &mut y).expect("elemt")
    });
}

fn backward<T: Element>(s: &Stream, shape: &[usize], cl: bool) {
    let c = shape[1];
    let dy = tensor::<T>(s, shape, cl, 1, -2.0, 2.0);
    let x = tensor::<T>(s, shape, cl, 2, -2.0, 2.0);
    let mut gi = tensor::<T>(s, shape, cl, 3, 0.0, 0.0);
    let v = |seed| tensor::<f32>(s, &[c], false, seed, 0.5, 1.5);
    let (mean, invstd, weight, sum_dy, sum_dy_xmu) = (v(4), v(5), v(6), v(7), v(8));
    let counter = Tensor::from_slice(s, &[1000f32, 2000.0], &[2, 1]).expect("counter");
    let bytes = x.numel() * T::DTYPE.size_in_bytes();
    let name = format!("elemt_backward {} {:?}{}", T::DTYPE, shape, if cl { " channels-last" } else { "" });
    row(&name, 2 * bytes, bytes, || {
        batch_norm_elemt_backward_into(
            s,
            &dy,
            &x,
            &mean,
            &invstd,
            Some(&weight),
            &sum_dy,
            &sum_dy_xmu,
            &counter,
            &mut gi,
        )
        .expect("elemt_backward")
    });
}

fn isa() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let mut v =
            vec!["x86_64 (kernels built for the target's baseline: autovectorised SSE2 unless RUSTFLAGS raise it)"];
        for (f, on) in [
            ("f16c", std::arch::is_x86_feature_detected!("f16c")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
        ] {
            if on {
                v.push(f);
            }
        }
        v.join(", ")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

fn main() {
    println!("CPU: {}, {} threads; ISA: {}", cpu_model(), threads(), isa());
    println!("(f16 conversions use F16C through the half crate when the CPU has it; bf16 is bit arithmetic)\n");
    let ctx = Context::cpu();
    let s = ctx.new_stream().expect("stream");
    let cached = [2, 32, 32, 32];
    elemt::<f32>(&s, &cached, false);
    elemt::<bf16>(&s, &cached, false);
    backward::<f32>(&s, &cached, false);
    println!("(main memory:)");
    let big = [32, 64, 56, 56];
    let small_hw = [1024, 128, 7, 7];
    let rgb = [64, 3, 224, 224];
    elemt::<f32>(&s, &big, false);
    elemt::<f32>(&s, &big, true);
    elemt::<f32>(&s, &small_hw, false);
    elemt::<f32>(&s, &rgb, true);
    elemt::<f16>(&s, &big, false);
    elemt::<bf16>(&s, &big, false);
    elemt::<bf16>(&s, &big, true);
    backward::<f32>(&s, &big, false);
    backward::<f32>(&s, &big, true);
    backward::<f16>(&s, &big, false);
    backward::<bf16>(&s, &big, true);
}
