//! Operands of kernels taken from Python: arrays of any producer (zero-copy), Python and numpy
//! scalars, and the stream the kernel runs on. Shared by users' kernels and by extension crates
//! (the public [`AnyArray`]).

use super::import::{exchanged, import, python_scalar, type_name, typed_numpy_scalar, Exchanged};
use super::stream::Use;
use crate::array::Array;
use crate::cpu::element::Scalar;
use crate::cuda::stream::{Stream, LEGACY};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Error;
use pyo3::prelude::*;

/// One operand as imported.
pub enum Operand {
    /// An array, viewed in place.
    Array(Array),
    /// A scalar, with its dtype when it came with one (a numpy scalar or another 0-d host
    /// array), `None` for a Python scalar.
    Value(Scalar, Option<DType>),
}

/// Operands imported together, with the stream their kernel runs on.
pub struct Operands {
    /// One per object asked for; `None` where the object was `None`.
    pub items: Vec<Option<Operand>>,
    /// The stream the kernel runs on: the caller's, else the first operand's producer's current
    /// work stream where it publishes one (the DLPack exchange table: PyTorch), else the legacy
    /// default stream.
    pub stream: Stream,
    /// Producers' streams the kernel's stream must wait for, by device ([`Operands::order`]).
    waits: Vec<(Stream, Device)>,
}

impl Operands {
    /// Makes the kernel's stream wait for the producers whose work it found on other streams
    /// (exchange-table imports, which hand over their stream instead of ordering). Call it
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

/// Refuses to write a tensor that requires grad: a write behind autograd's back would leave its
/// version counter still and the gradients wrong (torch's `__dlpack__` refuses it; its exchange
/// table does not).
pub fn refuse_autograd_write(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
    let grad = obj
        .getattr(pyo3::intern!(obj.py(), "requires_grad"))
        .and_then(|r| r.is_truthy())
        .unwrap_or(false);
    if grad {
        return Err(pyo3::exceptions::PyBufferError::new_err(format!(
            "{what} requires grad: writing it in place would hide the write from autograd; pass \
             .detach() or a tensor that does not require grad"
        )));
    }
    Ok(())
}

/// How a kernel uses one operand.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only: scalars and 0-d host arrays are values.
    Read,
    /// Written: must be an array.
    Write,
    /// A scalar is a value; an array may be written (a raw kernel's arguments).
    Any,
}

/// Imports `objs` (`None` entries stay `None`) for one kernel: Python and numpy scalars as
/// values, everything else as arrays without copying. Arrays that may be written (`access`)
/// must be their producer's own memory and not tensors that require grad; 0-d host arrays that
/// are only read become values of their dtype. `explicit` is the caller's `stream=`.
pub fn import_operands(
    objs: &[Option<&Bound<'_, PyAny>>],
    access: &[Access],
    explicit: Option<Stream>,
) -> PyResult<Operands> {
    // Scalars first (Python's, then numpy's, read by value); the rest may come through the
    // exchange table, which also names the producer's stream.
    let mut values: Vec<Option<Operand>> = Vec::with_capacity(objs.len());
    for (k, obj) in objs.iter().enumerate() {
        let value = match obj {
            None => None,
            Some(o) => match python_scalar(o)? {
                Some(v) => Some(Operand::Value(v, None)),
                None => typed_numpy_scalar(o)?.map(|(v, d)| Operand::Value(v, Some(d))),
            },
        };
        if let (Some(_), Access::Write, Some(o)) = (&value, access[k], obj) {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "a kernel output must be an array, not {}",
                type_name(o)
            )));
        }
        values.push(value);
    }
    let mut exchanges: Vec<Option<Exchanged>> = objs
        .iter()
        .zip(&values)
        .map(|(o, v)| match (o, v) {
            (Some(o), None) => exchanged(o),
            _ => None,
        })
        .collect();
    let stream = explicit
        .or_else(|| exchanges.iter().find_map(|e| e.as_ref()?.stream))
        .unwrap_or(LEGACY);
    let waits = exchanges
        .iter()
        .flatten()
        .filter_map(|e| {
            let s = e.stream?;
            (s != stream).then(|| (s, e.imported.array.device()))
        })
        .collect();
    let mut items = Vec::with_capacity(objs.len());
    for (k, (obj, value)) in objs.iter().zip(values).enumerate() {
        let Some(obj) = obj else {
            items.push(None);
            continue;
        };
        if value.is_some() {
            items.push(value);
            continue;
        }
        let written = access[k] != Access::Read;
        let imported = match exchanges[k].take() {
            Some(e) => {
                // The table skips the refusal that torch's __dlpack__ makes.
                if written {
                    refuse_autograd_write(obj, "an output")?;
                }
                e.imported
            }
            None => import(obj, stream, Use::Immediate)?,
        };
        let array = imported.array;
        if written && imported.copied {
            return Err(Error::invalid(
                "an output's producer exported a copy, so writes would not reach it",
            )
            .into());
        }
        if !written && array.ndim() == 0 && array.device().is_host_accessible() {
            // A 0-d host array (a 0-d numpy array, a CPU scalar tensor) is a value.
            // SAFETY: a 0-d host-accessible array has one valid element at its data pointer.
            let v = unsafe { crate::cpu::copy::read_scalar(array.dtype(), array.data_ptr(), 0) };
            items.push(Some(Operand::Value(v, Some(array.dtype()))));
            continue;
        }
        items.push(Some(Operand::Array(array)));
    }
    Ok(Operands {
        items,
        stream,
        waits,
    })
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

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<AnyArray> {
        let obj = obj.to_owned();
        if let Some(e) = exchanged(&obj) {
            // The table hands over its stream instead of ordering: an event there stands for
            // the producer's pending work.
            let array = match (e.stream, e.imported.array.device()) {
                (Some(s), Device::Cuda(n)) => {
                    let event = crate::cuda::stream::Event::record(s, n)?;
                    e.imported.array.with_pending(s, event)
                }
                _ => e.imported.array,
            };
            return Ok(AnyArray {
                array,
                stream: e.stream,
            });
        }
        let imported = import(&obj, LEGACY, Use::Kept)?;
        Ok(AnyArray {
            array: imported.array,
            stream: None,
        })
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
