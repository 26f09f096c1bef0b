//! Layers users run, over the operators: [`BatchNorm`], torch's `BatchNorm{1,2,3}d` and
//! `SyncBatchNorm` in one type, on both backends.

mod batch_norm;

pub use batch_norm::{BatchNorm, BatchNormSaved, Grads};
