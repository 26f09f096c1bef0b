//! Events: the device's pool of reusable ordering events ([`EventPool`]), the events handed out
//! of it ([`PooledEvent`] for holders that live inside the device, [`EventInner`] for the rest),
//! and the public `Event`'s own timing events.
//!
//! Every event this crate records again comes from `aclrtCreateEventExWithFlag(ACL_EVENT_SYNC)`:
//! CANN documents re-recording (each record captures the stream's queued work anew) only for
//! those, and a stream may wait for them only with `ACL_EVENT_SYNC` (acl_rt.h, runtime
//! `docs/zh/api_ref/07_event_management.md`). An event goes back to the pool without a host wait,
//! once
//! * its last record is seen complete (`aclrtQueryEventStatus`), and
//! * no queued `aclrtStreamWaitEvent` may still refer to it. A wait queued on stream `S` has run
//!   once an event recorded on `S` after it has completed: a stream keeps the events it waited
//!   for until it records such a *guard* (one per [`WAIT_BATCH`] waits) and hands them to the
//!   pool with it, or until it is synchronised.
//!
//! The pool reclaims whenever an event is asked for (PyTorch's caching allocator likewise polls
//! its outstanding events on every allocation), keeps at most [`SPARE_MAX`] spare events
//! (destroying the others), and holds at most [`LIVE_MAX`] events per device: asking for one more
//! while none can be reclaimed is an error (`ACL_ERROR_RT_NO_EVENT_RESOURCE`), never a hang. (A
//! caller that cannot fail, a free or a drop, then waits for its stream instead.)
//!
//! The pool also keeps the owners of foreign memory (a DLPack producer's capsule) whose tensor
//! was dropped while queued work may still use it, each with an event recorded after that work on
//! every stream that used it ([`EventPool::park`]): an owner is dropped (its deleter called) once
//! all its events are seen complete, never waited for except at teardown. Every event request and
//! every stream synchronise gives back the parked owners' completed events; the owners themselves
//! are dropped only by the polls made where the thread holds no stream lock of this crate (park,
//! `Stream::synchronize` and drop, each after its stream's locks are let go:
//! [`EventPool::drop_ready_owners`]; and allocations, but for a launch's workspace that grows,
//! allocated under its stream's enqueue lock, which leaves them parked), so a deleter that comes
//! back into this crate (drops a tensor, reads one, synchronises a stream) finds none of them
//! held by its thread. A synchronise the crate makes for itself (under a buffer's list of streams, a
//! stream's enqueue lock or a borrowed stream's `released` lock) leaves the owners it made ready
//! parked for the next such poll. Every parked owner holds at least one of the pool's events until a poll that drops the
//! ready ones, so at most [`LIVE_MAX`] are parked: past that a drop cannot record its event and
//! waits for its stream instead.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use ascend_sys::event_flag::{ACL_EVENT_SYNC, ACL_EVENT_TIME_LINE};
use ascend_sys::{aclrtEvent, aclrtStream, Cann};

use super::allocator::Recorded;
use super::capture::Keep;
use super::{report_drop_error, Device};
use crate::acl;
use crate::error::{Error, Result};

/// Spare (complete, unreferenced) events a device's pool keeps; more are destroyed.
pub(crate) const SPARE_MAX: usize = 32;
/// The most pooled events a device holds at once (CANN allows 65536 per device on Atlas A2/A3,
/// 1023 on Atlas inference cards, shared with every other user of the device).
pub(crate) const LIVE_MAX: usize = 4096;
/// Pending events a reclaim queries past before it stops (see [`EventPool::reclaim`]).
pub(crate) const RECLAIM_SCAN: usize = 64;
/// Waits a stream queues before it records a guard event that tells when they have run.
pub(crate) const WAIT_BATCH: usize = 8;

/// An event of a device's pool, owned by a holder that lives inside the device (a cached block,
/// a deferred host free): it holds no reference to the device, so the device can keep it. It is
/// handed back with [`EventPool::give_back`] (complete) or [`EventPool::retire`]; one that is
/// dropped is leaked.
pub(crate) struct PooledEvent(aclrtEvent);

// SAFETY: an aclrtEvent is a handle of the device's default context, usable from any thread that
// binds the device (every use here binds it first); the value is owned uniquely.
unsafe impl Send for PooledEvent {}

impl PooledEvent {
    /// The raw handle, live while `self` is.
    pub(crate) fn raw(&self) -> aclrtEvent {
        self.0
    }

    /// Whether its last record has run (`aclrtQueryEventStatus`; a failed query counts as no).
    pub(crate) fn is_complete(&self, cann: &Cann) -> bool {
        // SAFETY: the event is live (owned by its holder); the caller bound the device.
        unsafe { acl::event_is_complete(cann, self.0) }.unwrap_or(false)
    }

    /// Blocks the host until its last record has run (`aclrtSynchronizeEvent`).
    pub(crate) fn synchronize(&self, cann: &Cann) -> Result<()> {
        // SAFETY: as in `is_complete`.
        unsafe { acl::synchronize_event(cann, self.0) }
    }
}

/// An event handed back to the pool that may not be reusable yet: it is, once its last record is
/// complete; then the waits in `waits` have run too (they were queued on the stream it was
/// recorded on, before it), so their events are let go.
struct Pending {
    event: PooledEvent,
    waits: Vec<Waited>,
}

/// An event a queued wait refers to, handed to the pool with a guard.
enum Waited {
    /// One of this pool's, no longer referenced elsewhere: spare with its guard (it holds no
    /// reference to the device, so the pool holding it keeps no cycle alive).
    Pooled(PooledEvent),
    /// Another's (a timing event, or one still referenced): let go with its guard.
    Shared(Arc<EventInner>),
}

#[derive(Default)]
struct PoolState {
    /// Complete events that no queued wait refers to: recorded again on the next request.
    spare: Vec<PooledEvent>,
    /// Handed back, oldest first; spare once seen complete.
    pending: VecDeque<Pending>,
    /// Pooled events alive now (handed out, pending or spare).
    live: usize,
}

/// Counters of a device's event pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PoolStats {
    /// Pooled events alive now.
    pub(crate) live: usize,
    /// Spare events now.
    pub(crate) spare: usize,
    /// Events handed back whose record (or the waits before it) may still be pending.
    pub(crate) pending: usize,
}

/// The pool of reusable ordering events of one device (see the module docs). Every method expects
/// the device bound on the calling thread.
#[derive(Default)]
pub(crate) struct EventPool {
    state: Mutex<PoolState>,
    /// Foreign owners waiting for their events, oldest first (see [`EventPool::park`]). Locked
    /// before `state`, never while an owner is dropped.
    parked: Mutex<Vec<Parked>>,
}

/// What keeps foreign memory allocated (dropped when the memory may be freed), with an event
/// recorded after the last use of the memory on each stream that used it, not yet seen complete.
struct Parked {
    events: Vec<PooledEvent>,
    owner: Box<dyn Send + Sync>,
}

impl std::fmt::Debug for EventPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPool").field("stats", &self.stats()).finish()
    }
}

impl EventPool {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn stats(&self) -> PoolStats {
        let st = self.lock();
        PoolStats { live: st.live, spare: st.spare.len(), pending: st.pending.len() }
    }

    /// An event that may be recorded now: a spare one (after reclaiming what has completed), or a
    /// new one while the device holds fewer than [`LIVE_MAX`].
    pub(crate) fn take(&self, cann: &Cann) -> Result<PooledEvent> {
        self.poll_parked(cann, false);
        let mut st = self.lock();
        let released = Self::reclaim_locked(cann, &mut st, RECLAIM_SCAN);
        let taken = match st.spare.pop() {
            Some(e) => Ok(e),
            None if st.live < LIVE_MAX => {
                let raw = acl::create_event(cann, ACL_EVENT_SYNC)?;
                st.live += 1;
                Ok(PooledEvent(raw))
            }
            None => Err(Error::Cann {
                call: "aclrtCreateEventExWithFlag",
                status: ascend_sys::status::ACL_ERROR_RT_NO_EVENT_RESOURCE,
                message: Some(format!(
                    "this crate keeps at most {LIVE_MAX} ordering events per device, and all of them are held by \
                     work queued without a host wait ({} of them waiting for their record to complete); \
                     synchronise a stream (or the device) to let them go",
                    st.pending.len()
                )),
            }),
        };
        drop(st);
        drop(released); // user events let go outside the lock
        taken
    }

    /// An event from the pool recorded now on `stream` (a live stream of this device).
    pub(crate) fn record(&self, cann: &Cann, stream: aclrtStream) -> Result<PooledEvent> {
        let event = self.take(cann)?;
        // SAFETY: the event is live and complete (or new), no queued wait refers to it; the
        // stream is live (the caller's guarantee) and on this device, which is bound.
        match unsafe { acl::record_event(cann, event.0, stream) } {
            Ok(()) => Ok(event),
            Err(e) => {
                // A failed record leaves the event as it was: complete.
                self.give_back(cann, event);
                Err(e)
            }
        }
    }

    /// Takes back an event whose last record has completed (or that was never recorded) and that
    /// no queued wait refers to: kept spare, or destroyed when [`SPARE_MAX`] are spare.
    pub(crate) fn give_back(&self, cann: &Cann, event: PooledEvent) {
        let mut st = self.lock();
        Self::spare_or_destroy(cann, &mut st, event);
    }

    /// Takes back an event whose last record may still be pending (no wait refers to it, except
    /// those in `waits`, queued before its record on the stream it was recorded on, whose events
    /// are let go once it has completed).
    pub(crate) fn retire(&self, event: PooledEvent, waits: Vec<Arc<EventInner>>) {
        let waits = waits
            .into_iter()
            .map(|w| match Arc::try_unwrap(w) {
                Ok(mut e) if e.pooled && std::ptr::eq(&e.device.events, self) => match e.event.take() {
                    Some(event) => Waited::Pooled(event),
                    None => Waited::Shared(Arc::new(e)),
                },
                Ok(e) => Waited::Shared(Arc::new(e)),
                Err(shared) => Waited::Shared(shared),
            })
            .collect();
        self.lock().pending.push_back(Pending { event, waits });
    }

    /// Moves pending events seen complete to the spare list (never waits): at most
    /// [`RECLAIM_SCAN`] still-pending ones are queried. With `drop_owners` (only for a caller that
    /// holds no lock of this crate), parked owners found ready are dropped too.
    pub(crate) fn reclaim(&self, cann: &Cann, drop_owners: bool) {
        self.poll_parked(cann, drop_owners);
        let released = Self::reclaim_locked(cann, &mut self.lock(), RECLAIM_SCAN);
        drop(released);
    }

    /// [`reclaim`](Self::reclaim) querying every pending event (after a stream synchronised:
    /// its guards have completed, and the waits they hold may keep the device alive). Parked
    /// owners it finds ready stay parked: the caller may hold a stream's locks, so it leaves them
    /// to [`drop_ready_owners`](Self::drop_ready_owners).
    pub(crate) fn reclaim_all(&self, cann: &Cann) {
        self.poll_parked(cann, false);
        let released = Self::reclaim_locked(cann, &mut self.lock(), usize::MAX);
        drop(released);
    }

    /// Drops the parked owners whose events have all completed (their deleters run on this
    /// thread). Only for callers that hold no lock of this crate (see the module docs).
    pub(crate) fn drop_ready_owners(&self, cann: &Cann) {
        self.poll_parked(cann, true);
    }

    /// [`reclaim`](Self::reclaim) with the state locked; returns the waited-for events let go
    /// (to be dropped after the lock). Queries the pending events oldest first, each once, and
    /// stops after [`RECLAIM_SCAN`] that are still pending (those go to the back): a bounded
    /// number of runtime calls per request, however far the device lags.
    fn reclaim_locked(cann: &Cann, st: &mut PoolState, scan: usize) -> Vec<Arc<EventInner>> {
        let mut released = Vec::new();
        let (mut left, mut still_pending) = (st.pending.len(), 0);
        while left > 0 && still_pending < scan {
            left -= 1;
            let Some(p) = st.pending.pop_front() else { break };
            if p.event.is_complete(cann) {
                Self::spare_or_destroy(cann, st, p.event);
                for w in p.waits {
                    match w {
                        // Its wait has run, so its record has completed.
                        Waited::Pooled(e) => Self::spare_or_destroy(cann, st, e),
                        Waited::Shared(e) => released.push(e),
                    }
                }
            } else {
                still_pending += 1;
                st.pending.push_back(p);
            }
        }
        released
    }

    fn spare_or_destroy(cann: &Cann, st: &mut PoolState, event: PooledEvent) {
        if st.spare.len() < SPARE_MAX {
            st.spare.push(event);
            return;
        }
        // SAFETY: the event is complete and no queued wait refers to it (the caller's
        // guarantee); it is never used again.
        match unsafe { acl::destroy_event(cann, event.0) } {
            Ok(()) => st.live -= 1,
            Err(e) => report_drop_error("aclrtDestroyEvent", &e),
        }
    }

    /// Keeps `owner` (of foreign memory) until every event of `events` (recorded after the last
    /// use of the memory on each stream that used it) is seen complete, then drops it on the
    /// thread that polls ([`poll_parked`](Self::poll_parked)), so `owner` must be droppable on
    /// any thread. Never waits; polls at once.
    pub(crate) fn park(&self, cann: &Cann, events: Vec<PooledEvent>, owner: Box<dyn Send + Sync>) {
        self.parked.lock().unwrap_or_else(|p| p.into_inner()).push(Parked { events, owner });
        self.poll_parked(cann, true);
    }

    /// Gives back the parked owners' events seen complete (queried oldest first, never waited
    /// for; at most [`RECLAIM_SCAN`] owners still pending are queried) and, with `run`, drops the
    /// owners whose events have all completed, outside every lock of the pool (a deleter may use
    /// the pool again). Without `run` (an event request, which callers make while holding a
    /// stream's locks) they stay parked, ready, for the next poll that runs them.
    fn poll_parked(&self, cann: &Cann, run: bool) {
        let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        if parked.is_empty() {
            return;
        }
        let mut done = Vec::new();
        let mut still_pending = 0;
        parked.retain_mut(|p| {
            if still_pending < RECLAIM_SCAN {
                let mut i = 0;
                while i < p.events.len() {
                    if p.events[i].is_complete(cann) {
                        self.give_back(cann, p.events.swap_remove(i));
                    } else {
                        i += 1;
                    }
                }
            }
            if !p.events.is_empty() {
                still_pending += 1;
                return true;
            }
            if run {
                done.push(std::mem::replace(&mut p.owner, Box::new(())));
            }
            !run
        });
        drop(parked);
        drop(done); // the owners' deleters, outside the locks
    }

    /// Teardown of the parked owners (every stream of the device has finished): waits for their
    /// events and drops them; an owner whose wait fails is leaked (queued work may still use its
    /// memory) and counted.
    fn teardown_parked(&self, cann: &Cann) {
        loop {
            let parked = std::mem::take(&mut *self.parked.lock().unwrap_or_else(|p| p.into_inner()));
            if parked.is_empty() {
                return;
            }
            for p in parked {
                // Waiting is teardown's right.
                match p.events.iter().try_for_each(|e| e.synchronize(cann)) {
                    Ok(()) => {
                        p.events.into_iter().for_each(|e| self.give_back(cann, e));
                        drop(p.owner);
                    }
                    Err(e) => {
                        report_drop_error("aclrtSynchronizeEvent (freeing foreign memory)", &e);
                        std::mem::forget(p);
                        super::leaked(super::Leak::Allocation);
                    }
                }
            }
        }
    }

    /// Teardown (every stream of the device has finished): waits for the pending events and
    /// destroys every event of the pool.
    pub(crate) fn teardown(&self, cann: &Cann) {
        self.teardown_parked(cann);
        loop {
            let pending: Vec<Pending> = self.lock().pending.drain(..).collect();
            if pending.is_empty() {
                break;
            }
            let mut released = Vec::new();
            for p in pending {
                if let Err(e) = p.event.synchronize(cann) {
                    report_drop_error("aclrtSynchronizeEvent (destroying the event pool)", &e);
                    std::mem::forget(p.waits); // their waits may not have run: leaked
                    continue;
                }
                let mut st = self.lock();
                st.spare.push(p.event);
                for w in p.waits {
                    match w {
                        Waited::Pooled(e) => st.spare.push(e),
                        Waited::Shared(e) => released.push(e),
                    }
                }
            }
            drop(released); // pooled ones come back as pending: another round
        }
        let mut st = self.lock();
        for e in std::mem::take(&mut st.spare) {
            // SAFETY: complete, and every wait on it has run; never used again.
            match unsafe { acl::destroy_event(cann, e.0) } {
                Ok(()) => st.live -= 1,
                Err(err) => report_drop_error("aclrtDestroyEvent", &err),
            }
        }
    }
}

/// An event of `device`'s pool recorded now on each of `users` after the work they queued (none
/// for a released stream, whose work has run), each with its stream's id, for a holder that frees
/// memory once they have completed (a device block, pinned host memory, a foreign owner):
/// [`After::Events`]. `held` is the user whose enqueue lock the caller holds, if any (see
/// [`Allocator::record`](super::allocator::Allocator::record): each record is made under its
/// stream's enqueue lock). A user being captured gets no event (it would be recorded into the
/// graph, and mark neither the eager work nor its end): [`After::Capturing`] with the graph's
/// keep, which the caller hands what it frees (its drop, once the graph goes, comes back here).
/// A stream on which no event can be recorded is synchronised instead; if even that fails
/// (reported as `what`), [`After::Unknown`]: queued work may still use the memory, which the
/// caller leaks. Unless `Events`, the events recorded so far are retired to the pool (reused once
/// seen complete: no wait refers to them).
pub(crate) fn record_after<'a>(
    device: &Device,
    users: impl IntoIterator<Item = &'a super::StreamInner>,
    held: Option<&super::StreamInner>,
    what: &str,
) -> After {
    let mut events = Vec::new();
    let retire =
        |events: Vec<(u64, PooledEvent)>| events.into_iter().for_each(|(_, e)| device.events.retire(e, Vec::new()));
    for s in users {
        match device.bind().and_then(|()| device.memory.record(device.cann, &device.events, s, held)) {
            Ok(Recorded::Event(e)) => events.push((s.id, e)),
            // A released stream: its work has run.
            Ok(Recorded::Released) => {}
            Ok(Recorded::Capturing(keep)) => {
                retire(events);
                return After::Capturing(keep);
            }
            Err(_) => {
                if let Err(e) = s.synchronize() {
                    report_drop_error(what, &e);
                    retire(events);
                    return After::Unknown;
                }
            }
        }
    }
    After::Events(events)
}

/// What [`record_after`] made of a block's users.
pub(crate) enum After {
    /// An event after each user's work (none for a released one, or one synchronised).
    Events(Vec<(u64, PooledEvent)>),
    /// A user is being captured into the graph this keeps.
    Capturing(Arc<Keep>),
    /// A user could be neither recorded on nor synchronised: its work may still use the memory.
    Unknown,
}

/// A live event held with an `Arc`: a pooled one checked out by a stream (an ordering marker, a
/// staging chunk's, a launch cache's), which goes back to its device's pool when the last `Arc`
/// drops, or a timing event of the public `Event`, destroyed then. A stream that queued a wait
/// on it holds an `Arc` until that wait has run.
pub(crate) struct EventInner {
    pub(crate) device: Arc<Device>,
    /// `None` only inside `drop`.
    event: Option<PooledEvent>,
    /// From the device's pool (else a timing event of its own).
    pooled: bool,
}

// SAFETY: as `PooledEvent`; `&EventInner` only records, queries, waits or reads the handle.
unsafe impl Send for EventInner {}
// SAFETY: as above; CANN's event calls are thread-safe.
unsafe impl Sync for EventInner {}

impl std::fmt::Debug for EventInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").field("device", &self.device.id).field("raw", &self.raw()).finish()
    }
}

impl EventInner {
    /// A timing event of its own (`aclrtCreateEventExWithFlag(ACL_EVENT_SYNC |
    /// ACL_EVENT_TIME_LINE)`: waitable and timed), destroyed when the last `Arc` drops.
    pub(crate) fn timing(device: Arc<Device>) -> Result<Arc<Self>> {
        device.bind()?;
        let raw = acl::create_event(device.cann, ACL_EVENT_SYNC | ACL_EVENT_TIME_LINE)?;
        Ok(Arc::new(EventInner { device, event: Some(PooledEvent(raw)), pooled: false }))
    }

    /// An event of `device`'s pool, recorded now on `stream`; back to the pool when the last
    /// `Arc` drops.
    pub(crate) fn pooled_on(device: &Arc<Device>, stream: aclrtStream) -> Result<Arc<Self>> {
        device.bind()?;
        let event = device.events.record(device.cann, stream)?;
        Ok(Arc::new(EventInner { device: device.clone(), event: Some(event), pooled: true }))
    }

    /// The raw handle, valid while `self` lives.
    pub(crate) fn raw(&self) -> aclrtEvent {
        self.event.as_ref().map_or(std::ptr::null_mut(), PooledEvent::raw)
    }

    /// Whether the last record has run (`aclrtQueryEventStatus`, never blocks).
    pub(crate) fn is_complete(&self) -> Result<bool> {
        self.device.bind()?;
        // SAFETY: `raw` is live while `self` is; the device is bound.
        unsafe { acl::event_is_complete(self.device.cann, self.raw()) }
    }

    /// Blocks the host until the last record has run (`aclrtSynchronizeEvent`).
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: as in `is_complete`.
        unsafe { acl::synchronize_event(self.device.cann, self.raw()) }
    }

    /// Leaks the event (a queued wait may still refer to it, so it must not be destroyed nor
    /// reused) without keeping its device alive.
    pub(crate) fn leak(this: Arc<Self>) {
        if let Ok(mut e) = Arc::try_unwrap(this) {
            // A `PooledEvent` has no destructor: the handle is simply never used again.
            e.event = None;
        }
    }

    /// Lets go of an event whose last record has completed and that no queued wait refers to: a
    /// pooled one goes straight back to the spare list when this was the last `Arc`.
    pub(crate) fn recycle(this: Arc<Self>) {
        let Ok(mut e) = Arc::try_unwrap(this) else { return };
        if e.pooled && e.device.bind().is_ok() {
            if let Some(event) = e.event.take() {
                e.device.events.give_back(e.device.cann, event);
            }
        }
    }

    /// Milliseconds from `start`'s record to this event's (`aclrtEventElapsedTime`).
    pub(crate) fn elapsed_ms_since(&self, start: &EventInner) -> Result<f32> {
        self.device.bind()?;
        // SAFETY: both handles are live while the references are.
        unsafe { acl::event_elapsed_ms(self.device.cann, start.raw(), self.raw()) }
    }
}

impl Drop for EventInner {
    fn drop(&mut self) {
        let Some(event) = self.event.take() else { return };
        if self.pooled {
            // Every stream that queued a wait on it held an `Arc` until that wait had run: only
            // its record may still be pending.
            self.device.events.retire(event, Vec::new());
            return;
        }
        let result = self.device.bind().and_then(|()| {
            // SAFETY: the event is live; every stream that queued a wait on it held an `Arc` to
            // it until that wait ran, so none refers to it any more.
            unsafe { acl::destroy_event(self.device.cann, event.raw()) }
        });
        if let Err(e) = result {
            report_drop_error("aclrtDestroyEvent", &e);
        }
    }
}
