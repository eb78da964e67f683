//! Strided copies and casts between host arrays, and filling with a scalar.

use super::element::{Complex, Element, Scalar};
use super::{for_each_run, parallel_ranges, SendPtr};
use crate::dtype::DType;
use crate::layout::Coalesced;
use half::{bf16, f16};

type ReadFn = unsafe fn(*const u8) -> Scalar;
type WriteFn = unsafe fn(*mut u8, Scalar);

/// # Safety
/// `p` points to a valid, aligned `T`.
unsafe fn read<T: Element>(p: *const u8) -> Scalar {
    // SAFETY: the caller's contract.
    unsafe { (p as *const T).read() }.to_scalar()
}

/// # Safety
/// `p` points to writable, aligned memory for a `T`.
unsafe fn write<T: Element>(p: *mut u8, v: Scalar) {
    // SAFETY: the caller's contract.
    unsafe { (p as *mut T).write(T::from_scalar(v)) }
}

fn accessors(d: DType) -> (ReadFn, WriteFn) {
    macro_rules! pick {
        ($($D:ident => $t:ty),*) => {
            match d { $(DType::$D => (read::<$t> as ReadFn, write::<$t> as WriteFn),)* }
        };
    }
    pick!(Bool => bool, Int8 => i8, Int16 => i16, Int32 => i32, Int64 => i64, UInt8 => u8,
          UInt16 => u16, UInt32 => u32, UInt64 => u64, Float16 => f16, BFloat16 => bf16,
          Float32 => f32, Float64 => f64, Complex64 => Complex<f32>, Complex128 => Complex<f64>)
}

/// Copies `src` (of dtype `from`) into `dst` (of dtype `to`), converting each element as
/// [`Element::from_scalar`] describes. `plan.strides` are `[dst, src]`.
///
/// # Safety
/// Both pointers address valid, aligned elements of their dtypes over the whole plan; `dst` is
/// writable and does not overlap `src`.
pub unsafe fn copy_cast(from: DType, to: DType, dst: SendPtr, src: SendPtr, plan: &Coalesced<2>) {
    let total: usize = plan.shape.iter().product();
    let last = plan.shape.len() - 1;
    let (sd, ss) = (plan.strides[0][last], plan.strides[1][last]);
    let (isz, osz) = (from.itemsize() as isize, to.itemsize() as isize);
    let (rd, _) = accessors(from);
    let (_, wr) = accessors(to);
    parallel_ranges(total, |start, end| {
        for_each_run(plan, start, end, |[od, os], len| {
            // SAFETY: offsets come from the walker over the plan the caller vouched for.
            unsafe {
                let d = dst.get().offset(od * osz);
                let s = src.get().offset(os * isz);
                if from == to && sd == 1 && ss == 1 {
                    std::ptr::copy_nonoverlapping(s, d, len * isz as usize);
                } else if from == to {
                    for i in 0..len as isize {
                        std::ptr::copy_nonoverlapping(
                            s.offset(i * ss * isz),
                            d.offset(i * sd * osz),
                            isz as usize,
                        );
                    }
                } else {
                    for i in 0..len as isize {
                        wr(d.offset(i * sd * osz), rd(s.offset(i * ss * isz)));
                    }
                }
            }
        });
    });
}

/// One element of a dtype, held by value: a scalar kernel parameter (16 aligned bytes hold the
/// widest element, complex128).
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct ElementBytes {
    bytes: [u8; 16],
    len: usize,
}

impl ElementBytes {
    /// `value` converted to `dtype`, as [`fill`] writes it.
    pub fn new(dtype: DType, value: Scalar) -> ElementBytes {
        let mut e = ElementBytes {
            bytes: [0; 16],
            len: dtype.itemsize(),
        };
        // SAFETY: 16 writable bytes, aligned to 16, hold one element of any dtype.
        unsafe { fill(dtype, e.bytes.as_mut_ptr(), 1, value) };
        e
    }

    /// The element's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// A pointer to the element, for a kernel parameter list.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.bytes.as_mut_ptr()
    }
}

/// Writes `value` (converted to `dtype`) into `n` contiguous elements at `dst`.
///
/// # Safety
/// `dst` is writable and aligned for `n` elements of `dtype`.
pub unsafe fn fill(dtype: DType, dst: *mut u8, n: usize, value: Scalar) {
    if n == 0 {
        return;
    }
    let size = dtype.itemsize();
    let (_, wr) = accessors(dtype);
    // SAFETY: `dst` holds at least one element; later copies stay inside the `n` elements.
    unsafe {
        wr(dst, value);
        let mut filled = 1;
        // Double the filled prefix each step: log2(n) memcpys.
        while filled < n {
            let count = filled.min(n - filled);
            std::ptr::copy_nonoverlapping(dst, dst.add(filled * size), count * size);
            filled += count;
        }
    }
}

/// Reads element `offset` (in elements) of a host array as a [`Scalar`].
///
/// # Safety
/// `base + offset` addresses a valid, aligned element of `dtype`.
pub unsafe fn read_scalar(dtype: DType, base: *const u8, offset: isize) -> Scalar {
    let (rd, _) = accessors(dtype);
    // SAFETY: the caller's contract.
    unsafe { rd(base.offset(offset * dtype.itemsize() as isize)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::coalesce;

    #[test]
    fn element_bytes_hold_one_element_of_its_dtype() {
        let e = ElementBytes::new(DType::Float32, Scalar::Float(1.5));
        assert_eq!(e.as_bytes(), &1.5f32.to_le_bytes());
        let e = ElementBytes::new(DType::Int16, Scalar::Int(-2));
        assert_eq!(e.as_bytes(), &(-2i16).to_le_bytes());
        let e = ElementBytes::new(DType::Complex128, Scalar::Complex(1.0, -1.0));
        let want: Vec<u8> = [1.0f64.to_le_bytes(), (-1.0f64).to_le_bytes()].concat();
        assert_eq!(e.as_bytes(), &want[..]);
        assert_eq!(
            ElementBytes::new(DType::Bool, Scalar::Bool(true)).as_bytes(),
            &[1]
        );
    }

    #[test]
    fn cast_and_strided_copy() {
        let src: [f32; 4] = [1.5, -2.5, 3.0, 4.0];
        let mut dst = [0i16; 4];
        // Reverse order while casting.
        let plan = coalesce(&[4], [&[1], &[-1]]);
        // SAFETY: both arrays outlive the call; offsets reach indices 3..=0 of `src`.
        unsafe {
            copy_cast(
                DType::Float32,
                DType::Int16,
                SendPtr(dst.as_mut_ptr().cast()),
                SendPtr(src.as_ptr().add(3) as *mut u8),
                &plan,
            )
        };
        assert_eq!(dst, [4, 3, -2, 1]);
    }

    #[test]
    fn fill_repeats_the_value() {
        let mut v = [0u16; 7];
        // SAFETY: `v` has 7 writable u16 elements.
        unsafe { fill(DType::Float16, v.as_mut_ptr().cast(), 7, Scalar::Float(1.0)) };
        assert!(v.iter().all(|&x| x == f16::from_f32(1.0).to_bits()));
    }
}
