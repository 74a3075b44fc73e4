//! Everything X-Ray-facing, in one module: the checkpoint names of the Whisper contract that
//! candle's public API reaches, the manifest (producer, tools, hashes exactly as the oracle
//! computes them), the dump written with X-Ray's `DumpWriter`, and the reference dumps read for
//! isolation feeds. The only X-Ray types used are the dump format's (`DumpWriter`, `Manifest`,
//! `Dump`, `Layout`).
//!
//! This is the code a runtime team writes to put its engine under X-Ray. The pattern, for any
//! engine (compiled as a doctest):
//!
//! ```
//! use xray_core::dump::{DumpWriter, Manifest, SCHEMA, VERSION};
//! use xray_core::Layout;
//!
//! let mut w = DumpWriter::new(Manifest {
//!     schema: SCHEMA.into(),
//!     version: VERSION,
//!     family: "whisper".into(),
//!     model_id: "my-model".into(),
//!     producer: "my-engine".into(),
//!     weights_sha256: "<sha256 of model.safetensors>".into(),
//!     audio_sha256: "<sha256 of the WAV bytes>".into(),
//!     tools: [("my-engine".to_string(), "1.2.3".to_string())].into(),
//!     tokens: vec![50257, 50362, 383, 50256],
//!     transcript: " The".into(),
//!     stats_only: false,
//!     checkpoints: vec![],
//!     extra: Default::default(),
//!     engine_weights: None,
//! });
//! // One tensor per (contract checkpoint, step), batch squeezed, in the contract's shape.
//! let memory = ndarray::ArrayD::<f32>::zeros(ndarray::IxDyn(&[1500, 384]));
//! w.add("audio.encoder.memory", 0, Layout::TokenMajor, &memory);
//! let dir = tempfile::tempdir().unwrap();
//! w.write(&dir.path().join("dump")).unwrap(); // atomic: temp dir + rename
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use xray_core::contract::Contract;
use xray_core::dump::{Dump, DumpWriter};
use xray_core::engine::RunIdentity;
use xray_core::ops::Side;
use xray_core::Layout;

use crate::engine::{Dense, Observations};
use crate::inputs::ModelDir;
use crate::Error;

/// Contract name of the log-mel (`[mel_bins, mel_frames]`, channel-major, once).
pub const MEL: &str = "audio.frontend.mel";
/// Contract name of the encoder output (`[enc_tokens, d_model]`, token-major, once).
pub const MEMORY: &str = "audio.encoder.memory";
/// Contract name of the decoder logits (`[tokens, vocab]`, token-major, every step).
pub const LOGITS: &str = "audio.decoder.logits";
/// Contract name of the token ids the decoder consumed at a step (`[tokens]`, plain, f32).
pub const INPUT_IDS: &str = "audio.decoder.input_ids";
/// Contract name of their positions (`[tokens]`, plain, f32).
pub const POSITION_IDS: &str = "audio.decoder.position_ids";
/// The producer recorded in the manifest.
pub const PRODUCER: &str = "candle";
/// The candle-transformers release this binary was built with (from Cargo.lock).
pub const CANDLE_VERSION: &str = env!("XRAY_CANDLE_VERSION");

/// Why the other contract checkpoints are unobserved (recorded in the manifest).
pub const UNOBSERVED: &str = "candle-transformers keeps AudioEncoder's convs and blocks and \
TextDecoder's blocks private: conv1/conv2 outputs, per-layer outputs, attention probabilities, \
cross K/V and attention contexts are not reachable through its public API. TextDecoder::forward's \
output (after the decoder's final LayerNorm) is reachable but has no contract checkpoint.";

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The weights hash exactly as the oracle computes it: sha256 of the single safetensors file, or
/// for sharded weights the sha256 of `"{file name}:{file sha256}\n"` over the sorted files.
pub fn weights_sha256(files: &[(PathBuf, Vec<u8>)]) -> String {
    match files {
        [(_, bytes)] => sha256_hex(bytes),
        _ => {
            let mut s = String::new();
            for (p, bytes) in files {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                s.push_str(&format!("{name}:{}\n", sha256_hex(bytes)));
            }
            sha256_hex(s.as_bytes())
        }
    }
}

/// The audio hash: sha256 of the WAV file's bytes.
pub fn audio_sha256(bytes: &[u8]) -> String {
    sha256_hex(bytes)
}

/// A reference dump opened for isolation feeds, checked to be of the same weights and audio.
#[derive(Debug)]
pub struct Reference {
    dump: Dump,
    dir: PathBuf,
}

impl Reference {
    /// Loads and verifies a dump (every hash, shape and dtype) and refuses one made from other
    /// weights or audio: feeding its tensors would measure nothing.
    pub fn open(dir: &Path, id: &RunIdentity) -> Result<Reference, Error> {
        let dump = Dump::load(dir).map_err(|e| Error::Input(format!("reference dump: {e}")))?;
        let m = &dump.manifest;
        if m.family != "whisper" {
            return Err(Error::Input(format!(
                "{}: a {} dump, not whisper",
                dir.display(),
                m.family
            )));
        }
        if m.stats_only {
            return Err(Error::Input(format!(
                "{}: a stats-only dump holds no tensors to feed",
                dir.display()
            )));
        }
        id.check_reference(dir, m).map_err(Error::Input)?;
        Ok(Reference {
            dump,
            dir: dir.to_path_buf(),
        })
    }

    /// The dump's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The reference log-mel `[mel_bins, mel_frames]`, to feed candle's encoder.
    pub fn mel(&self, shape: &[usize]) -> Result<Dense, Error> {
        self.tensor(MEL, Layout::ChannelMajor, shape)
    }

    /// The reference encoder memory `[enc_tokens, d_model]`, to feed candle's decoder.
    pub fn memory(&self, shape: &[usize]) -> Result<Dense, Error> {
        self.tensor(MEMORY, Layout::TokenMajor, shape)
    }

    /// A step-0 tensor in the expected canonical shape (layout as the contract's), or an error
    /// naming the checkpoint.
    fn tensor(&self, name: &str, layout: Layout, shape: &[usize]) -> Result<Dense, Error> {
        // Every refusal names the dump and the checkpoint's key.
        let (dir, key) = (self.dir.display(), xray_core::key(name, 0));
        let refuse = |why: String| Error::Input(format!("{dir}: {key} {why}"));
        let e = self
            .dump
            .entry(name, 0)
            .ok_or_else(|| Error::Input(format!("{dir}: no {key} to feed")))?;
        if e.layout != layout || e.shape != shape {
            return Err(refuse(format!(
                "is {:?} {:?}, candle needs {layout:?} {shape:?}",
                e.layout, e.shape
            )));
        }
        let t = self
            .dump
            .get(name, 0)
            .ok_or_else(|| refuse("has no tensor".into()))?;
        // A NaN or Inf fed in would be computed on and compared as if it were a reference.
        if let Some((i, v)) = t.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(refuse(format!("holds a non-finite value ({v}) at index {i} (C order); a non-finite tensor is not fed")));
        }
        Ok(Dense {
            shape: t.shape().to_vec(),
            data: t.iter().copied().collect(),
        })
    }

    /// The reference's generated tokens after `prefix` (which it must start with), each an id
    /// of the model's vocabulary (`0..vocab`).
    pub fn generated_tokens(&self, prefix: &[u32], vocab: usize) -> Result<Vec<u32>, Error> {
        let toks = &self.dump.manifest.tokens;
        if let Some((i, t)) = toks
            .iter()
            .enumerate()
            .find(|(_, &t)| !(0..vocab as i64).contains(&t))
        {
            return Err(Error::Input(format!(
                "{}: token {t} at position {i} is not an id of this model's vocabulary (0..{vocab}, config.json vocab_size)",
                self.dir.display()
            )));
        }
        let ids: Vec<u32> = toks
            .iter()
            .map(|&t| u32::try_from(t))
            .collect::<Result<_, _>>()
            .map_err(|_| Error::Input(format!("{}: negative token id", self.dir.display())))?;
        match ids.strip_prefix(prefix) {
            Some(rest) if !rest.is_empty() => Ok(rest.to_vec()),
            _ => Err(Error::Input(format!(
                "{}: tokens {:?} do not start with this checkpoint's prompt {prefix:?} followed by generated tokens",
                self.dir.display(),
                &ids[..ids.len().min(prefix.len() + 1)]
            ))),
        }
    }
}

/// What went into the dump's provenance.
#[derive(Debug, Clone)]
pub struct Provenance {
    /// The model directory as given, and the hashes of [`weights_sha256`] and [`audio_sha256`].
    pub id: RunIdentity,
    /// What was fed from a reference (recorded in `extra.fed`), keyed by checkpoint name
    /// (`audio.frontend.mel`, `audio.encoder.memory`) or `tokens`.
    pub fed: BTreeMap<String, Value>,
    /// Write every checkpoint also under the op-level points the contract declares it is
    /// (`--ops`; [`points_of`]).
    pub ops: bool,
}

/// The op-level points checkpoint `name` is the same tensor as, from the family contract's
/// declarations alone (`xray_core::contract::Contract::checkpoint_points`: the reference's hook
/// on the checkpoint and the points rules, `same_as` included), split by side: the `:out` names
/// (what the producer computed) and the `:in` names (what the consumer took: on a fed edge, the
/// fed tensor). No point name is written in this crate.
pub fn points_of(
    contract: &xray_core::contract::Contract,
    name: &str,
) -> (Vec<String>, Vec<String>) {
    contract
        .checkpoint_points(name)
        .into_iter()
        .partition(|p| xray_core::ops::parse_point(p).is_some_and(|(_, s)| s == Side::Out))
}

fn array(d: &Dense) -> Result<ArrayD<f32>, Error> {
    ArrayD::from_shape_vec(IxDyn(&d.shape), d.data.clone())
        .map_err(|e| Error::Engine(format!("tensor of shape {:?}: {e}", d.shape)))
}

/// The dump of one run: the log-mel and the encoder memory at step 0, the logits at every step;
/// with `prov.ops` each also under the op-level points it is (`fed_mel`: the log-mel the encoder
/// took when it was fed, written as the encoder's input points).
pub fn dump(
    md: &ModelDir,
    prov: &Provenance,
    obs: &Observations,
    fed_mel: Option<&Dense>,
    transcript: &str,
) -> Result<DumpWriter, Error> {
    let contract = Contract::for_family("whisper", &md.config_json)
        .map_err(|e| Error::Input(format!("the whisper contract on config.json: {e}")))?;
    let tools = BTreeMap::from([
        ("candle".to_string(), CANDLE_VERSION.to_string()),
        (
            "xray-candle-whisper".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
    ]);
    let mut extra = BTreeMap::new();
    extra.insert("config".to_string(), md.config_json.clone());
    extra.insert("dtype".to_string(), json!("float32"));
    extra.insert(
        "observed".to_string(),
        json!([MEL, MEMORY, INPUT_IDS, POSITION_IDS, LOGITS]),
    );
    extra.insert("unobserved_reason".to_string(), json!(UNOBSERVED));
    extra.insert("fed".to_string(), json!(prov.fed));
    extra.insert(
        "step_argmax".to_string(),
        json!(obs.steps.iter().map(|s| s.argmax).collect::<Vec<_>>()),
    );
    let tokens = obs.tokens.iter().map(|&t| i64::from(t)).collect();
    let mut manifest = prov
        .id
        .manifest("whisper", PRODUCER, tools, tokens, transcript.to_string());
    manifest.extra = extra;
    let mut w = DumpWriter::new(manifest);
    // A checkpoint, then (with --ops) the same tensor under each point the contract says it is;
    // a consumer's `:in` points get what the consumer took (`took`: the fed tensor).
    let mut put =
        |name: &str, k: usize, layout: Layout, t: &ArrayD<f32>, took: Option<&ArrayD<f32>>| {
            w.add(name, k, layout, t);
            if prov.ops {
                let (outs, ins) = points_of(&contract, name);
                for p in outs {
                    w.add(&p, k, layout, t);
                }
                for p in ins {
                    w.add(&p, k, layout, took.unwrap_or(t));
                }
            }
        };
    let fed_mel = fed_mel.map(array).transpose()?;
    put(
        MEL,
        0,
        Layout::ChannelMajor,
        &array(&obs.mel)?,
        fed_mel.as_ref(),
    );
    put(MEMORY, 0, Layout::TokenMajor, &array(&obs.memory)?, None);
    for (k, s) in obs.steps.iter().enumerate() {
        // The fed ids and positions, in the run dtype as the contract stores them.
        for (name, v) in [(INPUT_IDS, &s.ids), (POSITION_IDS, &s.positions)] {
            let a =
                ArrayD::from_shape_vec(IxDyn(&[v.len()]), v.iter().map(|&x| x as f32).collect())
                    .map_err(|e| Error::Engine(format!("{}: {e}", xray_core::key(name, k))))?;
            put(name, k, Layout::Plain, &a, None);
        }
        put(LOGITS, k, Layout::TokenMajor, &array(&s.logits)?, None);
    }
    Ok(w)
}

/// Writes the dump atomically; an existing dump at `out` is replaced only when `replace` is set.
pub fn write(w: &DumpWriter, out: &Path, replace: bool) -> Result<(), Error> {
    w.write_to(out, replace)
        .map_err(|e| Error::Engine(format!("writing {}: {e}", out.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharded_weights_hash_like_the_oracle() {
        let one = vec![(PathBuf::from("model.safetensors"), b"abc".to_vec())];
        assert_eq!(weights_sha256(&one), sha256_hex(b"abc"));
        let two = vec![
            (PathBuf::from("a.safetensors"), b"x".to_vec()),
            (PathBuf::from("b.safetensors"), b"y".to_vec()),
        ];
        let want = sha256_hex(
            format!(
                "a.safetensors:{}\nb.safetensors:{}\n",
                sha256_hex(b"x"),
                sha256_hex(b"y")
            )
            .as_bytes(),
        );
        assert_eq!(weights_sha256(&two), want);
    }
}
