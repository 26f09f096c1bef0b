//! Raw handles in and out, and deterministic mode, on the mock CANN: a caller's `aclrtStream`
//! and `HcclComm` are used like the crate's own and never destroyed by it; the deterministic
//! option lands on the device's context.
#![cfg(feature = "mock")]

mod common;

use std::sync::{Mutex, MutexGuard, OnceLock};

use ascend::hccl::{Communicator, ReduceOp};
use ascend::ops::{batch_norm_reduce_backward, OutputMask};
use ascend::sys::{aclSysParamOpt, aclrtStream, Cann, HcclComm, HcclResult};
use ascend::{Context, Stream, Tensor};

static SERIAL: Mutex<()> = Mutex::new(());

fn setup() -> MutexGuard<'static, ()> {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| std::env::set_var("ASCEND_MOCK_DEVICE_COUNT", "2"));
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn cann() -> &'static Cann {
    ascend::sys::load_from(ascend::mock::toolkit_dir()).expect("the mock toolkit")
}

/// Random values in [-1, 1).
fn random(n: usize, seed: u64) -> Vec<f32> {
    common::Rng::new(seed).vec_f32(n, -1.0, 1.0)
}

/// `aclrtCtxGetSysParamOpt(ACL_OPT_DETERMINISTIC)` on this thread's current device.
fn deterministic_option() -> i64 {
    let mut v = -1i64;
    // SAFETY: a plain out-pointer; the caller bound a device on this thread.
    let st = unsafe { cann().acl.aclrtCtxGetSysParamOpt(aclSysParamOpt::ACL_OPT_DETERMINISTIC, &mut v) };
    assert_eq!(st, 0);
    v
}

fn bind(device: i32) {
    // SAFETY: a plain value argument.
    assert_eq!(unsafe { cann().acl.aclrtSetDevice(device) }, 0);
}

#[test]
fn set_deterministic_sets_the_option_of_that_device_only() {
    let _g = setup();
    let d0 = ascend::mock::context(0).unwrap();
    let d1 = ascend::mock::context(1).unwrap();
    d0.set_deterministic(true).unwrap();
    bind(0);
    assert_eq!(deterministic_option(), 1);
    bind(1);
    assert_eq!(deterministic_option(), 0, "device 1's context is untouched");
    d1.set_deterministic(true).unwrap();
    d0.set_deterministic(false).unwrap();
    bind(0);
    assert_eq!(deterministic_option(), 0);
    bind(1);
    assert_eq!(deterministic_option(), 1);
    d1.set_deterministic(false).unwrap();
    // The CPU backend is always deterministic: both settings succeed and change nothing.
    Context::cpu().set_deterministic(true).unwrap();
    Context::cpu().set_deterministic(false).unwrap();
    assert_eq!(d0.device_id(), Some(0));
    assert_eq!(d1.device_id(), Some(1));
    assert_eq!(Context::cpu().device_id(), None);
}

#[test]
fn a_foreign_stream_runs_operators_and_is_not_destroyed_on_drop() {
    let _g = setup();
    let ctx = ascend::mock::context(0).unwrap();
    bind(0);
    let mut raw: aclrtStream = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; device 0 is bound on this thread.
    assert_eq!(unsafe { cann().acl.aclrtCreateStream(&mut raw) }, 0);
    let before = ascend::mock::stats();
    // SAFETY: `raw` is live and destroyed below, after the Stream and its tensors are gone.
    let stream = unsafe { Stream::from_raw(&ctx, raw) }.unwrap();
    assert_eq!(stream.as_raw(), Some(raw));
    let (n, c) = (6usize, 3usize);
    let (dy, x, mean) = (random(n * c, 1), random(n * c, 2), random(c, 3));
    let invstd = vec![1f32; c];
    let out = {
        let t = |v: &[f32], shape: &[usize]| Tensor::from_slice(&stream, v, shape).unwrap();
        let (tdy, tx, tm, ti) = (t(&dy, &[n, c]), t(&x, &[n, c]), t(&mean, &[c]), t(&invstd, &[c]));
        batch_norm_reduce_backward(&stream, &tdy, &tx, &tm, &ti, None, OutputMask::ALL).unwrap()
        // the inputs drop here, before the stream ran: they are recorded on it
    };
    let sum_dy = out.sum_dy.unwrap().to_vec::<f32>(&stream).unwrap();
    let sum_dy_xmu = out.sum_dy_xmu.unwrap().to_vec::<f32>(&stream).unwrap();
    for j in 0..c {
        let want: f64 = (0..n).map(|i| dy[i * c + j] as f64).sum();
        let want_xmu: f64 = (0..n).map(|i| dy[i * c + j] as f64 * (x[i * c + j] as f64 - mean[j] as f64)).sum();
        assert!((sum_dy[j] as f64 - want).abs() < 1e-5, "{j}: {} vs {want}", sum_dy[j]);
        assert!((sum_dy_xmu[j] as f64 - want_xmu).abs() < 1e-5, "{j}: {} vs {want_xmu}", sum_dy_xmu[j]);
    }
    drop(stream);
    let after = ascend::mock::stats();
    assert_eq!(after.live_streams, before.live_streams, "the caller's stream is still alive");
    assert_eq!(after.violations, before.violations);
    bind(0);
    // SAFETY: the crate no longer uses `raw`.
    assert_eq!(unsafe { cann().acl.aclrtDestroyStream(raw) }, 0);
    assert_eq!(ascend::mock::stats().live_streams, before.live_streams - 1);
    // SAFETY: the contract is not reached: both calls are rejected before using the handle.
    assert!(unsafe { Stream::from_raw(&ctx, std::ptr::null_mut()) }.is_err());
    assert!(unsafe { Stream::from_raw(&Context::cpu(), raw) }.is_err());
}

#[test]
fn a_foreign_communicator_runs_collectives_and_is_not_destroyed_on_drop() {
    let _g = setup();
    let ctx = ascend::mock::context(0).unwrap();
    let hccl = cann().hccl().unwrap();
    let mut raw: HcclComm = std::ptr::null_mut();
    let mut devices = [0i32];
    bind(0);
    // SAFETY: one device id and room for one handle.
    assert_eq!(
        unsafe { (hccl.HcclCommInitAll.as_ref().unwrap())(1, devices.as_mut_ptr(), &mut raw) },
        HcclResult::HCCL_SUCCESS
    );
    let before = ascend::mock::stats();
    // SAFETY: `raw` is live, made on device 0, and destroyed below after the Communicator is gone.
    let comm = unsafe { Communicator::from_raw(&ctx, raw) }.unwrap();
    assert_eq!((comm.rank(), comm.size()), (0, 1));
    assert_eq!(comm.as_raw(), Some(raw));
    assert!(comm.async_error().unwrap().is_none());
    let stream = ctx.new_stream().unwrap();
    let data = random(33, 7);
    let mut t = Tensor::from_slice(&stream, &data, &[33]).unwrap();
    comm.all_reduce(&stream, &mut t, ReduceOp::Max).unwrap();
    assert_eq!(t.to_vec::<f32>(&stream).unwrap(), data, "one rank: the max is the input");
    drop(comm);
    assert_eq!(ascend::mock::stats().live_comms, before.live_comms, "the caller's communicator is still alive");
    bind(0);
    // SAFETY: the crate no longer uses `raw`.
    assert_eq!(unsafe { (hccl.HcclCommDestroy.as_ref().unwrap())(raw) }, HcclResult::HCCL_SUCCESS);
    assert_eq!(ascend::mock::stats().live_comms, before.live_comms - 1);
    // An owned communicator hands out its handle too; the CPU engine has none.
    let owned = Communicator::init_all(std::slice::from_ref(&ctx)).unwrap();
    assert!(owned[0].as_raw().is_some_and(|p| !p.is_null()));
    let cpu = Communicator::init_all(&[Context::cpu()]).unwrap();
    assert!(cpu[0].as_raw().is_none());
    assert!(cpu[0].async_error().unwrap().is_none());
    // SAFETY: rejected before the handle is used.
    assert!(unsafe { Communicator::from_raw(&ctx, std::ptr::null_mut()) }.is_err());
}

/// Σ over the channel dim 1 of a contiguous [n, c] matrix, in f64.
fn channel_sums(v: &[f32], c: usize) -> Vec<f64> {
    let mut s = vec![0f64; c];
    for (i, x) in v.iter().enumerate() {
        s[i % c] += f64::from(*x);
    }
    s
}

#[test]
fn a_tensor_over_foreign_device_memory_runs_operators_and_never_frees_it() {
    let _g = setup();
    let ctx = ascend::mock::context(0).unwrap();
    let s = ctx.new_stream().unwrap();
    let (n, c) = (6, 3);
    let data = random(n * c, 17);
    // The "caller's" memory: a tensor the caller keeps, handed over by its raw device pointer.
    let owner = Tensor::from_slice(&s, &data, &[n, c]).unwrap();
    let ptr = owner.device_ptr().expect("a device tensor has a device pointer");
    assert!(Tensor::from_slice(&Context::cpu().new_stream().unwrap(), &data, &[n, c]).unwrap().device_ptr().is_none());
    let before = ascend::mock::stats();
    let bytes = owner.storage_len() * 4;
    // The view's work runs on a stream of its own, dropped at the end (with its workspace).
    let owner_stream = s;
    let s = ctx.new_stream().unwrap();
    // SAFETY: `owner` keeps the memory allocated until after `view` (and its work) is gone.
    let view = unsafe { Tensor::from_raw_device(&s, ptr, ascend::DType::F32, &[n, c], &[c, 1], 0, bytes) }.unwrap();
    let mean = Tensor::zeros(&s, ascend::DType::F32, &[c]).unwrap();
    let invstd = Tensor::from_slice(&s, &[1f32; 3], &[c]).unwrap();
    let mask = OutputMask { input_g: false, weight_g: false, bias_g: true };
    let r = batch_norm_reduce_backward(&s, &view, &view, &mean, &invstd, None, mask).unwrap();
    drop(view); // waits for its work; frees nothing
    let got: Vec<f32> = r.grad_bias.unwrap().to_vec(&s).unwrap();
    for (g, e) in got.iter().zip(channel_sums(&data, c)) {
        assert!((f64::from(*g) - e).abs() <= 1e-5 * e.abs().max(1.0), "gradBias {g} vs {e}");
    }
    drop((mean, invstd, s));
    let s = owner_stream;
    ctx.empty_cache().unwrap(); // cached blocks are not leaks: compare without them
    let after = ascend::mock::stats();
    assert_eq!(after.live_allocations, before.live_allocations, "the foreign view freed nothing");
    assert_eq!(after.violations, before.violations);
    assert_eq!(owner.to_vec::<f32>(&s).unwrap(), data, "the owner's memory is intact and still its own");

    // Refused before anything is made: a CPU stream, a null or misaligned pointer, a view
    // outside the storage.
    let cpu = Context::cpu().new_stream().unwrap();
    // SAFETY: every call below is refused before the pointer is used.
    unsafe {
        let f32_ = ascend::DType::F32;
        assert!(Tensor::from_raw_device(&cpu, ptr, f32_, &[n, c], &[c, 1], 0, bytes).is_err());
        assert_eq!(
            Tensor::from_raw_device(&s, std::ptr::null_mut(), f32_, &[1], &[1], 0, 4).unwrap_err().status(),
            Some(161002)
        );
        let odd = ptr.cast::<u8>().wrapping_add(2).cast();
        assert_eq!(Tensor::from_raw_device(&s, odd, f32_, &[1], &[1], 0, 4).unwrap_err().status(), Some(161002));
        // Aligned to the dtype but not to the 32 bytes CANN wants of tensor data: refused too,
        // naming `ptr` (the way to view the middle of an allocation is `offset`).
        let element = ptr.cast::<u8>().wrapping_add(4).cast();
        let err = Tensor::from_raw_device(&s, element, f32_, &[1], &[1], 0, 4).unwrap_err();
        assert!(matches!(&err, ascend::Error::InvalidArgument { argument: "ptr", .. }), "{err:?}");
        assert!(err.to_string().contains("32"), "{err}");
        assert_eq!(
            Tensor::from_raw_device(&s, ptr, f32_, &[n, c], &[c, 1], 1, bytes).unwrap_err().status(),
            Some(161002),
            "one element past the storage"
        );
    }
    assert_eq!(ascend::mock::stats().live_allocations, before.live_allocations);
}

#[test]
fn the_mock_catches_foreign_memory_that_is_too_small_or_freed() {
    let _g = setup();
    let ctx = ascend::mock::context(0).unwrap();
    let s = ctx.new_stream().unwrap();
    let c = 4;
    let mean = Tensor::zeros(&s, ascend::DType::F32, &[c]).unwrap();
    let invstd = Tensor::from_slice(&s, &[1f32; 4], &[c]).unwrap();
    let mask = OutputMask { input_g: false, weight_g: false, bias_g: true };
    // A storage the caller claims is 256 elements, over a tensor of 8 (whose block the caching
    // allocator rounds up to 512 bytes: the claim reaches beyond the allocation itself).
    let small = Tensor::from_slice(&s, &random(8, 3), &[2, c]).unwrap();
    let ptr = small.device_ptr().unwrap();
    let before = ascend::mock::stats().violations;
    // SAFETY: deliberately false (the extent is larger than the allocation): the mock must catch
    // it when the memory is described to CANN, before any kernel reads it.
    let lie = unsafe { Tensor::from_raw_device(&s, ptr, ascend::DType::F32, &[64, c], &[c, 1], 0, 1024) }.unwrap();
    let r = batch_norm_reduce_backward(&s, &lie, &lie, &mean, &invstd, None, mask);
    let sync = s.synchronize();
    assert!(
        r.is_err() || sync.is_err() || ascend::mock::stats().violations > before,
        "memory beyond the caller's allocation was used unnoticed"
    );
    assert!(ascend::mock::stats().violations > before, "the mock counts the out-of-allocation view");
}
