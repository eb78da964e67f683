//! The reader's side: another process's pool, imported once per exporter and device; its
//! blocks, mapped once while any array over them lives; and the order after the writer. A
//! block read back in the process that sent it is used where it is, after the same event.

use super::{
    counters, destroy_event, ipc_stream, is_own, ordinal_of, parked_event, Wire, POSIX_FD,
};
use crate::cuda::stream::{Event, Stream};
use crate::cuda::{check, context, free};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A block of another process's pool, mapped here.
pub struct Mapping {
    ptr: u64,
    size: usize,
    ordinal: u32,
    key: BlockKey,
    /// A block of this process's own (nothing mapped, nothing to free).
    own: bool,
    /// The counters to lower once the mapping is freed: one per receipt.
    counters: Mutex<Vec<&'static AtomicU64>>,
}

impl Mapping {
    /// The start of the block in this process.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Its size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device it is on, in this process's numbering.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }
}

/// Blocks mapped in this process, by exporter and block: a block received again while mapped
/// is not mapped twice.
static MAPPED: Mutex<Option<HashMap<BlockKey, Weak<Mapping>>>> = Mutex::new(None);

/// A block of another process: its exporter's nonce and its export data.
type BlockKey = (u64, [u8; 64]);

/// Maps the block that `wire` describes (`pool_fd`: the exporter's pool, taken and closed),
/// with a stream of this process and an event on it after the exporter's last write of the
/// block, which consumers wait for: the array's pending write (none where that write was
/// complete when the block was sent).
pub fn import(
    wire: &Wire,
    pool_fd: Option<std::os::fd::OwnedFd>,
) -> Result<(Arc<Mapping>, Stream, Option<Event>)> {
    let ordinal = ordinal_of(&wire.uuid)?;
    context::bind(ordinal)?;
    let counter = counters::remote(wire)?;
    let mapping = match map_block(wire, ordinal, pool_fd) {
        Ok(mapping) => mapping,
        Err(e) => {
            // Nothing here holds the block: the sender may free it.
            counter.fetch_sub(1, Ordering::AcqRel);
            return Err(e);
        }
    };
    crate::lock(&mapping.counters).push(counter);
    let on = ipc_stream(ordinal)?;
    Ok((mapping, on, wait_for_writer(wire, on, ordinal)?))
}

fn map_block(
    wire: &Wire,
    ordinal: u32,
    pool_fd: Option<std::os::fd::OwnedFd>,
) -> Result<Arc<Mapping>> {
    let key = (wire.nonce, wire.pointer);
    let new = |ptr, own| Mapping {
        ptr,
        size: wire.size as usize,
        ordinal,
        key,
        own,
        counters: Mutex::new(Vec::new()),
    };
    if is_own(wire) {
        return Ok(Arc::new(new(wire.base, true)));
    }
    loop {
        let mut mapped = crate::lock(&MAPPED);
        let map = mapped.get_or_insert_with(HashMap::new);
        match map.get(&key).map(Weak::upgrade) {
            Some(Some(mapping)) => return Ok(mapping),
            // Its release is queued: map it again once that has freed the old mapping.
            Some(None) => {
                drop(mapped);
                free::drain();
                continue;
            }
            None => {}
        }
        let pool = imported_pool(wire, ordinal, pool_fd)?;
        let mut data = sys::CUmemPoolPtrExportData {
            reserved: wire.pointer,
        };
        let mut ptr = 0u64;
        // SAFETY: an imported pool and export data from its exporter; out-pointer to a local.
        let r = unsafe { sys::cuMemPoolImportPointer(&mut ptr, pool, &mut data) };
        check(r.result(), "mapping another process's device memory")?;
        let mapping = Arc::new(new(ptr, false));
        map.insert(key, Arc::downgrade(&mapping));
        return Ok(mapping);
    }
}

/// Pools imported from other processes, by exporter and device (kept for the process).
static IMPORTED: Mutex<Vec<((u64, u32), usize)>> = Mutex::new(Vec::new());

/// Whether the pool of `wire`'s block is still to be imported here (its file descriptor is
/// needed).
pub fn needs_pool(wire: &Wire) -> Result<bool> {
    if is_own(wire) {
        return Ok(false);
    }
    let ordinal = ordinal_of(&wire.uuid)?;
    Ok(!crate::lock(&IMPORTED)
        .iter()
        .any(|(k, _)| *k == (wire.nonce, ordinal)))
}

/// The exporter's pool of `wire`, imported once per exporting process and device.
fn imported_pool(
    wire: &Wire,
    ordinal: u32,
    fd: Option<std::os::fd::OwnedFd>,
) -> Result<sys::CUmemoryPool> {
    use std::os::fd::AsRawFd;
    let mut pools = crate::lock(&IMPORTED);
    if let Some(&(_, pool)) = pools.iter().find(|(k, _)| *k == (wire.nonce, ordinal)) {
        return Ok(pool as sys::CUmemoryPool);
    }
    let fd =
        fd.ok_or_else(|| Error::invalid("the memory pool's file descriptor did not arrive"))?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: a POSIX file descriptor of an exported pool, passed by value as the handle; the
    // driver does not take it (it is closed when `fd` drops).
    let r = unsafe {
        sys::cuMemPoolImportFromShareableHandle(
            &mut pool,
            fd.as_raw_fd() as usize as *mut std::ffi::c_void,
            POSIX_FD,
            0,
        )
    };
    check(r.result(), "importing another process's memory pool")?;
    pools.push(((wire.nonce, ordinal), pool as usize));
    Ok(pool)
}

/// An event after the exporter's last write of the block: cubridge's stream waits for the
/// exporter's interprocess event and records one of its own, which consumers wait for. `None`
/// where the exporter sent no event (its write was complete).
fn wait_for_writer(wire: &Wire, on: Stream, ordinal: u32) -> Result<Option<Event>> {
    if is_own(wire) {
        // This process's own event, which the receipt keeps parked.
        let event = parked_event(wire.slot)
            .ok_or_else(|| Error::invalid("this process no longer holds the array it sent"))?;
        let Some(event) = event else {
            return Ok(None);
        };
        // SAFETY: a live event of this device and a live stream of the current context.
        let waited = unsafe { sys::cuStreamWaitEvent(on.handle(), event as sys::CUevent, 0) };
        check(waited.result(), "ordering after the sender's write")?;
        return Event::record(on, ordinal).map(Some);
    }
    let Some(handle) = wire.event else {
        return Ok(None);
    };
    let handle = sys::CUipcEventHandle {
        reserved: handle.map(|b| b as std::ffi::c_char),
    };
    let mut event: sys::CUevent = std::ptr::null_mut();
    // SAFETY: a handle from the exporter, whose event lives until this process lowers the
    // count; out-pointer to a local.
    let r = unsafe { sys::cuIpcOpenEventHandle(&mut event, handle) };
    check(r.result(), "opening another process's event")?;
    // SAFETY: an opened event and a live stream of the current context.
    let waited = unsafe { sys::cuStreamWaitEvent(on.handle(), event, 0) };
    // The wait holds what it needs: the opened handle can go at once.
    destroy_event(event as usize, ordinal);
    check(waited.result(), "ordering after another process's write")?;
    Event::record(on, ordinal).map(Some)
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let release = Release {
            ptr: (!self.own).then_some(self.ptr),
            ordinal: self.ordinal,
            key: self.key,
            counters: std::mem::take(self.counters.get_mut().unwrap_or_else(|p| p.into_inner())),
        };
        // After the device has run everything queued, on the background thread.
        free::drop_after_device(self.ordinal, Box::new(release));
    }
}

/// Frees a mapping (none for a block of this process's own), then lowers the exporter's
/// counts, as it drops.
struct Release {
    ptr: Option<u64>,
    ordinal: u32,
    key: BlockKey,
    counters: Vec<&'static AtomicU64>,
}

impl Drop for Release {
    fn drop(&mut self) {
        let _restore = context::Restore::new();
        if let Some(ptr) = self.ptr.filter(|_| context::bind(self.ordinal).is_ok()) {
            // SAFETY: a mapping made by `map_block`, freed once, after the device has run the
            // work queued before it was let go.
            let _ = unsafe { sys::cuMemFree_v2(ptr) };
        }
        let mut mapped = crate::lock(&MAPPED);
        if let Some(map) = mapped.as_mut() {
            if map.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
                map.remove(&self.key);
            }
        }
        drop(mapped);
        for counter in &self.counters {
            counter.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
