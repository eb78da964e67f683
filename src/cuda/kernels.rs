//! The elementwise kernels of `kernels/elementwise.cu`, instantiated per dtype and device,
//! compiled on first use and cached in memory (and, by [`super::nvrtc`], on disk).

use super::{check, context, nvrtc};
use crate::dtype::DType;
use crate::error::Result;
use cudarc::driver::{result, sys};
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Mutex;

const SOURCE: &str = include_str!("../../kernels/elementwise.cu");

/// Most dimensions the strided kernels take after coalescing (`CB_MAX_DIMS`).
pub const MAX_DIMS: usize = 8;

/// The strided kernels' `Geometry` parameter, laid out as the C struct.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Geometry {
    /// Shape, innermost last.
    pub shape: [i64; MAX_DIMS],
    /// Element strides of out, a, b (or out, src).
    pub stride: [[i64; MAX_DIMS]; 3],
    /// Number of dimensions in use.
    pub ndim: i32,
}

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
        DType::Complex64 => "c64",
        DType::Complex128 => "c128",
    }
}

/// Loaded functions (name, `CUfunction` address) by device and instantiation key.
type FunctionCache = HashMap<(u32, String), Vec<(String, usize)>>;
static CACHE: Mutex<Option<FunctionCache>> = Mutex::new(None);

/// The compute capability of `ordinal` as a number (9.0 → 90).
fn arch(ordinal: u32) -> Result<u32> {
    use sys::CUdevice_attribute::*;
    let major = context::attribute(ordinal, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = context::attribute(ordinal, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    Ok((major * 10 + minor) as u32)
}

/// Loads (compiling if needed) the module `key` with `wrappers` appended to the kernel source,
/// and returns the named functions, in order.
fn functions(ordinal: u32, key: &str, wrappers: &str, names: &[&str]) -> Result<Vec<usize>> {
    let mut guard = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let cache = guard.get_or_insert_with(HashMap::new);
    if let Some(found) = cache.get(&(ordinal, key.to_string())) {
        return Ok(found.iter().map(|(_, f)| *f).collect());
    }
    context::bind(ordinal)?;
    let source = format!("{SOURCE}\n{wrappers}");
    let ptx = nvrtc::compile(&source, key, arch(ordinal)?)?;
    let image = CString::new(ptx).map_err(|_| crate::Error::invalid("PTX contains NUL"))?;
    // SAFETY: `image` is NUL-terminated PTX; a context is current. The module stays loaded for
    // the process (its functions are cached).
    let module = check(
        unsafe { result::module::load_data(image.as_ptr().cast()) },
        "loading a compiled kernel module",
    )?;
    let mut found = Vec::new();
    for name in names {
        let cname = CString::new(*name).expect("kernel names have no NUL");
        // SAFETY: `module` is loaded; `cname` is NUL-terminated.
        let f = check(
            unsafe { result::module::get_function(module, cname) },
            "finding a kernel in its module",
        )?;
        found.push((name.to_string(), f as usize));
    }
    let out = found.iter().map(|(_, f)| *f).collect();
    cache.insert((ordinal, key.to_string()), found);
    Ok(out)
}

/// `(contiguous, strided)` add kernels for inputs `a`, `b` and result `r` on `ordinal`.
pub fn add(
    ordinal: u32,
    a: DType,
    b: DType,
    r: DType,
) -> Result<(sys::CUfunction, sys::CUfunction)> {
    let (ta, tb, tr) = (c_type(a), c_type(b), c_type(r));
    let wrappers = format!(
        "extern \"C\" __global__ void cb_add_contiguous({tr}* o, const {ta}* a, const {tb}* b, \
         long long n) {{ add_contiguous<{ta}, {tb}, {tr}>(o, a, b, n); }}\n\
         extern \"C\" __global__ void cb_add_strided({tr}* o, const {ta}* a, const {tb}* b, \
         long long n, Geometry g) {{ add_strided<{ta}, {tb}, {tr}>(o, a, b, n, g); }}\n"
    );
    let key = format!("add_{a}_{b}_{r}");
    let f = functions(
        ordinal,
        &key,
        &wrappers,
        &["cb_add_contiguous", "cb_add_strided"],
    )?;
    Ok((f[0] as sys::CUfunction, f[1] as sys::CUfunction))
}

/// The strided gather kernel for `dtype` on `ordinal`.
pub fn gather(ordinal: u32, dtype: DType) -> Result<sys::CUfunction> {
    let t = c_type(dtype);
    let wrappers = format!(
        "extern \"C\" __global__ void cb_gather({t}* o, const {t}* s, long long n, Geometry g) \
         {{ gather<{t}>(o, s, n, g); }}\n"
    );
    let f = functions(
        ordinal,
        &format!("gather_{dtype}"),
        &wrappers,
        &["cb_gather"],
    )?;
    Ok(f[0] as sys::CUfunction)
}

/// Blocks for `n` elements: enough to fill the device, grid-stride beyond that.
pub fn grid(ordinal: u32, n: usize) -> Result<u32> {
    let sms = context::attribute(
        ordinal,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    )?;
    let wanted = n.div_ceil(super::launch::BLOCK as usize).max(1);
    Ok(wanted.min(sms.max(1) as usize * 16) as u32)
}

impl Geometry {
    /// The kernel geometry of a coalesced plan (operand order as the plan's).
    pub fn from_plan<const N: usize>(plan: &crate::layout::Coalesced<N>) -> Result<Geometry> {
        let ndim = plan.shape.len();
        if ndim > MAX_DIMS {
            return Err(crate::Error::invalid(format!(
                "the CUDA kernels take at most {MAX_DIMS} dimensions after merging contiguous \
                 ones; this layout needs {ndim}"
            )));
        }
        let mut g = Geometry {
            ndim: ndim as i32,
            ..Default::default()
        };
        for d in 0..ndim {
            g.shape[d] = plan.shape[d] as i64;
            for k in 0..N.min(3) {
                g.stride[k][d] = plan.strides[k][d] as i64;
            }
        }
        Ok(g)
    }
}
