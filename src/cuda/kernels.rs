//! Programs given as source (the elementwise engine's, `add`'s among them, and extension
//! crates'), compiled on first use and cached in memory (and, by [`super::nvrtc`], on disk);
//! and the headers of `kernels/` they are made of.

use super::{check, context, nvrtc};
use crate::dtype::DType;
use crate::error::Result;
use cudarc::driver::{result, sys};
use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::sync::{Condvar, Mutex};

/// The parameter structs of every elementwise kernel, which every program starts with; mirrored
/// by [`crate::ops::elementwise::params`].
pub const ABI: &str = include_str!("../../kernels/abi.cuh");
/// The two ways the tiled kernel takes its second input, in namespace `cbt`, after [`ABI`].
pub const ACCESS: &str = include_str!("../../kernels/access.cuh");
/// The flat loops of every elementwise kernel (contiguous, vector, strided), over its operands
/// and operation (`cbt::contiguous`, ...), after [`ABI`].
pub const LOOPS: &str = include_str!("../../kernels/loops.cuh");
/// The tiled kernel, over an elementwise operation (`cbt::tiled`).
pub const TILED: &str = include_str!("../../kernels/tiled.cu");

/// Packs each thread of the vector kernel moves per step (`CB_UNROLL`).
pub const UNROLL: usize = 4;

/// Edge of the tiled kernel's square tiles for inputs `a` and `b` (`TileOf` in the kernels).
pub fn tile_edge(a: DType, b: DType) -> usize {
    let edge = |d: DType| if d.itemsize() <= 4 { 64 } else { 32 };
    edge(a).min(edge(b))
}

/// Dynamic shared memory of the tiled kernel for inputs `a`, `b` and the mask of tiled inputs
/// (bit 0: a, bit 1: b): one tile per tiled input, laid out as `cbt::tiled` does (a's tile
/// first, rounded up to 16 bytes; rows padded to a word past the edge). Mirrors `TileOf` in
/// the kernels.
pub fn tile_shared_bytes(a: DType, b: DType, mask: i32) -> u32 {
    let edge = tile_edge(a, b);
    let bytes = |d: DType| {
        let size = d.itemsize();
        let pad = if size >= 4 { 1 } else { 4 / size };
        edge * (edge + pad) * size
    };
    let mut total = 0;
    if mask & 1 != 0 {
        total += bytes(a).div_ceil(16) * 16;
    }
    if mask & 2 != 0 {
        total += bytes(b);
    }
    total as u32
}

/// Threads of a tiled-kernel block, (x, y).
pub const TILE_BLOCK: (u32, u32) = (32, 8);

/// The CUDA C++ type that stores a dtype.
pub fn c_type(d: DType) -> &'static str {
    match d {
        DType::Bool => "bool",
        DType::Int8 => "signed char",
        DType::Int16 => "short",
        DType::Int32 => "int",
        DType::Int64 => "long long",
        DType::UInt8 => "unsigned char",
        DType::UInt16 => "unsigned short",
        DType::UInt32 => "unsigned int",
        DType::UInt64 => "unsigned long long",
        DType::Float16 => "__half",
        DType::BFloat16 => "__nv_bfloat16",
        DType::Float32 => "float",
        DType::Float64 => "double",
        DType::Complex64 => "cb_complex<float>",
        DType::Complex128 => "cb_complex<double>",
    }
}

/// Loaded functions (`CUfunction` addresses, in the order asked for) by device and program.
/// Modules stay loaded for the process, so their lists are leaked and handed out without
/// copying.
type SourceCache = HashMap<(u32, Program), &'static [usize]>;
static SOURCES: Mutex<Option<SourceCache>> = Mutex::new(None);

/// CUDA C++ to compile with NVRTC and the `extern "C"` functions to find in it.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Program {
    /// Names the program in the disk cache's errors (`name.cu` in NVRTC's log).
    pub name: String,
    /// The whole source.
    pub source: String,
    /// NVRTC options beyond the architecture (C++17 unless one of them sets a standard).
    pub options: Vec<String>,
    /// The functions to find, in the order [`program`] returns them.
    pub functions: Vec<String>,
}

/// The compute capability of `ordinal` as a number (9.0 → 90).
fn arch(ordinal: u32) -> Result<u32> {
    use sys::CUdevice_attribute::*;
    let major = context::attribute(ordinal, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = context::attribute(ordinal, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    Ok((major * 10 + minor) as u32)
}

/// A module to compile: a program's source and options, and the name expressions (template
/// instances: `add<float>`) whose lowered names NVRTC reports.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Source {
    /// Names the module in errors (`name.cu` in NVRTC's log).
    pub name: String,
    /// The whole source.
    pub source: String,
    /// NVRTC options beyond the architecture.
    pub options: Vec<String>,
    /// Name expressions, whose lowered names [`Module::lowered`] holds in this order.
    pub name_expressions: Vec<String>,
}

/// A module loaded into a device's primary context, for the process.
#[derive(Debug)]
pub struct Module {
    /// The driver's `CUmodule`, as an address.
    pub handle: usize,
    /// The symbol each name expression became, in the order of [`Source::name_expressions`].
    pub lowered: Vec<String>,
}

/// What a module is made of.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum Code {
    /// CUDA C++ for NVRTC.
    Source(Source),
    /// A precompiled cubin, fatbin or NUL-terminated PTX, as `cuModuleLoadData` takes it.
    Image(Vec<u8>),
}

/// Loaded modules by device and code (leaked, as modules stay loaded for the process), and
/// those a thread is loading now.
#[derive(Default)]
struct Modules {
    loaded: HashMap<(u32, Code), &'static Module>,
    loading: HashSet<(u32, Code)>,
}
static MODULES: Mutex<Option<Modules>> = Mutex::new(None);
/// Signalled when a thread ends a module's load.
static LOADED: Condvar = Condvar::new();

/// The module of `code` on `ordinal`, loaded once per process and device; leaves the device's
/// context current. A source is compiled from its cubin shipped in the build where there is one
/// for the device (see [`super::shipped`]), else the disk cache's (see [`super::disk_cache`];
/// with the lowered names of its name expressions), else NVRTC's. A shipped or cached image
/// that the driver refused (an older driver, say) is passed over for a compile; a refused cache
/// entry is discarded. No lock is held while a module compiles: other modules load meanwhile
/// (a background compile of a tiled program takes hundreds of milliseconds), and a thread that
/// asks for the same one waits for it. (Callers reach this through [`super::shared::module`],
/// which hands it to the process's runtime where this copy of cubridge adopted one.)
pub fn module(ordinal: u32, code: &Code) -> Result<&'static Module> {
    context::bind(ordinal)?;
    let key = (ordinal, code.clone());
    let mut guard = crate::lock(&MODULES);
    loop {
        let modules = guard.get_or_insert_with(Modules::default);
        if let Some(&found) = modules.loaded.get(&key) {
            return Ok(found);
        }
        if modules.loading.insert(key.clone()) {
            break;
        }
        guard = LOADED.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
    drop(guard);
    let loading = Loading(&key);
    let module = match code {
        Code::Source(source) => load_module(ordinal, source)?,
        Code::Image(image) => Module {
            handle: load_image(image)? as usize,
            lowered: Vec::new(),
        },
    };
    let found: &'static Module = Box::leak(Box::new(module));
    let mut guard = crate::lock(&MODULES);
    let modules = guard.get_or_insert_with(Modules::default);
    modules.loaded.insert(key.clone(), found);
    drop(guard);
    drop(loading);
    Ok(found)
}

/// A module this thread is loading; dropped (loaded, failed or unwound), it lets waiting
/// threads look again.
struct Loading<'k>(&'k (u32, Code));

impl Drop for Loading<'_> {
    fn drop(&mut self) {
        if let Some(modules) = crate::lock(&MODULES).as_mut() {
            modules.loading.remove(self.0);
        }
        LOADED.notify_all();
    }
}

/// Loads a cubin or NUL-terminated PTX into the current context.
fn load_image(image: &[u8]) -> Result<sys::CUmodule> {
    // SAFETY: `image` is a cubin, fatbin or NUL-terminated PTX, alive for the call; a context
    // is current. The module stays loaded for the process.
    check(
        unsafe { result::module::load_data(image.as_ptr().cast()) },
        "loading a compiled kernel module",
    )
}

/// [`module`]'s work, for a module not loaded yet; binds the device's context.
fn load_module(ordinal: u32, src: &Source) -> Result<Module> {
    let arch = arch(ordinal)?;
    let (source, options, names) = (&src.source, &src.options, &src.name_expressions);
    let key = nvrtc::module_key(source, options, names);
    let shipped = || match super::shipped::find(&key, arch).filter(|_| names.is_empty()) {
        Some(image) => refused_as_none(load_image(image)),
        None => Ok(None),
    };
    let cached = || {
        let Some(entry) = nvrtc::entry_for(key.clone(), arch) else {
            return Ok(None);
        };
        let Some(payload) = entry.read() else {
            return Ok(None);
        };
        let Some((image, lowered)) = super::disk_cache::split_names(&payload, names.len()) else {
            entry.discard("its name expressions do not match");
            return Ok(None);
        };
        let loaded = refused_as_none(load_image(image).inspect_err(|e| {
            if e.cuda_code().is_some_and(super::is_image_refusal) {
                entry.discard(&e.to_string());
            }
        }))?;
        Ok(loaded.map(|m| (m, lowered)))
    };
    let started = std::time::Instant::now();
    let ((loaded, lowered), how) = match shipped()? {
        Some(module) => ((module, Vec::new()), "shipped"),
        None => match cached()? {
            Some(found) => (found, "disk cache"),
            None => {
                nvrtc::ensure_loaded()?;
                nvrtc::trace(&src.name, "NVRTC ready", started.elapsed());
                let compiled = nvrtc::compile_module(source, &src.name, arch, (options, names))?;
                nvrtc::trace(&src.name, "compiled", started.elapsed());
                let module = load_image(&compiled.image)?;
                ((module, compiled.lowered), "its compile loaded")
            }
        },
    };
    nvrtc::trace(&src.name, how, started.elapsed());
    Ok(Module {
        handle: loaded as usize,
        lowered,
    })
}

/// The function `name` of a loaded `module`; a name the module lacks is the driver's
/// `CUDA_ERROR_NOT_FOUND`, naming the function.
pub fn function(module: usize, name: &str) -> Result<usize> {
    let cname = CString::new(name).map_err(|_| crate::Error::invalid("a kernel name has a NUL"))?;
    // SAFETY: `module` is a loaded module (it stays loaded for the process); `cname` is
    // NUL-terminated.
    let f = check(
        unsafe { result::module::get_function(module as sys::CUmodule, cname) },
        &format!("finding kernel `{name}` in its module"),
    )?;
    Ok(f as usize)
}

/// The address and size in bytes of the `__device__` or `__constant__` variable `name` of a
/// loaded `module`; a name the module lacks is the driver's `CUDA_ERROR_NOT_FOUND`.
pub fn global(module: usize, name: &str) -> Result<(usize, usize)> {
    let cname =
        CString::new(name).map_err(|_| crate::Error::invalid("a variable name has a NUL"))?;
    // SAFETY: `module` is a loaded module (it stays loaded for the process); `cname` is
    // NUL-terminated.
    let (ptr, bytes) = check(
        unsafe { result::module::get_global(module as sys::CUmodule, cname) },
        &format!("finding variable `{name}` in its module"),
    )?;
    Ok((ptr as usize, bytes))
}

/// Loads `program` into `ordinal`'s context (see [`module`]), and finds its functions.
fn load(ordinal: u32, program: &Program) -> Result<&'static [usize]> {
    let source = Source {
        name: program.name.clone(),
        source: program.source.clone(),
        options: program.options.clone(),
        name_expressions: Vec::new(),
    };
    let loaded = module(ordinal, &Code::Source(source))?;
    let found = (program.functions.iter())
        .map(|name| function(loaded.handle, name))
        .collect::<Result<Vec<_>>>()?;
    Ok(Vec::leak(found))
}

/// A module the driver loaded, `None` for an image it refused as such (code for another
/// architecture, PTX newer than the driver: a compile may still serve), or any other error.
fn refused_as_none(loaded: Result<sys::CUmodule>) -> Result<Option<sys::CUmodule>> {
    match loaded {
        Ok(module) => Ok(Some(module)),
        Err(e) if e.cuda_code().is_some_and(super::is_image_refusal) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The functions of `program` on `ordinal` (`CUfunction`s, in the order of
/// `program.functions`), compiled and loaded once per process and device. Callers that launch
/// often keep what this returns: a lookup hashes the whole source. (Callers reach this through
/// [`super::shared::program`], which hands it to the process's runtime where this copy of
/// cubridge adopted one.)
pub fn program(ordinal: u32, program: &Program) -> Result<&'static [usize]> {
    let key = (ordinal, program.clone());
    if let Some(&found) = crate::lock(&SOURCES).as_ref().and_then(|c| c.get(&key)) {
        return Ok(found);
    }
    // Loaded without the lock ([`module`] loads each module once): two threads that both get
    // here find the same functions.
    let found = load(ordinal, program)?;
    let mut guard = crate::lock(&SOURCES);
    Ok(*guard
        .get_or_insert_with(HashMap::new)
        .entry(key)
        .or_insert(found))
}

/// Whether `program` loads on `ordinal` without NVRTC: loaded already in this copy of
/// cubridge, shipped for the device, or in the disk cache (where [`module`] looks).
pub fn loads_without_compile(ordinal: u32, program: &Program) -> bool {
    let loaded = crate::lock(&SOURCES)
        .as_ref()
        .is_some_and(|c| c.contains_key(&(ordinal, program.clone())));
    if loaded {
        return true;
    }
    let Ok(arch) = arch(ordinal) else {
        return true; // the load reports it
    };
    let key = nvrtc::module_key(&program.source, &program.options, &[]);
    super::shipped::find(&key, arch).is_some()
        || nvrtc::entry_for(key, arch).is_some_and(|entry| entry.exists())
}

/// The modules loaded from source in this process, as (name, device) pairs: the elementwise
/// engine's (add's and users' kernels'), users' raw kernels and modules, and extension crates'
/// (whose copies of cubridge load them here).
pub fn loaded_programs() -> Vec<(String, u32)> {
    let guard = crate::lock(&MODULES);
    let keys = guard.iter().flat_map(|modules| modules.loaded.keys());
    keys.filter_map(|(ordinal, code)| match code {
        Code::Source(s) => Some((s.name.clone(), *ordinal)),
        Code::Image(_) => None,
    })
    .collect()
}

/// Most elements (and element offsets) the 32-bit kernels take, with room for a grid-stride step
/// past the end.
pub const I32_LIMIT: usize = (i32::MAX as usize) - (1 << 24);

/// Whether every index and element offset of a loop over `n` elements of `shape`, with each
/// operand's element `strides`, fits the 32-bit kernels.
pub fn fits_32_bits(n: usize, shape: &[usize], strides: &[&[isize]]) -> bool {
    n <= I32_LIMIT
        && strides.iter().all(|strides| {
            let mut reach: usize = 0;
            for (&extent, &stride) in shape.iter().zip(strides.iter()) {
                let span = (extent.saturating_sub(1)).saturating_mul(stride.unsigned_abs());
                reach = reach.saturating_add(span);
            }
            reach <= I32_LIMIT
        })
}

/// Index width of a kernel variant: 32-bit arithmetic where every index and offset fits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Index {
    /// `unsigned int` (contiguous) or `int` (strided, tiled) indices.
    I32,
    /// `long long` indices.
    I64,
}

/// Whether the tiled kernel of a dtype triple (its two inputs and its result) moves pairs: all
/// three of 2 bytes.
pub fn pairs(dtypes: [DType; 3]) -> bool {
    dtypes.iter().all(|d| d.itemsize() == 2)
}

/// Resident threads per SM the grid-stride kernels aim for (full occupancy on recent GPUs).
const THREADS_PER_SM: usize = 2048;

/// Blocks of `block` threads to launch when `wanted` would give every thread (or, for tiles,
/// every block) one item: at most what the device holds at once; grid-stride loops do the rest.
pub fn grid(ordinal: u32, wanted: usize, block: u32) -> Result<u32> {
    let sms = context::sm_count(ordinal)?;
    let resident = sms * (THREADS_PER_SM / block as usize).max(1);
    Ok(wanted.clamp(1, resident) as u32)
}
