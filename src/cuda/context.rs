//! Primary contexts: cubridge uses each device's primary context, the one PyTorch, CuPy and the
//! CUDA runtime share, so it pays no second context start and pointers mean the same thing.

use super::check;
use crate::error::Result;
use cudarc::driver::{result, sys};
use std::sync::Mutex;

/// Retained primary contexts by ordinal. Retained once and kept for the life of the process:
/// releasing them at exit would race other libraries' teardown.
static CONTEXTS: Mutex<Vec<Option<usize>>> = Mutex::new(Vec::new());

/// The primary context of `ordinal`, retained on first use.
pub fn primary(ordinal: u32) -> Result<sys::CUcontext> {
    let mut table = crate::lock(&CONTEXTS);
    let i = ordinal as usize;
    if let Some(Some(ctx)) = table.get(i) {
        return Ok(*ctx as sys::CUcontext);
    }
    // Every driver call goes through a context: without a driver (or for a device that does
    // not exist) this is where it stops, with an error rather than the loader's panic.
    crate::cuda::require(crate::Device::Cuda(ordinal))?;
    if table.len() <= i {
        table.resize(i + 1, None);
    }
    let dev = check(result::device::get(ordinal as i32), "looking up the device")?;
    // SAFETY: `dev` is a valid device handle; the retained context is never released.
    let ctx = check(
        unsafe { result::primary_ctx::retain(dev) },
        "retaining the primary context",
    )?;
    table[i] = Some(ctx as usize);
    Ok(ctx)
}

/// Makes `ordinal`'s primary context current on this thread (cheap when it already is).
pub fn bind(ordinal: u32) -> Result<()> {
    let ctx = primary(ordinal)?;
    if let Ok(Some(current)) = result::ctx::get_current() {
        if current == ctx {
            return Ok(());
        }
    }
    // SAFETY: `ctx` is a retained, live primary context.
    check(
        unsafe { result::ctx::set_current(ctx) },
        "binding the primary context",
    )
}

/// The ordinal of the context current on this thread, if any.
pub fn current_ordinal() -> Result<Option<u32>> {
    let Some(ctx) = check(result::ctx::get_current(), "querying the current context")? else {
        return Ok(None);
    };
    let mut dev: sys::CUdevice = 0;
    // SAFETY: `ctx` is the current context, so cuCtxGetDevice reads it; `dev` is writable.
    let r = unsafe { sys::cuCtxGetDevice(&mut dev) };
    check(r.result(), "querying the current device")?;
    let _ = ctx;
    Ok(Some(dev as u32))
}

/// A device attribute (compute capability, SM count, ...).
pub fn attribute(ordinal: u32, attr: sys::CUdevice_attribute) -> Result<i32> {
    let dev = check(result::device::get(ordinal as i32), "looking up the device")?;
    // SAFETY: valid device handle and attribute enum.
    check(
        unsafe { result::device::get_attribute(dev, attr) },
        "reading a device attribute",
    )
}

/// Blocks until all work in `ordinal`'s primary context is done.
pub fn synchronize(ordinal: u32) -> Result<()> {
    bind(ordinal)?;
    check(result::ctx::synchronize(), "synchronizing the device")
}

/// The value `table` holds for device `ordinal`, made by `make` on the first call for that
/// device (under the table's lock, so it is made once) and kept for the process.
pub fn per_device<T: Copy>(
    table: &Mutex<Vec<Option<T>>>,
    ordinal: u32,
    make: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let mut table = crate::lock(table);
    let i = ordinal as usize;
    if table.len() <= i {
        table.resize(i + 1, None);
    }
    if let Some(value) = table[i] {
        return Ok(value);
    }
    let value = make()?;
    table[i] = Some(value);
    Ok(value)
}

/// Streaming multiprocessors of `ordinal`, read once per device.
pub fn sm_count(ordinal: u32) -> Result<usize> {
    static SMS: Mutex<Vec<Option<usize>>> = Mutex::new(Vec::new());
    per_device(&SMS, ordinal, || {
        let n = attribute(
            ordinal,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?;
        Ok(n.max(1) as usize)
    })
}

/// Puts back, when dropped, the context that was current on this thread when it was made, or
/// none where none was. cubridge binds the primary context of the device it works on; a Python
/// call that works on another device than the caller's must not leave the caller (and the CUDA
/// runtime that torch and CuPy read their current device from) on that device, nor bind one on
/// a thread that had none (the runtime would then report that device as current). Inert
/// without a driver.
pub struct Restore(Option<usize>);

/// What [`Restore`] holds for a thread with no current context.
const NO_CONTEXT: usize = 0;

impl Restore {
    /// Remembers the current context (none, when CUDA was never loaded or nothing is bound).
    pub fn new() -> Restore {
        if !crate::cuda::is_available() {
            return Restore(None);
        }
        Restore(match result::ctx::get_current() {
            Ok(Some(ctx)) => Some(ctx as usize),
            Ok(None) => Some(NO_CONTEXT),
            Err(_) => None,
        })
    }
}

impl Default for Restore {
    fn default() -> Self {
        Restore::new()
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        let Some(before) = self.0 else {
            return;
        };
        let now = match result::ctx::get_current() {
            Ok(now) => now.map_or(NO_CONTEXT, |c| c as usize),
            Err(_) => return,
        };
        if now != before {
            // SAFETY: `before` was current on this thread when the guard was made (or is NULL,
            // which unbinds); contexts cubridge binds are primary contexts retained for the
            // process, and others belong to the caller, who had it current.
            let _ = unsafe { result::ctx::set_current(before as sys::CUcontext) };
        }
    }
}
