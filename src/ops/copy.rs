//! Copies and casts into a new C-contiguous array, between any devices. On a CUDA device a cast,
//! and the copy of a non-contiguous array, is an instance of the elementwise engine
//! ([`crate::ops::elementwise`]): `y = (B)x`, with `B` the source's own dtype for a copy.

use crate::array::Array;
use crate::cpu::{copy::copy_cast, SendPtr};
use crate::cuda::kernels::{self, Index, Program};
use crate::cuda::stream::Event;
use crate::cuda::{memory, nvrtc, stream};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::coalesce;
use crate::ops::elementwise::source::{self, Role, Signature};
use crate::ops::elementwise::spec::{Rule, Spec};
use crate::ops::elementwise::ElementwiseKernel;
use crate::ops::{plan::Variant, Arg};
use std::sync::OnceLock;

/// A new C-contiguous array on `device` holding `src`'s values converted to `dtype` (numpy's
/// unsafe-cast rules; see [`crate::cpu::element::Element::from_scalar`]). Copies into device
/// memory are queued on the legacy default stream, after the source's pending work, and return
/// without waiting (the result records that stream's pending write; the source is kept alive
/// until the copy has run); copies into host memory are complete on return.
pub fn copy(src: &Array, dtype: DType, device: Device) -> Result<Array> {
    let host_src = src.device().is_host_accessible();
    if host_src {
        if let Some(event) = src.pending()? {
            // Pinned or managed memory may still be written by a kernel.
            event.synchronize()?;
        }
    }
    if host_src && device.is_host_accessible() {
        return host_copy(src, dtype, device);
    }
    if host_src {
        return host_to_device(src, dtype, device);
    }
    // From device memory: a cast, or a copy of a non-contiguous array, runs on its device first.
    if dtype == src.dtype() && src.layout().is_contiguous() {
        return from_device(src, device);
    }
    let inputs = [Arg::Array(src.clone())];
    // SAFETY: the cast's operation reads its one element and writes its one, nothing else.
    let outs = unsafe { cast_kernel(dtype).call(&inputs, &[None], stream::LEGACY, None)? };
    let cast = outs.into_iter().next();
    let converted = cast.ok_or_else(|| Error::invalid("internal: the cast made no result"))?;
    if device == src.device() {
        return Ok(converted);
    }
    from_device(&converted, device)
}

/// The cast into `to` as an elementwise kernel: `y = (to)x` for an input of any dtype, with the
/// conversions of `kernels/common.cuh`.
fn cast_kernel(to: DType) -> &'static ElementwiseKernel {
    static CASTS: [OnceLock<ElementwiseKernel>; DType::ALL.len()] =
        [const { OnceLock::new() }; DType::ALL.len()];
    CASTS[to as usize].get_or_init(|| {
        let operation = format!("y = Cvt<{}, A>::run(x)", kernels::c_type(to));
        let spec = Spec::new("A x", &format!("{to} y"), &operation, "cast", "");
        // A fixed declaration, which the tests parse.
        let spec = spec.expect("a cast's declaration parses");
        ElementwiseKernel::new(spec.built_in(Rule::Exact, super::add::HEADER, &[nvrtc::MINIMAL]))
    })
}

/// The cast's programs from `from` into `to` in each of `variants`, in the `index` width.
fn programs(from: DType, to: DType, variants: &[Variant], index: Index) -> Vec<Program> {
    let sig = Signature {
        dtypes: vec![from, to],
        roles: vec![Role::Element; 2],
    };
    let program = |&v: &Variant| source::program(cast_kernel(to).spec(), &sig, &[false], v, index);
    variants.iter().filter_map(program).collect()
}

/// The casts' programs that ship (see [`crate::ops::shipped_programs`]), with 32-bit
/// indices: every dtype into itself in the strided and tiled variants (copies of
/// non-contiguous arrays), and float32 into and out of float16 and bfloat16 in every variant.
pub(crate) fn shipped_programs() -> Vec<Program> {
    let (f32, f16, bf16) = (DType::Float32, DType::Float16, DType::BFloat16);
    let strided = [Variant::Strided, Variant::Tiled { mask: 0 }];
    let same = DType::ALL.map(|d| programs(d, d, &strided, Index::I32));
    let halves = [(f32, f16), (f16, f32), (f32, bf16), (bf16, f32)];
    let halves = halves.map(|(a, b)| programs(a, b, &super::add::ALL, Index::I32));
    same.into_iter().chain(halves).flatten().collect()
}

/// Host memory to a CUDA device: a contiguous host array of the target dtype (`src` itself
/// where it is one), then one copy on the legacy default stream.
fn host_to_device(src: &Array, dtype: DType, device: Device) -> Result<Array> {
    let staged = if src.layout().is_contiguous() && src.dtype() == dtype {
        src.clone()
    } else {
        host_copy(src, dtype, Device::Cpu)?
    };
    let n = cuda_ordinal(device)?;
    let dst = Array::empty(src.shape(), dtype, device)?;
    // SAFETY: both are contiguous with the same byte size; dst is a fresh allocation for the
    // legacy default stream; the staged memory is kept alive until the copy has run.
    unsafe {
        memory::copy_async(
            dst.data_ptr(),
            staged.data_ptr(),
            dst.nbytes(),
            n,
            stream::LEGACY,
        )?
    };
    Array::keep_until_run([&staged], stream::LEGACY, None, n);
    Ok(dst)
}

/// `src`, contiguous on a CUDA device, into a new array of its dtype on `device`: queued on the
/// legacy default stream after the source's pending work, on the same device or another (see
/// [`peer_copy`]), complete on return in host memory.
fn from_device(src: &Array, device: Device) -> Result<Array> {
    let n = cuda_ordinal(src.device())?;
    match device {
        Device::Cuda(m) if m != n => return peer_copy(src, n, m),
        _ => {}
    }
    src.order_before(stream::LEGACY)?;
    let dst = Array::empty(src.shape(), src.dtype(), device)?;
    let queued = device == Device::Cuda(n);
    let copy = if queued {
        memory::copy_async
    } else {
        memory::copy_sync
    };
    // SAFETY: same shape and dtype, both contiguous; dst is fresh (on this device, allocated
    // for the legacy default stream). A queued copy keeps the source alive until it has run;
    // any other is complete on return, while both are alive.
    unsafe {
        copy(
            dst.data_ptr(),
            src.data_ptr(),
            dst.nbytes(),
            n,
            stream::LEGACY,
        )?
    };
    if queued {
        Array::keep_until_run([src], stream::LEGACY, None, n);
    }
    Ok(dst)
}

/// `src`, contiguous on device `n`, into a new array on device `m`: one copy device to device
/// on `n`'s legacy default stream, after the source's pending work and the new memory's
/// allocation (on `m`'s legacy default stream, made to wait with an event), which `m`'s legacy
/// default stream then waits for in turn. The host never waits.
fn peer_copy(src: &Array, n: u32, m: u32) -> Result<Array> {
    src.order_before(stream::LEGACY)?;
    let dst = Array::empty(src.shape(), src.dtype(), Device::Cuda(m))?;
    if let Some(allocated) = dst.pending()? {
        allocated.wait_on(stream::LEGACY, n)?;
    }
    // SAFETY: same shape and dtype, both contiguous, on two devices; dst's allocation is ordered
    // before the copy's stream (above); the source is kept alive until the copy has run.
    unsafe {
        memory::copy_peer_async(
            (dst.data_ptr(), m),
            (src.data_ptr(), n),
            dst.nbytes(),
            stream::LEGACY,
        )?
    };
    Array::keep_until_run([src], stream::LEGACY, None, n);
    Event::record(stream::LEGACY, n)?.wait_on(stream::LEGACY, m)?;
    // Readers of dst follow `m`'s legacy default stream, which now follows the copy.
    Ok(dst.with_legacy_write())
}

fn host_copy(src: &Array, dtype: DType, device: Device) -> Result<Array> {
    let dst = Array::empty(src.shape(), dtype, device)?;
    let plan = coalesce(src.shape(), [dst.strides(), src.strides()]);
    // SAFETY: `dst` is a fresh host-accessible allocation of src's shape and `dtype`; `src` is a
    // validated host-accessible array whose layout stays inside its buffer; they cannot overlap.
    unsafe {
        copy_cast(
            src.dtype(),
            dtype,
            SendPtr(dst.data_ptr()),
            SendPtr(src.data_ptr()),
            &plan,
        )
    };
    Ok(dst)
}

/// The ordinal of a CUDA device; host devices are an internal error reported, not a panic.
fn cuda_ordinal(device: Device) -> Result<u32> {
    match device {
        Device::Cuda(n) => Ok(n),
        other => Err(Error::invalid(format!(
            "internal: expected CUDA device memory, got {other}"
        ))),
    }
}

/// Every conversion between two dtypes, in one program for `ops::add`'s compile test.
#[cfg(test)]
pub(crate) fn every_conversion() -> Program {
    let t = DType::ALL.map(kernels::c_type);
    let mut body = String::new();
    // Each into a slot of its own: no store is dropped, so every conversion is compiled.
    let pairs = t.iter().flat_map(|a| t.iter().map(move |b| (a, b)));
    for (k, (a, b)) in pairs.enumerate() {
        body += &format!("*({b}*)p[{k}] = Cvt<{b}, {a}>::run(*({a}*)p[225]);\n");
    }
    let (abi, header) = (kernels::ABI, super::add::HEADER);
    let source = format!(
        "#define CB_FLOAT16\n#include <cuda_fp16.h>\n#define CB_BFLOAT16\n#include <cuda_bf16.h>\n\
         {abi}{header}extern \"C\" __global__ void every_cast(void** p) {{\n{body}}}\n"
    );
    Program {
        name: "every_conversion".into(),
        source,
        options: vec![nvrtc::MINIMAL.into()],
        functions: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::elementwise::spec::{reads_output, uses_index};

    #[test]
    fn every_cast_only_assigns_its_output() {
        // Stored without being loaded, in any order (its loop may take tiles).
        for to in DType::ALL {
            let op = &cast_kernel(to).spec().operation;
            assert!(!reads_output(op, "y") && !uses_index(op), "{to}");
        }
    }
}
