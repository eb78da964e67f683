//! Views: arrays over foreign memory, built from untrusted descriptors. Every field is checked
//! before use; only ownership (the deleter, or the reference that keeps a producer alive) is
//! trusted.

use crate::array::Array;
use crate::device::Device;
use crate::dtype::{DType, Kind};
use crate::error::{Error, Result};
use crate::layout::{check_ndim, Layout};
use crate::storage::{Buffer, Keepalive, HOST_ALIGN};
use dlpark::ffi::DLTensor;
use dlpark::{DlpackFlags, Managed, ManagedTensorBase, TensorRef};
use std::any::Any;
use std::sync::Arc;

/// The alignment an element of `dtype` needs (complex numbers align like their parts).
pub fn alignment(dtype: DType) -> usize {
    match dtype.kind() {
        Kind::Complex => dtype.itemsize() / 2,
        _ => dtype.itemsize(),
    }
}

/// An untrusted description of foreign memory, as a protocol hands it over.
pub struct Descriptor<'a> {
    /// Address of the buffer (the first element is at `data + byte_offset`).
    pub data: usize,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
    /// The shape.
    pub shape: &'a [i64],
    /// Strides in elements; `None` means C-contiguous.
    pub strides: Option<&'a [i64]>,
    /// The element type.
    pub dtype: DType,
    /// Where the memory lives.
    pub device: Device,
    /// Whether the producer forbids writes.
    pub readonly: bool,
    /// When the protocol states the buffer's size (the buffer protocol does), its length in bytes
    /// from `data`: elements must lie inside it.
    pub len_bytes: Option<usize>,
}

/// Builds a view over foreign memory from a validated descriptor; `keepalive` keeps the producer's
/// memory valid and is dropped exactly once, when the last array or export over it goes.
///
/// # Safety
/// While `keepalive` lives, the memory the descriptor names is the producer's live allocation on
/// `device` (only the descriptor's consistency is checked here, not the producer's honesty).
pub unsafe fn from_descriptor(
    d: &Descriptor<'_>,
    keepalive: Box<dyn Any + Send + Sync>,
) -> Result<Array> {
    let checked = check(d)?;
    // SAFETY: the caller's contract.
    Ok(unsafe { checked.into_array(Keepalive::Boxed(keepalive)) })
}

/// A descriptor that passed [`check`]: what a view needs, owning no borrowed fields, so that
/// the producer's tensor can be handed over after its descriptor was read.
pub struct Checked {
    layout: Layout,
    ptr: *mut u8,
    dtype: DType,
    device: Device,
    readonly: bool,
}

impl Checked {
    /// The device the memory is on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The view, with `keepalive` keeping the memory valid.
    ///
    /// # Safety
    /// As [`from_descriptor`]'s: while `keepalive` lives, the memory the checked descriptor
    /// named is the producer's live allocation.
    pub unsafe fn into_array(self, keepalive: Keepalive) -> Array {
        // SAFETY: the caller vouches that the memory stays valid while keepalive lives; the
        // buffer owns keepalive.
        let buffer = Arc::new(unsafe { Buffer::foreign(self.ptr, keepalive) });
        // SAFETY: layout validated by `check` (non-negative shape, addressable extent,
        // alignment, and the bounds where the protocol states them); device and read-only flag
        // come from the producer.
        unsafe { Array::from_parts(buffer, self.layout, self.dtype, self.device, self.readonly) }
    }

    /// The view over host memory that the caller lends for the length of one call, holding
    /// nothing ([`crate::storage::lend`]), where this thread has a lent buffer free; else the
    /// view held by `keepalive()`, as [`Checked::into_array`] makes it.
    ///
    /// # Safety
    /// As [`crate::storage::lend`]'s: the memory stays valid while the view (or any array made
    /// from it) lives, and all are dropped before the call that lent the memory returns; and
    /// as [`Checked::into_array`]'s for `keepalive()`.
    pub unsafe fn into_lent_or(self, keepalive: impl FnOnce() -> Keepalive) -> Array {
        // SAFETY: the caller's contract.
        let Some(buffer) = (unsafe { crate::storage::lend(self.ptr) }) else {
            // SAFETY: the caller's contract.
            return unsafe { self.into_array(keepalive()) };
        };
        // SAFETY: as in `into_array`; the caller keeps the memory valid while the view lives.
        unsafe { Array::from_parts(buffer, self.layout, self.dtype, self.device, self.readonly) }
    }
}

/// Checks every field of a descriptor (see [`from_descriptor`]).
pub fn check(d: &Descriptor<'_>) -> Result<Checked> {
    let itemsize = d.dtype.itemsize();
    let layout = Layout::from_untrusted(d.shape, d.strides, 0, itemsize)?;
    let nbytes = layout.checked_nbytes(itemsize)?;
    let first = d
        .data
        .checked_add(usize::try_from(d.byte_offset).unwrap_or(usize::MAX))
        .ok_or_else(|| Error::invalid("data pointer plus byte_offset overflows"))?;
    let mut ptr = first as *mut u8;
    // Every itemsize is at least one byte: no bytes, no elements.
    if nbytes == 0 {
        // Producers may hand NULL for empty arrays; consumers of ours get an aligned address.
        if ptr.is_null() {
            ptr = HOST_ALIGN as *mut u8;
        }
    } else {
        if d.data == 0 {
            return Err(Error::invalid("data pointer is NULL for a non-empty array"));
        }
        let align = alignment(d.dtype);
        // Alignments are powers of two (itemsizes, or half of a complex one).
        if first & (align - 1) != 0 {
            return Err(Error::invalid(format!(
                "data pointer {first:#x} (byte_offset {}) is not aligned to the {align} bytes \
                 that {} needs",
                d.byte_offset, d.dtype
            )));
        }
        if let Some(len) = d.len_bytes {
            let (start, end) = layout
                .byte_extent(itemsize)?
                .ok_or_else(|| Error::invalid("empty layout in a non-empty branch"))?;
            let base = isize::try_from(first - d.data)
                .map_err(|_| Error::invalid("byte_offset is too large"))?;
            let reach = start.checked_add(base).zip(end.checked_add(base));
            let inside = matches!(reach, Some((lo, hi)) if lo >= 0 && hi as usize <= len);
            if !inside {
                let (lo, hi) = reach.unwrap_or((isize::MIN, isize::MAX));
                return Err(Error::invalid(format!(
                    "strides reach bytes {lo}..{hi} but the buffer has {len} bytes"
                )));
            }
        }
    }
    Ok(Checked {
        layout,
        ptr,
        dtype: d.dtype,
        device: d.device,
        readonly: d.readonly,
    })
}

/// A view over an imported DLPack managed tensor (either ABI). The managed tensor's deleter runs
/// exactly once, when the last array or export over the view goes, or at once if the descriptor
/// is rejected.
pub fn from_managed<M: ManagedTensorBase>(managed: Managed<M>) -> Result<Array> {
    // SAFETY: Managed guarantees a live managed tensor.
    check_ndim(unsafe { managed.tensor() }.ndim.into())?;
    let readonly = managed.flags().contains(DlpackFlags::READ_ONLY);
    let checked = check_tensor(&managed.validate().map_err(invalid_tensor)?, readonly)?;
    // SAFETY: DLPack's contract: the memory stays valid until the deleter runs, which happens when
    // the AllocationDeleter, which the buffer holds, is dropped.
    Ok(unsafe { checked.into_array(Keepalive::Deleter(managed.into_deleter())) })
}

/// Checks a DLPack tensor lent for the duration of a call (no managed tensor, no flags), for a
/// view whose memory the caller keeps valid.
///
/// # Safety
/// `tensor`'s shape and strides pointers are readable for `ndim` entries during the call.
pub unsafe fn check_dltensor(tensor: &DLTensor) -> Result<Checked> {
    check_ndim(tensor.ndim.into())?;
    // SAFETY: the caller's contract.
    let validated = unsafe { TensorRef::from_raw(tensor) }.map_err(invalid_tensor)?;
    check_tensor(&validated, false)
}

fn invalid_tensor(e: dlpark::tensor::Error) -> Error {
    Error::invalid(format!("invalid DLPack tensor: {e}"))
}

/// [`check`] of a DLPack tensor that dlpark validated structurally.
fn check_tensor(tensor: &TensorRef<'_>, readonly: bool) -> Result<Checked> {
    check(&Descriptor {
        data: tensor.data_ptr() as usize,
        byte_offset: tensor.byte_offset(),
        shape: tensor.shape(),
        strides: tensor.strides(),
        dtype: DType::from_dlpack(tensor.dtype())?,
        device: Device::from_dlpack(tensor.device())?,
        readonly,
        len_bytes: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::to_managed;
    use dlpark::ffi::DLManagedTensorVersioned;

    fn desc<'a>(data: usize, shape: &'a [i64], strides: Option<&'a [i64]>) -> Descriptor<'a> {
        Descriptor {
            data,
            byte_offset: 0,
            shape,
            strides,
            dtype: DType::Float32,
            device: Device::Cpu,
            readonly: false,
            len_bytes: None,
        }
    }

    #[test]
    fn round_trip_through_dlpack_shares_memory() {
        let a = Array::zeros(&[4, 2], DType::Int16, Device::Cpu).unwrap();
        let m = to_managed::<DLManagedTensorVersioned>(&a, false).unwrap();
        let v = from_managed(m).unwrap();
        assert_eq!(v.data_ptr(), a.data_ptr());
        assert_eq!(v.shape(), a.shape());
        assert_eq!(v.dtype(), DType::Int16);
    }

    #[test]
    fn byte_offset_is_honoured() {
        let data = [0f32; 8];
        let p = data.as_ptr() as usize;
        let mut d = desc(p, &[2], None);
        d.byte_offset = 8;
        // SAFETY: `data` outlives the view; offset 8 plus 2 floats stays inside it.
        let v = unsafe { from_descriptor(&d, Box::new(())) }.unwrap();
        assert_eq!(v.data_ptr() as usize, p + 8);
        d.byte_offset = 2;
        // SAFETY: as above (rejected before use).
        let misaligned = unsafe { from_descriptor(&d, Box::new(())) };
        assert!(misaligned.is_err(), "misaligned");
    }

    #[test]
    fn descriptors_are_validated() {
        let data = [0f32; 8];
        let p = data.as_ptr() as usize;
        let ok = |d: &Descriptor| {
            // SAFETY: `data` outlives every view made here.
            unsafe { from_descriptor(d, Box::new(())) }
        };
        assert!(ok(&desc(p, &[2, 4], None)).is_ok());
        assert!(ok(&desc(0, &[2], None)).is_err());
        assert!(ok(&desc(0, &[0, 3], None)).is_ok());
        assert!(ok(&desc(p + 1, &[2], None)).is_err());
        assert!(ok(&desc(p, &[-2], None)).is_err());
        let mut bounded = desc(p, &[2, 4], Some(&[4, 1]));
        bounded.len_bytes = Some(32);
        assert!(ok(&bounded).is_ok());
        bounded.strides = Some(&[5, 1]);
        assert!(ok(&bounded).is_err());
        let mut neg = desc(p + 28, &[8], Some(&[-1]));
        neg.len_bytes = Some(4);
        assert!(ok(&neg).is_err(), "reaches before the buffer start");
    }
}
