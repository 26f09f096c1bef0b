//! DLPack: [`Tensor::to_dlpack`] and [`Tensor::from_dlpack`] exchange tensors with torch_npu,
//! MindSpore and CPU frameworks through the ABI of `dlpack.h` ([`ascend_sys::dlpack`]).
//!
//! * **Ascend memory is shared, never copied.** An exported capsule keeps the tensor's device
//!   buffer alive (it returns to the allocator after the consumer's deleter, in stream order); an
//!   imported one becomes a tensor over the producer's memory whose deleter runs once the last
//!   tensor over it is dropped and every stream that used it has passed that use. Dropping it
//!   never waits: an event is recorded on each such stream and the capsule parked with them in
//!   the device's event pool, which calls the deleter once they are seen complete
//!   (`aclrtQueryEventStatus`), at the next allocation, stream synchronise or such drop of the
//!   device, whichever thread makes it; at the latest at the context's teardown (which waits). DLPack's `dlpack.h` says nothing about the thread a deleter runs on: the importer
//!   promises it may run on any (torch's deletes its `ATenDLMTensor`, which any thread may do).
//!   It never runs inside a synchronise the crate makes for itself (under its locks), so it may
//!   itself drop, read or synchronise tensors and streams of the context (see `device::event`
//!   for the one allocation that still polls under a stream's lock).
//! * **The CPU backend copies.** Its tensors own their host memory alone, so an exported capsule
//!   holds a copy (flagged `DLPACK_FLAG_BITMASK_IS_COPIED`) and an imported one is copied, its
//!   deleter called at once.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use ascend_sys::dlpack::{
    self as dl, DLDataType, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
    DLPACK_FLAG_BITMASK_IS_COPIED, DLPACK_FLAG_BITMASK_READ_ONLY,
};

use crate::device::{enqueue_using, DeviceBuffer};
use crate::dtype::{bf16, f16, DType, Element};
use crate::error::{Error, Result};
use crate::layout;
use crate::stream::Stream;
use crate::tensor::{DeviceStorage, Storage, Tensor, TENSOR_DATA_ALIGN};

/// The DLPack device type an exported Ascend tensor is labelled with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DlDevice {
    /// `kDLExtDev` (12): what torch_npu exports and imports NPU tensors as today.
    #[default]
    ExtDev,
    /// `kDLAscend` (21): DLPack's own Ascend device type (its main branch, not yet released).
    Ascend,
}

impl DlDevice {
    fn device_type(self) -> dl::DLDeviceType {
        match self {
            DlDevice::ExtDev => dl::kDLExtDev,
            DlDevice::Ascend => dl::kDLAscend,
        }
    }
}

/// What an exported capsule keeps alive: the tensor's device buffer, or (CPU backend) a host
/// copy of its elements.
enum Keep {
    Device(Arc<DeviceBuffer>),
    Host(#[allow(dead_code)] Box<dyn Send + Sync>),
}

/// A capsule made here: the DLPack struct `H` first (so a pointer to it is a pointer to the
/// capsule), then what its pointers point into.
#[repr(C)]
struct Capsule<H> {
    head: H,
    // Vecs, not boxes: moving them keeps the raw pointers into their elements valid.
    shape: Vec<i64>,
    strides: Vec<i64>,
    keep: Keep,
}

/// The two managed-tensor structs of DLPack, as this module reads and makes them.
trait Head: Sized + 'static {
    /// The deleter of the capsules made here.
    const OWN_DELETER: unsafe extern "C" fn(*mut Self);
    fn new(dl_tensor: DLTensor, flags: u64) -> Self;
    fn dl_tensor(&self) -> &DLTensor;
    fn manager_ctx(&self) -> *mut c_void;
    fn set_manager_ctx(&mut self, ctx: *mut c_void);
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)>;
}

/// The [`Head`] impl of one managed-tensor struct (both have `dl_tensor`, `manager_ctx` and
/// `deleter` fields), with how a capsule made here fills it.
macro_rules! head {
    ($t:ident, |$dl_tensor:ident, $flags:ident| $new:expr) => {
        impl Head for $t {
            const OWN_DELETER: unsafe extern "C" fn(*mut Self) = delete::<Self>;
            fn new($dl_tensor: DLTensor, $flags: u64) -> Self {
                $new
            }
            fn dl_tensor(&self) -> &DLTensor {
                &self.dl_tensor
            }
            fn manager_ctx(&self) -> *mut c_void {
                self.manager_ctx
            }
            fn set_manager_ctx(&mut self, ctx: *mut c_void) {
                self.manager_ctx = ctx;
            }
            fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
                self.deleter
            }
        }
    };
}

head!(DLManagedTensorVersioned, |dl_tensor, flags| DLManagedTensorVersioned {
    version: DLPackVersion { major: dl::DLPACK_MAJOR_VERSION, minor: dl::DLPACK_MINOR_VERSION },
    manager_ctx: std::ptr::null_mut(),
    deleter: Some(Self::OWN_DELETER),
    flags,
    dl_tensor,
});
head!(DLManagedTensor, |dl_tensor, _flags| DLManagedTensor {
    dl_tensor,
    manager_ctx: std::ptr::null_mut(),
    deleter: Some(Self::OWN_DELETER),
});

/// The deleter of the capsules made here: frees the capsule and what it keeps (a device buffer
/// goes back to the allocator after the work of the streams that used it, without waiting).
/// Callable from any thread.
///
/// # Safety
/// `p` is null or a capsule made by [`Capsule::boxed`] with head `H`, not yet deleted.
unsafe extern "C" fn delete<H: Head>(p: *mut H) {
    if !p.is_null() {
        // SAFETY: the caller's guarantee: `p` came from `Box::into_raw` of a `Capsule<H>`, whose
        // first field (repr(C)) is the `H` it points to.
        drop(unsafe { Box::from_raw(p.cast::<Capsule<H>>()) });
    }
}

impl<H: Head> Capsule<H> {
    /// The capsule on the heap, its `manager_ctx` pointing at itself.
    fn boxed(mut dl_tensor: DLTensor, flags: u64, mut shape: Vec<i64>, mut strides: Vec<i64>, keep: Keep) -> Box<Self> {
        // The vectors' elements do not move with them.
        dl_tensor.shape = shape.as_mut_ptr();
        dl_tensor.strides = strides.as_mut_ptr();
        let mut capsule = Box::new(Capsule { head: H::new(dl_tensor, flags), shape, strides, keep });
        let ctx = std::ptr::from_mut(&mut *capsule).cast::<c_void>();
        capsule.head.set_manager_ctx(ctx);
        capsule
    }

    /// Whether `head` heads a capsule made here (its deleter and context are this module's).
    fn is_own(p: *mut H, head: &H) -> bool {
        head.deleter().map(|f| f as usize) == Some(H::OWN_DELETER as usize) && head.manager_ctx() == p.cast()
    }
}

/// An owned DLPack tensor (`DLManagedTensorVersioned`, DLPack 1.x) made by
/// [`Tensor::to_dlpack`]. Hand it to a consumer with [`into_raw`](Self::into_raw) (or
/// [`into_raw_legacy`](Self::into_raw_legacy) for pre-1.0 consumers); dropping it instead calls
/// its own deleter. `Send + Sync`: its deleter may run on any thread.
pub struct DlPack(Box<Capsule<DLManagedTensorVersioned>>);

// SAFETY: the raw pointers of the capsule point into the capsule's own boxes and into the memory
// it keeps, which is `Send + Sync` (a device buffer, or a host copy); nothing is tied to a thread.
unsafe impl Send for DlPack {}
// SAFETY: `&DlPack` only reads the capsule's fields.
unsafe impl Sync for DlPack {}

impl DlPack {
    /// The described tensor: data address, device, dtype, shape, strides (in elements) and byte
    /// offset.
    pub fn dl_tensor(&self) -> &DLTensor {
        &self.0.head.dl_tensor
    }

    /// The `DLPACK_FLAG_BITMASK_*` flags: `IS_COPIED` on the CPU backend, else 0.
    pub fn flags(&self) -> u64 {
        self.0.head.flags
    }

    /// A `DLManagedTensorVersioned*`: the consumer owns it and calls its deleter (once, from any
    /// thread) when done with the memory. A Rust consumer: [`Tensor::from_dlpack`].
    pub fn into_raw(self) -> *mut c_void {
        Box::into_raw(self.0).cast()
    }

    /// The same tensor as a legacy `DLManagedTensor*` (DLPack before 1.0: no version, no flags),
    /// for consumers that take only that form. The consumer owns it and calls its deleter.
    pub fn into_raw_legacy(self) -> *mut c_void {
        let Capsule { head, shape, strides, keep } = *self.0;
        let legacy = Capsule::<DLManagedTensor>::boxed(head.dl_tensor, 0, shape, strides, keep);
        Box::into_raw(legacy).cast()
    }
}

impl std::fmt::Debug for DlPack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.dl_tensor();
        f.debug_struct("DlPack")
            .field("device", &t.device)
            .field("dtype", &t.dtype)
            .field("shape", &&*self.0.shape)
            .field("strides", &&*self.0.strides)
            .field("byte_offset", &t.byte_offset)
            .field("flags", &self.flags())
            .finish()
    }
}

/// A producer's capsule a tensor was made over: its deleter runs when this is dropped (for device
/// memory: after every stream that used the memory has finished).
struct Producer<H: Head>(NonNull<H>);

// SAFETY: `from_dlpack`'s caller guarantees that the capsule's deleter may be called from any
// thread; nothing else of the capsule is touched after the import.
unsafe impl<H: Head> Send for Producer<H> {}
// SAFETY: a `&Producer` gives access to nothing.
unsafe impl<H: Head> Sync for Producer<H> {}

impl<H: Head> Drop for Producer<H> {
    fn drop(&mut self) {
        let p = self.0.as_ptr();
        // SAFETY: the capsule is live until its deleter runs, which happens only here, once.
        if let Some(deleter) = unsafe { (*p).deleter() } {
            // SAFETY: the producer's deleter, called once on its own capsule, as DLPack prescribes.
            unsafe { deleter(p) };
        }
    }
}

/// The DLPack dtype of `dtype`.
fn dl_dtype(dtype: DType) -> DLDataType {
    let (code, bits) = match dtype {
        DType::F32 => (dl::kDLFloat, 32),
        DType::F16 => (dl::kDLFloat, 16),
        DType::BF16 => (dl::kDLBfloat, 16),
        DType::I32 => (dl::kDLInt, 32),
    };
    DLDataType { code, bits, lanes: 1 }
}

/// The dtype a DLPack dtype names, or an error naming `dtype`.
fn dtype_of(t: DLDataType) -> Result<DType> {
    let DLDataType { code, bits, lanes } = t;
    if lanes != 1 {
        return Err(Error::invalid("dtype", format!("expected 1 lane (scalar elements), got {lanes} lanes")));
    }
    match (code, bits) {
        (dl::kDLFloat, 32) => Ok(DType::F32),
        (dl::kDLFloat, 16) => Ok(DType::F16),
        (dl::kDLBfloat, 16) => Ok(DType::BF16),
        (dl::kDLInt, 32) => Ok(DType::I32),
        _ => Err(Error::invalid(
            "dtype",
            format!(
                "expected float32, float16, bfloat16 or int32 (code {}/{}/{}/{} with bits 32/16/16/32), got code {code} \
                 with {bits} bits",
                dl::kDLFloat,
                dl::kDLFloat,
                dl::kDLBfloat,
                dl::kDLInt
            ),
        )),
    }
}

/// A DLPack tensor's layout, checked: the view starts `offset` elements after `data`.
struct Parsed {
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<usize>,
    data: *mut c_void,
    offset: usize,
    /// Elements from `data` to one past the view's last element (`offset` for an empty view).
    extent: usize,
}

/// Reads and checks a producer's tensor (not its device): rank, dtype, shape, strides, byte
/// offset, data address and alignment, and that its extent is addressable.
///
/// # Safety
/// `shape` and `strides` (unless null) point to `ndim` values each, as DLPack requires.
unsafe fn parse(t: &DLTensor) -> Result<Parsed> {
    let rank = usize::try_from(t.ndim).ok().filter(|&r| r <= layout::MAX_RANK).ok_or_else(|| {
        Error::invalid("ndim", format!("expected 0..={} dimensions, got {}", layout::MAX_RANK, t.ndim))
    })?;
    let dtype = dtype_of(t.dtype)?;
    let size = dtype.size_in_bytes();
    let read = |p: *mut i64, field: &'static str| -> Result<Option<Vec<usize>>> {
        if p.is_null() || rank == 0 {
            return Ok(None);
        }
        // SAFETY: the caller's guarantee: `rank` values at `p`.
        let values = unsafe { std::slice::from_raw_parts(p, rank) };
        values
            .iter()
            .map(|&v| usize::try_from(v).map_err(|_| v))
            .collect::<std::result::Result<Vec<_>, i64>>()
            .map(Some)
            .map_err(|v| {
                Error::invalid(field, format!("expected values >= 0, got {v} in {values:?} (copy the tensor first)"))
            })
    };
    let shape = match read(t.shape, "shape")? {
        Some(s) => s,
        None if rank == 0 => Vec::new(),
        None => return Err(Error::null("shape", format!("null shape for {rank} dimensions"))),
    };
    let strides = read(t.strides, "strides")?.unwrap_or_else(|| layout::contiguous_strides(&shape));
    let offset =
        usize::try_from(t.byte_offset).ok().filter(|b| b.is_multiple_of(size)).map(|b| b / size).ok_or_else(|| {
            Error::invalid(
                "byte_offset",
                format!("expected a multiple of {size} bytes ({dtype}), got {}", t.byte_offset),
            )
        })?;
    let n = layout::numel(&shape).ok_or_else(|| Error::invalid("shape", format!("{shape:?} overflows usize")))?;
    let extent = if n == 0 {
        Some(offset)
    } else {
        shape.iter().zip(&strides).try_fold(offset, |last, (&d, &s)| (d - 1).checked_mul(s)?.checked_add(last))
    }
    .and_then(|last| last.checked_add(usize::from(n > 0)))
    .filter(|e| e.checked_mul(size).is_some_and(|b| b <= isize::MAX as usize))
    .ok_or_else(|| {
        Error::invalid(
            "strides",
            format!("shape {shape:?} with strides {strides:?} and offset {offset} reach beyond the address space"),
        )
    })?;
    layout::check_view(&shape, &strides, offset, extent).map_err(|m| Error::invalid("strides", m))?;
    if n > 0 && t.data.is_null() {
        return Err(Error::null("data", format!("null data for shape {shape:?}")));
    }
    if !(t.data as usize).is_multiple_of(size) {
        return Err(Error::invalid("data", format!("{:p} is not aligned to {size} bytes ({dtype})", t.data)));
    }
    Ok(Parsed { dtype, shape, strides, data: t.data, offset, extent })
}

/// Checks the producer's device against `stream`'s: Ascend memory (`kDLExtDev`, `kDLAscend`) of
/// the stream's device, or host memory (`kDLCPU`) on the CPU backend.
fn check_device(stream: &Stream, device: dl::DLDevice) -> Result<()> {
    let dl::DLDevice { device_type, device_id } = device;
    let ascend = matches!(device_type, dl::kDLExtDev | dl::kDLAscend);
    match stream.ascend() {
        Some((_, d)) if ascend && device_id == d.id => Ok(()),
        Some((_, d)) if ascend => Err(Error::invalid(
            "device_id",
            format!("the tensor is on Ascend device {device_id}, but the stream is on Ascend device {}", d.id),
        )),
        None if device_type == dl::kDLCPU && device_id == 0 => Ok(()),
        None if device_type == dl::kDLCPU => {
            Err(Error::invalid("device_id", format!("expected 0 for host memory (kDLCPU), got {device_id}")))
        }
        _ if ascend || device_type == dl::kDLCPU => Err(stream.mismatch(
            "device_type",
            &format!("the tensor is {}", if ascend { "in Ascend memory" } else { "in host memory (kDLCPU)" }),
        )),
        _ => Err(Error::invalid(
            "device_type",
            format!(
                "expected Ascend memory (kDLExtDev {}, kDLAscend {}) or host memory (kDLCPU {}), got {device_type}",
                dl::kDLExtDev,
                dl::kDLAscend,
                dl::kDLCPU
            ),
        )),
    }
}

impl Tensor {
    /// This tensor as a DLPack tensor over the same memory (no copy): `kDLExtDev` with the device
    /// id on Ascend (what torch_npu reads), `kDLCPU` on the CPU backend; the dtype, shape and
    /// strides (in elements) of the view, `data` at its first element and `byte_offset` 0 (as
    /// PyTorch and torch_npu export: torch_npu's importer ignores `byte_offset`). See
    /// [`to_dlpack_as`](Self::to_dlpack_as).
    pub fn to_dlpack(&self, stream: &Stream) -> Result<DlPack> {
        self.to_dlpack_as(stream, DlDevice::ExtDev)
    }

    /// [`to_dlpack`](Self::to_dlpack) with the device type of Ascend memory chosen: `kDLExtDev`
    /// (12) or `kDLAscend` (21). The CPU backend always exports `kDLCPU` (1).
    ///
    /// **The stream contract** (that of DLPack's `__dlpack__(stream=)`, with `stream` as the
    /// consumer's stream): work this crate queued on the tensor, on any stream, is ordered before
    /// work queued on `stream` from now on (an event on the device, no host wait), and `stream`
    /// is recorded as a user of the memory. The consumer uses the memory on `stream` (its handle
    /// is [`Stream::as_raw`]), or after synchronising it; when it calls the deleter, the memory
    /// goes back to the allocator after the work queued on `stream` by then, so work it queued
    /// on other streams must have completed before it calls the deleter. This tensor stays
    /// usable: the two sides share the memory and must not write it at the same time.
    ///
    /// On the CPU backend, whose tensors own their host memory alone, the capsule holds a
    /// compact copy of the view (flagged `DLPACK_FLAG_BITMASK_IS_COPIED`). Errors: a stream of
    /// another device or backend.
    pub fn to_dlpack_as(&self, stream: &Stream, device: DlDevice) -> Result<DlPack> {
        self.check_stream(stream, "stream")?;
        let dims = |v: &[usize]| {
            v.iter().map(|&d| i64::try_from(d)).collect::<std::result::Result<Vec<i64>, _>>().map_err(|_| {
                Error::invalid("tensor", format!("shape {:?} or strides {v:?} exceed int64", self.shape()))
            })
        };
        let shape = dims(self.shape())?;
        let dtype = dl_dtype(self.dtype());
        let (data, dl_device, strides, byte_offset, flags, keep) = match (&self.storage, stream.ascend()) {
            (Storage::Device(d), Some((inner, dev))) => {
                // Orders the tensor's pending work before `stream` and records `stream` on it.
                enqueue_using(inner, [&*d.buffer], |_| Ok(()))?;
                let device = dl::DLDevice { device_type: device.device_type(), device_id: dev.id };
                let first = d.buffer.ptr().cast::<u8>().wrapping_add(self.offset() * self.dtype().size_in_bytes());
                (first.cast(), device, dims(self.strides())?, 0, 0, Keep::Device(d.buffer.clone()))
            }
            _ => {
                let (data, copy) = match self.dtype() {
                    DType::F32 => host_copy::<f32>(self, stream)?,
                    DType::F16 => host_copy::<f16>(self, stream)?,
                    DType::BF16 => host_copy::<bf16>(self, stream)?,
                    DType::I32 => host_copy::<i32>(self, stream)?,
                };
                let strides = dims(&layout::contiguous_strides(self.shape()))?;
                let device = dl::DLDevice { device_type: dl::kDLCPU, device_id: 0 };
                (data, device, strides, 0, DLPACK_FLAG_BITMASK_IS_COPIED, Keep::Host(copy))
            }
        };
        let dl_tensor = DLTensor {
            data,
            device: dl_device,
            ndim: shape.len() as i32,
            dtype,
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            byte_offset,
        };
        Ok(DlPack(Capsule::boxed(dl_tensor, flags, shape, strides, keep)))
    }

    /// A tensor over a producer's DLPack tensor (a `DLManagedTensorVersioned*`, DLPack 1.x),
    /// taking ownership of it: Ascend memory (`kDLExtDev` or `kDLAscend`, of the stream's device)
    /// is used in place, no copy; on the CPU backend host memory (`kDLCPU`) is copied.
    ///
    /// The producer's deleter is called exactly once: for Ascend memory once the last tensor
    /// over it is dropped and the work queued on it has run (never while queued work still reads
    /// it; the drop does not wait: an event is recorded on every stream that used the memory and
    /// the deleter runs when a later allocation, stream synchronise or such drop of the device
    /// sees them complete, or at the context's teardown; a stream on which no event can be
    /// recorded is synchronised instead, and if that fails the capsule is leaked); for host memory
    /// right after the copy. A capsule made by [`Tensor::to_dlpack`] gives back its tensor's
    /// buffer (tracked as before: dropping the tensor waits for nothing).
    ///
    /// Refused, with an error naming the field, before anything is taken (the caller still owns
    /// the capsule; its deleter has not been called): a null pointer; a major `version` other
    /// than 1; the read-only flag (this crate's operators write their outputs in place, so it
    /// has no read-only tensors); another device type or device id (`device_type`,
    /// `device_id`); a dtype other than float32, float16, bfloat16 or int32, or lanes other than
    /// 1 (`dtype`); more than 8 dimensions (`ndim`); negative extents or strides (`shape`,
    /// `strides`); strides or an offset reaching beyond the address space, or for a capsule made
    /// here beyond its buffer (`strides`); a `byte_offset` not a multiple of the element size;
    /// null or misaligned `data` (it must be aligned to the element size; CANN's 32-byte rule is
    /// met by addressing the memory from the 32-byte boundary below `data`, inside the same
    /// allocation since device allocations are 32-byte aligned).
    ///
    /// # Safety
    /// `raw` is null or a live `DLManagedTensorVersioned` (its shape and strides readable) that
    /// the caller owns and hands over on success. Its memory is as described (`data` plus the
    /// view's extent is allocated on that device) and stays allocated until the deleter runs;
    /// the producer's writes to it are ordered before work queued on `stream` (e.g. torch's
    /// `__dlpack__(stream=...)` with this stream's handle, or a synchronise), and it does not
    /// access the memory while this crate's work on it may run (the two sides share it). The
    /// deleter may be called from any thread.
    pub unsafe fn from_dlpack(stream: &Stream, raw: *mut c_void) -> Result<Tensor> {
        let p = raw.cast::<DLManagedTensorVersioned>();
        let Some(p) = NonNull::new(p) else {
            return Err(Error::null("raw", "a null DLManagedTensorVersioned pointer"));
        };
        // SAFETY: a live capsule (the caller's guarantee).
        let head = unsafe { p.as_ref() };
        if head.version.major != dl::DLPACK_MAJOR_VERSION {
            return Err(Error::invalid(
                "version",
                format!(
                    "expected DLPack {}.x, got {}.{} (its layout differs: call its deleter)",
                    dl::DLPACK_MAJOR_VERSION,
                    head.version.major,
                    head.version.minor
                ),
            ));
        }
        if head.flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0 {
            return Err(Error::invalid(
                "flags",
                "the tensor is read-only (DLPACK_FLAG_BITMASK_READ_ONLY), and this crate's tensors are writable: \
                 export a copy",
            ));
        }
        // SAFETY: the caller's guarantees, passed on.
        unsafe { import(stream, p) }
    }

    /// [`from_dlpack`](Self::from_dlpack) for a legacy `DLManagedTensor*` (DLPack before 1.0,
    /// e.g. `torch.utils.dlpack.to_dlpack`): the same checks (it has no version and no flags)
    /// and the same ownership rules.
    ///
    /// # Safety
    /// As [`from_dlpack`](Self::from_dlpack), for a live `DLManagedTensor`.
    pub unsafe fn from_dlpack_legacy(stream: &Stream, raw: *mut c_void) -> Result<Tensor> {
        let Some(p) = NonNull::new(raw.cast::<DLManagedTensor>()) else {
            return Err(Error::null("raw", "a null DLManagedTensor pointer"));
        };
        // SAFETY: the caller's guarantees, passed on.
        unsafe { import(stream, p) }
    }
}

/// A compact host copy of a CPU tensor's view, as a DLPack data pointer and its owner.
fn host_copy<T: Element>(t: &Tensor, stream: &Stream) -> Result<(*mut c_void, Box<dyn Send + Sync>)> {
    let mut copy = t.to_vec::<T>(stream)?;
    // The vector's elements do not move with it; an empty one has a dangling, aligned (non-null)
    // address, which DLPack allows for an empty tensor.
    let data = copy.as_mut_ptr().cast::<c_void>();
    Ok((data, Box::new(copy)))
}

/// [`Tensor::from_dlpack`]'s checks past the header, and the import.
///
/// # Safety
/// As [`Tensor::from_dlpack`].
unsafe fn import<H: Head>(stream: &Stream, p: NonNull<H>) -> Result<Tensor> {
    // SAFETY: `p` is a live capsule (the caller's guarantee).
    let head = unsafe { p.as_ref() };
    let t = head.dl_tensor();
    check_device(stream, t.device)?;
    // SAFETY: DLPack's rule (the caller's guarantee): `ndim` shape and stride values.
    let v = unsafe { parse(t) }?;
    let size = v.dtype.size_in_bytes();
    let take = || Producer(p);
    let Some((inner, device)) = stream.ascend() else {
        let tensor = match v.dtype {
            // SAFETY: host memory of the described extent (the caller's guarantee).
            DType::F32 => unsafe { host_import::<f32>(stream, &v) },
            // SAFETY: as above.
            DType::F16 => unsafe { host_import::<f16>(stream, &v) },
            // SAFETY: as above.
            DType::BF16 => unsafe { host_import::<bf16>(stream, &v) },
            // SAFETY: as above.
            DType::I32 => unsafe { host_import::<i32>(stream, &v) },
        }?;
        drop(take()); // copied: the producer's memory is no longer used
        return Ok(tensor);
    };
    if Capsule::<H>::is_own(p.as_ptr(), head) {
        let capsule = p.cast::<Capsule<H>>();
        // SAFETY: made by `Capsule::boxed` (its deleter and context are this module's).
        if let Keep::Device(buffer) = unsafe { &capsule.as_ref().keep } {
            // `data` is the view's first element (or, if a consumer moved it, any element).
            let lead = (v.data as usize).wrapping_sub(buffer.ptr() as usize);
            if !buffer.device().same(device) || lead > buffer.bytes() || !lead.is_multiple_of(size) {
                return Err(Error::invalid("data", "the capsule's data is not in its own buffer on this device"));
            }
            let (storage_len, offset) = (buffer.bytes() / size, v.offset + lead / size);
            layout::check_view(&v.shape, &v.strides, offset, storage_len).map_err(|m| Error::invalid("strides", m))?;
            // Taken (the caller hands the capsule over): its buffer moves into the tensor, and
            // the rest is freed here instead of by its deleter (which would drop the same box).
            let buffer = buffer.clone();
            // SAFETY: as above; the capsule is freed once, here.
            drop(unsafe { Box::from_raw(capsule.as_ptr()) });
            return Ok(Tensor::with_layout(
                v.dtype,
                v.shape,
                v.strides,
                offset,
                storage_len,
                Storage::Device(DeviceStorage { buffer }),
            ));
        }
    }
    if v.extent == v.offset {
        // Nothing to address (an empty view): an empty tensor of this shape, the capsule let go.
        let tensor = Tensor::zeros(stream, v.dtype, &v.shape)?;
        drop(take());
        return Ok(tensor);
    }
    // CANN wants tensor data 32-byte aligned: address the memory from the boundary below `data`
    // (inside the same allocation, which starts on such a boundary), the rest as an offset.
    let lead = (v.data as usize) % TENSOR_DATA_ALIGN;
    let base = v.data.cast::<u8>().wrapping_sub(lead).cast::<c_void>();
    let (offset, storage_len) = (v.offset + lead / size, v.extent + lead / size);
    let owner: Box<dyn Send + Sync> = Box::new(take());
    // SAFETY: the caller's guarantee: the extent at `data` is allocated on this device (checked
    // above: the stream's) until the deleter runs, which `owner` calls only after the buffer's
    // streams have passed their use of it, on any thread (the caller's guarantee too); the `lead`
    // bytes before `data` are in the same allocation. The producer's writes are ordered before
    // work queued on `stream` (the caller's guarantee): it is the buffer's first user.
    let buffer = unsafe { DeviceBuffer::foreign_owned(inner, base, storage_len * size, owner) };
    Ok(Tensor::with_layout(
        v.dtype,
        v.shape,
        v.strides,
        offset,
        storage_len,
        Storage::Device(DeviceStorage { buffer: Arc::new(buffer) }),
    ))
}

/// A CPU tensor holding a copy of the producer's host view `v` (offset dropped).
///
/// # Safety
/// `v.extent` elements of `T` at `v.data` are readable.
unsafe fn host_import<T: Element>(stream: &Stream, v: &Parsed) -> Result<Tensor> {
    let span = v.extent - v.offset;
    let storage: &[T] = if span == 0 {
        &[]
    } else {
        // SAFETY: the caller's guarantee; `parse` checked `data` non-null and aligned for `T`,
        // and every f32/f16/bf16/i32 bit pattern is a value.
        unsafe { std::slice::from_raw_parts(v.data.cast::<T>().add(v.offset), span) }
    };
    Tensor::from_slice_strided(stream, storage, &v.shape, &v.strides, 0)
}
