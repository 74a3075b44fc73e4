//! X-Ray comparison library (`xray_compare`): metrics, tolerances, localization, signatures,
//! evidence, reports and the gate, on two dumps. It depends on `xray-core` only: no Python, no
//! runtime, so a team can compare its own engine's dumps with the reference's anywhere.
//!
//! | module | what it does |
//! |---|---|
//! | [`compare`] | the comparison paths, each its stages in order: align -> judge -> localize -> explain (`compare_graph`, `compare_dumps`, `compare_dumps_isolated`, `compare_stats_dumps`); `Comparison` -> evidence |
//! | [`align`] | each checkpoint's two tensors: `Pair` / `PairSource` (in memory, or `DumpPairs`: two dumps through the contract, its layout transforms, the entries' declarations, isolated runs), fed edges, token alignment |
//! | [`suppression`] | logits suppression: a generation config's suppressed ids, compared away where declared, found where not |
//! | [`judge`] | every node held to its tolerance: metrics of a pair, or the estimated rel_l2 of two summaries (stats-only) |
//! | [`metrics`] | one-pass element metrics (max_abs, rel_l2, cosine, ULPs, outliers, non-finite) and logits token metrics |
//! | [`tolerance`] | per-dtype defaults, JSON policy with glob overrides, calibrated noise-floor mode |
//! | [`localize`] | checkpoint DAG (from resolved specs or contract templates), origin localization, error profile, token drill-down |
//! | [`explain`] | each divergence described: inputs, the unobserved region and its suspects, a signature (tensors, shape in the contract's axes, missing, suppression); the fallback origin of a verdict with none |
//! | [`signatures`] | divergence signatures of the origin (permutation, scale, mask, ...) |
//! | [`ops`] | op-level localization: the first op-level point (`{module}:{in|out}`) that differs at the origin's step, the engine ops before it, its signature |
//! | [`case`] | repro cases (`xray.case/v1`): one op's inputs, weights, reference and engine outputs, tolerance; atomic write, checked read, judging |
//! | [`mechanism`] | reference replay at the op-level origin: per-op local errors (the module re-run on the engine's own input), cleared / convicted, the counterfactual that reproduces the engine's output |
//! | [`evidence`] | `xray.evidence/v1` serde types, atomic write, checked read |
//! | [`report`] | self-contained HTML and Markdown renderings |
//! | [`gate`] | baseline gate and JUnit XML |
//! | [`precision`] | declared precision: the ops an engine computed below f32 (`extra.precision`), and the policy's `accept_precision` applied downstream of them |
//! | [`offline`] | `xray compare`'s evidence from two loaded dumps (the CLI and the Python bindings share it) |
//! | [`variant`] | reference variants: the engine measured against the reference with its weights on a named grid, how much of the divergence the grid explains |
//! | [`corpus`] | a corpus's evidence: per-clip summary rows, `summary.json`, the corpus gate |
//! | [`error`] | the library's error type |
//!
//! The library works on plain `ndarray::ArrayViewD<f32>` and never links Python.

#![warn(missing_docs)]

pub mod align;
pub mod case;
pub mod compare;
pub mod corpus;
pub mod error;
pub mod evidence;
pub mod explain;
pub mod gate;
pub mod judge;
pub mod localize;
pub mod mechanism;
pub mod metrics;
pub mod offline;
pub mod ops;
pub mod precision;
pub mod report;
pub mod signatures;
pub mod suppression;
pub mod tolerance;
pub mod variant;

pub use error::{Error, Result};
