//! devalloc's `log` records on stderr, for C programs (which have no Rust logger to install).

use std::sync::Mutex;

use log::{LevelFilter, Log, Metadata, Record};

use crate::status::{DevallocStatus, Failure, Outcome};

/// How much of devalloc's log a C program sees on stderr (`devalloc_log_to_stderr`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevallocLogLevel {
    /// Nothing.
    Off = 0,
    /// Errors (a panic caught at the boundary, a device lost).
    Error = 1,
    /// And warnings (leaks reported when an allocator is dropped, slow paths).
    Warn = 2,
    /// And what was opened and registered.
    Info = 3,
    /// And each allocator's decisions.
    Debug = 4,
    /// Everything.
    Trace = 5,
}

struct Stderr;

impl Log for Stderr {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record<'_>) {
        if self.enabled(record.metadata()) {
            eprintln!("[{} {}] {}", record.level(), record.target(), record.args());
        }
    }

    fn flush(&self) {}
}

static STDERR: Stderr = Stderr;
static INSTALLED: Mutex<bool> = Mutex::new(false);

/// Sends devalloc's log to stderr at `level` (0 = off to 5 = trace); again to change the level.
/// `NOT_SUPPORTED` when another logger (a Rust host's own) is installed in the process.
pub fn to_stderr(level: crate::raw::RawLogLevel) -> Outcome {
    let level = level.0;
    let filter = match level {
        0 => LevelFilter::Off,
        1 => LevelFilter::Error,
        2 => LevelFilter::Warn,
        3 => LevelFilter::Info,
        4 => LevelFilter::Debug,
        5 => LevelFilter::Trace,
        _ => return Err(Failure::invalid(format!("log level {level}: expected 0 (off) to 5 (trace)"))),
    };
    // Checked and installed under one lock: threads calling at once all see it installed.
    let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    if !*installed {
        log::set_logger(&STDERR).map_err(|_| {
            Failure::new(
                DevallocStatus::NotSupported,
                "another logger is installed in this process: it gets devalloc's log",
            )
        })?;
        *installed = true;
    }
    log::set_max_level(filter);
    Ok(())
}
