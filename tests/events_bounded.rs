//! Live runtime objects stay bounded in loops that never wait on the host (issues 33 and 35):
//! a steady SyncBatchNorm training step (2 ranks as threads) and a plain operator loop over two
//! streams run 1,000 steps without a host synchronise, and every live count of the mock
//! (events per device, device allocations, tensors, executors, pinned host blocks, streams,
//! queued tasks) stays within what the warm-up reached, with no event created in the steady
//! steps; 70,000 pinned copies alternating between two streams keep live events bounded; and a
//! loop whose device never progresses ends in an error at the pool's bound, not a hang.
//! Values are checked against f64 references at the end of each loop.
#![cfg(feature = "mock")]

mod common;

use std::sync::{Barrier, Mutex, MutexGuard};

use ascend::hccl::Communicator;
use ascend::mock::{self, stats};
use ascend::ops::{self, OutputMask};
use ascend::{sync_batch_norm, Context, DType, Error, HostBuffer, Tensor};
use common::Rng;

static LOCK: Mutex<()> = Mutex::new(());

/// The mock's counters are process-wide: one test at a time (2 mock devices).
fn lock() -> MutexGuard<'static, ()> {
    let g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    std::env::set_var("ASCEND_MOCK_DEVICE_COUNT", "2");
    g
}

/// Every live count the loops must keep flat.
#[derive(Debug, Clone, Copy, Default)]
struct Live {
    events_device_0: u64,
    events_device_1: u64,
    allocations: u64,
    tensors: u64,
    executors: u64,
    host_allocations: u64,
    streams: u64,
    queued_tasks: u64,
}

/// A named field of [`Live`].
type Field = (&'static str, fn(&Live) -> u64);

const FIELDS: [Field; 8] = [
    ("live events of device 0", |l| l.events_device_0),
    ("live events of device 1", |l| l.events_device_1),
    ("live device allocations", |l| l.allocations),
    ("live aclTensors", |l| l.tensors),
    ("live executors", |l| l.executors),
    ("live pinned host blocks", |l| l.host_allocations),
    ("live streams", |l| l.streams),
    ("queued tasks", |l| l.queued_tasks),
];

fn live() -> Live {
    let s = stats();
    Live {
        events_device_0: mock::live_events_on(0),
        events_device_1: mock::live_events_on(1),
        allocations: s.live_allocations,
        tensors: s.live_tensors,
        executors: s.live_executors,
        host_allocations: s.live_host_allocations,
        streams: s.live_streams,
        queued_tasks: s.queued_tasks,
    }
}

/// Samples `(step, live counts, events created so far)` of a loop of `steps` steps: after the
/// warm-up (the first `warm` steps) no count exceeds the largest value the second `warm` steps
/// reached, and from step `2 * warm` on no event is created.
fn assert_flat(what: &str, samples: &[(u64, Live, u64)], warm: u64, steps: u64) {
    assert_eq!(samples.last().map(|s| s.0), Some(steps), "{what}: the loop ran to its end");
    let window: Vec<_> = samples.iter().filter(|s| (warm..=2 * warm).contains(&s.0)).collect();
    let after: Vec<_> = samples.iter().filter(|s| s.0 > 2 * warm).collect();
    assert!(!window.is_empty() && after.len() >= 5, "{what}: too few samples");
    for (name, f) in FIELDS {
        let bound = window.iter().map(|s| f(&s.1)).max().unwrap_or(0);
        for (step, l, _) in &after {
            assert!(f(l) <= bound, "{what}: {name} grew to {} at step {step} (at most {bound} after warm-up)", f(l));
        }
    }
    let created_at = |s: &(u64, Live, u64)| s.2;
    let (first, last) = (window.last().map(|s| created_at(s)), after.last().map(|s| created_at(s)));
    assert_eq!(first, last, "{what}: events created in the steady steps ({first:?} at step {} -> {last:?})", 2 * warm);
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// BatchNorm's normalised output over `x` ([n, c, hw] blocks, batch statistics, biased variance)
/// of every rank's slice, in f64: `y[r]` for rank `r`.
fn normalised(xs: &[Vec<f64>], shape: [usize; 3], eps: f64) -> Vec<Vec<f64>> {
    let [n, c, hw] = shape;
    let at = |i: usize, ch: usize, k: usize| (i * c + ch) * hw + k;
    let m = (xs.len() * n * hw) as f64;
    let mut ys: Vec<Vec<f64>> = xs.iter().map(|x| vec![0.0; x.len()]).collect();
    for ch in 0..c {
        let vals = |x: &Vec<f64>| {
            (0..n).flat_map(move |i| (0..hw).map(move |k| at(i, ch, k))).map(|j| x[j]).collect::<Vec<_>>()
        };
        let all: Vec<f64> = xs.iter().flat_map(vals).collect();
        let mean = all.iter().sum::<f64>() / m;
        let var = all.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / m;
        let invstd = 1.0 / (var + eps).sqrt();
        for (x, y) in xs.iter().zip(&mut ys) {
            for i in 0..n {
                for k in 0..hw {
                    y[at(i, ch, k)] = (x[at(i, ch, k)] - mean) * invstd;
                }
            }
        }
    }
    ys
}

/// f32 accumulation over a few hundred values: a few units of f32 roundoff, relative to 1.
const TOL_F32: f64 = 1e-4;

fn assert_close(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((f64::from(*g) - w).abs() <= TOL_F32 * w.abs().max(1.0), "{what}[{i}]: got {g}, expected {w}");
    }
}

const STEPS: u64 = 1_000;
const WARM: u64 = 50;
const SAMPLE: u64 = 25;

/// (a) One SyncBatchNorm layer's training step (forward + backward, allocating API, temporaries
/// dropped), 2 ranks as threads on mock devices 0 and 1, 1,000 steps with no host synchronise.
/// The counts are sampled with both ranks at a step boundary (a host barrier). Before it, each
/// rank asks whether an event recorded at the end of its step has completed (a query: no host
/// wait on hardware): on the mock that runs the rank's collectives, which need the peer, and the
/// peer does the same, so neither waits at the barrier with a collective the other needs. Those
/// timing events (one per rank and sample) are the only events a steady step may create.
#[test]
fn sync_batch_norm_steps_without_a_host_wait_keep_every_live_count_flat() {
    let _g = lock();
    const SHAPE: [usize; 4] = [2, 8, 4, 4];
    let (n, c, hw) = (SHAPE[0], SHAPE[1], SHAPE[2] * SHAPE[3]);
    let eps = 1e-5;
    let ctxs: Vec<Context> = (0..2).map(|d| mock::context(d).expect("mock device")).collect();
    let comms = Communicator::init_all(&ctxs).expect("communicators");
    let before = stats();
    let xs: Vec<Vec<f32>> = (0..2).map(|r| Rng::new(100 + r).vec_f32(n * c * hw, -2.0, 2.0)).collect();
    let barrier = Barrier::new(2);
    let samples = Mutex::new(Vec::new());
    let outputs: Vec<Vec<f32>> = std::thread::scope(|sc| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(&ctxs)
            .zip(&xs)
            .map(|((comm, ctx), x)| {
                let (barrier, samples) = (&barrier, &samples);
                sc.spawn(move || -> ascend::Result<Vec<f32>> {
                    let r = comm.rank() as u64;
                    let s = ctx.new_stream()?;
                    let x = Tensor::from_slice(&s, x, &SHAPE)?;
                    let dy = Tensor::from_slice(&s, &Rng::new(200 + r).vec_f32(n * c * hw, -1.0, 1.0), &SHAPE)?;
                    let mut last = None;
                    let mut sampled = 0;
                    for step in 1..=STEPS {
                        let (y, saved) = sync_batch_norm::forward(&comm, &s, &x, None, None, None, None, 0.1, eps)?;
                        let grads = sync_batch_norm::backward(&comm, &s, &dy, &saved, None, OutputMask::ALL)?;
                        drop((saved, grads));
                        if step == STEPS {
                            last = Some(y);
                        }
                        if step % SAMPLE == 0 || (WARM..=2 * WARM).contains(&step) {
                            s.record_event()?.is_complete()?;
                            sampled += 1;
                            barrier.wait();
                            if r == 0 {
                                // Each rank made one timing event per sample: not the step's.
                                let created = stats().events_created - 2 * sampled;
                                samples.lock().unwrap().push((step, live(), created));
                            }
                            barrier.wait();
                        }
                    }
                    let y = last.expect("the last step's output");
                    y.to_vec::<f32>(&s)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank panicked").expect("rank failed")).collect()
    });
    let want = normalised(&xs.iter().map(|x| f64s(x)).collect::<Vec<_>>(), [n, c, hw], eps);
    for (r, (got, want)) in outputs.iter().zip(&want).enumerate() {
        assert_close(&format!("rank {r}: y of step {STEPS}"), got, want);
    }
    assert_flat("SyncBatchNorm steps", &samples.into_inner().unwrap(), WARM, STEPS);
    assert_eq!(stats().violations, before.violations, "the mock saw a violation");
}

/// (b) A plain operator loop over two streams: the statistics on one stream, the normalisation
/// reading them on the other (ordered by events on the device), temporaries dropped, 1,000 steps
/// with no host synchronise.
#[test]
fn operator_loop_over_two_streams_keeps_every_live_count_flat() {
    let _g = lock();
    let (n, c, hw) = (4, 6, 5);
    let eps = 1e-5;
    let ctx = mock::context(0).expect("mock device");
    let (s1, s2) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let before = stats();
    let data = Rng::new(7).vec_f32(n * c * hw, -3.0, 3.0);
    let x = Tensor::from_slice(&s1, &data, &[n, c, hw]).unwrap();
    let mut samples = Vec::new();
    let mut last = None;
    for step in 1..=STEPS {
        let (mean, invstd) = ops::batch_norm_stats(&s1, &x, eps).unwrap();
        let y = ops::batch_norm_elemt(&s2, &x, None, None, &mean, &invstd, eps).unwrap();
        drop((mean, invstd));
        if step == STEPS {
            last = Some(y);
        }
        if step % SAMPLE == 0 {
            samples.push((step, live(), stats().events_created));
        }
    }
    let y = last.unwrap().to_vec::<f32>(&s2).unwrap();
    let want = normalised(&[f64s(&data)], [n, c, hw], eps);
    assert_close("y of the last step", &y, &want[0]);
    assert_flat("two-stream operator loop", &samples, WARM, STEPS);
    assert_eq!(stats().violations, before.violations, "the mock saw a violation");
}

/// Issue 35, item 2: one pinned `HostBuffer` copied 70,000 times into a tensor on two
/// alternating streams, never synchronised: live events stay far below the device's 65,536
/// (they were 69,999), and the tensor holds the buffer's values.
#[test]
fn seventy_thousand_pinned_copies_on_alternating_streams_keep_events_bounded() {
    let _g = lock();
    let ctx = mock::context(0).expect("mock device");
    let streams = [ctx.new_stream().unwrap(), ctx.new_stream().unwrap()];
    let before = stats();
    let data = Rng::new(9).vec_f32(16, -5.0, 5.0);
    let mut h = HostBuffer::<f32>::new(&ctx, data.len()).unwrap();
    h.as_mut_slice().copy_from_slice(&data);
    let mut t = Tensor::zeros(&streams[0], DType::F32, &[16]).unwrap();
    let mut most = 0;
    for i in 0..70_000usize {
        t.copy_from_host_async(&streams[i % 2], &h).unwrap();
        if i % 1000 == 999 {
            most = most.max(mock::live_events_on(0));
        }
    }
    most = most.max(mock::live_events_on(0));
    let created = stats().events_created - before.events_created;
    assert!(most <= 64, "{most} live events on device 0 during 70,000 copies ({created} created)");
    assert_eq!(t.to_vec::<f32>(&streams[1]).unwrap(), data);
    drop(h);
    assert_eq!(stats().violations, before.violations, "the mock saw a violation");
}

/// A device that never progresses (the mock's progress at queries off: nothing completes until
/// a synchronise) while the host keeps launching on a stream and dropping the outputs: each drop
/// records an event after the work, none completes, so the pool reaches its bound (4096 events of
/// the device). The loop neither hangs nor creates events without end: a free, which cannot fail,
/// then waits for its stream (a host synchronise) and the events come back.
#[test]
fn a_device_that_never_progresses_stays_within_the_event_bound() {
    let _g = lock();
    let ctx = mock::context(0).expect("mock device");
    let s = ctx.new_stream().unwrap();
    let before = stats();
    let (n, c) = (3, 4);
    let data = Rng::new(11).vec_f32(n * c, -1.0, 1.0);
    let x = Tensor::from_slice(&s, &data, &[n, c]).unwrap();
    let progress = mock::set_query_progress(false);
    let mut most = 0;
    let mut run = || -> ascend::Result<()> {
        for i in 0..6_000usize {
            drop(ops::batch_norm_stats(&s, &x, 1e-5)?);
            if i % 100 == 0 {
                most = most.max(mock::live_events_on(0));
            }
        }
        Ok(())
    };
    let ran = run();
    mock::set_query_progress(progress);
    ran.unwrap();
    let after = stats();
    assert!(most <= 4096 + 8, "{most} live events");
    assert!(most > 2048, "the loop never came near the bound ({most} live events): the test tests nothing");
    assert!(after.stream_synchronizes > before.stream_synchronizes, "no host wait at the bound");
    let (mean, _) = ops::batch_norm_stats(&s, &x, 1e-5).unwrap();
    let want: Vec<f64> = (0..c).map(|ch| (0..n).map(|i| f64::from(data[i * c + ch])).sum::<f64>() / n as f64).collect();
    assert_close("mean", &mean.to_vec::<f32>(&s).unwrap(), &want);
    assert_eq!(stats().violations, before.violations, "the mock saw a violation");
}

/// The device's events used up by someone else (65,536 live events made through the raw API):
/// operators that order two streams, once the pool has no spare event left, fail with CANN's `ACL_ERROR_RT_NO_EVENT_RESOURCE`
/// (207007) from the refused creation, writes nothing and does not hang; once events are
/// destroyed the same call succeeds.
#[test]
fn no_event_left_on_the_device_is_an_error_not_a_hang() {
    let _g = lock();
    let ctx = mock::context(0).expect("mock device");
    let (s1, s2) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let before = stats();
    let (n, c) = (3, 4);
    let data = Rng::new(12).vec_f32(n * c, -1.0, 1.0);
    let x = Tensor::from_slice(&s1, &data, &[n, c]).unwrap();
    drop(ops::batch_norm_stats(&s1, &x, 1e-5).unwrap()); // x is in use on s1
    let cann = ascend_sys::load_from(mock::toolkit_dir()).expect("the mock loads");
    let mut hog = Vec::new();
    // SAFETY: plain runtime calls on the mock; the events are destroyed below.
    unsafe {
        assert_eq!(cann.acl.aclrtSetDevice(0), 0);
        loop {
            let mut e = std::ptr::null_mut();
            match cann.acl.aclrtCreateEventExWithFlag(&mut e, ascend_sys::event_flag::ACL_EVENT_SYNC) {
                0 => hog.push(e),
                status => {
                    assert_eq!(status, 207007, "the mock's refusal");
                    break;
                }
            }
            assert!(hog.len() <= 65_536, "the mock made more than 65,536 events on one device");
        }
    }
    assert_eq!(mock::live_events_on(0), 65_536);
    // Cross-stream work until the pool's spare events are used up and it must create one (the
    // mock's progress at queries off, so none comes back meanwhile).
    let progress = mock::set_query_progress(false);
    let mut refused = None;
    for i in 0..200 {
        let s = if i % 2 == 0 { &s2 } else { &s1 };
        if let Err(e) = ops::batch_norm_stats(s, &x, 1e-5) {
            refused = Some(e);
            break;
        }
    }
    mock::set_query_progress(progress);
    // SAFETY: events made above, waited for by nothing.
    unsafe {
        for e in hog.drain(..) {
            assert_eq!(cann.acl.aclrtDestroyEvent(e), 0);
        }
    }
    match &refused {
        Some(Error::Cann { status, call, .. }) => assert_eq!((*status, *call), (207007, "aclrtCreateEventExWithFlag")),
        other => panic!("expected the refused event creation, got {other:?}"),
    }
    let (mean, _) = ops::batch_norm_stats(&s2, &x, 1e-5).unwrap();
    let want: Vec<f64> = (0..c).map(|ch| (0..n).map(|i| f64::from(data[i * c + ch])).sum::<f64>() / n as f64).collect();
    assert_close("mean", &mean.to_vec::<f32>(&s2).unwrap(), &want);
    // The refused creations (the raw loop's last, and the crate's) are the only violations.
    let seen = mock::violations_since(before.violations);
    assert!(seen.len() >= 2 && seen.iter().all(|v| v.contains("already holds 65536 live events")), "{seen:?}");
    s1.synchronize().unwrap();
}
