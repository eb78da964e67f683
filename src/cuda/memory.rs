//! CUDA allocations: device memory from each device's stream-ordered pool, pinned host memory,
//! and managed memory, as one type ([`CudaAlloc`]); plus copies and pointer queries.
//!
//! Device memory is allocated with `cuMemAllocFromPoolAsync` from the device's *current* pool
//! (the one PyTorch's `cudaMallocAsync` backend and CuPy's `MemoryAsyncPool` use, so the three
//! share what it holds), on the stream whose work will use it first. The pool's release
//! threshold is raised to the maximum once per device, so memory freed into it is reused
//! without driver round trips instead of being handed back at every synchronize. Freeing is
//! stream-ordered too and never waits on the host: see [`super::free`]. A device without pool
//! support falls back to `cuMemAlloc` and a synchronous `cuMemFree` (on a background thread).
//!
//! A process's first allocation from a pool costs the driver 7 to 12 ms (an H100 with torch
//! initialised; later ones take microseconds), which would be most of a first `add`'s time. So
//! the first lookup of a device's pool starts that first allocation on a thread of its own, and
//! until it has finished, allocations on that device come from `cuMemAlloc` (0.2 to 0.3 ms for
//! the first, less after), freed like those of a device without pools.

use super::free::{self, Uses};
use super::stream::{Stream, LEGACY};
use super::{check, context};
use crate::device::Device;
use crate::error::{Error, Result};
use cudarc::driver::{result, sys};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The address of an empty allocation: aligned for any element, never dereferenced.
const EMPTY_ADDRESS: usize = 64;

/// What kind of CUDA memory an allocation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// Device memory on one device.
    Device {
        /// The device.
        ordinal: u32,
        /// Whether it came from the device's pool (else from `cuMemAlloc`).
        pooled: bool,
    },
    /// Page-locked host memory.
    Pinned,
    /// Managed (unified) memory.
    Managed,
}

/// A CUDA allocation, freed exactly once when dropped, ordered after every use recorded with
/// [`CudaAlloc::set_uses`] (see [`super::free`]).
pub struct CudaAlloc {
    ptr: u64,
    bytes: usize,
    kind: MemoryKind,
    uses: Uses,
    /// Its `cuMemPoolExportPointer` data, once it has been sent to another process, reused for
    /// later sends (the driver call costs tens of microseconds). The data names the allocation:
    /// the driver's documentation does not say it is the same on every call, but it was in
    /// every measurement (`benches/ipc_floor.py` counts it), while a new allocation at the same
    /// address got new data each time.
    export_data: std::sync::OnceLock<[u8; 64]>,
}

// SAFETY: an allocation is a plain address owned uniquely; freeing binds the right context on
// whichever thread does it.
unsafe impl Send for CudaAlloc {}
// SAFETY: as above; shared references only read the address.
unsafe impl Sync for CudaAlloc {}

/// Each device's pool (`None`: the device has no pool support), looked up once.
static POOLS: Mutex<Vec<Option<Option<usize>>>> = Mutex::new(Vec::new());

/// The current memory pool of device `ordinal`, or `None` where the device has no pool support.
/// The first call per device raises the pool's release threshold to the maximum.
pub fn pool(ordinal: u32) -> Result<Option<sys::CUmemoryPool>> {
    let pool = context::per_device(&POOLS, ordinal, || find_pool(ordinal))?;
    Ok(pool.map(|p| p as sys::CUmemoryPool))
}

fn find_pool(ordinal: u32) -> Result<Option<usize>> {
    let supported = context::attribute(
        ordinal,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
    )
    .unwrap_or(0)
        != 0;
    if !supported {
        return Ok(None);
    }
    let dev = check(result::device::get(ordinal as i32), "looking up the device")?;
    // SAFETY: `dev` is a valid device handle.
    let pool = check(
        unsafe { result::device::get_mem_pool(dev) },
        "looking up the device's memory pool",
    )?;
    let mut threshold = u64::MAX;
    // SAFETY: a live pool; RELEASE_THRESHOLD takes a u64, which `threshold` is.
    let raised = unsafe {
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    };
    check(raised, "raising the memory pool's release threshold")?;
    share_with_peers(ordinal, pool);
    warm(ordinal, pool);
    Ok(Some(pool as usize))
}

/// Makes the memory of `pool` (device `ordinal`'s) readable and writable by every other device
/// that can reach it (`cuDeviceCanAccessPeer`), so that copies between devices, cubridge's and
/// other libraries' of exported arrays, go device to device. Pool memory does not follow the
/// contexts' peer access; without this a peer copy is staged by the driver, or refused.
/// Best effort: where the driver refuses, the pool stays as it was.
fn share_with_peers(ordinal: u32, pool: sys::CUmemoryPool) {
    let peers = (0..super::device_count() as u32).filter(|&p| p != ordinal);
    let map: Vec<sys::CUmemAccessDesc> = peers
        .filter(|&p| can_access_peer(p, ordinal))
        .map(|p| sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: p as i32,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        })
        .collect();
    if !map.is_empty() {
        // SAFETY: a live pool; `map` holds `map.len()` initialised descriptors of devices.
        let _ = unsafe { sys::cuMemPoolSetAccess(pool, map.as_ptr(), map.len()) };
    }
}

/// Whether device `device` can address device `peer`'s memory directly.
pub fn can_access_peer(device: u32, peer: u32) -> bool {
    let mut can = 0;
    let (Ok(d), Ok(p)) = (
        result::device::get(device as i32),
        result::device::get(peer as i32),
    ) else {
        return false;
    };
    // SAFETY: two valid device handles; `can` is a writable int.
    let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, d, p) };
    r == sys::CUresult::CUDA_SUCCESS && can != 0
}

/// Lets device `from`'s primary context address device `to`'s memory allocated outside pools
/// (`cuCtxEnablePeerAccess`, as torch does before its copies between devices), once per pair,
/// where the hardware allows; a copy between them then needs no staging. Best effort: access
/// another library enabled first, or a refusal, leaves copies working as the driver does them.
fn enable_peer_access(from: u32, to: u32) -> Result<()> {
    static ENABLED: Mutex<Vec<(u32, u32)>> = Mutex::new(Vec::new());
    let mut enabled = crate::lock(&ENABLED);
    if enabled.contains(&(from, to)) {
        return Ok(());
    }
    if can_access_peer(from, to) {
        let peer = context::primary(to)?;
        context::bind(from)?;
        // SAFETY: `from`'s primary context is current and `peer` is a retained primary context.
        let _ = unsafe { sys::cuCtxEnablePeerAccess(peer, 0) };
    }
    enabled.push((from, to));
    Ok(())
}

/// Bit `n` is set while the pool of device `n` makes its first allocation on the warming thread
/// (devices from 64 on are not warmed: their first allocation pays the set-up itself).
static WARMING: AtomicU64 = AtomicU64::new(0);

fn warming(ordinal: u32) -> bool {
    ordinal < 64 && WARMING.load(Ordering::Acquire) & (1 << ordinal) != 0
}

/// Starts the pool's first allocation (and its free) on a thread of its own. Whatever happens
/// there, the bit is cleared when it ends, and allocations go to the pool from then on.
fn warm(ordinal: u32, pool: sys::CUmemoryPool) {
    if ordinal >= 64 {
        return;
    }
    let bit = 1u64 << ordinal;
    WARMING.fetch_or(bit, Ordering::AcqRel);
    let pool = pool as usize;
    let spawned = std::thread::Builder::new()
        .name("cubridge-pool".into())
        .spawn(move || {
            // Its calls are on a stream of cubridge's, outside any capture another thread runs.
            let _relaxed = super::stream::RelaxedCapture::new();
            let _ = first_allocation(ordinal, pool as sys::CUmemoryPool);
            WARMING.fetch_and(!bit, Ordering::AcqRel);
        });
    if spawned.is_err() {
        WARMING.fetch_and(!bit, Ordering::AcqRel);
    }
}

fn first_allocation(ordinal: u32, pool: sys::CUmemoryPool) -> Result<()> {
    context::bind(ordinal)?;
    let stream = free::free_stream(ordinal)?;
    // SAFETY: a live pool of this device and a live stream of its (now current) context.
    let ptr = unsafe { result::mem_pool::alloc_async(pool, 256, stream.handle()) };
    let ptr = check(ptr, "allocating device memory")?;
    // SAFETY: the block just allocated on `stream`, used by nothing, freed once, on that stream.
    let r = unsafe { sys::cuMemFreeAsync(ptr, stream.handle()) };
    check(r.result(), "freeing device memory")
}

/// Bytes cubridge holds on each device (allocated and not yet handed back), and the most it
/// ever held, by ordinal.
static IN_USE: Mutex<Vec<(u64, u64, u64)>> = Mutex::new(Vec::new());
/// Allocations made, all devices (for `memory_stats`).
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

fn count(ordinal: u32, bytes: usize, add: bool) {
    let mut table = crate::lock(&IN_USE);
    let i = ordinal as usize;
    if table.len() <= i {
        table.resize(i + 1, (0, 0, 0));
    }
    let (current, peak, allocations) = &mut table[i];
    if add {
        *current += bytes as u64;
        *peak = (*peak).max(*current);
        *allocations += 1;
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    } else {
        *current = current.saturating_sub(bytes as u64);
    }
}

/// What cubridge and the pool hold on one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes of cubridge arrays alive now (their frees not yet queued).
    pub allocated: u64,
    /// The most `allocated` has been.
    pub allocated_peak: u64,
    /// Device allocations cubridge has made.
    pub allocations: u64,
    /// Bytes the device's pool holds from the driver (in use by anyone, or cached).
    pub reserved: u64,
    /// The most `reserved` has been.
    pub reserved_peak: u64,
    /// Bytes of the pool handed out now, to cubridge and to every other user of the pool.
    pub pool_used: u64,
}

/// Memory statistics of device `ordinal`.
pub fn stats(ordinal: u32) -> Result<Stats> {
    context::bind(ordinal)?;
    let (allocated, allocated_peak, allocations) = crate::lock(&IN_USE)
        .get(ordinal as usize)
        .copied()
        .unwrap_or_default();
    let mut stats = Stats {
        allocated,
        allocated_peak,
        allocations,
        ..Stats::default()
    };
    if let Some(pool) = pool(ordinal)? {
        let read = |attr| -> Result<u64> {
            let mut value = 0u64;
            // SAFETY: a live pool; these attributes are u64 values.
            let r = unsafe {
                result::mem_pool::get_attribute(pool, attr, (&mut value as *mut u64).cast())
            };
            check(r, "reading the memory pool's statistics")?;
            Ok(value)
        };
        use sys::CUmemPool_attribute as A;
        stats.reserved = read(A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
        stats.reserved_peak = read(A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?;
        stats.pool_used = read(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
    }
    Ok(stats)
}

/// Gives the driver back what device `ordinal`'s pool holds unused. Waits for the device and for
/// cubridge's deferred frees first (an explicit request, like `torch.cuda.empty_cache()`), so
/// that everything cubridge no longer uses is in the pool to be trimmed.
pub fn empty_cache(ordinal: u32) -> Result<()> {
    super::ipc::reap();
    free::unpark_all();
    context::synchronize(ordinal)?;
    free::drain();
    super::release::flush();
    // The flush queued frees of its own: they must have run for the trim to see the memory.
    context::synchronize(ordinal)?;
    trim(ordinal)
}

fn trim(ordinal: u32) -> Result<()> {
    if let Some(pool) = pool(ordinal)? {
        // SAFETY: a live pool.
        let trimmed = unsafe { result::mem_pool::trim_to(pool, 0) };
        check(trimmed, "trimming the memory pool")?;
    }
    Ok(())
}

/// Called, once per failed allocation, to ask other libraries in the process (PyTorch, CuPy) to
/// give their cached device memory back; set by the Python module.
static OUT_OF_MEMORY_HOOK: Mutex<Option<fn()>> = Mutex::new(None);

/// Sets the hook that asks other libraries to release their caches before an allocation fails.
pub fn set_out_of_memory_hook(hook: fn()) {
    *crate::lock(&OUT_OF_MEMORY_HOOK) = Some(hook);
}

fn is_oom(e: &Error) -> bool {
    e.cuda_code() == Some(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)
}

/// The driver's out-of-memory error of an allocation of `bytes` on `device` as
/// [`Error::OutOfMemory`]; any other error as it is.
pub(super) fn out_of_memory(bytes: usize, device: Device) -> impl Fn(Error) -> Error {
    move |e| match is_oom(&e) {
        true => Error::OutOfMemory {
            bytes,
            device: device.to_string(),
        },
        false => e,
    }
}

/// Runs `alloc`; when it fails for lack of memory, gives memory back and tries again: first
/// what the pool holds unused, then (after waiting for the device, so that queued frees have
/// happened) also what other libraries cache.
fn with_retries<T>(ordinal: u32, mut alloc: impl FnMut() -> Result<T>) -> Result<T> {
    match alloc() {
        Err(e) if is_oom(&e) => {}
        done => return done,
    }
    free::unpark_all();
    trim(ordinal)?;
    match alloc() {
        Err(e) if is_oom(&e) => {}
        done => return done,
    }
    let hook = *crate::lock(&OUT_OF_MEMORY_HOOK);
    if let Some(hook) = hook {
        hook();
    }
    empty_cache(ordinal)?;
    context::bind(ordinal)?;
    alloc()
}

impl CudaAlloc {
    /// Allocates `bytes` of device memory on `ordinal`, usable by work queued on `stream`
    /// (DLPack numbering) from now on, zeroed there if asked. Other streams must be ordered
    /// after `stream` first (the caller records the allocation as `stream`'s pending write).
    pub fn device(bytes: usize, ordinal: u32, stream: Stream, zeroed: bool) -> Result<CudaAlloc> {
        context::bind(ordinal)?;
        let mut kind = MemoryKind::Device {
            ordinal,
            pooled: true,
        };
        if bytes == 0 {
            return Ok(CudaAlloc::new(0, 0, kind));
        }
        let device = Device::Cuda(ordinal);
        // Blocks that other processes have let go of are freed before more is taken.
        super::ipc::reap();
        // While the pool's set-up runs on its thread, `cuMemAlloc` answers at once. Sharing
        // with other processes takes memory from a pool that can be exported instead.
        let pool = match super::ipc::allocation_pool(ordinal)? {
            Some(shareable) => Some(shareable),
            None => pool(ordinal)?.filter(|_| !warming(ordinal)),
        };
        let handle = stream.handle();
        // Blocks parked for this stream go back to the pool on it first, for this to reuse.
        free::unpark(ordinal, stream);
        let ptr = with_retries(ordinal, || match pool {
            // SAFETY: a live pool of this device; `handle` is a live stream of the current
            // context (the caller's); the result is checked.
            Some(pool) => check(
                unsafe { result::mem_pool::alloc_async(pool, bytes, handle) },
                "allocating device memory",
            ),
            // SAFETY: a context is current; the result is checked.
            None => check(
                unsafe { result::malloc_sync(bytes) },
                "allocating device memory",
            ),
        })
        .map_err(out_of_memory(bytes, device))?;
        if pool.is_none() {
            kind = MemoryKind::Device {
                ordinal,
                pooled: false,
            };
        }
        let alloc = CudaAlloc::new(ptr, bytes, kind);
        count(ordinal, bytes, true);
        if zeroed {
            // SAFETY: `ptr` addresses `bytes` bytes allocated for work on `handle`, queued there.
            let zeroing = unsafe { sys::cuMemsetD8Async(ptr, 0, bytes, handle) };
            check(zeroing.result(), "zeroing device memory")?;
        }
        Ok(alloc)
    }

    /// Allocates `bytes` of device memory on `ordinal` outside the pool, with `cuMemAlloc`, ready
    /// for any stream on return. For memory taken while a graph is being captured (the caller
    /// has the thread in the relaxed capture mode): no stream is touched, and the memory serves
    /// every replay. Freed after waiting for the device, on the background thread.
    pub fn device_outside_pool(bytes: usize, ordinal: u32) -> Result<CudaAlloc> {
        context::bind(ordinal)?;
        let kind = MemoryKind::Device {
            ordinal,
            pooled: false,
        };
        if bytes == 0 {
            return Ok(CudaAlloc::new(0, 0, kind));
        }
        // SAFETY: a context is current; the result is checked.
        let ptr = unsafe { result::malloc_sync(bytes) };
        let ptr = check(ptr, "allocating device memory")
            .map_err(out_of_memory(bytes, Device::Cuda(ordinal)))?;
        count(ordinal, bytes, true);
        Ok(CudaAlloc::new(ptr, bytes, kind))
    }

    /// Allocates `bytes` of host memory the device reads, zeroed if asked: page-locked memory
    /// for `Device::CudaHost`, managed memory for `Device::CudaManaged`.
    pub fn host_visible(bytes: usize, device: Device, zeroed: bool) -> Result<CudaAlloc> {
        context::bind(0)?;
        let managed = device == Device::CudaManaged;
        let kind = match managed {
            false => MemoryKind::Pinned,
            true => MemoryKind::Managed,
        };
        if bytes == 0 {
            return Ok(CudaAlloc::new(0, 0, kind));
        }
        let ptr = with_retries(0, || match managed {
            // SAFETY: a context is current; flags 0 is plain pinned memory.
            false => check(
                unsafe { result::malloc_host(bytes, 0) },
                "allocating pinned memory",
            )
            .map(|p| p as u64),
            // SAFETY: a context is current; global attachment makes it usable from any stream.
            true => check(
                unsafe {
                    result::malloc_managed(bytes, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL)
                },
                "allocating managed memory",
            ),
        })
        .map_err(out_of_memory(bytes, device))?;
        if zeroed {
            // SAFETY: both kinds are host-accessible, `bytes` long; nothing else uses them yet.
            unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, bytes) };
        }
        Ok(CudaAlloc::new(ptr, bytes, kind))
    }

    fn new(ptr: u64, bytes: usize, kind: MemoryKind) -> CudaAlloc {
        CudaAlloc {
            ptr,
            bytes,
            kind,
            uses: Uses::default(),
            export_data: std::sync::OnceLock::new(),
        }
    }

    /// The address (device, or host for pinned and managed memory). An empty allocation has an
    /// aligned address that is never dereferenced.
    pub fn as_ptr(&self) -> *mut u8 {
        if self.ptr == 0 {
            EMPTY_ADDRESS as *mut u8
        } else {
            self.ptr as *mut u8
        }
    }

    /// The allocation's start and size in bytes, as the allocator returned them.
    pub fn block(&self) -> (u64, usize) {
        (self.ptr, self.bytes)
    }

    /// The export data of this allocation for other processes, kept once made (see
    /// [`super::ipc::export`]); it lives and dies with the allocation, since a later allocation
    /// at the same address has data of its own.
    pub fn export_data(&self) -> &std::sync::OnceLock<[u8; 64]> {
        &self.export_data
    }

    /// What kind of memory this is.
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }

    /// The work the free must follow: the buffer's last write and the streams its consumers
    /// declared (set by the buffer as it goes).
    pub fn set_uses(&mut self, uses: Uses) {
        self.uses = uses;
    }
}

impl Drop for CudaAlloc {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        if let MemoryKind::Device { ordinal, .. } = self.kind {
            count(ordinal, self.bytes, false);
        }
        free::free(
            self.ptr,
            self.bytes,
            self.kind,
            std::mem::take(&mut self.uses),
        );
    }
}

/// Copies `bytes` from `src` to `dst` (any mix of host and device addresses, by unified
/// addressing) on `stream`, then waits for that stream, so the copy is ordered after the work
/// already queued there and complete on return.
///
/// # Safety
/// Both ranges are valid for `bytes` and do not overlap.
pub unsafe fn copy_sync(
    dst: *mut u8,
    src: *const u8,
    bytes: usize,
    ordinal: u32,
    stream: Stream,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { copy_async(dst, src, bytes, ordinal, stream)? };
    check(
        // SAFETY: a live stream of the context `copy_async` bound.
        unsafe { result::stream::synchronize(stream.handle()) },
        "waiting for a copy",
    )
}

/// Queues a copy of `bytes` from `src` to `dst` on `stream` of device `ordinal` without waiting.
///
/// # Safety
/// Both ranges are valid for `bytes` and do not overlap, and stay valid until the copy has run
/// (the caller keeps them alive, or their frees are ordered after `stream`).
pub unsafe fn copy_async(
    dst: *mut u8,
    src: *const u8,
    bytes: usize,
    ordinal: u32,
    stream: Stream,
) -> Result<()> {
    context::bind(ordinal)?;
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract; a context is current.
    check(
        unsafe { sys::cuMemcpyAsync(dst as u64, src as u64, bytes, stream.handle()).result() },
        "copying memory",
    )
}

/// Queues a copy of `bytes` from `src` (memory of device `src_ordinal`) to `dst` (of device
/// `dst_ordinal`) on `stream` of `src_ordinal`, device to device (`cuMemcpyPeerAsync`, with the
/// devices' peer access enabled where the hardware allows), without waiting.
///
/// # Safety
/// Both ranges are valid for `bytes` and do not overlap, and stay valid until the copy has run;
/// `dst` may be written once the work queued so far on `stream` has run.
pub unsafe fn copy_peer_async(
    (dst, dst_ordinal): (*mut u8, u32),
    (src, src_ordinal): (*const u8, u32),
    bytes: usize,
    stream: Stream,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    enable_peer_access(src_ordinal, dst_ordinal)?;
    let (dst_ctx, src_ctx) = (
        context::primary(dst_ordinal)?,
        context::primary(src_ordinal)?,
    );
    context::bind(src_ordinal)?;
    // SAFETY: the caller's contract; both contexts are retained primary contexts, the source's
    // current, whose stream `stream` is.
    let r = unsafe {
        sys::cuMemcpyPeerAsync(
            dst as u64,
            dst_ctx,
            src as u64,
            src_ctx,
            bytes,
            stream.handle(),
        )
    };
    check(r.result(), "copying memory between devices")
}

/// Sets `n` elements of `itemsize` bytes at `dst` (device memory of `ordinal`) to the element
/// whose bytes are `value[..itemsize]`, with memsets queued on `stream`: no host staging, no
/// wait. Elements of 8 and 16 bytes whose 4-byte words differ are set word by word, each word
/// of every element in one strided (2-D) memset.
///
/// # Safety
/// `dst` addresses `n * itemsize` bytes of device memory, 4-byte aligned for elements of 4 bytes
/// or more, that stay valid until the memsets have run.
pub unsafe fn fill_async(
    dst: *mut u8,
    n: usize,
    value: &[u8],
    ordinal: u32,
    stream: Stream,
) -> Result<()> {
    context::bind(ordinal)?;
    let itemsize = value.len();
    let (dst, h) = (dst as u64, stream.handle());
    let word = |i: usize| u32::from_ne_bytes([value[i], value[i + 1], value[i + 2], value[i + 3]]);
    let words: Vec<u32> = (0..itemsize / 4).map(|k| word(4 * k)).collect();
    // SAFETY: the caller's contract; every memset below stays inside n * itemsize bytes.
    let r = unsafe {
        match itemsize {
            1 => sys::cuMemsetD8Async(dst, value[0], n, h),
            2 => sys::cuMemsetD16Async(dst, u16::from_ne_bytes([value[0], value[1]]), n, h),
            4 => sys::cuMemsetD32Async(dst, words[0], n, h),
            _ if words.iter().all(|&w| w == words[0]) => {
                sys::cuMemsetD32Async(dst, words[0], n * words.len(), h)
            }
            _ => {
                for (k, &w) in words.iter().enumerate() {
                    let r = sys::cuMemsetD2D32Async(dst + 4 * k as u64, itemsize, w, 1, n, h);
                    if r != sys::CUresult::CUDA_SUCCESS {
                        return check(r.result(), "filling device memory");
                    }
                }
                sys::CUresult::CUDA_SUCCESS
            }
        }
    };
    check(r.result(), "filling device memory")
}

/// The device that owns `ptr`, by asking the driver (the CUDA array interface carries no
/// device). Managed memory reports as its device of origin.
pub fn pointer_device(ptr: usize) -> Result<Device> {
    super::require(Device::Cuda(0))?;
    let mut ordinal: i32 = -1;
    // SAFETY: cuPointerGetAttribute writes one int for DEVICE_ORDINAL into `ordinal`.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr as u64,
        )
    };
    check(r.result(), "asking the driver which device owns a pointer").map_err(|e| {
        Error::invalid(format!(
            "{ptr:#x} is not memory the CUDA driver knows ({e})"
        ))
    })?;
    let ordinal = u32::try_from(ordinal)
        .map_err(|_| Error::invalid(format!("{ptr:#x} is not memory of a CUDA device")))?;
    Ok(Device::Cuda(ordinal))
}

/// Free and total bytes on device `ordinal`.
pub fn mem_info(ordinal: u32) -> Result<(usize, usize)> {
    context::bind(ordinal)?;
    check(result::mem_get_info(), "reading memory use")
}

/// Releases the memory of `kind` at `ptr` now, on the calling thread: a pooled block on the
/// legacy default stream, anything else with the driver's synchronous free.
///
/// # Safety
/// `ptr` is a live allocation of `kind`, freed only here, and no queued work still uses it (or,
/// for a pooled block, all such work is ordered before the legacy default stream's next work).
pub(super) unsafe fn release_now(ptr: u64, kind: MemoryKind) {
    let _restore = context::Restore::new();
    let ordinal = match kind {
        MemoryKind::Device { ordinal, .. } => ordinal,
        MemoryKind::Pinned | MemoryKind::Managed => 0,
    };
    if context::bind(ordinal).is_err() {
        // The driver is gone (interpreter exit after teardown): nothing to give back.
        return;
    }
    // SAFETY: the caller's contract; errors (a context already torn down) are ignored.
    let _ = unsafe {
        match kind {
            MemoryKind::Device { pooled: true, .. } => {
                sys::cuMemFreeAsync(ptr, LEGACY.handle()).result()
            }
            MemoryKind::Device { pooled: false, .. } | MemoryKind::Managed => {
                result::free_sync(ptr)
            }
            MemoryKind::Pinned => result::free_host(ptr as *mut c_void),
        }
    };
}
