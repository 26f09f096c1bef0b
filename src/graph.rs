//! [`Graph`]: work captured from a [`Stream`] once (`aclmdlRICaptureBegin`/`End`) and replayed
//! with one runtime call (`aclmdlRIExecuteAsync`), as torch_npu's `NPUGraph` does.
//!
//! Made by [`Stream::capture`]. Everything the captured work uses stays alive until the graph is
//! dropped: device buffers (a tensor dropped meanwhile hands its memory to the graph, so eager
//! work never reuses memory a replay writes: the graph's private pool), the capture's workspace
//! and repeatable executors, its staged uploads, the communicators of captured collectives. The
//! graph is dropped in this order: its last replay is waited for, the model run instance
//! destroyed (`aclmdlRIDestroy`), then what it kept is released: the blocks of its private pool
//! (and its workspace) after the work queued so far on the captured stream (an event recorded
//! there, no host wait), as eager work queued before the capture may still use them
//! (`aclmdlRICaptureBegin` does not wait for it).
//!
//! Inputs are refreshed by writing into the captured tensors (e.g. [`Tensor::copy_from_slice`]
//! or a copy on a stream) between replays: a replay reads the addresses captured, never new
//! tensors. Outputs are the captured tensors too.
//!
//! A capture is of one stream: nothing this crate does joins another stream into it. CANN can
//! capture across streams (an event recorded on the captured stream pulls a stream waiting for
//! it into the same model, which must join back before `aclmdlRICaptureEnd`, else
//! `ACL_ERROR_RT_STREAM_UNJOINED`); here every call that would order the captured stream with
//! another one is refused before it reaches CANN (see [`Stream::capture`]), so all the work a
//! graph replays is on its captured stream and everything that work uses is kept by the graph.
//!
//! Needs CANN 8.2 or later with the capture API (`aclmdlRI*`; an older toolkit gives
//! [`Error::Load`] naming the missing function) on a chip that supports it: Atlas A2/A3 and the
//! inference series, **not** Atlas training series (910) or Atlas 200I/500 A2 (CANN 9.0.0's API
//! page); HCCL captures its collectives on Atlas A2/A3 only. Only aclnn operators and HCCL
//! collectives are captured; captured tasks are not updated in place (CANN's task groups are not
//! bound). CANN marks the API experimental.
//!
//! [`Tensor::copy_from_slice`]: crate::Tensor::copy_from_slice

use std::sync::Arc;

use ascend_sys::{aclmdlRI, aclmdlRICaptureMode};

use crate::acl;
use crate::device::capture::Keep;
use crate::device::{leaked, report_drop_error, Device, Leak, StreamInner};
use crate::error::{Error, Result};
use crate::stream::Stream;

/// How strictly CANN refuses calls during a capture (`aclmdlRICaptureMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureMode {
    /// `ACL_MODEL_RI_CAPTURE_MODE_GLOBAL`: the blocking memory calls (`aclrtMemcpy`,
    /// `aclrtMemset`) are refused on every thread while the capture runs (torch's default).
    Global,
    /// `ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL`: refused on the capturing thread only.
    ThreadLocal,
    /// `ACL_MODEL_RI_CAPTURE_MODE_RELAXED`: not refused (nor `aclrtMalloc`); synchronising or
    /// querying a stream, event or device stays refused in every mode.
    Relaxed,
}

impl CaptureMode {
    fn raw(self) -> aclmdlRICaptureMode {
        match self {
            CaptureMode::Global => aclmdlRICaptureMode::ACL_MODEL_RI_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => aclmdlRICaptureMode::ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => aclmdlRICaptureMode::ACL_MODEL_RI_CAPTURE_MODE_RELAXED,
        }
    }
}

/// A captured model run instance and everything its work uses (see the module docs). `Send` and
/// `Sync`: replays from several threads are serialised.
pub struct Graph {
    /// The `aclmdlRI`, as an address.
    model: usize,
    device: Arc<Device>,
    keep: Arc<Keep>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph").field("device", &self.device.id).finish_non_exhaustive()
    }
}

impl Graph {
    /// Queues a replay of the captured work on `stream` (`aclmdlRIExecuteAsync`: one runtime
    /// call), which may be any stream of the graph's device. It runs after the previous replay
    /// (an event when that was on another stream) and after work queued on the captured tensors
    /// since (the first replay also after the work queued on the captured stream before the
    /// capture); work queued on them later, and host reads, come after it. The host does not wait.
    pub fn replay(&self, stream: &Stream) -> Result<()> {
        let inner = match stream.ascend() {
            Some((s, d)) if d.same(&self.device) => s,
            _ => return Err(stream.mismatch("stream", &format!("the graph is on Ascend device {}", self.device.id))),
        };
        // (No lock: the caller's stream, whose captures only this thread begins or ends.)
        if inner.capturing() {
            return Err(Error::invalid("stream", "the stream is being captured: replay the graph after the capture"));
        }
        self.keep.order_replay(inner, || {
            self.device.bind()?;
            // SAFETY: the model is live until `self` drops; the stream is live (its `Stream` is
            // borrowed) on the bound device; everything the model's tasks use is kept by `keep`
            // until after the model is destroyed, which waits for this replay first.
            unsafe { acl::capture::execute_async(self.device.cann, self.model as aclmdlRI, inner.raw()) }
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Err(e) = self.keep.drain() {
            // A replay may still run: the model and what it uses must stay.
            report_drop_error("aclrtSynchronizeEvent (waiting for a graph's last replay)", &e);
            std::mem::forget(self.keep.close());
            leaked(Leak::Allocation);
            return;
        }
        destroy_model(&self.device, self.model as aclmdlRI, &self.keep);
    }
}

/// Destroys a model no replay of which is pending, then releases what `keep` held (or leaks it
/// when the model could not be destroyed).
fn destroy_model(device: &Arc<Device>, model: aclmdlRI, keep: &Keep) {
    let result = device.bind().and_then(|()| {
        // SAFETY: the model is live, none of its replays is pending, and it is never used again.
        unsafe { acl::capture::destroy(device.cann, model) }
    });
    let items = keep.close();
    match result {
        Ok(()) => drop(items),
        Err(e) => {
            report_drop_error("aclmdlRIDestroy", &e);
            std::mem::forget(items);
            leaked(Leak::Allocation);
        }
    }
}

/// A capture under way on one stream: ends it (and cleans up) however the capture leaves.
struct Capturing<'a> {
    inner: &'a Arc<StreamInner>,
    device: &'a Arc<Device>,
    keep: Arc<Keep>,
    suspended: Option<crate::device::Suspended>,
    thread: Option<acl::capture::ThreadCapture>,
}

impl Capturing<'_> {
    /// `aclmdlRICaptureEnd`, and the stream back to eager work.
    fn finish(&mut self) -> Result<aclmdlRI> {
        let ended = self.device.bind().and_then(|()| {
            // SAFETY: this thread began capturing the live stream.
            unsafe { acl::capture::end(self.device.cann, self.inner.raw()) }
        });
        self.thread = None;
        if let Some(s) = self.suspended.take() {
            self.inner.end_capture(s);
        }
        ended
    }
}

impl Drop for Capturing<'_> {
    /// Reached only when the capture did not finish (the closure panicked).
    fn drop(&mut self) {
        if self.suspended.is_none() {
            return;
        }
        match self.finish() {
            Ok(model) => destroy_model(self.device, model, &self.keep),
            Err(e) => {
                report_drop_error("aclmdlRICaptureEnd", &e);
                std::mem::forget(self.keep.close());
            }
        }
    }
}

impl Stream {
    /// Captures the work `f` queues on this stream into a [`Graph`] (`aclmdlRICaptureBegin`,
    /// `f(self)`, `aclmdlRICaptureEnd`): the work is recorded, not run; [`Graph::replay`] runs it.
    ///
    /// Inside `f`, what CANN forbids during a capture is an error naming the call, before it
    /// reaches CANN: synchronising or querying a stream, event or device (so reading a tensor to
    /// the host), `aclrtFree`, `aclrtMalloc` and blocking copies (`aclrtMemcpy`, `aclrtMemset`;
    /// allowed in [`CaptureMode::Relaxed`], as CANN allows them), [`Context::empty_cache`](crate::Context::empty_cache) (even
    /// with nothing cached), and work that would join another stream into the capture
    /// (`ACL_ERROR_RT_CAPTURE_DEPENDENCY`, 107024, naming `aclrtRecordEvent` or
    /// `aclrtStreamWaitEvent`): an event recorded on or waited for by this stream, captured work
    /// on a buffer another stream last used, eager work on another stream that would be ordered
    /// after this one (a read of what the capture writes). Memory the captured work
    /// allocates comes from the caching allocator's free blocks, so run the work once eagerly
    /// before capturing it; it belongs to the graph until the graph is dropped.
    ///
    /// Errors: a CPU stream, the default stream (never used by this crate: a [`Stream`] is
    /// always a created one), a stream already capturing, a thread already capturing, a toolkit
    /// without the capture API ([`Error::Load`]), or the first error of `f` (the capture is then
    /// ended and its model destroyed).
    pub fn capture(&self, mode: CaptureMode, f: impl FnOnce(&Stream) -> Result<()>) -> Result<Graph> {
        let Some((inner, device)) = self.ascend() else {
            return Err(self.mismatch("stream", "graph capture needs an Ascend stream"));
        };
        if inner.raw().is_null() {
            return Err(Error::null("stream", "the default stream cannot be captured"));
        }
        // The toolkit must have the API before anything changes.
        device.cann.capture()?;
        let keep = Arc::new(Keep::new(inner));
        // The graph's pool opens before the capture begins (torch_npu's order).
        let suspended = inner.begin_capture(keep.clone())?;
        let mut capturing = Capturing { inner, device, keep, suspended: Some(suspended), thread: None };
        capturing.thread = Some(acl::capture::enter(mode.raw())?);
        let begun = device.bind().and_then(|()| {
            // SAFETY: `inner` is a live created stream of the bound device.
            unsafe { acl::capture::begin(device.cann, inner.raw(), mode.raw()) }
        });
        if let Err(e) = begun {
            capturing.thread = None;
            if let Some(s) = capturing.suspended.take() {
                inner.end_capture(s);
            }
            drop(capturing.keep.close());
            return Err(e);
        }
        let result = f(self);
        let ended = capturing.finish();
        let keep = capturing.keep.clone();
        match (result, ended) {
            (Ok(()), Ok(model)) => Ok(Graph { model: model as usize, device: device.clone(), keep }),
            (result, Ok(model)) => {
                destroy_model(device, model, &keep);
                Err(result.err().unwrap_or_else(|| Error::internal("a failed capture without an error")))
            }
            (result, Err(e)) => {
                // CANN may still hold the captured tasks: keep what they use forever.
                std::mem::forget(keep.close());
                Err(result.err().unwrap_or(e))
            }
        }
    }
}
