//! Graph capture ([`Stream::capture`], [`Graph::replay`]) on the mock: a captured SyncBatchNorm
//! step (forward and backward, two ranks) replayed N times equals N eager steps bit for bit,
//! inputs refreshed by copying into the captured tensors and the running statistics updated in
//! place by every replay; the graph keeps what it uses whatever is dropped first; every call
//! CANN forbids inside a capture is an error naming it.
#![cfg(feature = "mock")]

mod common;

use ascend::hccl::Communicator;
use ascend::ops::OutputMask;
use ascend::{sync_batch_norm, CaptureMode, Context, DType, Graph, Result, Stream, Tensor};
use common::{on_ranks, Data, Rng};

const EPS: f64 = 1e-5;
const MOMENTUM: f64 = 0.1;
const SHAPE: [usize; 3] = [3, 4, 5];

/// Serialises the tests (they compare the mock's process-wide counters).
fn setup() -> std::sync::MutexGuard<'static, ()> {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var("ASCEND_MOCK_DEVICE_COUNT", "2"));
    static MOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    MOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// One rank's tensors of a step.
struct Step {
    x: Tensor,
    dy: Tensor,
    w: Tensor,
    b: Tensor,
    rm: Tensor,
    rv: Tensor,
}

impl Step {
    fn new(s: &Stream, rng: &mut Rng) -> Step {
        let mut t =
            |shape: &[usize], lo: f64, hi: f64| Data::uniform(rng, DType::F32, shape, lo, hi).tensor(s).unwrap();
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

    /// Forward and backward: y, dx, dw, db.
    fn run(&mut self, comm: &Communicator, s: &Stream) -> Result<[Tensor; 4]> {
        let (y, saved) = sync_batch_norm::forward(
            comm,
            s,
            &self.x,
            Some(&self.w),
            Some(&self.b),
            Some(&mut self.rm),
            Some(&mut self.rv),
            MOMENTUM,
            EPS,
        )?;
        let (dx, dw, db) = sync_batch_norm::backward(comm, s, &self.dy, &saved, Some(&self.w), OutputMask::ALL)?;
        let missing = || ascend::Error::Config("a gradient of OutputMask::ALL is missing".into());
        Ok([y, dx.ok_or_else(missing)?, dw.ok_or_else(missing)?, db.ok_or_else(missing)?])
    }

    /// Copies of the six tensors' values (same data, new tensors).
    fn twin(&self, s: &Stream) -> Step {
        let copy = |t: &Tensor| Tensor::from_slice(s, &t.to_vec::<f32>(s).unwrap(), t.shape()).unwrap();
        Step {
            x: copy(&self.x),
            dy: copy(&self.dy),
            w: copy(&self.w),
            b: copy(&self.b),
            rm: copy(&self.rm),
            rv: copy(&self.rv),
        }
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
        let mut eager = Step::new(&s, &mut rng);
        let mut graph_step = eager.twin(&s);
        // Warm-up (the allocator then holds the blocks the capture uses), on scratch copies.
        let mut warm = eager.twin(&s);
        drop(warm.run(comm, &s).unwrap());
        let mut outputs = None;
        let graph: Graph = s
            .capture(CaptureMode::Global, |s| {
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
