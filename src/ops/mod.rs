//! Operators, one folder each, on the shared launch path: [`batch_norm_reduce_backward`]
//! (`aclnnBatchNormReduceBackward`), the per-channel reductions of BatchNorm's backward pass and
//! the building block of SyncBatchNorm; and its companions
//! [`batch_norm_stats`] (`aclnnBatchNormStats`: per-channel mean and invstd),
//! [`batch_norm_gather_stats_with_counts`] (`aclnnBatchNormGatherStatsWithCounts`: the global
//! statistics from every rank's, and the running statistics), [`batch_norm_elemt`]
//! (`aclnnBatchNormElemt`) and [`batch_norm_elemt_backward`] (`aclnnBatchNormElemtBackward`),
//! SyncBatchNorm's element-wise steps (see their docs); and single-device BatchNorm,
//! [`batch_norm`] (`aclnnBatchNorm`) and [`batch_norm_backward`] (`aclnnBatchNormBackward`);
//! and [`cast`] (`aclnnCast`, between f32, f16 and bf16), with which SyncBatchNorm widens a bf16
//! input for the statistics.
// Host allocations sized by a caller's count are fallible here (.ci/alloc-lint/clippy.toml).
#![deny(clippy::disallowed_methods)]

pub(crate) mod batch_norm;
mod batch_norm_backward;
mod batch_norm_elemt;
mod batch_norm_elemt_backward;
mod batch_norm_gather_stats_with_counts;
pub(crate) mod batch_norm_reduce_backward;
mod batch_norm_stats;
mod call;
mod cast;
mod launch;
mod operator;
mod prepared;
pub(crate) mod validate;

pub use crate::layout::{MAX_RANK, MIN_RANK};
pub use batch_norm::{batch_norm, batch_norm_into, prepare_batch_norm, BatchNormSaved};
pub use batch_norm_backward::{
    batch_norm_backward, batch_norm_backward_into, prepare_batch_norm_backward, BatchNormGrads, BatchNormGradsOut,
};
pub use batch_norm_elemt::{batch_norm_elemt, batch_norm_elemt_into, prepare_batch_norm_elemt};
pub use batch_norm_elemt_backward::{
    batch_norm_elemt_backward, batch_norm_elemt_backward_into, prepare_batch_norm_elemt_backward,
};
pub use batch_norm_gather_stats_with_counts::{
    batch_norm_gather_stats_with_counts, batch_norm_gather_stats_with_counts_into,
    prepare_batch_norm_gather_stats_with_counts,
};
pub use batch_norm_reduce_backward::{
    batch_norm_reduce_backward, batch_norm_reduce_backward_into, prepare_batch_norm_reduce_backward, OutputMask,
    PreparedReduceBackward, ReduceBackward, ReduceBackwardOut,
};
pub(crate) use batch_norm_stats::host_stats_into;
pub use batch_norm_stats::{batch_norm_stats, batch_norm_stats_into, prepare_batch_norm_stats};
pub use cast::{cast, cast_into, prepare_cast};
pub use launch::Workspace;
pub use prepared::Prepared;

/// The input rules of single operators over layouts, dtypes and scalars, for composite calls
/// (`sync_batch_norm`) that validate everything before their first side effect: none allocates,
/// uploads or enqueues anything, so a composite asks them with the layouts of tensors it has not
/// made yet. An entry applies the same rules, then checks its tensors' streams ([`streams`]).
pub(crate) mod checks {
    pub(crate) use super::batch_norm_elemt::{check_inputs as batch_norm_elemt, ElemtInputs};
    pub(crate) use super::batch_norm_elemt_backward::{check_inputs as batch_norm_elemt_backward, ElemtBackwardInputs};
    pub(crate) use super::batch_norm_gather_stats_with_counts::{
        check_inputs as batch_norm_gather_stats_with_counts, check_scalars as gather_scalars, GatherInputs,
    };
    pub(crate) use super::batch_norm_stats::check_inputs as batch_norm_stats;
    pub(crate) use super::call::check_streams as streams;
}
