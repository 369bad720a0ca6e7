//! The enum arguments as they cross from C: 32-bit integers that may hold any value.
//!
//! A C caller passes an enum parameter as an `int`, and nothing stops it from passing 42 (or a
//! status where a device type belongs, in C). A Rust enum parameter holding 42 would be
//! undefined behaviour, so each function takes the integer (`#[repr(transparent)]`, the same
//! ABI) and checks it, while the header shows the enum type: `cbindgen.toml` renames these
//! three to `DevallocDeviceType`, `DevallocStatus` and `DevallocLogLevel` and leaves their own
//! definitions out. A C++ caller gets its compiler's type check; a C caller gets GCC's and
//! Clang's `-Wenum-conversion` where an enum of another type is passed.

use crate::logger::DevallocLogLevel;
use crate::open::DevallocDeviceType;
use crate::status::DevallocStatus;

/// A `DevallocDeviceType` argument as C passed it, not yet checked.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawDeviceType(pub i32);

/// A `DevallocStatus` argument as C passed it, not yet checked.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawStatus(pub i32);

/// A `DevallocLogLevel` argument as C passed it, not yet checked.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawLogLevel(pub i32);

impl From<DevallocDeviceType> for RawDeviceType {
    fn from(t: DevallocDeviceType) -> Self {
        RawDeviceType(t as i32)
    }
}

impl From<DevallocStatus> for RawStatus {
    fn from(s: DevallocStatus) -> Self {
        RawStatus(s as i32)
    }
}

impl From<DevallocLogLevel> for RawLogLevel {
    fn from(l: DevallocLogLevel) -> Self {
        RawLogLevel(l as i32)
    }
}
