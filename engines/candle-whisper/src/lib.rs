//! candle-transformers' Whisper, unpatched, under X-Ray: an engine this project did not write,
//! instrumented the way a runtime team would instrument theirs (docs/bring-your-own-engine.md).
//!
//! - [`inputs`]: the model directory, configs and WAV, validated before any work;
//! - [`melbank`]: the checkpoint's HF mel filter bank, computed as transformers does;
//! - [`engine`]: candle's own pipeline (log-mel, encoder, decoder with its cross-attention cache,
//!   greedy decoding with HF's suppression), with reference tensors fed in for isolation;
//! - [`emit`]: the only X-Ray-facing code: contract names, manifest, dump.

#![forbid(unsafe_code)]

pub mod emit;
pub mod engine;
pub mod inputs;
pub mod melbank;

/// Everything that can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input (model directory, configs, audio, reference dump, options): exit 2.
    #[error("{0}")]
    Input(String),
    /// candle failed (one line: the backtrace candle captures under `RUST_BACKTRACE` is dropped).
    #[error("candle: {}", candle_message(.0))]
    Candle(#[from] candle_core::Error),
    /// Anything else in the run (writing the dump, an unexpected tensor).
    #[error("{0}")]
    Engine(String),
}

/// candle's error without the backtraces it carries, on one line.
fn candle_message(e: &candle_core::Error) -> String {
    fn text(e: &candle_core::Error) -> String {
        match e {
            candle_core::Error::WithBacktrace { inner, .. } => text(inner),
            candle_core::Error::Context { inner, context } => format!("{context}: {}", text(inner)),
            candle_core::Error::WithPath { inner, path } => {
                format!("{}: {}", path.display(), text(inner))
            }
            other => other.to_string(),
        }
    }
    text(e).split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Error {
    /// Process exit code: 2 for input errors, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Input(_) => 2,
            _ => 1,
        }
    }
}
