//! The reduction engine: a reduction written once in CuPy's `ReductionKernel` syntax (see
//! [`spec`]), compiled per call signature and kernel variant with NVRTC, and run on arrays from
//! any producer: inputs broadcast as the elementwise engine broadcasts them (the same binding of
//! type names, scalars and `raw` arrays), reduced over any axes, into outputs allocated or
//! passed. Users' `ReductionKernel`s are its instances, and so are the built-in `sum`, `prod`,
//! `max`, `min`, `argmax` and `argmin` ([`builtin`]). A call binds its arguments, plans the
//! split of dimensions and the strategy ([`plan`]), loads the variant's kernels ([`source`]),
//! and launches one kernel, or two where the outputs' elements are split into chunks
//! ([`params`]). Deterministic: see `kernels/reduce.cuh`.

pub mod builtin;
pub mod params;
pub mod plan;
pub mod source;
pub mod spec;

use crate::array::Array;
use crate::cuda::stream::Stream;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::broadcast_shapes;
use crate::ops::elementwise::source::{Role, Signature};
use crate::ops::elementwise::ElementwiseKernel;
use crate::ops::launch::Launch;
use crate::ops::plan::Operand;
use crate::ops::Arg;
use plan::{ReductionPlan, Walk, Walked};
use source::Variant;
use spec::ReductionSpec;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Bytes a partial result may take (`static_assert`ed by the generated code).
const PARTIAL_BYTES: usize = 32;

/// A reduction kernel; see the module documentation.
pub struct ReductionKernel {
    spec: ReductionSpec,
    /// Binds a call's arguments to the parameters, by the elementwise engine's rules.
    binder: ElementwiseKernel,
    /// Whether the map expression reads `_J` (the reduced dimensions then keep C order).
    indexed: bool,
    /// The loaded pass and fold kernels per device, signature and variant.
    loaded: Mutex<HashMap<(u32, Signature, Variant), [usize; 2]>>,
    /// The last call's plan and kernels: a repeated call finds them without planning again or
    /// building a key.
    last: Mutex<Option<Last>>,
}

/// A call's plan and kernels with what they were made from.
struct Last {
    ordinal: u32,
    sig: Signature,
    walked: Walked,
    plan: Arc<ReductionPlan>,
    functions: [usize; 2],
}

/// A call's parameters bound: each one's dtype and role (inputs, then outputs).
pub struct Bound {
    /// Dtypes.
    pub dtypes: Vec<DType>,
    /// Roles.
    pub roles: Vec<Role>,
}

/// The axes a call reduces: `None` for all, else each given once (negative from the end).
pub struct Axes<'a> {
    /// The axes.
    pub axis: Option<&'a [isize]>,
    /// Whether reduced axes stay, of length 1.
    pub keepdims: bool,
}

impl ReductionKernel {
    /// The kernel of a parsed declaration; compiles nothing yet.
    pub fn new(spec: ReductionSpec) -> ReductionKernel {
        ReductionKernel {
            binder: ElementwiseKernel::new(spec.spec.clone()),
            indexed: spec.uses_index(),
            spec,
            loaded: Mutex::new(HashMap::new()),
            last: Mutex::new(None),
        }
    }

    /// The parsed declaration.
    pub fn spec(&self) -> &ReductionSpec {
        &self.spec
    }

    /// Runs the reduction of `inputs` (one per input parameter) over `axes` into `outputs`
    /// (one per output parameter: an array written in place, or `None` to allocate one) on
    /// `stream`, after every array's pending writes; returns the outputs.
    ///
    /// # Safety
    /// The expressions and preamble are the caller's CUDA C++, which cubridge cannot check:
    /// they may index raw arrays only within their sizes and touch no memory beyond them.
    pub unsafe fn call(
        &self,
        inputs: &[Arg],
        outputs: &[Option<Array>],
        axes: Axes<'_>,
        stream: Stream,
    ) -> Result<Vec<Array>> {
        let call = self.binder.bind(inputs, outputs)?;
        let bound = Bound {
            dtypes: call.dtypes.to_vec(),
            roles: call.roles().to_vec(),
        };
        if !crate::cuda::is_available() {
            return Err(crate::cuda::unavailable_for(&self.spec.spec.name));
        }
        let spec = &self.spec.spec;
        let arrays = (0..bound.roles.len()).filter_map(|k| Some((k, call.array(k)?)));
        let name = |k| {
            spec.params()
                .nth(k)
                .map_or_else(String::new, |p| p.name.clone())
        };
        let device = crate::ops::launch::kernel_device((&spec.name, "reduction"), arrays, name)?;
        // SAFETY: the caller's contract.
        unsafe { self.run(&bound, inputs, outputs, axes, (device, stream)) }
    }

    /// Runs a bound call on CUDA `device` and `stream`: checks the axes and the outputs, plans,
    /// loads the kernels (before anything is allocated), allocates the outputs not passed,
    /// orders the work after every operand's writes, launches, and records the writes.
    ///
    /// # Safety
    /// As [`ReductionKernel::call`]; every array is on `device`.
    pub(crate) unsafe fn run(
        &self,
        bound: &Bound,
        inputs: &[Arg],
        outputs: &[Option<Array>],
        axes: Axes<'_>,
        (device, stream): (Device, Stream),
    ) -> Result<Vec<Array>> {
        let nin = inputs.len();
        let shapes = Shapes::of(bound, inputs, &axes)?;
        self.check_outputs(bound, outputs, &shapes.out, &shapes.elements)?;
        let launch = Launch::begin(device, stream)?;
        let allocate = |k: usize| match &outputs[k - nin] {
            Some(o) => Ok(o.clone()),
            None => launch.empty(&shapes.out, bound.dtypes[k]),
        };
        if shapes.out.contains(&0) {
            return (nin..bound.roles.len()).map(allocate).collect();
        }
        if shapes.n_red == 0 && !self.spec.empty_ok {
            return Err(Error::invalid(format!(
                "zero-size array to reduction operation {} which has no identity",
                self.spec.spec.name
            )));
        }
        let wide: Vec<Array> = (shapes.elements.iter())
            .map(|a| a.broadcast_to(&shapes.shape))
            .collect::<Result<_>>()?;
        let (plan, functions) = self.planned(bound, outputs, &shapes, &wide, launch.ordinal())?;
        let outs: Vec<Array> = (nin..bound.roles.len())
            .map(allocate)
            .collect::<Result<_>>()?;
        let partial = match plan.chunks {
            1 => None,
            c => Some(launch.empty(&[c * plan.n_out * PARTIAL_BYTES], DType::UInt8)?),
        };
        let raw_inputs = (0..nin).filter(|&k| bound.roles[k] == Role::Raw);
        let raw: Vec<&Array> = raw_inputs.filter_map(|k| arg_array(&inputs[k])).collect();
        launch.order(wide.iter().chain(raw.iter().copied()).chain(&outs))?;
        let operands = operands(bound, inputs, &wide, &outs)?;
        // SAFETY: `functions` are the kernels of this plan's variant for this signature, loaded
        // on the launch's device (for this call, or for the last one where it walked the same
        // shapes, strides and alignments: `planned`), whose context Launch::order made current;
        // every element input spans the input shape within its validated layout (broadcast
        // views are only read), every element output the plan's kept dimensions (checked: its
        // shape, writable, not overlapping itself or an input); raw arrays are indexed by the
        // user's code within their sizes (this function's contract); Launch::finish keeps every
        // array valid until the kernels have run.
        unsafe {
            launch_plan(
                &launch,
                &plan,
                functions,
                (&operands, nin),
                partial.as_ref(),
            )?
        };
        let read = wide.iter().chain(partial.iter());
        launch.finish(read, outs.iter().chain(raw))?;
        Ok(outs)
    }

    /// The plan of a call and its kernels, loaded: `wide`, the element inputs broadcast to the
    /// input shape, and the element outputs (passed, or new and contiguous) over the kept axes,
    /// on device `ordinal`. A call that walks what the last one walked, with its signature,
    /// reuses its plan and kernels.
    fn planned(
        &self,
        bound: &Bound,
        outputs: &[Option<Array>],
        shapes: &Shapes<'_>,
        wide: &[Array],
        ordinal: u32,
    ) -> Result<(Arc<ReductionPlan>, [usize; 2])> {
        let nin = bound.roles.len() - outputs.len();
        let contiguous = crate::layout::Layout::contiguous(&shapes.out)?;
        let kept = |s: &[isize]| kept_of(s, &shapes.shape, &shapes.reduced, shapes.keepdims);
        let out_strides: Vec<Vec<isize>> = (nin..bound.roles.len())
            .filter(|&k| bound.roles[k] == Role::Element)
            .map(|k| match &outputs[k - nin] {
                Some(o) => kept(o.strides()),
                None => kept(contiguous.strides()),
            })
            .collect();
        let walked: Vec<Operand<'_>> = wide.iter().map(Operand::of).collect();
        let out_refs: Vec<&[isize]> = out_strides.iter().map(|s| &s[..]).collect();
        let walk = Walk {
            shape: &shapes.shape,
            axes: &shapes.reduced,
            inputs: &walked,
            outputs: &out_refs,
        };
        let width = crate::ops::elementwise::source::vector_width(
            &bound.dtypes[..nin],
            &bound.roles[..nin],
        );
        if let Some(last) = &*crate::lock(&self.last) {
            let same_sig = last.sig.dtypes == bound.dtypes && last.sig.roles == bound.roles;
            if last.ordinal == ordinal && same_sig && last.walked.matches(&walk, width) {
                return Ok((last.plan.clone(), last.functions));
            }
        }
        let sms = crate::cuda::context::sm_count(ordinal)?;
        let plan = ReductionPlan::new(&walk, self.indexed, self.spec.reduce_dims, width, sms)?;
        let sig = Signature {
            dtypes: bound.dtypes.clone(),
            roles: bound.roles.clone(),
        };
        let variant = Variant::of(&plan);
        let functions = self.functions(ordinal, sig.clone(), variant)?;
        let plan = Arc::new(plan);
        *crate::lock(&self.last) = Some(Last {
            ordinal,
            sig,
            walked: Walked::of(&walk, width),
            plan: plan.clone(),
            functions,
        });
        Ok((plan, functions))
    }

    /// Checks the outputs passed: element outputs of the result's shape and dtype, writable,
    /// overlapping no input; raw outputs passed (they have no shape of the result's) and
    /// writable. Errors name the output.
    fn check_outputs(
        &self,
        bound: &Bound,
        outputs: &[Option<Array>],
        shape: &[usize],
        inputs: &[&Array],
    ) -> Result<()> {
        let spec = &self.spec.spec;
        let nin = spec.inputs.len();
        for (j, (out, p)) in outputs.iter().zip(&spec.outputs).enumerate() {
            let k = nin + j;
            // A user's outputs are named in errors; a built-in's one output is `out`.
            let users = spec.rule == crate::ops::elementwise::spec::Rule::Exact;
            let named = |e: Error| match e {
                Error::Invalid(m) if users => Error::Invalid(format!("{}: {m}", p.name)),
                Error::ReadOnly(m) if users => Error::ReadOnly(format!("{}: {m}", p.name)),
                other => other,
            };
            match (out, bound.roles[k]) {
                (None, Role::Raw) => {
                    return Err(Error::invalid(format!(
                        "{}: raw output {} has no shape of its own to allocate: pass it",
                        spec.name, p.name
                    )))
                }
                (None, _) => {}
                (Some(o), Role::Raw) if o.readonly() => {
                    return Err(named(Error::ReadOnly(
                        "read-only: its producer does not allow writes".into(),
                    )))
                }
                (Some(_), Role::Raw) => {}
                (Some(o), _) => {
                    let elements = inputs.iter().copied();
                    crate::ops::elementwise::check::check_out(o, shape, bound.dtypes[k], elements)
                        .map_err(named)?
                }
            }
        }
        Ok(())
    }

    /// The pass and fold kernels of `variant` for `sig` on `ordinal`, compiled and loaded the
    /// first time a call needs them.
    fn functions(&self, ordinal: u32, sig: Signature, variant: Variant) -> Result<[usize; 2]> {
        let key = (ordinal, sig, variant);
        if let Some(f) = crate::lock(&self.loaded).get(&key) {
            return Ok(*f);
        }
        let program = source::program(&self.spec, &key.1, variant);
        let f = crate::cuda::shared::program(ordinal, &program)?;
        let f = [f[0], f[1]];
        crate::lock(&self.loaded).insert(key, f);
        Ok(f)
    }
}

/// A call's shapes: the element inputs, their broadcast shape, the reduced axes and the
/// result's shape.
struct Shapes<'a> {
    elements: Vec<&'a Array>,
    shape: Vec<usize>,
    reduced: Vec<usize>,
    out: Vec<usize>,
    keepdims: bool,
    n_red: usize,
}

impl<'a> Shapes<'a> {
    fn of(bound: &Bound, inputs: &'a [Arg], axes: &Axes<'_>) -> Result<Shapes<'a>> {
        let elements: Vec<&Array> = (inputs.iter().enumerate())
            .filter(|(k, _)| bound.roles[*k] == Role::Element)
            .filter_map(|(_, a)| arg_array(a))
            .collect();
        let mut shape: Vec<usize> = Vec::new();
        for a in &elements {
            shape = broadcast_shapes(&shape, a.shape())?;
        }
        let reduced = normalize_axes(axes.axis, shape.len())?;
        Ok(Shapes {
            out: out_shape(&shape, &reduced, axes.keepdims),
            n_red: reduced.iter().map(|&d| shape[d]).product(),
            keepdims: axes.keepdims,
            elements,
            shape,
            reduced,
        })
    }
}

/// The kernels' operands in parameter order: inputs (element ones broadcast, as `wide` holds
/// them), then the outputs `outs`.
fn operands<'a>(
    bound: &Bound,
    inputs: &'a [Arg],
    wide: &'a [Array],
    outs: &'a [Array],
) -> Result<Vec<params::Param<'a>>> {
    let nin = inputs.len();
    let mut element = wide.iter();
    let internal = |what: &str| Error::invalid(format!("internal: {what}"));
    let mut operands = Vec::with_capacity(bound.roles.len());
    for (k, &role) in bound.roles.iter().enumerate() {
        operands.push(match (role, inputs.get(k)) {
            (Role::Value, Some(arg)) => params::Param::Value(value_bytes(arg, bound.dtypes[k])),
            (Role::Raw, Some(arg)) => {
                params::Param::Raw(arg_array(arg).ok_or_else(|| internal("a raw value"))?)
            }
            (_, Some(_)) => {
                params::Param::Element(element.next().ok_or_else(|| internal("an input"))?)
            }
            (Role::Raw, None) => params::Param::Raw(&outs[k - nin]),
            (_, None) => params::Param::Element(&outs[k - nin]),
        });
    }
    Ok(operands)
}

/// Launches the pass kernel of `plan` (`functions[0]`) over `operands` (the first `nin`
/// inputs), and where the plan
/// splits outputs into chunks, the fold of their partial results (`functions[1]`), on
/// `launch`'s stream.
///
/// # Safety
/// 1. `functions` are the pass and fold kernels of `plan`'s variant for the operands'
///    signature (source.rs, kernels/reduce.cuh), loaded in the launch's device's context,
///    which is current.
/// 2. The operands are those the plan was made for, valid on that device until the kernels
///    have run, element outputs writable and overlapping nothing else.
/// 3. `partial` holds `plan.chunks * plan.n_out` results of [`PARTIAL_BYTES`] where the plan
///    has more than one chunk.
unsafe fn launch_plan(
    launch: &Launch,
    plan: &ReductionPlan,
    functions: [usize; 2],
    (operands, nin): (&[params::Param<'_>], usize),
    partial: Option<&Array>,
) -> Result<()> {
    if plan.chunks > 1 && partial.is_none() {
        return Err(Error::invalid(
            "internal: chunks without their partial results",
        ));
    }
    let p = partial.map_or(std::ptr::null_mut(), |p| p.data_ptr());
    let list = || params::list(plan, operands.iter().map(params::Param::copy), nin, p);
    let ordinal = launch.ordinal();
    // Blocks of outputs, a row of them per chunk, at most what the device holds at once in
    // all (the kernels loop over the outputs).
    let blocks = |items: usize, group: u32, rows: usize| {
        let wanted = (items * group as usize).div_ceil(plan::BLOCK as usize);
        let resident = crate::cuda::kernels::grid(ordinal, usize::MAX, plan::BLOCK)? as usize;
        Ok::<u32, Error>(wanted.clamp(1, resident.div_ceil(rows).max(1)) as u32)
    };
    let (stream, block) = (launch.stream().handle(), (plan::BLOCK, 1, 1));
    // Columns in packs: a block's threads along the outputs cover them (a power of two), the
    // rest of it takes more chunks (kernels/reduce.cuh, pass_columns). Short rows in packs
    // take a block of outputs' threads, as groups do.
    let threads_out = plan.n_out.div_ceil(plan.per_thread);
    let across = match plan.per_thread > 1 && plan.rows == 0 {
        true => threads_out.next_power_of_two().min(plan::BLOCK as usize),
        false => plan::BLOCK as usize,
    };
    let rows = plan.chunks.div_ceil(plan::BLOCK as usize / across);
    let rows32 = u32::try_from(rows).map_err(|_| Error::invalid("internal: chunks"))?;
    let grid = (blocks(threads_out, plan.group, rows)?, rows32, 1);
    let pass = functions[0] as crate::cuda::sys::CUfunction;
    // SAFETY: this function's contract; the parameters are those the kernels declare
    // (params::list), alive for the call.
    unsafe { crate::cuda::launch::launch(pass, grid, block, 0, stream, list()?.pointers())? };
    if plan.chunks > 1 {
        let fold = functions[1] as crate::cuda::sys::CUfunction;
        let grid = (blocks(plan.n_out, plan::final_group(plan.group), 1)?, 1, 1);
        // SAFETY: as above; the pass's partial results come first on the same stream.
        unsafe { crate::cuda::launch::launch(fold, grid, block, 0, stream, list()?.pointers())? };
    }
    Ok(())
}

/// The array of an argument, if it is one.
fn arg_array(arg: &Arg) -> Option<&Array> {
    match arg {
        Arg::Array(a) => Some(a),
        Arg::Value(..) => None,
    }
}

/// A value argument's bytes in `dtype`.
fn value_bytes(arg: &Arg, dtype: DType) -> crate::cpu::copy::ElementBytes {
    let value = match arg {
        Arg::Value(v, _) => *v,
        Arg::Array(_) => crate::cpu::element::Scalar::Int(0),
    };
    crate::cpu::copy::ElementBytes::new(dtype, value)
}

/// The reduced axes of `ndim` dimensions: all for `None`; each given once, counted from the
/// end when negative.
pub fn normalize_axes(axis: Option<&[isize]>, ndim: usize) -> Result<Vec<usize>> {
    let Some(axis) = axis else {
        return Ok((0..ndim).collect());
    };
    let mut axes = Vec::with_capacity(axis.len());
    for &a in axis {
        let d = if a < 0 { a + ndim as isize } else { a };
        if d < 0 || d >= ndim as isize {
            return Err(Error::invalid(format!(
                "axis {a} is out of bounds for an array of {ndim} dimension(s)"
            )));
        }
        if axes.contains(&(d as usize)) {
            return Err(Error::invalid(format!("axis {a} is given twice")));
        }
        axes.push(d as usize);
    }
    axes.sort_unstable();
    Ok(axes)
}

/// The result's shape: `shape` without the reduced `axes`, or with them of length 1.
pub fn out_shape(shape: &[usize], axes: &[usize], keepdims: bool) -> Vec<usize> {
    (0..shape.len())
        .filter_map(|d| match (axes.contains(&d), keepdims) {
            (false, _) => Some(shape[d]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// An output's strides (over the result's shape) at the kept axes of `shape`.
fn kept_of(strides: &[isize], shape: &[usize], axes: &[usize], keepdims: bool) -> Vec<isize> {
    match keepdims {
        true => (0..shape.len())
            .filter(|d| !axes.contains(d))
            .map(|d| strides[d])
            .collect(),
        false => strides.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_are_normalized_and_checked() {
        assert_eq!(normalize_axes(None, 3).unwrap(), [0, 1, 2]);
        assert_eq!(normalize_axes(Some(&[-1, 0]), 3).unwrap(), [0, 2]);
        assert!(normalize_axes(Some(&[3]), 3).is_err());
        assert!(normalize_axes(Some(&[1, -2]), 3)
            .unwrap_err()
            .to_string()
            .contains("twice"));
        assert_eq!(out_shape(&[2, 3, 4], &[1], false), [2, 4]);
        assert_eq!(out_shape(&[2, 3, 4], &[0, 2], true), [1, 3, 1]);
        assert_eq!(kept_of(&[12, 4, 1], &[2, 3, 4], &[1], true), [12, 1]);
    }
}
