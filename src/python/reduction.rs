//! `cubridge.ReductionKernel` and the built-in reductions (`sum`, `prod`, `max`, `min`,
//! `argmax`, `argmin`) on arrays of any producer. Conversion only; the engine lives in
//! `ops::reduction`.

use super::kernels::{call_operands, returned, CallOperands};
use super::operands::{lend_arrays, Access};
use super::types::{parse_optional_dtype, PyArray};
use crate::cpu::reduce::Op;
use crate::error::Error;
use crate::ops::reduction::spec::{Code, ReductionSpec};
use crate::ops::reduction::{builtin, Axes, ReductionKernel};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// `axis=`: None (every axis), an int, or a sequence of ints.
fn parse_axis(axis: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<isize>>> {
    let Some(axis) = axis.filter(|a| !a.is_none()) else {
        return Ok(None);
    };
    if let Ok(a) = axis.extract::<isize>() {
        return Ok(Some(vec![a]));
    }
    axis.extract::<Vec<isize>>()
        .map(Some)
        .map_err(|_| Error::wrong_type("axis must be None, an int or a tuple of ints").into())
}

/// `ReductionKernel(in_params, out_params, map_expr, reduce_expr, post_map_expr, identity,
/// name="reduce_kernel", reduce_type=None, reduce_dims=True, preamble="", options=())`: a
/// reduction in CuPy's syntax, run on CUDA arrays of any producer, compiled by NVRTC at its
/// first call for each dtype signature.
///
/// `map_expr` maps each element (of the inputs, and `_J`, its C-order index along the reduced
/// axes) to `reduce_type` (default: the first output's type); `reduce_expr` combines two such
/// values `a` and `b`; `post_map_expr` writes the outputs from the result `a` (several outputs:
/// several statements). Each partial result starts from `identity` (None: value-initialized,
/// and a reduction over no elements is refused, as in CuPy). Beyond CuPy: `raw` inputs are
/// passed whole to the map and post-map, several outputs may be given as `out=` (a tuple), and
/// each malformed part of a declaration is named in the error.
///
/// The result is deterministic: the same input on the same device gives the same bits on every
/// run and stream (a fixed reduction tree, no atomics).
///
/// Raises (construction): ValueError for a declaration it cannot parse, naming the part.
///
/// Calling: `kernel(*inputs, *outputs, out=None, axis=None, keepdims=False, stream=None)`
/// broadcasts the inputs, reduces over `axis` (None: all), allocates the outputs not given, runs
/// on `stream` (default: the producer's current stream, else the legacy default stream) and
/// returns the output, or a tuple of them.
///
/// Raises (call):
/// - TypeError: the wrong number of arguments, or dtypes that fit no type parameter.
/// - ValueError: shapes that do not broadcast, an axis out of range or repeated, arrays on
///   different or non-CUDA devices, an output of the wrong shape or read-only, or a reduction
///   over no elements without an identity.
/// - CompileError: NVRTC rejected the code (the log is in the message).
/// - CudaError, CudaUnavailableError: a CUDA driver call failed, or CUDA is missing.
///
/// >>> l2 = cubridge.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "l2")
/// >>> y = l2(torch.ones(2, 8, device="cuda"), axis=1)  # [2.828..., 2.828...] on cuda:0
#[pyclass(name = "ReductionKernel", module = "cubridge", frozen)]
pub struct PyReductionKernel {
    inner: ReductionKernel,
    access: Vec<Access>,
}

#[pymethods]
impl PyReductionKernel {
    #[new]
    #[pyo3(signature = (in_params, out_params, map_expr, reduce_expr, post_map_expr, identity,
        name="reduce_kernel", reduce_type=None, reduce_dims=true, preamble="", options=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        in_params: &str,
        out_params: &str,
        map_expr: &str,
        reduce_expr: &str,
        post_map_expr: &str,
        identity: Option<&Bound<'_, PyAny>>,
        name: &str,
        reduce_type: Option<&str>,
        reduce_dims: bool,
        preamble: &str,
        options: Option<Vec<String>>,
    ) -> PyResult<Self> {
        let identity = match identity.filter(|i| !i.is_none()) {
            Some(i) => Some(i.str()?.to_string()),
            None => None,
        };
        let code = Code {
            map_expr,
            reduce_expr,
            post_map_expr,
            identity: identity.as_deref(),
            reduce_type,
        };
        let options = options.unwrap_or_default();
        let spec = ReductionSpec::new(
            in_params,
            out_params,
            code,
            name,
            preamble,
            (reduce_dims, options),
        )?;
        let access = (spec.spec.inputs.iter().map(|_| Access::Read))
            .chain(spec.spec.outputs.iter().map(|_| Access::Write))
            .collect();
        Ok(PyReductionKernel {
            inner: ReductionKernel::new(spec),
            access,
        })
    }

    /// The kernel's name.
    #[getter]
    fn name(&self) -> &str {
        &self.inner.spec().spec.name
    }

    /// Runs the reduction: inputs, then optionally the outputs (positionally or as `out=`).
    #[pyo3(signature = (*args, out=None, axis=None, keepdims=false, stream=None))]
    fn __call__(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        out: Option<&Bound<'_, PyAny>>,
        axis: Option<&Bound<'_, PyAny>>,
        keepdims: bool,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let _restore = crate::cuda::context::Restore::new();
        let _later = crate::cuda::release::DropLater::new();
        let spec = &self.inner.spec().spec;
        let axis = parse_axis(axis)?;
        let CallOperands {
            operands,
            inputs,
            outputs,
            outs,
        } = call_operands(spec, args, out, stream, &self.access)?;
        let results = py.detach(|| -> crate::Result<Vec<crate::Array>> {
            operands.order()?;
            let axes = Axes {
                axis: axis.as_deref(),
                keepdims,
            };
            // SAFETY: the expressions are the Python user's CUDA C++, trusted as CuPy trusts a
            // ReductionKernel's: they index raw arrays within their sizes and touch nothing
            // beyond their parameters.
            unsafe { self.inner.call(&inputs, &outputs, axes, operands.stream) }
        })?;
        returned(py, outs, results)
    }
}

/// A built-in reduction of `x` from Python: its arguments converted, the work on `x`'s device.
#[allow(clippy::too_many_arguments)]
fn reduce(
    py: Python<'_>,
    op: Op,
    x: &Bound<'_, PyAny>,
    axis: Option<&Bound<'_, PyAny>>,
    dtype: Option<&Bound<'_, PyAny>>,
    keepdims: bool,
    out: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let _restore = crate::cuda::context::Restore::new();
    let _later = crate::cuda::release::DropLater::new();
    let explicit = super::stream::parse(stream)?;
    let out = out.filter(|o| !o.is_none());
    let axis = parse_axis(axis)?;
    let dtype = parse_optional_dtype(dtype)?;
    // The objects lent below, held until the arrays lent from them are gone (declared first:
    // dropped last).
    let mut held = [None, None];
    let mut arrays: [Option<crate::Array>; 2] = [None, None];
    // SAFETY: `held` outlives the arrays: the result is a new array or `out`'s (`out` itself
    // returned), and a host array's reduction runs on the host, within the call (a CUDA device
    // with a host array is refused).
    let (stream, waits) = unsafe {
        lend_arrays(
            &[Some(x), out],
            &[Access::Read, Access::Write],
            explicit,
            &mut arrays,
            &mut held,
        )?
    };
    let [Some(x_array), out_array] = arrays else {
        return Err(Error::wrong_type("cubridge cannot read the array").into());
    };
    if explicit.is_some() && x_array.device().is_host_accessible() {
        return Err(
            Error::invalid("stream= orders CUDA work; this array is in host memory").into(),
        );
    }
    let result = py.detach(|| -> crate::Result<crate::Array> {
        for &(producer, d) in &waits {
            if let (crate::Device::Cuda(n), true) = (d, d == x_array.device()) {
                crate::cuda::stream::order(stream, producer, n)?;
            }
        }
        let axes = Axes {
            axis: axis.as_deref(),
            keepdims,
        };
        builtin::reduce(op, &x_array, axes, dtype, out_array.as_ref(), Some(stream))
    })?;
    Ok(match out {
        Some(o) => o.clone().unbind(),
        None => Bound::new(py, PyArray::new(result))?.into_any().unbind(),
    })
}

/// `sum(x, /, *, axis=None, dtype=None, keepdims=False, out=None, stream=None)`: the sum of
/// `x`'s elements over `axis` (None: all; an int or a tuple of ints), as numpy sums: bool and
/// signed integers into int64, unsigned ones into uint64 (exact, wrapping), the rest in their
/// own dtype unless `dtype` is given; float16 and bfloat16 accumulate in float32 and round
/// once. Runs where `x` is (on `stream` for CUDA arrays); deterministic.
///
/// Raises:
/// - TypeError: an array cubridge cannot read, or an `axis` that is not ints.
/// - ValueError: an axis out of range or repeated, an `out` of the wrong shape, dtype or
///   read-only, `x` and `out` on different devices, or `stream` with a host array.
/// - CudaError, CudaUnavailableError: a CUDA driver call failed, or CUDA is missing.
///
/// >>> cubridge.sum(numpy.arange(6).reshape(2, 3), axis=1).to_numpy()
/// array([ 3, 12])
#[pyfunction]
#[pyo3(signature = (x, /, *, axis=None, dtype=None, keepdims=false, out=None, stream=None))]
pub fn sum(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    axis: Option<&Bound<'_, PyAny>>,
    dtype: Option<&Bound<'_, PyAny>>,
    keepdims: bool,
    out: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    reduce(py, Op::Sum, x, axis, dtype, keepdims, out, stream)
}

/// `prod(x, /, *, axis=None, dtype=None, keepdims=False, out=None, stream=None)`: the product
/// of `x`'s elements over `axis`, with `sum`'s dtypes.
///
/// Raises:
/// - TypeError: an array cubridge cannot read, or an `axis` that is not ints.
/// - ValueError: an axis out of range or repeated, an `out` of the wrong shape, dtype or
///   read-only, `x` and `out` on different devices, or `stream` with a host array.
/// - CudaError, CudaUnavailableError: a CUDA driver call failed, or CUDA is missing.
///
/// >>> cubridge.prod(numpy.arange(1, 5)).to_numpy()
/// array(24)
#[pyfunction]
#[pyo3(signature = (x, /, *, axis=None, dtype=None, keepdims=false, out=None, stream=None))]
pub fn prod(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    axis: Option<&Bound<'_, PyAny>>,
    dtype: Option<&Bound<'_, PyAny>>,
    keepdims: bool,
    out: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    reduce(py, Op::Prod, x, axis, dtype, keepdims, out, stream)
}

/// `max(x, /, *, axis=None, keepdims=False, out=None, stream=None)`: the largest element over
/// `axis`, in `x`'s dtype; NaN wins, as numpy's.
///
/// Raises:
/// - TypeError: an array cubridge cannot read, or an `axis` that is not ints.
/// - ValueError: an axis out of range or repeated, an `out` of the wrong shape, dtype or
///   read-only, `x` and `out` on different devices, or `stream` with a host array, or no elements to reduce.
/// - CudaError, CudaUnavailableError: a CUDA driver call failed, or CUDA is missing.
///
/// >>> cubridge.max(numpy.array([1.0, 3.0, 2.0])).to_numpy()
/// array(3.)
#[pyfunction]
#[pyo3(signature = (x, /, *, axis=None, keepdims=false, out=None, stream=None))]
pub fn max(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    axis: Option<&Bound<'_, PyAny>>,
    keepdims: bool,
    out: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    reduce(py, Op::Max, x, axis, None, keepdims, out, stream)
}

/// `min(x, /, *, axis=None, keepdims=False, out=None, stream=None)`: the smallest element over
/// `axis`, as `max`.
///
/// Raises:
/// - TypeError: an array cubridge cannot read, or an `axis` that is not ints.
/// - ValueError: an axis out of range or repeated, an `out` of the wrong shape, dtype or
///   read-only, `x` and `out` on different devices, or `stream` with a host array, or no elements to reduce.
/// - CudaError, CudaUnavailableError: a CUDA driver call failed, or CUDA is missing.
///
/// >>> cubridge.min(numpy.array([1.0, 3.0, 2.0])).to_numpy()
/// array(1.)
#[pyfunction]
#[pyo3(signature = (x, /, *, axis=None, keepdims=false, out=None, stream=None))]
pub fn min(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    axis: Option<&Bound<'_, PyAny>>,
    keepdims: bool,
    out: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    reduce(py, Op::Min, x, axis, None, keepdims, out, stream)
}

/// `argmax(x, /, *, axis=None, keepdims=False, out=None, stream=None)`: the int64 index of the
/// first largest element along `axis` (None: of the flattened array, in C order); the first
/// NaN wins, as numpy's.
///
/// Raises:
/// - TypeError: an array cubridge cannot read, or an `axis` that is not ints.
/// - ValueError: a tuple of axes, an axis out of range, an `out` of the wrong shape, dtype or
///   read-only, `x` and `out` on different devices, or `stream` with a host array, or no elements to reduce.
/// - CudaError, CudaUnavailableError: a CUDA driver call failed, or CUDA is missing.
///
/// >>> cubridge.argmax(numpy.array([1.0, 3.0, 3.0])).to_numpy()
/// array(1)
#[pyfunction]
#[pyo3(signature = (x, /, *, axis=None, keepdims=false, out=None, stream=None))]
pub fn argmax(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    axis: Option<&Bound<'_, PyAny>>,
    keepdims: bool,
    out: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    reduce(py, Op::ArgMax, x, axis, None, keepdims, out, stream)
}

/// `argmin(x, /, *, axis=None, keepdims=False, out=None, stream=None)`: the index of the first
/// smallest element, as `argmax`.
///
/// Raises:
/// - TypeError: an array cubridge cannot read, or an `axis` that is not ints.
/// - ValueError: a tuple of axes, an axis out of range, an `out` of the wrong shape, dtype or
///   read-only, `x` and `out` on different devices, or `stream` with a host array, or no elements to reduce.
/// - CudaError, CudaUnavailableError: a CUDA driver call failed, or CUDA is missing.
///
/// >>> cubridge.argmin(numpy.array([1.0, 0.0, 0.0])).to_numpy()
/// array(1)
#[pyfunction]
#[pyo3(signature = (x, /, *, axis=None, keepdims=false, out=None, stream=None))]
pub fn argmin(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    axis: Option<&Bound<'_, PyAny>>,
    keepdims: bool,
    out: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    reduce(py, Op::ArgMin, x, axis, None, keepdims, out, stream)
}
