//! `xray-nopy`: the `xray` CLI built without the `oracle` feature (no pyo3, no libpython): it
//! compares, gates, reports, lists, runs the runtime and checks from a reference cache on a
//! machine with no Python at all. A binary of its own name, built by `make test-nopy` as
//! `cargo build --release -p xray --no-default-features --features nopy --bin xray-nopy`, so
//! building it never replaces `target/release/xray` (the oracle build `make demo` and the docs
//! use). The `nopy` feature only enables this target.
//!
//! Exit codes: 0 pass, 1 divergence or gate failure, 2 usage or input error.

#![forbid(unsafe_code)]

#[cfg(feature = "oracle")]
compile_error!(
    "xray-nopy is the Python-free build: cargo build -p xray --no-default-features --features nopy --bin xray-nopy"
);

mod cli;
include!("entry.rs");
