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
use plan::{ReductionPlan, Walk};
use source::Variant;
use spec::ReductionSpec;
use std::collections::HashMap;
use std::sync::Mutex;

/// Bytes a partial result may take (`static_assert`ed by the generated code).
const PARTIAL_BYTES: usize = 32;

/// A reduction kernel; see the module documentation.
pub struct ReductionKernel {
    spec: ReductionSpec,
    /// Binds a call's arguments to the parameters, by the elementwise engine's rules.
    binder: ElementwiseKernel,
    /// The loaded pass and fold kernels per device, signature and variant.
    loaded: Mutex<HashMap<(u32, Signature, Variant), [usize; 2]>>,
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
            spec,
            loaded: Mutex::new(HashMap::new()),
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
        let device = call.device()?;
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
        let elements: Vec<&Array> = (inputs.iter().enumerate())
            .filter(|(k, _)| bound.roles[*k] == Role::Element)
            .filter_map(|(_, a)| match a {
                Arg::Array(a) => Some(a),
                Arg::Value(..) => None,
            })
            .collect();
        let mut shape: Vec<usize> = Vec::new();
        for a in &elements {
            shape = broadcast_shapes(&shape, a.shape())?;
        }
        let reduced = normalize_axes(axes.axis, shape.len())?;
        let out_shape = out_shape(&shape, &reduced, axes.keepdims);
        self.check_outputs(bound, outputs, &out_shape, &elements)?;
        let n_red: usize = reduced.iter().map(|&d| shape[d]).product();
        let launch = Launch::begin(device, stream)?;
        let allocate = |k: usize| match &outputs[k - nin] {
            Some(o) => Ok(o.clone()),
            None => launch.empty(&out_shape, bound.dtypes[k]),
        };
        if out_shape.contains(&0) {
            return (nin..bound.roles.len()).map(allocate).collect();
        }
        if n_red == 0 && !self.spec.empty_ok {
            return Err(Error::invalid(format!(
                "zero-size array to reduction operation {} which has no identity",
                self.spec.spec.name
            )));
        }
        let wide: Vec<Array> = (elements.iter())
            .map(|a| a.broadcast_to(&shape))
            .collect::<Result<_>>()?;
        let contiguous = crate::layout::Layout::contiguous(&out_shape)?;
        let kept_strides = |s: &[isize]| kept_of(s, &shape, &reduced, axes.keepdims);
        let out_strides: Vec<Vec<isize>> = (nin..bound.roles.len())
            .filter(|&k| bound.roles[k] == Role::Element)
            .map(|k| match &outputs[k - nin] {
                Some(o) => kept_strides(o.strides()),
                None => kept_strides(contiguous.strides()),
            })
            .collect();
        let walked: Vec<Operand<'_>> = wide.iter().map(Operand::of).collect();
        let out_refs: Vec<&[isize]> = out_strides.iter().map(|s| &s[..]).collect();
        let walk = Walk {
            shape: &shape,
            axes: &reduced,
            inputs: &walked,
            outputs: &out_refs,
        };
        let sig = Signature {
            dtypes: bound.dtypes.clone(),
            roles: bound.roles.clone(),
        };
        let width = source::width(&sig, nin);
        let sms = crate::cuda::context::sm_count(launch.ordinal())?;
        let indexed = self.spec.uses_index();
        let plan = ReductionPlan::new(&walk, indexed, self.spec.reduce_dims, width, sms)?;
        let variant = Variant {
            group: plan.group,
            vector: plan.vector,
        };
        let functions = self.functions(launch.ordinal(), sig, variant)?;
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
        let mut element = wide.iter();
        let mut operands = Vec::with_capacity(bound.roles.len());
        for (k, &role) in bound.roles.iter().enumerate() {
            operands.push(match (role, inputs.get(k)) {
                (Role::Value, Some(arg)) => params::Param::Value(value_bytes(arg, bound.dtypes[k])),
                (Role::Raw, Some(arg)) => params::Param::Raw(
                    arg_array(arg).ok_or_else(|| Error::invalid("internal: a raw value"))?,
                ),
                (Role::Element, Some(_)) => params::Param::Element(
                    element
                        .next()
                        .ok_or_else(|| Error::invalid("internal: an element input"))?,
                ),
                (Role::Raw, None) => params::Param::Raw(&outs[k - nin]),
                (_, None) => params::Param::Element(&outs[k - nin]),
            });
        }
        let p = partial
            .as_ref()
            .map_or(std::ptr::null_mut(), |p| p.data_ptr());
        let list = || params::list(&plan, operands.iter().map(params::Param::copy), nin, p);
        let ordinal = launch.ordinal();
        let items = plan.n_out * plan.chunks;
        let blocks = |items: usize, group: u32| {
            let wanted = (items * group as usize).div_ceil(plan::BLOCK as usize);
            crate::cuda::kernels::grid(ordinal, wanted, plan::BLOCK)
        };
        // SAFETY: the program's kernels take the parameters `params::list` lays out for this
        // signature (kernels/reduce.cuh and source.rs); every element input spans the input
        // shape within its validated layout (broadcast views are only read), every element
        // output the plan's kept dimensions (checked: its shape, writable, not overlapping
        // itself or an input), and the vector kernel is chosen only where every element
        // input's rows start on a pack. The partials hold chunks * n_out results of at most
        // PARTIAL_BYTES each. Raw arrays are indexed by the user's code within their sizes
        // (this function's contract). Launch::order made the context current; the module was
        // loaded there; Launch::finish keeps every array valid until the kernels have run.
        unsafe {
            let stream = launch.stream().handle();
            let block = (plan::BLOCK, 1, 1);
            let pass = functions[0] as crate::cuda::sys::CUfunction;
            let grid = (blocks(items, plan.group)?, 1, 1);
            crate::cuda::launch::launch(pass, grid, block, 0, stream, list()?.pointers())?;
            if partial.is_some() {
                let fold = functions[1] as crate::cuda::sys::CUfunction;
                let grid = (blocks(plan.n_out, plan::FINAL_GROUP)?, 1, 1);
                crate::cuda::launch::launch(fold, grid, block, 0, stream, list()?.pointers())?;
            }
        }
        let read = wide.iter().chain(partial.iter());
        launch.finish(read, outs.iter().chain(raw))?;
        Ok(outs)
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
            let named = |e: Error| match e {
                Error::Invalid(m) => Error::Invalid(format!("{}: {m}", p.name)),
                Error::ReadOnly(m) => Error::ReadOnly(format!("{}: {m}", p.name)),
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
