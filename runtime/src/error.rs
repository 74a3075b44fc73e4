//! The runtime's one error type. Every variant names the fact that was missing or wrong:
//! the edge, the HF key and file, the checkpoint, the path.

use std::path::PathBuf;

/// Errors of the X-Ray runtime. Structured fields, never a bare string where a name is known.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A core error (file, dump, contract).
    #[error(transparent)]
    Core(#[from] xray_core::CoreError),
    /// A layout disagreement on an edge with no declared transform between the endpoints.
    #[error("layout mismatch on edge '{edge}': {producer} -> {consumer}: no physical-layout route; declare a layout transform op between them")]
    LayoutMismatch {
        /// The edge name.
        edge: String,
        /// `op:port/layout` of the producer.
        producer: String,
        /// `op:port/layout` of the consumer.
        consumer: String,
    },
    /// A shape disagreement on an edge.
    #[error("shape mismatch on edge '{edge}': declared {declared}, {context} gives {found}")]
    ShapeMismatch {
        /// The edge name.
        edge: String,
        /// The declared shape.
        declared: String,
        /// What produced the other shape (op inference, a feed, a weight).
        context: String,
        /// The other shape.
        found: String,
    },
    /// A structural fault in the graph (unknown edge, two producers, unconsumed feed...).
    #[error("graph fault: {0}")]
    Graph(String),
    /// A weight that the graph needs and the table does not have.
    #[error("missing weight '{key}' (needed by op '{op}') in {file}")]
    MissingWeight {
        /// HF state-dict key.
        key: String,
        /// The op that needs it.
        op: String,
        /// The weights file.
        file: PathBuf,
    },
    /// A weight present with the wrong shape.
    #[error("weight '{key}' in {file} has shape {found:?}, op '{op}' expects {expected:?}")]
    WeightShape {
        /// HF state-dict key.
        key: String,
        /// The op that needs it.
        op: String,
        /// The weights file.
        file: PathBuf,
        /// Shape the op expects.
        expected: Vec<usize>,
        /// Shape in the file.
        found: Vec<usize>,
    },
    /// Weights in the file that no op uses (the candle embed_positions bug class).
    #[error("{count} unused weight(s) in {file}: {keys}")]
    UnusedWeights {
        /// The weights file.
        file: PathBuf,
        /// How many.
        count: usize,
        /// The first few keys.
        keys: String,
    },
    /// A file could not be read or parsed.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A config value that is missing or inconsistent.
    #[error("config {path}: {reason}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is missing or inconsistent.
        reason: String,
    },
    /// Bad audio input.
    #[error("audio {path}: {reason}")]
    Audio {
        /// The audio file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A feed that the formula needs was not provided, or has the wrong shape.
    #[error("feed '{edge}': {reason}")]
    Feed {
        /// The fed edge.
        edge: String,
        /// What is wrong.
        reason: String,
    },
    /// A cache used while invalid (e.g. cross-attention K/V after new encoder memory).
    #[error("stale cache: {0}")]
    StaleCache(String),
    /// A checkpoint contract fault.
    #[error("contract {family}: {reason}")]
    Contract {
        /// The family whose contract is at fault.
        family: String,
        /// What is wrong.
        reason: String,
    },
    /// A kernel refused its inputs.
    #[error("op '{op}': {reason}")]
    Op {
        /// The op name.
        op: String,
        /// What is wrong.
        reason: String,
    },
    /// An unknown fault name or target.
    #[error("fault injection: {0}")]
    Fault(String),
}

/// Result alias for the runtime.
pub type Result<T> = std::result::Result<T, RuntimeError>;

impl RuntimeError {
    /// A file error from an io::Error.
    pub fn io(path: impl Into<PathBuf>, e: std::io::Error) -> Self {
        RuntimeError::File {
            path: path.into(),
            reason: e.to_string(),
        }
    }
}
