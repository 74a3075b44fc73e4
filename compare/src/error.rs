//! The harness library's error type: one enum with structured fields.

use xray_core::Step;

/// Errors of the harness library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The two tensors of a comparison do not have the same shape.
    #[error("shape mismatch: reference {reference:?} vs runtime {runtime:?}")]
    ShapeMismatch {
        /// Reference shape.
        reference: Vec<usize>,
        /// Runtime shape.
        runtime: Vec<usize>,
    },
    /// Logits metrics need a `[positions, vocab]` tensor.
    #[error("logits must be 2-D [positions, vocab], got shape {shape:?}")]
    NotLogits {
        /// The offending shape.
        shape: Vec<usize>,
    },
    /// The reference holds a NaN or Inf: an input error (broken weights or input), never compared.
    #[error(
        "reference {}holds {count} non-finite value(s), the first {value} at index {index:?}: a \
         non-finite reference is an input error (check the model's weights and the audio), not \
         something to compare against",
        .checkpoint.as_ref().map(|c| format!("checkpoint {c} ")).unwrap_or_default()
    )]
    NonFiniteReference {
        /// Checkpoint id `name@stepK`, when known.
        checkpoint: Option<String>,
        /// Number of non-finite reference elements.
        count: u64,
        /// C-order index of the first one.
        index: Vec<usize>,
        /// `NaN`, `inf` or `-inf`.
        value: String,
    },
    /// A stats-only reference counts NaN or Inf values: the input error of
    /// [`Error::NonFiniteReference`], from its summary (which records no index).
    #[error(
        "reference checkpoint {checkpoint} holds {} non-finite value(s) ({nan} NaN, {inf} Inf; \
         a stats-only summary records no index): a non-finite reference is an input error \
         (check the model's weights and the audio), not something to compare against",
        .nan + .inf
    )]
    NonFiniteReferenceStats {
        /// Checkpoint id `name@stepK`.
        checkpoint: String,
        /// NaN count.
        nan: usize,
        /// Inf count.
        inf: usize,
    },
    /// A checkpoint's summary statistics cannot be those of any tensor (`Stats::check`).
    #[error("{dump}: checkpoint {checkpoint}: inconsistent statistics: {reason}")]
    InconsistentStats {
        /// The dump directory.
        dump: String,
        /// Checkpoint id `name@stepK`.
        checkpoint: String,
        /// The first violation.
        reason: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// File path.
        path: String,
        /// Underlying error.
        source: std::io::Error,
    },
    /// A JSON document does not parse into the expected type.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        /// File path (or `<string>`).
        path: String,
        /// Underlying error.
        source: serde_json::Error,
    },
    /// A policy glob does not compile.
    #[error("invalid glob {glob:?} in policy rule {rule}: {source}")]
    Glob {
        /// Rule index (0-based).
        rule: usize,
        /// The glob text.
        glob: String,
        /// Underlying error.
        source: globset::Error,
    },
    /// A policy value is outside its domain.
    #[error("invalid policy: {0}")]
    Policy(String),
    /// Two graph nodes share a name and step.
    #[error("duplicate checkpoint {}", xray_core::key(.name, *.step))]
    DuplicateNode {
        /// Checkpoint name.
        name: String,
        /// Step.
        step: Step,
    },
    /// An input refers to a checkpoint that is not in the graph.
    #[error("{node}: input {input} is not a checkpoint of the graph")]
    DanglingInput {
        /// Consumer id (`name@stepK`).
        node: String,
        /// Missing input id.
        input: String,
    },
    /// An input lies at a later step than its consumer.
    #[error("{node}: input {input} is at a later step")]
    ForwardInStep {
        /// Consumer id.
        node: String,
        /// Input id.
        input: String,
    },
    /// The same-step edges contain a cycle.
    #[error("cycle among checkpoints at step {step}, involving {node}")]
    Cycle {
        /// Step of the cycle.
        step: Step,
        /// One node on or after the cycle.
        node: String,
    },
    /// A contract template could not be expanded.
    #[error("template {template:?}: {reason}")]
    Template {
        /// The template text.
        template: String,
        /// Why.
        reason: String,
    },
    /// A per-node slice has the wrong length.
    #[error("expected {expected} per-node entries, got {found}")]
    Length {
        /// Node count.
        expected: usize,
        /// Slice length.
        found: usize,
    },
    /// An evidence document has an unsupported schema identifier.
    #[error("{path}: schema {found:?}, expected {expected:?}")]
    Schema {
        /// File path.
        path: String,
        /// Schema found.
        found: String,
        /// Schema expected.
        expected: String,
    },
    /// `gate` was given evidence and a baseline that describe different runs.
    #[error("the evidence and the baseline describe different runs: {}{}", .differences.join("; "), if *.overridable { " (pass --allow-different-input to gate them anyway)" } else { "" })]
    IdentityMismatch {
        /// One line per differing fact (family, contract, weights, audio).
        differences: Vec<String>,
        /// Whether `--allow-different-input` may override it (false for family and contract).
        overridable: bool,
    },
    /// A checkpoint the dump under test holds is absent from the reference dump: the reference
    /// must cover what is compared.
    #[error("{checkpoint}: {note}; the reference must cover what is compared (re-make it with the same steps and checkpoints)")]
    NotInReference {
        /// `name@stepK`.
        checkpoint: String,
        /// Which dump lacks it.
        note: String,
    },
    /// No checkpoint of the contract was observed in both dumps.
    #[error(
        "nothing to compare: none of the contract's checkpoints is in both {reference} and {got}"
    )]
    NothingObserved {
        /// Reference dump directory.
        reference: String,
        /// Dump under test.
        got: String,
    },
    /// A dump's manifest is inconsistent with what is compared (e.g. an unknown `extra.fed` key).
    #[error("{dump}: {reason}")]
    Manifest {
        /// Dump directory.
        dump: String,
        /// What is wrong.
        reason: String,
    },
    /// A document X-Ray reads (evidence, a corpus summary) contradicts itself or what it points
    /// to (a verdict its checkpoints do not support, a summary row without its evidence), or a
    /// gate has nothing to compare: refused, never read as a pass.
    #[error("{path}: {reason}")]
    Invalid {
        /// File or directory path.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// Result alias of the harness library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Reads a text file: `(its path as displayed, its text)`, `Error::Io` naming it when it cannot
/// be read.
pub(crate) fn read_text(path: &std::path::Path) -> Result<(String, String)> {
    let p = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => Ok((p, text)),
        Err(source) => Err(Error::Io { path: p, source }),
    }
}
