//! An extension module built on cubridge: `scaled_add(x, y, alpha)` returns `alpha * x + y` for
//! float32 arrays of any producer (torch, CuPy, numpy, JAX, Numba, cubridge), computed by a
//! CUDA kernel of this crate's own on device memory and by a Rust loop on host memory, without
//! copying the inputs. The result is a `cubridge.Array`, which every framework takes: the
//! crate's copy of cubridge hands its allocations, kernel loads and results to the `cubridge`
//! module's runtime. `scale(x, alpha)` multiplies a CUDA float32 array in place with a
//! `RawKernel`, which that runtime compiles and loads too.

use cubridge::cpu::element::Scalar;
use cubridge::cuda::kernels::Program;
use cubridge::cuda::launch::{launch, Params, BLOCK};
use cubridge::cuda::shared::program;
use cubridge::cuda::stream::Stream;
use cubridge::ops::launch::Launch;
use cubridge::ops::raw::RawKernel;
use cubridge::ops::Arg;
use cubridge::python::{prepare_extension, work_stream, AnyArray};
use cubridge::{Array, DType, Device, Error, Result};
use pyo3::prelude::*;
use std::sync::OnceLock;

/// This crate's kernel: a grid-stride loop over contiguous float32 arrays.
const SOURCE: &str = r#"
extern "C" __global__ void scaled_add(const float* x, const float* y, float* out, float alpha,
                                      long long n) {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        out[i] = alpha * x[i] + y[i];
}
"#;

/// `scale`'s kernel, as a `RawKernel` takes it (also in Python, as `SCALE_SOURCE`).
const SCALE_SOURCE: &str = r#"
extern "C" __global__ void scale(float* x, float alpha, long long n) {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        x[i] *= alpha;
}
"#;

/// What this example supports: contiguous float32 arrays of one shape on one device.
fn check(x: &Array, y: &Array) -> Result<()> {
    for (name, a) in [("x", x), ("y", y)] {
        if a.dtype() != DType::Float32 {
            return Err(Error::invalid(format!(
                "{name} is {}; scaled_add takes float32",
                a.dtype()
            )));
        }
        if !a.layout().is_contiguous() {
            return Err(Error::invalid(format!("{name} must be contiguous")));
        }
    }
    if x.shape() != y.shape() {
        return Err(Error::invalid("x and y must have one shape"));
    }
    if x.device().is_host_accessible() != y.device().is_host_accessible()
        || (!x.device().is_host_accessible() && x.device() != y.device())
    {
        return Err(Error::invalid(format!(
            "x is on {} and y on {}",
            x.device(),
            y.device()
        )));
    }
    Ok(())
}

/// `alpha * x + y` for float32 arrays of any producer, as a new `cubridge.Array` on their device.
/// On CUDA it runs on `stream` when given, else on the producer's current stream (torch's),
/// else the default stream, after the inputs' pending work.
#[pyfunction]
#[pyo3(signature = (x, y, alpha, *, stream=None))]
fn scaled_add(
    py: Python<'_>,
    x: AnyArray,
    y: AnyArray,
    alpha: f32,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Array> {
    let stream = work_stream(stream, &[&x, &y])?;
    let (x, y) = (x.array(), y.array());
    check(x, y)?;
    let out = py.detach(|| match x.device() {
        Device::Cuda(_) => on_gpu(x, y, alpha, stream),
        _ => on_cpu(x, y, alpha),
    })?;
    Ok(out)
}

fn on_cpu(x: &Array, y: &Array, alpha: f32) -> Result<Array> {
    let out = Array::empty(x.shape(), DType::Float32, Device::Cpu)?;
    let n = x.numel();
    // SAFETY: x and y are contiguous float32 arrays of n elements in host memory (checked), which
    // their producers keep alive while we hold them; out is a new array of n float32 elements
    // that nothing else references.
    let (xs, ys, os) = unsafe {
        (
            std::slice::from_raw_parts(x.data_ptr() as *const f32, n),
            std::slice::from_raw_parts(y.data_ptr() as *const f32, n),
            std::slice::from_raw_parts_mut(out.data_ptr() as *mut f32, n),
        )
    };
    for ((o, &a), &b) in os.iter_mut().zip(xs).zip(ys) {
        *o = alpha * a + b;
    }
    Ok(out)
}

fn on_gpu(x: &Array, y: &Array, alpha: f32, stream: Stream) -> Result<Array> {
    // The launch: the result allocated on the stream, the inputs' pending writes ordered first.
    let work = Launch::begin(x.device(), stream)?;
    let out = work.empty(x.shape(), DType::Float32)?;
    work.order([x, y, &out])?;
    // Compiled with NVRTC once per process and device (by the `cubridge` module's runtime, which
    // every extension shares) and cached on disk, as cubridge's own kernels are.
    let kernel = program(
        work.ordinal(),
        &Program {
            name: "scaled_add".into(),
            source: SOURCE.into(),
            options: Vec::new(),
            functions: vec!["scaled_add".into()],
        },
    )?[0];
    let n = x.numel();
    let mut params = Params::new();
    params.push(x.data_ptr());
    params.push(y.data_ptr());
    params.push(out.data_ptr());
    params.push(alpha);
    params.push(n as i64);
    let grid = n.div_ceil(BLOCK as usize).clamp(1, 1 << 20) as u32;
    // SAFETY: the parameters are the kernel's (three float pointers, a float, a long long); x, y
    // and out hold n contiguous float32 elements on this device (checked) and stay valid until
    // the kernel has run (work.finish below); program() loaded the kernel in the device's
    // context, which work.order() made current.
    unsafe {
        launch(
            kernel as cubridge::cuda::sys::CUfunction,
            (grid, 1, 1),
            (BLOCK, 1, 1),
            0,
            work.stream().handle(),
            params.pointers(),
        )?
    };
    // x and y stay alive until the kernel has run; out records it as its pending write.
    work.finish([x, y], [&out])?;
    Ok(out)
}

/// `scale`'s kernel, made once; its module is compiled and loaded once per process and device
/// by the `cubridge` module's runtime, whoever asks for it (`cubridge.RawKernel` of the same
/// source and name included).
fn scale_kernel() -> Result<&'static RawKernel> {
    static KERNEL: OnceLock<RawKernel> = OnceLock::new();
    if let Some(kernel) = KERNEL.get() {
        return Ok(kernel);
    }
    let kernel = RawKernel::new(SCALE_SOURCE, "scale", Vec::new())?;
    Ok(KERNEL.get_or_init(|| kernel))
}

/// Multiplies the contiguous float32 CUDA array `x` (of any producer) by `alpha` in place, on
/// `stream` when given, else the producer's current stream, else the default stream.
#[pyfunction]
#[pyo3(signature = (x, alpha, *, stream=None))]
fn scale(
    py: Python<'_>,
    x: AnyArray,
    alpha: f32,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let stream = work_stream(stream, &[&x])?;
    let x = x.array();
    check(x, x)?;
    if !matches!(x.device(), Device::Cuda(_)) {
        return Err(
            Error::invalid(format!("x is on {}; scale takes CUDA arrays", x.device())).into(),
        );
    }
    let n = x.numel();
    let args = [
        Arg::Array(x.clone()),
        Arg::Value(Scalar::Float(alpha.into()), Some(DType::Float32)),
        Arg::Value(Scalar::Int(n as i128), Some(DType::Int64)),
    ];
    let grid = n.div_ceil(BLOCK as usize).clamp(1, 1 << 20) as u32;
    let kernel = scale_kernel()?;
    // SAFETY: the kernel takes a float pointer, a float and a long long, and touches only the n
    // contiguous float32 elements of x (checked above); launch orders x's pending writes first
    // and keeps it alive until the kernel has run.
    py.detach(|| unsafe { kernel.launch([grid, 1, 1], [BLOCK, 1, 1], &args, 0, stream, false) })?;
    Ok(())
}

#[pymodule]
fn cubridge_example(m: &Bound<'_, PyModule>) -> PyResult<()> {
    prepare_extension(m)?;
    m.add("SCALE_SOURCE", SCALE_SOURCE)?;
    m.add_function(wrap_pyfunction!(scale, m)?)?;
    m.add_function(wrap_pyfunction!(scaled_add, m)?)
}
