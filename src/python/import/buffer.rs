//! The Python buffer protocol as a consumer: any buffer-protocol object, viewed zero-copy.

use crate::array::Array;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{check_ndim, element_stride, Dims};
use crate::view::{from_descriptor, Descriptor};
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;

/// A `Py_buffer` obtained from an exporter, released exactly once when dropped (from any
/// thread: release re-attaches to the interpreter, and is skipped only after it has finalized).
/// pyo3's own buffer type refuses the NULL shape that 0-d exporters (numpy scalars) hand over,
/// so cubridge holds the raw view itself, boxed once: the box is the view's keepalive.
struct HeldBuffer {
    view: ffi::Py_buffer,
    /// Whether `view` was filled (and so must be released).
    filled: bool,
}

// SAFETY: the exporter keeps the view's memory valid until release; release runs with the
// interpreter attached whatever thread drops the holder.
unsafe impl Send for HeldBuffer {}
// SAFETY: shared references only read the filled-in fields.
unsafe impl Sync for HeldBuffer {}

impl Drop for HeldBuffer {
    fn drop(&mut self) {
        if !self.filled {
            return;
        }
        let view: *mut ffi::Py_buffer = &mut self.view;
        // SAFETY: the view was filled by a successful PyObject_GetBuffer and is released once.
        let _ = Python::try_attach(|_| unsafe {
            crate::phases::producer!(ProducerRelease, ffi::PyBuffer_Release(view))
        });
    }
}

/// The dtype of a filled buffer's format (`B` where it gives none) and itemsize.
fn format_dtype(v: &ffi::Py_buffer, itemsize: usize) -> Result<DType> {
    if v.format.is_null() {
        return DType::from_buffer_format("B", itemsize);
    }
    // SAFETY: a non-NULL format is a NUL-terminated C string owned by the exporter.
    let format = unsafe { std::ffi::CStr::from_ptr(v.format) };
    match format.to_str() {
        Ok(text) => DType::from_buffer_format(text, itemsize),
        Err(_) => DType::from_buffer_format(&format.to_string_lossy(), itemsize),
    }
}

/// A filled buffer's `ndim` strides in elements; `None` where it gives none (C-contiguous).
fn element_strides(v: &ffi::Py_buffer, itemsize: usize, ndim: usize) -> Result<Option<Dims<i64>>> {
    if v.strides.is_null() || ndim == 0 {
        return Ok(None);
    }
    // SAFETY: a filled Py_buffer's non-NULL strides hold `ndim` entries.
    let bytes = unsafe { std::slice::from_raw_parts(v.strides, ndim) };
    let element = |&s: &isize| element_stride(s as i64, itemsize);
    bytes.iter().map(element).collect::<Result<_>>().map(Some)
}

/// The object's buffer (`PyBUF_FULL_RO`), held until the box is dropped; `None` where the
/// object has no buffer protocol (the `TypeError` CPython raises for that).
fn get_buffer(obj: &Bound<'_, PyAny>) -> PyResult<Option<Box<HeldBuffer>>> {
    let py = obj.py();
    let mut held = Box::new(HeldBuffer {
        // SAFETY: Py_buffer is a plain C struct; all-zero is a valid "unfilled" state.
        view: unsafe { std::mem::zeroed() },
        filled: false,
    });
    // SAFETY: `obj` is a live object and `held.view` a writable Py_buffer that does not move
    // (it is boxed); on success the view must be released, which dropping `held` does.
    let rc = unsafe {
        crate::phases::producer!(
            ProducerExport,
            ffi::PyObject_GetBuffer(obj.as_ptr(), &mut held.view, ffi::PyBUF_FULL_RO)
        )
    };
    if rc != 0 {
        let e = PyErr::fetch(py);
        return if e.is_instance_of::<PyTypeError>(py) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    held.filled = true;
    Ok(Some(held))
}

/// A filled view's shape, refusing indirect (suboffset) buffers.
fn direct_dims(v: &ffi::Py_buffer, ndim: usize) -> Result<&[isize]> {
    if ndim > 0 && v.shape.is_null() {
        return Err(Error::invalid("buffer has dimensions but no shape"));
    }
    // A filled Py_buffer's shape and suboffsets, where non-NULL, hold `ndim` entries.
    let dims: &[isize] = if ndim == 0 {
        &[]
    } else {
        // SAFETY: shape is non-NULL (checked above) and holds `ndim` entries.
        unsafe { std::slice::from_raw_parts(v.shape, ndim) }
    };
    let suboffsets: &[isize] = if v.suboffsets.is_null() || ndim == 0 {
        &[]
    } else {
        // SAFETY: non-NULL suboffsets hold `ndim` entries.
        unsafe { std::slice::from_raw_parts(v.suboffsets, ndim) }
    };
    if suboffsets.iter().any(|&o| o >= 0) {
        return Err(Error::invalid(
            "indirect (PIL-style) buffers are not supported",
        ));
    }
    Ok(dims)
}

/// A zero-copy view of a buffer-protocol object, or `None` if it has no buffer protocol. The view
/// holds the buffer (and so the object) until the last array over it goes.
pub fn import(obj: &Bound<'_, PyAny>) -> PyResult<Option<Array>> {
    let Some(held) = get_buffer(obj)? else {
        return Ok(None);
    };
    let v = &held.view;
    let ndim = check_ndim(v.ndim.into())?;
    let itemsize = usize::try_from(v.itemsize)
        .ok()
        .filter(|&i| i > 0)
        .ok_or_else(|| Error::invalid(format!("buffer itemsize {} is invalid", v.itemsize)))?;
    let dims = direct_dims(v, ndim)?;
    let dtype = format_dtype(v, itemsize)?;
    // In place for up to four dimensions, as layouts hold them.
    let shape: Dims<i64> = dims.iter().map(|&d| d as i64).collect();
    let strides = element_strides(v, itemsize, ndim)?;
    let descriptor = Descriptor {
        data: v.buf as usize,
        byte_offset: 0,
        shape: &shape,
        strides: strides.as_deref(),
        dtype,
        device: Device::Cpu,
        readonly: v.readonly != 0,
        // Without strides the buffer is C-contiguous and `len` bounds it exactly.
        len_bytes: usize::try_from(v.len).ok().filter(|_| strides.is_none()),
    };
    // SAFETY: the exporter keeps the memory valid (and, for resizable objects, fixed) until the
    // view is released, which happens when the boxed HeldBuffer is dropped.
    Ok(Some(unsafe { from_descriptor(&descriptor, held)? }))
}
