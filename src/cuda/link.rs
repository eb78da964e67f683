//! Relocatable device code (NVRTC's `-rdc=true` or `-dc`: device-side launches, device functions
//! defined elsewhere) must be linked before it loads: the driver's linker joins
//! NVRTC's code with the CUDA device runtime (`libcudadevrt.a`, from the toolkit or the `nvidia`
//! pip packages) into the cubin that is loaded, and that [`super::disk_cache`] keeps.

use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::{c_void, CString};
use std::path::PathBuf;

/// Whether NVRTC `options` ask for relocatable code (the last of `-rdc`, `-dc` and `-dw` says),
/// which must be linked with the device runtime before it loads.
pub fn needs_link(options: &[String]) -> bool {
    let mut relocatable = false;
    for option in options {
        match option.as_str() {
            "-rdc=true" | "--relocatable-device-code=true" | "-dc" | "--device-c" => {
                relocatable = true
            }
            "-rdc=false" | "--relocatable-device-code=false" | "-dw" | "--device-w" => {
                relocatable = false
            }
            _ => {}
        }
    }
    relocatable
}

/// Where the device runtime is looked for: `dirs` (the folders NVRTC is looked for in, the
/// pip packages' and the toolkit's), and the CUDA runtime pip packages beside them
/// (`nvidia/cuda_runtime/lib`, `nvidia/cuda_cudart/lib`).
fn search_dirs(mut dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    let beside: Vec<PathBuf> = dirs
        .iter()
        .filter_map(|d| d.parent()?.parent())
        .flat_map(|root| ["cuda_runtime", "cuda_cudart"].map(|p| root.join(p).join("lib")))
        .collect();
    for dir in beside {
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

/// The first `libcudadevrt.a` in `dirs`, or an error that names every folder searched.
fn find_device_runtime(dirs: &[PathBuf]) -> Result<PathBuf> {
    dirs.iter()
        .map(|d| d.join("libcudadevrt.a"))
        .find(|p| p.is_file())
        .ok_or_else(|| Error::Compile {
            kernel: "(linking relocatable device code)".into(),
            code: None,
            log: format!(
                "relocatable device code (-rdc=true, -dc) is linked with the CUDA device \
                 runtime, libcudadevrt.a, which was not found in: {}. Install a CUDA toolkit \
                 (and set CUDA_HOME) or the CUDA runtime pip package beside NVRTC's.",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
}

/// Destroys a link state when dropped (its output with it).
struct Linker(sys::CUlinkState);

impl Drop for Linker {
    fn drop(&mut self) {
        // SAFETY: the state was created by cuLinkCreate and is destroyed once, here.
        let _ = unsafe { sys::cuLinkDestroy(self.0) };
    }
}

/// Bytes of the linker's error log.
const LOG: usize = 8 << 10;

/// `image` (NVRTC's relocatable code of program `name`, a cubin or PTX as `input` says) linked
/// with the device runtime, looked for in and beside `dirs`, into a cubin for the current
/// context's device. A context must be current.
pub fn link(
    image: &[u8],
    input: sys::CUjitInputType,
    name: &str,
    dirs: Vec<PathBuf>,
) -> Result<Vec<u8>> {
    let devrt = find_device_runtime(&search_dirs(dirs))?;
    let library = CString::new(devrt.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::invalid("a NUL in the device runtime's path"))?;
    let file = CString::new(format!("{name}.cu")).map_err(|_| Error::invalid("a NUL in a name"))?;
    // Declared before the link state, so that they outlive it: the driver writes the log.
    let mut log = vec![0u8; LOG];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values: [*mut c_void; 2] = [
        log.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(LOG),
    ];
    let mut state: sys::CUlinkState = std::ptr::null_mut();
    // SAFETY: two options with their values (the log buffer and its size), which outlive the
    // state; `state` is a valid out-pointer.
    let created =
        unsafe { sys::cuLinkCreate_v2(2, options.as_mut_ptr(), values.as_mut_ptr(), &mut state) };
    let linked = match created {
        sys::CUresult::CUDA_SUCCESS => {
            let linker = Linker(state);
            run(&linker, (image, input, &file), &library)
        }
        code => Err((code, "starting the link")),
    };
    linked.map_err(|(code, step)| {
        let text = log.split(|&b| b == 0).next().unwrap_or_default();
        Error::Compile {
            kernel: name.to_string(),
            code: None,
            log: format!(
                "{step} with {}: {code:?}\n{}",
                devrt.display(),
                String::from_utf8_lossy(text).trim_end()
            ),
        }
    })
}

/// Adds `image` (of `input`'s kind, named `file`) and the device runtime `library` to a link, and
/// completes it: the cubin, or the failed call's code and what it did.
fn run(
    linker: &Linker,
    (image, input, file): (&[u8], sys::CUjitInputType, &CString),
    library: &CString,
) -> std::result::Result<Vec<u8>, (sys::CUresult, &'static str)> {
    let ok = |code, step| match code {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        code => Err((code, step)),
    };
    // No options for either input.
    let (no, none) = (std::ptr::null_mut(), std::ptr::null_mut());
    let (data, len) = (image.as_ptr() as *mut c_void, image.len());
    // SAFETY: the state is live; `image` holds `len` bytes of code of the input type and `file`
    // is NUL-terminated, both alive for the call (the driver copies what it keeps).
    let added =
        unsafe { sys::cuLinkAddData_v2(linker.0, input, data, len, file.as_ptr(), 0, no, none) };
    ok(added, "adding the compiled program")?;
    let library_input = sys::CUjitInputType::CU_JIT_INPUT_LIBRARY;
    // SAFETY: the state is live; `library` is a NUL-terminated path, alive for the call.
    let added =
        unsafe { sys::cuLinkAddFile_v2(linker.0, library_input, library.as_ptr(), 0, no, none) };
    ok(added, "adding the device runtime")?;
    let (mut cubin, mut size): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
    // SAFETY: the state is live; both are valid out-pointers.
    let done = unsafe { sys::cuLinkComplete(linker.0, &mut cubin, &mut size) };
    ok(done, "linking")?;
    if cubin.is_null() {
        return Err((sys::CUresult::CUDA_ERROR_INVALID_IMAGE, "linking"));
    }
    // SAFETY: the driver hands back `size` bytes at `cubin`, owned by the link state, which
    // the caller keeps alive until after this copy.
    Ok(unsafe { std::slice::from_raw_parts(cubin as *const u8, size) }.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn relocatable_options_are_recognised() {
        for yes in [
            &["-rdc=true"][..],
            &["--relocatable-device-code=true"],
            &["-dc"],
            &["--device-c"],
            &["-DN=4", "-rdc=true"],
            &["-rdc=false", "-dc"],
        ] {
            assert!(needs_link(&opts(yes)), "{yes:?}");
        }
        for no in [
            &[][..],
            &["-rdc=false"],
            &["-dc", "-dw"],
            &["-rdc=true", "--relocatable-device-code=false"],
            &["--use_fast_math", "-DRDC=true", "-ewp"],
        ] {
            assert!(!needs_link(&opts(no)), "{no:?}");
        }
    }

    /// A device-side launch compiles with each option that asks for relocatable code (NVRTC
    /// refuses it otherwise), when `CUBRIDGE_TEST_NVRTC_DIR` names a folder holding libnvrtc.
    #[test]
    fn device_side_launches_compile_as_relocatable_code() {
        if !crate::cuda::nvrtc::test_dir("relocatable device code") {
            return;
        }
        let source = "extern \"C\" __global__ void child(float* y) { y[threadIdx.x] += 1; }\n\
                      extern \"C\" __global__ void parent(float* y) { child<<<1, 32>>>(y); }\n";
        let compile = |options: &[&str]| {
            super::super::nvrtc::compile_for(
                source,
                "parent",
                super::super::nvrtc::Target::Cubin(80),
                &opts(options),
            )
        };
        for option in [
            "-rdc=true",
            "--relocatable-device-code=true",
            "-dc",
            "--device-c",
        ] {
            assert!(needs_link(&opts(&[option])));
            if let Err(e) = compile(&[option]) {
                panic!("{option}: {e}");
            }
        }
        assert!(compile(&[]).is_err());
    }

    #[test]
    fn a_missing_device_runtime_names_where_it_was_looked_for() {
        let dirs = [PathBuf::from("/nowhere/a"), PathBuf::from("/nowhere/b")];
        let e = find_device_runtime(&dirs).unwrap_err().to_string();
        assert!(
            e.contains("libcudadevrt.a") && e.contains("/nowhere/a, /nowhere/b"),
            "{e}"
        );
        let here = std::env::temp_dir().join(format!("cubridge_devrt_{}", std::process::id()));
        std::fs::create_dir_all(&here).unwrap();
        std::fs::write(here.join("libcudadevrt.a"), b"!<arch>\n").unwrap();
        let found = find_device_runtime(&[dirs[0].clone(), here.clone()]).unwrap();
        assert_eq!(found, here.join("libcudadevrt.a"));
        std::fs::remove_dir_all(&here).unwrap();
    }
}
