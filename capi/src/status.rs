//! Status codes, the thread-local last error, and [`guard`]: how every call's `Result` (or
//! panic) becomes what C sees.

use std::cell::UnsafeCell;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

use devalloc::Error;

/// What a devalloc call returns: `DEVALLOC_STATUS_OK` (0), or why it failed. On failure,
/// `devalloc_last_error()` gives the message on the same thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevallocStatus {
    /// The call succeeded.
    Ok = 0,
    /// An argument is invalid: a zero size, a bad alignment, a null host pointer, an unknown
    /// device type, a size past `PTRDIFF_MAX`.
    InvalidArgument = 1,
    /// No room now, on the device or under its memory limit (the message says what is held).
    OutOfMemory = 2,
    /// The request can never fit on the device (or under its limit).
    TooLarge = 3,
    /// Nothing to serve the call: no allocator open for that device type (no driver, no
    /// device, or not built in).
    NotFound = 4,
    /// The device index is not one of that type's devices.
    NoSuchDevice = 5,
    /// A device pointer that is null, unknown (foreign), freed (a double free or a use after
    /// free), of another device, or (for a free) not the start of its allocation.
    InvalidPointer = 6,
    /// A copy runs past the end of the allocation its pointer lies in.
    OutOfBounds = 7,
    /// The operation is not supported by that device type's allocator.
    NotSupported = 8,
    /// The device was lost; every later call on it fails so.
    DeviceLost = 9,
    /// The backend (driver, wgpu) failed otherwise.
    Backend = 10,
    /// A file could not be written (snapshots).
    Io = 11,
    /// A bug in devalloc: a panic, caught at the boundary (nothing reached C). The call had no
    /// effect that can be relied on; the message names the call and the panic, and Rust's panic
    /// hook prints it with its source location on stderr, whatever the log level.
    Internal = 12,
}

impl DevallocStatus {
    /// The status of a devalloc error.
    pub fn of(error: &Error) -> Self {
        match error {
            Error::InvalidArgument { .. } => DevallocStatus::InvalidArgument,
            Error::OutOfMemory { .. } => DevallocStatus::OutOfMemory,
            Error::TooLarge { .. } => DevallocStatus::TooLarge,
            Error::NotFound { .. } => DevallocStatus::NotFound,
            // The C ABI opens allocators itself and never registers twice; a second `open` is Ok.
            Error::AlreadyRegistered { .. } => DevallocStatus::Internal,
            Error::NoSuchDevice { .. } => DevallocStatus::NoSuchDevice,
            Error::InvalidPointer { .. } => DevallocStatus::InvalidPointer,
            Error::OutOfBounds { .. } => DevallocStatus::OutOfBounds,
            Error::NotSupported { .. } => DevallocStatus::NotSupported,
            Error::DeviceLost { .. } => DevallocStatus::DeviceLost,
            _ => DevallocStatus::Backend,
        }
    }

    /// The constant's name without its prefix, as a static C string (`"OUT_OF_MEMORY"`).
    pub fn name(self) -> &'static std::ffi::CStr {
        match self {
            DevallocStatus::Ok => c"OK",
            DevallocStatus::InvalidArgument => c"INVALID_ARGUMENT",
            DevallocStatus::OutOfMemory => c"OUT_OF_MEMORY",
            DevallocStatus::TooLarge => c"TOO_LARGE",
            DevallocStatus::NotFound => c"NOT_FOUND",
            DevallocStatus::NoSuchDevice => c"NO_SUCH_DEVICE",
            DevallocStatus::InvalidPointer => c"INVALID_POINTER",
            DevallocStatus::OutOfBounds => c"OUT_OF_BOUNDS",
            DevallocStatus::NotSupported => c"NOT_SUPPORTED",
            DevallocStatus::DeviceLost => c"DEVICE_LOST",
            DevallocStatus::Backend => c"BACKEND",
            DevallocStatus::Io => c"IO",
            DevallocStatus::Internal => c"INTERNAL",
        }
    }
}

/// A failure on its way to C: a devalloc error, or one the boundary found itself.
#[derive(Debug)]
pub struct Failure {
    status: DevallocStatus,
    message: String,
}

impl Failure {
    /// A failure with this status and message.
    pub fn new(status: DevallocStatus, message: impl Into<String>) -> Self {
        Failure { status, message: message.into() }
    }

    /// An invalid argument, said so.
    pub fn invalid(message: impl Into<String>) -> Self {
        Failure::new(DevallocStatus::InvalidArgument, message)
    }

    /// Its status.
    pub fn status(&self) -> DevallocStatus {
        self.status
    }

    /// Its message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same failure with `more` after its message.
    pub fn and(mut self, more: &str) -> Self {
        self.message.push_str(more);
        self
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure { status: DevallocStatus::of(&e), message: e.to_string() }
    }
}

/// What the boundary's helpers return.
pub type Outcome<T = ()> = Result<T, Failure>;

/// The longest message kept, NUL included; longer ones are cut at a character boundary.
const MESSAGE_CAPACITY: usize = 4096;

thread_local! {
    /// The message of this thread's last failed call, NUL-terminated for C. A fixed buffer,
    /// written in place: a pointer C holds from `devalloc_last_error` stays valid for the life of
    /// the thread (a later failure changes the text it points to, never frees it).
    static LAST_ERROR: UnsafeCell<[u8; MESSAGE_CAPACITY]> = const { UnsafeCell::new([0; MESSAGE_CAPACITY]) };
}

/// Runs `call`, the body of the C function `name`, and turns its result into a status: Ok, its
/// failure (whose message, after `name: `, becomes this thread's last error), or a caught panic
/// ([`DevallocStatus::Internal`]). Nothing unwinds past it.
pub fn guard(name: &str, call: impl FnOnce() -> Outcome) -> DevallocStatus {
    let failure = match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(())) => return DevallocStatus::Ok,
        Ok(Err(failure)) => failure,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            log::error!("devalloc: a panic was caught at the C boundary in {name}: {what}");
            Failure::new(DevallocStatus::Internal, format!("internal error (a bug in devalloc): {what}"))
        }
    };
    set_last_error(&format!("{name}: {}", failure.message));
    failure.status
}

/// Makes `message` this thread's last error (a NUL inside it ends it early).
#[allow(unsafe_code)] // writes the thread's own buffer through its raw pointer
fn set_last_error(message: &str) {
    let text = message.split('\0').next().unwrap_or_default();
    let mut len = text.len().min(MESSAGE_CAPACITY - 1);
    while !text.is_char_boundary(len) {
        len -= 1;
    }
    // A thread being torn down may have no thread-locals left: its message is dropped.
    let _ = LAST_ERROR.try_with(|slot| {
        let buffer = slot.get().cast::<u8>();
        // SAFETY: `buffer` is this thread's MESSAGE_CAPACITY bytes, only ever reached through
        // raw pointers from `slot.get()` on this thread; `len + 1 <= MESSAGE_CAPACITY`; `text`
        // is a distinct allocation. C reads it only between calls, on this thread.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buffer, len);
            buffer.add(len).write(0);
        }
    });
}

/// This thread's last error message: NUL-terminated, valid for the life of the thread.
pub fn last_error() -> *const c_char {
    LAST_ERROR.try_with(|slot| slot.get().cast::<c_char>().cast_const()).unwrap_or(c"".as_ptr())
}

#[cfg(test)]
#[allow(unsafe_code)] // reads the C strings it hands out
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_their_status() {
        let e = Error::invalid_argument("zero bytes");
        assert_eq!(DevallocStatus::of(&e), DevallocStatus::InvalidArgument);
        assert_eq!(DevallocStatus::of(&Error::not_found("cuda")), DevallocStatus::NotFound);
    }

    #[test]
    fn a_panic_becomes_internal_and_a_message() {
        let status = guard("test", || panic!("on purpose"));
        assert_eq!(status, DevallocStatus::Internal);
        // SAFETY: last_error returns a NUL-terminated string owned by this thread.
        let text = unsafe { std::ffi::CStr::from_ptr(last_error()) }.to_str().unwrap().to_owned();
        assert!(text.contains("on purpose"), "{text}");
    }

    #[test]
    fn a_held_message_pointer_stays_valid_and_long_messages_are_cut() {
        assert_eq!(guard("test", || Err(Failure::invalid("first"))), DevallocStatus::InvalidArgument);
        let held = last_error();
        let long = "é".repeat(MESSAGE_CAPACITY); // 2 bytes a character: cut on a boundary
        assert_eq!(guard("test", || Err(Failure::invalid(long.clone()))), DevallocStatus::InvalidArgument);
        assert_eq!(last_error(), held, "the message moved");
        // SAFETY: the thread's buffer, NUL-terminated.
        let text = unsafe { std::ffi::CStr::from_ptr(held) }.to_str().expect("cut on a char boundary");
        assert!(text.len() < MESSAGE_CAPACITY);
        let cut = text.strip_prefix("test: ").expect("the call is named first");
        assert!(cut.starts_with("éé") && cut.len() % 2 == 0);
    }

    #[test]
    fn messages_with_a_nul_are_cut_not_lost() {
        assert_eq!(guard("test", || Err(Failure::invalid("before\0after"))), DevallocStatus::InvalidArgument);
        // SAFETY: as above.
        let text = unsafe { std::ffi::CStr::from_ptr(last_error()) };
        assert_eq!(text.to_str().unwrap(), "test: before");
    }
}
