//! `xray`: numerical parity harness CLI. Its entry (entry.rs) only parses and dispatches; each
//! subcommand lives in `cli/<name>.rs` with one entry function.
//!
//! Exit codes: 0 pass, 1 divergence or gate failure, 2 usage or input error.

#![forbid(unsafe_code)]

mod cli;
include!("entry.rs");
