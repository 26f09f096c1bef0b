//! The safe Ascend layer: RAII over the ACL runtime handles.
//!
//! * [`Device`]: a loaded toolkit, initialised once per process, and a device id that is bound
//!   (`aclrtSetDevice`) on the calling thread before every runtime call.
//! * [`StreamInner`]: an `aclrtStream`, synchronised and destroyed on drop, with the workspace
//!   reused by the operator on that stream.
//! * [`DeviceAlloc`] / [`DeviceBuffer`]: device memory; a buffer remembers every stream that
//!   enqueued work on it and synchronises them before `aclrtFree`.
//! * [`descriptor::AclTensor`] and [`executor::Executor`]: `aclTensor` and `aclOpExecutor`.

pub(crate) mod descriptor;
pub(crate) mod executor;
mod memory;
mod runtime;
mod stream;

pub(crate) use memory::{enqueue_using, DeviceAlloc, DeviceBuffer};
pub(crate) use runtime::Device;
pub(crate) use stream::StreamInner;

/// Reports an error from a destructor (which cannot return it) on standard error. Never panics
/// (unlike `eprintln!`, a failed write is ignored).
pub(crate) fn report_drop_error(what: &str, err: &crate::Error) {
    report(format_args!("{what} failed while dropping: {err}"));
}

/// Writes one `ascend: ...` line to standard error, ignoring write failures.
pub(crate) fn report(message: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "ascend: {message}");
}
