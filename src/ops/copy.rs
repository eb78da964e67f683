//! Copies and casts into a new C-contiguous array.

use crate::array::Array;
use crate::cpu::{copy::copy_cast, SendPtr};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::layout::coalesce;

/// A new C-contiguous array on `device` holding `src`'s values converted to `dtype` (numpy's
/// unsafe-cast rules; see [`crate::cpu::element::Element::from_scalar`]).
pub fn copy(src: &Array, dtype: DType, device: Device) -> Result<Array> {
    if !src.device().is_host_accessible() || !device.is_host_accessible() {
        return Err(crate::cuda::unavailable(device));
    }
    let dst = Array::empty(src.shape(), dtype, device)?;
    let plan = coalesce(src.shape(), [dst.strides(), src.strides()]);
    // SAFETY: `dst` is a fresh allocation of src's shape and `dtype`; `src` is a validated
    // host-accessible array whose layout stays inside its buffer; the two cannot overlap.
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
