//! The elementwise engine: an operation written in CUDA C++ once (CuPy's `ElementwiseKernel`
//! syntax, see [`spec`]), compiled per call signature and loop variant with NVRTC, and run on
//! arrays from any producer with numpy broadcasting, any strides, outputs written in place or
//! allocated, on a given stream. Users' kernels are its instances, and so is `add`
//! ([`mod@crate::ops::add`]: its operation, its promotion rule and its scalar rule). A call is a
//! chain of steps: bind the arguments (`ElementwiseKernel::bind`), broadcast, check, plan
//! ([`crate::ops::plan`]), load the variant's kernel, lay out its parameters and launch
//! ([`params`]).

pub(crate) mod check;
pub mod params;
pub mod source;
pub mod spec;

use crate::array::Array;
use crate::cuda::background::{self, Ready};
use crate::cuda::kernels::Index;
use crate::cuda::stream::Stream;
use crate::cuda::sys;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{broadcast_shapes, same_shape, Dims, Layout};
use crate::ops::launch::Launch;
use crate::ops::plan::{Operand, Plan, Variant};
pub use crate::ops::Arg;
use crate::phases::phase;
use params::Param;
use source::{Role, Signature};
use spec::Spec;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;

/// The loaded kernels of one signature on one device, by [`slot`] (0 where not loaded yet).
type Slots = [usize; 8];

/// Where the kernel of a variant in an index width sits among a signature's [`Slots`].
fn slot(variant: Variant, index: Index) -> usize {
    let part = match variant {
        Variant::Contiguous => 0,
        Variant::Vector => 1,
        Variant::Strided => 2,
        Variant::Tiled { .. } => 3,
    };
    2 * part + usize::from(index == Index::I64)
}

/// An elementwise kernel; see the module documentation.
pub struct ElementwiseKernel {
    spec: Spec,
    /// Per parameter (inputs, then outputs): whether it is `raw`.
    raw: Vec<bool>,
    /// Per output: whether the operation may read it before writing it.
    reads: Vec<bool>,
    /// Whether the operation reads its index `i` (the loop then keeps C order).
    indexed: bool,
    /// The declaration's [`Spec::type_slots`], which every call binds by.
    type_slots: Vec<Option<usize>>,
    /// The kernels loaded per device and signature, each compiled when a call first needs it.
    loaded: Mutex<HashMap<(u32, Signature), Slots>>,
    /// The signature of the last call and its kernels: a repeated call finds them without
    /// building a key.
    last: Mutex<Option<(u32, Signature, Slots)>>,
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
            type_slots: spec.type_slots(),
            spec,
            reads,
            loaded: Mutex::new(HashMap::new()),
            last: Mutex::new(None),
        }
    }

    /// The parsed declaration.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// Runs the kernel on `inputs` (one per input parameter) into `outputs` (one per output
    /// parameter: an array written in place, or `None` to allocate one of the loop's shape on
    /// the inputs' device) on `stream`, after every array's pending writes; returns the outputs.
    /// The loop's shape is the broadcast of the element (not `raw`) arrays, inputs and outputs
    /// passed; where there are none (only raw arrays and scalars), `size` gives it as
    /// `[size]`, and is refused otherwise, as CuPy does. A raw output is allocated only with
    /// `size` (then with `size` elements). The operation may write raw inputs too (a kernel
    /// may have no outputs at all), so they are recorded as written.
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
        let call = self.bind(inputs, outputs)?;
        let shape = call.loop_shape(size)?;
        if !crate::cuda::is_available() {
            return Err(crate::cuda::unavailable_for(&self.spec.name));
        }
        let device = call.device()?;
        // SAFETY: the caller's contract.
        unsafe { self.launch(&call, device, &shape, stream) }
    }

    /// Runs a bound call on CUDA `device` over the loop's `shape` on `stream`: checks the
    /// outputs, plans the loop, loads the kernel the plan needs (before anything is allocated:
    /// a compile error leaves nothing behind), allocates the outputs not passed, orders the
    /// work after every operand's writes, launches, and records the outputs' write.
    ///
    /// # Safety
    /// As [`ElementwiseKernel::call`]; every array of `call` is on `device`.
    pub(crate) unsafe fn launch(
        &self,
        call: &Call<'_>,
        device: Device,
        shape: &[usize],
        stream: Stream,
    ) -> Result<Vec<Array>> {
        call.check_outputs(shape)?;
        let launch = Launch::begin(device, stream)?;
        if shape.iter().product::<usize>() == 0 {
            return call.allocate_outputs(&launch, shape);
        }
        let wide = call.broadcast_inputs(shape)?;
        let nin = call.inputs.len();
        // An input as the kernel sees it: broadcast to the loop's shape where it had another.
        let input = |k: usize| match wide.iter().find(|w| w.0 == k) {
            Some((_, x)) => Some(x),
            None => call.array(k),
        };
        // Outputs to allocate are planned as they will be: contiguous, aligned to any pack.
        let contiguous = match call.outputs.iter().any(Option::is_none) {
            true => Some(Layout::contiguous(shape)?),
            false => None,
        };
        let new = |k: usize| Operand {
            strides: contiguous.as_ref().map_or(&[], |c| c.strides()),
            contiguous: true,
            address: 0,
            itemsize: call.dtypes[k].itemsize(),
        };
        let before = |k: usize| match input(k) {
            Some(x) => Operand::of(x),
            None => new(k),
        };
        let (mut plan, mut function) = self.planned(launch.ordinal(), call, before, shape)?;
        phase!(Alloc);
        let outs = call.allocate_outputs(&launch, shape)?;
        phase!(Plan);
        let operand = |k: usize| -> &Array {
            match k < nin {
                true => input(k).expect("an array operand"),
                false => &outs[k - nin],
            }
        };
        if plan.variant == Variant::Vector
            && outs
                .iter()
                .any(|o| !(o.data_ptr() as usize).is_multiple_of(16))
        {
            let of = |k| Operand::of(operand(k));
            (plan, function) = self.planned(launch.ordinal(), call, of, shape)?;
        }
        let input_arrays = || (0..nin).filter_map(input);
        launch.order(input_arrays().chain(&outs))?;
        phase!(Launch);
        // SAFETY: the caller's contract (the operation); `launch` ordered every operand, and
        // `function` is the plan's kernel for the call's signature on its device.
        unsafe { self.run(call, &launch, &plan, function, &operand)? };
        // Raw inputs may have been written (as CuPy allows): later users wait for the kernel.
        let is_raw = |k: &usize| call.roles[*k] == Role::Raw;
        let read = (0..nin).filter(|k| !is_raw(k)).filter_map(input);
        let raw = (0..nin).filter(is_raw).filter_map(input);
        launch.finish(read, outs.iter().chain(raw))?;
        Ok(outs)
    }

    /// Binds a call's arguments to the parameters: each one's role and dtype.
    pub(crate) fn bind<'a>(
        &'a self,
        inputs: &'a [Arg],
        outputs: &'a [Option<Array>],
    ) -> Result<Call<'a>> {
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
            roles: Dims::from_fn(nin + nout, |_| Role::Element),
            dtypes: Dims::from_fn(0, |_| DType::default()),
        };
        // Per parameter: the dtype of the array passed for it, and that of a scalar.
        let mut given: Dims<Option<DType>> = Dims::from_fn(nin + nout, |_| None);
        let mut scalars = given.clone();
        for (k, arg) in inputs.iter().enumerate() {
            let (role, dtype) = call.input_role(k, arg)?;
            call.roles[k] = role;
            given[k] = dtype;
            if let Arg::Value(v, d) = arg {
                scalars[k] = Some(d.unwrap_or(v.default_dtype()));
                if let spec::Rule::Promote(_) = spec.rule {
                    // A typed scalar (a numpy scalar) is a strong type in a built-in's
                    // promotion, as in numpy's (NEP 50): it keeps its dtype.
                    given[k] = *d;
                }
            }
        }
        for (j, out) in outputs.iter().enumerate() {
            call.roles[nin + j] = call.output_role(j);
            given[nin + j] = out.as_ref().map(|o| o.dtype());
        }
        call.dtypes = spec.bind_slots(&self.type_slots, &given, &scalars)?;
        for (k, arg) in inputs.iter().enumerate() {
            if let Arg::Value(v, _) = arg {
                crate::ops::create::check_value_kind(*v, call.dtypes[k], spec.op())?;
            }
        }
        Ok(call)
    }

    /// The plan of a call over `operand`s and its kernel, loaded. A tiled plan whose program
    /// is compiling in the background ([`crate::cuda::background`]) runs untiled meanwhile.
    fn planned<'o>(
        &self,
        ordinal: u32,
        call: &Call<'_>,
        operand: impl Fn(usize) -> Operand<'o>,
        shape: &[usize],
    ) -> Result<(Plan, sys::CUfunction)> {
        let tiled = self.plan(call, &operand, shape, true);
        if let Some(function) = self.function(ordinal, call, &tiled)? {
            return Ok((tiled, function));
        }
        let plan = self.plan(call, &operand, shape, false);
        let function = self.function(ordinal, call, &plan)?;
        let function = function.ok_or_else(|| Error::invalid("internal: an untiled kernel"))?;
        // Started once the kernel of this call is loaded, so that its compile has NVRTC first.
        let sig = call.signature();
        if let Some(program) =
            source::program(&self.spec, &sig, &self.reads, tiled.variant, tiled.index)
        {
            background::start(ordinal, &program);
        }
        Ok((plan, function))
    }

    /// The plan of a call over the loop's `shape`, with each element parameter `k` as
    /// `operand(k)` sees it.
    fn plan<'o>(
        &self,
        call: &Call<'_>,
        operand: impl Fn(usize) -> Operand<'o>,
        shape: &[usize],
        may_tile: bool,
    ) -> Plan {
        let nin = call.inputs.len();
        let walked: Dims<Operand<'o>> = call.elements().map(operand).collect();
        // The first element output leads (its writes run along its unit stride), unless the
        // operation reads its index (C order).
        let lead = (!self.indexed).then(|| call.elements().position(|k| k >= nin).unwrap_or(0));
        let tiled = may_tile && lead.is_some() && self.tile_operands(call).is_some();
        let width = source::vector_width(&call.dtypes, &call.roles);
        Plan::new(shape, shape.iter().product(), &walked, lead, width, tiled)
    }

    /// The operands of the tiled kernel where a call's signature has one: the first input, the
    /// second (none for a value), the output (see [`source::tile_operands`]).
    fn tile_operands(&self, call: &Call<'_>) -> Option<(usize, Option<usize>, usize)> {
        source::tile_operands(&call.roles, call.inputs.len(), &self.reads)
    }

    /// Launches `function`, the kernel of `plan` for the call's signature.
    ///
    /// # Safety
    /// As [`ElementwiseKernel::call`]; `operand(k)` is the call's array for parameter `k` on
    /// `launch`'s device, ordered before it, with the loop's shape (element inputs broadcast to
    /// it), and `function` is the plan's variant and index width there.
    unsafe fn run<'o>(
        &self,
        call: &Call<'_>,
        launch: &Launch,
        plan: &Plan,
        function: sys::CUfunction,
        operand: &impl Fn(usize) -> &'o Array,
    ) -> Result<()> {
        let ordinal = launch.ordinal();
        let width = source::vector_width(&call.dtypes, &call.roles);
        let tiles = self.tile_operands(call).map(|(a, b, out)| {
            let b_dtype = call.dtypes[b.unwrap_or(a)];
            (operand(a), b.map(operand), b_dtype, operand(out))
        });
        let kernel = params::kernel(function, plan, ordinal, width, tiles)?;
        // SAFETY: source::program writes this signature's kernels with the parameters of their
        // variant as kernels/abi.cuh lays them out (values of the parameter's dtype, CbRaw per
        // raw array). Every element operand spans the loop's shape within its validated layout
        // (broadcast views read, never written: outputs were checked to have the loop's shape
        // and not to overlap themselves or partially overlap an input); the vector kernel is
        // chosen only when every element pointer is aligned to its pack, and the 32-bit kernels
        // only when every index and offset fits (Plan::new); the tiled kernel only where out
        // has unit stride along cols and the tiled inputs along rows, with the shared memory of
        // its tiles (params::kernel). Raw arrays are indexed by the operation, within their
        // sizes (this function's contract). The arrays are kept valid until the kernel has run
        // (the caller's Launch::finish). Launch::order made the device's context current, and
        // the module was loaded there.
        unsafe { params::launch(launch, plan, call.params(operand), &kernel) }
    }

    /// The kernel of `plan` for a call's signature on `ordinal`, compiled and loaded the first
    /// time a call needs it; `None` for a tiled kernel that compiles in the background.
    fn function(
        &self,
        ordinal: u32,
        call: &Call<'_>,
        plan: &Plan,
    ) -> Result<Option<sys::CUfunction>> {
        let k = slot(plan.variant, plan.index);
        let same = |o: &u32, sig: &Signature| {
            *o == ordinal && sig.dtypes[..] == call.dtypes[..] && sig.roles[..] == call.roles[..]
        };
        if let Some((o, sig, slots)) = &*crate::lock(&self.last) {
            if same(o, sig) && slots[k] != 0 {
                return Ok(Some(slots[k] as sys::CUfunction));
            }
        }
        let key = (ordinal, call.signature());
        let loaded = |key| crate::lock(&self.loaded).get(key).copied();
        let mut slots = loaded(&key).unwrap_or_default();
        if slots[k] == 0 {
            let program =
                source::program(&self.spec, &key.1, &self.reads, plan.variant, plan.index)
                    .ok_or_else(|| {
                        Error::invalid("internal: a tiled plan without a tiled kernel")
                    })?;
            let f = match plan.variant {
                Variant::Tiled { .. } => match background::program(ordinal, &program)? {
                    Ready::Now(functions) => functions[0],
                    Ready::Later => return Ok(None),
                },
                _ => crate::cuda::shared::program(ordinal, &program)?[0],
            };
            let mut map = crate::lock(&self.loaded);
            let entry = map.entry(key.clone()).or_default();
            entry[k] = f;
            slots = *entry;
        }
        *crate::lock(&self.last) = Some((key.0, key.1, slots));
        Ok(Some(slots[k] as sys::CUfunction))
    }
}

/// A call's arguments bound to the kernel's parameters (inputs, then outputs).
pub(crate) struct Call<'a> {
    kernel: &'a ElementwiseKernel,
    inputs: &'a [Arg],
    outputs: &'a [Option<Array>],
    /// Per parameter: element, value or raw.
    roles: Dims<Role>,
    /// Per parameter: its dtype.
    pub(crate) dtypes: Dims<DType>,
}

impl<'a> Call<'a> {
    /// The call's signature: each parameter's dtype and role.
    fn signature(&self) -> Signature {
        Signature {
            dtypes: self.dtypes.to_vec(),
            roles: self.roles.to_vec(),
        }
    }

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
    pub(crate) fn array(&self, k: usize) -> Option<&'a Array> {
        match self.inputs.get(k) {
            Some(Arg::Array(a)) => Some(a),
            Some(Arg::Value(..)) => None,
            None => self.outputs[k - self.inputs.len()].as_ref(),
        }
    }

    /// The value passed for input `k`, if it is one.
    pub(crate) fn value(&self, k: usize) -> Option<crate::cpu::element::Scalar> {
        match self.inputs.get(k) {
            Some(&Arg::Value(v, _)) => Some(v),
            _ => None,
        }
    }

    /// Per parameter (inputs, then outputs): element, value or raw.
    pub(crate) fn roles(&self) -> &[Role] {
        &self.roles
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

    /// Output `j`'s role.
    fn output_role(&self, j: usize) -> Role {
        match self.kernel.raw[self.inputs.len() + j] {
            true => Role::Raw,
            false => Role::Element,
        }
    }

    /// The one CUDA device of every array (the current device when no array is passed).
    fn device(&self) -> Result<Device> {
        let arrays = (0..self.roles.len()).filter_map(|k| Some((k, self.array(k)?)));
        let name = |k| self.param(k).name.clone();
        crate::ops::launch::kernel_device((&self.kernel.spec.name, "elementwise"), arrays, name)
    }

    /// The loop's shape: the broadcast of every element operand, or `size` indices where there
    /// is none (CuPy's rule: `size` is required then, and refused otherwise). A built-in op's
    /// result has its inputs' broadcast shape, which an output passed must have (add's rule); a
    /// user's kernel broadcasts its outputs too, as CuPy's does. A raw output to allocate
    /// needs `size`: the loop's shape is not its own.
    pub(crate) fn loop_shape(&self, size: Option<usize>) -> Result<Cow<'a, [usize]>> {
        let exact = self.kernel.spec.rule == spec::Rule::Exact;
        let nin = self.inputs.len();
        let mut shape: Option<Cow<'a, [usize]>> = None;
        let shaping = self.elements().filter(|&k| exact || k < nin);
        for a in shaping.filter_map(|k| self.array(k)) {
            shape = Some(match shape {
                None => Cow::Borrowed(a.shape()),
                Some(s) if same_shape(&s, a.shape()) => s,
                Some(s) => Cow::Owned(broadcast_shapes(&s, a.shape())?),
            });
        }
        let name = &self.kernel.spec.name;
        match (shape, size) {
            (Some(s), None) => match self.raw_output_to_allocate() {
                Some(k) => Err(Error::invalid(format!(
                    "{name}: raw output {} has no shape of its own to allocate: pass it, or \
                     give size= where every array is raw",
                    self.param(k).name
                ))),
                None => Ok(s),
            },
            (Some(_), Some(size)) => Err(Error::invalid(format!(
                "{name}: size={size} can be given only when every array is raw; here the \
                 element arrays set the number of indices"
            ))),
            (None, Some(size)) => Ok(Cow::Owned(vec![size])),
            (None, None) => Err(Error::invalid(format!(
                "{name}: no array sets the number of indices; pass size="
            ))),
        }
    }

    /// The first raw output not passed, if any.
    fn raw_output_to_allocate(&self) -> Option<usize> {
        let nin = self.inputs.len();
        (0..self.outputs.len())
            .find(|&j| self.roles[nin + j] == Role::Raw && self.outputs[j].is_none())
            .map(|j| nin + j)
    }

    /// Checks the outputs passed: element outputs as `add` checks `out`, raw ones writable.
    pub(crate) fn check_outputs(&self, shape: &[usize]) -> Result<()> {
        let nin = self.inputs.len();
        let element_inputs = || {
            self.elements()
                .filter(|&k| k < nin)
                .filter_map(|k| self.array(k))
        };
        for (j, out) in self.outputs.iter().enumerate() {
            let (k, Some(out)) = (nin + j, out) else {
                continue;
            };
            let name = &self.param(k).name;
            if self.roles[k] == Role::Element {
                check::check_out(out, shape, self.dtypes[k], element_inputs()).map_err(|e| {
                    match self.kernel.spec.rule {
                        spec::Rule::Exact => name_error(e, name),
                        spec::Rule::Promote(_) => e,
                    }
                })?;
            } else if out.readonly() {
                return Err(Error::ReadOnly(format!(
                    "{name} is read-only: its producer does not allow writes"
                )));
            }
        }
        Ok(())
    }

    /// The outputs: those passed, and new arrays of the loop's shape on `launch`'s stream (for
    /// a raw output, `[size]`: see [`Call::loop_shape`]).
    fn allocate_outputs(&self, launch: &Launch, shape: &[usize]) -> Result<Vec<Array>> {
        let nin = self.inputs.len();
        let mut outs = Vec::with_capacity(self.outputs.len());
        for (j, out) in self.outputs.iter().enumerate() {
            outs.push(match out {
                Some(out) => out.clone(),
                None => launch.empty(shape, self.dtypes[nin + j])?,
            });
        }
        Ok(outs)
    }

    /// The element inputs whose shape is not the loop's, broadcast to it, each with its
    /// parameter's index: none (and no allocation) when every input has the loop's shape.
    fn broadcast_inputs(&self, shape: &[usize]) -> Result<Vec<(usize, Array)>> {
        let mut wide = Vec::new();
        for k in self.elements().take_while(|&k| k < self.inputs.len()) {
            match self.array(k) {
                Some(a) if !same_shape(a.shape(), shape) => wide.push((k, a.broadcast_to(shape)?)),
                _ => {}
            }
        }
        Ok(wide)
    }

    /// The kernel's parameters in order: each operand as its role passes it.
    fn params<'s, 'o>(
        &'s self,
        operand: &'s impl Fn(usize) -> &'o Array,
    ) -> impl ExactSizeIterator<Item = Param<'o>> + 's {
        (0..self.roles.len()).map(move |k| match (self.roles[k], self.inputs.get(k)) {
            (Role::Element, _) => Param::Element(operand(k)),
            (Role::Value, Some(Arg::Value(v, _))) => {
                Param::Value(crate::cpu::copy::ElementBytes::new(self.dtypes[k], *v))
            }
            _ => Param::Raw(operand(k)),
        })
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
            call.roles[..],
            [Role::Element, Role::Value, Role::Raw, Role::Element]
        );
        assert_eq!(call.dtypes[..], [DType::Float32; 4]);
        assert_eq!(call.elements().collect::<Vec<_>>(), [0, 3]);
        assert_eq!(*call.loop_shape(None).unwrap(), [4, 3]);
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
