//! [`DevicePtr`], the opaque device address. At the bottom of the crate's layers: it imports
//! nothing from the crate (the checked offsets, which fail with an [`crate::Error`], are in
//! `error.rs`).

use std::fmt;

/// An opaque 64-bit device address: the Rust stand-in for a `void*` into device memory.
///
/// CUDA hands out real device addresses; the host and wgpu allocators hand out addresses in a
/// virtual range they keep per device and resolve back to their storage. Either way offset
/// arithmetic works the same (a planned tensor is `base.offset(n)?`), and nothing can be
/// dereferenced by mistake on the host. Arithmetic is checked: overflow is an error, never a
/// wrap.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct DevicePtr(u64);

impl DevicePtr {
    /// The null address, which no allocation ever has.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// Wraps a raw address.
    pub const fn new(addr: u64) -> Self {
        DevicePtr(addr)
    }

    /// The raw address.
    pub const fn addr(self) -> u64 {
        self.0
    }

    /// Whether this is [`DevicePtr::NULL`].
    pub const fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The distance `self - base` in bytes, or `None` when `base` is above `self`.
    pub fn offset_from(self, base: DevicePtr) -> Option<u64> {
        self.0.checked_sub(base.0)
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr({:#x})", self.0)
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl fmt::LowerHex for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

impl From<DevicePtr> for u64 {
    fn from(p: DevicePtr) -> u64 {
        p.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn null_and_arithmetic() {
        assert!(DevicePtr::NULL.is_null());
        assert!(DevicePtr::default().is_null());
        let p = DevicePtr::new(0x1000);
        assert!(!p.is_null());
        assert_eq!(p.offset(0x20).unwrap().addr(), 0x1020);
        assert_eq!(p.offset(0x20).unwrap().offset_from(p), Some(0x20));
        assert_eq!(p.offset_from(p.offset(1).unwrap()), None);
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        let p = DevicePtr::new(u64::MAX - 3);
        assert_eq!(p.offset(3).unwrap().addr(), u64::MAX);
        let err = p.offset(4).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }));
        assert!(err.to_string().contains("overflow"));
    }

    #[test]
    fn debug_is_hex() {
        assert_eq!(format!("{:?}", DevicePtr::new(0xdead_beef)), "DevicePtr(0xdeadbeef)");
        assert_eq!(DevicePtr::new(255).to_string(), "0xff");
    }
}
