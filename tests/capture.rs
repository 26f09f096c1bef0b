//! Graph capture ([`Stream::capture`], [`Graph::replay`]) on the mock: a captured SyncBatchNorm
//! step (forward and backward, two ranks) replayed N times equals N eager steps bit for bit,
//! inputs refreshed by copying into the captured tensors and the running statistics updated in
//! place by every replay; the graph keeps what it uses whatever is dropped first; every call
//! CANN forbids inside a capture is an error naming it; a stream ordered after another that a
//! second thread keeps capturing never joins a capture, and that thread's drops and reads of what
//! the stream used record or synchronise nothing into it; work queued before a capture (which the
//! mock, like CANN, does not wait for at `aclmdlRICaptureBegin`) comes before the graph's first
//! replay on another stream and before the graph's blocks are reused.
#![cfg(feature = "mock")]

mod common;
#[path = "common/sync_bn_step.rs"]
mod sync_bn_step;

use ascend::hccl::Communicator;
use ascend::{CaptureMode, Context, DType, Graph, Result, Stream, Tensor};
use common::{on_ranks, Data, Rng};
use sync_bn_step::{Step, EPS};

const SHAPE: [usize; 3] = [3, 4, 5];

/// Serialises the tests (they compare the mock's process-wide counters).
fn setup() -> std::sync::MutexGuard<'static, ()> {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var("ASCEND_MOCK_DEVICE_COUNT", "2"));
    static MOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    MOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A rank's step on random data.
fn new_step(s: &Stream, rng: &mut Rng) -> Step {
    let mut t = |shape: &[usize], lo: f64, hi: f64| Data::uniform(rng, DType::F32, shape, lo, hi).tensor(s).unwrap();
    let c = &SHAPE[1..2];
    Step {
        x: t(&SHAPE, -2.0, 2.0),
        dy: t(&SHAPE, -1.0, 1.0),
        w: t(c, 0.5, 1.5),
        b: t(c, -1.0, 1.0),
        rm: t(c, -0.5, 0.5),
        rv: t(c, 0.5, 2.0),
    }
}

/// Copies of a step's six tensors (same values, new tensors).
fn twin(step: &Step, s: &Stream) -> Step {
    let copy = |t: &Tensor| Tensor::from_slice(s, &t.to_vec::<f32>(s).unwrap(), t.shape()).unwrap();
    Step {
        x: copy(&step.x),
        dy: copy(&step.dy),
        w: copy(&step.w),
        b: copy(&step.b),
        rm: copy(&step.rm),
        rv: copy(&step.rv),
    }
}
fn bits(s: &Stream, t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>(s).unwrap().into_iter().map(f32::to_bits).collect()
}

fn contexts() -> Vec<Context> {
    (0..2).map(|d| ascend::mock::context(d).unwrap()).collect()
}

/// N replays of a captured two-rank SyncBatchNorm step equal N eager steps bit for bit: fresh
/// inputs copied into the captured tensors before each replay, running statistics updated in
/// place by each.
#[test]
fn replayed_sync_batch_norm_steps_equal_eager_steps_bit_for_bit() {
    let _mock = setup();
    let before = ascend::mock::stats();
    let ctxs = contexts();
    let comms = Communicator::init_all(&ctxs).unwrap();
    on_ranks(comms, &ctxs, |rank, comm, ctx| {
        let s = ctx.new_stream().unwrap();
        let mut rng = Rng::new(0xC0FFEE + u64::from(rank));
        let mut eager = new_step(&s, &mut rng);
        let mut graph_step = twin(&eager, &s);
        // Warm-up (the allocator then holds the blocks the capture uses), on scratch copies.
        let mut warm = twin(&eager, &s);
        drop(warm.run(comm, &s).unwrap());
        let mut outputs = None;
        // Thread-local: in global mode CANN refuses the other rank's blocking copies while this
        // rank captures.
        let graph: Graph = s
            .capture(CaptureMode::ThreadLocal, |s| {
                outputs = Some(graph_step.run(comm, s)?);
                Ok(())
            })
            .unwrap();
        let outputs = outputs.unwrap();
        for step in 0..4 {
            let x: Vec<f32> = (0..SHAPE.iter().product()).map(|_| rng.uniform(-2.0, 2.0) as f32).collect();
            let dy: Vec<f32> = (0..SHAPE.iter().product()).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
            eager.x.copy_from_slice(&s, &x).unwrap();
            eager.dy.copy_from_slice(&s, &dy).unwrap();
            let want = eager.run(comm, &s).unwrap();
            graph_step.x.copy_from_slice(&s, &x).unwrap();
            graph_step.dy.copy_from_slice(&s, &dy).unwrap();
            let replays = ascend::mock::capture_stats().replays;
            graph.replay(&s).unwrap();
            assert!(ascend::mock::capture_stats().replays > replays);
            for (i, (w, g)) in want.iter().zip(&outputs).enumerate() {
                assert_eq!(bits(&s, w), bits(&s, g), "rank {rank} step {step} output {i}");
            }
            assert_eq!(bits(&s, &eager.rm), bits(&s, &graph_step.rm), "rank {rank} step {step} running mean");
            assert_eq!(bits(&s, &eager.rv), bits(&s, &graph_step.rv), "rank {rank} step {step} running var");
        }
        drop(graph);
    });
    drop(ctxs);
    let after = ascend::mock::stats();
    assert_eq!(after.violations, before.violations, "{:?}", ascend::mock::violations_since(before.violations));
    assert_eq!((after.live_comms, after.live_allocations), (before.live_comms, before.live_allocations));
    assert_eq!(ascend::mock::capture_stats().live_models, 0);
}

/// `Err` with `status`, naming `call` in the error.
#[track_caller]
fn refused<T: std::fmt::Debug>(r: Result<T>, status: i32, call: &str) {
    let e = r.expect_err("refused inside a capture");
    assert_eq!(e.status(), Some(status), "{e}");
    assert!(e.to_string().contains(call), "`{call}` not named in: {e}");
}

fn input(s: &Stream, rng: &mut Rng) -> Tensor {
    Data::uniform(rng, DType::F32, &SHAPE, -2.0, 2.0).tensor(s).unwrap()
}

/// Every call CANN forbids during a capture is an error naming it, made before CANN is reached
/// (the mock counts no violation); the capture still ends and its graph replays; the calls work
/// again after it. A relaxed capture allows the blocking memory calls CANN allows.
#[test]
fn forbidden_calls_inside_a_capture_are_errors() {
    let _mock = setup();
    let before = ascend::mock::stats();
    let ctx = ascend::mock::context(0).unwrap();
    let s = ctx.new_stream().unwrap();
    let other = ctx.new_stream().unwrap();
    let mut rng = Rng::new(7);
    let mut x = input(&s, &mut rng);
    let on_other = input(&other, &mut rng);
    let big: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let host = ascend::HostBuffer::<f32>::new(&ctx, SHAPE.iter().product()).unwrap();
    let mut other_out = [0, 1].map(|_| Tensor::zeros(&other, DType::F32, &SHAPE[1..2]).unwrap());
    {
        // Work queued on `other` that the capture would have to wait for.
        let [m, v] = &mut other_out;
        ascend::ops::batch_norm_stats_into(&other, &on_other, EPS, m, v).unwrap();
    }
    drop(ascend::ops::batch_norm_stats(&s, &x, EPS).unwrap()); // warm-up
    let mut stats = None;
    let graph = s
        .capture(CaptureMode::Global, |s| {
            stats = Some(ascend::ops::batch_norm_stats(s, &x, EPS)?);
            refused(x.to_vec::<f32>(s), 107041, "aclrtSynchronizeStream");
            refused(s.synchronize(), 107041, "aclrtSynchronizeStream");
            refused(x.copy_from_slice(s, &big[..x.numel()]), 107041, "aclrtSynchronizeStream");
            refused(Tensor::from_slice(s, &big, &[4096]), 107041, "aclrt");
            refused(Tensor::zeros(s, DType::F32, &[1 << 20]), 107041, "aclrtMalloc");
            refused(s.record_event(), 107024, "aclrtRecordEvent");
            let e = other.record_event().unwrap();
            refused(s.wait_event(&e), 107024, "aclrtStreamWaitEvent");
            refused(e.synchronize(), 107041, "aclrtSynchronizeEvent");
            let [m, v] = &mut other_out;
            refused(ascend::ops::batch_norm_stats_into(s, &on_other, EPS, m, v), 107024, "aclrtStreamWaitEvent");
            let mut d = Tensor::zeros(s, DType::F32, &SHAPE);
            if let Ok(d) = &mut d {
                refused(d.copy_from_host_async(s, &host), 107024, "HostBuffer");
            }
            assert!(s.capture(CaptureMode::Global, |_| Ok(())).is_err(), "a nested capture");
            Ok(())
        })
        .unwrap();
    let (mean, _) = stats.unwrap();
    graph.replay(&s).unwrap();
    let want = ascend::ops::batch_norm_stats(&s, &x, EPS).unwrap().0;
    assert_eq!(bits(&s, &mean), bits(&s, &want));
    // After the capture every call works again.
    s.synchronize().unwrap();
    x.copy_from_slice(&s, &big[..x.numel()]).unwrap();
    drop((graph, mean, want, x, on_other, other_out, host, s, other, ctx));
    let after = ascend::mock::stats();
    assert_eq!(after.violations, before.violations, "{:?}", ascend::mock::violations_since(before.violations));
    assert_eq!(after.live_allocations, before.live_allocations);
}

/// A relaxed capture allows the blocking memory calls CANN allows (an upload of a new tensor),
/// never a synchronisation.
#[test]
fn a_relaxed_capture_allows_blocking_copies_but_not_synchronisation() {
    let _mock = setup();
    let ctx = ascend::mock::context(0).unwrap();
    let s = ctx.new_stream().unwrap();
    let big: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let graph = s
        .capture(CaptureMode::Relaxed, |s| {
            let t = Tensor::from_slice(s, &big, &[4096])?;
            refused(s.synchronize(), 107041, "aclrtSynchronizeStream");
            drop(t);
            Ok(())
        })
        .unwrap();
    graph.replay(&s).unwrap();
}

/// The graph keeps what its work uses: inputs, outputs, the stream, the context and the
/// communicators may be dropped in any order before or after it; no violation, nothing leaked.
#[test]
fn dropping_inputs_stream_or_context_in_any_order_is_safe() {
    let _mock = setup();
    let before = ascend::mock::stats();
    let leaks = ascend::mock::leaks();
    for order in 0..6 {
        let ctx = ascend::mock::context(0).unwrap();
        let s = ctx.new_stream().unwrap();
        let mut rng = Rng::new(11 + order);
        let x = input(&s, &mut rng);
        drop(ascend::ops::batch_norm_stats(&s, &x, EPS).unwrap());
        let mut out = None;
        let graph = s.capture(CaptureMode::Global, |s| {
            out = Some(ascend::ops::batch_norm_stats(s, &x, EPS)?);
            Ok(())
        });
        let graph = graph.unwrap();
        let (mean, invstd) = out.unwrap();
        let want = mean.to_vec::<f32>(&s).unwrap();
        let _ = want;
        let replay_on = ctx.new_stream().unwrap();
        graph.replay(&replay_on).unwrap();
        // The replay on another stream is ordered before a read on the first.
        let expect = ascend::ops::batch_norm_stats(&s, &x, EPS).unwrap().0.to_vec::<f32>(&s).unwrap();
        match order {
            0 => {
                drop((x, mean, invstd));
                graph.replay(&replay_on).unwrap();
                drop((s, ctx));
                drop(graph);
            }
            1 => {
                drop((s, ctx));
                graph.replay(&replay_on).unwrap();
                assert_eq!(mean.to_vec::<f32>(&replay_on).unwrap(), expect);
                drop((x, graph, mean, invstd));
            }
            2 => {
                drop(graph);
                drop((x, mean, invstd, s, ctx));
            }
            3 => {
                drop(x);
                assert_eq!(mean.to_vec::<f32>(&s).unwrap(), expect);
                drop((graph, s, ctx, mean, invstd));
            }
            4 => {
                drop((ctx, s));
                drop((mean, invstd));
                graph.replay(&replay_on).unwrap();
                drop((graph, x));
            }
            _ => {
                drop((replay_on, mean, s));
                drop((graph, ctx, invstd, x));
                continue;
            }
        }
        drop(replay_on);
    }
    let after = ascend::mock::stats();
    assert_eq!(after.violations, before.violations, "{:?}", ascend::mock::violations_since(before.violations));
    assert_eq!((after.live_allocations, after.live_streams), (before.live_allocations, before.live_streams));
    assert_eq!(ascend::mock::leaks(), leaks);
    assert_eq!(ascend::mock::capture_stats().live_models, 0);
}

/// A panic inside the closure ends the capture (its model destroyed): the stream and the
/// process are usable afterwards.
#[test]
fn a_panic_inside_the_capture_ends_it() {
    let _mock = setup();
    let models = ascend::mock::capture_stats().live_models;
    let ctx = ascend::mock::context(0).unwrap();
    let s = ctx.new_stream().unwrap();
    let x = input(&s, &mut Rng::new(5));
    drop(ascend::ops::batch_norm_stats(&s, &x, EPS).unwrap());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = s.capture(CaptureMode::Global, |s| {
            drop(ascend::ops::batch_norm_stats(s, &x, EPS)?);
            panic!("inside the capture");
        });
    }));
    assert!(r.is_err());
    assert_eq!(ascend::mock::capture_stats().live_models, models);
    assert_eq!(x.to_vec::<f32>(&s).unwrap().len(), x.numel());
    let mut y = Tensor::zeros(&s, DType::F32, &SHAPE).unwrap();
    y.copy_from_slice(&s, &vec![1f32; y.numel()]).unwrap();
}

/// Replays on alternating streams, and eager work on a third stream reading the captured
/// outputs, are ordered on the device (the mock counts a violation for any unordered access):
/// every read sees the replay's values.
#[test]
fn replays_on_other_streams_are_ordered_with_eager_work() {
    let _mock = setup();
    let before = ascend::mock::stats();
    let ctx = ascend::mock::context(0).unwrap();
    let (s, a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let mut rng = Rng::new(21);
    let mut x = input(&s, &mut rng);
    drop(ascend::ops::batch_norm_stats(&s, &x, EPS).unwrap());
    let (graph, (mean, invstd)) = capture_stats(&s, &x).unwrap();
    for step in 0..4 {
        let data: Vec<f32> = (0..x.numel()).map(|_| rng.uniform(-2.0, 2.0) as f32).collect();
        x.copy_from_slice(&s, &data).unwrap();
        graph.replay(if step % 2 == 0 { &a } else { &b }).unwrap();
        // Eager work on another stream reading the replay's outputs.
        let y = ascend::ops::batch_norm_elemt(&b, &x, None, None, &mean, &invstd, EPS).unwrap();
        let (m, v) = ascend::ops::batch_norm_stats(&s, &x, EPS).unwrap();
        let want = ascend::ops::batch_norm_elemt(&s, &x, None, None, &m, &v, EPS).unwrap();
        assert_eq!(bits(&a, &mean), bits(&s, &m), "step {step}");
        assert_eq!(bits(&b, &y), bits(&s, &want), "step {step}");
    }
    drop((graph, mean, invstd, x, s, a, b, ctx));
    let after = ascend::mock::stats();
    assert_eq!(after.violations, before.violations, "{:?}", ascend::mock::violations_since(before.violations));
}

/// The safe API never joins a second stream into a capture (CANN's capture across streams, where
/// an event recorded on the captured stream pulls a stream that waits for it into the model, is
/// not exposed): every way to order the captured stream with another one inside the closure, an
/// explicit event or the crate's own ordering of a buffer last used by another stream, is an
/// error naming the call (ACL_ERROR_RT_CAPTURE_DEPENDENCY) made before CANN is reached, as is
/// eager work on another stream that the crate would order after the captured stream (a read of
/// what the capture writes). The mock joins no stream, counts no violation, and the capture still
/// ends and replays.
#[test]
fn the_safe_api_never_joins_another_stream_into_a_capture() {
    let _mock = setup();
    let before = ascend::mock::stats();
    let joined = ascend::mock::capture_stats().joined_streams;
    let ctx = ascend::mock::context(0).unwrap();
    let (s, other) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let mut rng = Rng::new(33);
    let x = input(&s, &mut rng);
    let on_other = input(&other, &mut rng);
    let mut written_by_other = [0, 1].map(|_| Tensor::zeros(&other, DType::F32, &SHAPE[1..2]).unwrap());
    {
        let [m, v] = &mut written_by_other;
        ascend::ops::batch_norm_stats_into(&other, &on_other, EPS, m, v).unwrap();
    }
    let mut outs_on_s = [0, 1].map(|_| Tensor::zeros(&s, DType::F32, &SHAPE[1..2]).unwrap());
    let mut y_on_other = Tensor::zeros(&other, DType::F32, &SHAPE).unwrap();
    drop(ascend::ops::batch_norm_stats(&s, &x, EPS).unwrap()); // warm-up
    let mut captured = None;
    let graph = s
        .capture(CaptureMode::ThreadLocal, |s| {
            let (mean, invstd) = ascend::ops::batch_norm_stats(s, &x, EPS)?;
            // An event recorded on the captured stream (a fork), and one waited for (a join).
            refused(s.record_event(), 107024, "aclrtRecordEvent");
            let e = other.record_event()?;
            refused(s.wait_event(&e), 107024, "aclrtStreamWaitEvent");
            // Captured work on buffers another stream last wrote: the crate would wait for it.
            let [m, v] = &mut written_by_other;
            refused(ascend::ops::batch_norm_stats_into(s, &x, EPS, m, v), 107024, "aclrtStreamWaitEvent");
            let [m, v] = &mut outs_on_s;
            refused(ascend::ops::batch_norm_stats_into(s, &on_other, EPS, m, v), 107024, "aclrtStreamWaitEvent");
            // Eager work on another stream reading what the capture writes: the crate would
            // order it after the captured stream (an event recorded into the capture).
            refused(
                ascend::ops::batch_norm_elemt_into(&other, &x, None, None, &mean, &invstd, EPS, &mut y_on_other),
                107024,
                "aclrtRecordEvent",
            );
            captured = Some((mean, invstd));
            Ok(())
        })
        .unwrap();
    assert_eq!(ascend::mock::capture_stats().joined_streams, joined, "no stream joined the capture");
    let (mean, invstd) = captured.unwrap();
    graph.replay(&s).unwrap();
    let want = ascend::ops::batch_norm_stats(&s, &x, EPS).unwrap().0;
    assert_eq!(bits(&s, &mean), bits(&s, &want));
    drop((graph, mean, invstd, want, x, on_other, written_by_other, outs_on_s, y_on_other));
    drop((s, other, ctx));
    let after = ascend::mock::stats();
    assert_eq!(after.violations, before.violations, "{:?}", ascend::mock::violations_since(before.violations));
    assert_eq!(after.live_allocations, before.live_allocations);
    assert_eq!(ascend::mock::capture_stats().joined_streams, joined);
}

/// `Context::empty_cache` inside a capture is an error naming it, whether the cache is empty or
/// holds blocks (it would wait and free); nothing is freed; it works again after the capture.
#[test]
fn empty_cache_inside_a_capture_is_refused_even_with_nothing_cached() {
    let _mock = setup();
    let before = ascend::mock::stats();
    let ctx = ascend::mock::context(0).unwrap();
    let s = ctx.new_stream().unwrap();
    let x = input(&s, &mut Rng::new(41));
    s.synchronize().unwrap();
    ctx.empty_cache().unwrap();
    let empty = ctx.memory_stats().reserved;
    for cached in [false, true] {
        if cached {
            drop(ascend::ops::batch_norm_stats(&s, &x, EPS).unwrap());
        } else {
            s.synchronize().unwrap();
            ctx.empty_cache().unwrap();
        }
        let reserved = ctx.memory_stats().reserved;
        assert_eq!(reserved > empty, cached, "blocks cached: {cached}");
        let graph = s
            .capture(CaptureMode::Relaxed, |_| {
                refused(ctx.empty_cache(), 107041, "Context::empty_cache");
                Ok(())
            })
            .unwrap();
        assert_eq!(ctx.memory_stats().reserved, reserved, "nothing freed");
        drop(graph);
        s.synchronize().unwrap();
        ctx.empty_cache().unwrap();
    }
    drop((x, s, ctx));
    let after = ascend::mock::stats();
    assert_eq!(after.violations, before.violations, "{:?}", ascend::mock::violations_since(before.violations));
}

/// Rounds of a capture race test: `default`, or `CAPTURE_RACE_ROUNDS` (`.ci/run` lowers it under
/// valgrind, where every round is ~50x slower and threads take turns anyway).
fn race_rounds(default: usize) -> usize {
    common::env_or("CAPTURE_RACE_ROUNDS", default).max(1)
}

/// A context on mock device 0, two streams and an input `x` on the first, whose statistics that
/// stream has computed 16 times and drained (the caching allocator then holds blocks for a capture
/// of them while eager work holds others).
fn warmed_streams(seed: u64) -> (Context, Stream, Stream, Tensor) {
    let ctx = ascend::mock::context(0).unwrap();
    let (a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let x = input(&a, &mut Rng::new(seed));
    let warm: Vec<_> = (0..16).map(|_| ascend::ops::batch_norm_stats(&a, &x, EPS).unwrap()).collect();
    drop(warm);
    a.synchronize().unwrap();
    (ctx, a, b, x)
}

/// A graph of the statistics of `x` captured on `s` (thread-local), and its outputs.
fn capture_stats(s: &Stream, x: &Tensor) -> Result<(Graph, (Tensor, Tensor))> {
    let mut out = None;
    let graph = s.capture(CaptureMode::ThreadLocal, |s| {
        out = Some(ascend::ops::batch_norm_stats(s, x, EPS)?);
        Ok(())
    })?;
    Ok((graph, out.expect("a capture that succeeded ran its closure")))
}

/// Captures the statistics of `x` on `a` into a graph; every 50th round replays it and checks its
/// output against the eager statistics bit for bit. The capture's error, if it failed.
fn capture_round(a: &Stream, x: &Tensor, round: usize) -> Result<()> {
    let (graph, (mean, _)) = capture_stats(a, x)?;
    if round.is_multiple_of(50) {
        graph.replay(a).unwrap();
        let want = ascend::ops::batch_norm_stats(a, x, EPS).unwrap().0;
        assert_eq!(bits(a, &mean), bits(a, &want), "round {round}");
    }
    Ok(())
}

/// Fails with the mock's violations since `before` (its counters), if any.
fn assert_no_violation_since(before: ascend::mock::MockStats) {
    let after = ascend::mock::stats();
    assert_eq!(after.violations, before.violations, "{:?}", ascend::mock::violations_since(before.violations));
}

/// Runs `f` until it is not refused for joining a stream being captured (the refusal changes
/// nothing: `f` is called again, once the other thread's capture has ended).
fn unless_capturing<T>(mut f: impl FnMut() -> Result<T>) -> Result<T> {
    loop {
        match f() {
            Err(e) if e.status() == Some(107024) && e.to_string().contains("aclrtRecordEvent") => {
                std::thread::yield_now();
            }
            r => return r,
        }
    }
}

/// One thread captures on stream `a` again and again (eager work on `a` in between) while another
/// orders stream `b` after `a`: it copies on `b` from a pinned buffer `a` has just filled, and
/// uses on `b` the statistics `a` has just computed. The event recorded on `a` for `b` to wait
/// for never lands in a capture begun meanwhile (which would join `b` to it: the capture's end
/// refused, and `b`'s later work captured, not run): every capture ends and replays right, every
/// copy on `b` holds the statistics, and every result computed on `b` is `(z - mean) * invstd`
/// against an f64 reference. (Ordering is refused while `a` is being captured; the reader then
/// tries again.)
#[test]
fn ordering_after_a_stream_that_another_thread_begins_capturing_never_joins_the_capture() {
    let rounds = race_rounds(10_000);
    let _mock = setup();
    let before = ascend::mock::stats();
    let joined = ascend::mock::capture_stats().joined_streams;
    let (ctx, a, b, x) = warmed_streams(61);
    let c = SHAPE[1];
    type Sent = (Tensor, Tensor, ascend::HostBuffer<f32>);
    let (tx, rx) = std::sync::mpsc::sync_channel::<Sent>(4);
    let (captures, checked) = std::thread::scope(|scope| {
        let reader = scope.spawn(move || {
            let mut rng = Rng::new(62);
            let mut checked = 0;
            for (mean, invstd, host) in rx {
                let fail = |what: &str, e: ascend::Error| format!("round {checked}: {what}: {e}");
                // Ordered after `a` (the host buffer's last user): no lock held by the caller.
                let mut copied = Tensor::zeros(&b, DType::F32, &[c]).map_err(|e| fail("zeros", e))?;
                unless_capturing(|| copied.copy_from_host_async(&b, &host)).map_err(|e| fail("copy on b", e))?;
                // Ordered after `a` (the statistics' last writer): under `a`'s enqueue lock.
                let z = input(&b, &mut rng);
                let y = unless_capturing(|| ascend::ops::batch_norm_elemt(&b, &z, None, None, &mean, &invstd, EPS))
                    .map_err(|e| fail("batch_norm_elemt on b", e))?;
                let read = |t: &Tensor| t.to_vec::<f32>(&b).map_err(|e| fail("a read on b", e));
                let (m, v, z, y, copied) = (read(&mean)?, read(&invstd)?, read(&z)?, read(&y)?, read(&copied)?);
                if copied != m || host.as_slice() != m {
                    return Err(format!(
                        "round {checked}: copied {copied:?} and host {:?}, want {m:?}",
                        host.as_slice()
                    ));
                }
                let inner = SHAPE[2];
                for (i, (&zi, &yi)) in z.iter().zip(&y).enumerate() {
                    let ch = (i / inner) % c;
                    let want = (f64::from(zi) - f64::from(m[ch])) * f64::from(v[ch]);
                    if (f64::from(yi) - want).abs() > 1e-5 * (1.0 + want.abs()) {
                        return Err(format!("round {checked}: y[{i}] = {yi}, want {want}"));
                    }
                }
                checked += 1;
            }
            Ok::<usize, String>(checked)
        });
        let mut rng = Rng::new(63);
        let mut captures = 0;
        for round in 0..rounds {
            let xi = input(&a, &mut rng);
            let (mean, invstd) = ascend::ops::batch_norm_stats(&a, &xi, EPS).unwrap();
            drop(xi);
            let mut host = ascend::HostBuffer::<f32>::new(&ctx, c).unwrap();
            mean.copy_to_host_async(&a, &mut host).unwrap();
            if tx.send((mean, invstd, host)).is_err() {
                break; // the reader failed: its error is reported below
            }
            if let Err(e) = capture_round(&a, &x, round) {
                drop(tx);
                let reader = reader.join().unwrap();
                panic!("round {round}: the capture failed: {e} (reader: {reader:?})");
            }
            captures += 1;
        }
        drop(tx);
        (captures, reader.join().unwrap())
    });
    assert_eq!(checked, Ok(rounds));
    assert_eq!(captures, rounds);
    assert_eq!(ascend::mock::capture_stats().joined_streams, joined, "no stream joined a capture");
    drop((x, a, ctx));
    assert_no_violation_since(before);
}

/// Drops, on a second thread, what eager work on stream `a` used while the first thread captures on
/// `a` again and again between that work: tensors (device blocks back to the caching allocator) and
/// a pinned buffer `a` copied into (its block freed later). Each drop records an event on `a` after
/// the work, which the allocator (or the deferred free) queries before the block is used again on
/// another stream; that event never lands in a capture begun meanwhile (it would mark the capture,
/// not the eager work, and look complete while that work is still queued). The mock's device runs
/// nothing unless a stream is drained, so `a`'s eager work stays queued; stream `b` allocates
/// blocks of the same size class every round: a block handed to `b` while `a`'s work on it is
/// queued is a hazard the mock counts. Every capture ends and replays right, no violation, nothing
/// leaked, every block back to the allocator at the end.
#[test]
fn dropping_what_a_stream_used_on_another_thread_while_it_begins_capturing_records_nothing_into_the_capture() {
    let rounds = race_rounds(5_000);
    let _mock = setup();
    let before = ascend::mock::stats();
    let leaks = ascend::mock::leaks();
    let (ctx, a, b, x) = warmed_streams(71);
    let xb = input(&b, &mut Rng::new(73));
    drop(ascend::ops::batch_norm_stats(&b, &xb, EPS).unwrap());
    b.synchronize().unwrap();
    let allocated = ctx.memory_stats().allocated;
    // Queued work runs only when its stream is drained: `a`'s eager work stays in flight.
    let progress = ascend::mock::set_query_progress(false);
    let c = SHAPE[1];
    type Sent = (Vec<Tensor>, ascend::HostBuffer<f32>);
    let (tx, rx) = std::sync::mpsc::sync_channel::<Sent>(4);
    let captures = std::thread::scope(|scope| {
        let dropper = scope.spawn(move || {
            for (tensors, host) in rx {
                // Dropped here, on this thread, in both orders.
                if tensors.len() % 2 == 0 {
                    drop(host);
                    drop(tensors);
                } else {
                    drop(tensors);
                    drop(host);
                }
            }
        });
        let mut rng = Rng::new(72);
        let mut captures = 0;
        for round in 0..rounds {
            let xi = input(&a, &mut rng);
            let (mean, invstd) = ascend::ops::batch_norm_stats(&a, &xi, EPS).unwrap();
            let y = ascend::ops::batch_norm_elemt(&a, &xi, None, None, &mean, &invstd, EPS).unwrap();
            let mut host = ascend::HostBuffer::<f32>::new(&ctx, c).unwrap();
            mean.copy_to_host_async(&a, &mut host).unwrap();
            let tensors = if round % 2 == 0 { vec![xi, mean, invstd, y] } else { vec![y, xi, mean] };
            if tx.send((tensors, host)).is_err() {
                break; // the dropper panicked: reported below
            }
            // Blocks of the same size class for `b`: only those whose work on `a` is known done.
            drop(ascend::ops::batch_norm_stats(&b, &xb, EPS).unwrap());
            if let Err(e) = capture_round(&a, &x, round) {
                drop(tx);
                let _ = dropper.join();
                ascend::mock::set_query_progress(progress);
                panic!("round {round}: the capture failed: {e}");
            }
            if round.is_multiple_of(50) {
                b.synchronize().unwrap();
            }
            captures += 1;
        }
        drop(tx);
        dropper.join().unwrap();
        captures
    });
    ascend::mock::set_query_progress(progress);
    assert_eq!(captures, rounds);
    assert_no_violation_since(before);
    assert_eq!(ascend::mock::leaks(), leaks, "nothing leaked");
    // (Eager work again: the stream's workspace, which each capture took with it, is back.)
    drop(ascend::ops::batch_norm_stats(&a, &x, EPS).unwrap());
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    assert_eq!(ctx.memory_stats().allocated, allocated, "every dropped block back to the allocator");
    drop((x, xb, a, b, ctx));
    assert_no_violation_since(before);
}

/// Reads, on a second thread and its own stream, tensors that eager work on stream `a` has just
/// written while the first thread captures on `a` again and again between that work: each read
/// synchronises `a` first (the tensor's last user). The synchronise is made before a capture begins
/// or refused (107041, by this crate, before CANN is reached: the reader then tries again), never
/// issued while `a` is being captured, which CANN forbids: every capture ends, every value read is
/// the per-channel mean of its input against an f64 reference, and the mock counts no violation.
#[test]
fn reading_on_another_thread_what_a_stream_wrote_while_it_begins_capturing_never_synchronises_the_capture() {
    let rounds = race_rounds(5_000);
    let _mock = setup();
    let before = ascend::mock::stats();
    let (ctx, a, b, x) = warmed_streams(81);
    let (c, inner) = (SHAPE[1], SHAPE[2]);
    let (tx, rx) = std::sync::mpsc::sync_channel::<(Vec<f32>, Tensor)>(4);
    let (captures, checked) = std::thread::scope(|scope| {
        let reader = scope.spawn(move || {
            let mut checked = 0;
            for (xi, mean) in rx {
                let got = loop {
                    match mean.to_vec::<f32>(&b) {
                        Err(e)
                            if e.status() == Some(107041)
                                && e.to_string().contains("refused by this crate: the stream is being captured") =>
                        {
                            std::thread::yield_now();
                        }
                        r => break r.map_err(|e| format!("round {checked}: reading the mean: {e}"))?,
                    }
                };
                for (ch, &g) in got.iter().enumerate() {
                    let values = xi.chunks(inner).skip(ch).step_by(c).flatten();
                    let want = values.map(|&v| f64::from(v)).sum::<f64>() / (xi.len() / c) as f64;
                    if (f64::from(g) - want).abs() > 1e-5 * (1.0 + want.abs()) {
                        return Err(format!("round {checked}: mean[{ch}] = {g}, want {want}"));
                    }
                }
                checked += 1;
            }
            Ok::<usize, String>(checked)
        });
        let mut rng = Rng::new(82);
        let mut captures = 0;
        for round in 0..rounds {
            let data = Data::uniform(&mut rng, DType::F32, &SHAPE, -2.0, 2.0);
            let xi = data.tensor(&a).unwrap();
            let (mean, _) = ascend::ops::batch_norm_stats(&a, &xi, EPS).unwrap();
            if tx.send((xi.to_vec::<f32>(&a).unwrap(), mean)).is_err() {
                break; // the reader failed: its error is reported below
            }
            if let Err(e) = capture_round(&a, &x, round) {
                drop(tx);
                let reader = reader.join().unwrap();
                panic!("round {round}: the capture failed: {e} (reader: {reader:?})");
            }
            captures += 1;
        }
        drop(tx);
        (captures, reader.join().unwrap())
    });
    assert_eq!(checked, Ok(rounds));
    assert_eq!(captures, rounds);
    drop((x, a, ctx));
    assert_no_violation_since(before);
}

/// The per-channel mean and 1/sqrt(var + eps) of `x` (shape [`SHAPE`]) in f64.
fn stats_reference(x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let (c, inner) = (SHAPE[1], SHAPE[2]);
    let n = (x.len() / c) as f64;
    let channel = |ch: usize| x.chunks(inner).skip(ch).step_by(c).flatten().map(|&v| f64::from(v));
    let mean: Vec<f64> = (0..c).map(|ch| channel(ch).sum::<f64>() / n).collect();
    let invstd = (0..c)
        .map(|ch| {
            let var = channel(ch).map(|v| (v - mean[ch]) * (v - mean[ch])).sum::<f64>() / n;
            1.0 / (var + EPS).sqrt()
        })
        .collect();
    (mean, invstd)
}

/// Fails unless `(mean, invstd)` read on `s` are the statistics of `x` against an f64 reference.
#[track_caller]
fn assert_stats(s: &Stream, x: &[f32], (mean, invstd): &(Tensor, Tensor), what: &str) {
    let (want_mean, want_invstd) = stats_reference(x);
    for (name, t, want) in [("mean", mean, want_mean), ("invstd", invstd, want_invstd)] {
        for (ch, (g, w)) in t.to_vec::<f32>(s).unwrap().into_iter().zip(want).enumerate() {
            assert!((f64::from(g) - w).abs() <= 1e-5 * (1.0 + w.abs()), "{what}: {name}[{ch}] = {g}, want {w}");
        }
    }
}

/// A graph dropped (never replayed) while eager work queued on its stream before the capture has
/// not run yet frees nothing that work still uses: the stream's workspace (which the capture took
/// with it) and a block of the graph's private pool (a tensor that work wrote, dropped inside the
/// capture) go back to the allocator in the stream's order. The mock's device runs nothing unless
/// a stream is drained, so that work stays queued while stream `b` then takes every free block of
/// the same size class and writes it: a block handed to `b` while `a`'s work on it is queued is a
/// hazard the mock counts. No violation, every value right against an f64 reference, nothing
/// leaked, every block back to the allocator.
#[test]
fn dropping_a_graph_frees_its_blocks_after_the_work_queued_before_its_capture() {
    let _mock = setup();
    let before = ascend::mock::stats();
    let leaks = ascend::mock::leaks();
    let (ctx, a, b, x) = warmed_streams(91);
    let xs = x.to_vec::<f32>(&a).unwrap();
    let mut rng = Rng::new(92);
    let xbs: Vec<f32> = (0..x.numel()).map(|_| rng.uniform(-2.0, 2.0) as f32).collect();
    let xb = Tensor::from_slice(&b, &xbs, &SHAPE).unwrap();
    b.synchronize().unwrap();
    let allocated = ctx.memory_stats().allocated;
    let progress = ascend::mock::set_query_progress(false);
    // Queued on `a`, not run: the statistics (in `a`'s workspace) and `y`, written from them.
    let eager = ascend::ops::batch_norm_stats(&a, &x, EPS).unwrap();
    let y = ascend::ops::batch_norm_elemt(&a, &x, None, None, &eager.0, &eager.1, EPS).unwrap();
    let mut out = None;
    let graph = a
        .capture(CaptureMode::ThreadLocal, |a| {
            out = Some(ascend::ops::batch_norm_stats(a, &x, EPS)?);
            drop(y); // used by `a` alone: to the graph's private pool
            Ok(())
        })
        .unwrap();
    drop(graph);
    // Every free block of the size class (and new ones) to `b`, each written there.
    let on_b: Vec<_> = (0..48).map(|_| ascend::ops::batch_norm_stats(&b, &xb, EPS).unwrap()).collect();
    ascend::mock::set_query_progress(progress);
    assert_no_violation_since(before);
    assert_stats(&a, &xs, &eager, "eager on a");
    for (i, stats) in on_b.iter().enumerate() {
        assert_stats(&b, &xbs, stats, &format!("eager on b, {i}"));
    }
    assert_no_violation_since(before);
    drop((on_b, eager, out));
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    assert_eq!(ctx.memory_stats().allocated, allocated, "every block back to the allocator");
    assert_eq!(ascend::mock::leaks(), leaks, "nothing leaked");
    drop((x, xb, a, b, ctx));
    assert_no_violation_since(before);
}

/// A graph's first replay, on another stream than the one captured, is ordered after the eager
/// work queued on the captured stream before the capture (which used the workspace the captured
/// work launches with, and may write the captured tensors): the mock, whose device runs nothing
/// unless a stream is drained, counts no hazard between the replay and that queued work, and the
/// replay's statistics equal the eager ones and an f64 reference.
#[test]
fn a_first_replay_on_another_stream_is_ordered_after_the_work_queued_before_the_capture() {
    let _mock = setup();
    let before = ascend::mock::stats();
    let (ctx, a, b, mut x) = warmed_streams(93);
    let progress = ascend::mock::set_query_progress(false);
    // Queued on `a`, not run: new values into `x`, and their statistics in `a`'s workspace.
    let mut rng = Rng::new(94);
    let xs: Vec<f32> = (0..x.numel()).map(|_| rng.uniform(-2.0, 2.0) as f32).collect();
    x.copy_from_slice(&a, &xs).unwrap();
    let eager = ascend::ops::batch_norm_stats(&a, &x, EPS).unwrap();
    let (graph, out) = capture_stats(&a, &x).unwrap();
    graph.replay(&b).unwrap();
    ascend::mock::set_query_progress(progress);
    assert_no_violation_since(before);
    assert_stats(&b, &xs, &out, "replayed on b");
    assert_stats(&a, &xs, &eager, "eager on a");
    assert_eq!(bits(&b, &out.0), bits(&a, &eager.0));
    drop((graph, out, eager, x, a, b, ctx));
    assert_no_violation_since(before);
}
