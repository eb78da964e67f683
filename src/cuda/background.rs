//! Programs compiled on a background thread while calls go on without them: the tiled kernels
//! of the elementwise engine, which only speed up a layout that another kernel (the strided
//! one) also runs. Compiling the tiled program of a signature takes NVRTC hundreds of
//! milliseconds; a transposed call that would wait for it runs the strided kernel instead and
//! then starts the compile ([`start`]), and the calls after it take the tiled kernel. A program
//! that loads without compiling (shipped in the build, in the disk cache, or loaded already) is
//! loaded on the call, as any other; so is every program of a copy of cubridge that adopted
//! another's runtime (an extension module's), whose compiles that runtime does.
//!
//! At most [`THREADS`] compiles run at once; a program that finds none free is started by a
//! later call. A failed compile is run again on the next call that needs the program, where its
//! error (NVRTC's log, the driver's code) reaches the caller as a compile on the call would.
//! A process waits for its running compiles when it exits (an `atexit` handler, registered with
//! the first compile): NVRTC must not be torn down under a compile.

use super::kernels::{self, Program};
use super::{nvrtc, shared, shipped, stream};
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

/// A background compile.
enum State {
    /// Running on a thread of the process with this id (a forked child has none of them).
    Running(u32),
    /// Ended, with the functions or the error.
    Done(Result<&'static [usize]>),
}

/// Background compiles by device and program.
type Compiles = HashMap<(u32, Program), State>;
static COMPILES: Mutex<Option<Compiles>> = Mutex::new(None);
/// Signalled when a background compile ends.
static DONE: Condvar = Condvar::new();
/// Most compiles that run at once (each NVRTC instance takes hundreds of megabytes).
pub const THREADS: usize = 2;

/// The functions of `program` on device `ordinal` where they load without a compile here, or
/// where a background compile of it ended; [`Ready::Later`] where it must compile (running
/// already, or to be started with [`start`]).
pub fn program(ordinal: u32, program: &Program) -> Result<Ready> {
    let key = (ordinal, program.clone());
    let failed = match crate::lock(&COMPILES).as_ref().and_then(|c| c.get(&key)) {
        Some(State::Done(Ok(functions))) => return Ok(Ready::Now(functions)),
        Some(State::Running(pid)) if *pid == std::process::id() => return Ok(Ready::Later),
        Some(State::Done(Err(_))) => true,
        // Unknown here, or a parent's before a fork.
        _ => false,
    };
    if failed {
        // Compiled again on this call, which reports the error or keeps the functions.
        let found = shared::program(ordinal, program);
        let mut guard = crate::lock(&COMPILES);
        guard
            .get_or_insert_with(HashMap::new)
            .insert(key, State::Done(found.clone()));
        return found.map(Ready::Now);
    }
    if shared::adopted().is_some() || loads_without_compile(ordinal, program) {
        return shared::program(ordinal, program).map(Ready::Now);
    }
    Ok(Ready::Later)
}

/// Whether `program` loads on `ordinal` without NVRTC: loaded already, shipped for the
/// device, or in the disk cache.
fn loads_without_compile(ordinal: u32, program: &Program) -> bool {
    if kernels::is_loaded(ordinal, program) {
        return true;
    }
    let Ok(arch) = kernels::arch(ordinal) else {
        return true; // the load reports it
    };
    let key = nvrtc::module_key(&program.source, &program.options, &[]);
    shipped::find(&key, arch).is_some()
        || nvrtc::entry_for(key, arch).is_some_and(|entry| entry.exists())
}

/// Starts the compile of `program` on device `ordinal` on a thread of its own, unless it runs
/// or ended already, or [`THREADS`] compiles run (a later call starts it then).
pub fn start(ordinal: u32, program: &Program) {
    let me = std::process::id();
    let key = (ordinal, program.clone());
    let mut guard = crate::lock(&COMPILES);
    let compiles = guard.get_or_insert_with(HashMap::new);
    let running = |s: &State| matches!(s, State::Running(pid) if *pid == me);
    if compiles.get(&key).is_some_and(running)
        || compiles.values().filter(|s| running(s)).count() >= THREADS
    {
        return;
    }
    compiles.insert(key.clone(), State::Running(me));
    drop(guard);
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a function that takes no arguments and returns; exit runs it before
    // the destructors of libraries loaded earlier (NVRTC, the driver).
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(wait_at_exit);
    });
    let spawned = std::thread::Builder::new()
        .name("cubridge-compile".into())
        .spawn(move || compile(key));
    if spawned.is_err() {
        // No thread: the program compiles on a later call.
        let mut guard = crate::lock(&COMPILES);
        guard
            .as_mut()
            .map(|c| c.remove(&(ordinal, program.clone())));
        DONE.notify_all();
    }
}

/// Compiles and loads `key`'s program, and keeps the outcome for the next call that asks.
fn compile((ordinal, program): (u32, Program)) {
    // Its calls (the module's load) must not be refused, nor invalidate a capture, while
    // another thread captures a graph in the global mode.
    let _relaxed = stream::RelaxedCapture::new();
    let run = std::panic::AssertUnwindSafe(|| shared::program(ordinal, &program));
    let found = std::panic::catch_unwind(run).unwrap_or_else(|_| {
        Err(crate::Error::invalid(
            "internal: a background compile failed",
        ))
    });
    let mut guard = crate::lock(&COMPILES);
    let compiles = guard.get_or_insert_with(HashMap::new);
    compiles.insert((ordinal, program), State::Done(found));
    DONE.notify_all();
}

extern "C" fn wait_at_exit() {
    wait();
}

/// Waits until no background compile of this process runs (their kernels then load on the
/// next call that needs them).
pub fn wait() {
    let me = std::process::id();
    let mut guard = crate::lock(&COMPILES);
    let running = |c: &Option<Compiles>| {
        let mut states = c.iter().flat_map(|c| c.values());
        states.any(|s| matches!(s, State::Running(pid) if *pid == me))
    };
    while running(&guard) {
        guard = DONE.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
}
