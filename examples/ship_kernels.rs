//! Compiles the kernels cubridge ships in its wheel (see `src/cuda/shipped.rs`) with NVRTC, as
//! cubins for each architecture given and as PTX for the newest of them, into a folder that a
//! build with `CUBRIDGE_SHIP_KERNELS` embeds:
//!
//! ```text
//! cargo run --release --example ship_kernels -- DIR [ARCH ...]
//! ```
//!
//! Without architectures: the oldest of each major version from sm_80 on that NVRTC knows
//! (`cubridge::cuda::shipped::default_archs`; 80 90 100 120 for NVRTC 12.9).
//!
//! NVRTC is found as at run time (the library search path, `CUDA_HOME`) and in the folder
//! `$CUBRIDGE_NVRTC_DIR`; the CUDA headers in `$CUDA_HOME/include`. `make wheel` sets both from
//! the `nvidia` pip packages, so no CUDA toolkit is needed.

use std::path::PathBuf;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: ship_kernels DIR [ARCH ...]");
        std::process::exit(2);
    };
    let mut archs: Vec<u32> = Vec::new();
    for a in args {
        match a.parse() {
            Ok(a) => archs.push(a),
            Err(_) => {
                eprintln!("not an architecture (e.g. 90): {a}");
                std::process::exit(2);
            }
        }
    }
    if let Some(nvrtc) = std::env::var_os("CUBRIDGE_NVRTC_DIR") {
        cubridge::cuda::nvrtc::add_search_dirs([PathBuf::from(nvrtc)]);
    }
    if archs.is_empty() {
        archs = cubridge::cuda::shipped::default_archs().unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1);
        });
    }
    let start = Instant::now();
    let targets = cubridge::cuda::shipped::targets(&archs);
    let written = cubridge::ops::shipped_programs()
        .and_then(|programs| cubridge::cuda::shipped::write(&dir, &targets, &programs));
    match written {
        Ok(files) => {
            let bytes: u64 = files
                .iter()
                .filter_map(|f| std::fs::metadata(f).ok())
                .map(|m| m.len())
                .sum();
            println!(
                "{} images ({} KiB), cubins for sm_{archs:?} and PTX for the newest, in {} in {:.1} s",
                files.len(),
                bytes / 1024,
                dir.display(),
                start.elapsed().as_secs_f64()
            );
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
