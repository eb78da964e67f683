//! Copies and casts into a new C-contiguous array, between any devices.

use crate::array::Array;
use crate::cpu::{copy::copy_cast, SendPtr};
use crate::cuda::launch::Params;
use crate::cuda::{self, kernels, launch, memory, stream};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::layout::coalesce;
use crate::ops::elementwise::params::{Shape, Strided};

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
    // From device memory: make it contiguous on its device first.
    let n = cuda_ordinal(src.device())?;
    // Copies and gathers run on the legacy default stream, after the source's pending work.
    src.order_before(stream::LEGACY)?;
    let contiguous = if src.layout().is_contiguous() {
        src.clone()
    } else {
        gather(src)?
    };
    if dtype == src.dtype() {
        return from_device(src, &contiguous, device, n);
    }
    // A cast of device data goes through the host.
    let host = copy(&contiguous, contiguous.dtype(), Device::Cpu)?;
    copy(&host, dtype, device)
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

/// `contiguous` (`src`, or its gather, on CUDA device `n`) into a new array of its dtype on
/// `device`: queued on the same device, complete on return elsewhere.
fn from_device(src: &Array, contiguous: &Array, device: Device, n: u32) -> Result<Array> {
    let dst = Array::empty(src.shape(), src.dtype(), device)?;
    if device == Device::Cuda(n) {
        // SAFETY: same shape and dtype, both contiguous on this device; dst is fresh and
        // allocated for the legacy default stream; the source is kept alive until the copy has
        // run.
        unsafe {
            memory::copy_async(
                dst.data_ptr(),
                contiguous.data_ptr(),
                dst.nbytes(),
                n,
                stream::LEGACY,
            )?
        };
        Array::keep_until_run([src, contiguous], stream::LEGACY, None, n);
        return Ok(dst);
    }
    if let Device::Cuda(m) = device {
        // Another device's stream copies into it: the allocation must have happened.
        stream::synchronize(stream::LEGACY, m)?;
    }
    // SAFETY: same shape and dtype, both contiguous; dst is fresh; the copy is complete on
    // return, while both are alive.
    unsafe {
        memory::copy_sync(
            dst.data_ptr(),
            contiguous.data_ptr(),
            dst.nbytes(),
            n,
            stream::LEGACY,
        )?
    };
    Ok(dst)
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

/// A contiguous copy of a strided device array on the same device, queued on the legacy
/// default stream (which the caller has ordered after the source's pending work; the caller
/// keeps the source alive until the gather has run).
fn gather(src: &Array) -> Result<Array> {
    let n = cuda_ordinal(src.device())?;
    let dst = Array::empty(src.shape(), src.dtype(), src.device())?;
    let count = src.numel();
    if count == 0 {
        return Ok(dst);
    }
    let plan = coalesce(src.shape(), [dst.strides(), src.strides()]);
    let function = kernels::gather(n, src.dtype())?;
    let mut params = Params::with_capacity(4, 2 * size_of::<Shape>());
    params.push(Strided::new(src.data_ptr(), &plan.strides[1]));
    params.push(dst.data_ptr());
    params.push(count as i64);
    params.push(Shape::new(&plan.shape)?);
    cuda::context::bind(n)?;
    // SAFETY: cb_gather(CbStrided<T> s, T* o, long long n, CbShape g) matches the params (the
    // structs as kernels/abi.cuh has them); `o` holds `count` elements, `s`'s layout stays in
    // its buffer; both live until the gather has run (dst's free is ordered after the legacy
    // default stream's work; the caller keeps src).
    unsafe {
        launch::launch(
            function,
            (
                kernels::grid(n, count.div_ceil(launch::BLOCK as usize), launch::BLOCK)?,
                1,
                1,
            ),
            (launch::BLOCK, 1, 1),
            0,
            stream::LEGACY.handle(),
            params.pointers(),
        )?
    };
    Ok(dst)
}

/// The ordinal of a CUDA device; host devices are an internal error reported, not a panic.
fn cuda_ordinal(device: Device) -> Result<u32> {
    match device {
        Device::Cuda(n) => Ok(n),
        other => Err(crate::Error::invalid(format!(
            "internal: expected CUDA device memory, got {other}"
        ))),
    }
}
