//! Checkpoint contracts (`core/contracts/<family>.json`, doc: docs/checkpoint-contracts.md):
//! the canonical checkpoint names of a family with their symbolic shapes, layouts, producers,
//! checkpoint-level edges and the HF reference capture recipe. The file is embedded here and its
//! text is handed to the Python oracle, so both sides read the same facts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{CoreError, Result};
use crate::Layout;

/// The contract text of a family, embedded at build time.
pub fn contract_text(family: &str) -> Option<&'static str> {
    match family {
        "whisper" => Some(include_str!("../contracts/whisper.json")),
        "granite_nar" => Some(include_str!("../contracts/granite_nar.json")),
        _ => None,
    }
}

/// Families with a contract.
pub const FAMILIES: &[&str] = &["whisper", "granite_nar"];

/// When a checkpoint exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Steps {
    /// Once per input, at step 0 (encoder tensors).
    Once,
    /// Once per input, at step 0, produced by the decoder prefill (projection caches).
    Prefill,
    /// At every decode step.
    Every,
}

/// Which step an upstream checkpoint-level edge refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepRef {
    /// The same step as the consumer (or step 0 when the upstream exists once).
    Same,
    /// Step 0.
    Prefill,
    /// The consumer's step minus one (only for steps >= 1; a recurrence such as a KV cache).
    Previous,
}

/// One checkpoint as written in the contract file (templates unexpanded).
#[derive(Debug, Clone, Deserialize)]
pub struct RawCheckpoint {
    /// Name template (`audio.decoder.layer.{layer}.out`).
    pub name: String,
    /// Repeat count name (from `repeats`), if templated by `{layer}`.
    #[serde(default)]
    pub repeat: Option<String>,
    /// Restricts the repeat to `[start, end)` (expressions); `inputs_at_first` applies to `start`.
    #[serde(default)]
    pub range: Option<[String; 2]>,
    /// When it exists.
    pub steps: Steps,
    /// Optional kind (`logits` adds argmax/top-k/KL metrics).
    #[serde(default)]
    pub kind: Option<String>,
    /// Symbolic shape (dim names from `dims`, run-time symbols, or integers as strings).
    pub shape: Vec<String>,
    /// Canonical layout.
    pub layout: Layout,
    /// Producing op name template.
    pub producer: String,
    /// Upstream checkpoints (`NAME` or `NAME@prefill` / `NAME@previous`).
    #[serde(default)]
    pub inputs: Vec<String>,
    /// Replaces `inputs` for the first repeat (layer 0).
    #[serde(default)]
    pub inputs_at_first: Option<Vec<String>>,
    /// How the HF reference captures it (read by the oracle).
    #[serde(default)]
    pub reference: serde_json::Value,
}

/// A contract file.
#[derive(Debug, Clone, Deserialize)]
pub struct ContractFile {
    /// `xray.contract/v1`.
    pub schema: String,
    /// Family name.
    pub family: String,
    /// Named dims: expressions over config keys.
    #[serde(default)]
    pub dims: BTreeMap<String, String>,
    /// Named repeat counts: expressions over config keys.
    #[serde(default)]
    pub repeats: BTreeMap<String, String>,
    /// Integer lists read from the config (`{each:NAME}` in inputs expands once per element).
    #[serde(default)]
    pub lists: BTreeMap<String, ListSpec>,
    /// Data-dependent dims and how they relate (documentation for readers; checked per run).
    #[serde(default)]
    pub symbols: BTreeMap<String, String>,
    /// Checkpoint templates in graph order.
    pub checkpoints: Vec<RawCheckpoint>,
}

/// An integer list from the config, wrapped Python-style into `[0, wrap)`.
#[derive(Debug, Clone, Deserialize)]
pub struct ListSpec {
    /// Config key of the list.
    pub config: String,
    /// Negative elements wrap modulo this expression.
    #[serde(default)]
    pub wrap: Option<String>,
}

/// One dimension of a resolved checkpoint shape: the same [`Dim`] the runtime's graph declares.
pub use crate::Dim as CDim;

/// A checkpoint with templates expanded against a config.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointSpec {
    /// Canonical name.
    pub name: String,
    /// When it exists.
    pub steps: Steps,
    /// `logits` or none.
    pub kind: Option<String>,
    /// Shape.
    pub shape: Vec<CDim>,
    /// The axes' names as the contract writes the shape (`heads`, `tokens`, `past+tokens`).
    pub axes: Vec<String>,
    /// Canonical layout.
    pub layout: Layout,
    /// Producing op.
    pub producer: String,
    /// Upstream checkpoints.
    pub inputs: Vec<(String, StepRef)>,
    /// Repeat index (layer) if templated.
    pub layer: Option<usize>,
    /// Repeat group name (`decoder_layers`) if templated.
    pub repeat: Option<String>,
    /// Position in the contract's graph order.
    pub order: usize,
}

/// A contract resolved against one model config.
#[derive(Debug, Clone)]
pub struct Contract {
    /// Family.
    pub family: String,
    /// Resolved dims.
    pub dims: BTreeMap<String, usize>,
    /// Resolved repeat counts.
    pub repeats: BTreeMap<String, usize>,
    /// Checkpoints in graph order.
    pub checkpoints: Vec<CheckpointSpec>,
    /// Data-dependent symbols and their relations (from the contract file).
    pub symbols: BTreeMap<String, String>,
    /// The raw contract text (handed to the oracle).
    pub text: String,
}

fn cerr(family: &str, reason: impl Into<String>) -> CoreError {
    CoreError::Contract {
        family: family.to_string(),
        reason: reason.into(),
    }
}

/// Look up a config key (dotted paths walk nested objects) as an integer.
fn config_int(config: &serde_json::Value, key: &str) -> Option<i64> {
    let mut v = config;
    for part in key.split('.') {
        v = v.get(part)?;
    }
    v.as_i64()
}

/// Evaluate `a`, `a * b`, `a / b`, `a + b - c` (left to right, `*` `/` before `+` `-`), where each
/// term is an integer, a variable, or a config key. Division must be exact.
pub fn eval_expr(
    expr: &str,
    vars: &dyn Fn(&str) -> Option<i64>,
) -> std::result::Result<i64, String> {
    let toks: Vec<String> = tokenize(expr);
    if toks.is_empty() {
        return Err(format!("empty expression '{expr}'"));
    }
    let term = |t: &str| -> std::result::Result<i64, String> {
        if let Ok(n) = t.parse::<i64>() {
            return Ok(n);
        }
        vars(t)
            .ok_or_else(|| format!("'{t}' is not a known dim, repeat or config key (in '{expr}')"))
    };
    // Split into additive terms, each a product chain.
    let mut total: i64 = 0;
    let mut sign = 1i64;
    let mut i = 0;
    while i < toks.len() {
        let mut acc = term(&toks[i])?;
        i += 1;
        while i + 1 < toks.len() && (toks[i] == "*" || toks[i] == "/") {
            let rhs = term(&toks[i + 1])?;
            if toks[i] == "*" {
                acc *= rhs;
            } else {
                if rhs == 0 || acc % rhs != 0 {
                    return Err(format!("'{expr}': {acc} is not divisible by {rhs}"));
                }
                acc /= rhs;
            }
            i += 2;
        }
        total += sign * acc;
        if i < toks.len() {
            sign = match toks[i].as_str() {
                "+" => 1,
                "-" => -1,
                o => return Err(format!("unexpected '{o}' in '{expr}'")),
            };
            i += 1;
            if i >= toks.len() {
                return Err(format!("dangling operator in '{expr}'"));
            }
        }
    }
    Ok(total)
}

fn tokenize(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in s.chars() {
        if "+-*/".contains(c) {
            if !cur.trim().is_empty() {
                out.push(cur.trim().to_string());
            }
            cur.clear();
            out.push(c.to_string());
        } else {
            cur.push(c);
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

impl Contract {
    /// sha256 of the contract text: which contract a comparison was made through (evidence
    /// records it; `xray gate` refuses evidence made through another contract).
    pub fn sha256(&self) -> String {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(self.text.as_bytes()))
    }

    /// Parse a family's embedded contract and resolve it against a model's config.json value.
    pub fn for_family(family: &str, config: &serde_json::Value) -> Result<Contract> {
        let text =
            contract_text(family).ok_or_else(|| cerr(family, "no contract for this family"))?;
        Contract::parse(text, config)
    }

    /// Parse a contract text and resolve it against a config.
    pub fn parse(text: &str, config: &serde_json::Value) -> Result<Contract> {
        let file: ContractFile = serde_json::from_str(text)
            .map_err(|e| cerr("?", format!("contract JSON does not parse: {e}")))?;
        let fam = file.family.clone();
        if file.schema != "xray.contract/v1" {
            return Err(cerr(&fam, format!("unknown schema '{}'", file.schema)));
        }
        let mut dims = BTreeMap::new();
        for (k, e) in &file.dims {
            let v = eval_expr(e, &|t| config_int(config, t))
                .map_err(|r| cerr(&fam, format!("dim '{k}': {r}")))?;
            if v <= 0 {
                return Err(cerr(
                    &fam,
                    format!("dim '{k}' = {e} = {v} must be positive"),
                ));
            }
            dims.insert(k.clone(), v as usize);
        }
        let mut repeats = BTreeMap::new();
        for (k, e) in &file.repeats {
            let v = eval_expr(e, &|t| {
                config_int(config, t).or_else(|| dims.get(t).map(|&d| d as i64))
            })
            .map_err(|r| cerr(&fam, format!("repeat '{k}': {r}")))?;
            if v <= 0 {
                return Err(cerr(&fam, format!("repeat '{k}' = {v} must be positive")));
            }
            repeats.insert(k.clone(), v as usize);
        }
        let global = |t: &str| -> Option<i64> {
            repeats
                .get(t)
                .or_else(|| dims.get(t))
                .map(|&n| n as i64)
                .or_else(|| config_int(config, t))
        };
        let mut lists: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for (k, l) in &file.lists {
            let mut v = config;
            for part in l.config.split('.') {
                v = v.get(part).ok_or_else(|| {
                    cerr(&fam, format!("list '{k}': config has no '{}'", l.config))
                })?;
            }
            let raw: Vec<i64> = serde_json::from_value(v.clone()).map_err(|_| {
                cerr(
                    &fam,
                    format!(
                        "list '{k}': config '{}' is not a list of integers",
                        l.config
                    ),
                )
            })?;
            let wrap = match &l.wrap {
                Some(w) => Some(
                    eval_expr(w, &global)
                        .map_err(|r| cerr(&fam, format!("list '{k}' wrap: {r}")))?,
                ),
                None => None,
            };
            let vals = raw
                .into_iter()
                .map(|x| match wrap {
                    Some(w) if x < 0 => x.rem_euclid(w),
                    _ => x,
                })
                .collect();
            lists.insert(k.clone(), vals);
        }
        // Consecutive templates repeating over the same key (and range) form a group, expanded
        // layer-major (layer 0 of each, then layer 1, ...) so the order follows depth, as the
        // harness's `localize::expand_templates` does.
        let mut group = Vec::with_capacity(file.checkpoints.len());
        for (ti, raw) in file.checkpoints.iter().enumerate() {
            let same = ti > 0 && raw.repeat.is_some() && {
                let prev = &file.checkpoints[ti - 1];
                prev.repeat == raw.repeat && prev.range == raw.range
            };
            let g = match group.last() {
                Some(&g) if same => g,
                Some(&g) => g + 1,
                None => 0usize,
            };
            group.push(g);
        }
        let mut sort_keys: Vec<(usize, usize, usize)> = Vec::new();
        let mut checkpoints = Vec::new();
        for (ti, raw) in file.checkpoints.iter().enumerate() {
            let layers: Vec<Option<usize>> = match &raw.repeat {
                Some(r) => {
                    let n = *repeats.get(r).ok_or_else(|| {
                        cerr(&fam, format!("'{}' repeats over unknown '{r}'", raw.name))
                    })?;
                    let (lo, hi) = match &raw.range {
                        Some([a, b]) => {
                            let lo = eval_expr(a, &global)
                                .map_err(|e| cerr(&fam, format!("range of '{}': {e}", raw.name)))?;
                            let hi = eval_expr(b, &global)
                                .map_err(|e| cerr(&fam, format!("range of '{}': {e}", raw.name)))?;
                            if lo < 0 || hi as usize > n || lo > hi {
                                return Err(cerr(
                                    &fam,
                                    format!("range [{lo}, {hi}) of '{}' outside 0..{n}", raw.name),
                                ));
                            }
                            (lo as usize, hi as usize)
                        }
                        None => (0, n),
                    };
                    (lo..hi).map(Some).collect()
                }
                None => vec![None],
            };
            let first = layers.first().copied().flatten();
            for layer in layers {
                let each: std::cell::Cell<Option<i64>> = std::cell::Cell::new(None);
                let vars = |t: &str| -> Option<i64> {
                    if t.starts_with("each:") {
                        return each.get();
                    }
                    if t == "layer" {
                        return layer.map(|l| l as i64);
                    }
                    if let Some(r) = t.strip_prefix("last:") {
                        return repeats.get(r.trim()).map(|&n| n as i64 - 1);
                    }
                    repeats
                        .get(t)
                        .or_else(|| dims.get(t))
                        .map(|&n| n as i64)
                        .or_else(|| config_int(config, t))
                };
                let expand = |tpl: &str| -> Result<Option<String>> {
                    let mut out = String::new();
                    let mut rest = tpl;
                    while let Some(open) = rest.find('{') {
                        out.push_str(&rest[..open]);
                        let close = rest[open..]
                            .find('}')
                            .ok_or_else(|| cerr(&fam, format!("unclosed '{{' in '{tpl}'")))?
                            + open;
                        let v = eval_expr(&rest[open + 1..close], &vars)
                            .map_err(|r| cerr(&fam, format!("'{tpl}': {r}")))?;
                        if v < 0 {
                            return Ok(None);
                        }
                        out.push_str(&v.to_string());
                        rest = &rest[close + 1..];
                    }
                    out.push_str(rest);
                    Ok(Some(out))
                };
                let name = expand(&raw.name)?
                    .ok_or_else(|| cerr(&fam, format!("'{}' expands negative", raw.name)))?;
                let producer = expand(&raw.producer)?
                    .ok_or_else(|| cerr(&fam, format!("producer of '{name}' expands negative")))?;
                let inputs_tpl = match (&raw.inputs_at_first, layer) {
                    (Some(f), Some(l)) if Some(l) == first => f,
                    _ => &raw.inputs,
                };
                let mut inputs = Vec::new();
                for i in inputs_tpl {
                    let (n, step) = match i.split_once('@') {
                        Some((n, "prefill")) => (n, StepRef::Prefill),
                        Some((n, "previous")) => (n, StepRef::Previous),
                        Some((_, s)) => {
                            return Err(cerr(
                                &fam,
                                format!("input '{i}' of '{name}': unknown step '@{s}'"),
                            ))
                        }
                        None => (i.as_str(), StepRef::Same),
                    };
                    let elems: Vec<Option<i64>> = match n.find("each:") {
                        Some(at) => {
                            let list: String = n[at + 5..]
                                .chars()
                                .take_while(|c| c.is_alphanumeric() || *c == '_')
                                .collect();
                            let l = lists.get(&list).ok_or_else(|| {
                                cerr(
                                    &fam,
                                    format!("input '{i}' of '{name}': unknown list '{list}'"),
                                )
                            })?;
                            l.iter().map(|&x| Some(x)).collect()
                        }
                        None => vec![None],
                    };
                    for el in elems {
                        each.set(el);
                        let n = expand(n)?.ok_or_else(|| {
                            cerr(&fam, format!("input '{i}' of '{name}' expands to a negative layer; declare inputs_at_first"))
                        })?;
                        inputs.push((n, step));
                    }
                }
                let shape = raw
                    .shape
                    .iter()
                    .map(|d| {
                        if let Ok(n) = d.parse::<usize>() {
                            CDim::Fixed(n)
                        } else if let Some(&n) = dims.get(d) {
                            CDim::Fixed(n)
                        } else {
                            CDim::Sym(d.clone())
                        }
                    })
                    .collect();
                sort_keys.push((group[ti], layer.unwrap_or(0), ti));
                checkpoints.push(CheckpointSpec {
                    name,
                    steps: raw.steps,
                    kind: raw.kind.clone(),
                    shape,
                    axes: raw.shape.clone(),
                    layout: raw.layout,
                    producer,
                    inputs,
                    layer,
                    repeat: raw.repeat.clone(),
                    order: checkpoints.len(),
                });
            }
        }
        let mut keyed: Vec<_> = sort_keys.into_iter().zip(checkpoints).collect();
        keyed.sort_by_key(|(k, _)| *k);
        let checkpoints: Vec<CheckpointSpec> = keyed
            .into_iter()
            .enumerate()
            .map(|(i, (_, mut c))| {
                c.order = i;
                c
            })
            .collect();
        // Every input must name a checkpoint of the contract.
        for c in &checkpoints {
            for (i, _) in &c.inputs {
                if !checkpoints.iter().any(|d| &d.name == i) {
                    return Err(cerr(
                        &fam,
                        format!("'{}' lists unknown input checkpoint '{i}'", c.name),
                    ));
                }
            }
        }
        Ok(Contract {
            family: fam,
            dims,
            repeats,
            checkpoints,
            symbols: file.symbols.clone(),
            text: text.to_string(),
        })
    }

    /// A checkpoint by canonical name.
    pub fn get(&self, name: &str) -> Option<&CheckpointSpec> {
        self.checkpoints.iter().find(|c| c.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions() {
        let cfg = serde_json::json!({"d_model": 384, "heads": 6, "n": {"layers": 4}});
        let v = |t: &str| config_int(&cfg, t);
        assert_eq!(eval_expr("d_model / heads", &v), Ok(64));
        assert_eq!(eval_expr("2 * d_model", &v), Ok(768));
        assert_eq!(eval_expr("n.layers / 2 - 1", &v), Ok(1));
        assert!(eval_expr("d_model / 5", &v)
            .unwrap_err()
            .contains("not divisible"));
        assert!(eval_expr("missing_key", &v)
            .unwrap_err()
            .contains("missing_key"));
    }

    #[test]
    fn whisper_contract_expands() {
        let cfg = serde_json::json!({
            "num_mel_bins": 80, "max_source_positions": 1500, "d_model": 384,
            "decoder_attention_heads": 6, "vocab_size": 51864, "encoder_layers": 4, "decoder_layers": 4
        });
        let c = Contract::for_family("whisper", &cfg).unwrap();
        let x = c
            .get("audio.decoder.layer.3.cross_attention.output")
            .unwrap();
        assert_eq!(
            x.shape,
            vec![CDim::Fixed(6), CDim::Sym("tokens".into()), CDim::Fixed(64)]
        );
        assert_eq!(x.layout, Layout::HeadMajor);
        assert!(x.inputs.contains(&(
            "audio.decoder.layer.3.cross_k".to_string(),
            StepRef::Prefill
        )));
        let l0 = c.get("audio.encoder.layer.0.out").unwrap();
        assert_eq!(
            l0.inputs,
            vec![("audio.encoder.conv2.out".to_string(), StepRef::Same)]
        );
        let logits = c.get("audio.decoder.logits").unwrap();
        assert_eq!(logits.inputs[0].0, "audio.decoder.layer.3.out");
    }

    #[test]
    fn granite_contract_expands_ranges_and_lists() {
        let cfg_text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/build/granite-nar-tiny/config.json"
        ));
        let Ok(cfg_text) = cfg_text else {
            eprintln!("skip: granite fixture not built (make fixtures)");
            return;
        };
        let cfg: serde_json::Value = serde_json::from_str(&cfg_text).unwrap();
        let c = Contract::for_family("granite_nar", &cfg).unwrap();
        let n = c.repeats["enc_layers"];
        let sc = c.dims["sc_layer"];
        let names: Vec<&str> = c.checkpoints.iter().map(|c| c.name.as_str()).collect();
        let pos = |s: &str| names.iter().position(|n| *n == s).unwrap();
        // The bypass sits between block sc-1 and block sc, in graph order.
        assert!(pos(&format!("enc.block.{}.out", sc - 1)) < pos("enc.ctc_logits"));
        assert!(pos("enc.mid_blank_probs") < pos(&format!("enc.block.{sc}.out")));
        let after = c.get(&format!("enc.block.{sc}.out")).unwrap();
        assert!(after.inputs.iter().any(|(i, _)| i == "enc.ctc_logits"));
        let cat = c.get("enc.cat_out").unwrap();
        assert!(cat
            .inputs
            .iter()
            .any(|(i, _)| *i == format!("enc.block.{}.out", n - 1)));
        assert_eq!(
            names.iter().filter(|x| x.starts_with("enc.block.")).count(),
            n
        );
    }

    #[test]
    fn bad_geometry_fails_closed() {
        let cfg = serde_json::json!({
            "num_mel_bins": 80, "max_source_positions": 1500, "d_model": 384,
            "decoder_attention_heads": 5, "vocab_size": 51864, "encoder_layers": 4, "decoder_layers": 4
        });
        let e = Contract::for_family("whisper", &cfg)
            .unwrap_err()
            .to_string();
        assert!(e.contains("head_dim") && e.contains("not divisible"), "{e}");
    }
}
