//! Names the platform conditions once, so that code says `#[cfg(native)]` / `#[cfg(web)]`;
//! and the wgpu backends devalloc's features turn on, as wgpu's own build.rs names them (the
//! `vulkan` and `gles` features bring those backends only to their native platforms).
fn main() {
    cfg_aliases::cfg_aliases! {
        web: { target_arch = "wasm32" },
        native: { not(target_arch = "wasm32") },
        hal_vulkan: { all(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd"), feature = "vulkan") },
        hal_gles: { all(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd"), feature = "gles") },
        hal_metal: { all(target_vendor = "apple", feature = "metal") },
        hal_dx12: { all(target_os = "windows", feature = "dx12") },
    }
}
