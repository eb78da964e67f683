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

/// Frees `ptr` (of `kind`) after `uses`, without blocking the calling thread.
pub(super) fn free(ptr: u64, kind: MemoryKind, uses: Uses) {
    if let MemoryKind::Device {
        ordinal,
        pooled: true,
    } = kind
    {
        // The last reference may go on a thread that is capturing a graph (a Python variable
        // reassigned inside `torch.cuda.graph`): the free's calls are on streams outside the
        // capture, which its mode would refuse, invalidating it.
        let _relaxed = stream::RelaxedCapture::new();
        if !uses.unknown && ordered_free(ptr, ordinal, &uses).is_ok() {
            return;
        }
    }
    background(Job {
        what: Freed::Memory(ptr, kind),
        uses,
    });
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
