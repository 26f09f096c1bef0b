//! Compile-time trait probes for the public types: `send::<Stream>()` compiles only if `Stream`
//! is `Send`, and so on.

pub fn clone_send_sync<T: Clone + Send + Sync>() {}
pub fn send<T: Send>() {}
pub fn send_sync<T: Send + Sync>() {}
pub fn copy<T: Copy>() {}
pub fn debug<T: std::fmt::Debug>() {}
pub fn error<T: std::error::Error + Send + Sync + 'static>() {}

/// `probe!(debug: A, B<'static>)`: the probe `debug` of each type listed (compiles only if each
/// has the probed traits).
macro_rules! probe {
    ($probe:ident: $($t:ty),+ $(,)?) => {
        $($crate::common::traits::$probe::<$t>();)+
    };
}
pub(crate) use probe;

/// The trait bounds docs/DESIGN.md's "Public API contract" states for the public types (the
/// contract test checks these; `api.rs` checks them and more).
pub fn public_api_contract() {
    use ascend::ops::{OutputMask, ReduceBackward, ReduceBackwardOut};
    use ascend::{Backend, Context, DType, Error, Stream, Tensor};
    probe!(clone_send_sync: Context);
    probe!(send: Stream);
    probe!(send_sync: Tensor);
    probe!(copy: OutputMask);
    probe!(debug: Context, Stream, Tensor, ReduceBackward, ReduceBackwardOut<'static>, Error, Backend, DType);
}
