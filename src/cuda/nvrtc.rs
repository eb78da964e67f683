//! NVRTC: finding the library (a CUDA toolkit, or the pip packages that PyTorch and CuPy wheels
//! install), compiling CUDA C++ to PTX, and caching PTX on disk so a new process does not run
//! NVRTC again. The disk cache lives in `$CUBRIDGE_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/cubridge`, else `~/.cache/cubridge`.

use crate::error::{Error, Result};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// Extra directories to look in for libnvrtc (the Python package adds the `nvidia` pip
/// packages' library folders).
static SEARCH_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Adds directories to search for libnvrtc before the system's defaults.
pub fn add_search_dirs(dirs: impl IntoIterator<Item = PathBuf>) {
    let mut list = SEARCH_DIRS.lock().unwrap_or_else(|p| p.into_inner());
    for d in dirs {
        if !list.contains(&d) {
            list.push(d);
        }
    }
}

fn toolkit_dirs(sub: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            dirs.push(PathBuf::from(root).join(sub));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda").join(sub));
    dirs
}

fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs = SEARCH_DIRS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    dirs.extend(toolkit_dirs("lib64"));
    dirs
}

/// Loads NVRTC once per process, or explains where it looked.
fn ensure_loaded() -> Result<()> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            // SAFETY: only tries to open the library by its usual names.
            if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return Ok(());
            }
            let dirs = candidate_dirs();
            for dir in &dirs {
                let Ok(entries) = std::fs::read_dir(dir) else {
                    continue;
                };
                let mut libs: Vec<PathBuf> = entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with("libnvrtc") && n.contains(".so"))
                    })
                    .collect();
                // The builtins library first: NVRTC opens it by name while compiling.
                libs.sort_by_key(|p| !p.to_string_lossy().contains("builtins"));
                for lib in libs {
                    // SAFETY: loading NVRTC runs its initialisers, which have no preconditions.
                    // The handle is leaked on purpose: NVRTC stays loaded for the process, and
                    // later opens by soname find this copy.
                    if let Ok(handle) = unsafe { libloading::Library::new(&lib) } {
                        std::mem::forget(handle);
                    }
                }
                // SAFETY: as above.
                if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                    return Ok(());
                }
            }
            Err(format!(
                "NVRTC (libnvrtc) was not found. cubridge looked on the library search path \
                 (libnvrtc.so, .so.13, .so.12, ...) and in: {}. Install a CUDA toolkit or the \
                 nvidia-cuda-nvrtc pip package, or set CUDA_HOME.",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
        .clone()
        .map_err(|log| Error::Compile {
            kernel: "(loading NVRTC)".into(),
            log,
        })
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CUBRIDGE_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("cubridge"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("cubridge"))
}

/// PTX for `source` on compute capability `arch` (e.g. 90), from the disk cache when present.
/// `name` names the program in errors; `extra` are further NVRTC options (`-DNAME=1`,
/// `--use_fast_math`, ...), part of the cache key. A compile error carries NVRTC's log and,
/// after it, the source lines the log points at.
pub fn compile(source: &str, name: &str, arch: u32, extra: &[String]) -> Result<String> {
    let mut hasher = DefaultHasher::new();
    (env!("CARGO_PKG_VERSION"), source, arch, extra).hash(&mut hasher);
    let key = format!("{:016x}.ptx", hasher.finish());
    let cached = cache_dir().map(|d| d.join(&key));
    if let Some(path) = &cached {
        if let Ok(ptx) = std::fs::read_to_string(path) {
            return Ok(ptx);
        }
    }
    ensure_loaded()?;
    let arch_flag: &'static str = Box::leak(format!("compute_{arch}").into_boxed_str());
    let mut include_paths: Vec<String> = toolkit_dirs("include")
        .into_iter()
        .chain(
            SEARCH_DIRS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter_map(|d| d.parent().map(|p| p.join("include"))),
        )
        .filter(|d| d.is_dir())
        .map(|d| d.display().to_string())
        .collect();
    include_paths.dedup();
    // C++17 unless the caller chose a standard.
    let mut options: Vec<String> = extra.to_vec();
    if !extra
        .iter()
        .any(|o| o.starts_with("--std") || o.starts_with("-std"))
    {
        options.push("--std=c++17".into());
    }
    let file = format!("{name}.cu");
    let options = CompileOptions {
        arch: Some(arch_flag),
        include_paths,
        options,
        name: Some(file.clone()),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(source, options).map_err(|e| Error::Compile {
        kernel: name.to_string(),
        log: match e {
            CompileError::CompileError { log, .. } => {
                with_source_lines(&log.to_string_lossy(), &file, source)
            }
            other => format!("{other:?}"),
        },
    })?;
    let text = ptx.to_src();
    if let Some(path) = cached {
        // Best effort, atomically: a temporary file renamed into place.
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
            let tmp = dir.join(format!("{key}.{}.tmp", std::process::id()));
            if std::fs::write(&tmp, &text).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
    }
    Ok(text)
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

/// For tests that compile with NVRTC without a GPU: adds `$CUBRIDGE_TEST_NVRTC_DIR` (a folder
/// holding libnvrtc) to the search and says whether it was set; when not, notes the skip.
#[cfg(test)]
pub(crate) fn test_dir(what: &str) -> bool {
    match std::env::var_os("CUBRIDGE_TEST_NVRTC_DIR") {
        Some(dir) => {
            add_search_dirs([PathBuf::from(dir)]);
            true
        }
        None => {
            eprintln!("CUBRIDGE_TEST_NVRTC_DIR is not set: {what} not compiled");
            false
        }
    }
}

#[cfg(test)]
mod tests {
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
