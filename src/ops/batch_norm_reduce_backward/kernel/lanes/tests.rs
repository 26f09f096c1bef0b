//! The block primitives on every instruction set this CPU has, bit for bit against the portable
//! code: every start alignment (the AVX-512 runs realign on 64-byte boundaries), lengths around
//! the step and vector sizes, several runs per block, dead lanes of partial steps (an infinite
//! mean would show a touched lane), and the row primitive with every lane count.
//! Direct calls also cover the AVX-512 f16 code, which `Isa::Avx512` leaves to the AVX2 code.

use super::super::tests::{float_tests, Rng};
use super::*;

/// ±m·2^e, m in [1, 2), e in [-12, 12], so that f32 sums round and any change in which lane an
/// element goes to, or in the order of a lane's additions, changes the bits.
fn values<T: Element>(n: usize, seed: u64) -> Vec<T> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            let r = rng.next_u64();
            let m = 1.0 + (r >> 11) as f64 / (1u64 << 53) as f64;
            let e = (rng.next_u64() % 25) as i32 - 12;
            T::from_f64(if r & 1 == 0 { m } else { -m } * 2f64.powi(e))
        })
        .collect()
}

/// Same bits, or both NaN (NaN payloads may depend on operand order).
fn same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// `sum_runs` by every implementation available: the dispatched ISAs, plus the AVX-512 module
/// itself (for the dtypes it is not dispatched to).
fn sum_runs_all<T: Element, const XMU: bool>(dy: &[T], x: &[T], runs: &[Run], mean: f32) -> Vec<(String, (f64, f64))> {
    // Extended below only on x86-64 (the AVX-512 code's f16 path).
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut out: Vec<(String, (f64, f64))> = Isa::supported()
        .into_iter()
        .map(|isa| (format!("{isa:?}"), sum_runs::<T, XMU>(isa, true, dy, x, runs.iter().copied(), mean)))
        .collect();
    #[cfg(target_arch = "x86_64")]
    if Isa::supported().contains(&Isa::Avx512) {
        // SAFETY: `supported` lists Avx512 only after checking avx512f, avx512bw and avx512vl.
        let r = unsafe { avx512::sum_runs::<T, XMU>(RunsCall { pf: false, dy, x, runs: runs.iter().copied(), mean }) };
        out.push(("avx512 module".into(), r));
    }
    out
}

fn check_runs<T: Element>(dy: &[T], x: &[T], runs: &[Run], mean: f32) {
    for xmu in [false, true] {
        let all =
            if xmu { sum_runs_all::<T, true>(dy, x, runs, mean) } else { sum_runs_all::<T, false>(dy, x, runs, mean) };
        let (_, p) = &all[0];
        for (name, r) in &all[1..] {
            assert!(
                same(p.0, r.0) && same(p.1, r.1),
                "{:?} xmu {xmu} runs {runs:?} mean {mean}: portable {p:?} vs {name} {r:?}",
                T::DTYPE
            );
        }
    }
}

fn runs_every_alignment<T: Element>() {
    let n = 1200;
    let dy: Vec<T> = values(n, 1);
    let x: Vec<T> = values(n, 2);
    let lens = [0, 1, 5, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 130, 161, 191, 255, 256, 300, 513];
    for start in 0..40 {
        for &len in &lens {
            // x at the same offset (same alignment), and at another one.
            for dx in [0, 3] {
                check_runs(&dy, &x, &[(start, start + dx, len)], 0.1);
            }
        }
        // Several runs in one block, of mixed lengths and alignments.
        let runs = [(start, start + 1, 200), (start + 301, start + 7, 37), (start + 450, start + 450, 129)];
        check_runs(&dy, &x, &runs, -0.3);
    }
    // Runs ending at the very end of the storage.
    for len in [1, 31, 33, 130, 257] {
        check_runs(&dy, &x, &[(n - len, n - len, len)], 0.1);
    }
}

float_tests!(runs_every_alignment: runs_match_portable_f32, runs_match_portable_f16, runs_match_portable_bf16);

/// Lanes a partial step does not reach keep their bits: an infinite mean would turn a lane
/// that took a zero-filled element into NaN (0·(0 − ∞)). (Zero-filled elements are otherwise
/// invisible: the accumulators start at +0.0 and can never become −0.0.)
fn dead_lanes<T: Element>() {
    let ones = vec![T::from_f64(1.0); 300];
    for start in 0..33 {
        for len in [1, 5, 17, 31, 129, 150] {
            check_runs(&ones, &ones, &[(start, start, len)], f32::INFINITY);
            let r = sum_runs::<T, true>(Isa::detect(), true, &ones, &ones, [(start, start, len)], f32::INFINITY);
            assert_eq!(r.1, f64::NEG_INFINITY, "{:?} start {start} len {len}", T::DTYPE);
        }
    }
}

#[test]
fn dead_lanes_keep_their_bits() {
    dead_lanes::<f32>();
    dead_lanes::<f16>();
    dead_lanes::<bf16>();
}

/// `acc_rows` by every implementation, from the same starting accumulators; returns the
/// accumulators (d then m) of each.
fn acc_rows_all<T: Element>(dy: &[T], x: &[T], rows: Rows<'_>, len: usize, mean: &[f32]) -> Vec<(String, Vec<f32>)> {
    let init: Vec<f32> = values::<f32>(2 * len, 9);
    let run = |f: &dyn Fn(&mut [f32], &mut [f32])| {
        let mut acc = init.clone();
        let (d, m) = acc.split_at_mut(len);
        f(d, m);
        acc
    };
    // Extended below only on x86-64 (the AVX-512 code's f16 path).
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut out: Vec<(String, Vec<f32>)> = Isa::supported()
        .into_iter()
        .map(|isa| (format!("{isa:?}"), run(&|d, m| acc_rows::<T, true>(isa, true, dy, x, rows, len, mean, d, m))))
        .collect();
    #[cfg(target_arch = "x86_64")]
    if Isa::supported().contains(&Isa::Avx512) {
        let acc = run(&|d, m| {
            // SAFETY: `supported` lists Avx512 only after checking avx512f, avx512bw and avx512vl.
            unsafe { avx512::acc_rows::<T, true>(RowsCall { pf: false, dy, x, rows, len, mean, acc_d: d, acc_m: m }) }
        });
        out.push(("avx512 module".into(), acc));
    }
    out
}

fn rows_all_lane_counts<T: Element>() {
    let n = 8000;
    let dy: Vec<T> = values(n, 3);
    let x: Vec<T> = values(n, 4);
    let mean: Vec<f32> = values::<f32>(300, 5);
    let lens = (1..=70).chain([95, 96, 97, 130, 257]);
    for len in lens {
        for count in [0, 1, 3, 4, 5, 9] {
            for (d, stride) in [(0, len), (3, len + 5), (1, 2 * len)] {
                let rows = Rows::Strided { d, x: d + 1, stride, count };
                let list: Vec<(usize, usize)> = (0..count).map(|k| ((7 * k + 2) * (len + 1) % 4000, 11 * k)).collect();
                for rows in [rows, Rows::List(&list)] {
                    let all = acc_rows_all(&dy, &x, rows, len, &mean[..len]);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    for (name, acc) in &all[1..] {
                        assert_eq!(bits(acc), bits(&all[0].1), "{:?} {rows:?} len {len}: portable vs {name}", T::DTYPE);
                    }
                }
            }
        }
    }
}

#[test]
fn rows_match_portable() {
    rows_all_lane_counts::<f32>();
    rows_all_lane_counts::<f16>();
    rows_all_lane_counts::<bf16>();
}
