//! Operands of kernels taken from Python: arrays of any producer (zero-copy), Python and numpy
//! scalars, and the stream the kernel runs on. Shared by users' kernels and by extension crates
//! (the public [`AnyArray`]).

use super::import::{
    cubridge_array, current_stream, exchanged, import, is_numpy_ndarray, lent_cai, python_scalar,
    type_name, typed_numpy_scalar, Exchanged,
};
use super::stream::Use;
use crate::array::Array;
use crate::cuda::stream::{Stream, LEGACY};
use crate::device::Device;
use crate::error::Error;
use crate::ops::Arg;
use pyo3::prelude::*;

/// Operands imported together, with the stream their kernel runs on.
pub struct Operands {
    /// One per object asked for; `None` where the object was `None`.
    pub items: Vec<Option<Arg>>,
    /// The stream the kernel runs on: the caller's, else the first operand's producer's current
    /// work stream where it names one (the DLPack exchange table: PyTorch; a version-3 CUDA
    /// array interface: Numba; CuPy's current stream), else the legacy default stream.
    pub stream: Stream,
    /// Producers' streams the kernel's stream must wait for, by device ([`Operands::order`]).
    waits: Waits,
}

impl Operands {
    /// Makes the kernel's stream wait for the producers whose work it found on other streams
    /// (producers that name their stream instead of ordering). Call it
    /// without the GIL: the driver may wait on its own locks.
    pub fn order(&self) -> crate::Result<()> {
        for &(producer, device) in &self.waits {
            if let Device::Cuda(n) = device {
                crate::cuda::stream::order(self.stream, producer, n)?;
            }
        }
        Ok(())
    }
}

/// Refuses to write `obj` in place where its producer forbids it: a tensor that requires grad
/// (BufferError: a write behind autograd's back would leave its version counter still and the
/// gradients wrong; torch's `__dlpack__` refuses it, its exchange table does not) or a JAX array
/// (ValueError: immutable, and other arrays may share its memory). `what` names the operand.
pub fn refuse_write(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
    match super::import::write_refusal(obj, what) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// How a kernel uses one operand.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only: scalars and 0-d host arrays are values.
    Read,
    /// Written: must be an array.
    Write,
    /// A scalar is a value; an array may be written, and is marked read-only where its producer
    /// forbids writes or exported a copy (a raw kernel's arguments, which the kernel refuses
    /// unless told that it only reads them).
    Any,
}

/// Imports `objs` (`None` entries stay `None`) for one kernel: Python and numpy scalars as
/// values, everything else as arrays without copying. Outputs (`access`) must be their
/// producer's own memory and not tensors that require grad; arrays of [`Access::Any`] are marked
/// read-only instead; 0-d host arrays that are only read become values of their dtype.
/// `explicit` is the caller's `stream=`.
pub fn import_operands(
    objs: &[Option<&Bound<'_, PyAny>>],
    access: &[Access],
    explicit: Option<Stream>,
) -> PyResult<Operands> {
    // Scalars first (Python's, then numpy's, read by value); the rest may come through the
    // exchange table, which also names the producer's stream.
    let mut values: Vec<Option<Arg>> = Vec::with_capacity(objs.len());
    for (k, obj) in objs.iter().enumerate() {
        let value = match obj {
            // cubridge's and numpy's arrays, the common cases, are no scalars (a 0-d numpy
            // array that is only read becomes a value below).
            Some(o) if cubridge_array(o).is_some() || is_numpy_ndarray(o) => None,
            None => None,
            Some(o) => match python_scalar(o)? {
                Some(v) => Some(Arg::Value(v, None)),
                None => typed_numpy_scalar(o)?.map(|(v, d)| Arg::Value(v, Some(d))),
            },
        };
        if let (Some(_), Access::Write, Some(o)) = (&value, access[k], obj) {
            return Err(Error::wrong_type(format!(
                "a kernel output must be an array, not {}",
                type_name(o)
            ))
            .into());
        }
        values.push(value);
    }
    let arrays: Vec<Option<&Bound<'_, PyAny>>> = objs
        .iter()
        .zip(&values)
        .map(|(o, v)| o.filter(|_| v.is_none()))
        .collect();
    let mut taken: Vec<Option<Array>> = vec![None; objs.len()];
    let (stream, waits) = take_arrays(&arrays, access, explicit, &mut taken)?;
    // The arrays join the values in place: one list, in the objects' order.
    for (k, array) in taken.into_iter().enumerate() {
        let Some(array) = array else {
            continue;
        };
        values[k] = Some(
            if access[k] == Access::Read && array.ndim() == 0 && array.device().is_host_accessible()
            {
                // A 0-d host array (a 0-d numpy array, a CPU scalar tensor) is a value.
                // SAFETY: a 0-d host-accessible array has one valid element at its data pointer.
                let v =
                    unsafe { crate::cpu::copy::read_scalar(array.dtype(), array.data_ptr(), 0) };
                Arg::Value(v, Some(array.dtype()))
            } else {
                Arg::Array(array)
            },
        );
    }
    Ok(Operands {
        items: values,
        stream,
        waits,
    })
}

/// Producers' streams that a kernel's stream must wait for, by device.
pub(crate) type Waits = Vec<(Stream, Device)>;

/// Imports the arrays `objs` for one kernel into `arrays` (one entry each; `None` objects are
/// left alone) without copying, and returns the kernel's stream and what it must wait for.
/// numpy arrays are read directly. Producers that name the stream of their pending work come
/// first (the C exchange table's current work stream: PyTorch; a version-3 CUDA array
/// interface's stream: Numba): the kernel runs on `explicit` (the caller's `stream=`), else the
/// first such stream, else CuPy's current stream when an operand is CuPy's, else the legacy
/// default stream; the other named streams are waited for. Every other object is then imported
/// with the kernel's stream as its consumer (CuPy orders its own work before it, with no event
/// when it is CuPy's current stream). An output ([`Access::Write`]) must be its producer's own
/// memory, and one it allows to be written ([`refuse_write`]); an [`Access::Any`] array is marked
/// read-only where either fails ([`usable`]).
pub(crate) fn take_arrays(
    objs: &[Option<&Bound<'_, PyAny>>],
    access: &[Access],
    explicit: Option<Stream>,
    arrays: &mut [Option<Array>],
) -> PyResult<(Stream, Waits)> {
    // SAFETY: nothing is lent.
    unsafe { take(objs, access, explicit, arrays, &mut []) }
}

/// As [`take_arrays`], but numpy arrays come as views lent for the call
/// ([`super::import::ndarray::lend`]): the view holds no reference and allocates nothing. For
/// each array lent, a strong reference to its object goes into `held` (one entry per object)
/// as it is lent.
///
/// # Safety
/// The caller keeps `held` until every array taken, and every array made from one, is dropped,
/// which happens before the call returns: none is returned to Python, exported, kept, or handed
/// to CUDA work (a host array's kernel runs on the host, within the call). Python code may run
/// meanwhile (a later operand's export, another thread while the interpreter is let go): the
/// reference keeps numpy from resizing an array in use, as the one a held view takes does.
pub(crate) unsafe fn lend_arrays<'py>(
    objs: &[Option<&Bound<'py, PyAny>>],
    access: &[Access],
    explicit: Option<Stream>,
    arrays: &mut [Option<Array>],
    held: &mut [Option<Bound<'py, PyAny>>],
) -> PyResult<(Stream, Waits)> {
    debug_assert_eq!(held.len(), objs.len(), "one slot per object");
    // SAFETY: the caller's contract.
    unsafe { take(objs, access, explicit, arrays, held) }
}

/// [`take_arrays`], numpy arrays lent where `held` has an entry per object ([`lend_arrays`]);
/// none are lent where it is empty.
///
/// # Safety
/// Where `held` is not empty, [`lend_arrays`]'s contract.
unsafe fn take<'py>(
    objs: &[Option<&Bound<'py, PyAny>>],
    access: &[Access],
    explicit: Option<Stream>,
    arrays: &mut [Option<Array>],
    held: &mut [Option<Bound<'py, PyAny>>],
) -> PyResult<(Stream, Waits)> {
    let mut producers: Waits = Vec::new();
    // The current stream of a producer that does not hand its work over (CuPy's).
    let mut current: Option<Stream> = None;
    let mut streams = super::import::exchange::WorkStreams::default();
    for (k, obj) in objs.iter().enumerate() {
        if let (Some(obj), Access::Write) = (obj, access[k]) {
            refuse_write(obj, "an output")?;
        }
    }
    for (k, obj) in objs.iter().enumerate() {
        let Some(obj) = obj else {
            continue;
        };
        // cubridge's and numpy's arrays (no producer's stream, never a copy) are read directly.
        if let Some(a) = cubridge_array(obj) {
            arrays[k] = Some(a.get().inner.clone());
            continue;
        }
        // Written in place: an array is large enough that moving it costs.
        arrays[k] = match held.get_mut(k) {
            Some(hold) => {
                // SAFETY: the caller's contract; the object is held here, before any Python
                // code runs.
                let lent = unsafe { super::import::ndarray::lend(obj) };
                if lent.is_some() {
                    *hold = Some((*obj).clone());
                }
                lent
            }
            None => super::import::ndarray::import(obj),
        };
        if arrays[k].is_some() {
            continue;
        }
        let Some(e) = exchanged(obj, Use::Immediate, &mut streams).or_else(|| lent_cai(obj)) else {
            if current.is_none() {
                current = current_stream(obj);
            }
            continue;
        };
        let Exchanged { imported, stream } = e;
        if let Some(s) = stream {
            producers.push((s, imported.array.device()));
        }
        arrays[k] = Some(usable(obj, imported, access[k])?);
    }
    let stream = explicit
        .or_else(|| producers.first().map(|p| p.0))
        .or(current)
        .unwrap_or(LEGACY);
    producers.retain(|p| p.0 != stream);
    for (k, obj) in objs.iter().enumerate() {
        if let (Some(obj), None) = (obj, &arrays[k]) {
            let imported = import(obj, stream, Use::Immediate)?;
            arrays[k] = Some(usable(obj, imported, access[k])?);
        }
    }
    Ok((stream, producers))
}

/// The array `obj` imported as, as a kernel may use it: an output is refused where the producer
/// exported a copy (writes would not reach it); an [`Access::Any`] array is marked read-only
/// there and where the producer forbids writes, for the kernel to decide.
fn usable(
    obj: &Bound<'_, PyAny>,
    imported: super::import::Imported,
    access: Access,
) -> PyResult<Array> {
    match access {
        Access::Write if imported.copied => Err(Error::invalid(
            "an output's producer exported a copy (the DLPack IS_COPIED flag), so writes would \
             not reach it",
        )
        .into()),
        Access::Any if imported.copied || super::import::write_refusal(obj, "").is_some() => {
            Ok(imported.array.with_readonly(true))
        }
        _ => Ok(imported.array),
    }
}

/// Any Python array (a cubridge array, or any DLPack, DLPack-exchange-table, CUDA array
/// interface or buffer-protocol producer: torch, CuPy, JAX, Numba, numpy, ...) as a cubridge
/// [`Array`], without copying, for a `#[pyfunction]` argument. It keeps its producer alive.
///
/// Its pending work is ordered before anything queued after it: for a CUDA producer an event
/// follows that work, which [`crate::ops::launch::Launch::order`] makes the launch's stream
/// wait for. [`AnyArray::stream`] is the producer's current work stream where it publishes one
/// (PyTorch's `torch.cuda.current_stream()`), where a kernel usually belongs.
///
/// ```ignore
/// #[pyfunction]
/// fn total_bytes(x: cubridge::python::AnyArray) -> usize {
///     x.array().nbytes()
/// }
/// ```
pub struct AnyArray {
    array: Array,
    stream: Option<Stream>,
}

impl AnyArray {
    /// The array.
    pub fn array(&self) -> &Array {
        &self.array
    }

    /// The array, owned.
    pub fn into_array(self) -> Array {
        self.array
    }

    /// The producer's current work stream, where it published one (CUDA arrays from PyTorch).
    pub fn stream(&self) -> Option<Stream> {
        self.stream
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for AnyArray {
    type Error = PyErr;

    /// Imported by the process's runtime (its Python layer's services, relayed in an extension).
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<AnyArray> {
        let (array, stream) = (super::runtime::services().import)(&obj)?;
        Ok(AnyArray { array, stream })
    }
}

/// The stream a kernel over `arrays` should run on: `explicit` (a `stream=` argument: an int,
/// a torch or CuPy stream, anything with `__cuda_stream__`) when given, else the first array's
/// producer's current work stream, else the legacy default stream.
pub fn work_stream(explicit: Option<&Bound<'_, PyAny>>, arrays: &[&AnyArray]) -> PyResult<Stream> {
    Ok(super::stream::parse(explicit)?
        .or_else(|| arrays.iter().find_map(|a| a.stream))
        .unwrap_or(LEGACY))
}
