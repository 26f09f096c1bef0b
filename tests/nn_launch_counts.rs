//! What a steady training step of `nn::BatchNorm` costs on the mock CANN, counted and printed
//! (issue 29): on one device 2 operator launches (`aclnnBatchNorm`, `aclnnBatchNormBackward`),
//! no blocking or allocating runtime call, no descriptor made and no phase 1 (the launch cache
//! rebinds addresses); a SyncBatchNorm step over 2 ranks stays 5 launches and 2 collectives (one
//! all-gather, one all-reduce), 6 launches with the centered backward (the default of
//! `BatchNorm::centered_sync`: one element-wise launch more).
//! Launches are the phase-2 calls that queued work (`ascend::mock::launch_counters().launches`).
#![cfg(feature = "mock")]

mod common;

use std::sync::Barrier;

use ascend::hccl::Communicator;
use ascend::mock::{launch_counters, stats, LaunchCounters, MockStats};
use ascend::nn::BatchNorm;
use ascend::Tensor;
use common::mock_counters::HOST_WAITS_AND_ALLOCATIONS;

const SHAPE: [usize; 4] = [4, 16, 6, 6];
const STEPS: u64 = 10;

struct Snapshot {
    stats: MockStats,
    launches: LaunchCounters,
}

fn snapshot() -> Snapshot {
    Snapshot { stats: stats(), launches: launch_counters() }
}

/// Prints and returns, per step: queued tasks, descriptors, phase-1 calls, then each host wait and
/// allocation counter.
fn per_step(what: &str, a: &Snapshot, b: &Snapshot, per: u64) -> Vec<(String, u64)> {
    let mut counts = vec![
        ("operator launches".to_string(), b.launches.launches - a.launches.launches),
        ("aclCreateTensor".to_string(), b.launches.tensors_created - a.launches.tensors_created),
        ("phase-1 calls".to_string(), b.launches.phase1_calls - a.launches.phase1_calls),
        ("all-gathers".to_string(), b.stats.all_gathers - a.stats.all_gathers),
        ("all-reduces".to_string(), b.stats.all_reduces - a.stats.all_reduces),
    ];
    counts.extend(HOST_WAITS_AND_ALLOCATIONS.iter().map(|&(name, f)| (name.to_string(), f(&b.stats) - f(&a.stats))));
    let counts: Vec<(String, u64)> = counts.into_iter().map(|(n, v)| (n, v / per)).collect();
    let text: Vec<String> = counts.iter().map(|(n, v)| format!("{n} {v}")).collect();
    println!("{what}: {}", text.join(", "));
    counts
}

fn count(counts: &[(String, u64)], name: &str) -> u64 {
    counts.iter().find(|(n, _)| n == name).map(|(_, v)| *v).unwrap()
}

#[test]
fn single_device_step_is_two_launches_and_nothing_else() {
    common::mock::isolated(|ctx| {
        let s = ctx.new_stream().unwrap();
        let n: usize = SHAPE.iter().product();
        let x = Tensor::from_slice(&s, &common::Rng::new(1).vec_f32(n, -2.0, 2.0), &SHAPE).unwrap();
        let dy = Tensor::from_slice(&s, &common::Rng::new(2).vec_f32(n, -1.0, 1.0), &SHAPE).unwrap();
        let mut bn = BatchNorm::new(&s, SHAPE[1]).unwrap();
        let step = |bn: &mut BatchNorm| {
            let (y, saved) = bn.forward(&s, &x).unwrap();
            let g = bn.backward(&s, &dy, &saved).unwrap();
            drop((y, saved, g));
        };
        for _ in 0..3 {
            step(&mut bn);
        }
        s.synchronize().unwrap();
        let a = snapshot();
        for _ in 0..STEPS {
            step(&mut bn);
        }
        let b = snapshot();
        let counts = per_step("nn::BatchNorm step, one device", &a, &b, STEPS);
        assert_eq!(b.launches.launches - a.launches.launches, 2 * STEPS, "{counts:?}");
        for (name, v) in &counts {
            if name != "operator launches" {
                assert_eq!(*v, 0, "{name} per step ({counts:?})");
            }
        }
        assert_eq!(count(&counts, "aclCreateTensor"), 0);
        s.synchronize().unwrap();
        drop((x, dy, bn));
    });
}

#[test]
fn sync_step_is_unchanged() {
    for centered in [false, true] {
        sync_step(centered);
    }
}

fn sync_step(centered: bool) {
    let _guard = common::mock::lock();
    ascend::mock::set_device_count(2).unwrap();
    let ctxs: Vec<_> = (0..2).map(|d| ascend::mock::context(d).unwrap()).collect();
    let comms = Communicator::init_all(&ctxs).unwrap();
    let barrier = Barrier::new(2);
    let snaps = std::sync::Mutex::new(Vec::new());
    let n: usize = SHAPE.iter().product();
    std::thread::scope(|sc| {
        for (comm, ctx) in comms.into_iter().zip(&ctxs) {
            let (barrier, snaps) = (&barrier, &snaps);
            sc.spawn(move || {
                let r = comm.rank() as u64;
                let s = ctx.new_stream().unwrap();
                let x = Tensor::from_slice(&s, &common::Rng::new(1 + r).vec_f32(n, -2.0, 2.0), &SHAPE).unwrap();
                let dy = Tensor::from_slice(&s, &common::Rng::new(5 + r).vec_f32(n, -1.0, 1.0), &SHAPE).unwrap();
                let mut bn = BatchNorm::new(&s, SHAPE[1]).unwrap();
                bn.centered_sync = centered;
                let step = |bn: &mut BatchNorm| {
                    let (y, saved) = bn.forward_sync(&comm, &s, &x).unwrap();
                    let g = bn.backward_sync(&comm, &s, &dy, &saved).unwrap();
                    drop((y, saved, g));
                };
                for _ in 0..3 {
                    step(&mut bn);
                }
                s.synchronize().unwrap();
                for _ in 0..2 {
                    barrier.wait();
                    if r == 0 {
                        snaps.lock().unwrap().push(snapshot());
                    }
                    barrier.wait();
                    if snaps.lock().unwrap().len() == 2 {
                        break;
                    }
                    for _ in 0..STEPS {
                        step(&mut bn);
                    }
                }
                s.synchronize().unwrap();
            });
        }
    });
    let snaps = snaps.into_inner().unwrap();
    let what = format!("nn::BatchNorm forward_sync + backward_sync (centered_sync {centered}), per rank");
    let counts = per_step(&what, &snaps[0], &snaps[1], 2 * STEPS);
    assert_eq!(count(&counts, "operator launches"), if centered { 6 } else { 5 });
    for (name, v) in &counts {
        if !["operator launches", "all-gathers", "all-reduces"].contains(&name.as_str()) {
            assert_eq!(*v, 0, "{name} per step ({counts:?})");
        }
    }
    assert_eq!(count(&counts, "all-gathers"), 1);
    assert_eq!(count(&counts, "all-reduces"), 1);
}

/// A bf16 SyncBatchNorm forward on one mock device (issue 30): its local statistics are two
/// launches (`aclnnCast` to an f32 temporary, `aclnnBatchNormStats`) with no host read, so a
/// steady forward is 4 launches and 1 all-gather with no host wait, no blocking copy and no
/// allocating runtime call. The runtime calls of the step (every toolkit entry point called on
/// this thread) are printed. Its statistics match f64 to f32 accuracy, also when |mean| ≫ std.
#[test]
fn bf16_sync_forward_makes_no_host_wait() {
    common::mock::isolated(|ctx| {
        let s = ctx.new_stream().unwrap();
        let comm = Communicator::init_all(std::slice::from_ref(ctx)).unwrap().remove(0);
        let mut rng = common::Rng::new(30);
        let x = common::Data::normal(&mut rng, ascend::DType::BF16, &SHAPE, 300.0, 6.0);
        let xt = x.tensor(&s).unwrap();
        let forward = || {
            let (y, saved) =
                ascend::sync_batch_norm::forward(&comm, &s, &xt, None, None, None, None, 0.1, 1e-5).unwrap();
            drop(y);
            saved
        };
        for _ in 0..3 {
            drop(forward());
        }
        s.synchronize().unwrap();
        let (a, calls) = (snapshot(), ascend::mock::thread_stats().api_calls);
        for _ in 0..STEPS {
            drop(forward());
        }
        let (b, calls) = (snapshot(), ascend::mock::thread_stats().api_calls - calls);
        let counts = per_step("sync_batch_norm::forward, bf16, one mock device", &a, &b, STEPS);
        println!("sync_batch_norm::forward, bf16, one mock device: runtime calls {} per step", calls / STEPS);
        assert_eq!(count(&counts, "operator launches"), 4, "{counts:?}");
        assert_eq!(count(&counts, "all-gathers"), 1, "{counts:?}");
        for &(name, _) in &HOST_WAITS_AND_ALLOCATIONS {
            assert_eq!(count(&counts, name), 0, "{name} per step ({counts:?})");
        }
        // The statistics of the exact bf16 values, against f64.
        let saved = forward();
        let (mean, invstd) = (saved.mean().to_vec::<f32>(&s).unwrap(), saved.invstd().to_vec::<f32>(&s).unwrap());
        let (v, [n, c, h, w]) = (x.values(), SHAPE);
        for ch in 0..c {
            let vals: Vec<f64> =
                (0..n).flat_map(|i| (0..h * w).map(move |k| (i * c + ch) * h * w + k)).map(|j| v[j]).collect();
            let m = vals.iter().sum::<f64>() / vals.len() as f64;
            let var = vals.iter().map(|x| (x - m).powi(2)).sum::<f64>() / vals.len() as f64;
            let r = 1.0 / (var + f64::from(1e-5f32)).sqrt();
            let (gm, gi) = (f64::from(mean[ch]), f64::from(invstd[ch]));
            assert!((gm - m).abs() <= 2e-7 * m.abs(), "mean[{ch}]: {gm} vs {m}");
            assert!((gi - r).abs() <= 2e-6 * r, "invstd[{ch}]: {gi} vs {r}");
        }
        drop(saved);
        drop((xt, comm));
        s.synchronize().unwrap();
    });
}
