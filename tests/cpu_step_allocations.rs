//! A steady CPU training step allocates nothing on the heap: a counting global allocator (every
//! thread of the process, the CPU pool's helpers included) sees zero allocation calls in one
//! `nn::BatchNorm` forward + backward after warm-up steps, for every dtype, layout and shape
//! class of `benches/cpu_step.rs` (NCHW long runs, NCHW short runs, `[N, C, 1, 1]`,
//! channels-last, tiny), on 1 and 2 threads. The counted step's outputs must equal the first
//! step's bit for bit (the reused scratch changes nothing), and making a tensor is counted (so
//! the counter is live). The same for a SyncBatchNorm step (`sync_batch_norm` forward +
//! backward: the CPU communicator's all-gather and all-reduce, which reuse their buffers, and the
//! gather operator, whose tables are scratch) over one CPU rank, and over two ranks (threads)
//! whose steps are counted together. Its own test binary, whose tests take turns (`serial`), so
//! no other test allocates while one counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex, MutexGuard};

use ascend::hccl::Communicator;
use ascend::nn::BatchNorm;
use ascend::ops::OutputMask;
use ascend::{bf16, cpu, f16, sync_batch_norm, Context, DType, Element, Stream, Tensor};

/// The system allocator, counting every allocation call while `COUNTING` is set.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

fn count() {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to `System` unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is `GlobalAlloc::alloc`'s, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Heap allocation calls of the whole process while `f` runs.
fn allocations<R>(f: impl FnOnce() -> R) -> (u64, R) {
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let r = f();
    COUNTING.store(false, Ordering::SeqCst);
    (ALLOCATIONS.load(Ordering::SeqCst), r)
}

/// Holds the other tests of this binary off (they count process-wide and set the thread count).
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The bench's cases, smaller batches (the same kernel paths).
const CASES: &[(&str, bool, &[usize])] = &[
    ("f32", false, &[2, 64, 56, 56]),
    ("f32", true, &[2, 64, 56, 56]),
    ("f32", false, &[2, 256, 28, 28]),
    ("f32", true, &[2, 256, 28, 28]),
    ("f32", false, &[8, 512, 7, 7]),
    ("f32", false, &[64, 1024, 1, 1]),
    ("f32", false, &[4, 2, 1, 1]),
    // Large enough for both threads in every pass.
    ("f32", false, &[4, 64, 96, 96]),
    ("bf16", false, &[2, 64, 56, 56]),
    ("bf16", true, &[2, 64, 56, 56]),
    ("f16", false, &[2, 64, 56, 56]),
    ("f16", true, &[2, 64, 56, 56]),
    ("bf16", false, &[2, 256, 28, 28]),
    ("f16", false, &[2, 256, 28, 28]),
];

/// Steps before the counted one (the memory cache and the scratch lists fill).
const WARM: usize = 3;

/// Strides of `shape` (rank 4), channels-last when `cl`.
fn strides(shape: &[usize], cl: bool) -> Vec<usize> {
    let (c, h, w) = (shape[1], shape[2], shape[3]);
    if cl {
        vec![h * w * c, 1, w * c, c]
    } else {
        vec![c * h * w, h * w, w, 1]
    }
}

/// One case's inputs and the layer, whose parameters and running statistics the Sync path uses
/// too.
struct Case {
    bn: BatchNorm,
    x: Tensor,
    dy: Tensor,
    stream: Stream,
    comm: Communicator,
}

impl Case {
    /// A case on rank `comm` (its data depends on the rank).
    fn on<T: Element>(ctx: &Context, shape: &[usize], cl: bool, comm: Communicator) -> Case {
        let stream = ctx.new_stream().unwrap();
        let n: usize = shape.iter().product();
        let mut seed = 0x2545_f491_4f6c_dd1du64 ^ (u64::from(comm.rank()) << 32);
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let x: Vec<T> = (0..n).map(|_| T::from_f64(next() * 6.0 - 3.0)).collect();
        let dy: Vec<T> = (0..n).map(|_| T::from_f64(next() * 4.0 - 2.0)).collect();
        let st = strides(shape, cl);
        let c = shape[1];
        let per = |f: fn(usize) -> f32| {
            let v: Vec<f32> = (0..c).map(f).collect();
            Tensor::from_slice(&stream, &v, &[c]).unwrap()
        };
        let mut bn = BatchNorm::new(&stream, c).unwrap();
        bn.weight = Some(per(|i| 1.0 + 0.01 * i as f32));
        bn.bias = Some(per(|i| 0.1 * i as f32));
        let [x, dy] = [x, dy].map(|v| Tensor::from_slice_strided(&stream, &v, shape, &st, 0).unwrap());
        Case { bn, x, dy, stream, comm }
    }

    /// One layer step; its outputs (y, dx, dw, db).
    fn layer(&mut self) -> [Tensor; 4] {
        let (y, saved) = self.bn.forward(&self.stream, &self.x).unwrap();
        let g = self.bn.backward(&self.stream, &self.dy, &saved).unwrap();
        [y, g.input, g.weight.unwrap(), g.bias.unwrap()]
    }

    /// One SyncBatchNorm step over one rank; its outputs (y, dx, dw, db).
    fn sync(&mut self) -> [Tensor; 4] {
        let bn = &mut self.bn;
        let (y, saved) = sync_batch_norm::forward(
            &self.comm,
            &self.stream,
            &self.x,
            bn.weight.as_ref(),
            bn.bias.as_ref(),
            bn.running_mean.as_mut(),
            bn.running_var.as_mut(),
            0.1,
            1e-5,
        )
        .unwrap();
        let grads =
            sync_batch_norm::backward(&self.comm, &self.stream, &self.dy, &saved, bn.weight.as_ref(), OutputMask::ALL);
        let (dx, dw, db) = grads.unwrap();
        [y, dx.unwrap(), dw.unwrap(), db.unwrap()]
    }
}

/// The outputs' values as f64 (read after the count).
fn values(stream: &Stream, outs: &[Tensor; 4]) -> Vec<Vec<f64>> {
    fn read<T: Element>(stream: &Stream, t: &Tensor) -> Vec<f64> {
        t.to_vec::<T>(stream).unwrap().into_iter().map(T::to_f64).collect()
    }
    outs.iter()
        .map(|t| match t.dtype() {
            DType::F16 => read::<f16>(stream, t),
            DType::BF16 => read::<bf16>(stream, t),
            _ => read::<f32>(stream, t),
        })
        .collect()
}

/// A case of `dtype` on `comm`.
fn case_of(dtype: &str, ctx: &Context, shape: &[usize], cl: bool, comm: Communicator) -> Case {
    match dtype {
        "f32" => Case::on::<f32>(ctx, shape, cl, comm),
        "f16" => Case::on::<f16>(ctx, shape, cl, comm),
        _ => Case::on::<bf16>(ctx, shape, cl, comm),
    }
}

/// Runs the first and the warm-up steps of `case`; the first step's outputs.
fn warm_up(case: &mut Case, step: fn(&mut Case) -> [Tensor; 4]) -> Vec<Vec<f64>> {
    let first = step(case);
    let want = values(&case.stream, &first);
    drop(first);
    for _ in 0..WARM {
        drop(step(case));
    }
    case.stream.synchronize().unwrap();
    want
}

/// Every case on 1 and 2 threads: the steady step's allocation calls, and its outputs equal to
/// the first step's. Returns `(case, allocations)` for each case with allocations.
fn run(step: fn(&mut Case) -> [Tensor; 4]) -> Vec<String> {
    let ctx = Context::cpu();
    let mut failures = Vec::new();
    for &(dtype, cl, shape) in CASES {
        for threads in [1, 2] {
            cpu::set_max_threads(threads);
            let comm = Communicator::init_all(std::slice::from_ref(&ctx)).unwrap().remove(0);
            let mut case = case_of(dtype, &ctx, shape, cl, comm);
            let want = warm_up(&mut case, step);
            let (n, outs) = allocations(|| {
                let outs = step(&mut case);
                case.stream.synchronize().unwrap();
                outs
            });
            let got = values(&case.stream, &outs);
            // The layer's running statistics move every step; y, dx, dw and db do not.
            assert!(got == want, "{dtype} cl={cl} {shape:?} {threads} threads: the steady step's outputs changed");
            if n > 0 {
                failures.push(format!("{dtype} cl={cl} {shape:?} {threads} threads: {n} allocations"));
            }
        }
    }
    cpu::set_max_threads(0);
    failures
}

#[test]
fn layer_step_allocates_nothing() {
    let _serial = serial();
    // The counter is live: making a tensor allocates (its storage block, first time).
    let ctx = Context::cpu();
    let stream = ctx.new_stream().unwrap();
    let (made, _t) = allocations(|| Tensor::from_slice(&stream, &[1f32; 1000], &[1000]).unwrap());
    assert!(made > 0, "the counting allocator saw nothing");
    let failures = run(Case::layer);
    assert!(failures.is_empty(), "steady layer steps allocated:\n{}", failures.join("\n"));
}

#[test]
fn sync_step_allocates_nothing() {
    let _serial = serial();
    let failures = run(Case::sync);
    assert!(failures.is_empty(), "steady SyncBatchNorm steps allocated:\n{}", failures.join("\n"));
}

/// `f`'s result or its panic, which a rank raises again only after the barriers it shares with
/// the others (else they would wait for it forever).
fn hold<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    catch_unwind(AssertUnwindSafe(f))
}

/// Two ranks (threads of this test) step together; the counted window holds both ranks' steady
/// step (the ranks start it after the counter is on and the counter stops after both finished),
/// whose outputs must equal each rank's first step's.
#[test]
fn sync_step_over_two_ranks_allocates_nothing() {
    let _serial = serial();
    let mut failures = Vec::new();
    for &(dtype, cl, shape) in CASES {
        for threads in [1, 2] {
            cpu::set_max_threads(threads);
            // A context per rank (a device per rank): each its own memory cache, as one shared
            // by two ranks would need more blocks whenever their steps interleave differently.
            let contexts = [Context::cpu(), Context::cpu()];
            let comms = Communicator::init_all(&contexts).unwrap();
            // Warmed up | counter on | steps done | counter off.
            let [ready, on, done, off] = [(); 4].map(|()| Barrier::new(comms.len() + 1));
            let n = std::thread::scope(|s| {
                let ranks: Vec<_> = comms
                    .into_iter()
                    .zip(&contexts)
                    .map(|(comm, ctx)| {
                        let (ready, on, done, off) = (&ready, &on, &done, &off);
                        s.spawn(move || {
                            let warm = hold(|| {
                                let mut case = case_of(dtype, ctx, shape, cl, comm);
                                let want = warm_up(&mut case, Case::sync);
                                (case, want)
                            });
                            ready.wait();
                            on.wait();
                            let stepped = warm.map(|(mut case, want)| {
                                let outs = hold(|| {
                                    let outs = case.sync();
                                    case.stream.synchronize().unwrap();
                                    outs
                                });
                                (case, want, outs)
                            });
                            done.wait();
                            off.wait();
                            let (case, want, outs) = stepped.unwrap_or_else(|p| resume_unwind(p));
                            let outs = outs.unwrap_or_else(|p| resume_unwind(p));
                            values(&case.stream, &outs) == want
                        })
                    })
                    .collect();
                ready.wait();
                let (n, ()) = allocations(|| {
                    on.wait();
                    done.wait();
                });
                off.wait();
                for (rank, same) in ranks.into_iter().map(|r| r.join().unwrap()).enumerate() {
                    assert!(same, "{dtype} cl={cl} {shape:?} {threads} threads: rank {rank}'s steady step changed");
                }
                n
            });
            if n > 0 {
                failures.push(format!("{dtype} cl={cl} {shape:?} {threads} threads: {n} allocations"));
            }
        }
    }
    cpu::set_max_threads(0);
    assert!(failures.is_empty(), "steady SyncBatchNorm steps over two ranks allocated:\n{}", failures.join("\n"));
}
