//! Process-wide runtime initialisation and per-thread device binding.

use std::cell::Cell;
use std::sync::{Arc, Mutex};

use ascend_sys::Cann;

use crate::acl;
use crate::error::{Error, Result};

/// A device of a loaded CANN toolkit.
pub(crate) struct Device {
    pub(crate) cann: &'static Cann,
    pub(crate) id: i32,
    /// The caching allocator of this context's device memory (see `Context::memory_stats`).
    pub(crate) memory: super::allocator::Allocator,
    /// The pool of reusable ordering events of this device (see [`super::event`]).
    pub(crate) events: super::event::EventPool,
    /// Pinned host blocks (addresses from `aclrtMallocHost`) whose owner was dropped while
    /// copies were queued on them, each with an event recorded after those copies on every
    /// stream that used it: freed once all its events have completed.
    pub(crate) deferred_host_frees: Mutex<Vec<(usize, Vec<super::event::PooledEvent>)>>,
}

impl Device {
    /// Frees the deferred pinned blocks whose events have all completed (queried, never
    /// waited for); with `wait`, waits for the events first (teardown).
    pub(crate) fn reap_host_frees(&self, wait: bool) {
        let mut list = self.deferred_host_frees.lock().unwrap_or_else(|p| p.into_inner());
        if list.is_empty() || self.bind().is_err() {
            return;
        }
        list.retain_mut(|(ptr, events)| {
            let done =
                events.iter().all(|e| if wait { e.synchronize(self.cann).is_ok() } else { e.is_complete(self.cann) });
            if !done {
                return true;
            }
            // SAFETY: `ptr` came from aclrtMallocHost, its owner is gone, and every copy that
            // used it came before one of these events, all of which have completed.
            if let Err(e) = unsafe { acl::free_host(self.cann, *ptr as *mut std::ffi::c_void) } {
                super::report_drop_error("aclrtFreeHost", &e);
            }
            for e in events.drain(..) {
                self.events.give_back(self.cann, e);
            }
            false
        });
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // Every stream is gone (each holds the device), so every event has completed.
        self.reap_host_frees(true);
        let left = self.deferred_host_frees.get_mut().unwrap_or_else(|p| p.into_inner()).len();
        if left > 0 {
            super::report(format_args!("leaking {left} pinned host blocks whose copies could not be waited for"));
            // The events are leaked with them: a failed wait may leave a copy running.
            std::mem::forget(std::mem::take(self.deferred_host_frees.get_mut().unwrap_or_else(|p| p.into_inner())));
        }
        // Every block has been returned (each held the device): free the cache.
        match self.bind() {
            Ok(()) => {
                self.memory.teardown(self.cann, &self.events);
                self.events.teardown(self.cann);
            }
            Err(e) => super::report_drop_error("aclrtSetDevice (freeing the memory cache)", &e),
        }
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("id", &self.id).field("libraries", &self.cann.paths).finish()
    }
}

thread_local! {
    /// The (toolkit, device) this thread last bound with `aclrtSetDevice`.
    static BOUND: Cell<(usize, i32)> = const { Cell::new((0, -1)) };
}

/// Toolkits on which `aclInit` has succeeded in this process.
static INITIALISED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn key(cann: &'static Cann) -> usize {
    cann as *const Cann as usize
}

impl Device {
    /// Initialises the runtime (once per process and toolkit), checks that `id` exists and binds
    /// it on the calling thread.
    pub(crate) fn open(cann: &'static Cann, id: i32) -> Result<Arc<Device>> {
        {
            let mut done = INITIALISED.lock().unwrap_or_else(|p| p.into_inner());
            if !done.contains(&key(cann)) {
                acl::init(cann)?;
                done.push(key(cann));
            }
        }
        let count = acl::device_count(cann)?;
        if id < 0 || id as u32 >= count {
            return Err(Error::NoDevice { device: id, count });
        }
        let device = Arc::new(Device {
            cann,
            id,
            memory: super::allocator::Allocator::from_env(),
            events: super::event::EventPool::default(),
            deferred_host_frees: Mutex::new(Vec::new()),
        });
        device.bind()?;
        Ok(device)
    }

    /// Binds this device on the calling thread (`aclrtSetDevice`), unless it already is.
    pub(crate) fn bind(&self) -> Result<()> {
        let me = (key(self.cann), self.id);
        if BOUND.with(|b| b.get()) == me {
            return Ok(());
        }
        acl::set_device(self.cann, self.id)?;
        BOUND.with(|b| b.set(me));
        Ok(())
    }

    /// Whether `other` is the same device of the same toolkit.
    #[inline]
    pub(crate) fn same(&self, other: &Device) -> bool {
        key(self.cann) == key(other.cann) && self.id == other.id
    }
}
