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
use crate::cuda::stream::Stream;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::broadcast_shapes;
use crate::ops::launch::Launch;
use crate::ops::plan::{Operand, Plan, Variant};
use params::{Kernel, Param};
use source::{Role, Signature};
use spec::Spec;
use std::borrow::Cow;
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
    /// Per parameter (inputs, then outputs): whether it is `raw`.
    raw: Vec<bool>,
    /// Per output: whether the operation may read it before writing it.
    reads: Vec<bool>,
    /// Whether the operation reads its index `i` (the loop then keeps C order).
    indexed: bool,
    compiled: Mutex<HashMap<(u32, Signature), Compiled>>,
    /// The tiled kernels of a signature on a device (32- and 64-bit), compiled when a
    /// transposed layout first needs them.
    tiled: Mutex<HashMap<(u32, Signature), [usize; 2]>>,
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
            raw: spec.params().map(|p| p.raw).collect(),
            spec,
            reads,
            compiled: Mutex::new(HashMap::new()),
            tiled: Mutex::new(HashMap::new()),
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
        let param = |k: usize| {
            if k < nin {
                &spec.inputs[k]
            } else {
                &spec.outputs[k - nin]
            }
        };
        let array = |k: usize| -> Option<&Array> {
            match inputs.get(k) {
                Some(Arg::Array(a)) => Some(a),
                Some(Arg::Value(..)) => None,
                None => outputs[k - nin].as_ref(),
            }
        };
        // Per parameter: its role, the dtype of the array passed for it, and that of a scalar.
        let mut roles = Vec::with_capacity(nin + nout);
        let mut given = Vec::with_capacity(nin + nout);
        let mut scalars = vec![None; nin + nout];
        for (k, arg) in inputs.iter().enumerate() {
            let raw = self.raw[k];
            match arg {
                Arg::Array(a) => {
                    roles.push(if raw { Role::Raw } else { Role::Element });
                    given.push(Some(a.dtype()));
                }
                Arg::Value(v, d) => {
                    if raw {
                        return Err(Error::invalid(format!(
                            "{}: raw parameter {} needs an array, not a scalar",
                            spec.name,
                            param(k).name
                        )));
                    }
                    roles.push(Role::Value);
                    given.push(None);
                    scalars[k] = Some(d.unwrap_or(v.default_dtype()));
                }
            }
        }
        for (j, out) in outputs.iter().enumerate() {
            let raw = self.raw[nin + j];
            if out.is_none() && raw {
                return Err(Error::invalid(format!(
                    "{}: raw output {} must be passed (its shape is not the loop's)",
                    spec.name,
                    param(nin + j).name
                )));
            }
            roles.push(if raw { Role::Raw } else { Role::Element });
            given.push(out.as_ref().map(|o| o.dtype()));
        }
        let dtypes = spec.bind(&given, &scalars)?;
        for (k, arg) in inputs.iter().enumerate() {
            if let Arg::Value(v, _) = arg {
                crate::ops::create::check_value_kind(*v, dtypes[k], "an elementwise kernel")?;
            }
        }

        // One CUDA device for every array.
        let device = match (0..nin + nout).find_map(array) {
            Some(a) => a.device(),
            None => crate::cuda::current_device()?,
        };
        for k in 0..nin + nout {
            let Some(a) = array(k) else { continue };
            if !matches!(a.device(), Device::Cuda(_)) || a.device() != device {
                return Err(Error::invalid(format!(
                    "{}: {} is on {}, but the kernel runs on {} (elementwise kernels run on one \
                     CUDA device)",
                    spec.name,
                    param(k).name,
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
        for (k, role) in roles.iter().enumerate() {
            if let (Some(a), Role::Element) = (array(k), role) {
                shape = Some(match shape {
                    None => a.shape().to_vec(),
                    Some(s) if s == a.shape() => s,
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
        if outputs.iter().any(Option::is_some) {
            let element_inputs: Vec<&Array> = (0..nin)
                .filter(|&k| roles[k] == Role::Element)
                .filter_map(array)
                .collect();
            for (j, out) in outputs.iter().enumerate() {
                if let (Some(out), Role::Element) = (out, roles[nin + j]) {
                    crate::ops::add::check_out(out, &shape, dtypes[nin + j], &element_inputs)
                        .map_err(|e| name_error(e, &param(nin + j).name))?;
                } else if let Some(out) = out {
                    if out.readonly() {
                        return Err(Error::ReadOnly(format!(
                            "{} is read-only: its producer does not allow writes",
                            param(nin + j).name
                        )));
                    }
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
        // Every operand as the kernel sees it (element inputs broadcast to the loop's shape,
        // borrowed where they have it already), inputs then outputs.
        let mut operands: Vec<Option<Cow<'_, Array>>> = Vec::with_capacity(nin + nout);
        for (k, role) in roles.iter().enumerate().take(nin) {
            operands.push(match (array(k), role) {
                (Some(a), Role::Element) if a.shape() != shape => {
                    Some(Cow::Owned(a.broadcast_to(&shape)?))
                }
                (Some(a), _) => Some(Cow::Borrowed(a)),
                (None, _) => None,
            });
        }
        operands.extend(outs.iter().map(|o| Some(Cow::Borrowed(o))));
        let all: Vec<&Array> = operands.iter().flatten().map(|a| &**a).collect();
        launch.order(&all)?;

        let operand = |k: usize| -> &Array {
            operands[k]
                .as_deref()
                .expect("an element operand is an array")
        };
        let is_element = |k: &usize| roles[*k] == Role::Element;
        // The loop's plan over the element operands, led by the first element output (its
        // writes run along its unit stride), in C order when the operation reads its index.
        let planned: Vec<Operand<'_>> = (0..nin + nout)
            .filter(is_element)
            .map(|k| Operand::of(operand(k)))
            .collect();
        let lead = (!self.indexed).then(|| {
            (0..nin + nout)
                .filter(is_element)
                .position(|k| k >= nin)
                .unwrap_or(0)
        });
        let width = compiled.width;
        // Signatures of one or two element inputs and one output also take the tiled kernel,
        // add's, for a transposed input (never when the operation reads its index).
        let tile_operands = lead
            .is_some()
            .then(|| source::tile_operands(&roles, nin, &self.reads))
            .flatten();
        let plan = Plan::new(&shape, n, &planned, lead, width, tile_operands.is_some());
        let wide = plan.index == kernels::Index::I64;
        let flat = |function: usize| {
            Kernel::flat(
                function as cudarc::driver::sys::CUfunction,
                &plan,
                ordinal,
                width,
            )
        };
        let kernel = match (plan.variant, tile_operands) {
            (Variant::Vector, _) => flat(compiled.functions[if wide { 2 } else { 1 }])?,
            (Variant::Contiguous, _) => flat(compiled.functions[0])?,
            (Variant::Tiled { mask }, Some((a, b, out))) => {
                let f = self.tiled_functions(ordinal, &dtypes, &roles)?[usize::from(wide)];
                let b_dtype = dtypes[b.unwrap_or(a)];
                let pairs = kernels::pairs([dtypes[a], b_dtype, dtypes[out]]);
                params::tiled_kernel(
                    (f as cudarc::driver::sys::CUfunction, pairs),
                    &plan,
                    mask,
                    (operand(a), b.map(operand), b_dtype),
                    operand(out),
                )
            }
            // (Plan::new tiles only signatures that tile_operands accepts.)
            (Variant::Strided | Variant::Tiled { .. }, _) => {
                flat(compiled.functions[if wide { 4 } else { 3 }])?
            }
        };
        let mut list = Vec::with_capacity(nin + nout);
        for (k, role) in roles.iter().enumerate() {
            list.push(match (role, inputs.get(k)) {
                (Role::Element, _) => Param::Element(operand(k)),
                (Role::Value, Some(Arg::Value(v, _))) => {
                    Param::Value(crate::cpu::copy::ElementBytes::new(dtypes[k], *v))
                }
                _ => Param::Raw(operand(k)),
            });
        }
        // SAFETY: source::program writes this signature's kernels with the parameters of their
        // variant as kernels/abi.cuh lays them out (values of the parameter's dtype, CbRaw per
        // raw array), and the function is the plan's variant and index width. Every element
        // operand spans the loop's shape within its validated layout (broadcast views read,
        // never written: outputs were checked to have the loop's shape and not to overlap
        // themselves or partially overlap an input); the vector kernel is chosen only when every
        // element pointer is aligned to its pack, and the 32-bit kernels only when every index
        // and offset fits (Plan::new); the tiled kernel (source::tiled_program) only where out
        // has unit stride along cols and the tiled inputs along rows, with the shared memory of
        // its tiles (params::tiled_kernel). Raw arrays are indexed by the user's operation,
        // within their sizes (this function's contract). The arrays are kept valid until the kernel has
        // run (Launch::finish). Launch::order made the device's context current, and the module
        // was loaded there.
        unsafe { params::launch(&launch, &plan, &list, &kernel)? };
        // `all` is the input arrays, then the outputs.
        let (input_arrays, output_arrays) = all.split_at(all.len() - nout);
        launch.finish(input_arrays, output_arrays)?;
        drop(operands);
        Ok(outs)
    }

    /// The tiled kernels (32- and 64-bit) of a signature on `ordinal`, compiled on first use.
    fn tiled_functions(
        &self,
        ordinal: u32,
        dtypes: &[DType],
        roles: &[Role],
    ) -> Result<[usize; 2]> {
        let key = (
            ordinal,
            Signature {
                dtypes: dtypes.to_vec(),
                roles: roles.to_vec(),
            },
        );
        if let Some(f) = self
            .tiled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(*f);
        }
        let program = source::tiled_program(&self.spec, &key.1, &self.reads).ok_or_else(|| {
            Error::invalid("internal: a tiled plan for a signature without a tiled kernel")
        })?;
        let f = kernels::program(ordinal, &program)?;
        let found = [f[0], f[1]];
        self.tiled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, found);
        Ok(found)
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
