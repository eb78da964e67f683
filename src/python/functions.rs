//! Module-level functions: creation, import, `add`, and `cubridge.cuda` queries.

use super::import::{
    default_dtype, finish, from_sequence, from_values, import, infer_dtype, is_sequence,
    numpy_default, python_scalar, typed_numpy_scalar, widest,
};
use super::operands::{
    lend_arrays,
    Access::{Read, Write},
};
use super::stream::Use;
use super::types::PyArray;
use super::types::{parse_device, parse_optional_device, parse_optional_dtype};
use crate::array::Array;
use crate::cpu::element::Scalar;
use crate::cuda::stream::LEGACY;
use crate::dtype::DType;
use crate::error::Error;
use crate::ops::{self, Arg};
use crate::phases::{phase, phase_at_end, timed_call};
use pyo3::prelude::*;

pub(super) fn parse_shape(shape: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let not_ints = || {
        PyErr::from(Error::wrong_type(
            "shape must be an int or a sequence of ints",
        ))
    };
    // An integer (Python's or numpy's: anything with __index__) that does not fit is too large,
    // not of the wrong type.
    let dim = |d: &Bound<'_, PyAny>| -> PyResult<i64> {
        d.extract::<i64>().or_else(|_| {
            if d.hasattr(pyo3::intern!(d.py(), "__index__"))? {
                Err(Error::Overflow("a dimension of the shape is too large".into()).into())
            } else {
                Err(not_ints())
            }
        })
    };
    // One integer, or a sequence of them (a numpy array of ints is a sequence, though it has
    // __index__ too).
    let dims: Vec<i64> = if let Ok(n) = shape.extract::<i64>() {
        vec![n]
    } else if let Ok(items) = shape.extract::<Vec<Bound<'_, PyAny>>>() {
        items.iter().map(dim).collect::<PyResult<_>>()?
    } else {
        vec![dim(shape)?]
    };
    dims.iter()
        .map(|&d| usize::try_from(d).map_err(|_| Error::invalid(format!("negative dimension {d}"))))
        .collect::<Result<_, _>>()
        .map_err(Into::into)
}

fn dtype_or(dtype: Option<&Bound<'_, PyAny>>, default: DType) -> PyResult<DType> {
    Ok(parse_optional_dtype(dtype)?.unwrap_or(default))
}

/// A new array of `shape` with unspecified contents; `dtype` defaults to float32 and
/// `device` to "cpu" (or "cuda", "cuda:1", "cuda_host", "cuda_managed").
///
/// Raises:
/// - TypeError: `shape` is not an int or a sequence of ints, or `dtype` is not one cubridge has.
/// - ValueError: a negative dimension, or an unknown `device`.
/// - MemoryError: the memory cannot be allocated.
/// - CudaUnavailableError: a CUDA `device` on a machine without CUDA.
///
/// >>> cubridge.empty((2, 3), dtype="int32").shape
/// (2, 3)
#[pyfunction]
#[pyo3(signature = (shape, *, dtype=None, device=None))]
pub fn empty(
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArray> {
    created(Array::empty, shape, dtype, device)
}

/// A new array of `shape` filled with zeros; `dtype` defaults to float32 and `device` to
/// "cpu".
///
/// Raises:
/// - TypeError: `shape` is not an int or a sequence of ints, or `dtype` is not one cubridge has.
/// - ValueError: a negative dimension, or an unknown `device`.
/// - MemoryError: the memory cannot be allocated.
/// - CudaUnavailableError: a CUDA `device` on a machine without CUDA.
///
/// >>> cubridge.zeros(3, dtype="int64").to_numpy()
/// array([0, 0, 0])
#[pyfunction]
#[pyo3(signature = (shape, *, dtype=None, device=None))]
pub fn zeros(
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArray> {
    created(Array::zeros, shape, dtype, device)
}

/// `make(shape, dtype, device)` from the Python arguments (float32 when no dtype is given).
fn created(
    make: fn(&[usize], DType, crate::Device) -> crate::Result<Array>,
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArray> {
    let _restore = crate::cuda::context::Restore::new();
    let (shape, dtype) = (parse_shape(shape)?, dtype_or(dtype, DType::Float32)?);
    Ok(PyArray::new(make(&shape, dtype, parse_device(device)?)?))
}

/// A Python or numpy scalar as a value and the dtype it takes when none is given: a numpy
/// scalar's own, else the Array API's default for the Python kind (bool, int64, float32,
/// complex64; uint64 for an int past int64).
fn creation_value(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<(Scalar, DType)> {
    let (v, dtype) = creation_item(obj, what)?;
    Ok((v, dtype.map_or_else(|| infer_dtype(&[(v, None)]), Ok)?))
}

/// A Python or numpy scalar as a value, and its dtype if it is a numpy scalar.
fn creation_item(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<(Scalar, Option<DType>)> {
    if let Some(v) = python_scalar(obj)? {
        return Ok((v, None));
    }
    if let Some((v, d)) = typed_numpy_scalar(obj)? {
        return Ok((v, Some(d)));
    }
    Err(Error::wrong_type(format!(
        "{what} must be a bool, int, float or complex (Python's or numpy's), not {}",
        super::import::type_name(obj)
    ))
    .into())
}

/// A new array of `shape` with every element `fill_value`. Without a `dtype`, a numpy scalar
/// keeps its own and a Python value takes the default of its kind (bool, int64, float32,
/// complex64).
///
/// Raises:
/// - TypeError: as for `empty`, or `fill_value` is not a bool, int, float or complex, or
///   does not fit `dtype` (1.5 for int32).
/// - ValueError, MemoryError, CudaUnavailableError: as for `empty`.
///
/// >>> cubridge.full((2,), 7).to_numpy()
/// array([7, 7])
#[pyfunction]
#[pyo3(signature = (shape, fill_value, *, dtype=None, device=None))]
pub fn full(
    shape: &Bound<'_, PyAny>,
    fill_value: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArray> {
    let _restore = crate::cuda::context::Restore::new();
    let (value, inferred) = creation_value(fill_value, "fill_value")?;
    let a = ops::full(
        &parse_shape(shape)?,
        value,
        dtype_or(dtype, inferred)?,
        parse_device(device)?,
    )?;
    Ok(PyArray::new(a))
}

/// `arange(stop)` or `arange(start, stop, step)`: evenly spaced values in `[start, stop)`, as
/// numpy makes them. Without a `dtype`, Python ints give int64 and floats float32; numpy
/// scalars promote as in numpy.
///
/// Raises:
/// - TypeError: a bound or step that is not a number, or a `dtype` cubridge has not.
/// - ValueError: `step` is zero, or an unknown `device`.
/// - MemoryError, CudaUnavailableError: as for `empty`.
///
/// >>> cubridge.arange(1, 7, 2).to_numpy()
/// array([1, 3, 5])
#[pyfunction]
#[pyo3(signature = (start, /, stop=None, step=None, *, dtype=None, device=None))]
pub fn arange(
    start: &Bound<'_, PyAny>,
    stop: Option<&Bound<'_, PyAny>>,
    step: Option<&Bound<'_, PyAny>>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArray> {
    let _restore = crate::cuda::context::Restore::new();
    let first = creation_item(start, "arange's start")?;
    let (start, stop) = match stop.filter(|s| !s.is_none()) {
        Some(stop) => (first, creation_item(stop, "arange's stop")?),
        None => ((Scalar::Int(0), None), first),
    };
    let step = match step.filter(|s| !s.is_none()) {
        Some(step) => creation_item(step, "arange's step")?,
        None => (Scalar::Int(1), None),
    };
    let dtype = match parse_optional_dtype(dtype)? {
        Some(d) => d,
        None => arange_dtype(&[start, stop, step]),
    };
    let a = ops::arange(start.0, stop.0, step.0, dtype, parse_device(device)?)?;
    Ok(PyArray::new(a))
}

/// arange's dtype when none is given. With a numpy scalar among its values, numpy's: at least
/// int64, Python values counting as numpy's defaults (`arange(numpy.int8(0),
/// numpy.int16(200))` is int64, `arange(numpy.float32(0), 1.0)` float64). Python values alone
/// make what `asarray` makes of them (int64, uint64 past it, float32 for floats, complex64),
/// or float64 where no integer dtype holds their ints, as numpy's.
fn arange_dtype(values: &[(Scalar, Option<DType>)]) -> DType {
    if values.iter().all(|(_, d)| d.is_none()) {
        return infer_dtype(values).unwrap_or(DType::Float64);
    }
    values
        .iter()
        .map(|&(v, d)| d.unwrap_or_else(|| numpy_default(v)))
        .fold(DType::Int64, DType::result_type)
}

/// A cubridge array over the memory of `x` (a DLPack producer such as a numpy, torch, CuPy or
/// JAX array, a DLPack capsule, a CUDA array interface or buffer-protocol object), without a
/// copy unless `device` differs or `copy=True`. The array keeps `x` alive.
///
/// Raises:
/// - TypeError: `x` offers none of those protocols, or its dtype is not one cubridge has.
/// - BufferError: the producer refuses to export (`copy=False` where a copy is needed).
/// - ValueError: `copy=False` with another `device`, or an unknown `device`.
/// - CudaError, CudaUnavailableError: a CUDA driver call failed, or CUDA is missing.
///
/// >>> import numpy
/// >>> cubridge.from_dlpack(numpy.arange(3.0)).shape
/// (3,)
#[pyfunction]
#[pyo3(signature = (x, /, *, device=None, copy=None))]
pub fn from_dlpack(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
    copy: Option<bool>,
) -> PyResult<PyArray> {
    timed_call!();
    let _restore = crate::cuda::context::Restore::new();
    let device = parse_optional_device(device)?;
    phase!(Import);
    let imported = import(x, LEGACY, Use::Kept)?;
    // (The array's Python object is made by pyo3 after the body, outside the timed call.)
    phase_at_end!(Exit);
    Ok(PyArray::new(finish(py, imported, None, device, copy)?))
}

/// Like `from_dlpack`, and also takes Python scalars and nested sequences (copied) and a
/// `dtype` (a cast copies).
///
/// Raises:
/// - TypeError: `obj` is neither an array nor numbers, or a dtype cubridge has not.
/// - ValueError: `copy=False` where a copy is needed (a sequence, a cast, another device).
/// - BufferError, CudaError, CudaUnavailableError: as for `from_dlpack`.
///
/// >>> cubridge.asarray([[1, 2], [3, 4]], dtype="float64").to_numpy()
/// array([[1., 2.],
///        [3., 4.]])
#[pyfunction]
#[pyo3(signature = (obj, /, *, dtype=None, device=None, copy=None))]
pub fn asarray(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
    copy: Option<bool>,
) -> PyResult<PyArray> {
    let _restore = crate::cuda::context::Restore::new();
    let dtype = parse_optional_dtype(dtype)?;
    let device = parse_optional_device(device)?;
    let target = device.unwrap_or(crate::Device::Cpu);
    if let Some(array) = from_sequence(obj, dtype, target)? {
        return copied_values(array, copy);
    }
    match import(obj, LEGACY, Use::Kept) {
        Ok(imported) => Ok(PyArray::new(finish(py, imported, dtype, device, copy)?)),
        // A sequence that no array protocol describes (a range, a deque) is read by value.
        Err(_) if is_sequence(obj) => copied_values(from_values(obj, dtype, target)?, copy),
        Err(e) => Err(e),
    }
}

/// An array built from Python values, which `copy=False` cannot have.
fn copied_values(array: Array, copy: Option<bool>) -> PyResult<PyArray> {
    if copy == Some(false) {
        return Err(Error::invalid("copy=False, but a Python sequence must be copied").into());
    }
    Ok(PyArray::new(array))
}

/// Largest host add (elements of any operand) that runs without letting the GIL go.
const HOST_GIL_ELEMENTS: usize = 1 << 14;

/// `a + b`, elementwise, into a new array or into `out` (which is returned). `a` and `b` are
/// arrays of any producer or scalars; shapes broadcast and dtypes promote as in the Array API,
/// within a kind only (int8 + int32 is int32; int + float is refused). The kernel runs where the
/// arrays are, on `stream` when given (CUDA arrays only).
///
/// Raises:
/// - TypeError: an operand cubridge cannot read, or dtypes of different kinds.
/// - ValueError: shapes that do not broadcast, arrays on different devices, an `out` of the
///   wrong shape, dtype or read-only, or `stream` with host arrays.
/// - CudaError, CudaUnavailableError: a CUDA driver call failed, or CUDA is missing.
///
/// >>> import numpy
/// >>> cubridge.add(numpy.array([1, 2]), 10).to_numpy()
/// array([11, 12])
#[pyfunction]
#[pyo3(signature = (a, b, /, *, out=None, stream=None))]
pub fn add(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    out: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    timed_call!();
    let _restore = crate::cuda::context::Restore::new();
    let _later = crate::cuda::release::DropLater::new();
    let explicit = super::stream::parse(stream)?;
    let out = out.filter(|o| !o.is_none());
    // Scalars go to the kernel by value; every other operand is imported for the kernel
    // (which also picks its stream: `stream=`, else the first torch operand's current stream).
    let (scalar_a, scalar_b) = (scalar_operand(a)?, scalar_operand(b)?);
    let objs = [
        Some(a).filter(|_| scalar_a.is_none()),
        Some(b).filter(|_| scalar_b.is_none()),
        out,
    ];
    // The objects lent below, held until the arrays lent from them are gone (declared first:
    // dropped last).
    let mut held = [None, None, None];
    let mut arrays: [Option<Array>; 3] = [None, None, None];
    phase!(Import);
    // SAFETY: `held` outlives the arrays: the kernel consumes them, its result is a new array
    // or `out`'s (dropped below, `out` itself returned), and a host array's add runs on the
    // host, within the call (a CUDA device with a host array is refused).
    let (kernel_stream, waits) = unsafe {
        lend_arrays(
            &objs,
            &[Read, Read, Write],
            explicit,
            &mut arrays,
            &mut held,
        )?
    };
    let [array_a, array_b, out_array] = arrays;
    phase!(Bind);
    let (x, y) = add_inputs([array_a, array_b], [scalar_a, scalar_b])?;
    let y_host = match &y {
        Arg::Array(y) => y.device().is_host_accessible(),
        Arg::Value(..) => true,
    };
    if explicit.is_some() && x.device().is_host_accessible() && y_host {
        return Err(
            Error::invalid("stream= orders CUDA work; these arrays are in host memory").into(),
        );
    }
    let device = x.device();
    let small_host = small_host(&x, &y, out_array.as_ref());
    let run = || -> crate::error::Result<Array> {
        phase!(Order);
        // The driver may wait on its own locks here: never with the GIL held.
        for &(producer, d) in &waits {
            if let (crate::Device::Cuda(n), true) = (d, d == device) {
                crate::cuda::stream::order(kernel_stream, producer, n)?;
            }
        }
        phase!(Bind);
        // Once the work is queued, the interpreter is taken back.
        phase_at_end!(Gil if !small_host);
        ops::add::run([Arg::Array(x), y], out_array, Some(kernel_stream))
    };
    // A small loop on host memory runs with the GIL held: letting it go and taking it back
    // costs more than the loop (numpy keeps it for small arrays too). Everything else, CUDA
    // work above all, runs without it.
    phase!(Gil);
    let result = if small_host { run()? } else { py.detach(run)? };
    phase!(Result);
    phase_at_end!(Exit);
    // Like numpy and torch, `out` itself is the result when given.
    Ok(match out {
        Some(o) => o.clone().unbind(),
        None => Bound::new(py, PyArray::new(result))?.into_any().unbind(),
    })
}

/// A scalar operand of add as a value and, for a typed one, its dtype: a Python scalar (no
/// dtype: it takes the other operand's), a numpy scalar or a 0-d numpy array (its own dtype,
/// which promotes as an array's does, as in numpy). `None` for anything else.
fn scalar_operand(obj: &Bound<'_, PyAny>) -> PyResult<Option<(Scalar, Option<DType>)>> {
    if super::import::cubridge_array(obj).is_some() {
        return Ok(None);
    }
    // numpy's arrays first: they are the common operand, and known by one comparison.
    if super::import::is_numpy_ndarray(obj) {
        let value = super::import::ndarray::zero_d_value(obj);
        return Ok(value.map(|(v, d)| (v, Some(d))));
    }
    if let Some(v) = python_scalar(obj)? {
        return Ok(Some((v, None)));
    }
    Ok(typed_numpy_scalar(obj)?.map(|(v, d)| (v, Some(d))))
}

/// add's inputs: the arrays, and a scalar beside an array by value (add commutes, so the array
/// is always the first input); two scalars make a 0-d array on the CPU (of the first typed
/// one's dtype, else of the wider kind of two Python scalars, whichever comes first).
fn add_inputs(
    arrays: [Option<Array>; 2],
    scalars: [Option<(Scalar, Option<DType>)>; 2],
) -> PyResult<(Array, Arg)> {
    Ok(match (arrays, scalars) {
        ([Some(x), Some(y)], _) => (x, Arg::Array(y)),
        ([Some(x), None], [_, Some((v, d))]) | ([None, Some(x)], [Some((v, d)), _]) => {
            (x, Arg::Value(v, d))
        }
        ([None, None], [Some(sa), Some(sb)]) => {
            let ((va, da), (vb, db)) = if sa.1.is_none() && sb.1.is_some() {
                (sb, sa)
            } else {
                (sa, sb)
            };
            let dtype = da.unwrap_or_else(|| widest(default_dtype(va), default_dtype(vb)));
            let x = ops::full(&[], va, dtype, crate::Device::Cpu)?;
            (x, Arg::Value(vb, db))
        }
        _ => return Err(Error::invalid("add takes arrays and scalars").into()),
    })
}

/// Whether add runs on host memory only, with a result of at most [`HOST_GIL_ELEMENTS`] (the
/// broadcast of the inputs; equal shapes, the common case, need no broadcast).
fn small_host(x: &Array, y: &Arg, out: Option<&Array>) -> bool {
    let y = match y {
        Arg::Array(y) => Some(y),
        Arg::Value(..) => None,
    };
    let numel = match y {
        Some(y) if !crate::layout::same_shape(y.shape(), x.shape()) => {
            crate::layout::broadcast_shapes(x.shape(), y.shape())
                .and_then(|s| crate::layout::checked_numel(&s))
                .unwrap_or(usize::MAX)
        }
        _ => x.numel(),
    };
    let operands = [Some(x), y, out];
    numel <= HOST_GIL_ELEMENTS
        && operands
            .iter()
            .flatten()
            .all(|a| a.device().is_host_accessible())
}

/// `a + b` for the `+` operator: like [`add`], returning NotImplemented for a foreign operand
/// that offers none of the ways cubridge reads arrays, so Python can try the other side.
/// (Errors about operands cubridge can read, such as dtypes that do not promote, are raised.)
pub fn add_operands(a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let py = a.py();
    for x in [a, b] {
        if !super::import::readable(x)? {
            return Ok(py.NotImplemented());
        }
    }
    add(py, a, b, None, None)
}

/// An operand that cubridge can read ([`super::import::readable`]). Extracting anything else
/// fails, and pyo3 answers an in-place operator whose operand fails to extract with
/// NotImplemented, so Python tries `+` and the other side, as for `+` itself.
pub struct Readable<'py>(pub Bound<'py, PyAny>);

impl<'a, 'py> FromPyObject<'a, 'py> for Readable<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if super::import::readable(&obj)? {
            return Ok(Readable(obj.to_owned()));
        }
        Err(Error::wrong_type(format!(
            "cubridge cannot read a {}",
            super::import::type_name(&obj)
        ))
        .into())
    }
}

/// `x += y` for a cubridge array `x`: `add(x, y, out=x)`, which writes the memory `x` views in
/// place (as numpy, torch and CuPy do), so the result's dtype must be `x`'s and `x` writable.
pub fn add_in_place(x: &Bound<'_, PyAny>, y: &Readable<'_>) -> PyResult<()> {
    add(x.py(), x, &y.0, Some(x), None)?;
    Ok(())
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

/// Blocks until all work on `device` (default: the current device) is done.
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn cuda_synchronize(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let _restore = crate::cuda::context::Restore::new();
    let n = cuda_device(device)?;
    Ok(py.detach(|| crate::cuda::context::synchronize(n))?)
}

/// Waits for the kernels that still hold foreign buffers and releases those buffers; registered
/// with `atexit`.
#[pyfunction]
pub fn _release_pending(py: Python<'_>) {
    // Deleters may take the GIL themselves; the wait must not hold it.
    py.detach(crate::cuda::release::release_all);
}

/// Adds folders to search for NVRTC (the package passes the pip `nvidia` library folders).
#[pyfunction]
pub fn _add_nvrtc_search_dirs(dirs: Vec<std::path::PathBuf>) {
    crate::cuda::nvrtc::add_search_dirs(dirs);
}

/// The kernels shipped in this build, as (program name, compute capability) pairs.
#[pyfunction]
pub fn cuda_shipped_kernels() -> Vec<(&'static str, u32)> {
    crate::cuda::shipped::list()
}

/// Waits for the kernels compiling in the background (tiled kernels of transposed layouts),
/// without the GIL.
#[pyfunction]
pub fn cuda_wait_for_compiles(py: Python<'_>) {
    py.detach(crate::cuda::background::wait);
}

/// The programs given as source loaded in this process, as (name, device) pairs.
#[pyfunction]
pub fn cuda_loaded_programs() -> Vec<(String, u32)> {
    crate::cuda::kernels::loaded_programs()
}

/// The CUDA device a `device=` argument names (default: the current device), checked to exist.
fn cuda_device(device: Option<&Bound<'_, PyAny>>) -> PyResult<u32> {
    let n = super::types::parse_cuda_device(device)?;
    crate::cuda::require(crate::Device::Cuda(n))?;
    Ok(n)
}

/// Gives back to the driver what the device's memory pool holds unused, after waiting for the
/// device and for cubridge's pending frees.
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn cuda_empty_cache(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let _restore = crate::cuda::context::Restore::new();
    let n = cuda_device(device)?;
    // Buffers released here may run their producers' deleters, which take the GIL.
    Ok(py.detach(|| crate::cuda::memory::empty_cache(n))?)
}

/// cubridge's device memory and the device pool's, as a dict of byte counts.
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn cuda_memory_stats<'py>(
    py: Python<'py>,
    device: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    let _restore = crate::cuda::context::Restore::new();
    let stats = crate::cuda::memory::stats(cuda_device(device)?)?;
    let d = pyo3::types::PyDict::new(py);
    d.set_item("allocated_bytes", stats.allocated)?;
    d.set_item("allocated_bytes_peak", stats.allocated_peak)?;
    d.set_item("allocations", stats.allocations)?;
    d.set_item("reserved_bytes", stats.reserved)?;
    d.set_item("reserved_bytes_peak", stats.reserved_peak)?;
    d.set_item("pool_used_bytes", stats.pool_used)?;
    Ok(d)
}

/// Records that `array`'s memory is read on `stream`, a use that no protocol reported: freeing
/// the memory waits for the work queued on that stream when the memory is let go.
#[pyfunction]
pub fn cuda_record_stream(array: &Bound<'_, PyAny>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
    let array = array.cast::<PyArray>().map_err(|_| {
        PyErr::from(Error::wrong_type(format!(
            "record_stream takes a cubridge.Array, not {}",
            super::import::type_name(array)
        )))
    })?;
    let array = &array.get().inner;
    let crate::Device::Cuda(_) = array.device() else {
        return Err(Error::invalid(format!(
            "record_stream orders CUDA device memory; this array is on {}",
            array.device()
        ))
        .into());
    };
    let stream = super::stream::parse(Some(stream))?
        .ok_or_else(|| Error::invalid("record_stream needs a stream, not None"))?;
    array.record_consumer(stream);
    Ok(())
}

/// Asks PyTorch and CuPy, where loaded, to give their cached device memory back; cubridge calls
/// it before an allocation fails for lack of memory.
pub fn release_other_caches() {
    let _ = Python::try_attach(|py| -> PyResult<()> {
        py.import("cubridge.cuda")?
            .call_method0("_release_other_caches")?;
        Ok(())
    });
}

/// Free and total bytes of device memory on `device` (default: the current device).
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn cuda_mem_info(device: Option<&Bound<'_, PyAny>>) -> PyResult<(usize, usize)> {
    let _restore = crate::cuda::context::Restore::new();
    Ok(crate::cuda::memory::mem_info(cuda_device(device)?)?)
}

/// The phase times of the calls timed on this thread since the last call, which it resets
/// (the `phase-times` feature: a benchmarks' wheel): `{"calls": n, "reading_ns": one clock
/// reading's cost, "phases": [(name, ns, readings), ...]}`.
#[cfg(feature = "phase-times")]
#[pyfunction]
pub fn _phase_times(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let totals = crate::phases::take();
    let dict = pyo3::types::PyDict::new(py);
    dict.set_item("calls", totals.calls)?;
    dict.set_item("reading_ns", totals.reading_ns)?;
    dict.set_item("phases", totals.phases)?;
    Ok(dict)
}
