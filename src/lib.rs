//! cubridge: zero-copy array exchange between Rust and the Python array libraries (DLPack, the
//! CUDA array interface, the buffer protocol), and kernels that run on memory cubridge does not
//! own.
//!
//! The core (dtypes, devices, layouts, arrays, views, ops, backends) is plain Rust and builds
//! without Python; the `python` feature adds the bindings (the `python` module).
//!
//! Two arrays made on the CPU, added, and the result read back (the same calls take
//! `Device::Cuda(0)` to run on a GPU):
//!
//! ```
//! use cubridge::cpu::element::Scalar;
//! use cubridge::{ops, DType, Device};
//!
//! let (int, f32, cpu) = (Scalar::Int, DType::Float32, Device::Cpu);
//! let a = ops::arange(int(0), int(4), int(1), f32, cpu)?;
//! let b = ops::full(&[4], Scalar::Float(0.5), f32, cpu)?;
//! let sum = ops::add(&a, &b, None, None)?;
//! assert_eq!((sum.shape(), sum.dtype()), (&[4][..], DType::Float32));
//! // SAFETY: `sum` is a new contiguous float32 array in host memory, alive while `values` is.
//! let values = unsafe { std::slice::from_raw_parts(sum.data_ptr() as *const f32, sum.numel()) };
//! assert_eq!(values, [0.5, 1.5, 2.5, 3.5]);
//! # Ok::<(), cubridge::Error>(())
//! ```

#![deny(clippy::undocumented_unsafe_blocks)]

// A wheel for the limited API of 3.11 must not call what the limited API has only from 3.12.
#[cfg(all(feature = "abi3", feature = "vectorcall"))]
compile_error!(
    "the `vectorcall` feature needs the limited API of Python 3.12 (feature `py312`), not `abi3` (3.11)"
);

pub mod array;
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod dtype;
pub mod error;
pub mod export;
pub mod layout;
pub mod ops;
pub(crate) mod phases;
pub mod storage;
pub mod view;

#[cfg(feature = "python")]
pub mod python;

pub use array::Array;
pub use device::Device;
pub use dtype::DType;
pub use error::{Error, Result};
pub use layout::Layout;

/// `mutex` locked, poisoned or not: cubridge's locks guard plain tables and queues, which a
/// panic elsewhere leaves whole.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
