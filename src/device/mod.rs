//! The safe Ascend layer: RAII over the ACL runtime handles.
//!
//! * [`Device`]: a loaded toolkit, initialised once per process, and a device id that is bound
//!   (`aclrtSetDevice`) on the calling thread before every runtime call.
//! * [`StreamInner`]: an `aclrtStream`, synchronised and destroyed on drop, with its enqueue lock
//!   and what it guards ([`Enqueue`]: the workspace reused by the operators launched on it, and
//!   the launch cache's state).
//! * [`allocator`]: the stream-ordered caching allocator of each device.
//! * [`DeviceAlloc`] / [`DeviceBuffer`]: device memory from it; a buffer remembers every stream
//!   that enqueued work on it, and goes back to the allocator after that work (events, no host
//!   wait); work of another stream on it is ordered after them by an event on the device.
//! * [`event`]: the device's pool of reusable ordering events, and [`EventInner`], an event
//!   held by streams (pooled) or by the public `Event` (timing).
//! * [`descriptor::AclTensor`] and [`executor::Executor`]: `aclTensor` and `aclOpExecutor`.
//! * [`launch_cache`]: the repeatable executors a stream keeps, so repeated launches skip phase 1.

pub(crate) mod allocator;
pub(crate) mod capture;
pub(crate) mod descriptor;
pub(crate) mod event;
pub(crate) mod executor;
pub(crate) mod launch_cache;
mod memory;
mod runtime;
mod stream;

pub(crate) use event::EventInner;
pub(crate) use memory::{enqueue_if_sole_user, enqueue_using, DeviceAlloc, DeviceBuffer};
pub(crate) use runtime::Device;
pub(crate) use stream::{Enqueue, StreamInner, Suspended, STAGING_MAX};

/// What a destructor may leave behind when a destroy call, or the synchronise before it, fails:
/// leaking is then the only sound choice, since queued work may still use the object.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Leak {
    Allocation = 0,
    Tensor = 1,
    Executor = 2,
    Stream = 3,
    Communicator = 4,
}

static LEAKS: [std::sync::atomic::AtomicU64; 5] = [const { std::sync::atomic::AtomicU64::new(0) }; 5];

/// Counts an object deliberately leaked by a destructor.
pub(crate) fn leaked(kind: Leak) {
    LEAKS[kind as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// How many objects of each kind (allocations, tensors, executors, streams, communicators)
/// destructors have leaked in this process.
#[cfg_attr(not(feature = "mock"), allow(dead_code))]
pub(crate) fn leaks() -> [u64; 5] {
    std::array::from_fn(|i| LEAKS[i].load(std::sync::atomic::Ordering::Relaxed))
}

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
