//! Streams, as the DLPack protocol numbers them: 1 is the legacy default stream, 2 the
//! per-thread default stream, any other value a `CUstream` handle. (The driver accepts 1 and 2 as
//! `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`.) Ordering two streams never blocks the host:
//! an event recorded on the producer is waited on by the consumer.

use super::{check, context};
use crate::error::{Error, Result};
use cudarc::driver::{result, sys};

/// The legacy default stream.
pub const LEGACY: usize = 1;
/// The per-thread default stream.
pub const PER_THREAD: usize = 2;

/// The driver handle for a DLPack-numbered stream.
pub fn handle(stream: usize) -> sys::CUstream {
    stream as sys::CUstream
}

/// Validates a user-given stream number: 0 is ambiguous in DLPack and refused.
pub fn from_user(value: i128) -> Result<usize> {
    match value {
        0 => Err(Error::invalid(
            "stream 0 is ambiguous; use 1 for the legacy default stream or 2 for the \
             per-thread default stream",
        )),
        v if v < 0 || v > usize::MAX as i128 => {
            Err(Error::invalid(format!("{v} is not a CUDA stream")))
        }
        v => Ok(v as usize),
    }
}

/// Makes `consumer` wait for the work queued so far on `producer` (both on device `ordinal`),
/// without blocking the host. Nothing to do when they are the same stream.
pub fn order(consumer: usize, producer: usize, ordinal: u32) -> Result<()> {
    if consumer == producer {
        return Ok(());
    }
    // The event goes back to the spare list at once: the wait has captured its record.
    Event::record(producer, ordinal)?.wait(consumer)
}

/// A point in a stream's work: an event recorded after the work that wrote an array. Waiting on
/// it needs no handle to the stream it was recorded on, which its owner may destroy at any time.
pub struct Event {
    raw: usize,
    ordinal: u32,
}

// SAFETY: an event handle may be used from any thread with its context bound.
unsafe impl Send for Event {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for Event {}

/// Events no longer in use, by device, kept for reuse: creating one costs a driver call per
/// array that CUDA work writes. Re-recording an event is safe even while earlier waits on it are
/// queued: a wait captures the record that preceded it.
static SPARE_EVENTS: std::sync::Mutex<Vec<(u32, usize)>> = std::sync::Mutex::new(Vec::new());
const MAX_SPARE_EVENTS: usize = 256;

fn spare_event(ordinal: u32) -> Option<usize> {
    let mut spare = SPARE_EVENTS.lock().unwrap_or_else(|p| p.into_inner());
    let i = spare.iter().rposition(|&(o, _)| o == ordinal)?;
    Some(spare.swap_remove(i).1)
}

impl Event {
    /// Records an event after the work queued so far on `stream`.
    pub fn record(stream: usize, ordinal: u32) -> Result<Event> {
        context::bind(ordinal)?;
        let raw = match spare_event(ordinal) {
            Some(raw) => raw as sys::CUevent,
            None => check(
                result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING),
                "creating an event",
            )?,
        };
        let event = Event {
            raw: raw as usize,
            ordinal,
        };
        // SAFETY: a live event of this context; `stream` is live (the caller is using it now).
        let recorded = unsafe { result::event::record(raw, handle(stream)) };
        check(recorded, "recording an event")?;
        Ok(event)
    }

    /// Makes `consumer` wait for this event without blocking the host.
    pub fn wait(&self, consumer: usize) -> Result<()> {
        context::bind(self.ordinal)?;
        // SAFETY: a live event of this context; `consumer` is live (the caller's).
        check(
            unsafe {
                result::stream::wait_event(
                    handle(consumer),
                    self.raw as sys::CUevent,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            },
            "ordering a stream after an array's pending work",
        )
    }

    /// Blocks the host until the event has happened.
    pub fn synchronize(&self) -> Result<()> {
        context::bind(self.ordinal)?;
        // SAFETY: a live event of this context.
        check(
            unsafe { result::event::synchronize(self.raw as sys::CUevent) },
            "waiting for an event",
        )
    }

    /// Whether the work before the event is done (an error counts as done: nothing more will
    /// happen on its account).
    pub fn is_done(&self) -> bool {
        // SAFETY: a live event; querying needs no current context.
        let r = unsafe { sys::cuEventQuery(self.raw as sys::CUevent) };
        r != sys::CUresult::CUDA_ERROR_NOT_READY
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let mut spare = SPARE_EVENTS.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < MAX_SPARE_EVENTS {
            spare.push((self.ordinal, self.raw));
            return;
        }
        drop(spare);
        let _restore = context::Restore::new();
        if context::bind(self.ordinal).is_ok() {
            // SAFETY: created by `record`, destroyed once; pending waits still complete.
            let _ = unsafe { result::event::destroy(self.raw as sys::CUevent) };
        }
    }
}

/// Blocks the host until `stream`'s queued work is done.
pub fn synchronize(stream: usize, ordinal: u32) -> Result<()> {
    context::bind(ordinal)?;
    // SAFETY: a live stream handle of the current context.
    check(
        unsafe { result::stream::synchronize(handle(stream)) },
        "synchronizing a stream",
    )
}

/// A new non-blocking stream on `ordinal`, owned by the caller (see [`destroy`]).
pub fn create(ordinal: u32) -> Result<usize> {
    context::bind(ordinal)?;
    let s = check(
        result::stream::create(result::stream::StreamKind::NonBlocking),
        "creating a stream",
    )?;
    Ok(s as usize)
}

/// Destroys a stream made by [`create`].
pub fn destroy(stream: usize, ordinal: u32) {
    if context::bind(ordinal).is_ok() {
        // SAFETY: a stream from `create`, destroyed once; queued work still completes.
        let _ = unsafe { result::stream::destroy(handle(stream)) };
    }
}

/// Whether `stream` of device `ordinal` is capturing a graph (an invalidated capture counts: it
/// has not ended yet). The legacy default stream never captures.
pub fn is_capturing(stream: usize, ordinal: u32) -> Result<bool> {
    if stream == LEGACY {
        return Ok(false);
    }
    context::bind(ordinal)?;
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `stream` is a stream handle of the current context; the status is written to a
    // local of the right type.
    let r = unsafe { sys::cuStreamIsCapturing(handle(stream), &mut status) };
    check(r.result(), "asking whether a stream is capturing")?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Puts the calling thread in the relaxed stream-capture mode until dropped: calls that a
/// capture in the global mode (the default, `torch.cuda.graph`'s among them) would otherwise
/// refuse, and be invalidated by, are allowed. cubridge uses it on its background threads and
/// around the few calls it makes beside a capture it takes part in.
pub struct RelaxedCapture(Option<sys::CUstreamCaptureMode>);

impl RelaxedCapture {
    /// Enters the relaxed mode (inert without a driver).
    pub fn new() -> RelaxedCapture {
        if !crate::cuda::is_available() {
            return RelaxedCapture(None);
        }
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: exchanges this thread's mode with a valid one; the previous one is written back.
        let r = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        RelaxedCapture(r.result().ok().map(|_| mode))
    }
}

impl Default for RelaxedCapture {
    fn default() -> Self {
        RelaxedCapture::new()
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some(mut mode) = self.0.take() {
            // SAFETY: restores the mode this thread had, a valid one.
            let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        }
    }
}
