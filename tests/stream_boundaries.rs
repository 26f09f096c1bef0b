//! Regression tests of the fourth audit's findings about streams and host buffers
//! (`reviews/audit-4.md`), through the public API on the mock CANN:
//!
//! * G02: a `HostBuffer` made on one device is refused by a copy on another device's stream (one
//!   rule for every handle: used only with work of its own device), so its drop never records an
//!   event on the wrong device nor waits;
//! * G06: a `Stream` over a caller's handle (`Stream::from_raw`) ends its life for the crate when
//!   it drops: the caller may destroy the handle then, and a host buffer, a tensor, a
//!   communicator and the memory cache that used it never touch it again.
#![cfg(feature = "mock")]

mod common;

use std::sync::{Mutex, MutexGuard};

use ascend::hccl::{Communicator, ReduceOp};
use ascend::mock::{self, stats};
use ascend::sys::{aclrtStream, Cann};
use ascend::{Context, DType, HostBuffer, Stream, Tensor};
use common::Rng;

static SERIAL: Mutex<()> = Mutex::new(());

/// The mock's counters are process-wide: one test at a time (2 mock devices).
fn setup() -> MutexGuard<'static, ()> {
    let g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    std::env::set_var("ASCEND_MOCK_DEVICE_COUNT", "2");
    g
}

fn cann() -> &'static Cann {
    ascend::sys::load_from(mock::toolkit_dir()).expect("the mock toolkit")
}

/// A stream made with the mock's exported `aclrtCreateStream` on `device`.
fn raw_stream(device: i32) -> aclrtStream {
    let mut raw: aclrtStream = std::ptr::null_mut();
    // SAFETY: plain runtime calls with a valid out-pointer.
    unsafe {
        assert_eq!(cann().acl.aclrtSetDevice(device), 0);
        assert_eq!(cann().acl.aclrtCreateStream(&mut raw), 0);
    }
    raw
}

/// Destroys a stream made by [`raw_stream`], as its owner would once the crate is done with it.
fn destroy(device: i32, raw: aclrtStream) {
    // SAFETY: `raw` is the caller's live stream; the crate promised not to use it any more.
    unsafe {
        assert_eq!(cann().acl.aclrtSetDevice(device), 0);
        assert_eq!(cann().acl.aclrtDestroyStream(raw), 0, "the handle was still alive");
    }
}

/// G02: a pinned buffer of device 0 copied on a stream of device 1 is refused both ways, nothing
/// is queued or written, and dropping it neither records on device 1's stream nor waits.
#[test]
fn g02_a_host_buffer_is_refused_on_another_devices_stream() {
    let _g = setup();
    let (ctx0, ctx1) = (mock::context(0).unwrap(), mock::context(1).unwrap());
    let before = stats();
    let data = Rng::new(21).vec_f32(4, -4.0, 4.0);
    let mut h = HostBuffer::<f32>::new(&ctx0, 4).unwrap();
    h.as_mut_slice().copy_from_slice(&data);
    let s1 = ctx1.new_stream().unwrap();
    let mut t = Tensor::zeros(&s1, DType::F32, &[4]).unwrap();
    let queued = stats().queued_tasks;
    let up = t.copy_from_host_async(&s1, &h);
    assert!(up.as_ref().is_err_and(|e| e.to_string().contains("device 0")), "{up:?}");
    let down = t.copy_to_host_async(&s1, &mut h);
    assert!(down.is_err(), "{down:?}");
    assert_eq!(stats().queued_tasks, queued, "nothing queued");
    let syncs = stats().stream_synchronizes;
    drop(h);
    assert_eq!(stats().stream_synchronizes, syncs, "dropping the buffer waits for nothing");
    assert_eq!(t.to_vec::<f32>(&s1).unwrap(), vec![0.0; 4], "nothing written");
    // The same buffer on its own device's stream works.
    let s0 = ctx0.new_stream().unwrap();
    let mut h = HostBuffer::<f32>::new(&ctx0, 4).unwrap();
    h.as_mut_slice().copy_from_slice(&data);
    let mut t0 = Tensor::zeros(&s0, DType::F32, &[4]).unwrap();
    t0.copy_from_host_async(&s0, &h).unwrap();
    assert_eq!(t0.to_vec::<f32>(&s0).unwrap(), data);
    assert_eq!(stats().violations, before.violations, "{:?}", mock::violations_since(before.violations));
}

/// G06 with host buffers and tensors: a copy queued on a borrowed stream, the `Stream` dropped,
/// the caller destroys its handle; then the host buffer's read and drop and a tensor's drop
/// never use the destroyed handle (the mock counts every use after destroy as a violation), and
/// the copied values are right.
#[test]
fn g06_a_released_borrowed_stream_is_never_used_by_host_buffers_or_tensors() {
    let _g = setup();
    let ctx = mock::context(0).unwrap();
    let before = stats();
    let data = Rng::new(22).vec_f32(8, -3.0, 3.0);
    let mut h = HostBuffer::<f32>::new(&ctx, data.len()).unwrap();
    h.as_mut_slice().copy_from_slice(&data);
    let mut down = HostBuffer::<f32>::new(&ctx, data.len()).unwrap();
    let raw = raw_stream(0);
    let own = ctx.new_stream().unwrap();
    let kept = {
        // SAFETY: `raw` is live until `destroy` below, after this Stream is dropped.
        let s = unsafe { Stream::from_raw(&ctx, raw) }.unwrap();
        let mut t = Tensor::zeros(&s, DType::F32, &[data.len()]).unwrap();
        t.copy_from_host_async(&s, &h).unwrap();
        t.copy_to_host_async(&s, &mut down).unwrap();
        let mut kept = Tensor::zeros(&s, DType::F32, &[data.len()]).unwrap();
        kept.copy_from_host_async(&s, &h).unwrap();
        kept
        // `s` and `t` drop here, with copies still queued on `raw`
    };
    destroy(0, raw);
    assert_eq!(down.as_slice(), &data[..], "the copies ran before the stream was released");
    // Work of another stream on the tensor that used the released stream: no ordering on it.
    assert_eq!(kept.to_vec::<f32>(&own).unwrap(), data);
    drop(kept);
    drop(h);
    drop(down);
    own.synchronize().unwrap();
    assert_eq!(stats().violations, before.violations, "{:?}", mock::violations_since(before.violations));
}

/// G06 with a communicator: its last collective ran on a borrowed stream; after that `Stream`
/// dropped and the caller destroyed the handle, the next collective on another stream and the
/// communicator's drop never use it, and the communicator is destroyed (not leaked).
#[test]
fn g06_a_communicator_does_not_use_a_released_borrowed_stream() {
    let _g = setup();
    let ctx = mock::context(0).unwrap();
    let comms = Communicator::init_all(std::slice::from_ref(&ctx)).unwrap();
    let (before, leaks) = (stats(), mock::leaks().communicators);
    let values = Rng::new(23).vec_f32(5, -2.0, 2.0);
    let raw = raw_stream(0);
    {
        // SAFETY: `raw` is live until `destroy` below, after this Stream is dropped.
        let s = unsafe { Stream::from_raw(&ctx, raw) }.unwrap();
        let mut t = Tensor::from_slice(&s, &values, &[5]).unwrap();
        comms[0].all_reduce(&s, &mut t, ReduceOp::Sum).unwrap();
    }
    destroy(0, raw);
    let s = ctx.new_stream().unwrap();
    let mut t = Tensor::from_slice(&s, &values, &[5]).unwrap();
    comms[0].all_reduce(&s, &mut t, ReduceOp::Max).unwrap();
    assert_eq!(t.to_vec::<f32>(&s).unwrap(), values, "one rank reduces to its own values");
    drop(comms);
    let after = stats();
    assert_eq!(after.live_comms, before.live_comms - 1, "the communicator was destroyed");
    assert_eq!(after.violations, before.violations, "{:?}", mock::violations_since(before.violations));
    assert_eq!(mock::leaks().communicators, leaks, "no communicator leaked");
}

/// G06 with the memory cache and the workspace: memory used on a borrowed stream, returned to
/// the cache after it was released, is handed out again without recording on (or waiting for)
/// the destroyed handle.
#[test]
fn g06_memory_used_on_a_released_borrowed_stream_is_reused_without_touching_it() {
    let _g = setup();
    let ctx: Context = mock::context(0).unwrap();
    let before = stats();
    let (n, c) = (4, 3);
    let data = Rng::new(24).vec_f32(n * c, -1.0, 1.0);
    let raw = raw_stream(0);
    let kept = {
        // SAFETY: `raw` is live until `destroy` below, after this Stream is dropped.
        let s = unsafe { Stream::from_raw(&ctx, raw) }.unwrap();
        let x = Tensor::from_slice(&s, &data, &[n, c]).unwrap();
        let (mean, invstd) = ascend::ops::batch_norm_stats(&s, &x, 1e-5).unwrap();
        drop(invstd);
        (x, mean)
    };
    destroy(0, raw);
    let s = ctx.new_stream().unwrap();
    let (x, mean) = kept;
    let got = mean.to_vec::<f32>(&s).unwrap();
    drop((x, mean));
    for _ in 0..3 {
        drop(ascend::ops::batch_norm_stats(&s, &Tensor::from_slice(&s, &data, &[n, c]).unwrap(), 1e-5).unwrap());
    }
    s.synchronize().unwrap();
    let want: Vec<f64> = (0..c).map(|ch| (0..n).map(|i| f64::from(data[i * c + ch])).sum::<f64>() / n as f64).collect();
    for (g, w) in got.iter().zip(&want) {
        assert!((f64::from(*g) - w).abs() < 1e-5, "{g} vs {w}");
    }
    assert_eq!(stats().violations, before.violations, "{:?}", mock::violations_since(before.violations));
}
