//! The dump format `xray.dump` v1 (docs/dump-format.md): a directory with `manifest.json` and one
//! `.npy` per (checkpoint, step). Written atomically (temp dir + rename); loading verifies every
//! hash, dtype, shape and payload length and refuses anything else with an error naming the file.

use crate::Step;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use ndarray_npy::npy::header::Header;
use ndarray_npy::{ReadDataError, ReadableElement};
use py_literal::Value as PyValue;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{CoreError, Result};
use crate::{Layout, Tensor};

/// Schema name in every manifest.
pub const SCHEMA: &str = "xray.dump";
/// Schema version.
pub const VERSION: u32 = 1;

/// Number of signed projections in [`Stats::sketch`].
pub const SKETCH_LEN: usize = 32;
/// The manifest's `extra` key under which an engine declares the ops it computed below f32: a
/// list of `{"op", "dtype", "why", ...}` (docs/dump-format.md, "Declared precision").
pub const PRECISION_KEY: &str = "precision";

/// The 64 pseudo-random sign bits of flat element `i` (splitmix64 of `i`): bit `k` is the sign of
/// element `i` in sketch projection `k` (1 = minus). The Python writer
/// (`oracle/xray_oracle/dump.py`) computes the same bits.
pub fn sketch_bits(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Per-checkpoint summary statistics (stats-only dumps, and evidence).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Element count.
    pub count: usize,
    /// Minimum over finite values (0 when there is none).
    pub min: f64,
    /// Maximum over finite values (0 when there is none).
    pub max: f64,
    /// Mean over finite values (0 when there is none).
    pub mean: f64,
    /// Root mean square over finite values (0 when there is none).
    pub rms: f64,
    /// NaN count.
    pub nan: usize,
    /// ±Inf count.
    pub inf: usize,
    /// Order-sensitive summary: [`SKETCH_LEN`] random-sign projections of the C-order content,
    /// `sketch[k] = sum_i s_k(i) * x_i / sqrt(count)` over finite `x_i`, with `s_k(i) = -1` when
    /// bit `k` of [`sketch_bits`]`(i)` is set, else `+1`. For two tensors `x`, `y` of the same
    /// shape, `mean_k (sketch_k(x) - sketch_k(y))^2` is an unbiased estimate of
    /// `||x - y||^2 / count`, so a permutation, shift or transposition shows as a large
    /// difference while f32 rounding noise stays at its own size (docs/dump-format.md).
    /// Absent only in dumps from older writers, which stats-only comparison refuses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sketch: Option<Vec<f64>>,
}

impl Stats {
    /// Statistics of a slice (C order).
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
        let mut acc = [0f64; SKETCH_LEN];
        for (i, &v) in data.iter().enumerate() {
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
                let bits = sketch_bits(i as u64);
                for (k, a) in acc.iter_mut().enumerate() {
                    *a += if (bits >> k) & 1 == 1 { -v } else { v };
                }
            }
        }
        let nf = n.max(1) as f64;
        let norm = (data.len().max(1) as f64).sqrt();
        Stats {
            count: data.len(),
            min: if n > 0 { mn } else { 0.0 },
            max: if n > 0 { mx } else { 0.0 },
            mean: s / nf,
            rms: (s2 / nf).sqrt(),
            nan,
            inf,
            sketch: Some(acc.iter().map(|a| a / norm).collect()),
        }
    }
}

impl Stats {
    /// Whether these statistics can be the summary of some tensor of `count` values, as
    /// [`Stats::of`] computes them: NaN and Inf counts within `count`; every moment finite;
    /// with finite values, `min <= mean <= max`, `|mean| <= rms <= max(|min|, |max|)` and each
    /// sketch element within `finite * rms / sqrt(count)` (Cauchy-Schwarz); with none, every
    /// moment and sketch element 0. Bounds carry a relative slack of 1e-6 of `max(|min|,
    /// |max|)` for the f64 rounding of the sums. The reason names the first violation.
    pub fn check(&self) -> std::result::Result<(), String> {
        let bad = self
            .nan
            .checked_add(self.inf)
            .filter(|&b| b <= self.count)
            .ok_or_else(|| {
                format!(
                    "{} NaN + {} Inf values in a count of {}",
                    self.nan, self.inf, self.count
                )
            })?;
        let finite = self.count - bad;
        for (what, v) in [
            ("min", self.min),
            ("max", self.max),
            ("mean", self.mean),
            ("rms", self.rms),
        ] {
            if !v.is_finite() {
                return Err(format!("{what} is {v}"));
            }
        }
        let sketch = self.sketch.as_deref().unwrap_or(&[]);
        if let Some(k) = sketch.iter().find(|k| !k.is_finite()) {
            return Err(format!("a sketch element is {k}"));
        }
        if finite == 0 {
            if [self.min, self.max, self.mean, self.rms]
                .iter()
                .any(|&v| v != 0.0)
                || sketch.iter().any(|&k| k != 0.0)
            {
                return Err(format!(
                    "no finite value (count {}, {} NaN, {} Inf) but min {}, max {}, mean {}, rms {} or a sketch element is not 0",
                    self.count, self.nan, self.inf, self.min, self.max, self.mean, self.rms
                ));
            }
            return Ok(());
        }
        let abs_max = self.min.abs().max(self.max.abs());
        let slack = 1e-6 * abs_max;
        let fail = |what: String| Err(what);
        if self.min > self.max {
            return fail(format!("min {} > max {}", self.min, self.max));
        }
        if self.mean < self.min - slack || self.mean > self.max + slack {
            return fail(format!(
                "mean {} outside [min {}, max {}]",
                self.mean, self.min, self.max
            ));
        }
        if self.rms < self.mean.abs() - slack {
            return fail(format!("rms {} < |mean| {}", self.rms, self.mean.abs()));
        }
        if self.rms > abs_max + slack {
            return fail(format!("rms {} > max(|min|, |max|) {abs_max}", self.rms));
        }
        let limit = finite as f64 * self.rms / (self.count as f64).sqrt();
        if let Some(k) = sketch
            .iter()
            .find(|k| k.abs() > limit * (1.0 + 1e-6) + slack)
        {
            return fail(format!(
                "sketch element {k} above {limit} (finite values x rms / sqrt(count))"
            ));
        }
        Ok(())
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
    pub step: Step,
    /// Shape as stored.
    pub shape: Vec<usize>,
    /// Element type as stored (`f32`, `f64`, `f16`, `i64`, `i32`).
    pub dtype: Dtype,
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
    /// Which positions of the step the `tokens` axis holds (absent: every position, the
    /// contract's shape). `last`: only the step's last position, as engines that return the
    /// last row's logits write step 0; compared against the reference's last row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_positions: Option<TokenPositions>,
    /// Logits after the engine's logits processors (absent: raw `proj_out` outputs, what the
    /// reference dumps). `suppression`: the generation config's suppressed ids are set to a huge
    /// negative value; compared outside those ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logits_processed: Option<LogitsProcessed>,
}

/// [`Entry::token_positions`]: the positions a checkpoint's `tokens` axis holds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TokenPositions {
    /// Only the step's last position (one row).
    Last,
}

/// [`Entry::logits_processed`]: how an engine's logits differ from the raw `proj_out` output by
/// construction.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LogitsProcessed {
    /// The generation config's `suppress_tokens` (every step) and `begin_suppress_tokens` (the
    /// first generated position, step 0) are set to a huge negative value (or -inf).
    Suppression,
}

impl TokenPositions {
    /// The manifest spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenPositions::Last => "last",
        }
    }
}

impl LogitsProcessed {
    /// The manifest spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LogitsProcessed::Suppression => "suppression",
        }
    }
}

/// [`Manifest::engine_weights`]: the engine's own weights file, for an engine that computes from a
/// converted copy of the HF weights (CTranslate2's `model.bin`, a ggml or ONNX file). The
/// manifest's `weights_sha256` stays the identity of the HF weights it corresponds to (converted
/// from or into), the one every identity check compares.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EngineWeights {
    /// The engine's weights format (`ctranslate2`, `ggml`, `onnx`, ...).
    pub format: String,
    /// sha256 of the engine's weights file bytes.
    pub sha256: String,
    /// The file's name (or path) as the engine read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The HF model (directory or id) whose weights `weights_sha256` identifies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// How the two files relate (the converter and what it changes), free-form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversion: Option<String>,
    /// The engine's own model config (e.g. CTranslate2's config.json), kept apart from
    /// `extra.config`, which is always the HF config.json.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
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
    /// sha256 of the HF weights (the single `.safetensors` file, or the sorted shards' list);
    /// for an engine on converted weights, of the HF weights they were converted from or into
    /// (its own file is in `engine_weights`).
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
    /// The engine's own weights file when it computes from converted weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_weights: Option<EngineWeights>,
}

impl Manifest {
    /// A manifest of this schema and version with nothing recorded yet: no checkpoints, tokens,
    /// tools or extras, empty identities (the writer's and tests' starting point).
    pub fn empty(family: &str, model_id: &str, producer: &str) -> Manifest {
        Manifest {
            schema: SCHEMA.into(),
            version: VERSION,
            family: family.into(),
            model_id: model_id.into(),
            producer: producer.into(),
            weights_sha256: String::new(),
            audio_sha256: String::new(),
            tools: Default::default(),
            tokens: vec![],
            transcript: String::new(),
            stats_only: false,
            checkpoints: vec![],
            extra: Default::default(),
            engine_weights: None,
        }
    }
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
    /// Files in the directory that the manifest does not list (reported by the caller, never
    /// read).
    pub unlisted: Vec<String>,
}

fn derr(path: &Path, reason: impl Into<String>) -> CoreError {
    CoreError::Dump {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Encode an f32 tensor as `.npy` bytes (C order, little-endian, format 1.0): exactly the bytes
/// `numpy.save` (`numpy.lib.format.write_array`, version 1.0) writes, so the Rust and Python
/// writers agree byte for byte (`core/tests/dump_golden.rs`). The header is numpy's: the dict
/// literal with a trailing `, `, numpy's spare space for growing the first axis (21 digits), then
/// spaces and a newline up to a multiple of 64 bytes. Reading goes through ndarray-npy.
pub fn npy_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let shape = t.shape();
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let tuple = match dims.as_slice() {
        [] => "()".to_string(),
        [one] => format!("({one},)"),
        many => format!("({})", many.join(", ")),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {tuple}, }}");
    // numpy's GROWTH_AXIS_MAX_DIGITS spare space (21 - digits of the first axis).
    if let Some(first) = dims.first() {
        header.push_str(&" ".repeat(21usize.saturating_sub(first.len())));
    }
    // numpy's `_wrap_header`: magic (6) + version (2) + length (2) + header + '\n', padded with
    // 1..=64 spaces to the next multiple of 64.
    let hlen = header.len() + 1;
    let pad = 64 - (10 + hlen) % 64;
    let total = u16::try_from(hlen + pad).map_err(|_| CoreError::Dump {
        path: PathBuf::from(format!("<{shape:?} f32 tensor>")),
        reason: "shape too long for a .npy 1.0 header".into(),
    })?;
    let mut out = Vec::with_capacity(10 + total as usize + t.len() * 4);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&total.to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.resize(out.len() + pad, b' ');
    out.push(b'\n');
    for v in t.as_standard_layout().iter() {
        out.extend_from_slice(&v.to_le_bytes());
    }
    Ok(out)
}

/// The element type of a tensor as a dump stores it: the `.npy` file's `descr` and the manifest
/// entry's `dtype` (`f32`, `f64`, `f16`, `i64`, `i32`), every one read into f32. A manifest
/// naming any other type is refused, naming the key (`dtype`) and the manifest file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE binary32 (`<f4`): what X-Ray's engines write.
    F32,
    /// IEEE binary64 (`<f8`).
    F64,
    /// IEEE binary16 (`<f2`).
    F16,
    /// 64-bit integer (`<i8`): token ids, positions.
    I64,
    /// 32-bit integer (`<i4`).
    I32,
}

/// The `.npy` element types a dump accepts: header `descr`, dtype, item size.
const NPY_DTYPES: [(&str, Dtype, usize); 5] = [
    ("<f4", Dtype::F32, 4),
    ("<f8", Dtype::F64, 8),
    ("<f2", Dtype::F16, 2),
    ("<i8", Dtype::I64, 8),
    ("<i4", Dtype::I32, 4),
];

impl Dtype {
    /// The manifest's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
            Dtype::F16 => "f16",
            Dtype::I64 => "i64",
            Dtype::I32 => "i32",
        }
    }

    /// The dtype the manifest spells `s`, if any.
    pub fn parse(s: &str) -> Option<Dtype> {
        NPY_DTYPES
            .iter()
            .map(|&(_, d, _)| d)
            .find(|d| d.as_str() == s)
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Dtype {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Dtype {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Dtype, D::Error> {
        let s = String::deserialize(d)?;
        Dtype::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "dtype '{s}' is none of f32, f64, f16, i64, i32 (the element types a dump stores)"
            ))
        })
    }
}

/// Decode `.npy` bytes (v1/v2/v3; `<f4`, `<f8`, `<f2`, `<i8`, `<i4`; C order) into f32. The header
/// is read by ndarray-npy (a Python literal dict of exactly `descr`, `fortran_order` and `shape`);
/// the payload must be exactly `prod(shape) * itemsize` bytes (checked arithmetic). Nothing is
/// allocated before the sizes are checked against the bytes given, and every failure names `path`.
pub fn parse_npy(path: &Path, bytes: &[u8]) -> Result<(Tensor, Dtype)> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(derr(path, "not a .npy file (bad magic)"));
    }
    // The header length is read from the file: bound it by the bytes given before ndarray-npy
    // allocates a buffer of that size.
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(derr(path, format!("unsupported .npy version {v}"))),
    };
    let payload_start = start
        .checked_add(hlen)
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| derr(path, "truncated .npy header"))?;
    let mut reader = &bytes[..payload_start];
    let header = Header::from_reader(&mut reader)
        .map_err(|e| derr(path, format!(".npy header does not parse: {e}")))?;
    if header.layout.is_fortran() {
        return Err(derr(
            path,
            "fortran_order .npy files are not supported; save C-contiguous",
        ));
    }
    let descr = match &header.type_descriptor {
        PyValue::String(d) => d.as_str(),
        other => return Err(derr(path, format!("unsupported dtype {other}"))),
    };
    let (_, dtype, item) = NPY_DTYPES
        .iter()
        .copied()
        .find(|(d, _, _)| *d == descr)
        .ok_or_else(|| derr(path, format!("unsupported dtype '{descr}'")))?;
    let shape = header.shape;
    let len = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|n| n.checked_mul(item).is_some())
        .ok_or_else(|| {
            derr(
                path,
                format!("shape {shape:?} of {dtype} overflows the address space"),
            )
        })?;
    let payload = &bytes[payload_start..];
    if payload.len() != len * item {
        return Err(derr(
            path,
            format!("payload is {} bytes, shape {shape:?} of {dtype} needs {} (truncated or padded file)", payload.len(), len * item),
        ));
    }
    let bad = |e: ReadDataError| derr(path, format!(".npy payload does not read: {e}"));
    let vals: Vec<f32> = match dtype {
        Dtype::F32 => {
            f32::read_to_end_exact_vec(payload, &header.type_descriptor, len).map_err(bad)?
        }
        Dtype::F64 => f64::read_to_end_exact_vec(payload, &header.type_descriptor, len)
            .map_err(bad)?
            .into_iter()
            .map(|v| v as f32)
            .collect(),
        Dtype::I64 => i64::read_to_end_exact_vec(payload, &header.type_descriptor, len)
            .map_err(bad)?
            .into_iter()
            .map(|v| v as f32)
            .collect(),
        Dtype::I32 => i32::read_to_end_exact_vec(payload, &header.type_descriptor, len)
            .map_err(bad)?
            .into_iter()
            .map(|v| v as f32)
            .collect(),
        // ndarray-npy has no f16 element: the payload length is checked above.
        Dtype::F16 => payload
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
    };
    let t = ArrayD::from_shape_vec(IxDyn(&shape), vals).map_err(|e| derr(path, e.to_string()))?;
    Ok((t, dtype))
}

/// File name of a checkpoint at a step.
pub fn file_name(name: &str, step: Step) -> String {
    format!("{}.npy", crate::key(name, step))
}

/// Accumulates checkpoints and writes a dump directory atomically.
#[derive(Debug)]
pub struct DumpWriter {
    /// The manifest being built (entries are appended by [`DumpWriter::add`]).
    pub manifest: Manifest,
    files: Vec<(String, Vec<u8>)>,
    /// The first checkpoint that could not be encoded: [`DumpWriter::write_to`] refuses to write.
    failed: Option<(String, String)>,
}

impl DumpWriter {
    /// Start a dump. `stats_only` keeps statistics and a content hash instead of tensors.
    pub fn new(manifest: Manifest) -> DumpWriter {
        DumpWriter {
            manifest,
            files: Vec::new(),
            failed: None,
        }
    }

    /// Add one checkpoint tensor (a tensor that cannot be encoded makes [`DumpWriter::write_to`]
    /// fail, naming its file).
    pub fn add(&mut self, name: &str, step: Step, layout: Layout, t: &Tensor) {
        self.add_declared(name, step, layout, t, None, None);
    }

    /// [`DumpWriter::add`] with the entry's declarations: which positions its `tokens` axis holds
    /// ([`Entry::token_positions`]) and whether its logits are processed
    /// ([`Entry::logits_processed`]).
    pub fn add_declared(
        &mut self,
        name: &str,
        step: Step,
        layout: Layout,
        t: &Tensor,
        token_positions: Option<TokenPositions>,
        logits_processed: Option<LogitsProcessed>,
    ) {
        let data = t.as_standard_layout();
        let slice = data.as_slice().unwrap_or(&[]);
        let entry = Entry {
            name: name.to_string(),
            step,
            shape: t.shape().to_vec(),
            dtype: Dtype::F32,
            layout,
            file: None,
            sha256: None,
            stats: None,
            content_sha256: None,
            token_positions,
            logits_processed,
        };
        if self.manifest.stats_only {
            self.manifest.checkpoints.push(Entry {
                stats: Some(Stats::of(slice)),
                content_sha256: Some(content_sha256(slice)),
                ..entry
            });
            return;
        }
        let file = file_name(name, step);
        let bytes = match npy_bytes(t) {
            Ok(b) => b,
            Err(e) => {
                self.failed.get_or_insert((file, e.to_string()));
                return;
            }
        };
        self.manifest.checkpoints.push(Entry {
            file: Some(file.clone()),
            sha256: Some(crate::sha256_hex(&bytes)),
            ..entry
        });
        self.files.push((file, bytes));
    }

    /// Write everything into a new or empty `dir`; an existing dump is refused (see
    /// [`DumpWriter::write_to`]).
    pub fn write(&self, dir: &Path) -> Result<()> {
        self.write_to(dir, false)
    }

    /// Write everything into `dir` atomically: the files go into a fresh temporary sibling
    /// directory, which is renamed into place once complete. `dir` may be absent or empty; an
    /// existing X-Ray dump is replaced only when `replace` is true (`--force`), and then only
    /// after the new dump is complete, removing only the files its manifest lists. Anything else
    /// at `dir` is refused (see [`check_dump_target`]); nothing X-Ray did not write is deleted.
    pub fn write_to(&self, dir: &Path, replace: bool) -> Result<()> {
        if let Some((file, reason)) = &self.failed {
            return Err(derr(&dir.join(file), reason.clone()));
        }
        crate::outdir::write_whole(dir, &DUMP_DIR, replace, |tmp| {
            for (f, bytes) in &self.files {
                let p = tmp.join(f);
                let mut fh = std::fs::File::create_new(&p).map_err(|e| CoreError::io(&p, e))?;
                fh.write_all(bytes).map_err(|e| CoreError::io(&p, e))?;
                fh.sync_all().map_err(|e| CoreError::io(&p, e))?;
            }
            let mp = tmp.join("manifest.json");
            let text = serde_json::to_string_pretty(&self.manifest)
                .map_err(|e| derr(&mp, e.to_string()))?;
            std::fs::write(&mp, text + "\n").map_err(|e| CoreError::io(&mp, e))
        })
    }
}

/// What an output directory for a dump holds now ([`crate::outdir::Target`]; an existing dump is
/// `Existing`).
pub type DumpTarget = crate::outdir::Target;

/// A dump directory as [`crate::outdir`] writes and recognises it: `manifest.json` of schema
/// [`SCHEMA`], listing itself and its checkpoints' `.npy` files.
const DUMP_DIR: crate::outdir::Kind = crate::outdir::Kind {
    noun: "dump",
    manifest: "manifest.json",
    schema: SCHEMA,
    listed: listed_files,
};

/// The files a dump manifest lists (read leniently: any plain `file` name of its checkpoints).
fn listed_files(v: &serde_json::Value) -> Vec<String> {
    let mut files = vec!["manifest.json".to_string()];
    for e in v
        .get("checkpoints")
        .and_then(|c| c.as_array())
        .into_iter()
        .flatten()
    {
        if let Some(f) = e.get("file").and_then(|f| f.as_str()) {
            if !f.contains('/') && !f.contains('\\') && f != "." && f != ".." {
                files.push(f.to_string());
            }
        }
    }
    files
}

/// Checks that a dump may be written to `dir` (run it before the expensive work; the writer
/// runs it again): absent, empty, or (only with `replace`) an existing X-Ray dump holding no
/// file its manifest does not list. A file, a symbolic link, a non-empty directory that is not an
/// X-Ray dump, or an ancestor that is not a directory is refused with an error naming it
/// ([`crate::outdir::check_target`]).
pub fn check_dump_target(dir: &Path, replace: bool) -> Result<DumpTarget> {
    Ok(crate::outdir::check_target(dir, &DUMP_DIR, replace)?)
}

impl From<crate::outdir::Refused> for CoreError {
    fn from(r: crate::outdir::Refused) -> Self {
        CoreError::Dump {
            path: r.path,
            reason: r.reason,
        }
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
                dtype: Dtype::F32,
                layout: c.layout,
                file: None,
                sha256: None,
                stats: None,
                content_sha256: None,
                token_positions: None,
                logits_processed: None,
            });
            tensors.insert((c.name, c.step), c.data);
        }
        Dump {
            dir: PathBuf::new(),
            manifest,
            tensors,
            unlisted: Vec::new(),
        }
    }

    /// An in-memory stats-only dump: `manifest.stats_only` is set and its entries carry `stats`
    /// and `content_sha256`; no tensor.
    pub fn stats_only(mut manifest: Manifest) -> Dump {
        manifest.stats_only = true;
        Dump {
            dir: PathBuf::new(),
            manifest,
            tensors: BTreeMap::new(),
            unlisted: Vec::new(),
        }
    }

    /// A writer holding the same content (to save an in-memory dump; a stats-only dump's
    /// summaries as they are).
    pub fn to_writer(&self) -> DumpWriter {
        if self.manifest.stats_only {
            return DumpWriter::new(self.manifest.clone());
        }
        let mut m = self.manifest.clone();
        m.checkpoints.clear();
        let mut w = DumpWriter::new(m);
        for e in &self.manifest.checkpoints {
            if let Some(t) = self.get(&e.name, e.step) {
                w.add_declared(
                    &e.name,
                    e.step,
                    e.layout,
                    t,
                    e.token_positions,
                    e.logits_processed,
                );
            }
        }
        w
    }

    /// Load and verify a dump directory.
    pub fn load(dir: &Path) -> Result<Dump> {
        let mp = dir.join("manifest.json");
        let text = std::fs::read_to_string(&mp).map_err(|e| CoreError::io(&mp, e))?;
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
        let mut seen = std::collections::BTreeSet::new();
        let mut listed = std::collections::BTreeSet::new();
        for e in &manifest.checkpoints {
            if seen.contains(&(e.name.clone(), e.step)) {
                return Err(derr(
                    &mp,
                    format!("{} listed twice", crate::key(&e.name, e.step)),
                ));
            }
            if manifest.stats_only {
                let id = crate::key(&e.name, e.step).to_string();
                let (Some(st), Some(_)) = (&e.stats, &e.content_sha256) else {
                    return Err(derr(
                        &mp,
                        format!("stats-only entry {id} has no stats/content_sha256"),
                    ));
                };
                let n = e.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
                if n != Some(st.count) {
                    return Err(derr(
                        &mp,
                        format!(
                            "stats-only entry {id}: count {} does not match shape {:?}",
                            st.count, e.shape
                        ),
                    ));
                }
                // Statistics no tensor can have are refused here: a matching content hash
                // would otherwise pass them unread.
                if let Err(why) = st.check() {
                    return Err(derr(
                        &mp,
                        format!("stats-only entry {id}: inconsistent statistics: {why}"),
                    ));
                }
                match &st.sketch {
                    Some(k) if k.len() == SKETCH_LEN && k.iter().all(|v| v.is_finite()) => {}
                    Some(_) => {
                        return Err(derr(
                            &mp,
                            format!("stats-only entry {id}: 'sketch' must be {SKETCH_LEN} finite numbers"),
                        ))
                    }
                    None => {
                        return Err(derr(
                            &mp,
                            format!("stats-only entry {id} has no order-sensitive 'sketch' (written by an older writer; re-run `xray run --stats-only`)"),
                        ))
                    }
                }
                seen.insert((e.name.clone(), e.step));
                continue;
            }
            let file = e.file.as_ref().ok_or_else(|| {
                derr(
                    &mp,
                    format!("entry {} has no file", crate::key(&e.name, e.step)),
                )
            })?;
            if file.contains('/') || file.contains('\\') || file.contains("..") {
                return Err(derr(
                    &mp,
                    format!("entry file '{file}' must be a plain file name"),
                ));
            }
            let p = dir.join(file);
            let bytes = std::fs::read(&p).map_err(|e| CoreError::io(&p, e))?;
            let got = crate::sha256_hex(&bytes);
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
            seen.insert((e.name.clone(), e.step));
            listed.insert(file.clone());
            tensors.insert((e.name.clone(), e.step), t);
        }
        let mut unlisted = Vec::new();
        for ent in std::fs::read_dir(dir).map_err(|e| CoreError::io(dir, e))? {
            let ent = ent.map_err(|e| CoreError::io(dir, e))?;
            let n = ent.file_name().to_string_lossy().to_string();
            if n != "manifest.json" && !listed.contains(&n) {
                unlisted.push(n);
            }
        }
        unlisted.sort();
        Ok(Dump {
            dir: dir.to_path_buf(),
            manifest,
            tensors,
            unlisted,
        })
    }

    /// A tensor by name and step.
    pub fn get(&self, name: &str, step: Step) -> Option<&Tensor> {
        self.tensors.get(&(name.to_string(), step))
    }

    /// A manifest entry by name and step.
    pub fn entry(&self, name: &str, step: Step) -> Option<&Entry> {
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
            engine_weights: None,
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

    /// A manifest's dtype is one of the stored element types, spelled as `.npy` files name them;
    /// any other spelling (bf16 is no storage type) is refused naming the key and the manifest,
    /// in a full dump and in a stats-only one (which has no file to check it against).
    #[test]
    fn unknown_dtype_is_refused_naming_the_key_and_the_manifest() {
        for (d, json) in [
            (Dtype::F32, "\"f32\""),
            (Dtype::F64, "\"f64\""),
            (Dtype::F16, "\"f16\""),
            (Dtype::I64, "\"i64\""),
            (Dtype::I32, "\"i32\""),
        ] {
            assert_eq!(serde_json::to_string(&d).unwrap(), json);
            assert_eq!(serde_json::from_str::<Dtype>(json).unwrap(), d);
        }
        for stats_only in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path().join("d");
            let mut m = manifest();
            m.stats_only = stats_only;
            let mut w = DumpWriter::new(m);
            w.add("x", 0, Layout::Plain, &ArrayD::zeros(IxDyn(&[2])));
            w.write(&d).unwrap();
            assert_eq!(
                Dump::load(&d).unwrap().manifest.checkpoints[0].dtype,
                Dtype::F32
            );
            let mp = d.join("manifest.json");
            let text = std::fs::read_to_string(&mp).unwrap();
            std::fs::write(&mp, text.replace("\"f32\"", "\"bf16\"")).unwrap();
            let e = Dump::load(&d).unwrap_err().to_string();
            assert!(
                e.contains(mp.to_str().unwrap()) && e.contains("dtype 'bf16' is none of f32"),
                "{e}"
            );
        }
    }
}
