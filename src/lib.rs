//! Safe Rust bindings over Huawei Ascend CANN's aclnn `BatchNormReduceBackward`.
#![allow(dead_code)]

pub mod cpu;
pub mod dtype;

pub use dtype::{bf16, f16, DType, Element};
