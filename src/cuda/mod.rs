//! CUDA backend: driver discovery, primary contexts, memory, stream ordering, NVRTC and the one
//! kernel launch site. The driver is loaded at run time, so cubridge imports and its CPU path
//! works on machines without one; everything CUDA then reports [`Error::CudaUnavailable`].

pub mod context;
pub mod disk_cache;
pub mod free;
pub mod kernels;
pub mod launch;
pub mod memory;
pub mod nvrtc;
pub mod release;
pub mod shipped;
pub mod stream;

/// The driver API's types (`CUfunction`, `CUstream`, ...), for extension crates that launch
/// their own kernels through [`launch::launch`].
pub use cudarc::driver::sys;

use crate::device::Device;
use crate::error::{Error, Result};
use cudarc::driver::DriverError;
use std::sync::OnceLock;

/// Why CUDA is not usable here, or `None` when it is. Probed once per process.
fn probe() -> &'static Option<String> {
    static PROBE: OnceLock<Option<String>> = OnceLock::new();
    PROBE.get_or_init(|| {
        // SAFETY: is_culib_present only tries to open the driver library; it has no
        // preconditions.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Some("no CUDA driver library (libcuda) was found".into());
        }
        if let Err(e) = cudarc::driver::result::init() {
            return Some(format!(
                "the CUDA driver failed to initialise ({})",
                name(&e)
            ));
        }
        match cudarc::driver::result::device::get_count() {
            Ok(n) if n > 0 => None,
            Ok(_) => Some("the CUDA driver reports no devices".into()),
            Err(e) => Some(format!(
                "the CUDA driver could not count devices ({})",
                name(&e)
            )),
        }
    })
}

/// Whether a CUDA driver with at least one device is present.
pub fn is_available() -> bool {
    probe().is_none()
}

/// Number of CUDA devices (0 without a driver). Counted once: the driver fixes it at
/// initialisation (`CUDA_VISIBLE_DEVICES` is read then), and every allocation asks.
pub fn device_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        if !is_available() {
            return 0;
        }
        cudarc::driver::result::device::get_count().map_or(0, |n| n.max(0) as usize)
    })
}

/// Fails with [`Error::CudaUnavailable`] unless CUDA is usable, and checks `device`'s ordinal.
pub fn require(device: Device) -> Result<()> {
    if !is_available() {
        return Err(unavailable(device));
    }
    if let Device::Cuda(n) = device {
        let count = device_count();
        if n as usize >= count {
            return Err(Error::invalid(format!(
                "cuda:{n} does not exist: this machine has {count} CUDA device(s)"
            )));
        }
    }
    Ok(())
}

/// The calling thread's current CUDA device (what `"cuda"` names): the device of the context
/// current on this thread, else device 0.
pub fn current_device() -> Result<Device> {
    require(Device::Cuda(0))?;
    let ordinal = context::current_ordinal()?.unwrap_or(0);
    Ok(Device::Cuda(ordinal))
}

/// The error for a request that needs CUDA on `device`.
pub fn unavailable(device: Device) -> Error {
    let why = probe().clone().unwrap_or_else(|| "it is not usable".into());
    Error::CudaUnavailable(format!("{device} was requested but {why}"))
}

/// The error for `what` (a kernel, say), which needs CUDA, on a machine without it.
pub fn unavailable_for(what: &str) -> Error {
    let why = probe().clone().unwrap_or_else(|| "it is not usable".into());
    Error::CudaUnavailable(format!("{what} runs on CUDA devices, but {why}"))
}

/// The driver's name for an error code (`CUDA_ERROR_...`).
pub fn name(e: &DriverError) -> String {
    e.error_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("CUDA error {}", e.0 as u32))
}

/// Converts a driver result, naming what cubridge was doing.
pub fn check<T>(r: std::result::Result<T, DriverError>, context: &str) -> Result<T> {
    r.map_err(|e| {
        if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            Error::OutOfMemory {
                bytes: 0,
                device: context.to_string(),
            }
        } else {
            Error::Cuda {
                name: name(&e),
                context: context.to_string(),
            }
        }
    })
}
