//! cubridge: zero-copy array exchange between Rust and the Python array libraries (DLPack, the
//! CUDA array interface, the buffer protocol), and kernels that run on memory cubridge does not
//! own.
//!
//! The core (dtypes, devices, layouts, arrays, views, ops, backends) is plain Rust and builds
//! without Python; the `python` feature adds the bindings in [`python`].

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod array;
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod dtype;
pub mod error;
pub mod export;
pub mod layout;
pub mod ops;
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
