//! The launch cache (issue 17) on the mock CANN: a stream keeps the repeatable executors of the
//! signatures it launched and a repeated `_into` or allocating call skips phase 1 and the
//! descriptors, rebinding every tensor to the new call's memory.
//!
//! Every value is checked against an independent f64 reference on random data (written here):
//! * `batch_norm_elemt`: `y = (x − mean[c])·invstd[c]·w[c] + b[c]`, c = dim 1;
//! * `batch_norm_reduce_backward`: `sumDy = Σdy`, `sumDyXmu = Σdy·(x − mean)`,
//!   `gradWeight = sumDyXmu·invstd`, `gradBias = sumDy`;
//! * `batch_norm_stats`: `mean = Σx/n`, `invstd = 1/sqrt(Σ(x − mean)²/n + eps)`.
//!
//! Tolerance: an f32 result may differ from the reference by `1e-5` relative to the size of
//! what it is made of (`|(x − mean)·invstd·w| + |b|` per element, `Σ|term|` per sum, `|ref|`
//! for the statistics), which covers a few f32 roundings per term; an f16 output by `1e-3`
//! relative (its rounding is `2⁻¹¹`).
//!
//! Every test runs in `common::mock::isolated` (serialised; at the end no leaked allocation,
//! descriptor, executor or stream, and no mock violation: a wrong rebind index, a stale or freed
//! address, an executor on two streams at once or one destroyed with a launch queued all are
//! violations). The streams set their capacity themselves, so the tests mean the same with
//! `ASCEND_NO_LAUNCH_CACHE=1` or `ASCEND_LAUNCH_CACHE_SIZE` in the environment (CI runs them
//! both ways), but for the one that checks what a new stream gets from it.
#![cfg(feature = "mock")]

mod common;

use ascend::hccl::Communicator;
use ascend::mock::{launch_counters, LaunchCounters};
use ascend::ops::{
    batch_norm_elemt_into, batch_norm_reduce_backward, batch_norm_reduce_backward_into, batch_norm_stats_into,
    OutputMask, ReduceBackwardOut,
};
use ascend::{sync_batch_norm, Context, DType, LaunchCacheStats, Stream, Tensor};
use common::{read, Data, Rng};

const N: usize = 3;
const C: usize = 4;
const S: usize = 5;
const SHAPE: [usize; 3] = [N, C, S];
const EPS: f64 = 1e-5;
const F32_TOL: f64 = 1e-5;
const F16_TOL: f64 = 1e-3;
/// What an output holds before a call that should write it (no correct result is this).
const SENTINEL: f32 = 12345.0;

fn tol(dtype: DType) -> f64 {
    if dtype == DType::F32 {
        F32_TOL
    } else {
        F16_TOL
    }
}

/// Channel (dim 1) of element `i` (row-major) of a `[n, c, s]` tensor.
fn channel(i: usize, shape: [usize; 3]) -> usize {
    (i / shape[2]) % shape[1]
}

/// Asserts `|got − want| ≤ rel·scale` element by element (and the lengths).
fn assert_close(what: &str, got: &[f64], want: &[f64], scale: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
        let bound = rel * s.max(f64::MIN_POSITIVE);
        assert!((g - w).abs() <= bound, "{what}[{i}]: got {g}, want {w} (bound {bound:e}); got {got:?}");
    }
}

fn counters() -> LaunchCounters {
    launch_counters()
}

/// (descriptors made, phase-1 calls) since `before`.
fn cost(before: LaunchCounters) -> (u64, u64) {
    let now = counters();
    (now.tensors_created - before.tensors_created, now.phase1_calls - before.phase1_calls)
}

fn stats(hits: u64, misses: u64, evictions: u64, entries: usize, capacity: usize) -> LaunchCacheStats {
    LaunchCacheStats { hits, misses, evictions, entries, capacity }
}

/// A stream of `ctx` whose cache keeps `capacity` entries (whatever the environment says).
fn stream(ctx: &Context, capacity: usize) -> Stream {
    let s = ctx.new_stream().expect("stream");
    s.set_launch_cache_capacity(capacity);
    s
}

fn vector(s: &Stream, v: &[f64]) -> Tensor {
    Data::new(DType::F32, v, &[v.len()]).tensor(s).expect("upload")
}

fn sentinel(s: &Stream, dtype: DType, shape: &[usize]) -> Tensor {
    Data::filled(dtype, shape, f64::from(SENTINEL)).tensor(s).expect("upload")
}

// ---------------------------------------------------------------------------------------------
// batch_norm_elemt

/// One elemt call's data: x in any layout and dtype, f32 per-channel vectors.
struct Elemt {
    shape: [usize; 3],
    x: Data,
    w: Vec<f64>,
    b: Vec<f64>,
    mean: Vec<f64>,
    invstd: Vec<f64>,
}

impl Elemt {
    fn new(seed: u64, dtype: DType, shape: [usize; 3]) -> Elemt {
        let mut rng = Rng::new(seed);
        let c = shape[1];
        let x = Data::normal(&mut rng, dtype, &shape, 0.3, 1.2);
        let mut chan =
            |lo: f64, hi: f64| -> Vec<f64> { (0..c).map(|_| f64::from(rng.uniform(lo, hi) as f32)).collect() };
        let (w, b, mean, invstd) = (chan(0.5, 1.5), chan(-1.0, 1.0), chan(-0.5, 0.5), chan(0.5, 2.0));
        Elemt { shape, x, w, b, mean, invstd }
    }

    /// The same values with x laid out channels-last (strides `[C·S, 1, C]`).
    fn channels_last(mut self) -> Elemt {
        self.x = self.x.permuted(&[0, 2, 1]);
        self
    }

    /// The f64 reference and the scale of each element.
    fn reference(&self, with_w: bool, with_b: bool) -> (Vec<f64>, Vec<f64>) {
        let x = self.x.values();
        x.iter()
            .enumerate()
            .map(|(i, &x)| {
                let c = channel(i, self.shape);
                let w = if with_w { self.w[c] } else { 1.0 };
                let b = if with_b { self.b[c] } else { 0.0 };
                let t = (x - self.mean[c]) * self.invstd[c] * w;
                (t + b, t.abs() + b.abs())
            })
            .unzip()
    }

    /// Uploads x, w, b, mean, invstd.
    fn upload(&self, s: &Stream) -> [Tensor; 5] {
        [
            self.x.tensor(s).expect("x"),
            vector(s, &self.w),
            vector(s, &self.b),
            vector(s, &self.mean),
            vector(s, &self.invstd),
        ]
    }

    /// `batch_norm_elemt_into` a fresh output (pre-filled with the sentinel) on `s`, with
    /// weight and bias as asked and `eps`; returns the output.
    fn run_into(&self, s: &Stream, up: &[Tensor; 5], with_w: bool, with_b: bool, eps: f64) -> Tensor {
        let [x, w, b, mean, invstd] = up;
        let mut y = sentinel(s, self.x.dtype, &self.shape);
        batch_norm_elemt_into(s, x, with_w.then_some(w), with_b.then_some(b), mean, invstd, eps, &mut y)
            .expect("batch_norm_elemt_into");
        y
    }

    fn check(&self, what: &str, s: &Stream, y: &Tensor, with_w: bool, with_b: bool) {
        assert_eq!((y.shape(), y.dtype()), (&self.shape[..], self.x.dtype), "{what}: output shape and dtype");
        let (want, scale) = self.reference(with_w, with_b);
        assert_close(what, &read(s, y), &want, &scale, tol(self.x.dtype));
    }
}

/// Four launches of one signature, each with FRESH inputs and outputs (new random values; the
/// previous ones dropped, and a varying number of spacer allocations held, so the allocator
/// reuses some addresses and moves others): each gives the right values, the first is the only
/// miss, and only the miss makes descriptors and runs phase 1. The same for the allocating form
/// of `batch_norm_reduce_backward`, whose outputs are new allocations each time.
fn a_hit_rebinds_every_tensor_to_fresh_memory(ctx: &Context) {
    let s = stream(ctx, 8);
    let mut addresses = Vec::new();
    let mut spacers = Vec::new();
    for i in 0..4u64 {
        // Memory held across this iteration's launches: the next allocations land elsewhere.
        spacers.push(Tensor::zeros(&s, DType::F32, &[(i as usize + 1) * 64]).expect("spacer"));
        let case = Elemt::new(10 + i, DType::F32, SHAPE);
        let up = case.upload(&s);
        let before = counters();
        let y = case.run_into(&s, &up, true, true, EPS);
        let elemt_cost = cost(before);

        let rb = Reduce::new(20 + i, [N, C, S]);
        let [dy, x, mean, invstd] = rb.upload(&s);
        let before = counters();
        let r = batch_norm_reduce_backward(&s, &dy, &x, &mean, &invstd, None, OutputMask::ALL).expect("reduce");
        let reduce_cost = cost(before);

        if i == 0 {
            assert_eq!(elemt_cost, (6, 1), "elemt miss: x, w, b, mean, invstd, y described; one phase 1");
            assert_eq!(reduce_cost, (8, 1), "reduce miss: dy, x, mean, invstd and 4 outputs described; one phase 1");
        } else {
            assert_eq!(elemt_cost, (0, 0), "elemt hit {i}: no descriptor, no phase 1");
            assert_eq!(reduce_cost, (0, 0), "reduce hit {i}: no descriptor, no phase 1");
        }
        addresses.push([up[0].device_ptr(), y.device_ptr(), r.sum_dy.as_ref().and_then(Tensor::device_ptr)]);
        case.check(&format!("elemt iteration {i}"), &s, &y, true, true);
        rb.check(&format!("reduce iteration {i}"), &s, &r.sum_dy, &r.sum_dy_xmu, &r.grad_weight, &r.grad_bias, None);
        if i % 2 == 1 {
            spacers.remove(0);
        }
    }
    assert_eq!(s.launch_cache_stats(), stats(6, 2, 0, 2, 8), "two signatures: 2 misses, 3 hits each");
    for k in 0..3 {
        let distinct: std::collections::HashSet<_> = addresses.iter().map(|a| a[k]).collect();
        assert!(distinct.len() > 1, "argument {k} never moved ({addresses:?}): the test would not see a stale address");
    }
}

// ---------------------------------------------------------------------------------------------
// batch_norm_reduce_backward

/// One reduce_backward call's data (f32).
struct Reduce {
    shape: [usize; 3],
    dy: Data,
    x: Data,
    mean: Vec<f64>,
    invstd: Vec<f64>,
}

impl Reduce {
    fn new(seed: u64, shape: [usize; 3]) -> Reduce {
        let mut rng = Rng::new(seed);
        let c = shape[1];
        let dy = Data::normal(&mut rng, DType::F32, &shape, 0.0, 1.0);
        let x = Data::normal(&mut rng, DType::F32, &shape, 0.5, 1.5);
        let mean = (0..c).map(|_| f64::from(rng.uniform(-0.5, 0.5) as f32)).collect();
        let invstd = (0..c).map(|_| f64::from(rng.uniform(0.5, 2.0) as f32)).collect();
        Reduce { shape, dy, x, mean, invstd }
    }

    fn upload(&self, s: &Stream) -> [Tensor; 4] {
        [self.dy.tensor(s).expect("dy"), self.x.tensor(s).expect("x"), vector(s, &self.mean), vector(s, &self.invstd)]
    }

    /// Per channel: (sumDy, sumDyXmu, gradWeight, gradBias) and their scales (Σ|dy|, Σ|dy·(x−mean)|).
    fn reference(&self) -> ([Vec<f64>; 4], [Vec<f64>; 4]) {
        let (dy, x) = (self.dy.values(), self.x.values());
        let c = self.shape[1];
        let (mut sdy, mut sdx, mut adx, mut ady) = (vec![0.0; c], vec![0.0; c], vec![0.0; c], vec![0.0; c]);
        for i in 0..dy.len() {
            let ch = channel(i, self.shape);
            let t = dy[i] * (x[i] - self.mean[ch]);
            sdy[ch] += dy[i];
            ady[ch] += dy[i].abs();
            sdx[ch] += t;
            adx[ch] += t.abs();
        }
        let gw: Vec<f64> = sdx.iter().zip(&self.invstd).map(|(v, s)| v * s).collect();
        let agw: Vec<f64> = adx.iter().zip(&self.invstd).map(|(v, s)| v * s).collect();
        ([sdy.clone(), sdx, gw, sdy], [ady.clone(), adx, agw, ady])
    }

    /// Checks each output the mask (`None`: all) turned on; an output it turned off must be
    /// `None`, or (if given) still hold the sentinel.
    #[allow(clippy::too_many_arguments)]
    fn check(
        &self,
        what: &str,
        s: &Stream,
        sum_dy: &Option<Tensor>,
        sum_dy_xmu: &Option<Tensor>,
        grad_weight: &Option<Tensor>,
        grad_bias: &Option<Tensor>,
        mask: Option<OutputMask>,
    ) {
        let mask = mask.unwrap_or(OutputMask::ALL);
        let enabled = [mask.input_g, mask.input_g, mask.weight_g, mask.bias_g];
        let (want, scale) = self.reference();
        let names = ["sumDy", "sumDyXmu", "gradWeight", "gradBias"];
        for (k, t) in [sum_dy, sum_dy_xmu, grad_weight, grad_bias].into_iter().enumerate() {
            let what = format!("{what}: {}", names[k]);
            match (enabled[k], t) {
                (true, Some(t)) => assert_close(&what, &read(s, t), &want[k], &scale[k], F32_TOL),
                (true, None) => panic!("{what}: missing"),
                (false, Some(t)) => {
                    assert_eq!(read(s, t), vec![f64::from(SENTINEL); self.shape[1]], "{what}: turned off, written")
                }
                (false, None) => {}
            }
        }
    }
}

const MASKS_OFF: [(bool, bool, bool); 3] = [(false, true, true), (true, false, true), (true, true, false)];

fn mask((input_g, weight_g, bias_g): (bool, bool, bool)) -> OutputMask {
    OutputMask { input_g, weight_g, bias_g }
}

/// Absent optional arguments and outputs turned off are rebound by position among the present
/// ones (the mock flags a wrong index): batch_norm_elemt without weight and bias, with bias only
/// and with weight only; batch_norm_reduce_backward with each mask that turns outputs off, with
/// and without weight; each twice (a miss, then a hit with fresh tensors), values right, the
/// outputs turned off untouched.
fn absent_arguments_are_rebound_by_position(ctx: &Context) {
    let s = stream(ctx, 16);
    let mut expected = stats(0, 0, 0, 0, 16);
    for (k, (with_w, with_b)) in [(false, false), (false, true), (true, false)].into_iter().enumerate() {
        for round in 0..2u64 {
            let case = Elemt::new(100 + 10 * k as u64 + round, DType::F32, SHAPE);
            let up = case.upload(&s);
            let before = counters();
            let y = case.run_into(&s, &up, with_w, with_b, EPS);
            let (made, phase1) = cost(before);
            let what = format!("elemt weight {with_w} bias {with_b} round {round}");
            if round == 0 {
                expected.misses += 1;
                expected.entries += 1;
                assert_eq!((made, phase1), (4 + u64::from(with_w) + u64::from(with_b), 1), "{what}");
            } else {
                expected.hits += 1;
                assert_eq!((made, phase1), (0, 0), "{what}");
            }
            assert_eq!(s.launch_cache_stats(), expected, "{what}");
            case.check(&what, &s, &y, with_w, with_b);
        }
    }
    for (k, m) in MASKS_OFF.into_iter().enumerate() {
        for with_weight in [false, true] {
            for round in 0..2u64 {
                let what = format!("reduce mask {m:?} weight {with_weight} round {round}");
                let case = Reduce::new(200 + 10 * k as u64 + 2 * round + u64::from(with_weight), SHAPE);
                let [dy, x, mean, invstd] = case.upload(&s);
                let w = vector(&s, &[0.75; C]);
                let mut outs: Vec<Tensor> = (0..4).map(|_| sentinel(&s, DType::F32, &[C])).collect();
                let [o0, o1, o2, o3] = &mut outs[..] else { unreachable!() };
                let out = ReduceBackwardOut {
                    sum_dy: Some(o0),
                    sum_dy_xmu: Some(o1),
                    grad_weight: Some(o2),
                    grad_bias: Some(o3),
                };
                let before = counters();
                batch_norm_reduce_backward_into(&s, &dy, &x, &mean, &invstd, with_weight.then_some(&w), mask(m), out)
                    .expect("reduce_backward_into");
                let (made, phase1) = cost(before);
                if round == 0 {
                    expected.misses += 1;
                    expected.entries += 1;
                    assert_eq!(phase1, 1, "{what}");
                    assert!(made > 0, "{what}: a miss describes its tensors");
                } else {
                    expected.hits += 1;
                    assert_eq!((made, phase1), (0, 0), "{what}");
                }
                assert_eq!(s.launch_cache_stats(), expected, "{what}");
                let [o0, o1, o2, o3] = outs.map_into();
                case.check(&what, &s, &o0, &o1, &o2, &o3, Some(mask(m)));
            }
        }
    }
}

/// `[Tensor]` of four into four `Some`s.
trait MapInto {
    fn map_into(self) -> [Option<Tensor>; 4];
}

impl MapInto for Vec<Tensor> {
    fn map_into(self) -> [Option<Tensor>; 4] {
        let mut it = self.into_iter().map(Some);
        [(); 4].map(|()| it.next().expect("four outputs"))
    }
}

/// A different eps, a strided (channels-last) input of the same shape, or another dtype is
/// another entry (a miss), never a wrong hit: each call's values are right, and each signature
/// hits on its second call.
fn scalars_strides_and_dtypes_make_different_entries(ctx: &Context) {
    let s = stream(ctx, 8);
    let variants: [(&str, DType, bool, f64); 4] = [
        ("f32 contiguous eps 1e-5", DType::F32, false, EPS),
        ("f32 contiguous eps 1e-3", DType::F32, false, 1e-3),
        ("f32 channels-last eps 1e-5", DType::F32, true, EPS),
        ("f16 contiguous eps 1e-5", DType::F16, false, EPS),
    ];
    let mut expected = stats(0, 0, 0, 0, 8);
    for round in 0..2u64 {
        for (k, &(what, dtype, channels_last, eps)) in variants.iter().enumerate() {
            let case = Elemt::new(300 + 10 * k as u64 + round, dtype, SHAPE);
            let case = if channels_last { case.channels_last() } else { case };
            let up = case.upload(&s);
            if channels_last {
                assert_eq!(up[0].strides(), &[C * S, 1, C], "{what}: a strided view");
            }
            let y = case.run_into(&s, &up, true, true, eps);
            if round == 0 {
                (expected.misses, expected.entries) = (expected.misses + 1, expected.entries + 1);
            } else {
                expected.hits += 1;
            }
            let what = format!("{what}, round {round}");
            assert_eq!(s.launch_cache_stats(), expected, "{what}");
            case.check(&what, &s, &y, true, true);
        }
    }
    assert_eq!(s.launch_cache_stats(), stats(4, 4, 0, 4, 8));
}

// ---------------------------------------------------------------------------------------------
// batch_norm_stats

/// One batch_norm_stats call's input (f32) of shape `[n, c, S]`.
struct Stats {
    shape: [usize; 3],
    x: Data,
}

impl Stats {
    fn new(seed: u64, c: usize) -> Stats {
        let shape = [N, c, S];
        Stats { shape, x: Data::normal(&mut Rng::new(seed), DType::F32, &shape, 0.5, 2.0) }
    }

    /// (mean, invstd) per channel.
    fn reference(&self, eps: f64) -> (Vec<f64>, Vec<f64>) {
        let x = self.x.values();
        let c = self.shape[1];
        let n = (x.len() / c) as f64;
        let mut mean = vec![0.0; c];
        x.iter().enumerate().for_each(|(i, v)| mean[channel(i, self.shape)] += v / n);
        let mut var = vec![0.0; c];
        x.iter()
            .enumerate()
            .for_each(|(i, v)| var[channel(i, self.shape)] += (v - mean[channel(i, self.shape)]).powi(2) / n);
        (mean, var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect())
    }

    /// `batch_norm_stats_into` fresh outputs (sentinels); returns them.
    fn launch(&self, s: &Stream, x: &Tensor, eps: f64) -> ascend::Result<(Tensor, Tensor)> {
        let c = self.shape[1];
        let (mut mean, mut invstd) = (sentinel(s, DType::F32, &[c]), sentinel(s, DType::F32, &[c]));
        batch_norm_stats_into(s, x, eps, &mut mean, &mut invstd)?;
        Ok((mean, invstd))
    }

    fn check(&self, what: &str, s: &Stream, (mean, invstd): &(Tensor, Tensor), eps: f64) {
        let (m, v) = self.reference(eps);
        let scale = |r: &[f64]| r.iter().map(|v| v.abs().max(1.0)).collect::<Vec<_>>();
        assert_close(&format!("{what}: mean"), &read(s, mean), &m, &scale(&m), F32_TOL);
        assert_close(&format!("{what}: invstd"), &read(s, invstd), &v, &scale(&v), F32_TOL);
    }
}

/// An entry is found by layout, not by tensor: the very tensors of its last launch hit, new
/// tensors of the same layouts hit too, and tensors of another layout (made after the first
/// ones were dropped, so possibly at their addresses) miss; every value is right.
fn tensors_are_matched_by_layout_not_by_identity(ctx: &Context) {
    let s = stream(ctx, 8);
    let (wide, narrow) = (Stats::new(450, C), Stats::new(451, 2));
    let outputs = |c: usize| (sentinel(&s, DType::F32, &[c]), sentinel(&s, DType::F32, &[c]));
    let run = |case: &Stats, x: &Tensor, out: &mut (Tensor, Tensor), what: &str, want: LaunchCacheStats| {
        batch_norm_stats_into(&s, x, EPS, &mut out.0, &mut out.1).expect("stats");
        assert_eq!(s.launch_cache_stats(), want, "{what}");
        case.check(what, &s, out, EPS);
    };
    let x = wide.x.tensor(&s).expect("x");
    let mut out = outputs(C);
    run(&wide, &x, &mut out, "first launch", stats(0, 1, 0, 1, 8));
    run(&wide, &x, &mut out, "the same tensors", stats(1, 1, 0, 1, 8));
    // The same input with outputs of another layout (every other element of a longer storage).
    let strided = || {
        let t = Tensor::from_slice_strided(&s, &[SENTINEL; 2 * C], &[C], &[2], 1).expect("strided");
        (t, Tensor::from_slice_strided(&s, &[SENTINEL; 2 * C], &[C], &[2], 1).expect("strided"))
    };
    let mut strided_out = strided();
    run(&wide, &x, &mut strided_out, "the same input, strided outputs", stats(1, 2, 0, 2, 8));
    drop((x, out, strided_out));
    let x = narrow.x.tensor(&s).expect("x");
    let mut out = outputs(2);
    run(&narrow, &x, &mut out, "another layout", stats(1, 3, 0, 3, 8));
    let x = wide.x.tensor(&s).expect("x");
    let mut out = outputs(C);
    run(&wide, &x, &mut out, "new tensors of the first layout", stats(2, 3, 0, 3, 8));
    run(&wide, &x, &mut out, "those tensors again", stats(3, 3, 0, 3, 8));
}

/// Capacity 2, signatures A B C A launched without synchronising in between: C evicts A and the
/// second A evicts B (2 evictions, 4 misses, 2 entries), C then hits; every value is right and
/// the mock sees no evicted executor destroyed while its launch is still queued (a violation).
/// The evicted executors are destroyed once the stream has drained.
fn lru_evicts_without_destroying_queued_launches(ctx: &Context) {
    let s = stream(ctx, 2);
    let executors = || ascend::mock::stats().live_executors;
    let idle = executors();
    let cases: Vec<Stats> = [2, 3, 5].iter().enumerate().map(|(i, &c)| Stats::new(400 + i as u64, c)).collect();
    let inputs: Vec<Tensor> = cases.iter().map(|c| c.x.tensor(&s).expect("x")).collect();
    let mut results = Vec::new();
    for (step, &k) in [0usize, 1, 2, 0, 2].iter().enumerate() {
        results.push((k, cases[k].launch(&s, &inputs[k], EPS).expect("stats")));
        let want = match step {
            0 => stats(0, 1, 0, 1, 2),
            1 => stats(0, 2, 0, 2, 2),
            2 => stats(0, 3, 1, 2, 2),
            3 => stats(0, 4, 2, 2, 2),
            _ => stats(1, 4, 2, 2, 2),
        };
        assert_eq!(s.launch_cache_stats(), want, "after step {step} (signature {k})");
    }
    assert!(executors() >= idle + 3, "evicted executors with queued launches are kept until they ran");
    s.synchronize().expect("synchronize");
    assert_eq!(executors(), idle + 2, "once the stream drained, only the 2 cached executors are live");
    for (step, (k, r)) in results.iter().enumerate() {
        cases[*k].check(&format!("step {step} (signature {k})"), &s, r, EPS);
    }
}

/// Two streams launching the same signature, interleaved without synchronising: each stream has
/// its own entry (one miss each, then hits), so one executor is never on two streams at once
/// (the mock would flag it), and every value is right.
fn two_streams_keep_their_own_entries(ctx: &Context) {
    let streams = [stream(ctx, 4), stream(ctx, 4)];
    let mut results = Vec::new();
    for round in 0..3u64 {
        for (k, s) in streams.iter().enumerate() {
            let case = Elemt::new(500 + 10 * round + k as u64, DType::F32, SHAPE);
            let up = case.upload(s);
            let y = case.run_into(s, &up, true, true, EPS);
            results.push((k, case, y));
        }
    }
    for s in &streams {
        assert_eq!(s.launch_cache_stats(), stats(2, 1, 0, 1, 4));
    }
    for (i, (k, case, y)) in results.iter().enumerate() {
        case.check(&format!("launch {i} on stream {k}"), &streams[*k], y, true, true);
    }
}

/// Foreign memory (`Tensor::from_raw_device`) at 32-byte aligned addresses is cached and
/// rebound like the crate's own: a view at another tensor's address + 32 bytes misses then hits,
/// and one at + 64 bytes of another allocation (same signature) hits, each with right values.
/// An empty input (N = 0) runs uncached (no miss, no hit; phase 1 each time) and gives zeros.
///
/// (A view whose address is not 32-byte aligned, e.g. + 4 bytes, is not tested: it cannot run
/// at all, cached or not, since the mock, like CANN, refuses it in `aclCreateTensor`, and counts
/// a violation, although `Tensor::from_raw_device` accepts any address aligned to the dtype.)
fn foreign_memory_is_rebound_and_empty_inputs_are_not_cached(ctx: &Context) {
    let s = stream(ctx, 8);
    let case = Elemt::new(600, DType::F32, SHAPE);
    let numel = N * C * S;
    let x = case.x.values();
    for (round, shift) in [8usize, 8, 16].into_iter().enumerate() {
        // The storage of `holder` holds x from element `shift` on: a view at + shift·4 bytes.
        let mut storage = vec![-7.0f32; numel + 16];
        storage[shift..shift + numel].iter_mut().zip(&x).for_each(|(d, &v)| *d = v as f32);
        let holder = Tensor::from_slice(&s, &storage, &[storage.len()]).expect("holder");
        let base = holder.device_ptr().expect("device memory");
        let ptr = base.cast::<u8>().wrapping_add(shift * 4).cast::<std::ffi::c_void>();
        assert_eq!(ptr as usize % 32, 0, "+{} bytes: 32-byte aligned", shift * 4);
        // SAFETY: `ptr` lies inside `holder`'s allocation with numel·4 bytes from it on;
        // `holder` outlives the view (dropped after it and after the stream drained), and only
        // work ordered on `s` touches the memory.
        let foreign = unsafe {
            Tensor::from_raw_device(&s, ptr, DType::F32, &SHAPE, &[C * S, S, 1], 0, numel * 4).expect("foreign view")
        };
        let [_, w, b, mean, invstd] = case.upload(&s);
        let up = [foreign, w, b, mean, invstd];
        let before = counters();
        let y = case.run_into(&s, &up, true, true, EPS);
        let (made, phase1) = cost(before);
        let what = format!("foreign x at +{} bytes, round {round}", shift * 4);
        if round == 0 {
            assert_eq!((made, phase1), (6, 1), "{what}: a miss");
            assert_eq!(s.launch_cache_stats(), stats(0, 1, 0, 1, 8), "{what}");
        } else {
            assert_eq!((made, phase1), (0, 0), "{what}: a hit");
            assert_eq!(s.launch_cache_stats(), stats(round as u64, 1, 0, 1, 8), "{what}");
        }
        case.check(&what, &s, &y, true, true);
        drop(up);
        s.synchronize().expect("synchronize");
        drop(holder);
    }

    // An empty input: the outputs are zeros, written after the launch (uncached).
    let empty = Reduce::new(610, [0, C, S]);
    let [dy, x, mean, invstd] = empty.upload(&s);
    for round in 0..2 {
        let before_stats = s.launch_cache_stats();
        let before = counters();
        let mut outs: Vec<Tensor> = (0..4).map(|_| sentinel(&s, DType::F32, &[C])).collect();
        let [o0, o1, o2, o3] = &mut outs[..] else { unreachable!() };
        let out =
            ReduceBackwardOut { sum_dy: Some(o0), sum_dy_xmu: Some(o1), grad_weight: Some(o2), grad_bias: Some(o3) };
        batch_norm_reduce_backward_into(&s, &dy, &x, &mean, &invstd, None, OutputMask::ALL, out).expect("empty into");
        let r = batch_norm_reduce_backward(&s, &dy, &x, &mean, &invstd, None, OutputMask::ALL).expect("empty alloc");
        let (_, phase1) = cost(before);
        let what = format!("empty input, round {round}");
        let now = s.launch_cache_stats();
        assert_eq!((now.hits, now.misses), (before_stats.hits, before_stats.misses), "{what}: not cached");
        assert_eq!(phase1, 2, "{what}: each call runs phase 1");
        for (k, t) in outs
            .iter()
            .chain([&r.sum_dy, &r.sum_dy_xmu, &r.grad_weight, &r.grad_bias].into_iter().flatten())
            .enumerate()
        {
            assert_eq!(read(&s, t), vec![0.0; C], "{what}: output {k} is zeros");
        }
    }
}

/// Capacity 0 turns the cache off: every launch describes its tensors and runs phase 1, and the
/// counters stay 0. Capacity 4 with 4 signatures, then 1: 3 entries retired (evictions 3), the
/// most recently used kept (it hits, the others miss again); values right throughout.
fn capacity_zero_is_off_and_shrinking_retires(ctx: &Context) {
    let s = stream(ctx, 0);
    let case = Stats::new(700, C);
    let x = case.x.tensor(&s).expect("x");
    for round in 0..3 {
        let before = counters();
        let r = case.launch(&s, &x, EPS).expect("stats");
        assert_eq!(cost(before), (3, 1), "off, round {round}: x, mean, invstd described, phase 1");
        assert_eq!(s.launch_cache_stats(), stats(0, 0, 0, 0, 0), "off, round {round}");
        case.check(&format!("off, round {round}"), &s, &r, EPS);
    }

    s.set_launch_cache_capacity(4);
    let eps = [1e-5, 1e-4, 1e-3, 1e-2];
    for (k, &e) in eps.iter().enumerate() {
        let r = case.launch(&s, &x, e).expect("stats");
        case.check(&format!("eps {e}"), &s, &r, e);
        assert_eq!(s.launch_cache_stats(), stats(0, k as u64 + 1, 0, k + 1, 4));
    }
    s.set_launch_cache_capacity(1);
    assert_eq!(s.launch_cache_stats(), stats(0, 4, 3, 1, 1), "shrunk to 1: 3 retired");
    let before = counters();
    let r = case.launch(&s, &x, eps[3]).expect("stats");
    assert_eq!(cost(before), (0, 0), "the most recent signature stayed cached");
    case.check("kept entry", &s, &r, eps[3]);
    assert_eq!(s.launch_cache_stats(), stats(1, 4, 3, 1, 1));
    let r = case.launch(&s, &x, eps[0]).expect("stats");
    case.check("retired entry, again", &s, &r, eps[0]);
    assert_eq!(s.launch_cache_stats(), stats(1, 5, 4, 1, 1), "a retired signature misses and replaces the kept one");
}

/// `aclnnBatchNormStats` failing on a hit (361001): the call fails with that status, the entry
/// is evicted (evictions + 1, no entry left), and the next call is a miss with right values.
fn a_failed_launch_evicts_its_entry(ctx: &Context) {
    let s = stream(ctx, 4);
    let case = Stats::new(800, C);
    let x = case.x.tensor(&s).expect("x");
    let r = case.launch(&s, &x, EPS).expect("miss");
    case.check("miss", &s, &r, EPS);
    let r = case.launch(&s, &x, EPS).expect("hit");
    case.check("hit", &s, &r, EPS);
    assert_eq!(s.launch_cache_stats(), stats(1, 1, 0, 1, 4));

    ascend::mock::fail_next_on_this_thread("aclnnBatchNormStats", 361001);
    let failed = case.launch(&s, &x, EPS);
    ascend::mock::clear_faults();
    assert_eq!(common::status_of(failed), 361001, "the launch's status");
    assert_eq!(s.launch_cache_stats(), stats(2, 1, 1, 0, 4), "the failed hit's entry is evicted");

    let before = counters();
    let r = case.launch(&s, &x, EPS).expect("after the failure");
    assert_eq!(cost(before).1, 1, "a miss: phase 1 again");
    assert_eq!(s.launch_cache_stats(), stats(2, 2, 1, 1, 4));
    case.check("after the failure", &s, &r, EPS);
}

/// Turns the device's deterministic mode off again when dropped (it is process-wide device state).
struct DeterministicOff<'c>(&'c Context);

impl Drop for DeterministicOff<'_> {
    fn drop(&mut self) {
        self.0.set_deterministic(false).expect("set_deterministic(false)");
    }
}

/// (launches, of executors prepared deterministic, of executors prepared under another setting
/// than the device's at the launch) since `before`.
fn deterministic_launches(before: LaunchCounters) -> (u64, u64, u64) {
    let now = counters();
    (
        now.launches - before.launches,
        now.deterministic_launches - before.deterministic_launches,
        now.stale_deterministic_launches - before.stale_deterministic_launches,
    )
}

/// Audit 4, G03: `Context::set_deterministic` reaches signatures already cached, on every stream
/// of the device and of another context of it: the first launch after each change runs phase 1
/// again (a miss that replaces the entry), later ones hit; the mock, which records the setting at
/// phase 1, runs no executor prepared under another setting than the device's. A call prepared
/// with `prepare_*` before the change keeps its setting (the mock counts its launch as stale).
fn set_deterministic_reaches_cached_launches(ctx: &Context) {
    let s = stream(ctx, 8);
    let other_ctx = ascend::mock::context(0).expect("a second context of device 0");
    let t = stream(&other_ctx, 8);
    let case = Elemt::new(1100, DType::F32, SHAPE);
    let (up, up_t) = (case.upload(&s), case.upload(&t));
    for _ in 0..2 {
        case.check("before", &s, &case.run_into(&s, &up, true, true, EPS), true, true);
        case.check("before, other context", &t, &case.run_into(&t, &up_t, true, true, EPS), true, true);
    }
    assert_eq!(s.launch_cache_stats(), stats(1, 1, 0, 1, 8));
    let _off = DeterministicOff(ctx);
    for (round, on) in [(1u64, true), (2, false), (3, true)] {
        ctx.set_deterministic(on).expect("set_deterministic");
        let before = counters();
        for (what, st, up) in [("this context", &s, &up), ("other context", &t, &up_t)] {
            let y = case.run_into(st, up, true, true, EPS);
            case.check(&format!("round {round}, {what}, first"), st, &y, true, true);
            let y = case.run_into(st, up, true, true, EPS);
            case.check(&format!("round {round}, {what}, second"), st, &y, true, true);
            assert_eq!(st.launch_cache_stats(), stats(1 + round, 1 + round, round, 1, 8), "round {round}, {what}");
        }
        assert_eq!(cost(before).1, 2, "round {round}: one phase 1 per stream after the change");
        assert_eq!(deterministic_launches(before), (4, if on { 4 } else { 0 }, 0), "round {round}: launches");
    }
    let [x, w, b, mean, invstd] = &up;
    let mut y = sentinel(&s, DType::F32, &SHAPE);
    let prepared =
        ascend::ops::prepare_batch_norm_elemt(&s, x, Some(w), Some(b), mean, invstd, EPS, &mut y).expect("prepare");
    ctx.set_deterministic(false).expect("set_deterministic(false)");
    let before = counters();
    prepared.launch(&s, None).expect("launch");
    assert_eq!(deterministic_launches(before), (1, 1, 1), "a call prepared before the change keeps its setting");
    case.check("prepared before the change", &s, &y, true, true);
}

/// A new stream's capacity comes from the environment: 0 with `ASCEND_NO_LAUNCH_CACHE=1`, else
/// `ASCEND_LAUNCH_CACHE_SIZE` or 256; with the cache off by the environment, a new stream's
/// launches are uncached until a capacity is set.
fn new_streams_follow_the_environment(ctx: &Context) {
    let off = std::env::var("ASCEND_NO_LAUNCH_CACHE").is_ok_and(|v| v.trim() == "1");
    let size = std::env::var("ASCEND_LAUNCH_CACHE_SIZE").ok().and_then(|v| v.trim().parse().ok());
    let want = if off { 0 } else { size.unwrap_or(256) };
    let s = ctx.new_stream().expect("stream");
    assert_eq!(s.launch_cache_stats(), stats(0, 0, 0, 0, want));
    let case = Stats::new(900, C);
    let x = case.x.tensor(&s).expect("x");
    for round in 0..2 {
        let r = case.launch(&s, &x, EPS).expect("stats");
        case.check(&format!("round {round}"), &s, &r, EPS);
    }
    let st = s.launch_cache_stats();
    if want == 0 {
        assert_eq!(st, stats(0, 0, 0, 0, 0), "off by the environment");
    } else {
        assert_eq!(st, stats(1, 1, 0, 1, want));
    }
    assert_eq!(Context::cpu().new_stream().expect("cpu").launch_cache_stats(), LaunchCacheStats::default());
}

// ---------------------------------------------------------------------------------------------
// SyncBatchNorm

const RANKS: usize = 2;
const STEPS: usize = 3;

/// Each rank's outputs of the last step (y, dx, dw, db as bits) and the launch counters'
/// increase over the steps after the first (all ranks): (descriptors made, phase-1 calls,
/// launches, refused `aclSetAclOpExecutorRepeatable` calls).
type SyncRun = (Vec<[Vec<u32>; 4]>, (u64, u64, u64, u64));

/// `STEPS` SyncBatchNorm forward+backward steps on two mock devices (one thread per rank, the
/// same data each step), with each rank's stream keeping `capacity` entries.
fn sync_steps(ctxs: &[Context], capacity: usize) -> SyncRun {
    let comms = Communicator::init_all(ctxs).expect("communicators");
    let barrier = std::sync::Barrier::new(RANKS);
    let first = std::sync::Mutex::new(counters());
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(ctxs)
            .enumerate()
            .map(|(r, (comm, ctx))| {
                let (barrier, first) = (&barrier, &first);
                scope.spawn(move || {
                    let s = stream(ctx, capacity);
                    let mut rng = Rng::new(1000 + r as u64);
                    let shape = [2 + r, C, S];
                    let x = Data::normal(&mut rng, DType::F32, &shape, 0.5, 1.5).tensor(&s).expect("x");
                    let dy = Data::normal(&mut rng, DType::F32, &shape, 0.0, 1.0).tensor(&s).expect("dy");
                    let w = vector(&s, &(0..C).map(|c| 0.5 + c as f64 / 4.0).collect::<Vec<_>>());
                    let b = vector(&s, &(0..C).map(|c| c as f64 / 8.0 - 0.2).collect::<Vec<_>>());
                    let mut last = None;
                    for step in 0..STEPS {
                        let (y, saved) =
                            sync_batch_norm::forward(&comm, &s, &x, Some(&w), Some(&b), None, None, 0.1, EPS)
                                .expect("forward");
                        let (dx, dw, db) = sync_batch_norm::backward(&comm, &s, &dy, &saved, Some(&w), OutputMask::ALL)
                            .expect("backward");
                        if step == 0 {
                            s.synchronize().expect("synchronize");
                            barrier.wait();
                            if r == 0 {
                                *first.lock().unwrap() = counters();
                            }
                            barrier.wait();
                        }
                        last = Some((y, dx.expect("dx"), dw.expect("dw"), db.expect("db")));
                    }
                    let (y, dx, dw, db) = last.expect("a step");
                    [y, dx, dw, db].map(|t| common::bits(&s, &t))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect::<Vec<_>>()
    });
    let after = counters();
    let first = *first.lock().unwrap();
    let cost = (
        after.tensors_created - first.tensors_created,
        after.phase1_calls - first.phase1_calls,
        after.launches - first.launches,
        after.repeatable_refusals - first.repeatable_refusals,
    );
    (results, cost)
}

/// A steady SyncBatchNorm step (forward + backward over two mock devices, one thread per rank)
/// makes no descriptor and runs no phase 1 after the first step, with the cache on; and its
/// values are bit for bit those of the same steps with the cache off (which does describe and
/// run phase 1 every step).
fn a_steady_sync_batch_norm_step_skips_phase_1(ctx0: &Context) {
    ascend::mock::set_device_count(RANKS as u32).expect("two mock devices");
    let ctxs = [ctx0.clone(), ascend::mock::context(1).expect("device 1")];
    let (on, on_cost) = sync_steps(&ctxs, 64);
    assert_eq!((on_cost.0, on_cost.1), (0, 0), "steps after the first: (aclCreateTensor, phase-1 calls)");
    let (off, off_cost) = sync_steps(&ctxs, 0);
    assert!(off_cost.0 > 0 && off_cost.1 > 0, "the cache off describes and runs phase 1 each step: {off_cost:?}");
    assert_eq!(on, off, "the cached steps' bits equal the uncached ones'");
}

/// The SyncBatchNorm step with every operator's executors refused repeatability, as CANN refuses
/// those it cannot repeat: each step is right (bit for bit the cached steps'), every launch runs
/// phase 1 (uncached) and, after the first step, no call tries `aclSetAclOpExecutorRepeatable`
/// again; nothing leaks and no violation (checked by `isolated`).
fn a_sync_batch_norm_step_survives_refused_executors(ctx0: &Context) {
    ascend::mock::set_device_count(RANKS as u32).expect("two mock devices");
    let ctxs = [ctx0.clone(), ascend::mock::context(1).expect("device 1")];
    let (cached, cached_cost) = sync_steps(&ctxs, 64);
    let refused = {
        let _refuse = common::framework::RefuseRepeatable::new("*");
        sync_steps(&ctxs, 64)
    };
    let (refused, (tensors, phase1, launches, refusals)) = refused;
    assert_eq!(refused, cached, "the refused steps' bits equal the cached ones'");
    let steps = (RANKS * (STEPS - 1)) as u64;
    assert_eq!(launches, cached_cost.2, "as many launches as with the cache");
    assert_eq!(phase1, launches, "every launch runs its phase 1");
    assert!(tensors > 0, "the refused calls describe their tensors");
    assert_eq!(refusals, 0, "a refused signature is not tried again");
    println!(
        "SyncBatchNorm step under refusal, per rank and step: {} launches, {} phase-1 calls, {} descriptors \
         (cached: {} phase-1 calls)",
        launches / steps,
        phase1 / steps,
        tensors / steps,
        cached_cost.1 / steps
    );
}

/// Each case as `mock::<name>`, inside `common::mock::isolated`.
macro_rules! on_the_mock {
    ($($name:ident),* $(,)?) => {
        mod mock {
            $( #[test] fn $name() { crate::common::mock::isolated(super::$name) } )*
        }
    };
}

on_the_mock!(
    a_hit_rebinds_every_tensor_to_fresh_memory,
    absent_arguments_are_rebound_by_position,
    scalars_strides_and_dtypes_make_different_entries,
    tensors_are_matched_by_layout_not_by_identity,
    lru_evicts_without_destroying_queued_launches,
    two_streams_keep_their_own_entries,
    foreign_memory_is_rebound_and_empty_inputs_are_not_cached,
    capacity_zero_is_off_and_shrinking_retires,
    a_failed_launch_evicts_its_entry,
    new_streams_follow_the_environment,
    set_deterministic_reaches_cached_launches,
    a_steady_sync_batch_norm_step_skips_phase_1,
    a_sync_batch_norm_step_survives_refused_executors,
);
