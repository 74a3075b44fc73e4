//! The harness's integration tests, one test binary (`cargo test -p xray --test it`): each module
//! below was a test binary of its own (`tests/<module>.rs`), each linking the whole stack (pyo3
//! and libpython included); one binary is linked once. Run one module with a filter on its path,
//! `cargo test --release -p xray --test it -- corpus_mode::`.
//!
//! One process now runs every module's tests, in parallel threads, so a test must not change
//! what the process shares:
//!
//! - no `std::env::set_var` / `remove_var` and no `std::env::set_current_dir`: a child gets its
//!   environment and working directory from its `Command` (`.env`, `.env_remove`,
//!   `.current_dir`), which changes nothing in this process;
//! - files in a `tempfile::tempdir()` of the test's own, never at a fixed path;
//! - no embedded Python in this process: the in-process corpus test (`corpus`) runs in a child
//!   process of its own ([`common::own_process`]), because starting the interpreter and the
//!   reference changes the process (torch writes `os.environ`, the interpreter sets the C locale)
//!   while the other tests spawn `xray` with the environment;
//! - the `xray` binaries the tests run (`CARGO_BIN_EXE_xray`, `xray-nopy`, `xray-candle-whisper`)
//!   are built before the tests start and never rebuilt by a test.

#[macro_use]
mod common;

mod bench;
mod cli;
mod cli_snapshots;
mod contract;
mod corpus;
mod corpus_mode;
mod e2e;
mod input_errors;
mod op_level;
mod partial;
mod reference_variant;
mod replay;
mod repro;
mod schema;
mod snapshots;
mod stats_check;
mod trust_env;
mod trust_gate;
mod trust_inject;
mod trust_numerics;
mod trust_outputs;
mod weights;
