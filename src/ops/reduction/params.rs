//! The parameters of every reduction kernel: the structs of `kernels/reduce.cuh` (keep each
//! pair in step), and the list that [`super::source::program`]'s kernels take.

use super::plan::ReductionPlan;
use crate::array::Array;
use crate::cpu::copy::ElementBytes;
use crate::cuda::launch::{KernelParam, Params};
use crate::error::{Error, Result};
use crate::layout::MAX_DIMS;
use crate::ops::elementwise::params::{Raw, Strided};

/// `CbRedShape`: the kept and reduced extents and the split.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct RedShape {
    /// Kept extents, innermost last.
    pub kept: [i64; MAX_DIMS],
    /// Reduced extents, innermost last.
    pub red: [i64; MAX_DIMS],
    /// Kept dimensions in use.
    pub kept_ndim: i32,
    /// Reduced dimensions in use.
    pub red_ndim: i32,
    /// Output elements.
    pub n_out: i64,
    /// Elements reduced into each.
    pub n_red: i64,
    /// Chunks per output.
    pub chunks: i64,
}

/// `CbRedIn<T>`: an element input and its strides over the kept and the reduced dimensions.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RedIn {
    /// The first element.
    pub p: *mut u8,
    /// Strides over the kept dimensions.
    pub ks: [i64; MAX_DIMS],
    /// Strides over the reduced dimensions.
    pub rs: [i64; MAX_DIMS],
}

// SAFETY: `#[repr(C)]` structs of 8-byte fields and pairs of 4-byte ones (`the_structs_have_no
// _padding` checks their sizes against the sums of their fields): no byte is padding.
unsafe impl KernelParam for RedShape {}
// SAFETY: as above.
unsafe impl KernelParam for RedIn {}

/// The first [`MAX_DIMS`] of `values`, zero after them.
fn fixed<T: Copy + TryInto<i64>>(values: &[T]) -> [i64; MAX_DIMS] {
    let mut out = [0; MAX_DIMS];
    for (to, &v) in out.iter_mut().zip(values) {
        *to = v.try_into().unwrap_or(i64::MAX);
    }
    out
}

impl RedShape {
    /// The shape of `plan` (whose dimensions [`ReductionPlan::new`] checked).
    pub fn of(plan: &ReductionPlan) -> RedShape {
        RedShape {
            kept: fixed(&plan.kept),
            red: fixed(&plan.red),
            kept_ndim: plan.kept.len() as i32,
            red_ndim: plan.red.len() as i32,
            n_out: plan.n_out as i64,
            n_red: plan.n_red as i64,
            chunks: plan.chunks as i64,
        }
    }
}

/// One operand of a reduction, as its parameter list takes it.
pub enum Param<'a> {
    /// An element input (broadcast to the input shape), or an element output.
    Element(&'a Array),
    /// One value for every element.
    Value(ElementBytes),
    /// A `raw` array.
    Raw(&'a Array),
}

impl Param<'_> {
    /// The same operand, again (for the second kernel's list).
    pub fn copy(&self) -> Param<'_> {
        match self {
            Param::Element(a) => Param::Element(a),
            Param::Value(b) => Param::Value(*b),
            Param::Raw(a) => Param::Raw(a),
        }
    }
}

/// The parameter list of a reduction kernel for `plan`: `operands` (inputs, then outputs; the
/// first `nin` inputs), the shape, and `partial` (null where there is one chunk).
pub fn list<'a>(
    plan: &ReductionPlan,
    operands: impl ExactSizeIterator<Item = Param<'a>>,
    nin: usize,
    partial: *mut u8,
) -> Result<Params> {
    let n = operands.len();
    let mut p = Params::with_capacity(n + 2, n * size_of::<Raw>() + size_of::<RedShape>() + 16);
    let (mut inputs, mut outputs) = (plan.in_kept.iter().zip(&plan.in_red), plan.out_kept.iter());
    let missing = || Error::invalid("internal: more element operands than the plan walks");
    for (k, operand) in operands.enumerate() {
        match operand {
            Param::Element(a) if k < nin => {
                let (ks, rs) = inputs.next().ok_or_else(missing)?;
                p.push(RedIn {
                    p: a.data_ptr(),
                    ks: fixed(ks),
                    rs: fixed(rs),
                });
            }
            Param::Element(a) => p.push(Strided::new(
                a.data_ptr(),
                outputs.next().ok_or_else(missing)?,
            )),
            Param::Value(bytes) => p.push_bytes(bytes.as_bytes()),
            Param::Raw(a) => p.push(Raw::new(a)?),
        }
    }
    p.push(RedShape::of(plan));
    p.push(partial);
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structs_have_no_padding() {
        assert_eq!(size_of::<RedShape>(), 64 + 64 + 4 + 4 + 3 * 8);
        assert_eq!(std::mem::offset_of!(RedShape, n_out), 64 + 64 + 8);
        assert_eq!(size_of::<RedIn>(), 8 + 64 + 64);
        let core = include_str!("../../../kernels/reduce.cuh");
        assert!(core.contains("int kept_ndim;\n    int red_ndim;\n    long long n_out;"));
    }

    /// Reads parameter `k` of a list as a `T`.
    fn read<T: Copy>(pointers: &[*mut std::ffi::c_void], k: usize) -> T {
        // SAFETY: the tests read each parameter as the type that was pushed for it.
        unsafe { *(pointers[k] as *const T) }
    }

    #[test]
    fn a_list_follows_the_declared_parameters() {
        use super::super::plan::Walk;
        use super::super::source::{program, tests::weighted, Variant};
        use crate::ops::plan::Operand;
        use crate::{DType, Device};
        let (r, sig) = weighted();
        let host = |shape: &[usize], d| Array::zeros(shape, d, Device::Cpu).unwrap();
        let x = host(&[4, 6], DType::BFloat16);
        let w = host(&[6], DType::BFloat16);
        let (y, z) = (host(&[4], DType::BFloat16), host(&[4], DType::Int32));
        let inputs = [Operand::of(&x)];
        let walk = Walk {
            shape: &[4, 6],
            axes: &[1],
            inputs: &inputs,
            outputs: &[&[1], &[1]],
        };
        let plan = ReductionPlan::new(&walk, true, true, 8, 1).unwrap();
        let value = ElementBytes::new(DType::Float32, crate::cpu::element::Scalar::Float(2.0));
        let operands = [
            Param::Element(&x),
            Param::Raw(&w),
            Param::Value(value),
            Param::Element(&y),
            Param::Element(&z),
        ];
        let mut p = list(&plan, operands.into_iter(), 3, std::ptr::null_mut()).unwrap();
        let q = p.pointers();
        let variant = Variant::of(&plan);
        let source = program(&r, &sig, variant).source;
        let head = format!("{}(", program(&r, &sig, variant).functions[0]);
        let (_, after) = source.split_once(&head).unwrap();
        let (declared, _) = after.split_once(')').unwrap();
        assert_eq!(declared.split(", ").count(), q.len());
        let x_in = read::<RedIn>(q, 0);
        assert_eq!((x_in.p, x_in.ks[0], x_in.rs[0]), (x.data_ptr(), 6, 1));
        assert_eq!(read::<f32>(q, 2), 2.0);
        let y_out = read::<Strided>(q, 3);
        assert_eq!((y_out.p, y_out.s[0]), (y.data_ptr(), 1));
        let shape = read::<RedShape>(q, 5);
        assert_eq!((shape.n_out, shape.n_red, shape.chunks), (4, 6, 1));
        assert_eq!((shape.kept_ndim, shape.red_ndim), (1, 1));
        assert!(read::<*mut u8>(q, 6).is_null());
    }
}
