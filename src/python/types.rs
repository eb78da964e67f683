//! The classes of the Python module: `cubridge.Array` ([`PyArray`], whose methods are in
//! `array.rs`), and `cubridge.dtype` and `cubridge.Device`, small value classes whose `str()` is
//! the canonical name and that compare equal to that name.

use crate::array::Array;
use crate::device::{Device, DeviceSpec};
use crate::dtype::DType;
use crate::error::Error;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyType};

/// An n-dimensional array whose memory cubridge owns, or a zero-copy view of another library's
/// array that keeps that array alive. Made by `empty`, `zeros`, `full`, `arange`, `asarray`,
/// `from_dlpack` and `add`, not by calling the class; other libraries read it through
/// `__dlpack__`, the buffer protocol (host memory) and `__cuda_array_interface__`.
///
/// >>> import numpy
/// >>> a = cubridge.arange(3)
/// >>> numpy.from_dlpack(a)
/// array([0, 1, 2])
#[pyclass(name = "Array", module = "cubridge", frozen)]
pub struct PyArray {
    /// The array.
    pub inner: Array,
}

impl PyArray {
    /// Wraps `inner` for Python.
    pub fn new(inner: Array) -> Self {
        debug_assert!(!inner.buffer().is_lent(), "memory lent for a call returned");
        PyArray { inner }
    }
}

/// `dtype(name)`: an element type, from its canonical name (bool, int8, int16, int32, int64,
/// uint8, uint16, uint32, uint64, float16, bfloat16, float32, float64, complex64, complex128),
/// a numpy dtype or scalar type, or a torch dtype. `str(d)` is the canonical name, and `d`
/// compares equal to it; `cubridge.float32` and the others are instances.
///
/// Raises:
/// - TypeError: a dtype cubridge does not have (the message lists the names it accepts).
///
/// >>> cubridge.dtype("float32") == cubridge.float32 == "float32"
/// True
/// >>> cubridge.int16.itemsize
/// 2
#[pyclass(name = "dtype", module = "cubridge", frozen)]
#[derive(Clone, Copy)]
pub struct PyDType(pub DType);

#[pymethods]
impl PyDType {
    #[new]
    fn new(name: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(PyDType(parse_dtype(name)?))
    }

    /// The canonical name.
    #[getter]
    fn name(&self) -> &'static str {
        self.0.name()
    }

    /// Bytes per element.
    #[getter]
    fn itemsize(&self) -> usize {
        self.0.itemsize()
    }

    fn __str__(&self) -> &'static str {
        self.0.name()
    }

    fn __repr__(&self) -> String {
        format!("cubridge.{}", self.0.name())
    }

    /// Equal to the same dtype named any way: a `cubridge.dtype`, its canonical name, or numpy's
    /// dtype or scalar type of it (`numpy.dtype("float32")`, `numpy.float32`, `numpy.single`).
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        if let Ok(d) = other.cast::<PyDType>() {
            return d.get().0 == self.0;
        }
        if let Ok(s) = other.extract::<&str>() {
            return s == self.0.name();
        }
        numpy_dtype(other).is_some_and(|d| d.is_ok_and(|d| d == self.0))
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        // Equal to the name, so hash like the name (numpy's types hash by identity, and
        // numpy's own dtypes unlike their names: no hash agrees with all of them).
        PyString::new(py, self.0.name()).hash()
    }
}

/// `Device(name)`: a device, from `"cpu"`, `"cuda"` (the current CUDA device), `"cuda:N"`,
/// `"cuda_host"` (pinned host memory) or `"cuda_managed"`, or as torch and CuPy users name one:
/// an int N (`"cuda:N"`), a `torch.device`, a `cupy.cuda.Device`. Every `device=` argument
/// takes the same. `str(d)` is the canonical name (`"cuda:0"`), and `d` compares equal to it.
///
/// Raises:
/// - ValueError: an unknown device name, or a negative int.
/// - TypeError: an object that names no device (the message lists what is accepted).
/// - CudaUnavailableError: `"cuda"` on a machine without CUDA.
///
/// >>> cubridge.Device("cpu") == "cpu"
/// True
/// >>> cubridge.Device(1) == cubridge.Device(torch.device("cuda", 1)) == "cuda:1"
/// True
/// >>> cubridge.zeros(2).device
/// cubridge.Device('cpu')
#[pyclass(name = "Device", module = "cubridge", frozen)]
#[derive(Clone, Copy)]
pub struct PyDevice(pub Device);

#[pymethods]
impl PyDevice {
    #[new]
    fn new(name: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(PyDevice(parse_device(Some(name))?))
    }

    /// `"cpu"`, `"cuda"`, `"cuda_host"` or `"cuda_managed"`.
    #[getter]
    fn r#type(&self) -> &'static str {
        match self.0 {
            Device::Cpu => "cpu",
            Device::Cuda(_) => "cuda",
            Device::CudaHost => "cuda_host",
            Device::CudaManaged => "cuda_managed",
        }
    }

    /// The CUDA device ordinal, or None for host memory.
    #[getter]
    fn index(&self) -> Option<u32> {
        match self.0 {
            Device::Cuda(n) => Some(n),
            _ => None,
        }
    }

    fn __str__(&self) -> String {
        self.0.to_string()
    }

    fn __repr__(&self) -> String {
        format!("cubridge.Device('{}')", self.0)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        if let Ok(d) = other.cast::<PyDevice>() {
            return d.get().0 == self.0;
        }
        other
            .extract::<&str>()
            .is_ok_and(|s| s == self.0.to_string())
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        PyString::new(py, &self.0.to_string()).hash()
    }
}

/// Reads a dtype argument: a `cubridge.dtype`, a canonical name, numpy's dtype or scalar type
/// of any spelling (`dtype('float32')`, `np.float32`, `np.longlong`, `np.intc`, `np.double`),
/// or another library's dtype object whose name is canonical (`torch.float32`).
pub fn parse_dtype(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    if let Ok(d) = obj.cast::<PyDType>() {
        return Ok(d.get().0);
    }
    if let Ok(s) = obj.extract::<String>() {
        return Ok(DType::from_name(&s)?);
    }
    if let Some(d) = numpy_dtype(obj) {
        return d;
    }
    for attr in ["name", "__name__"] {
        if let Ok(name) = obj.getattr(attr).and_then(|n| n.extract::<String>()) {
            if let Ok(d) = DType::from_name(&name) {
                return Ok(d);
            }
        }
    }
    let text = obj.str()?.to_string();
    if let Ok(d) = DType::from_name(text.strip_prefix("torch.").unwrap_or(&text)) {
        return Ok(d);
    }
    Err(DType::unknown(&obj.repr()?.to_string()).into())
}

/// numpy's `dtype` and `generic` types, once numpy is loaded (without numpy there are no
/// numpy dtypes).
fn numpy_types(py: Python<'_>) -> Option<&(Py<PyType>, Py<PyType>)> {
    static TYPES: pyo3::sync::PyOnceLock<(Py<PyType>, Py<PyType>)> = pyo3::sync::PyOnceLock::new();
    if let Some(t) = TYPES.get(py) {
        return Some(t);
    }
    let modules = py.import("sys").and_then(|s| s.getattr("modules")).ok()?;
    let numpy = modules.get_item("numpy").ok()?;
    let get = |name: &str| -> Option<Py<PyType>> {
        Some(
            numpy
                .getattr(name)
                .ok()?
                .cast_into::<PyType>()
                .ok()?
                .unbind(),
        )
    };
    let types = (get("dtype")?, get("generic")?);
    Some(TYPES.get_or_init(py, || types))
}

/// The dtype of a numpy dtype or numpy scalar type, read from numpy's typestr of it (which
/// names the size, whatever the alias: `np.longlong` and `np.int_` are `<i8`); ml_dtypes'
/// bfloat16 by its name. `None` where `obj` is neither; an error for numpy's dtypes that
/// cubridge has not (big-endian, structured, datetime, ...).
fn numpy_dtype(obj: &Bound<'_, PyAny>) -> Option<PyResult<DType>> {
    let py = obj.py();
    let (dtype_type, generic) = numpy_types(py)?;
    let is_dtype = obj.is_instance(dtype_type.bind(py)).ok()?;
    let is_scalar_type = obj
        .cast::<PyType>()
        .is_ok_and(|t| t.is_subclass(generic.bind(py)).unwrap_or(false));
    if !(is_dtype || is_scalar_type) {
        return None;
    }
    let read = || -> PyResult<DType> {
        let dtype = dtype_type.bind(py).call1((obj,))?;
        let typestr = dtype.getattr(pyo3::intern!(py, "str"))?;
        if let Ok(d) = DType::from_typestr(typestr.extract::<&str>()?) {
            return Ok(d);
        }
        let name = dtype.getattr(pyo3::intern!(py, "name"))?;
        let itemsize = dtype.getattr(pyo3::intern!(py, "itemsize"))?;
        if name.extract::<&str>()? == "bfloat16" && itemsize.extract::<usize>()? == 2 {
            return Ok(DType::BFloat16);
        }
        Err(DType::unknown(&dtype.repr()?.to_string()).into())
    };
    Some(read())
}

/// Reads an optional dtype argument: `None` (or an absent one) stays `None`.
pub fn parse_optional_dtype(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<DType>> {
    obj.filter(|d| !d.is_none()).map(parse_dtype).transpose()
}

/// Reads an optional device argument: `None` (or an absent one) stays `None`, for the caller's
/// own default.
pub fn parse_optional_device(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Device>> {
    obj.filter(|d| !d.is_none())
        .map(|d| parse_device(Some(d)))
        .transpose()
}

/// Reads a device argument whose default (None) is cpu: the creation functions', `to_device`'s.
/// See [`device_spec`] for the forms it takes.
pub fn parse_device(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Device> {
    match device_spec(obj)? {
        None => Ok(Device::Cpu),
        Some(spec) => resolve(spec),
    }
}

/// Reads a device argument whose default (None) is the current CUDA device: `cubridge.cuda`'s
/// functions', `Stream`'s and a kernel's `compile`. Host devices are refused.
pub fn parse_cuda_device(obj: Option<&Bound<'_, PyAny>>) -> PyResult<u32> {
    let spec = device_spec(obj)?.unwrap_or(DeviceSpec::CurrentCuda);
    match resolve(spec)? {
        Device::Cuda(n) => Ok(n),
        other => Err(Error::invalid(format!("{other} is not a CUDA device")).into()),
    }
}

fn resolve(spec: DeviceSpec) -> PyResult<Device> {
    match spec {
        DeviceSpec::Exact(d) => Ok(d),
        DeviceSpec::CurrentCuda => Ok(crate::cuda::current_device()?),
    }
}

/// A device as torch and CuPy users name it: a `cubridge.Device`, a name (`"cuda:1"`), an int
/// (CUDA ordinal, as torch reads one), a `torch.device` (any object with a string `type` and an
/// int or None `index`) or a `cupy.cuda.Device` (its `id`). `None` for None.
fn device_spec(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<DeviceSpec>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    if let Ok(d) = obj.cast::<PyDevice>() {
        return Ok(Some(DeviceSpec::Exact(d.get().0)));
    }
    if let Ok(text) = obj.cast::<PyString>() {
        return Ok(Some(Device::parse(text.to_str()?)?));
    }
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(Error::wrong_type(Device::unknown(&obj.repr()?.to_string())).into());
    }
    if let Ok(n) = obj.cast::<pyo3::types::PyInt>() {
        let n = n.extract::<i64>().unwrap_or(i64::MIN);
        return Ok(Some(DeviceSpec::Exact(Device::from_ordinal(n)?)));
    }
    if let Some(spec) = foreign_device(obj)? {
        return Ok(Some(spec));
    }
    // Other objects by their name (a jax GPU device's is "cuda:0").
    match Device::parse(&obj.str()?.to_string()) {
        Ok(spec) => Ok(Some(spec)),
        Err(_) => Err(Error::wrong_type(Device::unknown(&obj.repr()?.to_string())).into()),
    }
}

/// A `torch.device`-like object (`type` and `index`), or CuPy's `Device` (`id`); `None` for
/// anything else.
fn foreign_device(obj: &Bound<'_, PyAny>) -> PyResult<Option<DeviceSpec>> {
    let py = obj.py();
    let kind = obj.getattr_opt(pyo3::intern!(py, "type"))?;
    let index = obj.getattr_opt(pyo3::intern!(py, "index"))?;
    if let (Some(kind), Some(index)) = (kind, index) {
        if let (Ok(kind), Ok(index)) = (kind.extract::<String>(), index.extract::<Option<i64>>()) {
            return Ok(Some(match (kind.as_str(), index) {
                ("cuda", Some(n)) => DeviceSpec::Exact(Device::from_ordinal(n)?),
                // torch.device("cpu", 0) is the CPU; any other type names itself.
                (kind, _) => Device::parse(kind)?,
            }));
        }
    }
    let module = obj.get_type().module()?;
    if module.to_str()?.starts_with("cupy") {
        if let Some(id) = obj.getattr_opt(pyo3::intern!(py, "id"))? {
            return Ok(Some(DeviceSpec::Exact(Device::from_ordinal(
                id.extract()?,
            )?)));
        }
    }
    Ok(None)
}
