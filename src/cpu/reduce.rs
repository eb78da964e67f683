//! The built-in reductions on host memory: `sum` and `prod` (integers exact and wrapping in 64
//! bits, float16 and bfloat16 in float32, float32 and float64 in float64, complex in
//! complex128, each rounded once into the result), `max` and `min` (NaN wins, as numpy's), and
//! `argmax` and `argmin` (the first index of the extreme; the first NaN wins). One generic walk
//! per input type; outputs split across cores when there are many.

use super::copy::fill;
use super::element::{AddElem, Complex, Element, Scalar};
use super::{for_each_run, parallel_ranges, SendPtr};
use crate::dtype::{DType, Kind};
use crate::error::{Error, Result};
use crate::layout::Coalesced;
use half::{bf16, f16};

/// A built-in reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// The sum.
    Sum,
    /// The product.
    Prod,
    /// The largest element.
    Max,
    /// The smallest element.
    Min,
    /// The index of the first largest element.
    ArgMax,
    /// The index of the first smallest element.
    ArgMin,
}

/// The walk of one reduction: `kept` over (out, x) strides, `red` over x's reduced strides in
/// C order (so that the n-th element visited has index n along the reduced dimensions).
pub struct Walk {
    /// Kept dimensions: out's strides, then x's.
    pub kept: Coalesced<2>,
    /// Output elements.
    pub n_out: usize,
    /// Reduced dimensions: x's strides.
    pub red: Coalesced<1>,
    /// Elements reduced into each output.
    pub n_red: usize,
}

/// An accumulator of sums and products.
trait Wide: Element + AddElem {
    fn mul(a: Self, b: Self) -> Self;
    fn one() -> Self {
        Self::from_scalar(Scalar::Int(1))
    }
}
macro_rules! wide {
    ($($t:ty => |$a:ident, $b:ident| $mul:expr),* $(,)?) => {$(
        impl Wide for $t {
            #[inline(always)]
            fn mul($a: Self, $b: Self) -> Self { $mul }
        }
    )*};
}
wide!(
    bool => |a, b| a & b,
    i64 => |a, b| a.wrapping_mul(b),
    u64 => |a, b| a.wrapping_mul(b),
    f32 => |a, b| a * b,
    f64 => |a, b| a * b,
    Complex<f64> => |a, b| Complex { re: a.re * b.re - a.im * b.im, im: a.re * b.im + a.im * b.re },
);

/// Calls `f(j, x)` for each element `x` of the reduced dimensions from `base`, `j` counting
/// them in C order.
///
/// # Safety
/// Every element `red` addresses from `base` is a valid `T`.
#[inline(always)]
unsafe fn walk_red<T: Element>(
    base: *const T,
    red: &Coalesced<1>,
    n: usize,
    mut f: impl FnMut(usize, T),
) {
    let last = red.shape.len() - 1;
    let step = red.strides[0][last];
    let mut j = 0;
    for_each_run(red, 0, n, |[o], len| {
        for i in 0..len as isize {
            // SAFETY: the caller's contract: the walker stays inside the reduced dimensions.
            f(j, unsafe { *base.offset(o + i * step) });
            j += 1;
        }
    });
}

/// Runs `one(x_base, out_offset)` for each output element, split across cores.
fn each_output(w: &Walk, one: impl Fn(isize, isize) + Sync) {
    let last = w.kept.shape.len() - 1;
    let (so, sx) = (w.kept.strides[0][last], w.kept.strides[1][last]);
    parallel_ranges(w.n_out, |start, end| {
        for_each_run(&w.kept, start, end, |[oo, ox], len| {
            for i in 0..len as isize {
                one(ox + i * sx, oo + i * so);
            }
        });
    });
}

/// Sums or multiplies in `W`, writing each result into `out` (of `out_dtype`).
///
/// # Safety
/// As [`reduce`].
unsafe fn fold<T: Element, W: Wide>(op: Op, x: SendPtr, out: SendPtr, out_dtype: DType, w: &Walk) {
    let size = out_dtype.itemsize() as isize;
    each_output(w, |xo, oo| {
        let mut acc = if op == Op::Sum {
            W::from_scalar(Scalar::Int(0))
        } else {
            W::one()
        };
        // SAFETY: the caller's contract: x's elements from xo along the reduced dimensions.
        unsafe {
            walk_red((x.get() as *const T).offset(xo), &w.red, w.n_red, |_, v| {
                let v = W::from_scalar(v.to_scalar());
                acc = if op == Op::Sum {
                    W::add(acc, v)
                } else {
                    W::mul(acc, v)
                };
            });
            fill(out_dtype, out.get().offset(oo * size), 1, acc.to_scalar());
        }
    });
}

/// Whether `a` orders after `b` (complex: lexicographic).
fn greater(a: Scalar, b: Scalar) -> bool {
    match (a, b) {
        (Scalar::Complex(ar, ai), Scalar::Complex(br, bi)) => ar > br || (ar == br && ai > bi),
        (Scalar::Int(a), Scalar::Int(b)) => a > b,
        (Scalar::Bool(a), Scalar::Bool(b)) => a & !b,
        (a, b) => as_f64(a) > as_f64(b),
    }
}

fn as_f64(s: Scalar) -> f64 {
    match s {
        Scalar::Float(f) => f,
        Scalar::Int(i) => i as f64,
        Scalar::Bool(b) => b as u8 as f64,
        _ => f64::NAN,
    }
}

fn is_nan(s: Scalar) -> bool {
    match s {
        Scalar::Float(f) => f.is_nan(),
        Scalar::Complex(r, i) => r.is_nan() || i.is_nan(),
        _ => false,
    }
}

/// max, min, argmax or argmin of `T` elements: the first NaN, else the first extreme.
///
/// # Safety
/// As [`reduce`].
unsafe fn pick<T: Element>(op: Op, x: SendPtr, out: SendPtr, w: &Walk) {
    let more = matches!(op, Op::Max | Op::ArgMax);
    let arg = matches!(op, Op::ArgMax | Op::ArgMin);
    each_output(w, |xo, oo| {
        let mut best: Option<(usize, T, Scalar)> = None;
        // SAFETY: the caller's contract.
        unsafe {
            walk_red((x.get() as *const T).offset(xo), &w.red, w.n_red, |j, v| {
                let s = v.to_scalar();
                let take = match best {
                    None => true,
                    Some((_, _, b)) if is_nan(b) => false,
                    Some(_) if is_nan(s) => true,
                    Some((_, _, b)) if more => greater(s, b),
                    Some((_, _, b)) => greater(b, s),
                };
                if take {
                    best = Some((j, v, s));
                }
            });
            if let Some((j, v, _)) = best {
                if arg {
                    *(out.get() as *mut i64).offset(oo) = j as i64;
                } else {
                    *(out.get() as *mut T).offset(oo) = v;
                }
            }
        }
    });
}

/// Reduces `x` (of `dtypes[0]`) into `out` (of `dtypes[1]`, as `ops::reduction::builtin`
/// chooses it) along `w`.
///
/// # Safety
/// Every element `w` addresses from `x` (kept then reduced strides) and from `out` (kept
/// strides) is valid, aligned and of its dtype; `out` is writable, its elements distinct and
/// disjoint from `x`; max and min reduce at least one element; `out` has `x`'s dtype for max
/// and min and is int64 for argmax and argmin.
pub unsafe fn reduce(op: Op, dtypes: [DType; 2], x: SendPtr, out: SendPtr, w: &Walk) -> Result<()> {
    let [dx, dr] = dtypes;
    macro_rules! each_type {
        ($($t:ty),*) => {$(
            if dx == <$t>::DTYPE {
                // SAFETY: the dtype matches the type; the rest is the caller's contract.
                unsafe { typed::<$t>(op, x, out, dr, w) };
                return Ok(());
            }
        )*};
    }
    each_type!(
        bool,
        i8,
        i16,
        i32,
        i64,
        u8,
        u16,
        u32,
        u64,
        f16,
        bf16,
        f32,
        f64,
        Complex<f32>,
        Complex<f64>
    );
    Err(Error::invalid(format!(
        "internal: no CPU reduction of {dx}"
    )))
}

/// [`reduce`] for input type `T`: sums and products in the accumulator of the result's dtype.
///
/// # Safety
/// As [`reduce`].
unsafe fn typed<T: Element>(op: Op, x: SendPtr, out: SendPtr, dr: DType, w: &Walk) {
    // SAFETY: (each arm) the caller's contract.
    unsafe {
        match (op, dr.kind(), dr) {
            (Op::Sum | Op::Prod, Kind::Bool, _) => fold::<T, bool>(op, x, out, dr, w),
            (Op::Sum | Op::Prod, Kind::Int, _) => fold::<T, i64>(op, x, out, dr, w),
            (Op::Sum | Op::Prod, Kind::UInt, _) => fold::<T, u64>(op, x, out, dr, w),
            (Op::Sum | Op::Prod, _, DType::Float16 | DType::BFloat16) => {
                fold::<T, f32>(op, x, out, dr, w)
            }
            (Op::Sum | Op::Prod, Kind::Float, _) => fold::<T, f64>(op, x, out, dr, w),
            (Op::Sum | Op::Prod, _, _) => fold::<T, Complex<f64>>(op, x, out, dr, w),
            _ => pick::<T>(op, x, out, w),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::coalesce;

    fn walk(shape_kept: &[usize], so: &[isize], sx: &[isize], red: &[usize], sr: &[isize]) -> Walk {
        Walk {
            kept: coalesce(shape_kept, [so, sx]),
            n_out: shape_kept.iter().product(),
            red: coalesce(red, [sr]),
            n_red: red.iter().product(),
        }
    }

    #[test]
    fn integer_sums_are_exact_and_half_sums_round_once() {
        // Rows of a 2 x 3 int32 array, into int64.
        let x: [i32; 6] = [i32::MAX, i32::MAX, 1, -5, 2, 3];
        let mut out = [0i64; 2];
        let w = walk(&[2], &[1], &[3], &[3], &[1]);
        let (px, po) = (
            SendPtr(x.as_ptr() as *mut u8),
            SendPtr(out.as_mut_ptr().cast()),
        );
        // SAFETY: the walk stays inside both arrays.
        unsafe { reduce(Op::Sum, [DType::Int32, DType::Int64], px, po, &w).unwrap() };
        assert_eq!(out, [2 * i32::MAX as i64 + 1, 0]);
        // 2048 + 1 + 1 in float16: float32 keeps 2050, rounded once (float16 alone gives 2048).
        let h = [2048.0f32, 1.0, 1.0].map(f16::from_f32);
        let mut r = [f16::ZERO];
        let w = walk(&[], &[], &[], &[3], &[1]);
        let (px, po) = (
            SendPtr(h.as_ptr() as *mut u8),
            SendPtr(r.as_mut_ptr().cast()),
        );
        // SAFETY: as above.
        unsafe { reduce(Op::Sum, [DType::Float16, DType::Float16], px, po, &w).unwrap() };
        assert_eq!(r[0].to_f32(), 2050.0);
    }

    #[test]
    fn nan_wins_and_arg_takes_the_first() {
        let x = [1.0f32, 3.0, f32::NAN, 3.0, f32::NAN, 7.0];
        let w = walk(&[], &[], &[], &[6], &[1]);
        let px = SendPtr(x.as_ptr() as *mut u8);
        let mut m = [0f32];
        let mut i = [0i64];
        // SAFETY: the walk stays inside the arrays.
        unsafe {
            reduce(
                Op::Max,
                [DType::Float32; 2],
                px,
                SendPtr(m.as_mut_ptr().cast()),
                &w,
            )
            .unwrap();
            let pi = SendPtr(i.as_mut_ptr().cast());
            reduce(Op::ArgMin, [DType::Float32, DType::Int64], px, pi, &w).unwrap();
        }
        assert!(m[0].is_nan());
        assert_eq!(i[0], 2);
        let y = [1.0f32, 3.0, 0.5, 3.0];
        let w = walk(&[], &[], &[], &[4], &[1]);
        // SAFETY: as above.
        unsafe {
            let pi = SendPtr(i.as_mut_ptr().cast());
            reduce(
                Op::ArgMax,
                [DType::Float32, DType::Int64],
                SendPtr(y.as_ptr() as *mut u8),
                pi,
                &w,
            )
            .unwrap();
        }
        assert_eq!(i[0], 1);
    }
}
