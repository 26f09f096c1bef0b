//! Device memory.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{leaked, report_drop_error, Device, Leak, StreamInner};
use crate::acl;
use crate::error::Result;

/// One `aclrtMalloc` allocation, freed on drop, or device memory another owner keeps (never
/// freed here). The owner guarantees no pending work uses it by then (see [`DeviceBuffer`] for
/// memory shared with streams).
pub(crate) struct DeviceAlloc {
    device: Arc<Device>,
    ptr: *mut c_void,
    bytes: usize,
    /// Whether this value frees the memory (false for the caller's memory).
    owned: bool,
}

// SAFETY: the pointer is a device address, meaningful from any thread that binds the device
// (which every use does first); the allocation is owned uniquely by this value.
unsafe impl Send for DeviceAlloc {}
// SAFETY: `&DeviceAlloc` only exposes the address and size.
unsafe impl Sync for DeviceAlloc {}

impl DeviceAlloc {
    /// Allocates `bytes` (0 allocates nothing and yields a null pointer).
    pub(crate) fn new(device: Arc<Device>, bytes: usize) -> Result<Self> {
        if bytes == 0 {
            return Ok(DeviceAlloc { device, ptr: std::ptr::null_mut(), bytes, owned: true });
        }
        device.bind()?;
        let ptr = acl::malloc(device.cann, bytes)?;
        device.memory.allocated(bytes);
        Ok(DeviceAlloc { device, ptr, bytes, owned: true })
    }

    /// `bytes` of device memory at `ptr` that another owner allocated and frees.
    ///
    /// # Safety
    /// `ptr` is the start of `bytes` of device memory of `device` that stays allocated until this
    /// value and every piece of work enqueued on it have finished.
    pub(crate) unsafe fn foreign(device: Arc<Device>, ptr: *mut c_void, bytes: usize) -> Self {
        DeviceAlloc { device, ptr, bytes, owned: false }
    }

    pub(crate) fn ptr(&self) -> *mut c_void {
        self.ptr
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn device(&self) -> &Arc<Device> {
        &self.device
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if self.ptr.is_null() || !self.owned {
            return;
        }
        self.device.memory.released(self.bytes);
        let result = self.device.bind().and_then(|()| {
            // SAFETY: `ptr` came from aclrtMalloc and the owner guarantees no pending work uses it.
            unsafe { acl::free(self.device.cann, self.ptr) }
        });
        if let Err(e) = result {
            report_drop_error("aclrtFree", &e);
            leaked(Leak::Allocation);
        }
    }
}

/// Device memory shared with streams: every stream that enqueued work on it is recorded, and
/// dropping the buffer synchronises those streams before freeing it.
pub(crate) struct DeviceBuffer {
    /// `None` only inside `drop`.
    alloc: Option<DeviceAlloc>,
    users: Mutex<Vec<Arc<StreamInner>>>,
}

impl DeviceBuffer {
    pub(crate) fn new(device: Arc<Device>, bytes: usize) -> Result<Self> {
        Ok(DeviceBuffer { alloc: Some(DeviceAlloc::new(device, bytes)?), users: Mutex::new(Vec::new()) })
    }

    /// A buffer over the caller's device memory (see [`DeviceAlloc::foreign`]): recorded on
    /// streams and synchronised on drop like any buffer, never freed.
    ///
    /// # Safety
    /// As [`DeviceAlloc::foreign`].
    pub(crate) unsafe fn foreign(device: Arc<Device>, ptr: *mut c_void, bytes: usize) -> Self {
        // SAFETY: the caller's guarantee, passed on.
        DeviceBuffer { alloc: Some(unsafe { DeviceAlloc::foreign(device, ptr, bytes) }), users: Mutex::new(Vec::new()) }
    }

    fn alloc(&self) -> &DeviceAlloc {
        self.alloc.as_ref().expect("DeviceBuffer::alloc is Some until drop")
    }

    pub(crate) fn ptr(&self) -> *mut c_void {
        self.alloc().ptr()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.alloc().bytes()
    }

    pub(crate) fn device(&self) -> &Arc<Device> {
        self.alloc().device()
    }

    fn lock_users(&self) -> MutexGuard<'_, Vec<Arc<StreamInner>>> {
        self.users.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for all work enqueued on this buffer, so the host may read or overwrite it. Holds
    /// the buffer's stream list while it waits, so a launch on another thread cannot slip in
    /// between the wait and the forgetting of a stream.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let mut users = self.lock_users();
        while let Some(s) = users.last() {
            s.synchronize()?; // on failure it stays listed, so drop still waits for it
            users.pop();
        }
        Ok(())
    }
}

/// Enqueues work that touches `buffers` on `stream`, as one step.
///
/// Every buffer's list of streams is locked (in address order, so two calls never deadlock, and
/// each buffer once however often it is listed); work that other streams queued on a buffer is
/// ordered before this work on the device (an event recorded on each such stream, waited for by
/// `stream`: the host does not block), so accesses from different streams never overlap;
/// `enqueue` runs; and `stream` is recorded on every buffer before any lock is released. So no
/// other thread can free a buffer, or enqueue on it from another stream, between the recording
/// and the enqueue: a buffer is freed only after every stream that may use it has finished.
/// `stream` is recorded even when `enqueue` fails (it may have queued part of its work;
/// recording too much only costs a sync).
///
/// Once `stream` waits for an earlier stream's event, the earlier stream is forgotten: waiting
/// for `stream` (as drop does) implies its work has completed.
pub(crate) fn enqueue_using<R>(
    stream: &Arc<StreamInner>,
    buffers: &[&DeviceBuffer],
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let mut sorted: Vec<&DeviceBuffer> = buffers.to_vec();
    sorted.sort_by_key(|b| std::ptr::from_ref::<DeviceBuffer>(b) as usize);
    sorted.dedup_by(|a, b| std::ptr::eq(*a, *b));
    let mut guards: Vec<MutexGuard<'_, Vec<Arc<StreamInner>>>> = sorted.iter().map(|b| b.lock_users()).collect();
    // Each earlier stream once, however many buffers it used.
    let mut ordered: Vec<Arc<StreamInner>> = Vec::new();
    for users in &mut guards {
        // On failure the unordered ones stay listed, so drop still waits for them.
        while let Some(i) = users.iter().position(|s| !Arc::ptr_eq(s, stream)) {
            if !ordered.iter().any(|o| Arc::ptr_eq(o, &users[i])) {
                stream.order_after(&users[i])?;
                ordered.push(users[i].clone());
            }
            users.swap_remove(i);
        }
    }
    let result = enqueue();
    for users in &mut guards {
        if users.is_empty() {
            users.push(stream.clone());
        }
    }
    result
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let mut drained = true;
        for s in self.users.get_mut().unwrap_or_else(|p| p.into_inner()).drain(..) {
            if let Err(e) = s.synchronize() {
                report_drop_error("aclrtSynchronizeStream (before aclrtFree)", &e);
                drained = false;
            }
        }
        let alloc = self.alloc.take();
        if drained {
            drop(alloc); // aclrtFree, now that no stream uses it
        } else if let Some(alloc) = alloc {
            // Work may still be using the memory: leaking it is the only sound choice.
            super::report(format_args!(
                "leaking {} bytes of device memory whose stream could not be synchronised",
                alloc.bytes()
            ));
            if !alloc.ptr.is_null() && alloc.owned {
                leaked(Leak::Allocation);
            }
            std::mem::forget(alloc);
        }
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer").field("device", &self.device().id).field("bytes", &self.bytes()).finish()
    }
}
