//! One runtime per process. An extension crate built on cubridge links its own copy of this
//! crate; when the `cubridge` Python module is loaded, that copy hands its stateful work to the
//! module's copy through a versioned table of C functions (the `_runtime` capsule of
//! `cubridge._cubridge`), as numpy's C API does for its extensions. So one memory pool and its
//! statistics, one releaser thread and one kernel cache serve the whole process, and an
//! extension's results are `cubridge.Array` instances.
//!
//! Arrays cross the table as DLPack managed tensors, their pending writes as lent events
//! ([`Written`]: never as a stream to record on, which its owner may have destroyed), streams as
//! their DLPack numbers, errors as their kind, code and message: nothing of Rust's layout crosses, so an extension built
//! against another release of cubridge works while the table's [`ABI`] is the same.
//!
//! The module's copy serves the table ([`serve`]); an extension's copy adopts it
//! ([`adopt`]) and from then on [`shared`] returns it to the places that ask: allocation
//! (`Array::allocate`), kernel loading (`cuda::kernels`), and the releaser
//! (`cuda::release`); the Python layer relays imports and results.

use crate::array::Array;
use crate::cuda::kernels::Program;
use crate::cuda::stream::{Event, Stream};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use dlpark::ffi::{DLDataType, DLDevice, DLManagedTensorVersioned};
use dlpark::Managed;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::OnceLock;

/// The table's layout. Raised whenever an entry is added, removed or changes its signature; the
/// first two fields keep their place in every layout.
pub const ABI: u32 = 1;

/// This build's crate version, as the table carries it.
pub const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("the crate version holds a NUL"),
    };

/// The runtime's entry points. Each returns 0 on success; on failure the fallible ones without
/// the interpreter fill a [`Failure`] and return -1, and those with it (`import`, `wrap`) set a
/// Python exception and return -1 or null.
#[repr(C)]
pub struct Table {
    /// [`ABI`] of the copy that serves the table.
    pub abi: u32,
    /// Its crate version, NUL-terminated.
    pub version: *const c_char,
    /// A new array from the runtime's allocator; the tensor is the caller's to delete.
    pub allocate: unsafe extern "C" fn(
        *const Allocation,
        *mut *mut DLManagedTensorVersioned,
        *mut Failure,
    ) -> i32,
    /// Loads a program (compiling it, or taking it from the caches) on a device, writing its
    /// functions' handles, one per name asked for.
    pub program: unsafe extern "C" fn(u32, *const ProgramText, *mut usize, *mut Failure) -> i32,
    /// Calls `release(context)` once the work queued so far on the stream (DLPack number) of the
    /// device has run, from the runtime's releaser.
    pub keep_alive: unsafe extern "C" fn(
        u32,
        usize,
        *mut c_void,
        unsafe extern "C" fn(*mut c_void),
        *mut Failure,
    ) -> i32,
    /// Frees a failure's text.
    pub free_text: unsafe extern "C" fn(*mut c_char),
    /// Imports a Python object (a borrowed reference) as the runtime does a kernel's argument,
    /// with the interpreter attached.
    pub import: unsafe extern "C" fn(*mut c_void, *mut ImportReply) -> i32,
    /// A new `cubridge.Array` (a new reference) over a tensor, with its last write; takes the
    /// tensor and the write in every case.
    pub wrap: unsafe extern "C" fn(*mut DLManagedTensorVersioned, Written) -> *mut c_void,
}

impl Table {
    /// The table that the `cubridge` module serves, with its Python entries.
    pub const fn served(
        import: unsafe extern "C" fn(*mut c_void, *mut ImportReply) -> i32,
        wrap: unsafe extern "C" fn(*mut DLManagedTensorVersioned, Written) -> *mut c_void,
    ) -> Table {
        Table {
            abi: ABI,
            version: VERSION.as_ptr(),
            allocate: serve::allocate,
            program: serve::program,
            keep_alive: serve::keep_alive,
            free_text: serve::free_text,
            import,
            wrap,
        }
    }
}

// SAFETY: the table is immutable plain data: function pointers and a pointer to a static string.
unsafe impl Sync for Table {}

/// What `allocate` is asked for.
#[repr(C)]
pub struct Allocation {
    pub shape: *const usize,
    pub ndim: usize,
    pub dtype: DLDataType,
    pub device: DLDevice,
    /// The stream the memory is for (DLPack number).
    pub stream: usize,
    pub zeroed: bool,
    /// For a graph being captured on the stream: memory from outside the pool.
    pub capture: bool,
}

/// UTF-8 text lent for a call.
#[repr(C)]
pub struct Text {
    pub ptr: *const u8,
    pub len: usize,
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
/// runtime's message (freed with `free_text`).
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

static SHARED: OnceLock<&'static Table> = OnceLock::new();

/// The runtime this copy hands its work to: set in an extension crate's copy once the
/// `cubridge` module's table is adopted, never in the module's own.
pub fn shared() -> Option<&'static Table> {
    SHARED.get().copied()
}

/// Takes `table` as the process's runtime after checking its ABI; `who` names the extension for
/// the error.
///
/// # Safety
/// `table` points to a table whose first two fields are an ABI number and a NUL-terminated
/// version, and, where the ABI is [`ABI`], to a whole [`Table`] that lives for the process.
pub unsafe fn adopt(table: *const Table, who: &str) -> Result<()> {
    // SAFETY: the caller's contract: the first two fields are readable in every layout.
    let (abi, version) = unsafe { ((*table).abi, CStr::from_ptr((*table).version)) };
    check_abi(abi, &version.to_string_lossy(), who)?;
    // SAFETY: the caller's contract, the ABI being ours.
    let _ = SHARED.set(unsafe { &*table });
    Ok(())
}

/// Refuses a runtime whose table has another layout, naming both versions.
fn check_abi(abi: u32, version: &str, who: &str) -> Result<()> {
    if abi == ABI {
        return Ok(());
    }
    Err(Error::Incompatible(format!(
        "{who} was built with cubridge {} (runtime ABI {ABI}), but the installed cubridge \
         module is {version} (runtime ABI {abi}); rebuild {who} against cubridge {version}",
        VERSION.to_string_lossy()
    )))
}

impl Table {
    /// A failed entry's error, its text freed.
    fn failed(&self, failure: Failure) -> Error {
        let message = if failure.text.is_null() {
            String::from("the cubridge runtime failed without a message")
        } else {
            // SAFETY: a NUL-terminated string the runtime allocated for this failure; freed once,
            // by the runtime, after it is copied.
            let text = unsafe { CStr::from_ptr(failure.text) }
                .to_string_lossy()
                .into_owned();
            // SAFETY: as above.
            unsafe { (self.free_text)(failure.text) };
            text
        };
        Error::Relayed {
            kind: ErrorKind::from_raw(failure.kind),
            code: failure.has_code.then_some(failure.code),
            message,
        }
    }

    /// A new array from the runtime's allocator (see `Array::allocate`).
    pub(crate) fn allocate(
        &self,
        shape: &[usize],
        dtype: DType,
        device: Device,
        stream: Stream,
        (zeroed, capture): (bool, bool),
    ) -> Result<Array> {
        let request = Allocation {
            shape: shape.as_ptr(),
            ndim: shape.len(),
            dtype: dtype.to_dlpack(),
            device: device.to_dlpack(),
            stream: stream.handle() as usize,
            zeroed,
            capture,
        };
        let mut tensor = std::ptr::null_mut();
        let mut failure = Failure::empty();
        // SAFETY: the request and both out-pointers are valid for the call.
        if unsafe { (self.allocate)(&request, &mut tensor, &mut failure) } != 0 {
            return Err(self.failed(failure));
        }
        // SAFETY: a managed tensor the runtime made for this call and handed over.
        unsafe { take_tensor(tensor) }
    }

    /// The functions of `program` on device `ordinal`, loaded by the runtime.
    pub(crate) fn program(&self, ordinal: u32, program: &Program) -> Result<Vec<usize>> {
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
        // SAFETY: the program's texts and the output (one slot per function) are valid for the call.
        if unsafe { (self.program)(ordinal, &lent, found.as_mut_ptr(), &mut failure) } != 0 {
            return Err(self.failed(failure));
        }
        Ok(found)
    }

    /// Hands `held` to the runtime's releaser, dropped once the work queued so far on `stream`
    /// of device `ordinal` has run; gives it back where the runtime cannot take it (it could not
    /// record an event there).
    pub(crate) fn keep_alive<T: Send + 'static>(
        &self,
        held: T,
        stream: Stream,
        ordinal: u32,
    ) -> std::result::Result<(), T> {
        let (context, release) = lend(held);
        let mut failure = Failure::empty();
        // SAFETY: the runtime calls `release` once with `context` when it accepts it; when it
        // refuses (returns nonzero) it never does, and the box is taken back here.
        let refused = unsafe {
            (self.keep_alive)(
                ordinal,
                stream.handle() as usize,
                context,
                release,
                &mut failure,
            )
        };
        if refused != 0 {
            drop(self.failed(failure));
            // SAFETY: refused: the box is still ours.
            return Err(*unsafe { Box::from_raw(context.cast::<T>()) });
        }
        Ok(())
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

    /// `array`'s last write where it may still be running (an event already seen done is not
    /// lent). The event is not queried: it may have been recorded into a graph being captured,
    /// whose capture a query would invalidate.
    pub fn of(array: &Array) -> Written {
        let Some(w) = array.buffer().last_write() else {
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

    /// `array`, with this write recorded as its last.
    ///
    /// # Safety
    /// The write came from [`Written::of`] in some copy of cubridge, for this array's memory;
    /// it is taken over (its event let go of once).
    pub unsafe fn record(self, array: Array) -> Array {
        let this = std::mem::ManuallyDrop::new(self);
        let owner = this.release.map(|r| Lent(this.context, r));
        match (array.device(), this.stream, owner) {
            (_, 0, _) => array,
            (Device::Cuda(n), s, Some(owner)) if this.event != 0 => {
                // SAFETY: a recorded event of this array's device, kept by `owner` (the caller's
                // contract); lent events are never recorded again.
                let event = unsafe { Event::lent(this.event, n, Box::new(owner)) };
                array.with_pending(Stream::from_handle(s), event)
            }
            (Device::Cuda(_), _, _) => array.with_legacy_write(),
            _ => array,
        }
    }
}

/// A write that was never recorded lets go of its event.
impl Drop for Written {
    fn drop(&mut self) {
        if let Some(release) = self.release {
            drop(Lent(self.context, release));
        }
    }
}

/// An array over a managed tensor that the runtime handed over.
///
/// # Safety
/// `tensor` is a live managed tensor that the caller owns.
pub unsafe fn take_tensor(tensor: *mut DLManagedTensorVersioned) -> Result<Array> {
    // SAFETY: the caller's contract.
    let managed = unsafe { Managed::from_raw(tensor) }
        .map_err(|e| Error::invalid(format!("the cubridge runtime handed over no tensor: {e}")))?;
    crate::view::from_managed(managed)
}

/// A managed tensor over `array` for the other side of the table.
pub fn give_tensor(array: &Array) -> Result<*mut DLManagedTensorVersioned> {
    Ok(crate::export::to_managed::<DLManagedTensorVersioned>(array, false)?.into_raw())
}

/// The entries of the table that the `cubridge` module serves, apart from the Python ones.
pub mod serve {
    use super::*;
    use crate::cuda::stream::{Event, LEGACY};
    use std::sync::Arc;

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
    /// The request's shape holds `ndim` entries; the out-pointers are valid for writes.
    pub unsafe extern "C" fn allocate(
        request: *const Allocation,
        out: *mut *mut DLManagedTensorVersioned,
        failure: *mut Failure,
    ) -> i32 {
        // SAFETY: the caller's contract.
        let r = unsafe { &*request };
        // SAFETY: the caller's contract.
        let shape = unsafe { std::slice::from_raw_parts(r.shape, r.ndim) };
        let made = DType::from_dlpack(r.dtype).and_then(|dtype| {
            let device = Device::from_dlpack(r.device)?;
            let array = match device {
                Device::Cuda(n) if r.capture => Array::empty_for_capture(shape, dtype, n)?,
                _ => Array::allocate(
                    shape,
                    dtype,
                    device,
                    r.zeroed,
                    Stream::from_handle(r.stream),
                )?,
            };
            give_tensor(&array)
        });
        match made {
            // SAFETY: the caller's contract.
            Ok(tensor) => unsafe {
                *out = tensor;
                0
            },
            // SAFETY: the caller's contract.
            Err(e) => unsafe { fail(&e, failure) },
        }
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
        let owned = |t: &Text| unsafe {
            String::from_utf8_lossy(std::slice::from_raw_parts(t.ptr, t.len)).into_owned()
        };
        // SAFETY: the caller's contract.
        let list = |p: *const Text, n: usize| unsafe { std::slice::from_raw_parts(p, n) };
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
        match crate::cuda::kernels::program(ordinal, &program) {
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
        let held: crate::cuda::release::KeepAlive = Arc::new(Lent(context, release));
        crate::cuda::release::keep_alive_until(event, vec![held], stream, ordinal);
        0
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
    fn another_abi_is_refused_naming_both_versions() {
        let e = check_abi(ABI + 1, "9.9.9", "my_ext").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("my_ext") && text.contains("9.9.9"), "{text}");
        assert!(text.contains(&*VERSION.to_string_lossy()), "{text}");
        assert_eq!(e.kind(), ErrorKind::Incompatible);
        assert!(check_abi(ABI, "9.9.9", "my_ext").is_ok());
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
        let relayed = table.failed(failure);
        assert_eq!(relayed.kind(), ErrorKind::Compile);
        assert_eq!(relayed.code(), Some(6));
        assert_eq!(relayed.to_string(), e.to_string());
    }

    #[test]
    fn a_cpu_allocation_crosses_the_table_and_comes_back_as_an_array() {
        let mut failure = Failure::empty();
        let mut tensor = std::ptr::null_mut();
        let request = Allocation {
            shape: [2usize, 3].as_ptr(),
            ndim: 2,
            dtype: DType::Int16.to_dlpack(),
            device: Device::Cpu.to_dlpack(),
            stream: 0,
            zeroed: true,
            capture: false,
        };
        // SAFETY: valid request and out-pointers.
        let status = unsafe { serve::allocate(&request, &mut tensor, &mut failure) };
        assert_eq!(status, 0);
        // SAFETY: the tensor just made.
        let a = unsafe { take_tensor(tensor) }.unwrap();
        assert_eq!((a.shape(), a.dtype()), (&[2usize, 3][..], DType::Int16));
        // SAFETY: six zeroed int16 elements.
        let values = unsafe { std::slice::from_raw_parts(a.data_ptr() as *const i16, 6) };
        assert_eq!(values, &[0; 6]);
    }

    #[test]
    fn a_lent_write_is_let_go_of_once_whether_recorded_or_not() {
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
        let a = Array::zeros(&[1], DType::Int8, Device::Cpu).unwrap();
        // SAFETY: the release function ignores its context; no event is used on the host.
        let a = unsafe { write().record(a) };
        assert_eq!(RELEASED.load(Ordering::SeqCst), 2);
        assert!(!a.has_pending());
        assert_eq!(Written::of(&a).stream, 0);
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
