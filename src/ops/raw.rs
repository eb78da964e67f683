//! Users' raw CUDA kernels: a source with an `extern "C" __global__` function, compiled with
//! NVRTC (through the same memory and disk cache as cubridge's own kernels) and launched on
//! arrays from any producer, whose pending writes run first and whose memory stays valid until
//! the kernel has run.

use crate::array::Array;
use crate::cuda::launch::{self as cuda_launch, Params};
use crate::cuda::stream::Stream;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ops::launch::Launch;
use crate::ops::module::RawModule;
use crate::ops::Arg;
use crate::phases::phase;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Dynamic shared memory a block may use without opting in.
const SHARED_DEFAULT: u32 = 48 << 10;

/// A user's CUDA kernel; see the module documentation. It is a function of a [`RawModule`]
/// (of its own source, or one it was got from), which it keeps.
pub struct RawKernel {
    module: Arc<RawModule>,
    /// The function's name, as the module's `get_function` was given it.
    name: String,
    /// The loaded function per device ordinal, and the dynamic shared memory it was opened to.
    functions: Mutex<HashMap<u32, (usize, u32)>>,
}

impl RawKernel {
    /// A kernel named `name` (declared `extern "C"`, so that its name is not mangled) in
    /// `source`, compiled with the NVRTC `options` on first launch on each device.
    pub fn new(source: &str, name: &str, options: Vec<String>) -> Result<RawKernel> {
        if name.is_empty() || name.contains(char::is_whitespace) || name.contains('\0') {
            return Err(Error::invalid(format!("{name:?} is not a kernel name")));
        }
        if source.contains('\0') {
            return Err(Error::invalid("the kernel source contains a NUL character"));
        }
        let module = RawModule::from_source(name, source, options, Vec::new())?;
        Ok(RawKernel::of_module(Arc::new(module), name))
    }

    /// The kernel `name` of `module` (an `extern "C"` name, a name expression, or a
    /// precompiled file's symbol), found on the current device now and on any other at its
    /// first launch there; it keeps the module.
    pub fn in_module(module: Arc<RawModule>, name: &str) -> Result<RawKernel> {
        module.find(name, None)?;
        Ok(RawKernel::of_module(module, name))
    }

    /// The function `name` of `module`, found on each device at its first launch there.
    fn of_module(module: Arc<RawModule>, name: &str) -> RawKernel {
        RawKernel {
            module,
            name: name.to_string(),
            functions: Mutex::new(HashMap::new()),
        }
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The loaded function on `ordinal`, compiled on first use, opened to `shared` bytes of
    /// dynamic shared memory when that is more than a block gets by default.
    fn function(&self, ordinal: u32, shared: u32) -> Result<usize> {
        let mut map = crate::lock(&self.functions);
        if let Some(&(f, opened)) = map.get(&ordinal) {
            if shared <= opened.max(SHARED_DEFAULT) {
                return Ok(f);
            }
        }
        let f = self.module.function(ordinal, &self.name)?;
        if shared > SHARED_DEFAULT {
            use cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX;
            let set = {
                // SAFETY: `f` is a loaded function of the current context (the module's
                // load bound it); the attribute takes a byte count.
                unsafe {
                    cudarc::driver::result::function::set_function_attribute(
                        f as cudarc::driver::sys::CUfunction,
                        MAX,
                        shared as i32,
                    )
                }
            };
            crate::cuda::check(
                set,
                &format!("allowing {shared} bytes of dynamic shared memory"),
            )?;
        }
        let opened = map.get(&ordinal).map_or(0, |&(_, o)| o).max(shared);
        map.insert(ordinal, (f, opened));
        Ok(f)
    }

    /// Compiles and loads the kernel on `device` now (a launch would on first use).
    pub fn compile(&self, device: Device) -> Result<()> {
        let Device::Cuda(n) = device else {
            return Err(Error::invalid(format!("{device} is not a CUDA device")));
        };
        crate::cuda::require(device)?;
        self.function(n, 0).map(|_| ())
    }

    /// Launches `grid` blocks of `block` threads with `shared` bytes of dynamic shared memory on
    /// `stream`, with `args` in the kernel's parameter order. Every array must be on one CUDA
    /// device (the current device when there are none); their pending writes run first, and
    /// each records the kernel as its last write (the kernel may write any of them). cubridge
    /// cannot see which arrays the kernel writes, so a read-only array (one its producer does
    /// not allow to be written) is refused unless `readonly_ok` says that the kernel only
    /// reads the read-only arrays it is given.
    ///
    /// # Safety
    /// cubridge cannot see the kernel's signature or what it does:
    /// 1. The kernel's parameters are, in order, one pointer per array argument and one value of
    ///    the dtype's C type per value argument.
    /// 2. The kernel reads and writes only elements of the arrays it is given (each within the
    ///    array's layout, from the pointer to its first element) and memory of its own.
    /// 3. With `readonly_ok`, the kernel writes no read-only array.
    pub unsafe fn launch(
        &self,
        grid: [u32; 3],
        block: [u32; 3],
        args: &[Arg],
        shared: u32,
        stream: Stream,
        readonly_ok: bool,
    ) -> Result<()> {
        check_configuration(grid, block)?;
        if !readonly_ok {
            check_writable(&self.name, args)?;
        }
        if !crate::cuda::is_available() {
            return Err(crate::cuda::unavailable_for(&self.name));
        }
        let arrays: Vec<&Array> = args
            .iter()
            .filter_map(|a| match a {
                Arg::Array(x) => Some(x),
                Arg::Value(..) => None,
            })
            .collect();
        let device = crate::ops::launch::kernel_device(
            (&self.name, "raw"),
            arrays.iter().copied().enumerate(),
            |k| format!("array argument {k}"),
        )?;
        let launch = Launch::begin(device, stream)?;
        let function = self.function(launch.ordinal(), shared)?;
        launch.order(&arrays)?;
        phase!(Launch);
        let mut params = raw_params(args)?;
        // SAFETY: the parameters match the kernel's signature and it stays inside the arrays
        // (this function's contract); each array is passed as the device pointer of its first
        // element (on this device, and kept valid until the kernel has run by Launch::finish),
        // each value as its dtype's bytes. The launch configuration was checked above and the
        // function belongs to the current context (its module was loaded there;
        // Launch::order bound it).
        unsafe {
            cuda_launch::launch(
                function as cudarc::driver::sys::CUfunction,
                (grid[0], grid[1], grid[2]),
                (block[0], block[1], block[2]),
                shared,
                launch.stream().handle(),
                params.pointers(),
            )?
        };
        launch.finish(&[], &arrays)
    }
}

/// The kernel's parameters: each array's data pointer, each value's bytes in its dtype.
fn raw_params(args: &[Arg]) -> Result<Params> {
    // A slot (16 bytes) each fits a pointer and every scalar: one allocation per list.
    let mut params = Params::with_capacity(args.len(), 0);
    for arg in args {
        match arg {
            Arg::Array(a) => params.push(a.data_ptr()),
            Arg::Value(_, None) => {
                return Err(Error::invalid(
                    "a raw kernel's value needs a dtype (its C type): pass a numpy scalar",
                ))
            }
            Arg::Value(v, Some(dtype)) => {
                crate::ops::create::check_value_kind(*v, *dtype, "a raw kernel")?;
                params.push_bytes(crate::cpu::copy::ElementBytes::new(*dtype, *v).as_bytes());
            }
        }
    }
    Ok(params)
}

/// Refuses a launch configuration CUDA would refuse: an empty grid or block, more than 1024
/// threads a block (64 along z), or a grid past CUDA's limits.
fn check_configuration(grid: [u32; 3], block: [u32; 3]) -> Result<()> {
    let threads = block.iter().map(|&b| b as u64).product::<u64>();
    let limit = if grid.contains(&0) || block.contains(&0) {
        "each must be at least 1 in every dimension"
    } else if threads > 1024 || block[2] > 64 {
        "a block has at most 1024 threads (and 64 along z)"
    } else if grid[1] > 65535 || grid[2] > 65535 || grid[0] > i32::MAX as u32 {
        "the grid is too large (at most 2^31 - 1 along x, 65535 along y and z)"
    } else {
        return Ok(());
    };
    Err(Error::Launch { grid, block, limit })
}

/// Refuses read-only arrays among `args` of kernel `name`: it may write any array it is given.
fn check_writable(name: &str, args: &[Arg]) -> Result<()> {
    let readonly = args
        .iter()
        .position(|a| matches!(a, Arg::Array(x) if x.readonly()));
    match readonly {
        None => Ok(()),
        Some(k) => Err(Error::ReadOnly(format!(
            "{name}: argument {k} is read-only (its producer does not allow writes: a tensor that \
             requires grad, a JAX array, a read-only numpy array or export), and a raw kernel may \
             write any array it is given; if the kernel only reads its read-only arguments, pass \
             readonly_ok=True"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launches_past_cudas_limits_name_the_limit() {
        let limit = |grid, block| match check_configuration(grid, block) {
            Err(Error::Launch { limit, .. }) => limit,
            _ => "",
        };
        assert!(limit([1, 0, 1], [32, 1, 1]).contains("at least 1"));
        assert!(limit([1, 1, 1], [64, 32, 1]).contains("1024"));
        assert!(limit([1, 1, 1], [1, 1, 128]).contains("64 along z"));
        assert!(limit([1, 65536, 1], [32, 1, 1]).contains("65535"));
        assert_eq!(limit([i32::MAX as u32, 65535, 65535], [32, 32, 1]), "");
    }
}
