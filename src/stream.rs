//! [`Stream`]: an ordered queue of work on a [`Context`].

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::context::{Backend, Context, ContextKind};
use crate::device::launch_cache::LaunchCacheStats;
use crate::device::{Device, StreamInner};
use crate::error::{Error, Result};

/// An ordered queue of work. On Ascend it owns an `aclrtStream` (destroyed once the last
/// tensor that used it is gone) and the operator workspace reused by launches on it; on the CPU
/// work runs when it is submitted.
///
/// `Send` but not `Sync`: one thread at a time enqueues on a stream; give each thread its own.
#[derive(Debug)]
pub struct Stream {
    ctx: Context,
    /// What runs the work: the one place that says whether this is a device stream.
    engine: Engine,
    _not_sync: PhantomData<Cell<()>>,
}

/// What runs a [`Stream`]'s work.
#[derive(Debug)]
enum Engine {
    /// The calling thread, when the work is submitted (the CPU backend).
    Cpu,
    /// An `aclrtStream` on the context's device (whose `Device` it holds).
    Ascend(Arc<StreamInner>),
}

impl Context {
    /// A new stream: an `aclrtStream` on Ascend (`aclrtCreateStream`); on the CPU, work runs on
    /// the calling thread when it is submitted.
    pub fn new_stream(&self) -> Result<Stream> {
        let engine = match &self.kind {
            ContextKind::Cpu => Engine::Cpu,
            ContextKind::Ascend(d) => Engine::Ascend(StreamInner::new(d.clone())?),
        };
        Ok(Stream::new(self.clone(), engine))
    }
}

impl Stream {
    fn new(ctx: Context, engine: Engine) -> Self {
        Stream { ctx, engine, _not_sync: PhantomData }
    }

    /// The context this stream belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The backend of this stream's context.
    pub fn backend(&self) -> Backend {
        self.ctx.backend()
    }

    /// Blocks until all work enqueued on this stream has completed (`aclrtSynchronizeStream`;
    /// a no-op on the CPU).
    pub fn synchronize(&self) -> Result<()> {
        match &self.engine {
            Engine::Ascend(s) => s.synchronize_then_drop_owners(),
            Engine::Cpu => Ok(()),
        }
    }

    /// The Ascend stream and its device; `None` for a CPU stream.
    pub(crate) fn ascend(&self) -> Option<(&Arc<StreamInner>, &Arc<Device>)> {
        match &self.engine {
            Engine::Ascend(s) => Some((s, &s.device)),
            Engine::Cpu => None,
        }
    }

    /// The raw `aclrtStream` handle, for calling other aclnn operators on the same stream. It is
    /// valid while this `Stream` (or a tensor that used it) lives; `None` on the CPU backend.
    pub fn as_raw(&self) -> Option<ascend_sys::aclrtStream> {
        self.ascend().map(|(s, _)| s.raw())
    }

    /// A `Stream` over an `aclrtStream` the caller created (e.g. another library's stream), on
    /// `ctx`'s device. It is used like a stream of [`Context::new_stream`]: operators, copies and
    /// collectives enqueue on it, every buffer they touch is recorded on it, and it is
    /// synchronised before those buffers (and this crate's workspace for it) are freed. It is
    /// **never destroyed** by this crate. Errors: a CPU context, or a null handle (the default
    /// stream, which collectives refuse).
    ///
    /// # Safety
    /// `raw` is a live stream created on `ctx`'s device (in its default context) and stays alive
    /// until this `Stream` is dropped; the caller destroys it only after that. Dropping the
    /// `Stream` synchronises `raw`, and from then on this crate never uses it again (tensors,
    /// host buffers, communicators and cached memory that it used treat it as drained).
    pub unsafe fn from_raw(ctx: &Context, raw: ascend_sys::aclrtStream) -> Result<Stream> {
        match &ctx.kind {
            ContextKind::Cpu => {
                Err(Error::invalid("ctx", "a raw aclrtStream needs an Ascend context, got the CPU backend"))
            }
            ContextKind::Ascend(_) if raw.is_null() => Err(Error::null(
                "raw",
                "a null aclrtStream is the default stream; pass a stream from aclrtCreateStream",
            )),
            ContextKind::Ascend(d) => {
                // SAFETY: the caller guarantees `raw` is a live stream of this device that outlives it.
                Ok(Stream::new(ctx.clone(), Engine::Ascend(unsafe { StreamInner::borrowed(d.clone(), raw) })))
            }
        }
    }

    /// Sets how many launch signatures this stream's launch cache keeps (0 turns it off; the
    /// least recently used go first). A launch of an `_into` or allocating operator entry whose
    /// operator, tensor dtypes, shapes, strides, offsets, storage sizes and scalars match a kept
    /// one skips phase 1 and the descriptors: its executor (repeatable) is rebound to the new
    /// addresses and launched. New streams start with `ASCEND_LAUNCH_CACHE_SIZE` entries
    /// (default 256), or 0 with `ASCEND_NO_LAUNCH_CACHE=1`. Removed entries are destroyed once
    /// their queued launches have run. Nothing to do on the CPU backend.
    pub fn set_launch_cache_capacity(&self, entries: usize) {
        if let Some((s, _)) = self.ascend() {
            s.launches.set_capacity(s, entries);
        }
    }

    /// The counters of this stream's launch cache (all 0 on the CPU backend).
    pub fn launch_cache_stats(&self) -> LaunchCacheStats {
        self.ascend().map(|(s, _)| s.launches.stats(s)).unwrap_or_default()
    }

    pub(crate) fn mismatch(&self, argument: &'static str, what: &str) -> Error {
        Error::invalid(argument, format!("{what}, but the stream is on {}", describe(&self.ctx)))
    }
}

impl Drop for Stream {
    /// A stream over the caller's handle ([`Stream::from_raw`]) ends here for this crate: it is
    /// synchronised, and every holder (host buffers, communicators, workspaces, the allocator)
    /// treats it as drained from now on, never touching the handle again, so the caller may
    /// destroy it. A stream of [`Context::new_stream`] lives on while tensors that used it do.
    fn drop(&mut self) {
        if let Engine::Ascend(inner) = &self.engine {
            inner.release();
        }
    }
}

pub(crate) fn describe(ctx: &Context) -> String {
    match &ctx.kind {
        ContextKind::Cpu => "the CPU backend".into(),
        ContextKind::Ascend(d) => format!("Ascend device {}", d.id),
    }
}
