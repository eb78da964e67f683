//! numpy's own arrays, read from numpy's array object as numpy's C macros read it
//! (`PyArray_DATA`, `PyArray_NDIM`, `PyArray_DIMS`, `PyArray_STRIDES`, `PyArray_DESCR`,
//! `PyArray_FLAGS`): no buffer-protocol request, no format string to parse, no `Py_buffer` to
//! hold and release; and numpy's scalars, read as `PyArrayScalar_VAL` reads them. The fields
//! read here have the same place in numpy 1.x and 2.x. Arrays of ml_dtypes' bfloat16 (a dtype
//! numpy lacks) are read here too: neither DLPack nor the buffer protocol carries them.

use crate::array::Array;
use crate::cpu::copy::read_scalar;
use crate::cpu::element::Scalar;
use crate::device::Device;
use crate::dtype::DType;
use crate::layout::MAX_DIMS;
use crate::python::Holder;
use crate::storage::Keepalive;
use crate::view::{check, Checked, Descriptor};
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_char, c_int};

/// The head of numpy's `PyArrayObject_fields`.
#[repr(C)]
struct ArrayFields {
    ob_base: ffi::PyObject,
    data: *mut c_char,
    nd: c_int,
    dimensions: *const isize,
    strides: *const isize,
    base: *mut ffi::PyObject,
    descr: *const DescrFields,
    flags: c_int,
}

/// The head of numpy's `PyArray_Descr`.
#[repr(C)]
struct DescrFields {
    ob_base: ffi::PyObject,
    typeobj: *mut ffi::PyObject,
    kind: c_char,
    type_char: c_char,
    byteorder: c_char,
    former_flags: c_char,
    type_num: c_int,
}

/// `NPY_ARRAY_WRITEABLE`.
const WRITEABLE: c_int = 0x0400;
/// `NPY_HALF`, the last of numpy's built-in type numbers that cubridge reads.
const LAST_BUILTIN: c_int = 23;
/// `NPY_USERDEF`, the first type number of dtypes registered by other packages (ml_dtypes').
const USERDEF: c_int = 256;

/// The dtype of a built-in numpy type character (`dtype.char`), native byte order.
fn dtype_of(type_char: u8) -> Option<DType> {
    let long64 = std::mem::size_of::<std::ffi::c_long>() == 8;
    Some(match type_char {
        b'?' => DType::Bool,
        b'b' => DType::Int8,
        b'B' => DType::UInt8,
        b'h' => DType::Int16,
        b'H' => DType::UInt16,
        b'i' => DType::Int32,
        b'I' => DType::UInt32,
        b'q' => DType::Int64,
        b'Q' => DType::UInt64,
        b'l' if long64 => DType::Int64,
        b'l' => DType::Int32,
        b'L' if long64 => DType::UInt64,
        b'L' => DType::UInt32,
        b'e' => DType::Float16,
        b'f' => DType::Float32,
        b'd' => DType::Float64,
        b'F' => DType::Complex64,
        b'D' => DType::Complex128,
        _ => return None,
    })
}

/// A view of `obj` if it is exactly a `numpy.ndarray`, holding `obj`; `None` for anything else
/// and for what this reading does not cover (another dtype or byte order, strides that are not whole
/// elements, more than [`MAX_DIMS`] dimensions), which the buffer protocol then answers.
pub fn import(obj: &Bound<'_, PyAny>) -> Option<Array> {
    // SAFETY: numpy keeps an array's memory valid while the array lives (and refuses to resize
    // one that others reference); the view holds a strong reference to it.
    Some(unsafe { checked(obj)?.into_array(Keepalive::Object(Holder::new(obj))) })
}

/// As [`import`], but a view lent for the length of one call where this thread has a lent
/// buffer free ([`crate::storage::lend`]): it holds no reference to `obj`, and costs no
/// allocation.
///
/// # Safety
/// The caller holds a strong reference to `obj`, taken before any Python code can run after
/// this returns, until every array over the view is dropped, which happens before the current
/// call returns (none is returned, exported or handed to CUDA work).
pub unsafe fn lend(obj: &Bound<'_, PyAny>) -> Option<Array> {
    let held = || Keepalive::Object(Holder::new(obj));
    // SAFETY: the caller's reference keeps `obj`, and with it numpy's memory, alive past every
    // use of the view; numpy refuses to resize an array referenced beyond its user's own, as
    // this one is. A view held by `held` is as `import`'s.
    Some(unsafe { checked(obj)?.into_lent_or(held) })
}

/// `obj`'s fields checked for a view, if it is exactly a `numpy.ndarray` this reading covers.
fn checked(obj: &Bound<'_, PyAny>) -> Option<Checked> {
    if !super::is_numpy_ndarray(obj) {
        return None;
    }
    // SAFETY: `obj` is exactly a numpy.ndarray (checked above), whose object starts with
    // the fields of `ArrayFields`, and whose descriptor starts with those of `DescrFields`;
    // numpy keeps both valid while the array lives, and the GIL is held.
    let (fields, descr) = unsafe {
        let fields = &*obj.as_ptr().cast::<ArrayFields>();
        (fields, &*fields.descr)
    };
    if descr.byteorder as u8 == b'>' {
        return None;
    }
    let dtype = match descr.type_num {
        n if n <= LAST_BUILTIN => dtype_of(descr.type_char as u8)?,
        n if n >= USERDEF && is_bfloat16(obj.py(), descr.typeobj) => DType::BFloat16,
        _ => return None,
    };
    let ndim = usize::try_from(fields.nd).ok().filter(|&n| n <= MAX_DIMS)?;
    let (mut shape, mut strides) = ([0i64; MAX_DIMS], [0i64; MAX_DIMS]);
    for k in 0..ndim {
        // SAFETY: numpy's dimensions and strides hold `nd` entries each.
        let (d, s) = unsafe { (*fields.dimensions.add(k), *fields.strides.add(k)) };
        shape[k] = d as i64;
        strides[k] = crate::layout::element_stride(s as i64, dtype.itemsize()).ok()?;
    }
    check(&Descriptor {
        data: fields.data as usize,
        byte_offset: 0,
        shape: &shape[..ndim],
        strides: Some(&strides[..ndim]),
        dtype,
        device: Device::Cpu,
        readonly: fields.flags & WRITEABLE == 0,
        len_bytes: None,
    })
    .ok()
}

/// The value and dtype of `obj` if it is a 0-d `numpy.ndarray` of a dtype read here (numpy
/// takes one as a scalar beside arrays); `None` for anything else, without importing it.
pub fn zero_d_value(obj: &Bound<'_, PyAny>) -> Option<(Scalar, DType)> {
    if !super::is_numpy_ndarray(obj) {
        return None;
    }
    // SAFETY: `obj` is exactly a numpy.ndarray, whose object starts with `ArrayFields`.
    let nd = unsafe { (*obj.as_ptr().cast::<ArrayFields>()).nd };
    if nd != 0 {
        return None;
    }
    let array = import(obj)?;
    // SAFETY: a 0-d array holds one element of its dtype at its data pointer, valid while
    // `array` (which holds `obj`) lives.
    let value = unsafe { read_scalar(array.dtype(), array.data_ptr(), 0) };
    Some((value, array.dtype()))
}

/// Whether `typeobj` (a dtype's scalar type) is ml_dtypes' `bfloat16`: numpy has no bfloat16,
/// and its arrays of ml_dtypes' (which `numpy.asarray` of a cubridge bfloat16 array makes)
/// export neither DLPack nor a buffer. ml_dtypes' bfloat16 is 2 bytes, native byte order.
fn is_bfloat16(py: Python<'_>, typeobj: *mut ffi::PyObject) -> bool {
    static BFLOAT16: pyo3::sync::PyOnceLock<Py<PyAny>> = pyo3::sync::PyOnceLock::new();
    if let Some(t) = BFLOAT16.get(py) {
        return t.as_ptr() == typeobj;
    }
    // A dtype of ml_dtypes means ml_dtypes is loaded; it is not imported here.
    let found = py
        .import("sys")
        .and_then(|sys| sys.getattr("modules"))
        .and_then(|modules| modules.get_item("ml_dtypes"))
        .and_then(|m| m.getattr("bfloat16"));
    match found {
        Ok(t) => BFLOAT16.get_or_init(py, || t.unbind()).as_ptr() == typeobj,
        Err(_) => false,
    }
}

/// numpy's own scalar types (`numpy.float32`, ...) met so far, with their dtypes.
static SCALAR_TYPES: std::sync::Mutex<Vec<(Py<pyo3::types::PyType>, DType)>> =
    std::sync::Mutex::new(Vec::new());

/// The value and dtype of a scalar of one of numpy's own scalar types that [`learn_scalar`] has
/// seen, read where numpy keeps it (`PyArrayScalar_VAL`: right after the object header);
/// `None` for anything else.
pub fn builtin_scalar(obj: &Bound<'_, PyAny>) -> Option<(Scalar, DType)> {
    let ty = obj.get_type();
    let dtype = {
        let types = crate::lock(&SCALAR_TYPES);
        types.iter().find(|(t, _)| t.is(&ty)).map(|&(_, d)| d)?
    };
    // SAFETY: `obj` is exactly one of numpy's scalar types of `dtype` (learn_scalar's check),
    // whose object holds one aligned value of the dtype right after the object header.
    let value = unsafe {
        let at = obj
            .as_ptr()
            .cast::<u8>()
            .add(std::mem::size_of::<ffi::PyObject>());
        read_scalar(dtype, at, 0)
    };
    Some((value, dtype))
}

/// Remembers `obj`'s type for [`builtin_scalar`] when it is numpy's own scalar type of `dtype`
/// (`obj.dtype.type is type(obj)`, defined by numpy), not a subclass or another library's.
pub fn learn_scalar(obj: &Bound<'_, PyAny>, dtype: DType) {
    let py = obj.py();
    let ty = obj.get_type();
    let canonical = obj
        .getattr(pyo3::intern!(py, "dtype"))
        .and_then(|d| d.getattr(pyo3::intern!(py, "type")))
        .is_ok_and(|t| t.is(&ty));
    let numpys = ty
        .module()
        .is_ok_and(|m| m.to_str().is_ok_and(|m| m == "numpy"));
    if !(canonical && numpys) {
        return;
    }
    let mut types = crate::lock(&SCALAR_TYPES);
    if types.len() < 32 && !types.iter().any(|(t, _)| t.is(&ty)) {
        types.push((ty.unbind(), dtype));
    }
}
