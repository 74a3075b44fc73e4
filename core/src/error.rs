//! The core crate's error type.

use std::path::PathBuf;

/// Errors of the core crate: files, dumps and contracts, each naming what it is about.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// A file could not be read or written.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A checkpoint contract could not be parsed or resolved.
    #[error("contract {family}: {reason}")]
    Contract {
        /// Family.
        family: String,
        /// Why.
        reason: String,
    },
    /// A dump is malformed, or cannot be written where asked.
    #[error("dump {path}: {reason}")]
    Dump {
        /// The dump directory or file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl CoreError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, e: std::io::Error) -> Self {
        CoreError::File {
            path: path.into(),
            reason: e.to_string(),
        }
    }
}

/// Result alias of the core crate.
pub type Result<T> = std::result::Result<T, CoreError>;
