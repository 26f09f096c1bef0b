//! A persistent pool of helper threads, started once, where the calling thread works too.
//!
//! Why not spawn per call (the old way) or `rayon`: a scoped spawn + join costs 15-40 µs on the
//! development VM, as much as summing several MiB in cache; and `rayon`'s `scope` from a thread
//! outside its pool queues the job and puts the caller to sleep, so every call pays the wake-up of
//! a worker *and* of the caller. Here the caller starts on the first chunk at once and the helpers
//! join when they wake: a helper that wakes late (or whose core is busy with other work) only
//! takes the chunks that are left, so two threads are never much slower than one (at most one
//! chunk, which the caller keeps small).
//!
//! - Work is a number of chunks, claimed one at a time from an atomic counter by whoever is free;
//!   a chunk's result must not depend on which thread runs it (the kernel writes each item's
//!   partials to fixed slots, so results are bit-identical for any thread count).
//! - One job at a time: a caller that finds the pool busy (another thread is using it) runs all
//!   chunks itself.
//! - An idle helper polls for the next job for [`SPIN`] (100 µs), then blocks on a condition
//!   variable; the caller likewise polls briefly for helpers still in their last chunk before it
//!   blocks. Only blocked helpers are notified (a wake-up costs tens of µs on a VM, as much as a
//!   mid-size call). Helpers are never joined: they sleep until the process exits.
//! - A panic in a chunk, on a helper, is caught there (the helper lives on) and re-raised on the
//!   caller after every helper has let go of the job; a panic on the caller also waits for the
//!   helpers before it unwinds further. Nobody hangs.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// One call's work: chunks `0..n`, each run once by `run`.
struct Job<'a> {
    next: AtomicUsize,
    n: usize,
    run: &'a (dyn Fn(usize) + Sync),
    /// The first panic payload of a helper.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Job<'_> {
    /// Claims and runs chunks until none is left.
    fn drain(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            (self.run)(i);
        }
    }
}

/// The published job, lifetime erased (see `run`'s SAFETY comment).
#[derive(Clone, Copy)]
struct JobPtr(*const Job<'static>);

// SAFETY: a `JobPtr` is only dereferenced by helpers while the job is live (the caller retracts
// it and waits for every holder before the `Job` goes away); `Job` is `Sync` (atomics, a mutex
// and a `Sync` closure), so sharing it between threads is sound.
unsafe impl Send for JobPtr {}

struct State {
    /// The job on offer, if any.
    job: Option<JobPtr>,
    /// Bumped for every job, so a helper joins each job at most once.
    epoch: u64,
    /// Helpers that may still join the current job.
    seats: usize,
    /// Helpers blocked on `work`.
    sleepers: usize,
    /// A caller owns the pool (from publishing until every helper has let go).
    busy: bool,
}

struct Pool {
    state: Mutex<State>,
    /// `State::epoch`, readable without the lock by spinning helpers.
    published: AtomicU64,
    /// Helpers holding the current job's pointer: raised under the lock while the job is on
    /// offer, lowered (Release) when a helper lets go.
    active: AtomicUsize,
    /// Signalled when a job is published.
    work: Condvar,
    /// Signalled when the last active helper lets go of a job.
    done: Condvar,
    /// Helper threads started.
    helpers: AtomicUsize,
}

/// How long a helper keeps polling for the next job before it blocks, and a caller polls for
/// the helpers to finish before it blocks. Waking a blocked thread costs tens of µs on a VM
/// (as much as the work of a mid-size call); a bounded poll keeps back-to-back calls (a
/// training step's channels, a benchmark) fast and costs an idle core at most this long.
const SPIN: Duration = Duration::from_micros(100);

impl Pool {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned one still holds consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn helper(&self) {
        let mut seen = 0u64;
        loop {
            // Poll for a new job for a while before blocking.
            let t0 = Instant::now();
            while self.published.load(Ordering::Acquire) == seen && t0.elapsed() < SPIN {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
            }
            let job = {
                let mut s = self.lock();
                loop {
                    match s.job {
                        Some(job) if s.epoch != seen && s.seats > 0 => {
                            seen = s.epoch;
                            s.seats -= 1;
                            self.active.fetch_add(1, Ordering::Relaxed);
                            break job;
                        }
                        // Seen or gone: that job needs no more help.
                        _ if s.epoch != seen => seen = s.epoch,
                        _ => {
                            s.sleepers += 1;
                            s = self.work.wait(s).unwrap_or_else(|e| e.into_inner());
                            s.sleepers -= 1;
                        }
                    }
                }
            };
            // SAFETY: `active` was raised under the lock while the job was on offer; the caller
            // keeps the `Job` alive until `active` is back to 0 (see `run`).
            let job = unsafe { &*job.0 };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| job.drain())) {
                // Stop the others claiming more chunks; keep the first payload.
                job.next.store(job.n, Ordering::Relaxed);
                let mut slot = job.panic.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(p);
            }
            if self.active.fetch_sub(1, Ordering::Release) == 1 {
                // Under the lock, so a caller between its check and its wait cannot miss it.
                let _s = self.lock();
                self.done.notify_all();
            }
        }
    }
}

/// The pool, with up to `cores - 1` helpers (started on first use).
fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            state: Mutex::new(State { job: None, epoch: 0, seats: 0, sleepers: 0, busy: false }),
            published: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            work: Condvar::new(),
            done: Condvar::new(),
            helpers: AtomicUsize::new(0),
        }));
        // A helper that cannot be spawned is simply not counted (its chunks run elsewhere).
        let started = (0..cores().saturating_sub(1))
            .filter(|k| {
                std::thread::Builder::new().name(format!("ascend-cpu-{k}")).spawn(move || pool.helper()).is_ok()
            })
            .count();
        pool.helpers.store(started, Ordering::Relaxed);
        pool
    })
}

/// Helper threads the pool has; starts them on first use.
#[cfg(test)]
pub(crate) fn helpers() -> usize {
    pool().helpers.load(Ordering::Relaxed)
}

/// The machine's cores, asked once (`available_parallelism` reads cgroup files on Linux, ~10 µs).
pub(crate) fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Runs `f(0)`, ..., `f(n - 1)`, each exactly once, on the calling thread and up to
/// `threads - 1` pool helpers (`threads` 0: [`super::max_threads`], itself 0 for one per core);
/// returns when all have run. A panic in any `f` is re-raised here. Which thread runs a chunk
/// never matters to a result: kernels write each chunk's results to fixed places.
pub(crate) fn run(threads: usize, n: usize, f: &(dyn Fn(usize) + Sync)) {
    let threads = match (threads, super::max_threads()) {
        (0, 0) => cores(),
        (0, m) => m,
        (t, _) => t,
    };
    let job = Job { next: AtomicUsize::new(0), n, run: f, panic: Mutex::new(None) };
    let seats = threads.saturating_sub(1).min(n.saturating_sub(1));
    if seats == 0 {
        job.drain();
        return;
    }
    let pool = pool();
    let seats = seats.min(pool.helpers.load(Ordering::Relaxed));
    let wake = {
        let mut s = pool.lock();
        if seats == 0 || s.busy {
            drop(s);
            job.drain();
            return;
        }
        // SAFETY (lifetime erasure): the pointer is withdrawn and every helper holding it has
        // let go (`Retract` below, which also runs when the caller unwinds) before `job` is
        // dropped at the end of this function.
        let ptr = JobPtr((&job as *const Job<'_>).cast::<Job<'static>>());
        s.job = Some(ptr);
        s.epoch = s.epoch.wrapping_add(1);
        pool.published.store(s.epoch, Ordering::Release);
        s.seats = seats;
        s.busy = true;
        // Spinning helpers see `published`; only blocked ones need a (costly) wake-up.
        seats.min(s.sleepers)
    };
    for _ in 0..wake {
        pool.work.notify_one();
    }
    /// Withdraws the job and waits for the helpers that hold it (also on unwind).
    struct Retract(&'static Pool);
    impl Drop for Retract {
        fn drop(&mut self) {
            let pool = self.0;
            let mut s = pool.lock();
            s.job = None;
            s.seats = 0;
            if pool.active.load(Ordering::Acquire) > 0 {
                drop(s);
                let t0 = Instant::now();
                while pool.active.load(Ordering::Acquire) > 0 && t0.elapsed() < SPIN {
                    std::hint::spin_loop();
                }
                s = pool.lock();
                while pool.active.load(Ordering::Acquire) > 0 {
                    s = pool.done.wait(s).unwrap_or_else(|e| e.into_inner());
                }
            }
            s.busy = false;
        }
    }
    let retract = Retract(pool);
    job.drain();
    drop(retract);
    let panic = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(p) = panic {
        resume_unwind(p);
    }
}
