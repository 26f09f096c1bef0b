//! The one launch path of every operator on Ascend: descriptor list → phase 1 → workspace →
//! phase 2 → record, written once.
//!
//! [`prepare`] describes every tensor an operator lists (its inputs and outputs, see
//! [`Operator`]) through `DeviceCall`, the only way to get an `aclTensor` for phase 1: the
//! descriptor keeps the [`DeviceBuffer`] it points into, so the list of descriptors is also the
//! list of memory the call touches, and no argument can be left out of it. The operator names
//! only its two FFI functions. [`DevicePrepared::launch`] hands that list (plus the workspace) to
//! [`enqueue_using`], which records the stream on every buffer and enqueues phase 2 as one step,
//! under the buffers' locks. No operator writes its own lifetime code.

use std::ffi::c_void;
use std::sync::Arc;

use ascend_sys::symbols;
use ascend_sys::{aclOpExecutor, aclTensor, aclnnStatus, aclrtStream};

use super::operator::{Handles, Operator, Outputs};
use crate::device::descriptor::AclTensor;
use crate::device::executor::Executor;
use crate::device::{enqueue_using, Device, DeviceBuffer, StreamInner};
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::tensor::Tensor;

/// Phase 2 of every aclnn operator: `(workspace, workspace bytes, executor, stream)`.
pub(crate) type Phase2 = unsafe extern "C" fn(*mut c_void, u64, *mut aclOpExecutor, aclrtStream) -> aclnnStatus;

/// The device arguments of one operator call, being described for phase 1.
struct DeviceCall<'a> {
    device: Arc<Device>,
    descriptors: Vec<AclTensor<'a>>,
}

impl<'a> DeviceCall<'a> {
    /// Describes `t` (argument `name`, for errors; null when absent) and returns its handle for
    /// phase 1. The handle lives as long as this call (and the prepared call made from it).
    fn describe(&mut self, t: Option<&'a Tensor>, name: &'static str) -> Result<*mut aclTensor> {
        let Some(t) = t else { return Ok(std::ptr::null_mut()) };
        let Some((buffer, device)) = t.device_buffer() else {
            return Err(Error::internal(format!("{name}: a host tensor reached the Ascend backend")));
        };
        if !device.same(&self.device) {
            return Err(Error::internal(format!(
                "{name}: a tensor on Ascend device {} reached a call on device {} after the stream checks",
                device.id, self.device.id
            )));
        }
        let d = AclTensor::new(buffer, t.dtype(), t.shape(), t.strides(), t.offset(), t.storage_len())?;
        let raw = d.raw();
        self.descriptors.push(d);
        Ok(raw)
    }
}

/// The most inputs, or outputs, an operator has (aclnn's have at most a dozen tensors).
const MAX_TENSORS: usize = 16;

fn too_many() -> Error {
    Error::internal(format!("an operator lists more than {MAX_TENSORS} inputs or outputs"))
}

/// Phase 1 of `op` on `device`, its streams checked: every tensor described (inputs, then
/// outputs, each in its prototype's order), the operator resolved in the toolkit on first use (a
/// toolkit lacking it is [`Error::Load`] naming it), then its `GetWorkspaceSize` with the handles
/// and scalars. An operator whose plan asks for it gets its outputs filled with zeros after
/// phase 2 (CANN's kernels skip empty inputs).
pub(crate) fn prepare<'a, O: Operator<'a>>(
    device: &Arc<Device>,
    op: O,
    plan: O::Plan,
    outs: O::Outputs,
) -> Result<DevicePrepared<'a>> {
    // bounded: MAX_TENSORS (16) descriptors, a constant.
    #[allow(clippy::disallowed_methods)]
    let mut call = DeviceCall { device: device.clone(), descriptors: Vec::with_capacity(MAX_TENSORS) };
    // The handles live on the stack: describing a call allocates only its descriptor list.
    let (mut inputs, mut n_in) = ([std::ptr::null_mut(); MAX_TENSORS], 0);
    for (t, name) in op.inputs() {
        *inputs.get_mut(n_in).ok_or_else(too_many)? = call.describe(t, name)?;
        n_in += 1;
    }
    let (mut outputs, mut n_out) = ([std::ptr::null_mut(); MAX_TENSORS], 0);
    let zero = O::zero_after_launch(&plan);
    let mut zero_after_launch = Vec::new();
    for (t, name) in outs.into_shared().zip(O::OUTPUTS) {
        *outputs.get_mut(n_out).ok_or_else(too_many)? = call.describe(t, name)?;
        n_out += 1;
        if let (true, Some(t)) = (zero, t) {
            zero_after_launch.push(t);
        }
    }
    let (inputs, outputs) = (&inputs[..n_in], &outputs[..n_out]);
    let api = device.cann.operator(O::OP)?;
    let launch = crate::acl::op_fn(O::phase2(api), O::OP.name)?;
    device.bind()?;
    let scalars = op.scalars();
    let (workspace_size, raw) = crate::acl::phase1(device.cann, O::OP.phase1, |size, executor| {
        let h = Handles { inputs, outputs, size, executor };
        // SAFETY: `h` holds the call's descriptors, inputs then outputs in the operator's order
        // (null for an absent one), kept alive by `call`, which moves into the prepared call and
        // outlives the executor, and phase1's valid out-pointers.
        unsafe { O::phase1(api, scalars, h) }
    })?;
    let executor = Executor::new(device.clone(), raw);
    Ok(DevicePrepared { executor: Some(executor), call, workspace_size, op: O::OP, launch, zero_after_launch })
}

/// Phase 1 done on Ascend: the executor and the descriptors (each with its buffer), borrowing
/// every tensor of the call. Field order matters: the executor (which references the
/// descriptors) drops first.
pub(crate) struct DevicePrepared<'a> {
    executor: Option<Executor>,
    call: DeviceCall<'a>,
    workspace_size: u64,
    op: &'static symbols::Operator,
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
    pub(crate) fn launch(self, stream: &Stream, workspace: Option<&Workspace>) -> Result<()> {
        let device = &self.call.device;
        let Some((inner, stream_device)) = stream.ascend() else {
            return Err(stream.mismatch("stream", &format!("the call was prepared on Ascend device {}", device.id)));
        };
        if !stream_device.same(device) {
            return Err(stream.mismatch("stream", &format!("the tensors are on Ascend device {}", device.id)));
        }
        self.launch_on(inner, workspace)
    }

    /// Phase 2 on `inner`, a stream of the call's device.
    pub(crate) fn launch_on(mut self, inner: &Arc<StreamInner>, workspace: Option<&Workspace>) -> Result<()> {
        let device = &self.call.device;
        let size = self.workspace_size;
        // CANN's rule: the workspace is null exactly when its size is 0, whatever the caller gave.
        let caller_workspace = match workspace {
            Some(ws) if size > 0 => Some(ws.buffer_for(size, device)?),
            _ => None,
        };
        let Some(executor) = self.executor.take() else {
            return Err(Error::internal("a prepared call's executor was launched twice"));
        };
        // bounded: one buffer per descriptor (at most 2·MAX_TENSORS: inputs and outputs), a list
        // already in memory.
        #[allow(clippy::disallowed_methods)]
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
    // One run of n elements (contiguous), or n runs of one element each `stride` apart: walked
    // without a table, whose length would be the caller's channel count.
    let (count, len, step) = if stride == 1 || n <= 1 { (1, n, 0) } else { (n, 1, stride) };
    for start in (0..count).map(|i| t.offset() + i * step) {
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
