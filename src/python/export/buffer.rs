//! The Python buffer protocol as an exporter: host-accessible arrays fill a `Py_buffer`, so that
//! `memoryview(x)` and `numpy.asarray(x)` share their memory.

use crate::array::Array;
use crate::error::Error;
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

/// The buffer format of `array`, where a buffer request with `flags` can be served: the host
/// reads it, its dtype has a format, and it is as writable and contiguous as asked.
fn exportable(array: &Array, flags: c_int) -> Result<&'static str, Error> {
    if !array.device().is_host_accessible() {
        return Err(Error::export(format!(
            "an array on {} has no buffer protocol (the host cannot read it); use DLPack",
            array.device()
        )));
    }
    let Some(format) = array.dtype().buffer_format() else {
        return Err(Error::export(format!(
            "{} has no buffer-protocol format; use DLPack",
            array.dtype()
        )));
    };
    if has(flags, ffi::PyBUF_WRITABLE) && array.readonly() {
        return Err(Error::export("the array is read-only"));
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
        ));
    }
    Ok(format)
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
    let format = exportable(array, flags)?;
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
