//! `arange`: numpy's evenly spaced values, its length and its way of stepping, with integer
//! bounds counted exactly.

use super::create::{cast_value, check_value_kind};
use crate::array::Array;
use crate::cpu::copy::fill;
use crate::cpu::element::{Element, Scalar};
use crate::device::Device;
use crate::dtype::{DType, Kind};
use crate::error::{Error, Result};
use half::{bf16, f16};
use std::ops::{Add, Mul, Sub};

/// `[start, start + step, ...)` up to but excluding `stop`, as a 1-d array of `dtype`, as
/// numpy's `arange` makes it. Its length is `ceil((stop - start) / step)`, exactly for integer
/// bounds (Python's or numpy's ints, at any magnitude), in float64 otherwise. The first two
/// elements are `start` and `start + step` converted to `dtype` (a float truncates into an
/// integer dtype); element `i` is the first plus `i` times their difference, in `dtype`'s
/// arithmetic (float32's for float16 and bfloat16), so a float step into an integer dtype
/// steps by `int(start + step) - int(start)`. A value that an integer dtype cannot hold is an
/// [`Error::Overflow`] (numpy checks only the first two, and wraps the rest); bool takes at
/// most two elements ([`Error::WrongType`] past them).
pub fn arange(
    start: Scalar,
    stop: Scalar,
    step: Scalar,
    dtype: DType,
    device: Device,
) -> Result<Array> {
    if !device.is_host_accessible() {
        let host = arange(start, stop, step, dtype, Device::Cpu)?;
        return super::copy(&host, dtype, device);
    }
    let n = match [int(start), int(stop), int(step)] {
        [Some(a), Some(b), Some(s)] => integer_length(a, b, s)?,
        _ => float_length(real(start)?, real(stop)?, real(step)?)?,
    };
    let second = match (int(start), int(step)) {
        (Some(a), Some(s)) => a.checked_add(s).map(Scalar::Int),
        _ => None,
    };
    let second = second.map_or_else(|| Ok(Scalar::Float(real(start)? + real(step)?)), Ok)?;
    match dtype.kind() {
        Kind::Bool if n > 2 => Err(Error::wrong_type(format!(
            "arange makes bool arrays of at most 2 elements (as numpy), not {n}"
        ))),
        Kind::Bool => filled(n, dtype, device, |i| [start, second][i]),
        Kind::Int | Kind::UInt => integer_steps(n, start, second, dtype, device),
        Kind::Float | Kind::Complex => float_steps(n, start, second, dtype, device),
    }
}

/// A bound as an exact integer, if it is one (`i128`-sized).
fn int(v: Scalar) -> Option<i128> {
    match v {
        Scalar::Int(i) => Some(i),
        Scalar::Bool(b) => Some(i128::from(b)),
        _ => None,
    }
}

/// A bound as a float64 (a complex one is refused, as cubridge makes no complex ranges).
fn real(v: Scalar) -> Result<f64> {
    match v {
        Scalar::Bool(b) => Ok(f64::from(u8::from(b))),
        Scalar::Int(i) => Ok(i as f64),
        Scalar::Float(f) => Ok(f),
        Scalar::Wide(w) => Ok(w.to_f64()),
        Scalar::Complex(..) => Err(Error::wrong_type("arange takes no complex bounds")),
    }
}

/// `ceil((b - a) / s)`, exactly, at least 0.
fn integer_length(a: i128, b: i128, s: i128) -> Result<usize> {
    if s == 0 {
        return Err(Error::invalid("arange needs a non-zero step"));
    }
    let too_long = || Error::invalid(format!("arange({a}, {b}, {s}) is too long"));
    let span = b.checked_sub(a).ok_or_else(too_long)?;
    if span == 0 || (span > 0) != (s > 0) {
        return Ok(0);
    }
    let (span, s) = (span.unsigned_abs(), s.unsigned_abs());
    let count = span / s + u128::from(span % s != 0);
    usize::try_from(count)
        .ok()
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(too_long)
}

/// numpy's length of a range with a float among its bounds: `ceil((b - a) / s)` in float64,
/// where a quotient that underflows to zero counts one element (none when negative).
fn float_length(a: f64, b: f64, s: f64) -> Result<usize> {
    if s == 0.0 {
        return Err(Error::invalid("arange needs a non-zero step"));
    }
    let (delta, quotient) = (b - a, (b - a) / s);
    if quotient == 0.0 && delta != 0.0 {
        return Ok(usize::from(quotient.is_sign_positive()));
    }
    let count = quotient.ceil();
    // Past 2^63 either way (infinite, or NaN), as numpy refuses it; negative counts are empty.
    if count.is_nan() || count.abs() >= 2f64.powi(63) {
        // Debug formatting keeps exponents: Display would print 1e-300 as 300 digits.
        return Err(Error::invalid(format!(
            "arange({a:?}, {b:?}, {s:?}) has no length that an array can have"
        )));
    }
    Ok(count.max(0.0) as usize)
}

/// An integer dtype's range: the first two values converted to it (floats truncated, out of
/// range refused), then steps of their difference, exactly; the last must fit too.
fn integer_steps(
    n: usize,
    first: Scalar,
    second: Scalar,
    dtype: DType,
    device: Device,
) -> Result<Array> {
    let exact = |v: Scalar| match cast_value(v, dtype)? {
        Scalar::Int(i) => Ok(i),
        Scalar::Bool(b) => Ok(i128::from(b)),
        _ => Err(Error::invalid("internal: an integer dtype's value")),
    };
    let v0 = if n > 0 { exact(first)? } else { 0 };
    let delta = if n > 1 { exact(second)? - v0 } else { 0 };
    let last = (n.saturating_sub(1) as i128)
        .checked_mul(delta)
        .and_then(|d| d.checked_add(v0))
        .ok_or_else(|| Error::Overflow(format!("arange's values overflow {dtype}")))?;
    check_value_kind(Scalar::Int(last), dtype, "arange")?;
    filled(n, dtype, device, |i| Scalar::Int(v0 + i as i128 * delta))
}

/// A floating or complex dtype's range: the first two values rounded into it, then steps of
/// their difference in its arithmetic (float32's for float16 and bfloat16, as numpy and
/// ml_dtypes fill them), each rounded once into `dtype`.
fn float_steps(
    n: usize,
    first: Scalar,
    second: Scalar,
    dtype: DType,
    device: Device,
) -> Result<Array> {
    for v in [first, second].iter().take(n) {
        check_value_kind(*v, dtype, "arange")?;
    }
    let (a, b) = (first, second);
    let f32_index = |i: usize| i as f32;
    match dtype {
        DType::Float16 => steps(n, half::<f16>(a), half::<f16>(b), f32_index, dtype, device),
        DType::BFloat16 => steps(
            n,
            half::<bf16>(a),
            half::<bf16>(b),
            f32_index,
            dtype,
            device,
        ),
        DType::Float32 | DType::Complex64 => steps(n, from(a), from(b), f32_index, dtype, device),
        _ => steps(n, from::<f64>(a), from(b), |i| i as f64, dtype, device),
    }
}

/// `value` rounded once into the 16-bit float `H`, then widened to float32, whose arithmetic
/// fills its ranges.
fn half<H: Element + Into<f32>>(value: Scalar) -> f32 {
    from::<H>(value).into()
}

/// `value` rounded once into `T`.
fn from<T: Element>(value: Scalar) -> T {
    T::from_scalar(value)
}

/// `[b0, b1, b0 + 2 (b1 - b0), ...]` computed in `T` (`index` converts `i` to it, as C does),
/// each written into `dtype`.
fn steps<T>(
    n: usize,
    b0: T,
    b1: T,
    index: fn(usize) -> T,
    dtype: DType,
    device: Device,
) -> Result<Array>
where
    T: Element + Add<Output = T> + Sub<Output = T> + Mul<Output = T>,
{
    let delta = b1 - b0;
    filled(n, dtype, device, |i| match i {
        0 => b0.to_scalar(),
        1 => b1.to_scalar(),
        _ => (b0 + index(i) * delta).to_scalar(),
    })
}

/// A new 1-d array of `n` elements of `dtype` on the host `device`, element `i` being
/// `value(i)`.
fn filled(
    n: usize,
    dtype: DType,
    device: Device,
    value: impl Fn(usize) -> Scalar,
) -> Result<Array> {
    let out = Array::empty(&[n], dtype, device)?;
    let size = dtype.itemsize();
    for i in 0..n {
        // SAFETY: element i of the fresh contiguous host-accessible allocation of n elements.
        unsafe { fill(dtype, out.data_ptr().add(i * size), 1, value(i)) };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::copy::read_scalar;

    #[test]
    fn arange_counts_like_numpy() {
        let (i, f) = (Scalar::Int, Scalar::Float);
        let a = arange(i(0), i(5), i(1), DType::Int32, Device::Cpu).unwrap();
        assert_eq!(a.shape(), &[5]);
        let a = arange(f(1.0), f(2.0), f(0.3), DType::Float64, Device::Cpu).unwrap();
        assert_eq!(a.shape(), &[4]);
        // SAFETY: element 3 of a 4-element float64 array.
        let last = unsafe { read_scalar(DType::Float64, a.data_ptr(), 3) };
        // numpy steps by (start + step) - start, not by step.
        assert_eq!(last, Scalar::Float(1.0 + 3.0 * ((1.0 + 0.3) - 1.0)));
        assert_ne!(last, Scalar::Float(1.0 + 3.0 * 0.3));
        let empty = arange(i(5), i(0), i(1), DType::Int8, Device::Cpu).unwrap();
        assert_eq!(empty.shape(), &[0]);
        assert!(arange(i(0), i(1), i(0), DType::Int8, Device::Cpu).is_err());
        assert!(arange(f(0.0), f(1.0), f(0.0), DType::Int8, Device::Cpu).is_err());
        // Integers count and fill exactly where float64 cannot tell them apart.
        let big = 1i128 << 53;
        let a = arange(i(big), i(big + 4), i(1), DType::Int64, Device::Cpu).unwrap();
        // SAFETY: elements of a 4-element int64 array.
        let values: Vec<Scalar> = (0..4)
            .map(|k| unsafe { read_scalar(DType::Int64, a.data_ptr(), k) })
            .collect();
        assert_eq!(values, (0..4).map(|k| i(big + k)).collect::<Vec<_>>());
        let top = i128::from(u64::MAX);
        let a = arange(i(top), i(top - 6), i(-3), DType::UInt64, Device::Cpu).unwrap();
        assert_eq!(a.shape(), &[2]);
        // SAFETY: element 1 of a 2-element uint64 array.
        let second = unsafe { read_scalar(DType::UInt64, a.data_ptr(), 1) };
        assert_eq!(second, i(top - 3));
        assert!(matches!(
            arange(i(250), i(260), i(1), DType::UInt8, Device::Cpu),
            Err(Error::Overflow(_))
        ));
        // Bounds far apart do not overflow the count.
        assert!(arange(i(i128::MIN), i(i128::MAX), i(1), DType::Int8, Device::Cpu).is_err());
    }

    fn values(a: &Array) -> Vec<Scalar> {
        // SAFETY: each element of a host array of a.numel() elements.
        (0..a.numel() as isize)
            .map(|k| unsafe { read_scalar(a.dtype(), a.data_ptr(), k) })
            .collect()
    }

    #[test]
    fn float_steps_into_integer_dtypes_truncate_the_first_two_values() {
        let (i, f) = (Scalar::Int, Scalar::Float);
        // int(0.1) - int(0) is 0: every value is 0, as numpy's.
        let a = arange(f(0.0), f(1.0), f(0.1), DType::Int8, Device::Cpu).unwrap();
        assert_eq!(values(&a), vec![i(0); 10]);
        let a = arange(f(9.9), f(-3.0), f(-2.5), DType::Int32, Device::Cpu).unwrap();
        assert_eq!(values(&a), [9, 7, 5, 3, 1, -1].map(i));
        for (start, stop) in [(-1.0, 2.0), (0.0, 300.0)] {
            let r = arange(f(start), f(stop), f(1.0), DType::UInt8, Device::Cpu);
            assert!(matches!(r, Err(Error::Overflow(_))), "{start} {stop}");
        }
        let r = arange(f(f64::NAN), f(1.0), f(1.0), DType::Int8, Device::Cpu);
        assert!(matches!(r, Err(Error::Invalid(_))));
    }

    #[test]
    fn bool_ranges_hold_two_elements_at_most() {
        let (i, f) = (Scalar::Int, Scalar::Float);
        let a = arange(i(0), i(2), i(1), DType::Bool, Device::Cpu).unwrap();
        assert_eq!(values(&a), [Scalar::Bool(false), Scalar::Bool(true)]);
        let a = arange(f(1.5), f(-1.0), f(-1.5), DType::Bool, Device::Cpu).unwrap();
        assert_eq!(values(&a), [Scalar::Bool(true), Scalar::Bool(false)]);
        let r = arange(i(0), i(3), i(1), DType::Bool, Device::Cpu);
        assert!(matches!(r, Err(Error::WrongType(_))));
    }

    #[test]
    fn float_lengths_follow_numpy() {
        let f = Scalar::Float;
        let n = |a, b, s| arange(f(a), f(b), f(s), DType::Float64, Device::Cpu).map(|x| x.numel());
        assert_eq!(n(0.0, 1.0, f64::INFINITY), Ok(1));
        assert_eq!(n(0.0, -1.0, f64::INFINITY), Ok(0));
        assert_eq!(n(0.0, 1.0, 0.25), Ok(4));
        assert!(n(0.0, f64::NAN, 1.0).is_err());
        assert!(n(f64::NEG_INFINITY, 0.0, 1.0).is_err());
        assert!(n(0.0, 1e300, 1e-300).is_err());
    }
}
