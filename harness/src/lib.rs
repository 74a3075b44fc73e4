//! The `xray` CLI's orchestration library (`xray_harness`): running X-Ray's own runtime into
//! dumps ([`runs`]) and, with the `oracle` feature (on by default), the in-process check against
//! the HF reference ([`check`]) and the fault self-test ([`selftest`]). The comparison itself
//! lives in `xray-compare`, which never links Python.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(feature = "oracle")]
pub mod check;
#[cfg(feature = "oracle")]
pub mod replay;
pub mod runs;
#[cfg(feature = "oracle")]
pub mod selftest;
