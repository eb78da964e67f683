//! Kernel parameters of users' elementwise kernels, laid out as the structs of
//! `kernels/user.cuh` (keep the two in step).

use crate::array::Array;
use crate::error::{Error, Result};

/// Most dimensions a strided operand or a raw array takes after coalescing (`CB_MAX_DIMS`).
pub const MAX_DIMS: usize = 8;

/// `CbStrided<T>`: an operand's pointer and element strides over the loop's shape.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Strided {
    /// The operand's first element.
    pub p: *mut u8,
    /// Element strides, innermost last.
    pub s: [i64; MAX_DIMS],
}

/// `CbShape`: the loop's coalesced shape.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Shape {
    /// Extents, innermost last.
    pub d: [i64; MAX_DIMS],
    /// Dimensions in use.
    pub ndim: i32,
}

/// `CbRaw<T>`: a whole array, indexed by the operation.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Raw {
    /// The first element.
    pub p: *mut u8,
    /// Extents of its coalesced shape, innermost last.
    pub shape: [i64; MAX_DIMS],
    /// Element strides.
    pub stride: [i64; MAX_DIMS],
    /// Dimensions in use.
    pub ndim: i32,
    /// Elements in all.
    pub n: i64,
}

fn too_many(what: &str, ndim: usize) -> Error {
    Error::invalid(format!(
        "{what} needs {ndim} dimensions after merging contiguous ones; elementwise kernels take \
         at most {MAX_DIMS}"
    ))
}

impl Shape {
    /// The loop's shape, checked against [`MAX_DIMS`].
    pub fn new(shape: &[usize]) -> Result<Shape> {
        if shape.len() > MAX_DIMS {
            return Err(too_many("the loop", shape.len()));
        }
        let mut d = [0i64; MAX_DIMS];
        for (k, &e) in shape.iter().enumerate() {
            d[k] = e as i64;
        }
        Ok(Shape {
            d,
            ndim: shape.len() as i32,
        })
    }
}

impl Strided {
    /// `p` with strides `s` over a shape already checked by [`Shape::new`].
    pub fn new(p: *mut u8, s: &[isize]) -> Strided {
        let mut out = [0i64; MAX_DIMS];
        for (k, &x) in s.iter().take(MAX_DIMS).enumerate() {
            out[k] = x as i64;
        }
        Strided { p, s: out }
    }
}

impl Raw {
    /// `x` seen whole, its dimensions merged where contiguous.
    pub fn new(x: &Array) -> Result<Raw> {
        let (shape, strides) = crate::layout::coalesce_of(x.shape(), &[x.strides()]);
        if shape.len() > MAX_DIMS {
            return Err(too_many("a raw array", shape.len()));
        }
        let mut raw = Raw {
            p: x.data_ptr(),
            shape: [0; MAX_DIMS],
            stride: [0; MAX_DIMS],
            ndim: shape.len() as i32,
            n: x.numel() as i64,
        };
        for k in 0..shape.len() {
            raw.shape[k] = shape[k] as i64;
            raw.stride[k] = strides[0][k] as i64;
        }
        Ok(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_header() {
        // Sizes as the C structs of kernels/user.cuh have them on a 64-bit target.
        assert_eq!(size_of::<Strided>(), 8 + 8 * 8);
        assert_eq!(size_of::<Shape>(), 8 * 8 + 8);
        assert_eq!(size_of::<Raw>(), 8 + 64 + 64 + 8 + 8);
        assert_eq!(std::mem::offset_of!(Raw, n), 8 + 64 + 64 + 8);
    }
}
