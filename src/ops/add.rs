//! `add(a, b, out)`: validate (dtypes, shapes, devices, `out`), plan (broadcast and coalesce),
//! launch (CPU loop or CUDA kernel). Inputs and `out` are used in place, never copied.

use crate::array::Array;
use crate::cpu::{self, SendPtr};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{shape_str, Error, Result};
use crate::layout::{broadcast_shapes, coalesce};

/// `a + b` with numpy broadcasting and Array API promotion, written into `out` when given (which
/// must have the broadcast shape and the promoted dtype, and may be `a` or `b` itself) or into a
/// new array on the inputs' device. Returns the array written.
pub fn add(a: &Array, b: &Array, out: Option<&Array>) -> Result<Array> {
    let dtype = DType::promote(a.dtype(), b.dtype(), "add")?;
    let shape = broadcast_shapes(a.shape(), b.shape())?;
    let device = common_device(a, b, out)?;
    let out = match out {
        Some(out) => {
            check_out(out, &shape, dtype, [a, b])?;
            out.clone()
        }
        None => Array::empty(&shape, dtype, device)?,
    };
    if out.numel() == 0 {
        return Ok(out);
    }
    let (a_b, b_b) = (a.broadcast_to(&shape)?, b.broadcast_to(&shape)?);
    if !device.is_host_accessible() {
        return Err(crate::cuda::unavailable(device));
    }
    let plan = coalesce(&shape, [out.strides(), a_b.strides(), b_b.strides()]);
    // SAFETY: all three arrays are host-accessible and their layouts were validated against
    // their buffers when they were made; `out` is writable (checked) and overlaps an input only
    // exactly (checked); dtypes are the promoted triple.
    unsafe {
        cpu::add::add(
            [a.dtype(), b.dtype(), dtype],
            SendPtr(out.data_ptr()),
            SendPtr(a_b.data_ptr()),
            SendPtr(b_b.data_ptr()),
            &plan,
        )?
    };
    Ok(out)
}

/// The device the operation runs on. Host-accessible memory (cpu, pinned, managed) mixes on the
/// CPU; CUDA device memory must all be on one device.
fn common_device(a: &Array, b: &Array, out: Option<&Array>) -> Result<Device> {
    let mut devices = vec![a.device(), b.device()];
    devices.extend(out.map(|o| o.device()));
    let first = devices[0];
    let all_host = devices.iter().all(|d| d.is_host_accessible());
    if all_host {
        return Ok(Device::Cpu);
    }
    for &d in &devices[1..] {
        if d != first {
            return Err(Error::DeviceMismatch {
                left: first.to_string(),
                right: d.to_string(),
            });
        }
    }
    Ok(first)
}

fn check_out(out: &Array, shape: &[usize], dtype: DType, inputs: [&Array; 2]) -> Result<()> {
    if out.shape() != shape {
        return Err(Error::invalid(format!(
            "out has shape {} but the result has shape {}",
            shape_str(out.shape()),
            shape_str(shape)
        )));
    }
    if out.dtype() != dtype {
        return Err(Error::invalid(format!(
            "out has dtype {} but the result has dtype {dtype}",
            out.dtype()
        )));
    }
    if out.readonly() {
        return Err(Error::ReadOnly(
            "out is read-only: its producer does not allow writes".into(),
        ));
    }
    if out.layout().has_zero_stride_overlap() {
        return Err(Error::invalid(
            "out has a zero stride, so several results would land on one element",
        ));
    }
    let Some((o_start, o_end)) = out.address_range() else {
        return Ok(());
    };
    for input in inputs {
        let Some((i_start, i_end)) = input.address_range() else {
            continue;
        };
        let overlaps = i_start < o_end && o_start < i_end;
        if !overlaps || input.device() != out.device() {
            continue;
        }
        let exact = input.dtype() == out.dtype()
            && input.data_ptr() == out.data_ptr()
            && input
                .broadcast_to(shape)
                .is_ok_and(|b| b.strides() == out.strides());
        if !exact {
            return Err(Error::invalid(
                "out partially overlaps an input; only out identical to an input is allowed",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::copy::read_scalar;
    use crate::cpu::element::Scalar;
    use crate::ops::{arange, full};

    fn values(a: &Array) -> Vec<Scalar> {
        (0..a.numel() as isize)
            // SAFETY: contiguous results; i < numel.
            .map(|i| unsafe { read_scalar(a.dtype(), a.data_ptr(), i) })
            .collect()
    }

    #[test]
    fn broadcast_add_with_promotion() {
        let a = arange(0.0, 6.0, 1.0, DType::Int8, Device::Cpu).unwrap();
        let a = unsafe_reshape(&a, &[2, 3]);
        let b = full(&[3], Scalar::Int(100), DType::Int32, Device::Cpu).unwrap();
        let r = add(&a, &b, None).unwrap();
        assert_eq!(r.dtype(), DType::Int32);
        assert_eq!(r.shape(), &[2, 3]);
        let want: Vec<Scalar> = (100..106).map(Scalar::Int).collect();
        assert_eq!(values(&r), want);
    }

    #[test]
    fn in_place_is_allowed_and_partial_overlap_is_not() {
        let a = arange(0.0, 4.0, 1.0, DType::Float32, Device::Cpu).unwrap();
        let one = full(&[], Scalar::Float(1.0), DType::Float32, Device::Cpu).unwrap();
        add(&a, &one, Some(&a)).unwrap();
        assert_eq!(
            values(&a),
            (1..5).map(|v| Scalar::Float(v as f64)).collect::<Vec<_>>()
        );
        // out = a shifted by one element.
        let a6 = arange(0.0, 6.0, 1.0, DType::Float32, Device::Cpu).unwrap();
        let shifted = crate::layout::Layout::new(vec![4], vec![1], 4).unwrap();
        // SAFETY: elements 1..5 of a 6-element buffer.
        let view = unsafe {
            Array::from_parts(
                a6.buffer().clone(),
                shifted,
                DType::Float32,
                Device::Cpu,
                false,
            )
        };
        let first4 = crate::layout::Layout::new(vec![4], vec![1], 0).unwrap();
        // SAFETY: elements 0..4 of the same buffer.
        let head = unsafe {
            Array::from_parts(
                a6.buffer().clone(),
                first4,
                DType::Float32,
                Device::Cpu,
                false,
            )
        };
        assert!(add(&head, &one, Some(&view)).is_err());
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let f = Array::zeros(&[3], DType::Float32, Device::Cpu).unwrap();
        let i = Array::zeros(&[3], DType::Int32, Device::Cpu).unwrap();
        let e = add(&f, &i, None).unwrap_err().to_string();
        assert!(e.contains("float32") && e.contains("int32"), "{e}");
        let g = Array::zeros(&[4], DType::Float32, Device::Cpu).unwrap();
        assert!(matches!(add(&f, &g, None), Err(Error::Broadcast { .. })));
        assert!(add(&f, &f, Some(&g))
            .unwrap_err()
            .to_string()
            .contains("shape"));
        let ro = f.with_readonly(true);
        assert!(matches!(add(&f, &f, Some(&ro)), Err(Error::ReadOnly(_))));
    }

    fn unsafe_reshape(a: &Array, shape: &[usize]) -> Array {
        let l = crate::layout::Layout::contiguous(shape).unwrap();
        assert_eq!(l.numel(), a.numel());
        // SAFETY: same element count over a contiguous buffer.
        unsafe { Array::from_parts(a.buffer().clone(), l, a.dtype(), a.device(), false) }
    }
}
