//! Shared helpers of the whisper_* and granite_nar tests: fixture paths (skipped with a printed,
//! recorded line when missing, or failing when `XRAY_REQUIRE_FIXTURES` is set:
//! [`xray_core::testing`]), copies and edits.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The repository root (runtime/..).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A fixture directory or file (relative to the repository root), or `None` after a skip line;
/// a missing fixture fails the test under `XRAY_REQUIRE_FIXTURES` (`make test` sets it). The one
/// guard: [`xray_core::testing`].
pub use xray_core::testing::require_fixture as fixture;

/// Copy a model directory into a temp dir so a test can damage it.
pub fn copy_dir(src: &Path) -> tempfile::TempDir {
    let t = tempfile::tempdir().expect("tempdir");
    for e in std::fs::read_dir(src).expect("read fixture dir") {
        let e = e.expect("dir entry");
        if e.path().is_file() {
            std::fs::copy(e.path(), t.path().join(e.file_name())).expect("copy fixture file");
        }
    }
    t
}

/// Edit a JSON file in place.
pub fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read json"))
            .expect("parse json");
    f(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).expect("json")).expect("write json");
}

/// Asserts `msg` says each of `says` (the whole message shown when it does not).
pub fn assert_says(msg: &str, says: &[&str]) {
    for s in says {
        assert!(msg.contains(s), "{msg}");
    }
}
