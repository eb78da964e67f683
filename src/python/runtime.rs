//! The Python side of the one runtime per process (see [`crate::runtime`]): the `cubridge`
//! module publishes its table as the `_runtime` capsule and serves the entries that need the
//! interpreter (importing an object, wrapping a result as `cubridge.Array`); an extension crate
//! adopts the table in [`prepare_extension`] and relays its imports and results through it.

use super::operands::AnyArray;
use super::types::PyArray;
use crate::array::Array;
use crate::cuda::stream::Stream;
use crate::runtime::{give_tensor, take_tensor, ImportReply, Table, Written};
use dlpark::ffi::DLManagedTensorVersioned;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::ffi::{c_void, CStr};
use std::ptr::NonNull;

/// The capsule's name: where `PyCapsule_Import` finds it.
const NAME: &CStr = c"cubridge._cubridge._runtime";

/// The `cubridge` module's table.
static TABLE: Table = Table::served(serve_import, serve_wrap);

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
    // fields are its ABI and version in every release; `adopt` reads the rest only where the
    // ABI is ours.
    unsafe { crate::runtime::adopt(table.as_ptr().cast(), &who) }?;
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
    crate::error::Error::Incompatible(format!(
        "{who} was built with cubridge {} (runtime ABI {}), but the installed cubridge module \
         (version {installed}) serves no runtime for extensions ({why}); install cubridge {} \
         or rebuild {who} against the installed one",
        crate::runtime::VERSION.to_string_lossy(),
        crate::runtime::ABI,
        crate::runtime::VERSION.to_string_lossy(),
    ))
    .into()
}

/// `Table::import`: `obj` as this module takes an extension's argument.
unsafe extern "C" fn serve_import(obj: *mut c_void, out: *mut ImportReply) -> i32 {
    Python::attach(|py| {
        // SAFETY: the caller lends a live object for the call.
        let obj = unsafe { Bound::from_borrowed_ptr(py, obj.cast()) };
        let imported = AnyArray::import_here(&obj).and_then(|a| {
            Ok(ImportReply {
                tensor: give_tensor(a.array())?,
                work_stream: a.stream().map_or(0, |s| s.handle() as usize),
                write: Written::of(a.array()),
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
            .map(|array| unsafe { write.record(array) })
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

/// An extension's argument, imported by the process's runtime.
pub(crate) fn relay_import(runtime: &Table, obj: &Bound<'_, PyAny>) -> PyResult<AnyArray> {
    let mut out = ImportReply {
        tensor: std::ptr::null_mut(),
        work_stream: 0,
        write: Written::NONE,
    };
    // SAFETY: a live object, borrowed for the call, and a valid out-pointer; the interpreter is
    // attached.
    if unsafe { (runtime.import)(obj.as_ptr().cast(), &mut out) } != 0 {
        return Err(PyErr::fetch(obj.py()));
    }
    // SAFETY: the runtime handed the tensor over.
    // SAFETY: the runtime handed the tensor and its write over.
    let array = unsafe { out.write.record(take_tensor(out.tensor)?) };
    let stream = (out.work_stream != 0).then(|| Stream::from_handle(out.work_stream));
    Ok(AnyArray::new(array, stream))
}

/// Hands `array` to Python: a `cubridge.Array` of the process's runtime where this copy of
/// cubridge hands its work to one (an extension crate's), else of this module.
impl<'py> IntoPyObject<'py> for Array {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let Some(runtime) = crate::runtime::shared() else {
            return Ok(Bound::new(py, PyArray::new(self))?.into_any());
        };
        let write = Written::of(&self);
        let tensor = give_tensor(&self)?;
        // SAFETY: the tensor is handed over; the interpreter is attached.
        let object = unsafe { (runtime.wrap)(tensor, write) };
        // SAFETY: a new reference, or null with an exception set.
        unsafe { Bound::from_owned_ptr_or_err(py, object.cast()) }
    }
}
