//! `include/devalloc.h` is generated from this crate by cbindgen: the build script generates it
//! again (feature `header`) and this test fails when the committed one differs (CI: `cargo test
//! -p devalloc-capi --features header --test header`). `DEVALLOC_BLESS=1` writes the new header
//! instead.

use std::path::Path;

/// What cbindgen made of the crate as it is now (capi/build.rs).
const FRESH: &str = include_str!(concat!(env!("OUT_DIR"), "/devalloc.h"));

#[test]
fn the_committed_header_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/devalloc.h");
    if std::env::var_os("DEVALLOC_BLESS").is_some() {
        std::fs::write(&path, FRESH).expect("include/devalloc.h is writable");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != FRESH {
        let first = committed.lines().zip(FRESH.lines()).position(|(a, b)| a != b);
        panic!(
            "{} is stale (first difference at line {}): regenerate it with \
             `DEVALLOC_BLESS=1 cargo test -p devalloc-capi --features header --test header` and commit it",
            path.display(),
            first.map_or_else(|| "the end".to_string(), |l| (l + 1).to_string())
        );
    }
}
