//! Operations: one module per op, each validating its inputs, planning the loop and launching
//! the backend that owns the memory.

pub mod add;
pub mod arange;
pub mod copy;
pub mod create;
pub mod elementwise;
pub mod launch;
pub mod module;
pub mod plan;
pub mod raw;
pub mod reduction;

use crate::array::Array;
use crate::cpu::element::Scalar;
use crate::dtype::DType;

/// One operand of a kernel call: an array (zero-copy), or a value for every index, with the
/// dtype it came with (`numpy.float32(2)`, a 0-d host array) or none (a Python scalar).
pub enum Arg {
    /// An array from any producer.
    Array(Array),
    /// A scalar.
    Value(Scalar, Option<DType>),
}

/// The programs compiled ahead of time and shipped in the build (see
/// [`crate::cuda::shipped`]): `add`'s ([`add::shipped_programs`]), the casts of copies
/// (`copy::shipped_programs`) and the common reductions
/// ([`reduction::builtin::shipped_programs`]).
pub fn shipped_programs() -> crate::Result<Vec<crate::cuda::kernels::Program>> {
    let mut all = add::shipped_programs()?;
    all.extend(copy::shipped_programs());
    all.extend(reduction::builtin::shipped_programs());
    Ok(all)
}

pub use add::add;
pub use arange::arange;
pub use copy::copy;
pub use create::full;
