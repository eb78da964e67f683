//! `full`, and the conversion of Python values into elements of a dtype, shared by creation
//! and kernels (`empty` and `zeros` are [`Array`] constructors; `arange` has its own file).

use crate::array::Array;
use crate::cpu::copy::fill;
use crate::cpu::element::Scalar;
use crate::device::Device;
use crate::dtype::{DType, Kind};
use crate::error::{Error, Result};

/// An array of `shape` with every element `value` converted to `dtype`.
pub fn full(shape: &[usize], value: Scalar, dtype: DType, device: Device) -> Result<Array> {
    check_value_kind(value, dtype, "fill")?;
    if let Device::Cuda(n) = device {
        // Filled on the device, on the legacy default stream the allocation is recorded on.
        let out = Array::empty(shape, dtype, device)?;
        let mut element = [0u8; 16];
        // SAFETY: 16 writable bytes hold one element of any dtype.
        unsafe { fill(dtype, element.as_mut_ptr(), 1, value) };
        // SAFETY: `out` is a fresh contiguous device allocation of `numel` elements of
        // `dtype`, aligned for it, freed only after the legacy default stream's work.
        unsafe {
            crate::cuda::memory::fill_async(
                out.data_ptr(),
                out.numel(),
                &element[..dtype.itemsize()],
                n,
                crate::cuda::stream::LEGACY,
            )?
        };
        return Ok(out);
    }
    let out = Array::empty(shape, dtype, device)?;
    // SAFETY: `out` is a fresh contiguous host-accessible allocation of `numel` elements.
    unsafe { fill(dtype, out.data_ptr(), out.numel(), value) };
    Ok(out)
}

/// A Python value converted for an element of `dtype` the way numpy builds an array from
/// values (`numpy.asarray([1.5], dtype="int32")` is `[1]`): floats truncate toward zero into
/// integer dtypes, and any non-zero value (a complex one too) is true in bool. As numpy 2 does,
/// an integer that the dtype cannot hold is an [`Error::Overflow`] rather than wrapping, so are
/// a float beyond an integer dtype and an infinity into one; a NaN into one is an
/// [`Error::Invalid`], and a complex value into another real dtype is refused.
pub fn cast_value(value: Scalar, dtype: DType) -> Result<Scalar> {
    let value = match (value, dtype.kind()) {
        (Scalar::Int(v), Kind::Bool) => Scalar::Bool(v != 0),
        (Scalar::Wide(_), Kind::Bool) => Scalar::Bool(true),
        (Scalar::Float(v), Kind::Bool) => Scalar::Bool(v != 0.0),
        (Scalar::Complex(re, im), Kind::Bool) => Scalar::Bool(re != 0.0 || im != 0.0),
        (Scalar::Float(v), Kind::Int | Kind::UInt) => {
            if v.is_nan() {
                return Err(Error::invalid(format!(
                    "cannot convert float NaN to integer ({dtype})"
                )));
            }
            let t = v.trunc();
            if t.abs() >= 2f64.powi(64) {
                return Err(Error::Overflow(format!(
                    "Python float {v} out of bounds for {dtype}"
                )));
            }
            Scalar::Int(t as i128)
        }
        _ => value,
    };
    check_value_kind(value, dtype, "asarray")?;
    Ok(value)
}

/// Refuses values that `dtype` cannot hold meaningfully, as the Array API does for Python
/// scalars: a bool takes any dtype, an int any but bool, a float a floating or complex one, a
/// complex a complex one; and, as numpy 2 does, an int outside an integer dtype's range, or one
/// past float64's range ([`Error::Overflow`]), rather than wrapping it or making it infinite.
/// `op` names the operation in the error.
pub fn check_value_kind(value: Scalar, dtype: DType, op: &'static str) -> Result<()> {
    match (value, int_range(dtype)) {
        (Scalar::Int(v), Some((lo, hi))) if v < lo || v > hi => {
            return Err(Error::Overflow(format!(
                "Python integer {v} out of bounds for {dtype}"
            )));
        }
        (Scalar::Wide(w), Some(_)) => {
            return Err(Error::Overflow(format!(
                "Python integer of {} bits out of bounds for {dtype}",
                64 + u64::from(w.shift)
            )));
        }
        (Scalar::Wide(w), None) if w.to_f64().is_infinite() => {
            return Err(Error::Overflow(
                "Python integer too large to convert to float".into(),
            ));
        }
        _ => {}
    }
    let fits = match (value, dtype.kind()) {
        (Scalar::Bool(_), _) => true,
        (Scalar::Int(_) | Scalar::Wide(_), Kind::Bool) => false,
        (Scalar::Int(_) | Scalar::Wide(_), _) => true,
        (Scalar::Float(_), Kind::Float | Kind::Complex) => true,
        (Scalar::Complex(..), Kind::Complex) => true,
        _ => false,
    };
    if fits {
        Ok(())
    } else {
        Err(Error::DTypeMismatch {
            op,
            left: dtype.name().into(),
            right: value.kind_name().into(),
        })
    }
}

/// The values an integer dtype holds, or `None` for other kinds.
fn int_range(dtype: DType) -> Option<(i128, i128)> {
    let bits = 8 * dtype.itemsize() as u32;
    match dtype.kind() {
        Kind::Int => Some((-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)),
        Kind::UInt => Some((0, (1i128 << bits) - 1)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::copy::read_scalar;

    #[test]
    fn values_cast_as_numpy_builds_arrays() {
        use Scalar::*;
        assert_eq!(cast_value(Float(1.5), DType::Int32), Ok(Int(1)));
        assert_eq!(cast_value(Float(-1.9), DType::Int8), Ok(Int(-1)));
        assert_eq!(cast_value(Int(0), DType::Bool), Ok(Bool(false)));
        assert_eq!(cast_value(Float(0.5), DType::Bool), Ok(Bool(true)));
        assert_eq!(cast_value(Int(3), DType::Float16), Ok(Int(3)));
        assert!(matches!(
            cast_value(Int(300), DType::Int8),
            Err(Error::Overflow(_))
        ));
        assert!(matches!(
            cast_value(Float(1e30), DType::Int64),
            Err(Error::Overflow(_))
        ));
        assert!(matches!(
            cast_value(Float(f64::NAN), DType::Int32),
            Err(Error::Invalid(_))
        ));
        assert!(matches!(
            cast_value(Float(f64::NEG_INFINITY), DType::Int32),
            Err(Error::Overflow(_))
        ));
        assert_eq!(cast_value(Complex(0.0, -1.0), DType::Bool), Ok(Bool(true)));
        assert_eq!(cast_value(Complex(0.0, 0.0), DType::Bool), Ok(Bool(false)));
        assert!(cast_value(Complex(1.0, 2.0), DType::Float64).is_err());
        // Integers past i128 go into floating dtypes (past float64's range they overflow), true
        // into bool, and no integer dtype holds them.
        let wide = |shift| {
            Wide(crate::cpu::element::WideInt {
                negative: false,
                top: 1 << 63,
                shift,
            })
        };
        assert_eq!(cast_value(wide(64), DType::Float32), Ok(wide(64)));
        assert!(cast_value(wide(960), DType::Float64).is_ok()); // 2^1023
        assert_eq!(cast_value(wide(64), DType::Bool), Ok(Bool(true)));
        for dtype in [DType::UInt64, DType::Int8] {
            assert!(matches!(
                cast_value(wide(64), dtype),
                Err(Error::Overflow(_))
            ));
        }
        assert!(matches!(
            cast_value(wide(961), DType::Float64),
            Err(Error::Overflow(_))
        ));
        assert!(check_value_kind(wide(64), DType::Bool, "add").is_err());
    }

    #[test]
    fn full_checks_the_value_kind() {
        assert!(full(&[2], Scalar::Float(1.5), DType::Int32, Device::Cpu).is_err());
        assert!(full(&[2], Scalar::Int(1), DType::Float32, Device::Cpu).is_ok());
        let a = full(&[3], Scalar::Int(-7), DType::Int64, Device::Cpu).unwrap();
        // SAFETY: element 2 of a 3-element int64 array.
        let last = unsafe { read_scalar(DType::Int64, a.data_ptr(), 2) };
        assert_eq!(last, Scalar::Int(-7));
    }
}
