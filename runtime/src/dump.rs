//! The dump format `xray.dump` v1 (docs/dump-format.md): a directory with `manifest.json` and one
//! `.npy` per (checkpoint, step). Written atomically (temp dir + rename); loading verifies every
//! hash, dtype, shape and payload length and refuses anything else with an error naming the file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Result, RuntimeError};
use crate::graph::{Layout, Tensor};

/// Schema name in every manifest.
pub const SCHEMA: &str = "xray.dump";
/// Schema version.
pub const VERSION: u32 = 1;

/// Per-checkpoint summary statistics (stats-only dumps, and evidence).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Element count.
    pub count: usize,
    /// Minimum over finite values.
    pub min: f64,
    /// Maximum over finite values.
    pub max: f64,
    /// Mean over finite values.
    pub mean: f64,
    /// Root mean square over finite values.
    pub rms: f64,
    /// NaN count.
    pub nan: usize,
    /// ±Inf count.
    pub inf: usize,
}

impl Stats {
    /// Statistics of a slice.
    pub fn of(data: &[f32]) -> Stats {
        let (mut mn, mut mx, mut s, mut s2, mut nan, mut inf, mut n) = (
            f64::INFINITY,
            f64::NEG_INFINITY,
            0f64,
            0f64,
            0usize,
            0usize,
            0usize,
        );
        for &v in data {
            if v.is_nan() {
                nan += 1;
            } else if v.is_infinite() {
                inf += 1;
            } else {
                let v = v as f64;
                mn = mn.min(v);
                mx = mx.max(v);
                s += v;
                s2 += v * v;
                n += 1;
            }
        }
        let nf = n.max(1) as f64;
        Stats {
            count: data.len(),
            min: if n > 0 { mn } else { 0.0 },
            max: if n > 0 { mx } else { 0.0 },
            mean: s / nf,
            rms: (s2 / nf).sqrt(),
            nan,
            inf,
        }
    }
}

/// sha256 of a tensor's raw little-endian f32 bytes in C order.
pub fn content_sha256(data: &[f32]) -> String {
    let mut h = Sha256::new();
    for chunk in data.chunks(16384) {
        let mut buf = Vec::with_capacity(chunk.len() * 4);
        for v in chunk {
            buf.extend_from_slice(&v.to_le_bytes());
        }
        h.update(&buf);
    }
    hex::encode(h.finalize())
}

/// One manifest entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    /// Canonical checkpoint name.
    pub name: String,
    /// Decode step.
    pub step: usize,
    /// Shape as stored.
    pub shape: Vec<usize>,
    /// `f32` (or `f64`, `f16`).
    pub dtype: String,
    /// Layout as stored.
    pub layout: Layout,
    /// The `.npy` file (absent in stats-only dumps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// sha256 of the `.npy` file bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Summary statistics (stats-only dumps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
    /// sha256 of the raw f32 payload (stats-only dumps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_sha256: Option<String>,
}

/// `manifest.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `xray.dump`.
    pub schema: String,
    /// Always 1.
    pub version: u32,
    /// Model family.
    pub family: String,
    /// Model directory or id.
    pub model_id: String,
    /// `oracle`, `runtime`, or another engine's name.
    pub producer: String,
    /// sha256 of the weights file.
    pub weights_sha256: String,
    /// sha256 of the input audio file.
    pub audio_sha256: String,
    /// Tool versions.
    #[serde(default)]
    pub tools: BTreeMap<String, String>,
    /// Decoder token sequence (or final token ids).
    #[serde(default)]
    pub tokens: Vec<i64>,
    /// Decoded text.
    #[serde(default)]
    pub transcript: String,
    /// True when entries carry stats instead of files.
    #[serde(default)]
    pub stats_only: bool,
    /// Checkpoints.
    pub checkpoints: Vec<Entry>,
    /// Family-specific extras (e.g. the granite CTC hypothesis).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// A loaded dump.
#[derive(Debug, Clone)]
pub struct Dump {
    /// Directory.
    pub dir: PathBuf,
    /// Manifest.
    pub manifest: Manifest,
    /// Tensors by (name, step); empty for stats-only dumps.
    pub tensors: BTreeMap<(String, usize), Tensor>,
}

fn derr(path: &Path, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Dump {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Encode an f32 tensor as `.npy` v1.0 bytes.
pub fn npy_bytes(t: &Tensor) -> Vec<u8> {
    let shape = t.shape();
    let shape_s = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_s}, }}");
    let total = 10 + header.len() + 1;
    let pad = (64 - total % 64) % 64;
    header.push_str(&" ".repeat(pad));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + t.len() * 4);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    let std = t.as_standard_layout();
    for v in std.iter() {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// Decode `.npy` bytes (v1/v2/v3; `<f4`, `<f8`, `<f2`, `<i8`, `<i4`; C order) into f32.
pub fn parse_npy(path: &Path, bytes: &[u8]) -> Result<(Tensor, String)> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(derr(path, "not a .npy file (bad magic)"));
    }
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(derr(path, format!("unsupported .npy version {v}"))),
    };
    let header = bytes
        .get(start..start + hlen)
        .ok_or_else(|| derr(path, "truncated .npy header"))?;
    let header = std::str::from_utf8(header).map_err(|_| derr(path, "non-UTF-8 .npy header"))?;
    let field = |key: &str| -> Option<&str> {
        let i = header.find(&format!("'{key}'"))?;
        let rest = header[i + key.len() + 2..]
            .trim_start()
            .strip_prefix(':')?
            .trim_start();
        Some(rest)
    };
    let descr = field("descr")
        .and_then(|r| r.strip_prefix('\''))
        .and_then(|r| r.split('\'').next())
        .ok_or_else(|| derr(path, "no 'descr' in .npy header"))?;
    if field("fortran_order").is_some_and(|r| r.starts_with("True")) {
        return Err(derr(
            path,
            "fortran_order .npy files are not supported; save C-contiguous",
        ));
    }
    let shape_s = field("shape")
        .and_then(|r| r.strip_prefix('('))
        .and_then(|r| r.split(')').next())
        .ok_or_else(|| derr(path, "no 'shape' in .npy header"))?;
    let shape: Vec<usize> = shape_s
        .split(',')
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| derr(path, format!("bad shape '({shape_s})' in .npy header")))?;
    let n: usize = shape.iter().product();
    let payload = &bytes[start + hlen..];
    let (item, dtype) = match descr {
        "<f4" => (4, "f32"),
        "<f8" => (8, "f64"),
        "<f2" => (2, "f16"),
        "<i8" => (8, "i64"),
        "<i4" => (4, "i32"),
        d => return Err(derr(path, format!("unsupported dtype '{d}'"))),
    };
    if payload.len() != n * item {
        return Err(derr(
            path,
            format!("payload is {} bytes, shape {shape:?} of {dtype} needs {} (truncated or padded file)", payload.len(), n * item),
        ));
    }
    let vals: Vec<f32> = match dtype {
        "f32" => payload
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        "f64" => payload
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
            .collect(),
        "f16" => payload
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        "i64" => payload
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
            .collect(),
        _ => payload
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
            .collect(),
    };
    let t = ArrayD::from_shape_vec(IxDyn(&shape), vals).map_err(|e| derr(path, e.to_string()))?;
    Ok((t, dtype.to_string()))
}

/// File name of a checkpoint at a step.
pub fn file_name(name: &str, step: usize) -> String {
    format!("{name}@step{step}.npy")
}

/// Accumulates checkpoints and writes a dump directory atomically.
#[derive(Debug)]
pub struct DumpWriter {
    /// The manifest being built (entries are appended by [`DumpWriter::add`]).
    pub manifest: Manifest,
    files: Vec<(String, Vec<u8>)>,
}

impl DumpWriter {
    /// Start a dump. `stats_only` keeps statistics and a content hash instead of tensors.
    pub fn new(manifest: Manifest) -> DumpWriter {
        DumpWriter {
            manifest,
            files: Vec::new(),
        }
    }

    /// Add one checkpoint tensor.
    pub fn add(&mut self, name: &str, step: usize, layout: Layout, t: &Tensor) {
        let data = t.as_standard_layout();
        let slice = data.as_slice().unwrap_or(&[]);
        if self.manifest.stats_only {
            self.manifest.checkpoints.push(Entry {
                name: name.to_string(),
                step,
                shape: t.shape().to_vec(),
                dtype: "f32".into(),
                layout,
                file: None,
                sha256: None,
                stats: Some(Stats::of(slice)),
                content_sha256: Some(content_sha256(slice)),
            });
            return;
        }
        let bytes = npy_bytes(t);
        let file = file_name(name, step);
        self.manifest.checkpoints.push(Entry {
            name: name.to_string(),
            step,
            shape: t.shape().to_vec(),
            dtype: "f32".into(),
            layout,
            file: Some(file.clone()),
            sha256: Some(hex::encode(Sha256::digest(&bytes))),
            stats: None,
            content_sha256: None,
        });
        self.files.push((file, bytes));
    }

    /// Write everything into `dir` atomically: a temp sibling directory, then rename. An existing
    /// `dir` is replaced only after the new one is complete.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let parent = dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(|e| RuntimeError::io(parent, e))?;
        let base = dir.file_name().and_then(|n| n.to_str()).unwrap_or("dump");
        let tmp = parent.join(format!(".{base}.tmp-{}", std::process::id()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| RuntimeError::io(&tmp, e))?;
        }
        std::fs::create_dir_all(&tmp).map_err(|e| RuntimeError::io(&tmp, e))?;
        let result = (|| -> Result<()> {
            for (f, bytes) in &self.files {
                let p = tmp.join(f);
                let mut fh = std::fs::File::create(&p).map_err(|e| RuntimeError::io(&p, e))?;
                fh.write_all(bytes).map_err(|e| RuntimeError::io(&p, e))?;
                fh.sync_all().map_err(|e| RuntimeError::io(&p, e))?;
            }
            let mp = tmp.join("manifest.json");
            let text = serde_json::to_string_pretty(&self.manifest)
                .map_err(|e| derr(&mp, e.to_string()))?;
            std::fs::write(&mp, text + "\n").map_err(|e| RuntimeError::io(&mp, e))?;
            if dir.exists() {
                let old = parent.join(format!(".{base}.old-{}", std::process::id()));
                std::fs::rename(dir, &old).map_err(|e| RuntimeError::io(dir, e))?;
                std::fs::rename(&tmp, dir).map_err(|e| RuntimeError::io(dir, e))?;
                std::fs::remove_dir_all(&old).map_err(|e| RuntimeError::io(&old, e))?;
            } else {
                std::fs::rename(&tmp, dir).map_err(|e| RuntimeError::io(dir, e))?;
            }
            Ok(())
        })();
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        result
    }
}

impl Dump {
    /// An in-memory dump of captured tensors (not written anywhere).
    pub fn from_captured(mut manifest: Manifest, captured: Vec<crate::capture::Captured>) -> Dump {
        let mut tensors = BTreeMap::new();
        manifest.checkpoints.clear();
        for c in captured {
            manifest.checkpoints.push(Entry {
                name: c.name.clone(),
                step: c.step,
                shape: c.data.shape().to_vec(),
                dtype: "f32".into(),
                layout: c.layout,
                file: None,
                sha256: None,
                stats: None,
                content_sha256: None,
            });
            tensors.insert((c.name, c.step), c.data);
        }
        Dump {
            dir: PathBuf::new(),
            manifest,
            tensors,
        }
    }

    /// A writer holding the same content (to save an in-memory dump).
    pub fn to_writer(&self) -> DumpWriter {
        let mut m = self.manifest.clone();
        m.checkpoints.clear();
        let mut w = DumpWriter::new(m);
        for e in &self.manifest.checkpoints {
            if let Some(t) = self.get(&e.name, e.step) {
                w.add(&e.name, e.step, e.layout, t);
            }
        }
        w
    }

    /// Load and verify a dump directory.
    pub fn load(dir: &Path) -> Result<Dump> {
        let mp = dir.join("manifest.json");
        let text = std::fs::read_to_string(&mp).map_err(|e| RuntimeError::io(&mp, e))?;
        let manifest: Manifest = serde_json::from_str(&text)
            .map_err(|e| derr(&mp, format!("manifest does not parse: {e}")))?;
        if manifest.schema != SCHEMA || manifest.version != VERSION {
            return Err(derr(
                &mp,
                format!(
                    "schema {} v{} (expected {SCHEMA} v{VERSION})",
                    manifest.schema, manifest.version
                ),
            ));
        }
        let mut tensors = BTreeMap::new();
        for e in &manifest.checkpoints {
            if tensors.contains_key(&(e.name.clone(), e.step)) {
                return Err(derr(&mp, format!("{}@step{} listed twice", e.name, e.step)));
            }
            if manifest.stats_only {
                if e.stats.is_none() || e.content_sha256.is_none() {
                    return Err(derr(
                        &mp,
                        format!(
                            "stats-only entry {}@step{} has no stats/content_sha256",
                            e.name, e.step
                        ),
                    ));
                }
                continue;
            }
            let file = e
                .file
                .as_ref()
                .ok_or_else(|| derr(&mp, format!("entry {}@step{} has no file", e.name, e.step)))?;
            if file.contains('/') || file.contains("..") {
                return Err(derr(
                    &mp,
                    format!("entry file '{file}' must be a plain file name"),
                ));
            }
            let p = dir.join(file);
            let bytes = std::fs::read(&p).map_err(|e| RuntimeError::io(&p, e))?;
            let got = hex::encode(Sha256::digest(&bytes));
            match &e.sha256 {
                Some(want) if *want == got => {}
                Some(want) => {
                    return Err(derr(&p, format!("sha256 mismatch: manifest says {want}, file is {got} (tampered or truncated)")))
                }
                None => return Err(derr(&p, "manifest entry has no sha256")),
            }
            let (t, dtype) = parse_npy(&p, &bytes)?;
            if t.shape() != e.shape.as_slice() {
                return Err(derr(
                    &p,
                    format!("shape {:?} in file, manifest says {:?}", t.shape(), e.shape),
                ));
            }
            if dtype != e.dtype {
                return Err(derr(
                    &p,
                    format!("dtype {dtype} in file, manifest says {}", e.dtype),
                ));
            }
            tensors.insert((e.name.clone(), e.step), t);
        }
        Ok(Dump {
            dir: dir.to_path_buf(),
            manifest,
            tensors,
        })
    }

    /// A tensor by name and step.
    pub fn get(&self, name: &str, step: usize) -> Option<&Tensor> {
        self.tensors.get(&(name.to_string(), step))
    }

    /// A manifest entry by name and step.
    pub fn entry(&self, name: &str, step: usize) -> Option<&Entry> {
        self.manifest
            .checkpoints
            .iter()
            .find(|e| e.name == name && e.step == step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            schema: SCHEMA.into(),
            version: VERSION,
            family: "whisper".into(),
            model_id: "m".into(),
            producer: "runtime".into(),
            weights_sha256: "w".into(),
            audio_sha256: "a".into(),
            tools: BTreeMap::new(),
            tokens: vec![1, 2],
            transcript: "hi".into(),
            stats_only: false,
            checkpoints: vec![],
            extra: BTreeMap::new(),
        }
    }

    #[test]
    fn roundtrip_and_tamper() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("dump");
        let mut w = DumpWriter::new(manifest());
        let t = ArrayD::from_shape_fn(IxDyn(&[3, 5]), |i| (i[0] * 5 + i[1]) as f32 * 0.25 - 1.0);
        w.add("a.b", 0, Layout::TokenMajor, &t);
        w.add("a.b", 1, Layout::TokenMajor, &t.mapv(|x| x * 2.0));
        w.write(&d).unwrap();
        let l = Dump::load(&d).unwrap();
        assert_eq!(l.get("a.b", 0).unwrap(), &t);
        // Bit-exact reload.
        let f = d.join(file_name("a.b", 1));
        let mut bytes = std::fs::read(&f).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&f, &bytes).unwrap();
        let e = Dump::load(&d).unwrap_err().to_string();
        assert!(
            e.contains("a.b@step1.npy") && e.contains("sha256 mismatch"),
            "{e}"
        );
        // Truncation with a matching (re-computed) hash is still refused by the payload check.
        bytes.truncate(bytes.len() - 4);
        std::fs::write(&f, &bytes).unwrap();
        let e = parse_npy(&f, &bytes).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
    }

    #[test]
    fn stats_only() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("s");
        let mut m = manifest();
        m.stats_only = true;
        let mut w = DumpWriter::new(m);
        let t = ArrayD::from_shape_vec(IxDyn(&[2]), vec![1.0f32, f32::NAN]).unwrap();
        w.add("x", 0, Layout::Plain, &t);
        w.write(&d).unwrap();
        let l = Dump::load(&d).unwrap();
        let s = l.entry("x", 0).unwrap().stats.clone().unwrap();
        assert_eq!((s.count, s.nan, s.max), (2, 1, 1.0));
        assert!(l.tensors.is_empty());
    }
}
