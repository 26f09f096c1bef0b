//! What a captured graph keeps alive, and how its replays are ordered with other work
//! ([`Keep`]); see `crate::graph` for the public side.

use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{DeviceAlloc, StreamInner};
use crate::error::Result;

/// The resources a captured graph's tasks use, kept until the graph is dropped (after its model
/// run instance is destroyed): buffers dropped meanwhile, the workspace and launch cache of the
/// capture, its staging memory, communicators. Device buffers the captured work used are
/// *pinned* to it (`DeviceBuffer::pin`): dropping one while the graph lives hands it here, so
/// its memory is never reused while a replay could write it (the graph's private pool). Also
/// orders replays with eager work on pinned buffers: see [`Keep::order_replay`] and
/// [`Keep::order_eager`].
pub(crate) struct Keep {
    state: Mutex<KeepState>,
    /// Held for a whole replay, so two replays never interleave; the state is locked only
    /// briefly inside it (the hooks take other locks, e.g. a communicator's, without it).
    replaying: Mutex<()>,
}

#[derive(Default)]
struct KeepState {
    /// Cleared when the graph's model run instance is destroyed: nothing is kept any more.
    closed: bool,
    items: Vec<Box<dyn Any + Send>>,
    /// The stream of the last replay: work ordered after it (an event recorded on it when needed,
    /// or a host synchronise of it) is after the replay; nothing is recorded per replay.
    last: Option<Arc<StreamInner>>,
    /// Streams that queued work on pinned buffers since the last replay (each once). Starts with
    /// the captured stream: work queued on it before the capture (which the captured work's
    /// workspace and buffers took part in) comes before the first replay on another stream.
    touched: Vec<Arc<StreamInner>>,
    /// The captured stream, in whose order the pool's blocks go back to the allocator (see
    /// [`PoolBlock`]). `None` once closed.
    stream: Option<Arc<StreamInner>>,
    /// The graph's private pool: blocks that only the captured stream used, dropped during the
    /// capture (buffers, an outgrown workspace), and the capture's workspace; later allocations of
    /// the capture reuse them (in the capture's stream order, which every replay keeps). Work
    /// queued on the stream before the capture may still use them: they go back to the allocator
    /// in the stream's order when the graph goes (see [`PoolBlock`]), never as idle.
    pool: Vec<DeviceAlloc>,
    /// Run before each replay with its stream: orders it like the work it replays (a captured
    /// collective's communicator orders it as one of its collectives).
    hooks: Vec<Hook>,
}

/// See `KeepState::hooks`.
pub(crate) type Hook = Box<dyn FnMut(&Arc<StreamInner>) -> Result<()> + Send>;

impl KeepState {
    fn new(stream: &Arc<StreamInner>) -> Self {
        KeepState {
            closed: false,
            items: Vec::new(),
            last: None,
            touched: vec![stream.clone()],
            stream: Some(stream.clone()),
            pool: Vec::new(),
            hooks: Vec::new(),
        }
    }
}

impl Keep {
    /// What a graph captured on `stream` will keep (nothing yet).
    pub(crate) fn new(stream: &Arc<StreamInner>) -> Self {
        Keep { state: Mutex::new(KeepState::new(stream)), replaying: Mutex::new(()) }
    }

    fn lock(&self) -> MutexGuard<'_, KeepState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the graph still lives (its memory must not be reused).
    pub(crate) fn live(&self) -> bool {
        !self.lock().closed
    }

    /// Keeps `item` until the graph goes; gives it back when the graph is already gone.
    pub(crate) fn hold<T: Any + Send>(&self, item: T) -> std::result::Result<(), T> {
        let mut st = self.lock();
        if st.closed {
            return Err(item);
        }
        st.items.push(Box::new(item));
        Ok(())
    }

    /// Puts a block that only the captured stream used in the graph's private pool (see `pool`):
    /// dropped during the capture, or the capture's workspace; gives it back when the graph is
    /// already gone.
    pub(crate) fn recycle(&self, block: DeviceAlloc) -> std::result::Result<(), DeviceAlloc> {
        let mut st = self.lock();
        if st.closed {
            return Err(block);
        }
        st.pool.push(block);
        Ok(())
    }

    /// A block for `bytes` from the graph's private pool.
    pub(crate) fn take_pooled(&self, bytes: usize) -> Option<DeviceAlloc> {
        let mut st = self.lock();
        let i = st.pool.iter().position(|b| b.fits(bytes))?;
        Some(st.pool.swap_remove(i).reuse(bytes))
    }

    /// Adds a hook run before each replay (see `KeepState::hooks`).
    pub(crate) fn before_replay(&self, hook: Hook) {
        let mut st = self.lock();
        if !st.closed {
            st.hooks.push(hook);
        }
    }

    /// Orders a replay on `stream` after the previous replay (on another stream) and after the
    /// eager work queued on pinned buffers since then; then `replay` runs (under the keep's lock,
    /// so two replays never interleave) and an event is recorded after it.
    pub(crate) fn order_replay(&self, stream: &Arc<StreamInner>, replay: impl FnOnce() -> Result<()>) -> Result<()> {
        let _serial = self.replaying.lock().unwrap_or_else(|p| p.into_inner());
        let mut hooks = std::mem::take(&mut self.lock().hooks);
        let hooked = hooks.iter_mut().try_for_each(|hook| hook(stream));
        {
            let mut st = self.lock();
            hooks.append(&mut st.hooks);
            st.hooks = hooks;
        }
        hooked?;
        let mut st = self.lock();
        if let Some(last) = st.last.clone() {
            if !Arc::ptr_eq(&last, stream) {
                stream.order_after(&last)?;
            }
        }
        for s in std::mem::take(&mut st.touched) {
            if !Arc::ptr_eq(&s, stream) {
                stream.order_after(&s)?;
            }
        }
        {
            let _enqueue = stream.lock_enqueue();
            replay()?;
        }
        st.last = Some(stream.clone());
        Ok(())
    }

    /// Orders eager work about to be queued on `stream` (touching a pinned buffer) after the last
    /// replay, and notes `stream` so the next replay waits for it.
    pub(crate) fn order_eager(&self, stream: &Arc<StreamInner>) -> Result<()> {
        let mut st = self.lock();
        if st.closed {
            return Ok(());
        }
        if let Some(last) = st.last.clone() {
            if !Arc::ptr_eq(&last, stream) {
                stream.order_after(&last)?;
            }
        }
        if !st.touched.iter().any(|s| Arc::ptr_eq(s, stream)) {
            st.touched.push(stream.clone());
        }
        Ok(())
    }

    /// Blocks the host until the last replay has run (a host access to a pinned buffer).
    pub(crate) fn wait_replays(&self) -> Result<()> {
        let last = self.lock().last.clone();
        match last {
            Some(s) => s.synchronize(),
            None => Ok(()),
        }
    }

    /// The graph is going: waits for its last replay (`Err` if that failed: then nothing may be
    /// released). Called before the model run instance is destroyed.
    pub(crate) fn drain(&self) -> Result<()> {
        self.wait_replays()
    }

    /// The model run instance is destroyed: closes the keep and hands back what it held (dropped
    /// by the caller, outside the lock; `leak` instead when the graph could not be drained). The
    /// pool's blocks come back as [`PoolBlock`]s, released in the captured stream's order.
    pub(crate) fn close(&self) -> Vec<Box<dyn Any + Send>> {
        let mut st = self.lock();
        st.closed = true;
        st.last = None;
        st.touched.clear();
        st.hooks.clear();
        let stream = st.stream.take();
        let pool = std::mem::take(&mut st.pool);
        let mut items = std::mem::take(&mut st.items);
        if let Some(stream) = stream {
            items.extend(pool.into_iter().map(|alloc| {
                Box::new(PoolBlock { alloc: Some(alloc), stream: stream.clone() }) as Box<dyn Any + Send>
            }));
        }
        items
    }
}

/// A block of a closed graph's private pool: dropping it returns the block to the allocator after
/// the work queued so far on the captured stream (an event recorded there: no host wait). Eager
/// work queued on that stream before the capture (which used the stream's workspace and the
/// buffers dropped into the pool) may not have run yet; replays are done (the graph's last one
/// was waited for before its model was destroyed, and each replay is ordered after the one
/// before).
struct PoolBlock {
    /// `None` only inside `drop`.
    alloc: Option<DeviceAlloc>,
    stream: Arc<StreamInner>,
}

impl Drop for PoolBlock {
    fn drop(&mut self) {
        let mut alloc = self.alloc.take();
        // A capture begun on the stream since takes the block into its own pool (released in the
        // same stream's order when that graph goes); one that ended meanwhile lets us try again.
        for _ in 0..4 {
            let Some(block) = alloc.take() else { return };
            match block.release(&[&self.stream], None) {
                Ok(()) => return,
                Err((block, keep)) => alloc = keep.recycle(block).err(),
            }
        }
        // Still unordered: queued work may use it.
        if let Some(block) = alloc {
            block.leak();
        }
    }
}
