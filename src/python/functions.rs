//! Module-level functions: creation, import, `add`, and `cubridge.cuda` queries.

use super::array::PyArray;
use super::import::{default_dtype, finish, from_sequence, import, python_scalar};
use super::types::{parse_device, parse_dtype};
use crate::array::Array;
use crate::dtype::DType;
use crate::error::Error;
use crate::ops;
use pyo3::prelude::*;

fn parse_shape(shape: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let dims: Vec<i64> = match shape.extract::<i64>() {
        Ok(n) => vec![n],
        Err(_) => shape.extract().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err("shape must be an int or a sequence of ints")
        })?,
    };
    dims.iter()
        .map(|&d| usize::try_from(d).map_err(|_| Error::invalid(format!("negative dimension {d}"))))
        .collect::<Result<_, _>>()
        .map_err(Into::into)
}

fn dtype_or(dtype: Option<&Bound<'_, PyAny>>, default: DType) -> PyResult<DType> {
    dtype
        .filter(|d| !d.is_none())
        .map_or(Ok(default), parse_dtype)
}

/// A new array with unspecified contents.
#[pyfunction]
#[pyo3(signature = (shape, *, dtype=None, device=None))]
pub fn empty(
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArray> {
    let a = Array::empty(
        &parse_shape(shape)?,
        dtype_or(dtype, DType::Float32)?,
        parse_device(device)?,
    )?;
    Ok(PyArray::new(a))
}

/// A new array of zeros.
#[pyfunction]
#[pyo3(signature = (shape, *, dtype=None, device=None))]
pub fn zeros(
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArray> {
    let a = Array::zeros(
        &parse_shape(shape)?,
        dtype_or(dtype, DType::Float32)?,
        parse_device(device)?,
    )?;
    Ok(PyArray::new(a))
}

/// A new array with every element `fill_value`.
#[pyfunction]
#[pyo3(signature = (shape, fill_value, *, dtype=None, device=None))]
pub fn full(
    shape: &Bound<'_, PyAny>,
    fill_value: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArray> {
    let value = python_scalar(fill_value)?.ok_or_else(|| {
        pyo3::exceptions::PyTypeError::new_err("fill_value must be a bool, int, float or complex")
    })?;
    let a = ops::full(
        &parse_shape(shape)?,
        value,
        dtype_or(dtype, DType::Float32)?,
        parse_device(device)?,
    )?;
    Ok(PyArray::new(a))
}

/// `arange(stop)` or `arange(start, stop, step)`: evenly spaced values in `[start, stop)`.
#[pyfunction]
#[pyo3(signature = (start, /, stop=None, step=1.0, *, dtype=None, device=None))]
pub fn arange(
    start: f64,
    stop: Option<f64>,
    step: f64,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArray> {
    let (start, stop) = match stop {
        Some(stop) => (start, stop),
        None => (0.0, start),
    };
    let a = ops::arange(
        start,
        stop,
        step,
        dtype_or(dtype, DType::Float32)?,
        parse_device(device)?,
    )?;
    Ok(PyArray::new(a))
}

/// A cubridge array over the memory of any DLPack producer, capsule or buffer-protocol object,
/// without copying unless `device` differs or `copy=True`.
#[pyfunction]
#[pyo3(signature = (x, /, *, device=None, copy=None))]
pub fn from_dlpack(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
    copy: Option<bool>,
) -> PyResult<PyArray> {
    let device = device
        .filter(|d| !d.is_none())
        .map(|d| parse_device(Some(d)))
        .transpose()?;
    let imported = import(x)?;
    Ok(PyArray::new(finish(py, imported, None, device, copy)?))
}

/// Like `from_dlpack`, and also takes Python scalars and nested sequences (copied), a `dtype`
/// (a cast copies) and a `device`.
#[pyfunction]
#[pyo3(signature = (obj, /, *, dtype=None, device=None, copy=None))]
pub fn asarray(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
    copy: Option<bool>,
) -> PyResult<PyArray> {
    let dtype = dtype
        .filter(|d| !d.is_none())
        .map(parse_dtype)
        .transpose()?;
    let device = device
        .filter(|d| !d.is_none())
        .map(|d| parse_device(Some(d)))
        .transpose()?;
    if let Some(array) = from_sequence(obj, dtype, device.unwrap_or(crate::Device::Cpu))? {
        if copy == Some(false) {
            return Err(Error::invalid("copy=False, but a Python sequence must be copied").into());
        }
        return Ok(PyArray::new(array));
    }
    let imported = import(obj)?;
    Ok(PyArray::new(finish(py, imported, dtype, device, copy)?))
}

/// An operand of `add`: an array (zero-copy), or a Python scalar that takes the other operand's
/// dtype where its kind allows (the Array API's rule).
fn operand(obj: &Bound<'_, PyAny>, other: Option<&Array>) -> PyResult<Array> {
    if let Some(value) = python_scalar(obj)? {
        let dtype = other.map_or(default_dtype(value), |o| o.dtype());
        let device = other.map_or(crate::Device::Cpu, |o| o.device());
        return Ok(ops::full(&[], value, dtype, device)?);
    }
    Ok(import(obj)?.array)
}

/// `a + b` into a new array or into `out`; see the README for the rules.
#[pyfunction]
#[pyo3(signature = (a, b, /, *, out=None, stream=None))]
pub fn add(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    out: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    if stream.is_some_and(|s| !s.is_none()) {
        return Err(
            Error::invalid("stream= orders CUDA work; these arrays are in host memory").into(),
        );
    }
    let out = out.filter(|o| !o.is_none());
    let (x, y) = match (python_scalar(a)?.is_some(), python_scalar(b)?.is_some()) {
        (true, false) => {
            let y = operand(b, None)?;
            (operand(a, Some(&y))?, y)
        }
        _ => {
            let x = operand(a, None)?;
            let y = operand(b, Some(&x))?;
            (x, y)
        }
    };
    let out_array = match out {
        Some(o) => {
            let imported = import(o)?;
            if imported.copied {
                return Err(Error::invalid(
                    "out's producer exported a copy, so writes would not reach it",
                )
                .into());
            }
            Some(imported.array)
        }
        None => None,
    };
    let result = py.detach(|| ops::add(&x, &y, out_array.as_ref()))?;
    match out {
        Some(o) if o.cast::<PyArray>().is_ok() => Ok(o.clone().unbind()),
        _ => Ok(Bound::new(py, PyArray::new(result))?.into_any().unbind()),
    }
}

/// `a + b` for the `+` operator: like [`add`], returning NotImplemented for foreign operands
/// that cubridge cannot read, so Python can try the other side.
pub fn add_operands(a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let py = a.py();
    match add(py, a, b, None, None) {
        Err(e)
            if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py)
                && !e.to_string().contains("not defined for") =>
        {
            Ok(py.NotImplemented())
        }
        other => other,
    }
}

/// Whether a CUDA driver with at least one device is present.
#[pyfunction]
pub fn cuda_is_available() -> bool {
    crate::cuda::is_available()
}

/// Number of CUDA devices (0 without a driver).
#[pyfunction]
pub fn cuda_device_count() -> usize {
    crate::cuda::device_count()
}
