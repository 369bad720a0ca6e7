//! With the `header` feature, generates `devalloc.h` from this crate's source with cbindgen into
//! `OUT_DIR` (its C99 comments made C89 ones), where `tests/header.rs` compares it with the committed `include/devalloc.h`.
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
        // cbindgen closes its `extern "C"` block with C99 comments of its own: made C89 ones,
        // as every other comment in the header is.
        let mut text = Vec::new();
        bindings.write(&mut text);
        let text = String::from_utf8(text).expect("cbindgen writes UTF-8");
        let text = text
            .replace("// __cplusplus", "/* __cplusplus */")
            .replace("// extern \"C\"", "/* extern \"C\" */");
        std::fs::write(out.join("devalloc.h"), text).expect("OUT_DIR is writable");
        println!("cargo:rerun-if-changed=src");
        println!("cargo:rerun-if-changed=cbindgen.toml");
    }
}
