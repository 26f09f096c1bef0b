//! Stateful random test of the safe API on the mock CANN, with a CPU-backend twin as the model.
//!
//! proptest generates programs: tensors made (uploaded in any layout, or zeros) and dropped,
//! refilled and read, streams (each on a fresh `Context`) made and dropped on two mock devices,
//! launches of `batch_norm_reduce_backward` (allocating, `_into`, two-phase with and without a
//! caller workspace, with weight or not, any mask, any argument slots, valid or not), two
//! launches at once on two threads sharing their inputs (and a workspace), all-reduces over a
//! communicator of the two mock devices (one thread per rank), DLPack exchanges (a tensor
//! exported and imported back in its place), `nn::BatchNorm` training or eval steps
//! (`aclnnBatchNorm` and `aclnnBatchNormBackward`, results dropped before they ran, compared by
//! outcome), pinned host buffers shared by
//! every stream across steps (refused on another device's stream), long bursts of launches
//! alternating between two streams without a host synchronise (live events checked against the
//! crate's bound), and an injected fault
//! before any step (at any CANN function the crate binds). The launch cache is on and off: each
//! program gives every stream slot a capacity (0, i.e. off, 1, 2 or the environment's default,
//! so CI's run with `ASCEND_NO_LAUNCH_CACHE=1` has slots with the cache on too), and steps change
//! a stream's capacity or flush its cache (entries retired with their launches still queued), and
//! steps make the mock refuse or accept again the operator's repeatable executors (as CANN refuses
//! those it cannot repeat; a refused call is launched uncached). Every step runs on the mock and on a
//! CPU twin of the same program, and after every step:
//! - the mock counted no violation (no memory freed, raced or misused);
//! - both backends agreed: the same success, or the same aclnn status (a step that crosses
//!   devices fails on the mock alone, with 161002; a faulted step may fail on the mock alone,
//!   and then what it would have written is unknown until it is written again);
//! - every read of a known tensor returns exactly the twin's bits (the data are small integers
//!   and signed powers of two, so every sum is exact on both backends and every rounding is
//!   the same single rounding).
//!
//! After each program every live mock counter is back where it was, except for what the crate
//! reports it leaked on purpose (`ascend::mock::leaks`, when a fault hit a destroy call).
//! A failure shrinks to a minimal program. `STATEFUL_CASES` sets the number of programs
//! (default 700, about 23,000 steps), `STATEFUL_SEED` the seed (default: fixed).
#![cfg(feature = "mock")]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

use ascend::hccl::{Communicator, ReduceOp};
use ascend::ops::{
    batch_norm_reduce_backward, batch_norm_reduce_backward_into, prepare_batch_norm_reduce_backward, OutputMask,
    ReduceBackward, ReduceBackwardOut, Workspace,
};
use ascend::{Context, DType, Result, Stream, Tensor};

/// Slots 0..BIG hold (N, C, S) tensors, BIG..TENSOR_SLOTS hold [C] ones.
const BIG: usize = 4;
const TENSOR_SLOTS: usize = 10;
const STREAM_SLOTS: usize = 3;
const DEVICES: u8 = 2;
/// The status injected faults return (ACL_ERROR_RT_INTERNAL_ERROR).
const FAULT_STATUS: i32 = 507899;
const INVALID: i32 = 161002;

/// The operator the programs launch (its phase-2 name).
const OPERATOR: &str = "aclnnBatchNormReduceBackward";

/// Every CANN function the crate binds, but the one that reads error texts.
fn fault_apis() -> Vec<&'static str> {
    use ascend::sys::symbols::{ASCENDCL_SYMBOLS, NNOPBASE_SYMBOLS, OPERATORS};
    let ops = OPERATORS.iter().flat_map(|o| [o.phase1, o.name]);
    ASCENDCL_SYMBOLS.iter().chain(NNOPBASE_SYMBOLS).copied().chain(ops).filter(|f| *f != "aclGetRecentErrMsg").collect()
}

// ---------------------------------------------------------------------------------------------
// Programs

#[derive(Clone, Copy, Debug)]
enum Layout {
    Contiguous,
    /// Channel dim innermost (for [C] slots: contiguous).
    ChannelsLast,
    /// Every stride doubled, offset 1.
    Spread,
}

#[derive(Clone, Copy, Debug)]
enum Variant {
    Alloc,
    Into,
    TwoPhase { caller_workspace: bool },
}

#[derive(Clone, Debug)]
struct Launch {
    stream: usize,
    /// Slots of gradOut, input (big) and mean, invstd, weight ([C]).
    args: [usize; 5],
    with_weight: bool,
    /// Slots receiving sumDy, sumDyXmu, gradWeight, gradBias ([C]).
    outs: [usize; 4],
    mask: [bool; 3],
    variant: Variant,
}

impl Launch {
    fn mask(&self) -> OutputMask {
        OutputMask { input_g: self.mask[0], weight_g: self.mask[1], bias_g: self.mask[2] }
    }

    fn enabled(&self) -> [bool; 4] {
        [self.mask[0], self.mask[0], self.mask[1], self.mask[2]]
    }

    fn input_slots(&self) -> Vec<usize> {
        let n = if self.with_weight { 5 } else { 4 };
        self.args[..n].to_vec()
    }

    /// The output slots the call passes (those the mask turns on).
    fn output_slots(&self) -> Vec<usize> {
        self.outs.iter().zip(self.enabled()).filter(|(_, on)| *on).map(|(&s, _)| s).collect()
    }
}

#[derive(Clone, Debug)]
enum Step {
    NewStream {
        slot: usize,
        device: u8,
    },
    DropStream {
        slot: usize,
    },
    Upload {
        slot: usize,
        stream: usize,
        dt: DType,
        layout: Layout,
        seed: u64,
    },
    Zeros {
        slot: usize,
        stream: usize,
        dt: DType,
    },
    DropTensor {
        slot: usize,
    },
    Refill {
        slot: usize,
        stream: usize,
        seed: u64,
    },
    Read {
        slot: usize,
        stream: usize,
    },
    Sync {
        stream: usize,
    },
    Launch(Launch),
    Parallel(Launch, Launch),
    /// An all-reduce of slot `a` (rank 0) and slot `b` (rank 1) over a communicator of mock
    /// devices 0 and 1, one thread per rank, each synchronising its rank's stream.
    AllReduce {
        a: usize,
        b: usize,
        max: bool,
    },
    /// An event recorded on stream `from`, waited for by stream `to` (when both exist on one
    /// device), dropped at once; its query must not fail.
    Event {
        from: usize,
        to: usize,
    },
    /// Fills a pinned `HostBuffer` and copies it into the slot asynchronously (`f32`
    /// contiguous slots); the host buffer is dropped before anything waits for the copy.
    AsyncUpload {
        slot: usize,
        stream: usize,
        seed: u64,
    },
    /// Copies the slot into a pinned `HostBuffer` asynchronously and compares it with the twin.
    AsyncRead {
        slot: usize,
        stream: usize,
    },
    /// (Caching allocator) A stream of the world's shared context of `device`: every such stream
    /// allocates from one cache, so blocks freed by work on one are reused by the others.
    SharedStream {
        slot: usize,
        device: u8,
    },
    /// (Caching allocator) Returns the shared contexts' cached blocks to the device.
    EmptyCache,
    /// (Launch cache) The last single launch that ran on both backends (and writes none of its
    /// inputs), again: the same slots and stream, so the same signature when the slots kept
    /// their layouts, with whatever tensors they hold now (a cached executor is rebound to them).
    Again,
    /// (Launch cache) Sets the stream's launch cache capacity (0: off).
    CacheCapacity {
        stream: usize,
        capacity: usize,
    },
    /// (Launch cache) Empties the stream's launch cache without synchronising (its entries are
    /// retired while their launches may be queued), keeping its capacity.
    FlushLaunchCache {
        stream: usize,
    },
    /// (Launch cache) From now on the mock refuses (`on`) or accepts again
    /// `aclSetAclOpExecutorRepeatable` for the operator's executors (until the program ends).
    RefuseRepeatable {
        on: bool,
    },
    /// (DLPack) The slot's tensor exported on the stream (versioned or legacy) and imported back
    /// in its place: the same memory on the mock, a copy on the CPU twin. `foreign`: the export
    /// is wrapped in a capsule of another producer (its own deleter) first, so the import is
    /// foreign memory whose deleter runs once its work has run (never waited for at the drop).
    Exchange {
        slot: usize,
        stream: usize,
        legacy: bool,
        foreign: bool,
    },
    /// Refills the world's pinned `HostBuffer` of the slot's size (made on the stream's device
    /// at its first use, then kept: shared by every stream and step, so copies queued on one
    /// stream are still pending when another stream copies it) and copies it into the slot
    /// asynchronously. A buffer of another device than the stream's is refused (audit 4, G02).
    SharedHostUpload {
        slot: usize,
        stream: usize,
        seed: u64,
    },
    /// A long loop without a host synchronise: the launch `times` times, alternating between its
    /// stream and `other` (so every run is ordered after the previous one on the device), each
    /// checked against the twin; live events stay within the crate's bound.
    Burst {
        launch: Launch,
        other: usize,
        times: usize,
    },
    /// (Layer) `nn::BatchNorm` on the stream: a fresh layer (training, or eval), forward on slot
    /// `x` and backward with slot `dy` (both (N, C, S)), every result dropped at once, before the
    /// stream ran it. Compared with the twin by outcome (its values are not exact sums).
    Layer {
        stream: usize,
        x: usize,
        dy: usize,
        eval: bool,
    },
    /// (Graph capture) The launch run eagerly, then captured on its stream (`Stream::capture`)
    /// and replayed `times` times alternating with stream `other` (on its device); the graph is
    /// kept by the world (so later steps drop and refill its tensors while it lives). A capture
    /// refused (memory it would allocate, a dependency on another stream) changes nothing.
    Captured {
        launch: Launch,
        other: usize,
        times: usize,
    },
    /// Arms a fault at `FAULT_APIS[api]` for this thread, runs the step, disarms.
    Fault {
        api: usize,
        step: Box<Step>,
    },
}

fn dt() -> impl Strategy<Value = DType> {
    prop_oneof![3 => Just(DType::F32), 1 => Just(DType::F16), 1 => Just(DType::BF16)]
}

fn layout() -> impl Strategy<Value = Layout> {
    prop_oneof![Just(Layout::Contiguous), Just(Layout::ChannelsLast), Just(Layout::Spread)]
}

fn launch() -> impl Strategy<Value = Launch> {
    let variant = prop_oneof![
        Just(Variant::Alloc),
        Just(Variant::Into),
        any::<bool>().prop_map(|caller_workspace| Variant::TwoPhase { caller_workspace }),
    ];
    // Mostly: per-channel inputs from the first [C] slots and four distinct outputs from the
    // last ones, so most launches can be written in safe Rust; sometimes any slots at all.
    let per_channel = || prop_oneof![3 => BIG..BIG + 3, 1 => BIG..TENSOR_SLOTS];
    let outs = prop_oneof![
        3 => Just([6usize, 7, 8, 9]).prop_shuffle(),
        1 => proptest::array::uniform4(BIG..TENSOR_SLOTS),
    ];
    (
        0..STREAM_SLOTS,
        (0..BIG, 0..BIG + 1, per_channel(), per_channel(), per_channel()),
        any::<bool>(),
        outs,
        proptest::array::uniform3(any::<bool>()),
        variant,
    )
        .prop_map(|(stream, (dy, x, mean, invstd, weight), with_weight, outs, mask, variant)| Launch {
            stream,
            // One tensor as both gradOut and input a third of the time (always the same dtype).
            args: [dy, if x == BIG { dy } else { x }, mean, invstd, weight],
            with_weight,
            outs,
            mask,
            variant,
        })
}

fn step() -> impl Strategy<Value = Step> {
    let slot = 0..TENSOR_SLOTS;
    let stream = 0..STREAM_SLOTS;
    let base = prop_oneof![
        2 => (stream.clone(), 0..DEVICES).prop_map(|(slot, device)| Step::NewStream { slot, device }),
        1 => stream.clone().prop_map(|slot| Step::DropStream { slot }),
        6 => (slot.clone(), stream.clone(), dt(), layout(), any::<u64>())
            .prop_map(|(slot, stream, dt, layout, seed)| Step::Upload { slot, stream, dt, layout, seed }),
        1 => (slot.clone(), stream.clone(), dt()).prop_map(|(slot, stream, dt)| Step::Zeros { slot, stream, dt }),
        2 => slot.clone().prop_map(|slot| Step::DropTensor { slot }),
        2 => (slot.clone(), stream.clone(), any::<u64>())
            .prop_map(|(slot, stream, seed)| Step::Refill { slot, stream, seed }),
        3 => (slot.clone(), stream.clone()).prop_map(|(slot, stream)| Step::Read { slot, stream }),
        1 => stream.clone().prop_map(|stream| Step::Sync { stream }),
        2 => (stream.clone(), stream.clone()).prop_map(|(from, to)| Step::Event { from, to }),
        2 => (slot.clone(), stream.clone(), any::<u64>())
            .prop_map(|(slot, stream, seed)| Step::AsyncUpload { slot, stream, seed }),
        2 => (slot.clone(), stream.clone()).prop_map(|(slot, stream)| Step::AsyncRead { slot, stream }),
        2 => (slot.clone(), stream.clone(), any::<u64>())
            .prop_map(|(slot, stream, seed)| Step::SharedHostUpload { slot, stream, seed }),
        1 => (launch(), stream.clone(), 8..80usize)
            .prop_map(|(launch, other, times)| Step::Burst { launch, other, times }),
        6 => launch().prop_map(Step::Launch),
        2 => (stream.clone(), 0..BIG, 0..BIG, any::<bool>())
            .prop_map(|(stream, x, dy, eval)| Step::Layer { stream, x, dy, eval }),
        2 => (launch(), stream.clone(), 1..4usize)
            .prop_map(|(launch, other, times)| Step::Captured { launch, other, times }),
        2 => (launch(), launch()).prop_map(|(a, b)| Step::Parallel(a, b)),
        1 => (stream.clone(), prop_oneof![0..3usize, Just(256)])
            .prop_map(|(stream, capacity)| Step::CacheCapacity { stream, capacity }),
        1 => stream.clone().prop_map(|stream| Step::FlushLaunchCache { stream }),
        1 => any::<bool>().prop_map(|on| Step::RefuseRepeatable { on }),
        6 => Just(Step::Again),
        2 => (slot.clone(), stream.clone(), any::<bool>(), any::<bool>())
            .prop_map(|(slot, stream, legacy, foreign)| Step::Exchange { slot, stream, legacy, foreign }),
        // Rank 1's tensor from slot 3 or 8 (device 1 in half the programs), rank 0's of the same kind.
        2 => (any::<bool>(), 0..3usize, any::<bool>()).prop_map(|(big, i, max)| {
            let (a, b) = if big { (i, 3) } else { (BIG + i, 8) };
            Step::AllReduce { a, b, max }
        }),
    ];
    let apis = fault_apis().len();
    prop_oneof![
        8 => base.clone(),
        1 => (0..apis, base.clone()).prop_map(|(api, step)| Step::Fault { api, step: Box::new(step) }),
        2 => cache_step(base),
    ]
}

/// The caching allocator's steps: streams sharing a context (and so a cache), `empty_cache`,
/// and steps run with an injected `aclrtMalloc` failure (which the allocator may absorb by
/// returning its cache and retrying once).
fn cache_step(base: impl Strategy<Value = Step> + Clone + 'static) -> impl Strategy<Value = Step> {
    let malloc = fault_apis().iter().position(|a| *a == "aclrtMalloc").expect("aclrtMalloc is bound");
    prop_oneof![
        3 => (0..STREAM_SLOTS, 0..DEVICES).prop_map(|(slot, device)| Step::SharedStream { slot, device }),
        1 => Just(Step::EmptyCache),
        2 => base.prop_map(move |step| Step::Fault { api: malloc, step: Box::new(step) }),
    ]
}

#[derive(Clone, Debug)]
struct Program {
    /// (N, C, S): N may be 0 (empty inputs).
    n: usize,
    c: usize,
    s: usize,
    /// The device of each stream slot, made before the steps.
    devices: [u8; STREAM_SLOTS],
    /// The launch cache capacity of every stream made in each slot (`None`: the environment's
    /// default, 256 unless `ASCEND_NO_LAUNCH_CACHE=1` or `ASCEND_LAUNCH_CACHE_SIZE` says
    /// otherwise).
    capacities: [Option<usize>; STREAM_SLOTS],
    /// Uploads filling every tensor slot before the steps (so most launches find arguments).
    init: Vec<Step>,
    steps: Vec<Step>,
}

fn program() -> impl Strategy<Value = Program> {
    let init = proptest::collection::vec((dt(), layout(), any::<u64>(), 0..STREAM_SLOTS), TENSOR_SLOTS).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(slot, (dt, layout, seed, stream))| {
                // Slots 3 and 8 on stream 2, which is on device 1 in half the programs.
                let stream = if slot == 3 || slot == 8 { 2 } else { stream % 2 };
                Step::Upload { slot, stream, dt, layout, seed }
            })
            .collect::<Vec<_>>()
    });
    let devices = (0..DEVICES).prop_map(|d| [0, 0, d]);
    let capacity = prop_oneof![Just(None), Just(Some(0)), Just(Some(1)), Just(Some(2))];
    let capacities = proptest::array::uniform3(capacity);
    (0usize..4, 1usize..5, 1usize..4, devices, capacities, init, proptest::collection::vec(step(), 10..60))
        .prop_map(|(n, c, s, devices, capacities, init, steps)| Program { n, c, s, devices, capacities, init, steps })
}

// ---------------------------------------------------------------------------------------------
// The world: mock tensors and streams, each with its CPU twin

struct Slot {
    mock: Tensor,
    cpu: Tensor,
    device: u8,
    /// Whether `mock` holds what `cpu` holds (false after a faulted write).
    known: bool,
}

struct World {
    shape: [usize; 3],
    c: usize,
    streams: [Option<(Stream, u8)>; STREAM_SLOTS],
    cpu: Stream,
    slots: [Option<Slot>; TENSOR_SLOTS],
    apis: Vec<&'static str>,
    /// A communicator of mock devices 0 and 1 with a stream per rank, made at the first
    /// all-reduce step.
    comms: Option<Vec<(Communicator, Stream)>>,
    /// The context of each device that `SharedStream` steps make their streams on.
    shared: [Option<Context>; DEVICES as usize],
    /// The launch cache capacity of the streams made in each slot (see [`Program`]).
    capacities: [Option<usize>; STREAM_SLOTS],
    /// The last single launch that ran on both backends and writes none of its inputs, for `Again`.
    last_launch: Option<Launch>,
    /// `SharedHostUpload`'s pinned buffers, of the big and the [C] slots' sizes, with their device.
    hosts: [Option<(ascend::HostBuffer<f32>, u8)>; 2],
    /// The graphs `Captured` made, alive until the program ends.
    graphs: Vec<ascend::Graph>,
}

type Outcome = std::result::Result<(), TestCaseError>;

fn fail(msg: impl Into<String>) -> TestCaseError {
    TestCaseError::fail(msg.into())
}

/// Random values: small integers (`big`) or signed powers of two.
fn rng_values(seed: u64, n: usize, big: bool) -> Vec<f32> {
    common::Rng::new(seed).map_draws(n, |r| {
        if big {
            (r % 9) as f32 - 4.0 // integers in [-4, 4]
        } else {
            [-2.0, -1.0, -0.5, 0.5, 1.0, 2.0][(r % 6) as usize] // signed powers of two
        }
    })
}

/// Both outcomes agree: both succeeded, or both failed with the same status.
fn agree<A, B>(what: &str, mock: &Result<A>, cpu: &Result<B>) -> Outcome {
    match (mock, cpu) {
        (Ok(_), Ok(_)) => Ok(()),
        (Err(m), Err(c)) if m.status() == c.status() => Ok(()),
        (m, c) => {
            Err(fail(format!("{what}: backends disagree: mock {:?}, cpu {:?}", m.as_ref().err(), c.as_ref().err())))
        }
    }
}

fn expect_invalid<A>(what: &str, r: &Result<A>) -> Outcome {
    match r {
        Err(e) if e.status() == Some(INVALID) => Ok(()),
        Err(e) => Err(fail(format!("{what}: expected 161002, got {e:?}"))),
        Ok(_) => Err(fail(format!("{what}: a call across devices succeeded"))),
    }
}

/// After an asynchronous upload of `data` into `t` on the mock (`mock`, its result): the twin gets
/// `data` too, and the slot's value is known unless the upload failed under an injected fault.
fn uploaded(t: &mut Slot, cpu: &Stream, data: &[f32], mock: Result<()>, what: &str, faulted: bool) -> Outcome {
    t.cpu.copy_from_slice(cpu, data).map_err(|e| fail(format!("cpu refill: {e:?}")))?;
    match mock {
        Ok(()) => t.known = true,
        Err(e) if !faulted => return Err(fail(format!("{what}: {e:?}"))),
        Err(_) => {
            fault_error();
            t.known = false;
        }
    }
    Ok(())
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// One launch variant on one backend. Returns the allocating variant's outputs.
fn run_launch(
    variant: Variant,
    stream: &Stream,
    ins: [&Tensor; 4],
    weight: Option<&Tensor>,
    mask: OutputMask,
    outs: [Option<&mut Tensor>; 4],
    shared_workspace: Option<&Workspace>,
) -> Result<Option<ReduceBackward>> {
    let [dy, x, mean, invstd] = ins;
    let [sum_dy, sum_dy_xmu, grad_weight, grad_bias] = outs;
    let out = ReduceBackwardOut { sum_dy, sum_dy_xmu, grad_weight, grad_bias };
    match variant {
        Variant::Alloc => batch_norm_reduce_backward(stream, dy, x, mean, invstd, weight, mask).map(Some),
        Variant::Into => batch_norm_reduce_backward_into(stream, dy, x, mean, invstd, weight, mask, out).map(|()| None),
        Variant::TwoPhase { caller_workspace } => {
            let p = prepare_batch_norm_reduce_backward(stream, dy, x, mean, invstd, weight, mask, out)?;
            if let Some(ws) = shared_workspace {
                return p.launch(stream, Some(ws)).map(|()| None);
            }
            if caller_workspace {
                // Larger than asked, so an empty call (0 bytes) must still pass null.
                let ws = Workspace::new(stream, p.workspace_size() + 64)?;
                p.launch(stream, Some(&ws))?;
                drop(ws); // while the launch may still be queued
                Ok(None)
            } else {
                p.launch(stream, None).map(|()| None)
            }
        }
    }
}

/// The CPU twin's validation of a launch (a prepared call, dropped unlaunched: nothing runs).
fn cpu_validate(
    cpu: &Stream,
    ins: [&Tensor; 4],
    weight: Option<&Tensor>,
    mask: OutputMask,
    outs: [Option<&mut Tensor>; 4],
) -> Result<()> {
    let [dy, x, mean, invstd] = ins;
    let [sum_dy, sum_dy_xmu, grad_weight, grad_bias] = outs;
    let out = ReduceBackwardOut { sum_dy, sum_dy_xmu, grad_weight, grad_bias };
    prepare_batch_norm_reduce_backward(cpu, dy, x, mean, invstd, weight, mask, out).map(drop)
}

/// What a launch needs from the world, taken out of it for the call: the output slots (moved
/// out, so the inputs can be borrowed beside them).
struct Taken {
    outs: [Option<Slot>; 4],
}

impl World {
    fn new(p: &Program) -> Self {
        World {
            shape: [p.n, p.c, p.s],
            c: p.c,
            streams: Default::default(),
            cpu: Context::cpu().new_stream().expect("cpu stream"),
            slots: Default::default(),
            apis: fault_apis(),
            comms: None,
            shared: Default::default(),
            capacities: p.capacities,
            last_launch: None,
            hosts: Default::default(),
            graphs: Vec::new(),
        }
    }

    /// Puts a stream just made into `slot`, with the slot's launch cache capacity.
    fn place(&mut self, slot: usize, s: Stream, device: u8) {
        if let Some(capacity) = self.capacities[slot] {
            s.set_launch_cache_capacity(capacity);
        }
        self.streams[slot] = Some((s, device));
    }

    /// The launch cache's steps: a new capacity, or a flush (no synchronisation in either).
    fn run_launch_cache_step(&mut self, step: &Step) -> Outcome {
        let (Step::CacheCapacity { stream, .. } | Step::FlushLaunchCache { stream }) = step else {
            return Err(fail(format!("not a launch cache step: {step:?}")));
        };
        let Some((s, _)) = &self.streams[*stream] else { return Ok(()) };
        let before = s.launch_cache_stats();
        let capacity = match step {
            Step::CacheCapacity { capacity, .. } => *capacity,
            _ => before.capacity,
        };
        if matches!(step, Step::FlushLaunchCache { .. }) {
            s.set_launch_cache_capacity(0);
        }
        s.set_launch_cache_capacity(capacity);
        let after = s.launch_cache_stats();
        let kept = before.entries.min(if matches!(step, Step::FlushLaunchCache { .. }) { 0 } else { capacity });
        let retired = (before.entries - kept) as u64;
        if (after.capacity, after.entries, after.evictions) != (capacity, kept, before.evictions + retired) {
            return Err(fail(format!("launch cache {step:?}: {before:?} -> {after:?}")));
        }
        Ok(())
    }

    /// The caching allocator's steps (see [`cache_step`]).
    fn run_cache_step(&mut self, step: &Step, faulted: bool) -> Outcome {
        match step {
            Step::SharedStream { slot, device } => {
                self.streams[*slot] = None;
                let ctx = match &self.shared[usize::from(*device)] {
                    Some(ctx) => Ok(ctx.clone()),
                    None => ascend::mock::context(i32::from(*device)),
                };
                let made = ctx.and_then(|ctx| Ok((ctx.new_stream()?, ctx)));
                match made {
                    Ok((s, ctx)) => {
                        self.place(*slot, s, *device);
                        self.shared[usize::from(*device)] = Some(ctx);
                    }
                    Err(e) if !faulted => return Err(fail(format!("shared stream: {e:?}"))),
                    Err(_) => fault_error(),
                }
            }
            Step::EmptyCache => {
                for ctx in self.shared.iter().flatten() {
                    match ctx.empty_cache() {
                        Ok(()) if !faulted => {
                            // Everything cached went back: a second call frees nothing.
                            let frees = ascend::mock::stats().device_frees;
                            let again = ctx.empty_cache();
                            if again.is_err() || ascend::mock::stats().device_frees != frees {
                                return Err(fail(format!("empty_cache left cached memory ({again:?})")));
                            }
                        }
                        Ok(()) => {}
                        Err(e) if !faulted => return Err(fail(format!("empty_cache: {e:?}"))),
                        Err(_) => fault_error(),
                    }
                }
            }
            _ => return Err(fail(format!("not a cache step: {step:?}"))),
        }
        Ok(())
    }

    /// Puts a tensor made on both backends into `slot` (on `device`); a failure on the mock alone
    /// counts as a fault's when one was injected, any other difference fails the case.
    fn fill_slot(
        &mut self,
        slot: usize,
        device: u8,
        what: &str,
        made: (Result<Tensor>, Result<Tensor>),
        faulted: bool,
    ) -> Outcome {
        match made {
            (Ok(mock), Ok(cpu)) => self.slots[slot] = Some(Slot { mock, cpu, device, known: true }),
            (Err(_), Ok(_)) if faulted => fault_error(),
            (m, c) => return agree(what, &m, &c),
        }
        Ok(())
    }

    fn geometry(&self, slot: usize, layout: Layout) -> (Vec<usize>, Vec<usize>, usize, usize) {
        let [n, c, s] = self.shape;
        if slot >= BIG {
            return match layout {
                Layout::Spread => (vec![c], vec![2], 1, 2 * c + 1),
                _ => (vec![c], vec![1], 0, c),
            };
        }
        let numel = n * c * s;
        match layout {
            Layout::Contiguous => (vec![n, c, s], vec![c * s, s, 1], 0, numel),
            Layout::ChannelsLast => (vec![n, c, s], vec![c * s, 1, c], 0, numel),
            Layout::Spread => (vec![n, c, s], vec![2 * c * s, 2 * s, 2], 1, 2 * numel + 1),
        }
    }

    /// [`Step::SharedHostUpload`].
    fn shared_host_upload(&mut self, slot: usize, stream: usize, seed: u64, faulted: bool) -> Outcome {
        let (Some((s, sdev)), Some(t)) = (&self.streams[stream], &mut self.slots[slot]) else { return Ok(()) };
        if t.mock.dtype() != DType::F32 || !t.mock.is_contiguous() {
            return Ok(());
        }
        let data = rng_values(seed, t.cpu.numel(), slot < BIG);
        if data.is_empty() {
            return Ok(()); // an empty copy does nothing on any device
        }
        let host = &mut self.hosts[usize::from(slot >= BIG)];
        if host.is_none() {
            match ascend::HostBuffer::<f32>::new(s.context(), data.len()) {
                Ok(h) => *host = Some((h, *sdev)),
                Err(e) if !faulted => return Err(fail(format!("host buffer: {e:?}"))),
                Err(_) => {
                    fault_error();
                    return Ok(());
                }
            }
        }
        let Some((h, hdev)) = host else { return Ok(()) };
        // Waits for the copies still queued on it, on whichever streams.
        let slice = h.as_mut_slice();
        if slice.len() != data.len() {
            return if faulted { Ok(()) } else { Err(fail("the shared host buffer could not be waited for")) };
        }
        slice.copy_from_slice(&data);
        let mock = t.mock.copy_from_host_async(s, h);
        if *sdev != t.device {
            return expect_invalid("shared host upload, tensor of another device", &mock);
        }
        if *hdev != *sdev {
            return expect_invalid("shared host upload, host buffer of another device", &mock);
        }
        uploaded(t, &self.cpu, &data, mock, "shared host upload", faulted)
    }

    fn run(&mut self, step: &Step, faulted: bool) -> Outcome {
        match step {
            Step::NewStream { slot, device } => {
                self.streams[*slot] = None;
                let made = ascend::mock::context(i32::from(*device)).and_then(|ctx| ctx.new_stream());
                match made {
                    Ok(s) => self.place(*slot, s, *device),
                    Err(e) if !faulted => return Err(fail(format!("new stream: {e:?}"))),
                    Err(_) => fault_error(),
                }
            }
            Step::SharedStream { .. } | Step::EmptyCache => return self.run_cache_step(step, faulted),
            Step::CacheCapacity { .. } | Step::FlushLaunchCache { .. } => return self.run_launch_cache_step(step),
            Step::RefuseRepeatable { on } => {
                REFUSALS.fetch_add(usize::from(*on), Relaxed);
                ascend::mock::refuse_repeatable(OPERATOR, *on);
            }
            Step::DropStream { slot } => self.streams[*slot] = None,
            Step::DropTensor { slot } => self.slots[*slot] = None,
            Step::Upload { slot, stream, dt, layout, seed } => {
                let Some((s, device)) = &self.streams[*stream] else { return Ok(()) };
                let (shape, strides, offset, len) = self.geometry(*slot, *layout);
                let data = rng_values(*seed, len, *slot < BIG);
                let make = |st: &Stream| upload(st, *dt, &data, &shape, &strides, offset);
                let made = (make(s), make(&self.cpu));
                return self.fill_slot(*slot, *device, "upload", made, faulted);
            }
            Step::Zeros { slot, stream, dt } => {
                let Some((s, device)) = &self.streams[*stream] else { return Ok(()) };
                let shape: Vec<usize> = if *slot < BIG { self.shape.to_vec() } else { vec![self.c] };
                let made = (Tensor::zeros(s, *dt, &shape), Tensor::zeros(&self.cpu, *dt, &shape));
                return self.fill_slot(*slot, *device, "zeros", made, faulted);
            }
            Step::Refill { slot, stream, seed } => {
                let (Some((s, sdev)), Some(t)) = (&self.streams[*stream], &mut self.slots[*slot]) else {
                    return Ok(());
                };
                let data = rng_values(*seed, t.cpu.numel(), *slot < BIG);
                let mock = t.mock.copy_from_slice(s, &data);
                if *sdev != t.device {
                    return expect_invalid("refill across devices", &mock);
                }
                let cpu = t.cpu.copy_from_slice(&self.cpu, &data);
                match (&mock, &cpu) {
                    (Ok(()), Ok(())) => t.known = true,
                    (Err(_), Ok(())) if faulted => {
                        fault_error();
                        t.known = false;
                    }
                    _ => return agree("refill", &mock, &cpu),
                }
            }
            Step::Read { slot, stream } => {
                let (Some((s, sdev)), Some(t)) = (&self.streams[*stream], &self.slots[*slot]) else {
                    return Ok(());
                };
                let mock = t.mock.to_vec::<f32>(s);
                if *sdev != t.device {
                    return expect_invalid("read across devices", &mock);
                }
                let cpu = t.cpu.to_vec::<f32>(&self.cpu).map_err(|e| fail(format!("cpu read: {e:?}")))?;
                match mock {
                    Ok(v) if t.known && bits(&v) != bits(&cpu) => {
                        return Err(fail(format!("slot {slot}: mock read {v:?}, the CPU twin holds {cpu:?}")));
                    }
                    Ok(_) => {
                        if t.known {
                            COMPARED.fetch_add(1, Relaxed);
                        }
                    }
                    Err(e) if t.known && !faulted => return Err(fail(format!("read of slot {slot}: {e:?}"))),
                    Err(_) => fault_error(),
                }
            }
            Step::Sync { stream } => {
                if let Some((s, _)) = &self.streams[*stream] {
                    if let Err(e) = s.synchronize() {
                        if !faulted {
                            return Err(fail(format!("synchronize: {e:?}")));
                        }
                        fault_error();
                    }
                }
            }
            Step::Event { from, to } => {
                let (Some((a, da)), Some((b, db))) = (&self.streams[*from], &self.streams[*to]) else {
                    return Ok(());
                };
                match a.record_event() {
                    Ok(e) => {
                        let waited = b.wait_event(&e);
                        if da != db {
                            return expect_invalid("event of another device", &waited);
                        }
                        if let Err(err) = waited.and_then(|()| e.is_complete()) {
                            if !faulted {
                                return Err(fail(format!("event: {err:?}")));
                            }
                            fault_error();
                        }
                    }
                    Err(e) if !faulted => return Err(fail(format!("record event: {e:?}"))),
                    Err(_) => fault_error(),
                }
            }
            Step::AsyncUpload { slot, stream, seed } => {
                let (Some((s, sdev)), Some(t)) = (&self.streams[*stream], &mut self.slots[*slot]) else {
                    return Ok(());
                };
                if t.mock.dtype() != DType::F32 || !t.mock.is_contiguous() {
                    return Ok(());
                }
                let data = rng_values(*seed, t.cpu.numel(), *slot < BIG);
                let mut h = match ascend::HostBuffer::<f32>::new(s.context(), data.len()) {
                    Ok(h) => h,
                    Err(e) if !faulted => return Err(fail(format!("host buffer: {e:?}"))),
                    Err(_) => {
                        fault_error();
                        return Ok(());
                    }
                };
                h.as_mut_slice().copy_from_slice(&data);
                let mock = t.mock.copy_from_host_async(s, &h);
                drop(h); // the copy is still queued
                if *sdev != t.device {
                    return expect_invalid("async upload across devices", &mock);
                }
                return uploaded(t, &self.cpu, &data, mock, "async upload", faulted);
            }
            Step::AsyncRead { slot, stream } => {
                let (Some((s, sdev)), Some(t)) = (&self.streams[*stream], &self.slots[*slot]) else {
                    return Ok(());
                };
                if t.mock.dtype() != DType::F32 || !t.mock.is_contiguous() {
                    return Ok(());
                }
                let mut h = match ascend::HostBuffer::<f32>::new(s.context(), t.cpu.numel()) {
                    Ok(h) => h,
                    Err(e) if !faulted => return Err(fail(format!("host buffer: {e:?}"))),
                    Err(_) => {
                        fault_error();
                        return Ok(());
                    }
                };
                let read = t.mock.copy_to_host_async(s, &mut h).map(|()| h);
                if *sdev != t.device {
                    return expect_invalid("async read across devices", &read);
                }
                let cpu = t.cpu.to_vec::<f32>(&self.cpu).map_err(|e| fail(format!("cpu read: {e:?}")))?;
                match read {
                    Ok(h) if t.known && !faulted => {
                        if bits(h.as_slice()) != bits(&cpu) {
                            return Err(fail(format!("slot {slot}: async read {:?}, the twin {cpu:?}", h.as_slice())));
                        }
                        COMPARED.fetch_add(1, Relaxed);
                    }
                    Ok(_) => {}
                    Err(e) if !faulted => return Err(fail(format!("async read of slot {slot}: {e:?}"))),
                    Err(_) => fault_error(),
                }
            }
            Step::Launch(l) => return self.launch_one(l, faulted),
            Step::Layer { stream, x, dy, eval } => return self.layer(*stream, [*x, *dy], *eval, faulted),
            Step::Exchange { slot, stream, legacy, foreign } => {
                let (Some((s, sdev)), Some(t)) = (&self.streams[*stream], &mut self.slots[*slot]) else {
                    return Ok(());
                };
                let exported = t.mock.to_dlpack(s);
                if *sdev != t.device {
                    return expect_invalid("exchange across devices", &exported);
                }
                let d = match exported {
                    Ok(d) => d,
                    Err(e) if !faulted => return Err(fail(format!("to_dlpack: {e:?}"))),
                    Err(_) => {
                        fault_error();
                        return Ok(());
                    }
                };
                let exchange = |d: ascend::DlPack, s: &Stream| {
                    // SAFETY: made by to_dlpack, handed over once.
                    unsafe {
                        if *legacy {
                            Tensor::from_dlpack_legacy(s, d.into_raw_legacy())
                        } else {
                            Tensor::from_dlpack(s, d.into_raw())
                        }
                    }
                };
                let back = match foreign {
                    // SAFETY: a live capsule over the export's memory, handed over once; its
                    // deleter (dropping the export) may run on any thread.
                    true => unsafe { Tensor::from_dlpack(s, ForeignCapsule::wrap(d)) },
                    false => exchange(d, s),
                }
                .map_err(|e| fail(format!("from_dlpack: {e:?}")))?;
                // (A foreign empty view addresses nothing: imported as a fresh empty tensor.)
                let same = if *foreign && t.mock.numel() == 0 {
                    back.shape() == t.mock.shape()
                } else {
                    (back.device_ptr(), back.shape(), back.strides())
                        == (t.mock.device_ptr(), t.mock.shape(), t.mock.strides())
                };
                if !same {
                    return Err(fail(format!("exchange changed the tensor: {:?} -> {back:?}", t.mock)));
                }
                t.mock = back; // the exported tensor goes: the buffer lives on in `back`
                let twin = t.cpu.to_dlpack(&self.cpu).and_then(|d| exchange(d, &self.cpu));
                t.cpu = twin.map_err(|e| fail(format!("cpu exchange: {e:?}")))?;
                EXCHANGED.fetch_add(1, Relaxed);
            }
            Step::SharedHostUpload { slot, stream, seed } => {
                return self.shared_host_upload(*slot, *stream, *seed, faulted)
            }
            Step::Burst { launch, other, times } => {
                // Repeated only when it writes none of its inputs (see `launch_one`): else once.
                let ins = launch.input_slots();
                let times = if launch.output_slots().iter().any(|o| ins.contains(o)) { 1 } else { *times };
                for i in 0..times {
                    let mut l = launch.clone();
                    if i % 2 == 1 {
                        l.stream = *other;
                    }
                    self.launch_one(&l, faulted)?;
                }
                let bound = 4096 + 64; // the crate's bound, and a few timing events
                for device in 0..i32::from(DEVICES) {
                    let live = ascend::mock::live_events_on(device);
                    if live > bound {
                        return Err(fail(format!("{live} live events on device {device} after a burst")));
                    }
                }
            }
            Step::Again => {
                let Some(l) = self.last_launch.clone() else { return Ok(()) };
                return self.launch_one(&l, faulted);
            }
            Step::Parallel(a, b) => return self.launch_parallel(a, b, faulted),
            Step::Captured { launch, other, times } => return self.captured(launch, *other, *times, faulted),
            Step::AllReduce { a, b, max } => return self.all_reduce(*a, *b, *max, faulted),
            Step::Fault { api, step } => {
                ascend::mock::fail_next_on_this_thread(self.apis[*api], FAULT_STATUS);
                let r = self.run(step, true);
                ascend::mock::clear_faults();
                return r;
            }
        }
        Ok(())
    }

    /// A layer step (see [`Step::Layer`]) on the mock and on the twin.
    fn layer(&mut self, stream: usize, [x, dy]: [usize; 2], eval: bool, faulted: bool) -> Outcome {
        let (Some((s, sdev)), Some(xs), Some(ds)) = (&self.streams[stream], &self.slots[x], &self.slots[dy]) else {
            return Ok(());
        };
        let run = |s: &Stream, x: &Tensor, dy: &Tensor| -> Result<()> {
            let mut bn = ascend::nn::BatchNorm::new(s, x.shape()[1])?;
            if eval {
                bn.eval();
            }
            let (y, saved) = bn.forward(s, x)?;
            let g = bn.backward(s, dy, &saved)?;
            drop((y, g, saved, bn)); // before the stream ran them
            Ok(())
        };
        let mock = run(s, &xs.mock, &ds.mock);
        LAYERS.fetch_add(1, Relaxed);
        if faulted && mock.is_err() {
            fault_error();
            return Ok(());
        }
        if xs.device != *sdev || ds.device != *sdev {
            CROSSED.fetch_add(1, Relaxed);
            return expect_invalid("layer across devices", &mock);
        }
        agree("layer", &mock, &run(&self.cpu, &xs.cpu, &ds.cpu))
    }

    /// `Step::Captured`: the launch eagerly (the twin runs it, the allocator is warmed), then
    /// captured and replayed; a launch writing none of its inputs writes the same on each replay.
    fn captured(&mut self, l: &Launch, other: usize, times: usize, faulted: bool) -> Outcome {
        let ins = l.input_slots();
        if !self.expressible(l) || l.output_slots().iter().any(|o| ins.contains(o)) {
            return Ok(());
        }
        self.launch_one(l, faulted)?;
        if !self.expressible(l) {
            return Ok(());
        }
        let mut taken = self.take_outputs(l);
        if self.crosses_devices(l, &taken) {
            self.put_back(l, taken);
            return Ok(());
        }
        let (slots, streams) = (&self.slots, &self.streams);
        let Some((s, device)) = &streams[l.stream] else { return Ok(()) };
        let captured = s.capture(ascend::CaptureMode::Global, |s| mock_launch(slots, l, &mut taken, s, None).map(drop));
        let mut outcome = Ok(());
        let graph = match captured {
            Err(_) => {
                CAPTURES_REFUSED.fetch_add(1, Relaxed);
                None
            }
            Ok(graph) => {
                for i in 0..times {
                    let on = match &streams[other] {
                        Some((o, d)) if i % 2 == 1 && d == device => o,
                        _ => s,
                    };
                    if let Err(e) = graph.replay(on) {
                        if !faulted {
                            outcome = Err(fail(format!("replay {i}: {e:?}")));
                        }
                        taken.outs.iter_mut().flatten().for_each(|t| t.known = false);
                        break;
                    }
                    REPLAYS.fetch_add(1, Relaxed);
                }
                Some(graph)
            }
        };
        self.graphs.extend(graph);
        self.put_back(l, taken);
        outcome
    }

    /// Whether the launch can be written in safe Rust (an output is `&mut`: it can't also be an
    /// input or another output) and its stream and inputs exist.
    fn expressible(&self, l: &Launch) -> bool {
        let outs = l.output_slots();
        let mut all = outs.clone();
        all.sort_unstable();
        all.dedup();
        let ins = l.input_slots();
        let needs_outs = !matches!(l.variant, Variant::Alloc);
        self.streams[l.stream].is_some()
            && l.args[..4].iter().all(|&a| self.slots[a].is_some())
            && (!needs_outs || (all.len() == outs.len() && !outs.iter().any(|o| ins.contains(o))))
    }

    fn take_outputs(&mut self, l: &Launch) -> Taken {
        let mut outs: [Option<Slot>; 4] = Default::default();
        if !matches!(l.variant, Variant::Alloc) {
            for (i, on) in l.enabled().into_iter().enumerate() {
                if on {
                    outs[i] = self.slots[l.outs[i]].take();
                }
            }
        }
        Taken { outs }
    }

    fn put_back(&mut self, l: &Launch, taken: Taken) {
        for (i, slot) in taken.outs.into_iter().enumerate() {
            if let Some(slot) = slot {
                self.slots[l.outs[i]] = Some(slot);
            }
        }
    }

    /// The devices a launch touches besides its stream's.
    fn crosses_devices(&self, l: &Launch, taken: &Taken) -> bool {
        let Some((_, dev)) = &self.streams[l.stream] else { return false };
        let ins = l.input_slots().into_iter().filter_map(|a| self.slots[a].as_ref());
        ins.chain(taken.outs.iter().flatten()).any(|t| t.device != *dev)
    }

    fn launch_one(&mut self, l: &Launch, faulted: bool) -> Outcome {
        if !self.expressible(l) {
            return Ok(());
        }
        let mut taken = self.take_outputs(l);
        let before = self.streams[l.stream].as_ref().map(|(s, _)| s.launch_cache_stats());
        let ran = LAUNCHED.load(Relaxed);
        let r = self.launch_with(l, &mut taken, faulted, None);
        // `Again` repeats only a launch that writes none of its inputs: one whose results feed
        // its next inputs would grow them past where every sum is exact (then the mock and the
        // twin may round differently, cache or not).
        let ins = l.input_slots();
        if LAUNCHED.load(Relaxed) != ran && !l.output_slots().iter().any(|o| ins.contains(o)) {
            self.last_launch = Some(l.clone());
        }
        if let (Some(before), Some((s, _))) = (before, &self.streams[l.stream]) {
            let after = s.launch_cache_stats();
            CACHE_HITS.fetch_add((after.hits - before.hits) as usize, Relaxed);
            CACHE_MISSES.fetch_add((after.misses - before.misses) as usize, Relaxed);
            if after.capacity == 0 {
                UNCACHED.fetch_add(1, Relaxed);
            }
        }
        self.put_back(l, taken);
        r
    }

    /// The CPU twin's validation of the launch (nothing runs, nothing is written).
    fn validate(&self, l: &Launch, taken: &mut Taken) -> Result<()> {
        let slot = |a: usize| self.slots[a].as_ref().expect("expressible");
        let weight = l.with_weight.then(|| self.slots[l.args[4]].as_ref()).flatten();
        let cpu_ins = [0, 1, 2, 3].map(|i| &slot(l.args[i]).cpu);
        match l.variant {
            // The allocating entry validates its inputs only (it makes its outputs).
            Variant::Alloc => {
                let [dy, x, mean, invstd] = cpu_ins;
                batch_norm_reduce_backward(&self.cpu, dy, x, mean, invstd, weight.map(|w| &w.cpu), l.mask()).map(drop)
            }
            _ => {
                let cpu_outs = taken.outs.each_mut().map(|o| o.as_mut().map(|t| &mut t.cpu));
                cpu_validate(&self.cpu, cpu_ins, weight.map(|w| &w.cpu), l.mask(), cpu_outs)
            }
        }
    }

    /// Checks a mock launch's outcome against the twin and, when it ran, runs the twin.
    fn settle(
        &mut self,
        l: &Launch,
        taken: &mut Taken,
        crosses: bool,
        valid: Result<()>,
        mock: Result<Option<ReduceBackward>>,
        faulted: bool,
    ) -> Outcome {
        if let Err(v) = &valid {
            // Rejected by validation: the same status on the mock, nothing written.
            let _ = v;
            REJECTED.fetch_add(1, Relaxed);
            return agree("launch (invalid)", &mock, &valid);
        }
        if crosses {
            CROSSED.fetch_add(1, Relaxed);
            return expect_invalid("launch across devices", &mock);
        }
        let mock = match mock {
            Ok(m) => m,
            Err(e) if faulted => {
                let _ = e;
                fault_error();
                for t in taken.outs.iter_mut().flatten() {
                    t.known = false;
                }
                return Ok(());
            }
            Err(e) => return Err(fail(format!("launch: mock failed, the CPU twin accepts: {e:?}"))),
        };
        let slot = |a: usize| self.slots[a].as_ref().expect("expressible");
        let weight = l.with_weight.then(|| self.slots[l.args[4]].as_ref()).flatten();
        let cpu_ins = [0, 1, 2, 3].map(|i| &slot(l.args[i]).cpu);
        let cpu_outs = taken.outs.each_mut().map(|o| o.as_mut().map(|t| &mut t.cpu));
        let cpu = run_launch(l.variant, &self.cpu, cpu_ins, weight.map(|w| &w.cpu), l.mask(), cpu_outs, None)
            .map_err(|e| fail(format!("launch: the CPU twin failed after validating: {e:?}")))?;
        LAUNCHED.fetch_add(1, Relaxed);
        // What a launch computes from an unknown input is unknown too.
        let known = l.input_slots().iter().all(|&a| self.slots[a].as_ref().is_none_or(|t| t.known));
        for t in taken.outs.iter_mut().flatten() {
            t.known = known;
        }
        if let (Some(m), Some(c)) = (mock, cpu) {
            let device = self.streams[l.stream].as_ref().map_or(0, |(_, d)| *d);
            let pairs = [
                (m.sum_dy, c.sum_dy),
                (m.sum_dy_xmu, c.sum_dy_xmu),
                (m.grad_weight, c.grad_weight),
                (m.grad_bias, c.grad_bias),
            ];
            for (i, pair) in pairs.into_iter().enumerate() {
                match pair {
                    (Some(mock), Some(cpu)) => self.slots[l.outs[i]] = Some(Slot { mock, cpu, device, known }),
                    (None, None) => {}
                    _ => return Err(fail(format!("allocating launch: output {i} present on one backend only"))),
                }
            }
        }
        Ok(())
    }

    fn launch_with(&mut self, l: &Launch, taken: &mut Taken, faulted: bool, ws: Option<&Workspace>) -> Outcome {
        let crosses = self.crosses_devices(l, taken);
        let valid = self.validate(l, taken);
        let (s, _) = self.streams[l.stream].as_ref().expect("expressible");
        let mock = mock_launch(&self.slots, l, taken, s, ws);
        self.settle(l, taken, crosses, valid, mock, faulted)
    }

    /// Two launches at once, on two threads with their own streams, sharing their inputs (and,
    /// for two-phase launches on one device, one caller workspace).
    fn launch_parallel(&mut self, a: &Launch, b: &Launch, faulted: bool) -> Outcome {
        if a.stream == b.stream || !self.expressible(a) || !self.expressible(b) {
            return Ok(());
        }
        let (a_outs, b_outs) = (a.output_slots(), b.output_slots());
        // An allocating launch's outputs replace its output slots: writes too, for the model.
        let (wa, wb) = (a_outs, b_outs);
        let touches_b: Vec<usize> = b.input_slots().into_iter().chain(wb.iter().copied()).collect();
        let touches_a: Vec<usize> = a.input_slots().into_iter().chain(wa.iter().copied()).collect();
        if wa.iter().any(|s| touches_b.contains(s)) || wb.iter().any(|s| touches_a.contains(s)) {
            return Ok(()); // one writes what the other uses: not expressible without `&mut` aliasing
        }
        let (mut ta, mut tb) = (self.take_outputs(a), self.take_outputs(b));
        let crosses = (self.crosses_devices(a, &ta), self.crosses_devices(b, &tb));
        let mut sa = self.streams[a.stream].take().expect("expressible");
        let mut sb = self.streams[b.stream].take().expect("expressible");
        let shared = match (a.variant, b.variant) {
            (Variant::TwoPhase { caller_workspace: true }, Variant::TwoPhase { caller_workspace: true })
                if sa.1 == sb.1 =>
            {
                Workspace::new(&sa.0, 4096).ok()
            }
            _ => None,
        };
        let (va, vb) = (self.validate(a, &mut ta), self.validate(b, &mut tb));
        PARALLEL.fetch_add(1, Relaxed);
        let slots = &self.slots;
        let (ma, mb) = std::thread::scope(|sc| {
            let (sa, sb, ta, tb, shared) = (&mut sa, &mut sb, &mut ta, &mut tb, shared.as_ref());
            let ha = sc.spawn(move || mock_launch(slots, a, ta, &sa.0, shared));
            let hb = sc.spawn(move || mock_launch(slots, b, tb, &sb.0, shared));
            (ha.join().expect("thread a panicked"), hb.join().expect("thread b panicked"))
        });
        drop(shared);
        self.streams[a.stream] = Some(sa);
        self.streams[b.stream] = Some(sb);
        let ra = self.settle(a, &mut ta, crosses.0, va, ma, faulted);
        let rb = self.settle(b, &mut tb, crosses.1, vb, mb, faulted);
        self.put_back(a, ta);
        self.put_back(b, tb);
        ra.and(rb)
    }

    /// An all-reduce over two ranks (devices 0 and 1) of slots `a` and `b`, when they make a
    /// valid collective (same dtype and element count, contiguous, on devices 0 and 1).
    fn all_reduce(&mut self, a: usize, b: usize, max: bool, faulted: bool) -> Outcome {
        let valid = |t: &Slot, d: u8| t.device == d && t.mock.is_contiguous();
        let (Some(ta), Some(tb)) = (&self.slots[a], &self.slots[b]) else { return Ok(()) };
        if a == b
            || !valid(ta, 0)
            || !valid(tb, 1)
            || ta.mock.dtype() != tb.mock.dtype()
            || ta.mock.numel() != tb.mock.numel()
        {
            return Ok(());
        }
        if self.comms.is_none() {
            let ctxs = [ascend::mock::context(0), ascend::mock::context(1)];
            let made = ctxs.into_iter().collect::<Result<Vec<_>>>().and_then(|ctxs| {
                let comms = Communicator::init_all(&ctxs)?;
                let streams = ctxs.iter().map(|c| c.new_stream()).collect::<Result<Vec<_>>>()?;
                Ok(comms.into_iter().zip(streams).collect())
            });
            match made {
                Ok(c) => self.comms = Some(c),
                Err(e) if !faulted => return Err(fail(format!("communicator: {e:?}"))),
                Err(_) => return Ok(()),
            }
        }
        let op = if max { ReduceOp::Max } else { ReduceOp::Sum };
        let (mut sa, mut sb) = (self.slots[a].take().expect("checked"), self.slots[b].take().expect("checked"));
        let comms = self.comms.as_mut().expect("made above");
        let results: Vec<Result<()>> = std::thread::scope(|sc| {
            let hs: Vec<_> = comms
                .iter_mut()
                .zip([&mut sa.mock, &mut sb.mock])
                .map(|((comm, stream), t)| {
                    sc.spawn(move || {
                        comm.all_reduce(stream, t, op)?;
                        stream.synchronize() // a collective completes when every rank's stream runs it
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
        });
        let outcome = match (&results[0], &results[1]) {
            (Ok(()), Ok(())) => {
                COLLECTIVES.fetch_add(1, Relaxed);
                let va = sa.cpu.to_vec::<f32>(&self.cpu).map_err(|e| fail(format!("{e:?}")))?;
                let vb = sb.cpu.to_vec::<f32>(&self.cpu).map_err(|e| fail(format!("{e:?}")))?;
                let r: Vec<f32> = va.iter().zip(&vb).map(|(x, y)| if max { x.max(*y) } else { x + y }).collect();
                sa.cpu.copy_from_slice(&self.cpu, &r).map_err(|e| fail(format!("{e:?}")))?;
                sb.cpu.copy_from_slice(&self.cpu, &r).map_err(|e| fail(format!("{e:?}")))?;
                let known = sa.known && sb.known;
                sa.known = known;
                sb.known = known;
                Ok(())
            }
            _ if faulted => {
                fault_error();
                sa.known = false;
                sb.known = false;
                Ok(())
            }
            (ra, rb) => Err(fail(format!("all-reduce failed: {ra:?}, {rb:?}"))),
        };
        self.slots[a] = Some(sa);
        self.slots[b] = Some(sb);
        outcome
    }

    /// Reads every known tensor on a fresh stream of its device and compares it with its twin.
    fn final_check(&self) -> Outcome {
        let streams: Vec<Stream> = (0..DEVICES)
            .map(|d| ascend::mock::context(i32::from(d)).and_then(|c| c.new_stream()))
            .collect::<Result<_>>()
            .map_err(|e| fail(format!("final streams: {e:?}")))?;
        for (i, t) in self.slots.iter().enumerate() {
            let Some(t) = t.as_ref().filter(|t| t.known) else { continue };
            let mock = t.mock.to_vec::<f32>(&streams[usize::from(t.device)]);
            let cpu = t.cpu.to_vec::<f32>(&self.cpu);
            match (mock, cpu) {
                (Ok(m), Ok(c)) if bits(&m) == bits(&c) => {
                    COMPARED.fetch_add(1, Relaxed);
                }
                (m, c) => return Err(fail(format!("final read of slot {i}: mock {m:?}, twin {c:?}"))),
            }
        }
        Ok(())
    }
}

/// The launch on the mock, on `stream`.
fn mock_launch(
    slots: &[Option<Slot>; TENSOR_SLOTS],
    l: &Launch,
    taken: &mut Taken,
    stream: &Stream,
    workspace: Option<&Workspace>,
) -> Result<Option<ReduceBackward>> {
    let slot = |a: usize| slots[a].as_ref().expect("expressible");
    let weight = l.with_weight.then(|| slots[l.args[4]].as_ref()).flatten();
    let ins = [0, 1, 2, 3].map(|i| &slot(l.args[i]).mock);
    let outs = taken.outs.each_mut().map(|o| o.as_mut().map(|t| &mut t.mock));
    run_launch(l.variant, stream, ins, weight.map(|w| &w.mock), l.mask(), outs, workspace)
}

fn upload(s: &Stream, dtype: DType, data: &[f32], shape: &[usize], strides: &[usize], offset: usize) -> Result<Tensor> {
    match dtype {
        DType::F16 => {
            let v: Vec<ascend::f16> = data.iter().map(|&x| ascend::f16::from_f32(x)).collect();
            Tensor::from_slice_strided(s, &v, shape, strides, offset)
        }
        DType::BF16 => {
            let v: Vec<ascend::bf16> = data.iter().map(|&x| ascend::bf16::from_f32(x)).collect();
            Tensor::from_slice_strided(s, &v, shape, strides, offset)
        }
        _ => Tensor::from_slice_strided(s, data, shape, strides, offset),
    }
}

/// Live mock counters minus the crate's deliberate leaks: what the program still holds.
fn held() -> [i128; 4] {
    let (s, l) = (ascend::mock::stats(), ascend::mock::leaks());
    [
        i128::from(s.live_allocations) - i128::from(l.allocations),
        i128::from(s.live_tensors) - i128::from(l.tensors),
        i128::from(s.live_executors) - i128::from(l.executors),
        i128::from(s.live_streams) - i128::from(l.streams),
    ]
}

static STEPS: AtomicUsize = AtomicUsize::new(0);
static FAULTED: AtomicUsize = AtomicUsize::new(0);
static PROGRAMS: AtomicUsize = AtomicUsize::new(0);
/// Launches that ran on both backends / were rejected alike / were rejected across devices.
static LAUNCHED: AtomicUsize = AtomicUsize::new(0);
static REJECTED: AtomicUsize = AtomicUsize::new(0);
static CROSSED: AtomicUsize = AtomicUsize::new(0);
/// Reads compared bit for bit with the twin.
static COMPARED: AtomicUsize = AtomicUsize::new(0);
/// Another producer's capsule over this crate's export (as a framework re-exporting it would
/// make): its own deleter drops the export, so this crate imports it as foreign memory.
#[repr(C)]
struct ForeignCapsule {
    head: ascend::sys::dlpack::DLManagedTensorVersioned,
    inner: ascend::DlPack,
}

impl ForeignCapsule {
    /// A `DLManagedTensorVersioned*` describing `d`'s tensor, owning `d`.
    fn wrap(d: ascend::DlPack) -> *mut std::ffi::c_void {
        let head = ascend::sys::dlpack::DLManagedTensorVersioned {
            version: ascend::sys::dlpack::DLPackVersion { major: 1, minor: 1 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(Self::delete),
            flags: d.flags(),
            // The shape and strides point into `d`'s capsule, which lives as long as this one.
            dl_tensor: *d.dl_tensor(),
        };
        let p = Box::into_raw(Box::new(ForeignCapsule { head, inner: d }));
        // SAFETY: `p` is the live box made above.
        unsafe { (*p).head.manager_ctx = p.cast() };
        p.cast()
    }

    unsafe extern "C" fn delete(p: *mut ascend::sys::dlpack::DLManagedTensorVersioned) {
        // SAFETY: `p` is `head` (the first field) of a box made by `wrap`, deleted once.
        drop(unsafe { Box::from_raw(p.cast::<ForeignCapsule>()) });
    }
}

/// DLPack exchanges made (the tensor replaced by its re-import on both backends).
static EXCHANGED: AtomicUsize = AtomicUsize::new(0);
/// Steps (of any kind) that failed on the mock because of an injected fault.
static FAULT_ERRORS: AtomicUsize = AtomicUsize::new(0);
/// Parallel steps that ran both launches on two threads.
static PARALLEL: AtomicUsize = AtomicUsize::new(0);
/// All-reduce steps that ran on both ranks.
static COLLECTIVES: AtomicUsize = AtomicUsize::new(0);
/// Layer steps (`nn::BatchNorm` forward and backward).
static LAYERS: AtomicUsize = AtomicUsize::new(0);
/// Single launches (`Launch`, `Again`) that hit or missed the launch cache, or found it off.
static CACHE_HITS: AtomicUsize = AtomicUsize::new(0);
static CACHE_MISSES: AtomicUsize = AtomicUsize::new(0);
static UNCACHED: AtomicUsize = AtomicUsize::new(0);
/// Captured launches refused (allocation, dependency) and replays run.
static CAPTURES_REFUSED: AtomicUsize = AtomicUsize::new(0);
static REPLAYS: AtomicUsize = AtomicUsize::new(0);
/// Steps that made the mock refuse repeatable executors, and the refused
/// `aclSetAclOpExecutorRepeatable` calls.
static REFUSALS: AtomicUsize = AtomicUsize::new(0);
static REFUSED_CALLS: AtomicUsize = AtomicUsize::new(0);

fn fault_error() {
    FAULT_ERRORS.fetch_add(1, Relaxed);
}

fn run_program(p: &Program) -> Outcome {
    PROGRAMS.fetch_add(1, Relaxed);
    let before = held();
    let violations = ascend::mock::stats().violations;
    ascend::mock::refuse_repeatable(OPERATOR, false); // a failed program may have left it on
    let refusals = ascend::mock::launch_counters().repeatable_refusals;
    {
        let mut world = World::new(p);
        for (slot, &device) in p.devices.iter().enumerate() {
            world.run(&Step::NewStream { slot, device }, false)?;
        }
        for step in &p.init {
            world.run(step, false)?;
        }
        for (i, step) in p.steps.iter().enumerate() {
            STEPS.fetch_add(1, Relaxed);
            if matches!(step, Step::Fault { .. }) {
                FAULTED.fetch_add(1, Relaxed);
            }
            world.run(step, false).map_err(|e| fail(format!("step {i} ({step:?}): {e}")))?;
            let now = ascend::mock::stats().violations;
            if now != violations {
                return Err(fail(format!(
                    "step {i} ({step:?}): mock violations {:?}",
                    ascend::mock::violations_since(violations)
                )));
            }
            for (slot, (st, _)) in world.streams.iter().enumerate().filter_map(|(k, s)| Some((k, s.as_ref()?))) {
                let stats = st.launch_cache_stats();
                if stats.entries > stats.capacity {
                    return Err(fail(format!("step {i} ({step:?}): stream {slot}'s launch cache: {stats:?}")));
                }
            }
        }
        world.final_check()?;
    }
    ascend::mock::refuse_repeatable(OPERATOR, false);
    REFUSED_CALLS.fetch_add((ascend::mock::launch_counters().repeatable_refusals - refusals) as usize, Relaxed);
    let after = held();
    if after != before {
        return Err(fail(format!("live objects (allocations, tensors, executors, streams) {before:?} -> {after:?}")));
    }
    let now = ascend::mock::stats().violations;
    if now != violations {
        return Err(fail(format!("mock violations at teardown: {:?}", ascend::mock::violations_since(violations))));
    }
    Ok(())
}

#[test]
fn random_programs_on_the_mock_match_the_cpu_twin() {
    // Two mock devices; read by the mock at aclInit, before which nothing in this binary runs.
    std::env::set_var("ASCEND_MOCK_DEVICE_COUNT", "2");
    let cases = common::env_or("STATEFUL_CASES", 700);
    let seed: u64 = common::env_or("STATEFUL_SEED", 0x5EED_A5CE);
    let seed_bytes = common::seed_bytes(seed);
    let config = Config { cases, failure_persistence: None, max_shrink_iters: 4096, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes));
    let result = runner.run(&program(), |p| run_program(&p));
    println!(
        "stateful: seed {seed}, {} programs, {} steps ({} with an injected fault, {} of them failed by it), \
         launches: {} ran on both backends, {} rejected alike, {} rejected across devices, {} parallel pairs; \
         {} all-reduces over two devices; {} DLPack exchanges; {} layer steps; {} reads compared bit for bit; \
         single launches: {} launch cache hits, {} misses, {} with it off; {} refusal steps, {} refused executors; \
         {} graph replays, {} captures refused",
        PROGRAMS.load(Relaxed),
        STEPS.load(Relaxed),
        FAULTED.load(Relaxed),
        FAULT_ERRORS.load(Relaxed),
        LAUNCHED.load(Relaxed),
        REJECTED.load(Relaxed),
        CROSSED.load(Relaxed),
        PARALLEL.load(Relaxed),
        COLLECTIVES.load(Relaxed),
        EXCHANGED.load(Relaxed),
        LAYERS.load(Relaxed),
        COMPARED.load(Relaxed),
        CACHE_HITS.load(Relaxed),
        CACHE_MISSES.load(Relaxed),
        UNCACHED.load(Relaxed),
        REFUSALS.load(Relaxed),
        REFUSED_CALLS.load(Relaxed),
        REPLAYS.load(Relaxed),
        CAPTURES_REFUSED.load(Relaxed),
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
