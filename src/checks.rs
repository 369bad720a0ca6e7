//! Argument checks shared by every built-in allocator.

use crate::allocator::DEFAULT_ALIGNMENT;
use crate::device::{Device, DeviceIndex, DeviceType};
use crate::error::{Error, Result};

/// Checks that `alignment` is a non-zero power of two.
pub(crate) fn check_alignment(alignment: usize) -> Result<()> {
    if alignment.is_power_of_two() {
        Ok(())
    } else {
        Err(Error::invalid_argument(format!(
            "alignment {alignment} is not a power of two (use {DEFAULT_ALIGNMENT} if unsure)"
        )))
    }
}

/// Checks an allocation request: non-zero size, power-of-two alignment, and a size whose
/// rounding up to the alignment does not overflow `usize` (so that no later step can wrap it:
/// on 32-bit wasm that refuses some requests a 64-bit host takes). Returns the size as `u64`.
pub(crate) fn check_request(nbytes: usize, alignment: usize, device: Device) -> Result<u64> {
    check_alignment(alignment)?;
    if nbytes == 0 {
        return Err(Error::invalid_argument(format!(
            "zero-size allocation on {device}: devalloc refuses allocations of 0 bytes"
        )));
    }
    match nbytes.checked_next_multiple_of(alignment) {
        Some(_) => Ok(nbytes as u64),
        None => Err(Error::invalid_argument(format!(
            "{nbytes} bytes rounded up to alignment {alignment} overflows on {device}"
        ))),
    }
}

/// `value` rounded up to a multiple of the power of two `align`, or `None` on overflow.
pub(crate) fn round_up(value: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    value.checked_add(align - 1).map(|v| v & !(align - 1))
}

/// Checks `index < count` for an allocator of `device_type`.
pub(crate) fn check_index(device_type: DeviceType, index: DeviceIndex, count: usize) -> Result<()> {
    if (index as usize) < count {
        Ok(())
    } else {
        Err(Error::NoSuchDevice { device: Device::new(device_type, index), count })
    }
}

/// A host-side length as `u64` (lossless on every target devalloc builds for).
pub(crate) fn len64(n: usize) -> u64 {
    n as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked() {
        let d = Device::new(DeviceType::Cpu, 0);
        assert_eq!(check_request(1, 256, d).unwrap(), 1);
        assert_eq!(check_request(257, 256, d).unwrap(), 257);
        for bad_align in [0, 3, 6, 100] {
            assert!(matches!(check_request(8, bad_align, d), Err(Error::InvalidArgument { .. })));
        }
        assert!(check_request(0, 8, d).unwrap_err().to_string().contains("zero-size"));
        let e = check_request(usize::MAX - 2, 1 << 12, d).unwrap_err();
        assert!(e.to_string().contains("overflows"), "{e}");
    }

    #[test]
    fn index_is_checked() {
        assert!(check_index(DeviceType::Cuda, 0, 1).is_ok());
        let e = check_index(DeviceType::Cuda, 1, 1).unwrap_err();
        assert_eq!(e.to_string(), "no device cuda:1: this allocator has 1 cuda device(s)");
    }

    #[test]
    fn round_up_overflows_to_none() {
        assert_eq!(round_up(5, 4), Some(8));
        assert_eq!(round_up(8, 4), Some(8));
        assert_eq!(round_up(u64::MAX, 2), None);
    }
}
