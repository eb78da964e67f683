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
/// (16 bytes), as `cuLaunchKernel` reads them: by value, through a pointer to each. All of them
/// share one buffer, so a launch's parameter list costs one allocation, not one per parameter.
#[derive(Default)]
pub struct Params {
    /// The parameters' bytes, each starting on a 16-byte slot boundary.
    slots: Vec<u128>,
    /// Where each parameter starts, in slots.
    starts: Vec<usize>,
}

impl Params {
    /// An empty list.
    pub fn new() -> Params {
        Params::default()
    }

    /// An empty list with room for `params` parameters of `bytes` bytes in all, allocated once.
    pub fn with_capacity(params: usize, bytes: usize) -> Params {
        Params {
            slots: Vec::with_capacity(bytes.div_ceil(16) + params),
            starts: Vec::with_capacity(params),
        }
    }

    /// Appends one parameter given as its bytes (a pointer's, a scalar's, a `#[repr(C)]`
    /// struct's), in the kernel's parameter order.
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        let start = self.slots.len();
        self.slots
            .resize(start + bytes.len().div_ceil(16).max(1), 0);
        // SAFETY: the slots from `start` on hold at least `bytes.len()` bytes (just resized) and
        // do not overlap `bytes`, which the caller borrows from elsewhere.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.slots.as_mut_ptr().add(start).cast::<u8>(),
                bytes.len(),
            )
        };
        self.starts.push(start);
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
        self.starts.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Pointers to each parameter, for [`launch`]; valid while `self` lives and is not changed.
    pub fn pointers(&mut self) -> Vec<*mut c_void> {
        let base = self.slots.as_mut_ptr();
        self.starts
            .iter()
            // SAFETY: every start is within `slots` (push_bytes reserved it).
            .map(|&s| unsafe { base.add(s) }.cast())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_keep_their_bytes_and_alignment() {
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Wide {
            a: [i64; 3],
            b: i32,
        }
        let mut p = Params::with_capacity(1, 8);
        p.push(7u8);
        p.push(Wide {
            a: [1, 2, 3],
            b: -4,
        });
        p.push(2.5f64);
        p.push_bytes(&[]);
        assert_eq!(p.len(), 4);
        let ptrs = p.pointers();
        assert!(ptrs.iter().all(|q| (*q as usize) % 16 == 0));
        // SAFETY: each pointer addresses the bytes pushed as that type.
        unsafe {
            assert_eq!(*(ptrs[0] as *const u8), 7);
            let w = *(ptrs[1] as *const Wide);
            assert_eq!((w.a, w.b), ([1, 2, 3], -4));
            assert_eq!(*(ptrs[2] as *const f64), 2.5);
        }
    }
}
