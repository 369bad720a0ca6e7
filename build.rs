//! Names the platform conditions once, so that code says `#[cfg(native)]` / `#[cfg(web)]`;
//! and the wgpu-hal backends devalloc's features turn on (as wgpu-hal's own build.rs names them).
fn main() {
    cfg_aliases::cfg_aliases! {
        web: { target_arch = "wasm32" },
        native: { not(target_arch = "wasm32") },
        hal_vulkan: { all(not(target_arch = "wasm32"), feature = "vulkan") },
        hal_gles: { all(not(target_arch = "wasm32"), feature = "gles") },
        hal_metal: { all(target_vendor = "apple", feature = "metal") },
        hal_dx12: { all(target_os = "windows", feature = "dx12") },
    }
}
