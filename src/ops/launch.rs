//! Work that cubridge queues on a CUDA stream over arrays it may not own, made in one way for
//! every kernel: `add`, users' elementwise and raw kernels, and kernels that other crates launch
//! on cubridge arrays.
//!
//! ```no_run
//! # fn main() -> cubridge::Result<()> {
//! use cubridge::ops::launch::Launch;
//! use cubridge::{Array, DType, Device};
//! let x = Array::zeros(&[1024], DType::Float32, Device::Cuda(0))?;
//! let stream = cubridge::cuda::stream::LEGACY;
//! let launch = Launch::begin(Device::Cuda(0), stream)?;
//! let y = launch.empty(&[1024], DType::Float32)?;
//! launch.order([&x, &y])?; // x's pending writes run before anything queued next
//! // ... queue a kernel that reads x and writes y on launch.stream() ...
//! launch.finish([&x], [&y])?; // keeps x alive until it has run; y records the write
//! # Ok(())
//! # }
//! ```

use crate::array::Array;
use crate::cuda::stream::{self as cuda_stream, Event, RelaxedCapture, Stream};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::phases::phase;
use std::cell::RefCell;
use std::sync::Arc;

/// The one CUDA device of a kernel's arrays (the current device when there are none), each
/// given with its parameter's index, which `name` turns into its name for errors. `kernel` names
/// the kernel and `kind` says what kind it is ("elementwise", "raw").
pub fn kernel_device<'a>(
    (kernel, kind): (&str, &str),
    arrays: impl Iterator<Item = (usize, &'a Array)> + Clone,
    name: impl Fn(usize) -> String,
) -> Result<Device> {
    let device = match arrays.clone().next() {
        Some((_, a)) => a.device(),
        None => crate::cuda::current_device()?,
    };
    for (k, a) in arrays {
        if a.device() != device || !matches!(a.device(), Device::Cuda(_)) {
            let runs_on = match device {
                Device::Cuda(_) => device.to_string(),
                _ => "a CUDA device".to_string(),
            };
            return Err(Error::invalid(format!(
                "{kernel}: {} is on {}, but the kernel runs on {runs_on} ({kind} kernels run on \
                 one CUDA device)",
                name(k),
                a.device()
            )));
        }
    }
    Ok(device)
}

/// Work about to be queued on one stream of one CUDA device. Made with [`Launch::begin`] before
/// the work's results are allocated ([`Launch::empty`]), told the operands with
/// [`Launch::order`], and closed with [`Launch::finish`] once the work is queued.
///
/// When the stream is capturing a CUDA graph, the thread stays in the relaxed capture mode
/// while the `Launch` lives (loading a module or allocating would otherwise end the capture),
/// results come from memory outside the graph, and no events are recorded: the graph's replays
/// use the operands at times nobody knows, so the graph itself holds them until it and its
/// executable graphs are destroyed (see [`crate::cuda::graph`]), and their memory is let go of
/// only after waiting for the device.
pub struct Launch {
    ordinal: u32,
    stream: Stream,
    capture: Option<RelaxedCapture>,
    /// Results allocated by [`Launch::empty`], whose write is recorded by [`Launch::finish`].
    results: RefCell<Vec<Array>>,
    /// Where the stream is not capturing, so that allocations for the work know it.
    _not_capturing: Option<cuda_stream::NotCapturing>,
}

impl Launch {
    /// Prepares work on `stream` (DLPack numbering) of `device`, which must be a CUDA device.
    pub fn begin(device: Device, stream: Stream) -> Result<Launch> {
        phase!(Capture);
        let Device::Cuda(ordinal) = device else {
            return Err(Error::invalid(format!(
                "a CUDA launch needs a CUDA device, not {device}"
            )));
        };
        crate::cuda::require(device)?;
        let (capture, not_capturing) = if cuda_stream::is_capturing(stream, ordinal)? {
            (crate::cuda::shared::services().note_capture)(ordinal, stream);
            (Some(RelaxedCapture::new()), None)
        } else {
            (None, Some(cuda_stream::NotCapturing::new(ordinal, stream)))
        };
        phase!(Plan);
        Ok(Launch {
            ordinal,
            stream,
            capture,
            results: RefCell::new(Vec::new()),
            _not_capturing: not_capturing,
        })
    }

    /// The stream the work runs on.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Whether the stream is capturing a CUDA graph.
    pub fn is_capturing(&self) -> bool {
        self.capture.is_some()
    }

    /// A new array for a result of the work, allocated on the work's stream (from the device's
    /// pool; under capture, outside the graph and the pool, ready before the capture goes on).
    /// Its first write is the work's, recorded by [`Launch::finish`] (the allocation's, should
    /// the launch be dropped unfinished), so the work waits for no event of its allocation.
    pub fn empty(&self, shape: &[usize], dtype: DType) -> Result<Array> {
        if self.is_capturing() {
            return Array::empty_for_capture(shape, dtype, self.ordinal);
        }
        let device = Device::Cuda(self.ordinal);
        if self.stream == cuda_stream::LEGACY {
            // A write there needs no event: recording the allocation's costs nothing.
            return Array::empty_on(shape, dtype, device, self.stream);
        }
        let array = Array::allocate_unrecorded(shape, dtype, device, false, self.stream)?;
        if array.numel() > 0 {
            self.results.borrow_mut().push(array.clone());
        }
        Ok(array)
    }

    /// Orders every operand's pending writes before the work: the stream waits for them on the
    /// device, never on the host. Each operand must be on this launch's device. Under capture,
    /// refuses an operand whose last write is neither done nor on the capturing stream (a graph
    /// cannot wait for work outside it). Also makes the device's context current. Takes arrays
    /// or references to them, in an array, a slice or any iterator, as [`Launch::finish`] does.
    pub fn order<A: AsRef<Array>>(&self, operands: impl IntoIterator<Item = A>) -> Result<()> {
        phase!(Order);
        for operand in operands {
            let operand = operand.as_ref();
            if operand.device() != Device::Cuda(self.ordinal) {
                return Err(Error::DeviceMismatch {
                    left: Device::Cuda(self.ordinal).to_string(),
                    right: operand.device().to_string(),
                });
            }
            if self.is_capturing() {
                check_captured_operand(operand, self.stream)?;
            } else {
                operand.order_before(self.stream)?;
            }
        }
        crate::cuda::context::bind(self.ordinal)
    }

    /// Closes the launch once its work is queued: every operand (`inputs` and `outputs`) stays
    /// valid until that work has run, cubridge's pooled memory by ordering its free after it,
    /// anything else by being held until then (never waiting on the host), and the `outputs`
    /// record the work as their last write, which later users on other streams wait for.
    pub fn finish<A, O>(self, inputs: impl IntoIterator<Item = A>, outputs: O) -> Result<()>
    where
        A: AsRef<Array>,
        O: IntoIterator<Item = A> + Clone,
    {
        phase!(Finish);
        let all = inputs.into_iter().chain(outputs.clone());
        if self.is_capturing() {
            // The graph holds its operands for as long as it can replay, and their memory is
            // let go of only after waiting for the device.
            let held = all
                .map(|operand| {
                    operand.as_ref().record_unknown_consumer();
                    operand.as_ref().buffer().clone() as crate::cuda::release::KeepAlive
                })
                .collect();
            return crate::cuda::graph::hold_in_capture(self.stream, self.ordinal, held);
        }
        // On the legacy default stream, which runs its work in order, an event recorded later
        // still follows this work: none is recorded now, only when somebody needs one (the
        // releaser of held buffers, a consumer on another stream). Any other stream gets its
        // event at once: its owner may destroy it before then.
        let done = if self.stream == cuda_stream::LEGACY {
            None
        } else {
            Some(Arc::new(Event::record(self.stream, self.ordinal)?))
        };
        Array::keep_until_run(all, self.stream, done.clone(), self.ordinal);
        // The results allocated for the work follow the work too, outputs or not.
        // No event on the legacy default stream: see Array::with_legacy_write.
        let write = || cuda_stream::Write {
            stream: self.stream,
            event: done.clone(),
        };
        for out in outputs {
            out.as_ref().buffer().record_write(write());
        }
        for result in std::mem::take(&mut *self.results.borrow_mut()) {
            result.buffer().record_write(write());
        }
        Ok(())
    }
}

/// A launch dropped unfinished (its work failed to queue) records the allocation of each result
/// as its write, which orders the result's free after it.
impl Drop for Launch {
    fn drop(&mut self) {
        for result in self.results.get_mut().drain(..) {
            // An error means the context is unusable: nothing runs on it any more.
            let _ = result.written_on(self.stream);
        }
    }
}

/// Refuses an operand of captured work whose last write is neither done nor on the capturing
/// stream. A write on the legacy default stream counts as done: that stream may not even be
/// queried during a capture, and `torch.cuda.graph` synchronizes the device as it begins.
fn check_captured_operand(x: &Array, stream: Stream) -> Result<()> {
    let Some(write) = x.buffer().last_write() else {
        return Ok(());
    };
    let done = match &write.event {
        _ if write.stream == stream => true,
        Some(event) => event.is_done(),
        None => true,
    };
    if done {
        Ok(())
    } else {
        Err(Error::invalid(
            "an operand of work captured into a CUDA graph still has work pending on another \
             stream; synchronize before capturing",
        ))
    }
}
