//! The checks of an elementwise kernel's outputs: the loop's shape and dtype, writable, and no
//! overlap with an input but exact (in place).

use crate::array::Array;
use crate::dtype::DType;
use crate::error::{shape_str, Error, Result};

/// Whether an element of `a` and one of `b` may share a byte (decided exactly where the search
/// can, as numpy's `shares_memory`; see [`crate::layout::may_share_memory`]).
fn may_share(a: &Array, b: &Array) -> bool {
    crate::layout::may_share_memory(&a.footprint(), &b.footprint(), crate::layout::SHARE_WORK)
}

/// Checks `out`, passed for an output of `shape` and `dtype` computed from `inputs`.
pub(crate) fn check_out<'a>(
    out: &Array,
    shape: &[usize],
    dtype: DType,
    inputs: impl Iterator<Item = &'a Array>,
) -> Result<()> {
    if !crate::layout::same_shape(out.shape(), shape) {
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
        if !overlaps || !same_space {
            continue;
        }
        let exact = input.dtype() == out.dtype()
            && input.data_ptr() == out.data_ptr()
            && input
                .broadcast_to(shape)
                .is_ok_and(|b| b.strides() == out.strides());
        if !exact && may_share(input, out) {
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
        assert!(!may_share(&even, &odd) && !may_share(&odd, &even));
        let shifted = x.as_strided(&[3], &[2], 2).unwrap();
        assert!(may_share(&even, &shifted));
        // Contiguous elements meet the odd ones.
        let all = x.as_strided(&[4], &[1], 0).unwrap();
        assert!(may_share(&all, &odd));
        // Columns 0..2 and 2..4 of a 2 x 4 array share nothing.
        let left = x.as_strided(&[2, 2], &[4, 1], 0).unwrap();
        let right = x.as_strided(&[2, 2], &[4, 1], 2).unwrap();
        assert!(!may_share(&left, &right) && !may_share(&right, &left));
    }
}
