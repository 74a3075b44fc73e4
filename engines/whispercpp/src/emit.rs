//! Everything X-Ray-facing: the manifest (producer, tools, identities), the dump written with
//! X-Ray's `DumpWriter`, each tensor's ggml type and the ops whisper.cpp computed below f32
//! (`extra.ggml`), and reference dumps read for isolation feeds.
//!
//! Identity fields: `weights_sha256` is the sha256 of the HF safetensors the ggml file was
//! converted from (what the reference dump carries, so `xray compare` and `xray gate` see one
//! model); the engine's own weights file is `extra.ggml_model` (its sha256, format, ftype, mel
//! filter bank, planted converter bugs), from the converter's sidecar `MODEL.bin.json`, checked
//! against the file's bytes.

use std::collections::BTreeMap;
use std::path::Path;

use ndarray::{ArrayD, IxDyn};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use xray_core::dump::{Dump, DumpWriter, PRECISION_KEY};
use xray_core::engine::RunIdentity;

use crate::engine::{Error, ModelDir, Run};
use crate::ffi;

/// The producer recorded in the manifest.
pub const PRODUCER: &str = "whisper.cpp";
/// The vendored whisper.cpp release (whisper-rs-sys's build metadata).
pub const WHISPER_CPP_VERSION: &str = env!("XRAY_WHISPER_CPP_VERSION");

/// sha256 of a file.
pub fn sha256_file(p: &Path) -> Result<String, Error> {
    let bytes = std::fs::read(p).map_err(|e| Error::Input(format!("{}: {e}", p.display())))?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

/// The ggml model file's identity: the converter's sidecar, checked against the file and the HF
/// weights it names.
pub fn ggml_identity(ggml: &Path, md: &ModelDir) -> Result<(Value, String), Error> {
    let side = ggml.with_file_name(format!(
        "{}.json",
        ggml.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
    ));
    let text = std::fs::read_to_string(&side).map_err(|e| {
        Error::Input(format!(
            "{}: {e} (the converter's sidecar: fixtures/make_ggml.py writes it beside the model)",
            side.display()
        ))
    })?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| Error::Input(format!("{} does not parse: {e}", side.display())))?;
    let file_sha = sha256_file(ggml)?;
    if v["sha256"].as_str() != Some(file_sha.as_str()) {
        return Err(Error::Input(format!(
            "{}: sha256 {file_sha} is not the {} its sidecar {} records",
            ggml.display(),
            v["sha256"],
            side.display()
        )));
    }
    let src = sha256_file(&md.safetensors)?;
    if v["converted_from"]["weights_sha256"].as_str() != Some(src.as_str()) {
        return Err(Error::Input(format!(
            "{} was converted from other weights (sha256 {}) than {} ({src})",
            ggml.display(),
            v["converted_from"]["weights_sha256"],
            md.safetensors.display()
        )));
    }
    let mut id = v.clone();
    id["path"] = json!(ggml.display().to_string());
    Ok((id, src))
}

/// A reference dump opened for isolation feeds, checked to be of the same weights and audio.
#[derive(Debug)]
pub struct Reference {
    dump: Dump,
}

impl Reference {
    /// Loads and verifies a dump; refuses one of other weights or audio.
    pub fn open(dir: &Path, id: &RunIdentity) -> Result<Reference, Error> {
        let dump = Dump::load(dir).map_err(|e| Error::Input(format!("reference dump: {e}")))?;
        let m = &dump.manifest;
        if m.family != "whisper" || m.stats_only {
            return Err(Error::Input(format!(
                "{}: not a full whisper dump",
                dir.display()
            )));
        }
        id.check_reference(dir, m).map_err(Error::Input)?;
        Ok(Reference { dump })
    }

    /// The reference log-mel `[n_mels, frames]`, finite.
    pub fn mel(&self, n_mels: usize, frames: usize) -> Result<Vec<f32>, Error> {
        let dir = self.dump.dir.display();
        let t = self.dump.get("audio.frontend.mel", 0).ok_or_else(|| {
            let mel = xray_core::key("audio.frontend.mel", 0);
            Error::Input(format!("{dir}: no {mel} to feed"))
        })?;
        if t.shape() != [n_mels, frames] {
            return Err(Error::Input(format!(
                "{dir}: audio.frontend.mel is {:?}, expected [{n_mels}, {frames}]",
                t.shape()
            )));
        }
        if let Some((i, v)) = t.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(Error::Input(format!(
                "{dir}: audio.frontend.mel holds a non-finite value ({v}) at index {i}; not fed"
            )));
        }
        Ok(t.iter().copied().collect())
    }

    /// The reference's tokens after `prefix`, each in the vocabulary.
    pub fn generated(&self, prefix: &[i32], vocab: i64) -> Result<Vec<i32>, Error> {
        let dir = self.dump.dir.display();
        let toks = &self.dump.manifest.tokens;
        if let Some(t) = toks.iter().find(|&&t| !(0..vocab).contains(&t)) {
            return Err(Error::Input(format!(
                "{dir}: token {t} is not an id of this model's vocabulary (0..{vocab})"
            )));
        }
        let ids: Vec<i32> = toks.iter().map(|&t| t as i32).collect();
        match ids.strip_prefix(prefix) {
            Some(rest) if !rest.is_empty() => Ok(rest.to_vec()),
            _ => Err(Error::Input(format!(
                "{dir}: tokens do not start with the prompt {prefix:?} followed by generated tokens"
            ))),
        }
    }
}

/// Provenance of a run.
#[derive(Debug, Clone)]
pub struct Provenance {
    /// The model directory as given, the sha256 of the HF weights the ggml file was converted
    /// from and of the WAV bytes.
    pub id: RunIdentity,
    /// The engine's own weights file (`extra.ggml_model`).
    pub ggml_model: Value,
    /// Flash attention on.
    pub flash: bool,
    /// What was fed (`extra.fed`).
    pub fed: BTreeMap<String, Value>,
    /// Tokens of the run with capture off (neutrality), when made.
    pub taps_off_tokens: Option<Vec<i32>>,
}

/// The engine's own weights file as the manifest declares it (`engine_weights`), from
/// `extra.ggml_model` (the converter's sidecar, checked against the file's bytes); `None` when the
/// sidecar has no sha256.
fn engine_weights(prov: &Provenance) -> Option<xray_core::dump::EngineWeights> {
    let g = &prov.ggml_model;
    let text = |k: &str| g.get(k).and_then(Value::as_str).map(str::to_string);
    Some(xray_core::dump::EngineWeights {
        format: "ggml".into(),
        sha256: text("sha256")?,
        file: text("file").or_else(|| text("path")),
        source: Some(prov.id.model_id.clone()),
        conversion: Some(format!(
            "fixtures/make_ggml.py{}",
            text("ftype").map_or(String::new(), |f| format!(" (ftype {f})"))
        )),
        config: None,
    })
}

/// The dump of one run.
pub fn dump(md: &ModelDir, prov: &Provenance, run: &Run) -> Result<DumpWriter, Error> {
    let tools = BTreeMap::from([
        ("whisper.cpp".to_string(), WHISPER_CPP_VERSION.to_string()),
        ("whisper-rs-sys".to_string(), "0.15.0".to_string()),
        (
            "xray-whispercpp".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
    ]);
    // Per tensor: its ggml type, op and sources' types. Per graph: the ops below f32.
    let mut types = Map::new();
    for c in &run.captured {
        types.insert(
            format!("{}@{}", c.name, c.step),
            json!({
                "type": c.ggml.ty, "op": c.ggml.op, "ne": c.ggml.ne,
                "src": c.ggml.src.iter().map(|(o, t)| json!({"op": o, "type": t})).collect::<Vec<_>>(),
                "producer": c.tap.op,
            }),
        );
    }
    let mut reduced = vec![];
    let mut seen = std::collections::BTreeSet::new();
    for g in &run.graphs {
        for (r, m) in &g.reduced {
            // One entry per op (decode steps repeat the same ops): the first step it appears at.
            // The declaration X-Ray reads (`extra.precision`, docs/dump-format.md): the op, the
            // precision it ran at (every reduction whisper.cpp 1.8.3 makes is to f16: its
            // `itype`, the f16 GELU table, f16 `vec_dot_type`, f16 IM2COL; a bf16 tensor would
            // say bf16), why, and the ggml node.
            if seen.insert(r.op.clone()) {
                let types =
                    std::iter::once(m.ty.as_str()).chain(m.src.iter().map(|(_, t)| t.as_str()));
                let dtype = if types.into_iter().any(|t| t == "bf16") {
                    "bf16"
                } else {
                    "f16"
                };
                reduced.push(json!({
                    "op": r.op, "dtype": dtype, "why": r.why,
                    "ggml": {
                        "step": g.step, "op": m.op, "type": m.ty,
                        "src": m.src.iter().map(|(o, t)| json!({"op": o, "type": t})).collect::<Vec<_>>(),
                    },
                }));
            }
        }
    }
    let graphs: Vec<Value> = run
        .graphs
        .iter()
        .map(|g| json!({"kind": format!("{:?}", g.kind).to_lowercase(), "step": g.step, "nodes": g.nodes, "tapped": g.tapped}))
        .collect();
    let mut extra = BTreeMap::new();
    extra.insert("config".to_string(), md.config.clone());
    extra.insert(PRECISION_KEY.to_string(), json!(reduced));
    extra.insert("dtype".to_string(), json!("float32"));
    extra.insert("fed".to_string(), json!(prov.fed));
    extra.insert("step_argmax".to_string(), json!(run.step_argmax));
    extra.insert("ggml_model".to_string(), prov.ggml_model.clone());
    extra.insert(
        "ggml".to_string(),
        json!({
            "flash_attn": prov.flash,
            "system_info": ffi::system_info(),
            "types": types,
            "graphs": graphs,
            "graph_edits": if run.stubbed > 0 { json!([{
                "edit": "im2col_stub", "nodes": run.stubbed,
                "what": "each conv IM2COL's f32 kernel (src[0]) replaced, for the compute only, by a shape-only f16 stand-in: ggml_compute_forward_im2col_f16 reads the kernel's type and ne, never its data; without it whisper.cpp 1.8.3 aborts on an f32 model"
            }]) } else { json!([]) },
            "recognition": "by op and shape pattern from each graph's output backwards (src/graph.rs); counts per layer and shapes from config.json asserted",
        }),
    );
    if let Some(t) = &prov.taps_off_tokens {
        extra.insert(
            "capture_neutral".to_string(),
            json!({"tokens_taps_off": t, "equal": *t == run.tokens}),
        );
    }
    let tokens = run.tokens.iter().map(|&t| i64::from(t)).collect();
    let mut manifest = prov
        .id
        .manifest("whisper", PRODUCER, tools, tokens, run.transcript.clone());
    manifest.extra = extra;
    manifest.engine_weights = engine_weights(prov);
    let mut w = DumpWriter::new(manifest);
    for c in &run.captured {
        let shape: Vec<usize> = match &c.tap.shape {
            crate::graph::Shape::As(s) => s.clone(),
            crate::graph::Shape::CropKv {
                heads,
                tokens,
                keep,
                ..
            } => vec![*heads, *tokens, *keep],
        };
        let a = ArrayD::from_shape_vec(IxDyn(&shape), c.data.clone())
            .map_err(|e| Error::Engine(format!("{}@{}: {e}", c.name, c.step)))?;
        w.add(&c.name, c.step, c.tap.layout, &a);
    }
    Ok(w)
}
