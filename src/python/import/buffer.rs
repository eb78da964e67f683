//! The Python buffer protocol: exporting host-accessible arrays (so `memoryview(x)` and
//! `numpy.asarray(x)` share memory) and importing any buffer-protocol object zero-copy.

use crate::array::Array;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Error;
use crate::view::{from_descriptor, Descriptor};
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_int, CString};

/// What a filled `Py_buffer` points at, freed in [`release`].
struct Internal {
    /// Shape, then strides in bytes.
    dims: Vec<isize>,
    format: CString,
}

fn has(flags: c_int, wanted: c_int) -> bool {
    flags & wanted == wanted
}

fn is_f_contiguous(array: &Array) -> bool {
    let mut expected: isize = 1;
    for (&d, &s) in array.shape().iter().zip(array.strides()) {
        if d == 1 {
            continue;
        }
        if s != expected {
            return array.numel() == 0;
        }
        expected *= d as isize;
    }
    true
}

/// Fills `view` for `array` as `bf_getbuffer` must.
///
/// # Safety
/// `view` is the non-null `Py_buffer` CPython passed to `bf_getbuffer`; `owner` is the Python
/// object whose buffer is requested and owns `array`.
pub unsafe fn fill(
    owner: &Bound<'_, PyAny>,
    array: &Array,
    view: *mut ffi::Py_buffer,
    flags: c_int,
) -> PyResult<()> {
    if view.is_null() {
        return Err(Error::export("NULL Py_buffer").into());
    }
    if !array.device().is_host_accessible() {
        return Err(Error::export(format!(
            "an array on {} has no buffer protocol (the host cannot read it); use DLPack",
            array.device()
        ))
        .into());
    }
    let Some(format) = array.dtype().buffer_format() else {
        return Err(Error::export(format!(
            "{} has no buffer-protocol format; use DLPack",
            array.dtype()
        ))
        .into());
    };
    if has(flags, ffi::PyBUF_WRITABLE) && array.readonly() {
        return Err(Error::export("the array is read-only").into());
    }
    let c = array.layout().is_contiguous();
    let f = is_f_contiguous(array);
    let contiguity_ok = if has(flags, ffi::PyBUF_ANY_CONTIGUOUS) {
        c || f
    } else if has(flags, ffi::PyBUF_F_CONTIGUOUS) {
        f
    } else if has(flags, ffi::PyBUF_C_CONTIGUOUS) || !has(flags, ffi::PyBUF_STRIDES) {
        c
    } else {
        true
    };
    if !contiguity_ok {
        return Err(Error::export(
            "the array is not contiguous in the way the buffer request needs",
        )
        .into());
    }
    let itemsize = array.dtype().itemsize() as isize;
    let mut dims: Vec<isize> = array.shape().iter().map(|&d| d as isize).collect();
    dims.extend(array.strides().iter().map(|&s| s * itemsize));
    let internal = Box::new(Internal {
        dims,
        format: CString::new(format).expect("formats have no NUL"),
    });
    let ndim = array.ndim();
    // SAFETY: `view` is valid (CPython's contract); the pointers stored in it point into
    // `internal`, which stays alive (leaked into `view.internal`) until `release` frees it, and
    // into the array's buffer, which the new reference to `owner` keeps alive.
    unsafe {
        let v = &mut *view;
        v.buf = array.data_ptr().cast();
        v.obj = owner.clone().into_ptr();
        v.len = array.nbytes() as isize;
        v.readonly = array.readonly() as c_int;
        v.itemsize = itemsize;
        v.format = if has(flags, ffi::PyBUF_FORMAT) {
            internal.format.as_ptr() as *mut _
        } else {
            std::ptr::null_mut()
        };
        v.ndim = ndim as c_int;
        let dims_ptr = internal.dims.as_ptr() as *mut isize;
        v.shape = if has(flags, ffi::PyBUF_ND) {
            dims_ptr
        } else {
            std::ptr::null_mut()
        };
        v.strides = if has(flags, ffi::PyBUF_STRIDES) {
            dims_ptr.add(ndim)
        } else {
            std::ptr::null_mut()
        };
        v.suboffsets = std::ptr::null_mut();
        v.internal = Box::into_raw(internal).cast();
    }
    Ok(())
}

/// Frees what [`fill`] allocated.
///
/// # Safety
/// `view` was filled by [`fill`] and is released once.
pub unsafe fn release(view: *mut ffi::Py_buffer) {
    // SAFETY: `internal` was produced by Box::into_raw in `fill` and is freed only here.
    unsafe {
        let internal = (*view).internal.cast::<Internal>();
        if !internal.is_null() {
            drop(Box::from_raw(internal));
            (*view).internal = std::ptr::null_mut();
        }
    }
}

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
        let _ = Python::try_attach(|_| unsafe { ffi::PyBuffer_Release(view) });
    }
}

/// A zero-copy view of a buffer-protocol object, or `None` if it has no buffer protocol. The view
/// holds the buffer (and so the object) until the last array over it goes.
pub fn import(obj: &Bound<'_, PyAny>) -> PyResult<Option<Array>> {
    let py = obj.py();
    let mut held = Box::new(HeldBuffer {
        // SAFETY: Py_buffer is a plain C struct; all-zero is a valid "unfilled" state.
        view: unsafe { std::mem::zeroed() },
        filled: false,
    });
    // SAFETY: `obj` is a live object and `held.view` a writable Py_buffer that does not move
    // (it is boxed); on success the view must be released, which dropping `held` does.
    let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut held.view, ffi::PyBUF_FULL_RO) };
    if rc != 0 {
        let e = PyErr::fetch(py);
        return if e.is_instance_of::<PyTypeError>(py) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    held.filled = true;
    let v = &held.view;
    let ndim = usize::try_from(v.ndim).unwrap_or(usize::MAX);
    if ndim > crate::layout::MAX_NDIM {
        return Err(Error::invalid(format!("buffer ndim {} is out of range", v.ndim)).into());
    }
    let itemsize = usize::try_from(v.itemsize)
        .ok()
        .filter(|&i| i > 0)
        .ok_or_else(|| Error::invalid(format!("buffer itemsize {} is invalid", v.itemsize)))?;
    if ndim > 0 && v.shape.is_null() {
        return Err(Error::invalid("buffer has dimensions but no shape").into());
    }
    // A filled Py_buffer's shape, strides and suboffsets, where non-NULL, hold `ndim` entries,
    // and its format, where non-NULL, is a C string.
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
        return Err(Error::invalid("indirect (PIL-style) buffers are not supported").into());
    }
    let dtype = if v.format.is_null() {
        DType::from_buffer_format("B", itemsize)?
    } else {
        // SAFETY: a non-NULL format is a NUL-terminated C string owned by the exporter.
        let format = unsafe { std::ffi::CStr::from_ptr(v.format) };
        match format.to_str() {
            Ok(text) => DType::from_buffer_format(text, itemsize)?,
            Err(_) => DType::from_buffer_format(&format.to_string_lossy(), itemsize)?,
        }
    };
    // Shape and element strides on the stack for up to 8 dimensions.
    let (mut shape_buf, mut strides_buf) = ([0i64; 8], [0i64; 8]);
    let (mut shape_heap, mut strides_heap) = (Vec::new(), Vec::new());
    let (shape, strides): (&mut [i64], &mut [i64]) = if ndim <= 8 {
        (&mut shape_buf[..ndim], &mut strides_buf[..ndim])
    } else {
        shape_heap.resize(ndim, 0);
        strides_heap.resize(ndim, 0);
        (&mut shape_heap, &mut strides_heap)
    };
    for (to, &d) in shape.iter_mut().zip(dims) {
        *to = d as i64;
    }
    let has_strides = !v.strides.is_null() && ndim > 0;
    if has_strides {
        // SAFETY: see above.
        let bytes = unsafe { std::slice::from_raw_parts(v.strides, ndim) };
        for (to, &s) in strides.iter_mut().zip(bytes) {
            if s % itemsize as isize != 0 {
                return Err(Error::invalid(format!(
                    "buffer stride {s} is not a multiple of the item size {itemsize}"
                ))
                .into());
            }
            *to = (s / itemsize as isize) as i64;
        }
    }
    let descriptor = Descriptor {
        data: v.buf as usize,
        byte_offset: 0,
        shape,
        strides: has_strides.then_some(&*strides),
        dtype,
        device: Device::Cpu,
        readonly: v.readonly != 0,
        // Without strides the buffer is C-contiguous and `len` bounds it exactly.
        len_bytes: if has_strides {
            None
        } else {
            usize::try_from(v.len).ok()
        },
    };
    // SAFETY: the exporter keeps the memory valid (and, for resizable objects, fixed) until the
    // view is released, which happens when the boxed HeldBuffer is dropped.
    Ok(Some(unsafe { from_descriptor(&descriptor, held)? }))
}
