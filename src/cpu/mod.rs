//! The CPU backend: the pieces every CPU kernel shares (views, the thread pool, host access,
//! channel-wise loops), in pure Rust. Each operator's kernel lives in its own folder under
//! `src/ops/`.
//!
//! [`batch_norm_reduce_backward`] here is the zero-copy entry: it reads caller-owned slices
//! through [`View`]s (shape, strides and offset in elements) and writes into [`ViewMut`]s, so a
//! CPU user never copies gigabytes just to call the op. It validates exactly as the
//! [`ops`](crate::ops) entry points do (same errors, same status codes).
// Host allocations sized by a caller's count are fallible here (.ci/alloc-lint/clippy.toml).
#![deny(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) mod channelwise;
pub(crate) mod dims;
pub(crate) mod host;
pub(crate) mod isa;
pub(crate) mod memory;
pub(crate) mod pool;
pub(crate) mod scratch;
mod view;
pub(crate) mod widen;

pub use crate::ops::batch_norm_reduce_backward::cpu::{batch_norm_reduce_backward, Outputs};
pub use view::{View, ViewMut};

/// Most threads per call; 0 = one per core.
static MAX_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Sets the most threads one call of the CPU backend uses (the caller's thread included;
/// 0 = one per core, the default) and returns the previous setting. Results are bit-identical
/// whatever the setting; small inputs use fewer threads anyway. Applies to calls that start
/// afterwards, on every thread.
pub fn set_max_threads(threads: usize) -> usize {
    MAX_THREADS.swap(threads, Ordering::Relaxed)
}

/// The setting of [`set_max_threads`] (0 = one per core).
pub fn max_threads() -> usize {
    MAX_THREADS.load(Ordering::Relaxed)
}

/// The instruction set every CPU kernel uses: `"avx512"`, `"avx2"`, `"neon"` or `"portable"`. It is the
/// best this CPU supports unless the environment variable `ASCEND_CPU_ISA` (`avx2` or
/// `portable`, read once) asks for a lesser one; a value this CPU cannot honour is reported on
/// standard error and ignored. Every choice gives the same bits.
pub fn instruction_set() -> &'static str {
    isa::Isa::detect().name()
}
