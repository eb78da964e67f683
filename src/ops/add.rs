//! `add(a, b, out)`: validate (dtypes, shapes, devices, `out`), plan (broadcast and coalesce),
//! launch (CPU loop or CUDA kernel). Inputs and `out` are used in place, never copied.

use crate::array::Array;
use crate::cpu::{self, SendPtr};
use crate::cuda::{kernels, launch, stream as cuda_stream};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{shape_str, Error, Result};
use crate::layout::{broadcast_shapes, coalesce};
use std::ffi::c_void;

/// `a + b` with numpy broadcasting and Array API promotion, written into `out` when given (which
/// must have the broadcast shape and the promoted dtype, and may be `a` or `b` itself) or into a
/// new array on the inputs' device. Returns the array written.
///
/// On CUDA the kernel runs on `stream` (DLPack numbering; the legacy default stream when
/// `None`), after the pending work of every operand's recorded stream, and the result records
/// that stream.
pub fn add(a: &Array, b: &Array, out: Option<&Array>, stream: Option<usize>) -> Result<Array> {
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
    if let Device::Cuda(n) = device {
        let stream = stream.unwrap_or(cuda_stream::LEGACY);
        return add_cuda(n, stream, [a_b, b_b], out);
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

fn add_cuda(ordinal: u32, stream: usize, inputs: [Array; 2], out: Array) -> Result<Array> {
    let [a, b] = inputs;
    for operand in [&a, &b, &out] {
        operand.order_before(stream)?;
    }
    let shape = out.shape().to_vec();
    let plan = coalesce(&shape, [out.strides(), a.strides(), b.strides()]);
    let contiguous = plan.shape.len() == 1 && plan.strides.iter().all(|s| s[0] == 1);
    let (f_contiguous, f_strided) = kernels::add(ordinal, a.dtype(), b.dtype(), out.dtype())?;
    let n = out.numel();
    let mut geometry = kernels::Geometry::from_plan(&plan)?;
    let (mut o, mut pa, mut pb, mut len) = (out.data_ptr(), a.data_ptr(), b.data_ptr(), n as i64);
    let mut params: Vec<*mut c_void> = vec![
        (&mut o as *mut *mut u8).cast(),
        (&mut pa as *mut *mut u8).cast(),
        (&mut pb as *mut *mut u8).cast(),
        (&mut len as *mut i64).cast(),
    ];
    if !contiguous {
        params.push((&mut geometry as *mut kernels::Geometry).cast());
    }
    crate::cuda::context::bind(ordinal)?;
    // SAFETY: the parameters match cb_add_contiguous(R*, const A*, const B*, long long) and
    // cb_add_strided(..., Geometry) for the dtypes the kernels were built for; every pointer
    // addresses its operand's validated layout on this device, `out` is writable and overlaps an
    // input only exactly (checked); the arrays' buffers outlive the kernel because all three buffers are kept alive until the kernel
    // has run (keep_alive_until_done below).
    unsafe {
        launch::launch(
            if contiguous { f_contiguous } else { f_strided },
            kernels::grid(ordinal, n)?,
            cuda_stream::handle(stream),
            &mut params,
        )?
    };
    cuda_stream::keep_alive_until_done(
        stream,
        ordinal,
        vec![a.buffer().clone(), b.buffer().clone(), out.buffer().clone()],
    )?;
    Ok(out.with_pending(stream, cuda_stream::Event::record(stream, ordinal)?))
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
        let r = add(&a, &b, None, None).unwrap();
        assert_eq!(r.dtype(), DType::Int32);
        assert_eq!(r.shape(), &[2, 3]);
        let want: Vec<Scalar> = (100..106).map(Scalar::Int).collect();
        assert_eq!(values(&r), want);
    }

    #[test]
    fn in_place_is_allowed_and_partial_overlap_is_not() {
        let a = arange(0.0, 4.0, 1.0, DType::Float32, Device::Cpu).unwrap();
        let one = full(&[], Scalar::Float(1.0), DType::Float32, Device::Cpu).unwrap();
        add(&a, &one, Some(&a), None).unwrap();
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
        assert!(add(&head, &one, Some(&view), None).is_err());
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let f = Array::zeros(&[3], DType::Float32, Device::Cpu).unwrap();
        let i = Array::zeros(&[3], DType::Int32, Device::Cpu).unwrap();
        let e = add(&f, &i, None, None).unwrap_err().to_string();
        assert!(e.contains("float32") && e.contains("int32"), "{e}");
        let g = Array::zeros(&[4], DType::Float32, Device::Cpu).unwrap();
        assert!(matches!(
            add(&f, &g, None, None),
            Err(Error::Broadcast { .. })
        ));
        assert!(add(&f, &f, Some(&g), None)
            .unwrap_err()
            .to_string()
            .contains("shape"));
        let ro = f.with_readonly(true);
        assert!(matches!(
            add(&f, &f, Some(&ro), None),
            Err(Error::ReadOnly(_))
        ));
    }

    fn unsafe_reshape(a: &Array, shape: &[usize]) -> Array {
        let l = crate::layout::Layout::contiguous(shape).unwrap();
        assert_eq!(l.numel(), a.numel());
        // SAFETY: same element count over a contiguous buffer.
        unsafe { Array::from_parts(a.buffer().clone(), l, a.dtype(), a.device(), false) }
    }
}
