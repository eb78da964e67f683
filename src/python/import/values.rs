//! Python values as arrays (for `asarray` and scalar operands): Python and numpy scalars, and
//! nested sequences with their dtype inferred as numpy and the Array API infer it.

use super::numpy_scalar_dtype;
use crate::array::Array;
use crate::cpu::copy::{fill, read_scalar};
use crate::cpu::element::{Scalar, WideInt};
use crate::device::Device;
use crate::dtype::{DType, Kind};
use crate::error::Error;
use crate::ops;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyBytes, PyComplex, PyFloat, PyInt, PyList, PySequence, PyString, PyTuple,
};

/// A Python scalar as a [`Scalar`], or `None` if `obj` is not one.
pub fn python_scalar(obj: &Bound<'_, PyAny>) -> PyResult<Option<Scalar>> {
    // bool is a subclass of int: test it first.
    if obj.is_instance_of::<PyBool>() {
        return Ok(Some(Scalar::Bool(obj.extract()?)));
    }
    if obj.is_instance_of::<PyInt>() {
        // Any int: floating dtypes take large ones; the dtype it meets checks its range
        // (ops::create::check_value_kind).
        return Ok(Some(match crate::python::int_value(obj) {
            Ok(v) => Scalar::Int(v),
            Err(_) => Scalar::Wide(wide_int(obj)?),
        }));
    }
    // Exact types: numpy's float64 and complex128 scalars subclass float and complex, but they
    // carry their own dtype and come in through the buffer protocol instead.
    if obj.is_exact_instance_of::<PyFloat>() {
        return Ok(Some(Scalar::Float(obj.extract()?)));
    }
    if let Ok(c) = obj.cast_exact::<PyComplex>() {
        return Ok(Some(Scalar::Complex(c.real(), c.imag())));
    }
    Ok(None)
}

/// A Python int beyond `i128` as its leading 64 bits (the lowest one sticky) and their shift.
fn wide_int(obj: &Bound<'_, PyAny>) -> PyResult<WideInt> {
    let magnitude = obj.call_method0(pyo3::intern!(obj.py(), "__abs__"))?;
    let bits: u64 = magnitude
        .call_method0(pyo3::intern!(obj.py(), "bit_length"))?
        .extract()?;
    // Past 2^32 bits the value is infinite in every floating dtype anyway.
    let shift = u32::try_from(bits - 64).unwrap_or(u32::MAX);
    let top = magnitude.rshift(shift)?;
    let below = !top.lshift(shift)?.eq(&magnitude)?;
    Ok(WideInt {
        negative: obj.lt(0)?,
        top: top.extract::<u64>()? | u64::from(below),
        shift,
    })
}

/// The dtype a Python scalar takes by default (the Array API's defaults, float32 for floats).
pub fn default_dtype(value: Scalar) -> DType {
    value.default_dtype()
}

/// The wider kind of two default dtypes (bool < int < float < complex).
pub fn widest(a: DType, b: DType) -> DType {
    let rank = |d: DType| match d.kind() {
        Kind::Bool => 0,
        Kind::Int | Kind::UInt => 1,
        Kind::Float => 2,
        Kind::Complex => 3,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

/// One element of a nested sequence: its value, and its dtype when it is a numpy scalar or
/// comes from an array.
type Item = (Scalar, Option<DType>);

/// [`from_values`] of a Python scalar or a list or tuple; `None` for any other object (which
/// may be an array, or a sequence of another type: see [`is_sequence`]).
pub fn from_sequence(
    obj: &Bound<'_, PyAny>,
    dtype: Option<DType>,
    device: Device,
) -> PyResult<Option<Array>> {
    if !(obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>())
        && python_scalar(obj)?.is_none()
    {
        return Ok(None);
    }
    from_values(obj, dtype, device).map(Some)
}

/// Builds a new array from a Python scalar or a nested sequence of scalars and arrays. Without
/// a `dtype`, see [`infer_dtype`]; with one, each value is converted as numpy builds an array
/// ([`crate::ops::create::cast_value`]).
pub fn from_values(
    obj: &Bound<'_, PyAny>,
    dtype: Option<DType>,
    device: Device,
) -> PyResult<Array> {
    let mut shape = Vec::new();
    let mut values = Vec::new();
    flatten(obj, 0, &mut shape, &mut values)?;
    if crate::layout::checked_numel(&shape)? != values.len() {
        return Err(Error::invalid("nested sequences changed while being read").into());
    }
    let dtype = match dtype {
        Some(dtype) => dtype,
        None => infer_dtype(&values)?,
    };
    let host = Array::empty(&shape, dtype, Device::Cpu)?;
    let size = dtype.itemsize();
    for (i, &(v, _)) in values.iter().enumerate() {
        let v = crate::ops::create::cast_value(v, dtype)?;
        // SAFETY: element i of a fresh contiguous host array of values.len() elements.
        unsafe { fill(dtype, host.data_ptr().add(i * size), 1, v) };
    }
    if device == Device::Cpu {
        Ok(host)
    } else {
        Ok(ops::copy(&host, dtype, device)?)
    }
}

/// The dtype of an array of these elements. Python scalars alone take numpy's inference with
/// the Array API's float32 default for floats: the widest kind present; ints beyond int64 make
/// uint64 when none is negative. With numpy scalars among them, numpy's own inference: each
/// numpy scalar keeps its dtype, Python values count as numpy's defaults (int64, float64,
/// complex128), and all meet in [`DType::result_type`] (`[numpy.float64(0.1)]` stays float64).
pub fn infer_dtype(values: &[Item]) -> Result<DType, Error> {
    if values.iter().any(|(_, d)| d.is_some()) {
        let dtype = values
            .iter()
            .map(|&(v, d)| d.unwrap_or_else(|| numpy_default(v)))
            .reduce(DType::result_type);
        return Ok(dtype.unwrap_or(DType::Float64));
    }
    let inferred = values
        .iter()
        .map(|&(v, _)| default_dtype(v))
        .reduce(widest)
        .unwrap_or(DType::Float32);
    let ints = || {
        values.iter().filter_map(|v| match v.0 {
            Scalar::Int(i) => Some(i),
            Scalar::Wide(w) => Some(if w.negative { i128::MIN } else { i128::MAX }),
            _ => None,
        })
    };
    if inferred != DType::Int64 || ints().all(|i| i <= i64::MAX as i128) {
        return Ok(inferred);
    }
    if ints().all(|i| i >= 0) {
        return Ok(DType::UInt64);
    }
    Err(Error::Overflow(
        "no integer dtype holds all of these Python integers (some exceed int64, some are \
         negative); give a dtype"
            .into(),
    ))
}

/// The dtype numpy gives a Python value among numpy values: int64 (uint64 past it), float64,
/// complex128, bool.
pub fn numpy_default(value: Scalar) -> DType {
    match value {
        Scalar::Int(i) if i > i128::from(i64::MAX) => DType::UInt64,
        Scalar::Wide(w) if !w.negative => DType::UInt64,
        Scalar::Float(_) => DType::Float64,
        Scalar::Complex(..) => DType::Complex128,
        other => other.default_dtype(),
    }
}

/// A numpy scalar (`np.float32(2)`, not a 0-d array) as its value and dtype, read through its
/// attributes (cheaper than importing it as an array); `None` for anything else, and for
/// dtypes cubridge does not have.
pub fn typed_numpy_scalar(obj: &Bound<'_, PyAny>) -> PyResult<Option<(Scalar, DType)>> {
    // Whether the type is one of numpy's scalar types is known per type (an operand of every
    // call is asked).
    if !super::type_facts(obj).numpy_scalar {
        return Ok(None);
    }
    if let Some(known) = super::ndarray::builtin_scalar(obj) {
        return Ok(Some(known));
    }
    let value = numpy_value(obj)?;
    if let Some((_, dtype)) = value {
        super::ndarray::learn_scalar(obj, dtype);
    }
    Ok(value)
}

/// A numpy scalar's (or 0-d array's) value and dtype; TypeError for a dtype cubridge has not
/// (a datetime64 is no array of its bytes).
fn numpy_value(obj: &Bound<'_, PyAny>) -> PyResult<Option<(Scalar, DType)>> {
    let dtype = numpy_scalar_dtype(obj)?;
    let value = python_scalar(&obj.call_method0(pyo3::intern!(obj.py(), "item"))?)?;
    Ok(value.map(|v| (v, dtype)))
}

/// `numpy.generic`, once numpy is loaded (without numpy there are no numpy scalars).
pub(super) fn numpy_generic(py: Python<'_>) -> PyResult<Option<&Bound<'_, pyo3::types::PyType>>> {
    static GENERIC: pyo3::sync::PyOnceLock<Py<pyo3::types::PyType>> = pyo3::sync::PyOnceLock::new();
    if let Some(g) = GENERIC.get(py) {
        return Ok(Some(g.bind(py)));
    }
    let loaded = py
        .import("sys")?
        .getattr("modules")?
        .contains(pyo3::intern!(py, "numpy"))?;
    if !loaded {
        return Ok(None);
    }
    let g = py
        .import("numpy")?
        .getattr("generic")?
        .cast_into::<pyo3::types::PyType>()?;
    Ok(Some(GENERIC.get_or_init(py, || g.unbind()).bind(py)))
}

/// A numpy scalar (`np.float64(1.0)`, `np.int8(3)`, a 0-d array) as its value and dtype, for
/// the elements of a nested sequence, which numpy accepts too.
fn numpy_scalar(obj: &Bound<'_, PyAny>) -> PyResult<Option<Item>> {
    let py = obj.py();
    let from_numpy = obj
        .get_type()
        .module()
        .is_ok_and(|m| m.to_str().is_ok_and(|m| m == "numpy"));
    if !from_numpy
        || !obj
            .getattr(pyo3::intern!(py, "ndim"))?
            .extract::<usize>()
            .is_ok_and(|n| n == 0)
    {
        return Ok(None);
    }
    Ok(numpy_value(obj)?.map(|(v, d)| (v, Some(d))))
}

/// Gathers the values of a nested sequence (`shape` grows as new depths are met), checking
/// that its lengths and depths are consistent. Its elements may be scalars, sequences, or
/// arrays of any protocol (whose dimensions continue the sequence's, as numpy reads them).
fn flatten(
    obj: &Bound<'_, PyAny>,
    depth: usize,
    shape: &mut Vec<usize>,
    values: &mut Vec<Item>,
) -> PyResult<()> {
    let scalar = match python_scalar(obj)? {
        Some(v) => Some((v, None)),
        None => numpy_scalar(obj)?,
    };
    if let Some(v) = scalar {
        if depth != shape.len() {
            return Err(Error::invalid("nested sequences have inconsistent depths").into());
        }
        values.push(v);
        return Ok(());
    }
    let listlike = obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>();
    if !listlike && !is_text(obj) && super::readable(obj)? {
        return flatten_array(obj, depth, shape, values);
    }
    if !listlike && !is_sequence(obj) {
        return Err(Error::wrong_type(format!(
            "cannot put a {} into an array",
            obj.get_type().name()?
        ))
        .into());
    }
    // What iteration yields is what counts: a sequence's __len__ may disagree with it.
    let items = obj.try_iter()?.collect::<PyResult<Vec<_>>>()?;
    enter(depth, items.len(), shape, values)?;
    for item in &items {
        flatten(item, depth + 1, shape, values)?;
    }
    Ok(())
}

/// An array among a sequence's elements (a 0-d one is one value): its dimensions continue the
/// sequence's, and its elements keep their dtype, as numpy scalars do.
fn flatten_array(
    obj: &Bound<'_, PyAny>,
    depth: usize,
    shape: &mut Vec<usize>,
    values: &mut Vec<Item>,
) -> PyResult<()> {
    let imported = super::import(obj, crate::cuda::stream::LEGACY, super::Use::Immediate)?;
    let dtype = imported.array.dtype();
    // A contiguous host copy (the copy runs on the stream the import ordered its producer for).
    let host = ops::copy(&imported.array, dtype, Device::Cpu)?;
    for (k, &len) in host.shape().iter().enumerate() {
        enter(depth + k, len, shape, values)?;
    }
    if depth + host.ndim() != shape.len() {
        return Err(Error::invalid("nested sequences have inconsistent depths").into());
    }
    for i in 0..host.numel() {
        // SAFETY: element i of a contiguous host array of `numel` elements of `dtype`.
        let v = unsafe { read_scalar(dtype, host.data_ptr(), i as isize) };
        values.push((v, Some(dtype)));
    }
    Ok(())
}

/// Enters dimension `depth` of length `len`: the first time that depth is met (before any value,
/// else depths are inconsistent) it joins `shape`; later it must have the same length.
fn enter(depth: usize, len: usize, shape: &mut Vec<usize>, values: &[Item]) -> PyResult<()> {
    crate::layout::check_ndim(depth as i64 + 1)?;
    if depth == shape.len() {
        if !values.is_empty() {
            return Err(Error::invalid("nested sequences have inconsistent depths").into());
        }
        shape.push(len);
    } else if shape[depth] != len {
        return Err(Error::invalid(format!(
            "nested sequences have inconsistent lengths at depth {depth}: {} and {len}",
            shape[depth]
        ))
        .into());
    }
    Ok(())
}

/// Whether `asarray` reads `obj` as a sequence of values when no array protocol describes it:
/// any Python sequence (`range`, `collections.deque`, ...) but text.
pub fn is_sequence(obj: &Bound<'_, PyAny>) -> bool {
    !is_text(obj) && obj.cast::<PySequence>().is_ok()
}

/// A str or bytes: a sequence, but of characters, not numbers.
fn is_text(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>()
}
