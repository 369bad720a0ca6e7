//! The logger of devalloc's examples and tests: `env_logger` as usual (`RUST_LOG` overrides the
//! default filter), minus one known false alarm.
//!
//! The false alarm: on a machine without a GPU device node (`/dev/dri`), Mesa's surfaceless EGL
//! platform first tries a hardware driver, records `EGL_NOT_INITIALIZED` ("DRI2: failed to load
//! driver") and then initializes with its software rasterizer (llvmpipe), which works. In
//! debug builds wgpu enables EGL's debug output (its `VALIDATION` flag) and logs that
//! intermediate record at ERROR (`wgpu_hal::gles::egl`), although GL then opens fine. That one
//! record is dropped; every other EGL message, errors included, still comes through.
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

/// For an example: `default_filter` unless `RUST_LOG` says otherwise.
pub fn init(default_filter: &str) {
    install(env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_filter)));
}

/// For a test (output captured by the test harness); a second call does nothing.
pub fn init_for_tests() {
    let mut builder = env_logger::Builder::from_default_env();
    builder.is_test(true);
    install(builder);
}
