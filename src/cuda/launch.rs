//! The one place cubridge launches a kernel.

use super::check;
use crate::error::Result;
use cudarc::driver::{result, sys};
use std::ffi::c_void;

/// Threads per block for the elementwise kernels.
pub const BLOCK: u32 = 256;

/// Launches `function` with `grid` blocks of `block` threads (x, y) and `shared` bytes of
/// dynamic shared memory on `stream`.
///
/// # Safety
/// 1. `function` belongs to the context current on this thread.
/// 2. `params` point to values whose types and order match the kernel's parameters, and every
///    pointer among them is valid for what the kernel does with it until the kernel finishes.
pub unsafe fn launch(
    function: sys::CUfunction,
    grid: u32,
    block: (u32, u32),
    shared: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(
        unsafe {
            result::launch_kernel(
                function,
                (grid, 1, 1),
                (block.0, block.1, 1),
                shared,
                stream,
                params,
            )
        },
        "launching a kernel",
    )
}
