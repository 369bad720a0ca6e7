//! With the `header` feature, generates `devalloc.h` from this crate's source with cbindgen into
//! `OUT_DIR`, where `tests/header.rs` compares it with the committed `include/devalloc.h`.
//! Without it, does nothing.

fn main() {
    #[cfg(feature = "header")]
    {
        let crate_dir =
            std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
        let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
        let config =
            cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
        let bindings = cbindgen::Builder::new()
            .with_crate(&crate_dir)
            .with_config(config)
            .generate()
            .expect("cbindgen generates the header");
        bindings.write_to_file(out.join("devalloc.h"));
        println!("cargo:rerun-if-changed=src");
        println!("cargo:rerun-if-changed=cbindgen.toml");
    }
}
