//! The weight table (state): HF safetensors loaded by state-dict name, f32/f16/bf16 on disk,
//! f32 in memory. The graph checks it with [`crate::graph::Graph::check_weights`].
//!
//! A table can also hold *exact f16 mirrors*: for a 2-D tensor whose every value is exactly
//! representable in IEEE half precision, the same values stored in 16 bits, in the block layout
//! the row-stable GEMV reads (`kernels::simd::pack_f16_rows`). Widening an f16 to f32 is exact,
//! so a kernel that reads the mirror and widens computes the same bits as from the f32 tensor
//! while reading half the memory (the memory-bound decode-step GEMVs). A tensor with even one
//! value that does not round-trip gets no mirror; replacing a tensor drops its mirror.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use safetensors::tensor::Metadata;
use safetensors::Dtype;
use sha2::{Digest, Sha256};

use crate::error::{Result, RuntimeError};
use crate::graph::Tensor;

/// The largest safetensors header accepted (the format's own limit, 100 MB).
const HEADER_MAX: u64 = 100_000_000;

/// A table of named f32 tensors loaded from one safetensors file.
#[derive(Debug, Clone)]
pub struct Weights {
    path: PathBuf,
    sha256: String,
    tensors: HashMap<String, Tensor>,
    /// Exact f16 mirrors (bit patterns) of some tensors, by key.
    f16: HashMap<String, Vec<u16>>,
}

impl Weights {
    /// Load a safetensors file. Truncated or corrupt files, and dtypes other than
    /// f32/f16/bf16, are errors naming the file (and the key).
    pub fn load(path: &Path) -> Result<Weights> {
        // One streaming pass: the header (parsed and validated by the safetensors crate's own
        // `Metadata`), then each tensor's bytes in file order into one reused buffer, converted
        // and hashed as they come. The peak is the f32 table plus the largest tensor's bytes,
        // not the file plus the table (a whisper-small fixture: 1.9 -> ~1.1 GB).
        let bad = |reason: String| RuntimeError::File {
            path: path.to_path_buf(),
            reason: format!("not a valid safetensors file (truncated or corrupt?): {reason}"),
        };
        let file = std::fs::File::open(path).map_err(|e| RuntimeError::io(path, e))?;
        let file_len = file
            .metadata()
            .map_err(|e| RuntimeError::io(path, e))?
            .len();
        // Unbuffered: every read is one whole piece (length, header, a tensor).
        let mut r = file;
        let mut sha = Sha256::new();
        let mut n8 = [0u8; 8];
        r.read_exact(&mut n8)
            .map_err(|e| bad(format!("header length: {e}")))?;
        sha.update(n8);
        let n = u64::from_le_bytes(n8);
        if n > HEADER_MAX || n + 8 > file_len {
            return Err(bad(format!("header of {n} bytes in a file of {file_len}")));
        }
        let mut header = vec![0u8; n as usize];
        r.read_exact(&mut header)
            .map_err(|e| bad(format!("header: {e}")))?;
        sha.update(&header);
        let meta: Metadata = serde_json::from_slice(&header).map_err(|e| bad(e.to_string()))?;
        if (meta.data_len() as u64).checked_add(8 + n) != Some(file_len) {
            return Err(bad(format!(
                "the header describes {} data bytes, the file holds {}",
                meta.data_len(),
                file_len - 8 - n
            )));
        }
        let mut tensors = HashMap::new();
        let mut buf = Vec::new();
        for name in meta.offset_keys() {
            let info = meta
                .info(&name)
                .ok_or_else(|| bad(format!("tensor '{name}' has no entry")))?;
            let (start, end) = info.data_offsets;
            buf.resize(end - start, 0);
            r.read_exact(&mut buf)
                .map_err(|e| bad(format!("tensor '{name}': {e}")))?;
            sha.update(&buf);
            let vals: Vec<f32> = match info.dtype {
                Dtype::F32 => buf
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                Dtype::F16 => buf
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                Dtype::BF16 => buf
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                other => {
                    return Err(RuntimeError::File {
                        path: path.to_path_buf(),
                        reason: format!(
                        "tensor '{name}' has dtype {other:?}; only F32, F16 and BF16 are supported"
                    ),
                    })
                }
            };
            let t = ArrayD::from_shape_vec(IxDyn(&info.shape), vals).map_err(|e| {
                RuntimeError::File {
                    path: path.to_path_buf(),
                    reason: format!("tensor '{name}': {e}"),
                }
            })?;
            tensors.insert(name, t);
        }
        Ok(Weights {
            path: path.to_path_buf(),
            sha256: hex::encode(sha.finalize()),
            tensors,
            f16: HashMap::new(),
        })
    }

    /// A table built in memory (tests, synthetic graphs).
    pub fn from_map(path: &str, tensors: HashMap<String, Tensor>) -> Weights {
        Weights {
            path: PathBuf::from(path),
            sha256: String::new(),
            tensors,
            f16: HashMap::new(),
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

    /// How many distinct layers `PREFIX{N}.*` the table holds (e.g. `model.encoder.layers.`):
    /// checked against the config's layer count before a graph is built from it.
    pub fn layer_count(&self, prefix: &str) -> usize {
        self.keys()
            .filter_map(|k| {
                k.strip_prefix(prefix)?
                    .split('.')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    }

    /// All keys.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|k| k.as_str())
    }

    /// Replace or add a tensor (what-if experiments: copy the table, not the graph). Drops the
    /// tensor's f16 mirror, if it had one (call [`Weights::mirror_f16`] again to rebuild it).
    pub fn insert(&mut self, key: &str, t: Tensor) {
        self.f16.remove(key);
        self.tensors.insert(key.to_string(), t);
    }

    /// Build exact f16 mirrors for `keys` (unknown keys are skipped: the graph's weight check
    /// reports those). A tensor gets a mirror only when it is 2-D and every value is finite and
    /// widens back to the same f32 bits (no NaN, no infinity, nothing outside f16's range or
    /// precision). Returns how many of the keys have a mirror afterwards.
    pub fn mirror_f16<'a>(&mut self, keys: impl IntoIterator<Item = &'a str>) -> usize {
        let mut n = 0;
        for key in keys {
            if self.f16.contains_key(key) {
                n += 1;
                continue;
            }
            let Some(t) = self.tensors.get(key) else {
                continue;
            };
            let &[rows, cols] = t.shape() else {
                continue;
            };
            if let Some(m) = exact_f16(t.iter().copied()) {
                let packed = crate::kernels::simd::pack_f16_rows(&m, rows, cols);
                self.f16.insert(key.to_string(), packed);
                n += 1;
            }
        }
        n
    }

    /// The exact f16 mirror of a 2-D tensor, in the row-stable GEMV's block layout
    /// (`kernels::simd::pack_f16_rows`), if one was built.
    pub fn f16(&self, key: &str) -> Option<&[u16]> {
        self.f16.get(key).map(|v| v.as_slice())
    }

    /// This table without any f16 mirror (the plain f32 path everywhere).
    pub fn without_f16_mirrors(mut self) -> Weights {
        self.f16.clear();
        self
    }
}

/// The f16 bit patterns of `vals` when every value is finite and round-trips exactly, else
/// `None` (a weight with a NaN or an infinity keeps the plain f32 path).
fn exact_f16(vals: impl Iterator<Item = f32>) -> Option<Vec<u16>> {
    let (lo, _) = vals.size_hint();
    let mut out = Vec::with_capacity(lo);
    for v in vals {
        let h = half::f16::from_f32(v);
        if !v.is_finite() || h.to_f32().to_bits() != v.to_bits() {
            return None;
        }
        out.push(h.to_bits());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row: the block layout keeps it in order.
    fn table(vals: Vec<f32>) -> Weights {
        let n = vals.len();
        let t = ArrayD::from_shape_vec(IxDyn(&[1, n]), vals).unwrap();
        Weights::from_map("mem", [("w".to_string(), t)].into_iter().collect())
    }

    #[test]
    fn mirror_only_when_exact() {
        let mut w = table(vec![0.5, -0.0, 65504.0, 1.0 / 16_777_216.0, -3.25]);
        assert_eq!(w.mirror_f16(["w", "missing"]), 1);
        let m = w.f16("w").unwrap();
        for (h, v) in m.iter().zip(w.get("w").unwrap().iter()) {
            assert_eq!(half::f16::from_bits(*h).to_f32().to_bits(), v.to_bits());
        }
        // 0.1 is not an f16; 1e5 overflows; NaN and infinities never mirror.
        for bad in [0.1f32, 1.0e5, f32::NAN, f32::INFINITY] {
            let mut w = table(vec![0.5, bad]);
            assert_eq!(w.mirror_f16(["w"]), 0, "{bad}");
            assert!(w.f16("w").is_none());
        }
    }

    #[test]
    fn insert_drops_the_mirror() {
        let mut w = table(vec![0.5, 1.5]);
        w.mirror_f16(["w"]);
        assert!(w.f16("w").is_some());
        w.insert(
            "w",
            ArrayD::from_shape_vec(IxDyn(&[1, 2]), vec![0.25, 0.75]).unwrap(),
        );
        assert!(w.f16("w").is_none());
        assert_eq!(w.mirror_f16(["w"]), 1);
        assert!(w.without_f16_mirrors().f16("w").is_none());
        // Only matrices are mirrored (biases and norms are read in f32).
        let mut v = table(vec![]);
        v.insert(
            "b",
            ArrayD::from_shape_vec(IxDyn(&[2]), vec![0.25, 0.75]).unwrap(),
        );
        assert_eq!(v.mirror_f16(["b"]), 0);
    }
}
