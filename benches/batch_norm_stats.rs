//! CPU throughput of `ops::batch_norm_stats` and `ops::batch_norm_gather_stats_with_counts`.
//!
//! `cargo bench --bench batch_norm_stats` (about 20 s after the build). Through the public API on
//! the CPU backend (`_into`, so no allocation is timed).
//!
//! - GB/s = bytes of input read per second, next to a streaming read of the same bytes measured
//!   in the same run (integer sums over the same memory, several accumulators, compiled for AVX2
//!   when the CPU has it, the same number of threads); main-memory shapes use every core for
//!   both, cache-resident ones compare with the better of one thread and every core.
//! - Every timing is the best of several repetitions, interleaved kernel/stream (other load on the
//!   machine only ever makes a run slower).
//! - Last, the relative error of mean and invstd against f64 on x = 1000 + N(0, 1).

use std::hint::black_box;
use std::time::Instant;

use ascend::ops::{batch_norm_gather_stats_with_counts_into, batch_norm_stats_into};
use ascend::{f16, Context, DType, Element, Stream, Tensor};
use common::{cpu_model, strides, threads, Rng};

mod common;

/// The streaming read: a wrapping sum of the words of `bytes` with 16 independent accumulators.
#[inline(always)]
fn sum_words(words: &[u32]) -> u32 {
    let mut acc = [0u32; 16];
    let chunks = words.chunks_exact(16);
    let rem = chunks.remainder().iter().fold(0u32, |s, &v| s.wrapping_add(v));
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(v);
        }
    }
    acc.iter().fold(rem, |s, &v| s.wrapping_add(v))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_words_avx2(words: &[u32]) -> u32 {
    sum_words(words)
}

fn stream_one(words: &[u32]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 detected just above.
        return unsafe { sum_words_avx2(words) };
    }
    sum_words(words)
}

/// Streams `words` on `threads` threads (equal parts); returns the seconds taken.
fn stream(words: &[u32], threads: usize) -> f64 {
    let t = Instant::now();
    let part = words.len().div_ceil(threads);
    let total = std::thread::scope(|s| {
        let hs: Vec<_> = words.chunks(part.max(1)).skip(1).map(|c| s.spawn(move || stream_one(c))).collect();
        let first = stream_one(&words[..part.min(words.len())]);
        hs.into_iter().fold(first, |a, h| a.wrapping_add(h.join().unwrap_or(0)))
    });
    black_box(total);
    t.elapsed().as_secs_f64()
}

fn words_of(t: &Tensor, s: &Stream) -> Vec<u32> {
    // The tensor's bytes as words (a host copy of the same size, for the streaming read).
    match t.dtype() {
        DType::F32 => t.to_vec::<f32>(s).unwrap().iter().map(|v| v.to_bits()).collect(),
        _ => {
            let h = t.to_vec::<f16>(s).unwrap();
            h.chunks(2)
                .map(|p| u32::from(p[0].to_bits()) | u32::from(p.get(1).map_or(0, |v| v.to_bits())) << 16)
                .collect()
        }
    }
}

/// Throughput of batch_norm_stats on `shape` (NCHW or channels-last) in `T`.
fn throughput<T: Element>(s: &Stream, name: &str, shape: &[usize], channels_last: bool, reps: usize, cache: bool) {
    let n: usize = shape.iter().product();
    let mut r = Rng::new(0x9E37_79B9 ^ n as u64);
    let data: Vec<T> = (0..n).map(|_| T::from_f64(1.0 + r.normal())).collect();
    let st = strides(shape, channels_last);
    let x = Tensor::from_slice_strided(s, &data, shape, &st, 0).expect("input");
    drop(data);
    let c = shape[1];
    let mut m = Tensor::zeros(s, DType::F32, &[c]).unwrap();
    let mut v = Tensor::zeros(s, DType::F32, &[c]).unwrap();
    let words = words_of(&x, s);
    let bytes = (n * std::mem::size_of::<T>()) as f64;
    let (mut best_k, mut best_s) = (f64::MAX, f64::MAX);
    for _ in 0..reps {
        let t = Instant::now();
        batch_norm_stats_into(s, &x, 1e-5, &mut m, &mut v).expect("valid call");
        best_k = best_k.min(t.elapsed().as_secs_f64());
        best_s = best_s.min(stream(&words, threads()));
        if cache {
            best_s = best_s.min(stream(&words, 1));
        }
    }
    let (gk, gs) = (bytes / best_k / 1e9, bytes / best_s / 1e9);
    let layout = if channels_last { "channels-last" } else { "NCHW" };
    println!(
        "{:<6} {:<5} {:<14} {:>20} {:>9.1} MiB {:>7.1} {:>7.1} {:>6.2}",
        if cache { "cache" } else { "memory" },
        name,
        layout,
        format!("{shape:?}"),
        bytes / (1 << 20) as f64,
        gk,
        gs,
        gk / gs
    );
}

/// Seconds per call of the smallest calls.
fn tiny(s: &Stream) -> (f64, f64) {
    let x = Tensor::from_slice(s, &[1f32, 2., 3., 4., 5., 6., 7., 8.], &[4, 2]).unwrap();
    let mut m = Tensor::zeros(s, DType::F32, &[2]).unwrap();
    let mut v = Tensor::zeros(s, DType::F32, &[2]).unwrap();
    let calls = 20_000;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..calls {
            batch_norm_stats_into(s, &x, 1e-5, &mut m, &mut v).unwrap();
        }
        best = best.min(t.elapsed().as_secs_f64() / calls as f64);
    }
    // gather over 8 ranks × 64 channels, with running statistics
    let (w, c) = (8, 64);
    let mean = Tensor::from_slice(s, &vec![0.5f32; w * c], &[w, c]).unwrap();
    let invstd = Tensor::from_slice(s, &vec![2f32; w * c], &[w, c]).unwrap();
    let counts = Tensor::from_slice(s, &vec![1000f32; w], &[w]).unwrap();
    let input = Tensor::zeros(s, DType::F32, &[1, c]).unwrap();
    let mut rm = Tensor::zeros(s, DType::F32, &[c]).unwrap();
    let mut rv = Tensor::zeros(s, DType::F32, &[c]).unwrap();
    let mut mo = Tensor::zeros(s, DType::F32, &[c]).unwrap();
    let mut io = Tensor::zeros(s, DType::F32, &[c]).unwrap();
    let mut best_g = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..calls / 4 {
            batch_norm_gather_stats_with_counts_into(
                s,
                &input,
                &mean,
                &invstd,
                Some(&mut rm),
                Some(&mut rv),
                0.1,
                1e-5,
                &counts,
                &mut mo,
                &mut io,
            )
            .unwrap();
        }
        best_g = best_g.min(t.elapsed().as_secs_f64() / (calls / 4) as f64);
    }
    (best, best_g)
}

/// Relative errors (mean, invstd) against f64 on one channel of x = 1000 + N(0, 1).
fn accuracy(s: &Stream, shape: &[usize], channels_last: bool) -> (f64, f64) {
    let n: usize = shape.iter().product();
    let mut r = Rng::new(77);
    let data: Vec<f32> = (0..n).map(|_| (1000.0 + r.normal()) as f32).collect();
    let c = shape[1];
    let st = strides(shape, channels_last);
    // channel 0's values, in f64
    let mut vals = Vec::with_capacity(n / c);
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..n {
        if idx[1] == 0 {
            vals.push(f64::from(data[idx.iter().zip(&st).map(|(i, s)| i * s).sum::<usize>()]));
        }
        for k in (0..shape.len()).rev() {
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    let mean = vals.iter().sum::<f64>() / vals.len() as f64;
    let var = vals.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / vals.len() as f64;
    let invstd = 1.0 / (var + 1e-5).sqrt();
    let x = Tensor::from_slice_strided(s, &data, shape, &st, 0).unwrap();
    let mut m = Tensor::zeros(s, DType::F32, &[c]).unwrap();
    let mut v = Tensor::zeros(s, DType::F32, &[c]).unwrap();
    batch_norm_stats_into(s, &x, 1e-5, &mut m, &mut v).unwrap();
    let (gm, gv) = (f64::from(m.to_vec::<f32>(s).unwrap()[0]), f64::from(v.to_vec::<f32>(s).unwrap()[0]));
    ((gm - mean).abs() / mean.abs(), (gv - invstd).abs() / invstd)
}

/// The CPU's model, thread count and the ISAs the kernels can use.
fn machine() -> String {
    let model = cpu_model();
    #[allow(unused_mut)]
    let mut isa = vec!["portable"];
    #[cfg(target_arch = "aarch64")]
    isa.push("neon (baseline)");
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            isa.push("avx2");
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            isa.push("avx512f");
        }
    }
    format!("{model}; {} threads; ISA {}", threads(), isa.join("+"))
}

fn main() {
    let start = Instant::now();
    let s = Context::cpu().new_stream().expect("CPU stream");
    println!("batch_norm_stats (CPU): {}", machine());
    println!("best of several interleaved repetitions (other load only slows a run)");
    println!(
        "{:<6} {:<5} {:<14} {:>20} {:>13} {:>7} {:>7} {:>6}",
        "where", "dtype", "layout", "shape", "input", "GB/s", "stream", "ratio"
    );
    // Main memory: 256 MiB of f32, 128 MiB of f16.
    for cl in [false, true] {
        throughput::<f32>(&s, "f32", &[64, 64, 128, 128], cl, 6, false);
        throughput::<f16>(&s, "f16", &[64, 64, 128, 128], cl, 6, false);
    }
    // Cache-resident: 256 KiB, 1 MiB and 4 MiB of f32.
    for shape in [&[2usize, 16, 32, 32][..], &[4, 32, 32, 32], &[8, 64, 32, 32]] {
        for cl in [false, true] {
            throughput::<f32>(&s, "f32", shape, cl, 30, true);
            throughput::<f16>(&s, "f16", shape, cl, 30, true);
        }
    }
    // Small C channels-last (an RGB image batch) and short rows (7×7 maps).
    throughput::<f32>(&s, "f32", &[64, 3, 224, 224], true, 6, false);
    throughput::<f32>(&s, "f32", &[256, 256, 7, 7], false, 6, false);

    let (t, g) = tiny(&s);
    println!("tiny batch_norm_stats [4, 2] f32: {:.2} µs per call", t * 1e6);
    println!("batch_norm_gather_stats_with_counts, 8 ranks × 64 channels, running stats: {:.2} µs per call", g * 1e6);
    println!("relative error vs f64, x = 1000 + N(0,1) (mean, invstd):");
    for (name, shape, cl) in [
        ("NCHW [256, 1, 65536]", &[256usize, 1, 65536][..], false),
        ("channels-last [4194304, 4]", &[4_194_304, 4], true),
    ] {
        let (em, ev) = accuracy(&s, shape, cl);
        println!("  {name:<28} {em:.2e} {ev:.2e}");
    }
    println!("total bench time {:.1} s", start.elapsed().as_secs_f64());
}
