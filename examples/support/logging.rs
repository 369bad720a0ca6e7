//! The logger of devalloc's examples and tests: `env_logger` as usual (`RUST_LOG` overrides the
//! default filter), minus one known false alarm.
//!
//! The false alarm: on a machine without a GPU device node (`/dev/dri`), Mesa's surfaceless EGL
//! platform first tries a hardware driver, records `EGL_NOT_INITIALIZED` ("DRI2: failed to load
//! driver") and then initializes with its software rasterizer (llvmpipe), which works. In
//! debug builds wgpu enables EGL's debug output (its `VALIDATION` flag) and logs that
//! intermediate record at ERROR (`wgpu_hal::gles::egl`), although GL then opens fine. That one
//! record is dropped; every other EGL message, errors included, still comes through.
//!
//! The examples' [`init`] also gives Mesa a runtime folder where the session has none: on a
//! headless machine (a container, a CI runner, a login without a desktop session),
//! `XDG_RUNTIME_DIR` is unset, and Mesa's EGL and Vulkan loaders each print
//! `error: XDG_RUNTIME_DIR is invalid or not set in the environment.` before the example says
//! anything. It is noise (they need the folder only for a display server's sockets, and there
//! is no display), so the examples point it at a private folder of their own (mode 0700, under
//! the temporary folder, one per user) before any GPU is opened.
#![allow(dead_code)]

/// Whether `record` is the false alarm described in the module docs.
pub fn known_false_alarm(record: &log::Record<'_>) -> bool {
    record.target().starts_with("wgpu_hal::gles::egl")
        && record.args().to_string().contains("DRI2: failed to load driver")
}

struct Filtered(env_logger::Logger);

impl log::Log for Filtered {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        self.0.enabled(metadata)
    }
    fn log(&self, record: &log::Record<'_>) {
        if self.0.matches(record) && !known_false_alarm(record) {
            self.0.log(record);
        }
    }
    fn flush(&self) {
        self.0.flush();
    }
}

fn install(mut builder: env_logger::Builder) {
    let logger = builder.build();
    let level = logger.filter();
    if log::set_boxed_logger(Box::new(Filtered(logger))).is_ok() {
        log::set_max_level(level);
    }
}

/// Points `XDG_RUNTIME_DIR` at a private folder when it is unset or not a folder (see the
/// module docs). Called before any thread or GPU is started.
fn runtime_dir() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| std::path::Path::new(&d).is_dir()) {
        return;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        // One folder per user, kept between runs (it stays empty).
        let user = std::env::var("USER").unwrap_or_default();
        let dir = std::env::temp_dir().join(format!("devalloc-runtime-{user}"));
        if std::fs::DirBuilder::new().mode(0o700).create(&dir).is_ok() || dir.is_dir() {
            std::env::set_var("XDG_RUNTIME_DIR", &dir);
        }
    }
}

/// For an example: `default_filter` unless `RUST_LOG` says otherwise. Also gives Mesa a
/// runtime folder where the machine has none (see the module docs).
pub fn init(default_filter: &str) {
    runtime_dir();
    install(env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_filter)));
}

/// For a test (output captured by the test harness); a second call does nothing.
pub fn init_for_tests() {
    let mut builder = env_logger::Builder::from_default_env();
    builder.is_test(true);
    install(builder);
}
