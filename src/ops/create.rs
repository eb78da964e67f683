//! Creation functions that need values: `full` and `arange` (`empty` and `zeros` are
//! [`Array`] constructors).

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

/// `[start, start + step, ...)` up to but excluding `stop`, as a 1-d array of `dtype`.
pub fn arange(start: f64, stop: f64, step: f64, dtype: DType, device: Device) -> Result<Array> {
    if step == 0.0 || !step.is_finite() || !start.is_finite() || !stop.is_finite() {
        return Err(Error::invalid(format!(
            "arange needs finite start, stop and a non-zero step, got {start}, {stop}, {step}"
        )));
    }
    let count = ((stop - start) / step).ceil().max(0.0);
    if count > (isize::MAX as f64) {
        // Debug formatting keeps exponents: Display would print 1e-300 as 300 digits.
        return Err(Error::invalid(format!(
            "arange({start:?}, {stop:?}, {step:?}) is too long"
        )));
    }
    let n = count as usize;
    if !device.is_host_accessible() {
        let host = arange(start, stop, step, dtype, Device::Cpu)?;
        return super::copy(&host, dtype, device);
    }
    let out = Array::empty(&[n], dtype, device)?;
    let size = dtype.itemsize();
    for i in 0..n {
        let v = start + i as f64 * step;
        let value = match dtype.kind() {
            Kind::Float | Kind::Complex => Scalar::Float(v),
            _ => Scalar::Int(v as i128),
        };
        // SAFETY: element i of the fresh contiguous allocation of n elements.
        unsafe { fill(dtype, out.data_ptr().add(i * size), 1, value) };
    }
    Ok(out)
}

/// Refuses values that `dtype` cannot hold meaningfully, as the Array API does for Python
/// scalars: a bool takes any dtype, an int any but bool, a float a floating or complex one, a
/// complex a complex one; and, as numpy 2 does, an int outside an integer dtype's range
/// ([`Error::Overflow`]) rather than wrapping it. `op` names the operation in the error.
pub fn check_value_kind(value: Scalar, dtype: DType, op: &'static str) -> Result<()> {
    if let (Scalar::Int(v), Some((lo, hi))) = (value, int_range(dtype)) {
        if v < lo || v > hi {
            return Err(Error::Overflow(format!(
                "Python integer {v} out of bounds for {dtype}"
            )));
        }
    }
    let fits = match (value, dtype.kind()) {
        (Scalar::Bool(_), _) => true,
        (Scalar::Int(_), Kind::Bool) => false,
        (Scalar::Int(_), _) => true,
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
    fn arange_counts_like_numpy() {
        let a = arange(0.0, 5.0, 1.0, DType::Int32, Device::Cpu).unwrap();
        assert_eq!(a.shape(), &[5]);
        let a = arange(1.0, 2.0, 0.3, DType::Float64, Device::Cpu).unwrap();
        assert_eq!(a.shape(), &[4]);
        // SAFETY: element 3 of a 4-element float64 array.
        let last = unsafe { read_scalar(DType::Float64, a.data_ptr(), 3) };
        assert_eq!(last, Scalar::Float(1.0 + 3.0 * 0.3));
        assert_eq!(
            arange(5.0, 0.0, 1.0, DType::Int8, Device::Cpu)
                .unwrap()
                .shape(),
            &[0]
        );
        assert!(arange(0.0, 1.0, 0.0, DType::Int8, Device::Cpu).is_err());
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
