//! CPU backend throughput against a streaming read and against PyTorch's CPU kernel, tiny-call
//! latency and long-channel accuracy.
//!
//! `cargo bench --bench cpu_reduce` (a few minutes after the build; 11 on a 2-core VM with the
//! PyTorch peer, which alternates seven times per row). Everything goes through the
//! public zero-copy entry `ascend::cpu::batch_norm_reduce_backward` with sumDy and sumDyXmu
//! enabled, at 1 thread and at all cores (`ascend::cpu::set_max_threads`).
//!
//! - GB/s = bytes of dy + x read per second. `stream` is a streaming read of the same bytes in
//!   the same run (integer sums with AVX2 when the CPU has it, several accumulators) on the same
//!   number of threads; for cache-resident shapes at several threads it is the better of one
//!   thread and that many.
//! - `torch` is PyTorch's CPU kernel on the same shapes, timed by `benches/torch_peer.py` (see
//!   there which function) with the interpreter in `TORCH_PYTHON` (default `python3`), in a process
//!   that maps the same input pages ([`SharedInputs`]): ours and the peer's timings alternate
//!   [`ALTERNATIONS`] times per case and thread count (a shared machine's memory bandwidth drifts
//!   by half over seconds); `torch` is its best GB/s, and `xtorch` the median over the
//!   alternations of our best GB/s over the peer's in the same alternation (a burst of bandwidth
//!   that only one side caught moves a best-of ratio by 15%, not this one). The columns are
//!   empty when torch cannot be imported.
//! - Every timing is the best of several repetitions, interleaved kernel/stream, because other
//!   work on the machine mostly makes a run slower.
//! - Environment: `CPU_REDUCE_ONLY=cache` (or `=memory`) runs only the cache-resident (or
//!   main-memory) shapes, without the accuracy runs;
//!   `CPU_REDUCE_TORCH=0` skips the peer; `ASCEND_CPU_ISA=avx2` forces the AVX2 code on an
//!   AVX-512 CPU (the kernel reads it once).

use std::hint::black_box;
use std::time::Instant;

use ascend::cpu::{self, Outputs, View, ViewMut};
use ascend::ops::{self, OutputMask};
use ascend::{bf16, f16, Context, Element, Tensor};
use common::peer::{median, settle, Peer, SharedInputs, ALTERNATIONS};
use common::{cpu_model, random, strides, threads, time_batch, Rng};

mod common;

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

/// Calls per timed batch so that a batch takes about `target` seconds.
fn calibrate(target: f64, mut f: impl FnMut()) -> usize {
    let once = time_batch(1, &mut f).max(1e-9);
    ((target / once) as usize).clamp(1, 1_000_000)
}

struct Row {
    kernel: f64,
    stream: f64,
}

/// Kernel (at most `threads` threads) vs streaming read on one shape/layout, interleaved, best of
/// `rounds`.
fn compare<T: Element>(dy: &[T], x: &[T], shape: &[usize], cl: bool, threads: usize, cached: bool) -> Row {
    let rounds = if cached { 25 } else { 8 };
    let st = strides(shape, cl);
    let c = shape[1];
    let mean: Vec<f32> = (0..c).map(|i| 0.1 * i as f32).collect();
    let mut out = [vec![0f32; c], vec![0f32; c]];
    let (wa, wb) = (words(dy), words(x));
    cpu::set_max_threads(threads);
    let target = if cached { 0.01 } else { 0.0 };
    let nk = calibrate(target, || op(dy, x, shape, &st, &mean, &mut out));
    let ns = calibrate(target, || {
        black_box(stream(wa, wb, threads));
    });
    let (mut tk, mut ts) = (f64::MAX, f64::MAX);
    for _ in 0..rounds {
        tk = tk.min(time_batch(nk, || op(black_box(dy), black_box(x), shape, &st, &mean, &mut out)));
        ts = ts.min(time_batch(ns, || {
            black_box(stream(black_box(wa), black_box(wb), threads));
        }));
        if cached && threads > 1 {
            ts = ts.min(time_batch(ns, || {
                black_box(stream(black_box(wa), black_box(wb), 1));
            }));
        }
    }
    cpu::set_max_threads(0);
    let bytes = (std::mem::size_of_val(dy) + std::mem::size_of_val(x)) as f64;
    Row { kernel: bytes / tk / 1e9, stream: bytes / ts / 1e9 }
}

/// One benchmark shape.
struct Case {
    cached: bool,
    dtype: &'static str,
    shape: &'static [usize],
}

impl Case {
    fn layouts(&self) -> &'static [bool] {
        // A contiguous 2-D [N, C] is channels-last already.
        if self.shape.len() > 2 {
            &[false, true]
        } else {
            &[false]
        }
    }

    /// The peer script's name for one layout of this case.
    fn key(&self, cl: bool) -> String {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        format!("{}:{}:{}", self.dtype, if cl { "cl" } else { "nchw" }, dims.join(","))
    }
}

fn throughput<T: Element>(case: &Case, thread_counts: &[usize]) {
    let shape = case.shape;
    let n: usize = shape.iter().product();
    let shared = SharedInputs::new(&random::<T>(n, 11, -2.0, 2.0), &random::<T>(n, 12, -3.0, 3.0))
        .expect("a shared file mapping of the inputs");
    let (dy, x) = shared.slices();
    let bytes = (2 * n * std::mem::size_of::<T>()) as f64;
    for &cl in case.layouts() {
        for &threads in thread_counts {
            let mut peer = Peer::start("--serve", "CPU_REDUCE_TORCH", &case.key(cl), threads, &shared);
            let mut r = Row { kernel: 0.0, stream: 0.0 };
            let mut torch = f64::INFINITY;
            // Our GB/s over the peer's, one per alternation (each side's best of its rounds).
            let mut paired = Vec::with_capacity(ALTERNATIONS);
            for _ in 0..ALTERNATIONS {
                settle();
                let once = compare(dy, x, shape, cl, threads, case.cached);
                (r.kernel, r.stream) = (r.kernel.max(once.kernel), r.stream.max(once.stream));
                if let Some(t) = peer.as_mut().and_then(|p| {
                    settle();
                    p.time()
                }) {
                    torch = torch.min(t);
                    paired.push(once.kernel * t * 1e9 / bytes);
                }
            }
            drop(peer);
            let (tg, xt) = match median(&mut paired) {
                Some(m) => (format!("{:.2}", bytes / torch / 1e9), format!("{m:.2}")),
                None => ("-".into(), "-".into()),
            };
            println!(
                "{:<6} {:<5} {:<5} {:>20} {:>9.2} MiB {:>2} {:>8.2} {:>8.2} {:>6.2} {:>8} {:>6} {:>9.1}",
                if case.cached { "cache" } else { "memory" },
                case.dtype,
                if cl { "CL" } else { "NCHW" },
                format!("{shape:?}"),
                bytes / (1 << 20) as f64,
                threads,
                r.kernel,
                r.stream,
                r.kernel / r.stream,
                tg,
                xt,
                bytes / r.kernel / 1e3,
            );
        }
    }
}

/// Seconds per call of the allocating API (`ops::batch_norm_reduce_backward` on a CPU stream,
/// all four outputs allocated as new tensors) on a [4, 2] f32 input.
fn tiny_allocating() -> f64 {
    let stream = Context::cpu().new_stream().expect("cpu stream");
    let t = |v: &[f32], s: &[usize]| Tensor::from_slice(&stream, v, s).expect("tensor");
    let dy = t(&[1., 1., 1., 2., 2., 2., 3., 3.], &[4, 2]);
    let x = t(&[0., 1., 2., 3., 4., 5., 6., 7.], &[4, 2]);
    let ones = t(&[1., 1.], &[2]);
    let mut call = || {
        black_box(
            ops::batch_norm_reduce_backward(&stream, black_box(&dy), &x, &ones, &ones, None, OutputMask::ALL)
                .expect("valid call"),
        );
    };
    let n = calibrate(0.02, &mut call);
    let best = (0..10).map(|_| time_batch(n, &mut call)).fold(f64::MAX, f64::min);
    let r = ops::batch_norm_reduce_backward(&stream, &dy, &x, &ones, &ones, None, OutputMask::ALL).expect("call");
    let sum_dy_xmu: Vec<f32> = r.sum_dy_xmu.expect("output").to_vec(&stream).expect("read");
    assert_eq!(sum_dy_xmu, [21.0, 30.0]);
    best
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
    let mut r = Rng::new(99);
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

/// `CPU_REDUCE_PROFILE=dtype:layout:d0,d1,..:threads[:seconds]`: calls the kernel on that case
/// in a loop (for `perf record`), then prints its GB/s.
fn profile(spec: &str) {
    if spec == "tiny" {
        println!("tiny: {:.3} us zero-copy, {:.3} us allocating", tiny() * 1e6, tiny_allocating() * 1e6);
        return;
    }
    if let Some(n) = spec.strip_prefix("tiny:") {
        // `tiny:N`: N allocating-API calls on [4, 2] f32 (for callgrind: instructions per call).
        let n: usize = n.parse().expect("count");
        let stream = Context::cpu().new_stream().expect("cpu stream");
        let t = |v: &[f32], s: &[usize]| Tensor::from_slice(&stream, v, s).expect("tensor");
        let dy = t(&[1., 1., 1., 2., 2., 2., 3., 3.], &[4, 2]);
        let x = t(&[0., 1., 2., 3., 4., 5., 6., 7.], &[4, 2]);
        let ones = t(&[1., 1.], &[2]);
        for _ in 0..n {
            black_box(ops::batch_norm_reduce_backward(&stream, &dy, &x, &ones, &ones, None, OutputMask::ALL).ok());
        }
        return;
    }
    let parts: Vec<&str> = spec.split(':').collect();
    let shape: Vec<usize> = parts[2].split(',').map(|d| d.parse().expect("dim")).collect();
    let threads: usize = parts[3].parse().expect("threads");
    let secs: f64 = parts.get(4).map_or(5.0, |s| s.parse().expect("seconds"));
    let cl = parts[1] == "cl";
    fn go<T: Element>(shape: &[usize], cl: bool, threads: usize, secs: f64) {
        let n: usize = shape.iter().product();
        let dy: Vec<T> = random(n, 11, -2.0, 2.0);
        let x: Vec<T> = random(n, 12, -3.0, 3.0);
        let st = strides(shape, cl);
        let mean: Vec<f32> = (0..shape[1]).map(|i| 0.1 * i as f32).collect();
        let mut out = [vec![0f32; shape[1]], vec![0f32; shape[1]]];
        cpu::set_max_threads(threads);
        let (t0, mut calls, mut best) = (Instant::now(), 0usize, f64::MAX);
        while t0.elapsed().as_secs_f64() < secs {
            let t = Instant::now();
            op(black_box(&dy), black_box(&x), shape, &st, &mean, &mut out);
            best = best.min(t.elapsed().as_secs_f64());
            calls += 1;
        }
        let bytes = 2.0 * (n * std::mem::size_of::<T>()) as f64;
        println!("{calls} calls, best {:.1} us = {:.2} GB/s", best * 1e6, bytes / best / 1e9);
    }
    match parts[0] {
        "f32" => go::<f32>(&shape, cl, threads, secs),
        "f16" => go::<f16>(&shape, cl, threads, secs),
        _ => go::<bf16>(&shape, cl, threads, secs),
    }
}

fn main() {
    let start = Instant::now();
    let all = threads();
    println!("cpu_reduce: {} ({} cores), kernel ISA {}", cpu_model(), all, cpu::instruction_set());
    println!("best of several interleaved repetitions (other load only slows a run)");
    if let Ok(spec) = std::env::var("CPU_REDUCE_PROFILE") {
        profile(&spec);
        return;
    }
    // CPU_REDUCE_ONLY=cache (or =memory): only the cache-resident (or main-memory) shapes, and no
    // accuracy runs (quick A/B runs).
    let only = std::env::var("CPU_REDUCE_ONLY").ok();
    let only_cache = only.as_deref() == Some("cache");
    let only_memory = only.as_deref() == Some("memory");
    let cases: Vec<Case> = [
        (true, &[256usize, 1024][..]),
        (true, &[4, 32, 8, 16, 16]),
        (true, &[8, 256, 28, 28]),
        (true, &[8, 64, 32, 32]),
        (false, &[1, 4, 4096, 4096]),
        (false, &[64, 64, 128, 128]),
    ]
    .into_iter()
    .filter(|&(cached, _)| (cached || !only_cache) && (!cached || !only_memory))
    .flat_map(|(cached, shape)| ["f32", "f16", "bf16"].map(|dtype| Case { cached, dtype, shape }))
    .collect();
    let thread_counts: Vec<usize> = if all > 1 { vec![1, all] } else { vec![1] };
    println!(
        "{:<6} {:<5} {:<5} {:>20} {:>13} {:>2} {:>8} {:>8} {:>6} {:>8} {:>6} {:>9}",
        "where", "dtype", "lay", "shape", "dy+x", "th", "GB/s", "stream", "ratio", "torch", "xtorch", "us/call"
    );
    for case in &cases {
        match case.dtype {
            "f32" => throughput::<f32>(case, &thread_counts),
            "f16" => throughput::<f16>(case, &thread_counts),
            _ => throughput::<bf16>(case, &thread_counts),
        }
    }

    println!("tiny [4, 2] f32, all four outputs: {:.3} µs per call (zero-copy cpu entry)", tiny() * 1e6);
    println!("tiny [4, 2] f32, all four outputs: {:.3} µs per call (allocating ops API)", tiny_allocating() * 1e6);
    if only_cache || only_memory {
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
