//! The result layer: one thin wrapper per CANN call, its status checked and turned into
//! [`Result`], with the text of `aclGetRecentErrMsg` on failure.
//!
//! Functions taking raw pointers or handles are `unsafe`: the caller (the safe layer in
//! [`crate::device`]) guarantees the handles are live and the memory ranges valid.

pub(crate) mod capture;
pub(crate) mod hccl;

use std::ffi::{c_void, CStr};
use std::ptr;

use ascend_sys::{
    aclDataType, aclFormat, aclOpExecutor, aclTensor, aclrtEvent, aclrtEventRecordedStatus, aclrtMemMallocPolicy,
    aclrtMemcpyKind, aclrtStream, Cann,
};

use crate::error::{Error, Result};

/// The text of `aclGetRecentErrMsg`, if CANN has one for this thread.
pub(crate) fn recent_error(cann: &Cann) -> Option<String> {
    // SAFETY: aclGetRecentErrMsg takes no arguments and returns null or a NUL-terminated string
    // owned by CANN (thread-local), valid until the next CANN call on this thread; it is copied
    // out at once.
    unsafe {
        let p = cann.acl.aclGetRecentErrMsg();
        if p.is_null() {
            None
        } else {
            let s = CStr::from_ptr(p).to_string_lossy().trim().to_string();
            (!s.is_empty()).then_some(s)
        }
    }
}

/// Turns a status into a `Result`, fetching CANN's message on failure.
pub(crate) fn check(cann: &Cann, call: &'static str, status: i32) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(Error::Cann { call, status, message: recent_error(cann) })
    }
}

/// `handle` when it is not null; a null one (CANN reported success but gave nothing) is refused
/// with `recent_error`'s text.
fn non_null<H>(cann: &Cann, call: &'static str, handle: *mut H) -> Result<*mut H> {
    if handle.is_null() {
        return Err(Error::NullHandle { call, message: recent_error(cann) });
    }
    Ok(handle)
}

/// The handle `create` writes through its out-pointer: the status `create` returns is checked,
/// and a null handle refused.
fn created<H>(cann: &Cann, call: &'static str, create: impl FnOnce(&mut *mut H) -> i32) -> Result<*mut H> {
    let mut handle: *mut H = ptr::null_mut();
    check(cann, call, create(&mut handle))?;
    non_null(cann, call, handle)
}

/// `aclInit(nullptr)`. A process where someone else already initialised ACL (100002) counts as
/// success.
pub(crate) fn init(cann: &Cann) -> Result<()> {
    // SAFETY: aclInit accepts a null config path.
    let status = unsafe { cann.acl.aclInit(ptr::null()) };
    if status == ascend_sys::status::ACL_ERROR_REPEAT_INITIALIZE {
        return Ok(());
    }
    check(cann, "aclInit", status)
}

/// `aclrtGetDeviceCount`.
pub(crate) fn device_count(cann: &Cann) -> Result<u32> {
    let mut count = 0u32;
    // SAFETY: `count` is a valid out-pointer.
    check(cann, "aclrtGetDeviceCount", unsafe { cann.acl.aclrtGetDeviceCount(&mut count) })?;
    Ok(count)
}

/// `aclrtSetDevice`: binds the device (its default context) to the calling thread.
pub(crate) fn set_device(cann: &Cann, device: i32) -> Result<()> {
    // SAFETY: plain value argument.
    check(cann, "aclrtSetDevice", unsafe { cann.acl.aclrtSetDevice(device) })
}

/// `aclrtCreateStream`.
pub(crate) fn create_stream(cann: &Cann) -> Result<aclrtStream> {
    // SAFETY: `stream` is a valid out-pointer.
    created(cann, "aclrtCreateStream", |stream| unsafe { cann.acl.aclrtCreateStream(stream) })
}

/// `aclrtSynchronizeStream`.
///
/// # Safety
/// `stream` is a live stream of the device bound to this thread.
pub(crate) unsafe fn synchronize_stream(cann: &Cann, stream: aclrtStream) -> Result<()> {
    capture::refuse("aclrtSynchronizeStream", false)?;
    // SAFETY: `stream` is live on the bound device (this function's contract).
    check(cann, "aclrtSynchronizeStream", unsafe { cann.acl.aclrtSynchronizeStream(stream) })
}

/// `aclrtDestroyStream`.
///
/// # Safety
/// `stream` is a live stream, not used afterwards.
pub(crate) unsafe fn destroy_stream(cann: &Cann, stream: aclrtStream) -> Result<()> {
    // SAFETY: `stream` is live and never used again (this function's contract).
    check(cann, "aclrtDestroyStream", unsafe { cann.acl.aclrtDestroyStream(stream) })
}

/// `aclrtMalloc(.., ACL_MEM_MALLOC_HUGE_FIRST)`; `bytes` must be non-zero.
pub(crate) fn malloc(cann: &Cann, bytes: usize) -> Result<*mut c_void> {
    capture::refuse("aclrtMalloc", true)?;
    created(cann, "aclrtMalloc", |p| {
        // SAFETY: `p` is a valid out-pointer; the policy is a valid enum value.
        unsafe { cann.acl.aclrtMalloc(p, bytes, aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST) }
    })
}

/// `aclrtFree`.
///
/// # Safety
/// `p` came from [`malloc`] and no enqueued work still uses it.
pub(crate) unsafe fn free(cann: &Cann, p: *mut c_void) -> Result<()> {
    capture::refuse("aclrtFree", false)?;
    // SAFETY: `p` came from aclrtMalloc and no enqueued work uses it (this function's contract).
    check(cann, "aclrtFree", unsafe { cann.acl.aclrtFree(p) })
}

/// Synchronous `aclrtMemcpy` host → device.
///
/// # Safety
/// `dst..dst+src.len()` lies in one live device allocation that no pending work uses.
pub(crate) unsafe fn copy_to_device(cann: &Cann, dst: *mut c_void, src: &[u8]) -> Result<()> {
    capture::refuse("aclrtMemcpy", true)?;
    // SAFETY: the destination range is inside one live, idle device allocation (this function's
    // contract) and the source is a host slice of the same length.
    let status = unsafe {
        cann.acl.aclrtMemcpy(dst, src.len(), src.as_ptr().cast(), src.len(), aclrtMemcpyKind::ACL_MEMCPY_HOST_TO_DEVICE)
    };
    check(cann, "aclrtMemcpy", status)
}

/// Synchronous `aclrtMemcpy` device → host.
///
/// # Safety
/// `src..src+dst.len()` lies in one live device allocation whose writers have completed.
pub(crate) unsafe fn copy_to_host(cann: &Cann, dst: &mut [u8], src: *const c_void) -> Result<()> {
    capture::refuse("aclrtMemcpy", true)?;
    // SAFETY: the source range is inside one live device allocation whose writers have completed
    // (this function's contract) and the destination is a writable host slice of the same length.
    let status = unsafe {
        cann.acl.aclrtMemcpy(
            dst.as_mut_ptr().cast(),
            dst.len(),
            src,
            dst.len(),
            aclrtMemcpyKind::ACL_MEMCPY_DEVICE_TO_HOST,
        )
    };
    check(cann, "aclrtMemcpy", status)
}

/// Synchronous `aclrtMemset` of `count` bytes to `value`.
///
/// # Safety
/// `p..p+count` lies in one live device allocation that no pending work uses.
pub(crate) unsafe fn memset(cann: &Cann, p: *mut c_void, value: u8, count: usize) -> Result<()> {
    capture::refuse("aclrtMemset", true)?;
    // SAFETY: `p..p+count` is inside one live, idle device allocation (this function's contract).
    check(cann, "aclrtMemset", unsafe { cann.acl.aclrtMemset(p, count, i32::from(value), count) })
}

/// `aclCreateTensor` with a 1-D storage of `storage_len` elements (as op-plugin does).
///
/// # Safety
/// `data` is null (only when `storage_len` is 0) or a live device allocation of at least
/// `storage_len` elements of `dtype`, and the view lies inside it.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn create_tensor(
    cann: &Cann,
    shape: &[i64],
    strides: &[i64],
    offset: i64,
    dtype: aclDataType,
    format: aclFormat,
    storage_len: i64,
    data: *mut c_void,
) -> Result<*mut aclTensor> {
    let storage = [storage_len];
    // SAFETY: shape and strides are slices of the given length (CANN copies them), `storage` is
    // one element, and `data` is null or an allocation holding the view (this function's
    // contract).
    let t = unsafe {
        cann.nnopbase.aclCreateTensor(
            shape.as_ptr(),
            shape.len() as u64,
            dtype,
            strides.as_ptr(),
            offset,
            format,
            storage.as_ptr(),
            1,
            data,
        )
    };
    non_null(cann, "aclCreateTensor", t)
}

/// `aclDestroyTensor`.
///
/// # Safety
/// `t` is a live tensor descriptor, not used afterwards.
pub(crate) unsafe fn destroy_tensor(cann: &Cann, t: *mut aclTensor) -> Result<()> {
    // SAFETY: `t` is a live descriptor, never used again (this function's contract).
    check(cann, "aclDestroyTensor", unsafe { cann.nnopbase.aclDestroyTensor(t) })
}

/// `aclSetAclOpExecutorRepeatable`: phase 2 no longer consumes the executor, the caller destroys
/// it. CANN refuses (`ACLNN_ERR_INNER`, 561000) an executor it cannot repeat (phase 1 used an AI
/// CPU kernel, a DSA task or a synchronous copy, ASYNC.md §5); the executor is then unchanged.
///
/// # Safety
/// `e` is a live executor from phase 1, not launched yet.
pub(crate) unsafe fn set_repeatable(cann: &Cann, e: *mut aclOpExecutor) -> Result<()> {
    // SAFETY: `e` is a live, unlaunched executor (this function's contract).
    check(cann, "aclSetAclOpExecutorRepeatable", unsafe { cann.nnopbase.aclSetAclOpExecutorRepeatable(e) })
}

/// `aclDestroyAclOpExecutor`.
///
/// # Safety
/// `e` is a live executor that no queued launch uses and phase 2 has not consumed (repeatable, or
/// never launched after [`set_repeatable`] was tried on it), not used afterwards.
pub(crate) unsafe fn destroy_executor(cann: &Cann, e: *mut aclOpExecutor) -> Result<()> {
    // SAFETY: this function's contract.
    check(cann, "aclDestroyAclOpExecutor", unsafe { cann.nnopbase.aclDestroyAclOpExecutor(e) })
}

/// Destroys an executor that phase 2 never consumed and that was never made repeatable: the
/// documented pairing first (`aclSetAclOpExecutorRepeatable` hands its ownership to the caller),
/// then `aclDestroyAclOpExecutor`, which frees it whether or not CANN accepted the first call
/// (nnopbase's `aclDestroyAclOpExecutor` deletes any executor it is given, hicann/opbase
/// `src/nnopbase/common/api/acl_op_api.cpp`); so an executor CANN will not repeat is not leaked.
///
/// # Safety
/// `e` is a live executor from phase 1 that was never launched, not used afterwards.
pub(crate) unsafe fn destroy_unlaunched_executor(cann: &Cann, e: *mut aclOpExecutor) -> Result<()> {
    // SAFETY: `e` is a live executor that phase 2 never consumed (this function's contract). A
    // refusal changes nothing: the destroy below frees it either way.
    let _refused = unsafe { set_repeatable(cann, e) };
    // SAFETY: `e` is live and never used again (this function's contract).
    unsafe { destroy_executor(cann, e) }
}

/// Phase 1 of operator `call` (its `GetWorkspaceSize`): `f` makes the call with the
/// workspace-size and executor out-pointers (or fails before making it); the status is checked
/// and a null executor refused.
pub(crate) fn phase1(
    cann: &Cann,
    call: &'static str,
    f: impl FnOnce(*mut u64, *mut *mut aclOpExecutor) -> Result<i32>,
) -> Result<(u64, *mut aclOpExecutor)> {
    let mut size = 0u64;
    let mut executor: *mut aclOpExecutor = ptr::null_mut();
    check(cann, call, f(&mut size, &mut executor)?)?;
    Ok((size, non_null(cann, call, executor)?))
}

/// A function of an op library that [`Cann::operator`] found exported (it is then never an
/// `Err`; this turns the impossible case into an error rather than a panic).
pub(crate) fn op_fn<F: Copy>(f: &std::result::Result<F, libloading::Error>, call: &'static str) -> Result<F> {
    f.as_ref().copied().map_err(|e| Error::internal(format!("{call} is not exported although its library loaded: {e}")))
}

/// `aclrtCtxSetSysParamOpt(opt, value)` on the thread's current context (bind the device first).
pub(crate) fn ctx_set_sys_param(cann: &Cann, opt: ascend_sys::aclSysParamOpt, value: i64) -> Result<()> {
    // SAFETY: plain value arguments; the caller has bound the device (its default context).
    check(cann, "aclrtCtxSetSysParamOpt", unsafe { cann.acl.aclrtCtxSetSysParamOpt(opt, value) })
}

/// `aclrtCreateEventExWithFlag(flags)`: an event reused by recording it again (the only kind
/// CANN documents re-recording for), waitable by a stream when `flags` has `ACL_EVENT_SYNC`.
pub(crate) fn create_event(cann: &Cann, flags: u32) -> Result<aclrtEvent> {
    // SAFETY: `event` is a valid out-pointer; `flags` is a plain bitmap.
    created(cann, "aclrtCreateEventExWithFlag", |event| unsafe { cann.acl.aclrtCreateEventExWithFlag(event, flags) })
}

/// `aclrtDestroyEvent`.
///
/// # Safety
/// `event` is live, no queued `aclrtStreamWaitEvent` still refers to it, and it is not used afterwards.
pub(crate) unsafe fn destroy_event(cann: &Cann, event: aclrtEvent) -> Result<()> {
    // SAFETY: `event` is live, no queued wait refers to it, never used again (this function's
    // contract).
    check(cann, "aclrtDestroyEvent", unsafe { cann.acl.aclrtDestroyEvent(event) })
}

/// `aclrtRecordEvent`.
///
/// # Safety
/// `event` and `stream` are live, on the device bound to this thread.
pub(crate) unsafe fn record_event(cann: &Cann, event: aclrtEvent, stream: aclrtStream) -> Result<()> {
    // SAFETY: `event` and `stream` are live on the bound device (this function's contract).
    check(cann, "aclrtRecordEvent", unsafe { cann.acl.aclrtRecordEvent(event, stream) })
}

/// `aclrtStreamWaitEvent`: later work on `stream` waits (on the device) for the event.
///
/// # Safety
/// `event` and `stream` are live; the event stays alive until the wait has run.
pub(crate) unsafe fn stream_wait_event(cann: &Cann, stream: aclrtStream, event: aclrtEvent) -> Result<()> {
    // SAFETY: `stream` and `event` are live, the event until the wait has run (this function's
    // contract).
    check(cann, "aclrtStreamWaitEvent", unsafe { cann.acl.aclrtStreamWaitEvent(stream, event) })
}

/// `aclrtQueryEventStatus`: whether the event's last record has run (never blocks).
///
/// # Safety
/// `event` is live.
pub(crate) unsafe fn event_is_complete(cann: &Cann, event: aclrtEvent) -> Result<bool> {
    capture::refuse("aclrtQueryEventStatus", false)?;
    let mut status = aclrtEventRecordedStatus::ACL_EVENT_RECORDED_STATUS_NOT_READY;
    // SAFETY: `event` is live (this function's contract); `status` is a valid out-pointer.
    check(cann, "aclrtQueryEventStatus", unsafe { cann.acl.aclrtQueryEventStatus(event, &mut status) })?;
    Ok(status == aclrtEventRecordedStatus::ACL_EVENT_RECORDED_STATUS_COMPLETE)
}

/// `aclrtSynchronizeEvent`: blocks the host until the event completes.
///
/// # Safety
/// `event` is live.
pub(crate) unsafe fn synchronize_event(cann: &Cann, event: aclrtEvent) -> Result<()> {
    capture::refuse("aclrtSynchronizeEvent", false)?;
    // SAFETY: `event` is live (this function's contract).
    check(cann, "aclrtSynchronizeEvent", unsafe { cann.acl.aclrtSynchronizeEvent(event) })
}

/// `aclrtEventElapsedTime`: milliseconds from `start` to `end`.
///
/// # Safety
/// Both events are live.
pub(crate) unsafe fn event_elapsed_ms(cann: &Cann, start: aclrtEvent, end: aclrtEvent) -> Result<f32> {
    let mut ms = 0f32;
    // SAFETY: both events are live (this function's contract); `ms` is a valid out-pointer.
    check(cann, "aclrtEventElapsedTime", unsafe { cann.acl.aclrtEventElapsedTime(&mut ms, start, end) })?;
    Ok(ms)
}

/// `aclrtMemcpyAsync` of `count` bytes on `stream`.
///
/// # Safety
/// Both ranges are valid for `count` bytes (device ranges inside one live allocation, host ranges
/// pinned memory) and stay valid and untouched by the host until the copy has run.
pub(crate) unsafe fn memcpy_async(
    cann: &Cann,
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: aclrtMemcpyKind,
    stream: aclrtStream,
) -> Result<()> {
    // SAFETY: both ranges are valid for `count` bytes until the copy has run (this function's
    // contract).
    check(cann, "aclrtMemcpyAsync", unsafe { cann.acl.aclrtMemcpyAsync(dst, count, src, count, kind, stream) })
}

/// `aclrtMallocHost`: `bytes` (non-zero) of page-locked host memory.
pub(crate) fn malloc_host(cann: &Cann, bytes: usize) -> Result<*mut c_void> {
    // SAFETY: `p` is a valid out-pointer.
    created(cann, "aclrtMallocHost", |p| unsafe { cann.acl.aclrtMallocHost(p, bytes) })
}

/// `aclrtFreeHost`.
///
/// # Safety
/// `p` came from [`malloc_host`] and no queued copy still uses it.
pub(crate) unsafe fn free_host(cann: &Cann, p: *mut c_void) -> Result<()> {
    // SAFETY: `p` came from aclrtMallocHost and no queued copy uses it (this function's contract).
    check(cann, "aclrtFreeHost", unsafe { cann.acl.aclrtFreeHost(p) })
}
