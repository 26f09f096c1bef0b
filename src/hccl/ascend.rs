//! The Ascend engine: an `HcclComm` per rank, collectives enqueued on the stream through the
//! shared launch path (every buffer recorded on the stream with the enqueue).

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use ascend_sys::{Hccl, HcclComm, HcclDataType, HcclReduceOp, HcclResult, HcclRootInfo};

use super::{hccl_error, ReduceOp, ROOT_INFO_BYTES};
use crate::device::{enqueue_using, leaked, report_drop_error, Device, DeviceBuffer, Leak, StreamInner};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::tensor::Tensor;

/// Turns an `HcclResult` into a `Result`, with `HcclGetErrorString`'s text when the library has it.
fn check(hccl: &Hccl, call: &'static str, r: HcclResult) -> Result<()> {
    if r == HcclResult::HCCL_SUCCESS {
        return Ok(());
    }
    let text = hccl.HcclGetErrorString.as_ref().ok().and_then(|f| {
        // SAFETY: HcclGetErrorString takes a code and returns null or a static NUL-terminated
        // string (docs/cann/HCCL.md 4.7); it is copied out at once.
        let p = unsafe { f(r) };
        // SAFETY: as above, non-null means a valid C string.
        (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned())
    });
    Err(hccl_error(call, r.0, text.unwrap_or_default()))
}

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
pub(super) fn new_root(device: &Device) -> Result<Box<[u8; ROOT_INFO_BYTES]>> {
    let hccl = hccl_of(device)?;
    let get = crate::acl::op_fn(&hccl.HcclGetRootInfo, "HcclGetRootInfo")?;
    device.bind()?;
    let mut root = HcclRootInfo { internal: [0; ROOT_INFO_BYTES] };
    // SAFETY: `root` is a writable HcclRootInfo (4108 bytes, checked by the ABI tests).
    check(hccl, "HcclGetRootInfo", unsafe { get(&mut root) })?;
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
    let init = crate::acl::op_fn(&hccl.HcclCommInitAll, "HcclCommInitAll")?;
    let mut ids: Vec<i32> = devices.iter().map(|d| d.id).collect();
    let mut raw: Vec<HcclComm> = vec![std::ptr::null_mut(); devices.len()];
    first.bind()?;
    // SAFETY: `ids` holds `n` device ids and `raw` room for `n` handles (docs/cann/HCCL.md 4.5.2).
    check(hccl, "HcclCommInitAll", unsafe { init(ids.len() as u32, ids.as_mut_ptr(), raw.as_mut_ptr()) })?;
    Ok(raw.into_iter().zip(devices).map(|(raw, d)| Comm::new(raw, d.clone(), hccl)).collect())
}

/// `HcclCommInitRootInfo` on `device`: blocks until every rank has joined.
pub(super) fn init_rank(device: &Arc<Device>, n: u32, root: &[u8; ROOT_INFO_BYTES], rank: u32) -> Result<Comm> {
    let hccl = hccl_of(device)?;
    let init = crate::acl::op_fn(&hccl.HcclCommInitRootInfo, "HcclCommInitRootInfo")?;
    let root = HcclRootInfo { internal: root.map(|b| b as std::ffi::c_char) };
    let mut raw: HcclComm = std::ptr::null_mut();
    device.bind()?;
    // SAFETY: `root` is a valid HcclRootInfo and `raw` a writable handle.
    check(hccl, "HcclCommInitRootInfo", unsafe { init(n, &root, rank, &mut raw) })?;
    Ok(Comm::new(raw, device.clone(), hccl))
}

/// `HcclCommInitClusterInfo(path, rank)` on `device`: blocks until every rank has joined.
pub(super) fn init_cluster(device: &Arc<Device>, path: &std::ffi::CStr, rank: u32) -> Result<Comm> {
    let hccl = hccl_of(device)?;
    let init = crate::acl::op_fn(&hccl.HcclCommInitClusterInfo, "HcclCommInitClusterInfo")?;
    let mut raw: HcclComm = std::ptr::null_mut();
    device.bind()?;
    // SAFETY: `path` is a NUL-terminated string shorter than HCCL's limit and `raw` a writable handle.
    check(hccl, "HcclCommInitClusterInfo", unsafe { init(path.as_ptr(), rank, &mut raw) })?;
    Ok(Comm::new(raw, device.clone(), hccl))
}

/// A caller's `HcclComm` on `device`, with its rank and size (`HcclGetRankId`, `HcclGetRankSize`).
///
/// # Safety
/// `raw` is a live communicator of `device` that outlives the returned `Comm`.
pub(super) unsafe fn borrow(device: &Arc<Device>, raw: HcclComm) -> Result<(Comm, u32, u32)> {
    let hccl = hccl_of(device)?;
    let get_rank = crate::acl::op_fn(&hccl.HcclGetRankId, "HcclGetRankId")?;
    let get_size = crate::acl::op_fn(&hccl.HcclGetRankSize, "HcclGetRankSize")?;
    device.bind()?;
    let (mut rank, mut size) = (0u32, 0u32);
    // SAFETY: the caller guarantees `raw` is live; the out-pointers are writable.
    check(hccl, "HcclGetRankId", unsafe { get_rank(raw, &mut rank) })?;
    // SAFETY: as above.
    check(hccl, "HcclGetRankSize", unsafe { get_size(raw, &mut size) })?;
    if size == 0 || rank >= size {
        return Err(Error::invalid("comm", format!("HCCL reports rank {rank} of {size} ranks")));
    }
    let mut comm = Comm::new(raw, device.clone(), hccl);
    comm.borrowed = true;
    Ok((comm, rank, size))
}

/// One rank's `HcclComm`, destroyed after the streams its collectives ran on have finished.
pub(super) struct Comm {
    raw: HcclComm,
    device: Arc<Device>,
    hccl: &'static Hccl,
    /// Streams collectives were enqueued on (synchronised before `HcclCommDestroy`).
    streams: Mutex<Vec<Arc<StreamInner>>>,
    /// The caller's communicator ([`borrow`]): synchronised on drop, never destroyed.
    borrowed: bool,
}

// SAFETY: an HcclComm is a handle HCCL lets any thread use once that thread has bound the comm's
// device, which every use here does first; `Communicator` (not `Sync`) keeps one thread at a
// time on it, as HCCL requires.
unsafe impl Send for Comm {}

impl Comm {
    fn new(raw: HcclComm, device: Arc<Device>, hccl: &'static Hccl) -> Comm {
        Comm { raw, device, hccl, streams: Mutex::new(Vec::new()), borrowed: false }
    }

    /// The raw handle, valid while `self` lives (or, borrowed, while its owner keeps it).
    pub(super) fn raw(&self) -> HcclComm {
        self.raw
    }

    /// `HcclGetCommAsyncError`: `None`, or the error HCCL found on the communicator (with the
    /// text of `aclGetRecentErrMsg`).
    pub(super) fn async_error(&self) -> Result<Option<Error>> {
        let f = self.hccl.HcclGetCommAsyncError.as_ref().map_err(|e| {
            Error::Config(format!(
                "HcclGetCommAsyncError is not exported by this HCCL (HCCL before 2023 and Ascend 950 lack it): {e}"
            ))
        })?;
        self.device.bind()?;
        let mut code = HcclResult::HCCL_SUCCESS;
        // SAFETY: the comm is live and `code` a writable HcclResult.
        check(self.hccl, "HcclGetCommAsyncError", unsafe { f(self.raw, &mut code) })?;
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

    /// Enqueues one collective on `stream` over `buffers`, recording the stream for drop.
    fn enqueue(
        &self,
        stream: &Stream,
        buffers: &[&DeviceBuffer],
        call: &'static str,
        launch: impl FnOnce(*mut c_void) -> HcclResult,
    ) -> Result<()> {
        let Some((inner, _)) = stream.ascend() else {
            return Err(stream.mismatch("stream", "collectives on Ascend need an Ascend stream"));
        };
        {
            let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
            if !streams.iter().any(|s| Arc::ptr_eq(s, inner)) {
                streams.push(inner.clone());
            }
        }
        enqueue_using(inner, buffers, || {
            self.device.bind()?;
            check(self.hccl, call, launch(inner.raw()))
        })
    }

    pub(super) fn all_reduce(&self, stream: &Stream, t: &mut Tensor, op: ReduceOp) -> Result<()> {
        let (buffer, ptr) = flat(t)?;
        let count = t.numel() as u64;
        if count == 0 {
            return Ok(()); // HCCL returns at once for count 0
        }
        let f = crate::acl::op_fn(&self.hccl.HcclAllReduce, "HcclAllReduce")?;
        let (dt, op, comm) = (data_type(t.dtype()), reduce_op(op), self.raw);
        self.enqueue(stream, &[buffer], "HcclAllReduce", |s| {
            // SAFETY: in place (send = recv, which HCCL supports): `ptr` addresses the tensor's
            // `count` contiguous elements of `dt` inside a live device buffer, recorded on this
            // stream by `enqueue_using` so it outlives the collective; the comm is live.
            unsafe { f(ptr, ptr, count, dt, op, comm, s) }
        })
    }

    pub(super) fn all_gather(&self, stream: &Stream, input: &Tensor, output: &mut Tensor) -> Result<()> {
        let (in_buf, src) = flat(input)?;
        let (out_buf, dst) = flat(output)?;
        let count = input.numel() as u64;
        if count == 0 {
            return Ok(());
        }
        let f = crate::acl::op_fn(&self.hccl.HcclAllGather, "HcclAllGather")?;
        let (dt, comm) = (data_type(input.dtype()), self.raw);
        self.enqueue(stream, &[in_buf, out_buf], "HcclAllGather", |s| {
            // SAFETY: `src` holds `count` elements and `dst` size × count (checked by the caller),
            // both contiguous in live buffers recorded on this stream; the comm is live.
            unsafe { f(src, dst, count, dt, comm, s) }
        })
    }

    pub(super) fn broadcast(&self, stream: &Stream, t: &mut Tensor, root: u32) -> Result<()> {
        let (buffer, ptr) = flat(t)?;
        let count = t.numel() as u64;
        if count == 0 {
            return Ok(());
        }
        let f = crate::acl::op_fn(&self.hccl.HcclBroadcast, "HcclBroadcast")?;
        let (dt, comm) = (data_type(t.dtype()), self.raw);
        self.enqueue(stream, &[buffer], "HcclBroadcast", |s| {
            // SAFETY: as in all_reduce; `root` < size (checked by the caller).
            unsafe { f(ptr, count, dt, root, comm, s) }
        })
    }
}

/// The device buffer of a contiguous tensor and the address of its first element.
fn flat(t: &Tensor) -> Result<(&DeviceBuffer, *mut c_void)> {
    let Some((buffer, _)) = t.device_buffer() else {
        return Err(Error::invalid("tensor", "a host tensor reached the Ascend backend"));
    };
    let ptr = buffer.ptr().cast::<u8>().wrapping_add(t.offset() * t.dtype().size_in_bytes()).cast();
    Ok((buffer, ptr))
}

impl Drop for Comm {
    fn drop(&mut self) {
        let streams = std::mem::take(self.streams.get_mut().unwrap_or_else(|p| p.into_inner()));
        for s in &streams {
            if let Err(e) = s.synchronize() {
                // Queued collectives may still use the comm: leaking it is the only sound choice.
                report_drop_error("aclrtSynchronizeStream (before HcclCommDestroy)", &e);
                leaked(Leak::Communicator);
                return;
            }
        }
        if self.borrowed {
            return; // the caller's communicator: its collectives have run, the caller destroys it
        }
        let result = self.device.bind().and_then(|()| {
            let f = crate::acl::op_fn(&self.hccl.HcclCommDestroy, "HcclCommDestroy")?;
            // SAFETY: the comm is live, its streams have finished, and it is never used again.
            check(self.hccl, "HcclCommDestroy", unsafe { f(self.raw) })
        });
        if let Err(e) = result {
            report_drop_error("HcclCommDestroy", &e);
            leaked(Leak::Communicator);
        }
    }
}
