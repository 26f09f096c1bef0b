//! A replayed SyncBatchNorm step against the eager one on the mock CANN (issue 32).
//!
//! Two ranks as threads, one SyncBatchNorm layer (`forward` + `backward` with running
//! statistics, `[4, 64, 8, 8]` f32 per rank): the step run eagerly (launch cache warm) and the
//! same step captured once (`Stream::capture`) and replayed (`Graph::replay`); the step is
//! `tests/common/sync_bn_step.rs`, the one `tests/capture.rs` proves bit-exact. Prints, per rank
//! and step: runtime calls made by the rank's thread (every `acl*`, `aclnn*`, `Hccl*` entry the
//! mock counts), phase-1 calls, `aclTensor` descriptors, `aclrtMalloc`, host waits (stream,
//! event and device synchronises, blocking copies) and replays; and the host time per step of
//! each, measured side by side in this run (host time only: the mock runs kernels on the CPU
//! when a stream drains, outside the timed loop). Process-wide counts are fenced by barriers and
//! divided by ranks × steps. Run: `cargo bench --features mock --bench capture_step`.

use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use ascend::hccl::Communicator;
use ascend::mock::{capture_stats, launch_counters, stats, thread_stats};
use ascend::{CaptureMode, Context, Tensor};

mod common;
#[path = "../tests/common/sync_bn_step.rs"]
mod sync_bn_step;

use sync_bn_step::Step;

const RANKS: usize = 2;
const STEPS: u64 = 50;
const SHAPE: [usize; 4] = [4, 64, 8, 8];

/// Process-wide counters at a fence: phase-1 calls, descriptors, allocations, host waits, replays.
fn fence() -> [u64; 5] {
    let (s, l) = (stats(), launch_counters());
    let waits = s.stream_synchronizes + s.event_synchronizes + s.device_synchronizes + s.blocking_copies;
    [l.phase1_calls, l.tensors_created, s.device_mallocs, waits, capture_stats().replays]
}

/// The step (`tests/common/sync_bn_step.rs`, the one `tests/capture.rs` proves), its outputs
/// dropped.
fn step(rank: &mut Step, comm: &Communicator, s: &ascend::Stream) -> ascend::Result<()> {
    drop(rank.run(comm, s)?);
    Ok(())
}

fn main() -> ascend::Result<()> {
    std::env::set_var("ASCEND_MOCK_DEVICE_COUNT", "2");
    let ctxs: Vec<Context> = (0..RANKS as i32).map(ascend::mock::context).collect::<ascend::Result<_>>()?;
    let comms = Communicator::init_all(&ctxs)?;
    let barrier = Barrier::new(RANKS);
    let fences = Mutex::new(Vec::new());
    // Per rank: (runtime calls, host time) of the eager steps and of the replays.
    let per_rank = Mutex::new(Vec::new());
    let n: usize = SHAPE.iter().product();
    let c = SHAPE[1];
    std::thread::scope(|sc| -> ascend::Result<()> {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(&ctxs)
            .map(|(comm, ctx)| {
                let (barrier, fences, per_rank) = (&barrier, &fences, &per_rank);
                sc.spawn(move || -> ascend::Result<()> {
                    let r = u64::from(comm.rank());
                    let s = ctx.new_stream()?;
                    let t = |seed: u64, len: usize, shape: &[usize]| {
                        Tensor::from_slice(&s, &common::random::<f32>(len, seed, -2.0, 2.0), shape)
                    };
                    let mut rank = Step {
                        x: t(1 + r, n, &SHAPE)?,
                        dy: t(10 + r, n, &SHAPE)?,
                        w: t(20, c, &[c])?,
                        b: t(21, c, &[c])?,
                        rm: t(22, c, &[c])?,
                        rv: Tensor::from_slice(&s, &vec![1f32; c], &[c])?,
                    };
                    for _ in 0..2 {
                        step(&mut rank, &comm, &s)?;
                    }
                    s.synchronize()?;
                    let graph = s.capture(CaptureMode::ThreadLocal, |s| step(&mut rank, &comm, s))?;
                    // A fence: every rank drained, rank 0 snapshots the process-wide counters.
                    let fence_here = || -> ascend::Result<()> {
                        s.synchronize()?;
                        barrier.wait();
                        if r == 0 {
                            fences.lock().unwrap().push(fence());
                        }
                        barrier.wait();
                        Ok(())
                    };
                    let measure = |f: &mut dyn FnMut() -> ascend::Result<()>| -> ascend::Result<(u64, Duration)> {
                        fence_here()?;
                        let (calls, start) = (thread_stats().api_calls, Instant::now());
                        for _ in 0..STEPS {
                            f()?;
                        }
                        let (time, calls) = (start.elapsed(), thread_stats().api_calls - calls);
                        fence_here()?;
                        Ok((calls, time))
                    };
                    graph.replay(&s)?; // the first replay
                    let eager = measure(&mut || step(&mut rank, &comm, &s))?;
                    let replay = measure(&mut || graph.replay(&s))?;
                    per_rank.lock().unwrap().push((r, eager, replay));
                    drop(graph);
                    s.synchronize()
                })
            })
            .collect();
        for h in handles {
            h.join().expect("rank panicked")?;
        }
        Ok(())
    })?;
    let f = fences.into_inner().unwrap();
    let per = (RANKS as u64 * STEPS) as f64;
    // (The closing fence's stream synchronise, one per rank, is not the steps'.)
    let fence_waits = |i: usize| if i == 3 { RANKS as u64 } else { 0 };
    let d = |a: usize, i: usize| (f[a + 1][i] - f[a][i] - fence_waits(i)) as f64 / per;
    println!("CPU: {}", common::cpu_model());
    println!(
        "per rank and step ({RANKS} ranks as threads, {STEPS} steps, {SHAPE:?} f32, SyncBatchNorm forward + backward):"
    );
    let mut ranks = per_rank.into_inner().unwrap();
    ranks.sort_by_key(|r| r.0);
    for (what, a, pick) in [("eager step (launch cache warm)", 0, 0usize), ("replayed graph", 2, 1)] {
        let calls: Vec<String> =
            ranks.iter().map(|(_, e, g)| format!("{:.2}", [e, g][pick].0 as f64 / STEPS as f64)).collect();
        println!(
            "  {what:<32} runtime calls {} (rank 0, 1)  phase-1 {:.2}  descriptors {:.2}  aclrtMalloc {:.2}  \
             host waits {:.2}  replays {:.2}",
            calls.join(", "),
            d(a, 0),
            d(a, 1),
            d(a, 2),
            d(a, 3),
            d(a, 4)
        );
    }
    for (r, e, g) in &ranks {
        let (eager_us, replay_us) = (e.1.as_secs_f64() * 1e6 / STEPS as f64, g.1.as_secs_f64() * 1e6 / STEPS as f64);
        println!(
            "  rank {r}: host time per step: eager {eager_us:.1} µs, replay {replay_us:.1} µs, eager / replay = {:.1}",
            eager_us / replay_us
        );
    }
    Ok(())
}
