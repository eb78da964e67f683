//! Where NVRTC and the CUDA headers are looked for, apart from each other: the CUDA 12 pip
//! packages keep the library (`nvidia/cuda_nvrtc/lib`) and the headers
//! (`nvidia/cuda_runtime/include`) in different folders. Also which NVRTC to take when the
//! driver is older than some of those found. Pure functions of a [`SearchEnv`] and the files
//! under its folders, so that each layout is tested without a GPU.

use std::path::{Path, PathBuf};

/// The places searched: folders added by the Python package (library folders of the `nvidia`
/// pip packages, header folders `cuda.pathfinder` found), toolkit roots and a conda prefix.
#[derive(Clone, Debug, Default)]
pub(crate) struct SearchEnv {
    /// Folders added (library or header folders), searched first.
    pub added: Vec<PathBuf>,
    /// `$CONDA_PREFIX`.
    pub conda: Option<PathBuf>,
    /// Toolkit roots: `$CUDA_HOME`, `$CUDA_PATH`, then `/usr/local/cuda`.
    pub toolkits: Vec<PathBuf>,
}

impl SearchEnv {
    /// The process's: `added`, and the roots its environment names.
    pub fn from_process(added: Vec<PathBuf>) -> Self {
        let mut toolkits: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
            .into_iter()
            .filter_map(std::env::var_os)
            .map(PathBuf::from)
            .collect();
        toolkits.push(PathBuf::from("/usr/local/cuda"));
        SearchEnv {
            added,
            conda: std::env::var_os("CONDA_PREFIX").map(PathBuf::from),
            toolkits,
        }
    }

    /// `<root>/targets/<arch>-linux/<sub>`: where conda and the toolkit keep per-target files.
    fn target_dir(root: &Path, sub: &str) -> PathBuf {
        root.join("targets")
            .join(format!("{}-linux", std::env::consts::ARCH))
            .join(sub)
    }

    /// The folders searched for libnvrtc, in order: those added, conda's, the toolkits'.
    pub fn library_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = self.added.clone();
        if let Some(conda) = &self.conda {
            dirs.push(conda.join("lib"));
        }
        for root in &self.toolkits {
            dirs.push(root.join("lib64"));
            dirs.push(Self::target_dir(root, "lib"));
        }
        dedup(dirs)
    }

    /// The folders that hold the CUDA headers kernels include (`cuda_fp16.h`, ...), found
    /// independently of the library: a folder added that holds them, the `include` beside an
    /// added library folder (CUDA 13 pip: `nvidia/cu13`) or the CUDA runtime package's (CUDA 12
    /// pip: `nvidia/cuda_runtime/include`), conda's and the toolkits'.
    pub fn include_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        for added in &self.added {
            dirs.push(added.clone());
            if let Some(package) = added.parent() {
                dirs.push(package.join("include"));
                if let Some(nvidia) = package.parent() {
                    dirs.push(nvidia.join("cuda_runtime").join("include"));
                }
            }
        }
        for root in self.conda.iter().chain(&self.toolkits) {
            dirs.push(Self::target_dir(root, "include"));
            dirs.push(root.join("include"));
        }
        let mut found = dedup(dirs);
        found.retain(|d| d.join("cuda_fp16.h").is_file());
        found
    }
}

fn dedup(dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::with_capacity(dirs.len());
    for d in dirs {
        if !out.contains(&d) {
            out.push(d);
        }
    }
    out
}

/// The NVRTC libraries in `dir`, the builtins library first (NVRTC opens it by name while
/// compiling), without the `.alt` builds beside them (the same library again, which would
/// double the load time).
pub(crate) fn nvrtc_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut libs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("libnvrtc") && n.contains(".so") && !n.contains(".alt.")
            })
        })
        .collect();
    libs.sort_by_key(|p| !p.to_string_lossy().contains("builtins"));
    libs
}

/// The major version a library's file names (`libnvrtc.so.12`, `libnvrtc.so.12.4.127`,
/// `libnvrtc-builtins.so.13.2`); `None` for an unversioned name (`libnvrtc.so`).
pub(crate) fn major_of(file: &Path) -> Option<u32> {
    let name = file.file_name()?.to_str()?;
    let (_, after) = name.split_once(".so.")?;
    after.split('.').next()?.parse().ok()
}

/// The NVRTC folders to try, in order, among those found (in search order, each with the major
/// version its libraries name, where they do): those not newer than the driver (`driver_major`;
/// `None` without a driver, when all fit), since NVRTC's code does not load on an older driver.
/// An unknown version is tried and checked once loaded. `Err((newest found, driver))` when
/// every one is newer.
pub(crate) fn choose(
    found: &[Option<u32>],
    driver_major: Option<u32>,
) -> std::result::Result<Vec<usize>, (u32, u32)> {
    let fits = |m: &Option<u32>| match (m, driver_major) {
        (Some(m), Some(d)) => *m <= d,
        _ => true,
    };
    let order: Vec<usize> = (0..found.len()).filter(|&i| fits(&found[i])).collect();
    match (found.iter().flatten().max(), driver_major) {
        (Some(&newest), Some(driver)) if order.is_empty() => Err((newest, driver)),
        _ => Ok(order),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh folder under the system's temporary one, holding empty `files`.
    fn layout(name: &str, files: &[&str]) -> PathBuf {
        let root = std::env::temp_dir().join(format!(
            "cubridge_nvrtc_paths_{name}_{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        for f in files {
            let path = root.join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b"").unwrap();
        }
        root
    }

    fn target(sub: &str) -> String {
        format!("targets/{}-linux/{sub}", std::env::consts::ARCH)
    }

    #[test]
    fn cuda12_pip_headers_are_in_the_runtime_package() {
        let root = layout(
            "cu12",
            &[
                "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
                "nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.9",
                "nvidia/cuda_nvrtc/include/nvrtc.h",
                "nvidia/cuda_runtime/include/cuda_fp16.h",
            ],
        );
        let lib = root.join("nvidia/cuda_nvrtc/lib");
        let env = SearchEnv {
            added: vec![lib.clone()],
            ..Default::default()
        };
        assert_eq!(env.library_dirs(), vec![lib.clone()]);
        assert_eq!(
            env.include_dirs(),
            vec![root.join("nvidia/cuda_runtime/include")]
        );
        let files = nvrtc_files(&lib);
        assert!(files[0].ends_with("libnvrtc-builtins.so.12.9"), "{files:?}");
        assert_eq!(files.len(), 2);
        assert_eq!(major_of(&files[1]), Some(12));
    }

    #[test]
    fn cuda13_pip_headers_are_beside_the_library() {
        let root = layout(
            "cu13",
            &[
                "nvidia/cu13/lib/libnvrtc.so.13",
                "nvidia/cu13/lib/libnvrtc.alt.so.13",
                "nvidia/cu13/include/cuda_fp16.h",
            ],
        );
        let lib = root.join("nvidia/cu13/lib");
        let env = SearchEnv {
            added: vec![lib.clone()],
            ..Default::default()
        };
        assert_eq!(env.include_dirs(), vec![root.join("nvidia/cu13/include")]);
        assert_eq!(nvrtc_files(&lib), vec![lib.join("libnvrtc.so.13")]);
    }

    #[test]
    fn conda_headers_under_targets_or_include() {
        let with_targets = layout(
            "conda_t",
            &["lib/libnvrtc.so.12", &target("include/cuda_fp16.h")],
        );
        let env = SearchEnv {
            conda: Some(with_targets.clone()),
            ..Default::default()
        };
        assert_eq!(env.library_dirs(), vec![with_targets.join("lib")]);
        assert_eq!(
            env.include_dirs(),
            vec![with_targets.join(target("include"))]
        );
        let plain = layout("conda_p", &["lib/libnvrtc.so.12", "include/cuda_fp16.h"]);
        let env = SearchEnv {
            conda: Some(plain.clone()),
            ..Default::default()
        };
        assert_eq!(env.include_dirs(), vec![plain.join("include")]);
    }

    #[test]
    fn toolkit_lib64_and_include() {
        let root = layout(
            "toolkit",
            &["lib64/libnvrtc.so.12.4.127", "include/cuda_fp16.h"],
        );
        let env = SearchEnv {
            toolkits: vec![root.clone(), PathBuf::from("/nonexistent-cuda")],
            ..Default::default()
        };
        assert_eq!(env.library_dirs()[0], root.join("lib64"));
        assert_eq!(env.include_dirs(), vec![root.join("include")]);
        assert_eq!(major_of(&root.join("lib64/libnvrtc.so.12.4.127")), Some(12));
        assert_eq!(major_of(Path::new("libnvrtc.so")), None);
    }

    #[test]
    fn a_header_folder_added_directly_is_used() {
        let root = layout("pathfinder", &["somewhere/include/cuda_fp16.h"]);
        let env = SearchEnv {
            added: vec![root.join("somewhere/include")],
            ..Default::default()
        };
        assert_eq!(env.include_dirs(), vec![root.join("somewhere/include")]);
        assert!(nvrtc_files(&root.join("somewhere/include")).is_empty());
    }

    #[test]
    fn nvrtc_newer_than_the_driver_is_passed_over() {
        assert_eq!(choose(&[Some(13), Some(12)], Some(12)), Ok(vec![1]));
        assert_eq!(choose(&[Some(13), Some(12)], Some(13)), Ok(vec![0, 1]));
        assert_eq!(choose(&[Some(13)], None), Ok(vec![0]));
        assert_eq!(choose(&[Some(13), None], Some(12)), Ok(vec![1]));
        assert_eq!(choose(&[Some(13), Some(13)], Some(12)), Err((13, 12)));
        assert_eq!(choose(&[], Some(12)), Ok(vec![]));
    }
}
