//! CPU backend throughput, tiny-call latency and long-channel accuracy.
//!
//! `cargo bench --bench cpu_reduce` (about 15 s after the build). Everything goes through the public
//! zero-copy entry `ascend::cpu::batch_norm_reduce_backward` with sumDy and sumDyXmu enabled.
//!
//! - Throughput: GB/s = bytes of dy + x read per second. Each is compared with a streaming read
//!   of the same bytes measured in the same run (integer sums with AVX2 when the CPU has it,
//!   several accumulators, the same thread split). Main-memory shapes use all cores for both;
//!   for cache-resident shapes the streaming rate is the better of one thread and all cores.
//! - Every timing is the best of several repetitions, interleaved kernel/stream, because other
//!   work on the machine only ever makes a run slower.

use std::hint::black_box;
use std::time::Instant;

use ascend::cpu::{self, Outputs, View, ViewMut};
use ascend::ops::OutputMask;
use ascend::{bf16, f16, Element};

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
    fn normal(&mut self) -> f64 {
        let u = 1.0 - self.uniform(0.0, 1.0);
        let v = self.uniform(0.0, 1.0);
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

fn random<T: Element>(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<T> {
    let mut r = Rng(seed | 1);
    (0..n).map(|_| T::from_f64(r.uniform(lo, hi))).collect()
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Row-major strides of `shape`, or channels-last ones (dim 1 innermost).
fn strides(shape: &[usize], channels_last: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..shape.len()).collect();
    if channels_last {
        order.remove(1);
        order.push(1);
    }
    let mut s = vec![0; shape.len()];
    let mut acc = 1;
    for &k in order.iter().rev() {
        s[k] = acc;
        acc *= shape[k];
    }
    s
}

/// One call of the public entry: sumDy and sumDyXmu into f32 outputs.
fn op<T: Element>(dy: &[T], x: &[T], shape: &[usize], st: &[usize], mean: &[f32], out: &mut [Vec<f32>; 2]) {
    let c = [shape[1]];
    let [sd, sm] = out;
    cpu::batch_norm_reduce_backward(
        View::strided(dy, shape, st, 0),
        View::strided(x, shape, st, 0),
        View::new(mean, &c),
        View::new(mean, &c),
        None,
        OutputMask { input_g: true, weight_g: false, bias_g: false },
        Outputs { sum_dy: Some(ViewMut::new(sd, &c)), sum_dy_xmu: Some(ViewMut::new(sm, &c)), ..Default::default() },
    )
    .expect("valid call");
}

/// The words of `s` (the few bytes before the first aligned word and after the last are skipped).
fn words<T: Element>(s: &[T]) -> &[u32] {
    // SAFETY: every bit pattern is a valid u32; `align_to` only yields aligned, in-bounds words.
    unsafe { s.align_to::<u32>().1 }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_avx2(a: &[u32], b: &[u32]) -> u32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len()) / 32 * 32;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let z = _mm256_setzero_si256();
    let mut acc = [z; 4];
    let mut i = 0;
    while i < n {
        // SAFETY: i + 32 ≤ n ≤ len of both slices; unaligned loads.
        unsafe {
            for (k, acc) in acc.iter_mut().enumerate() {
                let va = _mm256_loadu_si256(pa.add(i + 8 * k).cast());
                let vb = _mm256_loadu_si256(pb.add(i + 8 * k).cast());
                *acc = _mm256_add_epi32(*acc, _mm256_add_epi32(va, vb));
            }
        }
        i += 32;
    }
    let s = _mm256_add_epi32(_mm256_add_epi32(acc[0], acc[1]), _mm256_add_epi32(acc[2], acc[3]));
    let mut lanes = [0u32; 8];
    // SAFETY: `lanes` holds 8 u32.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), s) };
    let tail = a[n..].iter().chain(&b[n..]).fold(0u32, |s, &v| s.wrapping_add(v));
    lanes.iter().fold(tail, |s, &v| s.wrapping_add(v))
}

fn stream_one(a: &[u32], b: &[u32]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 detected just above.
        return unsafe { stream_avx2(a, b) };
    }
    a.iter().chain(b).fold(0u32, |s, &v| s.wrapping_add(v))
}

/// A streaming read of `a` and `b` on `threads` threads (same split as the kernel: contiguous
/// pieces, the calling thread takes the first).
fn stream(a: &[u32], b: &[u32], threads: usize) -> u32 {
    if threads <= 1 {
        return stream_one(a, b);
    }
    let piece = a.len().div_ceil(threads);
    std::thread::scope(|s| {
        let hs: Vec<_> =
            (1..threads).map(|t| s.spawn(move || stream_one(chunk(a, t, piece), chunk(b, t, piece)))).collect();
        let first = stream_one(chunk(a, 0, piece), chunk(b, 0, piece));
        hs.into_iter().fold(first, |acc, h| acc.wrapping_add(h.join().expect("stream thread")))
    })
}

fn chunk(s: &[u32], t: usize, piece: usize) -> &[u32] {
    &s[(t * piece).min(s.len())..((t + 1) * piece).min(s.len())]
}

/// Seconds per call of `f`: best over `rounds` of the mean over a batch of `batch` calls.
fn time_batch(batch: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..batch {
        f();
    }
    t.elapsed().as_secs_f64() / batch as f64
}

/// Calls per timed batch so that a batch takes about `target` seconds.
fn calibrate(target: f64, mut f: impl FnMut()) -> usize {
    let once = time_batch(1, &mut f).max(1e-9);
    ((target / once) as usize).clamp(1, 1_000_000)
}

struct Row {
    kernel: f64,
    stream: f64,
}

/// Kernel vs streaming read on one shape/layout, interleaved, best of `rounds`.
fn compare<T: Element>(dy: &[T], x: &[T], shape: &[usize], cl: bool, rounds: usize, cached: bool) -> Row {
    let st = strides(shape, cl);
    let c = shape[1];
    let mean: Vec<f32> = (0..c).map(|i| 0.1 * i as f32).collect();
    let mut out = [vec![0f32; c], vec![0f32; c]];
    let (wa, wb) = (words(dy), words(x));
    let all = threads();
    let target = if cached { 0.01 } else { 0.0 };
    let nk = calibrate(target, || op(dy, x, shape, &st, &mean, &mut out));
    let ns = calibrate(target, || {
        black_box(stream(wa, wb, all));
    });
    let (mut tk, mut ts) = (f64::MAX, f64::MAX);
    for _ in 0..rounds {
        tk = tk.min(time_batch(nk, || op(black_box(dy), black_box(x), shape, &st, &mean, &mut out)));
        ts = ts.min(time_batch(ns, || {
            black_box(stream(black_box(wa), black_box(wb), all));
        }));
        if cached && all > 1 {
            ts = ts.min(time_batch(ns, || {
                black_box(stream(black_box(wa), black_box(wb), 1));
            }));
        }
    }
    let bytes = (std::mem::size_of_val(dy) + std::mem::size_of_val(x)) as f64;
    Row { kernel: bytes / tk / 1e9, stream: bytes / ts / 1e9 }
}

fn throughput<T: Element>(name: &str, shapes: &[(&str, &[usize])], rounds: usize, cached: bool) {
    for &(label, shape) in shapes {
        let n: usize = shape.iter().product();
        let dy: Vec<T> = random(n, 11, -2.0, 2.0);
        let x: Vec<T> = random(n, 12, -3.0, 3.0);
        for cl in [false, true] {
            let r = compare(&dy, &x, shape, cl, rounds, cached);
            println!(
                "{label:<6} {name:<5} {:<14} {:>22} {:>9.1} MiB {:>8.2} {:>8.2} {:>7.2}",
                if cl { "channels-last" } else { "NCHW" },
                format!("{shape:?}"),
                2.0 * (n * std::mem::size_of::<T>()) as f64 / (1 << 20) as f64,
                r.kernel,
                r.stream,
                r.kernel / r.stream
            );
        }
    }
}

fn tiny() -> f64 {
    let (shape, c) = ([4usize, 2], [2usize]);
    let dy = [1f32, 1., 1., 2., 2., 2., 3., 3.];
    let x = [0f32, 1., 2., 3., 4., 5., 6., 7.];
    let ones = [1f32, 1.];
    let (mut a, mut b, mut w, mut g) = ([0f32; 2], [0f32; 2], [0f32; 2], [0f32; 2]);
    let mut call = || {
        cpu::batch_norm_reduce_backward(
            View::new(black_box(&dy[..]), &shape),
            View::new(black_box(&x[..]), &shape),
            View::new(&ones[..], &c),
            View::new(&ones[..], &c),
            None,
            OutputMask::ALL,
            Outputs {
                sum_dy: Some(ViewMut::new(&mut a[..], &c)),
                sum_dy_xmu: Some(ViewMut::new(&mut b[..], &c)),
                grad_weight: Some(ViewMut::new(&mut w[..], &c)),
                grad_bias: Some(ViewMut::new(&mut g[..], &c)),
            },
        )
        .expect("valid call");
    };
    let n = calibrate(0.02, &mut call);
    let t = (0..10).map(|_| time_batch(n, &mut call)).fold(f64::MAX, f64::min);
    assert_eq!((a, b), ([7.0, 8.0], [21.0, 30.0]));
    t
}

/// Relative errors (sumDy, sumDyXmu) of the f32 outputs vs an f64 reference, over data where
/// channel 0 has `per_channel` elements.
fn accuracy(shape: &[usize], cl: bool, cancel: bool) -> (f64, f64) {
    let n: usize = shape.iter().product();
    let c = shape[1];
    let mut r = Rng(99);
    let (dy, x): (Vec<f32>, Vec<f32>) = if cancel {
        (0..n).map(|_| (r.normal() as f32, (1000.0 + r.normal()) as f32)).unzip()
    } else {
        (0..n).map(|_| (r.uniform(0.1, 5.5) as f32, r.uniform(0.5, 5.0) as f32)).unzip()
    };
    let st = strides(shape, cl);
    // f64 reference by plain loops over channel 0's elements.
    let idx = |i: usize| -> usize {
        // i-th element of channel 0 in row-major order over the other dims.
        let mut rest = i;
        let mut off = 0;
        for k in (0..shape.len()).rev().filter(|&k| k != 1) {
            off += (rest % shape[k]) * st[k];
            rest /= shape[k];
        }
        off
    };
    let per = n / c;
    let mean0 = if cancel { (0..per).map(|i| f64::from(x[idx(i)])).sum::<f64>() / per as f64 } else { 0.25 };
    let mean: Vec<f32> = vec![mean0 as f32; c];
    let m = f64::from(mean[0]);
    let (mut sd, mut sm) = (0f64, 0f64);
    for i in 0..per {
        let (d, xv) = (f64::from(dy[idx(i)]), f64::from(x[idx(i)]));
        sd += d;
        sm += d * (xv - m);
    }
    let mut out = [vec![0f32; c], vec![0f32; c]];
    op(&dy, &x, shape, &st, &mean, &mut out);
    ((f64::from(out[0][0]) - sd).abs() / sd.abs(), (f64::from(out[1][0]) - sm).abs() / sm.abs())
}

fn main() {
    let start = Instant::now();
    println!(
        "cpu_reduce: {} threads; best of several interleaved repetitions (other load only slows a run)",
        threads()
    );
    println!(
        "{:<6} {:<5} {:<14} {:>22} {:>13} {:>8} {:>8} {:>7}",
        "where", "dtype", "layout", "shape", "dy+x", "GB/s", "stream", "ratio"
    );
    // CPU_REDUCE_ONLY=cache: skip the main-memory shapes and the accuracy runs (quick A/B runs).
    let only_cache = std::env::var("CPU_REDUCE_ONLY").is_ok_and(|v| v == "cache");
    // Main memory: 2 × 256 MiB per dtype.
    let mem32: &[(&str, &[usize])] = &[("memory", &[64, 64, 128, 128])];
    let mem16: &[(&str, &[usize])] = &[("memory", &[128, 64, 128, 128])];
    if !only_cache {
        throughput::<f32>("f32", mem32, 8, false);
        throughput::<f16>("f16", mem16, 8, false);
        throughput::<bf16>("bf16", mem16, 8, false);
    }
    // Cache-resident: 256 KiB, 1 MiB (L2) and 4 MiB (L2 + L3) of f32; half that in f16/bf16.
    let cache: &[(&str, &[usize])] =
        &[("cache", &[2, 16, 32, 32]), ("cache", &[4, 32, 32, 32]), ("cache", &[8, 64, 32, 32])];
    throughput::<f32>("f32", cache, 15, true);
    throughput::<f16>("f16", cache, 15, true);
    throughput::<bf16>("bf16", cache, 15, true);

    println!("tiny [4, 2] f32, all four outputs: {:.3} µs per call", tiny() * 1e6);

    if only_cache {
        return;
    }
    println!("relative error of the f32 outputs vs f64 on a 16.8M-element channel (sumDy, sumDyXmu):");
    for (name, shape, cl, cancel) in [
        ("NCHW [256, 1, 65536]", &[256usize, 1, 65536][..], false, false),
        ("channels-last [16777216, 2]", &[16_777_216, 2][..], true, false),
        ("NCHW [256, 1, 65536], x = 1000 + N(0,1), exact mean", &[256, 1, 65536][..], false, true),
    ] {
        let (ed, em) = accuracy(shape, cl, cancel);
        println!("  {name:<52} {ed:.2e} {em:.2e}");
    }
    println!("total bench time {:.1} s", start.elapsed().as_secs_f64());
}
