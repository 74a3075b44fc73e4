//! X-Ray runtime: the system under test. A spec/state/feeds graph core (ops, declared edges with
//! producer, consumers, shape, dtype and layout; weights as a table passed in; caches as feeds),
//! f32 kernels, and speech-model families that expose named checkpoints.
//!
//! No Python here; the HF reference lives in `xray-oracle`.

pub mod audio;
pub mod error;
pub mod faults;
pub mod graph;
pub mod kernels;
pub mod models;
pub mod replay;
pub mod weights;

pub use error::{Result, RuntimeError};
pub use graph::{Dim, Graph, GraphBuilder, Layout, Tensor};
/// The capture API, checkpoint contracts and the dump format live in `xray-core` (no Python, no
/// kernels), shared with the oracle, the comparison library and outside engines.
pub use xray_core::{capture, contract, dump};

/// Runtime version string recorded in dumps and evidence.
pub fn version() -> String {
    format!("xray-runtime {}", env!("CARGO_PKG_VERSION"))
}
