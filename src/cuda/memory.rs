//! CUDA allocations (device, pinned host, managed), copies, and pointer queries. Every
//! allocation is freed exactly once, by its `Drop`, from whatever thread drops it; failures
//! while freeing (a driver already torn down at exit) are ignored rather than panicking.

use super::{check, context};
use crate::device::Device;
use crate::error::{Error, Result};
use cudarc::driver::{result, sys};
use std::ffi::c_void;

/// Device memory on one CUDA device.
pub struct DeviceAlloc {
    ptr: sys::CUdeviceptr,
    ordinal: u32,
}

/// Page-locked host memory.
pub struct PinnedAlloc {
    ptr: *mut c_void,
}

/// Managed (unified) memory.
pub struct ManagedAlloc {
    ptr: sys::CUdeviceptr,
}

// SAFETY: the allocations are plain addresses owned uniquely; freeing binds the right context
// on whichever thread does it.
unsafe impl Send for DeviceAlloc {}
// SAFETY: as above; shared references only read the address.
unsafe impl Sync for DeviceAlloc {}
// SAFETY: as above.
unsafe impl Send for PinnedAlloc {}
// SAFETY: as above.
unsafe impl Sync for PinnedAlloc {}
// SAFETY: as above.
unsafe impl Send for ManagedAlloc {}
// SAFETY: as above.
unsafe impl Sync for ManagedAlloc {}

fn oom(bytes: usize, device: Device) -> impl Fn(Error) -> Error {
    move |e| match e {
        Error::OutOfMemory { .. } => Error::OutOfMemory {
            bytes,
            device: device.to_string(),
        },
        other => other,
    }
}

impl DeviceAlloc {
    /// Allocates `bytes` on device `ordinal`, zeroed if asked.
    pub fn new(bytes: usize, ordinal: u32, zeroed: bool) -> Result<DeviceAlloc> {
        context::bind(ordinal)?;
        if bytes == 0 {
            return Ok(DeviceAlloc { ptr: 0, ordinal });
        }
        let device = Device::Cuda(ordinal);
        // SAFETY: a context is current; the result is checked.
        let ptr = check(
            unsafe { result::malloc_sync(bytes) },
            "allocating device memory",
        )
        .map_err(oom(bytes, device))?;
        let alloc = DeviceAlloc { ptr, ordinal };
        if zeroed {
            // SAFETY: `ptr` addresses `bytes` freshly allocated bytes.
            let zeroing = unsafe { result::memset_d8_sync(ptr, 0, bytes) };
            check(zeroing, "zeroing device memory")?;
        }
        Ok(alloc)
    }

    /// The device address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // Freeing must not leave this thread on another device than it was.
        let _restore = context::Restore::new();
        if self.ptr != 0 && context::bind(self.ordinal).is_ok() {
            // SAFETY: allocated by cuMemAlloc in this context, freed only here. cuMemFree waits
            // for work that may still use the memory.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

impl PinnedAlloc {
    /// Allocates `bytes` of page-locked host memory, zeroed if asked.
    pub fn new(bytes: usize, zeroed: bool) -> Result<PinnedAlloc> {
        context::bind(0)?;
        if bytes == 0 {
            return Ok(PinnedAlloc {
                ptr: crate::storage::HOST_ALIGN as *mut c_void,
            });
        }
        // SAFETY: a context is current; flags 0 is plain pinned memory.
        let ptr = check(
            unsafe { result::malloc_host(bytes, 0) },
            "allocating pinned memory",
        )
        .map_err(oom(bytes, Device::CudaHost))?;
        if zeroed {
            // SAFETY: `ptr` addresses `bytes` writable host bytes.
            unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, bytes) };
        }
        Ok(PinnedAlloc { ptr })
    }

    /// The host address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }
}

impl Drop for PinnedAlloc {
    fn drop(&mut self) {
        // Freeing must not leave this thread on another device than it was.
        let _restore = context::Restore::new();
        if self.ptr as usize != crate::storage::HOST_ALIGN && context::bind(0).is_ok() {
            // SAFETY: allocated by cuMemHostAlloc, freed only here.
            let _ = unsafe { result::free_host(self.ptr) };
        }
    }
}

impl ManagedAlloc {
    /// Allocates `bytes` of managed memory, zeroed if asked.
    pub fn new(bytes: usize, zeroed: bool) -> Result<ManagedAlloc> {
        context::bind(0)?;
        if bytes == 0 {
            return Ok(ManagedAlloc { ptr: 0 });
        }
        // SAFETY: a context is current; global attachment makes it usable from any stream.
        let ptr = check(
            unsafe { result::malloc_managed(bytes, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL) },
            "allocating managed memory",
        )
        .map_err(oom(bytes, Device::CudaManaged))?;
        if zeroed {
            // SAFETY: managed memory is host-accessible; nothing else uses it yet.
            unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, bytes) };
        }
        Ok(ManagedAlloc { ptr })
    }

    /// The (unified) address.
    pub fn as_ptr(&self) -> *mut u8 {
        if self.ptr == 0 {
            crate::storage::HOST_ALIGN as *mut u8
        } else {
            self.ptr as *mut u8
        }
    }
}

impl Drop for ManagedAlloc {
    fn drop(&mut self) {
        // Freeing must not leave this thread on another device than it was.
        let _restore = context::Restore::new();
        if self.ptr != 0 && context::bind(0).is_ok() {
            // SAFETY: allocated by cuMemAllocManaged, freed only here.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Copies `bytes` from `src` to `dst` (any mix of host and device addresses, by unified
/// addressing) on `stream`, then waits for that stream, so the copy is ordered after the work
/// already queued there and complete on return.
///
/// # Safety
/// Both ranges are valid for `bytes` and do not overlap.
pub unsafe fn copy_sync(
    dst: *mut u8,
    src: *const u8,
    bytes: usize,
    ordinal: u32,
    stream: sys::CUstream,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    context::bind(ordinal)?;
    // SAFETY: the caller's contract; a context is current.
    unsafe {
        check(
            sys::cuMemcpyAsync(dst as u64, src as u64, bytes, stream).result(),
            "copying memory",
        )?;
        check(result::stream::synchronize(stream), "waiting for a copy")
    }
}

/// The device that owns `ptr`, by asking the driver (the CUDA array interface carries no
/// device). Managed memory reports as its device of origin.
pub fn pointer_device(ptr: usize) -> Result<Device> {
    super::require(Device::Cuda(0))?;
    let mut ordinal: i32 = -1;
    // SAFETY: cuPointerGetAttribute writes one int for DEVICE_ORDINAL into `ordinal`.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr as u64,
        )
    };
    check(r.result(), "asking the driver which device owns a pointer").map_err(|e| {
        Error::invalid(format!(
            "{ptr:#x} is not memory the CUDA driver knows ({e})"
        ))
    })?;
    let ordinal = u32::try_from(ordinal)
        .map_err(|_| Error::invalid(format!("{ptr:#x} is not memory of a CUDA device")))?;
    Ok(Device::Cuda(ordinal))
}

/// Free and total bytes on device `ordinal`.
pub fn mem_info(ordinal: u32) -> Result<(usize, usize)> {
    context::bind(ordinal)?;
    check(result::mem_get_info(), "reading memory use")
}
