//! Python bindings (the `python` feature). Thin: each function converts its arguments, calls the
//! core, and converts back.
//!
//! For authors of their own pyo3 extensions, this module is also the way in: [`AnyArray`]
//! takes any Python array as a `#[pyfunction]` argument, [`work_stream`] picks the stream a
//! kernel belongs on, [`crate::ops::launch::Launch`] orders and keeps alive what a launch uses,
//! and a [`crate::Array`] returned from a `#[pyfunction]` is a `cubridge.Array` in Python (see `docs/extension.md`, "Writing
//! your own extension" and `examples/extension`).

mod array;
mod errors;
mod export;
mod functions;
mod import;
mod kernels;
mod module;
pub mod operands;
mod pickle;
mod reduction;
mod runtime;
mod stream;
mod types;

pub use operands::{work_stream, AnyArray};
pub use runtime::prepare_extension;

use pyo3::prelude::*;

#[pymodule]
#[pyo3(name = "_cubridge")]
fn cubridge_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<types::PyArray>()?;
    // The DLPack 1.3 C exchange table, so that consumers which read it skip the Python protocol.
    dlpark::python::install_exchange_api::<types::PyArray>(m.py())?;
    m.add_class::<types::PyDType>()?;
    m.add_class::<types::PyDevice>()?;
    errors::register(m)?;
    m.add_function(wrap_pyfunction!(functions::empty, m)?)?;
    m.add_function(wrap_pyfunction!(functions::zeros, m)?)?;
    m.add_function(wrap_pyfunction!(functions::full, m)?)?;
    m.add_function(wrap_pyfunction!(functions::arange, m)?)?;
    m.add_function(wrap_pyfunction!(functions::from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(functions::asarray, m)?)?;
    m.add_function(wrap_pyfunction!(functions::add, m)?)?;
    m.add_function(wrap_pyfunction!(functions::cuda_is_available, m)?)?;
    m.add_function(wrap_pyfunction!(functions::cuda_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(functions::cuda_synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(functions::cuda_mem_info, m)?)?;
    m.add_function(wrap_pyfunction!(functions::cuda_empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(functions::cuda_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(functions::cuda_shipped_kernels, m)?)?;
    m.add_function(wrap_pyfunction!(functions::cuda_loaded_programs, m)?)?;
    m.add_function(wrap_pyfunction!(functions::cuda_wait_for_compiles, m)?)?;
    m.add_function(wrap_pyfunction!(functions::cuda_record_stream, m)?)?;
    m.add_function(wrap_pyfunction!(functions::_add_nvrtc_search_dirs, m)?)?;
    #[cfg(feature = "phase-times")]
    m.add_function(wrap_pyfunction!(functions::_phase_times, m)?)?;
    m.add_class::<stream::PyStream>()?;
    m.add_class::<kernels::PyElementwiseKernel>()?;
    m.add_class::<kernels::PyRawKernel>()?;
    m.add_class::<module::PyRawModule>()?;
    pickle::register(m)?;
    m.add_class::<reduction::PyReductionKernel>()?;
    m.add_function(wrap_pyfunction!(reduction::sum, m)?)?;
    m.add_function(wrap_pyfunction!(reduction::prod, m)?)?;
    m.add_function(wrap_pyfunction!(reduction::max, m)?)?;
    m.add_function(wrap_pyfunction!(reduction::min, m)?)?;
    m.add_function(wrap_pyfunction!(reduction::argmax, m)?)?;
    m.add_function(wrap_pyfunction!(reduction::argmin, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Extension crates built on cubridge hand their work to this module's runtime.
    runtime::publish(m)?;
    crate::cuda::memory::set_out_of_memory_hook(functions::release_other_caches);
    // Buffers that queued kernels hold are released while the interpreter can still run their
    // producers' deleters (see cuda::release).
    let release = wrap_pyfunction!(functions::_release_pending, m)?;
    let atexit = m.py().import("atexit")?;
    atexit.call_method1("register", (release,))?;
    Ok(())
}

/// The value of an int (or of an object with `__index__` that fits 64 bits), read through 64
/// bits where it fits: the limited API converts wider ints through Python calls, thousands of
/// instructions, and the ints of calls (scalars, streams, grids) nearly always fit. An int past
/// `i128` raises OverflowError.
pub fn int_value(obj: &Bound<'_, PyAny>) -> PyResult<i128> {
    match obj.extract::<i64>() {
        Ok(v) => Ok(v.into()),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(obj.py()) => {
            obj.extract::<i128>()
        }
        Err(e) => Err(e),
    }
}

/// A Python object whose memory views hold it (a CUDA array interface's exporter, a tensor lent
/// through the DLPack exchange table). Its reference is dropped with the interpreter attached,
/// whatever thread drops the last view (the releaser of queued kernels' buffers has none), so
/// the object goes at once rather than at some later call into cubridge; after the interpreter
/// has finalized it is left alone.
pub struct Holder(Option<Py<PyAny>>);

impl Holder {
    pub(crate) fn new(obj: &Bound<'_, PyAny>) -> Holder {
        Holder(Some(obj.clone().unbind()))
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if let Some(obj) = self.0.take() {
            let _ = Python::try_attach(move |_| drop(obj));
        }
    }
}
