//! [`Context`]: which backend runs the work, and on which device.

use std::path::Path;
use std::sync::Arc;

use crate::cpu::memory::HostMemory;
use crate::device::{report, Device};
use crate::error::{Error, Result};

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
/// Device memory comes from a stream-ordered caching allocator (see the README, "Memory model"):
/// a dropped tensor's block stays reserved in the cache for later allocations, and goes back to
/// the device (`aclrtFree`) only at [`Context::empty_cache`], when an allocation fails (the cache
/// is emptied and the allocation retried once) or when the context's last clone, stream and
/// tensor are gone. `allocated` counts the bytes asked for, `reserved` the blocks (requests are
/// rounded up to multiples of 512 bytes, and above 1 MiB to one of four sizes per power of two),
/// so `reserved - allocated` is the cache plus rounding. With the environment variable
/// `ASCEND_NO_MEMORY_CACHING=1` (read when the context is made) nothing is cached or rounded: a
/// dropped tensor's memory is freed once the work that used it has completed, and `reserved`
/// exceeds `allocated` only by memory waiting for that. On the CPU backend the fields count the
/// host memory of its tensors, cached the same way (at most 1 GiB of idle blocks kept), and
/// `device_allocations` counts the blocks asked of the system (the environment variable does not
/// apply there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Bytes of device memory held by live tensors, workspaces and buffers now (as asked for).
    pub allocated: usize,
    /// Bytes of device memory this context holds from the runtime now (allocated plus cached,
    /// or waiting to be freed).
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
    /// Host memory for this context's host tensors (CPU backend: cached) and host copies
    /// (Ascend: not cached).
    pub(crate) host: Arc<HostMemory>,
}

#[derive(Clone, Debug)]
pub(crate) enum ContextKind {
    Cpu,
    Ascend(Arc<Device>),
}

/// The error behind the latest fallback of [`Context::auto`] (see [`Context::auto_reason`]).
static AUTO_REASON: std::sync::Mutex<Option<Error>> = std::sync::Mutex::new(None);

/// Warns on standard error when `Context::auto` falls back although a toolkit variable names a
/// CANN install: the user asked for Ascend and would otherwise silently get the CPU.
fn warn_if_toolkit_named(err: &Error) {
    for var in ["ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"] {
        if let Some(dir) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            report(format_args!(
                "Context::auto falls back to the CPU although {var}={} is set: {err} \
                 (set {BACKEND_ENV}=ascend to make this an error, or {BACKEND_ENV}=cpu to silence it)",
                Path::new(&dir).display()
            ));
            return;
        }
    }
}

impl Context {
    /// The CPU backend. Always works.
    pub fn cpu() -> Self {
        Context { kind: ContextKind::Cpu, host: Arc::default() }
    }

    /// Ascend device `device`, from CANN found by the default search (`$ASCEND_TOOLKIT_HOME`,
    /// `$ASCEND_HOME_PATH`, `/usr/local/Ascend/...`, the system path). Initialises ACL once per
    /// process (`aclInit`), checks `aclrtGetDeviceCount` and binds the device (`aclrtSetDevice`).
    /// Without CANN or the device this returns an error; it never panics.
    pub fn ascend(device: i32) -> Result<Self> {
        let cann = ascend_sys::load()?;
        Ok(Context { kind: ContextKind::Ascend(Device::open(cann, device)?), host: Arc::new(HostMemory::uncached()) })
    }

    /// Like [`Context::ascend`], looking in `toolkit_dir` (a CANN root holding `lib64/`, or the
    /// library directory itself) before the default search.
    pub fn ascend_from(toolkit_dir: &Path, device: i32) -> Result<Self> {
        let cann = ascend_sys::load_from(toolkit_dir)?;
        Ok(Context { kind: ContextKind::Ascend(Device::open(cann, device)?), host: Arc::new(HostMemory::uncached()) })
    }

    /// Ascend device 0 when CANN loads and the device answers, else the CPU. The environment
    /// variable `ASCEND_BACKEND=cpu|ascend` forces the choice (with `ascend`, failure is an error).
    pub fn auto() -> Result<Self> {
        match std::env::var(BACKEND_ENV) {
            Ok(v) if v.eq_ignore_ascii_case("cpu") => Ok(Context::cpu()),
            Ok(v) if v.eq_ignore_ascii_case("ascend") => Context::ascend(0),
            Ok(v) if !v.is_empty() => Err(Error::Config(format!("{BACKEND_ENV} must be `cpu` or `ascend`, got `{v}`"))),
            _ => {
                let chosen = Context::ascend(0);
                let mut reason = AUTO_REASON.lock().unwrap_or_else(|e| e.into_inner());
                Ok(match chosen {
                    Ok(ctx) => {
                        *reason = None;
                        ctx
                    }
                    Err(e) => {
                        warn_if_toolkit_named(&e);
                        *reason = Some(e);
                        Context::cpu()
                    }
                })
            }
        }
    }

    /// Why the latest [`Context::auto`] of this process fell back to the CPU: the error
    /// [`Context::ascend`]`(0)` returned (e.g. `Error::Load` listing every path tried). `None`
    /// when the latest unforced call chose Ascend, or before any; calls with `ASCEND_BACKEND`
    /// set do not change it.
    ///
    /// When `ASCEND_TOOLKIT_HOME` or `ASCEND_HOME_PATH` is set, a fallback also prints an
    /// `ascend: ...` warning on standard error: a toolkit was named and is unusable. For no
    /// fallback at all, set `ASCEND_BACKEND=ascend` (then `auto` returns the error).
    pub fn auto_reason() -> Option<Error> {
        AUTO_REASON.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The backend this context runs on.
    pub fn backend(&self) -> Backend {
        match self.kind {
            ContextKind::Cpu => Backend::Cpu,
            ContextKind::Ascend(_) => Backend::Ascend,
        }
    }

    /// The Ascend device id (the id given to `aclrtSetDevice`, to hand to other libraries that
    /// bind the same device), or `None` on the CPU backend.
    pub fn device_id(&self) -> Option<i32> {
        match &self.kind {
            ContextKind::Cpu => None,
            ContextKind::Ascend(d) => Some(d.id),
        }
    }

    /// Turns deterministic execution on or off for the work of this context: on Ascend,
    /// `aclrtCtxSetSysParamOpt(ACL_OPT_DETERMINISTIC, 1 or 0)` on the device's default context
    /// (bound first), which every stream of the device uses. Of the operators this crate runs, it
    /// changes only `aclnnBatchNormElemt`, which is non-deterministic by default on Atlas A2/A3 and
    /// Atlas training (910) and deterministic on Ascend 950; `aclnnBatchNormStats`,
    /// `aclnnBatchNormGatherStatsWithCounts`, `aclnnBatchNormElemtBackward` and
    /// `aclnnBatchNormReduceBackward` are deterministic by default (docs/cann/SYNCBN.md 3,
    /// ASYNC.md 3). Collectives are not affected: HCCL reads the environment variable
    /// `HCCL_DETERMINISTIC` (`true`/`strict`) when a communicator is made. Deterministic kernels
    /// may be slower. It applies to every call prepared after it: the launch cache prepares a
    /// cached call again (phase 1) at its first launch after the change, while a call prepared
    /// with `prepare_*` before it keeps the setting it was prepared under. On the CPU backend
    /// this is a no-op: it is always deterministic (fixed reduction order, f64 accumulation),
    /// with or without this call.
    pub fn set_deterministic(&self, on: bool) -> Result<()> {
        match &self.kind {
            ContextKind::Cpu => Ok(()),
            ContextKind::Ascend(d) => {
                d.bind()?;
                let opt = ascend_sys::aclSysParamOpt::ACL_OPT_DETERMINISTIC;
                let result = crate::acl::ctx_set_sys_param(d.cann, opt, i64::from(on));
                // Phase 1 reads the option: executors cached by any stream of the device are
                // stale now (even after a failure, whose effect is unknown).
                crate::device::launch_cache::config_changed(d);
                result
            }
        }
    }

    /// The device memory this context (and its clones) holds: see [`MemoryStats`]. Contexts made
    /// by separate `Context::ascend` calls count separately.
    pub fn memory_stats(&self) -> MemoryStats {
        match &self.kind {
            ContextKind::Cpu => {
                let m = self.host.stats();
                MemoryStats {
                    allocated: m.allocated,
                    reserved: m.reserved,
                    peak_allocated: m.peak_allocated,
                    device_allocations: m.system_allocations,
                }
            }
            ContextKind::Ascend(d) => {
                let m = d.memory.stats();
                MemoryStats {
                    allocated: m.allocated,
                    reserved: m.reserved,
                    peak_allocated: m.peak_allocated,
                    device_allocations: m.device_allocations,
                }
            }
        }
    }

    /// Returns the cached device memory of this context to the runtime (`aclrtFree`): blocks
    /// of dropped tensors that the caching allocator keeps for reuse. It waits on the host for
    /// the work that last used them (`aclrtSynchronizeEvent` on their events), so call it
    /// outside a steady loop. Tensors alive now keep their memory. A block whose wait or
    /// `aclrtFree` fails stays cached, and the first such error is returned. On the CPU backend
    /// it returns the cached host memory of dropped tensors to the system.
    pub fn empty_cache(&self) -> Result<()> {
        self.host.empty_cache();
        match &self.kind {
            ContextKind::Cpu => Ok(()),
            ContextKind::Ascend(d) => {
                d.bind()?;
                d.memory.empty_cache(d.cann, &d.events)
            }
        }
    }
}
