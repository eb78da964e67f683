//! The one place cubridge launches a kernel, and the parameter list a launch takes.

use super::check;
use crate::error::Result;
use cudarc::driver::{result, sys};
use std::ffi::c_void;

/// Threads per block for the elementwise kernels.
pub const BLOCK: u32 = 256;

/// Launches `function` with `grid` blocks of `block` threads and `shared` bytes of dynamic
/// shared memory on `stream`.
///
/// # Safety
/// 1. `function` belongs to the context current on this thread.
/// 2. `params` point to values whose types and order match the kernel's parameters, and every
///    pointer among them is valid for what the kernel does with it until the kernel finishes.
pub unsafe fn launch(
    function: sys::CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(
        unsafe { result::launch_kernel(function, grid, block, shared, stream, params) },
        "launching a kernel",
    )
}

/// Kernel parameters gathered one at a time, each kept at an address aligned for any C type
/// (16 bytes), as `cuLaunchKernel` reads them: by value, through a pointer to each.
#[derive(Default)]
pub struct Params {
    values: Vec<Box<[u128]>>,
}

impl Params {
    /// An empty list.
    pub fn new() -> Params {
        Params::default()
    }

    /// Appends one parameter given as its bytes (a pointer's, a scalar's, a `#[repr(C)]`
    /// struct's), in the kernel's parameter order.
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        let mut slot = vec![0u128; bytes.len().div_ceil(16).max(1)].into_boxed_slice();
        // SAFETY: `slot` holds at least `bytes.len()` bytes and does not overlap `bytes`.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), slot.as_mut_ptr().cast(), bytes.len())
        };
        self.values.push(slot);
    }

    /// Appends one parameter of a plain-data type (`T` has no padding that the kernel reads and
    /// no pointers it should not see: integers, floats, raw pointers, `#[repr(C)]` structs of
    /// them).
    pub fn push<T: Copy + 'static>(&mut self, value: T) {
        // SAFETY: `value` is a live `T`; its bytes are read as bytes for its size.
        let bytes = unsafe {
            std::slice::from_raw_parts((&value as *const T).cast::<u8>(), size_of::<T>())
        };
        self.push_bytes(bytes);
    }

    /// How many parameters.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Pointers to each parameter, for [`launch`]; valid while `self` lives and is not changed.
    pub fn pointers(&mut self) -> Vec<*mut c_void> {
        self.values
            .iter_mut()
            .map(|v| v.as_mut_ptr().cast())
            .collect()
    }
}
