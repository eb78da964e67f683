//! The built-in reductions as instances of the reduction engine: `sum`, `prod`, `max`, `min`,
//! `argmax` and `argmin`, each a declaration (`T x` into `R y`) whose arithmetic is
//! `kernels/reduce_ops.cuh`'s, with numpy's result dtypes, run by the engine on CUDA memory and
//! by the CPU loops of [`crate::cpu::reduce`] on host memory.

use super::{normalize_axes, out_shape, Axes, Bound, ReductionKernel};
use crate::array::Array;
use crate::cpu::reduce::{self as cpu, Op};
use crate::cpu::SendPtr;
use crate::cuda::kernels::Program;
use crate::cuda::nvrtc;
use crate::cuda::stream::{self as cuda_stream, Stream};
use crate::device::Device;
use crate::dtype::{DType, Kind};
use crate::error::{Error, Result};
use crate::layout::coalesce;
use crate::ops::elementwise::source::{Role, Signature};
use crate::ops::elementwise::spec::Rule;
use crate::ops::Arg;
use std::sync::OnceLock;

/// The arithmetic of the built-in reductions: add's conversions and sums, then products,
/// accumulators and comparisons.
const HEADER: &str = concat!(
    include_str!("../../../kernels/common.cuh"),
    include_str!("../../../kernels/reduce_ops.cuh")
);

/// The name of an op, as numpy's messages and cubridge's kernels call it.
pub fn name(op: Op) -> &'static str {
    match op {
        Op::Sum => "sum",
        Op::Prod => "prod",
        Op::Max => "max",
        Op::Min => "min",
        Op::ArgMax => "argmax",
        Op::ArgMin => "argmin",
    }
}

const ALL: [Op; 6] = [Op::Sum, Op::Prod, Op::Max, Op::Min, Op::ArgMax, Op::ArgMin];

/// The declaration of `op`: map, reduce, post-map, identity and reduce type.
fn declaration(op: Op) -> [&'static str; 5] {
    // max and min fold (value, 0) pairs whose index -1 marks the empty fold: no dtype needs a
    // smallest value. argmax and argmin fold (value, _J).
    const PAIR: &str = "cbr_arg<typename CbAcc<T>::type>";
    match op {
        Op::Sum | Op::Prod => [
            "Cvt<_type_reduce, T>::run(x)",
            if op == Op::Sum {
                "Add<_type_reduce>::run(a, b)"
            } else {
                "Mul<_type_reduce>::run(a, b)"
            },
            "y = Cvt<R, _type_reduce>::run(a)",
            if op == Op::Sum { "0" } else { "1" },
            "typename CbAcc<R>::type",
        ],
        Op::Max | Op::Min | Op::ArgMax | Op::ArgMin => {
            let more = matches!(op, Op::Max | Op::ArgMax);
            let arg = matches!(op, Op::ArgMax | Op::ArgMin);
            [
                if arg {
                    "_type_reduce{Cvt<typename CbAcc<T>::type, T>::run(x), _J}"
                } else {
                    "_type_reduce{Cvt<typename CbAcc<T>::type, T>::run(x), 0}"
                },
                if more {
                    "cb_pick_arg<true>(a, b)"
                } else {
                    "cb_pick_arg<false>(a, b)"
                },
                if arg {
                    "y = a.i"
                } else {
                    "y = Cvt<R, typename CbAcc<T>::type>::run(a.v)"
                },
                "_type_reduce{typename CbAcc<T>::type(), -1}",
                PAIR,
            ]
        }
    }
}

/// `op` as a reduction kernel, made once per process.
fn kernel(op: Op) -> &'static ReductionKernel {
    static KERNELS: [OnceLock<ReductionKernel>; 6] = [const { OnceLock::new() }; 6];
    let k = ALL.iter().position(|&o| o == op).unwrap_or(0);
    KERNELS[k].get_or_init(|| {
        let [map_expr, reduce_expr, post_map_expr, identity, reduce_type] = declaration(op);
        let code = super::spec::Code {
            map_expr,
            reduce_expr,
            post_map_expr,
            identity: Some(identity),
            reduce_type: Some(reduce_type),
        };
        let spec =
            super::spec::ReductionSpec::new("T x", "R y", code, name(op), "", (true, vec![]));
        // A fixed declaration, which the tests parse.
        let spec = spec.expect("a built-in reduction's declaration parses");
        let empty_ok = matches!(op, Op::Sum | Op::Prod);
        let spec = spec.built_in(Rule::Promote(name(op)), HEADER, &[nvrtc::MINIMAL], empty_ok);
        ReductionKernel::new(spec)
    })
}

/// The result's dtype of `op` over `x`, as numpy's: sums and products of bool and signed
/// integers in int64, of unsigned ones in uint64, of the rest in their own dtype, unless
/// `dtype` says otherwise; max and min in `x`'s dtype; argmax and argmin int64.
pub fn result_dtype(op: Op, x: DType, dtype: Option<DType>) -> Result<DType> {
    match (op, dtype) {
        (Op::Sum | Op::Prod, Some(d)) => Ok(d),
        (Op::Sum | Op::Prod, None) => Ok(match x.kind() {
            Kind::Bool | Kind::Int => DType::Int64,
            Kind::UInt => DType::UInt64,
            _ => x,
        }),
        (_, Some(_)) => Err(Error::invalid(format!("{} takes no dtype", name(op)))),
        (Op::Max | Op::Min, None) => Ok(x),
        (Op::ArgMax | Op::ArgMin, None) => Ok(DType::Int64),
    }
}

/// `op` of `x` over `axes`, into `out` when given (which must have the result's shape and
/// dtype) or a new array on `x`'s device; on CUDA on `stream` (the legacy default stream when
/// `None`). `dtype` is the result's dtype of sum and prod (see [`result_dtype`]). max, min,
/// argmax and argmin of no elements are refused, as numpy refuses them; argmax and argmin take
/// one axis or all.
pub fn reduce(
    op: Op,
    x: &Array,
    axes: Axes<'_>,
    dtype: Option<DType>,
    out: Option<&Array>,
    stream: Option<Stream>,
) -> Result<Array> {
    let r = result_dtype(op, x.dtype(), dtype)?;
    if matches!(op, Op::ArgMax | Op::ArgMin) && axes.axis.is_some_and(|a| a.len() != 1) {
        return Err(Error::invalid(format!(
            "{} takes one axis, or None",
            name(op)
        )));
    }
    // numpy refuses an empty max even where the result is empty too (CuPy's kernels do not).
    let reduced = normalize_axes(axes.axis, x.ndim())?;
    if !kernel_empty_ok(op) && reduced.iter().any(|&d| x.shape()[d] == 0) {
        return Err(Error::invalid(format!(
            "zero-size array to reduction operation {} which has no identity",
            name(op)
        )));
    }
    let host = x.device().is_host_accessible();
    if out.is_some_and(|o| o.device().is_host_accessible() != host) {
        let right = out.map(|o| o.device().to_string()).unwrap_or_default();
        let left = x.device().to_string();
        return Err(Error::DeviceMismatch { left, right });
    }
    if host {
        return on_host(op, x, axes, r, out);
    }
    let bound = Bound {
        dtypes: vec![x.dtype(), r],
        roles: vec![Role::Element; 2],
    };
    let stream = stream.unwrap_or(cuda_stream::LEGACY);
    let inputs = [Arg::Array(x.clone())];
    let outputs = [out.cloned()];
    // SAFETY: the built-in declarations read their one element and write their one output.
    let outs = unsafe { kernel(op).run(&bound, &inputs, &outputs, axes, (x.device(), stream))? };
    outs.into_iter()
        .next()
        .ok_or_else(|| Error::invalid("internal: a reduction made no result"))
}

/// `op` on host memory: the CPU loops of [`crate::cpu::reduce`].
fn on_host(op: Op, x: &Array, axes: Axes<'_>, r: DType, out: Option<&Array>) -> Result<Array> {
    let reduced = normalize_axes(axes.axis, x.ndim())?;
    let shape = out_shape(x.shape(), &reduced, axes.keepdims);
    let out = match out {
        Some(o) => {
            crate::ops::elementwise::check::check_out(o, &shape, r, [x].into_iter())?;
            o.clone()
        }
        None => Array::empty(&shape, r, Device::Cpu)?,
    };
    let n_red: usize = reduced.iter().map(|&d| x.shape()[d]).product();
    if out.numel() == 0 {
        return Ok(out);
    }
    let kept: Vec<usize> = (0..x.ndim()).filter(|d| !reduced.contains(d)).collect();
    let pick = |s: &[isize], axes: &[usize]| axes.iter().map(|&d| s[d]).collect::<Vec<_>>();
    let out_kept = super::kept_of(out.strides(), x.shape(), &reduced, axes.keepdims);
    let extents = |axes: &[usize]| axes.iter().map(|&d| x.shape()[d]).collect::<Vec<_>>();
    let walk = cpu::Walk {
        kept: coalesce(&extents(&kept), [&out_kept, &pick(x.strides(), &kept)]),
        n_out: out.numel(),
        red: coalesce(&extents(&reduced), [&pick(x.strides(), &reduced)]),
        n_red,
    };
    // SAFETY: x and out are host-accessible with layouts validated against their buffers; the
    // walk addresses x's elements (kept then reduced axes) and out's over the result's shape;
    // out is writable, does not overlap itself or x (checked), and has the result's dtype;
    // max and min reduce at least one element (checked above).
    unsafe {
        cpu::reduce(
            op,
            [x.dtype(), r],
            SendPtr(x.data_ptr()),
            SendPtr(out.data_ptr()),
            &walk,
        )?
    };
    Ok(out)
}

/// Whether `op` reduces no elements (into its identity).
fn kernel_empty_ok(op: Op) -> bool {
    matches!(op, Op::Sum | Op::Prod)
}

/// The reductions that ship compiled: sum, max and min of float32, float16, bfloat16, int32
/// and int64 (and their default results), over whole arrays and over rows (the kernels of
/// 256 and of 32 threads per output, with packs; short rows a pack or whole packs a thread),
/// and over columns (one thread per output, or per pack of neighbouring outputs).
pub fn shipped_programs() -> Vec<Program> {
    let dtypes = [
        DType::Float32,
        DType::Float16,
        DType::BFloat16,
        DType::Int32,
        DType::Int64,
    ];
    let variants = [(256, true, 0), (32, true, 0), (1, true, 0), (1, false, 0)];
    let mut all = Vec::new();
    for op in [Op::Sum, Op::Max, Op::Min] {
        for d in dtypes {
            let Ok(r) = result_dtype(op, d, None) else {
                continue;
            };
            let sig = Signature {
                dtypes: vec![d, r],
                roles: vec![Role::Element; 2],
            };
            // Short rows in packs: K rows of V / K elements a pack, down to rows of 2.
            let width = super::source::width(&sig, 1) as u32;
            let short = (0..).map(|s| 1 << s).take_while(|&k| k <= width / 2);
            let rows = short.map(|k| (1, true, k));
            for (group, vector, rows) in variants.into_iter().chain(rows) {
                let v = super::source::Variant {
                    group,
                    vector,
                    rows,
                };
                all.push(super::source::program(kernel(op).spec(), &sig, v));
            }
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::element::Scalar;

    #[test]
    fn result_dtypes_are_numpys() {
        assert_eq!(
            result_dtype(Op::Sum, DType::Int8, None).unwrap(),
            DType::Int64
        );
        assert_eq!(
            result_dtype(Op::Sum, DType::Bool, None).unwrap(),
            DType::Int64
        );
        assert_eq!(
            result_dtype(Op::Prod, DType::UInt8, None).unwrap(),
            DType::UInt64
        );
        assert_eq!(
            result_dtype(Op::Sum, DType::Float16, None).unwrap(),
            DType::Float16
        );
        let f64 = Some(DType::Float64);
        assert_eq!(
            result_dtype(Op::Sum, DType::Int8, f64).unwrap(),
            DType::Float64
        );
        assert!(result_dtype(Op::Max, DType::Int8, f64).is_err());
        assert_eq!(
            result_dtype(Op::ArgMin, DType::Float32, None).unwrap(),
            DType::Int64
        );
    }

    #[test]
    fn host_reductions_over_axes() {
        let x = crate::ops::arange(
            Scalar::Int(0),
            Scalar::Int(24),
            Scalar::Int(1),
            DType::Int32,
            Device::Cpu,
        )
        .unwrap()
        .as_strided(&[2, 3, 4], &[12, 4, 1], 0)
        .unwrap();
        let axes = Axes {
            axis: Some(&[0, 2]),
            keepdims: true,
        };
        let s = reduce(Op::Sum, &x, axes, None, None, None).unwrap();
        assert_eq!((s.shape(), s.dtype()), (&[1, 3, 1][..], DType::Int64));
        let got: Vec<Scalar> = (0..3)
            // SAFETY: three contiguous int64 results.
            .map(|i| unsafe { crate::cpu::copy::read_scalar(DType::Int64, s.data_ptr(), i) })
            .collect();
        // Rows of 4 at k*4 and 12 + k*4: (6 + 16k) + (54 + 16k).
        assert_eq!(got, [60, 92, 124].map(Scalar::Int));
        let none = Axes {
            axis: Some(&[0, 1]),
            keepdims: false,
        };
        assert!(reduce(Op::ArgMax, &x, none, None, None, None).is_err());
        let empty = x.as_strided(&[0], &[1], 0).unwrap();
        let all = || Axes {
            axis: None,
            keepdims: false,
        };
        assert!(reduce(Op::Max, &empty, all(), None, None, None)
            .unwrap_err()
            .to_string()
            .contains("no identity"));
        let z = reduce(Op::Sum, &empty, all(), None, None, None).unwrap();
        assert_eq!(
            // SAFETY: a 0-d int64 result.
            unsafe { crate::cpu::copy::read_scalar(DType::Int64, z.data_ptr(), 0) },
            Scalar::Int(0)
        );
    }
}

/// Compiles the built-in reductions with NVRTC when `CUBRIDGE_TEST_NVRTC_DIR` names a folder
/// holding libnvrtc (no GPU needed): every op over every dtype it takes, in every variant.
#[cfg(test)]
mod compile_tests {
    use super::*;

    #[test]
    fn built_in_reductions_compile() {
        if !nvrtc::test_dir("built-in reductions") {
            return;
        }
        let mut programs = shipped_programs();
        for op in ALL {
            for d in DType::ALL {
                let Ok(r) = result_dtype(op, d, None) else {
                    continue;
                };
                let sig = Signature {
                    dtypes: vec![d, r],
                    roles: vec![Role::Element; 2],
                };
                let v = super::super::source::Variant {
                    group: 32,
                    vector: d.itemsize() < 16,
                    rows: 0,
                };
                programs.push(super::super::source::program(kernel(op).spec(), &sig, v));
            }
        }
        for p in programs {
            let key = format!("test_{}_{}", p.name, std::process::id());
            if let Err(e) = nvrtc::compile(&p.source, &key, 80, &p.options) {
                panic!("{}: {e}\n{}", p.name, p.source);
            }
        }
    }
}
