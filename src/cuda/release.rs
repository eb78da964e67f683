//! Keeping the foreign buffers of queued kernels alive until the kernels have run, off the
//! caller's path. (cubridge's own pooled memory needs no holding: its free is queued on the
//! device after the kernels that used it, see [`super::free`]; pinned and managed memory is
//! held here like foreign memory.)
//!
//! A kernel that cubridge queues reads and writes memory that other libraries may free as soon as
//! their last reference goes (a torch tensor's caching allocator hands the block to the next
//! allocation of its stream at once). So every launch hands its operands' buffers here together
//! with an event recorded after the kernel, and they are dropped only once that event has
//! happened. The launching thread only appends to a list: a background thread (`cubridge-release`)
//! polls the events every [`POLL`], so no call pays for the queries or waits. What has finished is
//! set aside for the launching threads, which drop it on their next launch: a producer's deleter
//! then runs on the thread that imported the tensor, whose caches hold its reference counts and
//! allocations (the next import of the same tensor slowed down when another thread ran them).
//! What no launch takes within the next poll the releaser drops itself, so the buffers of the last
//! kernel of a burst go within about two polls of it running rather than on some later call.
//!
//! Kernels on the legacy default stream come without an event (see `ops::add`): at each poll the
//! releaser records one there per device, after all of them, since that stream runs its work in
//! order. Entries pushed by one thread for one stream finish in the order they were pushed (each
//! event follows the previous one on that stream), so one query of the newest entry of such a
//! group usually releases the whole group.
//!
//! At interpreter exit the Python module calls [`release_all`], which waits for what is still
//! queued and drops it while the interpreter can still run the producers' deleters, and stops
//! the thread from releasing anything after that.

use super::stream::{Event, Stream, LEGACY};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once};
use std::thread::ThreadId;
use std::time::Duration;

/// How often the releaser looks at the events of the entries it holds.
pub const POLL: Duration = Duration::from_millis(1);

/// Empty polls after which the releaser sleeps until the next entry arrives (a push then wakes
/// it; while it polls, a push costs no system call).
const IDLE_AFTER: u32 = 50;

/// What keeps a buffer's memory valid (the core's reference-counted buffers; this backend needs
/// to know only that dropping it may release the memory).
pub type KeepAlive = Arc<dyn std::any::Any + Send + Sync>;

/// Buffers that a queued kernel uses, with the event recorded after it (`None` on the legacy
/// default stream until the releaser records one).
struct Pending {
    event: Option<Arc<Event>>,
    _buffers: Vec<KeepAlive>,
    /// Entries of one thread on one stream finish in the order pushed.
    group: (ThreadId, u32, Stream),
    /// No event could be recorded for it because its context is unusable.
    context_lost: bool,
}

struct Queue {
    entries: Vec<Pending>,
    /// Finished entries, for the next launch (or, once `ready_seen`, the releaser) to drop.
    ready: Vec<Pending>,
    /// The releaser has seen `ready` as it is at one poll already.
    ready_seen: bool,
    /// The releaser waits on [`WAKE`] for the next entry.
    idle: bool,
    /// The releaser thread is running (else entries are swept on the callers' path).
    running: bool,
    /// [`release_all`] has run: nothing is released by the thread any more.
    stopped: bool,
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue {
    entries: Vec::new(),
    ready: Vec::new(),
    ready_seen: false,
    idle: false,
    running: false,
    stopped: false,
});
static WAKE: Condvar = Condvar::new();
/// Held while finished entries are dropped, so that [`release_all`] never runs beside a sweep.
static DROPPING: Mutex<()> = Mutex::new(());

fn queue() -> MutexGuard<'static, Queue> {
    crate::lock(&QUEUE)
}

/// Starts this copy's releaser thread, once.
pub(super) fn start() {
    static START: Once = Once::new();
    START.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("cubridge-release".into())
            .spawn(release_loop);
        queue().running = spawned.is_ok();
    });
}

/// Hands `buffers` to the releaser, to drop once the legacy default stream of device
/// `ordinal` has run what is queued there when it next looks: for a thread that may neither
/// call the driver nor drop them itself (the driver's own, destroying a graph's user object).
/// Makes no driver call and drops nothing; after [`release_all`], or where the releaser thread
/// could not be started ([`start`] first), they are leaked rather than dropped here.
pub(super) fn adopt(buffers: Vec<KeepAlive>, ordinal: u32) {
    let mut q = queue();
    if q.stopped || !q.running {
        drop(q);
        std::mem::forget(buffers);
        return;
    }
    q.entries.push(Pending {
        event: None,
        _buffers: buffers,
        group: (std::thread::current().id(), ordinal, LEGACY),
        context_lost: false,
    });
    let wake = q.idle;
    drop(q);
    if wake {
        WAKE.notify_one();
    }
}

/// Keeps `buffers` alive until `event` (recorded on `stream` of device `ordinal`, after the
/// kernel that uses them; `None` only for the legacy default stream, see the module) has
/// happened. Never blocks on the device and calls no driver function;
/// drops the buffers of earlier kernels that the releaser found finished.
pub fn keep_alive_until(
    event: Option<Arc<Event>>,
    buffers: Vec<KeepAlive>,
    stream: Stream,
    ordinal: u32,
) {
    start();
    let entry = Pending {
        event,
        _buffers: buffers,
        group: (std::thread::current().id(), ordinal, stream),
        context_lost: false,
    };
    let mut q = queue();
    q.entries.push(entry);
    if q.stopped {
        // After interpreter exit: the producers' deleters may no longer run safely. Leaked.
        std::mem::forget(q.entries.pop());
        return;
    }
    if !q.running {
        // No thread could be started: sweep here, as the call's own cost.
        drop(q);
        sweep();
        q = queue();
    }
    let ready = std::mem::take(&mut q.ready);
    q.ready_seen = false;
    let wake = q.idle;
    drop(q);
    if wake {
        WAKE.notify_one();
    }
    // Deleters may take their producers' locks: with none of ours held.
    let now = LATER.with(|later| {
        let mut later = later.borrow_mut();
        if later.depth == 0 {
            return Some(ready);
        }
        later.entries.extend(ready);
        None
    });
    drop(now);
}

/// Finished entries that launches on this thread took over while a [`DropLater`] lived.
struct Later {
    depth: u32,
    entries: Vec<Pending>,
}

std::thread_local! {
    static LATER: std::cell::RefCell<Later> =
        const { std::cell::RefCell::new(Later { depth: 0, entries: Vec::new() }) };
}

/// While one lives on a thread, the finished kernels' buffers that launches on this thread take
/// over are dropped when the last one goes instead of at the launch. The Python calls hold one
/// across a call whose launch runs detached from the interpreter and let it go attached, so
/// that producers' deleters that take the interpreter (CuPy's; the exporter of a CUDA array
/// interface) find it held rather than taking it back for each buffer.
pub struct DropLater(std::marker::PhantomData<*const ()>);

impl DropLater {
    /// Starts deferring on this thread.
    pub fn new() -> DropLater {
        LATER.with(|later| later.borrow_mut().depth += 1);
        DropLater(std::marker::PhantomData)
    }
}

impl Default for DropLater {
    fn default() -> Self {
        DropLater::new()
    }
}

impl Drop for DropLater {
    fn drop(&mut self) {
        let taken = LATER.with(|later| {
            let mut later = later.borrow_mut();
            later.depth -= 1;
            if later.depth == 0 {
                std::mem::take(&mut later.entries)
            } else {
                Vec::new()
            }
        });
        // Outside the borrow: a deleter may run Python code that launches again.
        drop(taken);
    }
}

fn release_loop() {
    // Queries beside a graph capture in the global mode would be refused and invalidate it.
    let _relaxed = super::stream::RelaxedCapture::new();
    let mut quiet = 0;
    loop {
        {
            let mut q = queue();
            if q.entries.is_empty() && q.ready.is_empty() {
                quiet += 1;
                if quiet >= IDLE_AFTER {
                    q.idle = true;
                    while q.entries.is_empty() || q.stopped {
                        q = WAKE.wait(q).unwrap_or_else(|p| p.into_inner());
                    }
                    q.idle = false;
                    quiet = 0;
                }
            } else {
                quiet = 0;
            }
        }
        sweep();
        std::thread::sleep(POLL);
    }
}

/// Sets aside the entries whose kernels have run, and drops those set aside at the previous
/// sweep that no launch has taken since.
fn sweep() {
    let _dropping = crate::lock(&DROPPING);
    let Some(done) = take_finished() else {
        return;
    };
    let stale = {
        let mut q = queue();
        let stale = match q.ready_seen {
            true => std::mem::take(&mut q.ready),
            false => Vec::new(),
        };
        q.ready.extend(done);
        q.ready_seen = !q.ready.is_empty();
        stale
    };
    // Deleters may take their producers' locks (and the GIL): with none of ours held but the
    // one that keeps release_all out.
    drop(stale);
}

/// Drops at once every entry whose kernel has run, those set aside for launching threads too
/// (`cubridge.cuda.empty_cache` calls it after waiting for the device, so that the buffers of
/// finished kernels go back to the pool before it is trimmed).
pub fn flush() {
    let _dropping = crate::lock(&DROPPING);
    let Some(done) = take_finished() else {
        return;
    };
    let ready = std::mem::take(&mut queue().ready);
    drop((ready, done));
}

/// Takes the entries whose kernels have run out of the queue (`None` once [`release_all`] has
/// run). The queries run without the queue lock, so that launches never wait on the driver.
fn take_finished() -> Option<Vec<Pending>> {
    let mut taken = {
        let mut q = queue();
        if q.stopped {
            return None;
        }
        std::mem::take(&mut q.entries)
    };
    record_legacy_events(&mut taken);
    let done = finished(&mut taken);
    let mut q = queue();
    let pushed_meanwhile = std::mem::replace(&mut q.entries, taken);
    q.entries.extend(pushed_meanwhile);
    Some(done)
}

/// Gives the entries of the legacy default stream that have no event yet one recorded there now,
/// one per device. Where it cannot be recorded because a graph capture forbids the legacy
/// stream for now, the entries wait for the next poll; any other failure means the context is
/// unusable (its kernels no longer run), and the entries count as done.
fn record_legacy_events(entries: &mut [Pending]) {
    let mut recorded: Vec<(u32, Result<Arc<Event>, bool>)> = Vec::new();
    for entry in entries.iter_mut().filter(|e| e.event.is_none()) {
        let ordinal = entry.group.1;
        let event = match recorded.iter().find(|(o, _)| *o == ordinal) {
            Some((_, event)) => event.clone(),
            None => {
                let _restore = super::context::Restore::new();
                let event = Event::record(LEGACY, ordinal)
                    .map(Arc::new)
                    .map_err(|e| !e.cuda_code().is_some_and(super::is_capture_refusal));
                recorded.push((ordinal, event.clone()));
                event
            }
        };
        match event {
            Ok(event) => entry.event = Some(event),
            Err(lost) => entry.context_lost = lost,
        }
    }
}

/// Whether the kernel of `entry` has run (an entry without an event has run only when its
/// context was lost: see [`record_legacy_events`]).
fn has_run(entry: &Pending) -> bool {
    match &entry.event {
        Some(event) => event.is_done(),
        None => entry.context_lost,
    }
}

/// Takes the entries whose events have happened out of `entries` (which keeps push order).
fn finished(entries: &mut Vec<Pending>) -> Vec<Pending> {
    type Group = (ThreadId, u32, Stream);
    // Whether each group's newest entry is done, which makes all of the group done.
    let mut newest: Vec<(Group, bool)> = Vec::new();
    for entry in entries.iter().rev() {
        if !newest.iter().any(|&(g, _)| g == entry.group) {
            newest.push((entry.group, has_run(entry)));
        }
    }
    // The others oldest first, done up to the first that is not.
    let mut blocked: Vec<Group> = Vec::new();
    let mut done = Vec::new();
    let mut kept = Vec::with_capacity(entries.len());
    for entry in entries.drain(..) {
        let group_done = newest.iter().any(|&(g, d)| g == entry.group && d);
        if group_done || (!blocked.contains(&entry.group) && has_run(&entry)) {
            done.push(entry);
        } else {
            blocked.push(entry.group);
            kept.push(entry);
        }
    }
    *entries = kept;
    done
}

/// Waits for every kernel still holding buffers and releases them, then stops releasing
/// (entries pushed later are leaked). Called at interpreter exit, with the interpreter still
/// able to run the producers' deleters.
pub fn release_all() {
    let _dropping = crate::lock(&DROPPING);
    let (mut entries, ready) = {
        let mut q = queue();
        q.stopped = true;
        (std::mem::take(&mut q.entries), std::mem::take(&mut q.ready))
    };
    drop(ready);
    record_legacy_events(&mut entries);
    for entry in &entries {
        if let Some(event) = &entry.event {
            // An error means the context is unusable and its kernels no longer run.
            let _ = event.synchronize();
        }
    }
    drop(entries);
}
