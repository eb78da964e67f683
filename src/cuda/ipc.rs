//! Device memory shared with other processes of the node (CUDA IPC), without copies.
//!
//! Only memory of an IPC-capable pool can be exported, and such a pool never gives its memory
//! back to the driver before the process exits (the driver ignores its release threshold and
//! trims nothing: CUDA programming guide, "IPC Export Pool Limitations"). So the device's own
//! pool stays the default, and [`set_shareable`] switches the process's later allocations to a
//! pool of cubridge's created with POSIX file descriptor handles ([`allocation_pool`]).
//!
//! Export ([`export`]): the pool's file descriptor (made once per pool and kept), the block's
//! `cuMemPoolExportPointer` data (made at the allocation's first export and kept with it), an
//! interprocess event recorded after the array's last write while that write is still queued
//! (none once it is complete), and a slot of this process's counter segment (a memfd, which the
//! reader opens through `/proc/<pid>/fd`), set to one. Until the reader sets it back to zero,
//! the exported buffer is parked here with its event: [`reap`] lets go of both once the count
//! is zero or the reader has died.
//!
//! Import ([`import`]): the pool is imported once per (exporting process, device), the block
//! once per process while any array over it lives; the reader's streams wait for the event, if
//! one came, on the device. The mapping is freed (`cuMemFree`) on the background thread after
//! the reader's device has run everything queued, and only then is the count lowered, so the
//! writer frees the block after every reader has let go, as the driver requires.

use super::stream::{self, Event, Stream};
use super::{check, context};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// Whether new device memory comes from the shareable pool.
static SHAREABLE: AtomicBool = AtomicBool::new(false);

/// Makes the device memory that this process allocates from now on shareable with other
/// processes (or, with `false`, come from the device's own pool again). Fails where a device's
/// driver offers no IPC-capable pools.
pub fn set_shareable(on: bool) -> Result<()> {
    if on {
        super::require(crate::Device::Cuda(0))?;
        for ordinal in 0..super::device_count() as u32 {
            let types = context::attribute(
                ordinal,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES,
            )
            .unwrap_or(0);
            if types as u32 & POSIX_FD.0 == 0 {
                return Err(Error::invalid(format!(
                    "cuda:{ordinal} cannot share memory with other processes: its driver offers \
                     no memory pools with POSIX file descriptor handles"
                )));
            }
        }
    }
    SHAREABLE.store(on, Ordering::Release);
    Ok(())
}

/// Whether [`set_shareable`] is on.
pub fn is_shareable() -> bool {
    SHAREABLE.load(Ordering::Acquire)
}

/// The pool new device memory of `ordinal` comes from while sharing is on; `None` otherwise
/// (the device's own pool then serves).
pub fn allocation_pool(ordinal: u32) -> Result<Option<sys::CUmemoryPool>> {
    if !is_shareable() {
        return Ok(None);
    }
    sharing_pool(ordinal).map(Some)
}

fn sharing_pool(ordinal: u32) -> Result<sys::CUmemoryPool> {
    static POOLS: Mutex<Vec<Option<usize>>> = Mutex::new(Vec::new());
    let pool = context::per_device(&POOLS, ordinal, || {
        context::bind(ordinal)?;
        // SAFETY: an all-zero CUmemPoolProps is valid (no pointers set); fields are set below.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = POSIX_FD;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = ordinal as i32;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: valid properties and an out-pointer to a local.
        let r = unsafe { sys::cuMemPoolCreate(&mut pool, &props) };
        check(r.result(), "creating a shareable memory pool")?;
        Ok(pool as usize)
    })?;
    Ok(pool as sys::CUmemoryPool)
}

/// cubridge's stream for the interprocess waits and records of device `ordinal`.
fn ipc_stream(ordinal: u32) -> Result<Stream> {
    static STREAMS: Mutex<Vec<Option<Stream>>> = Mutex::new(Vec::new());
    context::per_device(&STREAMS, ordinal, || stream::create(ordinal))
}

/// This process's identity in the wire data: its pid and a value drawn once, so that a reused
/// pid is not taken for an earlier process.
fn identity() -> (u32, u64) {
    static NONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let nonce = *NONCE.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    });
    (std::process::id(), nonce)
}

mod counters;
mod import;
mod wire;

pub use import::{import, needs_pool, Mapping};
pub use wire::Wire;

/// A buffer sent to another process, kept here until its count is zero.
struct Parked {
    slot: usize,
    /// The interprocess event the reader waits for, with its handle (none where the buffer's
    /// last write was complete when it was sent).
    event: Option<(usize, [u8; 64])>,
    ordinal: u32,
    keep: Box<dyn Any + Send + Sync>,
}

static PARKED: Mutex<Vec<Parked>> = Mutex::new(Vec::new());
/// How many buffers are parked: allocations look at the counts only when some are.
static N_PARKED: AtomicUsize = AtomicUsize::new(0);

/// An exported block: what the reader needs, and where the block starts here.
pub struct Export {
    /// The data for [`import`].
    pub wire: Wire,
    /// The pool's file descriptor (kept by this module; the sender duplicates it).
    pub pool_fd: i32,
    /// The start of the block (the memory at `ptr` lies `ptr - base` bytes into it).
    pub base: u64,
}

/// A pool allocation of cubridge's: its start, its size, and the place its export data is kept
/// after its first export (see [`crate::cuda::memory::CudaAlloc::export_data`]).
pub struct Block<'a> {
    /// Where the allocation starts.
    pub base: u64,
    /// Its size in bytes.
    pub size: usize,
    /// Its export data, once made.
    pub export_data: &'a std::sync::OnceLock<[u8; 64]>,
}

/// Exports the pool block holding `ptr` (device memory of `ordinal`; `alloc`, where cubridge
/// allocated it) for one reader. The reader's work waits for `pending` (the last write) on the
/// device, through an interprocess event, unless that write is already complete. `keep` holds
/// the memory; it is parked until the reader has let go.
pub fn export(
    ptr: u64,
    alloc: Option<Block<'_>>,
    ordinal: u32,
    pending: Option<Arc<Event>>,
    keep: Box<dyn Any + Send + Sync>,
) -> Result<Export> {
    context::bind(ordinal)?;
    reap();
    let pool = sharing_pool(ordinal)?;
    // The driver exports an allocation only from a pool it has already shared (a pool exported
    // to a handle), so the pool's descriptor comes first.
    let pool_fd = pool_fd(ordinal, pool)?;
    let (base, size, pointer) = exported_block(ptr, alloc, pool)?;
    // Everything that may fail comes before the event and the slot, which must be given back.
    let (uuid, counters_fd) = (device_uuid(ordinal)?, counters::own_fd()?);
    // A write that failed is an error here, not a complete write.
    let event = match pending {
        Some(write) if !write.query()? => Some(interprocess_event(ordinal, &write)?),
        _ => None,
    };
    let slot = match counters::take_slot() {
        Ok(slot) => slot,
        Err(e) => {
            if let Some((event, _)) = event {
                destroy_event(event, ordinal);
            }
            return Err(e);
        }
    };
    let (pid, nonce) = identity();
    let wire = Wire {
        pid,
        nonce,
        counters_fd,
        slot: slot as u32,
        uuid,
        size: size as u64,
        base,
        pointer,
        event: event.map(|(_, handle)| handle),
    };
    crate::lock(&PARKED).push(Parked {
        slot,
        event,
        ordinal,
        keep,
    });
    N_PARKED.fetch_add(1, Ordering::AcqRel);
    Ok(Export {
        wire,
        pool_fd,
        base,
    })
}

/// The start, size and export data of the block holding `ptr`. An allocation of cubridge's
/// keeps its data after its first export: later sends of it make no driver call here.
fn exported_block(
    ptr: u64,
    alloc: Option<Block<'_>>,
    pool: sys::CUmemoryPool,
) -> Result<(u64, usize, [u8; 64])> {
    if let Some(a) = &alloc {
        if let Some(data) = a.export_data.get() {
            return Ok((a.base, a.size, *data));
        }
    }
    let (base, size) = block_of(ptr, alloc.as_ref().map(|a| (a.base, a.size)), pool)?;
    let mut data = sys::CUmemPoolPtrExportData { reserved: [0; 64] };
    // SAFETY: `base` is a live block of an IPC-capable, shared pool; the data goes to a local.
    let r = unsafe { sys::cuMemPoolExportPointer(&mut data, base) };
    check(r.result(), "exporting device memory")?;
    if let Some(alloc) = alloc {
        let _ = alloc.export_data.set(data.reserved);
    }
    Ok((base, size, data.reserved))
}

/// The start and size of the block holding `ptr` (`block` where the caller knows the
/// allocation: a pool's mapped range can be wider than one allocation, and only an allocation's
/// own start can be exported), refused unless it is of `pool`.
fn block_of(
    ptr: u64,
    block: Option<(u64, usize)>,
    pool: sys::CUmemoryPool,
) -> Result<(u64, usize)> {
    let mut owner: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: MEMPOOL_HANDLE writes one pool handle into `owner`.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut owner as *mut sys::CUmemoryPool).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
            ptr,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS || owner != pool {
        return Err(Error::invalid(
            "this array's memory cannot be shared with another process: only memory allocated \
             after cubridge.cuda.set_shareable(True) can (the device's default pool cannot be \
             exported); copy it (a.to_device(a.device)) after set_shareable, or send a host copy",
        ));
    }
    if let Some(block) = block {
        return Ok(block);
    }
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: writes the block's start and size for a live device pointer.
    let r = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) };
    check(r.result(), "looking up an allocation")?;
    Ok((base, size))
}

/// An interprocess event recorded after `pending` (on cubridge's own stream, which waits for
/// it on the device), and its handle.
fn interprocess_event(ordinal: u32, pending: &Event) -> Result<(usize, [u8; 64])> {
    let on = ipc_stream(ordinal)?;
    pending.wait(on)?;
    let spare = {
        let mut spare = crate::lock(&SPARE_EVENTS);
        let i = spare.iter().position(|&(o, ..)| o == ordinal);
        i.map(|i| spare.swap_remove(i))
    };
    let (event, handle) = match spare {
        Some((_, event, handle)) => (event, handle),
        None => new_interprocess_event()?,
    };
    // SAFETY: a live interprocess event of this context (no reader waits for it any more, if
    // it was used before) and a live stream of the current context.
    let r = unsafe { sys::cuEventRecord(event as sys::CUevent, on.handle()) };
    if let Err(e) = check(r.result(), "recording an interprocess event") {
        destroy_event(event, ordinal);
        return Err(e);
    }
    Ok((event, handle))
}

/// Interprocess events whose readers have all let go, by device, with their handles, kept for
/// the next sends: creating one costs driver calls.
static SPARE_EVENTS: Mutex<Vec<(u32, usize, [u8; 64])>> = Mutex::new(Vec::new());
const MAX_SPARE_EVENTS: usize = 64;

/// A new interprocess event of the current context and its handle.
fn new_interprocess_event() -> Result<(usize, [u8; 64])> {
    let flags = sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
        | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    let mut event: sys::CUevent = std::ptr::null_mut();
    // SAFETY: out-pointer to a local; valid flags.
    let created = unsafe { sys::cuEventCreate(&mut event, flags) };
    check(created.result(), "creating an interprocess event")?;
    let mut handle = sys::CUipcEventHandle { reserved: [0; 64] };
    // SAFETY: a live interprocess event; the handle goes to a local.
    let r = unsafe { sys::cuIpcGetEventHandle(&mut handle, event) };
    if let Err(e) = check(r.result(), "exporting an event") {
        // SAFETY: the event just created, destroyed once.
        let _ = unsafe { sys::cuEventDestroy_v2(event) };
        return Err(e);
    }
    Ok((event as usize, handle.reserved.map(|c| c as u8)))
}

/// Keeps an interprocess event whose readers have let go for a later send, or destroys it.
fn spare_event(ordinal: u32, event: usize, handle: [u8; 64]) {
    let mut spare = crate::lock(&SPARE_EVENTS);
    if spare.len() < MAX_SPARE_EVENTS {
        return spare.push((ordinal, event, handle));
    }
    drop(spare);
    destroy_event(event, ordinal);
}

fn destroy_event(event: usize, ordinal: u32) {
    let _restore = context::Restore::new();
    if context::bind(ordinal).is_ok() {
        // SAFETY: an event created here, destroyed once; pending waits still complete.
        let _ = unsafe { sys::cuEventDestroy_v2(event as sys::CUevent) };
    }
}

/// The pool's shareable file descriptor, made once per pool and kept for the process.
fn pool_fd(ordinal: u32, pool: sys::CUmemoryPool) -> Result<i32> {
    static FDS: Mutex<Vec<Option<i32>>> = Mutex::new(Vec::new());
    context::per_device(&FDS, ordinal, || {
        let mut fd: i32 = -1;
        // SAFETY: POSIX_FD handles are ints, written to a local; flags must be 0.
        let r = unsafe {
            sys::cuMemPoolExportToShareableHandle((&mut fd as *mut i32).cast(), pool, POSIX_FD, 0)
        };
        check(r.result(), "exporting a memory pool")?;
        Ok(fd)
    })
}

/// The UUID of device `ordinal`, read once per device.
fn device_uuid(ordinal: u32) -> Result<[u8; 16]> {
    static UUIDS: Mutex<Vec<Option<[u8; 16]>>> = Mutex::new(Vec::new());
    context::per_device(&UUIDS, ordinal, || read_uuid(ordinal))
}

fn read_uuid(ordinal: u32) -> Result<[u8; 16]> {
    let dev = check(
        cudarc::driver::result::device::get(ordinal as i32),
        "looking up the device",
    )?;
    let mut uuid = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: a valid device; the uuid goes to a local.
    let r = unsafe { sys::cuDeviceGetUuid_v2(&mut uuid, dev) };
    check(r.result(), "reading the device's UUID")?;
    Ok(uuid.bytes.map(|c| c as u8))
}

/// The ordinal of the device with `uuid` in this process.
fn ordinal_of(uuid: &[u8; 16]) -> Result<u32> {
    super::require(crate::Device::Cuda(0))?;
    for ordinal in 0..super::device_count() as u32 {
        if device_uuid(ordinal)? == *uuid {
            return Ok(ordinal);
        }
    }
    Err(Error::invalid(
        "the sending process's device is not visible in this process (CUDA_VISIBLE_DEVICES)",
    ))
}

/// Whether `wire` came from this process (a queue read where it was written).
fn is_own(wire: &Wire) -> bool {
    (wire.pid, wire.nonce) == identity()
}

/// The interprocess event of this process's receipt in `slot` (`None` for none), while the
/// receipt holds it; `None` once it does not.
fn parked_event(slot: u32) -> Option<Option<usize>> {
    let parked = crate::lock(&PARKED);
    parked
        .iter()
        .find(|p| p.slot == slot as usize)
        .map(|p| p.event.map(|(event, _)| event))
}

/// Lets go of the parked buffers whose readers have all let go, or died.
pub fn reap() {
    if N_PARKED.load(Ordering::Acquire) == 0 {
        return;
    }
    let done: Vec<Parked> = {
        let mut parked = crate::lock(&PARKED);
        let (done, kept) = std::mem::take(&mut *parked)
            .into_iter()
            .partition(|p| counters::released(p.slot));
        *parked = kept;
        done
    };
    N_PARKED.fetch_sub(done.len(), Ordering::AcqRel);
    for p in done {
        if let Some((event, handle)) = p.event {
            spare_event(p.ordinal, event, handle);
        }
        counters::give_back(p.slot);
        drop(p.keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharing_is_off_until_asked_and_needs_cuda() {
        assert!(allocation_pool(0).unwrap().is_none());
        if !crate::cuda::is_available() {
            let e = set_shareable(true).unwrap_err();
            assert!(matches!(e, Error::CudaUnavailable(_)), "{e}");
            assert!(!is_shareable());
        }
    }
}
