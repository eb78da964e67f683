//! Fuzzes everything cubridge reads from an untrusted producer before it touches memory: DLPack
//! dtype and device fields, CAI typestrs, buffer-protocol formats, shapes, strides and offsets.
//! Descriptors that are accepted are then used for real over a heap buffer of the stated size
//! (a view, `add`, a copy), so AddressSanitizer catches any read or write outside it.
#![no_main]

use cubridge::device::Device;
use cubridge::dtype::DType;
use cubridge::layout::{broadcast_shapes, Layout};
use cubridge::view::{from_descriptor, Descriptor};
use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType};
use libfuzzer_sys::fuzz_target;

/// Reads fuzz input front to back; zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn i64(&mut self) -> i64 {
        // Mostly small values (where layouts are valid), sometimes any 64-bit value.
        let tag = self.byte();
        if tag & 0xE0 == 0xE0 {
            i64::from_le_bytes(std::array::from_fn(|_| self.byte()))
        } else {
            i64::from(tag as i8 % 9)
        }
    }

    fn text(&mut self) -> String {
        let n = usize::from(self.byte() % 8);
        (0..n).map(|_| char::from(self.byte() % 128)).collect()
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);

    // Names a user or producer hands over as text.
    let _ = DType::from_typestr(&input.text());
    let _ = DType::from_buffer_format(&input.text(), usize::from(input.byte()));
    let _ = Device::parse(&input.text());
    let _ = Device::from_dlpack(DLDevice {
        device_type: DLDeviceType(u32::from(input.byte())),
        device_id: i32::from(input.byte() as i8),
    });

    // A DLPack-like descriptor.
    let dtype = DType::from_dlpack(DLDataType {
        code: DLDataTypeCode(input.byte()),
        bits: input.byte(),
        lanes: u16::from(input.byte() % 4),
    });
    let ndim = usize::from(input.byte() % 6);
    let shape: Vec<i64> = (0..ndim).map(|_| input.i64()).collect();
    let strides: Option<Vec<i64>> = if input.byte() % 4 == 0 {
        None
    } else {
        Some((0..ndim).map(|_| input.i64()).collect())
    };
    let byte_offset = u64::from(input.byte());
    let len = usize::from(input.byte()) * 8;
    let other: Vec<usize> = (0..usize::from(input.byte() % 4))
        .map(|_| usize::from(input.byte() % 4))
        .collect();

    if let Ok(dtype) = dtype {
        let itemsize = dtype.itemsize();
        if let Ok(layout) = Layout::from_untrusted(&shape, strides.as_deref(), 0, itemsize) {
            let _ = broadcast_shapes(layout.shape(), &other);
            let _ = layout.broadcast_to(&other);
        }
        // A heap buffer of exactly `len` bytes (u64-backed for alignment), described as the
        // buffer protocol would.
        let buffer = vec![0u64; len.div_ceil(8)];
        let descriptor = Descriptor {
            data: buffer.as_ptr() as usize,
            byte_offset,
            shape: &shape,
            strides: strides.as_deref(),
            dtype,
            device: Device::Cpu,
            readonly: false,
            len_bytes: Some(len),
        };
        // SAFETY: `buffer` outlives every use below (the view and its results are dropped first);
        // it holds `len` bytes, which is what the descriptor states.
        if let Ok(view) = unsafe { from_descriptor(&descriptor, Box::new(())) } {
            if view.numel() <= 1 << 14 {
                let sum = cubridge::ops::add::add(&view, &view, None, None);
                let copy = cubridge::ops::copy::copy(&view, DType::Float64, Device::Cpu);
                if let Ok(target) = view.broadcast_to(&other) {
                    let _ = cubridge::ops::add::add(&target, &view, None, None);
                }
                let _ = cubridge::ops::add::add(&view, &view, Some(&view), None);
                drop((sum, copy));
            }
        }
        drop(buffer);
    }
});
