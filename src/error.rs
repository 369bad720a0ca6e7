//! The one error type: every failure in devalloc is a value of [`Error`], never a panic.

use std::fmt;
use std::str::FromStr;

use crate::device::{Device, DeviceIndex, DeviceType};
use crate::ptr::DevicePtr;

/// `Result` with devalloc's [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A backend's own error, kept as the `source` of [`Error::Backend`].
#[cfg(native)]
pub type BackendSource = Box<dyn std::error::Error + Send + Sync + 'static>;
/// A backend's own error, kept as the `source` of [`Error::Backend`].
#[cfg(web)]
pub type BackendSource = Box<dyn std::error::Error + 'static>;

/// Why a pointer was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PointerProblem {
    /// The pointer is null.
    Null,
    /// The address lies in no live allocation of the device, and in none freed recently.
    Unknown,
    /// The address lies in an allocation that was freed (a use after free or a double free).
    Freed,
    /// The address belongs to another device of the same allocator.
    OtherDevice(Device),
    /// A deallocation was given an address inside an allocation rather than its start.
    NotAllocationStart,
}

impl fmt::Display for PointerProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PointerProblem::Null => f.write_str("it is null"),
            PointerProblem::Unknown => f.write_str("it is in no live allocation of this device"),
            PointerProblem::Freed => f.write_str("its allocation was already freed"),
            PointerProblem::OtherDevice(d) => write!(f, "it belongs to {d}"),
            PointerProblem::NotAllocationStart => {
                f.write_str("it points inside an allocation, not at its start")
            }
        }
    }
}

/// Every failure devalloc reports.
///
/// The variants carry structured fields; `Display` gives a sentence that names the device, the
/// sizes and, where there is one, the way out. "Can never fit" ([`Error::TooLarge`]) is kept
/// apart from "out of memory now" ([`Error::OutOfMemory`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument is invalid: a zero size, a bad alignment, an overflowing size, junk text.
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// What is wrong with it.
        message: String,
    },

    /// The device (or devalloc's memory limit for it) has no room for the request now.
    #[error("out of memory on {device}: could not allocate {requested} bytes ({detail})")]
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// The device.
        device: Device,
        /// What ran out (the device, or devalloc's limit and how much is in use).
        detail: String,
    },

    /// The request can never fit: it is larger than the device's largest allocation or limit.
    #[error("{requested} bytes can never be allocated on {device}: the most it allows is {max} bytes")]
    TooLarge {
        /// Bytes asked for.
        requested: u64,
        /// The largest size the device (or the configured limit) allows.
        max: u64,
        /// The device.
        device: Device,
    },

    /// Something looked up is not there: no allocator registered for a type, a memory id not
    /// initialised.
    #[error("not found: {what}")]
    NotFound {
        /// What was looked for.
        what: String,
    },

    /// A registry already has an allocator for this device type.
    #[error("an allocator for {device_type} is already registered")]
    AlreadyRegistered {
        /// The device type.
        device_type: DeviceType,
    },

    /// The device index is not one of the allocator's devices.
    #[error("no device {device}: this allocator has {count} {} device(s)", device.device_type)]
    NoSuchDevice {
        /// The device asked for.
        device: Device,
        /// How many devices of that type the allocator has.
        count: usize,
    },

    /// A pointer that is null, unknown, freed, or belongs to another device.
    #[error("invalid pointer {ptr} on {device}: {problem}")]
    InvalidPointer {
        /// The pointer.
        ptr: DevicePtr,
        /// The device it was used with.
        device: Device,
        /// What is wrong with it.
        problem: PointerProblem,
    },

    /// An access runs past the end of an allocation or a planned buffer.
    #[error("out of bounds on {device}: {len} bytes at offset {offset} run past the end of {what} of {size} bytes")]
    OutOfBounds {
        /// The device.
        device: Device,
        /// What was accessed ("an allocation", "planned buffer 2").
        what: String,
        /// Offset of the access within it.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Its size.
        size: u64,
    },

    /// The operation is not supported by this allocator or on this platform.
    #[error("{operation} is not supported on {device_type}: {reason}")]
    NotSupported {
        /// The operation.
        operation: &'static str,
        /// The device type.
        device_type: DeviceType,
        /// Why, and what to use instead.
        reason: String,
    },

    /// The device was lost (driver reset, removal); every later call on it fails with this.
    #[error("device {device} was lost: {reason}")]
    DeviceLost {
        /// The device.
        device: Device,
        /// What the backend said.
        reason: String,
    },

    /// A streamed copy stopped part-way (a source that failed, ended early or ran long, or a
    /// copy that failed): the first `landed` bytes of the range were written, in order from its
    /// start, and nothing past them. `source` is the underlying error: an `std::io::Error` of the
    /// reader, or devalloc's own [`Error`] (downcast it to tell a lost device from the rest).
    #[error("streaming into {device}: {landed} of {expected} bytes landed, then {reason}")]
    Stream {
        /// The device.
        device: Device,
        /// Bytes written from the start of the range before it stopped.
        landed: u64,
        /// Bytes the range holds (what the stream was to fill).
        expected: u64,
        /// What stopped it.
        reason: String,
        /// The reader's or the copy's own error, where there is one.
        #[source]
        source: Option<BackendSource>,
    },

    /// Any other failure of the backend, with the backend's own error as source.
    #[error("backend error on {device}: {message}")]
    Backend {
        /// The device.
        device: Device,
        /// What devalloc was doing and what the backend said.
        message: String,
        /// The backend's error.
        #[source]
        source: Option<BackendSource>,
    },
}

impl Error {
    /// An [`Error::InvalidArgument`] with this message.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Error::InvalidArgument { message: message.into() }
    }

    /// An [`Error::NotFound`] for this thing.
    pub fn not_found(what: impl Into<String>) -> Self {
        Error::NotFound { what: what.into() }
    }

    /// An [`Error::Backend`] without a source.
    pub fn backend(device: Device, message: impl Into<String>) -> Self {
        Error::Backend { device, message: message.into(), source: None }
    }
}

// The words' conversions that can fail: here, so that `device.rs` and `ptr.rs` import nothing
// from the crate and this file imports only them.

impl FromStr for DeviceType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        DeviceType::ALL.iter().copied().find(|t| t.name().eq_ignore_ascii_case(s)).ok_or_else(|| {
            Error::invalid_argument(format!(
                "unknown device type {s:?}: expected one of cpu, cuda, vulkan, metal, dx12, gl, webgpu"
            ))
        })
    }
}

impl FromStr for Device {
    type Err = Error;

    /// Parses `type:index` (`cuda:0`); a bare type (`cpu`) means index 0.
    fn from_str(s: &str) -> Result<Self> {
        let (ty, index) = match s.split_once(':') {
            Some((ty, idx)) => {
                let index = idx.parse::<DeviceIndex>().map_err(|_| {
                    Error::invalid_argument(format!(
                        "invalid device {s:?}: index {idx:?} is not a non-negative integer"
                    ))
                })?;
                (ty, index)
            }
            None => (s, 0),
        };
        Ok(Device::new(ty.parse()?, index))
    }
}

impl DevicePtr {
    /// `self + bytes`, or [`Error::InvalidArgument`] when the sum overflows 64 bits.
    pub fn offset(self, bytes: usize) -> Result<DevicePtr> {
        self.offset_u64(bytes as u64)
    }

    /// `self + bytes` for a 64-bit byte count, checked like [`DevicePtr::offset`].
    pub fn offset_u64(self, bytes: u64) -> Result<DevicePtr> {
        self.addr().checked_add(bytes).map(DevicePtr::new).ok_or_else(|| {
            Error::invalid_argument(format!("{self:?} + {bytes} overflows the 64-bit address space"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_what_matters() {
        let dev = Device::new(DeviceType::Vulkan, 1);
        let e = Error::OutOfMemory { requested: 1024, device: dev, detail: "limit 512 bytes".into() };
        assert_eq!(
            e.to_string(),
            "out of memory on vulkan:1: could not allocate 1024 bytes (limit 512 bytes)"
        );
        let e = Error::AlreadyRegistered { device_type: DeviceType::Cuda };
        assert!(e.to_string().contains("already registered"));
        let e = Error::InvalidPointer {
            ptr: DevicePtr::new(0x10),
            device: dev,
            problem: PointerProblem::OtherDevice(Device::new(DeviceType::Vulkan, 0)),
        };
        assert_eq!(e.to_string(), "invalid pointer 0x10 on vulkan:1: it belongs to vulkan:0");
    }

    #[test]
    fn backend_errors_keep_their_source() {
        use std::error::Error as _;
        let io = std::io::Error::other("driver said no");
        let e = Error::Backend {
            device: Device::new(DeviceType::Cuda, 0),
            message: "cuMemAlloc failed".into(),
            source: Some(Box::new(io)),
        };
        assert_eq!(e.source().unwrap().to_string(), "driver said no");
    }
}
