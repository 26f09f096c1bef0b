//! The CPU backend's worker threads, shared by every operator's kernel.
//!
//! [`run`] splits work into chunks that any thread may run: kernels write each chunk's results to
//! fixed places, so a result never depends on the thread count. (This is the interface the
//! kernels use; the implementation may keep persistent workers.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The machine's cores, asked once (`available_parallelism` reads cgroup files on Linux).
pub(crate) fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Runs `f(chunk)` for every chunk in `0..n`, on up to `threads` threads (0: every core), the
/// calling thread included; returns when all have run. Chunks are claimed one at a time, so a
/// slow thread only delays the chunk it holds.
pub(crate) fn run(threads: usize, n: usize, f: &(dyn Fn(usize) + Sync)) {
    let threads = if threads == 0 { cores() } else { threads }.clamp(1, n.max(1));
    if threads == 1 {
        (0..n).for_each(f);
        return;
    }
    let next = AtomicUsize::new(0);
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        f(i);
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            // A thread that cannot be spawned leaves its chunks to the others.
            let _ = std::thread::Builder::new().spawn_scoped(s, work);
        }
        work();
    });
}
