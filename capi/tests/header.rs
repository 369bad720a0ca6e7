//! `include/devalloc.h` is generated from this crate by cbindgen: this test generates it again
//! and fails when the committed one differs (CI: `cargo test -p devalloc-capi --features
//! header --test header`). `DEVALLOC_BLESS=1` writes the new header instead.

use std::path::Path;

#[test]
fn the_committed_header_is_current() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let fresh = String::from_utf8(fresh).expect("the header is UTF-8");
    let path = crate_dir.join("include/devalloc.h");
    if std::env::var_os("DEVALLOC_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("include/devalloc.h is writable");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != fresh {
        let first = committed.lines().zip(fresh.lines()).position(|(a, b)| a != b);
        panic!(
            "{} is stale (first difference at line {}): regenerate it with \
             `DEVALLOC_BLESS=1 cargo test -p devalloc-capi --features header --test header` and commit it",
            path.display(),
            first.map_or_else(|| "the end".to_string(), |l| (l + 1).to_string())
        );
    }
}
