//! Safe Rust bindings over Huawei Ascend CANN's aclnn operator API and HCCL: the SyncBatchNorm
//! toolkit for Rust on Ascend. [`ops`] holds the five BatchNorm operators SyncBatchNorm is made
//! of (`aclnnBatchNormReduceBackward`, `aclnnBatchNormStats`,
//! `aclnnBatchNormGatherStatsWithCounts`, `aclnnBatchNormElemt`, `aclnnBatchNormElemtBackward`),
//! [`hccl`] the collectives across devices and servers, and [`sync_batch_norm`] chains them in
//! torch's order. [`nn::BatchNorm`] is the layer users run, torch's `BatchNorm{1,2,3}d` and
//! `SyncBatchNorm` in one type, over `aclnnBatchNorm`/`aclnnBatchNormBackward` on one device
//! ([`ops::batch_norm`], [`ops::batch_norm_backward`]) and that chain over ranks.
//!
//! The package is `ascend-aclnn` on the crate registry (`cargo add ascend-aclnn`); the library
//! is named `ascend`, so code writes `use ascend::...`.
//!
//! One API, two backends: **Ascend** (CANN loaded at run time through [`ascend_sys`]) and
//! **CPU** (pure Rust, used wherever there is no Ascend hardware).
//!
//! ```
//! use ascend::{Context, Tensor, ops::{batch_norm_reduce_backward, OutputMask}};
//!
//! # fn main() -> ascend::Result<()> {
//! let ctx = Context::cpu(); // or Context::auto()? for Ascend device 0 when present
//! let stream = ctx.new_stream()?;
//! let dy = Tensor::from_slice(&stream, &[1f32, 1., 1., 2., 2., 2., 3., 3.], &[4, 2])?;
//! let x = Tensor::from_slice(&stream, &[0f32, 1., 2., 3., 4., 5., 6., 7.], &[4, 2])?;
//! let ones = Tensor::from_slice(&stream, &[1f32, 1.], &[2])?;
//! let out = batch_norm_reduce_backward(&stream, &dy, &x, &ones, &ones, None, OutputMask::ALL)?;
//! assert_eq!(out.sum_dy.unwrap().to_vec::<f32>(&stream)?, [7.0, 8.0]);
//! assert_eq!(out.sum_dy_xmu.unwrap().to_vec::<f32>(&stream)?, [21.0, 30.0]);
//! # Ok(()) }
//! ```
//!
//! [`Tensor::to_dlpack`] and [`Tensor::from_dlpack`] exchange tensors with torch_npu and other
//! frameworks through DLPack (device memory shared, not copied); with the `ndarray` feature,
//! `Tensor::from_array` and `Tensor::to_array` copy host arrays in and out.
//!
//! Layers (cudarc's split): [`ascend_sys`] (raw FFI and loader) → `acl` (one checked wrapper per
//! C call) → the safe types here ([`Context`], [`Stream`], [`Tensor`], [`ops`]) → the [`cpu`]
//! backend beside them. With the `mock` feature, `mock` runs the Ascend path on a fake CANN.

#![warn(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acl;
#[cfg(feature = "ndarray")]
mod array;
mod context;
pub mod cpu;
mod device;
mod dlpack;
pub mod dtype;
mod error;
mod event;
mod graph;
pub mod hccl;
mod host_buffer;
mod layout;
#[cfg(feature = "mock")]
#[cfg_attr(docsrs, doc(cfg(feature = "mock")))]
pub mod mock;
pub mod nn;
pub mod ops;
mod stream;
pub mod sync_batch_norm;
mod tensor;

pub use context::{Backend, Context, MemoryStats, BACKEND_ENV};
pub use device::launch_cache::LaunchCacheStats;
pub use dlpack::{DlDevice, DlPack};
pub use dtype::{bf16, f16, DType, Element};
pub use error::{Error, Result, STATUS_INVALID, STATUS_NULLPTR};
pub use event::Event;
pub use graph::{CaptureMode, Graph};
pub use host_buffer::HostBuffer;
pub use stream::Stream;
pub use tensor::Tensor;

/// The raw FFI crate, re-exported.
pub use ascend_sys as sys;
