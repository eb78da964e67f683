//! `Array`: an n-dimensional view into a reference-counted [`Buffer`]. The buffer is either memory
//! cubridge allocated or a foreign tensor it borrows (a *view*, whose producer the buffer keeps
//! alive). Both are the same type so every operation accepts either.

use crate::cuda::shared::{services, Memory, Need};
use crate::cuda::stream::{Event, Stream, LEGACY};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::storage::{Buffer, HostAlloc, Storage};
use std::sync::Arc;

/// An n-dimensional array: buffer, layout, dtype, device, and whether writes are allowed.
#[derive(Clone)]
pub struct Array {
    buffer: Arc<Buffer>,
    layout: Layout,
    dtype: DType,
    device: Device,
    readonly: bool,
}

/// So that lists of arrays and of references to them are taken alike (`Launch::order`).
impl AsRef<Array> for Array {
    fn as_ref(&self) -> &Array {
        self
    }
}

impl std::fmt::Debug for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Array")
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("dtype", &self.dtype)
            .field("device", &self.device)
            .field("readonly", &self.readonly)
            .finish()
    }
}

impl Array {
    /// A new C-contiguous array with unspecified contents. CUDA device memory is allocated for
    /// work on the legacy default stream (see [`Array::empty_on`]).
    pub fn empty(shape: &[usize], dtype: DType, device: Device) -> Result<Array> {
        Self::allocate(shape, dtype, device, false, crate::cuda::stream::LEGACY)
    }

    /// A new C-contiguous array of zeros (on CUDA devices, zeroed on the legacy default stream).
    pub fn zeros(shape: &[usize], dtype: DType, device: Device) -> Result<Array> {
        Self::allocate(shape, dtype, device, true, crate::cuda::stream::LEGACY)
    }

    /// A new C-contiguous array with unspecified contents, whose CUDA device memory comes from the
    /// device's pool for work on `stream` (DLPack numbering): the allocation is recorded as that
    /// stream's pending write, so work on other streams is ordered after it.
    pub fn empty_on(
        shape: &[usize],
        dtype: DType,
        device: Device,
        stream: Stream,
    ) -> Result<Array> {
        Self::allocate(shape, dtype, device, false, stream)
    }

    /// A new C-contiguous CUDA device array for a graph being captured on device `ordinal`:
    /// memory from outside the pool, ready for any stream, with no pending write (see
    /// [`crate::cuda::memory::CudaAlloc::device_outside_pool`]).
    pub fn empty_for_capture(shape: &[usize], dtype: DType, ordinal: u32) -> Result<Array> {
        Self::over_cuda_memory(shape, dtype, Device::Cuda(ordinal), LEGACY, (false, true))
    }

    /// A C-contiguous array of `shape` over CUDA memory from the process's services (see
    /// [`crate::cuda::shared`]) for work on `stream`, zeroed and for a capture as asked.
    fn over_cuda_memory(
        shape: &[usize],
        dtype: DType,
        device: Device,
        stream: Stream,
        (zeroed, capture): (bool, bool),
    ) -> Result<Array> {
        crate::cuda::require(device)?;
        Self::over_new_storage(shape, dtype, device, |bytes| {
            let need = Need {
                bytes,
                device,
                stream,
                zeroed,
                capture,
            };
            Ok(match (services().allocate)(&need)? {
                Memory::Own(alloc) => Storage::Cuda(alloc),
                Memory::Relayed(relayed) => Storage::Relayed(relayed),
            })
        })
    }

    /// A C-contiguous array of `shape` over storage that `make` allocates with the byte count
    /// (checked to fit the address space).
    fn over_new_storage(
        shape: &[usize],
        dtype: DType,
        device: Device,
        make: impl FnOnce(usize) -> Result<Storage>,
    ) -> Result<Array> {
        let layout = Layout::contiguous(shape)?;
        let storage = make(layout.checked_nbytes(dtype.itemsize())?)?;
        Ok(Array {
            buffer: Arc::new(Buffer::owned(storage)),
            layout,
            dtype,
            device,
            readonly: false,
        })
    }

    /// A new C-contiguous array on `device`, zeroed if `zeroed`, for work on `stream`, the
    /// allocation recorded as that stream's pending write. CUDA memory comes from the process's
    /// services (see [`crate::cuda::shared`]).
    pub(crate) fn allocate(
        shape: &[usize],
        dtype: DType,
        device: Device,
        zeroed: bool,
        stream: Stream,
    ) -> Result<Array> {
        let array = Self::allocate_unrecorded(shape, dtype, device, zeroed, stream)?;
        // A pool allocation (and its zeroing) is work queued on `stream`: other streams order
        // after it as after a write.
        match device {
            Device::Cuda(_) if array.numel() == 0 => Ok(array),
            _ => array.written_on(stream),
        }
    }

    /// [`Array::allocate`] without recording the allocation as a write: for a result whose
    /// writer records its own write on the same stream ([`crate::ops::launch::Launch::empty`]).
    pub(crate) fn allocate_unrecorded(
        shape: &[usize],
        dtype: DType,
        device: Device,
        zeroed: bool,
        stream: Stream,
    ) -> Result<Array> {
        match device {
            Device::Cpu => Self::over_new_storage(shape, dtype, device, |bytes| {
                Ok(Storage::Host(HostAlloc::new(bytes, zeroed)?))
            }),
            _ => Self::over_cuda_memory(shape, dtype, device, stream, (zeroed, false)),
        }
    }

    /// Keeps the memory of `arrays` valid until the work queued so far on `stream` of device
    /// `ordinal` has run (`event` follows that work; `None` on the legacy default stream, which
    /// runs in order): cubridge's pooled memory by ordering its free after it, anything else by
    /// holding it in the releaser (see [`crate::cuda::release`]). Never waits.
    pub fn keep_until_run<A: AsRef<Array>>(
        arrays: impl IntoIterator<Item = A>,
        stream: Stream,
        event: Option<Arc<Event>>,
        ordinal: u32,
    ) {
        let held: Vec<crate::cuda::release::KeepAlive> = arrays
            .into_iter()
            .filter(|a| !a.as_ref().buffer.record_kernel(stream, event.clone()))
            .map(|a| {
                debug_assert!(
                    !a.as_ref().buffer.is_lent(),
                    "memory lent for a call in CUDA work"
                );
                a.as_ref().buffer.clone() as crate::cuda::release::KeepAlive
            })
            .collect();
        if !held.is_empty() {
            (services().keep_alive)(event, held, stream, ordinal);
        }
    }

    /// Records that a consumer reads this array's memory on `stream`: freeing it waits for the
    /// work queued there at that time (see [`crate::cuda::free`]).
    pub fn record_consumer(&self, stream: Stream) {
        self.buffer.record_consumer(stream, self.ordinal());
    }

    /// Records a consumer of this array's memory whose stream is unknown: freeing it waits for
    /// the whole device, on a background thread.
    pub fn record_unknown_consumer(&self) {
        self.buffer.record_unknown_consumer(self.ordinal());
    }

    /// The CUDA device whose streams use this memory (device 0 for pinned and managed memory,
    /// as cubridge allocates them there).
    fn ordinal(&self) -> u32 {
        match self.device {
            Device::Cuda(n) => n,
            _ => 0,
        }
    }

    /// An array over an existing buffer.
    ///
    /// # Safety
    /// 1. Every element that `layout` addresses, from `buffer.ptr()`, lies inside the buffer's
    ///    memory and is properly aligned for `dtype`.
    /// 2. That memory is on `device`.
    /// 3. If `readonly` is false, the memory may be written.
    pub unsafe fn from_parts(
        buffer: Arc<Buffer>,
        layout: Layout,
        dtype: DType,
        device: Device,
        readonly: bool,
    ) -> Array {
        Array {
            buffer,
            layout,
            dtype,
            device,
            readonly,
        }
    }

    /// The CUDA stream (DLPack numbering: 1 legacy default) that last wrote the array's memory.
    pub fn stream(&self) -> Stream {
        self.buffer
            .last_write()
            .map_or(crate::cuda::stream::LEGACY, |w| w.stream)
    }

    /// The same array, its memory recorded as written on `stream`, with `event` after that
    /// work. The record is kept with the memory, so every array over it sees it.
    pub fn with_pending(self, stream: Stream, event: impl Into<Arc<Event>>) -> Array {
        self.buffer.record_write(crate::cuda::stream::Write {
            stream,
            event: Some(event.into()),
        });
        self
    }

    /// The same array, its memory recorded as written on the legacy default stream by the work
    /// queued there so far, with no event yet: one is recorded only when a consumer on another
    /// stream (or the host) needs it, which saves an event per kernel whose result is read on
    /// that stream, as it mostly is.
    pub fn with_legacy_write(self) -> Array {
        self.buffer.record_write(crate::cuda::stream::Write {
            stream: crate::cuda::stream::LEGACY,
            event: None,
        });
        self
    }

    /// The same array, its memory recorded as written by the work queued so far on `stream` of
    /// its CUDA device: on the legacy default stream with no event yet (as
    /// [`Array::with_legacy_write`]), on any other with an event recorded now. Host memory is
    /// returned as it is.
    pub fn written_on(self, stream: Stream) -> Result<Array> {
        Ok(match self.device {
            Device::Cuda(_) if stream == LEGACY => self.with_legacy_write(),
            Device::Cuda(n) => self.with_pending(stream, Event::record(stream, n)?),
            _ => self,
        })
    }

    /// The event after the last write of the array's memory, if any. Consumers wait on it,
    /// never on the stream, whose owner may have destroyed it since.
    pub fn pending(&self) -> Result<Option<Arc<Event>>> {
        match self.device {
            Device::Cuda(n) => self.buffer.write_event(n),
            _ => Ok(self.buffer.last_write().and_then(|w| w.event)),
        }
    }

    /// The memory of a pinned or managed array labelled as CPU memory, for a consumer on the
    /// host, once the device's last write of it is complete: the host waits for that write's
    /// event, as a copy to the host does (no stream orders the CPU's reads). Work that only
    /// reads the memory is not waited for; a consumer that writes it while a kernel still
    /// reads it races, as with any host memory the device uses.
    pub fn host_view(&self) -> Result<Array> {
        if !matches!(self.device, Device::CudaHost | Device::CudaManaged) {
            return Err(Error::invalid(format!(
                "only pinned or managed memory can be seen as CPU memory, not {}",
                self.device
            )));
        }
        if let Some(event) = self.pending()? {
            event.synchronize()?;
        }
        // SAFETY: the same buffer, layout and dtype as this array's (1); pinned and managed
        // memory is host memory that the CPU addresses (2); the read-only flag is kept (3).
        Ok(unsafe {
            Array::from_parts(
                self.buffer.clone(),
                self.layout.clone(),
                self.dtype,
                Device::Cpu,
                self.readonly,
            )
        })
    }

    /// Whether CUDA work has written the array's memory (see [`Array::pending`]).
    pub fn has_pending(&self) -> bool {
        self.buffer.last_write().is_some()
    }

    /// Makes `consumer` (a stream of this array's device) wait for the array's pending work.
    pub fn order_before(&self, consumer: Stream) -> Result<()> {
        match self.buffer.last_write() {
            // Work on the legacy default stream is ordered before everything queued on it later,
            // from any thread. (Other handles are not trusted that way: a destroyed stream's
            // handle may be reused by a new one.)
            Some(w) if consumer == w.stream && consumer == crate::cuda::stream::LEGACY => Ok(()),
            // Work seen done needs no wait: asking costs less than waiting, and once seen done
            // nothing is asked again. Work on the consumer's own stream is waited for without
            // asking (it is most often the work queued just before).
            Some(w) => match self.pending()? {
                Some(event) if w.stream != consumer && event.is_done() => Ok(()),
                Some(event) => event.wait(consumer),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    /// The strides, in elements.
    pub fn strides(&self) -> &[isize] {
        self.layout.strides()
    }

    /// The layout (shape, strides, byte offset).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the memory lives.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Whether the producer forbids writes.
    pub fn readonly(&self) -> bool {
        self.readonly
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.layout.ndim()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// Bytes spanned by the elements (`numel * itemsize`).
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.itemsize()
    }

    /// The shared buffer.
    pub fn buffer(&self) -> &Arc<Buffer> {
        &self.buffer
    }

    /// Address of the first element.
    pub fn data_ptr(&self) -> *mut u8 {
        self.buffer.ptr().wrapping_add(self.layout.byte_offset())
    }

    /// The same memory marked read-only (for exports of read-only views).
    pub fn with_readonly(&self, readonly: bool) -> Array {
        Array {
            readonly: self.readonly || readonly,
            ..self.clone()
        }
    }

    /// The same buffer seen through another layout of the same extent or smaller (broadcasts).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Array> {
        Ok(Array {
            buffer: self.buffer.clone(),
            layout: self.layout.broadcast_to(shape)?,
            dtype: self.dtype,
            device: self.device,
            readonly: self.readonly,
        })
    }

    /// The same memory with the dimensions in reverse order (a transpose of a matrix).
    pub fn transposed(&self) -> Array {
        Array {
            layout: self.layout.transposed(),
            ..self.clone()
        }
    }

    /// A view of the same memory through another layout: `shape` and `strides` in elements, the
    /// first element `offset` elements away from this array's first element. Every element the
    /// new layout reaches must lie within the bytes this array's own elements span (from its
    /// lowest to its highest element), so a view never reaches memory the array does not cover;
    /// an empty view may start anywhere in that span.
    pub fn as_strided(&self, shape: &[usize], strides: &[isize], offset: isize) -> Result<Array> {
        let item = self.dtype.itemsize() as isize;
        let outside = || {
            Error::invalid(format!(
                "as_strided(shape={shape:?}, strides={strides:?}, offset={offset}) reaches outside \
                 the memory of this array (shape {:?}, strides {:?})",
                self.shape(),
                self.strides()
            ))
        };
        let byte_offset = offset
            .checked_mul(item)
            .and_then(|b| b.checked_add(self.layout.byte_offset() as isize))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(outside)?;
        let layout = Layout::new(shape.to_vec(), strides.to_vec(), byte_offset)?;
        layout.checked_nbytes(self.dtype.itemsize())?;
        let own = self.layout.byte_extent(self.dtype.itemsize())?;
        match (layout.byte_extent(self.dtype.itemsize())?, own) {
            (Some((start, end)), Some((lo, hi))) if start >= lo && end <= hi => {}
            (None, Some((lo, hi))) if (lo..=hi).contains(&(byte_offset as isize)) => {}
            (None, None) if offset == 0 => {}
            _ => return Err(outside()),
        }
        Ok(Array {
            layout,
            ..self.clone()
        })
    }

    /// The absolute address range `[start, end)` the elements occupy, or `None` when empty.
    pub fn address_range(&self) -> Option<(usize, usize)> {
        let (start, end) = self
            .layout
            .byte_extent(self.dtype.itemsize())
            .ok()
            .flatten()?;
        let base = self.buffer.ptr() as isize;
        Some((
            base.wrapping_add(start) as usize,
            base.wrapping_add(end) as usize,
        ))
    }

    /// Where the elements lie in memory, for [`crate::layout::may_share_memory`].
    pub fn footprint(&self) -> crate::layout::Footprint<'_> {
        crate::layout::Footprint {
            first: self.data_ptr() as usize,
            itemsize: self.dtype.itemsize(),
            shape: self.shape(),
            strides: self.strides(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_and_metadata() {
        let a = Array::zeros(&[2, 3], DType::Float32, Device::Cpu).unwrap();
        assert_eq!(a.shape(), &[2, 3]);
        assert_eq!(a.strides(), &[3, 1]);
        assert_eq!(a.nbytes(), 24);
        assert_eq!(a.data_ptr() as usize % 64, 0);
        assert_eq!(
            a.address_range().unwrap().1 - a.address_range().unwrap().0,
            24
        );
        assert!(Array::empty(&[usize::MAX, 2], DType::Int8, Device::Cpu).is_err());
    }

    #[test]
    fn strided_views_stay_inside_the_array() {
        let a = Array::zeros(&[5, 7], DType::Int16, Device::Cpu).unwrap();
        // A slice a[1:4, 2:6], its reversed columns, a transpose and a broadcast row.
        let s = a.as_strided(&[3, 4], &[7, 1], 9).unwrap();
        assert_eq!(s.data_ptr() as usize - a.data_ptr() as usize, 18);
        let r = s.as_strided(&[3, 4], &[7, -1], 3).unwrap();
        assert_eq!(r.data_ptr() as usize - s.data_ptr() as usize, 6);
        assert_eq!(r.address_range(), s.address_range());
        let t = s.transposed();
        assert_eq!((t.shape(), t.strides()), (&[4, 3][..], &[1, 7][..]));
        assert_eq!(t.data_ptr(), s.data_ptr());
        assert_eq!(
            a.as_strided(&[3, 7], &[0, 1], 0).unwrap().strides(),
            &[0, 1]
        );
        assert!(a.as_strided(&[0, 4], &[7, 1], 34).unwrap().numel() == 0);
        // One element past the end, before the start, past a slice's own span, an offset that
        // overflows, or mismatched lengths: all refused.
        assert!(a.as_strided(&[36], &[1], 0).is_err());
        assert!(a.as_strided(&[2], &[1], -1).is_err());
        assert!(s.as_strided(&[3, 5], &[7, 1], 0).is_err());
        assert!(s.as_strided(&[3, 4], &[7, -1], 0).is_err());
        assert!(a.as_strided(&[1], &[1], isize::MAX).is_err());
        assert!(a.as_strided(&[2, 2], &[1], 0).is_err());
        assert!(a.as_strided(&[0], &[1], 36).is_err());
        let empty = Array::zeros(&[0], DType::Int16, Device::Cpu).unwrap();
        assert!(empty.as_strided(&[1], &[1], 0).is_err());
        assert!(empty.as_strided(&[0, 3], &[3, 1], 0).is_ok());
    }

    #[test]
    fn cuda_without_a_driver_is_a_clear_error() {
        if crate::cuda::is_available() {
            return;
        }
        let e = Array::zeros(&[2], DType::Float32, Device::Cuda(0)).unwrap_err();
        assert!(matches!(e, Error::CudaUnavailable(_)), "{e}");
    }
}
