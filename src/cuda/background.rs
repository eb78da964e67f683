//! Programs compiled on a background thread while calls go on without them: the tiled kernels
//! of the elementwise engine, which only speed up a layout that another kernel (the strided
//! one) also runs. Compiling the tiled program of a signature takes NVRTC hundreds of
//! milliseconds; a transposed call that would wait for it runs the strided kernel instead, and
//! the calls after the compile take the tiled one. A program that loads without compiling
//! (shipped in the build, in the disk cache, or loaded already) is loaded on the call, as any
//! other.

use super::kernels::{self, Program};
use super::{nvrtc, shared, shipped, stream};
use crate::error::Result;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex};

/// Where the functions of a program asked for are.
pub enum Ready {
    /// Loaded: the functions, in the order of the program's.
    Now(&'static [usize]),
    /// Compiling on a background thread; ask again on a later call.
    Later,
}

/// Background compiles by device and program: running (`None`) or done.
type Compiles = HashMap<(u32, Program), Option<Result<&'static [usize]>>>;
static COMPILES: Mutex<Option<Compiles>> = Mutex::new(None);
/// Signalled when a background compile ends.
static DONE: Condvar = Condvar::new();

/// The functions of `program` on device `ordinal` where they load without a compile, or where
/// a background compile of it ended; otherwise starts that compile (once) and answers
/// [`Ready::Later`]. A background compile that failed is run again on this call, so that its
/// error (NVRTC's log, the driver's code) reaches the caller as a compile on the call would.
pub fn program(ordinal: u32, program: &Program) -> Result<Ready> {
    let key = (ordinal, program.clone());
    let mut guard = crate::lock(&COMPILES);
    let compiles = guard.get_or_insert_with(HashMap::new);
    match compiles.get(&key) {
        Some(None) => return Ok(Ready::Later),
        Some(Some(Ok(found))) => return Ok(Ready::Now(found)),
        Some(Some(Err(_))) => {
            compiles.remove(&key);
        }
        None if !loads_without_compile(ordinal, program) => {
            compiles.insert(key.clone(), None);
            drop(guard);
            return start(key);
        }
        None => {}
    }
    drop(guard);
    shared::program(ordinal, program).map(Ready::Now)
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

/// Runs the compile of `key` on a new thread; where no thread can be started, on this one.
fn start(key: (u32, Program)) -> Result<Ready> {
    let job = key.clone();
    let spawned = std::thread::Builder::new()
        .name("cubridge-compile".into())
        .spawn(move || compile(job));
    if spawned.is_err() {
        compile(key.clone());
        return match crate::lock(&COMPILES).as_mut().and_then(|c| c.remove(&key)) {
            Some(Some(found)) => found.map(Ready::Now),
            _ => Err(crate::Error::invalid("internal: a compile left no result")),
        };
    }
    Ok(Ready::Later)
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
    guard
        .get_or_insert_with(HashMap::new)
        .insert((ordinal, program), Some(found));
    DONE.notify_all();
}

/// Waits until no background compile runs (their kernels then load on the next call).
pub fn wait() {
    let mut guard = crate::lock(&COMPILES);
    while guard.iter().flat_map(|c| c.values()).any(Option::is_none) {
        guard = DONE.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
}
