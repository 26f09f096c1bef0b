//! The one launch path of every operator on Ascend: descriptor list → phase 1 → workspace →
//! phase 2 → record, written once.
//!
//! An operator describes each tensor argument through [`DeviceCall`], which is the only way to
//! get an `aclTensor` for phase 1: the descriptor keeps the [`DeviceBuffer`] it points into, so the
//! list of descriptors is also the list of memory the call touches, and no argument can be left
//! out of it. [`DevicePrepared::launch`] hands that list (plus the workspace) to
//! [`enqueue_using`], which records the stream on every buffer and enqueues phase 2 as one step,
//! under the buffers' locks. No operator writes its own lifetime code.

use std::ffi::c_void;
use std::sync::Arc;

use ascend_sys::symbols::Operator;
use ascend_sys::{aclOpExecutor, aclTensor, aclnnStatus, aclrtStream, Cann, OpApi};

use crate::device::descriptor::AclTensor;
use crate::device::executor::Executor;
use crate::device::{enqueue_using, Device, DeviceBuffer};
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::tensor::Tensor;

/// Phase 2 of every aclnn operator: `(workspace, workspace bytes, executor, stream)`.
pub(crate) type Phase2 = unsafe extern "C" fn(*mut c_void, u64, *mut aclOpExecutor, aclrtStream) -> aclnnStatus;

/// The device arguments of one operator call, being described for phase 1.
pub(crate) struct DeviceCall<'a> {
    device: Arc<Device>,
    descriptors: Vec<AclTensor<'a>>,
}

impl<'a> DeviceCall<'a> {
    /// Starts a call on the device of `stream` (an Ascend stream).
    pub(crate) fn new(stream: &Stream) -> Result<Self> {
        let Some((_, device)) = stream.ascend() else {
            return Err(stream.mismatch("stream", "the call needs an Ascend stream"));
        };
        Ok(DeviceCall { device: device.clone(), descriptors: Vec::with_capacity(12) })
    }

    /// Describes `t` (argument `name`, for errors) and returns its handle for phase 1. The
    /// handle lives as long as this call (and the prepared call made from it).
    pub(crate) fn tensor(&mut self, t: &'a Tensor, name: &'static str) -> Result<*mut aclTensor> {
        let Some((buffer, device)) = t.device_buffer() else {
            return Err(Error::internal(format!("{name}: a host tensor reached the Ascend backend")));
        };
        if !device.same(&self.device) {
            return Err(Error::invalid(
                name,
                format!("the tensor is on Ascend device {}, the call on device {}", device.id, self.device.id),
            ));
        }
        let d = AclTensor::new(buffer, t.dtype(), t.shape(), t.strides(), t.offset(), t.storage_len())?;
        let raw = d.raw();
        self.descriptors.push(d);
        Ok(raw)
    }

    /// [`tensor`](Self::tensor) for an optional argument: null when absent.
    pub(crate) fn optional(&mut self, t: Option<&'a Tensor>, name: &'static str) -> Result<*mut aclTensor> {
        t.map_or(Ok(std::ptr::null_mut()), |t| self.tensor(t, name))
    }

    /// Phase 1 of operator `op`, resolved in the toolkit on first use (a toolkit lacking it is
    /// [`Error::Load`] naming it): `phase1` calls its `GetWorkspaceSize` with the handles
    /// described so far (see [`crate::acl::phase1`]); `phase2` picks its launch function.
    /// `zero_after_launch` lists outputs that phase 2 leaves unwritten (CANN's kernels skip empty
    /// inputs) and that the launch fills with zeros.
    pub(crate) fn prepare(
        self,
        op: &'static Operator,
        phase1: impl FnOnce(&'static Cann, &'static OpApi) -> Result<(u64, *mut aclOpExecutor)>,
        phase2: fn(&OpApi) -> &std::result::Result<Phase2, libloading::Error>,
        zero_after_launch: Vec<&'a Tensor>,
    ) -> Result<DevicePrepared<'a>> {
        let api = self.device.cann.operator(op)?;
        let launch = crate::acl::op_fn(phase2(api), op.name)?;
        self.device.bind()?;
        let (workspace_size, raw) = phase1(self.device.cann, api)?;
        let executor = Executor::new(self.device.clone(), raw);
        Ok(DevicePrepared { executor: Some(executor), call: self, workspace_size, op, launch, zero_after_launch })
    }
}

/// Phase 1 done on Ascend: the executor and the descriptors (each with its buffer), borrowing
/// every tensor of the call. Field order matters: the executor (which references the
/// descriptors) drops first.
pub(crate) struct DevicePrepared<'a> {
    executor: Option<Executor>,
    call: DeviceCall<'a>,
    workspace_size: u64,
    op: &'static Operator,
    launch: Phase2,
    zero_after_launch: Vec<&'a Tensor>,
}

impl std::fmt::Debug for DevicePrepared<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePrepared")
            .field("operator", &self.op.name)
            .field("device", &self.call.device.id)
            .field("tensors", &self.call.descriptors.len())
            .field("workspace_size", &self.workspace_size)
            .finish()
    }
}

impl DevicePrepared<'_> {
    /// The workspace phase 2 needs, in bytes.
    pub(crate) fn workspace_size(&self) -> u64 {
        self.workspace_size
    }

    /// Phase 2 on `stream`, with `workspace` or (for `None`) the stream's cached one.
    pub(crate) fn launch(mut self, stream: &Stream, workspace: Option<&Workspace>) -> Result<()> {
        let device = &self.call.device;
        let Some((inner, stream_device)) = stream.ascend() else {
            return Err(stream.mismatch("stream", &format!("the call was prepared on Ascend device {}", device.id)));
        };
        if !stream_device.same(device) {
            return Err(stream.mismatch("stream", &format!("the tensors are on Ascend device {}", device.id)));
        }
        let size = self.workspace_size;
        // CANN's rule: the workspace is null exactly when its size is 0, whatever the caller gave.
        let caller_workspace = match workspace {
            Some(ws) if size > 0 => Some(ws.buffer_for(size, device)?),
            _ => None,
        };
        let Some(executor) = self.executor.take() else {
            return Err(Error::invalid("executor", "already launched"));
        };
        let mut buffers: Vec<&DeviceBuffer> = self.call.descriptors.iter().map(AclTensor::buffer).collect();
        buffers.extend(caller_workspace);
        let (cann, op, launch) = (device.cann, self.op, self.launch);
        // The executor moves into the closure: if phase 2 never runs (say the stream's workspace
        // could not be allocated), dropping the closure destroys the unlaunched executor.
        let run = move |ws: *mut c_void| {
            device.bind()?;
            // SAFETY: `launch` is the operator's phase 2 (the signature every aclnn launch has);
            // the executor is fresh from its phase 1 and consumed here; `ws` is null with size
            // 0 or a live allocation of at least `size` bytes on this device (the caller's,
            // checked above, or the stream's); every buffer the executor references is in
            // `buffers`, on which `enqueue_using` records this stream before releasing them, so
            // none is freed before the stream has completed the work.
            let status = unsafe { launch(ws, size, executor.into_raw(), inner.raw()) };
            crate::acl::check(cann, op.name, status)
        };
        enqueue_using(inner, &buffers, || match caller_workspace {
            Some(b) => run(b.ptr()),
            None if size == 0 => run(std::ptr::null_mut()),
            None => inner.with_workspace(size, run),
        })?;
        for t in &self.zero_after_launch {
            zero_device_view(t)?;
        }
        Ok(())
    }
}

/// A caller-owned operator workspace (`aclrtMalloc`), for the two-phase API's `launch`.
/// Dropping it returns the memory to the allocator after the work of the streams that used it,
/// without waiting. Holds no memory on the CPU backend. Shared by
/// several threads, launches that use it are ordered (each waits for the other streams first).
#[derive(Debug)]
pub struct Workspace {
    buffer: Option<DeviceBuffer>,
    bytes: u64,
}

impl Workspace {
    /// Allocates `bytes` on the device of `stream` (nothing on the CPU backend, or for 0 bytes).
    pub fn new(stream: &Stream, bytes: u64) -> Result<Self> {
        let buffer = match stream.ascend() {
            Some((inner, _)) if bytes > 0 => {
                let n = usize::try_from(bytes)
                    .map_err(|_| Error::invalid("workspace", format!("{bytes} bytes do not fit in usize")))?;
                // From `stream`'s cache: reusable at once by launches on it, ordered otherwise.
                Some(DeviceBuffer::on_stream(inner, n)?)
            }
            _ => None,
        };
        Ok(Workspace { buffer, bytes })
    }

    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.bytes
    }

    /// The device memory for a launch on `device` that needs `size` (> 0) bytes.
    fn buffer_for(&self, size: u64, device: &Device) -> Result<&DeviceBuffer> {
        if self.bytes < size {
            return Err(Error::invalid("workspace", format!("holds {} bytes, phase 1 asked for {size}", self.bytes)));
        }
        match &self.buffer {
            Some(b) if b.device().same(device) => Ok(b),
            Some(_) => Err(Error::invalid("workspace", "was allocated on another device")),
            // A CPU-backend workspace reports its size but holds no device memory: passing null
            // with a non-zero size would hand the kernel a null workspace.
            None => Err(Error::invalid(
                "workspace",
                format!("holds no device memory (made on the CPU backend), phase 1 asked for {size} bytes"),
            )),
        }
    }
}

/// Writes zeros to every element of a device view of rank 1 (aclrtMemset, after the streams that
/// used the buffer have finished).
fn zero_device_view(t: &Tensor) -> Result<()> {
    let Some((buffer, device)) = t.device_buffer() else {
        return Err(Error::internal("output: a host tensor reached the Ascend backend"));
    };
    buffer.synchronize()?;
    device.bind()?;
    let es = t.dtype().size_in_bytes();
    let base = buffer.ptr().cast::<u8>();
    let (n, stride) = (t.shape()[0], t.strides()[0]);
    let runs: Vec<(usize, usize)> = if stride == 1 || n <= 1 {
        vec![(t.offset(), n)]
    } else {
        (0..n).map(|i| (t.offset() + i * stride, 1)).collect()
    };
    for (start, len) in runs {
        if len == 0 {
            continue;
        }
        // SAFETY: the view was checked to lie inside the buffer's storage, so [start, start+len)
        // elements are inside the allocation; its streams have been synchronised. The address is
        // computed with wrapping arithmetic since it is a device address.
        unsafe { crate::acl::memset(device.cann, base.wrapping_add(start * es).cast(), 0, len * es)? };
    }
    Ok(())
}
