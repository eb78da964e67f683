//! Embeds the kernels compiled ahead of time (see `src/cuda/shipped.rs`): every
//! `NAME-KEY.smARCH.cubin` and `NAME-KEY.computeARCH.ptx` in `$CUBRIDGE_SHIP_KERNELS`, or none
//! when it is unset.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=CUBRIDGE_SHIP_KERNELS");
    let mut entries: Vec<(String, String, u32, bool, PathBuf)> = Vec::new();
    if let Some(dir) = std::env::var_os("CUBRIDGE_SHIP_KERNELS") {
        let dir = PathBuf::from(dir);
        println!("cargo:rerun-if-changed={}", dir.display());
        let listing = std::fs::read_dir(&dir).unwrap_or_else(|e| {
            panic!(
                "CUBRIDGE_SHIP_KERNELS={} cannot be read ({e}); run `make wheel`, or unset it",
                dir.display()
            )
        });
        for entry in listing.flatten() {
            let path = entry.path();
            let Some(file) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some((stem, ptx)) = image_stem(file) else {
                continue;
            };
            let parsed = stem.rsplit_once(if ptx { ".compute" } else { ".sm" });
            let parsed = parsed.and_then(|(front, arch)| {
                let (name, key) = front.rsplit_once('-')?;
                Some((name.to_string(), key.to_string(), arch.parse::<u32>().ok()?))
            });
            let Some((name, key, arch)) = parsed else {
                panic!(
                    "{} is not named NAME-KEY.smARCH.cubin or NAME-KEY.computeARCH.ptx",
                    path.display()
                );
            };
            let path = path.canonicalize().expect("a listed file resolves");
            entries.push((name, key, arch, ptx, path));
        }
        if entries.is_empty() {
            panic!(
                "CUBRIDGE_SHIP_KERNELS={} holds no shipped kernels",
                dir.display()
            );
        }
    }
    entries.sort();
    let mut code = String::from(
        "/// Kernels shipped in this build: (program name, key, architecture, PTX rather than a\n\
         /// cubin, image).\n\
         pub static SHIPPED: &[(&str, &str, u32, bool, &[u8])] = &[\n",
    );
    for (name, key, arch, ptx, path) in &entries {
        let _ = writeln!(
            code,
            "    ({name:?}, {key:?}, {arch}, {ptx}, include_bytes!({:?})),",
            path.display().to_string()
        );
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("shipped_kernels.rs"), code).expect("OUT_DIR is writable");
}

/// The part of a shipped image's file name before its extension, and whether it is PTX (its
/// text ends in the NUL the driver needs, as NVRTC hands it back); `None` for other files.
fn image_stem(file: &str) -> Option<(&str, bool)> {
    match file.strip_suffix(".cubin") {
        Some(stem) => Some((stem, false)),
        None => file.strip_suffix(".ptx").map(|stem| (stem, true)),
    }
}
