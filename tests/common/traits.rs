//! Compile-time trait probes for the public types: `send::<Stream>()` compiles only if `Stream`
//! is `Send`, and so on.

pub fn clone_send_sync<T: Clone + Send + Sync>() {}
pub fn send<T: Send>() {}
pub fn send_sync<T: Send + Sync>() {}
pub fn copy<T: Copy>() {}
pub fn debug<T: std::fmt::Debug>() {}
pub fn error<T: std::error::Error + Send + Sync + 'static>() {}
