//! Pickling `cubridge.Array` (the reducers themselves are registered by `cubridge/_pickle.py`,
//! with `copyreg` and multiprocessing's `ForkingPickler`).
//!
//! Host, pinned and managed arrays pickle by value, as numpy's do: dtype, shape, device and
//! the elements' bytes in C order; unpickling allocates the same kind of memory. A CUDA device
//! array crosses to another process of the node only through multiprocessing (its pickler
//! carries file descriptors): as a zero-copy view of the same memory, ordered after the
//! sender's last write on the device (see [`crate::cuda::ipc`]).

use super::types::{parse_device, parse_dtype, PyArray};
use crate::array::Array;
use crate::cuda::ipc;
use crate::device::Device;
use crate::error::Error;
use crate::layout::Layout;
use crate::ops;
use crate::storage::Buffer;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Arc;

/// The array's elements as bytes in C order (any device; CUDA memory is copied to the host).
#[pyfunction]
pub fn _host_bytes<'py>(
    py: Python<'py>,
    array: PyRef<'_, PyArray>,
) -> PyResult<Bound<'py, PyBytes>> {
    let _restore = crate::cuda::context::Restore::new();
    let a = &array.inner;
    let host = py.detach(|| ops::copy(a, a.dtype(), Device::Cpu))?;
    // SAFETY: a fresh C-contiguous host array of `nbytes` initialised bytes.
    let bytes = unsafe { std::slice::from_raw_parts(host.data_ptr(), host.nbytes()) };
    Ok(PyBytes::new(py, bytes))
}

/// A new array of `shape` and `dtype` on `device` (host, pinned or managed memory) holding
/// `data`, the elements in C order.
#[pyfunction]
pub fn _host_rebuild(
    data: &[u8],
    dtype: &Bound<'_, PyAny>,
    shape: Vec<usize>,
    device: &Bound<'_, PyAny>,
    readonly: bool,
) -> PyResult<PyArray> {
    let _restore = crate::cuda::context::Restore::new();
    let (dtype, device) = (parse_dtype(dtype)?, parse_device(Some(device))?);
    if matches!(device, Device::Cuda(_)) {
        return Err(Error::invalid("device arrays are not pickled by value").into());
    }
    let array = Array::empty(&shape, dtype, device)?;
    if data.len() != array.nbytes() {
        return Err(Error::invalid(format!(
            "{} bytes do not make an array of shape {shape:?} and dtype {}",
            data.len(),
            dtype.name()
        ))
        .into());
    }
    // SAFETY: a fresh host-accessible array of exactly `data.len()` bytes, used by nothing yet.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), array.data_ptr(), data.len()) };
    Ok(PyArray::new(array.with_readonly(readonly)))
}

/// What a reader needs to map a CUDA device array: the block's data, the pool's file
/// descriptor (for the sender to duplicate), and the array's place in the block (byte offset,
/// shape, strides in elements, dtype, read-only).
type Shared<'py> = (
    Bound<'py, PyBytes>,
    i32,
    usize,
    Vec<usize>,
    Vec<isize>,
    &'static str,
    bool,
);

/// Exports a CUDA device array for one reader in another process; its memory stays here until
/// that reader has let go (see [`ipc::export`]).
#[pyfunction]
pub fn _ipc_export<'py>(py: Python<'py>, array: PyRef<'_, PyArray>) -> PyResult<Shared<'py>> {
    let _restore = crate::cuda::context::Restore::new();
    let a = &array.inner;
    let Device::Cuda(ordinal) = a.device() else {
        return Err(Error::invalid(format!(
            "{} memory is not shared through CUDA IPC",
            a.device()
        ))
        .into());
    };
    let keep: Box<dyn std::any::Any + Send + Sync> = Box::new(a.buffer().clone());
    let block = a.buffer().cuda_alloc().map(|alloc| {
        let (base, size) = alloc.block();
        ipc::Block {
            base,
            size,
            export_data: alloc.export_data(),
        }
    });
    let export = ipc::export(a.data_ptr() as u64, block, ordinal, a.pending()?, keep)?;
    // The first element's place in the block (the layout's own offset is relative to this
    // process's buffer, which need not start the block).
    let offset = (a.data_ptr() as u64 - export.base) as usize;
    Ok((
        PyBytes::new(py, &export.wire.to_bytes()),
        export.pool_fd,
        offset,
        a.shape().to_vec(),
        a.strides().to_vec(),
        a.dtype().name(),
        a.readonly(),
    ))
}

/// Maps an array that another process exported (`fd`: its pool's file descriptor, owned by
/// this call, or -1), as a view of the same memory ordered after the sender's last write.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn _ipc_import(
    wire: &[u8],
    fd: i32,
    offset: usize,
    shape: Vec<usize>,
    strides: Vec<isize>,
    dtype: &Bound<'_, PyAny>,
    readonly: bool,
) -> PyResult<PyArray> {
    use std::os::fd::FromRawFd;
    let _restore = crate::cuda::context::Restore::new();
    // SAFETY: the descriptor was handed to this call to own (multiprocessing's DupFd.detach).
    let fd = (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
    let wire = ipc::Wire::from_bytes(wire)?;
    let dtype = parse_dtype(dtype)?;
    let layout = Layout::new(shape, strides, offset)?;
    let inside = match layout.byte_extent(dtype.itemsize())? {
        Some((start, end)) => start >= 0 && end as u64 <= wire.size,
        None => offset as u64 <= wire.size,
    };
    if !inside {
        return Err(Error::invalid("a shared array reaches outside the memory sent").into());
    }
    let (mapping, stream, event) = ipc::import(&wire, fd)?;
    let (ptr, ordinal) = (mapping.ptr() as *mut u8, mapping.ordinal());
    // SAFETY: the mapping keeps `ptr` valid for its size, and only its drop releases it.
    let buffer =
        unsafe { Buffer::foreign(ptr, crate::storage::Keepalive::Boxed(Box::new(mapping))) };
    // SAFETY: every element lies inside the mapped block (checked above), on that device; the
    // sender's read-only flag is kept.
    let array = unsafe {
        Array::from_parts(
            Arc::new(buffer),
            layout,
            dtype,
            Device::Cuda(ordinal),
            readonly,
        )
    };
    Ok(PyArray::new(match event {
        Some(event) => array.with_pending(stream, event),
        None => array,
    }))
}

/// Whether the pool of the array that `wire` describes must be imported here (its file
/// descriptor fetched from the sender): once per sending process and device.
#[pyfunction]
pub fn _ipc_needs_pool(wire: &[u8]) -> PyResult<bool> {
    let _restore = crate::cuda::context::Restore::new();
    Ok(ipc::needs_pool(&ipc::Wire::from_bytes(wire)?)?)
}

/// Makes the device memory that cubridge allocates from now on shareable with other processes
/// (`True`), or not (`False`).
#[pyfunction]
pub fn cuda_set_shareable(on: bool) -> PyResult<()> {
    let _restore = crate::cuda::context::Restore::new();
    Ok(ipc::set_shareable(on)?)
}

/// Lets go of the memory that other processes have released (also done at each allocation).
#[pyfunction]
pub fn _ipc_reap() {
    let _restore = crate::cuda::context::Restore::new();
    ipc::reap();
}

/// Adds this file's functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_host_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(_host_rebuild, m)?)?;
    m.add_function(wrap_pyfunction!(_ipc_export, m)?)?;
    m.add_function(wrap_pyfunction!(_ipc_import, m)?)?;
    m.add_function(wrap_pyfunction!(_ipc_reap, m)?)?;
    m.add_function(wrap_pyfunction!(_ipc_needs_pool, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_set_shareable, m)?)?;
    Ok(())
}
