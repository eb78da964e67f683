//! The seam below `Array`: the process-wide services of cubridge, and the table through which
//! one copy of the crate serves them to every other. An extension crate built on cubridge links
//! its own copy; once the `cubridge` Python module is loaded, that copy adopts the module's
//! table ([`adopt`]), as numpy's C API serves its extensions, so one memory pool, one releaser
//! thread, one kernel cache and one list of graph captures serve the whole process.
//!
//! [`services`] is the one accessor: it gives this copy's own implementation, or the adopted
//! table's, chosen by whether a table was adopted; no other code asks which.
//!
//! The table is plain data: function pointers and C structs. Memory crosses as a pointer with
//! an owner that the serving copy lets go of ([`Relayed`]); its uses as lent events and stream
//! numbers; programs and modules as text (a precompiled module as bytes), loaded modules as
//! their handle and lowered names; errors as their kind, code and message. Nothing of Rust's
//! layout crosses. Versions only append: the table starts with its [`VERSION`] and size, new entries
//! go at the end, and a copy built for version N takes any table of version N or later.

use super::free::{self, Uses};
use super::kernels::{self, Code, Module, Program};
use super::memory::{CudaAlloc, MemoryKind};
use super::release::{self, KeepAlive};
use super::stream::{Event, Stream, Write, LEGACY};
use crate::device::Device;
use crate::error::{Error, ErrorKind, Result};
use dlpark::ffi::{DLDevice, DLManagedTensorVersioned};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// The table's version: raised by one whenever an entry is appended.
pub const VERSION: u32 = 3;

/// This build's crate version, as the table carries it.
pub const CRATE_VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("the crate version holds a NUL"),
    };

/// The served entry points. Each fallible one returns 0 on success; on failure it fills a
/// [`Failure`] and returns -1, except `import` and `wrap`, which set a Python exception. The
/// first two fields keep their place in every version; entries are only appended.
#[repr(C)]
pub struct Table {
    /// [`VERSION`] of the copy that serves the table.
    pub version: u32,
    /// Its crate version, NUL-terminated.
    pub crate_version: *const c_char,
    /// The table's size in bytes, as served.
    pub size: usize,
    /// Device, pinned or managed memory; the block's owner is released with `release`.
    pub allocate: unsafe extern "C" fn(*const Request, *mut Block, *mut Failure) -> i32,
    /// Lets go of a block's owner after the uses given (lent for the call).
    pub release: unsafe extern "C" fn(*mut c_void, *const LentUses),
    /// Loads a program on a device, writing its functions' handles, one per name asked for.
    pub program: unsafe extern "C" fn(u32, *const ProgramText, *mut usize, *mut Failure) -> i32,
    /// Calls `release(context)` once the work queued so far on the stream (DLPack number) of
    /// the device has run.
    pub keep_alive: unsafe extern "C" fn(
        u32,
        usize,
        *mut c_void,
        unsafe extern "C" fn(*mut c_void),
        *mut Failure,
    ) -> i32,
    /// Notes that a stream (DLPack number) of a device is capturing a graph.
    pub note_capture: unsafe extern "C" fn(u32, usize),
    /// Frees a failure's text.
    pub free_text: unsafe extern "C" fn(*mut c_char),
    /// Imports a Python object (a borrowed reference) as a kernel's argument, with the
    /// interpreter attached.
    pub import: unsafe extern "C" fn(*mut c_void, *mut ImportReply) -> i32,
    /// A new `cubridge.Array` (a new reference) over a tensor, with its last write; takes the
    /// tensor and the write in every case.
    pub wrap: unsafe extern "C" fn(*mut DLManagedTensorVersioned, Written) -> *mut c_void,
    /// Version 3: loads a module on a device, writing its `CUmodule` and, one per name
    /// expression asked for, its lowered name (the serving copy's text, kept for the process).
    pub module:
        unsafe extern "C" fn(u32, *const ModuleText, *mut usize, *mut Text, *mut Failure) -> i32,
}

// SAFETY: the table is immutable plain data: function pointers and a pointer to a static string.
unsafe impl Sync for Table {}

impl Table {
    /// The table this copy serves, with the interpreter's entries of the Python layer.
    pub const fn served(
        import: unsafe extern "C" fn(*mut c_void, *mut ImportReply) -> i32,
        wrap: unsafe extern "C" fn(*mut DLManagedTensorVersioned, Written) -> *mut c_void,
    ) -> Table {
        Table {
            version: VERSION,
            crate_version: CRATE_VERSION.as_ptr(),
            size: std::mem::size_of::<Table>(),
            allocate: serve::allocate,
            release: serve::release,
            program: serve::program,
            keep_alive: serve::keep_alive,
            note_capture: serve::note_capture,
            free_text: serve::free_text,
            import,
            wrap,
            module: serve::module,
        }
    }
}

/// What `allocate` is asked for.
#[repr(C)]
pub struct Request {
    pub bytes: usize,
    pub device: DLDevice,
    /// The stream the memory is for (DLPack number).
    pub stream: usize,
    pub zeroed: bool,
    /// For a graph being captured on the stream: memory from outside the pool.
    pub capture: bool,
}

/// Memory that `allocate` made: its address, kind ([`MemoryKind`] as `kind_code` numbers
/// it) and owner.
#[repr(C)]
pub struct Block {
    pub ptr: u64,
    pub kind: u32,
    pub ordinal: u32,
    pub owner: *mut c_void,
}

/// A write lent for a call: its stream (DLPack number) and event handle (0 for none).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LentWrite {
    pub stream: usize,
    pub event: usize,
}

/// The uses a free must follow, lent for a call (see [`Uses`]).
#[repr(C)]
pub struct LentUses {
    pub write: LentWrite,
    pub kernels: *const LentWrite,
    pub n_kernels: usize,
    pub streams: *const usize,
    pub n_streams: usize,
    pub unknown: bool,
}

/// UTF-8 text (or, for an image, bytes) lent for a call.
#[repr(C)]
pub struct Text {
    pub ptr: *const u8,
    pub len: usize,
}

impl Text {
    /// `bytes`, lent for a call.
    fn of(bytes: &[u8]) -> Text {
        Text {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        }
    }

    /// The lent bytes.
    ///
    /// # Safety
    /// `ptr` holds `len` readable bytes (or `len` is 0) for the borrow.
    unsafe fn bytes(&self) -> &[u8] {
        match self.len {
            0 => &[],
            // SAFETY: the caller's contract.
            n => unsafe { std::slice::from_raw_parts(self.ptr, n) },
        }
    }

    /// The lent text, copied (invalid UTF-8 replaced).
    ///
    /// # Safety
    /// As [`Text::bytes`].
    unsafe fn owned(&self) -> String {
        // SAFETY: the caller's contract.
        String::from_utf8_lossy(unsafe { self.bytes() }).into_owned()
    }
}

/// `n` lent entries from `p` (none where `n` is 0).
///
/// # Safety
/// `p` holds `n` readable entries for the borrow.
unsafe fn lent_list<'a, T>(p: *const T, n: usize) -> &'a [T] {
    match n {
        0 => &[],
        // SAFETY: the caller's contract.
        n => unsafe { std::slice::from_raw_parts(p, n) },
    }
}

/// A program lent for a call (see [`Program`]).
#[repr(C)]
pub struct ProgramText {
    pub name: Text,
    pub source: Text,
    pub options: *const Text,
    pub n_options: usize,
    pub functions: *const Text,
    pub n_functions: usize,
}

/// A module lent for a call (see [`Code`]): CUDA C++ (`image` false) with its name, options
/// and name expressions, or a precompiled image (`image` true; the other lists empty).
#[repr(C)]
pub struct ModuleText {
    pub image: bool,
    pub name: Text,
    /// The source, or the image's bytes.
    pub code: Text,
    pub options: *const Text,
    pub n_options: usize,
    pub name_expressions: *const Text,
    pub n_name_expressions: usize,
}

/// What `import` hands back.
#[repr(C)]
pub struct ImportReply {
    /// The array; the caller's to delete.
    pub tensor: *mut DLManagedTensorVersioned,
    /// The producer's current work stream (DLPack number), 0 where it names none.
    pub work_stream: usize,
    /// Its last write, where it may still be running.
    pub write: Written,
}

/// A failed call: an [`ErrorKind`], a result code where a driver or NVRTC call failed, and the
/// serving copy's message (freed with `free_text`).
#[repr(C)]
pub struct Failure {
    pub kind: u32,
    pub has_code: bool,
    pub code: i64,
    pub text: *mut c_char,
}

impl Failure {
    fn empty() -> Failure {
        Failure {
            kind: 0,
            has_code: false,
            code: 0,
            text: std::ptr::null_mut(),
        }
    }
}

/// An array's last CUDA write as it crosses the table: the stream (DLPack number; 0 for none)
/// and, off the legacy default stream, the event after it, lent with what keeps it alive. The
/// event, never the stream, is waited for: the stream's owner may have destroyed it since.
#[repr(C)]
pub struct Written {
    pub stream: usize,
    /// The event's handle, 0 for a write on the legacy default stream that has none yet.
    pub event: usize,
    pub context: *mut c_void,
    pub release: Option<unsafe extern "C" fn(*mut c_void)>,
}

impl Written {
    /// No write pending.
    pub const NONE: Written = Written {
        stream: 0,
        event: 0,
        context: std::ptr::null_mut(),
        release: None,
    };

    /// `write` where it may still be running (an event already seen done is not lent). The
    /// event is not queried: it may have been recorded into a graph being captured, whose
    /// capture a query would invalidate.
    pub fn lend(write: Option<Write>) -> Written {
        let Some(w) = write else {
            return Written::NONE;
        };
        match w.event {
            Some(e) if e.seen_done() => Written::NONE,
            Some(e) => {
                let raw = e.raw();
                let (context, release) = lend(e);
                Written {
                    stream: w.stream.handle() as usize,
                    event: raw,
                    context,
                    release: Some(release),
                }
            }
            None => Written {
                stream: w.stream.handle() as usize,
                ..Written::NONE
            },
        }
    }

    /// The write as this copy records it on memory of `device`, taken over (its event let go
    /// of once); `None` where nothing is pending there.
    ///
    /// # Safety
    /// The write came from [`Written::lend`] in some copy of cubridge, for memory on `device`.
    pub unsafe fn take(self, device: Device) -> Option<Write> {
        let this = std::mem::ManuallyDrop::new(self);
        let owner = this.release.map(|r| Lent(this.context, r));
        match (device, this.stream, owner) {
            (_, 0, _) => None,
            (Device::Cuda(n), s, Some(owner)) if this.event != 0 => {
                // SAFETY: a recorded event of this device, kept by `owner` (the caller's
                // contract); lent events are never recorded again.
                let event = unsafe { Event::lent(this.event, n, Box::new(owner)) };
                Some(Write {
                    stream: Stream::from_handle(s),
                    event: Some(Arc::new(event)),
                })
            }
            (Device::Cuda(_), _, _) => Some(Write {
                stream: LEGACY,
                event: None,
            }),
            _ => None,
        }
    }
}

/// A write that was never taken lets go of its event.
impl Drop for Written {
    fn drop(&mut self) {
        if let Some(release) = self.release {
            drop(Lent(self.context, release));
        }
    }
}

/// A value one copy of cubridge lends another: a context and the function that lets go of it,
/// called once when the borrower drops this.
struct Lent(*mut c_void, unsafe extern "C" fn(*mut c_void));

// SAFETY: the lender hands over only `Send` values, and its release function may run on any
// thread.
unsafe impl Send for Lent {}
// SAFETY: the value is never reached through a shared reference, only dropped.
unsafe impl Sync for Lent {}

impl Drop for Lent {
    fn drop(&mut self) {
        // SAFETY: the lender's release function with its context, called once.
        unsafe { (self.1)(self.0) }
    }
}

/// Lends `value` across the table.
fn lend<T: Send + 'static>(value: T) -> (*mut c_void, unsafe extern "C" fn(*mut c_void)) {
    unsafe extern "C" fn release<T>(context: *mut c_void) {
        // SAFETY: the box made below, released once.
        drop(unsafe { Box::from_raw(context.cast::<T>()) });
    }
    (Box::into_raw(Box::new(value)).cast(), release::<T>)
}

/// What an allocation is for.
pub struct Need {
    pub bytes: usize,
    /// A CUDA device, pinned or managed memory.
    pub device: Device,
    /// The stream the memory is for.
    pub stream: Stream,
    pub zeroed: bool,
    /// For a graph being captured on the stream: memory from outside the pool.
    pub capture: bool,
}

/// CUDA memory: this copy's own allocation, or one that the serving copy made and owns.
pub enum Memory {
    Own(CudaAlloc),
    Relayed(Relayed),
}

/// The process-wide services, as this copy reaches them.
pub struct Services {
    /// CUDA memory for a [`Need`].
    pub allocate: fn(&Need) -> Result<Memory>,
    /// The functions of a program on a device, compiled and loaded once per process.
    pub program: fn(u32, &Program) -> Result<&'static [usize]>,
    /// A module on a device, compiled and loaded once per process.
    pub module: fn(u32, &Code) -> Result<&'static Module>,
    /// Keeps the values alive until the work queued so far on the stream of the device has
    /// run (the event follows that work; `None` on the legacy default stream).
    pub keep_alive: fn(Option<Arc<Event>>, Vec<KeepAlive>, Stream, u32),
    /// Notes that a stream of a device is capturing a graph.
    pub note_capture: fn(u32, Stream),
}

/// This copy's own services.
static LOCAL: Services = Services {
    allocate: allocate_here,
    program: kernels::program,
    module: kernels::module,
    keep_alive: release::keep_alive_until,
    note_capture: free::note_capture,
};

/// The adopted table's services.
static RELAYED: Services = Services {
    allocate: relay::allocate,
    program: relay::program,
    module: relay::module,
    keep_alive: relay::keep_alive,
    note_capture: relay::note_capture,
};

static ADOPTED: OnceLock<&'static Table> = OnceLock::new();

/// The services of this process: the adopted table's once [`adopt`] took one, else this copy's
/// own. The one place that asks which.
pub fn services() -> &'static Services {
    match ADOPTED.get() {
        Some(_) => &RELAYED,
        None => &LOCAL,
    }
}

/// The functions of `program` on device `ordinal`, loaded once per process (see
/// [`kernels::program`]) by the process's services.
pub fn program(ordinal: u32, program: &Program) -> Result<&'static [usize]> {
    (services().program)(ordinal, program)
}

/// The module of `code` on device `ordinal`, loaded once per process (see [`kernels::module`])
/// by the process's services.
pub fn module(ordinal: u32, code: &Code) -> Result<&'static Module> {
    (services().module)(ordinal, code)
}

/// The adopted table, for the Python layer's relayed entries (`import`, `wrap`).
pub fn adopted() -> Option<&'static Table> {
    ADOPTED.get().copied()
}

/// Takes `table` as the process's runtime after checking its version; `who` names the
/// extension for the error.
///
/// # Safety
/// `table` points to a table whose first two fields are a version and a NUL-terminated crate
/// version, and, where the version is [`VERSION`] or later, to a whole [`Table`] of at least
/// this version's entries that lives for the process.
pub unsafe fn adopt(table: *const Table, who: &str) -> Result<()> {
    // SAFETY: the caller's contract: the first two fields are readable in every version.
    let (version, text) = unsafe { ((*table).version, CStr::from_ptr((*table).crate_version)) };
    check_version(version, &text.to_string_lossy(), who)?;
    // SAFETY: the caller's contract, the version being ours or later.
    let _ = ADOPTED.set(unsafe { &*table });
    Ok(())
}

/// Refuses a runtime whose table is older than this copy's, naming both versions.
pub fn check_version(version: u32, crate_version: &str, who: &str) -> Result<()> {
    if version >= VERSION {
        return Ok(());
    }
    Err(Error::Incompatible(format!(
        "{who} was built with cubridge {} (runtime table version {VERSION}), but the installed \
         cubridge module is {crate_version} (runtime table version {version}); upgrade cubridge \
         to {} or later, or rebuild {who} against cubridge {crate_version}",
        CRATE_VERSION.to_string_lossy(),
        CRATE_VERSION.to_string_lossy(),
    )))
}

/// This copy's allocation for `need`.
fn allocate_here(need: &Need) -> Result<Memory> {
    let Need {
        bytes,
        device,
        stream,
        zeroed,
        capture,
    } = *need;
    Ok(Memory::Own(match device {
        Device::Cuda(n) if capture => CudaAlloc::device_outside_pool(bytes, n)?,
        Device::Cuda(n) => CudaAlloc::device(bytes, n, stream, zeroed)?,
        Device::CudaHost | Device::CudaManaged => CudaAlloc::host_visible(bytes, device, zeroed)?,
        Device::Cpu => return Err(Error::invalid("host memory is not CUDA memory")),
    }))
}

/// The number of a [`MemoryKind`] in a [`Block`].
fn kind_code(kind: MemoryKind) -> (u32, u32) {
    match kind {
        MemoryKind::Device {
            ordinal,
            pooled: true,
        } => (0, ordinal),
        MemoryKind::Device {
            ordinal,
            pooled: false,
        } => (1, ordinal),
        MemoryKind::Pinned => (2, 0),
        MemoryKind::Managed => (3, 0),
    }
}

fn kind_of(code: u32, ordinal: u32) -> MemoryKind {
    match code {
        0 => MemoryKind::Device {
            ordinal,
            pooled: true,
        },
        1 => MemoryKind::Device {
            ordinal,
            pooled: false,
        },
        2 => MemoryKind::Pinned,
        _ => MemoryKind::Managed,
    }
}

/// Memory that the serving copy allocated and owns: dropping it hands the uses recorded here
/// to that copy, which frees the memory after them.
pub struct Relayed {
    ptr: u64,
    kind: MemoryKind,
    owner: *mut c_void,
    table: &'static Table,
    uses: Uses,
}

// SAFETY: the owner is the serving copy's allocation, which may be released from any thread.
unsafe impl Send for Relayed {}
// SAFETY: shared references only read the address and kind.
unsafe impl Sync for Relayed {}

impl Relayed {
    /// The start of the memory.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }

    /// What kind of memory it is.
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }

    /// The work the free must follow (set by the buffer as it goes).
    pub fn set_uses(&mut self, uses: Uses) {
        self.uses = uses;
    }
}

impl Drop for Relayed {
    fn drop(&mut self) {
        let lent = |w: &Write| LentWrite {
            stream: w.stream.handle() as usize,
            event: w.event.as_ref().map_or(0, |e| e.raw()),
        };
        let kernels: Vec<LentWrite> = self.uses.kernels.iter().map(lent).collect();
        let streams: Vec<usize> = self.uses.streams.iter().map(|s| s.dlpack()).collect();
        let uses = LentUses {
            write: self.uses.write.as_ref().map_or(
                LentWrite {
                    stream: 0,
                    event: 0,
                },
                lent,
            ),
            kernels: kernels.as_ptr(),
            n_kernels: kernels.len(),
            streams: streams.as_ptr(),
            n_streams: streams.len(),
            unknown: self.uses.unknown,
        };
        // SAFETY: the owner the serving copy handed over, released once; the uses are valid
        // for the call, and their events stay alive until it returns (the serving copy waits
        // on them at once or waits for the whole device).
        unsafe { (self.table.release)(self.owner, &uses) };
    }
}

/// The entries of the adopted table, as [`Services`].
mod relay {
    use super::*;

    fn table() -> Result<&'static Table> {
        adopted().ok_or_else(|| Error::invalid("no cubridge runtime was adopted"))
    }

    /// A failed entry's error, its text freed.
    pub(super) fn failed(table: &Table, failure: Failure) -> Error {
        let message = if failure.text.is_null() {
            String::from("the cubridge runtime failed without a message")
        } else {
            // SAFETY: a NUL-terminated string the runtime allocated for this failure; freed
            // once, by the runtime, after it is copied.
            let text = unsafe { CStr::from_ptr(failure.text) }
                .to_string_lossy()
                .into_owned();
            // SAFETY: as above.
            unsafe { (table.free_text)(failure.text) };
            text
        };
        Error::Relayed {
            kind: ErrorKind::from_raw(failure.kind),
            code: failure.has_code.then_some(failure.code),
            message,
        }
    }

    pub(super) fn allocate(need: &Need) -> Result<Memory> {
        let table = table()?;
        let request = Request {
            bytes: need.bytes,
            device: need.device.to_dlpack(),
            stream: need.stream.handle() as usize,
            zeroed: need.zeroed,
            capture: need.capture,
        };
        let mut block = Block {
            ptr: 0,
            kind: 0,
            ordinal: 0,
            owner: std::ptr::null_mut(),
        };
        let mut failure = Failure::empty();
        // SAFETY: the request and both out-pointers are valid for the call.
        if unsafe { (table.allocate)(&request, &mut block, &mut failure) } != 0 {
            return Err(failed(table, failure));
        }
        Ok(Memory::Relayed(Relayed {
            ptr: block.ptr,
            kind: kind_of(block.kind, block.ordinal),
            owner: block.owner,
            table,
            uses: Uses::default(),
        }))
    }

    pub(super) fn program(ordinal: u32, program: &Program) -> Result<&'static [usize]> {
        type Loaded = HashMap<(u32, Program), &'static [usize]>;
        static LOADED: Mutex<Option<Loaded>> = Mutex::new(None);
        let key = (ordinal, program.clone());
        if let Some(found) = crate::lock(&LOADED)
            .get_or_insert_with(HashMap::new)
            .get(&key)
        {
            return Ok(found);
        }
        let found: &'static [usize] = load(table()?, ordinal, program)?.leak();
        crate::lock(&LOADED)
            .get_or_insert_with(HashMap::new)
            .insert(key, found);
        Ok(found)
    }

    fn load(table: &Table, ordinal: u32, program: &Program) -> Result<Vec<usize>> {
        let text = |s: &String| Text {
            ptr: s.as_ptr(),
            len: s.len(),
        };
        let options: Vec<Text> = program.options.iter().map(text).collect();
        let functions: Vec<Text> = program.functions.iter().map(text).collect();
        let lent = ProgramText {
            name: text(&program.name),
            source: text(&program.source),
            options: options.as_ptr(),
            n_options: options.len(),
            functions: functions.as_ptr(),
            n_functions: functions.len(),
        };
        let mut found = vec![0usize; functions.len()];
        let mut failure = Failure::empty();
        // SAFETY: the texts and the output (one slot per function) are valid for the call.
        if unsafe { (table.program)(ordinal, &lent, found.as_mut_ptr(), &mut failure) } != 0 {
            return Err(failed(table, failure));
        }
        Ok(found)
    }

    pub(super) fn module(ordinal: u32, code: &Code) -> Result<&'static Module> {
        cached_module(table()?, ordinal, code)
    }

    /// The module of `code` on `ordinal` as `table` serves it, asked for once per process
    /// and device (the serving copy keeps it loaded).
    pub(super) fn cached_module(
        table: &Table,
        ordinal: u32,
        code: &Code,
    ) -> Result<&'static Module> {
        type Loaded = HashMap<(u32, Code), &'static Module>;
        static LOADED: Mutex<Option<Loaded>> = Mutex::new(None);
        let key = (ordinal, code.clone());
        if let Some(&found) = crate::lock(&LOADED)
            .get_or_insert_with(HashMap::new)
            .get(&key)
        {
            return Ok(found);
        }
        let found: &'static Module = Box::leak(Box::new(load_module(table, ordinal, code)?));
        crate::lock(&LOADED)
            .get_or_insert_with(HashMap::new)
            .insert(key, found);
        Ok(found)
    }

    fn load_module(table: &Table, ordinal: u32, code: &Code) -> Result<Module> {
        let (name, bytes, options, names): (&str, &[u8], &[String], &[String]) = match code {
            Code::Source(s) => (
                &s.name,
                s.source.as_bytes(),
                &s.options,
                &s.name_expressions,
            ),
            Code::Image(image) => ("", image, &[], &[]),
        };
        let texts = |list: &[String]| -> Vec<Text> {
            list.iter().map(|s| Text::of(s.as_bytes())).collect()
        };
        let (options, names) = (texts(options), texts(names));
        let lent = ModuleText {
            image: matches!(code, Code::Image(_)),
            name: Text::of(name.as_bytes()),
            code: Text::of(bytes),
            options: options.as_ptr(),
            n_options: options.len(),
            name_expressions: names.as_ptr(),
            n_name_expressions: names.len(),
        };
        let mut handle = 0usize;
        let mut lowered: Vec<Text> = names.iter().map(|_| Text::of(&[])).collect();
        let mut failure = Failure::empty();
        // SAFETY: the texts and the outputs (one lowered name per name expression) are valid
        // for the call.
        let status = unsafe {
            (table.module)(
                ordinal,
                &lent,
                &mut handle,
                lowered.as_mut_ptr(),
                &mut failure,
            )
        };
        if status != 0 {
            return Err(failed(table, failure));
        }
        // SAFETY: the serving copy's names, kept for the process (or left empty).
        let lowered = lowered.iter().map(|t| unsafe { t.owned() }).collect();
        Ok(Module { handle, lowered })
    }

    pub(super) fn keep_alive(
        event: Option<Arc<Event>>,
        held: Vec<KeepAlive>,
        stream: Stream,
        ordinal: u32,
    ) {
        let Ok(table) = table() else {
            return release::keep_alive_until(event, held, stream, ordinal);
        };
        let (context, release) = lend(held);
        let mut failure = Failure::empty();
        // SAFETY: the runtime calls `release` once with `context` when it accepts it; when it
        // refuses (returns nonzero) it never does, and the box is taken back here.
        let refused = unsafe {
            (table.keep_alive)(
                ordinal,
                stream.handle() as usize,
                context,
                release,
                &mut failure,
            )
        };
        if refused != 0 {
            drop(failed(table, failure));
            // SAFETY: refused: the box is still ours.
            let held = *unsafe { Box::from_raw(context.cast::<Vec<KeepAlive>>()) };
            release::keep_alive_until(event, held, stream, ordinal);
        }
    }

    pub(super) fn note_capture(ordinal: u32, stream: Stream) {
        match table() {
            // SAFETY: plain values.
            Ok(table) => unsafe { (table.note_capture)(ordinal, stream.handle() as usize) },
            Err(_) => free::note_capture(ordinal, stream),
        }
    }
}

/// The entries this copy serves, apart from the Python ones.
pub mod serve {
    use super::*;

    /// Fills `failure` from `e` and returns -1.
    ///
    /// # Safety
    /// `failure` is valid for writes.
    pub unsafe fn fail(e: &Error, failure: *mut Failure) -> i32 {
        let text = CString::new(e.to_string().replace('\0', " ")).unwrap_or_default();
        // SAFETY: the caller's contract.
        unsafe {
            *failure = Failure {
                kind: e.kind() as u32,
                has_code: e.code().is_some(),
                code: e.code().unwrap_or(0),
                text: text.into_raw(),
            }
        };
        -1
    }

    /// `Table::allocate`.
    ///
    /// # Safety
    /// The request and out-pointers are valid.
    pub unsafe extern "C" fn allocate(
        request: *const Request,
        out: *mut Block,
        failure: *mut Failure,
    ) -> i32 {
        // SAFETY: the caller's contract.
        let r = unsafe { &*request };
        let made = Device::from_dlpack(r.device).and_then(|device| {
            allocate_here(&Need {
                bytes: r.bytes,
                device,
                stream: Stream::from_handle(r.stream),
                zeroed: r.zeroed,
                capture: r.capture,
            })
        });
        match made {
            Ok(Memory::Own(alloc)) => {
                let (kind, ordinal) = kind_code(alloc.kind());
                let block = Block {
                    ptr: alloc.as_ptr() as u64,
                    kind,
                    ordinal,
                    owner: Box::into_raw(Box::new(alloc)).cast(),
                };
                // SAFETY: the caller's contract.
                unsafe { *out = block };
                0
            }
            Ok(Memory::Relayed(_)) => {
                // SAFETY: the caller's contract.
                unsafe { fail(&Error::invalid("relayed memory cannot be served"), failure) }
            }
            // SAFETY: the caller's contract.
            Err(e) => unsafe { fail(&e, failure) },
        }
    }

    /// `Table::release`.
    ///
    /// # Safety
    /// `owner` came from [`allocate`] and is released once; the uses are valid for the call.
    pub unsafe extern "C" fn release(owner: *mut c_void, uses: *const LentUses) {
        // SAFETY: the caller's contract.
        let mut alloc = unsafe { Box::from_raw(owner.cast::<CudaAlloc>()) };
        // SAFETY: the caller's contract.
        let lent = unsafe { &*uses };
        let ordinal = match alloc.kind() {
            MemoryKind::Device { ordinal, .. } => ordinal,
            _ => 0,
        };
        // The events stay the lender's: the free waits on them before this returns, or waits
        // for the whole device without them.
        let take = |w: &LentWrite| Write {
            stream: Stream::from_handle(w.stream),
            // SAFETY: a recorded event of this device, alive for the call, never recorded here.
            event: (w.event != 0)
                .then(|| Arc::new(unsafe { Event::lent(w.event, ordinal, Box::new(())) })),
        };
        // SAFETY: the caller's contract: `n_kernels` and `n_streams` entries.
        let (kernels, streams) = unsafe {
            (
                std::slice::from_raw_parts(lent.kernels, lent.n_kernels),
                std::slice::from_raw_parts(lent.streams, lent.n_streams),
            )
        };
        alloc.set_uses(Uses {
            write: (lent.write.stream != 0).then(|| take(&lent.write)),
            kernels: kernels.iter().map(take).collect(),
            streams: streams.iter().map(|&s| Stream::from_handle(s)).collect(),
            unknown: lent.unknown,
        });
        drop(alloc);
    }

    /// `Table::program`.
    ///
    /// # Safety
    /// The program's texts are valid UTF-8 for their lengths; `found` holds `n_functions` slots.
    pub unsafe extern "C" fn program(
        ordinal: u32,
        lent: *const ProgramText,
        found: *mut usize,
        failure: *mut Failure,
    ) -> i32 {
        // SAFETY: the caller's contract.
        let lent = unsafe { &*lent };
        // SAFETY: the caller's contract, for each text.
        let owned = |t: &Text| unsafe { t.owned() };
        // SAFETY: the caller's contract.
        let list = |p: *const Text, n: usize| unsafe { lent_list(p, n) };
        let program = Program {
            name: owned(&lent.name),
            source: owned(&lent.source),
            options: list(lent.options, lent.n_options)
                .iter()
                .map(owned)
                .collect(),
            functions: list(lent.functions, lent.n_functions)
                .iter()
                .map(owned)
                .collect(),
        };
        match kernels::program(ordinal, &program) {
            Ok(functions) => {
                // SAFETY: the caller's contract: one slot per function asked for.
                let out = unsafe { std::slice::from_raw_parts_mut(found, functions.len()) };
                out.copy_from_slice(functions);
                0
            }
            // SAFETY: the caller's contract.
            Err(e) => unsafe { fail(&e, failure) },
        }
    }

    /// The module that `lent` describes, copied.
    ///
    /// # Safety
    /// The module's texts and lists are valid for their lengths.
    pub unsafe fn code_of(lent: &ModuleText) -> Code {
        // SAFETY: the caller's contract, for each text.
        let owned = |t: &Text| unsafe { t.owned() };
        // SAFETY: the caller's contract, for each list.
        let list =
            |p: *const Text, n: usize| unsafe { lent_list(p, n) }.iter().map(owned).collect();
        if lent.image {
            // SAFETY: the caller's contract.
            return Code::Image(unsafe { lent.code.bytes() }.to_vec());
        }
        Code::Source(kernels::Source {
            name: owned(&lent.name),
            source: owned(&lent.code),
            options: list(lent.options, lent.n_options),
            name_expressions: list(lent.name_expressions, lent.n_name_expressions),
        })
    }

    /// `Table::module`.
    ///
    /// # Safety
    /// The module's texts and lists are valid for their lengths; `lowered` holds
    /// `n_name_expressions` slots; `handle` and `failure` are valid for writes.
    pub unsafe extern "C" fn module(
        ordinal: u32,
        lent: *const ModuleText,
        handle: *mut usize,
        lowered: *mut Text,
        failure: *mut Failure,
    ) -> i32 {
        // SAFETY: the caller's contract.
        let code = unsafe { code_of(&*lent) };
        match kernels::module(ordinal, &code) {
            Ok(module) => {
                // SAFETY: the caller's contract: one slot per name expression.
                let slots = unsafe {
                    match (*lent).n_name_expressions {
                        0 => &mut [],
                        n => std::slice::from_raw_parts_mut(lowered, n),
                    }
                };
                // The names live for the process, with the module.
                for (slot, name) in slots.iter_mut().zip(&module.lowered) {
                    *slot = Text::of(name.as_bytes());
                }
                // SAFETY: the caller's contract.
                unsafe { *handle = module.handle };
                0
            }
            // SAFETY: the caller's contract.
            Err(e) => unsafe { fail(&e, failure) },
        }
    }

    /// `Table::keep_alive`.
    ///
    /// # Safety
    /// `release(context)` may be called once from any thread; `failure` is valid for writes.
    pub unsafe extern "C" fn keep_alive(
        ordinal: u32,
        stream: usize,
        context: *mut c_void,
        release: unsafe extern "C" fn(*mut c_void),
        failure: *mut Failure,
    ) -> i32 {
        let stream = Stream::from_handle(stream);
        let event = match stream {
            LEGACY => None,
            _ => match Event::record(stream, ordinal) {
                Ok(event) => Some(Arc::new(event)),
                // SAFETY: the caller's contract.
                Err(e) => return unsafe { fail(&e, failure) },
            },
        };
        let held: KeepAlive = Arc::new(Lent(context, release));
        release::keep_alive_until(event, vec![held], stream, ordinal);
        0
    }

    /// `Table::note_capture`.
    pub extern "C" fn note_capture(ordinal: u32, stream: usize) {
        free::note_capture(ordinal, Stream::from_handle(stream));
    }

    /// `Table::free_text`.
    ///
    /// # Safety
    /// `text` came from [`fail`] and is freed once.
    pub unsafe extern "C" fn free_text(text: *mut c_char) {
        // SAFETY: the caller's contract.
        drop(unsafe { CString::from_raw(text) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_tables_are_refused_naming_both_versions_and_newer_ones_taken() {
        let e = check_version(VERSION - 1, "0.0.9", "my_ext").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("my_ext") && text.contains("0.0.9"), "{text}");
        assert!(text.contains(&*CRATE_VERSION.to_string_lossy()), "{text}");
        assert_eq!(e.kind(), ErrorKind::Incompatible);
        assert!(check_version(VERSION, "9.9.9", "my_ext").is_ok());
        assert!(check_version(VERSION + 1, "9.9.9", "my_ext").is_ok());
    }

    #[test]
    fn failures_relay_kind_code_and_message() {
        let table = Table::served(unreachable_import, unreachable_wrap);
        let mut failure = Failure::empty();
        let e = Error::Compile {
            kernel: "k".into(),
            code: Some(cudarc::nvrtc::sys::nvrtcResult::NVRTC_ERROR_COMPILATION),
            log: "bad".into(),
        };
        // SAFETY: a valid failure slot.
        assert_eq!(unsafe { serve::fail(&e, &mut failure) }, -1);
        let relayed = relay::failed(&table, failure);
        assert_eq!(relayed.kind(), ErrorKind::Compile);
        assert_eq!(relayed.code(), Some(6));
        assert_eq!(relayed.to_string(), e.to_string());
    }

    #[test]
    fn a_lent_write_is_let_go_of_once_whether_taken_or_not() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static RELEASED: AtomicUsize = AtomicUsize::new(0);
        unsafe extern "C" fn count(_: *mut c_void) {
            RELEASED.fetch_add(1, Ordering::SeqCst);
        }
        let write = || Written {
            stream: 5,
            event: 7,
            context: std::ptr::null_mut(),
            release: Some(count),
        };
        drop(write());
        assert_eq!(RELEASED.load(Ordering::SeqCst), 1);
        // Host memory takes no CUDA write: the event is let go of at once.
        // SAFETY: the release function ignores its context; no event is used on the host.
        assert!(unsafe { write().take(Device::Cpu) }.is_none());
        assert_eq!(RELEASED.load(Ordering::SeqCst), 2);
        assert_eq!(Written::lend(None).stream, 0);
    }

    #[test]
    fn memory_kinds_cross_the_table_unchanged() {
        for kind in [
            MemoryKind::Device {
                ordinal: 3,
                pooled: true,
            },
            MemoryKind::Device {
                ordinal: 1,
                pooled: false,
            },
            MemoryKind::Pinned,
            MemoryKind::Managed,
        ] {
            let (code, ordinal) = kind_code(kind);
            assert_eq!(kind_of(code, ordinal), kind);
        }
    }

    /// The calls a host's `module` entry took, as the host copied them.
    static ASKED: Mutex<Vec<(u32, Code)>> = Mutex::new(Vec::new());
    const LOWERED: &str = "_Z5scaleIfEvPfS0_";

    /// A host's `module` entry: records what it was asked for and answers with a made-up
    /// module whose name expressions all lowered to [`LOWERED`].
    unsafe extern "C" fn host_module(
        ordinal: u32,
        lent: *const ModuleText,
        handle: *mut usize,
        lowered: *mut Text,
        _: *mut Failure,
    ) -> i32 {
        // SAFETY: the relaying copy lends a valid module and one slot per name expression.
        unsafe {
            crate::lock(&ASKED).push((ordinal, serve::code_of(&*lent)));
            for k in 0..(*lent).n_name_expressions {
                *lowered.add(k) = Text::of(LOWERED.as_bytes());
            }
            *handle = 0xC0DE;
        }
        0
    }

    #[test]
    fn modules_cross_the_table_whole_and_are_asked_for_once_per_device() {
        let host = Table {
            module: host_module,
            ..Table::served(unreachable_import, unreachable_wrap)
        };
        let source = Code::Source(kernels::Source {
            name: "scale".into(),
            source: "template <class T> __global__ void scale(T* x, T a) { *x *= a; }".into(),
            options: vec!["-DN=3".into(), "-lineinfo".into()],
            name_expressions: vec!["scale<float>".into()],
        });
        let image = Code::Image(b"\x7fELF\0\x02binary\0".to_vec());
        for code in [&source, &image] {
            let first = relay::cached_module(&host, 7, code).unwrap();
            let again = relay::cached_module(&host, 7, code).unwrap();
            assert!(std::ptr::eq(first, again));
            assert_eq!(first.handle, 0xC0DE);
            let expected = usize::from(matches!(code, Code::Source(_)));
            assert_eq!(first.lowered, vec![LOWERED; expected]);
        }
        relay::cached_module(&host, 8, &image).unwrap();
        let asked = crate::lock(&ASKED).clone();
        assert_eq!(asked, [(7, source), (7, image.clone()), (8, image)]);
    }

    unsafe extern "C" fn unreachable_import(_: *mut c_void, _: *mut ImportReply) -> i32 {
        -1
    }

    unsafe extern "C" fn unreachable_wrap(
        _: *mut DLManagedTensorVersioned,
        _: Written,
    ) -> *mut c_void {
        std::ptr::null_mut()
    }
}
