//! Turning Python objects into arrays: DLPack producers and capsules, the buffer protocol, and
//! (for `asarray`) Python scalars and nested sequences. Foreign memory is viewed, never copied,
//! unless the caller asks for a copy, another dtype or another device.

use super::buffer;
use super::exchange::WorkStreams;
use super::stream::{Consumer, Use};
use super::types::PyArray;
use crate::array::Array;
use crate::cpu::copy::fill;
use crate::cpu::element::Scalar;
use crate::cuda::stream::Stream;
use crate::device::Device;
use crate::dtype::{DType, Kind};
use crate::error::Error;
use crate::ops;
use crate::view::from_managed;
use dlpark::ffi::DLDeviceType;
use dlpark::python::consumer::exchange::ExchangeApi;
use dlpark::python::{from_dlpack as dlpark_import, DlpackStream, ImportRequest, ImportedDlpack};
use dlpark::DlpackFlags;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyComplex, PyFloat, PyInt, PyList, PyTuple};

/// An imported array and whether the producer handed over a copy rather than its own memory.
pub struct Imported {
    pub array: Array,
    pub copied: bool,
}

fn has_dlpack(obj: &Bound<'_, PyAny>) -> bool {
    // Producers define `__dlpack__` on their type (answered from the per-type cache, without
    // making a bound method); an instance attribute of that name is looked up as well.
    type_facts(obj).dlpack
        || obj
            .hasattr(pyo3::intern!(obj.py(), "__dlpack__"))
            .unwrap_or(false)
}

fn is_capsule(obj: &Bound<'_, PyAny>) -> bool {
    obj.cast::<pyo3::types::PyCapsule>().is_ok()
}

/// Imports `obj` without copying: a cubridge array as is, a DLPack producer or capsule, a CUDA
/// array interface, or a buffer-protocol object. CUDA producers order their pending work before
/// `consumer` (a DLPack-numbered stream); a view kept for later records an event there (see
/// [`Use`]). The memory of a tensor that requires grad, or of a JAX array, is imported
/// read-only ([`write_refusal`]). Errors with TypeError for anything else, numpy scalars of
/// dtypes cubridge has not (datetime64, bytes_, ...) among them.
pub fn import(obj: &Bound<'_, PyAny>, consumer: Stream, use_: Use) -> PyResult<Imported> {
    if let Ok(a) = obj.cast::<PyArray>() {
        return Ok(Imported {
            array: a.get().inner.clone(),
            copied: false,
        });
    }
    if is_numpy_ndarray(obj) {
        return import_any(obj, consumer, use_);
    }
    let facts = type_facts(obj);
    if facts.numpy_scalar {
        numpy_scalar_dtype(obj)?;
    }
    let mut imported = import_any(obj, consumer, use_)?;
    if forbids_writes(obj, facts) {
        imported.array = imported.array.with_readonly(true);
    }
    Ok(imported)
}

/// Whether cubridge must not write `obj`'s memory: a tensor that requires grad (a write would
/// hide from autograd), or a JAX array (immutable: other arrays may share its buffer).
fn forbids_writes(obj: &Bound<'_, PyAny>, facts: TypeFacts) -> bool {
    facts.immutable || (facts.grad && requires_grad(obj))
}

fn requires_grad(obj: &Bound<'_, PyAny>) -> bool {
    obj.getattr(pyo3::intern!(obj.py(), "requires_grad"))
        .and_then(|r| r.is_truthy())
        .unwrap_or(false)
}

/// Why a kernel may not write `obj` in place, if it may not: BufferError for a tensor that
/// requires grad (as torch's own `__dlpack__` refuses it), ValueError for a JAX array.
/// `what` names the operand.
pub fn write_refusal(obj: &Bound<'_, PyAny>, what: &str) -> Option<PyErr> {
    if obj.cast::<PyArray>().is_ok() || is_numpy_ndarray(obj) {
        return None;
    }
    let facts = type_facts(obj);
    if facts.immutable {
        return Some(PyValueError::new_err(format!(
            "{what} is a JAX array, which is immutable (other arrays may share its memory): \
             cubridge does not write into it; leave out out= and use the result"
        )));
    }
    (facts.grad && requires_grad(obj)).then(|| {
        PyBufferError::new_err(format!(
            "{what} requires grad: writing it in place would hide the write from autograd; \
             pass .detach() or a tensor that does not require grad"
        ))
    })
}

/// The dtype of a numpy scalar, read from its typestr (`'<f4'`: numpy computes `dtype.name` in
/// Python, `dtype.str` in C), or TypeError for a dtype cubridge does not have (its bytes would
/// otherwise come in through the buffer protocol as uint8).
fn numpy_scalar_dtype(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    let dtype = obj.getattr(pyo3::intern!(obj.py(), "dtype"))?;
    let typestr = dtype.getattr(pyo3::intern!(obj.py(), "str"))?;
    DType::from_typestr(typestr.extract::<&str>()?).map_err(|_| {
        let shown = dtype.str().map_or_else(|_| "?".into(), |s| s.to_string());
        PyTypeError::new_err(format!(
            "unsupported dtype: cubridge cannot read a numpy {} scalar (dtype {shown})",
            type_name(obj)
        ))
    })
}

/// [`import`] without the read-only rule.
fn import_any(obj: &Bound<'_, PyAny>, consumer: Stream, use_: Use) -> PyResult<Imported> {
    if is_numpy_ndarray(obj) {
        // numpy's own arrays (host memory, never a copy) read from numpy's array object, else
        // through the buffer protocol: either costs a fraction of its __dlpack__ (a capsule, a
        // managed tensor and a deleter per call). Whatever neither describes (bfloat16,
        // byte-swapped or structured dtypes) takes the DLPack path below, with its own answer.
        if let Some(array) = super::ndarray::import(obj) {
            return Ok(Imported {
                array,
                copied: false,
            });
        }
        if let Ok(Some(array)) = buffer::import(obj) {
            return Ok(Imported {
                array,
                copied: false,
            });
        }
    }
    if is_capsule(obj) || has_dlpack(obj) {
        match import_dlpack(obj, consumer, use_) {
            Ok(imported) => return Ok(imported),
            // A producer whose DLPack export fails or is malformed (BufferError: for example a
            // read-only numpy array under the legacy ABI; ValueError: a descriptor cubridge
            // rejects, such as CuPy's negative strides, which it mangles in DLPack) may describe
            // the same memory correctly through the CUDA array interface or the buffer protocol.
            // Those are tried; if neither serves, the DLPack error stands, unless the array's
            // dtype is what cubridge cannot read (numpy's big-endian, structured, object, string
            // and datetime arrays): that is a TypeError, as for any unsupported dtype.
            Err(e)
                if !is_capsule(obj)
                    && (e.is_instance_of::<PyBufferError>(obj.py())
                        || e.is_instance_of::<PyValueError>(obj.py())) =>
            {
                if let Ok(Some(array)) = super::cai::import(obj, consumer, use_) {
                    return Ok(Imported {
                        array,
                        copied: false,
                    });
                }
                match buffer::import(obj) {
                    Ok(Some(array)) => {
                        return Ok(Imported {
                            array,
                            copied: false,
                        })
                    }
                    Err(unreadable) if unreadable.is_instance_of::<PyTypeError>(obj.py()) => {
                        return Err(unreadable)
                    }
                    _ => {}
                }
                return Err(unsupported_dtype(obj)
                    .or_else(|| not_a_capsule(obj))
                    .unwrap_or(e));
            }
            Err(e) => return Err(e),
        }
    }
    if let Some(array) = super::cai::import(obj, consumer, use_)? {
        return Ok(Imported {
            array,
            copied: false,
        });
    }
    if let Some(array) = buffer::import(obj)? {
        return Ok(Imported {
            array,
            copied: false,
        });
    }
    Err(PyTypeError::new_err(format!(
        "cubridge cannot read a {}: it needs __dlpack__, a DLPack capsule, \
         __cuda_array_interface__ or the buffer protocol",
        obj.get_type().name()?
    )))
}

/// Whether `obj` is exactly a `numpy.ndarray` (not a subclass, which may export otherwise).
pub fn is_numpy_ndarray(obj: &Bound<'_, PyAny>) -> bool {
    static NDARRAY: pyo3::sync::PyOnceLock<Py<pyo3::types::PyType>> = pyo3::sync::PyOnceLock::new();
    let py = obj.py();
    let ty = obj.get_type();
    if let Some(nd) = NDARRAY.get(py) {
        return ty.is(nd.bind(py));
    }
    let is_ndarray = ty
        .name()
        .is_ok_and(|n| n.to_str().is_ok_and(|n| n == "ndarray"))
        && ty
            .module()
            .is_ok_and(|m| m.to_str().is_ok_and(|m| m == "numpy"));
    if is_ndarray {
        let _ = NDARRAY.set(py, ty.unbind());
    }
    is_ndarray
}

/// Whether `obj` offers one of the ways cubridge reads an operand: a cubridge array, a Python
/// or numpy scalar, a sequence (for `asarray`), a DLPack producer or capsule, the CUDA array
/// interface, or the buffer protocol. What does not is refused by [`import`] with TypeError.
pub fn readable(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = obj.py();
    Ok(obj.cast::<PyArray>().is_ok()
        || python_scalar(obj)?.is_some()
        || is_capsule(obj)
        || has_dlpack(obj)
        || obj.hasattr(pyo3::intern!(py, "__cuda_array_interface__"))?
        // SAFETY: PyObject_CheckBuffer only reads the object's type slots.
        || unsafe { pyo3::ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 1)
}

/// The name of `obj`'s type, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string())
}

/// TypeError when `obj.__dlpack__()` returns something that is not a capsule at all (asked
/// again only on this error path, where dlpark's refusal does not tell it from a capsule of
/// an unknown name; a capsule got here is released by its destructor).
fn not_a_capsule(obj: &Bound<'_, PyAny>) -> Option<PyErr> {
    let returned = obj
        .call_method0(pyo3::intern!(obj.py(), "__dlpack__"))
        .ok()?;
    (!is_capsule(&returned)).then(|| no_capsule(&returned))
}

/// The TypeError for a `__dlpack__` that returned `returned`, which is no capsule.
fn no_capsule(returned: &Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(format!(
        "__dlpack__ returned a {}, not a DLPack capsule",
        type_name(returned)
    ))
}

/// TypeError naming `obj`'s dtype when it has one that cubridge has no dtype for (its producer
/// refused DLPack for it and no other protocol describes it).
fn unsupported_dtype(obj: &Bound<'_, PyAny>) -> Option<PyErr> {
    let dtype = obj.getattr(pyo3::intern!(obj.py(), "dtype")).ok()?;
    if super::types::parse_dtype(&dtype).is_ok() {
        return None;
    }
    let shown = dtype.str().map_or_else(|_| "?".into(), |s| s.to_string());
    Some(PyTypeError::new_err(format!(
        "unsupported dtype: cubridge cannot read a {} of dtype {shown}",
        type_name(obj)
    )))
}

/// An array taken through its producer's DLPack C exchange table: one export, with the
/// producer's current work stream (DLPack numbering, CUDA only), on which its data is ready. A
/// caller that runs work on another stream orders that stream after this one first.
pub struct Exchanged {
    pub imported: Imported,
    pub stream: Option<Stream>,
}

/// `obj` through the C exchange table, when its type publishes one (PyTorch); `None` for
/// anything else, and for a table export that fails, so that [`import`] gives the answer (its
/// fallbacks, or its error). For [`Use::Immediate`] (a kernel's operand) the producer lends a
/// non-owning description of its tensor and the array holds the Python object instead of an
/// owning export; a producer that cannot lend is asked for the owning export.
pub fn exchanged(
    obj: &Bound<'_, PyAny>,
    use_: Use,
    streams: &mut WorkStreams,
) -> Option<Exchanged> {
    // cubridge's arrays need no table, and numpy's come in through the buffer protocol (host
    // memory, no stream), which costs less than any table lookup.
    if obj.cast::<PyArray>().is_ok() || is_numpy_ndarray(obj) {
        return None;
    }
    let facts = type_facts(obj);
    if facts.table != Table::Usable {
        return None;
    }
    let lent = match use_ {
        Use::Immediate => super::exchange::lend(facts.api, obj, streams),
        Use::Kept => None,
    };
    let (array, copied, stream) = match lent {
        Some((array, stream)) => (array, false, stream),
        None => {
            let api = ExchangeApi::from_object(obj.as_borrowed()).ok()??;
            let (managed, stream) = api
                .import_managed_no_sync(obj.as_borrowed())
                .ok()?
                .into_parts();
            let copied = managed.flags().contains(DlpackFlags::IS_COPIED);
            let array = from_managed(managed).ok()?;
            let stream = match array.device() {
                Device::Cuda(_) => Some(Stream::from_handle(stream as usize)),
                _ => None,
            };
            (array, copied, stream)
        }
    };
    // A kernel's operands that it writes were refused beforehand where the producer forbids
    // it (operands::refuse_write); only a kept view carries the refusal.
    let array = if use_ == Use::Kept && forbids_writes(obj, facts) {
        array.with_readonly(true)
    } else {
        array
    };
    if lazy_sign(obj, array.dtype().kind() == Kind::Complex).is_some() {
        // import() refuses it, with the reason.
        return None;
    }
    Some(Exchanged {
        imported: Imported { array, copied },
        stream,
    })
}

/// A kernel operand through its CUDA array interface, where that is version 3 and the producer
/// has no DLPack (Numba): the interface names the stream its pending writes are on (the
/// producer's current stream), on which the kernel can run with no event between them, or none
/// when nothing is pending.
/// `None` for anything else (an exchange-table producer, JAX's version-2 interface), which
/// [`import`] answers, as it does an interface it cannot read.
pub fn lent_cai(obj: &Bound<'_, PyAny>) -> Option<Exchanged> {
    if obj.cast::<PyArray>().is_ok() || is_numpy_ndarray(obj) {
        return None;
    }
    let facts = type_facts(obj);
    // DLPack producers take DLPack: for CuPy, its export costs less than its interface dict.
    if !facts.cai || facts.dlpack || facts.immutable || facts.table == Table::Usable {
        return None;
    }
    let described = super::cai::describe(obj).ok()??;
    if described.version < 3 {
        return None;
    }
    Some(Exchanged {
        imported: Imported {
            array: described.array,
            copied: false,
        },
        stream: described.stream,
    })
}

/// The current stream of `obj`'s producer where cubridge knows how to ask for it without the
/// exchange table: CuPy's (`cupy.cuda.get_current_stream().ptr`). A kernel on
/// that stream needs no event from the producer's export, which orders its work before the
/// stream it is handed only when that is another stream.
pub fn current_stream(obj: &Bound<'_, PyAny>) -> Option<Stream> {
    if !type_facts(obj).cupy {
        return None;
    }
    static GET: pyo3::sync::PyOnceLock<Option<Py<PyAny>>> = pyo3::sync::PyOnceLock::new();
    let py = obj.py();
    let get = GET.get_or_init(py, || {
        py.import("cupy.cuda")
            .and_then(|m| m.getattr("get_current_stream"))
            .ok()
            .map(Bound::unbind)
    });
    let current = get.as_ref()?.bind(py).call0().ok()?;
    let ptr: usize = current
        .getattr(pyo3::intern!(py, "ptr"))
        .ok()?
        .extract()
        .ok()?;
    // The NULL stream (0) is the legacy default stream; 1 and 2 name the legacy and per-thread
    // default streams, as in DLPack.
    Some(Stream::from_handle(ptr))
}

/// What `obj`'s type publishes of a DLPack C exchange table.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Table {
    /// None at all (the type names no `__dlpack_c_exchange_api__`).
    Absent,
    /// A valid capsule, set by the same class that implements `__dlpack__`: the table may stand
    /// for it.
    Usable,
    /// A table that may not stand for `__dlpack__` (a subclass that overrides `__dlpack__`, say
    /// a `torch.Tensor` subclass, must be asked through it, since the table it inherits would
    /// skip it), or one that is not a valid capsule.
    Unusable,
}

/// What cubridge needs to know of a producer's type: its [`Table`], whether the type defines
/// `__dlpack__` and `__cuda_array_interface__`, whether it is CuPy's, whether its instances may
/// require grad (torch's tensors: the instance is
/// asked), whether its arrays are immutable (JAX's), and whether it is a numpy scalar type.
#[derive(Clone, Copy, PartialEq, Eq)]
struct TypeFacts {
    table: Table,
    /// The address of a usable table ([`super::exchange::table_of`]), else 0.
    api: usize,
    dlpack: bool,
    cai: bool,
    cupy: bool,
    grad: bool,
    immutable: bool,
    numpy_scalar: bool,
}

/// `obj`'s type's [`Table`].
fn exchange_table(obj: &Bound<'_, PyAny>) -> Table {
    type_facts(obj).table
}

/// `obj`'s type's [`TypeFacts`], decided once per type: each question costs an attribute lookup
/// (one that fails with an exception, for a type without an exchange table) on every import.
/// The cache holds the types, so that an address is never reused for another.
fn type_facts(obj: &Bound<'_, PyAny>) -> TypeFacts {
    type Cache = Vec<(Py<pyo3::types::PyType>, TypeFacts)>;
    static CACHE: std::sync::Mutex<Cache> = std::sync::Mutex::new(Vec::new());
    const MAX_TYPES: usize = 64;
    let ty = obj.get_type();
    {
        let cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, facts)) = cache.iter().find(|(t, _)| t.is(&ty)) {
            return *facts;
        }
    }
    let table = if !ty
        .hasattr(pyo3::intern!(obj.py(), "__dlpack_c_exchange_api__"))
        .unwrap_or(false)
    {
        Table::Absent
    } else if table_belongs_to_protocol(&ty).unwrap_or(false) {
        Table::Usable
    } else {
        Table::Unusable
    };
    let py = obj.py();
    let dlpack = ty.hasattr(pyo3::intern!(py, "__dlpack__")).unwrap_or(false);
    let cai = ty
        .hasattr(pyo3::intern!(py, "__cuda_array_interface__"))
        .unwrap_or(false);
    let grad = ty
        .hasattr(pyo3::intern!(py, "requires_grad"))
        .unwrap_or(false);
    // jax.Array's implementation lives in jaxlib (`jaxlib._jax.ArrayImpl`; older jaxlibs call
    // the module `jaxlib.xla_extension`).
    let immutable = ty.module().is_ok_and(|m| {
        m.to_str()
            .is_ok_and(|m| m == "jax" || m.starts_with("jax.") || m.starts_with("jaxlib"))
    });
    let cupy = ty.module().is_ok_and(|m| {
        m.to_str()
            .is_ok_and(|m| m == "cupy" || m.starts_with("cupy."))
    });
    let numpy_scalar = numpy_generic(py)
        .ok()
        .flatten()
        .is_some_and(|g| ty.is_subclass(g).unwrap_or(false));
    let api = if table == Table::Usable {
        super::exchange::table_of(&ty)
    } else {
        0
    };
    let facts = TypeFacts {
        table,
        api,
        dlpack,
        cai,
        cupy,
        grad,
        immutable,
        numpy_scalar,
    };
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if cache.len() < MAX_TYPES && !cache.iter().any(|(t, _)| t.is(&ty)) {
        cache.push((ty.unbind(), facts));
    }
    facts
}

fn table_belongs_to_protocol(ty: &Bound<'_, pyo3::types::PyType>) -> PyResult<bool> {
    const TABLE: &str = "__dlpack_c_exchange_api__";
    let mro = ty.getattr(pyo3::intern!(ty.py(), "__mro__"))?;
    let owner = |name: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        for class in mro.try_iter()? {
            let class = class?;
            if class
                .getattr(pyo3::intern!(ty.py(), "__dict__"))?
                .contains(name)?
            {
                return Ok(Some(class));
            }
        }
        Ok(None)
    };
    let (Some(protocol), Some(table)) = (owner("__dlpack__")?, owner(TABLE)?) else {
        return Ok(false);
    };
    if !protocol.is(&table) {
        return Ok(false);
    }
    let capsule = ty.getattr(TABLE)?;
    // SAFETY: PyCapsule_IsValid accepts any object and only reads its type and name.
    let valid =
        unsafe { pyo3::ffi::PyCapsule_IsValid(capsule.as_ptr(), c"dlpack_exchange_api".as_ptr()) };
    Ok(valid == 1)
}

/// The lazily applied sign of a torch tensor, if it has one: the negative bit (`t.conj().imag`)
/// or, for a complex tensor (`complex`), the conjugate bit (`t.conj()`). Its values are then
/// its memory negated or conjugated, which DLPack cannot describe; torch's exchange table hands
/// over the memory as it is, and torch's `__dlpack__` refuses only the conjugate bit. One call
/// for a real tensor.
fn lazy_sign(obj: &Bound<'_, PyAny>, complex: bool) -> Option<PyErr> {
    let py = obj.py();
    let set = |name| {
        obj.call_method0(name)
            .and_then(|v| v.is_truthy())
            .unwrap_or(false)
    };
    let (bit, fix) = if set(pyo3::intern!(py, "is_neg")) {
        ("negative", "resolve_neg")
    } else if complex && set(pyo3::intern!(py, "is_conj")) {
        ("conjugate", "resolve_conj")
    } else {
        return None;
    };
    Some(PyBufferError::new_err(format!(
        "the tensor has its {bit} bit set: its values are not its memory, which DLPack cannot \
         describe; pass t.{fix}()"
    )))
}

/// The `max_version` cubridge passes to `__dlpack__`: the newest DLPack it reads.
const MAX_VERSION_ASKED: [u32; 2] = [1, 3];

/// `obj.__dlpack__` called by cubridge itself, with `consumer` as the stream of a CUDA producer
/// (cubridge numbers streams as DLPack does) and `max_version` when `versioned`, with the
/// device that `obj.__dlpack_device__()` announced (`None` without one). For producers without a usable
/// exchange table (dlpark's import request would look for one first, an attribute lookup that
/// raises and swallows an exception on every call for a type without one, and would consult
/// one that may not be used), and for those that predate `max_version`, asked again the legacy
/// way.
fn protocol_capsule<'py>(
    obj: &Bound<'py, PyAny>,
    consumer: Stream,
    versioned: bool,
) -> PyResult<(Bound<'py, PyAny>, Option<Announced>)> {
    // A producer without `__dlpack_device__` (older ones) announces nothing; one whose
    // `__dlpack_device__` fails gives its error, since the stream handed over depends on it.
    let announced = match obj.getattr(pyo3::intern!(obj.py(), "__dlpack_device__")) {
        Ok(method) => Some(method.call0()?.extract::<Announced>()?),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(obj.py()) => None,
        Err(e) => return Err(e),
    };
    let on_cuda = announced.is_some_and(|(t, _)| t == DLDeviceType::CUDA.0);
    let kwargs = pyo3::types::PyDict::new(obj.py());
    if versioned {
        // The version cubridge reads, as a tuple made once.
        static MAX_VERSION: pyo3::sync::PyOnceLock<Py<PyTuple>> = pyo3::sync::PyOnceLock::new();
        let version = MAX_VERSION.get_or_try_init(obj.py(), || {
            PyTuple::new(obj.py(), MAX_VERSION_ASKED).map(Bound::unbind)
        })?;
        kwargs.set_item(
            pyo3::intern!(obj.py(), "max_version"),
            version.bind(obj.py()),
        )?;
    }
    if on_cuda {
        kwargs.set_item(pyo3::intern!(obj.py(), "stream"), consumer.dlpack())?;
    }
    let capsule = obj.call_method(pyo3::intern!(obj.py(), "__dlpack__"), (), Some(&kwargs))?;
    if !is_capsule(&capsule) {
        return Err(no_capsule(&capsule));
    }
    Ok((capsule, announced))
}

/// A device as `__dlpack_device__` announces it: DLPack's device type and ordinal.
type Announced = (u32, i32);

/// Refuses a capsule on another device than its producer announced where that decided the
/// stream handed over: a CUDA capsule whose producer was not asked to order its work before
/// the consumer, or one of another device. (A host capsule of a producer that announced pinned
/// memory is host memory as announced: PyTorch names a pinned tensor's device kDLCUDAHost but
/// kDLCPU in the capsule.)
fn check_announced(announced: Announced, actual: Device) -> PyResult<()> {
    let cuda = DLDeviceType::CUDA.0;
    let consistent = match actual {
        Device::Cuda(n) => announced.0 == cuda && u32::try_from(announced.1) == Ok(n),
        _ => announced.0 != cuda,
    };
    if consistent {
        return Ok(());
    }
    Err(PyValueError::new_err(format!(
        "the producer announced DLPack device {announced:?} in __dlpack_device__ but exported \
         memory on {actual}"
    )))
}

/// DLPack import: a versioned capsule is asked for first, with `consumer` as the stream for
/// CUDA producers (or, through the C exchange table, an event wait on the producer's work
/// stream); a producer whose `__dlpack__` predates `max_version` (it raises TypeError) is asked
/// again the legacy way.
fn import_dlpack(obj: &Bound<'_, PyAny>, consumer: Stream, use_: Use) -> PyResult<Imported> {
    import_dlpack_raw(obj, consumer, use_).map_err(|e| as_export_refusal(obj.py(), e))
}

/// A plain `RuntimeError` out of a DLPack import is a refusal to export (DLPack's word for it
/// is BufferError): dlpark's for a tensor of another major version, which it has released;
/// producers' for what DLPack cannot describe (torch's sparse, meta and quantized tensors,
/// with pages of C++ frames). One line of it is kept. cubridge's own errors (CudaError and the
/// rest, subclasses of RuntimeError) pass unchanged.
fn as_export_refusal(py: Python<'_>, e: PyErr) -> PyErr {
    if !e
        .get_type(py)
        .is(py.get_type::<pyo3::exceptions::PyRuntimeError>())
    {
        return e;
    }
    let message = e.value(py).to_string();
    let first = message.lines().next().unwrap_or("").trim();
    PyBufferError::new_err(format!("the DLPack export was refused: {first}"))
}

fn import_dlpack_raw(obj: &Bound<'_, PyAny>, consumer: Stream, use_: Use) -> PyResult<Imported> {
    let py = obj.py();
    let consumer_stream = Consumer(consumer);
    let table = exchange_table(obj);
    let attempt = || -> PyResult<(ImportedDlpack, Option<Announced>)> {
        if is_capsule(obj) {
            return Ok((dlpark_import(obj.as_borrowed(), None, None)?, None));
        }
        if table != Table::Usable {
            let (capsule, announced) = protocol_capsule(obj, consumer, true)?;
            return Ok((dlpark_import(capsule.as_borrowed(), None, None)?, announced));
        }
        // A producer whose table could not serve (it refused, or the tensor has a lazy sign):
        // dlpark's request gives its answer.
        let request = ImportRequest::new(obj.as_borrowed())?;
        if request
            .device()
            .is_ok_and(|d| d.device_type == DLDeviceType::CUDAHOST)
        {
            // PyTorch names a pinned tensor's device kDLCUDAHost in __dlpack_device__ but kDLCPU
            // in the capsule. Both are host memory that needs no stream, so the capsule is taken
            // at its word instead of failing the device check.
            let kwargs = pyo3::types::PyDict::new(py);
            kwargs.set_item("max_version", (MAX_VERSION_ASKED[0], MAX_VERSION_ASKED[1]))?;
            let capsule = obj.call_method("__dlpack__", (), Some(&kwargs))?;
            return Ok((dlpark_import(capsule.as_borrowed(), None, None)?, None));
        }
        let on_cuda = request
            .device()
            .is_ok_and(|d| d.device_type == DLDeviceType::CUDA);
        let stream: Option<&dyn DlpackStream> = if on_cuda {
            Some(&consumer_stream)
        } else {
            None
        };
        Ok((request.import(stream, None)?, None))
    };
    let (imported, announced) = match attempt() {
        Ok(imported) => imported,
        Err(e) if e.is_instance_of::<PyTypeError>(py) && !is_capsule(obj) => {
            let (capsule, announced) = protocol_capsule(obj, consumer, false).map_err(|_| e)?;
            (dlpark_import(capsule.as_borrowed(), None, None)?, announced)
        }
        Err(e) => return Err(e),
    };
    let copied = imported.flags().contains(DlpackFlags::IS_COPIED);
    let array = match imported {
        ImportedDlpack::Legacy(m) => from_managed(m)?,
        ImportedDlpack::Versioned(m) => from_managed(m)?,
    };
    if let Some(announced) = announced {
        check_announced(announced, array.device())?;
    }
    if table != Table::Absent {
        if let Some(refusal) = lazy_sign(obj, array.dtype().kind() == Kind::Complex) {
            return Err(refusal);
        }
    }
    // The producer ordered its work before `consumer`; an event there lets later users of a
    // kept view wait for it from any stream.
    let array = match array.device() {
        Device::Cuda(n) if use_ == Use::Kept => {
            let event = crate::cuda::stream::Event::record(consumer, n)?;
            array.with_pending(consumer, event)
        }
        _ => array,
    };
    Ok(Imported { array, copied })
}

/// Applies the Array API `copy` / `dtype` / `device` rules to an imported array: no copy unless
/// one is needed or asked for; `copy=False` refuses a needed copy.
pub fn finish(
    py: Python<'_>,
    imported: Imported,
    dtype: Option<DType>,
    device: Option<Device>,
    copy: Option<bool>,
) -> PyResult<Array> {
    let Imported { array, copied } = imported;
    let dtype_target = dtype.unwrap_or(array.dtype());
    let device_target = device.unwrap_or(array.device());
    let needs_copy = dtype_target != array.dtype() || device_target != array.device();
    if copy == Some(false) && copied {
        return Err(PyBufferError::new_err(format!(
            "copy=False, but the producer exported a copy of its {} array on {} (the DLPack \
             IS_COPIED flag), not its own memory",
            array.dtype(),
            array.device()
        )));
    }
    if copy == Some(false) && needs_copy {
        return Err(Error::invalid(format!(
            "copy=False, but a {} array on {} cannot be seen as {dtype_target} on \
             {device_target} without copying",
            array.dtype(),
            array.device()
        ))
        .into());
    }
    if needs_copy || (copy == Some(true) && !copied) {
        return Ok(py.detach(|| ops::copy(&array, dtype_target, device_target))?);
    }
    Ok(array)
}

/// A Python scalar as a [`Scalar`], or `None` if `obj` is not one.
pub fn python_scalar(obj: &Bound<'_, PyAny>) -> PyResult<Option<Scalar>> {
    // bool is a subclass of int: test it first.
    if obj.is_instance_of::<PyBool>() {
        return Ok(Some(Scalar::Bool(obj.extract()?)));
    }
    if obj.is_instance_of::<PyInt>() {
        // Any int that a dtype may hold (floating dtypes take large ones); the dtype it meets
        // checks its range (ops::create::check_value_kind).
        let v: i128 = obj.extract().map_err(|_| {
            let bits = obj
                .call_method0("bit_length")
                .and_then(|b| b.extract::<u64>())
                .unwrap_or(0);
            Error::Overflow(format!(
                "Python integer of {bits} bits is too large for any cubridge dtype"
            ))
        })?;
        return Ok(Some(Scalar::Int(v)));
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

/// One element of a nested sequence: its value, and its dtype when it is a numpy scalar (or a
/// 0-d numpy array).
type Element = (Scalar, Option<DType>);

/// Builds a new array from a Python scalar or a nested list/tuple of scalars. Without a
/// `dtype`, see [`infer_dtype`]; with one, each value is converted as numpy builds an array
/// ([`crate::ops::create::cast_value`]).
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
        Ok(Some(host))
    } else {
        Ok(Some(ops::copy(&host, dtype, device)?))
    }
}

/// The dtype of an array of these elements. Python scalars alone take numpy's inference with
/// the Array API's float32 default for floats: the widest kind present; ints beyond int64 make
/// uint64 when none is negative. With numpy scalars among them, numpy's own inference: each
/// numpy scalar keeps its dtype, Python values count as numpy's defaults (int64, float64,
/// complex128), and all meet in [`DType::result_type`] (`[numpy.float64(0.1)]` stays float64).
pub fn infer_dtype(values: &[Element]) -> Result<DType, Error> {
    let python = |v: Scalar| match v {
        Scalar::Int(i) if i > i128::from(i64::MAX) => DType::UInt64,
        Scalar::Float(_) => DType::Float64,
        Scalar::Complex(..) => DType::Complex128,
        other => other.default_dtype(),
    };
    if values.iter().any(|(_, d)| d.is_some()) {
        let dtype = values
            .iter()
            .map(|&(v, d)| d.unwrap_or_else(|| python(v)))
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

/// A numpy scalar (`np.float32(2)`, not a 0-d array) as its value and dtype, read through its
/// attributes (cheaper than importing it as an array); `None` for anything else, and for
/// dtypes cubridge does not have.
pub fn typed_numpy_scalar(obj: &Bound<'_, PyAny>) -> PyResult<Option<(Scalar, DType)>> {
    if let Some(known) = super::ndarray::builtin_scalar(obj) {
        return Ok(Some(known));
    }
    let py = obj.py();
    let Some(generic) = numpy_generic(py)? else {
        return Ok(None);
    };
    if !obj.is_instance(generic)? {
        return Ok(None);
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
fn numpy_generic(py: Python<'_>) -> PyResult<Option<&Bound<'_, pyo3::types::PyType>>> {
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
fn numpy_scalar(obj: &Bound<'_, PyAny>) -> PyResult<Option<Element>> {
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

fn flatten(
    obj: &Bound<'_, PyAny>,
    depth: usize,
    shape: &mut Vec<usize>,
    values: &mut Vec<Element>,
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
    if !(obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>()) {
        return Err(PyTypeError::new_err(format!(
            "cannot put a {} into an array",
            obj.get_type().name()?
        )));
    }
    if depth >= crate::layout::MAX_NDIM {
        return Err(Error::invalid(format!(
            "sequence nesting is deeper than the {} dimensions cubridge supports",
            crate::layout::MAX_NDIM
        ))
        .into());
    }
    // What iteration yields is what counts: a sequence's __len__ may disagree with it.
    let items = obj.try_iter()?.collect::<PyResult<Vec<_>>>()?;
    let len = items.len();
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
    for item in &items {
        flatten(item, depth + 1, shape, values)?;
    }
    Ok(())
}
