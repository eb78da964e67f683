//! Memory that cubridge owns, and the reference-counted buffer that every array (owned or
//! borrowed) points into. A buffer is freed exactly once: when the last `Arc<Buffer>` (held by
//! Python arrays, views and exported DLPack tensors alike) is dropped, on whatever thread.

use crate::cuda::stream::{Event, Write};
use crate::error::{Error, Result};
use std::alloc::Layout as AllocLayout;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;

/// Alignment of host allocations: a cache line, and enough for any SIMD load.
pub const HOST_ALIGN: usize = 64;

/// A type with the host alignment, whose dangling pointer is the address of empty allocations.
#[repr(align(64))]
struct AlignedLine;

/// A 64-byte aligned host allocation.
pub struct HostAlloc {
    ptr: NonNull<u8>,
    /// `None` for zero bytes, which allocate nothing and use an aligned dangling pointer.
    layout: Option<AllocLayout>,
}

// SAFETY: HostAlloc uniquely owns plain bytes; nothing in it is tied to a thread.
unsafe impl Send for HostAlloc {}
// SAFETY: shared references only expose the pointer value; all access through it is governed by
// the callers' own synchronisation, as for any raw buffer.
unsafe impl Sync for HostAlloc {}

impl HostAlloc {
    /// Allocates `bytes` bytes, zero-filled if `zeroed`. Reports failure as
    /// [`Error::OutOfMemory`] instead of aborting.
    pub fn new(bytes: usize, zeroed: bool) -> Result<HostAlloc> {
        if bytes == 0 {
            // An aligned, non-null address that is never dereferenced.
            let ptr = NonNull::<AlignedLine>::dangling().cast::<u8>();
            return Ok(HostAlloc { ptr, layout: None });
        }
        let oom = || Error::OutOfMemory {
            bytes,
            device: "cpu".into(),
        };
        let layout = AllocLayout::from_size_align(bytes, HOST_ALIGN).map_err(|_| oom())?;
        // SAFETY: `layout` has a non-zero size (checked above) and a valid power-of-two alignment.
        let raw = unsafe {
            if zeroed {
                std::alloc::alloc_zeroed(layout)
            } else {
                std::alloc::alloc(layout)
            }
        };
        let ptr = NonNull::new(raw).ok_or_else(oom)?;
        Ok(HostAlloc {
            ptr,
            layout: Some(layout),
        })
    }

    /// The start of the allocation.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: `ptr` came from `alloc`/`alloc_zeroed` with exactly this layout and is freed
            // only here, once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// Memory cubridge allocated itself.
pub enum Storage {
    /// Ordinary host memory.
    Host(HostAlloc),
    /// CUDA memory: device (from the device's pool), pinned host, or managed.
    Cuda(crate::cuda::memory::CudaAlloc),
    /// CUDA memory that the process's runtime allocated for this copy of cubridge (an extension
    /// crate's) and frees after the uses handed to it (see [`crate::cuda::shared`]).
    Relayed(crate::cuda::shared::Relayed),
}

/// What keeps a buffer's memory valid.
pub enum Owner {
    /// Memory cubridge allocated.
    Storage(Storage),
    /// Memory that another library owns; dropping this value releases it (calls the DLPack
    /// deleter, releases the Python buffer, or drops the reference to the producer).
    Foreign(Keepalive),
    /// Host memory lent for one call by the caller, which keeps it valid (a Python argument):
    /// nothing is held or released, and every array over it is gone before the call returns
    /// ([`lend`]).
    Lent,
}

/// What keeps foreign memory valid: any value, boxed; or, held inline so that an import
/// allocates nothing for it, a DLPack producer's deleter or a reference to the Python object
/// that owns the memory.
pub enum Keepalive {
    /// Any value; dropping it releases the memory.
    Boxed(Box<dyn Any + Send + Sync>),
    /// A DLPack managed tensor's deleter, run when this is dropped.
    Deleter(dlpark::AllocationDeleter),
    /// A strong reference to the producer's Python object.
    #[cfg(feature = "python")]
    Object(crate::python::Holder),
}

impl Keepalive {
    /// The keepalive as one boxed value (for the releaser, which holds it past the buffer).
    fn into_boxed(self) -> Box<dyn Any + Send + Sync> {
        match self {
            Keepalive::Boxed(held) => held,
            Keepalive::Deleter(deleter) => Box::new(deleter),
            #[cfg(feature = "python")]
            Keepalive::Object(holder) => Box::new(holder),
        }
    }
}

/// A block of memory and what keeps it alive. Arrays hold it through an `Arc`.
pub struct Buffer {
    ptr: *mut u8,
    owner: Owner,
    /// The last CUDA work that wrote this memory: its stream (DLPack numbering) and an event
    /// after it. Kept with the memory, not with one array, so that every array over the buffer
    /// (the `out` a caller passed, views, clones) orders after a write through any of them.
    last_write: std::sync::Mutex<Option<Write>>,
    /// Who else reads this memory: its free (cubridge's own memory) or the release of its
    /// producer's tensor (a view's) waits for them.
    consumers: std::sync::Mutex<Consumers>,
}

/// Declared consumer streams kept per buffer; past this many the free waits for the device.
const MAX_CONSUMER_STREAMS: usize = 32;

/// The consumers of an exported buffer whose reads a free must follow.
#[derive(Default)]
struct Consumers {
    /// Streams the consumers declared (DLPack numbering), each once.
    streams: Vec<crate::cuda::stream::Stream>,
    /// A consumer whose stream cubridge does not know.
    unknown: bool,
    /// cubridge's own kernels that used the memory: one per stream, the newest (a later event
    /// on a stream follows the earlier work there).
    kernels: Vec<Write>,
    /// The device the consumers read on (for a view, whose buffer does not know its device).
    ordinal: u32,
}

impl Consumers {
    /// Whether a consumer was declared.
    fn any(&self) -> bool {
        self.unknown || !self.streams.is_empty()
    }
}

// SAFETY: the pointer is only an address; its owner is Send + Sync (every Owner variant is), and
// reads and writes through it are ordered by the operations that use it.
unsafe impl Send for Buffer {}
// SAFETY: as above.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// A buffer over memory cubridge allocated.
    pub fn owned(storage: Storage) -> Buffer {
        let ptr = match &storage {
            Storage::Host(alloc) => alloc.as_ptr(),
            Storage::Cuda(alloc) => alloc.as_ptr(),
            Storage::Relayed(relayed) => relayed.as_ptr(),
        };
        Buffer {
            ptr,
            owner: Owner::Storage(storage),
            last_write: std::sync::Mutex::new(None),
            consumers: Default::default(),
        }
    }

    /// A buffer over foreign memory at `ptr`, kept valid by `keepalive`.
    ///
    /// # Safety
    /// 1. `ptr` stays valid for every layout that arrays over this buffer use, for as long as
    ///    `keepalive` lives.
    /// 2. Dropping `keepalive` is the only thing that releases the memory.
    pub unsafe fn foreign(ptr: *mut u8, keepalive: Keepalive) -> Buffer {
        Buffer {
            ptr,
            owner: Owner::Foreign(keepalive),
            last_write: std::sync::Mutex::new(None),
            consumers: Default::default(),
        }
    }

    /// Whether this is memory lent for the current call ([`lend`]).
    pub fn is_lent(&self) -> bool {
        matches!(self.owner, Owner::Lent)
    }

    /// The base address (array data lives at `ptr + layout.byte_offset()`).
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The CUDA allocation this buffer is, where cubridge made it.
    pub fn cuda_alloc(&self) -> Option<&crate::cuda::memory::CudaAlloc> {
        match &self.owner {
            Owner::Storage(Storage::Cuda(alloc)) => Some(alloc),
            _ => None,
        }
    }

    /// The last CUDA write recorded on this memory, if any.
    pub fn last_write(&self) -> Option<Write> {
        crate::lock(&self.last_write).clone()
    }

    /// The event after the last CUDA write on this memory (on device `ordinal`), if any; for a
    /// write on the legacy default stream that left none, one is recorded there now.
    pub fn write_event(
        &self,
        ordinal: u32,
    ) -> crate::Result<Option<std::sync::Arc<crate::cuda::stream::Event>>> {
        use crate::cuda::stream::{Event, LEGACY};
        let mut guard = crate::lock(&self.last_write);
        let Some(write) = guard.as_mut() else {
            return Ok(None);
        };
        if write.event.is_none() {
            write.event = Some(std::sync::Arc::new(Event::record(LEGACY, ordinal)?));
        }
        Ok(write.event.clone())
    }

    /// Records a CUDA write on this memory (replacing the previous record: the new write was
    /// itself ordered after it, or was on the same memory by the caller's own choice).
    pub fn record_write(&self, write: Write) {
        *crate::lock(&self.last_write) = Some(write);
    }

    /// Whether cubridge allocated this memory.
    pub fn is_owned(&self) -> bool {
        matches!(self.owner, Owner::Storage(_))
    }

    /// Whether a consumer's reads of this memory are for cubridge to follow: its own CUDA
    /// memory, whose free it orders, and views, whose producer's tensor it holds until they
    /// have run (an extension's result, which is a view of cubridge's pool memory, among them).
    fn follows_consumers(&self) -> bool {
        matches!(
            self.owner,
            Owner::Storage(Storage::Cuda(_) | Storage::Relayed(_)) | Owner::Foreign(_)
        )
    }

    /// Records that a consumer reads this memory on `stream` (DLPack numbering) of device
    /// `ordinal`: the free, or for a view the release of the producer's tensor, waits for the
    /// work queued there when the memory is let go.
    pub fn record_consumer(&self, stream: crate::cuda::stream::Stream, ordinal: u32) {
        if !self.follows_consumers() {
            return;
        }
        let mut consumers = crate::lock(&self.consumers);
        consumers.ordinal = ordinal;
        if consumers.unknown || consumers.streams.contains(&stream) {
            return;
        }
        if consumers.streams.len() == MAX_CONSUMER_STREAMS {
            // So many streams (some perhaps destroyed since) are waited for as unknown ones.
            consumers.streams.clear();
            consumers.unknown = true;
            return;
        }
        consumers.streams.push(stream);
    }

    /// Whether this memory's free is queued in stream order after its recorded uses (a pooled
    /// device block of cubridge's), so that a kernel using it need not hold it alive.
    fn frees_in_stream_order(&self) -> bool {
        use crate::cuda::memory::MemoryKind;
        let kind = match &self.owner {
            Owner::Storage(Storage::Cuda(alloc)) => alloc.kind(),
            Owner::Storage(Storage::Relayed(relayed)) => relayed.kind(),
            _ => return false,
        };
        matches!(kind, MemoryKind::Device { pooled: true, .. })
    }

    /// Records that a kernel of cubridge's uses this memory on `stream`, with `event` after it
    /// (`None` on the legacy default stream), so that the free follows it on the device.
    /// Returns false, recording nothing, for memory whose free is not stream-ordered (foreign,
    /// pinned, managed): the caller must hold it until the kernel has run.
    pub fn record_kernel(
        &self,
        stream: crate::cuda::stream::Stream,
        event: Option<Arc<Event>>,
    ) -> bool {
        if !self.frees_in_stream_order() {
            return false;
        }
        let mut consumers = crate::lock(&self.consumers);
        let consumers = &mut *consumers;
        if let Some(known) = consumers.kernels.iter_mut().find(|k| k.stream == stream) {
            known.event = event;
        } else if consumers.kernels.len() < MAX_CONSUMER_STREAMS {
            consumers.kernels.push(Write { stream, event });
        } else {
            consumers.unknown = true;
        }
        true
    }

    /// Records a consumer whose stream is unknown (the CUDA array interface, `stream=-1`, the
    /// DLPack C exchange table) or a use by a captured graph, on device `ordinal`: the free (or
    /// the release of a view's producer) then waits for the device.
    pub fn record_unknown_consumer(&self, ordinal: u32) {
        if self.follows_consumers() {
            let mut consumers = crate::lock(&self.consumers);
            consumers.unknown = true;
            consumers.ordinal = ordinal;
        }
    }
}

/// Buffers of memory lent for a call, kept per thread: a call lends each of its host operands
/// one that no array uses any longer (repointed), so that such an import allocates and frees
/// nothing. Three operands a call, and nested calls, fit.
const LENT_SLOTS: usize = 8;

thread_local! {
    static LENT: std::cell::RefCell<[Option<Arc<Buffer>>; LENT_SLOTS]> =
        const { std::cell::RefCell::new([const { None }; LENT_SLOTS]) };
}

/// A buffer over host memory at `ptr` that its caller lends for the length of one call, holding
/// nothing; `None` when this thread's lent buffers are all in use (the caller then holds the
/// memory's owner as for any import).
///
/// # Safety
/// The memory at `ptr` stays valid while any array over the returned buffer lives, and the
/// caller drops every such array before the memory's owner may let it go (before the call that
/// lent it returns): no array over it is returned, exported, or handed to CUDA work.
pub unsafe fn lend(ptr: *mut u8) -> Option<Arc<Buffer>> {
    // `try_with`: none while the thread's locals are torn down.
    let lent = LENT.try_with(|slots| {
        let mut slots = slots.try_borrow_mut().ok()?;
        for slot in slots.iter_mut() {
            let Some(held) = slot else {
                let buffer = Arc::new(Buffer {
                    ptr,
                    owner: Owner::Lent,
                    last_write: std::sync::Mutex::new(None),
                    consumers: Default::default(),
                });
                *slot = Some(buffer.clone());
                return Some(buffer);
            };
            // No array uses this one any longer: repointed, as new.
            if let Some(buffer) = Arc::get_mut(held) {
                buffer.ptr = ptr;
                *buffer
                    .last_write
                    .get_mut()
                    .unwrap_or_else(|p| p.into_inner()) = None;
                return Some(held.clone());
            }
        }
        None
    });
    lent.ok().flatten()
}

/// Lets go of a view's producer (`held`) once the consumers' work queued so far has run: on
/// the releaser after an event on each declared stream, or after the whole device where a
/// stream is unknown or takes no event (destroyed, capturing). Never waits on the host.
fn release_after(held: Box<dyn Any + Send + Sync>, consumers: &Consumers) {
    use crate::cuda::stream::Event;
    // Recording binds the device's context: the thread's own is put back after.
    let _restore = crate::cuda::context::Restore::new();
    let ordinal = consumers.ordinal;
    let events: Option<Vec<_>> = match consumers.unknown {
        true => None,
        false => consumers
            .streams
            .iter()
            .map(|&s| match s.is_default() {
                // The releaser records one there, after every blocking stream's work.
                true => Ok((s, None)),
                false => Event::record(s, ordinal).map(|e| (s, Some(Arc::new(e)))),
            })
            .collect::<Result<_>>()
            .ok(),
    };
    let Some(events) = events else {
        return crate::cuda::free::drop_after_device(ordinal, held);
    };
    let held: crate::cuda::release::KeepAlive = Arc::new(held);
    for (stream, event) in events {
        (crate::cuda::shared::services().keep_alive)(event, vec![held.clone()], stream, ordinal);
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Owner::Lent = self.owner {
            return;
        }
        if let Owner::Foreign(held) = &mut self.owner {
            let consumers = self.consumers.get_mut().unwrap_or_else(|p| p.into_inner());
            // Timed where the benchmarks time phases; released with the buffer otherwise.
            #[cfg(feature = "phase-times")]
            if !consumers.any() {
                let held = std::mem::replace(held, Keepalive::Boxed(Box::new(())));
                crate::phases::producer!(ProducerRelease, drop(held));
            }
            if consumers.any() {
                let held = std::mem::replace(held, Keepalive::Boxed(Box::new(())));
                release_after(held.into_boxed(), consumers);
            }
            return;
        }
        let write = self
            .last_write
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let consumers = std::mem::take(self.consumers.get_mut().unwrap_or_else(|p| p.into_inner()));
        let uses = crate::cuda::free::Uses {
            write,
            kernels: consumers.kernels,
            streams: consumers.streams,
            unknown: consumers.unknown,
        };
        // The allocation frees itself as it drops, after the uses handed to it here.
        match &mut self.owner {
            Owner::Storage(Storage::Cuda(alloc)) => alloc.set_uses(uses),
            Owner::Storage(Storage::Relayed(relayed)) => relayed.set_uses(uses),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_allocations_are_aligned_and_zeroed() {
        for bytes in [0usize, 1, 63, 64, 4097] {
            let a = HostAlloc::new(bytes, true).unwrap();
            assert_eq!(a.as_ptr() as usize % HOST_ALIGN, 0);
            if bytes > 0 {
                // SAFETY: the allocation has `bytes` initialised (zeroed) bytes.
                let s = unsafe { std::slice::from_raw_parts(a.as_ptr(), bytes) };
                assert!(s.iter().all(|&b| b == 0));
            }
        }
    }

    #[test]
    fn impossible_allocation_is_an_error_not_an_abort() {
        let e = HostAlloc::new(usize::MAX - 8, false).err().unwrap();
        assert!(matches!(e, Error::OutOfMemory { .. }));
    }

    #[test]
    fn lent_buffers_are_reused_once_free_and_run_out() {
        let data = [0u8; 16];
        let at = |k: usize| data[k..].as_ptr().cast_mut();
        // SAFETY: `data` outlives every buffer lent here, all dropped in this scope.
        let first = unsafe { lend(at(0)) }.unwrap();
        assert!(first.is_lent() && first.ptr() == at(0));
        let slot = Arc::as_ptr(&first);
        first.record_write(Write {
            stream: crate::cuda::stream::LEGACY,
            event: None,
        });
        drop(first);
        // SAFETY: as above.
        let again = unsafe { lend(at(4)) }.unwrap();
        assert_eq!(
            Arc::as_ptr(&again),
            slot,
            "a free slot is repointed, not reallocated"
        );
        assert_eq!(again.ptr(), at(4));
        assert!(
            again.last_write().is_none(),
            "a repointed buffer forgets its last write"
        );
        // SAFETY: as above.
        let mut held: Vec<_> = (1..LENT_SLOTS)
            .map(|k| unsafe { lend(at(k)) }.unwrap())
            .collect();
        assert!(
            held.iter().all(|b| Arc::as_ptr(b) != slot),
            "a slot in use is not lent"
        );
        // SAFETY: as above.
        assert!(unsafe { lend(at(9)) }.is_none(), "every slot in use");
        held.pop();
        // SAFETY: as above.
        assert!(unsafe { lend(at(9)) }.is_some());
        drop(again);
    }

    #[test]
    fn foreign_keepalive_is_dropped_exactly_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        struct Count(Arc<AtomicUsize>);
        impl Drop for Count {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let drops = Arc::new(AtomicUsize::new(0));
        let mut data = [0u8; 4];
        // SAFETY: `data` outlives the buffer, which is dropped in this scope.
        let buf = Arc::new(unsafe {
            Buffer::foreign(
                data.as_mut_ptr(),
                Keepalive::Boxed(Box::new(Count(drops.clone()))),
            )
        });
        let second = buf.clone();
        drop(buf);
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        std::thread::spawn(move || drop(second)).join().unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}
