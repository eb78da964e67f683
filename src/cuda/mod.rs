//! CUDA backend: driver discovery. The driver is loaded at run time, so cubridge imports and its
//! CPU path works on machines without one; everything CUDA then reports
//! [`Error::CudaUnavailable`].

use crate::device::Device;
use crate::error::Error;
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
            return Some(format!("the CUDA driver failed to initialise ({e:?})"));
        }
        match cudarc::driver::result::device::get_count() {
            Ok(n) if n > 0 => None,
            Ok(_) => Some("the CUDA driver reports no devices".into()),
            Err(e) => Some(format!("the CUDA driver could not count devices ({e:?})")),
        }
    })
}

/// Whether a CUDA driver with at least one device is present.
pub fn is_available() -> bool {
    probe().is_none()
}

/// Number of CUDA devices (0 without a driver).
pub fn device_count() -> usize {
    if !is_available() {
        return 0;
    }
    cudarc::driver::result::device::get_count().map_or(0, |n| n.max(0) as usize)
}

/// The calling thread's current CUDA device (what `"cuda"` names).
pub fn current_device() -> crate::error::Result<Device> {
    if !is_available() {
        return Err(unavailable(Device::Cuda(0)));
    }
    Ok(Device::Cuda(0))
}

/// The error for a request that needs CUDA on `device`.
pub fn unavailable(device: Device) -> Error {
    let why = probe()
        .clone()
        .unwrap_or_else(|| "this build of cubridge has no CUDA memory support yet".into());
    Error::CudaUnavailable(format!("{device} was requested but {why}"))
}
