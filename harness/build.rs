//! Embeds the identity of the reference X-Ray is built with, for the reference cache's keys
//! (`src/refcache.rs`): the sha256 of the oracle package's Python sources
//! (`XRAY_ORACLE_SOURCES_SHA256`), so a cached reference made by other oracle code is a miss.

use sha2::{Digest, Sha256};

include!("src/oracle_sources.rs");

fn main() {
    let dir = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"))
        .join("../oracle/xray_oracle");
    // Each source file, not the folder: a folder is watched with everything under it, and
    // Python writes __pycache__ there on every run (a new module is imported by an edited one).
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        if e.path().extension().is_some_and(|x| x == "py") {
            println!("cargo:rerun-if-changed={}", e.path().display());
        }
    }
    println!("cargo:rerun-if-changed=src/oracle_sources.rs");
    let material = oracle_sources_material(&dir)
        .unwrap_or_else(|e| panic!("the oracle package {}: {e}", dir.display()));
    let sha = Sha256::digest(&material);
    let hex: String = sha.iter().map(|b| format!("{b:02x}")).collect();
    println!("cargo:rustc-env=XRAY_ORACLE_SOURCES_SHA256={hex}");
}
