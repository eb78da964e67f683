//! DLPack consumers: the Python protocol (`__dlpack_device__` / `__dlpack__`, capsules) and the
//! C exchange table, with the facts learned once per producer type; and the streams producers
//! name (CuPy's current stream, the CUDA array interface's).

use super::call::{call_dlpack, call_method0, MAX_VERSION_ASKED};
use super::exchange::WorkStreams;
use super::values::numpy_generic;
use super::{cubridge_array, forbids_writes, is_capsule, is_numpy_ndarray, no_capsule, Imported};
use crate::cuda::stream::Stream;
use crate::device::Device;
use crate::dtype::Kind;
use crate::error::Error;
use crate::phases::producer;
use crate::python::stream::{Consumer, Use};
use crate::view::from_managed;
use dlpark::ffi::DLDeviceType;
use dlpark::python::consumer::exchange::ExchangeApi;
use dlpark::python::{from_dlpack as dlpark_import, DlpackStream, ImportRequest, ImportedDlpack};
use dlpark::DlpackFlags;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

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
    if cubridge_array(obj).is_some() || is_numpy_ndarray(obj) {
        return None;
    }
    let facts = type_facts(obj);
    if facts.table != TableUse::Usable {
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
            let (managed, stream) = producer!(
                ProducerExport,
                api.import_managed_no_sync(obj.as_borrowed())
            )
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

/// The current stream of `obj`'s producer where cubridge knows how to ask for it without the
/// exchange table: CuPy's (`cupy.cuda.get_current_stream().ptr`, read through CuPy's own C
/// function where it exports one). A kernel on that stream needs no event from the producer's
/// export, which orders its work before the stream it is handed only when that is another
/// stream.
pub fn current_stream(obj: &Bound<'_, PyAny>) -> Option<Stream> {
    if !type_facts(obj).cupy {
        return None;
    }
    let py = obj.py();
    let ptr = match cupy_stream_function(py) {
        Some(get) => {
            // SAFETY: CuPy's `intptr_t get_current_stream_ptr(void)` (its signature checked by
            // the capsule's name), called with the GIL held, as CuPy's own kernels call it. Built
            // with Cython 3 it returns -1 with an exception set when it fails (`except? -1`);
            // older builds print the error and return 0, the legacy default stream.
            let ptr = producer!(ProducerStream, unsafe { get() });
            if ptr == -1 && PyErr::take(py).is_some() {
                return None;
            }
            usize::try_from(ptr).ok()?
        }
        None => cupy_stream_from_python(py)?,
    };
    // The NULL stream (0) is the legacy default stream; 1 and 2 name the legacy and per-thread
    // default streams, as in DLPack.
    Some(Stream::from_handle(ptr))
}

/// CuPy's current stream through Python: `cupy.cuda.get_current_stream().ptr`.
fn cupy_stream_from_python(py: Python<'_>) -> Option<usize> {
    static GET: pyo3::sync::PyOnceLock<Option<Py<PyAny>>> = pyo3::sync::PyOnceLock::new();
    let get = GET.get_or_init(py, || {
        py.import("cupy.cuda")
            .and_then(|m| m.getattr("get_current_stream"))
            .ok()
            .map(Bound::unbind)
    });
    let get = get.as_ref()?.bind(py);
    let current = producer!(ProducerStream, get.call0()).ok()?;
    current
        .getattr(pyo3::intern!(py, "ptr"))
        .ok()?
        .extract()
        .ok()
}

/// CuPy's C function for its current stream, `cupy.cuda.stream.get_current_stream_ptr`, which
/// Cython exports in the module's `__pyx_capi__` under its C signature; `None` where the
/// module has no such function of that signature (then Python is asked).
fn cupy_stream_function(py: Python<'_>) -> Option<unsafe extern "C" fn() -> isize> {
    static FUNCTION: pyo3::sync::PyOnceLock<Option<usize>> = pyo3::sync::PyOnceLock::new();
    let address = FUNCTION.get_or_init(py, || {
        let capsule = py
            .import("cupy.cuda.stream")
            .and_then(|m| m.getattr("__pyx_capi__"))
            .and_then(|capi| capi.get_item("get_current_stream_ptr"))
            .ok()?;
        let capsule = capsule.cast::<pyo3::types::PyCapsule>().ok()?;
        let pointer = capsule.pointer_checked(Some(c"intptr_t (void)")).ok()?;
        Some(pointer.as_ptr() as usize)
    });
    // SAFETY: the address is that of a C function `intptr_t (void)`, as its capsule's name
    // declares; CuPy's module stays loaded for the rest of the process once imported.
    address.map(|a| unsafe { std::mem::transmute::<usize, unsafe extern "C" fn() -> isize>(a) })
}

/// What `obj`'s type publishes of a DLPack C exchange table.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum TableUse {
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

/// What cubridge needs to know of a producer's type: its [`TableUse`], whether the type defines
/// `__dlpack__` and `__cuda_array_interface__`, whether it is CuPy's, whether its instances may
/// require grad (torch's tensors: the instance is
/// asked), whether its arrays are immutable (JAX's), and whether it is a numpy scalar type.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct TypeFacts {
    pub(super) table: TableUse,
    /// The address of a usable table ([`super::exchange::table_of`]), else 0.
    api: usize,
    /// The type has `__dlpack__`.
    pub(super) dlpack: bool,
    /// The type has `__cuda_array_interface__`.
    pub(super) cai: bool,
    cupy: bool,
    /// The type has `requires_grad` (torch's tensors).
    pub(super) grad: bool,
    /// A JAX array: immutable.
    pub(super) immutable: bool,
    /// One of numpy's own scalar types.
    pub(super) numpy_scalar: bool,
    /// numpy's array type itself (not a subclass).
    pub(super) ndarray: bool,
}

/// The types whose [`TypeFacts`] are known. The cache holds the types, so that an address is
/// never reused for another.
static FACTS: std::sync::Mutex<Vec<(Py<pyo3::types::PyType>, TypeFacts)>> =
    std::sync::Mutex::new(Vec::new());

/// `obj`'s type's [`TypeFacts`], decided once per type: each question costs an attribute lookup
/// (one that fails with an exception, for a type without an exchange table) on every import.
/// Facts only spare lookups: where a class has changed since (a method removed), the import
/// that finds out calls [`forget_type`], and an attribute an instance adds is looked up too.
pub(super) fn type_facts(obj: &Bound<'_, PyAny>) -> TypeFacts {
    const MAX_TYPES: usize = 64;
    // SAFETY: `obj` is a live object; its type pointer is compared, not dereferenced.
    let ty_ptr = unsafe { pyo3::ffi::Py_TYPE(obj.as_ptr()) }.cast::<pyo3::ffi::PyObject>();
    {
        let cache = crate::lock(&FACTS);
        if let Some((_, facts)) = cache.iter().find(|(t, _)| t.as_ptr() == ty_ptr) {
            return *facts;
        }
    }
    let ty = obj.get_type();
    let facts = learn_facts(&ty);
    let mut cache = crate::lock(&FACTS);
    if cache.len() < MAX_TYPES && !cache.iter().any(|(t, _)| t.is(&ty)) {
        cache.push((ty.unbind(), facts));
    }
    facts
}

/// Forgets what [`type_facts`] learned of `obj`'s type, which has changed since.
pub(super) fn forget_type(obj: &Bound<'_, PyAny>) {
    let ty = obj.get_type();
    crate::lock(&FACTS).retain(|(t, _)| !t.is(&ty));
}

/// What [`type_facts`] caches, asked of the type.
fn learn_facts(ty: &Bound<'_, pyo3::types::PyType>) -> TypeFacts {
    let py = ty.py();
    let table = if !ty
        .hasattr(pyo3::intern!(py, "__dlpack_c_exchange_api__"))
        .unwrap_or(false)
    {
        TableUse::Absent
    } else if table_belongs_to_protocol(ty).unwrap_or(false) {
        TableUse::Usable
    } else {
        TableUse::Unusable
    };
    let dlpack = ty.hasattr(pyo3::intern!(py, "__dlpack__")).unwrap_or(false);
    let cai = ty
        .hasattr(pyo3::intern!(py, "__cuda_array_interface__"))
        .unwrap_or(false);
    let grad = ty
        .hasattr(pyo3::intern!(py, "requires_grad"))
        .unwrap_or(false);
    // jax.Array's implementation lives in jaxlib (`jaxlib._jax.ArrayImpl`; older jaxlibs call
    // the module `jaxlib.xla_extension`).
    let module = |test: fn(&str) -> bool| ty.module().is_ok_and(|m| m.to_str().is_ok_and(test));
    let immutable = module(|m| m == "jax" || m.starts_with("jax.") || m.starts_with("jaxlib"));
    let cupy = module(|m| m == "cupy" || m.starts_with("cupy."));
    let ndarray = module(|m| m == "numpy")
        && ty
            .name()
            .is_ok_and(|n| n.to_str().is_ok_and(|n| n == "ndarray"));
    let numpy_scalar = numpy_generic(py)
        .ok()
        .flatten()
        .is_some_and(|g| ty.is_subclass(g).unwrap_or(false));
    let api = if table == TableUse::Usable {
        super::exchange::table_of(ty)
    } else {
        0
    };
    TypeFacts {
        table,
        api,
        dlpack,
        cai,
        cupy,
        grad,
        immutable,
        numpy_scalar,
        ndarray,
    }
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
        producer!(ProducerQuery, call_method0(obj, name))
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
    Some(
        Error::export(format!(
            "the tensor has its {bit} bit set: its values are not its memory, which DLPack cannot \
         describe; pass t.{fix}()"
        ))
        .into(),
    )
}

/// `obj.__dlpack__` called by cubridge itself, with `consumer` as the stream of a CUDA producer
/// (cubridge numbers streams as DLPack does) and `max_version` when `versioned`, with the
/// device that `obj.__dlpack_device__()` announced (`None` without one, and for CuPy's arrays,
/// whose device is not asked: they are always CUDA memory, managed or not, and CuPy takes a
/// stream for either, while its `__dlpack_device__` asks the driver about the pointer on every
/// call). For producers without a usable exchange table (dlpark's import request would look
/// for one first, an attribute lookup that raises and swallows an exception on every call for
/// a type without one, and would consult one that may not be used), and for those that predate
/// `max_version`, asked again the legacy way.
fn protocol_capsule<'py>(
    obj: &Bound<'py, PyAny>,
    facts: TypeFacts,
    consumer: Stream,
    versioned: bool,
) -> PyResult<(Bound<'py, PyAny>, Option<Announced>)> {
    let announced = match facts.cupy {
        true => None,
        false => announced_device(obj)?,
    };
    let on_cuda = facts.cupy || announced.is_some_and(|(t, _)| t == DLDeviceType::CUDA.0);
    let capsule = call_dlpack(obj, versioned, on_cuda.then(|| consumer.dlpack()))?;
    if !is_capsule(&capsule) {
        return Err(no_capsule(&capsule));
    }
    Ok((capsule, announced))
}

/// A device as `__dlpack_device__` announces it: DLPack's device type and ordinal.
type Announced = (u32, i32);

/// The device `obj.__dlpack_device__()` announces. A producer without `__dlpack_device__`
/// (older ones) announces nothing; one whose `__dlpack_device__` fails gives its error, since
/// the stream handed over depends on it.
fn announced_device(obj: &Bound<'_, PyAny>) -> PyResult<Option<Announced>> {
    match obj.getattr(pyo3::intern!(obj.py(), "__dlpack_device__")) {
        Ok(method) => Ok(Some(
            producer!(ProducerQuery, method.call0())?.extract::<Announced>()?,
        )),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

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
    Err(Error::invalid(format!(
        "the producer announced DLPack device {announced:?} in __dlpack_device__ but exported \
         memory on {actual}"
    ))
    .into())
}

/// DLPack import: a versioned capsule is asked for first, with `consumer` as the stream for
/// CUDA producers (or, through the C exchange table, an event wait on the producer's work
/// stream); a producer whose `__dlpack__` predates `max_version` (it raises TypeError) is asked
/// again the legacy way.
pub(super) fn import_dlpack(
    obj: &Bound<'_, PyAny>,
    facts: TypeFacts,
    consumer: Stream,
    use_: Use,
) -> PyResult<Imported> {
    import_dlpack_raw(obj, facts, consumer, use_).map_err(|e| as_export_refusal(obj.py(), e))
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
    PyErr::from(Error::export(format!(
        "the DLPack export was refused: {first}"
    )))
}

fn import_dlpack_raw(
    obj: &Bound<'_, PyAny>,
    facts: TypeFacts,
    consumer: Stream,
    use_: Use,
) -> PyResult<Imported> {
    let py = obj.py();
    let consumer_stream = Consumer(consumer);
    let table = facts.table;
    let attempt = || -> PyResult<(ImportedDlpack, Option<Announced>)> {
        if is_capsule(obj) {
            return Ok((dlpark_import(obj.as_borrowed(), None, None)?, None));
        }
        if table != TableUse::Usable {
            let (capsule, announced) = protocol_capsule(obj, facts, consumer, true)?;
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
            let (capsule, announced) =
                protocol_capsule(obj, facts, consumer, false).map_err(|_| e)?;
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

    if table != TableUse::Absent {
        if let Some(refusal) = lazy_sign(obj, array.dtype().kind() == Kind::Complex) {
            return Err(refusal);
        }
    }
    // The producer ordered its work before `consumer`; a kept view records that stream as its
    // writer, so that later users on any stream wait for it (on the legacy default stream, the
    // usual one, the event is recorded only when such a user comes).
    let array = match use_ {
        Use::Kept => array.written_on(consumer)?,
        Use::Immediate => array,
    };
    Ok(Imported { array, copied })
}
