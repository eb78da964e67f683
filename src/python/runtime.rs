//! The Python side of the one runtime per process (see [`crate::cuda::shared`]): the
//! `cubridge` module publishes its table as the `_runtime` capsule and serves the entries that
//! need the interpreter (importing an object, wrapping a result as `cubridge.Array`); an
//! extension crate adopts the table in [`prepare_extension`], and from then on [`services`]
//! relays its imports, results and exception classes through it.

use super::types::PyArray;
use crate::array::Array;
use crate::cuda::shared::{self, ImportReply, Table, Written};
use crate::cuda::stream::{Stream, Write};
use dlpark::ffi::DLManagedTensorVersioned;
use dlpark::Managed;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyType};
use std::ffi::{c_void, CStr};
use std::ptr::NonNull;

/// The capsule's name: where `PyCapsule_Import` finds it.
const NAME: &CStr = c"cubridge._cubridge._runtime";

/// The `cubridge` module's table.
static TABLE: Table = Table::served(serve_import, serve_wrap);

/// A kernel's argument, with its producer's current work stream where it names one.
pub(crate) type Imported = (Array, Option<Stream>);

/// The services of the Python layer, as this copy reaches them.
pub(crate) struct Services {
    /// Imports a kernel's argument.
    pub import: fn(&Bound<'_, PyAny>) -> PyResult<Imported>,
    /// A result handed to Python as a `cubridge.Array`.
    pub wrap: for<'py> fn(Python<'py>, Array) -> PyResult<Bound<'py, PyAny>>,
    /// The class of cubridge's exceptions to raise for this copy's class `local`.
    pub class: for<'py> fn(Python<'py>, Bound<'py, PyType>) -> Bound<'py, PyType>,
}

static LOCAL: Services = Services {
    import: super::import::kept,
    wrap: wrap_here,
    class: |_, local| local,
};

static RELAYED: Services = Services {
    import: relay_import,
    wrap: relay_wrap,
    class: module_class,
};

/// The Python layer's services: relayed to the `cubridge` module's runtime once this copy
/// adopted its table (see [`crate::cuda::shared::services`]), else this copy's own.
pub(crate) fn services() -> &'static Services {
    match shared::adopted() {
        Some(_) => &RELAYED,
        None => &LOCAL,
    }
}

/// Publishes the table in the `cubridge` module.
pub(crate) fn publish(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let table = NonNull::from(&TABLE).cast::<c_void>();
    // SAFETY: the table is a static that lives for the process, never written.
    let capsule = unsafe { PyCapsule::new_with_pointer(m.py(), table, NAME) }?;
    m.add("_runtime", capsule)
}

/// Makes an extension module built on the `cubridge` crate use the `cubridge` module's
/// runtime; call it once from the `#[pymodule]` function. From then on the crate's copy of
/// cubridge allocates CUDA memory from the module's pool (counted by
/// `cubridge.cuda.memory_stats()`), loads kernels through the module's caches, holds the buffers
/// of queued kernels in the module's releaser, imports arguments as the module does, and
/// returns its arrays as `cubridge.Array` instances. Raises `ImportError`, naming both
/// versions, where the installed `cubridge` module has another runtime ABI.
///
/// ```ignore
/// #[pymodule]
/// fn my_ext(m: &Bound<'_, PyModule>) -> PyResult<()> {
///     cubridge::python::prepare_extension(m)?;
///     m.add_function(wrap_pyfunction!(my_kernel, m)?)
/// }
/// ```
pub fn prepare_extension(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let who = m.name()?.to_string();
    let table =
        PyCapsule::import_pointer(m.py(), NAME).map_err(|e| no_runtime(m.py(), &who, &e))?;
    // SAFETY: the capsule of this name is the `cubridge` module's static table, whose first two
    // fields are its version and crate version in every release; `adopt` reads the rest only
    // where the version is this copy's or later, whose tables only append entries.
    unsafe { shared::adopt(table.as_ptr().cast(), &who) }?;
    Ok(())
}

/// The `ImportError` for an installed `cubridge` module that serves no runtime table (a release
/// from before the table, or a damaged install), naming both versions and what went wrong.
fn no_runtime(py: Python<'_>, who: &str, why: &PyErr) -> PyErr {
    let installed = py
        .import("cubridge")
        .and_then(|c| c.getattr("__version__"))
        .and_then(|v| v.extract::<String>())
        .unwrap_or_else(|_| "unknown".into());
    let ours = shared::CRATE_VERSION.to_string_lossy();
    crate::error::Error::Incompatible(format!(
        "{who} was built with cubridge {ours} (runtime table version {}), but the installed \
         cubridge module (version {installed}) serves no runtime for extensions ({why}); \
         install cubridge {ours} or later, or rebuild {who} against the installed one",
        shared::VERSION,
    ))
    .into()
}

/// An array over a managed tensor that the other side of the table handed over.
///
/// # Safety
/// `tensor` is a live managed tensor that the caller owns.
unsafe fn take_tensor(tensor: *mut DLManagedTensorVersioned) -> crate::Result<Array> {
    // SAFETY: the caller's contract.
    let managed = unsafe { Managed::from_raw(tensor) }.map_err(|e| {
        crate::Error::invalid(format!("the cubridge runtime handed over no tensor: {e}"))
    })?;
    crate::view::from_managed(managed)
}

/// A managed tensor over `array` for the other side of the table.
fn give_tensor(array: &Array) -> crate::Result<*mut DLManagedTensorVersioned> {
    Ok(crate::export::to_managed::<DLManagedTensorVersioned>(array, false)?.into_raw())
}

/// `array`, with `write` (lent by the other side of the table) recorded as its last.
///
/// # Safety
/// The write came from [`Written::lend`] for this array's memory.
unsafe fn with_lent_write(array: Array, write: Written) -> Array {
    // SAFETY: the caller's contract.
    match unsafe { write.take(array.device()) } {
        Some(Write {
            stream,
            event: Some(event),
        }) => array.with_pending(stream, event),
        Some(Write { event: None, .. }) => array.with_legacy_write(),
        None => array,
    }
}

/// `Table::import`: `obj` as this module takes an extension's argument.
unsafe extern "C" fn serve_import(obj: *mut c_void, out: *mut ImportReply) -> i32 {
    Python::attach(|py| {
        // SAFETY: the caller lends a live object for the call.
        let obj = unsafe { Bound::from_borrowed_ptr(py, obj.cast()) };
        let imported = super::import::kept(&obj).and_then(|(array, stream)| {
            Ok(ImportReply {
                tensor: give_tensor(&array)?,
                work_stream: stream.map_or(0, |s| s.handle() as usize),
                write: Written::lend(array.buffer().last_write()),
            })
        });
        match imported {
            Ok(reply) => {
                // SAFETY: the caller's out-pointer, valid for a write.
                unsafe { *out = reply };
                0
            }
            Err(e) => {
                e.restore(py);
                -1
            }
        }
    })
}

/// `Table::wrap`: a `cubridge.Array` over an extension's result.
unsafe extern "C" fn serve_wrap(
    tensor: *mut DLManagedTensorVersioned,
    write: Written,
) -> *mut c_void {
    Python::attach(|py| {
        // SAFETY: the caller hands the tensor over.
        let wrapped = unsafe { take_tensor(tensor) }
            .map_err(PyErr::from)
            // SAFETY: the extension's write of this array's memory, handed over.
            .map(|array| unsafe { with_lent_write(array, write) })
            .and_then(|array| Bound::new(py, PyArray::new(array)));
        match wrapped {
            Ok(object) => object.into_ptr().cast(),
            Err(e) => {
                e.restore(py);
                std::ptr::null_mut()
            }
        }
    })
}

/// The adopted table (the relayed services are chosen only once one is).
fn table() -> PyResult<&'static Table> {
    shared::adopted().ok_or_else(|| crate::Error::invalid("no cubridge runtime was adopted").into())
}

/// An extension's argument, imported by the process's runtime.
fn relay_import(obj: &Bound<'_, PyAny>) -> PyResult<Imported> {
    let mut out = ImportReply {
        tensor: std::ptr::null_mut(),
        work_stream: 0,
        write: Written::NONE,
    };
    // SAFETY: a live object, borrowed for the call, and a valid out-pointer; the interpreter is
    // attached.
    if unsafe { (table()?.import)(obj.as_ptr().cast(), &mut out) } != 0 {
        return Err(PyErr::fetch(obj.py()));
    }
    // SAFETY: the runtime handed the tensor and its write over.
    let array = unsafe { with_lent_write(take_tensor(out.tensor)?, out.write) };
    let stream = (out.work_stream != 0).then(|| Stream::from_handle(out.work_stream));
    Ok((array, stream))
}

/// `array` as this module's `cubridge.Array`.
fn wrap_here(py: Python<'_>, array: Array) -> PyResult<Bound<'_, PyAny>> {
    Ok(Bound::new(py, PyArray::new(array))?.into_any())
}

/// `array` as a `cubridge.Array` of the process's runtime.
fn relay_wrap(py: Python<'_>, array: Array) -> PyResult<Bound<'_, PyAny>> {
    let write = Written::lend(array.buffer().last_write());
    let tensor = give_tensor(&array)?;
    // SAFETY: the tensor is handed over; the interpreter is attached.
    let object = unsafe { (table()?.wrap)(tensor, write) };
    // SAFETY: a new reference, or null with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, object.cast()) }
}

/// The `cubridge` module's class of the same name as `local`, so that `except
/// cubridge.CudaError` catches an extension's errors too.
fn module_class<'py>(py: Python<'py>, local: Bound<'py, PyType>) -> Bound<'py, PyType> {
    py.import("cubridge._cubridge")
        .and_then(|m| m.getattr(local.name()?))
        .and_then(|c| Ok(c.cast_into::<PyType>()?))
        .unwrap_or(local)
}

/// Hands `array` to Python as a `cubridge.Array` (of the process's runtime).
impl<'py> IntoPyObject<'py> for Array {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        (services().wrap)(py, self)
    }
}
