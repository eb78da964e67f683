//! CUDA streams at the Python boundary: reading `stream=` arguments (ints, `torch.cuda.Stream`,
//! `cupy.cuda.Stream`, `__cuda_stream__` objects, `cubridge.cuda.Stream`) and handing cubridge's
//! consumer stream to DLPack producers.

use crate::cuda::stream::{self as cs, Stream, LEGACY};
use crate::error::Error;
use crate::python::int_value;
use dlpark::ffi::{DLDevice, DLDeviceType};
use dlpark::python::consumer::stream as dlstream;
use dlpark::python::{DlpackStream, StreamArg};
use pyo3::prelude::*;
use std::ffi::c_void;

/// A stream handle as a stream object reports it: 0 (the NULL stream) is the legacy default.
fn object_handle(value: i128) -> PyResult<Stream> {
    if value == 0 {
        return Ok(LEGACY);
    }
    Ok(Stream::from_dlpack(value)?)
}

/// Reads a `stream=` argument into DLPack numbering; `None` when absent.
pub fn parse(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Stream>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let out_of_range = |_| Error::invalid(format!("stream {obj} is no stream handle"));
    if obj.is_instance_of::<pyo3::types::PyInt>() {
        return Ok(Some(Stream::from_dlpack(
            int_value(obj).map_err(out_of_range)?,
        )?));
    }
    let py = obj.py();
    if let Ok(proto) = obj.getattr(pyo3::intern!(py, "__cuda_stream__")) {
        let value = if proto.is_callable() {
            crate::phases::producer!(ProducerStream, proto.call0())?
        } else {
            proto
        };
        // The protocol returns (version, handle).
        let handle = match value.cast::<pyo3::types::PyTuple>() {
            Ok(t) if t.len() == 2 && int_value(&t.get_item(0)?).is_ok() => {
                int_value(&t.get_item(1)?)?
            }
            _ => int_value(&value)?,
        };
        return Ok(Some(object_handle(handle)?));
    }
    for attr in [pyo3::intern!(py, "cuda_stream"), pyo3::intern!(py, "ptr")] {
        if let Ok(h) = obj.getattr(attr).and_then(|h| int_value(&h)) {
            return Ok(Some(object_handle(h)?));
        }
    }
    // Anything else that is an integer (numpy's ints).
    if let Ok(v) = int_value(obj) {
        return Ok(Some(Stream::from_dlpack(v)?));
    }
    Err(Error::invalid(format!(
        "stream must be an int, a torch.cuda.Stream, a cupy.cuda.Stream or an object with \
         __cuda_stream__, not {}",
        obj.get_type().name()?
    ))
    .into())
}

/// cubridge's stream as a DLPack consumer: producers order their pending work before it.
pub struct Consumer(pub Stream);

// SAFETY: as_python_arg encodes a live stream of the device the producer names, and
// wait_for_producer orders the consumer after the producer's stream before returning true.
unsafe impl DlpackStream for Consumer {
    fn as_python_arg(&self, _py: Python<'_>, device: DLDevice) -> PyResult<StreamArg> {
        if device.device_type != DLDeviceType::CUDA {
            return Ok(dlstream::none());
        }
        // DLPack passes the legacy default stream as NULL, any other stream as its handle.
        let raw = match self.0 {
            LEGACY => std::ptr::null_mut(),
            s => s.handle().cast(),
        };
        Ok(dlstream::cuda(raw))
    }

    unsafe fn wait_for_producer(&self, device: DLDevice, producer: *mut c_void) -> PyResult<bool> {
        if device.device_type != DLDeviceType::CUDA {
            return Ok(true);
        }
        let producer = Stream::from_handle(producer as usize);
        cs::order(self.0, producer, device.device_id as u32)?;
        Ok(true)
    }
}

/// `cubridge.cuda.Stream(device=None)`: a new CUDA stream on `device` (an int, `"cuda:N"`, a
/// `torch.device`, a `cupy.cuda.Device`; default: the current device), owned by cubridge, for
/// `stream=` arguments of cubridge and of other libraries (it has `__cuda_stream__`).
///
/// Raises:
/// - ValueError: `device` is not a CUDA device.
/// - CudaUnavailableError: this machine has no CUDA.
/// - CudaError: the driver could not create the stream.
///
/// >>> s = cubridge.cuda.Stream("cuda:0")
/// >>> cubridge.add(x, y, stream=s)  # x, y on cuda:0
#[pyclass(name = "Stream", module = "cubridge.cuda", frozen)]
pub struct PyStream {
    handle: Stream,
    ordinal: u32,
}

#[pymethods]
impl PyStream {
    #[new]
    #[pyo3(signature = (device=None))]
    fn new(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let _restore = crate::cuda::context::Restore::new();
        let ordinal = super::types::parse_cuda_device(device)?;
        crate::cuda::require(crate::Device::Cuda(ordinal))?;
        // The driver may block (it takes its own locks); never hold the GIL across that.
        let handle = py.detach(|| cs::create(ordinal))?;
        Ok(PyStream { handle, ordinal })
    }

    /// The `CUstream` handle.
    #[getter]
    fn ptr(&self) -> usize {
        self.handle.dlpack()
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> u32 {
        self.ordinal
    }

    /// Blocks until the work queued on this stream is done (without holding the GIL).
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let _restore = crate::cuda::context::Restore::new();
        let (h, o) = (self.handle, self.ordinal);
        Ok(py.detach(|| cs::synchronize(h, o))?)
    }

    /// The CUDA stream protocol: `(version, handle)`.
    fn __cuda_stream__(&self) -> (u32, usize) {
        (0, self.handle.dlpack())
    }

    fn __repr__(&self) -> String {
        format!(
            "cubridge.cuda.Stream(device={}, ptr={:#x})",
            self.ordinal,
            self.handle.dlpack()
        )
    }
}

impl Drop for PyStream {
    fn drop(&mut self) {
        // Dropped wherever the last reference goes: the caller's current device stays.
        let _restore = crate::cuda::context::Restore::new();
        cs::destroy(self.handle, self.ordinal);
    }
}

/// What an imported CUDA view is for, which decides whether it needs an event of its own.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// The view is kept (returned to the caller): an event is recorded on the consumer stream
    /// after the producer's work, so that any later user, on any stream, can wait for it.
    Kept,
    /// The view is used at once by work queued on the consumer stream and then dropped: the
    /// producer's ordering before that stream is all it needs, and no event is recorded.
    Immediate,
}
