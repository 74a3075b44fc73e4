//! Shared helpers of the whisper_* and granite_nar tests: fixture paths that skip with a notice when
//! missing, or fail when `XRAY_REQUIRE_FIXTURES` is set.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The repository root (runtime/..).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A fixture directory or file, or `None` after printing why the test is skipped. With
/// `XRAY_REQUIRE_FIXTURES` set (`make test` sets it) a missing fixture fails the test instead:
/// a skip must not pass for a result there.
pub fn fixture(rel: &str) -> Option<PathBuf> {
    fixture_at(
        repo().join(rel),
        std::env::var_os("XRAY_REQUIRE_FIXTURES").is_some(),
    )
}

/// [`fixture`] with the requirement given: `Some(p)` when `p` exists; else a panic naming it when
/// `required`, or `None` after a notice.
pub fn fixture_at(p: PathBuf, required: bool) -> Option<PathBuf> {
    if p.exists() {
        Some(p)
    } else if required {
        panic!(
            "fixture {} is missing and XRAY_REQUIRE_FIXTURES is set (run `make fixtures`)",
            p.display()
        );
    } else {
        eprintln!("SKIP: fixture {} is missing (run `make fixtures` or `.venv/bin/python fixtures/build.py`)", p.display());
        None
    }
}

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
