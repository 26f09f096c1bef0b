//! Graph capture (`aclmdlRI*`, acl_rt.h:4710-4795): the wrappers, and the refusal of the calls
//! CANN forbids while this thread captures a stream (runtime
//! `docs/zh/dev_guide/04-01_single_stream_capture.md`: any synchronisation or query of a stream,
//! event or device in every mode; `aclrtMemcpy`/`aclrtMemset` unless relaxed), made here before
//! they reach CANN. `aclrtMalloc` and `aclrtFree` are refused too (the allocator serves a capture
//! from cached blocks only, and a free may synchronise the device), except `aclrtMalloc` in
//! relaxed mode.
//!
//! The functions are optional symbols of `libascendcl.so` ([`Cann::capture`]): a toolkit
//! before CANN 8.2 lacks them, and the call is an [`Error::Load`] naming the one missing.
//! Atlas training series (910) and Atlas 200I/500 A2 have no capture (CANN 9.0.0's API page).

use std::cell::Cell;
use std::ptr;

use ascend_sys::loader::{LoadError, ASCENDCL};
use ascend_sys::status::ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC;
use ascend_sys::{aclmdlRI, aclmdlRICaptureMode, aclrtStream, AclCapture, Cann};

use super::check;
use crate::error::{Error, Result};

thread_local! {
    /// The mode of the capture this thread runs now (`Stream::capture`), if any.
    static CAPTURING: Cell<Option<aclmdlRICaptureMode>> = const { Cell::new(None) };
}

/// Marks this thread as capturing in `mode` until the returned guard drops.
pub(crate) fn enter(mode: aclmdlRICaptureMode) -> Result<ThreadCapture> {
    if CAPTURING.with(Cell::get).is_some() {
        return Err(Error::invalid("stream", "this thread is already capturing a stream (captures do not nest)"));
    }
    CAPTURING.with(|c| c.set(Some(mode)));
    Ok(ThreadCapture(()))
}

/// While it lives, this thread is capturing (see [`enter`]).
pub(crate) struct ThreadCapture(());

impl Drop for ThreadCapture {
    fn drop(&mut self) {
        CAPTURING.with(|c| c.set(None));
    }
}

/// `Err` naming `call` when this thread is capturing (and, with `relaxed_allows`, not in
/// relaxed mode): the status CANN gives (`ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC`, 107041) with
/// why, and nothing reaches CANN.
pub(crate) fn refuse(call: &'static str, relaxed_allows: bool) -> Result<()> {
    match CAPTURING.with(Cell::get) {
        None => Ok(()),
        Some(aclmdlRICaptureMode::ACL_MODEL_RI_CAPTURE_MODE_RELAXED) if relaxed_allows => Ok(()),
        Some(_) => Err(Error::Cann {
            call,
            status: ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC,
            message: Some(format!(
                "refused by this crate: {call} inside a stream capture (CANN forbids synchronising, querying, \
                 allocating, freeing and blocking copies while a stream is captured); do it before \
                 Stream::capture or after it"
            )),
        }),
    }
}

/// The capture functions, or the typed error of a toolkit without them.
fn functions(cann: &Cann) -> Result<&'static AclCapture> {
    Ok(cann.capture()?)
}

/// The function `f` of the capture API, or [`Error::Load`] naming it (toolkits before CANN 8.2).
fn function<F: Copy>(f: &std::result::Result<F, libloading::Error>, name: &'static str) -> Result<F> {
    f.as_ref().copied().map_err(|e| {
        Error::Load(LoadError::missing_symbol(
            ASCENDCL,
            name,
            format!("{e} (graph capture needs CANN 8.2 or later; Atlas training series lack it)"),
        ))
    })
}

/// `aclmdlRICaptureBegin(stream, mode)`.
///
/// # Safety
/// `stream` is a live stream (not the default one) of the device bound to this thread.
pub(crate) unsafe fn begin(cann: &Cann, stream: aclrtStream, mode: aclmdlRICaptureMode) -> Result<()> {
    let f = function(&functions(cann)?.aclmdlRICaptureBegin, "aclmdlRICaptureBegin")?;
    // SAFETY: `stream` is live on the bound device (this function's contract); `mode` a valid value.
    check(cann, "aclmdlRICaptureBegin", unsafe { f(stream, mode) })
}

/// `aclmdlRICaptureEnd(stream)`: the captured model run instance.
///
/// # Safety
/// `stream` is the live stream this thread began capturing.
pub(crate) unsafe fn end(cann: &Cann, stream: aclrtStream) -> Result<aclmdlRI> {
    let f = function(&functions(cann)?.aclmdlRICaptureEnd, "aclmdlRICaptureEnd")?;
    let mut model: aclmdlRI = ptr::null_mut();
    // SAFETY: `stream` is live (this function's contract); `model` a valid out-pointer.
    check(cann, "aclmdlRICaptureEnd", unsafe { f(stream, &mut model) })?;
    if model.is_null() {
        return Err(Error::NullHandle { call: "aclmdlRICaptureEnd", message: super::recent_error(cann) });
    }
    Ok(model)
}

/// `aclmdlRIExecuteAsync(model, stream)`.
///
/// # Safety
/// `model` is a live model run instance and `stream` a live stream, both of the bound device;
/// everything the model's tasks use stays valid until they have run.
pub(crate) unsafe fn execute_async(cann: &Cann, model: aclmdlRI, stream: aclrtStream) -> Result<()> {
    let f = function(&functions(cann)?.aclmdlRIExecuteAsync, "aclmdlRIExecuteAsync")?;
    // SAFETY: both handles are live on the bound device (this function's contract).
    check(cann, "aclmdlRIExecuteAsync", unsafe { f(model, stream) })
}

/// `aclmdlRIDestroy(model)`.
///
/// # Safety
/// `model` is live, no replay of it is pending, and it is not used afterwards.
pub(crate) unsafe fn destroy(cann: &Cann, model: aclmdlRI) -> Result<()> {
    let f = function(&functions(cann)?.aclmdlRIDestroy, "aclmdlRIDestroy")?;
    // SAFETY: `model` is live and idle, never used again (this function's contract).
    check(cann, "aclmdlRIDestroy", unsafe { f(model) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toolkit without a capture function (before CANN 8.2) is a typed load error naming it.
    #[test]
    fn a_missing_capture_function_is_a_load_error_naming_it() {
        let absent: std::result::Result<unsafe extern "C" fn(), libloading::Error> =
            Err(libloading::Error::DlSymUnknown);
        match function(&absent, "aclmdlRICaptureBegin").unwrap_err() {
            Error::Load(LoadError::Symbol { library, symbol, reason, .. }) => {
                assert_eq!((library.as_str(), symbol.as_str()), (ASCENDCL, "aclmdlRICaptureBegin"));
                assert!(reason.contains("CANN 8.2"), "{reason}");
            }
            other => panic!("expected Error::Load(LoadError::Symbol), got {other:?}"),
        }
    }

    /// Inside a capture the forbidden calls are refused (relaxed mode lifts only the blocking
    /// memory calls); outside, and after the guard drops, nothing is.
    #[test]
    fn refusals_follow_the_thread_capture_mode() {
        assert!(refuse("aclrtSynchronizeStream", false).is_ok());
        let guard = enter(aclmdlRICaptureMode::ACL_MODEL_RI_CAPTURE_MODE_RELAXED).unwrap();
        assert!(enter(aclmdlRICaptureMode::ACL_MODEL_RI_CAPTURE_MODE_GLOBAL).is_err(), "captures do not nest");
        assert!(refuse("aclrtMemcpy", true).is_ok());
        let e = refuse("aclrtSynchronizeStream", false).unwrap_err();
        assert_eq!(e.status(), Some(ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC));
        assert!(e.to_string().contains("aclrtSynchronizeStream"), "{e}");
        drop(guard);
        let _global = enter(aclmdlRICaptureMode::ACL_MODEL_RI_CAPTURE_MODE_GLOBAL).unwrap();
        assert!(refuse("aclrtMemcpy", true).is_err());
    }
}
