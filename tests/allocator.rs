//! The stream-ordered caching allocator on the mock (issue 16): reuse on the same stream at once,
//! on another stream only after the first one's events, never a host wait at drop, out-of-memory
//! recovery, `empty_cache`, and the switch that turns caching off. Values are checked against the
//! host data (f64 sums for the operator results).

#![cfg(feature = "mock")]

mod common;

use std::sync::Mutex;

use ascend::hccl::Communicator;
use ascend::mock::{fail_next, fail_next_on_this_thread, stats, violations_since, MockStats};
use ascend::ops::{batch_norm_reduce_backward, OutputMask};
use ascend::{sync_batch_norm, Context, DType, Error, Result, Stream, Tensor};
use common::mock_counters::HOST_WAITS_AND_ALLOCATIONS;
use common::on_ranks;

/// The mock's counters are process-wide: one test at a time.
static LOCK: Mutex<()> = Mutex::new(());

/// The lock, with the mock set to two devices first (read at the process's first `aclInit`,
/// which no test of this binary makes before taking the lock).
fn lock() -> std::sync::MutexGuard<'static, ()> {
    let g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    std::env::set_var("ASCEND_MOCK_DEVICE_COUNT", "2");
    g
}

/// Runs `f` on a context of its own, then checks that it caused no mock violation and that
/// dropping the context returned every device allocation it made.
fn isolated(f: impl FnOnce(&Context) -> Result<()>) {
    let _g = lock();
    ascend::mock::clear_faults();
    let before = stats();
    {
        let ctx = ascend::mock::context(0).expect("mock context");
        f(&ctx).expect("test body");
    }
    let after = stats();
    assert_eq!(after.violations, before.violations, "{:?}", violations_since(before.violations));
    assert_eq!(after.live_allocations, before.live_allocations, "device memory left after the context");
    assert_eq!(after.live_host_allocations, before.live_host_allocations, "pinned memory left");
}

/// [`isolated`], on two streams of the context.
fn on_two_streams(f: impl FnOnce(&Context, Stream, Stream) -> Result<()>) {
    isolated(|ctx| f(ctx, ctx.new_stream()?, ctx.new_stream()?));
}

/// `n` values uniform in [-2, 2) from the tests' one generator.
fn rng(seed: u64, n: usize) -> Vec<f32> {
    common::Rng::new(seed).vec_f32(n, -2.0, 2.0)
}

/// Σ over dim 1 of `[n, c]` data in f64: what `gradBias` (Σ dy) must be.
fn channel_sums(v: &[f32], c: usize) -> Vec<f64> {
    let mut s = vec![0f64; c];
    for (i, x) in v.iter().enumerate() {
        s[i % c] += f64::from(*x);
    }
    s
}

/// `dy` (`[n, c]`) with zero mean and invstd of its channel count, for [`grad_bias`].
struct Dy {
    dy: Tensor,
    zeros: Tensor,
}

impl Dy {
    fn new(s: &Stream, data: &[f32], n: usize, c: usize) -> Result<Dy> {
        Ok(Dy { dy: Tensor::from_slice(s, data, &[n, c])?, zeros: Tensor::zeros(s, DType::F32, &[c])? })
    }

    /// `rng(seed, n·c)`, and those values as a `Dy` on `s`.
    fn random(s: &Stream, seed: u64, n: usize, c: usize) -> Result<(Vec<f32>, Dy)> {
        let data = rng(seed, n * c);
        let dy = Dy::new(s, &data, n, c)?;
        Ok((data, dy))
    }
}

/// Launches `gradBias = Σ dy` on `s`: an allocating call whose output (a `[C]` f32 block) comes
/// from the cache of `s`.
fn grad_bias(s: &Stream, d: &Dy) -> Result<Tensor> {
    let mask = OutputMask { input_g: false, weight_g: false, bias_g: true };
    let r = batch_norm_reduce_backward(s, &d.dy, &d.dy, &d.zeros, &d.zeros, None, mask)?;
    r.grad_bias.ok_or_else(|| Error::Config("no gradBias".into()))
}

fn assert_sums(s: &Stream, t: &Tensor, data: &[f32], c: usize) -> Result<()> {
    let got: Vec<f32> = t.to_vec(s)?;
    for (g, e) in got.iter().zip(channel_sums(data, c)) {
        assert!((f64::from(*g) - e).abs() <= 1e-5 * e.abs().max(1.0), "gradBias {g} vs {e}");
    }
    Ok(())
}

fn delta(a: &MockStats, b: &MockStats) -> (u64, u64, u64, u64) {
    (
        b.device_mallocs - a.device_mallocs,
        b.device_frees - a.device_frees,
        b.stream_synchronizes - a.stream_synchronizes,
        b.event_synchronizes + b.device_synchronizes - a.event_synchronizes - a.device_synchronizes,
    )
}

/// A block freed on a stream is reused at once by the next allocation of its size class on that
/// stream: a steady loop of allocating calls makes no `aclrtMalloc`, no `aclrtFree` and no host
/// wait after its first step, and the values stay right although every step reuses the memory
/// of the previous one before it ran (the mock runs the stream only at synchronisation).
#[test]
fn same_stream_reuse_is_immediate_and_waits_for_nothing() {
    isolated(|ctx| {
        let s = ctx.new_stream()?;
        let (n, c) = (16, 8);
        let data: Vec<Vec<f32>> = (0..6).map(|i| rng(i, n * c)).collect();
        let dys: Vec<Dy> = data.iter().map(|d| Dy::new(&s, d, n, c)).collect::<Result<_>>()?;
        drop(grad_bias(&s, &dys[0])?); // the first step: an output block and the workspace
        let before = stats();
        let mut outs = Vec::new();
        for dy in &dys {
            let out = grad_bias(&s, dy)?;
            let again = grad_bias(&s, dy)?; // takes the block of the previous step's `again`
            drop(again);
            outs.push(out);
        }
        // Each step keeps `out` (it takes the block `again` dropped in the step before) and makes
        // one new block for `again`: one aclrtMalloc per kept output, no other.
        let (mallocs, frees, syncs, waits) = delta(&before, &stats());
        assert_eq!((frees, syncs, waits), (0, 0, 0), "no free and no host wait");
        assert_eq!(mallocs, outs.len() as u64, "one block per kept output");
        for (out, d) in outs.iter().zip(&data) {
            assert_sums(&s, out, d, c)?;
        }
        // Each reused block held the right values: recompute in a steady loop and check each.
        for (dy, d) in dys.iter().zip(&data) {
            let before = stats();
            let out = grad_bias(&s, dy)?;
            assert_eq!(delta(&before, &stats()), (0, 0, 0, 0), "steady allocating call: no malloc, free or wait");
            assert_sums(&s, &out, d, c)?;
        }
        Ok(())
    });
}

/// Dropping a tensor whose work is still queued does not wait on the host, on one stream or two;
/// the memory is used again only after that work (the mock's use-after-free and hazard checks
/// would count a violation otherwise), and the results are right.
#[test]
fn drop_never_blocks_and_memory_outlives_queued_work() {
    on_two_streams(|_, a, b| {
        let (n, c) = (32, 4);
        let (data, dy) = Dy::random(&a, 7, n, c)?;
        let out_a = grad_bias(&a, &dy)?; // dy used on a
        let out_b = grad_bias(&b, &dy)?; // and on b, ordered after a by an event
        let before = stats();
        drop(dy); // queued on both streams
        let (mallocs, frees, syncs, waits) = delta(&before, &stats());
        assert_eq!((mallocs, frees, syncs, waits), (0, 0, 0, 0), "drop waits for nothing");
        assert!(ascend::mock::live_events_and_queued_tasks().1 > 0, "the work is still queued");
        // New allocations on either stream must not take dy's block while b still reads it.
        let (fill, other) = Dy::random(&b, 8, n, c)?;
        let again = grad_bias(&a, &other)?;
        assert_sums(&a, &out_a, &data, c)?;
        assert_sums(&b, &out_b, &data, c)?;
        assert_sums(&a, &again, &fill, c)?;
        Ok(())
    });
}

/// A block freed after use on stream A is not handed to stream B while A's work may still run
/// (B gets a new block), and is handed to B once A's event has completed (after A synchronised).
#[test]
fn cross_stream_reuse_waits_for_the_events() {
    on_two_streams(|ctx, a, b| {
        let (n, c) = (8, 64);
        // Inputs of their own per stream: nothing orders b after a.
        let ((da, dya), (db, dyb)) = (Dy::random(&a, 9, n, c)?, Dy::random(&b, 10, n, c)?);
        drop(grad_bias(&b, &dyb)?); // b's workspace exists from here on
        b.synchronize()?;
        ctx.empty_cache()?;
        let out = grad_bias(&a, &dya)?; // [C] f32: one 512-byte block, queued on a
        drop(out);
        let m0 = ctx.memory_stats();
        assert!(m0.reserved >= m0.allocated + 512, "the block is cached: {m0:?}");
        // a's work stays in flight (the mock's queries would otherwise let it run to its event).
        let progress = ascend::mock::set_query_progress(false);
        let pending = grad_bias(&b, &dyb); // b may not take the block a's queued work uses
        ascend::mock::set_query_progress(progress);
        let pending = pending?;
        let m1 = ctx.memory_stats();
        assert_eq!(m1.device_allocations, m0.device_allocations + 1, "a new block for b: {m0:?} -> {m1:?}");
        drop(pending);
        a.synchronize()?;
        b.synchronize()?;
        // Every event has completed: the cached blocks are idle and any stream may take them.
        let m2 = ctx.memory_stats();
        let out_b = grad_bias(&b, &dya)?;
        let out_a = grad_bias(&a, &dyb)?;
        let m3 = ctx.memory_stats();
        assert_eq!(m3.device_allocations, m2.device_allocations, "served from the cache: {m2:?} -> {m3:?}");
        assert_sums(&b, &out_b, &da, c)?;
        assert_sums(&a, &out_a, &db, c)?;
        Ok(())
    });
}

/// `memory_stats` reports the cache: `allocated` falls at drop while `reserved` stays, the peak
/// remembers, `empty_cache` returns everything cached (and only that), and reserved stays within
/// 1.5x the peak in a steady loop.
#[test]
fn memory_stats_report_the_cache_and_empty_cache_returns_it() {
    isolated(|ctx| {
        let s = ctx.new_stream()?;
        let (n, c) = (64, 16);
        let (data, dy) = Dy::random(&s, 11, n, c)?;
        for _ in 0..10 {
            drop(grad_bias(&s, &dy)?);
        }
        let m = ctx.memory_stats();
        assert!(m.reserved >= m.allocated && m.peak_allocated >= m.allocated, "{m:?}");
        assert!(m.reserved as f64 <= 1.5 * m.peak_allocated as f64, "reserved within 1.5x the peak: {m:?}");
        assert!(m.reserved > m.allocated, "dropped blocks stay cached: {m:?}");
        let live_before = stats().live_allocations;
        ctx.empty_cache()?;
        let e = ctx.memory_stats();
        assert_eq!(e.allocated, m.allocated, "live tensors keep their memory");
        assert!(e.reserved < m.reserved, "{m:?} -> {e:?}");
        let returned = live_before - stats().live_allocations;
        assert!(returned > 0, "cached blocks went back to the device");
        assert_eq!(dy.dy.to_vec::<f32>(&s)?, data, "a live tensor is untouched");
        assert_sums(&s, &grad_bias(&s, &dy)?, &data, c)?;
        Ok(())
    });
}

/// A failed `aclrtMalloc` returns the cache to the device and retries once (one injected failure
/// is absorbed when something was cached); a second failure surfaces as the runtime's status,
/// naming the sizes; nothing leaks and the context works afterwards.
#[test]
fn allocation_failure_returns_the_cache_and_retries_once() {
    isolated(|ctx| {
        let s = ctx.new_stream()?;
        let (n, c) = (16, 600); // [C] f32 = 2400 bytes: a 2560-byte class
        let (data, dy) = Dy::random(&s, 12, n, c)?;
        drop(grad_bias(&s, &dy)?); // caches blocks of the 2560-byte class and a 512-byte one
        let cached = ctx.memory_stats();
        assert!(cached.reserved > cached.allocated);
        // A request no cached block serves: aclrtMalloc fails once, the cache goes back, the
        // retry succeeds.
        let frees = stats().device_frees;
        fail_next("aclrtMalloc", 207001);
        let big = Tensor::zeros(&s, DType::F32, &[n, c])?;
        assert!(stats().device_frees > frees, "the cache went back to the device first");
        let frees = stats().device_frees;
        ctx.empty_cache()?;
        assert_eq!(stats().device_frees, frees, "nothing was cached after the recovery");
        // Cached now: 38400 bytes. Two failures in a row for a size that block does not serve:
        // an error with the runtime's status and the sizes.
        drop(big);
        fail_next("aclrtMalloc", 207001);
        fail_next_on_this_thread("aclrtMalloc", 207001);
        let err = Tensor::zeros(&s, DType::F32, &[n, c + 200]).expect_err("two failures");
        assert_eq!(err.status(), Some(207001), "{err}");
        let text = err.to_string();
        assert!(text.contains("aclrtMalloc") && text.contains("51200 bytes"), "names the request: {text}");
        assert!(text.contains("38400 cached bytes"), "names what was returned: {text}");
        // Nothing cached at all: a single failure is the error (no pointless retry).
        ctx.empty_cache()?;
        fail_next("aclrtMalloc", 207001);
        assert_eq!(Tensor::zeros(&s, DType::F32, &[n, c]).unwrap_err().status(), Some(207001));
        assert_sums(&s, &grad_bias(&s, &dy)?, &data, c)?;
        Ok(())
    });
}

/// A block freed after work on its stream when no event can be recorded (the event pool at its
/// bound, 4,096 per device: nothing completes, the device makes no progress) and the stream's
/// synchronise fails too: queued work may still use the block, so it is leaked and counted, and
/// no longer in `memory_stats`; the pool's events are all destroyed at the teardown.
#[test]
fn a_free_that_can_neither_record_nor_wait_leaks_the_block() {
    let _g = lock();
    ascend::mock::clear_faults();
    let before = stats();
    let events = ascend::mock::live_events_on(0);
    let leaks = ascend::mock::leaks().allocations;
    let ctx = ascend::mock::context(0).expect("mock context");
    let run = || -> Result<()> {
        let (s1, s2) = (ctx.new_stream()?, ctx.new_stream()?);
        let (n, c) = (8, 4);
        let (data, d) = Dy::random(&s1, 14, n, c)?;
        let (fill_data, fill) = Dy::random(&s1, 15, n, c)?;
        let restore = Restore(ascend::mock::set_query_progress(false));
        let out = grad_bias(&s2, &d)?; // `dy` is in use on s2
        let Dy { dy, zeros } = d;
        // Outputs of work on s1 dropped until the pool is at its bound: each drop records an
        // event after the work, and none completes.
        let mut steps = 0;
        while ascend::mock::live_events_on(0) < events + 4096 {
            drop(grad_bias(&s1, &fill)?);
            steps += 1;
            assert!(steps <= 5000, "the pool never reached its bound");
        }
        assert_eq!(ascend::mock::live_events_on(0), events + 4096, "the pool at its bound");
        let (m, syncs) = (ctx.memory_stats(), stats().stream_synchronizes);
        fail_next_on_this_thread("aclrtSynchronizeStream", 507899);
        drop(dy);
        ascend::mock::clear_faults();
        assert_eq!(stats().stream_synchronizes, syncs, "the failed wait was the only one");
        assert_eq!(ascend::mock::leaks().allocations, leaks + 1, "the block is leaked and counted");
        let after = ctx.memory_stats();
        assert_eq!(
            (m.allocated - after.allocated, m.reserved - after.reserved),
            (n * c * 4, 512),
            "{m:?} -> {after:?}"
        );
        drop(restore);
        assert_sums(&s2, &out, &data, c)?;
        assert_sums(&s1, &grad_bias(&s1, &fill)?, &fill_data, c)?;
        drop(zeros);
        Ok(())
    };
    run().expect("test body");
    drop(ctx);
    let after = stats();
    assert_eq!(after.violations, before.violations, "{:?}", violations_since(before.violations));
    assert_eq!(after.live_allocations, before.live_allocations + 1, "only the leaked block is left");
    assert_eq!(ascend::mock::live_events_on(0), events, "every event of the pool destroyed");
}

/// Turns the mock's progress at event queries back to what it was, when dropped.
struct Restore(bool);

impl Drop for Restore {
    fn drop(&mut self) {
        ascend::mock::set_query_progress(self.0);
    }
}

/// With `ASCEND_NO_MEMORY_CACHING=1` (read when the context is made) every dropped block is
/// freed (`aclrtFree`) once the work that used it has completed, never before (the mock's
/// use-after-free check sees each free) and without a host wait at the drop; `aclrtFree` itself
/// does not wait either (as on CANN: the queued work is still queued after it).
#[test]
fn caching_off_frees_after_the_work_and_never_waits() {
    let _g = lock();
    let before = stats();
    // Only this binary's tests make contexts, one at a time (the lock): none sees the variable.
    std::env::set_var("ASCEND_NO_MEMORY_CACHING", "1");
    let made = ascend::mock::context(0);
    std::env::remove_var("ASCEND_NO_MEMORY_CACHING");
    let ctx = made.expect("mock context");
    let run = || -> Result<()> {
        let s = ctx.new_stream()?;
        let (n, c) = (8, 3);
        let (data, dy) = Dy::random(&s, 13, n, c)?;
        let t = Tensor::zeros(&s, DType::F32, &[10, 3])?;
        // The work stays in flight until something drains it (no progress at event queries).
        let progress = ascend::mock::set_query_progress(false);
        let _restore = Restore(progress);
        let m = ctx.memory_stats();
        let exact = n * c * 4 + c * 4 + 120;
        assert_eq!((m.allocated, m.reserved), (exact, exact), "exact sizes: {m:?}");
        let out = grad_bias(&s, &dy)?;
        let b = stats();
        drop(dy); // used by queued work: freed only after it
        assert!(ascend::mock::live_events_and_queued_tasks().1 > 0, "the work is queued");
        drop(t); // never used by a stream: freed at once
        let a = stats();
        assert_eq!(a.device_frees - b.device_frees, 1, "the unused block at once, dy later");
        assert_eq!(a.stream_synchronizes, b.stream_synchronizes, "no wait at drop");
        // aclrtFree neither synchronises nor waits (CANN's waiting variant is
        // aclrtFreeWithDevSync): freeing t ran none of the queued work.
        assert!(ascend::mock::live_events_and_queued_tasks().1 > 0, "aclrtFree ran the queued work");
        assert_sums(&s, &out, &data, c)?; // synchronises: dy's work has run
        drop(out);
        drop(s); // and its workspace
        let m = ctx.memory_stats();
        assert_eq!((m.allocated, m.reserved), (0, 0), "{m:?}");
        Ok(())
    };
    run().expect("caching off");
    drop(ctx);
    let after = stats();
    assert_eq!(after.violations, before.violations, "{:?}", violations_since(before.violations));
    assert_eq!(after.live_allocations, before.live_allocations);
}

/// A steady SyncBatchNorm-like step on one device: temporaries allocated and dropped every
/// step, used across two streams ordered by events; after the first step no `aclrtMalloc`, no
/// free and no host wait; values right at the end.
#[test]
fn steady_two_stream_step_allocates_nothing() {
    on_two_streams(|_, a, b| {
        let (n, c) = (16, 8);
        let (data, dy) = Dy::random(&a, 14, n, c)?;
        let step = || -> Result<(Tensor, Tensor)> {
            let x = grad_bias(&a, &dy)?;
            let y = grad_bias(&b, &dy)?;
            Ok((x, y))
        };
        drop(step()?);
        a.synchronize()?;
        b.synchronize()?;
        drop(step()?);
        // The loop keeps one step's results while the next runs: two more blocks, once.
        let held = step()?;
        let mut last = step()?;
        drop(held);
        let before = stats();
        for _ in 0..10 {
            last = step()?; // the previous results drop after this step was queued
        }
        let (mallocs, frees, syncs, waits) = delta(&before, &stats());
        assert_eq!((frees, syncs, waits), (0, 0, 0), "no free and no host wait in the steady state");
        assert_eq!(mallocs, 0, "no aclrtMalloc in the steady state");
        let (x, y) = last;
        assert_sums(&a, &x, &data, c)?;
        assert_sums(&b, &y, &data, c)?;
        Ok(())
    });
}

/// The steady SyncBatchNorm step of issue 16 (forward + backward, two ranks as threads, the
/// allocating API, every temporary dropped each step): per rank and step no synchronise of any
/// kind, no `aclrtMalloc` / `aclrtFree`, no blocking copy and no pinned allocation once warm;
/// reserved memory within 1.5x the peak; and the last step's output equals the CPU backend's
/// (to f32 accuracy), so the reused memory held the right values.
#[test]
fn steady_sync_batch_norm_step_waits_for_nothing_and_allocates_nothing() {
    let _g = lock();
    let before = stats();
    let shape = [4usize, 64, 8, 8]; // the shape
    let c = shape[1];
    let n: usize = shape.iter().product();
    let run = |ctxs: &[Context], counted: bool| -> Result<Vec<Vec<f32>>> {
        let comms = Communicator::init_all(ctxs)?;
        let snaps = Mutex::new(Vec::new());
        let barrier = std::sync::Barrier::new(comms.len());
        on_ranks(comms, ctxs, |rank, comm, ctx| -> Result<Vec<f32>> {
            let r = u64::from(rank);
            let s = ctx.new_stream()?;
            let x = Tensor::from_slice(&s, &rng(20 + r, n), &shape)?;
            let dy = Tensor::from_slice(&s, &rng(30 + r, n), &shape)?;
            let w = Tensor::from_slice(&s, &rng(40, c), &[c])?;
            let b = Tensor::from_slice(&s, &rng(41, c), &[c])?;
            let step = || -> Result<Tensor> {
                let (y, saved) = sync_batch_norm::forward(comm, &s, &x, Some(&w), Some(&b), None, None, 0.1, 1e-5)?;
                let (gx, _, _) = sync_batch_norm::backward(comm, &s, &dy, &saved, Some(&w), OutputMask::ALL)?;
                drop((saved, gx));
                Ok(y)
            };
            // Warm-up in the loop's own shape: each step's output lives until the next
            // step has been queued.
            let mut y = step()?;
            for _ in 0..2 {
                y = step()?;
            }
            s.synchronize()?;
            barrier.wait();
            if counted && r == 0 {
                snaps.lock().unwrap().push(stats());
            }
            barrier.wait();
            for _ in 0..4 {
                y = step()?;
            }
            barrier.wait();
            if counted && r == 0 {
                snaps.lock().unwrap().push(stats());
            }
            barrier.wait();
            y.to_vec::<f32>(&s)
        })
        .into_iter()
        .collect::<Result<Vec<_>>>()
        .inspect(|_| {
            if counted {
                let snaps = snaps.into_inner().unwrap();
                let (a, b) = (&snaps[0], &snaps[1]);
                let d = |f: fn(&MockStats) -> u64| f(b) - f(a);
                let raised: Vec<_> = HOST_WAITS_AND_ALLOCATIONS.iter().map(|&(name, f)| (name, d(f))).collect();
                assert!(raised.iter().all(|&(_, n)| n == 0), "a steady step waits or allocates: {raised:?}");
                // Four steps of two ranks: one all-gather and one all-reduce per rank and step.
                assert_eq!((d(|s| s.all_gathers), d(|s| s.all_reduces), d(|s| s.broadcasts)), (8, 8, 0));
                for ctx in ctxs {
                    let m = ctx.memory_stats();
                    assert!(m.reserved as f64 <= 1.5 * m.peak_allocated as f64, "reserved within 1.5x the peak: {m:?}");
                }
            }
        })
    };
    let mock: Vec<Context> = (0..2).map(ascend::mock::context).collect::<Result<_>>().expect("two mock devices");
    let on_mock = run(&mock, true).expect("mock ranks");
    let on_cpu = run(&[Context::cpu(), Context::cpu()], false).expect("cpu ranks");
    for (m, c) in on_mock.iter().zip(&on_cpu) {
        for (a, b) in m.iter().zip(c) {
            assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "mock {a} vs cpu {b}");
        }
    }
    drop(mock);
    let after = stats();
    assert_eq!(after.violations, before.violations, "{:?}", violations_since(before.violations));
    assert_eq!(after.live_allocations, before.live_allocations);
}
