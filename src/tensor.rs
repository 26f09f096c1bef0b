//! [`Tensor`]: a strided view over host memory (CPU backend) or device memory (Ascend).

use std::sync::Arc;

use crate::context::ContextKind;
use crate::cpu::memory::{HostBlock, HostMemory};
use crate::cpu::{View, ViewMut};
use crate::device::{Device, DeviceBuffer, STAGING_MAX};
use crate::dtype::{bf16, f16, DType, Element, SliceMut, SliceRef};
use crate::error::{Error, Result};
use crate::layout;
use crate::stream::{describe, Stream};

/// Typed host storage: `len` elements of `dtype` in a block of a context's host memory
/// ([`HostMemory`]: cached and reused like device memory). Every element is initialised (zeros,
/// written values, or an earlier tensor's values in a reused block: see [`crate::cpu::memory`]).
#[derive(Debug)]
pub(crate) struct HostData {
    dtype: DType,
    len: usize,
    block: HostBlock,
}

impl HostData {
    /// `n` elements of `dtype` from `memory`: zeros with `zeroed`, else whatever the block holds
    /// (for outputs a kernel writes whole before anything reads them).
    fn new(memory: &Arc<HostMemory>, dtype: DType, n: usize, zeroed: bool) -> Result<Self> {
        let bytes = n
            .checked_mul(dtype.size_in_bytes())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or(Error::HostAlloc { bytes: usize::MAX })?;
        Ok(HostData { dtype, len: n, block: memory.alloc(bytes, zeroed)? })
    }

    fn from_slice<T: Element>(memory: &Arc<HostMemory>, data: &[T]) -> Result<Self> {
        // T's own dtype: a byte copy (no conversion, NaN payloads kept).
        let mut h = Self::new(memory, T::DTYPE, data.len(), false)?;
        host_bytes_mut(&mut h).copy_from_slice(as_bytes(data));
        Ok(h)
    }

    /// A copy in a new block of the same memory.
    fn try_clone(&self) -> Result<Self> {
        let mut h = match self.block.memory() {
            Some(m) => Self::new(m, self.dtype, self.len, false)?,
            None => return Ok(HostData { dtype: self.dtype, len: 0, block: HostBlock::empty() }),
        };
        host_bytes_mut(&mut h).copy_from_slice(self.bytes());
        Ok(h)
    }

    /// The number of elements.
    fn len(&self) -> usize {
        self.len
    }

    /// The storage as a typed slice.
    pub(crate) fn as_slice_ref(&self) -> SliceRef<'_> {
        let (b, n) = (&self.block, self.len);
        match self.dtype {
            DType::F32 => SliceRef::F32(b.as_slice(n)),
            DType::F16 => SliceRef::F16(b.as_slice(n)),
            DType::BF16 => SliceRef::BF16(b.as_slice(n)),
            DType::I32 => SliceRef::I32(b.as_slice(n)),
        }
    }

    /// The storage as a mutable typed slice.
    pub(crate) fn as_slice_mut(&mut self) -> SliceMut<'_> {
        let (b, n) = (&mut self.block, self.len);
        match self.dtype {
            DType::F32 => SliceMut::F32(b.as_mut_slice(n)),
            DType::F16 => SliceMut::F16(b.as_mut_slice(n)),
            DType::BF16 => SliceMut::BF16(b.as_mut_slice(n)),
            DType::I32 => SliceMut::I32(b.as_mut_slice(n)),
        }
    }

    /// The raw little-endian bytes, for copying to the device.
    fn bytes(&self) -> &[u8] {
        self.block.as_slice(self.len * self.dtype.size_in_bytes())
    }
}

fn as_bytes<T: Element>(v: &[T]) -> &[u8] {
    // SAFETY: f32, f16, bf16 and i32 are plain-old-data without padding; the byte slice covers exactly
    // the same memory and borrows it for the same lifetime.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

#[derive(Debug)]
pub(crate) enum Storage {
    Host(HostData),
    Device(DeviceStorage),
}

pub(crate) struct DeviceStorage {
    /// Shared by the views of one buffer the crate makes internally ([`Tensor::view`]).
    pub(crate) buffer: Arc<DeviceBuffer>,
}

impl std::fmt::Debug for DeviceStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceStorage")
            .field("device", &self.buffer.device().id)
            .field("bytes", &self.buffer.bytes())
            .finish()
    }
}

/// A strided view of `f32`, [`struct@f16`], [`struct@bf16`] or `i32` elements (see [`DType`]) over
/// storage it owns: host memory on the CPU backend, device memory (`aclrtMalloc`) on Ascend.
/// Shapes, strides and offsets count elements. `Send + Sync`.
///
/// Device memory comes from the context's stream-ordered caching allocator and goes back to it
/// only after every stream that enqueued work on it has passed that work (events, no host wait),
/// so a tensor may be dropped right after a launch.
#[derive(Debug)]
pub struct Tensor {
    dtype: DType,
    shape: layout::Dims,
    strides: layout::Dims,
    offset: usize,
    storage_len: usize,
    /// A hash of the five fields above (they never change): the launch cache's key is made of them.
    layout_hash: u64,
    /// Unique per construction in the process (never 0): equal ids mean equal layouts, so the
    /// launch cache compares a tensor it matched before by this word alone.
    layout_id: u64,
    pub(crate) storage: Storage,
}

/// The alignment CANN requires of an `aclTensor`'s data address (`aclCreateTensor`,
/// `aclSet{Input,Output}TensorAddr`).
pub(crate) const TENSOR_DATA_ALIGN: usize = 32;

impl Tensor {
    /// A tensor over `storage` with this layout (checked by the caller).
    pub(crate) fn with_layout(
        dtype: DType,
        shape: impl Into<layout::Dims>,
        strides: impl Into<layout::Dims>,
        offset: usize,
        storage_len: usize,
        storage: Storage,
    ) -> Tensor {
        let (shape, strides) = (shape.into(), strides.into());
        let layout_hash =
            layout::hash(&crate::layout::Layout { dtype, shape: &shape, strides: &strides, offset, storage_len });
        static NEXT_LAYOUT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let layout_id = NEXT_LAYOUT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Tensor { dtype, shape, strides, offset, storage_len, layout_hash, layout_id, storage }
    }

    /// A hash of the dtype, shape, strides, offset and storage length (computed once).
    pub(crate) fn layout_hash(&self) -> u64 {
        self.layout_hash
    }

    /// This tensor's layout id: unique per construction, so equal ids mean equal layouts.
    pub(crate) fn layout_id(&self) -> u64 {
        self.layout_id
    }

    /// A contiguous (row-major) tensor of `shape` holding a copy of `data` (on Ascend: memory no
    /// queued work uses, and the blocking `aclrtMemcpy`, so the data is on the device when this
    /// returns).
    pub fn from_slice<T: Element>(stream: &Stream, data: &[T], shape: &[usize]) -> Result<Tensor> {
        let n = layout::numel(shape).ok_or_else(|| Error::invalid("shape", format!("{shape:?} overflows usize")))?;
        if n != data.len() {
            return Err(Error::invalid(
                "data",
                format!("shape {shape:?} has {n} elements but the slice has {}", data.len()),
            ));
        }
        Self::from_slice_strided(stream, data, shape, &layout::contiguous_strides(shape), 0)
    }

    /// A strided view (`shape`, `strides`, `offset`, in elements) over a copy of `storage`.
    /// Every element of the view must lie inside `storage`.
    pub fn from_slice_strided<T: Element>(
        stream: &Stream,
        storage: &[T],
        shape: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> Result<Tensor> {
        Self::uploaded(stream, storage, shape, strides, offset, false)
    }

    /// A contiguous tensor of zeros (on Ascend: memory no queued work uses, and the
    /// host-synchronous `aclrtMemset`).
    pub fn zeros(stream: &Stream, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Self::alloc(stream, dtype, shape, true)
    }

    /// An output for an operator whose output has `like`'s shape and dtype, in `like`'s memory
    /// order when `like` is dense (its elements fill its span without gaps or overlap: contiguous,
    /// channels-last, any permutation), as torch's `empty_like` keeps the memory format; else
    /// contiguous. Its contents are undefined: the operator writes every element.
    pub(crate) fn alloc_like(stream: &Stream, like: &Tensor) -> Result<Tensor> {
        let mut t = Self::alloc(stream, like.dtype(), like.shape(), false)?;
        if !like.is_contiguous() {
            if let Some(strides) = dense_strides(like.shape(), like.strides()) {
                t = Tensor::with_layout(t.dtype, t.shape, strides, 0, t.storage_len, t.storage);
            }
        }
        Ok(t)
    }

    /// A contiguous tensor; on Ascend its contents are undefined unless `zeroed`.
    pub(crate) fn alloc(stream: &Stream, dtype: DType, shape: &[usize], zeroed: bool) -> Result<Tensor> {
        let n = layout::numel(shape).ok_or_else(|| Error::invalid("shape", format!("{shape:?} overflows usize")))?;
        // Checked for both backends alike: on the host, a larger request would panic ("capacity
        // overflow") instead of returning this error.
        let bytes = n
            .checked_mul(dtype.size_in_bytes())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| Error::invalid("shape", format!("{shape:?} of {dtype} exceeds the addressable size")))?;
        let storage = match stream.ascend() {
            None => Storage::Host(HostData::new(&stream.context().host, dtype, n, zeroed)?),
            Some((_, device)) if zeroed => {
                let buffer = DeviceBuffer::new(device.clone(), bytes)?;
                if bytes > 0 {
                    device.bind()?;
                    // SAFETY: an idle block of at least `bytes` that no work uses.
                    unsafe { crate::acl::memset(device.cann, buffer.ptr(), 0, bytes)? };
                }
                Storage::Device(DeviceStorage { buffer: Arc::new(buffer) })
            }
            // Written first by work on `stream`: its block may come straight from that stream's
            // cache (stream order makes that safe).
            Some((inner, _)) => {
                Storage::Device(DeviceStorage { buffer: Arc::new(DeviceBuffer::on_stream(inner, bytes)?) })
            }
        };
        Ok(Tensor::with_layout(dtype, shape, layout::contiguous_dims(shape), 0, n, storage))
    }

    /// A strided view over a copy of `storage`: [`from_slice_strided`](Self::from_slice_strided),
    /// or with `staged`, for the small uploads the crate makes itself: on Ascend, up to 4 KiB go
    /// through the stream's pinned staging area (an `aclrtMemcpyAsync` queued on `stream`, no host
    /// wait), into memory from the stream's cache.
    pub(crate) fn uploaded<T: Element>(
        stream: &Stream,
        storage: &[T],
        shape: &[usize],
        strides: &[usize],
        offset: usize,
        staged: bool,
    ) -> Result<Tensor> {
        layout::check_view(shape, strides, offset, storage.len()).map_err(|m| Error::invalid("strides", m))?;
        let storage = Self::place(stream, storage, staged)?;
        Ok(Tensor::with_layout(T::DTYPE, shape, strides, offset, storage_len_of(&storage, T::DTYPE), storage))
    }

    /// The storage of `host` for `stream`'s backend; with `staged`, small data goes up through
    /// the stream's staging area.
    fn place<T: Element>(stream: &Stream, data: &[T], staged: bool) -> Result<Storage> {
        let bytes = as_bytes(data);
        match stream.ascend() {
            None => Ok(Storage::Host(HostData::from_slice(&stream.context().host, data)?)),
            Some((inner, _)) if staged && bytes.len() <= STAGING_MAX => {
                let buffer = DeviceBuffer::on_stream(inner, bytes.len())?;
                inner.upload(&buffer, 0, bytes)?;
                Ok(Storage::Device(DeviceStorage { buffer: Arc::new(buffer) }))
            }
            Some((_, device)) => {
                let buffer = DeviceBuffer::new(device.clone(), bytes.len())?;
                device.bind()?;
                // SAFETY: an idle block of at least `bytes.len()` bytes that no work uses.
                unsafe { crate::acl::copy_to_device(device.cann, buffer.ptr(), bytes)? };
                Ok(Storage::Device(DeviceStorage { buffer: Arc::new(buffer) }))
            }
        }
    }

    /// The view's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The view's strides, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The view's offset into its storage, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The number of elements in the view.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The dtype, shape, strides, offset and storage length, as the argument checks and the CPU
    /// kernels take them.
    pub(crate) fn layout(&self) -> crate::layout::Layout<'_> {
        crate::layout::Layout {
            dtype: self.dtype(),
            shape: self.shape(),
            strides: self.strides(),
            offset: self.offset(),
            storage_len: self.storage_len(),
        }
    }

    /// The number of elements of the storage the view lies in.
    pub fn storage_len(&self) -> usize {
        self.storage_len
    }

    /// Whether the view is row-major contiguous.
    pub fn is_contiguous(&self) -> bool {
        layout::is_contiguous(&self.shape, &self.strides)
    }

    /// A tensor view over device memory the caller owns (another library's, a C++ engine's, or
    /// this crate's own through [`device_ptr`](Self::device_ptr)): `dtype` elements viewed with
    /// `shape`, `strides` and `offset` (in elements) inside the `storage_bytes` bytes starting at
    /// `ptr` on the device of `stream`. The crate never frees that memory. Like any tensor it goes
    /// through the one launch path: every stream that enqueues work on it is recorded, and dropping
    /// the tensor waits for that work, so the caller may free the memory once the tensor is gone.
    ///
    /// Errors (nothing is made): a CPU stream, a null `ptr` or one not 32-byte aligned (CANN's
    /// rule for an `aclTensor`'s data, which `aclrtMalloc` gives: docs/cann/API.md §2.4; for a
    /// view into the middle of an allocation pass the allocation's start and an `offset`), a view
    /// outside `storage_bytes`.
    ///
    /// # Safety
    /// `ptr` points to at least `storage_bytes` bytes of device memory of `stream`'s device that
    /// stay allocated, and are neither freed nor written by anything else but work ordered with
    /// this tensor's streams, until the returned tensor (and every tensor or call borrowing it)
    /// has been dropped.
    pub unsafe fn from_raw_device(
        stream: &Stream,
        ptr: *mut std::ffi::c_void,
        dtype: DType,
        shape: &[usize],
        strides: &[usize],
        offset: usize,
        storage_bytes: usize,
    ) -> Result<Tensor> {
        let Some((_, device)) = stream.ascend() else {
            return Err(stream.mismatch("stream", "foreign device memory needs an Ascend stream"));
        };
        let size = dtype.size_in_bytes();
        if ptr.is_null() || !(ptr as usize).is_multiple_of(TENSOR_DATA_ALIGN) {
            return Err(Error::invalid(
                "ptr",
                format!(
                    "expected a non-null device address aligned to {TENSOR_DATA_ALIGN} bytes (CANN's rule for tensor \
                     data; view the middle of an allocation with `offset`), got {ptr:p}"
                ),
            ));
        }
        let storage_len = storage_bytes / size;
        layout::check_view(shape, strides, offset, storage_len).map_err(|m| Error::invalid("strides", m))?;
        // SAFETY: the caller's guarantee: `storage_bytes` of live device memory of this device at
        // `ptr`, kept until this tensor and its work are gone.
        let buffer = Arc::new(unsafe { DeviceBuffer::foreign(device.clone(), ptr, storage_len * size) });
        Ok(Tensor::with_layout(dtype, shape, strides, offset, storage_len, Storage::Device(DeviceStorage { buffer })))
    }

    /// The device address of the tensor's storage (element 0 of the storage, not of the view:
    /// add `offset()` elements for the view's first one) and `None` on the CPU backend. The
    /// storage holds [`storage_len`](Self::storage_len) elements of [`dtype`](Self::dtype).
    ///
    /// Valid only while the tensor lives. Work this crate enqueued on it may still be running:
    /// synchronise its stream (or wait for an [`Event`](crate::Event) recorded after that work)
    /// before another library reads or writes the memory, and keep this crate off the tensor
    /// while the other library's work runs.
    pub fn device_ptr(&self) -> Option<*mut std::ffi::c_void> {
        match &self.storage {
            Storage::Device(d) => Some(d.buffer.ptr()),
            Storage::Host(_) => None,
        }
    }

    /// Whether the tensor lives in device memory (Ascend backend).
    pub fn is_device(&self) -> bool {
        matches!(self.storage, Storage::Device(_))
    }

    /// The view's elements in row-major order, converted to `T` (rounding to nearest when `T`
    /// is narrower than the tensor's dtype). On Ascend this waits for every stream that enqueued
    /// work on the tensor, then copies it to the host (`aclrtSynchronizeStream`, `aclrtMemcpy`).
    pub fn to_vec<T: Element>(&self, stream: &Stream) -> Result<Vec<T>> {
        self.check_stream(stream, "tensor")?;
        match &self.storage {
            Storage::Host(h) => gather(&self.host_view(h)),
            Storage::Device(d) => {
                stream.synchronize()?;
                d.buffer.synchronize()?;
                let mut host = HostData::new(&stream.context().host, self.dtype, self.storage_len, false)?;
                let device = d.buffer.device();
                if self.storage_len > 0 {
                    device.bind()?;
                    let bytes = host_bytes_mut(&mut host);
                    // SAFETY: the buffer holds `storage_len` elements of `dtype` (= bytes.len()) and
                    // every stream that used it has just been synchronised.
                    unsafe { crate::acl::copy_to_host(device.cann, bytes, d.buffer.ptr())? };
                }
                gather(&self.host_view(&host))
            }
        }
    }

    /// Overwrites the view's elements (row-major order) with `data`, converted to the tensor's
    /// dtype: refills an existing tensor without allocating. On Ascend this first waits for
    /// every stream that enqueued work on the tensor, then copies (`aclrtMemcpy`); a
    /// non-contiguous view is read, updated and written back whole.
    pub fn copy_from_slice<T: Element>(&mut self, stream: &Stream, data: &[T]) -> Result<()> {
        self.check_stream(stream, "tensor")?;
        let n = self.numel();
        if data.len() != n {
            return Err(Error::invalid(
                "data",
                format!("the tensor has {n} elements (shape {:?}) but the slice has {}", self.shape, data.len()),
            ));
        }
        let (shape, strides, offset) = (&self.shape, &self.strides, self.offset);
        let scatter = |h: &mut HostData| {
            let mut values = data.iter();
            let mut storage = h.as_slice_mut();
            if let Some(dst) = T::of_slice_mut(&mut storage) {
                // The tensor's own dtype: element copies (no conversion, NaN payloads kept).
                layout::for_each_index(shape, strides, offset, |i| {
                    if let Some(&v) = values.next() {
                        dst[i] = v;
                    }
                });
                return;
            }
            // Another dtype: widened exactly to f64, then rounded once into the tensor's dtype.
            let mut view = ViewMut::from_host(h, shape, strides, offset);
            layout::for_each_index(shape, strides, offset, |i| {
                if let Some(v) = values.next() {
                    view.set_f64(i, v.to_f64());
                }
            });
        };
        match &mut self.storage {
            Storage::Host(h) => {
                scatter(h);
                Ok(())
            }
            Storage::Device(d) => {
                d.buffer.synchronize()?;
                let device = d.buffer.device().clone();
                device.bind()?;
                let es = self.dtype.size_in_bytes();
                if T::DTYPE == self.dtype && layout::is_contiguous(shape, strides) {
                    if n > 0 {
                        // SAFETY: the contiguous view [offset, offset + n) lies inside the buffer
                        // (checked at creation), T has the tensor's dtype so the byte count
                        // matches, and no stream uses the buffer (just synchronised; `&mut self`
                        // keeps new work out).
                        unsafe {
                            let dst = d.buffer.ptr().cast::<u8>().wrapping_add(offset * es).cast();
                            crate::acl::copy_to_device(device.cann, dst, as_bytes(data))?;
                        }
                    }
                    return Ok(());
                }
                let mut host = HostData::new(&stream.context().host, self.dtype, self.storage_len, false)?;
                if self.storage_len > 0 {
                    // SAFETY: the buffer holds `storage_len` elements of `dtype` and is idle.
                    unsafe { crate::acl::copy_to_host(device.cann, host_bytes_mut(&mut host), d.buffer.ptr())? };
                    scatter(&mut host);
                    // SAFETY: as above; the copy covers exactly the buffer's storage.
                    unsafe { crate::acl::copy_to_device(device.cann, d.buffer.ptr(), host.bytes())? };
                }
                Ok(())
            }
        }
    }

    /// Another view (`shape`, `strides`, `offset` in elements) of this tensor's storage: on
    /// Ascend the same device buffer (recorded on streams as one), on the CPU a copy of the host
    /// storage. For the crate's own packed buffers (`sync_batch_norm`).
    pub(crate) fn view(&self, shape: &[usize], strides: &[usize], offset: usize) -> Result<Tensor> {
        layout::check_view(shape, strides, offset, self.storage_len).map_err(|m| Error::invalid("strides", m))?;
        let storage = match &self.storage {
            Storage::Device(d) => Storage::Device(DeviceStorage { buffer: d.buffer.clone() }),
            Storage::Host(h) => Storage::Host(h.try_clone()?),
        };
        Ok(Tensor::with_layout(self.dtype, shape, strides, offset, self.storage_len, storage))
    }

    /// Takes the elements `view` (made by [`view`](Self::view) of this tensor, then written)
    /// holds: on the CPU backend, where a view holds a copy of the storage, they are copied back;
    /// on Ascend the view is this buffer already.
    pub(crate) fn absorb(&mut self, view: &Tensor) -> Result<()> {
        fn copy<T: Element>(dst: &mut HostData, src: &HostData, v: &Tensor) -> bool {
            let mut dst = dst.as_slice_mut();
            match (T::of_slice_mut(&mut dst), T::of_slice_ref(src.as_slice_ref())) {
                (Some(d), Some(s)) if d.len() == s.len() => {
                    layout::for_each_index(&v.shape, &v.strides, v.offset, |i| d[i] = s[i]);
                    true
                }
                _ => false,
            }
        }
        let done = match (&mut self.storage, &view.storage) {
            (Storage::Device(d), Storage::Device(v)) => Arc::ptr_eq(&d.buffer, &v.buffer),
            (Storage::Host(d), Storage::Host(h)) => {
                copy::<f32>(d, h, view)
                    || copy::<f16>(d, h, view)
                    || copy::<bf16>(d, h, view)
                    || copy::<i32>(d, h, view)
            }
            _ => false,
        };
        if done {
            Ok(())
        } else {
            Err(Error::internal("Tensor::absorb: the view was not made from this tensor"))
        }
    }

    /// Writes `data` at element `at` of this tensor's storage (of `T`'s dtype), in `stream`'s
    /// order: on Ascend an upload through the stream's pinned staging area (no host wait; at
    /// most 4 KiB), on the CPU a plain write.
    pub(crate) fn stage<T: Element>(&mut self, stream: &Stream, at: usize, data: &[T]) -> Result<()> {
        if T::DTYPE != self.dtype || at.checked_add(data.len()).is_none_or(|end| end > self.storage_len) {
            return Err(Error::internal(format!(
                "Tensor::stage: {} elements of {} at {at} into a storage of {} {}",
                data.len(),
                T::DTYPE,
                self.storage_len,
                self.dtype
            )));
        }
        match (&mut self.storage, stream.ascend()) {
            (Storage::Device(d), Some((inner, _))) => {
                inner.upload(&d.buffer, at * self.dtype.size_in_bytes(), as_bytes(data))
            }
            (Storage::Host(h), None) => match T::of_slice_mut(&mut h.as_slice_mut()) {
                Some(dst) => {
                    dst[at..at + data.len()].copy_from_slice(data);
                    Ok(())
                }
                None => Err(Error::internal("Tensor::stage: dtype mismatch")),
            },
            _ => Err(stream.mismatch("stream", "Tensor::stage: the tensor lives elsewhere")),
        }
    }

    /// A zero-copy view of host storage with this tensor's layout.
    pub(crate) fn host_view<'a>(&'a self, h: &'a HostData) -> View<'a> {
        View::from_host(h, &self.shape, &self.strides, self.offset)
    }

    /// The host view of a CPU tensor, or `None` for a device tensor.
    pub(crate) fn as_host_view(&self) -> Option<View<'_>> {
        match &self.storage {
            Storage::Host(h) => Some(self.host_view(h)),
            Storage::Device(_) => None,
        }
    }

    /// The mutable host view of a CPU tensor, or `None` for a device tensor.
    pub(crate) fn as_host_view_mut(&mut self) -> Option<ViewMut<'_>> {
        match &mut self.storage {
            Storage::Host(h) => Some(ViewMut::from_host(h, &self.shape, &self.strides, self.offset)),
            Storage::Device(_) => None,
        }
    }

    /// The device buffer and its device, or `None` for a host tensor.
    #[inline]
    pub(crate) fn device_buffer(&self) -> Option<(&DeviceBuffer, &Arc<Device>)> {
        match &self.storage {
            Storage::Device(d) => Some((&*d.buffer, d.buffer.device())),
            Storage::Host(_) => None,
        }
    }

    /// Checks that this tensor lives where `stream` runs work.
    pub(crate) fn check_stream(&self, stream: &Stream, argument: &'static str) -> Result<()> {
        match (&self.storage, &stream.context().kind) {
            (Storage::Host(_), ContextKind::Cpu) => Ok(()),
            (Storage::Device(d), ContextKind::Ascend(dev)) if d.buffer.device().same(dev) => Ok(()),
            (Storage::Host(_), _) => Err(stream.mismatch(argument, "the tensor is in host memory (CPU backend)")),
            (Storage::Device(d), _) => Err(Error::invalid(
                argument,
                format!(
                    "the tensor is on Ascend device {}, but the stream is on {}",
                    d.buffer.device().id,
                    describe(stream.context())
                ),
            )),
        }
    }
}

/// The strides of a dense view of `shape` (its elements fill `numel` consecutive positions in
/// some order of its dims) with the memory order of `strides`, or `None` when the view has gaps,
/// overlaps or broadcasts. Size-1 dims get stride 1.
fn dense_strides(shape: &[usize], strides: &[usize]) -> Option<layout::Dims> {
    let mut order = layout::Dims::zeros(shape.len());
    for (i, o) in order.iter_mut().enumerate() {
        *o = i;
    }
    // Outermost first: larger strides first, size-1 dims where row-major puts them (ties in
    // logical order).
    order.sort_by_key(|&d| std::cmp::Reverse(if shape[d] == 1 { None } else { Some(strides[d]) }));
    let mut out = layout::Dims::zeros(shape.len());
    let mut expected = 1usize;
    for &d in order.iter().rev() {
        if shape[d] != 1 && strides[d] != expected {
            return None;
        }
        out[d] = expected;
        expected = expected.checked_mul(shape[d])?;
    }
    Some(out)
}

fn storage_len_of(storage: &Storage, dtype: DType) -> usize {
    match storage {
        Storage::Host(h) => h.len(),
        Storage::Device(d) => d.buffer.bytes() / dtype.size_in_bytes(),
    }
}

fn host_bytes_mut(h: &mut HostData) -> &mut [u8] {
    let n = h.len * h.dtype.size_in_bytes();
    h.block.as_mut_slice(n)
}

/// The elements of a host view in row-major order, converted to `T`. A view of more elements
/// than host memory holds (a broadcast view may be far larger than its storage) is
/// [`Error::HostAlloc`].
fn gather<T: Element>(v: &View<'_>) -> Result<Vec<T>> {
    let n = layout::numel(v.shape()).unwrap_or(usize::MAX);
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| Error::HostAlloc { bytes: n.saturating_mul(std::mem::size_of::<T>()) })?;
    if let Some(data) = T::of_slice_ref(v.storage()) {
        // The tensor's own dtype: a byte copy (one memcpy when contiguous), no conversion.
        let run = v.offset().checked_add(n).and_then(|end| data.get(v.offset()..end));
        match run {
            Some(run) if layout::is_contiguous(v.shape(), v.strides()) => out.extend_from_slice(run),
            _ => layout::for_each_index(v.shape(), v.strides(), v.offset(), |i| out.push(data[i])),
        }
        return Ok(out);
    }
    // Another dtype: widened exactly to f64, then rounded once into T.
    v.for_each_f64(|x| out.push(T::from_f64(x)));
    Ok(out)
}
