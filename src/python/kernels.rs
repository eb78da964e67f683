//! `cubridge.ElementwiseKernel` and `cubridge.RawKernel`: users' CUDA kernels on arrays from any
//! producer. Conversion only; the kernels live in `ops::elementwise` and `ops::raw`.

use super::operands::{import_operands, Access, Operands};
use super::types::PyArray;
use crate::error::Error;
use crate::ops::elementwise::spec::Spec;
use crate::ops::elementwise::ElementwiseKernel;
use crate::ops::raw::RawKernel;
use crate::ops::Arg;
use crate::phases::{phase, phase_at_end, timed_call};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

/// `ElementwiseKernel(in_params, out_params, operation, name="kernel", *, preamble="")`: an
/// elementwise CUDA kernel in CuPy's syntax, run on arrays of any producer. It is compiled by
/// NVRTC at its first call for each dtype signature.
///
/// As in CuPy, `size=` gives the number of indices where every array is raw (and is refused
/// otherwise), raw outputs left out are allocated with `size` elements, and a kernel may have
/// no outputs (`out_params=""`), writing through raw inputs; it then returns `()`.
///
/// Raises (construction): ValueError for a declaration it cannot parse.
///
/// Calling: `kernel(*inputs, *outputs, out=None, stream=None, size=None)` broadcasts the
/// inputs, allocates the outputs not given, runs on `stream` (default: the producer's current
/// stream, else the legacy default stream) and returns the output, or a tuple of them.
///
/// Raises (call):
/// - TypeError: the wrong number of arguments, or dtypes that fit no type parameter.
/// - ValueError: shapes that do not broadcast, arrays on different or non-CUDA devices, or a
///   read-only output.
/// - CompileError: NVRTC rejected the operation (the log is in the message).
/// - CudaError, CudaUnavailableError: a CUDA driver call failed, or CUDA is missing.
///
/// >>> square = cubridge.ElementwiseKernel("T x", "T y", "y = x * x", "square")
/// >>> y = square(torch.arange(4.0, device="cuda"))  # a new cubridge.Array on cuda:0
#[pyclass(name = "ElementwiseKernel", module = "cubridge", frozen)]
pub struct PyElementwiseKernel {
    inner: ElementwiseKernel,
    /// How a call uses each parameter's object: inputs read, outputs written.
    access: Vec<Access>,
}

/// `out=`: nothing, one array, or a tuple or list of them (one per output).
fn out_objects<'py>(
    out: Option<&Bound<'py, PyAny>>,
    nout: usize,
) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
    let Some(out) = out.filter(|o| !o.is_none()) else {
        return Ok(vec![None; nout]);
    };
    let items: Vec<Bound<'py, PyAny>> =
        if out.is_instance_of::<PyTuple>() || out.is_instance_of::<PyList>() {
            out.try_iter()?.collect::<PyResult<_>>()?
        } else {
            vec![out.clone()]
        };
    if items.len() != nout {
        return Err(Error::invalid(format!(
            "out= gives {} array(s); the kernel has {nout} output(s)",
            items.len()
        ))
        .into());
    }
    Ok(items
        .into_iter()
        .map(|o| if o.is_none() { None } else { Some(o) })
        .collect())
}

#[pymethods]
impl PyElementwiseKernel {
    #[new]
    #[pyo3(signature = (in_params, out_params, operation, name="kernel", *, preamble=""))]
    fn new(
        in_params: &str,
        out_params: &str,
        operation: &str,
        name: &str,
        preamble: &str,
    ) -> PyResult<Self> {
        let spec = Spec::new(in_params, out_params, operation, name, preamble)?;
        let access = (spec.inputs.iter().map(|_| Access::Read))
            .chain(spec.outputs.iter().map(|_| Access::Write))
            .collect();
        Ok(PyElementwiseKernel {
            inner: ElementwiseKernel::new(spec),
            access,
        })
    }

    /// The kernel's name.
    #[getter]
    fn name(&self) -> &str {
        &self.inner.spec().name
    }

    /// Runs the kernel: inputs, then optionally the outputs (positionally or as `out=`).
    /// `size` sets the number of indices where every array is raw (and only then), and the
    /// length of raw outputs to allocate.
    #[pyo3(signature = (*args, out=None, stream=None, size=None))]
    fn __call__(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        out: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
        size: Option<usize>,
    ) -> PyResult<Py<PyAny>> {
        timed_call!();
        let _restore = crate::cuda::context::Restore::new();
        let _later = crate::cuda::release::DropLater::new();
        let spec = self.inner.spec();
        phase!(Import);
        let CallOperands {
            operands,
            inputs,
            outputs,
            outs,
        } = call_operands(spec, args, out, stream, &self.access)?;
        phase!(Gil);
        let results = py.detach(|| -> crate::Result<Vec<crate::Array>> {
            phase!(Order);
            operands.order()?;
            phase!(Bind);
            phase_at_end!(Gil);
            // SAFETY: the operation is the Python user's CUDA C++, trusted as CuPy trusts an
            // ElementwiseKernel's: it indexes raw arrays within their sizes and touches nothing
            // beyond its parameters.
            unsafe { self.inner.call(&inputs, &outputs, operands.stream, size) }
        })?;
        phase!(Result);
        phase_at_end!(Exit);
        returned(py, outs, results)
    }
}

/// A kernel call's operands from Python, imported for the call's stream.
pub(super) struct CallOperands<'py> {
    /// The imported operands: the call runs `order` before its work, on `stream`.
    pub operands: Operands,
    /// The inputs, in the declaration's order.
    pub inputs: Vec<Arg>,
    /// The outputs given (`None` for each output to allocate).
    pub outputs: Vec<Option<crate::Array>>,
    /// The output objects as the call passed them, for [`returned`].
    pub outs: Vec<Option<Bound<'py, PyAny>>>,
}

/// The inputs and outputs of a call of a kernel declared by `spec` (outputs positionally after
/// the inputs or as `out=`), imported with `access` on the caller's `stream` or the producers'.
pub(super) fn call_operands<'py>(
    spec: &Spec,
    args: &Bound<'py, PyTuple>,
    out: Option<&Bound<'py, PyAny>>,
    stream: Option<&Bound<'py, PyAny>>,
    access: &[Access],
) -> PyResult<CallOperands<'py>> {
    let nin = spec.inputs.len();
    let args: Vec<Bound<'py, PyAny>> = args.iter().collect();
    let outs = outputs_passed(spec, &args, out)?;
    let explicit = super::stream::parse(stream)?;
    let objs: Vec<Option<&Bound<'py, PyAny>>> = args[..nin]
        .iter()
        .map(Some)
        .chain(outs.iter().map(Option::as_ref))
        .collect();
    let mut operands = import_operands(&objs, access, explicit)?;
    let mut items = std::mem::take(&mut operands.items).into_iter();
    let inputs: Vec<Arg> = items
        .by_ref()
        .take(nin)
        .map(|o| o.ok_or_else(|| Error::invalid("an input is None")))
        .collect::<Result<_, _>>()?;
    let outputs = items
        .map(|o| match o {
            Some(Arg::Array(a)) => Some(a),
            _ => None,
        })
        .collect();
    Ok(CallOperands {
        operands,
        inputs,
        outputs,
        outs,
    })
}

/// The output objects a call passed, positionally after the inputs or as `out=` (`None` for
/// each output to allocate).
pub(super) fn outputs_passed<'py>(
    spec: &Spec,
    args: &[Bound<'py, PyAny>],
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
    let (nin, nout) = (spec.inputs.len(), spec.outputs.len());
    if args.len() == nin {
        out_objects(out, nout)
    } else if args.len() == nin + nout {
        if out.is_some_and(|o| !o.is_none()) {
            return Err(Error::wrong_type("outputs given both positionally and as out=").into());
        }
        Ok(args[nin..].iter().map(|o| Some(o.clone())).collect())
    } else {
        Err(Error::wrong_type(format!(
            "{} takes {nin} input(s), optionally followed by its {nout} output(s); got {} \
             argument(s)",
            spec.name,
            args.len()
        ))
        .into())
    }
}

/// What a call returns: outputs given as themselves (like numpy's `out=`), new ones as arrays;
/// one output alone, several (or none, as CuPy returns for a kernel without outputs) as a
/// tuple.
pub(super) fn returned(
    py: Python<'_>,
    outs: Vec<Option<Bound<'_, PyAny>>>,
    results: Vec<crate::Array>,
) -> PyResult<Py<PyAny>> {
    let mut all = outs
        .into_iter()
        .zip(results)
        .map(|(given, result)| -> PyResult<Py<PyAny>> {
            Ok(match given {
                Some(o) => o.unbind(),
                None => Bound::new(py, PyArray::new(result))?.into_any().unbind(),
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    if all.len() == 1 {
        return Ok(all.remove(0));
    }
    Ok(PyTuple::new(py, all)?.into_any().unbind())
}

/// `RawKernel(source, name, options=None)`: a CUDA kernel from source (`extern "C"`), launched
/// on arrays of any producer; NVRTC compiles it at its first launch (or `compile()`).
///
/// Each array is passed as a pointer, which the kernel may write. cubridge cannot see which
/// pointers it writes, so an array whose producer does not allow writes (a tensor that requires
/// grad, a JAX array, a read-only numpy array or DLPack export, or cubridge's import of one) is
/// refused with ValueError; pass `readonly_ok=True` when the kernel only reads the read-only
/// arrays it is given.
///
/// Relocatable device code (options `-rdc=true` or `-dc`: device-side launches) is linked with
/// the CUDA device runtime, `libcudadevrt.a`, looked for where NVRTC is (the `nvidia` pip
/// packages, `CUDA_HOME/lib64`); the linked code is what the disk cache keeps.
///
/// Calling: `kernel(grid, block, args, *, shared_mem=0, stream=None, readonly_ok=False)`
/// launches `grid` blocks of `block` threads (ints or tuples of up to 3) with `args`, a tuple
/// of arrays (passed as pointers) and numpy scalars (passed as their C type), and returns None.
///
/// Raises (call):
/// - TypeError: `args` is not a tuple or list, or holds a Python scalar or an unreadable
///   object.
/// - ValueError: a grid or block CUDA cannot launch, arrays on different or non-CUDA devices,
///   or a read-only array without `readonly_ok=True`.
/// - CompileError: NVRTC rejected the source (the log is in the message).
/// - CudaError, CudaUnavailableError: a CUDA driver call failed, or CUDA is missing.
///
/// >>> src = 'extern "C" __global__ void inc(float* x) { x[threadIdx.x] += 1; }'
/// >>> k = cubridge.RawKernel(src, "inc")
/// >>> x = torch.zeros(32, device="cuda")
/// >>> k(1, 32, (x,))  # x is now all ones
#[pyclass(name = "RawKernel", module = "cubridge", frozen)]
pub struct PyRawKernel {
    inner: RawKernel,
}

/// A grid or block: an int or a sequence (a tuple, a list, a numpy array) of up to three, each
/// at least 1 and at most what CUDA launches (`limits`: x, y, z). Tuples, lists and ints are
/// read without raising: a launch reads two per call.
fn dims(obj: &Bound<'_, PyAny>, what: &str, limits: [u32; 3]) -> PyResult<[u32; 3]> {
    let shape_error = || {
        PyErr::from(Error::wrong_type(format!(
            "{what} must be an int or a tuple of up to 3 ints"
        )))
    };
    let not_positive =
        |text: &str| PyErr::from(Error::invalid(format!("{what} {text} must be positive")));
    let too_large = |text: &str| {
        PyErr::from(Error::invalid(format!(
            "{what} {text} is too large: CUDA takes at most {} in x, {} in y and {} in z",
            limits[0], limits[1], limits[2]
        )))
    };
    let items: Vec<Bound<'_, PyAny>>;
    let given: &[Bound<'_, PyAny>] = if let Ok(t) = obj.cast::<PyTuple>() {
        items = t.iter().collect();
        &items
    } else if let Ok(l) = obj.cast::<PyList>() {
        items = l.iter().collect();
        &items
    } else if obj.is_instance_of::<pyo3::types::PyInt>() {
        std::slice::from_ref(obj)
    } else if let Ok(sequence) = obj.extract::<Vec<Bound<'_, PyAny>>>() {
        items = sequence;
        &items
    } else {
        // Anything else that is an integer (numpy's ints).
        std::slice::from_ref(obj)
    };
    if given.is_empty() || given.len() > 3 {
        return Err(shape_error());
    }
    let mut values = [1i128; 3];
    for (k, item) in given.iter().enumerate() {
        values[k] = match super::int_value(item) {
            Ok(v) => v,
            // An int past 128 bits: past every limit on one side or the other.
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(obj.py()) => {
                let text = obj.repr()?.to_string();
                return Err(match item.lt(0) {
                    Ok(true) => not_positive(&text),
                    _ => too_large(&text),
                });
            }
            Err(_) => return Err(shape_error()),
        };
    }
    let values = &values[..given.len()];
    let mut out = [1u32; 3];
    for (k, &v) in values.iter().enumerate() {
        if v < 1 {
            return Err(not_positive(&format!("{values:?}")));
        }
        out[k] = u32::try_from(v)
            .ok()
            .filter(|&v| v <= limits[k])
            .ok_or_else(|| too_large(&format!("{values:?}")))?;
    }
    Ok(out)
}

/// The largest grid CUDA launches, per dimension.
const GRID_LIMITS: [u32; 3] = [i32::MAX as u32, 65535, 65535];
/// The largest block, per dimension (at most 1024 threads in all, which the launch checks).
const BLOCK_LIMITS: [u32; 3] = [1024, 1024, 64];

impl PyRawKernel {
    /// The Python class over `inner` (a module's function).
    pub(super) fn from_kernel(inner: RawKernel) -> Self {
        PyRawKernel { inner }
    }
}

#[pymethods]
impl PyRawKernel {
    #[new]
    #[pyo3(signature = (source, name, options=None))]
    fn new(source: &str, name: &str, options: Option<Vec<String>>) -> PyResult<Self> {
        Ok(PyRawKernel {
            inner: RawKernel::new(source, name, options.unwrap_or_default())?,
        })
    }

    /// The kernel's name.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// Compiles and loads the kernel on `device` (default: the current device) now.
    #[pyo3(signature = (device=None))]
    fn compile(&self, py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let _restore = crate::cuda::context::Restore::new();
        let device = crate::Device::Cuda(super::types::parse_cuda_device(device)?);
        Ok(py.detach(|| self.inner.compile(device))?)
    }

    /// Launches `grid` blocks of `block` threads with `args`: arrays of any producer (passed as
    /// pointers) and numpy scalars (passed as their C type). A read-only array is refused unless
    /// `readonly_ok` says the kernel only reads it.
    #[pyo3(signature = (grid, block, args, *, shared_mem=0, stream=None, readonly_ok=false))]
    fn __call__(
        &self,
        grid: &Bound<'_, PyAny>,
        block: &Bound<'_, PyAny>,
        args: &Bound<'_, PyAny>,
        shared_mem: u32,
        stream: Option<&Bound<'_, PyAny>>,
        readonly_ok: bool,
    ) -> PyResult<()> {
        let py = args.py();
        timed_call!();
        let _restore = crate::cuda::context::Restore::new();
        let _later = crate::cuda::release::DropLater::new();
        let (grid, block) = (
            dims(grid, "grid", GRID_LIMITS)?,
            dims(block, "block", BLOCK_LIMITS)?,
        );
        // Read in place: an iterator over them would ask for a length hint on every call.
        let objs: Vec<Bound<'_, PyAny>> = if let Ok(t) = args.cast::<PyTuple>() {
            t.iter().collect()
        } else if let Ok(l) = args.cast::<PyList>() {
            l.iter().collect()
        } else {
            return Err(Error::wrong_type("args must be a tuple or a list").into());
        };
        for o in &objs {
            if super::import::python_scalar(o)?.is_some() {
                return Err(Error::wrong_type(format!(
                    "a raw kernel cannot tell which C type a Python {} is; pass a numpy scalar \
                     of the parameter's type (numpy.int32(n), numpy.float32(x), ...)",
                    super::import::type_name(o)
                ))
                .into());
            }
        }
        let refs: Vec<Option<&Bound<'_, PyAny>>> = objs.iter().map(Some).collect();
        // The kernel may write any array it is given: those it must not write come in read-only.
        let access = vec![Access::Any; objs.len()];
        let explicit = super::stream::parse(stream)?;
        phase!(Import);
        let mut operands = import_operands(&refs, &access, explicit)?;
        let args: Vec<Arg> = std::mem::take(&mut operands.items)
            .into_iter()
            .map(|o| o.ok_or_else(|| Error::invalid("an argument could not be read")))
            .collect::<Result<_, _>>()?;
        phase!(Gil);
        py.detach(|| -> crate::Result<()> {
            phase!(Order);
            operands.order()?;
            phase!(Bind);
            phase_at_end!(Gil);
            // SAFETY: the kernel and its argument list are the Python user's, trusted as CuPy
            // trusts a RawKernel's: its parameters are one pointer per array and one C value per
            // numpy scalar, in order, and it stays inside the arrays it is given (and, with
            // readonly_ok, writes none of the read-only ones).
            unsafe {
                let stream = operands.stream;
                (self.inner).launch(grid, block, &args, shared_mem, stream, readonly_ok)
            }
        })?;
        phase!(Exit);
        Ok(())
    }
}
