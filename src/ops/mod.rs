//! Operations: one module per op, each validating its inputs, planning the loop and launching
//! the backend that owns the memory.

pub mod add;
pub mod copy;
pub mod create;
pub mod elementwise;
pub mod launch;
pub mod plan;
pub mod raw;

pub use add::add;
pub use copy::copy;
pub use create::{arange, full};
