//! Fuzzes what a user hands `ElementwiseKernel`: the parameter lists, the kernel name, the
//! operation and the preamble. Parsing must never panic, and every refusal must be one of the
//! errors that reach Python as ValueError or TypeError. A declaration that is accepted is then
//! bound to dtypes and generated into CUDA C++ for every role its parameters can take (nothing
//! is compiled: that needs NVRTC), which must not panic either.
#![no_main]

use cubridge::dtype::DType;
use cubridge::ops::elementwise::source::{program, tiled_program, Role, Signature};
use cubridge::ops::elementwise::spec::{reads_output, uses_index, Spec};
use cubridge::Error;
use libfuzzer_sys::fuzz_target;

/// Splits the input into five texts at 0xFF bytes (missing ones are empty), lossily as UTF-8.
fn texts(data: &[u8]) -> [String; 5] {
    let mut parts = data.split(|&b| b == 0xFF);
    std::array::from_fn(|_| String::from_utf8_lossy(parts.next().unwrap_or(&[])).into_owned())
}

fuzz_target!(|data: &[u8]| {
    let [ins, outs, operation, name, preamble] = texts(data);
    let spec = match Spec::new(&ins, &outs, &operation, &name, &preamble) {
        Ok(spec) => spec,
        Err(Error::Invalid(_) | Error::UnsupportedDType(_) | Error::DTypeMismatch { .. }) => return,
        Err(other) => panic!("a declaration was refused with {other:?}"),
    };
    let _ = uses_index(&spec.operation);
    let reads: Vec<bool> = spec
        .outputs
        .iter()
        .map(|p| reads_output(&spec.operation, &p.name))
        .collect();
    // Bind every type name from one byte of the input, and give each parameter a role.
    let n = spec.inputs.len() + spec.outputs.len();
    let pick = |k: usize| data.get(k).copied().unwrap_or(0);
    let given: Vec<Option<DType>> = (0..n)
        .map(|k| Some(DType::ALL[usize::from(pick(k)) % DType::ALL.len()]))
        .collect();
    let Ok(dtypes) = spec.bind(&given, &vec![None; n]) else {
        return;
    };
    let roles: Vec<Role> = spec
        .params()
        .enumerate()
        .map(|(k, p)| match (p.raw, k < spec.inputs.len() && pick(k) % 3 == 0) {
            (true, _) => Role::Raw,
            (false, true) => Role::Value,
            (false, false) => Role::Element,
        })
        .collect();
    let sig = Signature { dtypes, roles };
    let _ = program(&spec, &sig, &reads);
    let _ = tiled_program(&spec, &sig, &reads);
});
