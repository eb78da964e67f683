//! Users' elementwise kernels: an operation written in CUDA C++ once (CuPy's `ElementwiseKernel`
//! syntax, see [`spec`]), compiled per call signature with NVRTC, and run on arrays from any
//! producer with numpy broadcasting, any strides, outputs written in place or allocated, on a
//! given stream. The loop is planned as `add`'s ([`crate::ops::plan`]): dimensions merged where
//! contiguous, a vectorized path when every operand is contiguous and aligned, 32-bit indexing
//! where it fits; an operation that reads its index `i` walks the C order of the loop's shape.

pub mod params;
pub mod source;
pub mod spec;

use crate::array::Array;
use crate::cpu::element::Scalar;
use crate::cuda::kernels;
use crate::cuda::launch::{self as cuda_launch, Params, BLOCK};
use crate::cuda::stream::Stream;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::broadcast_shapes;
use crate::ops::launch::Launch;
use crate::ops::plan::{Operand, Plan, Variant};
use source::{Role, Signature};
use spec::Spec;
use std::collections::HashMap;
use std::sync::Mutex;

/// One argument of a call: an array (zero-copy), or a value for every index, with the dtype it
/// came with (`numpy.float32(2)`) or none (a Python scalar).
pub enum Arg {
    /// An array from any producer.
    Array(Array),
    /// A scalar.
    Value(Scalar, Option<DType>),
}

/// The loaded kernels of one signature on one device, and the vector kernel's width.
#[derive(Clone, Copy)]
struct Compiled {
    functions: [usize; 5],
    width: usize,
}

/// A user's elementwise kernel; see the module documentation.
pub struct ElementwiseKernel {
    spec: Spec,
    /// Per output: whether the operation may read it before writing it.
    reads: Vec<bool>,
    /// Whether the operation reads its index `i` (the loop then keeps C order).
    indexed: bool,
    compiled: Mutex<HashMap<(u32, Signature), Compiled>>,
    /// The signature of the last call and its kernels: a repeated call finds them without
    /// building a key.
    last: Mutex<Option<(u32, Signature, Compiled)>>,
}

impl ElementwiseKernel {
    /// The kernel of a parsed declaration ([`Spec::new`]); compiles nothing yet.
    pub fn new(spec: Spec) -> ElementwiseKernel {
        let reads = spec
            .outputs
            .iter()
            .map(|p| spec::reads_output(&spec.operation, &p.name))
            .collect();
        ElementwiseKernel {
            indexed: spec::uses_index(&spec.operation),
            spec,
            reads,
            compiled: Mutex::new(HashMap::new()),
            last: Mutex::new(None),
        }
    }

    /// The parsed declaration.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// Runs the kernel on `inputs` (one per input parameter) into `outputs` (one per output
    /// parameter: an array written in place, or `None` to allocate one of the broadcast shape on
    /// the inputs' device) on `stream`, after every array's pending writes; returns the outputs.
    /// `size` gives the number of indices when no array is broadcast over them (only raw arrays
    /// and scalars).
    ///
    /// # Safety
    /// The operation and preamble are the caller's CUDA C++, which cubridge cannot check: they
    /// may index raw arrays only within their sizes and must touch no memory beyond their
    /// parameters (and memory of their own).
    pub unsafe fn call(
        &self,
        inputs: &[Arg],
        outputs: &[Option<Array>],
        stream: Stream,
        size: Option<usize>,
    ) -> Result<Vec<Array>> {
        let spec = &self.spec;
        if !crate::cuda::is_available() {
            return Err(crate::cuda::unavailable_for(&spec.name));
        }
        let (nin, nout) = (spec.inputs.len(), spec.outputs.len());
        if inputs.len() != nin || outputs.len() != nout {
            return Err(Error::invalid(format!(
                "{} takes {nin} input(s) and {nout} output(s); got {} and {}",
                spec.name,
                inputs.len(),
                outputs.iter().filter(|o| o.is_some()).count()
            )));
        }
        let params: Vec<&spec::Param> = spec.params().collect();
        let mut roles = Vec::with_capacity(nin + nout);
        let mut arrays: Vec<Option<&Array>> = Vec::with_capacity(nin + nout);
        let mut given = Vec::with_capacity(nin + nout);
        let mut scalar = Vec::with_capacity(nin + nout);
        for (k, arg) in inputs.iter().enumerate() {
            match arg {
                Arg::Array(a) => {
                    roles.push(if params[k].raw {
                        Role::Raw
                    } else {
                        Role::Element
                    });
                    arrays.push(Some(a));
                    given.push(Some(a.dtype()));
                    scalar.push(None);
                }
                Arg::Value(v, d) => {
                    if params[k].raw {
                        return Err(Error::invalid(format!(
                            "{}: raw parameter {} needs an array, not a scalar",
                            spec.name, params[k].name
                        )));
                    }
                    roles.push(Role::Value);
                    arrays.push(None);
                    given.push(None);
                    scalar.push(Some(d.unwrap_or(v.default_dtype())));
                }
            }
        }
        for (j, out) in outputs.iter().enumerate() {
            let p = params[nin + j];
            if out.is_none() && p.raw {
                return Err(Error::invalid(format!(
                    "{}: raw output {} must be passed (its shape is not the loop's)",
                    spec.name, p.name
                )));
            }
            roles.push(if p.raw { Role::Raw } else { Role::Element });
            arrays.push(out.as_ref());
            given.push(out.as_ref().map(|o| o.dtype()));
            scalar.push(None);
        }
        let dtypes = spec.bind(&given, &scalar)?;
        for (k, arg) in inputs.iter().enumerate() {
            if let Arg::Value(v, _) = arg {
                crate::ops::create::check_value_kind(*v, dtypes[k], "an elementwise kernel")?;
            }
        }

        // One CUDA device for every array.
        let device = match arrays.iter().flatten().next() {
            Some(a) => a.device(),
            None => crate::cuda::current_device()?,
        };
        for (k, a) in arrays.iter().enumerate() {
            let Some(a) = a else { continue };
            if !matches!(a.device(), Device::Cuda(_)) || a.device() != device {
                return Err(Error::invalid(format!(
                    "{}: {} is on {}, but the kernel runs on {} (elementwise kernels run on one \
                     CUDA device)",
                    spec.name,
                    params[k].name,
                    a.device(),
                    if matches!(device, Device::Cuda(_)) {
                        device.to_string()
                    } else {
                        "a CUDA device".to_string()
                    }
                )));
            }
        }

        // The loop's shape: the broadcast of every element operand.
        let mut shape: Option<Vec<usize>> = None;
        for (k, a) in arrays.iter().enumerate() {
            if let (Some(a), Role::Element) = (a, roles[k]) {
                shape = Some(match shape {
                    None => a.shape().to_vec(),
                    Some(s) => broadcast_shapes(&s, a.shape())?,
                });
            }
        }
        let shape = match (shape, size) {
            (Some(s), None) => s,
            (Some(s), Some(size)) if s.iter().product::<usize>() == size => s,
            (Some(s), Some(size)) => {
                return Err(Error::invalid(format!(
                    "{}: size={size}, but the arrays broadcast to {} elements",
                    spec.name,
                    s.iter().product::<usize>()
                )))
            }
            (None, Some(size)) => vec![size],
            (None, None) => {
                return Err(Error::invalid(format!(
                    "{}: no array sets the number of indices; pass size=",
                    spec.name
                )))
            }
        };
        let element_inputs: Vec<&Array> = (0..nin)
            .filter(|&k| roles[k] == Role::Element)
            .filter_map(|k| arrays[k])
            .collect();
        for (j, out) in outputs.iter().enumerate() {
            if let (Some(out), Role::Element) = (out, roles[nin + j]) {
                crate::ops::add::check_out(out, &shape, dtypes[nin + j], &element_inputs)
                    .map_err(|e| name_error(e, &params[nin + j].name))?;
            } else if let Some(out) = out {
                if out.readonly() {
                    return Err(Error::ReadOnly(format!(
                        "{} is read-only: its producer does not allow writes",
                        params[nin + j].name
                    )));
                }
            }
        }

        let launch = Launch::begin(device, stream)?;
        let ordinal = launch.ordinal();
        // Compiled before anything is allocated: a compile error leaves nothing behind.
        let compiled = self.functions(ordinal, &dtypes, &roles)?;
        let mut outs = Vec::with_capacity(nout);
        for (j, out) in outputs.iter().enumerate() {
            outs.push(match out {
                Some(o) => o.clone(),
                None => launch.empty(&shape, dtypes[nin + j])?,
            });
        }
        let n: usize = shape.iter().product();
        if n == 0 {
            return Ok(outs);
        }
        // Every operand as the kernel sees it: element inputs broadcast to the loop's shape.
        let mut operands: Vec<Option<Array>> = Vec::with_capacity(nin + nout);
        for k in 0..nin {
            operands.push(match (arrays[k], roles[k]) {
                (Some(a), Role::Element) if a.shape() != shape => Some(a.broadcast_to(&shape)?),
                (Some(a), _) => Some(a.clone()),
                (None, _) => None,
            });
        }
        operands.extend(outs.iter().cloned().map(Some));
        let all: Vec<&Array> = operands.iter().flatten().collect();
        launch.order(&all)?;

        let elements: Vec<usize> = (0..nin + nout)
            .filter(|&k| roles[k] == Role::Element)
            .collect();
        let operand = |k: usize| {
            operands[k]
                .as_ref()
                .expect("an element operand is an array")
        };
        // The loop's plan over the element operands, led by the first element output (its
        // writes run along its unit stride), in C order when the operation reads its index.
        let planned: Vec<Operand<'_>> = elements.iter().map(|&k| Operand::of(operand(k))).collect();
        let lead = (!self.indexed).then(|| elements.iter().position(|&k| k >= nin).unwrap_or(0));
        let width = compiled.width;
        let plan = Plan::new(&shape, n, &planned, lead, width, false);
        let mut p = Params::new();
        let push_rest = |p: &mut Params, k: usize| -> Result<()> {
            match (&inputs.get(k), roles[k]) {
                (Some(Arg::Value(v, _)), Role::Value) => {
                    p.push_bytes(crate::cpu::copy::ElementBytes::new(dtypes[k], *v).as_bytes())
                }
                _ => p.push(params::Raw::new(operand(k))?),
            }
            Ok(())
        };
        let wide = plan.index == kernels::Index::I64;
        let (function, grid) = match plan.variant {
            Variant::Vector | Variant::Contiguous => {
                for (k, role) in roles.iter().enumerate() {
                    match role {
                        Role::Element => p.push(operand(k).data_ptr()),
                        _ => push_rest(&mut p, k)?,
                    }
                }
                p.push(n as i64);
                if plan.variant == Variant::Vector {
                    let f = compiled.functions[if wide { 2 } else { 1 }];
                    (f, plan.vector_blocks(width, BLOCK))
                } else {
                    let blocks = kernels::grid(ordinal, n.div_ceil(BLOCK as usize), BLOCK)?;
                    (compiled.functions[0], blocks)
                }
            }
            // (This family has no tiled variant: Plan::new was told so.)
            Variant::Strided | Variant::Tiled { .. } => {
                let g = params::Shape::new(&plan.shape)?;
                let mut next = plan.strides.iter();
                for (k, role) in roles.iter().enumerate() {
                    match role {
                        Role::Element => {
                            let s = next.next().expect("one stride list per element operand");
                            p.push(params::Strided::new(operand(k).data_ptr(), s));
                        }
                        _ => push_rest(&mut p, k)?,
                    }
                }
                p.push(n as i64);
                p.push(g);
                let blocks = kernels::grid(ordinal, n.div_ceil(BLOCK as usize), BLOCK)?;
                (compiled.functions[if wide { 4 } else { 3 }], blocks)
            }
        };
        let mut pointers = p.pointers();
        // SAFETY: the parameters follow the chosen kernel's signature as source::program writes
        // it for this signature (pointers or CbStrided per element operand, values of the
        // parameter's dtype, CbRaw per raw array, n, and CbShape for the strided kernels; the
        // structs mirror kernels/user.cuh). Every element operand spans the loop's shape within
        // its validated layout (broadcast views read, never written: outputs were checked to
        // have the loop's shape and not to overlap themselves or partially overlap an input);
        // the vector kernel is chosen only when every element pointer is aligned to its pack,
        // and the 32-bit kernels only when every index and offset fits (Plan::new). Raw arrays
        // are indexed by the user's operation, within their sizes (this function's contract).
        // The arrays are kept valid until the kernel has run (Launch::finish). Launch::order
        // made the device's context current, and the module was loaded there.
        unsafe {
            cuda_launch::launch(
                function as cudarc::driver::sys::CUfunction,
                (grid, 1, 1),
                (BLOCK, 1, 1),
                0,
                launch.stream().handle(),
                &mut pointers,
            )?
        };
        let input_arrays: Vec<&Array> = operands[..nin].iter().flatten().collect();
        let output_arrays: Vec<&Array> = outs.iter().collect();
        launch.finish(&input_arrays, &output_arrays)?;
        Ok(outs)
    }

    /// The kernels of a signature on `ordinal`, compiled on first use.
    fn functions(&self, ordinal: u32, dtypes: &[DType], roles: &[Role]) -> Result<Compiled> {
        {
            let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((o, sig, c)) = last.as_ref() {
                if *o == ordinal && sig.dtypes == dtypes && sig.roles == roles {
                    return Ok(*c);
                }
            }
        }
        let key = (
            ordinal,
            Signature {
                dtypes: dtypes.to_vec(),
                roles: roles.to_vec(),
            },
        );
        let found = self
            .compiled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .copied();
        let compiled = match found {
            Some(c) => c,
            None => {
                let program = source::program(&self.spec, &key.1, &self.reads);
                let f = kernels::program(ordinal, &program)?;
                let compiled = Compiled {
                    functions: [f[0], f[1], f[2], f[3], f[4]],
                    width: source::vector_width(&key.1),
                };
                self.compiled
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.clone(), compiled);
                compiled
            }
        };
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some((key.0, key.1, compiled));
        Ok(compiled)
    }
}

/// `e` with the output parameter's name in front, for messages about one of several outputs.
fn name_error(e: Error, name: &str) -> Error {
    match e {
        Error::Invalid(m) => Error::Invalid(format!("{name}: {m}")),
        Error::ReadOnly(m) => Error::ReadOnly(format!("{name}: {m}")),
        other => other,
    }
}
