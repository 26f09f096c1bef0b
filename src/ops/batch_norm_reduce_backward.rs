//! `aclnnBatchNormReduceBackward` on both backends.

use std::sync::Arc;

use super::validate::{self, Meta, Plan};
use super::OutputMask;
use crate::cpu;
use crate::device::descriptor::AclTensor;
use crate::device::executor::Executor;
use crate::device::{Device, DeviceBuffer};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::tensor::Tensor;

/// The outputs of [`batch_norm_reduce_backward`]: each `Some` exactly when the mask asked for it,
/// each of shape `[C]`, f16 when input and mean are both f16, else f32 (op-plugin's rule).
#[derive(Debug, Default)]
pub struct ReduceBackward {
    /// Σ dy per channel (`inputG`).
    pub sum_dy: Option<Tensor>,
    /// Σ dy·(x − mean) per channel (`inputG`).
    pub sum_dy_xmu: Option<Tensor>,
    /// sumDyXmu·invstd per channel (`weightG`).
    pub grad_weight: Option<Tensor>,
    /// Σ dy per channel (`biasG`).
    pub grad_bias: Option<Tensor>,
}

/// Caller-owned outputs for [`batch_norm_reduce_backward_into`]: shape `[C]` (any stride), any of
/// f32/f16/bf16. Those the mask turns on are required; the others are ignored and left untouched.
#[derive(Debug, Default)]
pub struct ReduceBackwardOut<'a> {
    /// Receives Σ dy (`inputG`).
    pub sum_dy: Option<&'a mut Tensor>,
    /// Receives Σ dy·(x − mean) (`inputG`).
    pub sum_dy_xmu: Option<&'a mut Tensor>,
    /// Receives sumDyXmu·invstd (`weightG`).
    pub grad_weight: Option<&'a mut Tensor>,
    /// Receives Σ dy (`biasG`).
    pub grad_bias: Option<&'a mut Tensor>,
}

/// Computes the BatchNorm backward reductions into new tensors (see the [module](super) docs).
///
/// Arguments are validated first, on both backends alike; a rejected call returns
/// [`Error::InvalidArgument`] with aclnn's status (161002 invalid) and does nothing. On Ascend this
/// allocates the outputs (`aclrtMalloc`) and runs [`batch_norm_reduce_backward_into`]; the work is
/// asynchronous: read results with [`Tensor::to_vec`].
pub fn batch_norm_reduce_backward(
    stream: &Stream,
    grad_out: &Tensor,
    input: &Tensor,
    mean: &Tensor,
    invstd: &Tensor,
    weight: Option<&Tensor>,
    mask: OutputMask,
) -> Result<ReduceBackward> {
    let plan = validate_inputs(stream, grad_out, input, mean, invstd, weight)?;
    let dtype = if input.dtype() == DType::F16 && mean.dtype() == DType::F16 { DType::F16 } else { DType::F32 };
    let on = validate::enabled(mask);
    let mut outs: [Option<Tensor>; 4] = Default::default();
    for (slot, enabled) in outs.iter_mut().zip(on) {
        if enabled {
            *slot = Some(Tensor::alloc(stream, dtype, &[plan.channels], false)?);
        }
    }
    let [mut sum_dy, mut sum_dy_xmu, mut grad_weight, mut grad_bias] = outs;
    batch_norm_reduce_backward_into(
        stream,
        grad_out,
        input,
        mean,
        invstd,
        weight,
        mask,
        ReduceBackwardOut {
            sum_dy: sum_dy.as_mut(),
            sum_dy_xmu: sum_dy_xmu.as_mut(),
            grad_weight: grad_weight.as_mut(),
            grad_bias: grad_bias.as_mut(),
        },
    )?;
    Ok(ReduceBackward { sum_dy, sum_dy_xmu, grad_weight, grad_bias })
}

/// Computes the BatchNorm backward reductions into caller-owned tensors (any of f32/f16/bf16,
/// shape `[C]`, any stride). The outputs the mask turns on must be given (else 161001).
///
/// On Ascend this is `aclnnBatchNormReduceBackwardGetWorkspaceSize` followed by
/// `aclnnBatchNormReduceBackward` on `stream`, with the stream's cached workspace (no allocation in
/// a steady loop of same-size calls). The call returns once the work is enqueued; every tensor may
/// be dropped at once (its memory is freed after the stream has finished with it).
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_reduce_backward_into(
    stream: &Stream,
    grad_out: &Tensor,
    input: &Tensor,
    mean: &Tensor,
    invstd: &Tensor,
    weight: Option<&Tensor>,
    mask: OutputMask,
    out: ReduceBackwardOut<'_>,
) -> Result<()> {
    prepare_batch_norm_reduce_backward(stream, grad_out, input, mean, invstd, weight, mask, out)?.launch(stream, None)
}

/// Phase 1 of the two-phase API: validates the arguments and, on Ascend, creates the tensor
/// descriptors and the executor (`aclnnBatchNormReduceBackwardGetWorkspaceSize`).
///
/// The result borrows every tensor until it is launched or dropped, so none can be freed or
/// read in between. [`PreparedReduceBackward::launch`] runs phase 2; dropping it unlaunched
/// destroys the executor (`aclSetAclOpExecutorRepeatable` + `aclDestroyAclOpExecutor`) and writes
/// nothing.
#[allow(clippy::too_many_arguments)]
pub fn prepare_batch_norm_reduce_backward<'a>(
    stream: &Stream,
    grad_out: &'a Tensor,
    input: &'a Tensor,
    mean: &'a Tensor,
    invstd: &'a Tensor,
    weight: Option<&'a Tensor>,
    mask: OutputMask,
    out: ReduceBackwardOut<'a>,
) -> Result<PreparedReduceBackward<'a>> {
    let outs = validate::keep_enabled(mask, [out.sum_dy, out.sum_dy_xmu, out.grad_weight, out.grad_bias]);
    let plan = {
        let w = weight.map(meta);
        let metas = outs.each_ref().map(|o| o.as_deref().map(meta));
        validate::call(
            [&meta(grad_out), &meta(input), &meta(mean), &meta(invstd)],
            w.as_ref(),
            mask,
            metas.each_ref().map(Option::as_ref),
        )?
    };
    check_streams(stream, grad_out, input, mean, invstd, weight)?;
    for (t, name) in outs.iter().zip(validate::OUTPUT_NAMES) {
        if let Some(t) = t {
            t.check_stream(stream, name)?;
        }
    }

    let kind = match stream.ascend() {
        None => Kind::Cpu { plan, mask, inputs: [grad_out, input, mean, invstd], outs },
        Some(_) => Kind::Ascend(AscendPrepared::new(plan, mask, [grad_out, input, mean, invstd], weight, outs)?),
    };
    Ok(PreparedReduceBackward { kind })
}

/// A validated call, ready to launch (phase 2). See [`prepare_batch_norm_reduce_backward`].
#[derive(Debug)]
pub struct PreparedReduceBackward<'a> {
    kind: Kind<'a>,
}

#[derive(Debug)]
enum Kind<'a> {
    Cpu { plan: Plan, mask: OutputMask, inputs: [&'a Tensor; 4], outs: [Option<&'a mut Tensor>; 4] },
    Ascend(AscendPrepared<'a>),
}

impl PreparedReduceBackward<'_> {
    /// The workspace phase 2 needs, in bytes (0 on the CPU, and often on Ascend).
    pub fn workspace_size(&self) -> u64 {
        match &self.kind {
            Kind::Cpu { .. } => 0,
            Kind::Ascend(a) => a.workspace_size,
        }
    }

    /// Phase 2 (`aclnnBatchNormReduceBackward`): enqueues the work on `stream`, which must be on
    /// the device the tensors live on. With `workspace = None` the stream's cached workspace is
    /// used; a caller-owned [`Workspace`] must hold at least [`workspace_size`](Self::workspace_size)
    /// bytes. The executor is consumed: a prepared call runs once.
    pub fn launch(self, stream: &Stream, workspace: Option<&Workspace>) -> Result<()> {
        match self.kind {
            Kind::Cpu { plan, mask, inputs, outs } => {
                if stream.ascend().is_some() {
                    return Err(stream.mismatch("stream", "the call was prepared on the CPU backend"));
                }
                cpu_launch(plan, mask, inputs, outs)
            }
            Kind::Ascend(a) => a.launch(stream, workspace),
        }
    }
}

fn meta(t: &Tensor) -> Meta<'_> {
    Meta { dtype: t.dtype(), shape: t.shape(), strides: t.strides(), offset: t.offset(), storage_len: t.storage_len() }
}

/// Validates the inputs of the allocating entry point (whose outputs it makes itself).
fn validate_inputs(
    stream: &Stream,
    grad_out: &Tensor,
    input: &Tensor,
    mean: &Tensor,
    invstd: &Tensor,
    weight: Option<&Tensor>,
) -> Result<Plan> {
    let w = weight.map(meta);
    let plan = validate::inputs(&meta(grad_out), &meta(input), &meta(mean), &meta(invstd), w.as_ref())?;
    check_streams(stream, grad_out, input, mean, invstd, weight)?;
    Ok(plan)
}

/// Checks that every input lives where `stream` runs work.
fn check_streams(
    stream: &Stream,
    grad_out: &Tensor,
    input: &Tensor,
    mean: &Tensor,
    invstd: &Tensor,
    weight: Option<&Tensor>,
) -> Result<()> {
    for (name, t) in [("gradOut", grad_out), ("input", input), ("mean", mean), ("invstd", invstd)] {
        t.check_stream(stream, name)?;
    }
    match weight {
        Some(w) => w.check_stream(stream, "weight"),
        None => Ok(()),
    }
}

fn cpu_launch(plan: Plan, mask: OutputMask, inputs: [&Tensor; 4], outs: [Option<&mut Tensor>; 4]) -> Result<()> {
    let [grad_out, input, mean, invstd] = inputs.map(|t| t.as_host_view());
    let (Some(grad_out), Some(input), Some(mean), Some(invstd)) = (grad_out, input, mean, invstd) else {
        return Err(Error::invalid("gradOut", "a device tensor reached the CPU backend"));
    };
    let outs = outs.map(|o| o.and_then(|t| t.as_host_view_mut()));
    cpu::run(&plan, mask, grad_out, input, mean, invstd, outs);
    Ok(())
}

/// A caller-owned operator workspace (`aclrtMalloc`) for [`PreparedReduceBackward::launch`].
/// Dropping it waits for the streams that used it. Holds no memory on the CPU backend.
#[derive(Debug)]
pub struct Workspace {
    buffer: Option<DeviceBuffer>,
    bytes: u64,
}

impl Workspace {
    /// Allocates `bytes` on the device of `stream` (nothing on the CPU backend, or for 0 bytes).
    pub fn new(stream: &Stream, bytes: u64) -> Result<Self> {
        let buffer = match stream.ascend() {
            Some((_, device)) if bytes > 0 => {
                let n = usize::try_from(bytes)
                    .map_err(|_| Error::invalid("workspace", format!("{bytes} bytes do not fit in usize")))?;
                Some(DeviceBuffer::new(device.clone(), n)?)
            }
            _ => None,
        };
        Ok(Workspace { buffer, bytes })
    }

    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.bytes
    }
}

/// Phase 1 done on Ascend: the descriptors and the executor, borrowing every tensor.
/// Field order matters: the executor (which references the descriptors) drops first.
struct AscendPrepared<'a> {
    executor: Option<Executor<'a>>,
    /// Held (never read) so the descriptors live until after phase 2, then are destroyed.
    #[allow(dead_code)]
    descriptors: Vec<AclTensor<'a>>,
    device: &'a Arc<Device>,
    workspace_size: u64,
    buffers: Vec<&'a DeviceBuffer>,
    /// Outputs to zero when the input is empty (CANN leaves them unwritten on A2/A3).
    zero: Vec<&'a Tensor>,
}

impl std::fmt::Debug for AscendPrepared<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AscendPrepared")
            .field("device", &self.device.id)
            .field("workspace_size", &self.workspace_size)
            .field("launched", &self.executor.is_none())
            .finish()
    }
}

fn device_of<'a>(t: &'a Tensor, name: &'static str) -> Result<(&'a DeviceBuffer, &'a Arc<Device>)> {
    t.device_buffer().ok_or_else(|| Error::invalid(name, "a host tensor reached the Ascend backend"))
}

fn descriptor<'a>(t: &'a Tensor, name: &'static str) -> Result<AclTensor<'a>> {
    let (buffer, _) = device_of(t, name)?;
    AclTensor::new(buffer, t.dtype(), t.shape(), t.strides(), t.offset(), t.storage_len())
}

impl<'a> AscendPrepared<'a> {
    fn new(
        plan: Plan,
        mask: OutputMask,
        inputs: [&'a Tensor; 4],
        weight: Option<&'a Tensor>,
        outs: [Option<&'a mut Tensor>; 4],
    ) -> Result<Self> {
        const INPUT_NAMES: [&str; 4] = ["gradOut", "input", "mean", "invstd"];
        let (_, device) = device_of(inputs[0], "gradOut")?;
        let outs: [Option<&'a Tensor>; 4] = outs.map(|o| o.map(|t| &*t));

        let mut buffers = Vec::with_capacity(9);
        let mut descriptors = Vec::with_capacity(9);
        for (t, name) in inputs.iter().zip(INPUT_NAMES) {
            buffers.push(device_of(t, name)?.0);
            descriptors.push(descriptor(t, name)?);
        }
        let weight_desc = match weight {
            Some(w) => Some(descriptor(w, "weight")?),
            None => None,
        };
        let mut out_desc: [Option<AclTensor<'a>>; 4] = [None, None, None, None];
        for (i, t) in outs.iter().enumerate() {
            if let Some(t) = t {
                buffers.push(device_of(t, validate::OUTPUT_NAMES[i])?.0);
                out_desc[i] = Some(descriptor(t, validate::OUTPUT_NAMES[i])?);
            }
        }
        let raw_out = |i: usize| out_desc[i].as_ref().map_or(std::ptr::null_mut(), |d| d.raw());
        let tensors = crate::acl::OpTensors {
            grad_out: descriptors[0].raw(),
            input: descriptors[1].raw(),
            mean: descriptors[2].raw(),
            invstd: descriptors[3].raw(),
            weight: weight_desc.as_ref().map_or(std::ptr::null(), |d| d.raw()),
            sum_dy: raw_out(0),
            sum_dy_xmu: raw_out(1),
            grad_weight: raw_out(2),
            grad_bias: raw_out(3),
        };
        device.bind()?;
        // SAFETY: every non-null pointer is a live descriptor held in `descriptors`, `weight_desc`
        // or `out_desc`, all of which move into the returned value and outlive the executor.
        let (workspace_size, raw) = unsafe {
            crate::acl::batch_norm_reduce_backward_prepare(
                device.cann,
                &tensors,
                (mask.input_g, mask.weight_g, mask.bias_g),
            )?
        };
        let executor = Executor::new(device, raw);
        descriptors.extend(weight_desc);
        descriptors.extend(out_desc.into_iter().flatten());
        let zero = if plan.empty { outs.into_iter().flatten().collect() } else { Vec::new() };
        Ok(AscendPrepared { executor: Some(executor), descriptors, device, workspace_size, buffers, zero })
    }

    fn launch(mut self, stream: &Stream, workspace: Option<&Workspace>) -> Result<()> {
        let Some((inner, device)) = stream.ascend() else {
            return Err(stream
                .mismatch("stream", format!("the call was prepared on Ascend device {}", self.device.id).as_str()));
        };
        if !device.same(self.device) {
            return Err(
                stream.mismatch("stream", format!("the tensors are on Ascend device {}", self.device.id).as_str())
            );
        }
        let size = self.workspace_size;
        if let Some(ws) = workspace {
            if ws.bytes < size {
                return Err(Error::invalid("workspace", format!("holds {} bytes, phase 1 asked for {size}", ws.bytes)));
            }
            match &ws.buffer {
                Some(b) if !b.device().same(self.device) => {
                    return Err(Error::invalid("workspace", "was allocated on another device"));
                }
                // A CPU-backend workspace reports its size but holds no device memory: passing
                // null with a non-zero size would hand the kernel a null workspace.
                None if size > 0 => {
                    return Err(Error::invalid(
                        "workspace",
                        format!("holds no device memory (made on the CPU backend), phase 1 asked for {size} bytes"),
                    ));
                }
                _ => {}
            }
        }
        // From here on the buffers must outlive the work: each remembers the stream.
        for b in &self.buffers {
            b.record_use(inner)?;
        }
        let Some(executor) = self.executor.take() else {
            return Err(Error::invalid("executor", "already launched"));
        };
        let cann = self.device.cann;
        // The executor moves into the closure: if it never runs (workspace allocation failed),
        // dropping the closure destroys the unlaunched executor.
        let enqueue = move |ws: *mut std::ffi::c_void| {
            device.bind()?;
            let executor = executor.into_raw();
            // SAFETY: the executor is fresh from phase 1 and consumed here; the workspace is null
            // with size 0 or a live allocation of at least `size` bytes on this device; every
            // buffer the executor references has recorded this stream, so it is freed only after
            // the stream completes the work.
            unsafe { crate::acl::batch_norm_reduce_backward_launch(cann, ws, size, executor, inner.raw()) }
        };
        match workspace.and_then(|w| w.buffer.as_ref()) {
            Some(b) => {
                b.record_use(inner)?;
                enqueue(b.ptr())?;
            }
            None if workspace.is_some() || size == 0 => enqueue(std::ptr::null_mut())?,
            None => inner.with_workspace(size, enqueue)?,
        }
        for t in &self.zero {
            zero_device_view(t)?;
        }
        Ok(())
    }
}

/// Writes zeros to every element of a device view of rank 1 (aclrtMemset, after the streams that
/// used the buffer have finished).
fn zero_device_view(t: &Tensor) -> Result<()> {
    let (buffer, device) = device_of(t, "output")?;
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
