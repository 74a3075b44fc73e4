//! X-Ray comparison library (`xray_compare`): metrics, tolerances, localization, signatures,
//! evidence, reports and the gate, on two dumps. It depends on `xray-core` only: no Python, no
//! runtime, so a team can compare its own engine's dumps with the reference's anywhere.
//!
//! | module | what it does |
//! |---|---|
//! | [`metrics`] | one-pass element metrics (max_abs, rel_l2, cosine, ULPs, outliers, non-finite) and logits token metrics |
//! | [`tolerance`] | per-dtype defaults, JSON policy with glob overrides, calibrated noise-floor mode |
//! | [`localize`] | checkpoint DAG (from resolved specs or contract templates), origin localization, error profile, token drill-down |
//! | [`signatures`] | divergence signatures of the origin (permutation, scale, mask, ...) |
//! | [`ops`] | op-level localization: the first op-level point (`{module}:{in|out}`) that differs at the origin's step, the engine ops before it, its signature |
//! | [`case`] | repro cases (`xray.case/v1`): one op's inputs, weights, reference and engine outputs, tolerance; atomic write, checked read, judging |
//! | [`mechanism`] | reference replay at the op-level origin: per-op local errors (the module re-run on the engine's own input), cleared / convicted, the counterfactual that reproduces the engine's output |
//! | [`compare`] | the pipeline: graph + tensor pairs -> statuses, origin, explanation, profile |
//! | [`evidence`] | `xray.evidence/v1` serde types, atomic write, checked read |
//! | [`report`] | self-contained HTML and Markdown renderings |
//! | [`gate`] | baseline gate and JUnit XML |
//! | [`precision`] | declared precision: the ops an engine computed below f32 (`extra.precision`), and the policy's `accept_precision` applied downstream of them |
//! | [`offline`] | `xray compare`'s evidence from two loaded dumps (the CLI and the Python bindings share it) |
//! | [`pipeline`] | dumps + contract -> tensor pairs (layout transforms the contract declares), stats-only comparison |
//!
//! The library works on plain `ndarray::ArrayViewD<f32>` and never links Python.

#![warn(missing_docs)]

pub mod case;
pub mod compare;
pub mod corpus;
pub mod error;
pub mod evidence;
pub mod gate;
pub mod localize;
pub mod mechanism;
pub mod metrics;
pub mod offline;
pub mod ops;
pub mod pipeline;
pub mod precision;
pub mod report;
pub mod signatures;
pub mod tolerance;
pub mod variant;

pub use error::{Error, Result};
