//! cubridge's own kernels (`kernels/`: a common header, and the flat, tiled and gather
//! sources), instantiated per dtype and device, compiled on first use and cached in memory
//! (and, by [`super::nvrtc`], on disk); and programs given as source (users' kernels).

use super::{check, context, nvrtc};
use crate::dtype::DType;
use crate::error::Result;
use cudarc::driver::{result, sys};
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Mutex, OnceLock};

/// The parameter structs of every elementwise kernel (cubridge's own and users'), which every
/// program starts with; mirrored by [`crate::ops::elementwise::params`].
pub const ABI: &str = include_str!("../../kernels/abi.cuh");
/// Packs and the two ways a kernel takes its second input, in namespace `cbt`: after [`ABI`] in
/// the programs of add and of users' tiled kernels.
pub const ACCESS: &str = include_str!("../../kernels/access.cuh");
/// What every module of cubridge's own has after [`ABI`] and [`ACCESS`].
const COMMON: &str = include_str!("../../kernels/common.cuh");
/// The flat loops of every elementwise kernel (contiguous, vector, strided), over the operands
/// and operation of a kernel: add's and users' (`cbt::contiguous`, ...), after [`ABI`].
pub const LOOPS: &str = include_str!("../../kernels/loops.cuh");
/// add's operands for [`LOOPS`], after them.
const FLAT: &str = concat!(
    include_str!("../../kernels/loops.cuh"),
    include_str!("../../kernels/elementwise.cu")
);
/// The tiled kernel, over an operation: add's, and users' (`cbt::tiled`).
pub const TILED: &str = include_str!("../../kernels/tiled.cu");
/// The strided gather of device-side copies.
const GATHER: &str = include_str!("../../kernels/gather.cu");

/// Packs each thread of the vector kernel moves per step (`CB_UNROLL`).
pub const UNROLL: usize = 4;

/// Edge of the tiled kernel's square tiles for inputs `a` and `b` (`TileOf` in the kernels).
pub fn tile_edge(a: DType, b: DType) -> usize {
    let edge = |d: DType| if d.itemsize() <= 4 { 64 } else { 32 };
    edge(a).min(edge(b))
}

/// Dynamic shared memory of the tiled kernel for inputs `a`, `b` and the mask of tiled inputs
/// (bit 0: a, bit 1: b): one tile per tiled input, laid out as `add_tiled` does (a's tile
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

/// Most dimensions the strided kernels take after coalescing (`CB_MAX_DIMS`).
pub const MAX_DIMS: usize = 8;

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

/// A compiled module: which operation, for which dtypes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Module {
    /// Add's kernels of one [`AddPart`] and index width for inputs of dtypes `[a, b]` and
    /// result `r`.
    Add([DType; 3], Second, AddPart, Index),
    Gather(DType),
}

/// How add's kernels take their second input.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Second {
    /// A pointer to an array.
    Array,
    /// One value for every element, among the kernel parameters (a Python scalar), laid out as
    /// the dtype's element.
    Value,
}

/// Add's kernels for one dtype triple, each a module of its own for each index width, compiled
/// on first use: a first call compiles only the kernel it launches (the tiled kernel, which
/// takes most of the compile time, only for transposed layouts; the 64-bit variants only for
/// arrays past 2^31 elements).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AddPart {
    /// One element per access, any alignment.
    Contiguous,
    /// [`vector_width`] elements per aligned access.
    Vector,
    /// Any strides.
    Strided,
    /// 2-D, with a transposed input, through shared-memory tiles.
    Tiled,
}

impl AddPart {
    /// Every part.
    pub const ALL: [AddPart; 4] = [
        AddPart::Contiguous,
        AddPart::Vector,
        AddPart::Strided,
        AddPart::Tiled,
    ];
    /// The flat kernels (what [`add`] serves).
    pub const FLAT: [AddPart; 3] = [AddPart::Contiguous, AddPart::Vector, AddPart::Strided];
}

/// Loaded functions (`CUfunction` addresses, in the order asked for) by device and module. Modules
/// stay loaded for the process, so their lists are leaked and handed out without copying.
type FunctionCache = HashMap<(u32, Module), &'static [usize]>;
static CACHE: Mutex<Option<FunctionCache>> = Mutex::new(None);

/// The same for programs given as source (users' kernels), keyed by everything that makes them.
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

/// Loads `program` into `ordinal`'s context, and finds its functions: its cubin shipped in the
/// build where there is one for the device (see [`super::shipped`]), else the disk cache's
/// (see [`super::disk_cache`]), else NVRTC's. A shipped or cached image that the driver refuses
/// (an older driver, say) is passed over for a compile; a refused cache entry is discarded.
/// Where this copy of cubridge hands its work to the process's runtime (see
/// [`crate::runtime`]), that runtime loads it.
fn load(ordinal: u32, program: &Program) -> Result<&'static [usize]> {
    if let Some(runtime) = crate::runtime::shared() {
        // The process's runtime loads it, from its caches: one compile per process.
        return Ok(runtime.program(ordinal, program)?.leak());
    }
    context::bind(ordinal)?;
    let arch = arch(ordinal)?;
    let load_image = |image: &[u8]| {
        // SAFETY: `image` is a cubin or NUL-terminated PTX, alive for the call; a context is
        // current. The module stays loaded for the process (its functions are cached).
        check(
            unsafe { result::module::load_data(image.as_ptr().cast()) },
            "loading a compiled kernel module",
        )
    };
    let (source, options) = (&program.source, &program.options);
    let shipped = || match super::shipped::find(&nvrtc::key(source, options), arch) {
        Some(image) => refused_as_none(load_image(image)),
        None => Ok(None),
    };
    let cached = || {
        let Some(entry) = nvrtc::cache_entry(source, options, arch) else {
            return Ok(None);
        };
        let Some(image) = entry.read() else {
            return Ok(None);
        };
        refused_as_none(load_image(&image).inspect_err(|e| {
            if e.cuda_code().is_some_and(super::is_image_refusal) {
                entry.discard(&e.to_string());
            }
        }))
    };
    let started = std::time::Instant::now();
    let (loaded, how) = match shipped()? {
        Some(module) => (module, "shipped"),
        None => match cached()? {
            Some(module) => (module, "disk cache"),
            None => {
                nvrtc::ensure_loaded()?;
                trace(&program.name, "NVRTC ready", started.elapsed());
                let image = nvrtc::compile(source, &program.name, arch, options)?;
                let compiled = started.elapsed();
                let module = load_image(&image)?;
                trace(&program.name, "compiled", compiled);
                (module, "its compile loaded")
            }
        },
    };
    trace(&program.name, how, started.elapsed());
    let mut found = Vec::new();
    for name in &program.functions {
        let cname = CString::new(name.as_str())
            .map_err(|_| crate::Error::invalid("a kernel name has a NUL"))?;
        // SAFETY: `loaded` is a loaded module; `cname` is NUL-terminated.
        let f = check(
            unsafe { result::module::get_function(loaded, cname) },
            &format!("finding kernel `{name}` in its module"),
        )?;
        found.push(f as usize);
    }
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

/// With `CUBRIDGE_TRACE_LOADS` set, one line on stderr per step of loading a module: where
/// first calls spend their time.
fn trace(name: &str, step: &str, took: std::time::Duration) {
    static ON: OnceLock<bool> = OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("CUBRIDGE_TRACE_LOADS").is_some()) {
        eprintln!(
            "cubridge: {name}: {step} in {:.2} ms",
            took.as_secs_f64() * 1e3
        );
    }
}

/// The functions of one of cubridge's own `module`s on `ordinal`, compiling and loading it on
/// first use (`build` makes its program only then). A cache hit costs one lock and one hash
/// lookup.
fn functions(
    ordinal: u32,
    module: Module,
    build: impl FnOnce() -> Program,
) -> Result<&'static [usize]> {
    let mut guard = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let cache = guard.get_or_insert_with(HashMap::new);
    if let Some(&found) = cache.get(&(ordinal, module)) {
        return Ok(found);
    }
    let found = load(ordinal, &build())?;
    cache.insert((ordinal, module), found);
    Ok(found)
}

/// The functions of `program` on `ordinal` (`CUfunction`s, in the order of
/// `program.functions`), compiled and loaded once per process and device. Callers that launch
/// often keep what this returns: a lookup hashes the whole source.
pub fn program(ordinal: u32, program: &Program) -> Result<&'static [usize]> {
    let mut guard = SOURCES.lock().unwrap_or_else(|p| p.into_inner());
    let cache = guard.get_or_insert_with(HashMap::new);
    if let Some(&found) = cache.get(&(ordinal, program.clone())) {
        return Ok(found);
    }
    let found = load(ordinal, program)?;
    cache.insert((ordinal, program.clone()), found);
    Ok(found)
}

/// The programs given as source that [`program`] loaded in this process, as (name, device)
/// pairs: users' kernels and extension crates' (whose copies of cubridge load them here).
pub fn loaded_programs() -> Vec<(String, u32)> {
    let guard = SOURCES.lock().unwrap_or_else(|p| p.into_inner());
    let keys = guard.iter().flat_map(|cache| cache.keys());
    keys.map(|(ordinal, p)| (p.name.clone(), *ordinal))
        .collect()
}

/// Whether `dtype` needs the float16/bfloat16 headers (`CB_HALF` in `common.cuh`).
fn is_half(dtype: DType) -> bool {
    matches!(dtype, DType::Float16 | DType::BFloat16)
}

/// A program of cubridge's own: the ABI and common headers, one kernel source `part`, and
/// `wrappers`;
/// `half` where a float16 or bfloat16 operand needs their headers. Compiled with NVRTC's
/// `-minimal`, which leaves out what these kernels never use (textures, device-side launches,
/// the runtime's types): the same machine code, 5 to 30 ms sooner per module on the
/// development machine.
fn own(name: String, half: bool, part: &str, wrappers: String, functions: &[&str]) -> Program {
    let define = if half { "#define CB_HALF\n" } else { "" };
    Program {
        name,
        source: format!("{define}{ABI}\n{ACCESS}\n{COMMON}\n{part}\n{wrappers}"),
        options: vec![nvrtc::MINIMAL.to_string()],
        functions: functions.iter().map(|f| f.to_string()).collect(),
    }
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

/// Elements per 16-byte access of the widest operand (1 for 16-byte elements).
pub fn vector_width(a: DType, b: DType, r: DType) -> usize {
    let widest = a.itemsize().max(b.itemsize()).max(r.itemsize());
    (16 / widest).max(1)
}

/// One of add's flat kernels ([`AddPart::Contiguous`], [`AddPart::Vector`] or
/// [`AddPart::Strided`]) for inputs `a`, `b` and result `r` on `ordinal`, in the `index` width.
/// With [`Second::Value`], b is one value of dtype `b` (which then equals `a` and `r`).
pub fn add(
    ordinal: u32,
    dtypes: [DType; 3],
    second: Second,
    index: Index,
    part: AddPart,
) -> Result<sys::CUfunction> {
    if part == AddPart::Tiled {
        return Err(crate::Error::invalid(
            "kernels::add serves the flat kernels; the tiled one is kernels::add_tiled",
        ));
    }
    let f = add_module(ordinal, dtypes, second, part, index)?;
    Ok(f[0] as sys::CUfunction)
}

/// The tiled add kernel (2-D, with a transposed input, through shared-memory tiles).
pub struct TiledKernel {
    /// The kernel.
    pub function: sys::CUfunction,
    /// Whether it can move interior tiles in pairs of elements (2-byte dtypes): bit 2 of its
    /// tile mask asks for that, which the host may set only where every pointer is 4-byte
    /// aligned, out's and the tiled inputs' strides across are even, and an input read in place
    /// has unit stride along cols and an even stride across.
    pub pairs: bool,
}

/// The tiled add kernel; arguments as [`add`]'s.
pub fn add_tiled(
    ordinal: u32,
    dtypes: [DType; 3],
    second: Second,
    index: Index,
) -> Result<TiledKernel> {
    let f = add_module(ordinal, dtypes, second, AddPart::Tiled, index)?;
    Ok(TiledKernel {
        function: f[0] as sys::CUfunction,
        pairs: pairs(dtypes),
    })
}

/// Whether the tiled kernel of a dtype triple (its two inputs and its result) moves pairs: all
/// three of 2 bytes.
pub fn pairs(dtypes: [DType; 3]) -> bool {
    dtypes.iter().all(|d| d.itemsize() == 2)
}

/// Compiles (once) and finds one part of the add kernels in one index width.
fn add_module(
    ordinal: u32,
    dtypes: [DType; 3],
    second: Second,
    part: AddPart,
    index: Index,
) -> Result<&'static [usize]> {
    functions(ordinal, Module::Add(dtypes, second, part, index), || {
        add_program(dtypes, second, part, index)
    })
}

/// The program of one part of the add kernels for one dtype triple and index width. Each kernel
/// takes the parameters of its variant as `kernels/abi.cuh` lays them out for the operands a, b
/// (an array, or a value: a `Splat`), out.
fn add_program([a, b, r]: [DType; 3], second: Second, part: AddPart, index: Index) -> Program {
    let (wrapper, name) = add_wrapper([a, b, r], second, part, index);
    let (source, label) = match part {
        AddPart::Contiguous => (FLAT, "_contiguous"),
        AddPart::Vector => (FLAT, "_vector"),
        AddPart::Strided => (FLAT, "_strided"),
        AddPart::Tiled => (TILED, "_tiled"),
    };
    let suffix = match index {
        Index::I32 => "32",
        Index::I64 => "64",
    };
    let key = match second {
        Second::Array => format!("add_{a}_{b}_{r}{label}_{suffix}"),
        Second::Value => format!("add_scalar_{a}{label}_{suffix}"),
    };
    let half = [a, b, r].iter().any(|&d| is_half(d));
    own(key, half, source, wrapper, &[name])
}

/// How add's kernels take b (`tb` its C type; `signed` the strided index type).
struct SecondInput {
    /// The parameter of a flat kernel and of a strided one.
    flat: String,
    strided: String,
    /// The type the templates read it as, and that read in a flat and in a strided kernel.
    reader: String,
    read: String,
    read_strided: String,
    /// Its strides, and its strides along the tiled kernel's two dimensions.
    strides: &'static str,
    tile: String,
}

fn second_input(second: Second, tb: &str, signed: &str) -> SecondInput {
    match second {
        Second::Array => SecondInput {
            flat: format!("const {tb}* b"),
            strided: format!("CbStrided<{tb}> b"),
            reader: format!("Dense<{tb}>"),
            read: format!("Dense<{tb}>{{b}}"),
            read_strided: format!("Dense<{tb}>{{b.p}}"),
            strides: "b.s",
            tile: format!("({signed})b.s[0], ({signed})b.s[1]"),
        },
        Second::Value => SecondInput {
            flat: format!("Splat<{tb}> b"),
            strided: format!("Splat<{tb}> b"),
            reader: format!("Splat<{tb}>"),
            read: "b".to_string(),
            read_strided: "b".to_string(),
            strides: "nullptr",
            tile: format!("({signed})0, ({signed})0"),
        },
    }
}

/// The `extern "C"` wrapper of add's kernel `part` for dtypes `[a, b, r]`, and its name.
fn add_wrapper(
    [a, b, r]: [DType; 3],
    second: Second,
    part: AddPart,
    index: Index,
) -> (String, &'static str) {
    let (ta, tb, tr) = (c_type(a), c_type(b), c_type(r));
    // The 32-bit variants index in `unsigned int` (contiguous) or `int` (strided, tiled).
    let (unsigned, signed) = match index {
        Index::I32 => ("unsigned int", "int"),
        Index::I64 => ("long long", "long long"),
    };
    let b_in = second_input(second, tb, signed);
    let flat = |name: &str, lp: &str, v: usize| {
        format!(
            "extern \"C\" __global__ void {name}(const {ta}* a, {}, {tr}* o, long long n) \
             {{ cbt::{lp}<AddFlat<{ta}, {tb}, {tr}, {v}, {}>, {unsigned}>({{a, {}, o}}, n); }}\n",
            b_in.flat, b_in.reader, b_in.read
        )
    };
    match part {
        AddPart::Contiguous => (
            flat("cb_add_contiguous", "contiguous", 1),
            "cb_add_contiguous",
        ),
        AddPart::Vector => (
            flat("cb_add_vector", "vector", vector_width(a, b, r)),
            "cb_add_vector",
        ),
        AddPart::Strided => (
            format!(
                "extern \"C\" __global__ void cb_add_strided(CbStrided<{ta}> a, {}, \
                 CbStrided<{tr}> o, long long n, CbShape g) {{ cbt::strided<AddStrided<{ta}, \
                 {tb}, {tr}, {}>, {signed}>({{a, {}, {}, o}}, n, g); }}\n",
                b_in.strided, b_in.reader, b_in.read_strided, b_in.strides
            ),
            "cb_add_strided",
        ),
        AddPart::Tiled => (add_tiled_wrapper([a, b, r], &b_in, index), "cb_add_tiled"),
    }
}

/// The wrapper of add's tiled kernel. It keeps four blocks per SM (at most 64 registers a
/// thread): its loads in flight, not its arithmetic, set its speed. Its 64-bit addresses need
/// more registers, so the 64-bit variant keeps three (80 registers: no spills).
fn add_tiled_wrapper([a, b, r]: [DType; 3], b_in: &SecondInput, index: Index) -> String {
    let (ta, tb, tr) = (c_type(a), c_type(b), c_type(r));
    let (signed, blocks) = match index {
        Index::I32 => ("int", 4),
        Index::I64 => ("long long", 3),
    };
    format!(
        "extern \"C\" __global__ void __launch_bounds__(256, {blocks}) \
         cb_add_tiled(CbStrided<{ta}> a, {}, CbStrided<{tr}> o, long long n, \
         CbShape g, int tile) {{ (void)n; cbt::tiled<AddOp<{ta}, {tb}, {tr}>, {ta}, {tb}, \
         {tr}, {signed}, {}, {}>(AddOp<{ta}, {tb}, {tr}>{{}}, o.p, a.p, \
         {}, ({signed})g.d[0], ({signed})g.d[1], \
         ({signed})o.s[0], ({signed})a.s[0], ({signed})a.s[1], {}, tile); }}\n",
        b_in.strided,
        b_in.reader,
        pairs([a, b, r]),
        b_in.read_strided,
        b_in.tile
    )
}

/// The strided gather kernel for `dtype` on `ordinal`.
pub fn gather(ordinal: u32, dtype: DType) -> Result<sys::CUfunction> {
    let f = functions(ordinal, Module::Gather(dtype), || gather_program(dtype))?;
    Ok(f[0] as sys::CUfunction)
}

/// The program of the gather kernel for `dtype`.
fn gather_program(dtype: DType) -> Program {
    let t = c_type(dtype);
    let wrappers = format!(
        "extern \"C\" __global__ void cb_gather(CbStrided<{t}> s, {t}* o, long long n, \
         CbShape g) {{ gather<{t}>(o, s, n, g); }}\n"
    );
    own(
        format!("gather_{dtype}"),
        is_half(dtype),
        GATHER,
        wrappers,
        &["cb_gather"],
    )
}

/// The dtypes whose add (same dtype on both sides, array or scalar second input) and gather
/// kernels ship in the build: all fifteen, so that no same-dtype first call compiles.
const SHIPPED_DTYPES: [DType; 15] = [
    DType::Bool,
    DType::Int8,
    DType::Int16,
    DType::Int32,
    DType::Int64,
    DType::UInt8,
    DType::UInt16,
    DType::UInt32,
    DType::UInt64,
    DType::Float16,
    DType::BFloat16,
    DType::Float32,
    DType::Float64,
    DType::Complex64,
    DType::Complex128,
];

/// The mixed-dtype adds that ship, with their result: float16 and bfloat16 with float32 and with
/// float64, either way round (the promotions that need the half-precision headers, whose compile
/// takes longest).
const SHIPPED_PAIRS: [(DType, DType, DType); 8] = [
    (DType::Float16, DType::Float32, DType::Float32),
    (DType::Float32, DType::Float16, DType::Float32),
    (DType::BFloat16, DType::Float32, DType::Float32),
    (DType::Float32, DType::BFloat16, DType::Float32),
    (DType::Float16, DType::Float64, DType::Float64),
    (DType::Float64, DType::Float16, DType::Float64),
    (DType::BFloat16, DType::Float64, DType::Float64),
    (DType::Float64, DType::BFloat16, DType::Float64),
];

/// The programs compiled ahead of time and shipped in the build (see [`super::shipped`]): for
/// the common dtypes and promotions, add's flat and tiled kernels with 32-bit indices (64-bit
/// ones serve only arrays past 2^31 elements), the scalar add, and the gather.
pub fn shipped_programs() -> Vec<Program> {
    let mut programs = Vec::new();
    let triples = SHIPPED_DTYPES
        .iter()
        .map(|&d| [d, d, d])
        .chain(SHIPPED_PAIRS.iter().map(|&(a, b, r)| [a, b, r]));
    for t in triples {
        for part in AddPart::ALL {
            programs.push(add_program(t, Second::Array, part, Index::I32));
        }
        if t[0] == t[1] {
            for part in AddPart::FLAT {
                programs.push(add_program(t, Second::Value, part, Index::I32));
            }
        }
    }
    programs.extend(SHIPPED_DTYPES.iter().map(|&d| gather_program(d)));
    programs
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

/// Compiles cubridge's own programs with NVRTC when `CUBRIDGE_TEST_NVRTC_DIR` names a folder
/// holding libnvrtc (no GPU needed): add's flat and tiled parts for every dtype with itself and
/// the common promotions, in both index widths and with a scalar second input, and the gather
/// of every dtype. Skipped (with a note) otherwise.
#[cfg(test)]
mod compile_tests {
    use super::*;

    #[test]
    fn own_programs_compile() {
        if !nvrtc::test_dir("cubridge's kernels") {
            return;
        }
        let mut triples: Vec<[DType; 3]> = DType::ALL.iter().map(|&d| [d, d, d]).collect();
        for (a, b) in [
            (DType::Float16, DType::Float32),
            (DType::BFloat16, DType::Float32),
            (DType::Int8, DType::Int64),
            (DType::Complex64, DType::Float64),
        ] {
            triples.push([a, b, DType::promote(a, b, "add").unwrap()]);
        }
        let mut programs = Vec::new();
        for t in triples {
            for part in AddPart::ALL {
                for index in [Index::I32, Index::I64] {
                    programs.push(add_program(t, Second::Array, part, index));
                }
            }
            if t[0] == t[1] {
                for part in AddPart::FLAT {
                    programs.push(add_program(t, Second::Value, part, Index::I32));
                }
            }
        }
        programs.extend(DType::ALL.iter().map(|&d| gather_program(d)));
        for p in programs {
            let name = format!("test_{}_{}", p.name, std::process::id());
            if let Err(e) = nvrtc::compile(&p.source, &name, 80, &p.options) {
                panic!("{}: {e}", p.name);
            }
        }
    }
}
