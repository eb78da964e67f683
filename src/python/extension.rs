//! What every extension module that carries cubridge's core sets up once: cubridge's own
//! `_cubridge` module and the modules of extension crates built on it (see
//! [`prepare_extension`]).

use pyo3::prelude::*;

/// Sets up cubridge's machinery inside a pyo3 extension module that depends on the `cubridge`
/// crate; call it once from the `#[pymodule]` function. It:
///
/// 1. finds NVRTC where the `cubridge` Python package does (the `nvidia` pip packages that
///    PyTorch and CuPy install), so that kernels compile;
/// 2. asks PyTorch and CuPy to give back their cached memory before an allocation fails;
/// 3. registers with `atexit` the release of foreign buffers that queued kernels still hold,
///    while the interpreter can still run their producers' deleters.
///
/// The extension carries its own copy of cubridge's state (kernel cache, releaser), so this is
/// needed even when `cubridge` itself is imported.
///
/// ```ignore
/// #[pymodule]
/// fn my_ext(m: &Bound<'_, PyModule>) -> PyResult<()> {
///     cubridge::python::prepare_extension(m)?;
///     m.add_function(wrap_pyfunction!(my_kernel, m)?)
/// }
/// ```
pub fn prepare_extension(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let dirs: Vec<std::path::PathBuf> = py
        .import("cubridge.cuda")?
        .call_method0("_nvidia_library_dirs")?
        .extract()?;
    crate::cuda::nvrtc::add_search_dirs(dirs);
    register_shutdown(m)
}

/// Steps 2 and 3 of [`prepare_extension`] (cubridge's own module finds NVRTC from Python).
pub(crate) fn register_shutdown(m: &Bound<'_, PyModule>) -> PyResult<()> {
    crate::cuda::memory::set_out_of_memory_hook(super::functions::release_other_caches);
    let release = wrap_pyfunction!(super::functions::_release_pending, m)?;
    m.py()
        .import("atexit")?
        .call_method1("register", (release,))?;
    Ok(())
}
