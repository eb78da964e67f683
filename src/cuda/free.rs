//! Freeing CUDA memory without ever waiting on the host.
//!
//! A pooled device block is freed with `cuMemFreeAsync`, ordered on the device after everything
//! that may still use it: the last write recorded on its buffer, every kernel of cubridge's that
//! used it (each records its stream and the event after it, the newest per stream), and the work
//! queued, at the moment it is let go, on every stream a consumer declared
//! (`__dlpack__(stream=s)`, `cubridge.cuda.record_stream`). So a result dropped while its kernel
//! is still queued goes back to the pool at once, and the next allocation of that stream reuses
//! it (still in L2) without any wait. The free goes on the legacy default stream when that stream covers every use (it runs in order,
//! and waits for every blocking stream, the per-thread default streams among them); otherwise on
//! a per-device stream of cubridge's that waits on an event of each use, so that no stream of the
//! caller's is made to wait for another's work.
//!
//! A small block whose every use was on one stream of the caller's is parked instead, and freed
//! on that very stream by the next allocation there (which shows that the stream is alive): the
//! pool hands a block freed on the allocating stream straight back, where reusing one freed on
//! another stream costs its reuse check microseconds a call. At most [`PARK_MAX`] blocks of at
//! most [`PARK_BYTES`] wait so; more, a lack of memory or `empty_cache` frees them as above.
//!
//! What cannot be ordered that way goes to a background thread (`cubridge-free`), which waits
//! for the device and then frees: memory exported to a consumer whose stream is unknown (the CUDA
//! array interface, `stream=-1`, the DLPack C exchange table), memory used by a captured CUDA
//! graph, frees whose consumer stream is being captured (deferred until the capture ends),
//! pinned and managed memory (whose driver frees wait for the device), and device memory of a
//! device without pool support. The caller's thread never waits for any of it.
//!
//! Both background threads of cubridge run in the relaxed stream-capture mode: their queries and
//! waits would otherwise be refused while any thread captures a graph in the global mode (the
//! default of `torch.cuda.graph`), and would invalidate that capture.

use super::memory::{release_now, MemoryKind};
use super::stream::{self, Event, Stream, Write, LEGACY};
use super::{check, context};
use crate::error::Result;
use cudarc::driver::sys;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once};
use std::time::Duration;

/// The uses a free must follow.
#[derive(Default)]
pub struct Uses {
    /// The last write.
    pub write: Option<Write>,
    /// cubridge's kernels that used the memory, the newest per stream.
    pub kernels: Vec<Write>,
    /// Streams that consumers declared they read on.
    pub streams: Vec<Stream>,
    /// A consumer read on a stream cubridge does not know, or a captured graph used the memory:
    /// the free waits for the whole device, on the background thread.
    pub unknown: bool,
}

/// Frees `ptr` (`bytes` of `kind`) after `uses`, without blocking the calling thread.
pub(super) fn free(ptr: u64, bytes: usize, kind: MemoryKind, uses: Uses) {
    match kind {
        MemoryKind::Device {
            ordinal,
            pooled: true,
        } => {
            if let Some(not_parked) = park(ptr, bytes, ordinal, uses) {
                free_pooled(ptr, ordinal, not_parked);
            }
        }
        _ => background(Job {
            what: Freed::Memory(ptr, kind),
            uses,
        }),
    }
}

/// Frees a pooled block of device `ordinal` after `uses`: ordered on the device where it can
/// be, else on the background thread.
fn free_pooled(ptr: u64, ordinal: u32, uses: Uses) {
    // The last reference may go on a thread that is capturing a graph (a Python variable
    // reassigned inside `torch.cuda.graph`): the free's calls are on streams outside the
    // capture, which its mode would refuse, invalidating it.
    let _relaxed = stream::RelaxedCapture::new();
    if uses.unknown || ordered_free(ptr, ordinal, &uses).is_err() {
        let kind = MemoryKind::Device {
            ordinal,
            pooled: true,
        };
        background(Job {
            what: Freed::Memory(ptr, kind),
            uses,
        });
    }
}

/// Drops `held`, which keeps another owner's memory on device `ordinal` valid, once the device
/// has run everything queued so far: for a view of foreign memory that was exported to a
/// consumer whose stream is unknown. On the background thread; the caller never waits.
pub fn drop_after_device(ordinal: u32, held: Box<dyn std::any::Any + Send + Sync>) {
    background(Job {
        what: Freed::Held(ordinal, held),
        uses: Uses::default(),
    });
}

/// A pooled block waiting for the next allocation on `stream`, the one stream of all its uses.
struct Parked {
    ptr: u64,
    ordinal: u32,
    stream: Stream,
    uses: Uses,
}

/// Blocks of at most this many bytes may be parked.
pub const PARK_BYTES: usize = 1 << 20;
/// At most this many blocks are parked at once (all devices and streams together).
pub const PARK_MAX: usize = 8;
static PARKED: Mutex<Vec<Parked>> = Mutex::new(Vec::new());
static N_PARKED: AtomicUsize = AtomicUsize::new(0);

/// The one stream of every use of `uses`, where that is a stream of the caller's (not a
/// default stream, whose frees need no event), every kernel and write on it carries an event of
/// this copy's (one another copy lent may be valid only for the call that frees), and no
/// consumer declared a stream (which a later free would have to record on, alive or not).
fn only_stream(uses: &Uses) -> Option<Stream> {
    if uses.unknown || !uses.streams.is_empty() {
        return None;
    }
    let stream = uses.write.iter().chain(&uses.kernels).next()?.stream;
    let same = |w: &Write| w.stream == stream && w.event.as_ref().is_some_and(|e| !e.is_lent());
    (!stream.is_default() && uses.write.iter().chain(&uses.kernels).all(same)).then_some(stream)
}

/// Parks the block (see the module's docs), or hands `uses` back where it is not to be parked.
/// Parking one block too many frees the oldest as any other.
fn park(ptr: u64, bytes: usize, ordinal: u32, uses: Uses) -> Option<Uses> {
    let Some(stream) = only_stream(&uses).filter(|_| bytes <= PARK_BYTES) else {
        return Some(uses);
    };
    let oldest = {
        let mut parked = crate::lock(&PARKED);
        parked.push(Parked {
            ptr,
            ordinal,
            stream,
            uses,
        });
        let oldest = (parked.len() > PARK_MAX).then(|| parked.remove(0));
        N_PARKED.store(parked.len(), Ordering::Release);
        oldest
    };
    if let Some(p) = oldest {
        free_parked(p);
    }
    None
}

/// Frees the blocks parked for `stream` of device `ordinal`, whose context is current, on that
/// stream, before an allocation there. A block whose last use is not yet complete is ordered
/// after it by its event: the stream may be a new one at the address of one destroyed since.
pub fn unpark(ordinal: u32, stream: Stream) {
    if N_PARKED.load(Ordering::Acquire) == 0 || stream.is_default() {
        return;
    }
    let mine: Vec<Parked> = {
        let mut parked = crate::lock(&PARKED);
        let (mine, kept): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut *parked)
            .into_iter()
            .partition(|p| p.ordinal == ordinal && p.stream == stream);
        *parked = kept;
        N_PARKED.store(parked.len(), Ordering::Release);
        mine
    };
    let capturing = || {
        !stream::NotCapturing::known(ordinal, stream)
            && stream::is_capturing(stream, ordinal).unwrap_or(true)
    };
    if mine.is_empty() || capturing() {
        return mine.into_iter().for_each(free_parked);
    }
    for p in mine {
        if free_on_own_stream(&p).is_err() {
            free_parked(p);
        }
    }
}

/// [`unpark`]'s free of one block on its stream. A use seen complete needs no wait: on the
/// same stream it precedes the free anyway, and a new stream at a destroyed one's address
/// starts after it on the device (the event completed there).
fn free_on_own_stream(p: &Parked) -> Result<()> {
    for write in p.uses.write.iter().chain(&p.uses.kernels) {
        if let Some(event) = write.event.as_ref().filter(|e| !e.is_done()) {
            event.wait(p.stream)?;
        }
    }
    // SAFETY: a pooled block, freed only here (taken from the parked list), on the stream of
    // every use, after each use's event.
    let r = unsafe { sys::cuMemFreeAsync(p.ptr, p.stream.handle()) };
    check(r.result(), "freeing device memory")
}

/// Frees every parked block as any other (for `empty_cache` and a lack of memory).
pub fn unpark_all() {
    let all = {
        let mut parked = crate::lock(&PARKED);
        N_PARKED.store(0, Ordering::Release);
        std::mem::take(&mut *parked)
    };
    all.into_iter().for_each(free_parked);
}

/// Frees a parked block after its uses, as a block that is not parked.
fn free_parked(p: Parked) {
    free_pooled(p.ptr, p.ordinal, p.uses);
}

/// Queues the free of a pooled block after its uses, or fails (and queues nothing) when that
/// cannot be done here: a consumer stream that is capturing, gone, or refuses an event.
fn ordered_free(ptr: u64, ordinal: u32, uses: &Uses) -> Result<()> {
    let _restore = context::Restore::new();
    context::bind(ordinal)?;
    let mut events: Vec<Arc<Event>> = Vec::new();
    let mut legacy = false;
    // Even a write seen to be done is waited for: the free, and the pool's reuse, must follow
    // the allocation and the write on the device, not only on the host's clock.
    for write in uses.write.iter().chain(&uses.kernels) {
        match &write.event {
            Some(event) => events.push(event.clone()),
            None => legacy |= write.stream == LEGACY,
        }
    }
    for &s in &uses.streams {
        if s.is_default() {
            legacy = true;
            continue;
        }
        if stream::is_capturing(s, ordinal)? {
            return Err(crate::Error::invalid("a consumer stream is capturing"));
        }
        events.push(Arc::new(Event::record(s, ordinal)?));
    }
    if events.is_empty() {
        // SAFETY: a pooled block of this device, freed only here; everything that used it is
        // before the legacy default stream's next work.
        let r = unsafe { sys::cuMemFreeAsync(ptr, LEGACY.handle()) };
        return check(r.result(), "freeing device memory");
    }
    let on = free_stream(ordinal)?;
    if legacy {
        events.push(Arc::new(Event::record(LEGACY, ordinal)?));
    }
    for event in &events {
        event.wait(on)?;
    }
    // SAFETY: a pooled block, freed only here, on a stream ordered after every use.
    let r = unsafe { sys::cuMemFreeAsync(ptr, on.handle()) };
    check(r.result(), "freeing device memory")
}

/// cubridge's stream for frees on device `ordinal`, created on first use and kept.
pub(super) fn free_stream(ordinal: u32) -> Result<Stream> {
    static STREAMS: Mutex<Vec<Option<Stream>>> = Mutex::new(Vec::new());
    context::per_device(&STREAMS, ordinal, || stream::create(ordinal))
}

/// A free for the background thread.
struct Job {
    what: Freed,
    uses: Uses,
}

/// What a job lets go of.
enum Freed {
    /// cubridge's own allocation.
    Memory(u64, MemoryKind),
    /// What keeps another owner's memory on a device valid.
    Held(u32, Box<dyn std::any::Any + Send + Sync>),
}

impl Job {
    /// The device whose work the job waits for.
    fn ordinal(&self) -> u32 {
        match self.what {
            Freed::Memory(_, MemoryKind::Device { ordinal, .. }) | Freed::Held(ordinal, _) => {
                ordinal
            }
            Freed::Memory(_, MemoryKind::Pinned | MemoryKind::Managed) => 0,
        }
    }
}

struct FreeQueue {
    jobs: Vec<Job>,
    /// The thread is working on jobs it took.
    busy: bool,
    /// The thread is running (else jobs run on the caller's thread).
    running: bool,
}

static QUEUE: Mutex<FreeQueue> = Mutex::new(FreeQueue {
    jobs: Vec::new(),
    busy: false,
    running: false,
});
static WORK: Condvar = Condvar::new();
static IDLE: Condvar = Condvar::new();

fn queue() -> MutexGuard<'static, FreeQueue> {
    crate::lock(&QUEUE)
}

/// Streams on which cubridge saw a capture begin; background waits hold off until each has
/// ended. (A capture cubridge never takes part in is not known here.)
static CAPTURING: Mutex<Vec<(u32, Stream)>> = Mutex::new(Vec::new());

/// Notes that `stream` of device `ordinal` is capturing a graph.
pub fn note_capture(ordinal: u32, stream: Stream) {
    let mut streams = crate::lock(&CAPTURING);
    if !streams.contains(&(ordinal, stream)) {
        streams.push((ordinal, stream));
    }
}

fn background(job: Job) {
    static START: Once = Once::new();
    START.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("cubridge-free".into())
            .spawn(free_loop);
        queue().running = spawned.is_ok();
    });
    let mut q = queue();
    q.jobs.push(job);
    if q.running {
        drop(q);
        WORK.notify_one();
        return;
    }
    // No thread could be started: the caller waits, as before pools.
    let jobs = std::mem::take(&mut q.jobs);
    drop(q);
    run(jobs);
}

fn free_loop() {
    let _relaxed = stream::RelaxedCapture::new();
    loop {
        let jobs = {
            let mut q = queue();
            while q.jobs.is_empty() {
                q.busy = false;
                IDLE.notify_all();
                q = WORK.wait(q).unwrap_or_else(|p| p.into_inner());
            }
            q.busy = true;
            std::mem::take(&mut q.jobs)
        };
        run(jobs);
    }
}

/// Waits for the captures in progress and for each device, then frees.
fn run(jobs: Vec<Job>) {
    let _restore = context::Restore::new();
    wait_for_captures(&jobs);
    let mut waited: Vec<u32> = Vec::new();
    for job in &jobs {
        let ordinal = job.ordinal();
        if !waited.contains(&ordinal) {
            // Refused while a capture runs (one cubridge did not see begin): wait it out. Any
            // other error means the context is unusable: nothing runs on it any more.
            while let Err(e) = context::synchronize(ordinal) {
                if !e.cuda_code().is_some_and(super::is_capture_refusal) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            waited.push(ordinal);
        }
    }
    for job in jobs {
        match job.what {
            // SAFETY: each job owns its allocation, freed only here, after the device finished
            // all work queued before the job was (the synchronize above).
            Freed::Memory(ptr, kind) => unsafe { release_now(ptr, kind) },
            Freed::Held(_, held) => drop(held),
        }
        drop(job.uses);
    }
}

/// Holds off while any stream cubridge knows to be capturing still is, including the consumer
/// streams of the jobs (their frees were deferred for that).
fn wait_for_captures(jobs: &[Job]) {
    let mut streams: Vec<(u32, Stream)> = crate::lock(&CAPTURING).clone();
    for job in jobs {
        let ordinal = job.ordinal();
        streams.extend(job.uses.streams.iter().map(|&s| (ordinal, s)));
    }
    streams.retain(|&(_, s)| !s.is_default());
    for (ordinal, s) in streams {
        while stream::is_capturing(s, ordinal).unwrap_or(false) {
            std::thread::sleep(Duration::from_millis(1));
        }
        crate::lock(&CAPTURING).retain(|&entry| entry != (ordinal, s));
    }
}

/// Waits until the background thread has freed everything handed to it so far.
pub fn drain() {
    let mut q = queue();
    while q.running && (q.busy || !q.jobs.is_empty()) {
        q = IDLE.wait(q).unwrap_or_else(|p| p.into_inner());
    }
}
