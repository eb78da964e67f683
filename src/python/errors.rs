//! The one mapping from [`Error`] to Python exceptions, and cubridge's own exception classes.
//! The rest of `python/` builds no exceptions: it returns [`Error`] values, converted here.

use crate::error::Error;
use pyo3::create_exception;
use pyo3::exceptions::{
    PyAttributeError, PyBufferError, PyMemoryError, PyOverflowError, PyRuntimeError, PyTypeError,
    PyValueError,
};
use pyo3::prelude::*;

create_exception!(
    cubridge,
    CudaError,
    PyRuntimeError,
    "A CUDA driver call failed; the message starts with the driver's name for the error, and \
     `code` is its CUresult."
);
create_exception!(
    cubridge,
    CompileError,
    PyRuntimeError,
    "NVRTC could not compile a kernel; the message carries the compiler log, and `code` is \
     NVRTC's nvrtcResult (None where NVRTC could not be loaded or compiling is off)."
);
create_exception!(
    cubridge,
    CudaUnavailableError,
    PyRuntimeError,
    "CUDA was asked for, but this machine has no usable CUDA driver or device."
);

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        let message = e.to_string();
        match e {
            Error::UnsupportedDType(_) | Error::DTypeMismatch { .. } | Error::WrongType(_) => {
                PyTypeError::new_err(message)
            }
            Error::NoAttribute(_) => PyAttributeError::new_err(message),
            Error::UnsupportedDevice(_)
            | Error::DeviceMismatch { .. }
            | Error::Broadcast { .. }
            | Error::Invalid(_)
            | Error::ReadOnly(_) => PyValueError::new_err(message),
            Error::Overflow(_) => PyOverflowError::new_err(message),
            Error::Export(_) => PyBufferError::new_err(message),
            Error::OutOfMemory { .. } => PyMemoryError::new_err(message),
            Error::CudaUnavailable(_) => CudaUnavailableError::new_err(message),
            Error::Cuda { code, .. } => with_code(CudaError::new_err(message), Some(code as i64)),
            Error::Compile { code, .. } => {
                with_code(CompileError::new_err(message), code.map(|c| c as i64))
            }
        }
    }
}

/// Sets the exception's `code`: the driver's or NVRTC's result code, `None` where no call of
/// theirs failed.
fn with_code(err: PyErr, code: Option<i64>) -> PyErr {
    Python::attach(|py| {
        // Setting an attribute of a fresh exception instance fails only without memory; the
        // exception is still the right one then.
        let _ = err.value(py).setattr("code", code);
        err
    })
}

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("CudaError", py.get_type::<CudaError>())?;
    m.add("CompileError", py.get_type::<CompileError>())?;
    m.add(
        "CudaUnavailableError",
        py.get_type::<CudaUnavailableError>(),
    )?;
    Ok(())
}
