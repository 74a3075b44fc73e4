//! Checkpoint contracts (`core/contracts/<family>.json`, doc: docs/checkpoint-contracts.md):
//! the canonical checkpoint names of a family with their symbolic shapes, layouts, producers,
//! checkpoint-level edges and the HF reference capture recipe. The file is embedded here and its
//! text is handed to the Python oracle, so both sides read the same facts.

use crate::Step;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{CoreError, Result};
use crate::Layout;

mod attention;
mod expr;
mod points;
pub use attention::{core_of, AttentionRule, Operand};
pub use expr::{eval_expr, Lookup};
pub use points::{rule_for, PointRule};

include!(concat!(env!("OUT_DIR"), "/contracts.rs"));

/// The contract text of a family, embedded at build time (every `core/contracts/<family>.json`).
pub fn contract_text(family: &str) -> Option<&'static str> {
    CONTRACTS
        .iter()
        .find(|(f, _)| *f == family)
        .map(|(_, t)| *t)
}

/// Families with a contract.
pub fn families() -> impl Iterator<Item = &'static str> {
    CONTRACTS.iter().map(|(f, _)| *f)
}

/// `schema` of [`Contract::resolved_json`].
pub const RESOLVED_SCHEMA: &str = "xray.contract.resolved/v1";

/// The largest integer a contract reads from a config (a dim or a count): 2^24. The largest real
/// values are vocabularies of a few hundred thousand and context lengths of 131072; a config
/// above this is refused naming the key, before anything is sized by it.
pub const MAX_CONFIG_INT: u64 = 1 << 24;

/// The most repeats (layers) a contract expands a template over: every repeat is a checkpoint
/// per template, so this bounds the resolved contract (speech models have at most 48 layers,
/// the deepest language models about 128). Engines building a graph per layer use the same
/// bound ([`check_count`]).
pub const MAX_REPEAT: usize = 1024;

/// The longest integer list a contract reads from a config (`lists`, layer indices).
pub const MAX_LIST_LEN: usize = 4096;

/// What a JSON value is, for messages: `a string "64"`, `the number 64.5`, `null`.
pub fn json_kind(v: &serde_json::Value) -> String {
    use serde_json::Value as V;
    let clip = |t: String| {
        if t.chars().count() > 40 {
            format!("{}...", t.chars().take(40).collect::<String>())
        } else {
            t
        }
    };
    match v {
        V::Null => "null".into(),
        V::Bool(b) => format!("a boolean {b}"),
        V::Number(n) => format!("the number {}", clip(n.to_string())),
        V::String(t) => format!("a string {}", clip(format!("{t:?}"))),
        V::Array(a) => format!("an array of {} element(s)", a.len()),
        V::Object(_) => "an object".into(),
    }
}

/// A count or dim read from a file, checked against `max`: `key` names it in the error (`config.json
/// key 'decoder_layers' is 100000, above 1024, the most X-Ray accepts`). The one bound every
/// reader of config counts applies (the contract resolver, the runtime's config checks).
pub fn check_count(key: &str, value: u64, max: u64) -> std::result::Result<u64, String> {
    if value > max {
        return Err(format!(
            "config.json key '{key}' is {value}, above {max}, the most X-Ray accepts"
        ));
    }
    Ok(value)
}

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

impl Steps {
    /// Whether a checkpoint with these steps exists at `step`.
    pub fn present_at(self, step: Step) -> bool {
        matches!(self, Steps::Every) || step == 0
    }
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
#[serde(deny_unknown_fields)]
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
    /// How the HF reference captures it (read by the oracle; `module` may hold templates).
    pub reference: Reference,
}

/// Where a forward hook sits on the reference's module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hook {
    /// A forward hook: the module's output.
    Forward,
    /// A forward pre-hook: the module's input.
    Pre,
}

/// A transform the oracle applies to a captured reference tensor, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Transform {
    /// Drop a leading batch axis of 1.
    SqueezeBatch,
    /// `[windows, per_window, d]` -> `[windows * per_window, d]`
    /// (`{"flatten_windows": {"per_window": "n_query"}}`): `per_window` names the dim of the
    /// window's length, checked on the reference's tensor and what a replay needs to restore the
    /// windows of an engine's flat rows.
    FlattenWindows {
        /// A dim of the contract.
        per_window: String,
    },
    /// `[T, heads * head_dim]` -> `[heads, T, head_dim]` (needs dims `heads` and `head_dim`).
    SplitHeads,
    /// Keep the first `to` entries along `axis` (`{"crop": {"axis": 0, "to": "enc_frames"}}`):
    /// the reference padded that axis (a conformer attention's right padding to whole context
    /// blocks). `to` names a dim or a run-time symbol; the tensor must be at least that long.
    Crop {
        /// Axis (after the transforms before it).
        axis: usize,
        /// A dim or symbol of the contract.
        to: String,
    },
}

/// How the HF reference captures a checkpoint: a hook on a module, which element of its output
/// (or positional input, or keyword input) and the transforms that bring it to the contract's
/// shape and layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reference {
    /// Dotted module path (`model.encoder.layers.3.fc2`).
    pub module: String,
    /// Output or input.
    pub hook: Hook,
    /// Tuple index into the output / positional inputs; 0 on a bare tensor means the tensor.
    #[serde(default)]
    pub index: usize,
    /// Pre-hook only: capture this keyword argument instead of a positional input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kwarg: Option<String>,
    /// Applied in order.
    #[serde(default)]
    pub transform: Vec<Transform>,
}

/// A contract file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContractFile {
    /// `xray.contract/v1`.
    pub schema: String,
    /// Family name.
    pub family: String,
    /// The transformers class the oracle loads.
    #[serde(default)]
    pub hf_class: Option<String>,
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
    /// How the reference's op-level points map to the engine's layout ([`PointRule`]).
    #[serde(default)]
    pub points: Vec<PointRule>,
    /// Which points feed and leave each attention module's core ([`AttentionRule`]).
    #[serde(default)]
    pub attention: Vec<AttentionRule>,
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointSpec {
    /// Canonical name.
    pub name: String,
    /// The name template it was expanded from (`audio.decoder.layer.{layer}.out`).
    pub template: String,
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
    /// How the HF reference captures it, templates expanded.
    pub reference: Reference,
}

impl CheckpointSpec {
    /// A spec with only what a checkpoint graph reads: name, steps and inputs (producer
    /// `op.NAME`, no shape, no reference recipe), for synthetic graphs in tests and tools.
    pub fn bare(name: &str, steps: Steps, inputs: Vec<(&str, StepRef)>) -> CheckpointSpec {
        CheckpointSpec {
            name: name.into(),
            template: name.into(),
            steps,
            kind: None,
            shape: vec![],
            axes: vec![],
            layout: Layout::Plain,
            producer: format!("op.{name}"),
            inputs: inputs
                .into_iter()
                .map(|(n, r)| (n.to_string(), r))
                .collect(),
            layer: None,
            repeat: None,
            order: 0,
            reference: Reference {
                module: String::new(),
                hook: Hook::Forward,
                index: 0,
                kwarg: None,
                transform: vec![],
            },
        }
    }
}

/// The names the resolved contract speaks in, shipped in [`Contract::resolved_json`] as
/// `vocabulary` so the oracle reads them instead of typing them again: each enum's serde
/// names, in declaration order (`steps`: [`Steps`], `step_refs`: [`StepRef`], `layouts`:
/// [`Layout`], `hooks`: [`Hook`], `sides`: [`crate::ops::Side`], `transforms`: [`Transform`],
/// a keyed transform by its key). The variants are listed here once; a unit test holds each list
/// to the enum's own (serde's list of variant names).
pub fn vocabulary() -> serde_json::Value {
    use crate::ops::Side;
    serde_json::json!({
        "steps": serde_names(&[Steps::Once, Steps::Prefill, Steps::Every]),
        "step_refs": serde_names(&[StepRef::Same, StepRef::Prefill, StepRef::Previous]),
        "layouts": serde_names(&[Layout::TokenMajor, Layout::HeadMajor, Layout::ChannelMajor, Layout::Plain]),
        "hooks": serde_names(&[Hook::Forward, Hook::Pre]),
        "sides": serde_names(&[Side::In, Side::Out, Side::Keys, Side::Values]),
        "transforms": serde_names(&[
            Transform::SqueezeBatch,
            Transform::FlattenWindows { per_window: String::new() },
            Transform::SplitHeads,
            Transform::Crop { axis: 0, to: String::new() },
        ]),
    })
}

/// Each value's serde name: a unit variant serializes as its name, a struct variant as a
/// one-key object keyed by it.
fn serde_names<T: Serialize>(all: &[T]) -> Vec<String> {
    all.iter()
        .filter_map(|v| match serde_json::to_value(v).ok()? {
            serde_json::Value::String(s) => Some(s),
            serde_json::Value::Object(o) if o.len() == 1 => o.keys().next().cloned(),
            _ => None,
        })
        .collect()
}

/// A contract resolved against one model config.
#[derive(Debug, Clone)]
pub struct Contract {
    /// Family.
    pub family: String,
    /// The transformers class the oracle loads.
    pub hf_class: Option<String>,
    /// Resolved dims.
    pub dims: BTreeMap<String, usize>,
    /// Resolved repeat counts.
    pub repeats: BTreeMap<String, usize>,
    /// Resolved integer lists (wrapped into range).
    pub lists: BTreeMap<String, Vec<i64>>,
    /// Checkpoints in graph order.
    pub checkpoints: Vec<CheckpointSpec>,
    /// Data-dependent symbols and their relations (from the contract file).
    pub symbols: BTreeMap<String, String>,
    /// The op-level point rules, in file order ([`PointRule`]).
    pub points: Vec<PointRule>,
    /// The attention cores' points, in file order ([`AttentionRule`]).
    pub attention: Vec<AttentionRule>,
    /// The raw contract text (handed to the oracle).
    pub text: String,
}

fn cerr(family: &str, reason: impl Into<String>) -> CoreError {
    CoreError::Contract {
        family: family.to_string(),
        reason: reason.into(),
    }
}

/// Look up a config key (dotted paths walk nested objects) as a non-negative integer within
/// [`MAX_CONFIG_INT`]: `Ok(None)` when the config has no such key (the name may be something
/// else), an error naming the key and what it holds when it is there but is no such integer (a
/// string, a fraction, null, a negative or too large number).
pub fn config_int(config: &serde_json::Value, key: &str) -> Lookup {
    let mut v = config;
    let mut walked = String::new();
    for part in key.split('.') {
        v = match v {
            serde_json::Value::Object(o) => match o.get(part) {
                Some(x) => x,
                None => return Ok(None),
            },
            // The root of a config that is not an object has no keys (its own check refuses it).
            _ if walked.is_empty() => return Ok(None),
            other => {
                return Err(format!(
                    "config.json key '{walked}' is {}, expected an object holding '{key}'",
                    json_kind(other)
                ))
            }
        };
        if !walked.is_empty() {
            walked.push('.');
        }
        walked.push_str(part);
    }
    match v.as_u64() {
        Some(n) => check_count(key, n, MAX_CONFIG_INT).map(|n| Some(n as i64)),
        None => Err(format!(
            "config.json key '{key}' is {}, expected a non-negative integer",
            json_kind(v)
        )),
    }
}

/// The names an expression can use while a contract is resolved.
struct Scope<'a> {
    config: &'a serde_json::Value,
    dims: &'a BTreeMap<String, usize>,
    repeats: &'a BTreeMap<String, usize>,
}

impl Scope<'_> {
    /// Repeats, then dims, then config keys; `last:R` is repeat R's last index.
    fn lookup(&self, t: &str) -> Lookup {
        if let Some(r) = t.strip_prefix("last:") {
            return Ok(self.repeats.get(r.trim()).map(|&n| n as i64 - 1));
        }
        match self.repeats.get(t).or_else(|| self.dims.get(t)) {
            Some(&n) => Ok(Some(n as i64)),
            None => config_int(self.config, t),
        }
    }

    /// `tpl` with every `{expr}` evaluated (`layer` and `each:LIST` bound as given); `None` when
    /// one evaluates negative (an input below layer 0).
    fn expand(
        &self,
        fam: &str,
        tpl: &str,
        layer: Option<usize>,
        each: Option<i64>,
    ) -> Result<Option<String>> {
        let vars = |t: &str| -> Lookup {
            if t.starts_with("each:") {
                return Ok(each);
            }
            if t == "layer" {
                return Ok(layer.map(|l| l as i64));
            }
            self.lookup(t)
        };
        let mut out = String::new();
        let mut rest = tpl;
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| cerr(fam, format!("unclosed '{{' in '{tpl}'")))?
                + open;
            let v = eval_expr(&rest[open + 1..close], &vars)
                .map_err(|r| cerr(fam, format!("'{tpl}': {r}")))?;
            if v < 0 {
                return Ok(None);
            }
            out.push_str(&v.to_string());
            rest = &rest[close + 1..];
        }
        out.push_str(rest);
        Ok(Some(out))
    }
}

/// Evaluate each named expression (dims, repeats); every value must be positive and at most
/// `max` (a dim computed from bounded config values can still be their product).
fn resolve_named(
    fam: &str,
    what: &str,
    exprs: &BTreeMap<String, String>,
    vars: &dyn Fn(&str) -> Lookup,
    max: u64,
) -> Result<BTreeMap<String, usize>> {
    let mut out = BTreeMap::new();
    for (k, e) in exprs {
        let v = eval_expr(e, vars).map_err(|r| cerr(fam, format!("{what} '{k}': {r}")))?;
        if v <= 0 {
            return Err(cerr(
                fam,
                format!("{what} '{k}' = {e} = {v} must be positive"),
            ));
        }
        if v as u64 > max {
            return Err(cerr(
                fam,
                format!("{what} '{k}' = {e} = {v} is above {max}, the most X-Ray accepts"),
            ));
        }
        out.insert(k.clone(), v as usize);
    }
    Ok(out)
}

/// Read each list from the config; negative elements wrap Python-style into `[0, wrap)`.
fn resolve_lists(
    fam: &str,
    lists: &BTreeMap<String, ListSpec>,
    scope: &Scope,
) -> Result<BTreeMap<String, Vec<i64>>> {
    let mut out = BTreeMap::new();
    for (k, l) in lists {
        let mut v = scope.config;
        for part in l.config.split('.') {
            v = v
                .get(part)
                .ok_or_else(|| cerr(fam, format!("list '{k}': config has no '{}'", l.config)))?;
        }
        let not_ints = |v: &serde_json::Value| {
            cerr(
                fam,
                format!(
                    "list '{k}': config.json key '{}' is {}, expected a list of integers",
                    l.config,
                    json_kind(v)
                ),
            )
        };
        let items = v.as_array().ok_or_else(|| not_ints(v))?;
        if items.len() > MAX_LIST_LEN {
            return Err(cerr(
                fam,
                format!(
                    "list '{k}': config.json key '{}' holds {} elements, above {MAX_LIST_LEN}, the most X-Ray accepts",
                    l.config,
                    items.len()
                ),
            ));
        }
        let raw: Vec<i64> = items
            .iter()
            .map(|x| x.as_i64().ok_or_else(|| not_ints(x)))
            .collect::<Result<_>>()?;
        let wrap = match &l.wrap {
            Some(w) => Some(
                eval_expr(w, &|t| scope.lookup(t))
                    .map_err(|r| cerr(fam, format!("list '{k}' wrap: {r}")))?,
            ),
            None => None,
        };
        let mut vals = Vec::with_capacity(raw.len());
        for x in raw {
            vals.push(match wrap {
                Some(w) if !(-w..w).contains(&x) => {
                    return Err(cerr(
                        fam,
                        format!("list '{k}': element {x} outside [-{w}, {w})"),
                    ))
                }
                Some(w) => x.rem_euclid(w),
                None => x,
            });
        }
        out.insert(k.clone(), vals);
    }
    Ok(out)
}

/// The repeat indices a template expands over (`[None]` when it does not repeat).
fn layers_of(fam: &str, raw: &RawCheckpoint, scope: &Scope) -> Result<Vec<Option<usize>>> {
    let Some(r) = &raw.repeat else {
        if raw.range.is_some() {
            return Err(cerr(
                fam,
                format!("'{}' has a range but no repeat", raw.name),
            ));
        }
        return Ok(vec![None]);
    };
    let n = *scope
        .repeats
        .get(r)
        .ok_or_else(|| cerr(fam, format!("'{}' repeats over unknown '{r}'", raw.name)))?;
    let (lo, hi) = match &raw.range {
        Some([a, b]) => {
            let ev = |e: &str| {
                eval_expr(e, &|t| scope.lookup(t))
                    .map_err(|r| cerr(fam, format!("range of '{}': {r}", raw.name)))
            };
            let (lo, hi) = (ev(a)?, ev(b)?);
            if lo < 0 || hi < lo || hi as usize > n {
                return Err(cerr(
                    fam,
                    format!("range [{lo}, {hi}) of '{}' outside 0..{n}", raw.name),
                ));
            }
            (lo as usize, hi as usize)
        }
        None => (0, n),
    };
    Ok((lo..hi).map(Some).collect())
}

/// The resolved inputs of one expansion of `raw` at `layer`.
fn expand_inputs(
    fam: &str,
    raw: &RawCheckpoint,
    name: &str,
    layer: Option<usize>,
    first: Option<usize>,
    scope: &Scope,
    lists: &BTreeMap<String, Vec<i64>>,
) -> Result<Vec<(String, StepRef)>> {
    let tpls = match (&raw.inputs_at_first, layer) {
        (Some(f), Some(l)) if Some(l) == first => f,
        _ => &raw.inputs,
    };
    let mut inputs = Vec::new();
    for i in tpls {
        let (n, step) = match i.split_once('@') {
            Some((n, "prefill")) => (n, StepRef::Prefill),
            Some((n, "previous")) => (n, StepRef::Previous),
            Some((_, s)) => {
                return Err(cerr(
                    fam,
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
                        fam,
                        format!("input '{i}' of '{name}': unknown list '{list}'"),
                    )
                })?;
                l.iter().map(|&x| Some(x)).collect()
            }
            None => vec![None],
        };
        for el in elems {
            let n = scope.expand(fam, n, layer, el)?.ok_or_else(|| {
                cerr(
                    fam,
                    format!(
                        "input '{i}' of '{name}' expands to a negative layer; declare inputs_at_first"
                    ),
                )
            })?;
            if !inputs.iter().any(|(x, s)| *x == n && *s == step) {
                inputs.push((n, step));
            }
        }
    }
    Ok(inputs)
}

/// Every template expanded, in graph order: consecutive templates repeating over the same key
/// (and range) form a group, expanded layer-major (layer 0 of each, then layer 1, ...) so the
/// order follows depth.
fn expand_checkpoints(
    fam: &str,
    file: &ContractFile,
    scope: &Scope,
    lists: &BTreeMap<String, Vec<i64>>,
) -> Result<Vec<CheckpointSpec>> {
    let mut group = 0usize;
    let mut keyed: Vec<((usize, usize, usize), CheckpointSpec)> = Vec::new();
    for (ti, raw) in file.checkpoints.iter().enumerate() {
        if ti > 0 {
            let prev = &file.checkpoints[ti - 1];
            let same = raw.repeat.is_some() && prev.repeat == raw.repeat && prev.range == raw.range;
            if !same {
                group += 1;
            }
        }
        let layers = layers_of(fam, raw, scope)?;
        let first = layers.first().copied().flatten();
        for layer in layers {
            let expand = |what: &str, tpl: &str| -> Result<String> {
                scope
                    .expand(fam, tpl, layer, None)?
                    .ok_or_else(|| cerr(fam, format!("{what} '{tpl}' expands to a negative index")))
            };
            let name = expand("name", &raw.name)?;
            let producer = expand("producer", &raw.producer)?;
            let module = expand("reference module", &raw.reference.module)?;
            if raw.reference.kwarg.is_some() && raw.reference.hook != Hook::Pre {
                return Err(cerr(
                    fam,
                    format!("'{name}': reference kwarg needs hook 'pre'"),
                ));
            }
            let inputs = expand_inputs(fam, raw, &name, layer, first, scope, lists)?;
            let shape = raw
                .shape
                .iter()
                .map(|d| match (d.parse::<usize>(), scope.dims.get(d)) {
                    (Ok(n), _) | (_, Some(&n)) => CDim::Fixed(n),
                    _ => CDim::Sym(d.clone()),
                })
                .collect();
            keyed.push((
                (group, layer.unwrap_or(0), ti),
                CheckpointSpec {
                    name,
                    template: raw.name.clone(),
                    steps: raw.steps,
                    kind: raw.kind.clone(),
                    shape,
                    axes: raw.shape.clone(),
                    layout: raw.layout,
                    producer,
                    inputs,
                    layer,
                    repeat: raw.repeat.clone(),
                    order: 0,
                    reference: Reference {
                        module,
                        ..raw.reference.clone()
                    },
                },
            ));
        }
    }
    keyed.sort_by_key(|(k, _)| *k);
    let checkpoints: Vec<CheckpointSpec> = keyed
        .into_iter()
        .enumerate()
        .map(|(i, (_, mut c))| {
            c.order = i;
            c
        })
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    for c in &checkpoints {
        if !seen.insert(c.name.as_str()) {
            return Err(cerr(
                fam,
                format!("two checkpoints expand to the name '{}'", c.name),
            ));
        }
    }
    for c in &checkpoints {
        for (i, _) in &c.inputs {
            if !seen.contains(i.as_str()) {
                return Err(cerr(
                    fam,
                    format!("'{}' lists unknown input checkpoint '{i}'", c.name),
                ));
            }
        }
    }
    Ok(checkpoints)
}

impl Contract {
    /// sha256 of the contract text: which contract a comparison was made through (evidence
    /// records it; `xray gate` refuses evidence made through another contract).
    pub fn sha256(&self) -> String {
        crate::sha256_hex(self.text.as_bytes())
    }

    /// sha256 of [`Contract::resolved_json`]'s text: the contract as resolved against one model's
    /// config (its dims, repeats and expanded checkpoints), what the oracle is sent; the reference
    /// cache keys a reference by it (`xray check --reference-cache`).
    pub fn resolved_sha256(&self) -> String {
        crate::sha256_hex(self.resolved_json().to_string().as_bytes())
    }

    /// Parse a family's embedded contract and resolve it against a model's config.json value.
    pub fn for_family(family: &str, config: &serde_json::Value) -> Result<Contract> {
        let text =
            contract_text(family).ok_or_else(|| cerr(family, "no contract for this family"))?;
        Contract::parse(text, config)
    }

    /// Parse a contract text and resolve it against a config. Fails closed on anything unknown:
    /// a missing config key, an inexact division, a bad step, layout, hook or transform, a
    /// negative expansion, a duplicate name, an input naming no checkpoint, a symbol relation
    /// using an unknown name.
    pub fn parse(text: &str, config: &serde_json::Value) -> Result<Contract> {
        let file: ContractFile = serde_json::from_str(text)
            .map_err(|e| cerr("?", format!("contract JSON does not parse: {e}")))?;
        let fam = file.family.clone();
        if file.schema != "xray.contract/v1" {
            return Err(cerr(&fam, format!("unknown schema '{}'", file.schema)));
        }
        if !config.is_object() {
            return Err(cerr(
                &fam,
                format!("config.json is {}, expected an object", json_kind(config)),
            ));
        }
        // Every integer read from the config is bounded (MAX_CONFIG_INT), and so are the
        // resolved dims and the repeats (MAX_REPEAT), before anything is sized by them.
        let dims = resolve_named(
            &fam,
            "dim",
            &file.dims,
            &|t| config_int(config, t),
            MAX_CONFIG_INT,
        )?;
        let repeats = resolve_named(
            &fam,
            "repeat",
            &file.repeats,
            &|t| match config_int(config, t)? {
                Some(v) => Ok(Some(v)),
                None => Ok(dims.get(t).map(|&d| d as i64)),
            },
            MAX_REPEAT as u64,
        )?;
        let scope = Scope {
            config,
            dims: &dims,
            repeats: &repeats,
        };
        let lists = resolve_lists(&fam, &file.lists, &scope)?;
        let checkpoints = expand_checkpoints(&fam, &file, &scope, &lists)?;
        let contract = Contract {
            family: fam,
            hf_class: file.hf_class.clone(),
            dims,
            repeats,
            lists,
            checkpoints,
            symbols: file.symbols.clone(),
            points: file.points.clone(),
            attention: file.attention.clone(),
            text: text.to_string(),
        };
        contract.check_relations_parse()?;
        contract.check_point_rules()?;
        Ok(contract)
    }

    /// The contract resolved against one config, as the JSON the Python oracle reads
    /// (`xray.contract.resolved/v1`, doc: docs/checkpoint-contracts.md). Python evaluates
    /// nothing: names, modules, shapes and inputs arrive expanded.
    pub fn resolved_json(&self) -> serde_json::Value {
        serde_json::json!({
            "schema": RESOLVED_SCHEMA,
            "family": self.family,
            "hf_class": self.hf_class,
            "contract_sha256": self.sha256(),
            "dims": self.dims,
            "repeats": self.repeats,
            "lists": self.lists,
            "symbols": self.symbols,
            "checkpoints": self.checkpoints,
            "points": self.points,
            "attention": self.attention,
            "vocabulary": vocabulary(),
        })
    }

    /// The rule declaring op-level point `name` (the first that matches), or an error naming the
    /// point: a point no rule declares has no known layout.
    pub fn point_rule(&self, name: &str) -> Result<&PointRule> {
        rule_for(&self.points, name).ok_or_else(|| {
            cerr(
                &self.family,
                format!(
                    "op-level point '{name}': no rule of the contract's 'points' declares its layout"
                ),
            )
        })
    }

    /// The op-level points that are the same tensor as checkpoint `name`, as the contract
    /// declares it (empty for an unknown name): the point the reference's hook on it reads (a
    /// forward hook's output `{module}:out`, a pre-hook's first positional input `{module}:in`,
    /// element 0, no keyword) when that point's rule brings it to the checkpoint's layout by the
    /// checkpoint's own transforms, then every point a rule declares `same_as` one of those
    /// ([`Self::point_aliases`]). An engine that writes the checkpoint may write it under these
    /// names too: the op-level drill-down then sees it (`audio.encoder.memory` is
    /// `model.encoder.layer_norm:out` and `model.encoder:out`).
    pub fn checkpoint_points(&self, name: &str) -> Vec<String> {
        let Some(c) = self.get(name) else {
            return vec![];
        };
        let r = &c.reference;
        let side = match r.hook {
            Hook::Forward => crate::ops::Side::Out,
            Hook::Pre => crate::ops::Side::In,
        };
        // The point is the hook's tensor: element 0, or the keyword argument its rule names.
        if r.kwarg.is_none() && r.index != 0 {
            return vec![];
        }
        let point = crate::ops::point_name(&r.module, side);
        match rule_for(&self.points, &point) {
            Some(rule)
                if rule.kwarg == r.kwarg
                    && rule.layout == c.layout
                    && rule.transform == r.transform =>
            {
                self.point_aliases(&point)
            }
            _ => vec![],
        }
    }

    /// `point` and every point the contract's rules declare `same_as` it, in that order.
    pub fn point_aliases(&self, point: &str) -> Vec<String> {
        let mut v = vec![point.to_string()];
        for r in &self.points {
            if r.same_as.as_deref() == Some(point) {
                for s in &r.sides {
                    v.push(crate::ops::point_name(&r.module, *s));
                }
            }
        }
        v
    }

    /// Every `same_as` the rules declare: (the module's point, the point it is the same tensor
    /// as), in file order.
    pub fn same_as(&self) -> Vec<(String, String)> {
        self.points
            .iter()
            .filter_map(|r| {
                let to = r.same_as.clone()?;
                let s = *r.sides.first()?;
                Some((crate::ops::point_name(&r.module, s), to))
            })
            .collect()
    }

    /// Point rules: valid patterns; every transform's names resolve ([`Self::check_transforms`]).
    fn check_point_rules(&self) -> Result<()> {
        for r in &self.points {
            r.check().map_err(|e| cerr(&self.family, e))?;
            self.check_transforms(&r.transform, &format!("points rule '{}'", r.module))?;
            // One tensor under two names: the same layout and form.
            if let Some(other) = &r.same_as {
                match rule_for(&self.points, other) {
                    Some(o) if o.layout == r.layout && o.transform == r.transform => {}
                    Some(o) => {
                        return Err(cerr(
                            &self.family,
                            format!(
                                "points rule '{}': same_as '{other}', whose rule '{}' declares another layout or transforms ({} {:?}, this one {} {:?})",
                                r.module, o.module, o.layout, o.transform, r.layout, r.transform
                            ),
                        ))
                    }
                    None => {
                        return Err(cerr(
                            &self.family,
                            format!(
                                "points rule '{}': same_as '{other}', which no rule declares",
                                r.module
                            ),
                        ))
                    }
                }
            }
        }
        for c in &self.checkpoints {
            self.check_transforms(&c.reference.transform, &format!("checkpoint '{}'", c.name))?;
        }
        // An attention core's points are op-level points: each has a declared layout (checked on
        // one module the pattern matches: every wildcard a segment `0`).
        for r in &self.attention {
            r.check().map_err(|e| cerr(&self.family, e))?;
            let module = r.module.replace("**", "0").replace('*', "0");
            for p in r.operands().iter().map(|o| &o.point).chain([&r.output]) {
                let point = format!("{module}.{p}");
                if rule_for(&self.points, &point).is_none() {
                    return Err(cerr(
                        &self.family,
                        format!(
                            "attention rule '{}': {point}: no rule of the contract's 'points' declares its layout",
                            r.module
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// A `crop` names a dim or a symbol; a `flatten_windows` names a dim (its window's length).
    fn check_transforms(&self, transforms: &[Transform], what: &str) -> Result<()> {
        for t in transforms {
            let bad = match t {
                Transform::Crop { to, .. }
                    if !self.dims.contains_key(to) && !self.symbols.contains_key(to) =>
                {
                    format!("crop to '{to}', which is neither a dim nor a symbol")
                }
                Transform::FlattenWindows { per_window } if !self.dims.contains_key(per_window) => {
                    format!("flatten_windows per_window '{per_window}', which is not a dim")
                }
                _ => continue,
            };
            return Err(cerr(&self.family, format!("{what}: {bad}")));
        }
        Ok(())
    }

    /// A name written in the contract's template syntax (`enc.block.{sc_layer}.out`,
    /// `dec.layer.{last:text_layers}.out`) expanded with this contract's dims and repeats, as a
    /// checkpoint of the contract. For names written outside the contract file (a fault
    /// catalogue's expected origin), so they follow the model's geometry.
    pub fn expand_name(&self, tpl: &str) -> Result<String> {
        let config = serde_json::json!({});
        let scope = Scope {
            config: &config,
            dims: &self.dims,
            repeats: &self.repeats,
        };
        let name = scope
            .expand(&self.family, tpl, None, None)?
            .ok_or_else(|| cerr(&self.family, format!("'{tpl}' expands to a negative index")))?;
        if self.get(&name).is_none() {
            return Err(cerr(
                &self.family,
                format!("'{tpl}' expands to '{name}', which is not a checkpoint of the contract"),
            ));
        }
        Ok(name)
    }

    /// Names the symbol relations use must be symbols, dims or repeats (checked once, at parse).
    fn check_relations_parse(&self) -> Result<()> {
        for (sym, expr) in &self.symbols {
            if expr == "free" || expr.is_empty() {
                continue;
            }
            eval_expr(expr, &|t| {
                Ok(if self.symbols.contains_key(t) {
                    Some(1)
                } else {
                    self.dims
                        .get(t)
                        .or_else(|| self.repeats.get(t))
                        .map(|&n| n as i64)
                })
            })
            .map_err(|r| cerr(&self.family, format!("symbol '{sym}': {r}")))?;
        }
        Ok(())
    }

    /// Check captured shapes against the contract: fixed dims equal, each symbol bound to one
    /// value per step, and the `symbols` relations hold (a relation whose symbols a partial run
    /// did not bind is skipped). `shapes` yields `(name, step, shape)`; a name the contract
    /// does not have is an error. Returns the bindings per step.
    pub fn check_shapes<'a>(
        &self,
        shapes: impl IntoIterator<Item = (&'a str, usize, &'a [usize])>,
    ) -> Result<BTreeMap<usize, BTreeMap<String, i64>>> {
        let fam = &self.family;
        let mut bound: BTreeMap<usize, BTreeMap<String, i64>> = BTreeMap::new();
        for (name, step, shape) in shapes {
            let spec = self.get(name).ok_or_else(|| {
                cerr(fam, format!("'{name}' is not a checkpoint of the contract"))
            })?;
            if shape.len() != spec.shape.len() {
                return Err(cerr(
                    fam,
                    format!(
                        "{}: shape {shape:?} has {} axes, the contract {}",
                        crate::key(name, step),
                        shape.len(),
                        spec.shape.len()
                    ),
                ));
            }
            let b = bound.entry(step).or_default();
            for (axis, (want, &got)) in spec.shape.iter().zip(shape).enumerate() {
                match want {
                    CDim::Fixed(n) if *n != got => {
                        return Err(cerr(
                            fam,
                            format!(
                                "{}: axis {axis} is {got}, the contract says {n}",
                                crate::key(name, step)
                            ),
                        ))
                    }
                    CDim::Fixed(_) => {}
                    CDim::Sym(sym) => match b.get(sym) {
                        Some(&v) if v != got as i64 => {
                            return Err(cerr(
                                fam,
                                format!(
                                "{}: symbol '{sym}' is {got} here but {v} elsewhere at this step",
                                crate::key(name, step)
                            ),
                            ))
                        }
                        _ => {
                            b.insert(sym.clone(), got as i64);
                        }
                    },
                }
            }
        }
        for (step, b) in &bound {
            for (sym, expr) in &self.symbols {
                let Some(&have) = b.get(sym) else { continue };
                if expr == "free" || expr.is_empty() {
                    continue;
                }
                let unbound = std::cell::Cell::new(false);
                let want = eval_expr(expr, &|t| {
                    let v = b.get(t).copied().or_else(|| {
                        self.dims
                            .get(t)
                            .or_else(|| self.repeats.get(t))
                            .map(|&n| n as i64)
                    });
                    if v.is_none() {
                        unbound.set(true);
                    }
                    Ok(v)
                });
                match want {
                    Ok(w) if w != have => {
                        return Err(cerr(
                            fam,
                            format!("step {step}: symbol '{sym}' = {have}, but the contract says {expr} = {w}"),
                        ))
                    }
                    Ok(_) => {}
                    Err(_) if unbound.get() => {}
                    Err(r) => return Err(cerr(fam, format!("symbol '{sym}': {r}"))),
                }
            }
        }
        Ok(bound)
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
    fn every_embedded_contract_names_its_file() {
        let names: Vec<&str> = families().collect();
        assert!(
            names.contains(&"whisper") && names.contains(&"granite_nar"),
            "{names:?}"
        );
        for (f, text) in CONTRACTS {
            let file: ContractFile = serde_json::from_str(text).unwrap();
            assert_eq!(
                file.family, *f,
                "core/contracts/{f}.json declares another family"
            );
        }
    }

    #[test]
    fn whisper_contract_expands() {
        let c = Contract::for_family("whisper", &tiny_cfg()).unwrap();
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
        let Some(cfg) = granite_tiny_cfg() else {
            return;
        };
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
        let mut cfg = tiny_cfg();
        cfg["decoder_attention_heads"] = 5.into();
        let e = Contract::for_family("whisper", &cfg)
            .unwrap_err()
            .to_string();
        assert!(e.contains("head_dim") && e.contains("not divisible"), "{e}");
    }

    /// The checkpoints that are op-level points by the contract's own declarations, with the
    /// module boundaries `same_as` declares; a checkpoint read through a keyword, or whose rule
    /// does not give its form, is none.
    #[test]
    fn checkpoints_that_are_points_follow_the_declarations() {
        let c = Contract::for_family("whisper", &tiny_cfg()).unwrap();
        assert_eq!(
            c.checkpoint_points("audio.frontend.mel"),
            ["model.encoder.conv1:in", "model.encoder:in"]
        );
        assert_eq!(
            c.checkpoint_points("audio.encoder.memory"),
            ["model.encoder.layer_norm:out", "model.encoder:out"]
        );
        assert_eq!(
            c.checkpoint_points("audio.decoder.logits"),
            ["proj_out:out"]
        );
        assert_eq!(
            c.checkpoint_points("audio.decoder.input_ids"),
            ["model.decoder.embed_tokens:in"]
        );
        // A keyword input the point's rule names: the point (WhisperPositionalEmbedding looks up
        // its `position_ids`, not its first input).
        assert_eq!(
            c.checkpoint_points("audio.decoder.position_ids"),
            ["model.decoder.embed_positions:in"]
        );
        // Split heads (no rule gives that form): not points.
        assert!(c
            .checkpoint_points("audio.decoder.layer.0.cross_k")
            .is_empty());
        assert!(c.checkpoint_points("nope").is_empty());
        assert_eq!(
            c.same_as()[0],
            (
                "model.encoder:in".to_string(),
                "model.encoder.conv1:in".to_string()
            )
        );
        // A same_as whose forms differ is refused at load.
        let mut v: serde_json::Value =
            serde_json::from_str(contract_text("whisper").unwrap()).unwrap();
        let i = index_of(&v, "points", |r| r["same_as"] == "model.encoder.conv1:in");
        v["points"][i]["layout"] = "token_major".into();
        let e = Contract::parse(&v.to_string(), &tiny_cfg())
            .unwrap_err()
            .to_string();
        assert!(e.contains("same_as 'model.encoder.conv1:in'"), "{e}");
    }

    /// The tiny Granite NAR fixture's config.json (`None`, with a skip line, when it is not built).
    fn granite_tiny_cfg() -> Option<serde_json::Value> {
        let p = crate::testing::require_fixture("fixtures/build/granite-nar-tiny/config.json")?;
        Some(serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
    }

    /// Index of the first element of the array `v[list]` that `hit` accepts.
    fn index_of(
        v: &serde_json::Value,
        list: &str,
        hit: impl Fn(&serde_json::Value) -> bool,
    ) -> usize {
        v[list].as_array().unwrap().iter().position(hit).unwrap()
    }

    fn tiny_cfg() -> serde_json::Value {
        serde_json::json!({
            "num_mel_bins": 80, "max_source_positions": 1500, "d_model": 384,
            "decoder_attention_heads": 6, "vocab_size": 51864, "encoder_layers": 4, "decoder_layers": 4
        })
    }

    #[test]
    fn resolved_json_carries_expanded_references() {
        let c = Contract::for_family("whisper", &tiny_cfg()).unwrap();
        let j = c.resolved_json();
        assert_eq!(j["schema"], RESOLVED_SCHEMA);
        assert_eq!(j["contract_sha256"], c.sha256());
        let cks = j["checkpoints"].as_array().unwrap();
        assert_eq!(cks.len(), c.checkpoints.len());
        let x = cks
            .iter()
            .find(|x| x["name"] == "audio.decoder.layer.2.cross_attention.output")
            .unwrap();
        assert_eq!(
            x["template"],
            "audio.decoder.layer.{layer}.cross_attention.output"
        );
        assert!(!x["reference"]["module"].as_str().unwrap().contains('{'));
        assert!(x["reference"]["module"].as_str().unwrap().contains(".2."));
        assert_eq!(x["shape"], serde_json::json!([6, "tokens", 64]));
        // It reads back into the same specs.
        let back: Vec<CheckpointSpec> = serde_json::from_value(j["checkpoints"].clone()).unwrap();
        assert_eq!(back, c.checkpoints);
    }

    /// The variant names serde itself knows for enum `T`, in declaration order: the list its
    /// "unknown variant" error gives (`expected `a` or `b`` / `expected one of `a`, `b`, `c``).
    fn serde_variants<T: serde::de::DeserializeOwned + std::fmt::Debug>() -> Vec<String> {
        let err = serde_json::from_str::<T>("\"__no_such_variant__\"")
            .unwrap_err()
            .to_string();
        let (_, expected) = err.split_once("expected").expect(&err);
        let names: Vec<String> = expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(String::from)
            .collect();
        assert!(!names.is_empty(), "{err}");
        names
    }

    #[test]
    fn resolved_json_ships_every_variant_of_the_vocabulary() {
        let j = Contract::for_family("whisper", &tiny_cfg())
            .unwrap()
            .resolved_json();
        let v = &j["vocabulary"];
        assert_eq!(v, &vocabulary());
        let shipped =
            |key: &str| -> Vec<String> { serde_json::from_value(v[key].clone()).unwrap() };
        let want = [
            ("steps", serde_variants::<Steps>()),
            ("step_refs", serde_variants::<StepRef>()),
            ("layouts", serde_variants::<Layout>()),
            ("hooks", serde_variants::<Hook>()),
            ("sides", serde_variants::<crate::ops::Side>()),
            ("transforms", serde_variants::<Transform>()),
        ];
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let mut want_keys: Vec<&str> = want.iter().map(|(k, _)| *k).collect();
        keys.sort_unstable();
        want_keys.sort_unstable();
        assert_eq!(keys, want_keys);
        for (key, names) in &want {
            assert_eq!(&shipped(key), names, "vocabulary '{key}'");
        }
        // The names are the ones a contract file is read with.
        assert_eq!(
            shipped("layouts"),
            ["token_major", "head_major", "channel_major", "plain"]
        );
        assert_eq!(shipped("hooks"), ["forward", "pre"]);
        assert_eq!(
            shipped("transforms"),
            ["squeeze_batch", "flatten_windows", "split_heads", "crop"]
        );
        for name in shipped("steps") {
            serde_json::from_value::<Steps>(serde_json::json!(name)).unwrap();
        }
    }

    fn edited(f: impl Fn(&mut serde_json::Value)) -> String {
        let mut v: serde_json::Value =
            serde_json::from_str(contract_text("whisper").unwrap()).unwrap();
        f(&mut v);
        v.to_string()
    }

    #[test]
    fn unknown_reference_fields_fail_closed() {
        for (what, text) in [
            (
                "hook",
                edited(|v| v["checkpoints"][0]["reference"]["hook"] = "backward".into()),
            ),
            (
                "transform",
                edited(|v| {
                    v["checkpoints"][0]["reference"]["transform"] = serde_json::json!(["squeeze"])
                }),
            ),
            (
                "typo",
                edited(|v| v["checkpoints"][0]["reference"]["modul"] = "x".into()),
            ),
            (
                "missing",
                edited(|v| {
                    v["checkpoints"][0]
                        .as_object_mut()
                        .unwrap()
                        .remove("reference");
                }),
            ),
            (
                "kwarg",
                edited(|v| v["checkpoints"][1]["reference"]["kwarg"] = "x".into()),
            ),
            (
                "dup",
                edited(|v| {
                    let c = v["checkpoints"][0].clone();
                    v["checkpoints"].as_array_mut().unwrap().push(c);
                }),
            ),
            (
                "relation",
                edited(|v| v["symbols"] = serde_json::json!({"tokens": "ceil_div(nope, 2)"})),
            ),
        ] {
            assert!(
                Contract::parse(&text, &tiny_cfg()).is_err(),
                "{what} was accepted"
            );
        }
    }

    #[test]
    fn granite_extensions_fail_closed() {
        let Some(cfg) = granite_tiny_cfg() else {
            return;
        };
        let base: serde_json::Value =
            serde_json::from_str(contract_text("granite_nar").unwrap()).unwrap();
        let parse = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v = base.clone();
            f(&mut v);
            Contract::parse(&v.to_string(), &cfg)
                .map(|_| ())
                .unwrap_err()
                .to_string()
        };
        let last = base["checkpoints"].as_array().unwrap().len() - 1;
        let e = parse(&|v| {
            v["checkpoints"][last]["inputs"] = serde_json::json!(["enc.block.{each:nope}.out"])
        });
        assert!(e.contains("unknown list 'nope'"), "{e}");
        let first = index_of(&base, "checkpoints", |c| c.get("inputs_at_first").is_some());
        let e = parse(&|v| {
            v["checkpoints"][first]
                .as_object_mut()
                .unwrap()
                .remove("inputs_at_first");
        });
        assert!(e.contains("declare inputs_at_first"), "{e}");
        let e = parse(&|v| v["encoder_layer_indices_missing"] = 1.into());
        assert!(
            e.contains("unknown field") || e.contains("does not parse"),
            "{e}"
        );
        // A window flattening names its window's length (a dim): without it no replay could
        // restore the windows; a name that is no dim is refused, on a point rule and a checkpoint.
        let qformer = index_of(&base, "points", |r| r["module"] == "projector.qformer.**");
        let e =
            parse(&|v| v["points"][qformer]["transform"] = serde_json::json!(["flatten_windows"]));
        assert!(e.contains("does not parse"), "{e}");
        let e = parse(&|v| {
            v["points"][qformer]["transform"] =
                serde_json::json!([{"flatten_windows": {"per_window": "enc_frames"}}])
        });
        assert!(
            e.contains("points rule 'projector.qformer.**': flatten_windows per_window 'enc_frames', which is not a dim"),
            "{e}"
        );
        let ck = index_of(&base, "checkpoints", |c| c["name"] == "proj.qformer.out");
        let e = parse(&|v| {
            v["checkpoints"][ck]["reference"]["transform"] =
                serde_json::json!([{"flatten_windows": {"per_window": "nope"}}])
        });
        assert!(
            e.contains("checkpoint 'proj.qformer.out': flatten_windows per_window 'nope'"),
            "{e}"
        );
        let e = parse(&|v| {
            v["points"][qformer]["transform"] =
                serde_json::json!([{"flatten_windows": {"per_window": "n_query", "x": 1}}])
        });
        assert!(e.contains("does not parse"), "{e}");
        let e = parse(&|v| {
            v["points"][0]["transform"] =
                serde_json::json!([{"crop": {"axis": 0, "to": "enc_frames", "x": 1}}])
        });
        assert!(e.contains("does not parse"), "{e}");
    }

    #[test]
    fn shapes_bind_symbols_and_check_relations() {
        let text =
            edited(|v| v["symbols"] = serde_json::json!({"tokens": "free", "past+tokens": "free"}));
        let c = Contract::parse(&text, &tiny_cfg()).unwrap();
        let out = "audio.decoder.layer.0.cross_attention.output";
        let probs = "audio.decoder.layer.0.self_attention.probs";
        let b = c
            .check_shapes([
                (out, 0, &[6usize, 3, 64][..]),
                (probs, 0, &[6usize, 3, 3][..]),
            ])
            .unwrap();
        assert_eq!(b[&0]["tokens"], 3);
        // One symbol, two values at one step.
        assert!(c
            .check_shapes([
                (out, 0, &[6usize, 3, 64][..]),
                (probs, 0, &[6usize, 4, 4][..])
            ])
            .is_err());
        // A fixed dim off by one.
        assert!(c.check_shapes([(out, 0, &[6usize, 3, 63][..])]).is_err());
        // Each step binds its own value.
        assert!(c
            .check_shapes([
                (out, 0, &[6usize, 3, 64][..]),
                (out, 1, &[6usize, 1, 64][..])
            ])
            .is_ok());
        // A relation between symbols is evaluated here (ceil_div), once both are bound.
        let text = edited(|v| {
            v["symbols"] =
                serde_json::json!({"tokens": "free", "past+tokens": "ceil_div(tokens, 2) + 1"})
        });
        let c = Contract::parse(&text, &tiny_cfg()).unwrap();
        assert!(c.check_shapes([(probs, 0, &[6usize, 3, 3][..])]).is_ok());
        let e = c
            .check_shapes([(probs, 0, &[6usize, 4, 4][..])])
            .unwrap_err()
            .to_string();
        assert!(e.contains("past+tokens") && e.contains("= 3"), "{e}");
        // Unbound symbols skip the relation (a partial run).
        assert!(c
            .check_shapes([("audio.frontend.mel", 0, &[80usize, 3000][..])])
            .is_ok());
        assert!(c.check_shapes([("nope", 0, &[1usize][..])]).is_err());
    }

    /// Issue 24 item 2: a config number the resolver reads is checked before anything is sized
    /// by it; a value of the wrong kind says what it is.
    #[test]
    fn config_numbers_are_bounded_and_a_bad_value_says_what_it_is() {
        let with = |key: &str, v: serde_json::Value| {
            let mut c = tiny_cfg();
            c[key] = v;
            Contract::for_family("whisper", &c)
                .map(|c| c.checkpoints.len())
                .map_err(|e| e.to_string())
        };
        for (v, says) in [
            (
                serde_json::json!("64"),
                r#"is a string "64", expected a non-negative integer"#,
            ),
            (
                serde_json::json!(64.5),
                "is the number 64.5, expected a non-negative integer",
            ),
            (
                serde_json::json!(null),
                "is null, expected a non-negative integer",
            ),
            (
                serde_json::json!(-384),
                "is the number -384, expected a non-negative integer",
            ),
            (serde_json::json!(true), "is a boolean true"),
            (serde_json::json!([384]), "is an array of 1 element(s)"),
        ] {
            let e = with("d_model", v).unwrap_err();
            assert!(
                e.contains(&format!("config.json key 'd_model' {says}")),
                "{e}"
            );
            assert!(!e.contains('\n'), "{e}");
        }
        // 1e9 layers was a 16 GB allocation (an abort); 1e5 a 707 MB contract.
        let e = with("decoder_layers", serde_json::json!(1_000_000_000u64)).unwrap_err();
        assert!(
            e.contains("config.json key 'decoder_layers' is 1000000000, above 16777216"),
            "{e}"
        );
        let e = with("decoder_layers", serde_json::json!(100_000)).unwrap_err();
        assert!(
            e.contains("repeat 'decoder_layers'") && e.contains("100000 is above 1024"),
            "{e}"
        );
        let e = with("decoder_layers", serde_json::json!(1e9)).unwrap_err();
        assert!(
            e.contains("'decoder_layers' is the number 1000000000.0"),
            "{e}"
        );
        let e = with("vocab_size", serde_json::json!(u64::MAX)).unwrap_err();
        assert!(
            e.contains("'vocab_size' is 18446744073709551615, above"),
            "{e}"
        );
        // The bound itself resolves.
        assert!(with("decoder_layers", serde_json::json!(MAX_REPEAT)).is_ok());
        // i64::MIN / -1 (and % -1) overflow in i64: an error, not a panic.
        let mut c = tiny_cfg();
        c["d_model"] = serde_json::json!(i64::MIN);
        c["decoder_attention_heads"] = serde_json::json!(-1);
        assert!(Contract::for_family("whisper", &c).is_err());
        // A nested key under something that is not an object, a config that is not an object.
        let e = config_int(
            &serde_json::json!({"text_config": 5}),
            "text_config.vocab_size",
        )
        .unwrap_err();
        assert!(
            e.contains("'text_config' is the number 5, expected an object"),
            "{e}"
        );
        let e = Contract::for_family("whisper", &serde_json::json!([1]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("config.json is an array"), "{e}");
        assert!(check_count("k", MAX_CONFIG_INT, MAX_CONFIG_INT).is_ok());
        assert!(check_count("k", MAX_CONFIG_INT + 1, MAX_CONFIG_INT).is_err());
    }

    #[test]
    fn names_expand_with_the_contracts_geometry() {
        let c = Contract::for_family("whisper", &tiny_cfg()).unwrap();
        assert_eq!(
            c.expand_name("audio.encoder.layer.{last:encoder_layers}.out")
                .unwrap(),
            "audio.encoder.layer.3.out"
        );
        assert!(c
            .expand_name("audio.encoder.layer.{encoder_layers}.out")
            .is_err());
        assert!(c.expand_name("audio.encoder.layer.{nope}.out").is_err());
    }
}
