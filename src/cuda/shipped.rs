//! Kernels compiled when the crate was built and shipped inside it, so that the first call of
//! the common cases in a new process loads machine code instead of running NVRTC.
//!
//! `make wheel` compiles them: `cargo run --release --example ship_kernels -- DIR` writes the
//! programs of [`crate::ops::shipped_programs`] as cubins for each architecture it is given,
//! and a build with `CUBRIDGE_SHIP_KERNELS=DIR` embeds every `NAME-KEY.smARCH.cubin` in DIR (see
//! `build.rs`). A build without it ships none; everything then compiles on first use as before.

use crate::error::Result;
use std::path::{Path, PathBuf};

// `SHIPPED`: (program name, key, architecture, cubin), written by build.rs.
include!(concat!(env!("OUT_DIR"), "/shipped_kernels.rs"));

/// The shipped cubin of the program with `key` (see [`super::nvrtc::key`]) that runs on a device
/// of compute capability `arch`: one built for the same major version and a minor version at or
/// below the device's (a cubin runs on those), the newest such.
pub fn find(key: &str, arch: u32) -> Option<&'static [u8]> {
    pick(SHIPPED, key, arch)
}

fn pick<'a>(entries: &[(&str, &str, u32, &'a [u8])], key: &str, arch: u32) -> Option<&'a [u8]> {
    entries
        .iter()
        .filter(|(_, k, a, _)| *k == key && a / 10 == arch / 10 && *a <= arch)
        .max_by_key(|(_, _, a, _)| *a)
        .map(|(_, _, _, image)| *image)
}

/// The programs shipped in this build, by name and architecture.
pub fn list() -> Vec<(&'static str, u32)> {
    SHIPPED
        .iter()
        .map(|(name, _, arch, _)| (*name, *arch))
        .collect()
}

/// Compiles `programs` (those cubridge ships) for each of `archs` (e.g. `[80, 90]`) with NVRTC
/// and writes them into `dir` under the names build.rs embeds. Returns the files written.
pub fn write(
    dir: &Path,
    archs: &[u32],
    programs: &[super::kernels::Program],
) -> Result<Vec<PathBuf>> {
    let io = |path: &Path, e: std::io::Error| {
        crate::Error::invalid(format!("cannot write {}: {e}", path.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let mut written = Vec::new();
    for program in programs {
        let key = super::nvrtc::key(&program.source, &program.options);
        for &arch in archs {
            let image = super::nvrtc::compile_for(
                &program.source,
                &program.name,
                super::nvrtc::Target::Cubin(arch),
                &program.options,
            )?;
            let path = dir.join(format!("{}-{key}.sm{arch}.cubin", program.name));
            std::fs::write(&path, image).map_err(|e| io(&path, e))?;
            written.push(path);
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_device_takes_the_newest_cubin_of_its_major_version_at_or_below_it() {
        let entries: &[(&str, &str, u32, &[u8])] = &[
            ("add", "k1", 80, b"80"),
            ("add", "k1", 86, b"86"),
            ("add", "k1", 90, b"90"),
            ("add", "k1", 120, b"120"),
            ("add", "k2", 90, b"other"),
        ];
        let pick = |key, arch| super::pick(entries, key, arch);
        assert_eq!(pick("k1", 80), Some(&b"80"[..]));
        assert_eq!(pick("k1", 89), Some(&b"86"[..]));
        assert_eq!(pick("k1", 90), Some(&b"90"[..]));
        assert_eq!(pick("k1", 121), Some(&b"120"[..]));
        // Machine code does not run on another major version, nor on an older minor one.
        assert_eq!(pick("k1", 75), None);
        assert_eq!(pick("k1", 100), None);
        assert_eq!(pick("k2", 80), None);
        assert_eq!(pick("k3", 90), None);
    }
}
