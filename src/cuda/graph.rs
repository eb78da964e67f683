//! Memory that a captured CUDA graph uses lives as long as the graph. A graph replays its
//! kernels at times nobody tells cubridge, on memory the capture named: a result allocated
//! during the capture and dropped after it would go back to the pool while later replays still
//! write it. So the operands of captured work are handed to the graph itself, as a CUDA user
//! object that the graph (and every executable graph made from it) holds: the driver lets go of
//! it only once the graph and its executables are destroyed and their launches have run.
//! (PyTorch keeps a graph's memory in the graph's private pool for the same reason.)

use super::release::{self, KeepAlive};
use super::stream::Stream;
use super::{check, sys};
use crate::error::{Error, Result};
use std::ffi::c_void;

/// What a graph holds: the operands' keep-alives and their device.
struct Held {
    ordinal: u32,
    buffers: Vec<KeepAlive>,
}

/// Hands `buffers` to the graph being captured on `stream` of device `ordinal`, which holds
/// them until it and its executable graphs are destroyed.
pub fn hold_in_capture(stream: Stream, ordinal: u32, buffers: Vec<KeepAlive>) -> Result<()> {
    if buffers.is_empty() {
        return Ok(());
    }
    let graph = capturing_graph(stream)?;
    release::start();
    let held = Box::into_raw(Box::new(Held { ordinal, buffers }));
    let mut object: sys::CUuserObject = std::ptr::null_mut();
    // SAFETY: `held` is a live box that the destructor takes back once, when the object's last
    // reference goes; the driver may call it from any thread, which `let_go` allows for.
    let created = unsafe {
        sys::cuUserObjectCreate(
            &mut object,
            held.cast(),
            Some(let_go),
            1,
            sys::CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32,
        )
    };
    if let Err(e) = check(created.result(), "creating a graph's user object") {
        // SAFETY: the object was not created: the box is still ours.
        drop(unsafe { Box::from_raw(held) });
        return Err(e);
    }
    // SAFETY: the graph is being captured (so it is live), and the object is ours; MOVE hands
    // our one reference to the graph.
    let retained = unsafe {
        sys::cuGraphRetainUserObject(
            graph,
            object,
            1,
            sys::CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE as u32,
        )
    };
    if retained != sys::CUresult::CUDA_SUCCESS {
        // SAFETY: our reference, not moved: releasing it runs the destructor, which hands the
        // buffers to the releaser.
        unsafe { sys::cuUserObjectRelease(object, 1) };
    }
    check(retained.result(), "handing memory to a captured graph")
}

/// `cuStreamGetCaptureInfo_v2`, which every driver since CUDA 11.3 exports (the bindings
/// cubridge is built with name only its CUDA 12.3 successor).
type CaptureInfo = unsafe extern "C" fn(
    sys::CUstream,
    *mut sys::CUstreamCaptureStatus,
    *mut u64,
    *mut sys::CUgraph,
    *mut *const sys::CUgraphNode,
    *mut usize,
) -> sys::CUresult;

/// The graph being captured on `stream`.
fn capturing_graph(stream: Stream) -> Result<sys::CUgraph> {
    // SAFETY: the symbol, where the driver has it, has the signature of `CaptureInfo`.
    let info = unsafe { sys::culib().get::<CaptureInfo>(b"cuStreamGetCaptureInfo_v2\0") }.map_err(
        |_| Error::invalid("this CUDA driver cannot tell which graph a stream is capturing"),
    )?;
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut n_deps = 0usize;
    // SAFETY: every out-pointer is valid for a write; the stream is the caller's live stream.
    let r = unsafe {
        info(
            stream.handle(),
            &mut status,
            &mut id,
            &mut graph,
            &mut deps,
            &mut n_deps,
        )
    };
    check(r.result(), "asking which graph a stream is capturing")?;
    if graph.is_null() {
        return Err(Error::invalid("the stream is not capturing a graph"));
    }
    Ok(graph)
}

/// The user object's destructor, called by the driver on a thread of its own, where no driver
/// call may be made: the buffers go to the releaser, which drops them on its thread.
unsafe extern "C" fn let_go(held: *mut c_void) {
    // SAFETY: the box made in `hold_in_capture`, handed over once.
    let held = unsafe { Box::from_raw(held.cast::<Held>()) };
    release::adopt(held.buffers, held.ordinal);
}
