//! The DLPack C exchange table as kernels' operands use it: a producer's tensor lent through
//! `dltensor_from_py_object_no_sync` (a description filled on the caller's stack: no
//! allocation, no deleter) and the producer's current work stream, asked once per call and
//! device rather than once per operand (PyTorch's answer costs more than the lending). dlpark's
//! `ExchangeApi` asks for the stream with every tensor it imports, so the table is called here.

use crate::array::Array;
use crate::cuda::stream::Stream;
use crate::device::Device;
use crate::phases::producer;
use crate::python::Holder;
use crate::view::check_dltensor;
use dlpark::ffi::{
    DLDevice, DLPackExchangeAPI, DLPackExchangeAPIHeader, DLTensor, DLPACK_MAJOR_VERSION,
};
use pyo3::prelude::*;

/// The address of the exchange table of `ty`'s `__dlpack_c_exchange_api__` capsule of the
/// DLPack major version cubridge reads (walking the table's chain of older versions), or 0.
/// Tables live as long as the process (the DLPack contract), so the address may be kept.
pub fn table_of(ty: &Bound<'_, pyo3::types::PyType>) -> usize {
    let Ok(capsule) = ty.getattr(pyo3::intern!(ty.py(), "__dlpack_c_exchange_api__")) else {
        return 0;
    };
    // SAFETY: PyCapsule_GetPointer accepts any object; it returns NULL (with an exception set,
    // cleared below) for anything but a capsule of that name.
    let mut header = unsafe {
        pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dlpack_exchange_api".as_ptr())
    } as *const DLPackExchangeAPIHeader;
    if header.is_null() {
        let _ = PyErr::take(ty.py());
    }
    while !header.is_null() {
        // SAFETY: a table's chain consists of live tables, each starting with its header.
        let h = unsafe { &*header };
        if h.version.major == DLPACK_MAJOR_VERSION {
            return header as usize;
        }
        header = h.prev_api;
    }
    0
}

/// The producers' current work streams asked during one call, by table and device.
#[derive(Default)]
pub struct WorkStreams(Vec<(usize, (u32, i32), Option<Stream>)>);

impl WorkStreams {
    /// The current work stream of the producer of table `api` on `device`, asked once.
    fn get(
        &mut self,
        py: Python<'_>,
        api: &DLPackExchangeAPI,
        table: usize,
        device: DLDevice,
    ) -> Option<Stream> {
        let key = (device.device_type.0, device.device_id);
        if let Some(&(_, _, s)) = self.0.iter().find(|(t, k, _)| *t == table && *k == key) {
            return s;
        }
        let ask = api.current_work_stream?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the table's function, called with the GIL held as DLPack requires, writing
        // one stream handle into `raw`.
        let rc = unsafe {
            producer!(
                ProducerStream,
                ask(device.device_type, device.device_id, &mut raw)
            )
        };
        let stream = if rc == 0 {
            Some(Stream::from_handle(raw as usize))
        } else {
            // The producer set an exception; the owning export will give its answer.
            let _ = PyErr::take(py);
            None
        };
        self.0.push((table, key, stream));
        stream
    }
}

/// `obj` lent through table `table` (an address from [`table_of`]): a view holding `obj`, with
/// the producer's current work stream for a CUDA tensor. `None` where the producer lends
/// nothing (no such function, or a refusal, whose exception is cleared: the owning export then
/// answers) or describes what cubridge refuses.
pub fn lend(
    table: usize,
    obj: &Bound<'_, PyAny>,
    streams: &mut WorkStreams,
) -> Option<(Array, Option<Stream>)> {
    if table == 0 {
        return None;
    }
    // SAFETY: `table` came from table_of: a live table of the major version cubridge reads.
    let api = unsafe { &*(table as *const DLPackExchangeAPI) };
    let lend = api.dltensor_from_py_object_no_sync?;
    // SAFETY: DLTensor is a plain C struct; all zeros is a valid value to be overwritten.
    let mut t: DLTensor = unsafe { std::mem::zeroed() };
    // SAFETY: `obj` is of the type the table came from, the GIL is held, and `t` is writable.
    if unsafe { producer!(ProducerExport, lend(obj.as_ptr().cast(), &mut t)) } != 0 {
        let _ = PyErr::take(obj.py());
        return None;
    }
    // SAFETY: the lent descriptor's shape and strides are the producer's until control returns
    // to it, after this call.
    let checked = unsafe { check_dltensor(&t) }.ok()?;
    let stream = match checked.device() {
        Device::Cuda(_) => Some(streams.get(obj.py(), api, table, t.device)?),
        _ => None,
    };
    // SAFETY: DLPack's contract for a lent tensor: its memory is the object's while the object
    // lives, and the view holds a strong reference to the object.
    let array = unsafe { checked.into_array(crate::storage::Keepalive::Object(Holder::new(obj))) };
    Some((array, stream))
}
