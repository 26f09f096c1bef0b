//! [`HostBuffer`]: pinned host memory for asynchronous copies, and the copies themselves.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

use ascend_sys::aclrtMemcpyKind;

use crate::context::{Context, ContextKind};
use crate::device::event::After;
use crate::device::{enqueue_using, report, Device, StreamInner};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::tensor::Tensor;

/// `len` elements of host memory that asynchronous copies may use: page-locked
/// (`aclrtMallocHost`) on Ascend, a plain allocation on the CPU backend. Starts zeroed.
///
/// A copy queued on a stream records the stream on the buffer, like a device buffer: reading
/// ([`as_slice`](Self::as_slice)) or writing ([`as_mut_slice`](Self::as_mut_slice)) the
/// elements, and dropping the buffer, first wait for every stream that queued a copy of it, so
/// safe code never sees memory a copy is still using. Dropping never blocks: the pinned block is
/// freed once events recorded after its queued copies have completed. `Send + Sync`.
pub struct HostBuffer<T: Element> {
    ptr: *mut T,
    len: usize,
    /// The toolkit's device for pinned memory; `None` on the CPU backend (then `ptr` comes from
    /// the vector below) or for an empty buffer.
    pinned: Option<Arc<Device>>,
    /// Owns the memory `ptr` points into on the CPU backend (its heap block never moves).
    _host: Vec<T>,
    users: Mutex<Vec<Arc<StreamInner>>>,
}

// SAFETY: the buffer owns its memory uniquely; host memory is usable from any thread; the list
// of streams is behind a mutex and every access to the elements waits for those streams first.
unsafe impl<T: Element> Send for HostBuffer<T> {}
// SAFETY: `&HostBuffer` reads the elements only after the queued copies into it have completed
// (`as_slice` waits), and only queues copies that read it.
unsafe impl<T: Element> Sync for HostBuffer<T> {}

impl<T: Element> std::fmt::Debug for HostBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer")
            .field("dtype", &T::DTYPE)
            .field("len", &self.len)
            .field("pinned", &self.pinned.is_some())
            .finish()
    }
}

impl<T: Element> HostBuffer<T> {
    /// `len` zeroed elements: pinned memory (`aclrtMallocHost`) on an Ascend context, a host
    /// vector on the CPU backend.
    pub fn new(ctx: &Context, len: usize) -> Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| Error::invalid("len", format!("{len} elements of {} exceed the address space", T::DTYPE)))?;
        let users = Mutex::new(Vec::new());
        match &ctx.kind {
            ContextKind::Ascend(device) if bytes > 0 => {
                device.reap_host_frees(false);
                device.bind()?;
                let p = crate::acl::malloc_host(device.cann, bytes)?.cast::<T>();
                // SAFETY: `p` is a fresh allocation of `bytes` bytes (aligned for any scalar, as
                // malloc is); all-zero bytes are a valid f32/f16/bf16/i32.
                unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
                Ok(HostBuffer { ptr: p, len, pinned: Some(device.clone()), _host: Vec::new(), users })
            }
            _ => {
                let mut host = Vec::new();
                host.try_reserve_exact(len).map_err(|_| Error::HostAlloc { bytes })?;
                host.resize(len, T::default());
                let ptr = host.as_mut_ptr();
                Ok(HostBuffer { ptr, len, pinned: None, _host: host, users })
            }
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn lock_users(&self) -> MutexGuard<'_, Vec<Arc<StreamInner>>> {
        self.users.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for every stream that queued a copy of this buffer.
    fn wait_for_copies(users: &mut Vec<Arc<StreamInner>>) -> Result<()> {
        while let Some(s) = users.last() {
            s.synchronize()?;
            users.pop();
        }
        Ok(())
    }

    /// The elements, after every queued copy of this buffer has completed (this waits for their
    /// streams). If a stream cannot be synchronised the copy may still be running: the error is
    /// reported on standard error and the slice is empty.
    pub fn as_slice(&self) -> &[T] {
        if let Err(e) = Self::wait_for_copies(&mut self.lock_users()) {
            report(format_args!("HostBuffer::as_slice: a queued copy could not be waited for: {e}"));
            return &[];
        }
        // SAFETY: `ptr` holds `len` initialised elements owned by `self`; no queued copy uses
        // them any more, and a new one writing them needs `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The elements, writable, after every queued copy of this buffer has completed (this waits
    /// for their streams). If a stream cannot be synchronised the error is reported on standard
    /// error and the slice is empty.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        if let Err(e) = Self::wait_for_copies(self.users.get_mut().unwrap_or_else(|p| p.into_inner())) {
            report(format_args!("HostBuffer::as_mut_slice: a queued copy could not be waited for: {e}"));
            return &mut [];
        }
        // SAFETY: as in `as_slice`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Queues `copy` (which uses this buffer's memory) on `inner`, after the copies other
    /// streams queued on it (ordered on the device by events), and records `inner` on it.
    fn enqueue_copy(&self, inner: &Arc<StreamInner>, copy: impl FnOnce(*mut c_void) -> Result<()>) -> Result<()> {
        let mut users = self.lock_users();
        while let Some(i) = users.iter().position(|s| !Arc::ptr_eq(s, inner)) {
            inner.order_after(&users[i])?;
            users.swap_remove(i);
        }
        let result = copy(self.ptr.cast());
        if users.is_empty() {
            users.push(inner.clone());
        }
        result
    }
}

impl<T: Element> Drop for HostBuffer<T> {
    /// Never waits for queued copies: with copies still queued, an event is recorded after them
    /// on each stream and the pinned block is freed later, once those events have completed
    /// (checked without blocking at the next `HostBuffer::new` or drop on the device, and at
    /// the device's teardown). Only when an event cannot be recorded does it wait instead.
    fn drop(&mut self) {
        let users = std::mem::take(self.users.get_mut().unwrap_or_else(|p| p.into_inner()));
        let Some(device) = self.pinned.take() else {
            // CPU memory: copies on the CPU backend run when they are submitted.
            return;
        };
        // No event on a stream: it is waited for instead (the block leaked if even that fails).
        let what = "aclrtSynchronizeStream (before aclrtFreeHost)";
        let events = match crate::device::event::record_after(&device, users.iter().map(|s| &**s), None, what) {
            After::Events(events) => events,
            After::Capturing(keep) => {
                // A capture begun on a stream since its copy (seen under its enqueue lock: nothing
                // recorded into it): the graph keeps the buffer, dropped again once it goes.
                let ptr = std::mem::replace(&mut self.ptr, std::ptr::null_mut());
                let users = Mutex::new(users);
                let _ = keep.hold(HostBuffer { ptr, len: self.len, pinned: Some(device), _host: Vec::new(), users });
                return;
            }
            After::Unknown => {
                report(format_args!("leaking pinned host memory that a queued copy may still use"));
                return;
            }
        };
        let events = events.into_iter().map(|(_, e)| e).collect();
        device.deferred_host_frees.lock().unwrap_or_else(|p| p.into_inner()).push((self.ptr as usize, events));
        device.reap_host_frees(false);
    }
}

/// The device address of a contiguous tensor's first element and its byte count, checking that
/// `n` elements of `T` match it.
fn contiguous_target<T: Element>(t: &Tensor, n: usize, what: &'static str) -> Result<()> {
    if t.dtype() != T::DTYPE {
        return Err(Error::invalid(what, format!("the tensor holds {}, the host buffer {}", t.dtype(), T::DTYPE)));
    }
    if !t.is_contiguous() {
        return Err(Error::invalid("tensor", "asynchronous copies need a contiguous view"));
    }
    if t.numel() != n {
        return Err(Error::invalid(
            what,
            format!("the tensor has {} elements (shape {:?}), the host buffer {n}", t.numel(), t.shape()),
        ));
    }
    Ok(())
}

/// The Ascend stream of a copy, checking that `h` is pinned memory of the stream's device (one
/// rule for every handle: used only with work of its own device).
fn pinned_stream<'s, T: Element>(stream: &'s Stream, h: &HostBuffer<T>) -> Result<&'s Arc<StreamInner>> {
    let Some((inner, device)) = stream.ascend() else {
        return Err(stream.mismatch("stream", "the call needs an Ascend stream"));
    };
    if h.len == 0 {
        return Ok(inner);
    }
    match &h.pinned {
        Some(d) if d.same(device) => Ok(inner),
        Some(d) => Err(stream.mismatch("host", &format!("the host buffer was made on Ascend device {}", d.id))),
        None => Err(Error::invalid("host", "the host buffer was not made by HostBuffer::new on an Ascend context")),
    }
}

impl Tensor {
    /// Copies `h` into this tensor, asynchronously on `stream` (`aclrtMemcpyAsync` host →
    /// device; a plain copy on the CPU backend). The tensor must be contiguous, of `T`'s dtype
    /// and `h.len()` elements. `h` is recorded on the stream: reading it waits for the copy,
    /// dropping it frees the pinned memory only after the copy (without waiting).
    pub fn copy_from_host_async<T: Element>(&mut self, stream: &Stream, h: &HostBuffer<T>) -> Result<()> {
        self.check_stream(stream, "tensor")?;
        contiguous_target::<T>(self, h.len, "host")?;
        if stream.ascend().is_none() {
            return self.copy_from_slice(stream, h.as_slice());
        }
        self.enqueue_host_copy(stream, h, aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_DEVICE)
    }

    /// Copies this tensor into `h`, asynchronously on `stream` (`aclrtMemcpyAsync` device →
    /// host; a plain copy on the CPU backend). The tensor must be contiguous, of `T`'s dtype and
    /// `h.len()` elements. `h` is recorded on the stream: reading it waits for the copy,
    /// dropping it frees the pinned memory only after the copy (without waiting).
    pub fn copy_to_host_async<T: Element>(&self, stream: &Stream, h: &mut HostBuffer<T>) -> Result<()> {
        self.check_stream(stream, "tensor")?;
        contiguous_target::<T>(self, h.len, "host")?;
        if stream.ascend().is_none() {
            let values = self.to_vec::<T>(stream)?;
            h.as_mut_slice().copy_from_slice(&values);
            return Ok(());
        }
        self.enqueue_host_copy(stream, h, aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_HOST)
    }

    /// The Ascend half of both async copies: `aclrtMemcpyAsync` between this contiguous view and
    /// the pinned `h`, in the direction `kind`, recorded on `stream` for both.
    fn enqueue_host_copy<T: Element>(&self, stream: &Stream, h: &HostBuffer<T>, kind: aclrtMemcpyKind) -> Result<()> {
        let inner = pinned_stream(stream, h)?;
        // (No lock: the caller's stream, whose captures only this thread begins or ends.)
        if inner.capturing() {
            // (A replay would read or write the pinned memory after the HostBuffer may be gone.)
            return Err(StreamInner::capture_refusal("aclrtMemcpyAsync (a HostBuffer copy)"));
        }
        let Some((buffer, device)) = self.device_buffer() else {
            return Err(Error::internal("tensor: a host tensor reached the Ascend backend"));
        };
        let bytes = h.len * std::mem::size_of::<T>();
        if bytes == 0 {
            return Ok(());
        }
        let view = buffer.ptr().cast::<u8>().wrapping_add(self.offset() * std::mem::size_of::<T>()).cast::<c_void>();
        h.enqueue_copy(inner, |host| {
            enqueue_using(inner, [buffer], |_| {
                device.bind()?;
                let (dst, src) = match kind {
                    aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_DEVICE => (view, host.cast_const()),
                    _ => (host, view.cast_const()),
                };
                // SAFETY: [view, view+bytes) is the contiguous view inside the buffer (checked at
                // creation) and `host` the pinned buffer of `bytes`; the device buffer and the
                // pinned memory are recorded on the stream (the buffer by enqueue_using, the host
                // buffer by enqueue_copy) before any lock is released, so neither is freed or
                // touched by the host before the copy ran (for a read into `h`, `&mut h` at the
                // caller keeps the host off it until `as_slice` waited for the copy).
                unsafe { crate::acl::memcpy_async(device.cann, dst, src, bytes, kind, inner.raw()) }
            })
        })
    }
}
