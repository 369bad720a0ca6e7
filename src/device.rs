//! Device kinds and device identities: [`DeviceType`], [`DeviceIndex`], [`Device`]. At the
//! bottom of the crate's layers with `ptr.rs`: it imports nothing from the crate (parsing, which
//! can fail with an [`crate::Error`], is in `error.rs`).

use std::fmt;

/// Index of one device among the devices of a [`DeviceType`] (a CUDA ordinal, a wgpu adapter).
pub type DeviceIndex = u32;

/// Number of [`DeviceType`] variants: the size of a [`crate::DeviceAllocatorRegistry`] table.
pub(crate) const NUM_DEVICE_TYPES: usize = 7;

/// One kind of device memory. Each kind has at most one allocator in a registry.
///
/// Prints as and parses from its lower-case name: `cpu`, `cuda`, `vulkan`, `metal`, `dx12`,
/// `gl`, `webgpu`. More kinds may come (the enum is `non_exhaustive`, and addresses leave
/// room for 15 kinds): match with a wildcard arm, and iterate [`DeviceType::ALL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[non_exhaustive]
pub enum DeviceType {
    /// Host memory.
    Cpu = 0,
    /// NVIDIA CUDA device memory.
    Cuda = 1,
    /// Vulkan device memory (through wgpu).
    Vulkan = 2,
    /// Apple Metal device memory (through wgpu).
    Metal = 3,
    /// Direct3D 12 device memory (through wgpu).
    Dx12 = 4,
    /// OpenGL / OpenGL ES / WebGL2 buffers (through wgpu).
    Gl = 5,
    /// The browser's WebGPU (through wgpu).
    WebGpu = 6,
}

impl DeviceType {
    /// Every device type, in table order.
    pub const ALL: &'static [DeviceType] = &[
        DeviceType::Cpu,
        DeviceType::Cuda,
        DeviceType::Vulkan,
        DeviceType::Metal,
        DeviceType::Dx12,
        DeviceType::Gl,
        DeviceType::WebGpu,
    ];

    /// The lower-case name, as printed and parsed.
    pub const fn name(self) -> &'static str {
        match self {
            DeviceType::Cpu => "cpu",
            DeviceType::Cuda => "cuda",
            DeviceType::Vulkan => "vulkan",
            DeviceType::Metal => "metal",
            DeviceType::Dx12 => "dx12",
            DeviceType::Gl => "gl",
            DeviceType::WebGpu => "webgpu",
        }
    }

    /// Position of this type in a registry table (`0..NUM_DEVICE_TYPES`).
    pub(crate) const fn table_index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A device: its type and its index among devices of that type. Written `cuda:0`, `vulkan:1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    /// The kind of device memory.
    pub device_type: DeviceType,
    /// The index among devices of that kind.
    pub index: DeviceIndex,
}

impl Device {
    /// The device `device_type:index`.
    pub const fn new(device_type: DeviceType, index: DeviceIndex) -> Self {
        Device { device_type, index }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.device_type, self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn names_round_trip() {
        assert_eq!(DeviceType::ALL.len(), NUM_DEVICE_TYPES);
        for &t in DeviceType::ALL {
            assert_eq!(t.to_string().parse::<DeviceType>().unwrap(), t);
            assert_eq!(DeviceType::ALL[t.table_index()], t);
        }
        assert_eq!("WebGPU".parse::<DeviceType>().unwrap(), DeviceType::WebGpu);
    }

    #[test]
    fn devices_parse_and_print() {
        let d: Device = "cuda:3".parse().unwrap();
        assert_eq!(d, Device::new(DeviceType::Cuda, 3));
        assert_eq!(d.to_string(), "cuda:3");
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::new(DeviceType::Cpu, 0));
    }

    #[test]
    fn junk_is_rejected_with_a_message() {
        for junk in ["", "tpu:0", "cuda:", "cuda:-1", "cuda:x", "cuda:0:1", ":0", "cuda:99999999999"] {
            let err = junk.parse::<Device>().unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { .. }), "{junk:?}: {err}");
            assert!(err.to_string().contains("invalid") || err.to_string().contains("unknown"));
        }
    }
}
