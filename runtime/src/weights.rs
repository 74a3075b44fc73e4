//! The weight table (state): HF safetensors loaded by state-dict name, f32/f16/bf16 on disk,
//! f32 in memory. The graph checks it with [`crate::graph::Graph::check_weights`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use safetensors::{Dtype, SafeTensors};
use sha2::{Digest, Sha256};

use crate::error::{Result, RuntimeError};
use crate::graph::Tensor;

/// A table of named f32 tensors loaded from one safetensors file.
#[derive(Debug, Clone)]
pub struct Weights {
    path: PathBuf,
    sha256: String,
    tensors: HashMap<String, Tensor>,
}

impl Weights {
    /// Load a safetensors file. Truncated or corrupt files, and dtypes other than
    /// f32/f16/bf16, are errors naming the file (and the key).
    pub fn load(path: &Path) -> Result<Weights> {
        let bytes = std::fs::read(path).map_err(|e| RuntimeError::io(path, e))?;
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let st = SafeTensors::deserialize(&bytes).map_err(|e| RuntimeError::File {
            path: path.to_path_buf(),
            reason: format!("not a valid safetensors file (truncated or corrupt?): {e}"),
        })?;
        let mut tensors = HashMap::new();
        for (name, view) in st.tensors() {
            let shape = view.shape().to_vec();
            let data = view.data();
            let vals: Vec<f32> = match view.dtype() {
                Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                Dtype::F16 => data
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                Dtype::BF16 => data
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                other => return Err(RuntimeError::File {
                    path: path.to_path_buf(),
                    reason: format!(
                        "tensor '{name}' has dtype {other:?}; only F32, F16, BF16 (and integer buffers) are supported"
                    ),
                }),
            };
            let t =
                ArrayD::from_shape_vec(IxDyn(&shape), vals).map_err(|e| RuntimeError::File {
                    path: path.to_path_buf(),
                    reason: format!("tensor '{name}': {e}"),
                })?;
            tensors.insert(name, t);
        }
        Ok(Weights {
            path: path.to_path_buf(),
            sha256,
            tensors,
        })
    }

    /// A table built in memory (tests, synthetic graphs).
    pub fn from_map(path: &str, tensors: HashMap<String, Tensor>) -> Weights {
        Weights {
            path: PathBuf::from(path),
            sha256: String::new(),
            tensors,
        }
    }

    /// The file this table came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// sha256 of the file bytes.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// A tensor by HF key.
    pub fn get(&self, key: &str) -> Option<&Tensor> {
        self.tensors.get(key)
    }

    /// A tensor by HF key, or an error naming the key and the file.
    pub fn require(&self, key: &str, op: &str) -> Result<&Tensor> {
        self.get(key).ok_or_else(|| RuntimeError::MissingWeight {
            key: key.to_string(),
            op: op.to_string(),
            file: self.path.clone(),
        })
    }

    /// All keys.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|k| k.as_str())
    }

    /// Replace or add a tensor (what-if experiments: copy the table, not the graph).
    pub fn insert(&mut self, key: &str, t: Tensor) {
        self.tensors.insert(key.to_string(), t);
    }
}
