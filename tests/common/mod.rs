//! What the integration tests share, one definition each:
//!
//! * [`rng`]: the deterministic generator (splitmix64);
//! * [`data`]: host test data ([`Data`]) that knows its dtype and strided layout, uploads itself
//!   as a tensor and feeds the references; reading tensors back ([`read`], [`bits`]);
//! * [`tolerance`]: the per-dtype unit roundoffs and the tolerance checks built on them;
//! * [`backends`]: the contexts to run on and `on_both_backends!` (CPU always, the mock Ascend
//!   with `--features mock`, isolated);
//! * [`reduce_backward`]: the first operator's f64 reference and fixtures;
//! * [`mock_counters`]: the mock's host-wait and allocation counters, named;
//! * [`raw_mock`]: one raw session on the mock CANN through `ascend-sys`, for what the safe API
//!   cannot express;
//! * [`framework`]: `framework_tests!`, the launch path's behaviour every operator's test file
//!   instantiates (faults at each and at any CANN call, arguments dropped right after the
//!   launch, a prepared call dropped unlaunched, the two phases);
//! * [`self_exec`]: re-running the test binary as a child process;
//! * [`ranks`]: `on_ranks`, one thread per rank of a collectives test;
//! * [`traits`]: compile-time trait probes (`send::<T>()`, ...) for the public types.
#![allow(dead_code, unused_imports)]

pub mod backends;
pub mod data;
pub mod framework;
#[cfg(feature = "mock")]
pub mod mock_counters;
pub mod ranks;
#[cfg(feature = "mock")]
pub mod raw_mock;
pub mod reduce_backward;
pub mod rng;
pub mod self_exec;
pub mod tolerance;
pub mod traits;

pub(crate) use backends::on_both_backends;
pub use backends::*;
pub(crate) use data::uploaded;
pub use data::*;
pub use framework::Framework;
pub(crate) use framework::{framework_tests, one_output_framework_items, two_output_framework_items};
pub use ranks::on_ranks;
pub use reduce_backward::*;
pub use rng::*;
pub use tolerance::*;
