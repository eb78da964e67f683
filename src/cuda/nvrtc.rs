//! NVRTC: finding the library (a CUDA toolkit, or the pip packages that PyTorch and CuPy wheels
//! install), and compiling CUDA C++ to machine code for the device at hand (PTX where NVRTC does
//! not know the device), which [`super::disk_cache`] keeps for later processes.
//! `CUBRIDGE_NVRTC=0` switches run-time compilation off.

use super::disk_cache::Entry;
use super::nvrtc_paths::{self, SearchEnv};
use crate::error::{Error, Result};
use cudarc::nvrtc::{result, sys};
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// Extra directories to look in for libnvrtc and the CUDA headers (the Python package adds the
/// `nvidia` pip packages' library folders and the header folder `cuda.pathfinder` finds).
static SEARCH_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Adds directories to search for libnvrtc, or for the CUDA headers, before the system's
/// defaults.
pub fn add_search_dirs(dirs: impl IntoIterator<Item = PathBuf>) {
    let mut list = crate::lock(&SEARCH_DIRS);
    for d in dirs {
        if !list.contains(&d) {
            list.push(d);
        }
    }
}

/// The folders searched for libnvrtc after the library search path: those added, conda's, then
/// the toolkits'.
pub(crate) fn candidate_dirs() -> Vec<PathBuf> {
    search_env().library_dirs()
}

fn search_env() -> SearchEnv {
    SearchEnv::from_process(crate::lock(&SEARCH_DIRS).clone())
}

/// Loads NVRTC once per process, or explains where it looked or why the one found does not fit
/// the driver.
pub(crate) fn ensure_loaded() -> Result<()> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let driver = driver_version();
            // SAFETY: only tries to open the library by its usual names.
            if !unsafe { sys::is_culib_present() } {
                load_from_dirs(driver.map(|d| d.0))?;
            }
            check_against_driver(driver)
        })
        .clone()
        .map_err(|log| Error::Compile {
            kernel: "(loading NVRTC)".into(),
            code: None,
            log,
        })
}

/// The CUDA driver's version (major, minor), where a driver with a device is present.
fn driver_version() -> Option<(u32, u32)> {
    if !super::is_available() {
        return None;
    }
    let mut v: std::ffi::c_int = 0;
    // SAFETY: the driver is loaded and initialised (is_available); `v` is a valid out-pointer.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }
        .result()
        .ok()?;
    let v = u32::try_from(v).ok()?;
    Some((v / 1000, v % 1000 / 10))
}

/// Loads the first NVRTC of the search folders not newer than the driver (`driver_major`).
fn load_from_dirs(driver_major: Option<u32>) -> std::result::Result<(), String> {
    let dirs = candidate_dirs();
    let found: Vec<Vec<PathBuf>> = dirs
        .iter()
        .map(|d| nvrtc_paths::nvrtc_files(d))
        .filter(|files| !files.is_empty())
        .collect();
    let majors: Vec<Option<u32>> = found
        .iter()
        .map(|files| files.iter().filter_map(|f| nvrtc_paths::major_of(f)).max())
        .collect();
    let order = nvrtc_paths::choose(&majors, driver_major).map_err(|(newest, driver)| {
        format!(
            "the NVRTC found (CUDA {newest}) is newer than the CUDA driver (CUDA {driver}), \
             whose code it would not load. Install the NVRTC of CUDA {driver} (pip install \
             'cubridge[cu{driver}]') or a newer driver."
        )
    })?;
    for i in order {
        for lib in &found[i] {
            // SAFETY: loading NVRTC runs its initialisers, which have no preconditions. The
            // handle is leaked on purpose: NVRTC stays loaded for the process, and later opens
            // by soname find this copy.
            if let Ok(handle) = unsafe { libloading::Library::new(lib) } {
                std::mem::forget(handle);
            }
        }
        // SAFETY: as above.
        if unsafe { sys::is_culib_present() } {
            return Ok(());
        }
    }
    Err(format!(
        "NVRTC (libnvrtc) was not found. cubridge looked on the library search path \
         (libnvrtc.so, .so.13, .so.12, ...) and in: {}. Install the NVRTC pip package \
         (pip install 'cubridge[cu12]' or 'cubridge[cu13]', as the driver's CUDA version) or a \
         CUDA toolkit, or set CUDA_HOME.",
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Refuses the NVRTC loaded when it is newer than the driver (`driver`): its code would not
/// load. Only checked where a driver is present.
fn check_against_driver(driver: Option<(u32, u32)>) -> std::result::Result<(), String> {
    let Some((d_major, d_minor)) = driver else {
        return Ok(());
    };
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (is_culib_present); both are valid out-pointers.
    let read = unsafe { sys::nvrtcVersion(&mut major, &mut minor) }.result();
    if read.is_ok() && u32::try_from(major).is_ok_and(|m| m > d_major) {
        return Err(format!(
            "the NVRTC loaded (version {major}.{minor}) is newer than the CUDA driver \
             (version {d_major}.{d_minor}), whose code it would not load. \
             Put the NVRTC of CUDA {d_major} first on the library search path (pip install \
             'cubridge[cu{d_major}]') or install a newer driver."
        ));
    }
    Ok(())
}

/// Whether run-time compilation is switched off (`CUBRIDGE_NVRTC=0`): then only kernels shipped
/// in the build and those already in the disk cache run.
pub(crate) fn disabled() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    *OFF.get_or_init(|| std::env::var("CUBRIDGE_NVRTC").is_ok_and(|v| v == "0"))
}

/// What identifies a program's compiled code apart from its architecture: cubridge's version,
/// the source and the options, hashed with 64-bit FNV-1a (stable across builds and processes, so
/// kernels compiled when the wheel is built are found at run time by the same key).
pub fn key(source: &str, extra: &[String]) -> String {
    module_key(source, extra, &[])
}

/// [`key`] of a module whose `names` (name expressions, whose lowered names NVRTC reports) are
/// part of what it is; with no names, the key of the same source and options.
pub fn module_key(source: &str, extra: &[String], names: &[String]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes.iter().chain(std::iter::once(&0u8)) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    feed(env!("CARGO_PKG_VERSION").as_bytes());
    feed(source.as_bytes());
    for option in extra {
        feed(option.as_bytes());
    }
    if !names.is_empty() {
        // A marker no option can be (options hold no NUL), then the names.
        feed(b"\0name expressions");
        for name in names {
            feed(name.as_bytes());
        }
    }
    format!("{hash:016x}")
}

/// NVRTC's option that leaves textures, device-side launches and the CUDA runtime's types out
/// of a program, to compile it sooner (NVRTC 12.4 and later; dropped for older ones).
pub const MINIMAL: &str = "-minimal";

/// NVRTC's option to optimize and translate a program's kernels on as many threads as the
/// machine has, rather than one after the other: a reduction's two kernels compile side by side
/// (measured with NVRTC 13; 12.4 accepts it and compiles as without; dropped for older ones).
pub const SPLIT: &str = "-split-compile=0";

/// The loaded NVRTC's version, read once.
fn version() -> Option<(i32, i32)> {
    static VERSION: OnceLock<Option<(i32, i32)>> = OnceLock::new();
    *VERSION.get_or_init(|| {
        ensure_loaded().ok()?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: NVRTC is loaded; both are valid out-pointers.
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .ok()?;
        Some((major, minor))
    })
}

/// What NVRTC is asked to produce.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Target {
    /// Machine code (a cubin) for `sm_N`: loads without the driver's PTX compiler.
    Cubin(u32),
    /// PTX for `compute_N`, which the driver compiles when the module loads; for devices newer
    /// than the NVRTC found.
    Ptx(u32),
}

/// The architectures the loaded NVRTC compiles for (e.g. 75, 80, ..., 120).
pub(crate) fn supported_archs() -> Result<&'static [u32]> {
    static ARCHS: OnceLock<std::result::Result<Vec<u32>, result::NvrtcError>> = OnceLock::new();
    ensure_loaded()?;
    ARCHS
        .get_or_init(|| {
            let mut n: std::ffi::c_int = 0;
            // SAFETY: NVRTC is loaded; `n` is a valid out-pointer.
            unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) }.result()?;
            let mut archs: Vec<std::ffi::c_int> = vec![0; n.max(0) as usize];
            // SAFETY: `archs` has room for the `n` entries NVRTC writes.
            unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }.result()?;
            Ok(archs.into_iter().map(|a| a as u32).collect())
        })
        .as_deref()
        .map_err(|e| failed("(asking NVRTC for its architectures)", *e, ""))
}

/// The error of a failed NVRTC call for `kernel`, keeping NVRTC's code.
fn failed(kernel: &str, e: result::NvrtcError, what: &str) -> Error {
    Error::Compile {
        kernel: kernel.to_string(),
        code: Some(e.0),
        log: format!("{what}{:?}", e.0),
    }
}

/// The target for a device of compute capability `arch`: its machine code where NVRTC knows the
/// architecture, else PTX for the newest one NVRTC knows below it.
fn target_for(arch: u32) -> Result<Target> {
    let archs = supported_archs()?;
    if archs.contains(&arch) {
        return Ok(Target::Cubin(arch));
    }
    archs
        .iter()
        .copied()
        .filter(|&a| a <= arch)
        .max()
        .map(Target::Ptx)
        .ok_or_else(|| Error::Compile {
            kernel: "(choosing an architecture)".into(),
            code: None,
            log: format!(
                "the NVRTC found compiles for {archs:?}, none of them at or below this device's \
                 compute capability {}.{}",
                arch / 10,
                arch % 10
            ),
        })
}

/// The disk cache's entry for `source` and `extra` options on a device of compute capability
/// `arch`, for the NVRTC found (the newest entry of any NVRTC when none can be loaded: nothing
/// could compile it then, and the driver still checks what it loads).
pub fn cache_entry(source: &str, extra: &[String], arch: u32) -> Option<Entry> {
    entry_for(key(source, extra), arch)
}

/// The disk cache's entry for the program of `key` (see [`cache_entry`]).
pub fn entry_for(key: String, arch: u32) -> Option<Entry> {
    let nvrtc = version().or_else(|| super::disk_cache::any_version(&key, arch))?;
    Some(Entry { key, arch, nvrtc })
}

/// Compiled code for `source` on a device of compute capability `arch` (e.g. 90), ready for
/// `cuModuleLoadData`: NVRTC's (machine code where it knows the architecture, PTX otherwise),
/// which the disk cache then keeps. Callers look in the cache first ([`cache_entry`]). `name`
/// names the program in errors; `extra` are further NVRTC options (`-DNAME=1`,
/// `--use_fast_math`, ...), part of the key. Relocatable code (`-rdc=true`, ...) is linked
/// with the device runtime first ([`super::link`]; that needs the device's context current),
/// and the linked cubin is what the cache keeps. A compile error carries NVRTC's log and,
/// after it, the source lines the log points at.
pub fn compile(source: &str, name: &str, arch: u32, extra: &[String]) -> Result<Vec<u8>> {
    compile_module(source, name, arch, (extra, &[])).map(|c| c.image)
}

/// A compiled module: its image, and the lowered (mangled) name of each name expression asked
/// for, in order.
pub struct Compiled {
    /// A cubin, or NUL-terminated PTX.
    pub image: Vec<u8>,
    /// The symbol each name expression (`add<float>`, `table<3>`) became.
    pub lowered: Vec<String>,
}

/// [`compile`], also asking NVRTC for the lowered names of `names` (name expressions); the disk
/// cache keeps them after the image (see [`super::disk_cache::with_names`]), under
/// [`module_key`].
pub fn compile_module(
    source: &str,
    name: &str,
    arch: u32,
    (extra, names): (&[String], &[String]),
) -> Result<Compiled> {
    if disabled() {
        return Err(Error::Compile {
            kernel: name.to_string(),
            code: None,
            log: format!(
                "run-time compilation is off (CUBRIDGE_NVRTC=0), and no kernel for compute \
                 capability {}.{} was shipped in this build or is in the disk cache",
                arch / 10,
                arch % 10
            ),
        });
    }
    let target = target_for(arch)?;
    let step = std::time::Instant::now();
    let Compiled { mut image, lowered } = compile_named(source, name, target, (extra, names))?;
    trace(name, "its NVRTC compile alone", step.elapsed());
    if super::link::needs_link(extra) {
        let input = match target {
            Target::Cubin(_) => cudarc::driver::sys::CUjitInputType::CU_JIT_INPUT_CUBIN,
            Target::Ptx(_) => cudarc::driver::sys::CUjitInputType::CU_JIT_INPUT_PTX,
        };
        image = super::link::link(&image, input, name, candidate_dirs())?;
    }
    if let Some(entry) = entry_for(module_key(source, extra, names), arch) {
        let step = std::time::Instant::now();
        entry.write(&super::disk_cache::with_names(&image, &lowered));
        trace(name, "its disk cache write alone", step.elapsed());
    }
    Ok(Compiled { image, lowered })
}

/// Closes an NVRTC program when dropped.
struct NvrtcProgram(sys::nvrtcProgram);

impl Drop for NvrtcProgram {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once, here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

/// Runs NVRTC on `source` for `target`, with no cache. PTX comes back NUL-terminated, as
/// `cuModuleLoadData` takes it.
pub fn compile_for(source: &str, name: &str, target: Target, extra: &[String]) -> Result<Vec<u8>> {
    compile_named(source, name, target, (extra, &[])).map(|c| c.image)
}

/// [`compile_for`], with the lowered names of the name expressions `names`.
pub fn compile_named(
    source: &str,
    name: &str,
    target: Target,
    (extra, names): (&[String], &[String]),
) -> Result<Compiled> {
    ensure_loaded()?;
    let nul = |what: &str| Error::invalid(format!("{what} of kernel `{name}` contains a NUL byte"));
    let file = format!("{name}.cu");
    let c_source = CString::new(source).map_err(|_| nul("the source"))?;
    let c_file = CString::new(file.as_str()).map_err(|_| nul("the name"))?;
    let options = options_for(target, extra);
    if options.iter().any(|o| o.contains('\0')) {
        return Err(nul("an option"));
    }
    let c_names = names
        .iter()
        .map(|n| CString::new(n.as_str()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| nul("a name expression"))?;
    let program = NvrtcProgram(
        result::create_program(&c_source, Some(&c_file))
            .map_err(|e| failed(name, e, "NVRTC could not create the program: "))?,
    );
    for c_name in &c_names {
        // SAFETY: the program is live and not yet compiled; the name is NUL-terminated.
        unsafe { sys::nvrtcAddNameExpression(program.0, c_name.as_ptr()) }
            .result()
            .map_err(|e| failed(name, e, "NVRTC refused a name expression: "))?;
    }
    // SAFETY: the program is live; no option holds a NUL (checked above).
    if let Err(e) = unsafe { result::compile_program(program.0, &options) } {
        return Err(compile_error(&program, e, name, &file, source));
    }
    let lowered = c_names
        .iter()
        .map(|c_name| lowered_name(&program, c_name))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| failed(name, e, "NVRTC did not lower a name expression: "))?;
    let image = image_of(&program, target).map_err(|e| {
        failed(
            name,
            e,
            "NVRTC compiled the program but did not hand back its code: ",
        )
    })?;
    Ok(Compiled { image, lowered })
}

/// The symbol that the name expression `expression` of a compiled program became.
fn lowered_name(
    program: &NvrtcProgram,
    expression: &CString,
) -> std::result::Result<String, result::NvrtcError> {
    let mut lowered: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the program is live and compiled, and `expression` was added to it before the
    // compile; `lowered` is a valid out-pointer.
    unsafe { sys::nvrtcGetLoweredName(program.0, expression.as_ptr(), &mut lowered) }.result()?;
    if lowered.is_null() {
        return Err(result::NvrtcError(
            sys::nvrtcResult::NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID,
        ));
    }
    // SAFETY: NVRTC hands back a NUL-terminated string owned by the program, which is live;
    // it is copied here.
    Ok(unsafe { std::ffi::CStr::from_ptr(lowered) }
        .to_string_lossy()
        .into_owned())
}

/// NVRTC's options for `target`: the architecture, the include folders, the caller's `extra`
/// (less `-minimal` and `-split-compile` where this NVRTC predates them: they only speed a
/// compile up) and C++17 unless the caller chose a standard.
fn options_for(target: Target, extra: &[String]) -> Vec<String> {
    let mut options: Vec<String> = vec![match target {
        Target::Cubin(a) => format!("--gpu-architecture=sm_{a}"),
        Target::Ptx(a) => format!("--gpu-architecture=compute_{a}"),
    }];
    for dir in include_dirs() {
        options.push(format!("--include-path={dir}"));
    }
    let speedups_known = version().is_some_and(|v| v >= (12, 4));
    options.extend(
        (extra.iter())
            .filter(|o| speedups_known || (o.as_str() != MINIMAL && o.as_str() != SPLIT))
            .cloned(),
    );
    if !extra
        .iter()
        .any(|o| o.starts_with("--std") || o.starts_with("-std"))
    {
        options.push("--std=c++17".into());
    }
    options
}

/// The compile error of a program NVRTC refused: its result code and log, with the source lines
/// the log names.
fn compile_error(
    program: &NvrtcProgram,
    e: result::NvrtcError,
    name: &str,
    file: &str,
    source: &str,
) -> Error {
    // SAFETY: the program is live.
    let log = unsafe { result::get_program_log(program.0) }
        .map(|raw| {
            let bytes: Vec<u8> = raw
                .iter()
                .map(|&c| c as u8)
                .take_while(|&b| b != 0)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .unwrap_or_else(|_| format!("{e:?}"));
    Error::Compile {
        kernel: name.to_string(),
        code: Some(e.0),
        log: with_source_lines(&log, file, source),
    }
}

/// The code of a compiled program: its cubin, or its PTX with the terminating NUL.
fn image_of(
    program: &NvrtcProgram,
    target: Target,
) -> std::result::Result<Vec<u8>, result::NvrtcError> {
    match target {
        Target::Cubin(_) => {
            let mut size = 0usize;
            // SAFETY: the program is live and compiled; `size` is a valid out-pointer.
            unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size) }.result()?;
            let mut image = vec![0u8; size];
            // SAFETY: `image` has the `size` bytes NVRTC writes.
            unsafe { sys::nvrtcGetCUBIN(program.0, image.as_mut_ptr().cast()) }.result()?;
            Ok(image)
        }
        // SAFETY: the program is live and compiled; nvrtcGetPTX's text includes its NUL.
        Target::Ptx(_) => unsafe { result::get_ptx(program.0) }
            .map(|ptx| ptx.into_iter().map(|c| c as u8).collect()),
    }
}

/// Folders NVRTC searches for `#include <...>` (the CUDA headers: `cuda_fp16.h`, ...), found
/// apart from the library ([`SearchEnv::include_dirs`]).
fn include_dirs() -> Vec<String> {
    search_env()
        .include_dirs()
        .into_iter()
        .map(|d| d.display().to_string())
        .collect()
}

/// NVRTC's `log`, followed by each line of `source` that it points at (`file(LINE): ...`), at
/// most ten, so that an error in generated or user code shows the code.
fn with_source_lines(log: &str, file: &str, source: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let mut seen = Vec::new();
    for entry in log.lines() {
        let Some(rest) = entry.strip_prefix(file).and_then(|r| r.strip_prefix('(')) else {
            continue;
        };
        let Some(number) = rest.split(')').next().and_then(|n| n.parse::<usize>().ok()) else {
            continue;
        };
        if number >= 1 && number <= lines.len() && !seen.contains(&number) && seen.len() < 10 {
            seen.push(number);
        }
    }
    let mut out = log.trim_end().to_string();
    for number in seen {
        out.push_str(&format!("\n  line {number}: {}", lines[number - 1].trim()));
    }
    out
}

/// With `CUBRIDGE_TRACE_LOADS` set, one line on stderr per step of loading a module: where
/// first calls spend their time.
pub(super) fn trace(name: &str, step: &str, took: std::time::Duration) {
    static ON: OnceLock<bool> = OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("CUBRIDGE_TRACE_LOADS").is_some()) {
        eprintln!(
            "cubridge: {name}: {step} in {:.2} ms",
            took.as_secs_f64() * 1e3
        );
    }
}

/// For tests that compile with NVRTC without a GPU: adds `$CUBRIDGE_TEST_NVRTC_DIR` (a folder
/// holding libnvrtc) to the search and says whether it was set; when not, notes the skip, or
/// fails the test where `CUBRIDGE_TEST_REQUIRE_NVRTC=1` (`make test`, whose environment
/// installs NVRTC) so that a missing NVRTC is never a silent pass.
#[cfg(test)]
pub(crate) fn test_dir(what: &str) -> bool {
    match std::env::var_os("CUBRIDGE_TEST_NVRTC_DIR") {
        Some(dir) => {
            add_search_dirs([PathBuf::from(dir)]);
            true
        }
        None if std::env::var("CUBRIDGE_TEST_REQUIRE_NVRTC").is_ok_and(|v| v == "1") => {
            panic!("CUBRIDGE_TEST_REQUIRE_NVRTC=1 but CUBRIDGE_TEST_NVRTC_DIR is not set: {what} not compiled")
        }
        None => {
            eprintln!("CUBRIDGE_TEST_NVRTC_DIR is not set: {what} not compiled");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    /// Name expressions come back as their lowered (Itanium-mangled) symbols, in order, when
    /// `CUBRIDGE_TEST_NVRTC_DIR` names a folder holding libnvrtc; one that names nothing in
    /// the source is NVRTC's error.
    #[test]
    fn name_expressions_are_lowered_in_order() {
        if !super::test_dir("name expressions") {
            return;
        }
        let source = "template <typename T> __global__ void add(T* x) { x[0] += 1; }\n\
                      template <int N> __device__ int table[N];\n";
        let names: Vec<String> = ["add<float>", "add<int>", "table<3>"]
            .map(String::from)
            .into();
        let target = super::Target::Cubin(80);
        let compiled = super::compile_named(source, "m", target, (&[], &names)).unwrap();
        assert_eq!(
            compiled.lowered,
            ["_Z3addIfEvPT_", "_Z3addIiEvPT_", "_Z5tableILi3EE"]
        );
        let e = super::compile_named(source, "m", target, (&[], &["nope<1>".into()]));
        assert!(e.is_err());
    }

    #[test]
    fn compile_errors_quote_their_lines() {
        let source = "int a;\nint b = nope;\nint c;\n";
        let log = "k.cu(2): error: identifier \"nope\" is undefined\n\n1 error detected\n";
        let out = super::with_source_lines(log, "k.cu", source);
        assert!(out.starts_with("k.cu(2): error"), "{out}");
        assert!(out.ends_with("line 2: int b = nope;"), "{out}");
        // Lines past the end, and other files, are not quoted.
        let out = super::with_source_lines("k.cu(9): error: x\nother.h(1): y", "k.cu", source);
        assert!(!out.contains("line "), "{out}");
    }
}
