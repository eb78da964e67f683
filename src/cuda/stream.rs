//! Streams: [`Stream`] names a CUDA stream of the current device's context as the DLPack
//! protocol does (1 the legacy default stream, 2 the per-thread default stream, any other value a
//! `CUstream` handle; the driver accepts 1 and 2 as `CU_STREAM_LEGACY` and
//! `CU_STREAM_PER_THREAD`). Ordering two streams never blocks the host: an event recorded on the
//! producer is waited on by the consumer.

use super::{check, context};
use crate::error::{Error, Result};
use cudarc::driver::{result, sys};

/// A CUDA stream: the legacy default stream, the per-thread default stream, or a `CUstream`
/// handle. The default streams are the calling thread's view of its current context's; a handle
/// is valid only while its owner keeps the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream(usize);

/// A write of CUDA memory: the stream it was queued on and an event after it. Consumers wait on
/// the event, never on the stream, whose owner may destroy it at any time.
#[derive(Clone)]
pub struct Write {
    /// The stream of the write.
    pub stream: Stream,
    /// An event after the write. `None` only for a write on the legacy default stream whose
    /// event nobody has needed yet: one recorded there later still follows the write, since
    /// that stream runs its work in order.
    pub event: Option<std::sync::Arc<Event>>,
}

/// The legacy default stream.
pub const LEGACY: Stream = Stream(1);
/// The per-thread default stream.
pub const PER_THREAD: Stream = Stream(2);

impl Stream {
    /// A stream numbered as DLPack numbers them (`__dlpack__(stream=)`, CAI v3 `stream`,
    /// `add(stream=)` ints): 0 is ambiguous and refused, negative values are not streams.
    pub fn from_dlpack(value: i128) -> Result<Stream> {
        match value {
            0 => Err(Error::invalid(
                "stream 0 is ambiguous; use 1 for the legacy default stream or 2 for the \
                 per-thread default stream",
            )),
            v if v < 0 || v > usize::MAX as i128 => {
                Err(Error::invalid(format!("{v} is not a CUDA stream")))
            }
            v => Ok(Stream(v as usize)),
        }
    }

    /// A stream from a driver handle as libraries report it, where NULL is the legacy default
    /// stream (a stream object's `ptr`, the DLPack exchange table's work stream).
    pub fn from_handle(handle: usize) -> Stream {
        if handle == 0 {
            LEGACY
        } else {
            Stream(handle)
        }
    }

    /// The driver handle.
    pub fn handle(self) -> sys::CUstream {
        self.0 as sys::CUstream
    }

    /// The DLPack number (what a producer's `__dlpack__(stream=)` takes).
    pub fn dlpack(self) -> usize {
        self.0
    }

    /// The legacy or the per-thread default stream: never destroyed, and ordered with every
    /// blocking stream by the legacy one.
    pub fn is_default(self) -> bool {
        self == LEGACY || self == PER_THREAD
    }
}

/// Makes `consumer` wait for the work queued so far on `producer` (both on device `ordinal`),
/// without blocking the host. Nothing to do when they are the same stream.
pub fn order(consumer: Stream, producer: Stream, ordinal: u32) -> Result<()> {
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
    /// Seen done by [`Event::is_done`] (an event is recorded once, so it stays done).
    done: std::sync::atomic::AtomicBool,
    /// For an event another copy of cubridge lent ([`Event::lent`]): what keeps it alive there.
    /// Dropping it gives the event back instead of keeping it for reuse.
    owner: Option<Box<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: an event handle may be used from any thread with its context bound.
unsafe impl Send for Event {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for Event {}

/// Events no longer in use, by device, kept for reuse: creating one costs a driver call per
/// array that CUDA work writes. Re-recording an event is safe even while earlier waits on it are
/// queued: a wait captures the record that preceded it. Held events come back in batches (the
/// releaser lets go of every finished call's at once): under the host-path stub, calls on a side
/// stream created and destroyed half an event each with room for 256, none with 4096. One list
/// per device (indexed by ordinal), so that one device's spares neither crowd out nor slow down
/// another's.
static SPARE_EVENTS: std::sync::Mutex<Vec<Vec<usize>>> = std::sync::Mutex::new(Vec::new());
const MAX_SPARE_EVENTS: usize = 4096;

fn spare_event(ordinal: u32) -> Option<usize> {
    crate::lock(&SPARE_EVENTS).get_mut(ordinal as usize)?.pop()
}

/// Keeps `raw`, an event of device `ordinal` no longer in use, for reuse; false where that
/// device's list is full.
fn keep_spare(ordinal: u32, raw: usize) -> bool {
    let mut spare = crate::lock(&SPARE_EVENTS);
    let device = ordinal as usize;
    if spare.len() <= device {
        spare.resize_with(device + 1, Vec::new);
    }
    let list = &mut spare[device];
    if list.len() >= MAX_SPARE_EVENTS {
        return false;
    }
    list.push(raw);
    true
}

impl Event {
    /// Records an event after the work queued so far on `stream`.
    pub fn record(stream: Stream, ordinal: u32) -> Result<Event> {
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
            done: std::sync::atomic::AtomicBool::new(false),
            owner: None,
        };
        // SAFETY: a live event of this context; `stream` is live (the caller is using it now).
        let recorded = unsafe { result::event::record(raw, stream.handle()) };
        check(recorded, "recording an event")?;
        Ok(event)
    }

    /// Whether another copy of cubridge lent this event ([`Event::lent`]): it may be valid only
    /// while the call that lent it lasts.
    pub fn is_lent(&self) -> bool {
        self.owner.is_some()
    }

    /// An event of device `ordinal` that `owner` keeps alive (another copy of cubridge lends
    /// it, see [`super::shared`]); it is never recorded again here, only waited for and asked.
    ///
    /// # Safety
    /// `raw` is a recorded event of device `ordinal` that stays valid, and is not recorded
    /// again, while `owner` lives.
    pub unsafe fn lent(
        raw: usize,
        ordinal: u32,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Event {
        Event {
            raw,
            ordinal,
            done: std::sync::atomic::AtomicBool::new(false),
            owner: Some(owner),
        }
    }

    /// The driver's handle, for lending ([`Event::lent`]).
    pub fn raw(&self) -> usize {
        self.raw
    }

    /// Makes `consumer`, a stream of the event's device, wait for this event without blocking
    /// the host.
    pub fn wait(&self, consumer: Stream) -> Result<()> {
        self.wait_on(consumer, self.ordinal)
    }

    /// Makes `consumer`, a stream of device `ordinal` (another device than the event's, it may
    /// be: the default streams are named by the context current when waiting), wait for this
    /// event without blocking the host.
    pub fn wait_on(&self, consumer: Stream, ordinal: u32) -> Result<()> {
        context::bind(ordinal)?;
        // SAFETY: a live event (of this context or another: the driver orders across devices);
        // `consumer` is live (the caller's), and a default stream names the bound context's.
        check(
            unsafe {
                result::stream::wait_event(
                    consumer.handle(),
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

    /// Whether the work before the event has completed: `Ok(false)` while it runs, and the
    /// driver's error where the query fails (a launch before it failed, or the event was
    /// recorded into a graph capture), which [`Event::is_done`] counts as done. Asks the driver
    /// every time.
    pub fn query(&self) -> Result<bool> {
        let _relaxed = RelaxedCapture::new();
        // SAFETY: a live event; querying needs no current context.
        let r = unsafe { sys::cuEventQuery(self.raw as sys::CUevent) };
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check(
            r.result(),
            "asking whether an array's last write is complete",
        )?;
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(true)
    }

    /// Whether the event was already seen done ([`Event::is_done`]), without asking the driver:
    /// for places that must make no driver call, such as a call inside a graph capture, where
    /// querying an event recorded into the capture would invalidate it.
    pub fn seen_done(&self) -> bool {
        self.done.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the work before the event is done (an error counts as done: nothing more will
    /// happen on its account). Once seen done, the answer costs no driver call. Asked in the
    /// relaxed capture mode: a query is refused, and invalidates the capture, while a graph is
    /// captured in the global mode (on this thread or another).
    pub fn is_done(&self) -> bool {
        use std::sync::atomic::Ordering;
        if self.done.load(Ordering::Relaxed) {
            return true;
        }
        let _relaxed = RelaxedCapture::new();
        // SAFETY: a live event; querying needs no current context.
        let r = unsafe { sys::cuEventQuery(self.raw as sys::CUevent) };
        let done = r != sys::CUresult::CUDA_ERROR_NOT_READY;
        self.done.store(done, Ordering::Relaxed);
        done
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.owner.take().is_some() {
            return; // lent: its owner keeps or destroys it
        }
        if keep_spare(self.ordinal, self.raw) {
            return;
        }
        let _restore = context::Restore::new();
        if context::bind(self.ordinal).is_ok() {
            // SAFETY: created by `record`, destroyed once; pending waits still complete.
            let _ = unsafe { result::event::destroy(self.raw as sys::CUevent) };
        }
    }
}

/// Blocks the host until `stream`'s queued work is done.
pub fn synchronize(stream: Stream, ordinal: u32) -> Result<()> {
    context::bind(ordinal)?;
    // SAFETY: a live stream handle of the current context.
    check(
        unsafe { result::stream::synchronize(stream.handle()) },
        "synchronizing a stream",
    )
}

/// A new non-blocking stream on `ordinal`, owned by the caller (see [`destroy`]).
pub fn create(ordinal: u32) -> Result<Stream> {
    context::bind(ordinal)?;
    let s = check(
        result::stream::create(result::stream::StreamKind::NonBlocking),
        "creating a stream",
    )?;
    Ok(Stream(s as usize))
}

/// Destroys a stream made by [`create`].
pub fn destroy(stream: Stream, ordinal: u32) {
    if context::bind(ordinal).is_ok() {
        // SAFETY: a stream from `create`, destroyed once; queued work still completes.
        let _ = unsafe { result::stream::destroy(stream.handle()) };
    }
}

/// What a thread knows not to be capturing: a device, a stream, and the guard that knows it.
type Known = Option<(u32, Stream, u64)>;

thread_local! {
    /// The stream that work being prepared on this thread found not capturing (see
    /// [`NotCapturing`]).
    static NOT_CAPTURING: std::cell::Cell<Known> = const { std::cell::Cell::new(None) };
    /// Numbers the guards of this thread.
    static GUARDS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// While it lives, this thread knows that `stream` of a device is not capturing: work is being
/// prepared on it, which asked (a capture that began meanwhile would take in that work too).
/// Spares allocations for that work asking again. Stays on its thread (not `Send`).
pub struct NotCapturing {
    /// What the thread knew before, restored on drop.
    before: Known,
    /// This guard's number.
    id: u64,
    _thread: std::marker::PhantomData<*const ()>,
}

impl NotCapturing {
    /// Notes that `stream` of `ordinal` was just found not capturing, until dropped.
    pub fn new(ordinal: u32, stream: Stream) -> NotCapturing {
        let id = GUARDS.get().wrapping_add(1);
        GUARDS.set(id);
        NotCapturing {
            before: NOT_CAPTURING.replace(Some((ordinal, stream, id))),
            id,
            _thread: std::marker::PhantomData,
        }
    }

    /// Whether this thread knows `stream` of `ordinal` not to be capturing now.
    pub fn known(ordinal: u32, stream: Stream) -> bool {
        NOT_CAPTURING
            .get()
            .is_some_and(|(o, s, _)| (o, s) == (ordinal, stream))
    }
}

impl Drop for NotCapturing {
    fn drop(&mut self) {
        // Dropped out of order (not the newest guard), the thread forgets rather than keep an
        // answer whose guard is gone: the next allocation asks the driver.
        let newest = NOT_CAPTURING.get().is_some_and(|(_, _, id)| id == self.id);
        NOT_CAPTURING.set(if newest { self.before } else { None });
    }
}

/// Whether `stream` of device `ordinal` is capturing a graph (an invalidated capture counts: it
/// has not ended yet). The legacy default stream never captures.
pub fn is_capturing(stream: Stream, ordinal: u32) -> Result<bool> {
    if stream == LEGACY {
        return Ok(false);
    }
    context::bind(ordinal)?;
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `stream` is a stream handle of the current context; the status is written to a
    // local of the right type.
    let r = unsafe { sys::cuStreamIsCapturing(stream.handle(), &mut status) };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_numbered_as_dlpack_numbers_them() {
        assert_eq!(Stream::from_dlpack(1).unwrap(), LEGACY);
        assert_eq!(Stream::from_dlpack(2).unwrap(), PER_THREAD);
        assert_eq!(Stream::from_dlpack(0x7f00).unwrap().dlpack(), 0x7f00);
        assert!(Stream::from_dlpack(0)
            .unwrap_err()
            .to_string()
            .contains("ambiguous"));
        assert!(Stream::from_dlpack(-1).is_err());
        assert!(Stream::from_dlpack(i128::MAX).is_err());
        // A library's NULL handle is the legacy default stream.
        assert_eq!(Stream::from_handle(0), LEGACY);
        assert_eq!(Stream::from_handle(0x7f00).handle() as usize, 0x7f00);
        assert!(LEGACY.is_default() && PER_THREAD.is_default());
        assert!(!Stream::from_handle(0x7f00).is_default());
    }
}
