//! `cubridge.Array`'s methods: the Python face of [`Array`], exporting DLPack capsules and the
//! buffer protocol. The class itself ([`PyArray`]) is defined in `types.rs`, which the modules
//! that import operands depend on; this one depends on them (its `+` is `cubridge.add`).

use super::export::{self, Reader};
use super::types::{PyArray, PyDType, PyDevice};
use crate::array::Array;
use crate::cuda::stream as cs;
use crate::device::Device;
use crate::error::{shape_str, Error};
use crate::export::{to_managed, zero_copy_flags, Route};
use crate::ops;
use dlpark::ffi::{DLDevice, DLManagedTensor, DLManagedTensorVersioned};
use dlpark::python::{export_dlpack, CudaStreamRequest, DlpackExporter, ExportAbi, ExportRequest};
use dlpark::{DlpackFlags, Managed};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::IntoPyObjectExt;
use std::ffi::c_int;

impl PyArray {
    /// The one element as a Python bool, int, float or complex (device memory is copied to the
    /// host, after its pending work).
    fn element(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let _restore = crate::cuda::context::Restore::new();
        let src = &self.inner;
        let host = py.detach(|| ops::copy(src, src.dtype(), Device::Cpu))?;
        // SAFETY: `host` is a fresh contiguous host array of exactly one element of its dtype.
        let value = unsafe { crate::cpu::copy::read_scalar(host.dtype(), host.data_ptr(), 0) };
        use crate::cpu::element::Scalar;
        Ok(match value {
            Scalar::Bool(b) => b.into_py_any(py)?,
            Scalar::Int(i) => i.into_py_any(py)?,
            Scalar::Float(f) => f.into_py_any(py)?,
            // No array element reads as one; this arm only completes the match.
            Scalar::Wide(w) => w.to_f64().into_py_any(py)?,
            Scalar::Complex(re, im) => pyo3::types::PyComplex::from_doubles(py, re, im)
                .into_any()
                .unbind(),
        })
    }

    /// `builtin(value)` for a 0-d array (numpy 2 converts no other).
    fn convert(&self, py: Python<'_>, builtin: &str) -> PyResult<Py<PyAny>> {
        if self.inner.ndim() != 0 {
            return Err(Error::wrong_type(
                "only 0-dimensional arrays can be converted to Python scalars",
            )
            .into());
        }
        let value = self.element(py)?;
        Ok(py
            .import("builtins")?
            .getattr(builtin)?
            .call1((value,))?
            .unbind())
    }
}

/// Lets dlpark drive the zero-copy half of `__dlpack__` (ABI choice, flag and device checks).
struct Exporter<'a>(&'a Array);

impl DlpackExporter for Exporter<'_> {
    fn device(&self) -> DLDevice {
        self.0.device().to_dlpack()
    }

    fn flags(&self) -> DlpackFlags {
        zero_copy_flags(self.0)
    }

    fn prepare_export(&self, _py: Python<'_>, request: &ExportRequest<'_>) -> PyResult<()> {
        hand_over(self.0, request)
    }

    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensor>> {
        Ok(to_managed(self.0, false)?)
    }

    fn export_versioned(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        Ok(to_managed(self.0, false)?)
    }
}

/// A bfloat16 host array as an `ml_dtypes.bfloat16` numpy array of the same memory (its
/// elements as uint16, viewed as bfloat16); TypeError for any other dtype that the buffer
/// protocol cannot describe, and where ml_dtypes is not installed.
fn bfloat16_view<'py>(slf: &Bound<'py, PyArray>) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    let array = &slf.get().inner;
    let refused = |why: &str| {
        PyErr::from(Error::wrong_type(format!(
            "numpy has no {}{why}; torch.from_dlpack(x) reads it without a copy",
            array.dtype()
        )))
    };
    if array.dtype() != crate::DType::BFloat16 {
        return Err(refused(""));
    }
    let bf16 = py
        .import("ml_dtypes")
        .and_then(|m| m.getattr("bfloat16"))
        .map_err(|_| refused(" (install ml_dtypes for numpy arrays of bfloat16)"))?;
    // SAFETY: uint16 has bfloat16's size and alignment, so the same layout addresses the same
    // elements of the same buffer; the read-only flag is kept.
    let bits = unsafe {
        Array::from_parts(
            array.buffer().clone(),
            array.layout().clone(),
            crate::DType::UInt16,
            array.device(),
            array.readonly(),
        )
    };
    let numpy = py.import("numpy")?;
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("copy", false)?;
    let words = numpy.call_method(
        "array",
        (Bound::new(py, PyArray::new(bits))?,),
        Some(&kwargs),
    )?;
    words.call_method1("view", (bf16,))
}

/// `array`'s own memory for `request` (zero-copy).
fn export_in_place(
    py: Python<'_>,
    array: &Array,
    request: ExportRequest<'_>,
) -> PyResult<Py<PyAny>> {
    if request.abi() == ExportAbi::Legacy && array.readonly() {
        // (A copy is the consumer's own and writable: the legacy ABI serves it.)
        return Err(Error::export(
            "this array is read-only and the legacy DLPack ABI cannot say so; \
             ask for max_version=(1, 0) or later, or copy=True",
        )
        .into());
    }
    export_dlpack(&Exporter(array), py, request)
}

/// A copy of `src` on `target` for `request`, flagged IS_COPIED.
fn export_copy(
    py: Python<'_>,
    src: &Array,
    target: Device,
    request: ExportRequest<'_>,
) -> PyResult<Py<PyAny>> {
    if target != Device::Cpu {
        // A device this process cannot reach is the export's refusal, as the spec says.
        crate::cuda::require(target)
            .map_err(|e| PyErr::from(Error::export(format!("cannot export to {target}: {e}"))))?;
    }
    let copied = py.detach(|| ops::copy(src, src.dtype(), target))?;
    // The copy is queued like any write: the consumer's stream waits for it.
    hand_over(&copied, &request)?;
    match request.abi() {
        ExportAbi::Versioned => to_managed::<DLManagedTensorVersioned>(&copied, true)?
            .into_bound_py_any(py)
            .map(Bound::unbind),
        ExportAbi::Legacy => to_managed::<DLManagedTensor>(&copied, true)?
            .into_bound_py_any(py)
            .map(Bound::unbind),
    }
}

/// TypeError for a `__dlpack__` stream that is none of what DLPack passes: None, an int, or
/// (cubridge takes it too) an object with `__cuda_stream__`.
fn check_stream_type(stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let Some(s) = stream.filter(|s| !s.is_none()) else {
        return Ok(());
    };
    if s.is_instance_of::<pyo3::types::PyInt>() || s.hasattr("__cuda_stream__")? {
        return Ok(());
    }
    Err(Error::wrong_type(format!(
        "__dlpack__'s stream must be None, an int or an object with __cuda_stream__, not {}",
        super::import::type_name(s)
    ))
    .into())
}

/// Hands `array` (the exported memory: the array's own, or a copy made for the consumer) over
/// to the consumer of `request`, on the stream it names.
fn hand_over(array: &Array, request: &ExportRequest<'_>) -> PyResult<()> {
    if !matches!(array.device(), Device::Cuda(_) | Device::CudaManaged) {
        return Ok(());
    }
    let reader = match request.cuda_stream()? {
        CudaStreamRequest::Omitted | CudaStreamRequest::LegacyDefault => Reader::On(cs::LEGACY),
        CudaStreamRequest::PerThreadDefault => Reader::On(cs::PER_THREAD),
        CudaStreamRequest::Pointer(p) => Reader::On(cs::Stream::from_handle(p)),
        // The consumer orders its reads itself, on a stream it does not name.
        CudaStreamRequest::NoSync => Reader::Unknown(None),
    };
    Ok(export::hand_over(array, reader)?)
}

#[pymethods]
impl PyArray {
    /// The shape, as a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape())
    }

    /// The strides in elements, as a tuple.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.strides())
    }

    #[getter]
    fn dtype(&self) -> PyDType {
        PyDType(self.inner.dtype())
    }

    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice(self.inner.device())
    }

    #[getter]
    fn ndim(&self) -> usize {
        self.inner.ndim()
    }

    /// Number of elements.
    #[getter]
    fn size(&self) -> usize {
        self.inner.numel()
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    /// Whether the memory's producer forbids writes.
    #[getter]
    fn readonly(&self) -> bool {
        self.inner.readonly()
    }

    /// Address of the first element.
    #[getter]
    fn data_ptr(&self) -> usize {
        self.inner.data_ptr() as usize
    }

    /// Whether the one element is non-zero, as numpy: an array of any other size is ambiguous.
    fn __bool__(&self, py: Python<'_>) -> PyResult<bool> {
        match self.inner.numel() {
            1 => self.element(py)?.bind(py).is_truthy(),
            0 => Err(Error::invalid(
                "the truth value of an empty array is ambiguous; use a.size > 0",
            )
            .into()),
            _ => Err(Error::invalid(
                "the truth value of an array with more than one element is ambiguous",
            )
            .into()),
        }
    }

    /// The value of a 0-d array as a Python float (numpy's rules: complex values refuse).
    fn __float__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.convert(py, "float")
    }

    /// The value of a 0-d array as a Python int (floats truncate, as `int()` does).
    fn __int__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.convert(py, "int")
    }

    /// The value of a 0-d array as a Python complex.
    fn __complex__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.convert(py, "complex")
    }

    fn __len__(&self) -> PyResult<usize> {
        match self.inner.shape().first() {
            Some(&n) => Ok(n),
            None => Err(Error::wrong_type("len() of a 0-d array").into()),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "cubridge.Array(shape={}, dtype={}, device={})",
            shape_str(self.inner.shape()),
            self.inner.dtype(),
            self.inner.device()
        )
    }

    /// The CUDA array interface (version 3) of a device array; AttributeError for host memory.
    #[getter]
    fn __cuda_array_interface__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let _restore = crate::cuda::context::Restore::new();
        export::cuda_array_interface(py, &self.inner)
    }

    /// The stream holding the array's pending CUDA work (1 is the legacy default stream).
    #[getter]
    fn stream(&self) -> usize {
        self.inner.stream().dlpack()
    }

    fn __dlpack_device__(&self) -> (u32, i32) {
        self.inner.device().to_dlpack().into()
    }

    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _restore = crate::cuda::context::Restore::new();
        let own = self.inner.device();
        check_stream_type(stream.as_ref())?;
        if own == Device::Cpu && stream.as_ref().is_some_and(|s| !s.is_none()) {
            // The DLPack protocol has no streams for host memory; numpy refuses them too.
            return Err(Error::export("a CPU array's __dlpack__ takes stream=None only").into());
        }
        let request = ExportRequest::parse(stream.as_ref(), max_version, dl_device, copy)?;
        let target = match request.device() {
            Some(d) => Device::from_dlpack(d).map_err(|e| {
                PyErr::from(Error::export(format!(
                    "cannot export to the requested device: {e}"
                )))
            })?,
            None => own,
        };
        let src = &self.inner;
        match crate::export::route(own, target, copy)? {
            Route::Own => export_in_place(py, src, request),
            // Pinned or managed memory for a CPU consumer, once the device has written it.
            Route::Host => export_in_place(py, &py.detach(|| src.host_view())?, request),
            Route::Copy => export_copy(py, src, target, request),
        }
    }

    /// A view of the same memory with another shape and strides (in elements, any sign), its
    /// first element `offset` elements from this array's first element. The view must stay
    /// within the memory this array's elements span; it keeps the memory alive and shares the
    /// array's pending work and read-only flag.
    #[pyo3(signature = (shape, strides, offset=0))]
    fn as_strided(&self, shape: Vec<i64>, strides: Vec<isize>, offset: isize) -> PyResult<PyArray> {
        let shape = shape
            .iter()
            .map(|&d| {
                usize::try_from(d).map_err(|_| {
                    Error::invalid(format!("shape {shape:?} has a negative dimension"))
                })
            })
            .collect::<Result<Vec<usize>, Error>>()?;
        Ok(PyArray::new(
            self.inner.as_strided(&shape, &strides, offset)?,
        ))
    }

    /// The transpose: the same memory with the dimensions in reverse order.
    #[getter(T)]
    fn transpose(&self) -> PyArray {
        PyArray::new(self.inner.transposed())
    }

    /// A numpy array holding a copy of the data.
    fn to_numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let _restore = crate::cuda::context::Restore::new();
        let py = slf.py();
        let array = &slf.get().inner;
        if array.dtype().buffer_format().is_none() {
            return Err(Error::UnsupportedDType(format!(
                "numpy has no {}; convert with torch.from_dlpack instead",
                array.dtype()
            ))
            .into());
        }
        let source = if array.device().is_host_accessible() {
            slf.clone().into_any()
        } else {
            let host = py.detach(|| ops::copy(array, array.dtype(), Device::Cpu))?;
            Bound::new(py, PyArray::new(host))?.into_any()
        };
        let numpy = py.import("numpy")?;
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("copy", true)?;
        numpy.call_method("array", (source,), Some(&kwargs))
    }

    /// numpy's conversion (`numpy.asarray(x)`), which numpy asks for only where the buffer
    /// protocol cannot serve: device memory is refused with the ways to copy it (numpy reads
    /// host memory only); bfloat16, which numpy has not, becomes an `ml_dtypes.bfloat16` array
    /// of the same memory where ml_dtypes is installed, and is refused otherwise. Every other
    /// host array is its buffer, with numpy's `dtype` and `copy` rules.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let array = &slf.get().inner;
        if !array.device().is_host_accessible() {
            return Err(Error::wrong_type(format!(
                "the array is on {}, and numpy reads host memory only: copy it with x.to_numpy() \
                 or numpy.from_dlpack(x, device='cpu')",
                array.device()
            ))
            .into());
        }
        let numpy = py.import("numpy")?;
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("dtype", dtype)?;
        kwargs.set_item("copy", copy)?;
        let memory = match pyo3::types::PyMemoryView::from(slf.as_any()) {
            Ok(view) => view.into_any(),
            Err(_) => bfloat16_view(slf)?,
        };
        numpy.call_method("array", (memory,), Some(&kwargs))
    }

    /// A copy of the array on `device` (always a new array). Between two GPUs the copy goes
    /// device to device, queued after the array's pending work; the host does not wait.
    fn to_device(&self, py: Python<'_>, device: &Bound<'_, PyAny>) -> PyResult<PyArray> {
        let _restore = crate::cuda::context::Restore::new();
        let device = super::types::parse_device(Some(device))?;
        let src = &self.inner;
        Ok(PyArray::new(
            py.detach(|| ops::copy(src, src.dtype(), device))?,
        ))
    }

    fn __add__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        super::functions::add_operands(slf.as_any(), other)
    }

    fn __radd__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        super::functions::add_operands(other, slf.as_any())
    }

    /// `x += y` writes `x`'s memory in place (`add(x, y, out=x)`).
    fn __iadd__(slf: &Bound<'_, Self>, other: super::functions::Readable<'_>) -> PyResult<()> {
        super::functions::add_in_place(slf.as_any(), &other)
    }

    /// # Safety
    /// Called by CPython with a valid `view` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        // SAFETY: forwarded from CPython's buffer protocol call.
        unsafe { export::buffer::fill(slf.as_any(), &slf.get().inner, view, flags) }
    }

    /// # Safety
    /// Called by CPython with a view that `__getbuffer__` filled.
    unsafe fn __releasebuffer__(&self, view: *mut pyo3::ffi::Py_buffer) {
        // SAFETY: forwarded from CPython; `view` was filled by `export::buffer::fill`.
        unsafe { export::buffer::release(view) }
    }
}

// SAFETY: every managed tensor comes from `to_managed`, which gives it its own reference to the
// array's buffer, released by its deleter exactly once; no borrowed view is published
// (HAS_DLTENSOR_VIEW is false); `current_work_stream` names the legacy default stream (NULL),
// which `managed_tensor_no_sync` orders each CUDA array's pending work before.
unsafe impl dlpark::python::DlpackExchangeProducer for PyArray {
    fn managed_tensor_no_sync(
        &self,
        _py: Python<'_>,
    ) -> PyResult<Managed<DLManagedTensorVersioned>> {
        // cubridge's work stream is the legacy default stream: pending work on any other stream
        // is ordered before it with an event, without blocking the host. The consumer's own
        // stream is not told: the memory's free waits for the device.
        let _restore = crate::cuda::context::Restore::new();
        export::hand_over(&self.inner, Reader::Unknown(Some(cs::LEGACY)))?;
        Ok(to_managed(&self.inner, false)?)
    }

    fn current_work_stream(_py: Python<'_>, _device: DLDevice) -> PyResult<*mut std::ffi::c_void> {
        Ok(std::ptr::null_mut())
    }

    fn allocate(
        prototype: &dlpark::ffi::DLTensor,
    ) -> Result<Managed<DLManagedTensorVersioned>, String> {
        // SAFETY: the allocator contract: the prototype, its shape and its strides (when not
        // NULL) are readable for the duration of the call. dlpark checks them (NULL shape,
        // negative extents, element and byte counts that overflow).
        let view = unsafe { dlpark::tensor::TensorRef::from_raw(prototype) }
            .map_err(|e| format!("the prototype is not a valid DLPack tensor: {e}"))?;
        let shape = view
            .shape()
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("negative extent {d}")))
            .collect::<Result<Vec<_>, _>>()?;
        let dtype = crate::dtype::DType::from_dlpack(prototype.dtype).map_err(|e| e.to_string())?;
        let device = Device::from_dlpack(prototype.device).map_err(|e| e.to_string())?;
        let _restore = crate::cuda::context::Restore::new();
        let array = Array::empty(&shape, dtype, device).map_err(|e| e.to_string())?;
        to_managed(&array, false).map_err(|e| e.to_string())
    }

    fn from_managed_tensor_no_sync(
        py: Python<'_>,
        tensor: Managed<DLManagedTensorVersioned>,
    ) -> PyResult<Py<Self>> {
        let _restore = crate::cuda::context::Restore::new();
        let array = crate::view::from_managed(tensor)?;
        Py::new(py, PyArray::new(array))
    }
}
