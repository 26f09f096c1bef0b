//! DLPack in and out (`Tensor::to_dlpack`, `Tensor::from_dlpack`, their legacy forms): round trips
//! on the CPU and the mock (values; on the mock the same device memory, with no blocking copy
//! and no host wait per exchange), capsules shaped like torch_npu's (consumed in place, their
//! deleter run once, after the device work that reads them), bad capsules refused without being
//! taken, deleters deferred past queued work without a host wait (parked, bounded, run at a
//! later poll or the teardown; a stream that cannot record an event is waited for), and
//! deleters run from other threads.

mod common;

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use ascend::sys::dlpack::*;
use ascend::{bf16, f16, Context, DType, DlDevice, DlPack, Element, Error, Result, Stream, Tensor};
use common::{on_both_backends, Rng};

/// Random values of `T` in [-1, 1) (i32: [-1000, 1000)), never all zero.
fn random<T: Element>(n: usize, seed: u64) -> Vec<T> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| match T::DTYPE {
            DType::I32 => T::from_f64((rng.uniform(-1000.0, 1000.0)).floor()),
            _ => T::from_f64(rng.uniform(-1.0, 1.0)),
        })
        .collect()
}

/// The host waits and blocking copies the mock counted so far.
fn waits_and_copies() -> [u64; 4] {
    #[cfg(feature = "mock")]
    {
        let s = ascend::mock::stats();
        [s.stream_synchronizes, s.event_synchronizes, s.device_synchronizes, s.blocking_copies]
    }
    #[cfg(not(feature = "mock"))]
    [0; 4]
}

fn argument(err: &Error) -> &'static str {
    match err {
        Error::InvalidArgument { argument, .. } => argument,
        other => panic!("expected an invalid-argument error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Round trips

/// A strided view (every other row of a [2n, c] storage, from element `c`) of random `T`s.
fn strided<T: Element>(s: &Stream, seed: u64) -> Result<(Tensor, Vec<T>)> {
    let (n, c) = (5, 3);
    let storage = random::<T>(2 * n * c + c, seed);
    let t = Tensor::from_slice_strided(s, &storage, &[n, c], &[2 * c, 1], c)?;
    let expect = (0..n).flat_map(|i| (0..c).map(move |j| (i, j))).map(|(i, j)| storage[c + 2 * c * i + j]).collect();
    Ok((t, expect))
}

fn round_trip<T: Element>(ctx: &Context, legacy: bool) -> Result<()> {
    let s = ctx.new_stream()?;
    let (t, expect) = strided::<T>(&s, 7)?;
    assert_eq!(t.to_vec::<T>(&s)?, expect);
    let before = waits_and_copies();
    let d = t.to_dlpack(&s)?;
    let dl = d.dl_tensor();
    let shape = unsafe { std::slice::from_raw_parts(dl.shape, 2) };
    let strides = unsafe { std::slice::from_raw_parts(dl.strides, 2) };
    assert_eq!(dl.ndim, 2);
    assert_eq!(shape, [5, 3]);
    let (code, bits) = match T::DTYPE {
        DType::F32 => (kDLFloat, 32),
        DType::F16 => (kDLFloat, 16),
        DType::BF16 => (kDLBfloat, 16),
        _ => (kDLInt, 32),
    };
    assert_eq!(dl.dtype, DLDataType { code, bits, lanes: 1 });
    if t.is_device() {
        // The same memory: the view's strides, `data` at its first element (byte_offset 0, as
        // torch exports and torch_npu reads), the device's id, no flag.
        assert_eq!(dl.device, DLDevice { device_type: kDLExtDev, device_id: 0 });
        assert_eq!(strides, [6, 1]);
        assert_eq!(dl.byte_offset, 0);
        assert_eq!(Some(dl.data), t.device_ptr().map(|p| p.cast::<T>().wrapping_add(3).cast()));
        assert_eq!(d.flags(), 0);
    } else {
        // The CPU backend's capsule is a compact copy, flagged so.
        assert_eq!(dl.device, DLDevice { device_type: kDLCPU, device_id: 0 });
        assert_eq!(strides, [3, 1]);
        assert_eq!(dl.byte_offset, 0);
        assert_eq!(d.flags(), DLPACK_FLAG_BITMASK_IS_COPIED);
        let copy = unsafe { std::slice::from_raw_parts(dl.data.cast::<T>(), 15) };
        assert_eq!(copy, expect);
    }
    // SAFETY: a capsule made by to_dlpack, handed over once.
    let back = unsafe {
        if legacy {
            Tensor::from_dlpack_legacy(&s, d.into_raw_legacy())
        } else {
            Tensor::from_dlpack(&s, d.into_raw())
        }
    }?;
    assert_eq!(waits_and_copies(), before, "an exchange neither waits nor copies");
    assert_eq!(back.device_ptr(), t.device_ptr(), "no copy");
    assert_eq!((back.shape(), back.dtype()), (t.shape(), t.dtype()));
    if t.is_device() {
        assert_eq!((back.strides(), back.offset()), (t.strides(), t.offset()));
    }
    assert_eq!(back.to_vec::<T>(&s)?, expect);
    drop(t);
    // The buffer outlives the exporting tensor: the imported one still reads it.
    assert_eq!(back.to_vec::<T>(&s)?, expect);
    Ok(())
}

fn round_trips_keep_values_and_memory(ctx: &Context) -> Result<()> {
    for legacy in [false, true] {
        round_trip::<f32>(ctx, legacy)?;
        round_trip::<f16>(ctx, legacy)?;
        round_trip::<bf16>(ctx, legacy)?;
        round_trip::<i32>(ctx, legacy)?;
    }
    Ok(())
}

fn to_dlpack_as_picks_the_device_type(ctx: &Context) -> Result<()> {
    let s = ctx.new_stream()?;
    let t = Tensor::from_slice(&s, &random::<f32>(6, 3), &[2, 3])?;
    let want = |d: DlDevice| {
        if t.is_device() {
            if d == DlDevice::Ascend {
                kDLAscend
            } else {
                kDLExtDev
            }
        } else {
            kDLCPU
        }
    };
    for d in [DlDevice::ExtDev, DlDevice::Ascend] {
        assert_eq!(t.to_dlpack_as(&s, d)?.dl_tensor().device.device_type, want(d));
    }
    assert_eq!(DlDevice::default(), DlDevice::ExtDev);
    // A kDLAscend capsule is taken back too.
    // SAFETY: made by to_dlpack_as, handed over once.
    let back = unsafe { Tensor::from_dlpack(&s, t.to_dlpack_as(&s, DlDevice::Ascend)?.into_raw()) }?;
    assert_eq!(back.to_vec::<f32>(&s)?, t.to_vec::<f32>(&s)?);
    Ok(())
}

/// Rank 0 and empty tensors, a broadcast (stride 0) view.
fn odd_shapes_round_trip(ctx: &Context) -> Result<()> {
    let s = ctx.new_stream()?;
    let cases = [
        Tensor::from_slice(&s, &[2.5f32], &[])?,
        Tensor::from_slice::<f32>(&s, &[], &[0, 4])?,
        Tensor::from_slice_strided(&s, &[1.5f32, -2.0], &[3, 2], &[0, 1], 0)?,
    ];
    for t in &cases {
        // SAFETY: made by to_dlpack, handed over once.
        let back = unsafe { Tensor::from_dlpack(&s, t.to_dlpack(&s)?.into_raw()) }?;
        assert_eq!(back.shape(), t.shape());
        assert_eq!(back.to_vec::<f32>(&s)?, t.to_vec::<f32>(&s)?);
    }
    Ok(())
}

/// A DlPack dropped without being handed out frees what it keeps (its own deleter), and keeps it
/// until then.
fn an_unused_dlpack_frees_its_buffer_on_drop(ctx: &Context) -> Result<()> {
    let s = ctx.new_stream()?;
    let base = ctx.memory_stats().allocated;
    let t = Tensor::from_slice(&s, &random::<f32>(256, 5), &[256])?;
    let held = ctx.memory_stats().allocated;
    let d: DlPack = t.to_dlpack(&s)?;
    drop(t);
    // On the CPU backend the capsule holds a copy outside the context's memory cache (host
    // memory another framework may write is never aliased by a tensor): the tensor's block is
    // back in the cache at once.
    let kept = if ctx.backend() == ascend::Backend::Cpu { base } else { held };
    assert_eq!(ctx.memory_stats().allocated, kept, "the capsule keeps the buffer (the device's)");
    drop(d);
    assert_eq!(ctx.memory_stats().allocated, base, "dropping the capsule frees it");
    Ok(())
}

/// A handed-out capsule's deleter may run on another thread.
fn deleters_run_on_other_threads(ctx: &Context) -> Result<()> {
    let s = ctx.new_stream()?;
    let base = ctx.memory_stats().allocated;
    let t = Tensor::from_slice(&s, &random::<f32>(64, 9), &[8, 8])?;
    let raw = t.to_dlpack(&s)?.into_raw() as usize;
    let legacy = t.to_dlpack(&s)?.into_raw_legacy() as usize;
    drop(t);
    std::thread::spawn(move || {
        // SAFETY: live capsules made by to_dlpack, each deleted once, here.
        unsafe {
            let v = raw as *mut DLManagedTensorVersioned;
            ((*v).deleter.expect("a deleter"))(v);
            let l = legacy as *mut DLManagedTensor;
            ((*l).deleter.expect("a deleter"))(l);
        }
    })
    .join()
    .unwrap();
    assert_eq!(ctx.memory_stats().allocated, base);
    // An imported tensor (its capsule inside) dropped on another thread.
    let t = Tensor::from_slice(&s, &random::<f32>(64, 10), &[64])?;
    // SAFETY: made by to_dlpack, handed over once.
    let back = unsafe { Tensor::from_dlpack(&s, t.to_dlpack(&s)?.into_raw()) }?;
    drop(t);
    std::thread::spawn(move || drop(back)).join().unwrap();
    assert_eq!(ctx.memory_stats().allocated, base);
    Ok(())
}

/// A capsule of another backend's stream is refused (not taken), and its exporter checks the
/// stream too.
fn streams_of_another_backend_are_refused(ctx: &Context) -> Result<()> {
    let Some(other) = common::other_backend(ctx) else { return Ok(()) };
    let (s, o) = (ctx.new_stream()?, other.new_stream()?);
    let t = Tensor::from_slice(&s, &random::<f32>(4, 1), &[4])?;
    assert_eq!(argument(&t.to_dlpack(&o).unwrap_err()), "stream");
    let raw = t.to_dlpack(&s)?.into_raw();
    // SAFETY: refused before the capsule is used; deleted below.
    let err = unsafe { Tensor::from_dlpack(&o, raw) }.unwrap_err();
    assert_eq!(argument(&err), "device_type", "{err}");
    // SAFETY: still the caller's; deleted once.
    unsafe { ((*raw.cast::<DLManagedTensorVersioned>()).deleter.unwrap())(raw.cast()) };
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Foreign capsules

/// How many times the foreign capsules' deleter ran, and the tasks still queued on the mock's
/// streams when it last ran (the tests that read them hold the mock's lock).
static DELETED: AtomicU64 = AtomicU64::new(0);
#[cfg_attr(not(feature = "mock"), allow(dead_code))]
static QUEUED_AT_DELETE: AtomicU64 = AtomicU64::new(u64::MAX);
/// The thread the foreign capsules' deleter last ran on.
#[cfg_attr(not(feature = "mock"), allow(dead_code))]
static DELETER_THREAD: std::sync::Mutex<Option<std::thread::ThreadId>> = std::sync::Mutex::new(None);
/// Serialises the CPU cases that count deletes when the mock (whose lock they take too) is off.
static DELETES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn count_deletes() -> std::sync::MutexGuard<'static, ()> {
    DELETES.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a foreign capsule's `manager_ctx` owns, as torch's `ATenDLMTensor` holds the tensor
/// whose sizes and strides the capsule points into: the shape, the strides, and the memory
/// (host memory for kDLCPU, else `aclrtMalloc` memory it frees, as the tensor's storage would be
/// given back).
#[repr(C)]
struct Owner<H> {
    head: H,
    shape: Vec<i64>,
    strides: Vec<i64>,
    memory: Memory,
    /// Run by the deleter after it freed the memory (a producer's deleter may do anything).
    then: Option<Box<dyn FnOnce() + Send>>,
}

enum Memory {
    Host(#[allow(dead_code)] Vec<u64>),
    #[cfg(feature = "mock")]
    Device(*mut c_void),
}

/// The deleter torch's DLConvertor installs: deletes its context, which frees the memory.
unsafe extern "C" fn foreign_deleter<H>(p: *mut H) {
    // SAFETY: `p` is `head` of a boxed `Owner<H>` (its first field).
    let owner = unsafe { Box::from_raw(p.cast::<Owner<H>>()) };
    #[cfg(feature = "mock")]
    {
        QUEUED_AT_DELETE.store(ascend::mock::live_events_and_queued_tasks().1, Ordering::SeqCst);
        if let Memory::Device(ptr) = owner.memory {
            mock_memory::free(ptr);
        }
    }
    let then = owner.then;
    if let Some(then) = then {
        then();
    }
    *DELETER_THREAD.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::thread::current().id());
    DELETED.fetch_add(1, Ordering::SeqCst);
}

/// A producer's tensor: f32 values laid out at `shape`/`strides` from `lead` bytes into memory
/// on `device` (Ascend memory on the mock's device 0, host memory for kDLCPU).
struct Spec {
    device: DLDevice,
    dtype: DLDataType,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    lead: usize,
    byte_offset: u64,
    null_data: bool,
    /// Whether the memory is the mock's device memory (else host memory, whatever `device` says).
    #[cfg_attr(not(feature = "mock"), allow(dead_code))]
    device_memory: bool,
}

impl Spec {
    fn new(device_type: i32, shape: &[i64], strides: &[i64]) -> Spec {
        Spec {
            device: DLDevice { device_type, device_id: 0 },
            dtype: DLDataType { code: kDLFloat, bits: 32, lanes: 1 },
            shape: shape.to_vec(),
            strides: Some(strides.to_vec()),
            lead: 0,
            byte_offset: 0,
            null_data: false,
            device_memory: [kDLExtDev, kDLAscend].contains(&device_type),
        }
    }

    /// Fills memory with `storage` (f32 values, or their bits for other dtypes) and makes a
    /// boxed capsule of head `H` over it, as torch's DLConvertor does.
    fn capsule<H: 'static>(&self, storage: &[f32], make: impl FnOnce(DLTensor) -> H) -> *mut H {
        let bytes = (4 * storage.len() + self.lead).max(4); // aclrtMalloc refuses 0 bytes
        #[cfg(feature = "mock")]
        let mut data: *mut c_void = if self.device_memory { mock_memory::alloc(bytes) } else { std::ptr::null_mut() };
        #[cfg(not(feature = "mock"))]
        let mut data: *mut c_void = std::ptr::null_mut();
        let mut memory = match data.is_null() {
            true => {
                let mut host = vec![0u64; bytes.div_ceil(8)];
                data = host.as_mut_ptr().cast();
                Memory::Host(host)
            }
            #[cfg(feature = "mock")]
            false => Memory::Device(data),
            #[cfg(not(feature = "mock"))]
            false => unreachable!(),
        };
        let first = data.cast::<u8>().wrapping_add(self.lead).cast::<c_void>();
        match &mut memory {
            // SAFETY: `first` has room for the values' bytes (any alignment: a byte copy).
            Memory::Host(_) => unsafe {
                std::ptr::copy_nonoverlapping(storage.as_ptr().cast::<u8>(), first.cast::<u8>(), 4 * storage.len())
            },
            #[cfg(feature = "mock")]
            Memory::Device(_) => mock_memory::upload(first, storage),
        }
        let (mut shape, mut strides) = (self.shape.clone(), self.strides.clone().unwrap_or_default());
        let dl = DLTensor {
            data: if self.null_data { std::ptr::null_mut() } else { first },
            device: self.device,
            ndim: self.shape.len() as i32,
            dtype: self.dtype,
            shape: shape.as_mut_ptr(),
            strides: if self.strides.is_some() { strides.as_mut_ptr() } else { std::ptr::null_mut() },
            byte_offset: self.byte_offset,
        };
        // `head` first (repr(C)): the capsule's pointer is the owner's.
        Box::into_raw(Box::new(Owner { head: make(dl), shape, strides, memory, then: None })).cast::<H>()
    }

    fn versioned(&self, storage: &[f32], flags: u64) -> *mut DLManagedTensorVersioned {
        let p = self.capsule(storage, |dl_tensor| DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 1 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(foreign_deleter::<DLManagedTensorVersioned>),
            flags,
            dl_tensor,
        });
        unsafe { (*p).manager_ctx = p.cast() };
        p
    }

    fn legacy(&self, storage: &[f32]) -> *mut DLManagedTensor {
        let p = self.capsule(storage, |dl_tensor| DLManagedTensor {
            dl_tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(foreign_deleter::<DLManagedTensor>),
        });
        unsafe { (*p).manager_ctx = p.cast() };
        p
    }
}

/// Calls a refused capsule's deleter (the caller still owns it).
fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    unsafe { ((*p).deleter.unwrap())(p) }
}

/// The element-wise reference: the view's values in row-major order.
fn gather(storage: &[f32], shape: &[i64], strides: &[i64], offset: usize) -> Vec<f32> {
    let mut out = Vec::new();
    let mut idx = vec![0i64; shape.len()];
    let n: i64 = shape.iter().product();
    for _ in 0..n {
        let at = offset as i64 + idx.iter().zip(strides).map(|(i, s)| i * s).sum::<i64>();
        out.push(storage[at as usize]);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// A kDLCPU capsule on the CPU backend: copied, its deleter called at once; and a versioned
/// one with the usual flags.
fn cpu_capsules_are_copied_and_deleted(ctx: &Context) -> Result<()> {
    let _deletes = count_deletes();
    if ctx.device_id().is_some() {
        return Ok(());
    }
    let s = ctx.new_stream()?;
    let storage = random::<f32>(24, 11);
    let (shape, strides) = ([3i64, 4], [1i64, 6]); // a transposed view
    let deleted = DELETED.load(Ordering::SeqCst);
    let spec = Spec { byte_offset: 8, ..Spec::new(kDLCPU, &shape, &strides) };
    // SAFETY: a live capsule over host memory, handed over.
    let t = unsafe { Tensor::from_dlpack_legacy(&s, spec.legacy(&storage).cast()) }?;
    assert_eq!(DELETED.load(Ordering::SeqCst), deleted + 1, "copied, then deleted");
    assert_eq!(t.to_vec::<f32>(&s)?, gather(&storage, &shape, &strides, 2));
    // SAFETY: as above.
    let t = unsafe { Tensor::from_dlpack(&s, Spec::new(kDLCPU, &shape, &strides).versioned(&storage, 0).cast()) }?;
    assert_eq!(DELETED.load(Ordering::SeqCst), deleted + 2);
    assert_eq!(t.to_vec::<f32>(&s)?, gather(&storage, &shape, &strides, 0));
    Ok(())
}

/// Refused capsules (each named by its field) are not taken: their deleter has not run.
fn bad_capsules_are_refused_and_not_taken(ctx: &Context) -> Result<()> {
    let _deletes = count_deletes();
    let s = ctx.new_stream()?;
    let dev = if ctx.device_id().is_some() { kDLExtDev } else { kDLCPU };
    let storage = random::<f32>(12, 4);
    let other = if dev == kDLCPU { kDLExtDev } else { kDLCPU };
    let ok = || Spec::new(dev, &[3, 4], &[4, 1]);
    let cases: Vec<(&str, Spec, u64)> = vec![
        ("device_type", Spec::new(kDLCUDA, &[3, 4], &[4, 1]), 0),
        ("device_id", Spec { device: DLDevice { device_type: dev, device_id: 1 }, ..ok() }, 0),
        // (On the CPU backend, host memory labelled kDLExtDev: it is refused unread.)
        ("device_type", Spec { device_memory: false, ..Spec::new(other, &[3, 4], &[4, 1]) }, 0),
        ("dtype", Spec { dtype: DLDataType { code: kDLUInt, bits: 32, lanes: 1 }, ..ok() }, 0),
        ("dtype", Spec { dtype: DLDataType { code: kDLFloat, bits: 64, lanes: 1 }, ..ok() }, 0),
        ("dtype", Spec { dtype: DLDataType { code: 9, bits: 32, lanes: 1 }, ..ok() }, 0),
        ("dtype", Spec { dtype: DLDataType { code: kDLFloat, bits: 32, lanes: 2 }, ..ok() }, 0),
        ("ndim", Spec::new(dev, &[1; 9], &[1; 9]), 0),
        ("shape", Spec::new(dev, &[3, -4], &[4, 1]), 0),
        ("strides", Spec::new(dev, &[3, 4], &[-4, 1]), 0),
        ("strides", Spec::new(dev, &[3, 4], &[i64::MAX / 2, 1]), 0),
        ("strides", Spec::new(dev, &[2, 4], &[i64::MAX / 8, i64::MAX / 8]), 0),
        ("data", Spec { null_data: true, ..ok() }, 0),
        ("data", Spec { lead: 2, ..ok() }, 0),
        ("byte_offset", Spec { byte_offset: 6, ..ok() }, 0),
        ("flags", ok(), DLPACK_FLAG_BITMASK_READ_ONLY),
    ];
    for (field, spec, flags) in &cases {
        let deleted = DELETED.load(Ordering::SeqCst);
        let p = spec.versioned(&storage, *flags);
        // SAFETY: a live capsule; refused before its memory is used.
        let err = unsafe { Tensor::from_dlpack(&s, p.cast()) }.unwrap_err();
        assert_eq!(argument(&err), *field, "{err}");
        // The legacy form is refused alike (it has no flags).
        let l = (*flags == 0).then(|| spec.legacy(&storage));
        if let Some(l) = l {
            // SAFETY: as above.
            let err = unsafe { Tensor::from_dlpack_legacy(&s, l.cast()) }.unwrap_err();
            assert_eq!(argument(&err), *field, "{err}");
        }
        assert_eq!(DELETED.load(Ordering::SeqCst), deleted, "a refused capsule is not taken");
        // Still the caller's: deleted once each, here.
        delete_versioned(p);
        if let Some(l) = l {
            // SAFETY: a live capsule, deleted once.
            unsafe { ((*l).deleter.unwrap())(l) };
        }
        assert_eq!(DELETED.load(Ordering::SeqCst), deleted + 1 + u64::from(l.is_some()));
    }
    // Another major version: refused before any other field is read.
    let p = ok().versioned(&storage, 0);
    unsafe { (*p).version = DLPackVersion { major: 2, minor: 0 } };
    // SAFETY: as above.
    assert_eq!(argument(&unsafe { Tensor::from_dlpack(&s, p.cast()) }.unwrap_err()), "version");
    delete_versioned(p);
    // Null pointers.
    // SAFETY: null is refused.
    unsafe {
        assert_eq!(argument(&Tensor::from_dlpack(&s, std::ptr::null_mut()).unwrap_err()), "raw");
        assert_eq!(argument(&Tensor::from_dlpack_legacy(&s, std::ptr::null_mut()).unwrap_err()), "raw");
    }
    Ok(())
}

/// A capsule made here whose strides were changed to reach past its buffer is refused.
fn own_capsules_are_checked_against_their_buffer(ctx: &Context) -> Result<()> {
    if ctx.device_id().is_none() {
        return Ok(()); // a CPU capsule is checked like any host memory
    }
    let s = ctx.new_stream()?;
    let t = Tensor::from_slice(&s, &random::<f32>(12, 2), &[3, 4])?;
    let base = ctx.memory_stats().allocated;
    let p = t.to_dlpack(&s)?.into_raw().cast::<DLManagedTensorVersioned>();
    // Past the block the allocator rounded the 48 bytes up to.
    unsafe { *(*p).dl_tensor.strides = 1000 };
    // SAFETY: a live capsule; refused before it is taken.
    let err = unsafe { Tensor::from_dlpack(&s, p.cast()) }.unwrap_err();
    assert_eq!(argument(&err), "strides", "{err}");
    delete_versioned(p);
    // `data` outside the buffer is refused too.
    let p = t.to_dlpack(&s)?.into_raw().cast::<DLManagedTensorVersioned>();
    unsafe { (*p).dl_tensor.data = (*p).dl_tensor.data.cast::<u8>().wrapping_add(4096).cast() };
    // SAFETY: as above.
    assert_eq!(argument(&unsafe { Tensor::from_dlpack(&s, p.cast()) }.unwrap_err()), "data");
    delete_versioned(p);
    // The spec's other form of one view, `data` at the buffer and the offset in `byte_offset`,
    // is the same tensor.
    let v = Tensor::from_slice_strided(&s, &random::<f32>(12, 3), &[2, 4], &[4, 1], 4)?;
    let p = v.to_dlpack(&s)?.into_raw().cast::<DLManagedTensorVersioned>();
    unsafe {
        (*p).dl_tensor.data = v.device_ptr().unwrap();
        (*p).dl_tensor.byte_offset = 16;
    }
    // SAFETY: a live capsule made by to_dlpack (then moved within its buffer), handed over.
    let back = unsafe { Tensor::from_dlpack(&s, p.cast()) }?;
    assert_eq!((back.offset(), back.to_vec::<f32>(&s)?), (4, v.to_vec::<f32>(&s)?));
    drop((t, v, back));
    assert!(ctx.memory_stats().allocated < base, "the capsule was deleted once, freeing the buffer");
    Ok(())
}

on_both_backends!(
    local: [
        round_trips_keep_values_and_memory,
        to_dlpack_as_picks_the_device_type,
        odd_shapes_round_trip,
        an_unused_dlpack_frees_its_buffer_on_drop,
        deleters_run_on_other_threads,
        own_capsules_are_checked_against_their_buffer,
    ],
    // Serialised with the mock's tests (the CPU runs too): they count deletes in `DELETED`.
    cross: [
        streams_of_another_backend_are_refused,
        cpu_capsules_are_copied_and_deleted,
        bad_capsules_are_refused_and_not_taken,
    ],
);

#[cfg(feature = "mock")]
mod mock_memory {
    //! The producer's device memory on the mock: `aclrtMalloc`, `aclrtMemcpy`, `aclrtFree` on
    //! device 0.
    use std::ffi::c_void;

    use ascend::sys::{aclrtMemMallocPolicy, aclrtMemcpyKind, Cann};

    pub fn cann() -> &'static Cann {
        ascend::sys::load_from(ascend::mock::toolkit_dir()).expect("the mock toolkit")
    }

    pub fn alloc(bytes: usize) -> *mut c_void {
        let mut p = std::ptr::null_mut();
        // SAFETY: plain arguments and an out-pointer.
        unsafe {
            assert_eq!(cann().acl.aclrtSetDevice(0), 0);
            assert_eq!(cann().acl.aclrtMalloc(&mut p, bytes, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST), 0);
        }
        p
    }

    pub fn upload(dst: *mut c_void, values: &[f32]) {
        let bytes = std::mem::size_of_val(values);
        // SAFETY: `dst` has room for `values` (allocated for them).
        let st = unsafe {
            cann().acl.aclrtMemcpy(
                dst,
                bytes,
                values.as_ptr().cast(),
                bytes,
                aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_DEVICE,
            )
        };
        assert_eq!(st, 0);
    }

    pub fn free(p: *mut c_void) {
        // SAFETY: memory from `alloc`, freed once.
        unsafe {
            assert_eq!(cann().acl.aclrtSetDevice(0), 0);
            assert_eq!(cann().acl.aclrtFree(p), 0);
        }
    }
}

#[cfg(feature = "mock")]
mod torch_npu {
    //! Capsules shaped like torch_npu's (`DLConvertor.cpp`: kDLExtDev, the device index, the
    //! tensor's sizes and strides, `data_ptr()` with a zero byte offset, its own deleter),
    //! consumed in place by operators; the deleter runs once, after the device work.
    use super::*;
    use ascend::ops::{batch_norm_reduce_backward, OutputMask};

    fn channel_sums(storage: &[f32], shape: &[i64], strides: &[i64], offset: usize) -> Vec<f64> {
        let v = gather(storage, shape, strides, offset);
        let c = shape[1] as usize;
        (0..c).map(|j| v.iter().skip(j).step_by(c).map(|&x| f64::from(x)).sum()).collect()
    }

    fn consumed_in_place(legacy: bool) {
        common::mock::on_stream(|ctx, s| {
            let (n, c) = (6usize, 4usize);
            // torch's `x[1:]` of a [7, 4] tensor: data_ptr() 16 bytes into the allocation, not on
            // a 32-byte boundary; byte_offset 0.
            let storage = random::<f32>(n * c, 21);
            let spec = Spec { lead: 16, ..Spec::new(kDLExtDev, &[n as i64, c as i64], &[c as i64, 1]) };
            let raw: *mut c_void =
                if legacy { spec.legacy(&storage).cast() } else { spec.versioned(&storage, 0).cast() };
            let deleted = DELETED.load(Ordering::SeqCst);
            let before = waits_and_copies();
            // SAFETY: a live capsule over memory of device 0 that nothing else writes.
            let x = unsafe {
                if legacy {
                    Tensor::from_dlpack_legacy(&s, raw)
                } else {
                    Tensor::from_dlpack(&s, raw)
                }
            }?;
            assert_eq!(waits_and_copies(), before, "imported without a wait or a copy");
            let mean = Tensor::zeros(&s, DType::F32, &[c])?;
            let invstd = Tensor::from_slice(&s, &vec![1f32; c], &[c])?;
            let mask = OutputMask { input_g: false, weight_g: false, bias_g: true };
            let r = batch_norm_reduce_backward(&s, &x, &x, &mean, &invstd, None, mask)?;
            assert!(ascend::mock::live_events_and_queued_tasks().1 > 0, "the kernel is queued");
            let waits = host_waits();
            // The mock's device runs the kernel when the event recorded after it is queried (as
            // hardware runs while the host works): then the capsule is deleted, no host wait.
            drop(x);
            assert_eq!(host_waits(), waits, "the drop waits for nothing");
            assert_eq!(DELETED.load(Ordering::SeqCst), deleted + 1, "deleted once, at the last drop");
            assert_eq!(QUEUED_AT_DELETE.load(Ordering::SeqCst), 0, "deleted after the device work");
            let got: Vec<f32> = r.grad_bias.unwrap().to_vec(&s)?;
            for (g, e) in got.iter().zip(channel_sums(&storage, &[n as i64, c as i64], &[c as i64, 1], 0)) {
                assert!((f64::from(*g) - e).abs() <= 1e-5 * e.abs().max(1.0), "gradBias {g} vs {e}");
            }
            let _ = ctx;
            Ok(())
        });
    }

    #[test]
    fn a_legacy_torch_npu_capsule_is_used_in_place_and_deleted_once_after_the_work() {
        consumed_in_place(true);
    }

    #[test]
    fn a_versioned_torch_npu_capsule_is_used_in_place_and_deleted_once_after_the_work() {
        consumed_in_place(false);
    }

    /// A transposed torch_npu view (`x.t()`), read back exactly; an early drop (never used)
    /// deletes at once; a dropped view on another thread deletes there.
    #[test]
    fn views_read_back_and_early_drops_delete_once() {
        common::mock::on_stream(|_, s| {
            let storage = random::<f32>(24, 22);
            let (shape, strides) = ([4i64, 6], [1i64, 4]);
            let deleted = DELETED.load(Ordering::SeqCst);
            let spec = Spec::new(kDLAscend, &shape, &strides);
            // SAFETY: a live capsule over device-0 memory.
            let t = unsafe { Tensor::from_dlpack(&s, spec.versioned(&storage, 0).cast()) }?;
            assert_eq!(t.to_vec::<f32>(&s)?, gather(&storage, &shape, &strides, 0));
            assert_eq!(DELETED.load(Ordering::SeqCst), deleted);
            std::thread::spawn(move || drop(t)).join().unwrap();
            assert_eq!(DELETED.load(Ordering::SeqCst), deleted + 1);
            // SAFETY: as above.
            let t = unsafe { Tensor::from_dlpack_legacy(&s, spec.legacy(&storage).cast()) }?;
            drop(t);
            assert_eq!(DELETED.load(Ordering::SeqCst), deleted + 2);
            // Empty: nothing addressed, deleted at once.
            let empty = Spec { null_data: true, ..Spec::new(kDLExtDev, &[0, 3], &[3, 1]) };
            // SAFETY: as above.
            let t = unsafe { Tensor::from_dlpack(&s, empty.versioned(&[], 0).cast()) }?;
            assert_eq!((t.shape(), t.numel()), (&[0usize, 3][..], 0));
            assert_eq!(DELETED.load(Ordering::SeqCst), deleted + 3);
            Ok(())
        });
    }

    /// The stream contract: work queued on the tensor (a kernel on `s1`) is ordered before the
    /// consumer's work on the export stream (`s2`, here an `aclrtMemcpyAsync` of the test's):
    /// the mock counts a hazard otherwise.
    #[test]
    fn exported_memory_is_ready_for_work_on_the_export_stream() {
        common::mock::on_stream(|ctx, s1| {
            let (n, c) = (8usize, 4usize);
            let data = random::<f32>(n * c, 31);
            let x = Tensor::from_slice(&s1, &data, &[n, c])?;
            let mean = Tensor::zeros(&s1, DType::F32, &[c])?;
            let invstd = Tensor::from_slice(&s1, &vec![1f32; c], &[c])?;
            let mask = OutputMask { input_g: false, weight_g: false, bias_g: true };
            let y = batch_norm_reduce_backward(&s1, &x, &x, &mean, &invstd, None, mask)?.grad_bias.unwrap();
            let s2 = ctx.new_stream()?;
            let before = waits_and_copies();
            let d = y.to_dlpack(&s2)?;
            assert_eq!(waits_and_copies(), before, "ordered on the device, not by a host wait");
            let dst = mock_memory::alloc(4 * c);
            let src = d.dl_tensor().data;
            // SAFETY: `src` holds c f32 (the capsule keeps it), `dst` has room for them; both on
            // device 0, which is bound; s2 is live.
            let st = unsafe {
                mock_memory::cann().acl.aclrtMemcpyAsync(
                    dst,
                    4 * c,
                    src,
                    4 * c,
                    ascend::sys::aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_DEVICE,
                    s2.as_raw().unwrap(),
                )
            };
            assert_eq!(st, 0);
            drop((y, d)); // the consumer is done: its deleter (the buffer goes after s2's copy)
            s2.synchronize()?;
            let mut got = vec![0f32; c];
            // SAFETY: `dst` holds c f32 written by the completed copy.
            let st = unsafe {
                mock_memory::cann().acl.aclrtMemcpy(
                    got.as_mut_ptr().cast(),
                    4 * c,
                    dst,
                    4 * c,
                    ascend::sys::aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_HOST,
                )
            };
            assert_eq!(st, 0);
            mock_memory::free(dst);
            let sums = channel_sums(&data, &[n as i64, c as i64], &[c as i64, 1], 0);
            for (g, e) in got.iter().zip(sums) {
                assert!((f64::from(*g) - e).abs() <= 1e-5 * e.abs().max(1.0), "gradBias {g} vs {e}");
            }
            Ok(())
        });
    }

    /// Turns the mock's progress at event queries back to what it was, when dropped.
    struct Restore(bool);

    impl Drop for Restore {
        fn drop(&mut self) {
            ascend::mock::set_query_progress(self.0);
        }
    }

    /// Keeps queued work in flight (no progress at event queries) until the value is dropped.
    fn in_flight() -> Restore {
        Restore(ascend::mock::set_query_progress(false))
    }

    /// A torch_npu-shaped capsule of `n`×`c` random values, imported on `s`.
    fn import(s: &Stream, n: usize, c: usize, seed: u64) -> Result<(Tensor, Vec<f32>)> {
        let storage = random::<f32>(n * c, seed);
        let p = Spec::new(kDLExtDev, &[n as i64, c as i64], &[c as i64, 1]).versioned(&storage, 0);
        // SAFETY: a live capsule over device-0 memory that nothing else writes.
        Ok((unsafe { Tensor::from_dlpack(s, p.cast()) }?, storage))
    }

    /// gradBias of `x` (a kernel that reads it, queued on `s`).
    fn read_by_a_kernel(s: &Stream, x: &Tensor) -> Result<Tensor> {
        let c = x.shape()[1];
        let mean = Tensor::zeros(s, DType::F32, &[c])?;
        let invstd = Tensor::from_slice(s, &vec![1f32; c], &[c])?;
        let mask = OutputMask { input_g: false, weight_g: false, bias_g: true };
        Ok(batch_norm_reduce_backward(s, x, x, &mean, &invstd, None, mask)?.grad_bias.unwrap())
    }

    fn deleted() -> u64 {
        DELETED.load(Ordering::SeqCst)
    }

    /// The mock's synchronises of every kind (stream, event, device) so far; the blocking copies
    /// (which the tests make to fill their capsules) left out.
    fn host_waits() -> [u64; 3] {
        let [stream, event, device, _] = waits_and_copies();
        [stream, event, device]
    }

    /// The drop of an imported tensor read by queued work never waits; the deleter runs only
    /// once that work has run (here at the synchronise that runs it: later polls see it still
    /// queued), exactly once.
    #[test]
    fn a_drop_never_waits_and_the_deleter_runs_once_after_the_work() {
        common::mock::on_stream(|_, s| {
            let (n, c) = (6usize, 4usize);
            let _flight = in_flight();
            let before_delete = deleted();
            let (x, storage) = import(&s, n, c, 51)?;
            let g = read_by_a_kernel(&s, &x)?;
            assert!(ascend::mock::live_events_and_queued_tasks().1 > 0, "the kernel is queued");
            let before = host_waits();
            drop(x);
            assert_eq!(host_waits(), before, "the drop waits for nothing");
            assert_eq!(deleted(), before_delete, "not deleted while the kernel is queued");
            // Polls (an allocation, event requests) see the kernel still queued.
            let more = Tensor::zeros(&s, DType::F32, &[16])?;
            // Imported on `s` (the producer's writes ordered before its work), never used: its
            // deleter too waits for what `s` queued before the import.
            let (y, _) = import(&s, 2, c, 52)?;
            drop(y);
            assert_eq!(deleted(), before_delete, "still not deleted");
            assert_eq!(host_waits(), before, "polls wait for nothing");
            // The synchronise that runs the work, on another thread, calls the deleter there.
            let (s, poller) = std::thread::spawn(move || {
                let r = s.synchronize().map(|()| std::thread::current().id());
                (s, r)
            })
            .join()
            .unwrap();
            let poller = poller?;
            assert_eq!(deleted(), before_delete + 2, "deleted at the poll after the work ran");
            assert_eq!(*DELETER_THREAD.lock().unwrap(), Some(poller), "deleted on the polling thread");
            assert_eq!(QUEUED_AT_DELETE.load(Ordering::SeqCst), 0, "deleted after the device work");
            let got: Vec<f32> = g.to_vec(&s)?;
            for (g, e) in got.iter().zip(channel_sums(&storage, &[n as i64, c as i64], &[c as i64, 1], 0)) {
                assert!((f64::from(*g) - e).abs() <= 1e-5 * e.abs().max(1.0), "gradBias {g} vs {e}");
            }
            drop(more);
            s.synchronize()?;
            assert_eq!(deleted(), before_delete + 2, "deleted once");
            Ok(())
        });
    }

    /// `times` imports, each read by a kernel and dropped, without a synchronise (`each` after
    /// every drop); returns the most capsules not yet deleted at once.
    fn import_use_drop(s: &Stream, times: u64, mut each: impl FnMut()) -> Result<u64> {
        let first = deleted();
        let mut parked = 0;
        for i in 0..times {
            let (x, _) = import(s, 4, 2, 1000 + i)?;
            let g = read_by_a_kernel(s, &x)?;
            drop((x, g));
            parked = parked.max(i + 1 - (deleted() - first));
            each();
        }
        Ok(parked)
    }

    /// With the device progressing (the mock's queries run the queued work, as hardware runs
    /// while the host works), 1,000 imports read by a kernel and dropped without a synchronise
    /// are deleted as they go: the parked capsules and the live events stay bounded, and no host
    /// wait is made.
    #[test]
    fn a_thousand_drops_without_a_synchronise_stay_bounded() {
        common::mock::on_stream(|_, s| {
            let first = deleted();
            let before = host_waits();
            let events = ascend::mock::live_events_on(0);
            let mut live = 0;
            let parked = import_use_drop(&s, 1000, || live = live.max(ascend::mock::live_events_on(0)))?;
            assert_eq!(host_waits(), before, "no host wait");
            assert!(parked <= 1, "at most {parked} capsules waited for their events at once");
            assert!(live <= events + 64, "{live} live events (from {events})");
            assert_eq!(deleted() - first, 1000);
            Ok(())
        });
    }

    /// With the work held in flight, drops park their capsules until the pool's event bound
    /// (4096 per device) is reached; then a drop that cannot record an event synchronises its
    /// stream instead, which lets every parked capsule go: the list never grows past the bound.
    #[test]
    fn parked_capsules_are_bounded_by_the_event_pool() {
        common::mock::on_stream(|_, s| {
            let _flight = in_flight();
            let first = deleted();
            let syncs = ascend::mock::stats().stream_synchronizes;
            let parked = import_use_drop(&s, 4500, || {})?;
            assert!(parked <= 4096, "{parked} capsules parked at once");
            assert!(ascend::mock::stats().stream_synchronizes > syncs, "the bound made a drop wait");
            s.synchronize()?;
            assert_eq!(deleted() - first, 4500);
            Ok(())
        });
    }

    /// A context dropped while capsules are parked (their work still queued) deletes each once,
    /// after that work.
    #[test]
    fn a_dropped_context_deletes_parked_capsules_once() {
        let _lock = common::mock::lock();
        ascend::mock::clear_faults();
        let _flight = in_flight();
        let first = deleted();
        let ctx = common::mock::context();
        let s = ctx.new_stream().unwrap();
        let (x, _) = import(&s, 4, 2, 61).unwrap();
        let (y, _) = import(&s, 4, 2, 62).unwrap();
        let g = read_by_a_kernel(&s, &x).unwrap();
        let h = read_by_a_kernel(&s, &y).unwrap();
        drop((x, y));
        assert_eq!(deleted(), first, "parked");
        drop((g, h, s, ctx));
        assert_eq!(deleted(), first + 2, "deleted at the teardown");
        assert_eq!(QUEUED_AT_DELETE.load(Ordering::SeqCst), 0, "after the device work");
    }

    /// A stream on which no event can be recorded is synchronised at the drop instead (the
    /// deleter then runs at once, after the work); if that fails too, the capsule is leaked,
    /// never deleted, and the leak is counted.
    #[test]
    fn a_failed_record_falls_back_to_a_wait_and_a_failed_wait_leaks() {
        let _lock = common::mock::lock();
        ascend::mock::clear_faults();
        let _flight = in_flight();
        let ctx = common::mock::context();
        let s = ctx.new_stream().unwrap();
        let fail_records = || {
            // The pool retries a failed record once: both fail.
            ascend::mock::fail_next_on_this_thread("aclrtRecordEvent", 507899);
            ascend::mock::fail_next("aclrtRecordEvent", 507899);
        };
        let (x, _) = import(&s, 4, 2, 71).unwrap();
        let g = read_by_a_kernel(&s, &x).unwrap();
        let deleted_before = deleted();
        let syncs = ascend::mock::stats().stream_synchronizes;
        fail_records();
        drop(x);
        ascend::mock::clear_faults();
        assert_eq!(ascend::mock::stats().stream_synchronizes, syncs + 1, "the stream was waited for");
        assert_eq!(deleted(), deleted_before + 1, "deleted after the wait");
        assert_eq!(QUEUED_AT_DELETE.load(Ordering::SeqCst), 0, "after the device work");

        let storage = random::<f32>(8, 72);
        let p = Spec::new(kDLExtDev, &[4, 2], &[2, 1]).versioned(&storage, 0);
        // SAFETY: a live capsule over device-0 memory.
        let x = unsafe { Tensor::from_dlpack(&s, p.cast()) }.unwrap();
        let h = read_by_a_kernel(&s, &x).unwrap();
        let leaks = ascend::mock::leaks().allocations;
        fail_records();
        ascend::mock::fail_next_on_this_thread("aclrtSynchronizeStream", 507899);
        drop(x);
        ascend::mock::clear_faults();
        assert_eq!(deleted(), deleted_before + 1, "not deleted while work may be queued");
        assert_eq!(ascend::mock::leaks().allocations, leaks + 1, "the leak is counted");
        // The test, as the producer, takes its memory back once the work is done.
        s.synchronize().unwrap();
        drop((g, h));
        delete_versioned(p);
        assert_eq!(deleted(), deleted_before + 2);
    }

    /// [`import`], its deleter then running `then`.
    fn import_then(
        s: &Stream,
        n: usize,
        c: usize,
        seed: u64,
        then: impl FnOnce() + Send + 'static,
    ) -> Result<(Tensor, Vec<f32>)> {
        let storage = random::<f32>(n * c, seed);
        let p = Spec::new(kDLExtDev, &[n as i64, c as i64], &[c as i64, 1]).versioned(&storage, 0);
        // SAFETY: `p` is the `head` of a boxed `Owner`, not handed out yet.
        unsafe { (*p.cast::<Owner<DLManagedTensorVersioned>>()).then = Some(Box::new(then)) };
        // SAFETY: a live capsule over device-0 memory that nothing else writes.
        Ok((unsafe { Tensor::from_dlpack(s, p.cast()) }?, storage))
    }

    /// Checks gradBias `g` of `n`×`c` values `storage` against the f64 sums.
    fn assert_grad_bias(s: &Stream, g: &Tensor, storage: &[f32], n: usize, c: usize) -> Result<()> {
        let got: Vec<f32> = g.to_vec(s)?;
        for (g, e) in got.iter().zip(channel_sums(storage, &[n as i64, c as i64], &[c as i64, 1], 0)) {
            assert!((f64::from(*g) - e).abs() <= 1e-5 * e.abs().max(1.0), "gradBias {g} vs {e}");
        }
        Ok(())
    }

    /// Runs `f` on another thread and waits for it at most a minute: a deadlock fails the test
    /// instead of hanging it (the stuck thread is left behind).
    fn without_deadlock<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(60)).unwrap_or_else(|_| panic!("{what} deadlocked"))
    }

    /// A deleter that comes back into the crate runs when this thread holds no lock of the crate:
    /// here it drops a tensor whose memory work on a borrowed stream used (its drop records an
    /// event on that stream) while dropping that `Stream` releases it, which synchronises it and
    /// so completes the deleter's wait.
    #[test]
    fn a_deleter_may_use_the_borrowed_stream_whose_release_completes_it() {
        let _lock = common::mock::lock();
        ascend::mock::clear_faults();
        let before = ascend::mock::stats();
        let ctx = common::mock::context();
        let cann = mock_memory::cann();
        let mut raw: ascend::sys::aclrtStream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer on device 0, bound.
        unsafe {
            assert_eq!(cann.acl.aclrtSetDevice(0), 0);
            assert_eq!(cann.acl.aclrtCreateStream(&mut raw), 0);
        }
        let run = || -> Result<()> {
            // SAFETY: `raw` is live until destroyed below, after the Stream is gone.
            let b = unsafe { Stream::from_raw(&ctx, raw) }?;
            let flight = in_flight();
            let first = deleted();
            let (n, c) = (6usize, 4usize);
            let held: std::sync::Arc<std::sync::Mutex<Option<Tensor>>> = Default::default();
            let slot = held.clone();
            let (x, storage) = import_then(&b, n, c, 81, move || drop(slot.lock().unwrap().take()))?;
            assert_grad_bias(&b, &read_by_a_kernel(&b, &x)?, &storage, n, c)?;
            // Queued (not run: no progress), its memory listing `b`; the deleter's to drop.
            *held.lock().unwrap() = Some(read_by_a_kernel(&b, &x)?);
            drop(x);
            assert_eq!(deleted(), first, "parked: the kernel is queued");
            without_deadlock("dropping the borrowed stream", move || drop(b));
            assert_eq!(deleted(), first + 1, "deleted at the release, after the work");
            assert_eq!(QUEUED_AT_DELETE.load(Ordering::SeqCst), 0, "after the device work");
            assert!(held.lock().unwrap().is_none(), "the deleter dropped the tensor");
            drop(flight);
            Ok(())
        };
        let result = run();
        drop(ctx);
        // SAFETY: the crate no longer uses `raw`.
        unsafe {
            assert_eq!(cann.acl.aclrtSetDevice(0), 0);
            assert_eq!(cann.acl.aclrtDestroyStream(raw), 0);
        }
        result.unwrap();
        let after = ascend::mock::stats();
        assert_eq!(after.violations, before.violations);
        assert_eq!(after.live_allocations, before.live_allocations, "the tensor's memory went back");
    }

    /// A deleter runs when this thread holds no lock of the crate: here it reads a tensor (a second
    /// handle to the memory a kernel on `s2` writes) while the host read that completes its wait
    /// (`to_vec`, which synchronises `s2` holding that memory's list of streams) is under way.
    #[test]
    fn a_deleter_may_read_the_memory_whose_host_read_completes_it() {
        common::mock::on_stream(|ctx, s| {
            let flight = in_flight();
            let first = deleted();
            let (n, c) = (6usize, 4usize);
            let s2 = ctx.new_stream()?;
            type Handed = std::sync::Arc<std::sync::Mutex<Option<(Tensor, Stream)>>>;
            type Read = std::sync::Arc<std::sync::Mutex<Option<Result<Vec<f32>>>>>;
            let (handed, read): (Handed, Read) = Default::default();
            let (take, put) = (handed.clone(), read.clone());
            let (x, storage) = import_then(&s2, n, c, 82, move || {
                let (again, s3) = take.lock().unwrap().take().expect("handed over");
                *put.lock().unwrap() = Some(again.to_vec(&s3));
            })?;
            let g = read_by_a_kernel(&s2, &x)?; // queued on s2, not run (no progress)
                                                // SAFETY: made by to_dlpack, handed over once.
            let again = unsafe { Tensor::from_dlpack(&s2, g.to_dlpack(&s2)?.into_raw()) }?;
            *handed.lock().unwrap() = Some((again, ctx.new_stream()?));
            drop(x);
            assert_eq!(deleted(), first, "parked: the kernel is queued");
            let (g, s, got) = without_deadlock("reading the tensor", move || {
                let got = g.to_vec::<f32>(&s);
                (g, s, got)
            });
            let got = got?;
            s.synchronize()?;
            assert_eq!(deleted(), first + 1, "deleted by then, once");
            assert_eq!(QUEUED_AT_DELETE.load(Ordering::SeqCst), 0, "after the device work");
            let by_deleter = read.lock().unwrap().take().expect("the deleter ran")?;
            assert_eq!(by_deleter, got, "the deleter read the same values");
            for (g, e) in got.iter().zip(channel_sums(&storage, &[n as i64, c as i64], &[c as i64, 1], 0)) {
                assert!((f64::from(*g) - e).abs() <= 1e-5 * e.abs().max(1.0), "gradBias {g} vs {e}");
            }
            drop((flight, g));
            Ok(())
        });
    }

    /// Re-exported to another stream: the exchange of an imported tensor orders its pending
    /// work before the consumer's stream without a host wait.
    #[test]
    fn an_imported_tensor_can_be_exported_again() {
        common::mock::on_stream(|ctx, s| {
            let storage = random::<f32>(8, 23);
            let spec = Spec::new(kDLExtDev, &[2, 4], &[4, 1]);
            // SAFETY: a live capsule over device-0 memory.
            let t = unsafe { Tensor::from_dlpack(&s, spec.versioned(&storage, 0).cast()) }?;
            let s2 = ctx.new_stream()?;
            let before = waits_and_copies();
            // SAFETY: made by to_dlpack, handed over once.
            let back = unsafe { Tensor::from_dlpack(&s2, t.to_dlpack(&s2)?.into_raw()) }?;
            assert_eq!(waits_and_copies(), before);
            assert_eq!(back.device_ptr(), t.device_ptr());
            let deleted = DELETED.load(Ordering::SeqCst);
            drop(t);
            assert_eq!(DELETED.load(Ordering::SeqCst), deleted, "the re-imported tensor still uses the memory");
            assert_eq!(back.to_vec::<f32>(&s2)?, storage);
            drop(back);
            assert_eq!(DELETED.load(Ordering::SeqCst), deleted + 1);
            Ok(())
        });
    }
}
