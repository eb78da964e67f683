//! The checks of an elementwise kernel's outputs: the loop's shape and dtype, writable, and no
//! overlap with an input but exact (in place).

use crate::array::Array;
use crate::dtype::DType;
use crate::error::{shape_str, Error, Result};

/// Whether no element of `a` shares a byte with an element of `b`, decided on the lattice of
/// addresses their strides reach: every element of `a` starts at its first element's address
/// plus a multiple of `g`, the gcd of both arrays' byte strides, and so does every element of
/// `b` from its own; when the two starts differ (modulo `g`) by at least an element of each,
/// no two elements can meet (`x[::2]` and `x[1::2]`). `false` means they may share memory.
fn elements_disjoint(a: &Array, b: &Array) -> bool {
    fn gcd(x: usize, y: usize) -> usize {
        if y == 0 {
            x
        } else {
            gcd(y, x % y)
        }
    }
    let mut g = 0usize;
    for x in [a, b] {
        let item = x.dtype().itemsize();
        for (&d, &s) in x.shape().iter().zip(x.strides()) {
            if d > 1 {
                g = gcd(g, s.unsigned_abs().saturating_mul(item));
            }
        }
    }
    if g == 0 {
        return false; // single elements: the range test already said they meet
    }
    let g = g as i128;
    let d = (b.data_ptr() as usize as i128 - a.data_ptr() as usize as i128).rem_euclid(g);
    d >= a.dtype().itemsize() as i128 && g - d >= b.dtype().itemsize() as i128
}

/// Checks `out`, passed for an output of `shape` and `dtype` computed from `inputs`.
pub(crate) fn check_out<'a>(
    out: &Array,
    shape: &[usize],
    dtype: DType,
    inputs: impl Iterator<Item = &'a Array>,
) -> Result<()> {
    if out.shape() != shape {
        return Err(Error::invalid(format!(
            "out has shape {} but the result has shape {}",
            shape_str(out.shape()),
            shape_str(shape)
        )));
    }
    if out.dtype() != dtype {
        return Err(Error::invalid(format!(
            "out has dtype {} but the result has dtype {dtype}",
            out.dtype()
        )));
    }
    if out.readonly() {
        return Err(Error::ReadOnly(
            "out is read-only: its producer does not allow writes".into(),
        ));
    }
    if out.layout().may_overlap_itself() {
        return Err(Error::invalid(
            "out overlaps itself: several results would land on one element (a zero stride, or \
             strides that do not step past each other)",
        ));
    }
    let Some((o_start, o_end)) = out.address_range() else {
        return Ok(());
    };
    for input in inputs {
        let Some((i_start, i_end)) = input.address_range() else {
            continue;
        };
        let overlaps = i_start < o_end && o_start < i_end;
        // Host memory is one address space whether it is labelled cpu, pinned or managed (an
        // np.asarray of a pinned array is the same memory as the array).
        let same_space = input.device() == out.device()
            || (input.device().is_host_accessible() && out.device().is_host_accessible());
        if !overlaps || !same_space || elements_disjoint(input, out) {
            continue;
        }
        let exact = input.dtype() == out.dtype()
            && input.data_ptr() == out.data_ptr()
            && input
                .broadcast_to(shape)
                .is_ok_and(|b| b.strides() == out.strides());
        if !exact {
            return Err(Error::invalid(
                "out partially overlaps an input; only out identical to an input is allowed",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::element::Scalar;
    use crate::Device;

    #[test]
    fn interleaved_views_do_not_overlap() {
        let x = crate::ops::arange(
            Scalar::Int(0),
            Scalar::Int(8),
            Scalar::Int(1),
            DType::Float32,
            Device::Cpu,
        )
        .unwrap();
        let even = x.as_strided(&[4], &[2], 0).unwrap();
        let odd = x.as_strided(&[4], &[2], 1).unwrap();
        assert!(elements_disjoint(&even, &odd) && elements_disjoint(&odd, &even));
        let shifted = x.as_strided(&[3], &[2], 2).unwrap();
        assert!(!elements_disjoint(&even, &shifted));
        // Contiguous elements meet the odd ones.
        let all = x.as_strided(&[4], &[1], 0).unwrap();
        assert!(!elements_disjoint(&all, &odd));
    }
}
