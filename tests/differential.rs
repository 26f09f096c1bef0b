//! Differential random test of every operator (every entry form; `batch_norm` and
//! `batch_norm_backward` included), every collective and `sync_batch_norm`: each random program runs on the mock CANN and on a CPU twin, and after every
//! step
//! - the mock counted no violation;
//! - both backends agreed: the same success, or the same aclnn/HCCL status;
//! - every output read back agrees: bit for bit for copies, integers and collectives (HCCL's
//!   integer arithmetic wraps, floats of two ranks are one rounding), within a tolerance per
//!   output dtype for the operators (stated at [`tolerance`]); NaN where the other has NaN, and
//!   infinities of the same sign.
//!
//! The arguments are drawn to reach the edges: every dtype (i32 data beyond 2^24 and at
//! i32::MIN/MAX), contiguous, channels-last, spread and zero-stride (broadcast) views, empty
//! inputs (N = 0), ranks without elements, optional arguments present or not, output dtypes the
//! operator refuses, and scalar arguments at their edges (0, NaN, ±inf, beyond f32, subnormal,
//! negative). Each program runs with the mock streams' launch cache off (capacity 0), small (1
//! or 2 entries, so entries are retired with launches queued) or at the environment's default,
//! and one program in five with every operator's repeatable executor refused by the mock (as CANN
//! refuses those it cannot repeat: the calls are launched uncached).
//! A failure shrinks to a minimal program. `DIFFERENTIAL_CASES` sets the number of
//! programs (default 300), `DIFFERENTIAL_SEED` the seed (default: fixed).
#![cfg(feature = "mock")]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

use ascend::hccl::{Communicator, ReduceOp};
use ascend::ops::{self, OutputMask, Prepared, Workspace};
use ascend::{bf16, f16, sync_batch_norm, Context, DType, LaunchCacheStats, Result, Stream, Tensor};

type Outcome = std::result::Result<(), TestCaseError>;

fn fail(msg: impl Into<String>) -> TestCaseError {
    TestCaseError::fail(msg.into())
}

// ---------------------------------------------------------------------------------------------
// Programs

/// Mostly floats (f32 most), sometimes i32 (which most float arguments refuse).
fn dt() -> impl Strategy<Value = DType> {
    prop_oneof![6 => Just(DType::F32), 2 => Just(DType::F16), 2 => Just(DType::BF16), 1 => Just(DType::I32)]
}

fn float_dt() -> impl Strategy<Value = DType> {
    prop_oneof![3 => Just(DType::F32), 1 => Just(DType::F16), 1 => Just(DType::BF16)]
}

#[derive(Clone, Copy, Debug)]
enum Layout {
    Contiguous,
    /// The channel dim innermost (rank 3; other ranks: contiguous).
    ChannelsLast,
    /// Every stride doubled, offset 1.
    Spread,
    /// Stride 0 on dim 0: every row is the same storage.
    Broadcast,
}

fn layout() -> impl Strategy<Value = Layout> {
    prop_oneof![
        3 => Just(Layout::Contiguous),
        1 => Just(Layout::ChannelsLast),
        1 => Just(Layout::Spread),
        1 => Just(Layout::Broadcast)
    ]
}

/// What the values of a tensor are drawn from.
#[derive(Clone, Copy, Debug)]
enum Values {
    /// Integers in [-4, 4].
    Small,
    /// Positive powers of two (invstd-like), 1/4 to 4.
    Scale,
    /// Counts: integers in [0, 4].
    Count,
    /// i32 beyond 2^24 of either sign, with i32::MIN and i32::MAX among them (floats: the nearest).
    Wide,
}

/// A tensor argument: dtype, layout and the seed of its storage.
#[derive(Clone, Copy, Debug)]
struct Arg {
    dt: DType,
    layout: Layout,
    seed: u64,
}

fn arg(dt: impl Strategy<Value = DType>) -> impl Strategy<Value = Arg> {
    (dt, layout(), any::<u64>()).prop_map(|(dt, layout, seed)| Arg { dt, layout, seed })
}

#[derive(Clone, Copy, Debug)]
enum Entry {
    Alloc,
    Into,
    TwoPhase { caller_workspace: bool },
}

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        Just(Entry::Alloc),
        Just(Entry::Into),
        any::<bool>().prop_map(|caller_workspace| Entry::TwoPhase { caller_workspace })
    ]
}

/// eps/momentum: ordinary values mostly, edges sometimes: 0, NaN, ±inf, negative (small enough
/// that no variance of the data cancels it), beyond f32,
/// below f32's smallest subnormal (0 in f32, which CANN's kernels take these scalars in). `huge`
/// adds a valid eps that dwarfs every variance: the operators whose result then depends only on
/// f32 steps both backends take alike (stats, elemt) draw it; gather's running variance then
/// depends on how the backends round intermediate values, so its calls do not.
fn scalar(ordinary: f64, huge: bool) -> impl Strategy<Value = f64> {
    let huge = if huge { 1e30 } else { ordinary };
    prop_oneof![
        6 => Just(ordinary),
        1 => Just(0.0),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => Just(-1e-3),
        1 => Just(1e39),
        1 => Just(1e-300),
        1 => Just(huge),
    ]
}

#[derive(Clone, Copy, Debug)]
enum Collective {
    AllReduce(ReduceOp),
    AllGather,
    Broadcast(u32),
}

#[derive(Clone, Debug)]
enum Step {
    /// Upload and read back (exact for every dtype).
    RoundTrip {
        a: Arg,
        values: Values,
    },
    Stats {
        x: Arg,
        eps: f64,
        entry: Entry,
        out: DType,
    },
    Gather {
        x: Arg,
        mean: Arg,
        invstd: Arg,
        counts: Arg,
        running: Option<(Arg, Arg)>,
        momentum: f64,
        eps: f64,
        entry: Entry,
        out: DType,
    },
    Elemt {
        x: Arg,
        weight: Option<Arg>,
        bias: Option<Arg>,
        mean: Arg,
        invstd: Arg,
        eps: f64,
        entry: Entry,
        out: DType,
    },
    ElemtBackward {
        dy: Arg,
        x: Arg,
        mean: Arg,
        invstd: Arg,
        weight: Option<Arg>,
        sums: (Arg, Arg),
        counter: Arg,
        entry: Entry,
        out: DType,
    },
    /// `ops::cast` of `x` to `dtype` through `entry` (i32 on either side is refused alike).
    Cast {
        x: Arg,
        dtype: DType,
        entry: Entry,
    },
    /// `ops::batch_norm` (training or eval) through `entry`.
    BatchNorm {
        x: Arg,
        weight: Option<Arg>,
        bias: Option<Arg>,
        running: Option<(Arg, Arg)>,
        training: bool,
        momentum: f64,
        eps: f64,
        entry: Entry,
        out: DType,
    },
    /// `ops::batch_norm` (allocating) then `ops::batch_norm_backward` through `entry`.
    BatchNormBackward {
        dy: Arg,
        x: Arg,
        weight: Option<Arg>,
        running: Option<(Arg, Arg)>,
        training: bool,
        eps: f64,
        mask: [bool; 3],
        entry: Entry,
        out: DType,
    },
    /// One collective over two ranks (one thread each), `len` elements per rank.
    Collective {
        kind: Collective,
        dt: DType,
        values: Values,
        len: usize,
        seeds: [u64; 2],
    },
    /// `sync_batch_norm::forward` then `backward` over two ranks with `n[r]` rows on rank r.
    SyncBatchNorm {
        dt: DType,
        n: [usize; 2],
        affine: bool,
        running: bool,
        momentum: f64,
        eps: f64,
        mask: [bool; 3],
        seed: u64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let values = prop_oneof![Just(Values::Small), Just(Values::Wide), Just(Values::Count)];
    let out =
        || prop_oneof![6 => Just(DType::F32), 1 => Just(DType::F16), 1 => Just(DType::BF16), 1 => Just(DType::I32)];
    let op = prop_oneof![Just(ReduceOp::Sum), Just(ReduceOp::Prod), Just(ReduceOp::Max), Just(ReduceOp::Min)];
    let kind = prop_oneof![
        3 => op.prop_map(Collective::AllReduce),
        1 => Just(Collective::AllGather),
        1 => (0u32..2).prop_map(Collective::Broadcast)
    ];
    prop_oneof![
        2 => (arg(dt()), values.clone()).prop_map(|(a, values)| Step::RoundTrip { a, values }),
        3 => (arg(dt()), scalar(1e-5, true), entry(), out())
            .prop_map(|(x, eps, entry, out)| Step::Stats { x, eps, entry, out }),
        3 => (
            (arg(dt()), arg(dt()), arg(dt()), arg(dt())),
            proptest::option::weighted(0.6, (arg(dt()), arg(dt()))),
            (scalar(0.1, false), scalar(1e-5, false), entry(), out())
        )
            .prop_map(|((x, mean, invstd, counts), running, (momentum, eps, entry, out))| Step::Gather {
                x, mean, invstd, counts, running, momentum, eps, entry, out
            }),
        3 => (
            (arg(dt()), proptest::option::of(arg(dt())), proptest::option::of(arg(dt()))),
            (arg(dt()), arg(dt()), scalar(1e-5, true), entry(), out())
        )
            .prop_map(|((x, weight, bias), (mean, invstd, eps, entry, out))| Step::Elemt {
                x, weight, bias, mean, invstd, eps, entry, out
            }),
        3 => (
            (arg(dt()), arg(dt()), arg(dt()), arg(dt()), proptest::option::of(arg(dt()))),
            (arg(dt()), arg(dt()), arg(dt()), entry(), out())
        )
            .prop_map(|((dy, x, mean, invstd, weight), (sum_dy, sum_dy_xmu, counter, entry, out))| {
                Step::ElemtBackward { dy, x, mean, invstd, weight, sums: (sum_dy, sum_dy_xmu), counter, entry, out }
            }),
        2 => (arg(dt()), out(), entry()).prop_map(|(x, dtype, entry)| Step::Cast { x, dtype, entry }),
        3 => (
            (arg(dt()), proptest::option::of(arg(dt())), proptest::option::of(arg(dt()))),
            proptest::option::weighted(0.6, (arg(dt()), arg(dt()))),
            (any::<bool>(), scalar(0.1, false), scalar(1e-5, true), entry(), out())
        )
            .prop_map(|((x, weight, bias), running, (training, momentum, eps, entry, out))| Step::BatchNorm {
                x, weight, bias, running, training, momentum, eps, entry, out
            }),
        3 => (
            (arg(dt()), arg(dt()), proptest::option::of(arg(dt()))),
            proptest::option::weighted(0.6, (arg(dt()), arg(dt()))),
            (any::<bool>(), scalar(1e-5, false), proptest::array::uniform3(any::<bool>()), entry(), out())
        )
            .prop_map(|((dy, x, weight), running, (training, eps, mask, entry, out))| Step::BatchNormBackward {
                dy, x, weight, running, training, eps, mask, entry, out
            }),
        3 => (kind, dt(), values, 0usize..6, any::<[u64; 2]>())
            .prop_map(|(kind, dt, values, len, seeds)| Step::Collective { kind, dt, values, len, seeds }),
        2 => (
            float_dt(),
            (0usize..4, 0usize..4),
            (any::<bool>(), any::<bool>()),
            (scalar(0.1, false), scalar(1e-5, false)),
            proptest::array::uniform3(any::<bool>()),
            any::<u64>()
        )
            .prop_map(|(dt, (n0, n1), (affine, running), (momentum, eps), mask, seed)| Step::SyncBatchNorm {
                dt, n: [n0, n1], affine, running, momentum, eps, mask, seed
            }),
    ]
}

#[derive(Clone, Debug)]
struct Program {
    /// (N, C, S) of the big tensors; N may be 0. W ranks for gather's [W, C] and [W] arguments.
    n: usize,
    c: usize,
    s: usize,
    w: usize,
    /// The launch cache capacity of every mock stream during this program (`None`: the
    /// environment's default; 0: off).
    capacity: Option<usize>,
    /// Whether the mock refuses every repeatable executor during this program.
    refuse: bool,
    steps: Vec<Step>,
}

fn program() -> impl Strategy<Value = Program> {
    let capacity = prop_oneof![Just(None), Just(Some(0)), Just(Some(1)), Just(Some(2))];
    let refuse = prop_oneof![4 => Just(false), 1 => Just(true)];
    (0usize..4, 1usize..5, 1usize..4, 1usize..4, capacity, refuse, proptest::collection::vec(step(), 1..12))
        .prop_map(|(n, c, s, w, capacity, refuse, steps)| Program { n, c, s, w, capacity, refuse, steps })
}

// ---------------------------------------------------------------------------------------------
// Data: the same storage uploaded to both backends

/// Random values of the given kind, as f64 (exact in every dtype they are stored in, but
/// `Wide` in the float dtypes, which round it once on upload, identically on both backends).
fn storage(seed: u64, n: usize, values: Values) -> Vec<f64> {
    common::Rng::new(seed).map_draws(n, |r| match values {
        Values::Small => (r % 9) as f64 - 4.0,
        Values::Scale => [0.25, 0.5, 1.0, 2.0, 4.0][(r % 5) as usize],
        Values::Count => (r % 5) as f64,
        Values::Wide => match r % 8 {
            0 => f64::from(i32::MAX),
            1 => f64::from(i32::MIN),
            2 => f64::from(16_777_217),
            _ => {
                let m = (r >> 3) as i64 % (1 << 30) + (1 << 24) + 1;
                (if r & 1 == 0 { m } else { -m }) as f64
            }
        },
    })
}

/// Strides, offset and storage length of `layout` for `shape`.
fn placement(shape: &[usize], layout: Layout) -> (Vec<usize>, usize, usize) {
    let mut strides = vec![0; shape.len()];
    let mut acc = 1;
    for d in (0..shape.len()).rev() {
        strides[d] = acc;
        acc *= shape[d].max(1);
    }
    let (strides, offset) = match layout {
        Layout::Contiguous => (strides, 0),
        Layout::ChannelsLast if shape.len() == 3 => {
            let (c, s) = (shape[1].max(1), shape[2].max(1));
            (vec![c * s, 1, c], 0)
        }
        Layout::ChannelsLast => (strides, 0),
        Layout::Spread => (strides.iter().map(|s| s * 2).collect(), 1),
        Layout::Broadcast => {
            let mut st = strides;
            st[0] = 0;
            (st, 0)
        }
    };
    let extent =
        if shape.contains(&0) { 0 } else { shape.iter().zip(&strides).map(|(d, s)| (d - 1) * s).sum::<usize>() + 1 };
    (strides, offset, offset + extent)
}

/// Uploads `values` as `dt` in `arg`'s layout on `stream`.
fn upload(stream: &Stream, arg: Arg, shape: &[usize], values: Values) -> Result<Tensor> {
    let (strides, offset, len) = placement(shape, arg.layout);
    let v = storage(arg.seed, len, values);
    match arg.dt {
        DType::F32 => {
            let v: Vec<f32> = v.iter().map(|&x| x as f32).collect();
            Tensor::from_slice_strided(stream, &v, shape, &strides, offset)
        }
        DType::F16 => {
            let v: Vec<f16> = v.iter().map(|&x| f16::from_f64(x)).collect();
            Tensor::from_slice_strided(stream, &v, shape, &strides, offset)
        }
        DType::BF16 => {
            let v: Vec<bf16> = v.iter().map(|&x| bf16::from_f64(x)).collect();
            Tensor::from_slice_strided(stream, &v, shape, &strides, offset)
        }
        DType::I32 => {
            let v: Vec<i32> = v.iter().map(|&x| x as i32).collect();
            Tensor::from_slice_strided(stream, &v, shape, &strides, offset)
        }
        other => unreachable!("the strategies draw no {other:?}"),
    }
}

/// A tensor's values, exactly: i32 as i32, floats widened (exactly) to f64.
#[derive(Debug, PartialEq)]
enum Read {
    Ints(Vec<i32>),
    Floats(Vec<f64>),
}

fn read(stream: &Stream, t: &Tensor) -> Result<Read> {
    Ok(match t.dtype() {
        DType::I32 => Read::Ints(t.to_vec::<i32>(stream)?),
        DType::F32 => Read::Floats(t.to_vec::<f32>(stream)?.into_iter().map(f64::from).collect()),
        DType::F16 => Read::Floats(t.to_vec::<f16>(stream)?.into_iter().map(f64::from).collect()),
        _ => Read::Floats(t.to_vec::<bf16>(stream)?.into_iter().map(f64::from).collect()),
    })
}

/// The tolerance of an operator output of `dtype`, relative to max(1, |value|): both backends
/// accumulate in f32 (or wider) but in different orders, and each rounds its result once to the
/// output dtype, so they may differ by the accumulation error plus one unit in the last place
/// of the output dtype: f32 1e-5, f16 2e-3 (2^-9), bf16 1.6e-2 (2^-6).
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        _ => 1e-5,
    }
}

/// The two reads agree: exactly (`exact`), or within the dtype's tolerance, NaN for NaN and
/// infinities of one sign.
fn compare(what: &str, dtype: DType, mock: &Read, cpu: &Read, exact: bool) -> Outcome {
    // gradInput is a difference of terms up to ~64 (values to 4, invstd to 4) that CANN's
    // reduction forms as Σdy·x − mean·Σdy, the CPU's directly: its error scales with the terms.
    let floor = if what.ends_with("gradInput") { 64.0 } else { 1.0 };
    COMPARED.fetch_add(1, Relaxed);
    match (mock, cpu) {
        (Read::Ints(m), Read::Ints(c)) if m == c => Ok(()),
        (Read::Floats(m), Read::Floats(c)) if m.len() == c.len() => {
            for (i, (&a, &b)) in m.iter().zip(c).enumerate() {
                let same = if exact {
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
                } else if a.is_nan() || b.is_nan() {
                    a.is_nan() && b.is_nan()
                } else if a.is_infinite() || b.is_infinite() {
                    a == b
                } else {
                    (a - b).abs() <= tolerance(dtype) * a.abs().max(b.abs()).max(floor)
                };
                if !same {
                    return Err(fail(format!("{what}: element {i}: mock {a:e}, cpu {b:e}\n mock {m:?}\n cpu  {c:?}")));
                }
            }
            Ok(())
        }
        (m, c) => Err(fail(format!("{what}: mock {m:?}, cpu {c:?}"))),
    }
}

/// What identifies an error across backends: its aclnn/ACL status or its HcclResult.
fn code(e: &ascend::Error) -> (Option<i32>, Option<u32>) {
    (e.status(), e.hccl_result())
}

/// Both outcomes agree: both succeeded, or both failed with the same status.
fn agree<A, B>(what: &str, mock: &Result<A>, cpu: &Result<B>) -> Outcome {
    match (mock, cpu) {
        (Ok(_), Ok(_)) => {
            RAN.fetch_add(1, Relaxed);
            Ok(())
        }
        (Err(m), Err(c)) if code(m) == code(c) && code(m) != (None, None) => {
            REJECTED.fetch_add(1, Relaxed);
            Ok(())
        }
        (m, c) => {
            Err(fail(format!("{what}: backends disagree: mock {:?}, cpu {:?}", m.as_ref().err(), c.as_ref().err())))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The world: a stream on each backend, and a two-rank communicator on each

struct Rank {
    comm: Communicator,
    stream: Stream,
}

struct World {
    cpu: Stream,
    mock: Stream,
    /// Two ranks on CPU contexts, and two on mock devices 0 and 1.
    cpu_ranks: Vec<Rank>,
    mock_ranks: Vec<Rank>,
    /// A new mock stream's launch cache capacity (from the environment).
    default_capacity: usize,
}

impl World {
    fn new() -> Result<World> {
        let ranks = |ctxs: Vec<Context>| -> Result<Vec<Rank>> {
            let comms = Communicator::init_all(&ctxs)?;
            comms.into_iter().zip(&ctxs).map(|(comm, ctx)| Ok(Rank { comm, stream: ctx.new_stream()? })).collect()
        };
        let mock = ascend::mock::context(0)?.new_stream()?;
        Ok(World {
            cpu: Context::cpu().new_stream()?,
            default_capacity: mock.launch_cache_stats().capacity,
            mock,
            cpu_ranks: ranks(vec![Context::cpu(), Context::cpu()])?,
            mock_ranks: ranks(vec![ascend::mock::context(0)?, ascend::mock::context(1)?])?,
        })
    }
}

/// The same step on one backend, given that backend's stream and ranks; returns every output it
/// produced, read back, with whether it must match exactly.
type Outputs = Vec<(String, DType, Read, bool)>;

/// Runs a prepared call: launched at once, or with a caller workspace of its size.
fn launch(stream: &Stream, p: Prepared<'_>, caller_workspace: bool) -> Result<()> {
    if caller_workspace {
        let ws = Workspace::new(stream, p.workspace_size())?;
        p.launch(stream, Some(&ws))
    } else {
        p.launch(stream, None)
    }
}

/// An operator called through `entry` with the arguments `($arg, ...)`: the allocating form
/// `$alloc`, or the `_into` form `$into` or the prepared form `$prepare` (launched as [`launch`]
/// does) writing into outputs made as `[$out = $make, ...]`; gives the output or the tuple of
/// outputs.
macro_rules! by_entry {
    ($entry:expr, $s:expr, ($($arg:expr),*), $alloc:path, $prepare:path, $into:path, [$($out:ident = $make:expr),+]) => {
        match $entry {
            Entry::Alloc => $alloc($($arg),*)?,
            _ => {
                $(let mut $out = $make;)+
                match $entry {
                    Entry::TwoPhase { caller_workspace } => {
                        launch($s, $prepare($($arg,)* $(&mut $out),+)?, caller_workspace)?
                    }
                    _ => $into($($arg,)* $(&mut $out),+)?,
                }
                ($($out),+)
            }
        }
    };
}

fn outputs(stream: &Stream, named: &[(&str, &Tensor)], exact: bool) -> Result<Outputs> {
    named.iter().map(|(n, t)| Ok((n.to_string(), t.dtype(), read(stream, t)?, exact))).collect()
}

fn run_op(p: &Program, step: &Step, s: &Stream) -> Result<Outputs> {
    let (n, c, sp, w) = (p.n, p.c, p.s, p.w);
    let big = [n, c, sp];
    let chan = [c];
    let up = |a: Arg, shape: &[usize], v: Values| upload(s, a, shape, v);
    match *step {
        Step::RoundTrip { a, values } => {
            let t = up(a, &big, values)?;
            let got = read(s, &t)?;
            // The reference: the view's elements of the uploaded storage, in row-major order,
            // each stored once in the dtype (every conversion is exact or one rounding).
            let (strides, offset, len) = placement(&big, a.layout);
            let v = storage(a.seed, len, values);
            let mut want = Vec::new();
            for i in 0..big.iter().product::<usize>() {
                let (mut rest, mut pos) = (i, offset);
                for d in (0..3).rev() {
                    pos += rest % big[d] * strides[d];
                    rest /= big[d];
                }
                want.push(v[pos]);
            }
            let want = match a.dt {
                DType::I32 => Read::Ints(want.iter().map(|&x| x as i32).collect()),
                DType::F32 => Read::Floats(want.iter().map(|&x| f64::from(x as f32)).collect()),
                DType::F16 => Read::Floats(want.iter().map(|&x| f64::from(f16::from_f64(x))).collect()),
                DType::BF16 => Read::Floats(want.iter().map(|&x| f64::from(bf16::from_f64(x))).collect()),
                other => unreachable!("the strategies draw no {other:?}"),
            };
            // (A panic fails the case, and proptest shrinks it like any failure.)
            assert_eq!(got, want, "read back vs uploaded ({:?} in {:?} on {:?})", a.dt, a.layout, s.backend());
            Ok(vec![("round trip".to_string(), t.dtype(), got, true)])
        }
        Step::Stats { x, eps, entry, out } => {
            let x = up(x, &big, Values::Small)?;
            let (mean, invstd) = by_entry!(
                entry,
                s,
                (s, &x, eps),
                ops::batch_norm_stats,
                ops::prepare_batch_norm_stats,
                ops::batch_norm_stats_into,
                [mean = Tensor::zeros(s, out, &chan)?, invstd = Tensor::zeros(s, DType::F32, &chan)?]
            );
            outputs(s, &[("mean", &mean), ("invstd", &invstd)], false)
        }
        Step::Gather { x, mean, invstd, counts, running, momentum, eps, entry, out } => {
            let x = up(x, &big, Values::Small)?;
            let mean = up(mean, &[w, c], Values::Small)?;
            let invstd = up(invstd, &[w, c], Values::Scale)?;
            let counts = up(counts, &[w], Values::Count)?;
            let mut rm = running.map(|(a, _)| up(a, &chan, Values::Small)).transpose()?;
            let mut rv = running.map(|(_, b)| up(b, &chan, Values::Scale)).transpose()?;
            let (m, v) = by_entry!(
                entry,
                s,
                (s, &x, &mean, &invstd, rm.as_mut(), rv.as_mut(), momentum, eps, &counts),
                ops::batch_norm_gather_stats_with_counts,
                ops::prepare_batch_norm_gather_stats_with_counts,
                ops::batch_norm_gather_stats_with_counts_into,
                [m = Tensor::zeros(s, out, &chan)?, v = Tensor::zeros(s, DType::F32, &chan)?]
            );
            let mut named = vec![("meanAll", &m), ("invstdAll", &v)];
            if let (Some(rm), Some(rv)) = (&rm, &rv) {
                named.extend([("runningMean", rm), ("runningVar", rv)]);
            }
            outputs(s, &named, false)
        }
        Step::Elemt { x, weight, bias, mean, invstd, eps, entry, out } => {
            let x = up(x, &big, Values::Small)?;
            let weight = weight.map(|a| up(a, &chan, Values::Small)).transpose()?;
            let bias = bias.map(|a| up(a, &chan, Values::Small)).transpose()?;
            let mean = up(mean, &chan, Values::Small)?;
            let invstd = up(invstd, &chan, Values::Scale)?;
            let (wt, bt) = (weight.as_ref(), bias.as_ref());
            let y = by_entry!(
                entry,
                s,
                (s, &x, wt, bt, &mean, &invstd, eps),
                ops::batch_norm_elemt,
                ops::prepare_batch_norm_elemt,
                ops::batch_norm_elemt_into,
                [y = Tensor::zeros(s, out, &big)?]
            );
            outputs(s, &[("output", &y)], false)
        }
        Step::ElemtBackward { dy, x, mean, invstd, weight, sums, counter, entry, out } => {
            let dy = up(dy, &big, Values::Small)?;
            let x = up(x, &big, Values::Small)?;
            let mean = up(mean, &chan, Values::Small)?;
            let invstd = up(invstd, &chan, Values::Scale)?;
            let weight = weight.map(|a| up(a, &chan, Values::Small)).transpose()?;
            let sum_dy = up(sums.0, &chan, Values::Small)?;
            let sum_dy_xmu = up(sums.1, &chan, Values::Small)?;
            let counter = up(counter, &[w], Values::Count)?;
            let wt = weight.as_ref();
            let dx = by_entry!(
                entry,
                s,
                (s, &dy, &x, &mean, &invstd, wt, &sum_dy, &sum_dy_xmu, &counter),
                ops::batch_norm_elemt_backward,
                ops::prepare_batch_norm_elemt_backward,
                ops::batch_norm_elemt_backward_into,
                [dx = Tensor::zeros(s, out, &big)?]
            );
            outputs(s, &[("gradInput", &dx)], false)
        }
        Step::Cast { x, dtype, entry } => {
            let x = up(x, &big, Values::Wide)?;
            let y = by_entry!(
                entry,
                s,
                (s, &x, dtype),
                ops::cast,
                ops::prepare_cast,
                ops::cast_into,
                [y = Tensor::zeros(s, dtype, &big)?]
            );
            outputs(s, &[("output", &y)], true)
        }
        Step::BatchNorm { x, weight, bias, running, training, momentum, eps, entry, out } => {
            let x = up(x, &big, Values::Small)?;
            let weight = weight.map(|a| up(a, &chan, Values::Small)).transpose()?;
            let bias = bias.map(|a| up(a, &chan, Values::Small)).transpose()?;
            let mut rm = running.map(|(a, _)| up(a, &chan, Values::Small)).transpose()?;
            let mut rv = running.map(|(_, b)| up(b, &chan, Values::Scale)).transpose()?;
            let (wt, bt) = (weight.as_ref(), bias.as_ref());
            let (y, _saved) = by_entry!(
                entry,
                s,
                (s, &x, wt, bt, rm.as_mut(), rv.as_mut(), training, momentum, eps),
                ops::batch_norm,
                ops::prepare_batch_norm,
                ops::batch_norm_into,
                [y = Tensor::zeros(s, out, &big)?, saved = ops::BatchNormSaved::new(s, c)?]
            );
            let mut named = vec![("output", &y)];
            if let Some(rm) = &rm {
                named.push(("runningMean", rm));
            }
            if let Some(rv) = &rv {
                named.push(("runningVar", rv));
            }
            outputs(s, &named, false)
        }
        Step::BatchNormBackward { dy, x, weight, running, training, eps, mask, entry, out } => {
            let dy = up(dy, &big, Values::Small)?;
            let x = up(x, &big, Values::Small)?;
            let weight = weight.map(|a| up(a, &chan, Values::Small)).transpose()?;
            let rm = running.map(|(a, _)| up(a, &chan, Values::Small)).transpose()?;
            let rv = running.map(|(_, b)| up(b, &chan, Values::Scale)).transpose()?;
            let wt = weight.as_ref();
            // The forward's saved statistics (its running statistics are left alone: no momentum).
            let (_, saved) = ops::batch_norm(s, &x, wt, None, None, None, training, 0.1, eps)?;
            let mask = OutputMask { input_g: mask[0], weight_g: mask[1], bias_g: mask[2] };
            let args = (rm.as_ref(), rv.as_ref());
            let g = match entry {
                Entry::Alloc => ops::batch_norm_backward(s, &dy, &x, wt, args.0, args.1, &saved, training, eps, mask)?,
                _ => {
                    let mut gi = Tensor::zeros(s, out, &big)?;
                    let mut gw = Tensor::zeros(s, DType::F32, &chan)?;
                    let mut gb = Tensor::zeros(s, out, &chan)?;
                    let outs = ops::BatchNormGradsOut {
                        grad_input: Some(&mut gi),
                        grad_weight: Some(&mut gw),
                        grad_bias: Some(&mut gb),
                    };
                    match entry {
                        Entry::TwoPhase { caller_workspace } => launch(
                            s,
                            ops::prepare_batch_norm_backward(
                                s, &dy, &x, wt, args.0, args.1, &saved, training, eps, mask, outs,
                            )?,
                            caller_workspace,
                        )?,
                        _ => ops::batch_norm_backward_into(
                            s, &dy, &x, wt, args.0, args.1, &saved, training, eps, mask, outs,
                        )?,
                    }
                    let on = |t: Tensor, on: bool| on.then_some(t);
                    ops::BatchNormGrads {
                        grad_input: on(gi, mask.input_g),
                        grad_weight: on(gw, mask.weight_g),
                        grad_bias: on(gb, mask.bias_g),
                    }
                }
            };
            let mut named = Vec::new();
            for (name, t) in [("gradInput", &g.grad_input), ("gradWeight", &g.grad_weight), ("gradBias", &g.grad_bias)]
            {
                if let Some(t) = t {
                    named.push((name, t));
                }
            }
            outputs(s, &named, false)
        }
        Step::Collective { .. } | Step::SyncBatchNorm { .. } => unreachable!("run on ranks"),
    }
}

/// A step over two ranks, one thread each; returns each rank's outcome.
fn run_ranks(step: &Step, c: usize, s: usize, ranks: &mut [Rank]) -> Vec<Result<Outputs>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> =
            ranks.iter_mut().enumerate().map(|(r, rank)| scope.spawn(move || run_rank(step, c, s, r, rank))).collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

fn run_rank(step: &Step, c: usize, sp: usize, r: usize, rank: &mut Rank) -> Result<Outputs> {
    let (comm, s) = (&rank.comm, &rank.stream);
    match *step {
        Step::Collective { kind, dt, values, len, seeds } => {
            let a = Arg { dt, layout: Layout::Contiguous, seed: seeds[r] };
            let mut t = upload(s, a, &[len], values)?;
            match kind {
                Collective::AllReduce(op) => comm.all_reduce(s, &mut t, op)?,
                Collective::Broadcast(root) => comm.broadcast(s, &mut t, root)?,
                Collective::AllGather => {
                    let mut out = Tensor::zeros(s, dt, &[2 * len])?;
                    comm.all_gather(s, &t, &mut out)?;
                    t = out;
                }
            }
            outputs(s, &[("collective", &t)], true)
        }
        Step::SyncBatchNorm { dt, n, affine, running, momentum, eps, mask, seed } => {
            let shape = [n[r], c, sp];
            let arg = |k: u64, layout| Arg { dt, layout, seed: seed ^ k.wrapping_mul(0x9E37) ^ r as u64 };
            let x = upload(s, arg(1, Layout::ChannelsLast), &shape, Values::Small)?;
            let dy = upload(s, arg(2, Layout::Contiguous), &shape, Values::Small)?;
            let f32s = |k| Arg { dt: DType::F32, layout: Layout::Contiguous, seed: seed ^ k };
            let weight = affine.then(|| upload(s, f32s(3), &[c], Values::Small)).transpose()?;
            let bias = affine.then(|| upload(s, f32s(4), &[c], Values::Small)).transpose()?;
            let mut rm = running.then(|| upload(s, f32s(5), &[c], Values::Small)).transpose()?;
            let mut rv = running.then(|| upload(s, f32s(6), &[c], Values::Scale)).transpose()?;
            let (y, saved) = sync_batch_norm::forward(
                comm,
                s,
                &x,
                weight.as_ref(),
                bias.as_ref(),
                rm.as_mut(),
                rv.as_mut(),
                momentum,
                eps,
            )?;
            let mask = OutputMask { input_g: mask[0], weight_g: mask[1], bias_g: mask[2] };
            let (dx, dw, db) = sync_batch_norm::backward(comm, s, &dy, &saved, weight.as_ref(), mask)?;
            let mut named = vec![("output", &y), ("mean", saved.mean()), ("invstd", saved.invstd())];
            for (name, t) in [("gradInput", &dx), ("gradWeight", &dw), ("gradBias", &db)] {
                if let Some(t) = t {
                    named.push((name, t));
                }
            }
            if let (Some(rm), Some(rv)) = (&rm, &rv) {
                named.push(("runningMean", rm));
                // With one element per channel in the whole batch the unbiased variance divides
                // 0 by 0: CANN's gather forms it from 1/invstd² − eps, whose rounding (the CPU
                // twin's bf16 statistics come from another kernel than CANN's two passes) gives
                // either sign of infinity or NaN. Both must be non-finite; the sign is not compared.
                if n.iter().sum::<usize>() * sp == 1 {
                    let v = read(s, rv)?;
                    let Read::Floats(v) = &v else { unreachable!("runningVar is f32") };
                    assert!(v.iter().all(|x| !x.is_finite()), "runningVar {v:?} finite from one element per channel");
                } else {
                    named.push(("runningVar", rv));
                }
            }
            outputs(s, &named, false)
        }
        _ => unreachable!("not a step over ranks"),
    }
}

fn check(what: &str, mock: Result<Outputs>, cpu: Result<Outputs>) -> Outcome {
    agree(what, &mock, &cpu)?;
    let (Ok(mock), Ok(cpu)) = (mock, cpu) else { return Ok(()) };
    if mock.len() != cpu.len() {
        return Err(fail(format!("{what}: {} outputs on the mock, {} on the cpu", mock.len(), cpu.len())));
    }
    for ((name, dtype, m, exact), (_, cdtype, c, _)) in mock.iter().zip(&cpu) {
        if dtype != cdtype {
            return Err(fail(format!("{what}: {name}: dtype {dtype:?} on the mock, {cdtype:?} on the cpu")));
        }
        compare(&format!("{what}: {name}"), *dtype, m, c, *exact)?;
    }
    Ok(())
}

fn run_program(world: &mut World, p: &Program) -> Outcome {
    ascend::mock::refuse_repeatable("*", p.refuse);
    let outcome = run_steps(world, p);
    ascend::mock::refuse_repeatable("*", false);
    REFUSING_PROGRAMS.fetch_add(usize::from(p.refuse), Relaxed);
    outcome
}

fn run_steps(world: &mut World, p: &Program) -> Outcome {
    PROGRAMS.fetch_add(1, Relaxed);
    // The launch cache on or off (entries beyond a smaller capacity are retired, with their
    // launches possibly still queued).
    let capacity = p.capacity.unwrap_or(world.default_capacity);
    let mock_streams = |w: &World| -> Vec<LaunchCacheStats> {
        std::iter::once(&w.mock).chain(w.mock_ranks.iter().map(|r| &r.stream)).map(Stream::launch_cache_stats).collect()
    };
    std::iter::once(&world.mock)
        .chain(world.mock_ranks.iter().map(|r| &r.stream))
        .for_each(|s| s.set_launch_cache_capacity(capacity));
    let before = mock_streams(world);
    for (i, step) in p.steps.iter().enumerate() {
        let what = format!("step {i} ({step:?}) of [{}, {}, {}], W {}", p.n, p.c, p.s, p.w);
        let violations = ascend::mock::stats().violations;
        STEPS.fetch_add(1, Relaxed);
        match step {
            Step::Collective { .. } | Step::SyncBatchNorm { .. } => {
                let mock = run_ranks(step, p.c, p.s, &mut world.mock_ranks);
                let cpu = run_ranks(step, p.c, p.s, &mut world.cpu_ranks);
                for (r, (m, c)) in mock.into_iter().zip(cpu).enumerate() {
                    check(&format!("{what}, rank {r}"), m, c)?;
                }
            }
            _ => check(&what, run_op(p, step, &world.mock), run_op(p, step, &world.cpu))?,
        }
        if ascend::mock::stats().violations != violations {
            return Err(fail(format!("{what}: mock violations {:?}", ascend::mock::violations_since(violations))));
        }
    }
    for (a, b) in mock_streams(world).iter().zip(&before) {
        CACHE_HITS.fetch_add((a.hits - b.hits) as usize, Relaxed);
        CACHE_MISSES.fetch_add((a.misses - b.misses) as usize, Relaxed);
    }
    if capacity == 0 {
        UNCACHED_PROGRAMS.fetch_add(1, Relaxed);
    }
    Ok(())
}

static PROGRAMS: AtomicUsize = AtomicUsize::new(0);
static STEPS: AtomicUsize = AtomicUsize::new(0);
static RAN: AtomicUsize = AtomicUsize::new(0);
static REJECTED: AtomicUsize = AtomicUsize::new(0);
static COMPARED: AtomicUsize = AtomicUsize::new(0);
/// Launch cache hits and misses on the mock streams, and programs run with the cache off.
static CACHE_HITS: AtomicUsize = AtomicUsize::new(0);
static CACHE_MISSES: AtomicUsize = AtomicUsize::new(0);
static UNCACHED_PROGRAMS: AtomicUsize = AtomicUsize::new(0);
/// Programs run with every repeatable executor refused.
static REFUSING_PROGRAMS: AtomicUsize = AtomicUsize::new(0);

#[test]
fn every_operator_collective_and_sync_batch_norm_agrees_with_the_cpu_twin() {
    // The strategies' value trees are deep in a debug build: run on a thread with room for them.
    let runner = std::thread::Builder::new().stack_size(256 << 20).spawn(differential).expect("test thread");
    if let Err(panic) = runner.join() {
        std::panic::resume_unwind(panic);
    }
}

fn differential() {
    // Two mock devices; read by the mock at aclInit, before which nothing in this binary runs.
    std::env::set_var("ASCEND_MOCK_DEVICE_COUNT", "2");
    let cases = common::env_or("DIFFERENTIAL_CASES", 300);
    let seed: u64 = common::env_or("DIFFERENTIAL_SEED", 0xD1FF_5EED);
    let seed_bytes = common::seed_bytes(seed);
    let before = ascend::mock::stats();
    let result = {
        let world = std::cell::RefCell::new(World::new().expect("streams and communicators on both backends"));
        let config = Config { cases, failure_persistence: None, max_shrink_iters: 2048, ..Config::default() };
        let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes));
        runner.run(&program(), |p| run_program(&mut world.borrow_mut(), &p))
    };
    println!(
        "differential: seed {seed}, {} programs, {} steps: {} ran on both backends, {} rejected alike, \
         {} outputs compared; launch cache: {} hits, {} misses, {} programs with it off, {} with executors \
         refused",
        PROGRAMS.load(Relaxed),
        STEPS.load(Relaxed),
        RAN.load(Relaxed),
        REJECTED.load(Relaxed),
        COMPARED.load(Relaxed),
        CACHE_HITS.load(Relaxed),
        CACHE_MISSES.load(Relaxed),
        UNCACHED_PROGRAMS.load(Relaxed),
        REFUSING_PROGRAMS.load(Relaxed),
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    let after = ascend::mock::stats();
    let live = |s: &ascend::mock::MockStats| (s.live_allocations, s.live_tensors, s.live_executors, s.live_streams);
    assert_eq!(live(&after), live(&before), "every mock object is released once the world is dropped");
    assert_eq!(after.violations, before.violations, "no mock violation");
}
