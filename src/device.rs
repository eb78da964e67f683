//! Devices: where an array's memory lives, and the mapping to and from DLPack devices and names.

use crate::error::{Error, Result};
use dlpark::ffi::{DLDevice, DLDeviceType};
use std::fmt;

/// Where an array's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// Ordinary host memory.
    Cpu,
    /// Memory of CUDA device `N`.
    Cuda(u32),
    /// Page-locked (pinned) host memory, allocated through CUDA.
    CudaHost,
    /// CUDA managed (unified) memory.
    CudaManaged,
}

impl Device {
    /// Whether the host may read and write this memory directly.
    pub fn is_host_accessible(self) -> bool {
        !matches!(self, Device::Cuda(_))
    }

    /// The DLPack device. Pinned and managed memory carry device id 0, as the spec asks.
    pub fn to_dlpack(self) -> DLDevice {
        let (device_type, device_id) = match self {
            Device::Cpu => (DLDeviceType::CPU, 0),
            Device::Cuda(n) => (DLDeviceType::CUDA, n as i32),
            Device::CudaHost => (DLDeviceType::CUDAHOST, 0),
            Device::CudaManaged => (DLDeviceType::CUDAMANAGED, 0),
        };
        DLDevice {
            device_type,
            device_id,
        }
    }

    /// Reads a DLPack device from an untrusted descriptor.
    pub fn from_dlpack(device: DLDevice) -> Result<Device> {
        let id = device.device_id;
        let device_type = device.device_type;
        if id < 0 {
            return Err(Error::UnsupportedDevice(format!(
                "DLPack device id {id} is negative"
            )));
        }
        Ok(match device_type {
            DLDeviceType::CPU => Device::Cpu,
            DLDeviceType::CUDA => Device::Cuda(id as u32),
            DLDeviceType::CUDAHOST => Device::CudaHost,
            DLDeviceType::CUDAMANAGED => Device::CudaManaged,
            other => {
                return Err(Error::UnsupportedDevice(format!(
                    "{} (DLPack device type {}); cubridge handles cpu, cuda, cuda_host and \
                     cuda_managed",
                    dlpack_device_name(other),
                    other.0
                )))
            }
        })
    }

    /// Parses `"cpu"`, `"cuda"`, `"cuda:N"`, `"cuda_host"` or `"cuda_managed"`. A bare `"cuda"`
    /// names the current device, which the caller resolves (see [`DeviceSpec`]).
    pub fn parse(text: &str) -> Result<DeviceSpec> {
        let bad = || Error::invalid(Device::unknown(&format!("{text:?}")));
        Ok(match text {
            "cpu" => DeviceSpec::Exact(Device::Cpu),
            "cuda" => DeviceSpec::CurrentCuda,
            "cuda_host" => DeviceSpec::Exact(Device::CudaHost),
            "cuda_managed" => DeviceSpec::Exact(Device::CudaManaged),
            _ => {
                let n = text.strip_prefix("cuda:").ok_or_else(bad)?;
                // Plain decimal digits only: no sign, no spaces.
                if n.is_empty() || !n.bytes().all(|c| c.is_ascii_digit()) {
                    return Err(bad());
                }
                DeviceSpec::Exact(Device::Cuda(n.parse().map_err(|_| bad())?))
            }
        })
    }

    /// CUDA device `ordinal`, as an int names it (`device=1` is `"cuda:1"`, as in torch).
    pub fn from_ordinal(ordinal: i64) -> Result<Device> {
        u32::try_from(ordinal)
            .map(Device::Cuda)
            .map_err(|_| Error::invalid(Device::unknown(&ordinal.to_string())))
    }

    /// The message for a device argument that names no device (`what` as the user wrote it),
    /// listing every form a device argument takes.
    pub fn unknown(what: &str) -> String {
        format!(
            "unknown device {what}: expected \"cpu\", \"cuda\" (the current device), \"cuda:N\", \
             \"cuda_host\", \"cuda_managed\", an int N >= 0 (cuda:N), a cubridge.Device, a \
             torch.device, a cupy.cuda.Device, or None (the function's default)"
        )
    }
}

/// A device as a user names it: either exact, or "the current CUDA device".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A fully named device.
    Exact(Device),
    /// `"cuda"`: the calling thread's current CUDA device.
    CurrentCuda,
}

fn dlpack_device_name(t: DLDeviceType) -> &'static str {
    match t {
        DLDeviceType::OPENCL => "OpenCL",
        DLDeviceType::VULKAN => "Vulkan",
        DLDeviceType::METAL => "Metal",
        DLDeviceType::VPI => "VPI",
        DLDeviceType::ROCM => "ROCm",
        DLDeviceType::ROCMHOST => "ROCm host",
        DLDeviceType::EXTDEV => "extension device",
        DLDeviceType::ONEAPI => "oneAPI",
        DLDeviceType::WEBGPU => "WebGPU",
        DLDeviceType::HEXAGON => "Hexagon",
        DLDeviceType::MAIA => "MAIA",
        DLDeviceType::TRN => "Trainium",
        _ => "an unknown device",
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            Device::CudaHost => f.write_str("cuda_host"),
            Device::CudaManaged => f.write_str("cuda_managed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Device; 5] = [
        Device::Cpu,
        Device::Cuda(0),
        Device::Cuda(3),
        Device::CudaHost,
        Device::CudaManaged,
    ];

    #[test]
    fn dlpack_round_trip() {
        for d in ALL {
            assert_eq!(Device::from_dlpack(d.to_dlpack()).unwrap(), d);
        }
        assert_eq!(Device::CudaHost.to_dlpack().device_type.0, 3);
        assert_eq!(Device::CudaManaged.to_dlpack().device_type.0, 13);
        assert_eq!(Device::Cuda(1).to_dlpack().device_id, 1);
    }

    #[test]
    fn names_round_trip() {
        for d in ALL {
            assert_eq!(Device::parse(&d.to_string()).unwrap(), DeviceSpec::Exact(d));
        }
        assert_eq!(Device::parse("cuda").unwrap(), DeviceSpec::CurrentCuda);
        for bad in ["gpu", "cuda:", "cuda:-1", "cuda: 1", "CPU", "cuda:1x", ""] {
            assert!(Device::parse(bad).is_err(), "{bad}");
        }
        let e = Device::parse("gpu").unwrap_err().to_string();
        assert!(e.contains("\"gpu\"") && e.contains("torch.device"), "{e}");
    }

    #[test]
    fn ordinals_name_cuda_devices() {
        assert_eq!(Device::from_ordinal(0).unwrap(), Device::Cuda(0));
        assert_eq!(Device::from_ordinal(7).unwrap(), Device::Cuda(7));
        for bad in [-1, i64::MIN, 1 << 40] {
            let e = Device::from_ordinal(bad).unwrap_err().to_string();
            assert!(e.contains(&bad.to_string()) && e.contains("cuda:N"), "{e}");
        }
    }

    #[test]
    fn foreign_devices_are_named() {
        for (code, name) in [(10, "ROCm"), (8, "Metal"), (7, "Vulkan"), (14, "oneAPI")] {
            let e = Device::from_dlpack(DLDevice {
                device_type: DLDeviceType(code),
                device_id: 0,
            })
            .unwrap_err();
            assert!(e.to_string().contains(name), "{e}");
        }
        assert!(Device::from_dlpack(DLDevice {
            device_type: DLDeviceType::CUDA,
            device_id: -1
        })
        .is_err());
    }

    #[test]
    fn host_accessibility() {
        assert!(Device::Cpu.is_host_accessible());
        assert!(Device::CudaHost.is_host_accessible());
        assert!(Device::CudaManaged.is_host_accessible());
        assert!(!Device::Cuda(0).is_host_accessible());
    }
}
