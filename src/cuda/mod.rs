//! CUDA backend: driver discovery, primary contexts, memory, stream ordering, NVRTC and the one
//! kernel launch site. The driver is loaded at run time, so cubridge imports and its CPU path
//! works on machines without one; everything CUDA then reports [`Error::CudaUnavailable`].

pub mod background;
pub mod context;
pub mod disk_cache;
pub mod free;
pub mod graph;
pub mod ipc;
pub mod kernels;
pub mod launch;
pub mod link;
pub mod memory;
pub mod nvrtc;
pub(crate) mod nvrtc_paths;
pub mod release;
pub mod shared;
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
            return Some(format!("the CUDA driver failed to initialise ({:?})", e.0));
        }
        match cudarc::driver::result::device::get_count() {
            Ok(n) if n > 0 => None,
            Ok(_) => Some("the CUDA driver reports no devices".into()),
            Err(e) => Some(format!(
                "the CUDA driver could not count devices ({:?})",
                e.0
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

/// Whether the driver refused a call only because a graph is being captured (the call is not
/// allowed in the capture's mode, or would have joined work outside the capture).
pub fn is_capture_refusal(code: sys::CUresult) -> bool {
    use sys::CUresult::*;
    matches!(
        code,
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
            | CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
            | CUDA_ERROR_STREAM_CAPTURE_MERGE
            | CUDA_ERROR_STREAM_CAPTURE_UNMATCHED
            | CUDA_ERROR_STREAM_CAPTURE_UNJOINED
            | CUDA_ERROR_STREAM_CAPTURE_ISOLATION
            | CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
            | CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
            | CUDA_ERROR_CAPTURED_EVENT
    )
}

/// Whether the driver refused a module image itself (code for another architecture, PTX newer
/// than the driver, a damaged file), so that a compile for this device may still load.
pub fn is_image_refusal(code: sys::CUresult) -> bool {
    use sys::CUresult::*;
    matches!(
        code,
        CUDA_ERROR_INVALID_IMAGE
            | CUDA_ERROR_NO_BINARY_FOR_GPU
            | CUDA_ERROR_INVALID_PTX
            | CUDA_ERROR_UNSUPPORTED_PTX_VERSION
            | CUDA_ERROR_JIT_COMPILER_NOT_FOUND
            | CUDA_ERROR_JIT_COMPILATION_DISABLED
            | CUDA_ERROR_INVALID_SOURCE
            | CUDA_ERROR_SHARED_OBJECT_INIT_FAILED
    )
}

/// Converts a driver result, naming what cubridge was doing. An allocation turns the driver's
/// out-of-memory code into [`Error::OutOfMemory`] with the bytes it asked for (`memory.rs`).
pub fn check<T>(r: std::result::Result<T, DriverError>, context: &str) -> Result<T> {
    r.map_err(|e| Error::Cuda {
        code: e.0,
        context: context.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::CUresult::*;

    #[test]
    fn refusals_are_told_by_code() {
        assert!(is_capture_refusal(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
        assert!(is_capture_refusal(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
        assert!(!is_capture_refusal(CUDA_ERROR_INVALID_VALUE));
        assert!(is_image_refusal(CUDA_ERROR_NO_BINARY_FOR_GPU));
        assert!(is_image_refusal(CUDA_ERROR_UNSUPPORTED_PTX_VERSION));
        assert!(!is_image_refusal(CUDA_ERROR_OUT_OF_MEMORY));
        assert!(!is_image_refusal(CUDA_ERROR_ILLEGAL_ADDRESS));
    }

    #[test]
    fn out_of_memory_keeps_its_code_or_the_bytes_an_allocation_asked_for() {
        let e = check::<()>(Err(DriverError(CUDA_ERROR_OUT_OF_MEMORY)), "launching").unwrap_err();
        assert_eq!(e.to_string(), "CUDA_ERROR_OUT_OF_MEMORY while launching");
        assert_eq!(e.kind(), crate::error::ErrorKind::Memory);
        let e = memory::out_of_memory(1 << 40, crate::Device::Cuda(1))(e).to_string();
        assert_eq!(e, "could not allocate 1099511627776 bytes on cuda:1");
    }
}
