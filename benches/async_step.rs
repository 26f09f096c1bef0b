//! Host stalls and device allocations per steady training step on the mock CANN (issue 16).
//!
//! Prints, per rank and step of one SyncBatchNorm layer (`forward` + `backward`, `[4, 64, 8, 8]`
//! f32 per rank, 2 ranks as threads, allocating API, temporaries dropped each step): the
//! synchronises of each kind, `aclrtMalloc` / `aclrtFree`, blocking copies, pinned host
//! allocations and collectives counted by the mock, and the events created and live (issue 33:
//! 0 events created per steady step, live events flat), without a host synchronise and with one
//! after every step; then the same counts for a steady loop of one operator through `_into` and
//! through the allocating API; and reserved / peak device memory.
//! Counts are process-wide in the mock, so the ranks' steps are fenced by barriers and the
//! totals divided by ranks × steps. Before each snapshot every rank asks whether an event
//! recorded at the end of its steps has completed (a query, no host wait), which lets its queued
//! collectives run on the mock before the ranks meet on the host; that event is not counted.
//! Run: `cargo bench --features mock --bench async_step`.

use std::sync::Barrier;

use ascend::hccl::Communicator;
use ascend::mock::{launch_counters, stats, LaunchCounters, MockStats};
use ascend::ops::{batch_norm_reduce_backward, batch_norm_reduce_backward_into, OutputMask, ReduceBackwardOut};
use ascend::{sync_batch_norm, Context, DType, Tensor};

mod common;
#[path = "../tests/common/mock_counters.rs"]
mod mock_counters;
use mock_counters::HOST_WAITS_AND_ALLOCATIONS;

const RANKS: usize = 2;
const STEPS: u64 = 20;
const SHAPE: [usize; 4] = [4, 64, 8, 8];

/// `n` values in [-2, 2).
fn values(seed: u64, n: usize) -> Vec<f32> {
    common::random(n, seed, -2.0, 2.0)
}

/// Per `per` steps from `a` to `b`; `probes` events between them were the snapshots' own.
fn print_counts(what: &str, a: &MockStats, b: &MockStats, per: u64, probes: u64) {
    let d = |f: fn(&MockStats) -> u64| (f(b) - f(a)) as f64 / per as f64;
    let counts: Vec<String> =
        HOST_WAITS_AND_ALLOCATIONS.iter().map(|&(name, f)| format!("{name} {:>5.2}", d(f))).collect();
    let events = (b.events_created - a.events_created - probes) as f64 / per as f64;
    println!("{what:<44} {}  events created {events:>5.2}", counts.join("  "));
}

fn main() -> ascend::Result<()> {
    std::env::set_var("ASCEND_MOCK_DEVICE_COUNT", "2");
    let ctxs: Vec<Context> = (0..RANKS as i32).map(ascend::mock::context).collect::<ascend::Result<_>>()?;
    let comms = Communicator::init_all(&ctxs)?;
    let barrier = Barrier::new(RANKS);
    let snapshots = std::sync::Mutex::new(Vec::new());
    let n: usize = SHAPE.iter().product();
    std::thread::scope(|sc| -> ascend::Result<()> {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(&ctxs)
            .map(|(comm, ctx)| {
                let (barrier, snapshots) = (&barrier, &snapshots);
                sc.spawn(move || -> ascend::Result<()> {
                    let r = comm.rank() as u64;
                    let s = ctx.new_stream()?;
                    let x = Tensor::from_slice(&s, &values(1 + r, n), &SHAPE)?;
                    let dy = Tensor::from_slice(&s, &values(10 + r, n), &SHAPE)?;
                    let w = Tensor::from_slice(&s, &values(20, SHAPE[1]), &[SHAPE[1]])?;
                    let b = Tensor::from_slice(&s, &values(21, SHAPE[1]), &[SHAPE[1]])?;
                    let step = || -> ascend::Result<()> {
                        let (y, saved) =
                            sync_batch_norm::forward(&comm, &s, &x, Some(&w), Some(&b), None, None, 0.1, 1e-5)?;
                        let grads = sync_batch_norm::backward(&comm, &s, &dy, &saved, Some(&w), OutputMask::ALL)?;
                        drop((y, saved, grads));
                        Ok(())
                    };
                    for _ in 0..2 {
                        step()?;
                    }
                    s.synchronize()?;
                    // A snapshot taken by rank 0 while every rank waits, and STEPS steps between two.
                    let snapshot = || -> ascend::Result<()> {
                        s.record_event()?.is_complete()?;
                        barrier.wait();
                        if r == 0 {
                            let events = [ascend::mock::live_events_on(0), ascend::mock::live_events_on(1)];
                            snapshots.lock().unwrap().push((stats(), launch_counters(), events));
                        }
                        barrier.wait();
                        Ok(())
                    };
                    let measured = |host_wait: bool| -> ascend::Result<()> {
                        snapshot()?;
                        for _ in 0..STEPS {
                            step()?;
                            if host_wait {
                                s.synchronize()?;
                            }
                        }
                        snapshot()
                    };
                    measured(false)?;
                    // The same steps with a host synchronise after each.
                    measured(true)?;
                    // The same steps with the launch cache off, for comparison.
                    s.set_launch_cache_capacity(0);
                    measured(false)?;
                    s.synchronize()?;
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("rank panicked")?;
        }
        Ok(())
    })?;
    type Snapshot = (MockStats, LaunchCounters, [u64; RANKS]);
    let all: Vec<Snapshot> = snapshots.into_inner().unwrap();
    let snaps: Vec<MockStats> = all.iter().map(|s| s.0).collect();
    let launches: Vec<LaunchCounters> = all.iter().map(|s| s.1).collect();
    println!("per rank and steady step ({RANKS} ranks as threads, {STEPS} steps, {SHAPE:?} f32):");
    print_counts("SyncBatchNorm forward + backward", &snaps[0], &snaps[1], RANKS as u64 * STEPS, RANKS as u64);
    for (what, (a, b)) in [("no host synchronise", (0, 1)), ("a host synchronise after each step", (2, 3))] {
        // Each rank's snapshot made (and dropped) one timing event: not the steps'.
        let created = snaps[b].events_created - snaps[a].events_created - RANKS as u64;
        let live = |i: usize| all[i].2.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", ");
        println!(
            "  events, {what:<36} created per step {:>5.2}  live per device {} -> {} (device 0, 1)",
            created as f64 / (RANKS as u64 * STEPS) as f64,
            live(a),
            live(b)
        );
    }
    let per_step = |a: &LaunchCounters, b: &LaunchCounters| {
        let per = (RANKS as u64 * STEPS) as f64;
        ((b.tensors_created - a.tensors_created) as f64 / per, (b.phase1_calls - a.phase1_calls) as f64 / per)
    };
    for (what, (a, b)) in [("launch cache on (default)", (0, 1)), ("launch cache off", (4, 5))] {
        let (tensors, phase1) = per_step(&launches[a], &launches[b]);
        println!("  {what:<42} aclCreateTensor {tensors:>5.2}  phase-1 calls {phase1:>5.2}");
    }
    let per = (RANKS as u64 * STEPS) as f64;
    println!(
        "{:<44} all-gathers {:>5.2}  all-reduces {:>5.2}  broadcasts {:>5.2}",
        "  collectives (counted by the mock's HCCL)",
        (snaps[1].all_gathers - snaps[0].all_gathers) as f64 / per,
        (snaps[1].all_reduces - snaps[0].all_reduces) as f64 / per,
        (snaps[1].broadcasts - snaps[0].broadcasts) as f64 / per,
    );
    for (r, ctx) in ctxs.iter().enumerate() {
        print_memory(&format!("rank {r} after the steady steps"), ctx);
    }

    // One operator in a steady loop on device 0: `_into` and allocating.
    let ctx = &ctxs[0];
    let s = ctx.new_stream()?;
    let c = SHAPE[1];
    let dy = Tensor::from_slice(&s, &values(30, n), &SHAPE)?;
    let x = Tensor::from_slice(&s, &values(31, n), &SHAPE)?;
    let mean = Tensor::from_slice(&s, &values(32, c), &[c])?;
    let invstd = Tensor::from_slice(&s, &vec![1.5f32; c], &[c])?;
    let mut outs: Vec<Tensor> = (0..4).map(|_| Tensor::zeros(&s, DType::F32, &[c])).collect::<ascend::Result<_>>()?;
    let run_into = |outs: &mut [Tensor]| -> ascend::Result<()> {
        let [a, b, g, h] = outs else { unreachable!() };
        batch_norm_reduce_backward_into(
            &s,
            &dy,
            &x,
            &mean,
            &invstd,
            None,
            OutputMask::ALL,
            ReduceBackwardOut { sum_dy: Some(a), sum_dy_xmu: Some(b), grad_weight: Some(g), grad_bias: Some(h) },
        )
    };
    run_into(&mut outs)?;
    s.synchronize()?;
    let a = stats();
    for _ in 0..STEPS {
        run_into(&mut outs)?;
    }
    let b = stats();
    print_counts("batch_norm_reduce_backward_into loop", &a, &b, STEPS, 0);
    drop(batch_norm_reduce_backward(&s, &dy, &x, &mean, &invstd, None, OutputMask::ALL)?);
    s.synchronize()?;
    let a = stats();
    for _ in 0..STEPS {
        drop(batch_norm_reduce_backward(&s, &dy, &x, &mean, &invstd, None, OutputMask::ALL)?);
    }
    let b = stats();
    print_counts("batch_norm_reduce_backward (allocating) loop", &a, &b, STEPS, 0);
    s.synchronize()?;
    print_memory("device 0 after the operator loops", ctx);
    Ok(())
}

fn print_memory(what: &str, ctx: &Context) {
    let m = ctx.memory_stats();
    println!(
        "{what}: reserved {} B, peak allocated {} B, reserved / peak = {:.2}, aclrtMalloc calls {}",
        m.reserved,
        m.peak_allocated,
        m.reserved as f64 / m.peak_allocated.max(1) as f64,
        m.device_allocations
    );
}
