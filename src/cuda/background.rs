//! Programs compiled on a background thread while calls go on without them: the tiled kernels
//! of the elementwise engine, which only speed up a layout that another kernel (the strided
//! one) also runs. Compiling the tiled program of a signature takes NVRTC hundreds of
//! milliseconds; a transposed call that would wait for it runs the strided kernel instead and
//! then starts the compile ([`start`]), and the calls after it take the tiled kernel. A program
//! that loads without compiling (shipped in the build, in the disk cache, or loaded already) is
//! loaded on the call, as any other; so is every program of a copy of cubridge that adopted
//! another's runtime (an extension module's), whose compiles that runtime does.
//!
//! Programs wait in a queue that at most [`THREADS`] threads work through, so that a burst of
//! new signatures does not start an NVRTC (hundreds of megabytes) for each. A failed compile
//! is run again on the next call that needs the program, where its error (NVRTC's log, the
//! driver's code) reaches the caller as a compile on the call would.
//! A process waits for its queued and running compiles when it exits (an `atexit` handler,
//! registered once NVRTC is loaded and again after the first compile, so that it runs before
//! NVRTC's own destructors): NVRTC must not be torn down under a compile. Where nothing can
//! compile (NVRTC off or missing), a call loads its program or fails as it would have without
//! this module.

use super::kernels::{self, Program};
use super::{nvrtc, shared, stream};
use crate::error::Result;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex};

/// Where the functions of a program asked for are.
pub enum Ready {
    /// Loaded: the functions, in the order of the program's.
    Now(&'static [usize]),
    /// To be compiled: run without them, then [`start`] their compile.
    Later,
}

/// A background compile of a process (by its id: a forked child has none of its parent's
/// threads, and takes its entries for unknown).
enum State {
    /// Waiting for a thread.
    Queued(u32),
    /// Compiling on a thread.
    Running(u32),
    /// Ended, with the functions or the error.
    Done(Result<&'static [usize]>),
}

impl State {
    /// Whether a thread of this process will end this compile: queued or running here.
    fn pending(&self) -> bool {
        matches!(self, State::Queued(pid) | State::Running(pid) if *pid == std::process::id())
    }
}

/// Background compiles by device and program, and the threads of process `pid` working on
/// them.
#[derive(Default)]
struct Compiles {
    states: HashMap<(u32, Program), State>,
    threads: usize,
    pid: u32,
}
static COMPILES: Mutex<Option<Compiles>> = Mutex::new(None);
/// Signalled when a background compile ends.
static DONE: Condvar = Condvar::new();
/// Most compiles that run at once (each NVRTC instance takes hundreds of megabytes).
pub const THREADS: usize = 2;

fn compiles() -> std::sync::MutexGuard<'static, Option<Compiles>> {
    crate::lock(&COMPILES)
}

/// The functions of `program` on device `ordinal` where they load without a compile here, or
/// where a background compile of it ended; [`Ready::Later`] where it must compile (queued or
/// running already, or to be started with [`start`]).
pub fn program(ordinal: u32, program: &Program) -> Result<Ready> {
    let key = (ordinal, program.clone());
    let failed = match compiles().as_ref().and_then(|c| c.states.get(&key)) {
        Some(State::Done(Ok(functions))) => return Ok(Ready::Now(functions)),
        Some(State::Done(Err(_))) => true,
        Some(state) if state.pending() => return Ok(Ready::Later),
        // Unknown here, or a parent's before a fork.
        _ => false,
    };
    if failed {
        // Compiled again on this call, which reports the error or keeps the functions.
        let found = shared::program(ordinal, program);
        let mut guard = compiles();
        let states = &mut guard.get_or_insert_with(Compiles::default).states;
        states.insert(key, State::Done(found.clone()));
        return found.map(Ready::Now);
    }
    // Where nothing can compile (NVRTC off or missing) the call loads or fails as it would
    // without a background: no later call should fail where this one ran.
    let cannot_compile = || nvrtc::disabled() || nvrtc::ensure_loaded().is_err();
    if shared::adopted().is_some()
        || kernels::loads_without_compile(ordinal, program)
        || cannot_compile()
    {
        return shared::program(ordinal, program).map(Ready::Now);
    }
    Ok(Ready::Later)
}

/// Queues the compile of `program` on device `ordinal`, unless it is queued, running or ended
/// already, and starts a thread for it where fewer than [`THREADS`] work.
pub fn start(ordinal: u32, program: &Program) {
    let key = (ordinal, program.clone());
    let mut guard = compiles();
    let c = guard.get_or_insert_with(Compiles::default);
    if c.pid != std::process::id() {
        // A forked child: none of its parent's threads runs here.
        (c.pid, c.threads) = (std::process::id(), 0);
    }
    if c.states
        .get(&key)
        .is_some_and(|s| s.pending() || matches!(s, State::Done(_)))
    {
        return;
    }
    c.states.insert(key, State::Queued(std::process::id()));
    if c.threads >= THREADS {
        return;
    }
    c.threads += 1;
    drop(guard);
    // NVRTC is loaded ([`program`] made sure), so exit runs this handler before NVRTC's own
    // destructors, which were registered when it loaded.
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    AT_EXIT.call_once(wait_at_exit_first);
    let spawned = std::thread::Builder::new()
        .name("cubridge-compile".into())
        .spawn(work);
    if spawned.is_err() {
        // No thread: what it would have compiled is forgotten, and asked for again by a later
        // call (unless another thread takes it first).
        let mut guard = compiles();
        if let Some(c) = guard.as_mut() {
            c.threads -= 1;
            if c.threads == 0 {
                c.states.retain(|_, s| !s.pending());
            }
        }
        DONE.notify_all();
    }
}

/// A compile thread: compiles and loads queued programs, keeping each outcome for the next
/// call that asks, until none is left.
fn work() {
    // Its calls (the modules' loads) must not be refused, nor invalidate a capture, while
    // another thread captures a graph in the global mode.
    let _relaxed = stream::RelaxedCapture::new();
    let me = std::process::id();
    loop {
        let key = {
            let mut guard = compiles();
            let c = guard.get_or_insert_with(Compiles::default);
            let next = c
                .states
                .iter_mut()
                .find(|(_, s)| matches!(s, State::Queued(pid) if *pid == me));
            match next {
                Some((key, state)) => {
                    *state = State::Running(me);
                    key.clone()
                }
                None => {
                    c.threads -= 1;
                    return;
                }
            }
        };
        let (ordinal, program) = &key;
        let run = std::panic::AssertUnwindSafe(|| shared::program(*ordinal, program));
        let found = std::panic::catch_unwind(run).unwrap_or_else(|_| {
            Err(crate::Error::invalid(
                "internal: a background compile failed",
            ))
        });
        let mut guard = compiles();
        let c = guard.get_or_insert_with(Compiles::default);
        c.states.insert(key, State::Done(found));
        DONE.notify_all();
        drop(guard);
        // Again after a first compile, which may have loaded NVRTC's builtins library (and
        // registered its destructors) after the first registration.
        static AGAIN: std::sync::Once = std::sync::Once::new();
        AGAIN.call_once(wait_at_exit_first);
    }
}

/// Registers [`wait`] to run when the process exits, before what was registered earlier.
fn wait_at_exit_first() {
    extern "C" fn wait_at_exit() {
        wait();
    }
    // SAFETY: registers a function that takes no arguments and returns.
    unsafe { libc::atexit(wait_at_exit) };
}

/// Waits until no background compile of this process is queued or runs (their kernels then
/// load on the next call that needs them).
pub fn wait() {
    let mut guard = compiles();
    let pending =
        |c: &Option<Compiles>| c.iter().flat_map(|c| c.states.values()).any(State::pending);
    while pending(&guard) {
        guard = DONE.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
}
