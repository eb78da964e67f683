//! Exporting cubridge arrays to Python consumers: the one hand-over that `__dlpack__`, the CUDA
//! array interface and the DLPack C exchange table share (the consumer's stream ordered after the
//! array's pending work, the memory's free after the consumer's reads), and the interface dict.
//! Managed tensors themselves are built in [`crate::export`]; the buffer protocol's export is
//! [`buffer`].

pub mod buffer;

use crate::array::Array;
use crate::cuda::stream as cs;
use crate::device::Device;
use crate::error::Error;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// Where a consumer reads exported CUDA memory.
#[derive(Clone, Copy)]
pub enum Reader {
    /// On this stream, which is made to wait for the array's pending work; the memory's free
    /// waits for what is queued there when the memory goes.
    On(cs::Stream),
    /// On a stream it does not name: the free waits for the device. With `Some(s)`, pending
    /// work is first ordered before `s` (a stream that cannot have been destroyed, for a
    /// consumer that will order its reads after it); with `None` the consumer orders them itself.
    Unknown(Option<cs::Stream>),
}

/// Hands `array`'s memory over to a consumer reading as `reader`: CUDA device and managed
/// memory, which the device may still be using; host memory has no pending device work.
pub fn hand_over(array: &Array, reader: Reader) -> crate::Result<()> {
    if !matches!(array.device(), Device::Cuda(_) | Device::CudaManaged) {
        return Ok(());
    }
    match reader {
        Reader::On(stream) => {
            array.order_before(stream)?;
            array.record_consumer(stream);
        }
        Reader::Unknown(ordered) => {
            if let Some(stream) = ordered {
                array.order_before(stream)?;
            }
            array.record_unknown_consumer();
        }
    }
    Ok(())
}

/// The interface dict of a device or managed array: v3, with the stream holding its pending
/// work. (Pinned host memory has none: consumers would take it for device memory.)
pub fn cuda_array_interface<'py>(py: Python<'py>, array: &Array) -> PyResult<Bound<'py, PyDict>> {
    if !matches!(array.device(), Device::Cuda(_) | Device::CudaManaged) {
        return Err(Error::no_attribute(format!(
            "__cuda_array_interface__ describes CUDA device or managed memory; this array is on {}",
            array.device()
        ))
        .into());
    }
    let typestr = array.dtype().typestr().ok_or_else(|| {
        PyErr::from(Error::no_attribute(format!(
            "the CUDA array interface has no typestr for {}; use DLPack",
            array.dtype()
        )))
    })?;
    let d = PyDict::new(py);
    d.set_item("shape", PyTuple::new(py, array.shape())?)?;
    d.set_item("typestr", typestr)?;
    let ptr = if array.numel() == 0 {
        0
    } else {
        array.data_ptr() as usize
    };
    d.set_item("data", (ptr, array.readonly()))?;
    if array.layout().is_contiguous() {
        d.set_item("strides", py.None())?;
    } else {
        let item = array.dtype().itemsize() as isize;
        let bytes: Vec<isize> = array.strides().iter().map(|s| s * item).collect();
        d.set_item("strides", PyTuple::new(py, bytes)?)?;
    }
    d.set_item("version", 3)?;
    // The consumer reads on a stream it does not name. Pending work is handed over through the
    // legacy default stream, which is made to wait for it: the stream the array was written on
    // may since have been destroyed by its owner.
    let pending = array.has_pending();
    hand_over(array, Reader::Unknown(pending.then_some(cs::LEGACY)))?;
    match pending {
        true => d.set_item("stream", cs::LEGACY.dlpack())?,
        false => d.set_item("stream", py.None())?,
    }
    Ok(d)
}
