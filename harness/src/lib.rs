//! The `xray` CLI's orchestration library (`xray_harness`): running X-Ray's own runtime into
//! dumps ([`runs`]), the check against the HF reference ([`check`]: in-process with the `oracle`
//! feature, on by default; from the reference cache ([`refcache`]) in either build) and, with the
//! oracle, the fault self-test ([`selftest`]). The comparison itself
//! lives in `xray-compare`, which never links Python.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod check;
pub mod refcache;
pub mod replay;
pub mod runs;
#[cfg(feature = "oracle")]
pub mod selftest;
