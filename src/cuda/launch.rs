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

/// A type that a kernel takes by value, pushed as its bytes ([`Params::push`]).
///
/// # Safety
/// Implementors are plain data with no padding: every byte of a value is initialised (integers,
/// floats, raw pointers, and `#[repr(C)]` structs of them whose fields leave no gaps, with any
/// gap filled by an explicit field), so that reading a value as bytes reads no uninitialised
/// memory. Its layout is the one the kernel's C type has.
pub unsafe trait KernelParam: Copy + 'static {}

macro_rules! plain {
    ($($t:ty),*) => {$(
        // SAFETY: a primitive integer or float has no padding.
        unsafe impl KernelParam for $t {}
    )*};
}
plain!(i8, i16, i32, i64, isize, u8, u16, u32, u64, usize, f32, f64);
// SAFETY: a raw pointer is one address, no padding.
unsafe impl<T: 'static> KernelParam for *mut T {}
// SAFETY: as above.
unsafe impl<T: 'static> KernelParam for *const T {}

/// Kernel parameters gathered one at a time, each kept at an address aligned for any C type
/// (16 bytes), as `cuLaunchKernel` reads them: by value, through a pointer to each. All of them
/// share one buffer, and the pointers to them are kept as they are pushed, so a launch's
/// parameter list costs two allocations, not one per parameter.
#[derive(Default)]
pub struct Params {
    /// The parameters' bytes, each starting on a 16-byte slot boundary.
    slots: Vec<u128>,
    /// Where each parameter starts in `slots`.
    pointers: Vec<*mut c_void>,
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
            pointers: Vec::with_capacity(params),
        }
    }

    /// Appends one parameter given as its bytes (a pointer's, a scalar's, a `#[repr(C)]`
    /// struct's), in the kernel's parameter order.
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        let start = self.slots.len();
        let before = self.slots.as_ptr() as usize;
        self.slots
            .resize(start + bytes.len().div_ceil(16).max(1), 0);
        let base = self.slots.as_mut_ptr();
        if base as usize != before {
            // The slots moved: so do the parameters already pushed.
            for p in &mut self.pointers {
                *p = base.cast::<u8>().wrapping_add(*p as usize - before).cast();
            }
        }
        // SAFETY: the slots from `start` on hold at least `bytes.len()` bytes (just resized) and
        // do not overlap `bytes`, which the caller borrows from elsewhere.
        let at = unsafe { base.add(start) };
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at.cast::<u8>(), bytes.len()) };
        self.pointers.push(at.cast());
    }

    /// Appends one parameter of a plain-data type (see [`KernelParam`]).
    pub fn push<T: KernelParam>(&mut self, value: T) {
        // SAFETY: `value` is a live `T`, and a `KernelParam` has no padding (the trait's
        // contract): every one of its `size_of::<T>()` bytes is initialised.
        let bytes = unsafe {
            std::slice::from_raw_parts((&value as *const T).cast::<u8>(), size_of::<T>())
        };
        self.push_bytes(bytes);
    }

    /// How many parameters.
    pub fn len(&self) -> usize {
        self.pointers.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.pointers.is_empty()
    }

    /// Pointers to each parameter, for [`launch`]; valid while `self` lives and is not changed.
    pub fn pointers(&mut self) -> &mut [*mut c_void] {
        &mut self.pointers
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
            pad: i32,
        }
        // SAFETY: two i64-aligned fields of 24 and 8 bytes: no padding.
        unsafe impl KernelParam for Wide {}
        assert_eq!(size_of::<Wide>(), 32);
        let mut p = Params::with_capacity(1, 8);
        p.push(7u8);
        p.push(Wide {
            a: [1, 2, 3],
            b: -4,
            pad: 0,
        });
        p.push(2.5f64);
        p.push_bytes(&[]);
        assert_eq!(p.len(), 4);
        let ptrs = p.pointers();
        assert!(ptrs.iter().all(|q| (*q as usize).is_multiple_of(16)));
        // SAFETY: each pointer addresses the bytes pushed as that type.
        unsafe {
            assert_eq!(*(ptrs[0] as *const u8), 7);
            let w = *(ptrs[1] as *const Wide);
            assert_eq!((w.a, w.b), ([1, 2, 3], -4));
            assert_eq!(*(ptrs[2] as *const f64), 2.5);
        }
    }
}
