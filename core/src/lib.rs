//! X-Ray core: what an engine needs to speak X-Ray, with no Python, no kernels and no model code.
//!
//! | module | what it holds |
//! |---|---|
//! | (root) | [`Layout`], [`Dim`], [`Shape`], [`Tensor`]: the vocabulary of declared edges |
//! | [`family`] | family descriptors (`core/families/*.json`): model types, files, capabilities, extras, oracle module, self-test fixture |
//! | [`key`] | [`CheckpointKey`] and [`Step`]: a checkpoint at a step, `name@stepK`, spelled once |
//! | [`contract`] | the per-family checkpoint contracts (`core/contracts/*.json`), parsed and resolved once against a model config |
//! | [`dump`] | the `xray.dump` format: manifest, `.npy` tensors, atomic writer, checked loader |
//! | [`engine`] | what an engine writing dumps shares: its run's identity ([`engine::RunIdentity`]: the manifest's, checked against a reference it is fed) and its `extra.fed` records |
//! | [`ops`] | op-level points: `{module}:{in|out}` names at the reference's module boundaries, and which a run emits |
//! | [`reference`] | [`reference::OracleRequest`]: what a reference run is asked for (run by the oracle, keyed by the reference cache) |
//! | [`replay`] | reference replay: the counterfactuals a module is re-run with and what the replay reports about it |
//! | [`signature`] | [`SignatureKind`]: the kinds of difference, named by compare and expected by the fault catalogues |
//! | [`testing`] | the one test guard: a missing fixture or CPU feature is a printed, recorded skip, or a failure under `XRAY_REQUIRE_FIXTURES`; the `xray` binary run from an engine's end-to-end test |
//! | [`capture`] | the capture API: [`capture::Observer`] (an engine calls it at each checkpoint), [`capture::Recorder`], [`capture::StatsRecorder`], [`capture::Substitute`] (isolation) |
//!
//! X-Ray's own runtime, the HF oracle, the comparison library and outside engines (see
//! `docs/bring-your-own-engine.md`) all depend on this crate; it depends on none of them.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

use std::fmt;

use ndarray::ArrayD;
use serde::{Deserialize, Serialize};

pub mod capture;
pub mod contract;
pub mod dump;
pub mod engine;
pub mod error;
pub mod family;
pub mod key;
pub mod ops;
pub mod outdir;
pub mod reference;
pub mod replay;
pub mod signature;
pub mod testing;

pub use error::{CoreError, Result};
pub use key::{key, key_steps, CheckpointKey, KeyRef, Step};
pub use signature::SignatureKind;

/// Every tensor the runtime computes is f32 (weights are converted on load).
pub type Tensor = ArrayD<f32>;

/// Physical layout of a tensor edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// `[tokens, channels]` rows are tokens.
    TokenMajor,
    /// `[heads, tokens, head_dim]`.
    HeadMajor,
    /// `[channels, time]` (conv and mel layout).
    ChannelMajor,
    /// Anything else (ids, pcm samples, scalars); no layout transform applies.
    Plain,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::TokenMajor => "token_major",
            Layout::HeadMajor => "head_major",
            Layout::ChannelMajor => "channel_major",
            Layout::Plain => "plain",
        })
    }
}

/// One dimension of a declared shape: a number fixed by the config, or a symbol bound per run
/// (`tokens`, `past`, `past+tokens`, `frames`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Dim {
    /// Fixed by the config.
    Fixed(usize),
    /// Bound at run time; `a+b` is the sum of two symbols.
    Sym(String),
}

impl Dim {
    /// A symbolic dim.
    pub fn sym(s: &str) -> Dim {
        Dim::Sym(s.to_string())
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::Fixed(n)
    }
}

impl From<&str> for Dim {
    fn from(s: &str) -> Dim {
        Dim::Sym(s.to_string())
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
        }
    }
}

/// A declared shape.
pub type Shape = Vec<Dim>;

/// Render a shape as `[a, b, c]`.
pub fn fmt_shape(s: &[Dim]) -> String {
    let parts: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// The sha256 of `bytes` as lower-case hex: the one spelling of every content hash X-Ray writes
/// (dump files, contracts, policies, the reference cache's keys).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

/// Core version string recorded by engines that use only this crate.
pub fn version() -> String {
    format!("xray-core {}", env!("CARGO_PKG_VERSION"))
}
