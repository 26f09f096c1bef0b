//! [`Context`]: which backend runs the work, and on which device.

use std::path::Path;
use std::sync::Arc;

use crate::device::{Device, StreamInner};
use crate::error::{Error, Result};
use crate::stream::Stream;

/// The backend a [`Context`] runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Pure Rust on the host: always available.
    Cpu,
    /// CANN on an Ascend NPU (or the mock CANN), through `ascend-sys`.
    Ascend,
}

/// Environment variable that forces [`Context::auto`]'s choice: `cpu` or `ascend`.
pub const BACKEND_ENV: &str = "ASCEND_BACKEND";

/// Device memory of a [`Context`] ([`Context::memory_stats`]): bytes and counts.
///
/// Memory is returned to the device (`aclrtFree`) when the last value using it is dropped and
/// its streams have finished; nothing is cached yet, so `reserved` equals `allocated`. On the
/// CPU backend every field is 0 (tensors are host memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Bytes of device memory held by live tensors, workspaces and buffers now.
    pub allocated: usize,
    /// Bytes of device memory this context holds from the runtime now (allocated plus cached).
    pub reserved: usize,
    /// The largest `allocated` seen since the context was made.
    pub peak_allocated: usize,
    /// Total `aclrtMalloc` calls this context made.
    pub device_allocations: u64,
}

/// A backend and, for Ascend, a device of a loaded toolkit. Cheap to clone; `Send + Sync`.
#[derive(Clone, Debug)]
pub struct Context {
    pub(crate) kind: ContextKind,
}

#[derive(Clone, Debug)]
pub(crate) enum ContextKind {
    Cpu,
    Ascend(Arc<Device>),
}

impl Context {
    /// The CPU backend. Always works.
    pub fn cpu() -> Self {
        Context { kind: ContextKind::Cpu }
    }

    /// Ascend device `device`, from CANN found by the default search (`$ASCEND_TOOLKIT_HOME`,
    /// `$ASCEND_HOME_PATH`, `/usr/local/Ascend/...`, the system path). Initialises ACL once per
    /// process (`aclInit`), checks `aclrtGetDeviceCount` and binds the device (`aclrtSetDevice`).
    /// Without CANN or the device this returns an error; it never panics.
    pub fn ascend(device: i32) -> Result<Self> {
        let cann = ascend_sys::load()?;
        Ok(Context { kind: ContextKind::Ascend(Device::open(cann, device)?) })
    }

    /// Like [`Context::ascend`], looking in `toolkit_dir` (a CANN root holding `lib64/`, or the
    /// library directory itself) before the default search.
    pub fn ascend_from(toolkit_dir: &Path, device: i32) -> Result<Self> {
        let cann = ascend_sys::load_from(toolkit_dir)?;
        Ok(Context { kind: ContextKind::Ascend(Device::open(cann, device)?) })
    }

    /// Ascend device 0 when CANN loads and the device answers, else the CPU. The environment
    /// variable `ASCEND_BACKEND=cpu|ascend` forces the choice (with `ascend`, failure is an error).
    pub fn auto() -> Result<Self> {
        match std::env::var(BACKEND_ENV) {
            Ok(v) if v.eq_ignore_ascii_case("cpu") => Ok(Context::cpu()),
            Ok(v) if v.eq_ignore_ascii_case("ascend") => Context::ascend(0),
            Ok(v) if !v.is_empty() => Err(Error::Config(format!("{BACKEND_ENV} must be `cpu` or `ascend`, got `{v}`"))),
            _ => Ok(Context::ascend(0).unwrap_or_else(|_| Context::cpu())),
        }
    }

    /// The backend this context runs on.
    pub fn backend(&self) -> Backend {
        match self.kind {
            ContextKind::Cpu => Backend::Cpu,
            ContextKind::Ascend(_) => Backend::Ascend,
        }
    }

    /// The Ascend device id, or `None` on the CPU backend.
    pub fn device_id(&self) -> Option<i32> {
        match &self.kind {
            ContextKind::Cpu => None,
            ContextKind::Ascend(d) => Some(d.id),
        }
    }

    /// The device memory this context (and its clones) holds: see [`MemoryStats`]. Contexts made
    /// by separate `Context::ascend` calls count separately.
    pub fn memory_stats(&self) -> MemoryStats {
        match &self.kind {
            ContextKind::Cpu => MemoryStats::default(),
            ContextKind::Ascend(d) => {
                use std::sync::atomic::Ordering::Relaxed;
                let allocated = d.memory.allocated.load(Relaxed);
                MemoryStats {
                    allocated,
                    reserved: allocated,
                    peak_allocated: d.memory.peak_allocated.load(Relaxed),
                    device_allocations: d.memory.device_allocations.load(Relaxed),
                }
            }
        }
    }

    /// Returns cached device memory to the runtime. Nothing is cached yet (memory is freed when
    /// its last user drops), so this only checks the context; a no-op on the CPU backend.
    pub fn empty_cache(&self) -> Result<()> {
        match &self.kind {
            ContextKind::Cpu => Ok(()),
            ContextKind::Ascend(d) => d.bind(),
        }
    }

    /// A new stream: an `aclrtStream` on Ascend (`aclrtCreateStream`); on the CPU, work runs on
    /// the calling thread when it is submitted.
    pub fn new_stream(&self) -> Result<Stream> {
        match &self.kind {
            ContextKind::Cpu => Ok(Stream::new(self.clone(), None)),
            ContextKind::Ascend(d) => Ok(Stream::new(self.clone(), Some(StreamInner::new(d.clone())?))),
        }
    }
}
