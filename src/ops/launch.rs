//! The one launch path of every operator on Ascend: descriptor list → phase 1 → workspace →
//! phase 2 → record, written once, with the stream's launch cache in front of it.
//!
//! Every path first reads the tensors an operator lists (its inputs and outputs, see
//! [`Operator`]) once into a `Call`: each one's name, the tensor and its device buffer; the
//! launch cache sees them as [`Key`]s (plain layout data: the cache below never sees a `Tensor`).
//! [`prepare`] describes them
//! through `Descriptors`, the only way to get an `aclTensor` for phase 1: the
//! descriptor keeps the [`DeviceBuffer`] it points into, so the list of descriptors is also the
//! list of memory the call touches, and no argument can be left out of it. The operator names
//! only its two FFI functions. [`DevicePrepared::launch`] hands that list (plus the workspace) to
//! [`enqueue_using`], which records the stream on every buffer and enqueues phase 2 as one step,
//! under the stream's enqueue lock (and the buffers' locks unless the stream is already their only
//! user). No operator writes its own lifetime code.
//!
//! [`run`] (what the `_into` and allocating entries take) first asks the stream's
//! [`LaunchCache`](crate::device::launch_cache): on a hit, every tensor's address is rebound and
//! phase 2 runs, its buffers recorded through the same [`enqueue_using`]; on a miss, the call
//! above runs with its executor made repeatable and is kept, or, when CANN refuses to make it
//! repeatable, is launched uncached (and its signature not tried again). The two-phase `prepare_*` API
//! always runs phase 1 (its call may be launched on any stream of the device).

use std::ffi::c_void;
use std::sync::Arc;

use ascend_sys::aclTensor;
use ascend_sys::symbols;

use super::operator::{Handles, Operator, Outputs, ScalarBits};
use crate::device::descriptor::AclTensor;
use crate::device::executor::Executor;
use crate::device::launch_cache::{config_epoch, Entry, Key, Signature};
use crate::device::{enqueue_if_sole_user, enqueue_using, Device, DeviceAlloc, DeviceBuffer, Enqueue, StreamInner};
use crate::error::{Error, Result};
use crate::layout::{Layout, MAX_RANK};
use crate::stream::Stream;
use crate::tensor::{Tensor, TENSOR_DATA_ALIGN};

pub(crate) use crate::device::launch_cache::Phase2;

/// The most tensors of one call, inputs and outputs together (this crate's operators have at
/// most 9; kept small: a launch keeps these lists on the stack).
const MAX_ARGS: usize = 16;

fn too_many() -> Error {
    Error::internal(format!("an operator lists more than {MAX_ARGS} inputs and outputs"))
}

/// The tensors of one call, inputs then outputs, each in its prototype's order, read once: each
/// one's aclnn name (for errors), the tensor (`None`: absent) and its device buffer (`None`:
/// absent, or in host memory); on the stack. The launch cache sees them as [`Key`]s
/// ([`signature`](Self::signature)).
#[derive(Clone, Copy)]
struct Call<'t> {
    names: [&'static str; MAX_ARGS],
    tensors: [Option<&'t Tensor>; MAX_ARGS],
    buffers: [Option<&'t DeviceBuffer>; MAX_ARGS],
    len: usize,
    inputs: usize,
    /// Whether the launch cache takes the call: every present tensor in device memory of the
    /// call's device, of rank at most [`MAX_RANK`], at a non-null address that is 32-byte
    /// aligned (CANN rebinds only aligned addresses).
    cacheable: bool,
}

impl<'t> Call<'t> {
    /// The call of `inputs` then `outputs` on `device`; an error when they are more than
    /// [`MAX_ARGS`].
    fn of(
        device: &Device,
        inputs: impl IntoIterator<Item = (Option<&'t Tensor>, &'static str)>,
        outputs: impl IntoIterator<Item = (Option<&'t Tensor>, &'static str)>,
    ) -> Result<Self> {
        let mut call = Call::empty();
        call.fill(device, inputs, outputs)?;
        Ok(call)
    }

    fn empty() -> Self {
        Call {
            names: [""; MAX_ARGS],
            tensors: [None; MAX_ARGS],
            buffers: [None; MAX_ARGS],
            len: 0,
            inputs: 0,
            cacheable: true,
        }
    }

    /// Reads `inputs` then `outputs` into an empty call (in place: the steady launch copies no
    /// list).
    fn fill(
        &mut self,
        device: &Device,
        inputs: impl IntoIterator<Item = (Option<&'t Tensor>, &'static str)>,
        outputs: impl IntoIterator<Item = (Option<&'t Tensor>, &'static str)>,
    ) -> Result<()> {
        for (t, name) in inputs {
            self.push(t, name, device)?;
        }
        self.inputs = self.len;
        for (t, name) in outputs {
            self.push(t, name, device)?;
        }
        Ok(())
    }

    #[inline]
    fn push(&mut self, t: Option<&'t Tensor>, name: &'static str, device: &Device) -> Result<()> {
        let i = self.len;
        if i == MAX_ARGS {
            return Err(too_many());
        }
        self.len += 1;
        self.names[i] = name;
        let Some(t) = t else { return Ok(()) };
        self.tensors[i] = Some(t);
        self.buffers[i] = t.device_buffer().map(|(b, _)| b);
        self.cacheable &= self.buffers[i].is_some_and(|b| {
            let p = b.ptr();
            b.device().same(device) && !p.is_null() && (p as usize).is_multiple_of(TENSOR_DATA_ALIGN)
        }) && t.shape().len() <= MAX_RANK;
        Ok(())
    }

    /// Argument `i`'s layout and buffer (which must be on `device`: the stream checks said so),
    /// `None` when it is absent.
    fn device_arg(&self, i: usize, device: &Device) -> Result<Option<(Layout<'t>, &'t DeviceBuffer)>> {
        let (Some(t), name) = (self.tensors[i], self.names[i]) else { return Ok(None) };
        let Some(buffer) = self.buffers[i] else {
            return Err(Error::internal(format!("{name}: a host tensor reached the Ascend backend")));
        };
        let on = buffer.device();
        if !on.same(device) {
            return Err(Error::internal(format!(
                "{name}: a tensor on Ascend device {} reached a call on device {} after the stream checks",
                on.id, device.id
            )));
        }
        Ok(Some((t.layout(), buffer)))
    }

    /// What the launch cache matches, its keys written into `keys` (in place: a launch copies no
    /// list): each tensor as plain layout data, with the id and hash the tensor was given when it
    /// was made (`None`: absent).
    fn signature<'k, S: ScalarBits>(
        &self,
        keys: &'k mut [Option<Key<'t>>; MAX_ARGS],
        op: &'static symbols::Operator,
        scalars: S,
    ) -> Signature<'k> {
        for (k, t) in keys.iter_mut().zip(&self.tensors[..self.len]) {
            *k = t.map(|t| Key { id: t.layout_id(), hash: t.layout_hash(), layout: t.layout() });
        }
        Signature { op, scalars: scalars.bits(), keys: &keys[..self.len], inputs: self.inputs }
    }

    /// Launches the entry of this call cached on `inner`, if there is one: see [`launch_cached`].
    /// Its buffers go through [`enqueue_using`]'s steady case when `inner` is their only stream;
    /// otherwise, if the call is `validated`, through its general case (which records `inner`
    /// on them even on a miss: the call is launched next anyway), else it is left to the
    /// validated path (`None`, nothing done).
    fn launch_hit<S: ScalarBits>(
        &self,
        inner: &Arc<StreamInner>,
        op: &'static symbols::Operator,
        scalars: S,
        validated: bool,
    ) -> (u64, Option<Result<()>>) {
        let mut keys = [None; MAX_ARGS];
        let sig = self.signature(&mut keys, op, scalars);
        let hash = sig.hash();
        let buffers = self.buffers[..self.len].iter().flatten().copied();
        let hit = |e: &mut Enqueue| {
            e.launches.launch_hit(inner, hash, &sig, |entry| launch_cached(inner, self, entry, &mut e.workspace))
        };
        let result = if validated {
            enqueue_using(inner, buffers, |e| Ok(hit(e))).unwrap_or_else(|e| Some(Err(e)))
        } else {
            enqueue_if_sole_user(inner, buffers, hit).ok().flatten()
        };
        (hash, result)
    }
}

/// The descriptors of one operator call, being made for phase 1, on the stack (a call has at
/// most [`MAX_ARGS`]).
struct Descriptors<'a> {
    device: Arc<Device>,
    list: [Option<AclTensor<'a>>; MAX_ARGS],
    len: usize,
}

impl<'a> Descriptors<'a> {
    fn new(device: &Arc<Device>) -> Self {
        Descriptors { device: device.clone(), list: [const { None }; MAX_ARGS], len: 0 }
    }

    /// Describes argument `i` of `call` (null when absent) and returns its handle for phase 1.
    /// The handle lives as long as this list (and the prepared call made from it).
    fn describe(&mut self, call: &Call<'a>, i: usize) -> Result<*mut aclTensor> {
        let Some((l, buffer)) = call.device_arg(i, &self.device)? else { return Ok(std::ptr::null_mut()) };
        if self.len == MAX_ARGS {
            return Err(too_many());
        }
        let d = AclTensor::new(buffer, l.dtype, l.shape, l.strides, l.offset, l.storage_len)?;
        let raw = d.raw();
        self.list[self.len] = Some(d);
        self.len += 1;
        Ok(raw)
    }

    /// The descriptors made so far.
    fn iter(&self) -> impl Iterator<Item = &AclTensor<'a>> + Clone {
        self.list[..self.len].iter().flatten()
    }
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
    let call = Call::of(device, op.inputs(), outs.into_shared().zip(O::OUTPUTS.iter().copied()))?;
    phase1::<O>(device, op.scalars(), call, O::zero_after_launch(&plan))
}

fn phase1<'a, O: Operator<'a>>(
    device: &Arc<Device>,
    scalars: O::Scalars,
    call: Call<'a>,
    zero_after_launch: bool,
) -> Result<DevicePrepared<'a>> {
    let mut descriptors = Descriptors::new(device);
    // The handles live on the stack too: describing a call allocates nothing.
    let mut handles = [std::ptr::null_mut(); MAX_ARGS];
    for (i, h) in handles[..call.len].iter_mut().enumerate() {
        *h = descriptors.describe(&call, i)?;
    }
    let api = device.cann.operator(O::OP)?;
    let launch = crate::acl::op_fn(O::phase2(api), O::OP.name)?;
    device.bind()?;
    let (inputs, outputs) = handles[..call.len].split_at(call.inputs);
    let (workspace_size, raw) = crate::acl::phase1(device.cann, O::OP.phase1, |size, executor| {
        let h = Handles { inputs, outputs, size, executor, cann: Some(device.cann) };
        // SAFETY: `h` holds the call's descriptors, inputs then outputs in the operator's order
        // (null for an absent one), kept alive by `descriptors`, which move into the prepared call
        // and outlive the executor, and phase1's valid out-pointers.
        unsafe { O::phase1(api, scalars, h) }
    })?;
    let executor = Executor::new(device.clone(), raw);
    Ok(DevicePrepared {
        executor: Some(executor),
        descriptors,
        handles,
        call,
        workspace_size,
        op: O::OP,
        launch,
        zero_after_launch,
    })
}

/// An `_into` entry's first step on Ascend: if `inner`'s launch cache holds the executor of this
/// call's signature, launches it (every tensor rebound, then phase 2) and returns `true`. The
/// signature (operator, every tensor's dtype, shape, strides, offset and storage length, the
/// scalars) is all the operator's validation reads, and the entry was made by a call that passed
/// it, so the call is not validated again. Returns `false`, doing nothing, when the call is not
/// cached (then it is validated and goes through [`run`]).
pub(crate) fn launch_if_cached<'a, O: Operator<'a>>(
    inner: &Arc<StreamInner>,
    device: &Device,
    op: &O,
    outs: &O::Outputs,
) -> Result<bool> {
    if !inner.launches.enabled() {
        return Ok(false);
    }
    // (More tensors than a call holds: left to the validated path, which reports it.)
    // (The inputs, borrowed for `'a`, reborrowed for as long as the outputs are.)
    let inputs = op.inputs().into_iter().map(|(t, name)| (t.map(|t| t as &Tensor), name));
    let mut call = Call::empty();
    if call.fill(device, inputs, outs.each().zip(O::OUTPUTS.iter().copied())).is_err() || !call.cacheable {
        return Ok(false);
    }
    match call.launch_hit(inner, O::OP, op.scalars(), false).1 {
        Some(result) => result.map(|()| true),
        None => Ok(false),
    }
}

/// A validated `_into` or allocating call on Ascend: the cached executor of this call's
/// signature on `inner` if there is one (rebound, then phase 2), else phase 1 with a repeatable
/// executor, launched and kept. Calls the cache does not take (it is off, an empty input that is
/// zeroed after the launch, or see [`Call::cacheable`]) run [`prepare`] and launch as always.
pub(crate) fn run<'a, O: Operator<'a>>(
    inner: &Arc<StreamInner>,
    device: &Arc<Device>,
    op: O,
    plan: O::Plan,
    outs: O::Outputs,
) -> Result<()> {
    let call = Call::of(device, op.inputs(), outs.into_shared().zip(O::OUTPUTS.iter().copied()))?;
    let (scalars, zero) = (op.scalars(), O::zero_after_launch(&plan));
    if zero || !inner.launches.enabled() || !call.cacheable {
        return phase1::<O>(device, scalars, call, zero)?.launch_on(inner, None);
    }
    let (hash, hit) = call.launch_hit(inner, O::OP, scalars, true);
    if let Some(result) = hit {
        return result;
    }
    // A miss (the slow path): first destroy the retired entries whose launches have run.
    inner.launches.reap(inner);
    // Read before phase 1: a setting changed meanwhile leaves the entry stale, never the reverse.
    let epoch = config_epoch(device);
    let mut prepared = phase1::<O>(device, scalars, call, false)?;
    // CANN refuses executors it cannot repeat (ASYNC.md §5): such a call is launched uncached,
    // phase 2 consuming its executor, and its signature is not tried again.
    let refused = inner.launches.refused(inner, hash, epoch);
    if refused || !prepared.executor.as_mut().map_or(Ok(false), Executor::try_make_repeatable)? {
        if !refused {
            inner.launches.refuse(inner, hash, epoch);
        }
        return prepared.launch_on(inner, None);
    }
    prepared.launch_and_keep(inner, scalars, hash, epoch)
}

/// Phase 2 of a cached executor on its stream: every present tensor rebound to this call's
/// buffer, then launched with the stream's workspace. Runs inside [`enqueue_using`] (or its
/// steady case) over the call's buffers, which records them with the enqueue.
fn launch_cached(
    inner: &Arc<StreamInner>,
    call: &Call<'_>,
    entry: &mut Entry,
    workspace: &mut Option<DeviceAlloc>,
) -> Result<()> {
    let device = &inner.device;
    let size = entry.workspace_size();
    let n = call.len;
    device.bind()?;
    // SAFETY: each buffer is this call's buffer of that argument (its address checked 32-byte
    // aligned and non-null; the view was validated to lie inside it), recorded on this stream
    // by the enclosing `enqueue_using`, so it outlives the launch.
    unsafe { entry.rebind(&call.buffers[..n]) }?;
    inner.with_workspace(workspace, size, |ws| {
        // SAFETY: the entry's phase 2 with its live repeatable executor, all of whose tensors
        // were just rebound to live buffers recorded on this stream; `ws` is null with size 0 or
        // the stream's workspace of at least `size` bytes; the executor is launched on this
        // stream only (its cache's).
        let status = unsafe { entry.phase2()(ws, size, entry.executor(), inner.raw()) };
        crate::acl::check(device.cann, entry.op_name(), status)
    })
}

/// Phase 1 done on Ascend: the executor and the descriptors (each with its buffer), borrowing
/// every tensor of the call. Field order matters: the executor (which references the
/// descriptors) drops first.
pub(crate) struct DevicePrepared<'a> {
    executor: Option<Executor>,
    descriptors: Descriptors<'a>,
    /// Each argument's descriptor (null: absent), as phase 1 got them.
    handles: [*mut aclTensor; MAX_ARGS],
    call: Call<'a>,
    workspace_size: u64,
    op: &'static symbols::Operator,
    launch: Phase2,
    zero_after_launch: bool,
}

impl std::fmt::Debug for DevicePrepared<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePrepared")
            .field("operator", &self.op.name)
            .field("device", &self.descriptors.device.id)
            .field("tensors", &self.descriptors.len)
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
        let device = &self.descriptors.device;
        let Some((inner, stream_device)) = stream.ascend() else {
            return Err(stream.mismatch("stream", &format!("the call was prepared on Ascend device {}", device.id)));
        };
        if !stream_device.same(device) {
            return Err(stream.mismatch("stream", &format!("the tensors are on Ascend device {}", device.id)));
        }
        self.launch_on(inner, workspace)
    }

    /// Phase 2 on `inner`, a stream of the call's device; consumes the executor.
    pub(crate) fn launch_on(mut self, inner: &Arc<StreamInner>, workspace: Option<&Workspace>) -> Result<()> {
        let Some(executor) = self.executor.take() else {
            return Err(Error::internal("a prepared call's executor was launched twice"));
        };
        // The executor moves into the closure: if phase 2 never runs (say the stream's workspace
        // could not be allocated), dropping the closure destroys the unlaunched executor.
        self.enqueue(inner, workspace, move |launch, ws, size| {
            // SAFETY: `launch` is the operator's phase 2 (the signature every aclnn launch has);
            // the executor is fresh from its phase 1 and consumed here; `ws` is null with size
            // 0 or a live allocation of at least `size` bytes on this device (the caller's,
            // checked, or the stream's); every buffer the executor references is recorded on
            // this stream by `enqueue_using` before it releases them, so none is freed before
            // the stream has completed the work.
            unsafe { launch(ws, size, executor.into_raw(), inner.raw()) }
        })?;
        if self.zero_after_launch {
            for i in self.call.inputs..self.call.len {
                if let Some((l, buffer)) = self.call.device_arg(i, &self.descriptors.device)? {
                    zero_device_view(&l, buffer)?;
                }
            }
        }
        Ok(())
    }

    /// Phase 2 of a call whose executor was made repeatable, on `inner` with its workspace;
    /// then the executor and the descriptors go to the stream's launch cache for the call's
    /// signature with `scalars` (whose hash is `hash`; `epoch` the device's configuration epoch
    /// before phase 1), or are retired if the launch failed.
    fn launch_and_keep<S: ScalarBits>(
        mut self,
        inner: &Arc<StreamInner>,
        scalars: S,
        hash: u64,
        epoch: u64,
    ) -> Result<()> {
        let Some(executor) = self.executor.take() else {
            return Err(Error::internal("a prepared call's executor was launched twice"));
        };
        let raw = executor.into_raw();
        let result = self.enqueue(inner, None, |launch, ws, size| {
            // SAFETY: as in `launch_on`, but the executor is repeatable: phase 2 does not consume
            // it, and it goes to the cache of this stream, the only one it is launched on.
            unsafe { launch(ws, size, raw, inner.raw()) }
        });
        let descriptors: [*mut aclTensor; MAX_ARGS] = self.handles;
        self.descriptors.list.into_iter().flatten().for_each(|d| {
            d.into_raw(); // owned by the entry from now on (the same handles as `descriptors`)
        });
        let (call, n) = (&self.call, self.call.len);
        let mut keys = [None; MAX_ARGS];
        let sig = call.signature(&mut keys, self.op, scalars);
        // SAFETY: `raw` is the live repeatable executor of phase 1 of `sig.op` over these live
        // descriptors (null where absent), in `sig`'s order; nothing else uses them from here.
        let entry = unsafe {
            Entry::new(
                self.descriptors.device.clone(),
                &sig,
                &descriptors[..n],
                &call.buffers[..n],
                raw,
                self.workspace_size,
                self.launch,
                epoch,
            )
        };
        match result {
            Ok(()) => inner.launches.insert(inner, hash, entry),
            Err(_) => inner.launches.retire(inner, [entry]),
        }
        result
    }

    /// Enqueues `phase2(launch, workspace, size)` on `inner` through [`enqueue_using`] with every
    /// buffer of the call (and the caller's workspace), and checks its status.
    fn enqueue(
        &self,
        inner: &Arc<StreamInner>,
        workspace: Option<&Workspace>,
        phase2: impl FnOnce(Phase2, *mut c_void, u64) -> i32,
    ) -> Result<()> {
        let device = &self.descriptors.device;
        let size = self.workspace_size;
        // CANN's rule: the workspace is null exactly when its size is 0, whatever the caller gave.
        let caller_workspace = match workspace {
            Some(ws) if size > 0 => Some(ws.buffer_for(size, device)?),
            _ => None,
        };
        let buffers = self.descriptors.iter().map(AclTensor::buffer).chain(caller_workspace);
        let (cann, op, launch) = (device.cann, self.op, self.launch);
        let run = move |ws: *mut c_void| {
            device.bind()?;
            crate::acl::check(cann, op.name, phase2(launch, ws, size))
        };
        enqueue_using(inner, buffers, |state| match caller_workspace {
            Some(b) => run(b.ptr()),
            None if size == 0 => run(std::ptr::null_mut()),
            None => inner.with_workspace(&mut state.workspace, size, run),
        })
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

/// Writes zeros to every element of a device view of rank 1 (`l` in `buffer`; aclrtMemset, after
/// the streams that used the buffer have finished).
fn zero_device_view(l: &Layout<'_>, buffer: &DeviceBuffer) -> Result<()> {
    let (Some(&n), Some(&stride)) = (l.shape.first(), l.strides.first()) else {
        return Err(Error::internal("a view of rank 0 was to be zeroed as a vector"));
    };
    buffer.synchronize()?;
    let device = buffer.device();
    device.bind()?;
    let es = l.dtype.size_in_bytes();
    let base = buffer.ptr().cast::<u8>();
    // One run of n elements (contiguous), or n runs of one element each `stride` apart: walked
    // without a table, whose length would be the caller's channel count.
    let (count, len, step) = if stride == 1 || n <= 1 { (1, n, 0) } else { (n, 1, stride) };
    for start in (0..count).map(|i| l.offset + i * step) {
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
