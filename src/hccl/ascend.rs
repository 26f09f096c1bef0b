//! The Ascend engine: an `HcclComm` per rank, collectives enqueued on the stream through the
//! shared launch path (every buffer recorded on the stream with the enqueue).
//!
//! HCCL requires one communicator's collectives to run serially (docs/cann/HCCL.md 4.4). A comm
//! remembers the stream of its last collective; a collective on another stream is first ordered
//! after it on the device (an event of the device's pool recorded on the old stream, waited for
//! by the new one), and the old stream is then forgotten, so a comm holds one stream at a time.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ascend_sys::{aclrtStream, Hccl, HcclComm, HcclDataType, HcclReduceOp, HcclResult, HcclRootInfo};

use crate::acl::hccl as calls;

use super::{hccl_error, ReduceOp, HCCL_ROOT_BYTES};
use crate::device::{enqueue_using, leaked, report_drop_error, Device, DeviceBuffer, Leak, StreamInner};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::tensor::Tensor;

fn hccl_of(device: &Device) -> Result<&'static Hccl> {
    Ok(device.cann.hccl()?)
}

fn data_type(dtype: DType) -> HcclDataType {
    match dtype {
        DType::F32 => HcclDataType::HCCL_DATA_TYPE_FP32,
        DType::F16 => HcclDataType::HCCL_DATA_TYPE_FP16,
        DType::BF16 => HcclDataType::HCCL_DATA_TYPE_BFP16,
        DType::I32 => HcclDataType::HCCL_DATA_TYPE_INT32,
    }
}

fn reduce_op(op: ReduceOp) -> HcclReduceOp {
    match op {
        ReduceOp::Sum => HcclReduceOp::HCCL_REDUCE_SUM,
        ReduceOp::Prod => HcclReduceOp::HCCL_REDUCE_PROD,
        ReduceOp::Max => HcclReduceOp::HCCL_REDUCE_MAX,
        ReduceOp::Min => HcclReduceOp::HCCL_REDUCE_MIN,
    }
}

/// `HcclGetRootInfo` on `device` (bound first).
pub(super) fn new_root(device: &Device) -> Result<Box<[u8; HCCL_ROOT_BYTES]>> {
    let hccl = hccl_of(device)?;
    device.bind()?;
    let root = calls::get_root_info(hccl)?;
    // `c_char` is i8 on x86-64 and u8 on aarch64: the cast reinterprets the byte either way.
    #[allow(clippy::unnecessary_cast)]
    Ok(Box::new(root.internal.map(|c| c as u8)))
}

/// One `HcclComm` per device (`HcclCommInitAll`).
pub(super) fn init_all(devices: &[Arc<Device>]) -> Result<Vec<Comm>> {
    let first = &devices[0];
    for (i, d) in devices.iter().enumerate() {
        if !std::ptr::eq(d.cann, first.cann) {
            return Err(Error::invalid("contexts", "every context must come from the same CANN toolkit"));
        }
        if devices[..i].iter().any(|e| e.id == d.id) {
            return Err(Error::invalid("contexts", format!("device {} appears twice: one rank per device", d.id)));
        }
    }
    let hccl = hccl_of(first)?;
    // bounded: one id per device of `devices`, a slice already in memory.
    #[allow(clippy::disallowed_methods)]
    let mut ids: Vec<i32> = devices.iter().map(|d| d.id).collect();
    first.bind()?;
    let raw = calls::comm_init_all(hccl, &mut ids)?;
    // bounded: one communicator per handle of `raw`, a vector already in memory.
    #[allow(clippy::disallowed_methods)]
    let comms = raw.into_iter().zip(devices).map(|(raw, d)| Comm::new(raw, d.clone(), hccl)).collect();
    Ok(comms)
}

/// `HcclCommInitRootInfo` on `device`: blocks until every rank has joined.
pub(super) fn init_rank(device: &Arc<Device>, n: u32, root: &[u8; HCCL_ROOT_BYTES], rank: u32) -> Result<Comm> {
    let hccl = hccl_of(device)?;
    // Its contents came from `HcclGetRootInfo` through `RootInfo::as_bytes` (the caller checked
    // the envelope's magic, kind and checksum, so a CPU root or stray bytes never get here).
    let root = HcclRootInfo { internal: root.map(|b| b as std::ffi::c_char) };
    device.bind()?;
    let raw = calls::comm_init_root_info(hccl, n, &root, rank)?;
    Ok(Comm::new(raw, device.clone(), hccl))
}

/// `HcclCommInitClusterInfo(path, rank)` on `device`: blocks until every rank has joined.
pub(super) fn init_cluster(device: &Arc<Device>, path: &std::ffi::CStr, rank: u32) -> Result<Comm> {
    let hccl = hccl_of(device)?;
    device.bind()?;
    let raw = calls::comm_init_cluster_info(hccl, path, rank)?;
    Ok(Comm::new(raw, device.clone(), hccl))
}

/// A caller's `HcclComm` on `device`, with its rank and size (`HcclGetRankId`, `HcclGetRankSize`).
///
/// # Safety
/// `raw` is a live communicator of `device` that outlives the returned `Comm`.
pub(super) unsafe fn borrow(device: &Arc<Device>, raw: HcclComm) -> Result<(Comm, u32, u32)> {
    let hccl = hccl_of(device)?;
    device.bind()?;
    // SAFETY: the caller guarantees `raw` is live.
    let (rank, size) = unsafe { calls::rank_and_size(hccl, raw) }?;
    if size == 0 || rank >= size {
        return Err(Error::invalid("comm", format!("HCCL reports rank {rank} of {size} ranks")));
    }
    let comm = Comm::with(raw, device.clone(), hccl, true);
    Ok((comm, rank, size))
}

/// One rank's `HcclComm`, destroyed after the stream of its last collective has finished.
pub(super) struct Comm {
    raw: HcclComm,
    device: Arc<Device>,
    hccl: &'static Hccl,
    /// Shared with the captured graphs whose replays run its collectives (each replay is ordered
    /// as a collective on the replay stream).
    order: Arc<Mutex<Order>>,
    /// Destroys the handle when the last holder goes: this comm, or a captured graph using it.
    handle: Arc<Handle>,
}

/// What destroys an `HcclComm` (`HcclCommDestroy`) once neither its `Comm` nor a captured graph
/// whose collectives use it holds it.
struct Handle {
    raw: HcclComm,
    device: Arc<Device>,
    hccl: &'static Hccl,
    /// The caller's communicator ([`borrow`]): never destroyed.
    borrowed: bool,
    /// Set when queued collectives may still use it (a wait failed): never destroyed.
    leak: AtomicBool,
}

// SAFETY: the handle is only destroyed, once, by whichever thread drops the last holder (after
// binding the device).
unsafe impl Send for Handle {}
// SAFETY: `&Handle` exposes nothing but the flag.
unsafe impl Sync for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        if self.borrowed {
            return; // the caller's communicator: its collectives have run, the caller destroys it
        }
        if self.leak.load(Ordering::Acquire) {
            leaked(Leak::Communicator);
            return;
        }
        let result = self.device.bind().and_then(|()| {
            // SAFETY: the comm is live, its collectives (eager ones and every graph's replays)
            // have finished, and it is never used again.
            unsafe { calls::comm_destroy(self.hccl, self.raw) }
        });
        if let Err(e) = result {
            report_drop_error("HcclCommDestroy", &e);
            leaked(Leak::Communicator);
        }
    }
}

/// How a comm keeps its collectives serial across streams.
#[derive(Default)]
struct Order {
    /// The stream of the last collective (synchronised before `HcclCommDestroy`). Every earlier
    /// collective is ordered before the work on it by the chain of event waits queued at stream
    /// switches (events of the device's pool, held by the waiting streams until the waits ran).
    last: Option<Arc<StreamInner>>,
}

// SAFETY: an HcclComm is a handle HCCL lets any thread use once that thread has bound the comm's
// device, which every use here does first; `Communicator` (not `Sync`) keeps one thread at a
// time on it, as HCCL requires.
unsafe impl Send for Comm {}

impl Comm {
    fn new(raw: HcclComm, device: Arc<Device>, hccl: &'static Hccl) -> Comm {
        Comm::with(raw, device, hccl, false)
    }

    fn with(raw: HcclComm, device: Arc<Device>, hccl: &'static Hccl, borrowed: bool) -> Comm {
        let handle = Arc::new(Handle { raw, device: device.clone(), hccl, borrowed, leak: AtomicBool::new(false) });
        Comm { raw, device, hccl, order: Arc::new(Mutex::new(Order::default())), handle }
    }

    /// The raw handle, valid while `self` lives (or, borrowed, while its owner keeps it).
    pub(super) fn raw(&self) -> HcclComm {
        self.raw
    }

    /// `HcclGetCommAsyncError`: `None`, or the error HCCL found on the communicator (with the
    /// text of `aclGetRecentErrMsg`).
    pub(super) fn async_error(&self) -> Result<Option<Error>> {
        self.device.bind()?;
        // SAFETY: the comm is live while `self` is.
        let code = unsafe { calls::comm_async_error(self.hccl, self.raw) }?;
        if code == HcclResult::HCCL_SUCCESS {
            return Ok(None);
        }
        let message = crate::acl::recent_error(self.device.cann).unwrap_or_default();
        Ok(Some(hccl_error("HcclGetCommAsyncError", code.0, message)))
    }

    pub(super) fn device(&self) -> &Device {
        &self.device
    }

    pub(super) fn device_id(&self) -> i32 {
        self.device.id
    }

    /// Orders `next` after the comm's last collective (if that ran on another stream) and makes
    /// it the comm's stream. On an error nothing is enqueued and the comm keeps its stream.
    fn switch_to(order: &mut Order, next: &Arc<StreamInner>) -> Result<()> {
        let Some(last) = order.last.clone() else {
            order.last = Some(next.clone());
            return Ok(());
        };
        if Arc::ptr_eq(&last, next) {
            return Ok(());
        }
        // An event of the pool recorded on `last`, waited for by `next` (nothing when `last` is a
        // released borrowed stream: its work has run).
        if let Err(event_error) = next.order_after(&last) {
            // Without an event, a host synchronise of the old stream orders the two as well.
            last.synchronize().map_err(|_| event_error)?;
        }
        order.last = Some(next.clone());
        Ok(())
    }

    /// Enqueues one collective on `stream` over `buffers`, after the comm's earlier collectives.
    fn enqueue(
        &self,
        stream: &Stream,
        buffers: &[&DeviceBuffer],
        launch: impl FnOnce(aclrtStream) -> Result<()>,
    ) -> Result<()> {
        let Some((inner, _)) = stream.ascend() else {
            return Err(stream.mismatch("stream", "collectives on Ascend need an Ascend stream"));
        };
        // (No lock, here or below: the caller's stream, whose captures only this thread begins or ends.)
        if inner.capturing() && self.handle.borrowed {
            // Its owner may destroy it once the Communicator is gone, while a graph would replay it.
            return Err(Error::invalid(
                "comm",
                "a borrowed communicator's collectives cannot be captured (a graph may outlive it)",
            ));
        }
        let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        Self::switch_to(&mut order, inner)?;
        if let Some(keep) = inner.capture_keep() {
            // A captured collective: the graph keeps the comm, and orders each replay as a
            // collective of it on the replay stream.
            let comm_order = self.order.clone();
            let hook = move |next: &Arc<StreamInner>| {
                Self::switch_to(&mut comm_order.lock().unwrap_or_else(|p| p.into_inner()), next)
            };
            keep.before_replay(Box::new(hook));
            let _ = keep.hold(self.handle.clone());
        }
        enqueue_using(inner, buffers.iter().copied(), |_| {
            self.device.bind()?;
            launch(inner.raw())
        })
    }

    pub(super) fn all_reduce(&self, stream: &Stream, t: &mut Tensor, op: ReduceOp) -> Result<()> {
        let (buffer, ptr) = flat(t)?;
        let count = t.numel() as u64;
        if count == 0 {
            return Ok(()); // HCCL returns at once for count 0
        }
        let (dt, op, comm) = (data_type(t.dtype()), reduce_op(op), self.raw);
        self.enqueue(stream, &[buffer], |s| {
            // SAFETY: `ptr` addresses the tensor's `count` contiguous elements of `dt` inside a
            // live device buffer, recorded on this stream by `enqueue_using` so it outlives the
            // collective; the comm is live and the device bound.
            unsafe { calls::all_reduce(self.hccl, ptr, count, dt, op, comm, s) }
        })
    }

    pub(super) fn all_gather(&self, stream: &Stream, input: &Tensor, output: &mut Tensor) -> Result<()> {
        let (in_buf, src) = flat(input)?;
        let (out_buf, dst) = flat(output)?;
        let count = input.numel() as u64;
        if count == 0 {
            return Ok(());
        }
        let (dt, comm) = (data_type(input.dtype()), self.raw);
        self.enqueue(stream, &[in_buf, out_buf], |s| {
            // SAFETY: `src` holds `count` elements and `dst` size × count (checked by the caller),
            // both contiguous in live buffers recorded on this stream; the comm is live.
            unsafe { calls::all_gather(self.hccl, src, dst, count, dt, comm, s) }
        })
    }

    pub(super) fn broadcast(&self, stream: &Stream, t: &mut Tensor, root: u32) -> Result<()> {
        let (buffer, ptr) = flat(t)?;
        let count = t.numel() as u64;
        if count == 0 {
            return Ok(());
        }
        let (dt, comm) = (data_type(t.dtype()), self.raw);
        self.enqueue(stream, &[buffer], |s| {
            // SAFETY: as in all_reduce; `root` < size (checked by the caller).
            unsafe { calls::broadcast(self.hccl, ptr, count, dt, root, comm, s) }
        })
    }
}

/// The device buffer of a contiguous tensor and the address of its first element.
fn flat(t: &Tensor) -> Result<(&DeviceBuffer, *mut c_void)> {
    let Some((buffer, _)) = t.device_buffer() else {
        return Err(Error::internal("tensor: a host tensor reached the Ascend backend"));
    };
    let ptr = buffer.ptr().cast::<u8>().wrapping_add(t.offset() * t.dtype().size_in_bytes()).cast();
    Ok((buffer, ptr))
}

impl Drop for Comm {
    fn drop(&mut self) {
        let last = std::mem::take(&mut *self.order.lock().unwrap_or_else(|p| p.into_inner())).last;
        if let Some(last) = &last {
            if let Err(e) = last.synchronize() {
                // Queued collectives may still use the comm: leaking it is the only sound choice.
                report_drop_error("aclrtSynchronizeStream (before HcclCommDestroy)", &e);
                self.handle.leak.store(true, Ordering::Release);
            }
        }
        // (`handle` destroys the comm now, or when the last captured graph using it goes.)
    }
}
