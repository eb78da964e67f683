//! Kernels compiled when the crate was built and shipped inside it, so that the first call of
//! the common cases in a new process loads machine code instead of running NVRTC.
//!
//! `make wheel` compiles them: `cargo run --release --example ship_kernels -- DIR` writes the
//! programs of [`crate::ops::shipped_programs`] as cubins for each architecture it is given and
//! as PTX for the newest of them, and a build with `CUBRIDGE_SHIP_KERNELS=DIR` embeds every
//! `NAME-KEY.smARCH.cubin` and `NAME-KEY.computeARCH.ptx` in DIR (see `build.rs`). A build
//! without it ships none; everything then compiles on first use as before.

use super::nvrtc::Target;
use crate::error::Result;
use std::path::{Path, PathBuf};

/// A shipped image: (program name, key, architecture, PTX rather than a cubin, image).
type Entry<'a> = (&'a str, &'a str, u32, bool, &'a [u8]);

// `SHIPPED`: the `Entry`s of this build, written by build.rs.
include!(concat!(env!("OUT_DIR"), "/shipped_kernels.rs"));

/// The shipped image of the program with `key` (see [`super::nvrtc::key`]) that runs on a
/// device of compute capability `arch`: the newest cubin built for its major version and a
/// minor version at or below its own (a cubin runs on those); only where none fits, the newest
/// PTX for an architecture at or below it, which the driver compiles when it loads (a device
/// newer than every cubin shipped).
pub fn find(key: &str, arch: u32) -> Option<&'static [u8]> {
    pick(SHIPPED, key, arch)
}

fn pick<'a>(entries: &[Entry<'a>], key: &str, arch: u32) -> Option<&'a [u8]> {
    let newest = |ptx: bool, fits: &dyn Fn(u32) -> bool| {
        entries
            .iter()
            .filter(|(_, k, a, p, _)| *k == key && *p == ptx && fits(*a))
            .max_by_key(|(_, _, a, _, _)| *a)
            .map(|(_, _, _, _, image)| *image)
    };
    newest(false, &|a| a / 10 == arch / 10 && a <= arch).or_else(|| newest(true, &|a| a <= arch))
}

/// The cubins shipped in this build, by program name and architecture.
pub fn list() -> Vec<(&'static str, u32)> {
    SHIPPED
        .iter()
        .filter(|(_, _, _, ptx, _)| !ptx)
        .map(|(name, _, arch, _, _)| (*name, *arch))
        .collect()
}

/// The architectures `make wheel` ships cubins for when given none: the oldest that the loaded
/// NVRTC knows of each major version from sm_80 on. A cubin runs on every newer minor version
/// of its major, so these cover every architecture this NVRTC knows from sm_80 on.
pub fn default_archs() -> Result<Vec<u32>> {
    Ok(oldest_of_each_major(super::nvrtc::supported_archs()?))
}

fn oldest_of_each_major(supported: &[u32]) -> Vec<u32> {
    let mut archs: Vec<u32> = supported.iter().copied().filter(|&a| a >= 80).collect();
    archs.sort_unstable();
    archs.dedup_by_key(|a| *a / 10);
    archs
}

/// What [`write()`] compiles for `archs`: a cubin for each, and PTX for the newest, so that a
/// device newer than all of them still loads a shipped image (the driver compiles the PTX).
pub fn targets(archs: &[u32]) -> Vec<Target> {
    let mut targets: Vec<Target> = archs.iter().map(|&a| Target::Cubin(a)).collect();
    targets.extend(archs.iter().max().map(|&a| Target::Ptx(a)));
    targets
}

/// Compiles `programs` (those cubridge ships) for each of `targets` (see [`targets`]) with
/// NVRTC and writes them into `dir` under the names build.rs embeds. Returns the files written.
pub fn write(
    dir: &Path,
    targets: &[Target],
    programs: &[super::kernels::Program],
) -> Result<Vec<PathBuf>> {
    let io = |path: &Path, e: std::io::Error| {
        crate::Error::invalid(format!("cannot write {}: {e}", path.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let mut written = Vec::new();
    for program in programs {
        let key = super::nvrtc::key(&program.source, &program.options);
        for &target in targets {
            let image = super::nvrtc::compile_for(
                &program.source,
                &program.name,
                target,
                &program.options,
            )?;
            let file = match target {
                Target::Cubin(arch) => format!("{}-{key}.sm{arch}.cubin", program.name),
                Target::Ptx(arch) => format!("{}-{key}.compute{arch}.ptx", program.name),
            };
            let path = dir.join(file);
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
        let entries: &[super::Entry] = &[
            ("add", "k1", 80, false, b"80"),
            ("add", "k1", 86, false, b"86"),
            ("add", "k1", 90, false, b"90"),
            ("add", "k1", 120, false, b"120"),
            ("add", "k2", 90, false, b"other"),
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

    #[test]
    fn ptx_serves_only_a_device_that_no_cubin_fits_and_not_one_older_than_it() {
        let entries: &[super::Entry] = &[
            ("add", "k1", 80, false, b"sm80"),
            ("add", "k1", 90, false, b"sm90"),
            ("add", "k1", 120, false, b"sm120"),
            ("add", "k1", 90, true, b"compute90"),
            ("add", "k1", 120, true, b"compute120"),
            ("add", "k2", 80, false, b"other"),
        ];
        let pick = |key, arch| super::pick(entries, key, arch);
        assert_eq!(pick("k1", 89), Some(&b"sm80"[..]));
        assert_eq!(pick("k1", 90), Some(&b"sm90"[..]));
        assert_eq!(pick("k1", 121), Some(&b"sm120"[..]));
        // No cubin of its major version: the newest PTX at or below the device.
        assert_eq!(pick("k1", 100), Some(&b"compute90"[..]));
        assert_eq!(pick("k1", 130), Some(&b"compute120"[..]));
        assert_eq!(pick("k1", 75), None);
        assert_eq!(pick("k2", 130), None);
    }

    #[test]
    fn the_default_covers_each_major_version_from_sm_80_with_ptx_for_the_newest() {
        use super::Target::{Cubin, Ptx};
        // The architectures NVRTC 12.9 reports.
        let nvrtc = [
            50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 120, 121,
        ];
        let archs = super::oldest_of_each_major(&nvrtc);
        assert_eq!(archs, [80, 90, 100, 120]);
        let targets = super::targets(&archs);
        assert_eq!(
            targets,
            [Cubin(80), Cubin(90), Cubin(100), Cubin(120), Ptx(120)]
        );
    }
}
