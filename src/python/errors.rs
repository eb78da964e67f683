//! The one mapping from [`Error`] to Python exceptions, and cubridge's own exception classes.
//! The rest of `python/` builds no exceptions: it returns [`Error`] values, converted here.

use crate::error::{Error, ErrorKind};
use pyo3::create_exception;
use pyo3::exceptions::{
    PyAttributeError, PyBufferError, PyImportError, PyMemoryError, PyOverflowError, PyRuntimeError,
    PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::PyTypeInfo;

create_exception!(
    cubridge,
    CudaError,
    PyRuntimeError,
    "A CUDA driver call failed; the message starts with the driver's name for the error, and \
     `code` is its CUresult.\n\n\
     >>> try:\n\
     ...     cubridge.cuda.synchronize()\n\
     ... except cubridge.CudaError as e:\n\
     ...     print(e.code)  # a CUresult, such as 700 for an illegal address"
);
create_exception!(
    cubridge,
    CompileError,
    PyRuntimeError,
    "NVRTC could not compile a kernel; the message carries the compiler log, and `code` is \
     NVRTC's nvrtcResult (None where NVRTC could not be loaded or compiling is off).\n\n\
     >>> try:\n\
     ...     cubridge.RawKernel('extern \"C\" __global__ void k() { oops; }', \"k\").compile()\n\
     ... except cubridge.CompileError as e:\n\
     ...     print(e)  # the compiler log"
);
create_exception!(
    cubridge,
    CudaUnavailableError,
    PyRuntimeError,
    "CUDA was asked for, but this machine has no usable CUDA driver or device.\n\n\
     >>> if not cubridge.cuda.is_available():\n\
     ...     cubridge.zeros(2, device=\"cuda\")  # raises CudaUnavailableError"
);

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        let message = e.to_string();
        let code = e.code();
        match e.kind() {
            ErrorKind::Type => PyTypeError::new_err(message),
            ErrorKind::Value => PyValueError::new_err(message),
            ErrorKind::Attribute => PyAttributeError::new_err(message),
            ErrorKind::Overflow => PyOverflowError::new_err(message),
            ErrorKind::Buffer => PyBufferError::new_err(message),
            ErrorKind::Memory => PyMemoryError::new_err(message),
            ErrorKind::Incompatible => PyImportError::new_err(message),
            ErrorKind::CudaUnavailable => own::<CudaUnavailableError>(message),
            ErrorKind::Cuda => with_code(own::<CudaError>(message), code),
            ErrorKind::Compile => with_code(own::<CompileError>(message), code),
        }
    }
}

/// An exception of one of cubridge's own classes. In an extension crate's copy
/// of cubridge that hands its work to the `cubridge` module (see [`super::runtime`]), the class
/// is the module's, so that `except cubridge.CudaError` catches the extension's errors too.
fn own<T: PyTypeInfo>(message: String) -> PyErr {
    Python::attach(|py| {
        let local = py.get_type::<T>();
        let class = (super::runtime::services().class)(py, local);
        PyErr::from_type(class, message)
    })
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
