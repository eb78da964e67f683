//! Turning Python objects into arrays: DLPack producers and capsules, the buffer protocol, and
//! (for `asarray`) Python scalars and nested sequences. Foreign memory is viewed, never copied,
//! unless the caller asks for a copy, another dtype or another device.

mod buffer;
pub mod cai;
mod call;
mod dlpack;
pub mod exchange;
pub mod ndarray;
mod values;

use crate::array::Array;
use crate::cuda::stream::Stream;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Error;
use crate::ops;
use crate::python::stream::Use;
use crate::python::types::PyArray;
pub use cai::lent_cai;
pub use dlpack::{current_stream, exchanged, Exchanged};
use dlpack::{forget_type, import_dlpack, type_facts, TypeFacts};
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
pub use values::{
    default_dtype, from_sequence, from_values, infer_dtype, is_sequence, numpy_default,
    python_scalar, typed_numpy_scalar, widest,
};

/// An imported array and whether the producer handed over a copy rather than its own memory.
pub struct Imported {
    pub array: Array,
    pub copied: bool,
}

impl Imported {
    /// The producer's own memory, not a copy.
    pub fn zero_copy(array: Array) -> Imported {
        Imported {
            array,
            copied: false,
        }
    }
}

fn has_dlpack(obj: &Bound<'_, PyAny>, facts: TypeFacts) -> bool {
    // Producers define `__dlpack__` on their type (answered from the per-type cache, without
    // making a bound method); an instance attribute of that name is looked up as well.
    facts.dlpack || has_attr_dlpack(obj)
}

fn has_attr_dlpack(obj: &Bound<'_, PyAny>) -> bool {
    obj.hasattr(pyo3::intern!(obj.py(), "__dlpack__"))
        .unwrap_or(false)
}

fn is_capsule(obj: &Bound<'_, PyAny>) -> bool {
    obj.cast::<pyo3::types::PyCapsule>().is_ok()
}

/// Imports `obj` without copying: a cubridge array as is, a DLPack producer or capsule, a CUDA
/// array interface, or a buffer-protocol object. CUDA producers order their pending work before
/// `consumer` (a DLPack-numbered stream); a view kept for later records an event there (see
/// [`Use`]). The memory of a tensor that requires grad, or of a JAX array, is imported
/// read-only ([`write_refusal`]). Errors with TypeError for anything else, numpy scalars of
/// dtypes cubridge has not (datetime64, bytes_, ...) among them.
pub fn import(obj: &Bound<'_, PyAny>, consumer: Stream, use_: Use) -> PyResult<Imported> {
    if let Some(a) = cubridge_array(obj) {
        return Ok(Imported::zero_copy(a.get().inner.clone()));
    }
    if is_numpy_ndarray(obj) {
        if let Some(array) = ndarray::import(obj) {
            return Ok(Imported::zero_copy(array));
        }
        return import_any(obj, type_facts(obj), consumer, use_);
    }
    let facts = type_facts(obj);
    if facts.numpy_scalar {
        numpy_scalar_dtype(obj)?;
    }
    if use_ == Use::Kept {
        if let Some((imported, _)) = kept_exchanged(obj)? {
            return Ok(imported);
        }
    }
    let mut imported = import_any(obj, facts, consumer, use_)?;
    if forbids_writes(obj, facts) {
        imported.array = imported.array.with_readonly(true);
    }
    Ok(imported)
}

/// `obj` through its producer's exchange table for a view kept for later, where the table
/// serves: the memory recorded as written on the producer's current work stream (no ordering
/// call at import, and no event at all on the legacy default stream until a consumer on
/// another stream asks for one), with that stream.
fn kept_exchanged(obj: &Bound<'_, PyAny>) -> PyResult<Option<(Imported, Option<Stream>)>> {
    let Some(Exchanged { imported, stream }) = exchanged(obj, Use::Kept, &mut Default::default())
    else {
        return Ok(None);
    };
    let array = match stream {
        Some(s) => imported.array.written_on(s)?,
        None => imported.array,
    };
    let copied = imported.copied;
    Ok(Some((Imported { array, copied }, stream)))
}

/// `obj` as a kernel's argument that the caller keeps, imported by this copy of cubridge, with
/// the producer's current work stream where it names one (the DLPack exchange table hands over
/// its stream instead of ordering: an event there stands for the producer's pending work).
pub fn kept(obj: &Bound<'_, PyAny>) -> PyResult<(Array, Option<Stream>)> {
    if let Some((imported, stream)) = kept_exchanged(obj)? {
        return Ok((imported.array, stream));
    }
    Ok((
        import(obj, crate::cuda::stream::LEGACY, Use::Kept)?.array,
        None,
    ))
}

/// Whether cubridge must not write `obj`'s memory: a tensor that requires grad (a write would
/// hide from autograd), or a JAX array (immutable: other arrays may share its buffer).
fn forbids_writes(obj: &Bound<'_, PyAny>, facts: TypeFacts) -> bool {
    facts.immutable || (facts.grad && requires_grad(obj))
}

fn requires_grad(obj: &Bound<'_, PyAny>) -> bool {
    let asked = crate::phases::producer!(
        ProducerQuery,
        obj.getattr(pyo3::intern!(obj.py(), "requires_grad"))
    );
    asked.and_then(|r| r.is_truthy()).unwrap_or(false)
}

/// Why a kernel may not write `obj` in place, if it may not: BufferError for a tensor that
/// requires grad (as torch's own `__dlpack__` refuses it), ValueError for a JAX array.
/// `what` names the operand.
pub fn write_refusal(obj: &Bound<'_, PyAny>, what: &str) -> Option<PyErr> {
    if cubridge_array(obj).is_some() || is_numpy_ndarray(obj) {
        return None;
    }
    let facts = type_facts(obj);
    if facts.immutable {
        return Some(
            Error::invalid(format!(
                "{what} is a JAX array, which is immutable (other arrays may share its memory): \
             cubridge does not write into it; leave out out= and use the result"
            ))
            .into(),
        );
    }
    (facts.grad && requires_grad(obj)).then(|| {
        PyErr::from(Error::export(format!(
            "{what} requires grad: writing it in place would hide the write from autograd; \
             pass .detach() or a tensor that does not require grad"
        )))
    })
}

/// The dtype of a numpy scalar, read from its typestr (`'<f4'`: numpy computes `dtype.name` in
/// Python, `dtype.str` in C), or TypeError for a dtype cubridge does not have (its bytes would
/// otherwise come in through the buffer protocol as uint8).
fn numpy_scalar_dtype(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    let dtype = obj.getattr(pyo3::intern!(obj.py(), "dtype"))?;
    let typestr = dtype.getattr(pyo3::intern!(obj.py(), "str"))?;
    DType::from_typestr(typestr.extract::<&str>()?).map_err(|_| {
        let shown = dtype.str().map_or_else(|_| "?".into(), |s| s.to_string());
        PyErr::from(Error::wrong_type(format!(
            "unsupported dtype: cubridge cannot read a numpy {} scalar (dtype {shown})",
            type_name(obj)
        )))
    })
}

/// [`import`] without the read-only rule, `facts` being those of `obj`'s type. numpy's own
/// arrays (host memory, never a copy) are read from numpy's array object ([`ndarray::import`])
/// before this, else through the buffer protocol here: either costs a fraction of its
/// `__dlpack__` (a capsule, a managed tensor and a deleter per call). Whatever neither describes
/// (byte-swapped or structured dtypes) takes the DLPack path, with its own answer.
fn import_any(
    obj: &Bound<'_, PyAny>,
    facts: TypeFacts,
    consumer: Stream,
    use_: Use,
) -> PyResult<Imported> {
    if is_numpy_ndarray(obj) {
        if let Ok(Some(array)) = buffer::import(obj) {
            return Ok(Imported::zero_copy(array));
        }
    }
    let capsule = is_capsule(obj);
    if capsule || has_dlpack(obj, facts) {
        return match import_dlpack(obj, facts, consumer, use_) {
            Ok(imported) => Ok(imported),
            // A type that no longer has the `__dlpack__` it had when its facts were learned
            // (removed from the class): its facts are learned again, and the other
            // protocols answer.
            Err(e)
                if !capsule
                    && e.is_instance_of::<PyAttributeError>(obj.py())
                    && !has_attr_dlpack(obj) =>
            {
                forget_type(obj);
                import_other(obj, consumer, use_)
            }
            Err(e)
                if !capsule
                    && (e.is_instance_of::<PyBufferError>(obj.py())
                        || e.is_instance_of::<PyValueError>(obj.py())) =>
            {
                after_refused_dlpack(obj, consumer, use_, e)
            }
            Err(e) => Err(e),
        };
    }
    import_other(obj, consumer, use_)
}

/// `obj` through the CUDA array interface or the buffer protocol, or TypeError.
fn import_other(obj: &Bound<'_, PyAny>, consumer: Stream, use_: Use) -> PyResult<Imported> {
    if let Some(array) = cai::import(obj, consumer, use_)? {
        return Ok(Imported::zero_copy(array));
    }
    if let Some(array) = buffer::import(obj)? {
        return Ok(Imported::zero_copy(array));
    }
    Err(Error::wrong_type(format!(
        "cubridge cannot read a {}: it needs __dlpack__, a DLPack capsule, \
         __cuda_array_interface__ or the buffer protocol",
        obj.get_type().name()?
    ))
    .into())
}

/// A producer whose DLPack export failed or was malformed (`refusal`: BufferError, for example a
/// read-only numpy array under the legacy ABI; ValueError, a descriptor cubridge rejects, such as
/// CuPy's negative strides, which it mangles in DLPack) may describe the same memory correctly
/// through the CUDA array interface or the buffer protocol. Those are tried; if neither serves,
/// the DLPack error stands (a producer's BufferError reaches the caller, as the DLPack standard
/// asks: torch's for a quantized tensor), unless the array is numpy's, whose dtype cubridge
/// reads itself, or a malformed descriptor's, and its dtype is one cubridge cannot read (numpy's
/// big-endian, structured, object, string and datetime arrays): that is a TypeError, as for any
/// unsupported dtype.
fn after_refused_dlpack(
    obj: &Bound<'_, PyAny>,
    consumer: Stream,
    use_: Use,
    refusal: PyErr,
) -> PyResult<Imported> {
    if let Ok(Some(array)) = cai::import(obj, consumer, use_) {
        return Ok(Imported::zero_copy(array));
    }
    match buffer::import(obj) {
        Ok(Some(array)) => return Ok(Imported::zero_copy(array)),
        Err(unreadable) if unreadable.is_instance_of::<PyTypeError>(obj.py()) => {
            return Err(unreadable)
        }
        _ => {}
    }
    let producers = refusal.is_instance_of::<PyBufferError>(obj.py()) && !is_numpy_ndarray(obj);
    let unsupported = || (!producers).then(|| unsupported_dtype(obj)).flatten();
    Err(unsupported()
        .or_else(|| not_a_capsule(obj))
        .unwrap_or(refusal))
}

/// `obj` as a cubridge array if it is exactly one (not a subclass): one comparison of type
/// pointers (every operand of every call asks; pyo3's own check looks the type up each time).
pub fn cubridge_array<'a, 'py>(obj: &'a Bound<'py, PyAny>) -> Option<&'a Bound<'py, PyArray>> {
    use pyo3::PyTypeInfo;
    use std::sync::atomic::{AtomicPtr, Ordering};
    // The type lives as long as this module: pyo3 keeps it for the process.
    static ARRAY: AtomicPtr<pyo3::ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());
    let mut known = ARRAY.load(Ordering::Relaxed);
    if known.is_null() {
        known = PyArray::type_object_raw(obj.py());
        ARRAY.store(known, Ordering::Relaxed);
    }
    // SAFETY: `obj` is a live object; its type pointer is read, not dereferenced.
    let exact = unsafe { pyo3::ffi::Py_TYPE(obj.as_ptr()) } == known;
    // SAFETY: `obj`'s type is exactly cubridge's array type.
    exact.then(|| unsafe { obj.cast_unchecked::<PyArray>() })
}

/// Whether `obj` is exactly a `numpy.ndarray` (not a subclass, which may export otherwise):
/// one comparison of type pointers once numpy's array type has been met (every operand of
/// every call asks), the per-type facts until then.
pub fn is_numpy_ndarray(obj: &Bound<'_, PyAny>) -> bool {
    use std::sync::atomic::{AtomicPtr, Ordering};
    static NDARRAY: AtomicPtr<pyo3::ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());
    // SAFETY: `obj` is a live object; its type pointer is read, not dereferenced.
    let ty = unsafe { pyo3::ffi::Py_TYPE(obj.as_ptr()) };
    let known = NDARRAY.load(Ordering::Relaxed);
    if !known.is_null() {
        return ty == known;
    }
    if !type_facts(obj).ndarray {
        return false;
    }
    // The strong reference taken here is never given back: numpy's array type then lives as
    // long as the process, so its address never names another type.
    NDARRAY.store(obj.get_type().into_ptr().cast(), Ordering::Relaxed);
    true
}

/// Whether `obj` offers one of the ways cubridge reads an operand: a cubridge array, a Python
/// or numpy scalar, a sequence (for `asarray`), a DLPack producer or capsule, the CUDA array
/// interface, or the buffer protocol. What does not is refused by [`import`] with TypeError.
pub fn readable(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = obj.py();
    Ok(cubridge_array(obj).is_some()
        || python_scalar(obj)?.is_some()
        || is_capsule(obj)
        || has_dlpack(obj, type_facts(obj))
        || obj.hasattr(pyo3::intern!(py, "__cuda_array_interface__"))?
        // SAFETY: PyObject_CheckBuffer only reads the object's type slots.
        || unsafe { pyo3::ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 1)
}

/// The name of `obj`'s type, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string())
}

/// TypeError when `obj.__dlpack__()` returns something that is not a capsule at all (asked
/// again only on this error path, where dlpark's refusal does not tell it from a capsule of
/// an unknown name; a capsule got here is released by its destructor).
fn not_a_capsule(obj: &Bound<'_, PyAny>) -> Option<PyErr> {
    let returned = obj
        .call_method0(pyo3::intern!(obj.py(), "__dlpack__"))
        .ok()?;
    (!is_capsule(&returned)).then(|| no_capsule(&returned))
}

/// The TypeError for a `__dlpack__` that returned `returned`, which is no capsule.
fn no_capsule(returned: &Bound<'_, PyAny>) -> PyErr {
    PyErr::from(Error::wrong_type(format!(
        "__dlpack__ returned a {}, not a DLPack capsule",
        type_name(returned)
    )))
}

/// TypeError naming `obj`'s dtype when it has one that cubridge has no dtype for (its producer
/// refused DLPack for it and no other protocol describes it).
fn unsupported_dtype(obj: &Bound<'_, PyAny>) -> Option<PyErr> {
    let dtype = obj.getattr(pyo3::intern!(obj.py(), "dtype")).ok()?;
    if crate::python::types::parse_dtype(&dtype).is_ok() {
        return None;
    }
    let shown = dtype.str().map_or_else(|_| "?".into(), |s| s.to_string());
    Some(
        Error::wrong_type(format!(
            "unsupported dtype: cubridge cannot read a {} of dtype {shown}",
            type_name(obj)
        ))
        .into(),
    )
}

/// Applies the Array API `copy` / `dtype` / `device` rules to an imported array: no copy unless
/// one is needed or asked for; `copy=False` refuses a needed copy.
pub fn finish(
    py: Python<'_>,
    imported: Imported,
    dtype: Option<DType>,
    device: Option<Device>,
    copy: Option<bool>,
) -> PyResult<Array> {
    let Imported { array, copied } = imported;
    let dtype_target = dtype.unwrap_or(array.dtype());
    let device_target = device.unwrap_or(array.device());
    let needs_copy = dtype_target != array.dtype() || device_target != array.device();
    if copy == Some(false) && copied {
        return Err(Error::export(format!(
            "copy=False, but the producer exported a copy of its {} array on {} (the DLPack \
             IS_COPIED flag), not its own memory",
            array.dtype(),
            array.device()
        ))
        .into());
    }
    if copy == Some(false) && needs_copy {
        return Err(Error::invalid(format!(
            "copy=False, but a {} array on {} cannot be seen as {dtype_target} on \
             {device_target} without copying",
            array.dtype(),
            array.device()
        ))
        .into());
    }
    if needs_copy || (copy == Some(true) && !copied) {
        return Ok(py.detach(|| ops::copy(&array, dtype_target, device_target))?);
    }
    Ok(array)
}
