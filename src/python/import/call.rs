//! The producers' methods cubridge calls on every import: `obj.__dlpack__(max_version=...,
//! stream=...)` on a producer without a usable exchange table (CuPy, JAX, Numba), and torch's
//! `is_neg()` on every tensor. In the limited API of Python 3.11 through a bound method (and a
//! keyword dict); with the `vectorcall` feature (for a build whose wheel needs Python 3.12,
//! whose limited API has it) through `PyObject_VectorcallMethod`, which makes neither: about
//! 1,600 fewer instructions a `__dlpack__` call, measured on CPython 3.12.

use crate::phases::producer;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;

/// The `max_version` cubridge passes to `__dlpack__`: the newest DLPack it reads.
pub(super) const MAX_VERSION_ASKED: [u32; 2] = [1, 3];

/// [`MAX_VERSION_ASKED`] as a tuple, made once.
fn max_version(py: Python<'_>) -> PyResult<&Bound<'_, PyTuple>> {
    static MAX_VERSION: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    let version = MAX_VERSION.get_or_try_init(py, || {
        PyTuple::new(py, MAX_VERSION_ASKED).map(Bound::unbind)
    })?;
    Ok(version.bind(py))
}

/// `obj.name()`.
#[cfg(not(feature = "vectorcall"))]
pub(super) fn call_method0<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, pyo3::types::PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    obj.call_method0(name)
}

/// `obj.name()`.
#[cfg(feature = "vectorcall")]
pub(super) fn call_method0<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, pyo3::types::PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    let args = [obj.as_ptr()];
    // SAFETY: `args` holds `obj`, the one positional argument; the GIL is held. The result is
    // a new reference, or NULL with an exception set.
    unsafe {
        let ret = PyObject_VectorcallMethod(name.as_ptr(), args.as_ptr(), 1, std::ptr::null_mut());
        Bound::from_owned_ptr_or_err(obj.py(), ret)
    }
}

/// `obj.__dlpack__()` with `max_version` when `versioned` and `stream` when given.
#[cfg(not(feature = "vectorcall"))]
pub(super) fn call_dlpack<'py>(
    obj: &Bound<'py, PyAny>,
    versioned: bool,
    stream: Option<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let kwargs = pyo3::types::PyDict::new(py);
    if versioned {
        kwargs.set_item(pyo3::intern!(py, "max_version"), max_version(py)?)?;
    }
    if let Some(stream) = stream {
        kwargs.set_item(pyo3::intern!(py, "stream"), stream)?;
    }
    producer!(
        ProducerExport,
        obj.call_method(pyo3::intern!(py, "__dlpack__"), (), Some(&kwargs))
    )
}

#[cfg(feature = "vectorcall")]
extern "C" {
    /// CPython's (public since 3.9, in the limited API from 3.12).
    fn PyObject_VectorcallMethod(
        name: *mut pyo3::ffi::PyObject,
        args: *const *mut pyo3::ffi::PyObject,
        nargsf: usize,
        kwnames: *mut pyo3::ffi::PyObject,
    ) -> *mut pyo3::ffi::PyObject;
}

/// `obj.__dlpack__()` with `max_version` when `versioned` and `stream` when given.
#[cfg(feature = "vectorcall")]
pub(super) fn call_dlpack<'py>(
    obj: &Bound<'py, PyAny>,
    versioned: bool,
    stream: Option<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let stream = stream.map(|s| s.into_pyobject(py)).transpose()?;
    let mut args = [obj.as_ptr(), std::ptr::null_mut(), std::ptr::null_mut()];
    let mut given = 1;
    if versioned {
        args[given] = max_version(py)?.as_ptr();
        given += 1;
    }
    if let Some(s) = &stream {
        args[given] = s.as_ptr();
    }
    let names = keyword_names(py, versioned, stream.is_some())?;
    let names = names.map_or(std::ptr::null_mut(), |n| n.as_ptr());
    let name = pyo3::intern!(py, "__dlpack__");
    // SAFETY: `args` holds `obj` (one positional argument) and then one live value per keyword
    // name in `names`; the GIL is held. The result is a new reference, or NULL with an
    // exception set.
    unsafe {
        let ret = producer!(
            ProducerExport,
            PyObject_VectorcallMethod(name.as_ptr(), args.as_ptr(), 1, names)
        );
        Bound::from_owned_ptr_or_err(py, ret)
    }
}

/// The keyword names of [`call_dlpack`]'s call, interned, as tuples made once.
#[cfg(feature = "vectorcall")]
fn keyword_names(
    py: Python<'_>,
    versioned: bool,
    stream: bool,
) -> PyResult<Option<&Bound<'_, PyTuple>>> {
    static NAMES: [PyOnceLock<Py<PyTuple>>; 3] =
        [PyOnceLock::new(), PyOnceLock::new(), PyOnceLock::new()];
    let (k, names): (usize, &[&str]) = match (versioned, stream) {
        (true, true) => (0, &["max_version", "stream"]),
        (true, false) => (1, &["max_version"]),
        (false, true) => (2, &["stream"]),
        (false, false) => return Ok(None),
    };
    let tuple = NAMES[k].get_or_try_init(py, || {
        let interned = names.iter().map(|n| pyo3::types::PyString::intern(py, n));
        PyTuple::new(py, interned).map(Bound::unbind)
    })?;
    Ok(Some(tuple.bind(py)))
}
