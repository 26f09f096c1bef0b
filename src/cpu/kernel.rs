//! The CPU reduction kernel: per-channel Σdy and Σdy·(x − mean) over host memory.
//!
//! (Interface fixed; implementation by the CPU-backend work.)

use crate::dtype::Element;

/// A read-only strided view over host memory. The caller has validated it: `shape.len() ==
/// strides.len()` (2..=8), channel = dim 1, and every element's index
/// `offset + Σ i_k·strides[k]` lies inside `data`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StridedView<'a, T> {
    pub data: &'a [T],
    pub shape: &'a [usize],
    pub strides: &'a [usize],
    pub offset: usize,
}

/// Per-channel sums, each accumulated without cancellation and returned in f64 so that the
/// caller rounds exactly once into the output dtype.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ChannelSums {
    /// Σ dy per channel.
    pub sum_dy: Vec<f64>,
    /// Σ dy·(x − mean[c]) per channel, when asked for.
    pub sum_dy_xmu: Option<Vec<f64>>,
}

/// Computes the per-channel sums of `dy` (and of `dy·(x − mean)` when `with_xmu`), where
/// `dy` and `x` have the same shape (possibly different strides) and `mean.len() == C`.
/// `threads` is the most worker threads to use (0 = all cores). Results are bit-identical
/// whatever `threads` and `with_xmu` are.
pub(crate) fn channel_sums<T: Element>(
    dy: StridedView<'_, T>,
    x: StridedView<'_, T>,
    mean: &[f32],
    with_xmu: bool,
    threads: usize,
) -> ChannelSums {
    let _ = (dy, x, mean, with_xmu, threads);
    unimplemented!("CPU kernel")
}
