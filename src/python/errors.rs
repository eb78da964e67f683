//! The one mapping from [`Error`] to Python exceptions, and cubridge's own exception classes.

use crate::error::Error;
use pyo3::create_exception;
use pyo3::exceptions::{
    PyBufferError, PyMemoryError, PyOverflowError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;

create_exception!(
    cubridge,
    CudaError,
    PyRuntimeError,
    "A CUDA driver call failed; the message starts with the driver's name for the error."
);
create_exception!(
    cubridge,
    CompileError,
    PyRuntimeError,
    "NVRTC could not compile a kernel; the message carries the compiler log."
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
            Error::UnsupportedDType(_) | Error::DTypeMismatch { .. } => {
                PyTypeError::new_err(message)
            }
            Error::UnsupportedDevice(_)
            | Error::DeviceMismatch { .. }
            | Error::Broadcast { .. }
            | Error::Invalid(_)
            | Error::ReadOnly(_) => PyValueError::new_err(message),
            Error::Overflow(_) => PyOverflowError::new_err(message),
            Error::Export(_) => PyBufferError::new_err(message),
            Error::OutOfMemory { .. } => PyMemoryError::new_err(message),
            Error::CudaUnavailable(_) => CudaUnavailableError::new_err(message),
            Error::Cuda { .. } => CudaError::new_err(message),
            Error::Compile { .. } => CompileError::new_err(message),
        }
    }
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
