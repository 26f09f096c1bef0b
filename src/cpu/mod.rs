//! The CPU backend.

pub(crate) mod kernel;
