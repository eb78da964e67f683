//! DLPack export: the one place that builds managed tensors from arrays. Each export is a fresh
//! managed tensor whose context holds a reference to the array's buffer, so the memory lives
//! until both the array and every consumer let go; the deleter (dlpark's, dropping that
//! reference) runs on any thread and never panics.

use crate::array::Array;
use crate::error::{Error, Result};
use dlpark::metadata::Dynamic;
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};

/// A managed tensor (legacy or versioned ABI, per `M`) describing `array`. `copied` marks an
/// export that the consumer owns alone (DLPack's IS_COPIED flag).
pub fn to_managed<M: ManagedTensorBase>(array: &Array, copied: bool) -> Result<Managed<M>> {
    let shape: Vec<i64> = array.shape().iter().map(|&d| d as i64).collect();
    let strides: Vec<i64> = array.strides().iter().map(|&s| s as i64).collect();
    let mut tensor = Dynamic::new(shape, strides)
        .initialize_as::<M>(array.buffer().clone())
        .map_err(|e| Error::Export(format!("cannot describe the array for DLPack: {e}")))?;
    // The data pointer addresses the first element and byte_offset is 0, as the major producers
    // do: some consumers ignore byte_offset.
    tensor
        .set_data(array.data_ptr().cast())
        .set_byte_offset(0)
        .set_device(array.device().to_dlpack())
        .set_dtype(array.dtype().to_dlpack());
    let mut flags = DlpackFlags::empty();
    if array.readonly() {
        flags |= DlpackFlags::READ_ONLY;
    }
    if copied {
        flags |= DlpackFlags::IS_COPIED;
    }
    // SAFETY: IS_COPIED is only set by callers that exported a fresh copy nobody else holds;
    // READ_ONLY mirrors the array's own flag. (The legacy ABI ignores flags.)
    unsafe { tensor.set_flags_unchecked(flags) };
    // SAFETY: the descriptor is complete: shape and strides were copied into the managed
    // allocation; the data pointer stays valid while the context (an Arc of the buffer) lives;
    // dtype and device describe the memory; flags are accurate.
    Ok(unsafe { tensor.finish() })
}

/// How `__dlpack__` serves a request for `target` from memory on `own`, given `copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The array's own memory, as it is labelled.
    Own,
    /// The array's own memory labelled as CPU memory: pinned and managed memory that a CPU
    /// consumer asked for is host memory it can read in place (the Array API allows it).
    Host,
    /// A copy on `target`.
    Copy,
}

/// The [`Route`] of an export of memory on `own` to `target`: the memory itself where the
/// consumer can read it and no copy is asked for (`copy=True`), else a copy, which
/// `copy=False` refuses.
pub fn route(own: crate::Device, target: crate::Device, copy: Option<bool>) -> Result<Route> {
    use crate::Device::{Cpu, CudaHost, CudaManaged};
    let route = match (own, target) {
        _ if copy == Some(true) => Route::Copy,
        _ if own == target => Route::Own,
        (CudaHost | CudaManaged, Cpu) => Route::Host,
        _ => Route::Copy,
    };
    if route == Route::Copy && copy == Some(false) {
        return Err(Error::Export(format!(
            "copy=False but the array is on {own} and {target} was requested"
        )));
    }
    Ok(route)
}

/// The flags an export of `array` carries without copying.
pub fn zero_copy_flags(array: &Array) -> DlpackFlags {
    if array.readonly() {
        DlpackFlags::READ_ONLY
    } else {
        DlpackFlags::empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::dtype::DType;
    use dlpark::ffi::{DLManagedTensor, DLManagedTensorVersioned};
    use std::sync::Arc;

    #[test]
    fn routes_serve_host_memory_in_place_to_the_cpu() {
        use Device::{Cpu, Cuda, CudaHost, CudaManaged};
        for copy in [None, Some(false)] {
            assert_eq!(route(Cpu, Cpu, copy).unwrap(), Route::Own);
            assert_eq!(route(Cuda(0), Cuda(0), copy).unwrap(), Route::Own);
            assert_eq!(route(CudaHost, CudaHost, copy).unwrap(), Route::Own);
            assert_eq!(route(CudaHost, Cpu, copy).unwrap(), Route::Host);
            assert_eq!(route(CudaManaged, Cpu, copy).unwrap(), Route::Host);
        }
        for (own, target) in [
            (Cuda(0), Cpu),
            (Cpu, Cuda(0)),
            (Cuda(0), Cuda(1)),
            (Cpu, CudaHost),
        ] {
            assert_eq!(route(own, target, None).unwrap(), Route::Copy);
            assert!(matches!(
                route(own, target, Some(false)),
                Err(Error::Export(_))
            ));
        }
        for (own, target) in [(CudaHost, Cpu), (CudaManaged, Cpu), (Cpu, Cpu)] {
            assert_eq!(route(own, target, Some(true)).unwrap(), Route::Copy);
        }
    }

    #[test]
    fn export_keeps_the_buffer_alive_and_describes_it() {
        let a = Array::zeros(&[2, 3], DType::Float16, Device::Cpu).unwrap();
        let m = to_managed::<DLManagedTensorVersioned>(&a, false).unwrap();
        assert_eq!(Arc::strong_count(a.buffer()), 2);
        let t = m.validate_export().unwrap();
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.strides().unwrap(), &[3, 1]);
        assert_eq!(t.data_ptr() as usize, a.data_ptr() as usize);
        assert_eq!(t.dtype(), DType::Float16.to_dlpack());
        let buffer = a.buffer().clone();
        drop(a);
        assert_eq!(Arc::strong_count(&buffer), 2);
        drop(m);
        assert_eq!(Arc::strong_count(&buffer), 1);
    }

    #[test]
    fn legacy_and_zero_d() {
        let a = Array::zeros(&[], DType::Int64, Device::Cpu).unwrap();
        let m = to_managed::<DLManagedTensor>(&a, false).unwrap();
        assert_eq!(m.validate_export().unwrap().ndim(), 0);
    }

    #[test]
    fn flags() {
        let a = Array::zeros(&[1], DType::Int8, Device::Cpu).unwrap();
        let m = to_managed::<DLManagedTensorVersioned>(&a.with_readonly(true), true).unwrap();
        assert!(m
            .flags()
            .contains(DlpackFlags::READ_ONLY | DlpackFlags::IS_COPIED));
        assert_eq!(zero_copy_flags(&a), DlpackFlags::empty());
    }
}
