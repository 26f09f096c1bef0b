//! What the benches share: deterministic data, layouts, thread count, the CPU's name and batch
//! timing. (A folder, so that cargo does not take it for a bench target of its own.)
#![allow(dead_code)]

use std::time::Instant;

pub mod peer;

use ascend::Element;

/// xorshift64*: the benches' deterministic data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u = 1.0 - self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos()
    }
}

/// `n` values uniform in [lo, hi), converted to `T`.
pub fn random<T: Element>(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<T> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| T::from_f64(r.uniform(lo, hi))).collect()
}

/// The threads this machine offers.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Row-major strides of `shape`, or channels-last ones (dim 1 innermost).
pub fn strides(shape: &[usize], channels_last: bool) -> Vec<usize> {
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

/// The CPU's model name (Linux), else the architecture.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Seconds per call of `f`, over `batch` calls in a row.
pub fn time_batch(batch: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..batch {
        f();
    }
    t.elapsed().as_secs_f64() / batch as f64
}
