//! One BatchNorm training step (forward + backward) on the CPU backend against PyTorch's
//! `torch.nn.BatchNorm2d` on the same data, side by side in one run.
//!
//! `cargo bench --bench cpu_step` (about ten minutes on a 2-core VM with the PyTorch peer).
//!
//! - `ours`, path `Layer`: `nn::BatchNorm::forward` then `nn::BatchNorm::backward` (the
//!   single-device layer: aclnnBatchNorm / aclnnBatchNormBackward: the statistics pass, then the
//!   element-wise pass); path `Sync`: `sync_batch_norm::forward` then `sync_batch_norm::backward` (all three
//!   gradients) over a one-rank CPU communicator. Weight and bias `[C]` f32, running statistics
//!   updated: the whole step a user runs, with every output a new tensor. Best of timed batches (at least 15, and
//!   for up to 1 s, as the peer times torch).
//! - `torch`: `y = bn(x); y.backward(dy)` with `bn = torch.nn.BatchNorm2d(C)` in training mode
//!   (f32 parameters, x of the case's dtype and memory format), timed by `benches/torch_peer.py
//!   --serve-step` with the interpreter in `TORCH_PYTHON` (default `python3`), on copies of the
//!   same x and dy (passed through a shared file). Ours and the peer's timings alternate
//!   [`ALTERNATIONS`] times per row; `xtorch` is the median over the alternations of the peer's
//!   time over ours (above 1: we are faster). Empty without torch (or with `CPU_STEP_TORCH=0`).
//! - `floor`: the traffic a step must make (read x, write y; read dy and x, write dx: five
//!   tensors) at the streaming rate of a read-read-write loop over buffers of the tensor's size,
//!   measured in the same run on the same threads (or one, when that is faster); `/floor` is ours
//!   over it.
//! - `blocks`: host blocks the context asked of the system per steady step
//!   (`Context::memory_stats().device_allocations`, the tensor memory cache's misses); `mallocs`:
//!   every heap allocation call of the process per steady step (small scratch tables included).
//! - `CPU_STEP_ONLY=substring` runs the rows whose name contains it (e.g. `f32:nchw:32,64`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ascend::hccl::Communicator;
use ascend::nn::BatchNorm;
use ascend::ops::OutputMask;
use ascend::{bf16, cpu, f16, sync_batch_norm, Context, Element, Stream, Tensor};
use common::peer::{median, settle, Peer, SharedInputs, ALTERNATIONS};
use common::{cpu_model, random, strides, threads, time_batch};

mod common;

/// Counts every heap allocation call of the process.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's guarantees, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
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

/// What runs the step.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// `sync_batch_norm::forward` / `backward` over one rank.
    Sync,
    /// `nn::BatchNorm::forward` / `backward` on one device.
    Layer,
}

/// The paths every row runs.
const PATHS: &[Path] = &[Path::Layer, Path::Sync];

/// One case's tensors and state on the CPU backend.
struct Step {
    ctx: Context,
    stream: Stream,
    comm: Communicator,
    x: Tensor,
    dy: Tensor,
    weight: Tensor,
    bias: Tensor,
    running_mean: Tensor,
    running_var: Tensor,
    /// The layer, with its own copies of the parameters and running statistics.
    bn: BatchNorm,
}

impl Step {
    fn new<T: Element>(x: &[T], dy: &[T], shape: &[usize], cl: bool) -> Step {
        let ctx = Context::cpu();
        let stream = ctx.new_stream().expect("cpu stream");
        let comm = Communicator::init_all(std::slice::from_ref(&ctx)).expect("one-rank communicator").remove(0);
        let st = strides(shape, cl);
        let t = |v: &[T]| Tensor::from_slice_strided(&stream, v, shape, &st, 0).expect("input");
        let c = shape[1];
        let per = |f: fn(usize) -> f32| {
            let v: Vec<f32> = (0..c).map(f).collect();
            Tensor::from_slice(&stream, &v, &[c]).expect("[C]")
        };
        let mut bn = BatchNorm::new(&stream, c).expect("layer");
        bn.weight = Some(per(|i| 1.0 + 0.01 * i as f32));
        bn.bias = Some(per(|i| 0.1 * i as f32));
        Step {
            bn,
            x: t(x),
            dy: t(dy),
            weight: per(|i| 1.0 + 0.01 * i as f32),
            bias: per(|i| 0.1 * i as f32),
            running_mean: per(|_| 0.0),
            running_var: per(|_| 1.0),
            ctx,
            stream,
            comm,
        }
    }
}

impl Path {
    /// One training step; its outputs are dropped at the end (their memory goes back to the cache).
    fn step(self, s: &mut Step) {
        match self {
            Path::Sync => {
                let (y, saved) = sync_batch_norm::forward(
                    &s.comm,
                    &s.stream,
                    &s.x,
                    Some(&s.weight),
                    Some(&s.bias),
                    Some(&mut s.running_mean),
                    Some(&mut s.running_var),
                    0.1,
                    1e-5,
                )
                .expect("forward");
                let grads =
                    sync_batch_norm::backward(&s.comm, &s.stream, &s.dy, &saved, Some(&s.weight), OutputMask::ALL)
                        .expect("backward");
                black_box((y, grads));
            }
            Path::Layer => {
                let (y, saved) = s.bn.forward(&s.stream, &s.x).expect("forward");
                let grads = s.bn.backward(&s.stream, &s.dy, &saved).expect("backward");
                black_box((y, grads));
            }
        }
    }
}

/// `out[i] = a[i] + 3·b[i]` over words on `threads` threads: the streaming rate of a loop that
/// reads two tensors and writes one (what the backward's last pass does).
fn triad(a: &[u32], b: &[u32], out: &mut [u32], threads: usize) {
    let piece = a.len().div_ceil(threads.max(1)).max(1);
    let run = |a: &[u32], b: &[u32], o: &mut [u32]| {
        for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
            *o = a.wrapping_add(b.wrapping_mul(3));
        }
    };
    std::thread::scope(|s| {
        let mut parts = out.chunks_mut(piece).enumerate();
        let first = parts.next();
        for (k, o) in parts {
            let (a, b) = (&a[k * piece..], &b[k * piece..]);
            s.spawn(move || run(a, b, o));
        }
        if let Some((_, o)) = first {
            run(a, b, o);
        }
    });
}

/// Calls per timed batch so that a batch takes about 10 ms (at least one), as the peer batches.
fn batch_of(mut f: impl FnMut()) -> usize {
    let once = time_batch(1, &mut f).max(1e-9);
    ((0.01 / once) as usize).clamp(1, 100_000)
}

/// Best seconds per call of `f` over batches: at least `rounds`, and on for up to `budget`
/// seconds (at most 200), as the peer times torch (`best_time` in `benches/torch_peer.py`): on a
/// shared machine quiet rounds count, and both sides get the same chances at one.
fn best(rounds: usize, budget: f64, mut f: impl FnMut()) -> f64 {
    let n = batch_of(&mut f);
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut k = 0;
    while k < rounds || (start.elapsed().as_secs_f64() < budget && k < 200) {
        best = best.min(time_batch(n, &mut f));
        k += 1;
    }
    best
}

/// One row: dtype, layout, shape.
struct Case {
    dtype: &'static str,
    cl: bool,
    shape: &'static [usize],
}

impl Case {
    /// The peer script's name for this case.
    fn key(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        format!("{}:{}:{}", self.dtype, if self.cl { "cl" } else { "nchw" }, dims.join(","))
    }
}

fn row<T: Element>(case: &Case, thread_counts: &[usize]) {
    let shape = case.shape;
    let n: usize = shape.iter().product();
    let (x, dy) = (random::<T>(n, 12, -3.0, 3.0), random::<T>(n, 11, -2.0, 2.0));
    // The file holds dy then x, in the case's layout's storage order (a strided view of it with
    // the layout's strides reads them back): as the peer maps it.
    let shared = SharedInputs::new(&dy, &x).expect("a shared file of the inputs");
    let tensor_bytes = n * std::mem::size_of::<T>();
    let words = tensor_bytes.div_ceil(4).max(1);
    let (wa, wb, mut wo) = (vec![1u32; words], vec![2u32; words], vec![0u32; words]);
    for path in PATHS {
        let mut s = Step::new(&x, &dy, shape, case.cl);
        for &threads in thread_counts {
            cpu::set_max_threads(threads);
            // Warm: the first step fills the memory cache.
            path.step(&mut s);
            path.step(&mut s);
            let (blocks0, allocs0) = (s.ctx.memory_stats().device_allocations, ALLOCS.load(Ordering::Relaxed));
            path.step(&mut s);
            let blocks = s.ctx.memory_stats().device_allocations - blocks0;
            let mallocs = ALLOCS.load(Ordering::Relaxed) - allocs0;
            let mut peer = Peer::start("--serve-step", "CPU_STEP_TORCH", &case.key(), threads, &shared);
            // The peer's rounds and budget (its inputs are all under 64 MiB).
            let (mut ours, mut torch, mut stream) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
            let mut paired = Vec::new();
            for _ in 0..ALTERNATIONS {
                settle();
                let t = best(15, 1.0, || path.step(&mut s));
                ours = ours.min(t);
                // For cache-resident tensors one thread may stream faster than several.
                for t in if threads > 1 { vec![1, threads] } else { vec![1] } {
                    stream = stream.min(best(5, 0.0, || {
                        triad(black_box(&wa), black_box(&wb), &mut wo, t);
                        black_box(&mut wo);
                    }));
                }
                if let Some(p) = peer.as_mut().and_then(|p| {
                    settle();
                    p.time()
                }) {
                    torch = torch.min(p);
                    paired.push(p / t);
                }
            }
            drop(peer);
            cpu::set_max_threads(0);
            // The triad moves three tensors' bytes; a step must move five.
            let floor = stream * 5.0 / 3.0;
            let (tt, xt) = match median(&mut paired) {
                Some(m) => (format!("{:.3}", torch * 1e3), format!("{m:.2}")),
                None => ("-".into(), "-".into()),
            };
            println!(
                "{:<5} {:<4} {:>18} {:<5} {:>2} {:>9.3} {:>9} {:>6} {:>8.3} {:>6.2} {:>6} {:>7}",
                case.dtype,
                if case.cl { "CL" } else { "NCHW" },
                format!("{shape:?}"),
                format!("{path:?}"),
                threads,
                ours * 1e3,
                tt,
                xt,
                floor * 1e3,
                ours / floor,
                blocks,
                mallocs,
            );
        }
    }
}

fn main() {
    let start = Instant::now();
    let all = threads();
    println!("cpu_step: {} ({} cores), kernel ISA {}", cpu_model(), all, cpu::instruction_set());
    let only = std::env::var("CPU_STEP_ONLY").ok();
    let cases: Vec<Case> = [
        ("f32", false, &[32usize, 64, 56, 56][..]),
        ("f32", true, &[32, 64, 56, 56]),
        ("f32", false, &[8, 256, 28, 28]),
        ("f32", true, &[8, 256, 28, 28]),
        ("f32", false, &[64, 512, 7, 7]),
        ("f32", false, &[256, 1024, 1, 1]),
        ("bf16", false, &[16, 64, 56, 56]),
        ("bf16", true, &[16, 64, 56, 56]),
        ("f16", false, &[16, 64, 56, 56]),
        ("f16", true, &[16, 64, 56, 56]),
        ("bf16", false, &[8, 256, 28, 28]),
        ("f16", false, &[8, 256, 28, 28]),
        ("f32", false, &[4, 2, 1, 1]),
    ]
    .into_iter()
    .map(|(dtype, cl, shape)| Case { dtype, cl, shape })
    .filter(|c| only.as_deref().is_none_or(|o| c.key().contains(o)))
    .collect();
    let thread_counts: Vec<usize> = if all > 1 { vec![1, 2] } else { vec![1] };
    println!(
        "{:<5} {:<4} {:>18} {:<5} {:>2} {:>9} {:>9} {:>6} {:>8} {:>6} {:>6} {:>7}",
        "dtype",
        "lay",
        "shape",
        "path",
        "th",
        "ours ms",
        "torch ms",
        "xtorch",
        "floor ms",
        "/floor",
        "blocks",
        "mallocs"
    );
    for case in &cases {
        match case.dtype {
            "f32" => row::<f32>(case, &thread_counts),
            "f16" => row::<f16>(case, &thread_counts),
            _ => row::<bf16>(case, &thread_counts),
        }
    }
    println!("total bench time {:.1} s", start.elapsed().as_secs_f64());
}
