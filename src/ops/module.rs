//! Users' CUDA modules: CUDA C++ compiled with NVRTC (through the same memory and disk cache as
//! every program, template instances' lowered names included), or a precompiled cubin, PTX or
//! fatbin file; loaded once per device at first use. Their kernels are raw kernels
//! (`ops::raw`, which keep the module) and their `__device__` and `__constant__` variables
//! arrays over the module's memory.

use crate::array::Array;
use crate::cuda::kernels::{self, Code, Module, Source};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// A user's CUDA module; see the module documentation.
pub struct RawModule {
    /// Names the module in errors: its name, or the file it came from.
    name: String,
    code: Code,
    /// The loaded module per device ordinal (modules stay loaded for the process).
    loaded: Mutex<HashMap<u32, &'static Module>>,
}

/// The kind of a precompiled file, told by its first bytes, else (PTX, which is text) by its
/// extension or its `.version` directive.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ImageKind {
    /// An ELF cubin.
    Cubin,
    /// A fat binary (`nvcc -fatbin`).
    Fatbin,
    /// PTX text.
    Ptx,
}

/// The magic number a fat binary starts with (little endian).
const FATBIN_MAGIC: u32 = 0xBA55_ED50;

/// The kind of the precompiled `image` read from `path`, or why it is none of them.
pub fn image_kind(image: &[u8], path: &str) -> Result<ImageKind> {
    if image.starts_with(b"\x7fELF") {
        return Ok(ImageKind::Cubin);
    }
    if image.get(..4) == Some(&FATBIN_MAGIC.to_le_bytes()[..]) {
        return Ok(ImageKind::Fatbin);
    }
    let text = std::str::from_utf8(image.strip_suffix(&[0]).unwrap_or(image)).ok();
    let ptx_named = Path::new(path)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("ptx"));
    if text.is_some_and(|t| !t.contains('\0') && (ptx_named || t.contains(".version"))) {
        return Ok(ImageKind::Ptx);
    }
    Err(Error::invalid(format!(
        "{path} is not a cubin, PTX or fatbin file (its first bytes are {:02x?})",
        &image[..image.len().min(8)]
    )))
}

/// Refuses a name expression NVRTC could not take.
fn check_name_expression(name: &str) -> Result<()> {
    if name.trim().is_empty() || name.contains('\0') {
        return Err(Error::invalid(format!(
            "{name:?} is not a name expression (a kernel or variable's name, such as \
             \"add<float>\")"
        )));
    }
    Ok(())
}

impl RawModule {
    /// A module of CUDA C++ `code`, compiled with the NVRTC `options` (as RawKernel's: `-rdc=true`
    /// links with the device runtime) when first used on each device; `name` names it in
    /// NVRTC's log. Each of `name_expressions` (`"add<float>"`) is instantiated and found by
    /// its lowered name.
    pub fn from_source(
        name: &str,
        code: &str,
        options: Vec<String>,
        name_expressions: Vec<String>,
    ) -> Result<RawModule> {
        if code.contains('\0') {
            return Err(Error::invalid("the module's code contains a NUL character"));
        }
        if let Some(o) = options.iter().find(|o| o.contains('\0')) {
            return Err(Error::invalid(format!(
                "option {o:?} contains a NUL character"
            )));
        }
        name_expressions
            .iter()
            .try_for_each(|n| check_name_expression(n))?;
        let source = Source {
            name: name.to_string(),
            source: code.to_string(),
            options,
            name_expressions,
        };
        Ok(RawModule::of(name.to_string(), Code::Source(source)))
    }

    /// A module of the precompiled cubin, PTX or fatbin file at `path`. NVRTC `options` and
    /// `name_expressions` cannot apply to it, and are refused rather than ignored.
    pub fn from_file(
        path: &Path,
        options: &[String],
        name_expressions: &[String],
    ) -> Result<RawModule> {
        let shown = path.display().to_string();
        if let Some(o) = options.first() {
            return Err(Error::invalid(format!(
                "option {o:?} cannot apply to the precompiled file {shown}: options are NVRTC's, \
                 for code= (compile the file with them instead)"
            )));
        }
        if let Some(n) = name_expressions.first() {
            return Err(Error::invalid(format!(
                "name expression {n:?} cannot apply to the precompiled file {shown}: name \
                 expressions are NVRTC's, for code= (get_function takes the file's own \
                 symbol names)"
            )));
        }
        let mut image =
            std::fs::read(path).map_err(|e| Error::invalid(format!("cannot read {shown}: {e}")))?;
        if image_kind(&image, &shown)? == ImageKind::Ptx && image.last() != Some(&0) {
            image.push(0);
        }
        Ok(RawModule::of(shown, Code::Image(image)))
    }

    fn of(name: String, code: Code) -> RawModule {
        RawModule {
            name,
            code,
            loaded: Mutex::new(HashMap::new()),
        }
    }

    /// What names the module in errors: its name, or its file.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The module on `ordinal`, compiled (or read from the caches) and loaded on first use,
    /// once per process (by the process's runtime: see [`crate::cuda::shared::module`]);
    /// leaves the device's context current.
    fn module(&self, ordinal: u32) -> Result<&'static Module> {
        crate::cuda::context::bind(ordinal)?;
        if let Some(&m) = crate::lock(&self.loaded).get(&ordinal) {
            return Ok(m);
        }
        let m = crate::cuda::shared::module(ordinal, &self.code)?;
        crate::lock(&self.loaded).insert(ordinal, m);
        Ok(m)
    }

    /// The symbol `name` is in a loaded module: a name expression's lowered name, else itself.
    fn symbol<'a>(&'a self, name: &'a str, module: &'a Module) -> &'a str {
        let expressions = match &self.code {
            Code::Source(s) => &s.name_expressions[..],
            Code::Image(_) => &[],
        };
        match expressions.iter().position(|e| e == name) {
            Some(k) => module.lowered.get(k).map_or(name, String::as_str),
            None => name,
        }
    }

    /// Refuses a template instance (`add<float>`) that is not among the name expressions: NVRTC
    /// neither instantiates it nor reports its lowered name.
    fn check_instance(&self, name: &str) -> Result<()> {
        let Code::Source(s) = &self.code else {
            return Ok(());
        };
        if name.contains('<') && !s.name_expressions.iter().any(|e| e == name) {
            return Err(Error::invalid(format!(
                "{name} is a template instance that is not in name_expressions {:?}: add it \
                 there, so that NVRTC instantiates it and reports its lowered name",
                s.name_expressions
            )));
        }
        Ok(())
    }

    /// The device ordinal of `device` (the current CUDA device when `None`), which must be an
    /// available CUDA device.
    fn ordinal(device: Option<Device>) -> Result<u32> {
        let device = match device {
            Some(d) => d,
            None => crate::cuda::current_device()?,
        };
        let Device::Cuda(n) = device else {
            return Err(Error::invalid(format!("{device} is not a CUDA device")));
        };
        crate::cuda::require(device)?;
        Ok(n)
    }

    /// Compiles and loads the module on `device` (default: the current device) now, as its
    /// first kernel or variable would.
    pub fn compile(&self, device: Option<Device>) -> Result<()> {
        self.module(Self::ordinal(device)?).map(|_| ())
    }

    /// The kernel `name` (an `extern "C"` name, a name expression, or a cubin's symbol) on
    /// `ordinal`, loading the module there on first use.
    pub(crate) fn function(&self, ordinal: u32, name: &str) -> Result<usize> {
        let module = self.module(ordinal)?;
        kernels::function(module.handle, self.symbol(name, module))
            .map_err(|e| self.missing(e, name))
    }

    /// A driver's "not found" for `name`, saying where it was looked for and what may be amiss.
    fn missing(&self, e: Error, name: &str) -> Error {
        match e {
            Error::Cuda { code, .. }
                if code == cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_FOUND =>
            {
                Error::Cuda {
                    code,
                    context: format!(
                        "finding `{name}`: the module ({}) has no such symbol (a C++ name is \
                         mangled unless it is declared extern \"C\" or given in \
                         name_expressions)",
                        self.name()
                    ),
                }
            }
            e => e,
        }
    }

    /// Checks that the module has the kernel `name` (an `extern "C"` name, a name expression,
    /// or a cubin's symbol), loading it on `device` (default: the current device) first.
    pub fn find(&self, name: &str, device: Option<Device>) -> Result<()> {
        self.check_instance(name)?;
        self.function(Self::ordinal(device)?, name).map(|_| ())
    }

    /// The `__device__` or `__constant__` variable `name` on `device` (default: the current
    /// device), as an array over its
    /// memory that keeps the module: its bytes (`uint8`), or with `dtype` elements of that type
    /// (all of them, or `shape` when given), which must fill the variable exactly.
    pub fn global(
        self: &Arc<Self>,
        name: &str,
        device: Option<Device>,
        dtype: Option<DType>,
        shape: Option<&[usize]>,
    ) -> Result<Array> {
        self.check_instance(name)?;
        let ordinal = Self::ordinal(device)?;
        let module = self.module(ordinal)?;
        let (ptr, bytes) = kernels::global(module.handle, self.symbol(name, module))
            .map_err(|e| self.missing(e, name))?;
        let dtype = dtype.unwrap_or(DType::UInt8);
        let shape = typed_shape(name, bytes, dtype, shape)?;
        let shape: Vec<i64> = shape.iter().map(|&n| n as i64).collect();
        let descriptor = crate::view::Descriptor {
            data: ptr,
            byte_offset: 0,
            shape: &shape,
            strides: None,
            dtype,
            device: Device::Cuda(ordinal),
            readonly: false,
            len_bytes: Some(bytes),
        };
        // SAFETY: the driver gave `bytes` bytes at `ptr` on this device for the variable, valid
        // while the module is loaded: for the process, and at least while the array holds the
        // module.
        unsafe { crate::view::from_descriptor(&descriptor, Box::new(self.clone())) }
    }
}

/// The shape of a `bytes`-byte variable `name` seen as `dtype`: `shape` when given, else one
/// dimension; its elements must fill the variable exactly.
fn typed_shape(
    name: &str,
    bytes: usize,
    dtype: DType,
    shape: Option<&[usize]>,
) -> Result<Vec<usize>> {
    let size = dtype.itemsize();
    let shape = match shape {
        Some(s) => s.to_vec(),
        None if bytes.is_multiple_of(size) => vec![bytes / size],
        None => {
            return Err(Error::invalid(format!(
                "variable `{name}` has {bytes} bytes, not a whole number of {dtype} elements \
                 ({size} bytes each)"
            )))
        }
    };
    let elements = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if elements.and_then(|n| n.checked_mul(size)) != Some(bytes) {
        return Err(Error::invalid(format!(
            "variable `{name}` has {bytes} bytes; shape {shape:?} of {dtype} does not fill it \
             exactly"
        )));
    }
    Ok(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precompiled_files_are_told_apart() {
        let kind = |bytes: &[u8], path| image_kind(bytes, path);
        assert_eq!(kind(b"\x7fELF\x02\x01", "k.bin").unwrap(), ImageKind::Cubin);
        assert_eq!(
            kind(&[0x50, 0xed, 0x55, 0xba, 1, 0], "k").unwrap(),
            ImageKind::Fatbin
        );
        let ptx = b"//\n.version 8.0\n.target sm_80\n";
        assert_eq!(kind(ptx, "k.txt").unwrap(), ImageKind::Ptx);
        assert_eq!(kind(b"// comment only\0", "k.ptx").unwrap(), ImageKind::Ptx);
        let e = kind(b"MZ\x90\x00", "k.dll").unwrap_err().to_string();
        assert!(
            e.contains("k.dll") && e.contains("not a cubin, PTX or fatbin"),
            "{e}"
        );
        assert!(kind(b"plain words", "notes.txt").is_err());
    }

    #[test]
    fn typed_views_must_fill_the_variable() {
        assert_eq!(typed_shape("v", 16, DType::Float32, None).unwrap(), [4]);
        assert_eq!(typed_shape("v", 16, DType::UInt8, None).unwrap(), [16]);
        assert_eq!(
            typed_shape("v", 24, DType::Float32, Some(&[2, 3])).unwrap(),
            [2, 3]
        );
        let e = typed_shape("v", 6, DType::Float32, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("6 bytes") && e.contains("whole number"), "{e}");
        assert!(typed_shape("v", 24, DType::Float32, Some(&[2, 2])).is_err());
        assert!(typed_shape("v", 24, DType::Float32, Some(&[usize::MAX, 2])).is_err());
    }

    #[test]
    fn options_and_name_expressions_are_refused_for_files() {
        let path = Path::new("/nowhere/k.cubin");
        let e = RawModule::from_file(path, &["-DN=1".into()], &[])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("\"-DN=1\"") && e.contains("/nowhere/k.cubin"),
            "{e}"
        );
        let e = RawModule::from_file(path, &[], &["f<int>".into()])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("\"f<int>\""), "{e}");
        let e = RawModule::from_file(path, &[], &[])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("cannot read /nowhere/k.cubin"), "{e}");
    }

    #[test]
    fn template_instances_must_be_name_expressions() {
        let m = RawModule::from_source("m", "", vec![], vec!["f<int>".into()]).unwrap();
        assert!(m.check_instance("f<int>").is_ok());
        assert!(m.check_instance("g").is_ok());
        let e = m.check_instance("f<float>").unwrap_err().to_string();
        assert!(
            e.contains("f<float>") && e.contains("name_expressions"),
            "{e}"
        );
        assert!(RawModule::from_source("m", "", vec![], vec!["".into()]).is_err());
    }
}
