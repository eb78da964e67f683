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
use crate::cuda::stream::Stream;
use crate::cuda::{kernels, sys};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::broadcast_shapes;
use crate::ops::launch::Launch;
use crate::ops::plan::{Operand, Plan, Variant};
pub use crate::ops::Arg;
use params::Param;
use source::{Role, Signature};
use spec::Spec;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;

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
        if !crate::cuda::is_available() {
            return Err(crate::cuda::unavailable_for(&self.spec.name));
        }
        let call = self.bind(inputs, outputs)?;
        let device = call.device()?;
        let shape = call.loop_shape(size)?;
        call.check_outputs(&shape)?;
        let launch = Launch::begin(device, stream)?;
        let ordinal = launch.ordinal();
        // Compiled before anything is allocated: a compile error leaves nothing behind.
        let compiled = self.functions(ordinal, &call.dtypes, &call.roles)?;
        let outs = call.allocate_outputs(&launch, &shape)?;
        if shape.iter().product::<usize>() == 0 {
            return Ok(outs);
        }
        let operands = call.operands(&outs, &shape)?;
        let all: Vec<&Array> = operands.iter().flatten().map(|a| &**a).collect();
        launch.order(&all)?;
        // SAFETY: the caller's contract (the operation); `launch` ordered every operand.
        unsafe { self.run(&call, &launch, compiled, &operands, &shape)? };
        // `all` is the input arrays, then the outputs.
        let (input_arrays, output_arrays) = all.split_at(all.len() - outs.len());
        launch.finish(input_arrays, output_arrays)?;
        drop(operands);
        Ok(outs)
    }

    /// Binds a call's arguments to the parameters: each one's role and dtype.
    fn bind<'a>(&'a self, inputs: &'a [Arg], outputs: &'a [Option<Array>]) -> Result<Call<'a>> {
        let spec = &self.spec;
        let (nin, nout) = (spec.inputs.len(), spec.outputs.len());
        if inputs.len() != nin || outputs.len() != nout {
            return Err(Error::invalid(format!(
                "{} takes {nin} input(s) and {nout} output(s); got {} and {}",
                spec.name,
                inputs.len(),
                outputs.iter().filter(|o| o.is_some()).count()
            )));
        }
        let mut call = Call {
            kernel: self,
            inputs,
            outputs,
            roles: Vec::with_capacity(nin + nout),
            dtypes: Vec::new(),
        };
        // Per parameter: the dtype of the array passed for it, and that of a scalar.
        let mut given = Vec::with_capacity(nin + nout);
        let mut scalars = vec![None; nin + nout];
        for (k, arg) in inputs.iter().enumerate() {
            let (role, dtype) = call.input_role(k, arg)?;
            call.roles.push(role);
            given.push(dtype);
            if let Arg::Value(v, d) = arg {
                scalars[k] = Some(d.unwrap_or(v.default_dtype()));
            }
        }
        for (j, out) in outputs.iter().enumerate() {
            call.roles.push(call.output_role(j, out)?);
            given.push(out.as_ref().map(|o| o.dtype()));
        }
        call.dtypes = spec.bind(&given, &scalars)?;
        for (k, arg) in inputs.iter().enumerate() {
            if let Arg::Value(v, _) = arg {
                crate::ops::create::check_value_kind(*v, call.dtypes[k], "an elementwise kernel")?;
            }
        }
        Ok(call)
    }

    /// Launches the chosen variant of the kernel on the call's operands.
    ///
    /// # Safety
    /// As [`ElementwiseKernel::call`]; `operands` are the call's operands on `launch`'s device,
    /// ordered before it, with the loop's `shape` (element operands broadcast to it), and
    /// `compiled` is the call's signature's kernels there.
    unsafe fn run(
        &self,
        call: &Call<'_>,
        launch: &Launch,
        compiled: Compiled,
        operands: &[Option<Cow<'_, Array>>],
        shape: &[usize],
    ) -> Result<()> {
        let operand = |k: usize| -> &Array { operands[k].as_deref().expect("an array operand") };
        let planned: Vec<Operand<'_>> = call.elements().map(|k| Operand::of(operand(k))).collect();
        let (lead, tile_operands) = self.lead_and_tiles(call);
        let n = shape.iter().product();
        let plan = Plan::new(
            shape,
            n,
            &planned,
            lead,
            compiled.width,
            tile_operands.is_some(),
        );
        let family = Signed {
            kernel: self,
            call,
            ordinal: launch.ordinal(),
            compiled,
        };
        let dtypes = &call.dtypes;
        let tiles = tile_operands.map(|(a, b, out)| {
            (
                operand(a),
                b.map(operand),
                dtypes[b.unwrap_or(a)],
                operand(out),
            )
        });
        let kernel = params::choose(&family, &plan, launch.ordinal(), compiled.width, tiles)?;
        let list = call.params(&operand);
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
        // within their sizes (this function's contract). The arrays are kept valid until the
        // kernel has run (the caller's Launch::finish). Launch::order made the device's context
        // current, and the module was loaded there.
        unsafe { params::launch(launch, &plan, &list, &kernel) }
    }

    /// The operand that leads the loop (the first element output: its writes run along its unit
    /// stride), none when the operation reads its index (C order), and the operands of the tiled
    /// kernel where the signature has one (one or two element inputs and one output).
    fn lead_and_tiles(&self, call: &Call<'_>) -> (Option<usize>, TileOperands) {
        let nin = call.inputs.len();
        let lead = (!self.indexed).then(|| call.elements().position(|k| k >= nin).unwrap_or(0));
        let tiles = lead
            .is_some()
            .then(|| source::tile_operands(&call.roles, nin, &self.reads))
            .flatten();
        (lead, tiles)
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

/// A user's kernel's kernels for one call's signature on one device.
struct Signed<'a> {
    kernel: &'a ElementwiseKernel,
    call: &'a Call<'a>,
    ordinal: u32,
    compiled: Compiled,
}

impl params::Family for Signed<'_> {
    fn flat(&self, variant: Variant, index: kernels::Index) -> Result<sys::CUfunction> {
        let wide = usize::from(index == kernels::Index::I64);
        // source::FUNCTIONS: contiguous, vector32, vector64, strided32, strided64.
        let k = match variant {
            Variant::Contiguous => 0,
            Variant::Vector => 1 + wide,
            _ => 3 + wide,
        };
        Ok(self.compiled.functions[k] as sys::CUfunction)
    }

    fn tiled(&self, index: kernels::Index) -> Result<sys::CUfunction> {
        let (dtypes, roles) = (&self.call.dtypes, &self.call.roles);
        let f = self.kernel.tiled_functions(self.ordinal, dtypes, roles)?;
        Ok(f[usize::from(index == kernels::Index::I64)] as sys::CUfunction)
    }
}

/// The operands of the tiled kernel, where a signature has one: the first input, the second
/// (none for a value), the output (see [`source::tile_operands`]).
type TileOperands = Option<(usize, Option<usize>, usize)>;

/// A call's arguments bound to the kernel's parameters (inputs, then outputs).
struct Call<'a> {
    kernel: &'a ElementwiseKernel,
    inputs: &'a [Arg],
    outputs: &'a [Option<Array>],
    /// Per parameter: element, value or raw.
    roles: Vec<Role>,
    /// Per parameter: its dtype.
    dtypes: Vec<DType>,
}

impl<'a> Call<'a> {
    fn param(&self, k: usize) -> &'a spec::Declared {
        let spec = &self.kernel.spec;
        let nin = spec.inputs.len();
        if k < nin {
            &spec.inputs[k]
        } else {
            &spec.outputs[k - nin]
        }
    }

    /// The array passed for parameter `k`, if any.
    fn array(&self, k: usize) -> Option<&'a Array> {
        match self.inputs.get(k) {
            Some(Arg::Array(a)) => Some(a),
            Some(Arg::Value(..)) => None,
            None => self.outputs[k - self.inputs.len()].as_ref(),
        }
    }

    /// The element parameters (broadcast over the loop), in order.
    fn elements(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.roles.len()).filter(|&k| self.roles[k] == Role::Element)
    }

    /// Input `k`'s role and the dtype of the array passed for it.
    fn input_role(&self, k: usize, arg: &Arg) -> Result<(Role, Option<DType>)> {
        let raw = self.kernel.raw[k];
        match arg {
            Arg::Array(a) => Ok((if raw { Role::Raw } else { Role::Element }, Some(a.dtype()))),
            Arg::Value(..) if raw => Err(Error::invalid(format!(
                "{}: raw parameter {} needs an array, not a scalar",
                self.kernel.spec.name,
                self.param(k).name
            ))),
            Arg::Value(..) => Ok((Role::Value, None)),
        }
    }

    /// Output `j`'s role; a raw output must be passed (its shape is its own).
    fn output_role(&self, j: usize, out: &Option<Array>) -> Result<Role> {
        let k = self.inputs.len() + j;
        match (self.kernel.raw[k], out) {
            (true, None) => Err(Error::invalid(format!(
                "{}: raw output {} must be passed (its shape is not the loop's)",
                self.kernel.spec.name,
                self.param(k).name
            ))),
            (true, Some(_)) => Ok(Role::Raw),
            (false, _) => Ok(Role::Element),
        }
    }

    /// The one CUDA device of every array (the current device when no array is passed).
    fn device(&self) -> Result<Device> {
        let arrays = (0..self.roles.len()).filter_map(|k| Some((k, self.array(k)?)));
        let name = |k| self.param(k).name.clone();
        crate::ops::launch::kernel_device((&self.kernel.spec.name, "elementwise"), arrays, name)
    }

    /// The loop's shape: the broadcast of every element operand, or `size` indices.
    fn loop_shape(&self, size: Option<usize>) -> Result<Vec<usize>> {
        let mut shape: Option<Vec<usize>> = None;
        for a in self.elements().filter_map(|k| self.array(k)) {
            shape = Some(match shape {
                None => a.shape().to_vec(),
                Some(s) if s == a.shape() => s,
                Some(s) => broadcast_shapes(&s, a.shape())?,
            });
        }
        let name = &self.kernel.spec.name;
        match (shape, size) {
            (Some(s), None) => Ok(s),
            (Some(s), Some(size)) if s.iter().product::<usize>() == size => Ok(s),
            (Some(s), Some(size)) => Err(Error::invalid(format!(
                "{name}: size={size}, but the arrays broadcast to {} elements",
                s.iter().product::<usize>()
            ))),
            (None, Some(size)) => Ok(vec![size]),
            (None, None) => Err(Error::invalid(format!(
                "{name}: no array sets the number of indices; pass size="
            ))),
        }
    }

    /// Checks the outputs passed: element outputs as `add` checks `out`, raw ones writable.
    fn check_outputs(&self, shape: &[usize]) -> Result<()> {
        let nin = self.inputs.len();
        let element_inputs: Vec<&Array> = self
            .elements()
            .filter(|&k| k < nin)
            .filter_map(|k| self.array(k))
            .collect();
        for (j, out) in self.outputs.iter().enumerate() {
            let (k, Some(out)) = (nin + j, out) else {
                continue;
            };
            let name = &self.param(k).name;
            if self.roles[k] == Role::Element {
                crate::ops::add::check_out(out, shape, self.dtypes[k], &element_inputs)
                    .map_err(|e| name_error(e, name))?;
            } else if out.readonly() {
                return Err(Error::ReadOnly(format!(
                    "{name} is read-only: its producer does not allow writes"
                )));
            }
        }
        Ok(())
    }

    /// The outputs: those passed, and new arrays of the loop's shape on `launch`'s stream.
    fn allocate_outputs(&self, launch: &Launch, shape: &[usize]) -> Result<Vec<Array>> {
        let nin = self.inputs.len();
        let new = |j: usize| launch.empty(shape, self.dtypes[nin + j]);
        (0..self.outputs.len())
            .map(|j| self.outputs[j].clone().map_or_else(|| new(j), Ok))
            .collect()
    }

    /// Every operand as the kernel sees it, inputs then `outs`: element inputs broadcast to the
    /// loop's shape (borrowed where they have it already), none for a value.
    fn operands<'o>(
        &self,
        outs: &'o [Array],
        shape: &[usize],
    ) -> Result<Vec<Option<Cow<'o, Array>>>>
    where
        'a: 'o,
    {
        let mut operands = Vec::with_capacity(self.roles.len());
        for k in 0..self.inputs.len() {
            operands.push(match (self.array(k), self.roles[k]) {
                (Some(a), Role::Element) if a.shape() != shape => {
                    Some(Cow::Owned(a.broadcast_to(shape)?))
                }
                (Some(a), _) => Some(Cow::Borrowed(a)),
                (None, _) => None,
            });
        }
        operands.extend(outs.iter().map(|o| Some(Cow::Borrowed(o))));
        Ok(operands)
    }

    /// The kernel's parameters in order: each operand as its role passes it.
    fn params<'o>(&self, operand: &impl Fn(usize) -> &'o Array) -> Vec<Param<'o>> {
        (0..self.roles.len())
            .map(|k| match (self.roles[k], self.inputs.get(k)) {
                (Role::Element, _) => Param::Element(operand(k)),
                (Role::Value, Some(Arg::Value(v, _))) => {
                    Param::Value(crate::cpu::copy::ElementBytes::new(self.dtypes[k], *v))
                }
                _ => Param::Raw(operand(k)),
            })
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::element::Scalar;

    fn host(shape: &[usize], dtype: DType) -> Array {
        Array::zeros(shape, dtype, Device::Cpu).unwrap()
    }

    fn axpy() -> ElementwiseKernel {
        let spec = Spec::new("T x, T a, raw T r", "T z", "z = a * x + r[0]", "axpy", "").unwrap();
        ElementwiseKernel::new(spec)
    }

    #[test]
    fn a_call_binds_roles_dtypes_and_the_loop_shape() {
        let kernel = axpy();
        let inputs = [
            Arg::Array(host(&[4, 1], DType::Float32)),
            Arg::Value(Scalar::Float(2.0), None),
            Arg::Array(host(&[7], DType::Float32)),
        ];
        let outputs = [Some(host(&[4, 3], DType::Float32))];
        let call = kernel.bind(&inputs, &outputs).unwrap();
        assert_eq!(
            call.roles,
            [Role::Element, Role::Value, Role::Raw, Role::Element]
        );
        assert_eq!(call.dtypes, [DType::Float32; 4]);
        assert_eq!(call.elements().collect::<Vec<_>>(), [0, 3]);
        assert_eq!(call.loop_shape(None).unwrap(), [4, 3]);
        assert!(call.loop_shape(Some(5)).is_err());
        call.check_outputs(&[4, 3]).unwrap();
        assert!(call.check_outputs(&[4, 4]).is_err());
        // Host arrays: the kernel runs on one CUDA device, which they are not on.
        let e = call.device().unwrap_err().to_string();
        assert!(
            e.contains("axpy: x is on cpu") && e.contains("one CUDA device"),
            "{e}"
        );
    }

    #[test]
    fn a_call_refuses_what_its_parameters_cannot_take() {
        let kernel = axpy();
        let value = || Arg::Value(Scalar::Float(1.0), None);
        let two = [Arg::Array(host(&[3], DType::Float32)), value()];
        let e = kernel.bind(&two, &[None]).err().unwrap().to_string();
        assert!(e.contains("takes 3 input(s)"), "{e}");
        let raw_value = [Arg::Array(host(&[3], DType::Float32)), value(), value()];
        let e = kernel.bind(&raw_value, &[None]).err().unwrap().to_string();
        assert!(e.contains("raw parameter r needs an array"), "{e}");
        let mixed = [
            Arg::Array(host(&[3], DType::Float32)),
            value(),
            Arg::Array(host(&[3], DType::Float64)),
        ];
        assert!(kernel.bind(&mixed, &[None]).is_err());
    }
}
