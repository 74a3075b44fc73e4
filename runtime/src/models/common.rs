//! Helpers shared by every family: reading a model folder's JSON files ([`read_json`],
//! [`cfg_err`]) and graph building: a prefix-pushing weight-key path ([`Vb`], as
//! candle-nn's `VarBuilder::pp`) and one declaration each of the HF modules the families reuse
//! (`nn.Linear`, `nn.LayerNorm`, RMSNorm, `nn.Conv1d`, activations, residual adds, head
//! split/merge). A family's graph builder composes these into per-module helpers, so a layer
//! reads like the HF module it mirrors: `linear(g, "fc1", &vb.pp("fc1"), x, dense, &rows)`.
//!
//! Every helper declares exactly one op; weight keys are `<prefix>.weight` / `<prefix>.bias` in
//! that order, the order [`Graph::check_weights`](crate::graph::Graph::check_weights) reports.

use std::collections::HashMap;
use std::fmt::Display;
use std::path::{Path, PathBuf};

use ndarray::Array1;

use crate::audio::Audio;
use crate::error::{Result, RuntimeError};
use crate::graph::{Dim, EdgeId, Feeds, GraphBuilder, Kernel, Layout, Out, Shape, Tensor};
use crate::kernels::{Add, Conv1d, LayerNorm, Linear, MatmulStrategy, MergeHeads, SplitHeads};

/// A config error naming the file.
pub fn cfg_err(path: &Path, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Config {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// An audio error naming `audio`'s file.
pub fn audio_err(audio: &Audio, reason: String) -> RuntimeError {
    RuntimeError::Audio {
        path: audio.path.clone(),
        reason,
    }
}

/// `audio` must be at `rate` Hz (never silently resampled), else an error naming the file with
/// `hint` after the reason.
pub fn check_sample_rate(audio: &Audio, rate: usize, hint: &str) -> Result<()> {
    if audio.sample_rate as usize == rate {
        return Ok(());
    }
    let got = audio.sample_rate;
    Err(audio_err(
        audio,
        format!("sample rate {got} Hz; the model expects {rate} Hz{hint}"),
    ))
}

/// The next of a formula's outputs, in the order they were asked for; an error when it returned
/// fewer.
pub fn next_output(it: &mut std::vec::IntoIter<Tensor>) -> Result<Tensor> {
    it.next()
        .ok_or_else(|| RuntimeError::Graph("formula returned fewer outputs than asked".into()))
}

/// The feeds of a formula that starts from the audio: the pcm samples as the `[samples]` feed
/// `name` (the family's `names::PCM`).
pub fn pcm_feeds(name: &str, pcm: &[f32]) -> Feeds {
    HashMap::from([(name.to_string(), Array1::from_vec(pcm.to_vec()).into_dyn())])
}

/// The files `names` of a model directory, in that order; each must exist, else an error naming
/// the missing one and every file `what` (`a Whisper directory`) needs.
pub fn model_files<const N: usize>(
    dir: &Path,
    what: &str,
    names: [&str; N],
) -> Result<[PathBuf; N]> {
    let paths = names.map(|n| dir.join(n));
    if let Some(missing) = paths.iter().find(|p| !p.is_file()) {
        let needs = match names.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
            None => String::new(),
        };
        return Err(RuntimeError::File {
            path: missing.clone(),
            reason: format!("missing: {what} needs {needs}"),
        });
    }
    Ok(paths)
}

/// An id or a list of ids (config.json's and generation_config.json's `eos_token_id`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    /// One id.
    One(i64),
    /// Several ids.
    Many(Vec<i64>),
}

impl TokenIds {
    /// As a list.
    pub fn to_vec(&self) -> Vec<i64> {
        match self {
            TokenIds::One(i) => vec![*i],
            TokenIds::Many(v) => v.clone(),
        }
    }
}

/// A model's `tokenizer.json`, loaded; its errors name the file.
pub struct Tokenizer {
    path: PathBuf,
    inner: tokenizers::Tokenizer,
}

impl Tokenizer {
    /// Load `path`.
    pub fn load(path: &Path) -> Result<Tokenizer> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| RuntimeError::File {
            path: path.to_path_buf(),
            reason: format!("not a readable tokenizers JSON: {e}"),
        })?;
        Ok(Tokenizer {
            path: path.to_path_buf(),
            inner,
        })
    }

    /// Token ids to text, special tokens skipped ([`SpeechModel::decode_text`]).
    ///
    /// [`SpeechModel::decode_text`]: crate::models::SpeechModel::decode_text
    pub fn decode(&self, ids: &[i64]) -> Result<String> {
        let ids: Vec<u32> = ids
            .iter()
            .map(|&i| {
                u32::try_from(i).map_err(|_| RuntimeError::Feed {
                    edge: "token ids".into(),
                    reason: format!("id {i} is not a token id"),
                })
            })
            .collect::<Result<_>>()?;
        self.inner
            .decode(&ids, true)
            .map_err(|e| RuntimeError::File {
                path: self.path.clone(),
                reason: format!("decoding {ids:?}: {e}"),
            })
    }
}

/// config.json's `model_type` must be one of those `family`'s descriptor lists (an error naming
/// the first otherwise).
pub fn check_model_type(path: &Path, model_type: &str, family: &str) -> Result<()> {
    let accepted = &xray_core::family::descriptor(family)?.model_types;
    if accepted.iter().any(|t| t == model_type) {
        return Ok(());
    }
    Err(cfg_err(
        path,
        format!(
            "model_type is '{model_type}', expected '{}'",
            accepted.first().map(String::as_str).unwrap_or_default()
        ),
    ))
}

/// `(key, value)` pairs of config fields, each key spelled from the field itself (`d_model`, or
/// `encoder_config.input_dim` under a section): the name an error gives cannot drift from the
/// field it reads (the fields are config.json's keys, none renamed).
macro_rules! config_facts {
    ($cfg:expr; $($field:ident),+ $(,)?) => {
        [$((stringify!($field), $cfg.$field)),+]
    };
    ($($cfg:expr, $section:literal; $($field:ident),+);+ $(;)?) => {
        [$($((concat!($section, ".", stringify!($field)), $cfg.$field)),+),+]
    };
}
pub(crate) use config_facts;

/// Every config fact of `facts` (name, value) must be positive and at most core's
/// [`MAX_CONFIG_INT`](xray_core::contract::MAX_CONFIG_INT) (the bound the contract resolver
/// applies to the same keys): the first that is 0 is an error naming it, `{name} must be
/// positive{why}, got 0`; one above the bound is core's message naming it.
pub fn check_positive(path: &Path, facts: &[(&str, usize)], why: &str) -> Result<()> {
    if let Some((name, _)) = facts.iter().find(|(_, v)| *v == 0) {
        return Err(cfg_err(
            path,
            format!("{name} must be positive{why}, got 0"),
        ));
    }
    for (name, v) in facts {
        xray_core::contract::check_count(name, *v as u64, xray_core::contract::MAX_CONFIG_INT)
            .map_err(|r| cfg_err(path, r))?;
    }
    Ok(())
}

/// Layer counts (each builds a graph block) are at most core's
/// [`MAX_REPEAT`](xray_core::contract::MAX_REPEAT), the bound of the contract's repeats: checked
/// before a graph of that size is built or a weight file read.
pub fn check_layers(path: &Path, facts: &[(&str, usize)]) -> Result<()> {
    for (name, v) in facts {
        xray_core::contract::check_count(name, *v as u64, xray_core::contract::MAX_REPEAT as u64)
            .map_err(|r| cfg_err(path, r))?;
    }
    Ok(())
}

/// Read and deserialize a JSON file, errors naming the file.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<(T, serde_json::Value)> {
    let text = std::fs::read_to_string(path).map_err(|e| RuntimeError::io(path, e))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| cfg_err(path, format!("not valid JSON: {e}")))?;
    // From the text (not the value): serde's message then says where (line and column).
    let t = serde_json::from_str(&text).map_err(|e| cfg_err(path, e.to_string()))?;
    Ok((t, value))
}

/// A weight-key path (HF state-dict prefix) that helpers extend with `pp`, as candle-nn's
/// `VarBuilder::pp` does: `Vb::root("model.encoder").pp("layers").pp(3).key("fc1.weight")` is
/// `model.encoder.layers.3.fc1.weight`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vb {
    prefix: String,
}

impl Vb {
    /// The path `prefix` (may be empty: the state dict's root).
    pub fn root(prefix: &str) -> Vb {
        Vb {
            prefix: prefix.to_string(),
        }
    }

    /// This path with one more component pushed (`a.b` + `c` = `a.b.c`).
    pub fn pp(&self, component: impl Display) -> Vb {
        Vb {
            prefix: self.key(component),
        }
    }

    /// The full key of `leaf` under this path.
    pub fn key(&self, leaf: impl Display) -> String {
        if self.prefix.is_empty() {
            leaf.to_string()
        } else {
            format!("{}.{leaf}", self.prefix)
        }
    }

    /// The path itself (the HF module name).
    pub fn path(&self) -> &str {
        &self.prefix
    }
}

/// `nn.Linear(n_in, n_out, bias)` geometry and the matmul strategy to run it with.
#[derive(Debug, Clone, Copy)]
pub struct Dense {
    /// Input features.
    pub n_in: usize,
    /// Output features.
    pub n_out: usize,
    /// Whether the module has a bias.
    pub bias: bool,
    /// Matmul strategy (GEMM for batched rows, row-stable for incremental decode).
    pub strategy: MatmulStrategy,
}

impl Dense {
    /// A GEMM linear.
    pub fn gemm(n_in: usize, n_out: usize, bias: bool) -> Dense {
        Dense {
            n_in,
            n_out,
            bias,
            strategy: MatmulStrategy::Gemm,
        }
    }

    /// The same geometry with another strategy.
    pub fn with(self, strategy: MatmulStrategy) -> Dense {
        Dense { strategy, ..self }
    }
}

/// A named output port (for formula boundaries and cache edges).
pub fn named(name: &str, shape: Shape, layout: Layout) -> Out {
    Out {
        name: Some(name.to_string()),
        shape,
        layout,
    }
}

/// One token-major op `[rows, cols]` with weights `ws` (key, shape) in order.
pub fn op(
    g: &mut GraphBuilder,
    name: &str,
    kernel: impl Kernel + 'static,
    ins: &[EdgeId],
    ws: &[(String, Vec<usize>)],
    rows: &Dim,
    cols: usize,
) -> Result<EdgeId> {
    let ws: Vec<(&str, Vec<usize>)> = ws.iter().map(|(k, s)| (k.as_str(), s.clone())).collect();
    g.op1(
        name,
        Box::new(kernel),
        ins,
        &ws,
        vec![rows.clone(), cols.into()],
        Layout::TokenMajor,
    )
}

/// `nn.Linear` under `vb`: weight `[n_out, n_in]`, then bias `[n_out]` if any.
pub fn linear(
    g: &mut GraphBuilder,
    name: &str,
    vb: &Vb,
    x: EdgeId,
    dense: Dense,
    rows: &Dim,
) -> Result<EdgeId> {
    let mut w = vec![(vb.key("weight"), vec![dense.n_out, dense.n_in])];
    if dense.bias {
        w.push((vb.key("bias"), vec![dense.n_out]));
    }
    op(
        g,
        name,
        Linear::new(dense.bias, dense.strategy),
        &[x],
        &w,
        rows,
        dense.n_out,
    )
}

/// `nn.LayerNorm(d, eps)` under `vb` (weight, bias), token-major `[rows, d]`.
pub fn layer_norm(
    g: &mut GraphBuilder,
    name: &str,
    vb: &Vb,
    x: EdgeId,
    d: usize,
    eps: f32,
    rows: &Dim,
) -> Result<EdgeId> {
    let w = [(vb.key("weight"), vec![d]), (vb.key("bias"), vec![d])];
    op(g, name, LayerNorm::new(eps), &[x], &w, rows, d)
}

/// `nn.Conv1d(c_in, c_out, kernel, stride, padding)` under `vb` (weight, bias), channel-major
/// `[c_out, frames_out]`.
pub fn conv1d(
    g: &mut GraphBuilder,
    name: &str,
    vb: &Vb,
    x: EdgeId,
    conv: Conv1d,
    (c_in, c_out): (usize, usize),
    frames_out: Dim,
) -> Result<EdgeId> {
    let k = conv.kernel;
    g.op1(
        name,
        Box::new(conv),
        &[x],
        &[
            (&vb.key("weight"), vec![c_out, c_in, k]),
            (&vb.key("bias"), vec![c_out]),
        ],
        vec![c_out.into(), frames_out],
        Layout::ChannelMajor,
    )
}

/// A weightless op with one input and one output of `shape` in `layout` (activations, layout
/// changes).
pub fn unary(
    g: &mut GraphBuilder,
    name: &str,
    kernel: impl Kernel + 'static,
    x: EdgeId,
    shape: Shape,
    layout: Layout,
) -> Result<EdgeId> {
    g.op1(name, Box::new(kernel), &[x], &[], shape, layout)
}

/// Residual `a + scale * b`, token-major `[rows, d]`.
pub fn add(
    g: &mut GraphBuilder,
    name: &str,
    (a, b): (EdgeId, EdgeId),
    scale: f32,
    rows: &Dim,
    d: usize,
) -> Result<EdgeId> {
    op(g, name, Add::scaled(scale), &[a, b], &[], rows, d)
}

/// Token-major `[rows, heads * head_dim]` to head-major `[heads, rows, head_dim]`.
pub fn split_heads(
    g: &mut GraphBuilder,
    name: &str,
    x: EdgeId,
    heads: usize,
    rows: &Dim,
    head_dim: usize,
) -> Result<EdgeId> {
    g.op1(
        name,
        Box::new(SplitHeads { heads }),
        &[x],
        &[],
        vec![heads.into(), rows.clone(), head_dim.into()],
        Layout::HeadMajor,
    )
}

/// Head-major `[heads, rows, head_dim]` back to token-major `[rows, d]`.
pub fn merge_heads(
    g: &mut GraphBuilder,
    name: &str,
    x: EdgeId,
    rows: &Dim,
    d: usize,
) -> Result<EdgeId> {
    op(g, name, MergeHeads, &[x], &[], rows, d)
}

#[cfg(test)]
mod tests {
    use super::Vb;

    #[test]
    fn vb_pushes_prefixes_like_candle_pp() {
        let vb = Vb::root("model.encoder").pp("layers").pp(3);
        assert_eq!(vb.path(), "model.encoder.layers.3");
        assert_eq!(
            vb.pp("fc1").key("weight"),
            "model.encoder.layers.3.fc1.weight"
        );
        assert_eq!(Vb::root("").pp("encoder").key("out"), "encoder.out");
    }
}
