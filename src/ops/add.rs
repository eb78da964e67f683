//! `add(a, b, out)`: validate (dtypes, shapes, devices, `out`), plan (broadcast and coalesce),
//! launch (CPU loop or CUDA kernel). Inputs and `out` are used in place, never copied.

use crate::array::Array;
use crate::cpu::copy::ElementBytes;
use crate::cpu::element::Scalar;
use crate::cpu::{self, SendPtr};
use crate::cuda::kernels::AddPart;
use crate::cuda::stream::Stream;
use crate::cuda::{kernels, stream as cuda_stream, sys};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{shape_str, Error, Result};
use crate::layout::broadcast_shapes;
use crate::ops::elementwise::params::{self, Param};
use crate::ops::launch::Launch;
use crate::ops::plan::{Operand, Plan, Variant};
use std::borrow::Cow;

/// `a + b` with numpy broadcasting and Array API promotion, written into `out` when given (which
/// must have the broadcast shape and the promoted dtype, and may be `a` or `b` itself) or into a
/// new array on the inputs' device. Returns the array written.
///
/// On CUDA the kernel runs on `stream` (DLPack numbering; the legacy default stream when
/// `None`), after the pending work of every operand's recorded stream, and the result records
/// that stream.
pub fn add(a: &Array, b: &Array, out: Option<&Array>, stream: Option<Stream>) -> Result<Array> {
    let dtype = DType::promote(a.dtype(), b.dtype(), "add")?;
    // Equal shapes (the common case) need no broadcast and no new shape.
    let shape: Cow<'_, [usize]> = if a.shape() == b.shape() {
        Cow::Borrowed(a.shape())
    } else {
        Cow::Owned(broadcast_shapes(a.shape(), b.shape())?)
    };
    let device = common_device(&[a, b], out)?;
    let stream = stream.unwrap_or(cuda_stream::LEGACY);
    let launch = match device {
        Device::Cuda(_) => Some(Launch::begin(device, stream)?),
        _ => None,
    };
    let out = match (out, &launch) {
        (Some(out), _) => {
            check_out(out, &shape, dtype, &[a, b])?;
            out.clone()
        }
        (None, Some(launch)) => launch.empty(&shape, dtype)?,
        (None, None) => Array::empty(&shape, dtype, device)?,
    };
    if out.numel() == 0 {
        return Ok(out);
    }
    let (a_b, b_b) = (broadcast(a, &shape)?, broadcast(b, &shape)?);
    if let Some(launch) = launch {
        return add_cuda(launch, &a_b, Param::Element(&b_b), out);
    }
    let operands = [Operand::of(&out), Operand::of(&a_b), Operand::of(&b_b)];
    let plan = Plan::new(&shape, out.numel(), &operands, Some(0), 1, false).coalesced::<3>();
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

/// `a + value`, where `value` (a Python scalar) takes `a`'s dtype as the Array API asks: a
/// float value needs a floating or complex `a`, a complex value a complex `a`. Like [`add`]
/// otherwise. On CUDA the kernel takes the value by value among its parameters, so nothing is
/// allocated or uploaded and the host never waits for the device; on the CPU the value is read
/// from a one-element array.
pub fn add_scalar(
    a: &Array,
    value: Scalar,
    out: Option<&Array>,
    stream: Option<Stream>,
) -> Result<Array> {
    let dtype = a.dtype();
    crate::ops::create::check_value_kind(value, dtype, "add")?;
    let device = common_device(&[a], out)?;
    let Device::Cuda(_) = device else {
        let b = crate::ops::full(&[], value, dtype, Device::Cpu)?;
        return add(a, &b, out, stream);
    };
    let launch = Launch::begin(device, stream.unwrap_or(cuda_stream::LEGACY))?;
    let out = match out {
        Some(out) => {
            check_out(out, a.shape(), dtype, &[a])?;
            out.clone()
        }
        None => launch.empty(a.shape(), dtype)?,
    };
    if out.numel() == 0 {
        return Ok(out);
    }
    let value = ElementBytes::new(out.dtype(), value);
    add_cuda(launch, a, Param::Value(value), out)
}

/// `x` seen with `shape` (borrowed when it has that shape already).
fn broadcast<'a>(x: &'a Array, shape: &[usize]) -> Result<Cow<'a, Array>> {
    Ok(if x.shape() == shape {
        Cow::Borrowed(x)
    } else {
        Cow::Owned(x.broadcast_to(shape)?)
    })
}

/// `a + b` into `out` on `launch`'s device, where `b` is an array of out's shape or one value of
/// out's dtype (add_scalar).
fn add_cuda(launch: Launch, a: &Array, b: Param<'_>, out: Array) -> Result<Array> {
    let ordinal = launch.ordinal();
    let b_array = match b {
        Param::Element(b) => Some(b),
        _ => None,
    };
    let inputs: Vec<&Array> = [Some(a), b_array].into_iter().flatten().collect();
    launch.order(&[&inputs[..], &[&out]].concat())?;
    let n = out.numel();
    // A value has the result's dtype (add_scalar).
    let b_dtype = b_array.map_or(out.dtype(), |b| b.dtype());
    let dtypes = [a.dtype(), b_dtype, out.dtype()];
    // The kernel's operands in its parameter order: a, b (an array, or a value among the
    // parameters, which the loop does not walk), out. The loop is led by out, the last operand
    // it walks (its writes run along its unit stride).
    let second = match b_array {
        Some(_) => kernels::Second::Array,
        None => kernels::Second::Value,
    };
    // a, b, out; or a, out where b is a value.
    let all = [a, b_array.unwrap_or(&out), &out].map(Operand::of);
    let walked = &all[..2 + b_array.is_some() as usize];
    let width = kernels::vector_width(dtypes[0], dtypes[1], dtypes[2]);
    let plan = Plan::new(out.shape(), n, walked, Some(walked.len() - 1), width, true);
    let family = AddKernels {
        ordinal,
        dtypes,
        second,
    };
    let tiles = (a, b_array, b_dtype, &out);
    let kernel = params::choose(&family, &plan, ordinal, width, Some(tiles))?;
    // SAFETY: add's kernels take the parameters of their variant as kernels/abi.cuh lays them
    // out for a, b (a pointer or CbStrided, or for a value the element's bytes, which is
    // the kernel's `Splat` parameter), out (kernels::add_program writes them so), and the
    // chosen one is the plan's variant and index width (Plan::new: the vector kernel only for
    // aligned pointers, the 32-bit kernels only where every index and offset fits, the tiled
    // kernel only where out has unit stride along cols and the tiled inputs along rows, which
    // it assumes, with the shared memory its tiles need). Every pointer addresses its
    // operand's validated layout on this device, `out` is writable and overlaps an input only
    // exactly (checked); the arrays' buffers are kept valid until the kernel has run
    // (Launch::finish below), or, for a kernel captured into a graph, by the caller while it
    // replays the graph (see `Launch`). `order` made the device's context current.
    unsafe {
        params::launch(
            &launch,
            &plan,
            &[Param::Element(a), b, Param::Element(&out)],
            &kernel,
        )?
    };
    launch.finish(&inputs, &[&out])?;
    Ok(out)
}

/// add's kernels for one dtype triple and second input on one device.
struct AddKernels {
    ordinal: u32,
    dtypes: [DType; 3],
    second: kernels::Second,
}

impl params::Family for AddKernels {
    fn flat(&self, variant: Variant, index: kernels::Index) -> Result<sys::CUfunction> {
        let part = match variant {
            Variant::Vector => AddPart::Vector,
            Variant::Contiguous => AddPart::Contiguous,
            _ => AddPart::Strided,
        };
        kernels::add(self.ordinal, self.dtypes, self.second, index, part)
    }

    fn tiled(&self, index: kernels::Index) -> Result<sys::CUfunction> {
        Ok(kernels::add_tiled(self.ordinal, self.dtypes, self.second, index)?.function)
    }
}

/// The device the operation runs on. Host-accessible memory (cpu, pinned, managed) mixes on the
/// CPU; CUDA device memory must all be on one device.
fn common_device(inputs: &[&Array], out: Option<&Array>) -> Result<Device> {
    let devices = inputs
        .iter()
        .map(|x| x.device())
        .chain(out.map(|o| o.device()));
    let first = inputs[0].device();
    if devices.clone().all(|d| d.is_host_accessible()) {
        return Ok(Device::Cpu);
    }
    for d in devices {
        if d != first {
            return Err(Error::DeviceMismatch {
                left: first.to_string(),
                right: d.to_string(),
            });
        }
    }
    Ok(first)
}

/// Whether no element of `a` shares a byte with an element of `b`, decided on the lattice of
/// addresses their strides reach: every element of `a` starts at its first element's address
/// plus a multiple of `g`, the gcd of both arrays' byte strides, and so does every element of
/// `b` from its own; when the two starts differ (modulo `g`) by at least an element of each,
/// no two elements can meet (`x[::2]` and `x[1::2]`). `false` means they may share memory.
fn elements_disjoint(a: &Array, b: &Array) -> bool {
    fn gcd(x: usize, y: usize) -> usize {
        if y == 0 {
            x
        } else {
            gcd(y, x % y)
        }
    }
    let mut g = 0usize;
    for x in [a, b] {
        let item = x.dtype().itemsize();
        for (&d, &s) in x.shape().iter().zip(x.strides()) {
            if d > 1 {
                g = gcd(g, s.unsigned_abs().saturating_mul(item));
            }
        }
    }
    if g == 0 {
        return false; // single elements: the range test already said they meet
    }
    let g = g as i128;
    let d = (b.data_ptr() as usize as i128 - a.data_ptr() as usize as i128).rem_euclid(g);
    d >= a.dtype().itemsize() as i128 && g - d >= b.dtype().itemsize() as i128
}

pub(crate) fn check_out(
    out: &Array,
    shape: &[usize],
    dtype: DType,
    inputs: &[&Array],
) -> Result<()> {
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
    if out.layout().may_overlap_itself() {
        return Err(Error::invalid(
            "out overlaps itself: several results would land on one element (a zero stride, or \
             strides that do not step past each other)",
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
        // Host memory is one address space whether it is labelled cpu, pinned or managed (an
        // np.asarray of a pinned array is the same memory as the array).
        let same_space = input.device() == out.device()
            || (input.device().is_host_accessible() && out.device().is_host_accessible());
        if !overlaps || !same_space || elements_disjoint(input, out) {
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

    /// `[0, 1, ..., n - 1]` on the host.
    fn range(n: i128, dtype: DType) -> Array {
        arange(
            Scalar::Int(0),
            Scalar::Int(n),
            Scalar::Int(1),
            dtype,
            Device::Cpu,
        )
        .unwrap()
    }

    fn values(a: &Array) -> Vec<Scalar> {
        (0..a.numel() as isize)
            // SAFETY: contiguous results; i < numel.
            .map(|i| unsafe { read_scalar(a.dtype(), a.data_ptr(), i) })
            .collect()
    }

    #[test]
    fn broadcast_add_with_promotion() {
        let a = range(6, DType::Int8);
        let a = unsafe_reshape(&a, &[2, 3]);
        let b = full(&[3], Scalar::Int(100), DType::Int32, Device::Cpu).unwrap();
        let r = add(&a, &b, None, None).unwrap();
        assert_eq!(r.dtype(), DType::Int32);
        assert_eq!(r.shape(), &[2, 3]);
        let want: Vec<Scalar> = (100..106).map(Scalar::Int).collect();
        assert_eq!(values(&r), want);
    }

    #[test]
    fn interleaved_views_do_not_overlap() {
        let x = range(8, DType::Float32);
        let even = x.as_strided(&[4], &[2], 0).unwrap();
        let odd = x.as_strided(&[4], &[2], 1).unwrap();
        assert!(elements_disjoint(&even, &odd) && elements_disjoint(&odd, &even));
        let shifted = x.as_strided(&[3], &[2], 2).unwrap();
        assert!(!elements_disjoint(&even, &shifted));
        // Contiguous elements meet the odd ones.
        let all = x.as_strided(&[4], &[1], 0).unwrap();
        assert!(!elements_disjoint(&all, &odd));
        // out = odd elements, inputs = even ones: runs as numpy does.
        add(&even, &even, Some(&odd), None).unwrap();
        let want: Vec<Scalar> = [0, 0, 2, 4, 4, 8, 6, 12]
            .into_iter()
            .map(|v| Scalar::Float(v as f64))
            .collect();
        assert_eq!(values(&x), want);
    }

    #[test]
    fn in_place_is_allowed_and_partial_overlap_is_not() {
        let a = range(4, DType::Float32);
        let one = full(&[], Scalar::Float(1.0), DType::Float32, Device::Cpu).unwrap();
        add(&a, &one, Some(&a), None).unwrap();
        assert_eq!(
            values(&a),
            (1..5).map(|v| Scalar::Float(v as f64)).collect::<Vec<_>>()
        );
        // out = a shifted by one element.
        let a6 = range(6, DType::Float32);
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
