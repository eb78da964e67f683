//! `cubridge.RawModule`: a user's CUDA module (source or a precompiled file), its kernels and
//! its variables. Conversion only; the module lives in `ops::module`.

use super::kernels::PyRawKernel;
use super::types::{parse_optional_device, parse_optional_dtype, PyArray};
use crate::error::Error;
use crate::ops::module::RawModule;
use crate::ops::raw::RawKernel;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};
use std::path::PathBuf;
use std::sync::Arc;

/// `RawModule(code=None, path=None, options=(), name_expressions=None)`: a CUDA module, from
/// CUDA C++ `code` (compiled by NVRTC) or a precompiled cubin, PTX or fatbin file at `path`;
/// exactly one of them. It is compiled and loaded at its first `get_function`, `get_global` or
/// `compile()`, once per device; the compiled code is kept in the disk cache, with the lowered
/// names of its `name_expressions`, so a new process with a warm cache compiles nothing.
///
/// `options` are NVRTC's (as RawKernel's: `-rdc=true` links with the device runtime); with
/// `path` they cannot apply and are refused, as are `name_expressions`. `name_expressions`
/// (strings such as `"add<float>"`) name the template instances that `get_function` and
/// `get_global` take: NVRTC instantiates them and reports their mangled names.
///
/// Modules stay loaded for the process, as cubridge's own kernels do; kernels and variables
/// got from a module hold it too.
///
/// Raises (construction):
/// - TypeError: both or neither of `code` and `path`, or `options` or `name_expressions` that
///   are not sequences of strings.
/// - ValueError: options or name expressions with `path`, or a file that cannot be read or is
///   not a cubin, PTX or fatbin.
///
/// >>> src = 'template<typename T> __global__ void inc(T* x) { x[threadIdx.x] += 1; }\n' \
/// ...       'extern "C" __device__ float bias[4];'
/// >>> m = cubridge.RawModule(code=src, name_expressions=["inc<float>"])
/// >>> x = torch.zeros(32, device="cuda")
/// >>> m.get_function("inc<float>")(1, 32, (x,))  # x is now all ones
/// >>> b = torch.from_dlpack(m.get_global("bias")).view(torch.float32)  # 4 floats, zero-copy
/// >>> b.fill_(2.0)  # writes the module's variable
#[pyclass(name = "RawModule", module = "cubridge", frozen)]
pub struct PyRawModule {
    inner: Arc<RawModule>,
}

/// A sequence of strings (`options`, `name_expressions`): a tuple or list of `str`; `what`
/// names it in the error.
fn strings(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Vec<String>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    if !(obj.is_instance_of::<PyTuple>() || obj.is_instance_of::<PyList>()) {
        return Err(Error::wrong_type(format!(
            "{what} must be a tuple or list of strings, not {}",
            super::import::type_name(obj)
        ))
        .into());
    }
    let items: Vec<Bound<'_, PyAny>> = obj.try_iter()?.collect::<PyResult<_>>()?;
    items
        .iter()
        .enumerate()
        .map(|(k, item)| match item.cast::<PyString>() {
            Ok(s) => Ok(s.to_str()?.to_string()),
            Err(_) => Err(Error::wrong_type(format!(
                "{what} entries must be strings; entry {k} is {}",
                super::import::type_name(item)
            ))
            .into()),
        })
        .collect()
}

#[pymethods]
impl PyRawModule {
    #[new]
    #[pyo3(
        signature = (code=None, path=None, options=None, name_expressions=None),
        text_signature = "(code=None, path=None, options=(), name_expressions=None)"
    )]
    fn new(
        code: Option<&str>,
        path: Option<PathBuf>,
        options: Option<&Bound<'_, PyAny>>,
        name_expressions: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let options = strings(options, "options")?;
        let names = strings(name_expressions, "name_expressions")?;
        let inner =
            match (code, path) {
                (Some(code), None) => RawModule::from_source("raw_module", code, options, names)?,
                (None, Some(path)) => RawModule::from_file(&path, &options, &names)?,
                _ => return Err(Error::wrong_type(
                    "RawModule takes exactly one of code= (CUDA C++) and path= (a cubin, PTX or \
                     fatbin file)",
                )
                .into()),
            };
        Ok(PyRawModule {
            inner: Arc::new(inner),
        })
    }

    /// Compiles and loads the module on `device` (default: the current device) now.
    #[pyo3(signature = (device=None))]
    fn compile(&self, py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let _restore = crate::cuda::context::Restore::new();
        let device = parse_optional_device(device)?;
        Ok(py.detach(|| self.inner.compile(device))?)
    }

    /// The kernel `name` as a RawKernel: an `extern "C"` function, one of `name_expressions`,
    /// or a precompiled file's symbol. The module is loaded on the current device first.
    ///
    /// Raises: ValueError for a template instance not in `name_expressions`; CudaError
    /// (CUDA_ERROR_NOT_FOUND) naming a function the module lacks; CompileError,
    /// CudaUnavailableError.
    fn get_function(&self, py: Python<'_>, name: &str) -> PyResult<PyRawKernel> {
        let _restore = crate::cuda::context::Restore::new();
        let module = self.inner.clone();
        let kernel = py.detach(|| RawKernel::in_module(module, name))?;
        Ok(PyRawKernel::from_kernel(kernel))
    }

    /// The `__device__` or `__constant__` variable `name` (or one of `name_expressions`) on
    /// the current device, as a cubridge.Array over its memory, which keeps the module: its
    /// bytes (1-D uint8), or elements of `dtype` (1-D, or `shape`) that fill it exactly. It
    /// exports through DLPack and the CUDA array interface, so torch and CuPy read and write
    /// the variable in place: `torch.from_dlpack(m.get_global("v")).view(torch.float32)`.
    ///
    /// Raises: ValueError for a dtype or shape that does not fill the variable; CudaError
    /// (CUDA_ERROR_NOT_FOUND) naming a variable the module lacks; CompileError,
    /// CudaUnavailableError.
    #[pyo3(signature = (name, dtype=None, shape=None))]
    fn get_global(
        &self,
        py: Python<'_>,
        name: &str,
        dtype: Option<&Bound<'_, PyAny>>,
        shape: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArray> {
        let _restore = crate::cuda::context::Restore::new();
        let dtype = parse_optional_dtype(dtype)?;
        let shape = (shape.filter(|s| !s.is_none()))
            .map(super::functions::parse_shape)
            .transpose()?;
        let array = py.detach(|| (self.inner).global(name, None, dtype, shape.as_deref()))?;
        Ok(PyArray::new(array))
    }
}
