//! The mock's device count set per test at run time (`ascend::mock::set_device_count`), instead of
//! `ASCEND_MOCK_DEVICE_COUNT` read once by `aclInit`: what `aclrtGetDeviceCount` and
//! `Context::ascend_from` see follows each call, and shrinking below a device in use is refused.
//! The count is process-wide, so the tests here take one lock.
#![cfg(feature = "mock")]

use std::sync::{Mutex, MutexGuard};
use std::thread;

use ascend::mock;
use ascend::Error;

static DEVICES: Mutex<()> = Mutex::new(());
const HUGE_FIRST: ascend_sys::aclrtMemMallocPolicy = ascend_sys::aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST;

fn serial() -> MutexGuard<'static, ()> {
    DEVICES.lock().unwrap_or_else(|e| e.into_inner())
}

fn cann() -> &'static ascend_sys::Cann {
    ascend_sys::load_from(mock::toolkit_dir()).expect("the mock CANN loads")
}

/// `aclrtGetDeviceCount` (after `aclInit`, which `mock::context` does once per process).
fn acl_device_count() -> u32 {
    let mut count = u32::MAX;
    // SAFETY: `count` is a valid out-pointer.
    let status = unsafe { cann().acl.aclrtGetDeviceCount(&mut count) };
    assert_eq!(status, 0, "aclrtGetDeviceCount");
    count
}

/// Runs `f` on a fresh thread (its own current device, so raw `aclrtSetDevice` calls leave the
/// test thread's binding alone).
fn on_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    thread::scope(|s| s.spawn(f).join().expect("the thread does not panic"))
}

fn assert_no_device(result: ascend::Result<ascend::Context>, device: i32, count: u32) {
    match result {
        Err(Error::NoDevice { device: d, count: c }) => assert_eq!((d, c), (device, count)),
        Err(e) => panic!("device {device} of {count}: expected NoDevice, got {e}"),
        Ok(_) => panic!("device {device} of {count}: expected NoDevice, got a context"),
    }
}

fn assert_invalid_count(result: ascend::Result<()>, needle: &str) {
    match result {
        Err(Error::InvalidArgument { argument: "count", message, status }) => {
            assert_eq!(status, ascend::STATUS_INVALID);
            assert!(message.contains(needle), "{message:?} does not say {needle:?}");
        }
        other => panic!("expected InvalidArgument for `count` ({needle}), got {other:?}"),
    }
}

#[test]
fn the_count_is_what_the_test_sets_and_contexts_follow_it() {
    let _serial = serial();
    for n in [3u32, 1, 5, 2, 8] {
        mock::set_device_count(n).unwrap();
        on_thread(|| {
            // The last device opens and runs a stream. (No device memory through the crate here: a
            // device that held some could not be taken away again by the other tests.)
            let ctx = mock::context(n as i32 - 1).expect("the last device opens");
            let stream = ctx.new_stream().unwrap();
            stream.synchronize().unwrap();
            drop((stream, ctx));
            assert_no_device(mock::context(n as i32), n as i32, n);
        });
        assert_eq!(acl_device_count(), n);
    }
}

#[test]
fn zero_devices_and_counts_out_of_range() {
    let _serial = serial();
    mock::set_device_count(2).unwrap();
    mock::context(0).expect("device 0 of 2"); // aclInit done
    mock::set_device_count(0).unwrap();
    assert_eq!(acl_device_count(), 0);
    on_thread(|| assert_no_device(mock::context(0), 0, 0));

    assert_invalid_count(mock::set_device_count(mock::MAX_DEVICES + 1), "at most 64");
    assert_invalid_count(mock::set_device_count(u32::MAX), "at most 64");
    assert_eq!(acl_device_count(), 0, "a refused count changes nothing");
    mock::set_device_count(mock::MAX_DEVICES).unwrap();
    assert_eq!(acl_device_count(), mock::MAX_DEVICES);
    on_thread(|| mock::context(63).expect("device 63 of 64"));
    mock::set_device_count(1).unwrap();
}

#[test]
fn shrinking_below_a_device_in_use_is_refused() {
    let _serial = serial();
    mock::set_device_count(4).unwrap();
    let cann = cann();
    on_thread(|| {
        mock::context(0).expect("aclInit");
        // Raw calls, so that nothing of the crate caches or defers what they make.
        // SAFETY: device 2 exists (4 devices); the out-pointers are valid; what is allocated is
        // freed below on this thread, with device 2 still current.
        unsafe {
            assert_eq!(cann.acl.aclrtSetDevice(2), 0);
            let mut p = std::ptr::null_mut();
            assert_eq!(cann.acl.aclrtMalloc(&mut p, 64, HUGE_FIRST), 0);

            assert_invalid_count(mock::set_device_count(2), "device 2 is in use");
            assert_invalid_count(mock::set_device_count(0), "device 2 is in use");
            assert_eq!(acl_device_count(), 4, "a refused shrink changes nothing");
            mock::set_device_count(3).expect("device 3 holds nothing");
            assert_eq!(acl_device_count(), 3);

            // A created stream is a use too.
            assert_eq!(cann.acl.aclrtFree(p), 0);
            let mut s = std::ptr::null_mut();
            assert_eq!(cann.acl.aclrtCreateStream(&mut s), 0);
            assert_invalid_count(mock::set_device_count(1), "device 2 is in use");
            assert_eq!(cann.acl.aclrtDestroyStream(s), 0);

            // Nothing alive on device 2 any more: it may go, although it is still set here.
            mock::set_device_count(2).expect("device 2 holds nothing");
            assert_eq!(acl_device_count(), 2);
            let mut q = std::ptr::null_mut();
            let before = mock::stats().violations;
            assert_ne!(cann.acl.aclrtMalloc(&mut q, 64, HUGE_FIRST), 0, "device 2 is gone from this thread");
            assert_eq!(mock::stats().violations, before + 1, "as on CANN: a call with no device set");
            // ... and comes back as it was.
            mock::set_device_count(3).unwrap();
            assert_eq!(cann.acl.aclrtMalloc(&mut q, 64, HUGE_FIRST), 0, "device 2 is current again");
            assert_eq!(cann.acl.aclrtFree(q), 0);
        }
    });
    mock::set_device_count(1).unwrap();
    assert_eq!(acl_device_count(), 1);
}

#[test]
fn a_stream_of_a_context_keeps_its_device() {
    let _serial = serial();
    mock::set_device_count(2).unwrap();
    on_thread(|| {
        let ctx = mock::context(1).expect("device 1 of 2");
        let stream = ctx.new_stream().unwrap();
        assert_invalid_count(mock::set_device_count(1), "device 1 is in use");
        // Still two devices, and the stream still works.
        assert_eq!(acl_device_count(), 2);
        stream.synchronize().unwrap();
        drop((stream, ctx));
        mock::set_device_count(1).expect("nothing alive on device 1 any more");
        assert_no_device(mock::context(1), 1, 1);
    });
}
