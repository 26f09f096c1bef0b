//! [`Event`]: a marker recorded in a [`Stream`], to order streams on the device and to time work.

use std::sync::Arc;
use std::time::Instant;

use crate::device::EventInner;
use crate::error::{Error, Result};
use crate::stream::Stream;

/// A point in a stream's queue (`aclrtEvent` on Ascend), made by [`Stream::record_event`].
///
/// Another stream can wait for it on the device ([`Stream::wait_event`]: the host does not
/// block), the host can wait for it ([`Event::synchronize`]) or ask whether it has been reached
/// ([`Event::is_complete`], never blocks), and two events time the work between them
/// ([`Event::elapsed_ms`]). `Send + Sync`; dropping it is safe at any time (a stream that queued
/// a wait on it keeps the underlying event alive until the wait has run).
///
/// On the CPU backend work runs when it is submitted, so an event is complete as soon as it is
/// recorded; it holds the host time of its recording.
#[derive(Debug, Clone)]
pub struct Event {
    kind: EventKind,
}

#[derive(Debug, Clone)]
enum EventKind {
    Cpu(Instant),
    Ascend(Arc<EventInner>),
}

impl Stream {
    /// Records a new event after all work enqueued so far on this stream
    /// (`aclrtCreateEventExWithFlag(ACL_EVENT_SYNC | ACL_EVENT_TIME_LINE)`, waitable and timed, +
    /// `aclrtRecordEvent`; on the CPU, the current time).
    pub fn record_event(&self) -> Result<Event> {
        match self.ascend() {
            None => Ok(Event { kind: EventKind::Cpu(Instant::now()) }),
            Some((inner, device)) => {
                let event = EventInner::timing(device.clone())?;
                inner.record(&event)?;
                Ok(Event { kind: EventKind::Ascend(event) })
            }
        }
    }

    /// Makes work enqueued on this stream from now on wait, on the device, until `event` is
    /// complete (`aclrtStreamWaitEvent`); the host does not block. On the CPU this does nothing
    /// (the event is already complete). An event of another backend or device is an error.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        match (&event.kind, self.ascend()) {
            (EventKind::Cpu(_), None) => Ok(()),
            (EventKind::Ascend(e), Some((inner, device))) if e.device.same(device) => inner.wait(e.clone()),
            (EventKind::Ascend(e), _) => {
                Err(self.mismatch("event", &format!("the event was recorded on Ascend device {}", e.device.id)))
            }
            (EventKind::Cpu(_), Some(_)) => Err(self.mismatch("event", "the event was recorded on the CPU backend")),
        }
    }
}

impl Event {
    /// Blocks the host until the work before the event has completed (`aclrtSynchronizeEvent`;
    /// at once on the CPU).
    pub fn synchronize(&self) -> Result<()> {
        match &self.kind {
            EventKind::Cpu(_) => Ok(()),
            EventKind::Ascend(e) => e.synchronize(),
        }
    }

    /// Whether the work before the event has completed (`aclrtQueryEventStatus`; never blocks;
    /// always `true` on the CPU).
    pub fn is_complete(&self) -> Result<bool> {
        match &self.kind {
            EventKind::Cpu(_) => Ok(true),
            EventKind::Ascend(e) => e.is_complete(),
        }
    }

    /// Milliseconds from `start` to this event (`aclrtEventElapsedTime`: both must be complete;
    /// on the CPU the host time between the two recordings). Events of different backends or
    /// devices are an error.
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32> {
        match (&self.kind, &start.kind) {
            (EventKind::Cpu(end), EventKind::Cpu(begin)) => {
                let ms = end.saturating_duration_since(*begin).as_secs_f64() * 1e3;
                Ok(ms as f32)
            }
            (EventKind::Ascend(end), EventKind::Ascend(begin)) if end.device.same(&begin.device) => {
                end.elapsed_ms_since(begin)
            }
            _ => Err(Error::invalid("start", "the two events were recorded on different backends or devices")),
        }
    }
}
