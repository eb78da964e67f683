//! The CUDA array interface (`__cuda_array_interface__`, versions 2 and 3) as a consumer:
//! CuPy's, Numba's and PyTorch's device arrays without copying, and the stream a v3 producer
//! names.

use super::dlpack::{type_facts, Exchanged, TableUse};
use super::{cubridge_array, is_numpy_ndarray, Imported};
use crate::array::Array;
use crate::cuda::{memory, stream as cs};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Error;
use crate::python::stream::Use;
use crate::view::{from_descriptor, Descriptor};
use pyo3::exceptions::PyAttributeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A kernel operand through its CUDA array interface, where that is version 3 and the producer
/// has no DLPack (Numba): the interface names the stream its pending writes are on (the
/// producer's current stream), on which the kernel can run with no event between them, or none
/// when nothing is pending.
/// `None` for anything else (an exchange-table producer, JAX's version-2 interface), which
/// [`import`] answers, as it does an interface it cannot read.
pub fn lent_cai(obj: &Bound<'_, PyAny>) -> Option<Exchanged> {
    if cubridge_array(obj).is_some() || is_numpy_ndarray(obj) {
        return None;
    }
    let facts = type_facts(obj);
    // DLPack producers take DLPack: for CuPy, its export costs less than its interface dict.
    if !facts.cai || facts.dlpack || facts.immutable || facts.table == TableUse::Usable {
        return None;
    }
    let described = describe(obj).ok()??;
    if described.version < 3 {
        return None;
    }
    Some(Exchanged {
        imported: Imported::zero_copy(described.array),
        stream: described.stream,
    })
}

fn get<'py>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(d.get_item(key)?.filter(|v| !v.is_none()))
}

fn bad(msg: impl Into<String>) -> PyErr {
    Error::invalid(format!("__cuda_array_interface__: {}", msg.into())).into()
}

/// What an object's CUDA array interface describes: a view holding the object, on device
/// `ordinal`, with the stream its pending writes are on where the interface names one (version
/// 3), and the interface's version.
pub struct Described {
    pub array: Array,
    pub stream: Option<cs::Stream>,
    pub ordinal: u32,
    pub version: i64,
}

/// A view of an object's CUDA array interface, ordered before `consumer` (with an event of its
/// own when kept, see [`Use`]), or `None` when the object has none.
pub fn import(obj: &Bound<'_, PyAny>, consumer: cs::Stream, use_: Use) -> PyResult<Option<Array>> {
    let Some(Described {
        array,
        stream,
        ordinal,
        version,
    }) = describe(obj)?
    else {
        return Ok(None);
    };
    match stream {
        Some(p) => cs::order(consumer, p, ordinal)?,
        // Before version 3 the interface has no stream, and producers hand over memory whose
        // writes may still be queued: torch's on the legacy default stream, JAX's computations
        // on its blocking streams, which the legacy default stream waits for. A consumer on
        // another stream waits for that one. (What a producer queues on a non-blocking stream
        // it does not name, as JAX's host-to-device copies, no consumer can order after.)
        None if version < 3 => cs::order(consumer, cs::LEGACY, ordinal)?,
        None => {}
    }
    if use_ == Use::Immediate {
        return Ok(Some(array));
    }
    Ok(Some(array.with_pending(
        consumer,
        cs::Event::record(consumer, ordinal)?,
    )))
}

/// Key `key` of an interface, which must be there and be `what`.
fn required<T: for<'a, 'py> FromPyObject<'a, 'py>>(
    d: &Bound<'_, PyDict>,
    key: &str,
    what: &str,
) -> PyResult<T> {
    get(d, key)?
        .ok_or_else(|| bad(format!("missing '{key}'")))?
        .extract()
        .map_err(|_| bad(format!("'{key}' must be {what}")))
}

/// An interface's strides in elements (none: C-contiguous).
fn element_strides(d: &Bound<'_, PyDict>, dtype: DType) -> PyResult<Option<Vec<i64>>> {
    let Some(s) = get(d, "strides")? else {
        return Ok(None);
    };
    let bytes: Vec<i64> = s
        .extract()
        .map_err(|_| bad("'strides' must be a tuple of ints"))?;
    let element = |&b: &i64| crate::layout::element_stride(b, dtype.itemsize());
    let elements = bytes.iter().map(element).collect::<crate::Result<_>>();
    elements.map(Some).map_err(|e| bad(e.to_string()))
}

/// The stream an interface (version 3) says its pending writes are on, if it names one.
fn producer_stream(d: &Bound<'_, PyDict>) -> PyResult<Option<cs::Stream>> {
    let Some(s) = get(d, "stream")? else {
        return Ok(None);
    };
    let v = crate::python::int_value(&s).map_err(|_| bad("'stream' must be an int or None"))?;
    if v == 0 {
        return Err(bad("stream 0 is disallowed by version 3 of the interface"));
    }
    Ok(Some(cs::Stream::from_dlpack(v)?))
}

/// The view an object's CUDA array interface describes, not yet ordered after its producer's
/// pending writes, or `None` when the object has none.
pub fn describe(obj: &Bound<'_, PyAny>) -> PyResult<Option<Described>> {
    let py = obj.py();
    let cai =
        match crate::phases::producer!(ProducerExport, obj.getattr("__cuda_array_interface__")) {
            Ok(c) => c,
            Err(e) if e.is_instance_of::<PyAttributeError>(py) => return Ok(None),
            Err(e) => return Err(e),
        };
    let d = cai
        .cast::<PyDict>()
        .map_err(|_| PyErr::from(Error::wrong_type("__cuda_array_interface__ must be a dict")))?;
    let version: i64 = required(d, "version", "an int")?;
    if !(0..=3).contains(&version) {
        return Err(bad(format!(
            "version {version} is not supported (0 to 3 are)"
        )));
    }
    let shape: Vec<i64> = required(d, "shape", "a tuple of ints")?;
    let typestr: String = required(d, "typestr", "a str")?;
    let dtype = DType::from_typestr(&typestr)?;
    let (ptr, readonly): (usize, bool) = required(d, "data", "a (pointer, read-only) tuple")?;
    if get(d, "mask")?.is_some() {
        return Err(bad("masked arrays are not supported"));
    }
    let strides = element_strides(d, dtype)?;
    // The layout is checked before anything is asked of the driver.
    crate::layout::Layout::from_untrusted(&shape, strides.as_deref(), 0, dtype.itemsize())
        .map_err(|e| bad(e.to_string()))?;
    let producer_stream = producer_stream(d)?;
    let device = if ptr != 0 {
        memory::pointer_device(ptr).map_err(|e| match e {
            Error::Invalid(why) => bad(why),
            other => other.into(),
        })?
    } else {
        crate::cuda::current_device()?
    };
    let Device::Cuda(ordinal) = device else {
        return Err(bad(format!("{ptr:#x} is not CUDA device memory")));
    };
    let descriptor = Descriptor {
        data: ptr,
        byte_offset: 0,
        shape: &shape,
        strides: strides.as_deref(),
        dtype,
        device,
        readonly,
        len_bytes: None,
    };
    let keepalive = crate::python::Holder::new(obj);
    // SAFETY: the interface's contract: the memory stays valid while the exporting object lives,
    // and the view holds a strong reference to it.
    let array = unsafe { from_descriptor(&descriptor, Box::new(keepalive))? };
    Ok(Some(Described {
        array,
        stream: producer_stream,
        ordinal,
        version,
    }))
}
