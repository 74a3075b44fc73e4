//! Glue between the runtime's contracts and dumps and the comparison core: the checkpoint graph
//! comes from the family's contract (so a foreign engine's dump localizes the same way), tensor
//! pairs come from two dumps, aligned by canonical name and step with the layout transforms the
//! contract allows; anything else is an alignment fault of that edge.

use std::collections::HashMap;
use xray_core::SignatureKind;
use xray_core::Step;

use ndarray::{ArrayD, ArrayViewD, IxDyn};
use xray_core::contract::Contract;
use xray_core::dump::{content_sha256, Dump, LogitsProcessed, Stats, TokenPositions};
use xray_core::Layout;

use crate::compare::{
    compare_graph, layout_axis_names, CompareOptions, Comparison, Pair, PairMeta, PairSource,
};
use crate::evidence::{
    int_ranges, CheckpointEvidence, DivergenceKind, FedEdge, FirstDivergence, InputEvidence,
    OracleVersions, TokenAlignment, ToleranceEvidence,
};
use crate::localize::{build_graph, error_profile, localize, CheckpointGraph, Observed, Status};
use crate::signatures::Explanation;
use crate::tolerance::Dtype;
use crate::Error;

/// The steps a dump holds tensors at, ascending (0 always included).
pub fn dump_steps(d: &Dump) -> Vec<Step> {
    let mut steps: Vec<Step> = d.manifest.checkpoints.iter().map(|e| e.step).collect();
    steps.push(0);
    steps.sort_unstable();
    steps.dedup();
    steps
}

/// The checkpoint graph of a contract over the steps present in the reference dump.
pub fn graph_for(c: &Contract, reference: &Dump) -> Result<CheckpointGraph, Error> {
    build_graph(&c.checkpoints, &dump_steps(reference))
}

/// Tool versions of an oracle dump's manifest.
pub fn oracle_versions(tools: &std::collections::BTreeMap<String, String>) -> OracleVersions {
    OracleVersions {
        python: tools.get("python").cloned(),
        torch: tools.get("torch").cloned(),
        transformers: tools.get("transformers").cloned(),
    }
}

/// Convert a tensor stored in `from` layout into the contract's canonical `to` layout, when a
/// declared transform exists (`token_major [T, H*D]` <-> `head_major [H, T, D]`,
/// `channel_major [C, T]` <-> `token_major [T, C]`). Never reshapes just because counts match.
pub fn to_canonical(
    t: &ArrayD<f32>,
    from: Layout,
    to: Layout,
    heads: Option<usize>,
) -> Result<ArrayD<f32>, String> {
    use Layout::*;
    let s = t.shape().to_vec();
    match (from, to) {
        (a, b) if a == b => Ok(t.clone()),
        (TokenMajor, HeadMajor) if s.len() == 2 => {
            let h = heads.ok_or("the contract declares no 'heads' dim")?;
            if !s[1].is_multiple_of(h) {
                return Err(format!(
                    "token_major width {} is not divisible by {h} heads",
                    s[1]
                ));
            }
            let v = t
                .view()
                .into_shape_with_order(IxDyn(&[s[0], h, s[1] / h]))
                .map_err(|e| e.to_string())?;
            Ok(v.permuted_axes(IxDyn(&[1, 0, 2]))
                .as_standard_layout()
                .into_owned())
        }
        (HeadMajor, TokenMajor) if s.len() == 3 => {
            let v = t
                .view()
                .permuted_axes(IxDyn(&[1, 0, 2]))
                .as_standard_layout()
                .into_owned();
            v.into_shape_with_order(IxDyn(&[s[1], s[0] * s[2]]))
                .map_err(|e| e.to_string())
        }
        (ChannelMajor, TokenMajor) | (TokenMajor, ChannelMajor) if s.len() == 2 => {
            Ok(t.view().reversed_axes().as_standard_layout().into_owned())
        }
        (a, b) => Err(format!(
            "no layout transform from {a} to {b} for rank {}",
            s.len()
        )),
    }
}

/// Tensor pairs from a reference dump and a runtime dump (and optionally isolated dumps: the
/// runtime's isolated mode, or an outside engine's runs fed with the reference's tensors),
/// aligned to the contract.
pub struct DumpPairs<'a> {
    contract: &'a Contract,
    reference: &'a Dump,
    runtime: &'a Dump,
    isolated: Vec<&'a Dump>,
    /// Which isolated dump gives `(name, step)` its local error; absent: the first dump that
    /// fed nothing (X-Ray's isolated mode substitutes every edge), if any.
    isolated_for: HashMap<(String, Step), usize>,
    converted: HashMap<(String, usize, usize), Result<ArrayD<f32>, String>>,
    /// The reference as a side under test's declarations make it comparable (its last row for
    /// `token_positions: last`), by `(name, step, side)`.
    reference_for: HashMap<(String, usize, usize), Result<ArrayD<f32>, String>>,
}

impl<'a> DumpPairs<'a> {
    /// Prepare pairs; layout conversions are done once here.
    pub fn new(
        contract: &'a Contract,
        reference: &'a Dump,
        runtime: &'a Dump,
        isolated: Option<&'a Dump>,
    ) -> Self {
        Self::with_isolated(contract, reference, runtime, isolated.into_iter().collect())
    }

    /// Prepare pairs with several isolated dumps (see [`DumpPairs::choose_isolated`]).
    pub fn with_isolated(
        contract: &'a Contract,
        reference: &'a Dump,
        runtime: &'a Dump,
        isolated: Vec<&'a Dump>,
    ) -> Self {
        let heads = contract.dims.get("heads").copied();
        let mut converted = HashMap::new();
        let sides = [reference, runtime]
            .into_iter()
            .chain(isolated.iter().copied());
        for (side, d) in sides.enumerate() {
            for e in &d.manifest.checkpoints {
                let Some(spec) = contract.get(&e.name) else {
                    continue;
                };
                if e.layout == spec.layout {
                    continue;
                }
                if let Some(t) = d.get(&e.name, e.step) {
                    converted.insert(
                        (e.name.clone(), e.step, side),
                        to_canonical(t, e.layout, spec.layout, heads),
                    );
                }
            }
        }
        DumpPairs {
            contract,
            reference,
            runtime,
            isolated,
            isolated_for: HashMap::new(),
            converted,
            reference_for: HashMap::new(),
        }
    }

    /// Applies what the sides under test declare per entry (docs/dump-format.md):
    /// `token_positions: last` compares the entry against the reference's last position along
    /// the contract's `tokens` axis; `logits_processed: suppression` compares logits outside the
    /// suppressed ids (`suppression`, from the reference's generation config): there the
    /// engine's value is replaced by the reference's raw one, so they add no difference and every
    /// other id keeps its index. A declaration the contract cannot honour, or suppression with
    /// no suppress lists, is an error naming the entry and the missing key. Returns one
    /// line per declaration kind, for the evidence notes.
    pub fn apply_declarations(
        &mut self,
        suppression: Option<&Suppression>,
    ) -> Result<Vec<String>, Error> {
        let mut last_rows: Vec<String> = Vec::new();
        let mut processed: Vec<(String, Step, usize, usize, usize)> = Vec::new();
        let sides: Vec<&Dump> = std::iter::once(self.runtime)
            .chain(self.isolated.iter().copied())
            .collect();
        for (k, d) in sides.into_iter().enumerate() {
            let side = 1 + k;
            for e in &d.manifest.checkpoints {
                if e.token_positions.is_none() && e.logits_processed.is_none() {
                    continue;
                }
                let id = xray_core::key(&e.name, e.step).to_string();
                let err = |reason: String| Error::Manifest {
                    dump: d.dir.display().to_string(),
                    reason: format!("{id}: {reason}"),
                };
                let Some(spec) = self.contract.get(&e.name) else {
                    return Err(err(
                        "declares token_positions/logits_processed but is no checkpoint of the contract".into(),
                    ));
                };
                let Some(r) = self.side(self.reference, 0, &e.name, e.step) else {
                    continue; // absent from the reference: reported as such by `pair`
                };
                let mut r = match r {
                    Ok(v) => v.to_owned(),
                    Err(_) => continue,
                };
                let Some(g) = self.side(d, side, &e.name, e.step) else {
                    continue;
                };
                let Ok(g) = g.map(|v| v.to_owned()) else {
                    continue;
                };
                let mut g = g;
                if let Some(TokenPositions::Last) = e.token_positions {
                    let Some(ax) = spec.axes.iter().position(|a| a == "tokens") else {
                        return Err(err(format!(
                            "declares token_positions: last, but the contract's shape {:?} has no 'tokens' axis",
                            spec.axes
                        )));
                    };
                    if ax >= r.ndim() || g.ndim() != r.ndim() || g.shape()[ax] != 1 {
                        return Err(err(format!(
                            "declares token_positions: last, so its 'tokens' axis must hold 1 position; it holds shape {:?} (reference {:?})",
                            g.shape(),
                            r.shape()
                        )));
                    }
                    let n = r.shape()[ax];
                    if n == 0 {
                        continue;
                    }
                    r = r
                        .slice_axis(ndarray::Axis(ax), ndarray::Slice::from(n - 1..n))
                        .to_owned();
                    if !last_rows.contains(&e.name) {
                        last_rows.push(e.name.clone());
                    }
                }
                if let Some(LogitsProcessed::Suppression) = e.logits_processed {
                    if spec.kind.as_deref() != Some("logits") {
                        return Err(err(
                            "declares logits_processed, but the contract's checkpoint is not logits".into(),
                        ));
                    }
                    let Some(sup) = suppression else {
                        return Err(err(
                            "declares logits_processed: suppression, but no suppress list is known: the reference dump carries no extra.generation_config (nor suppress_tokens in extra.config); pass --model DIR with its generation_config.json".into(),
                        ));
                    };
                    let ids = sup.ids_at(e.step);
                    let vocab = r.shape().last().copied().unwrap_or(0);
                    if let Some(bad) = ids.iter().find(|&&i| i >= vocab) {
                        return Err(err(format!(
                            "suppressed id {bad} (from {}) is outside the vocabulary of {vocab}",
                            sup.source
                        )));
                    }
                    if g.shape() == r.shape() {
                        let last = r.ndim() - 1;
                        let mut held = 0usize;
                        for (mut gr, rr) in g
                            .lanes_mut(ndarray::Axis(last))
                            .into_iter()
                            .zip(r.lanes(ndarray::Axis(last)))
                        {
                            for &i in &ids {
                                if gr[i] <= SUPPRESSED {
                                    held += 1;
                                }
                                gr[i] = rr[i];
                            }
                        }
                        let rows = g.len() / vocab.max(1);
                        processed.push((e.name.clone(), e.step, held, rows * ids.len(), side));
                    }
                }
                self.reference_for
                    .insert((e.name.clone(), e.step, side), Ok(r));
                self.converted.insert((e.name.clone(), e.step, side), Ok(g));
            }
        }
        let mut notes = Vec::new();
        if !last_rows.is_empty() {
            notes.push(format!(
                "token_positions: last (declared): {} compared against the reference's last position at the steps so declared",
                last_rows.join(", ")
            ));
        }
        if let (Some(sup), false) = (suppression, processed.is_empty()) {
            let dirs: Vec<String> = std::iter::once(self.runtime)
                .chain(self.isolated.iter().copied())
                .map(|d| d.dir.display().to_string())
                .collect();
            let mut per_dump = Vec::new();
            for (side, dir) in dirs.iter().enumerate() {
                let mine: Vec<_> = processed.iter().filter(|p| p.4 == side + 1).collect();
                if !mine.is_empty() {
                    let held: usize = mine.iter().map(|p| p.2).sum();
                    let of: usize = mine.iter().map(|p| p.3).sum();
                    per_dump.push(format!("{held} of {of} in {dir}"));
                }
            }
            let mut names: Vec<&str> = processed.iter().map(|p| p.0.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            let at: Vec<String> = names
                .iter()
                .map(|n| {
                    let mut steps: Vec<Step> = processed
                        .iter()
                        .filter(|p| p.0 == *n)
                        .map(|p| p.1)
                        .collect();
                    steps.sort_unstable();
                    steps.dedup();
                    format!("{n} at steps {}", int_ranges(&steps))
                })
                .collect();
            notes.push(format!(
                "logits processed: suppression (declared): {} compared outside the ids {} suppresses ({} suppress_tokens at every step, {} begin_suppress_tokens at step 0); the engine holds a suppressed value (<= -1e30) at {}",
                at.join(", "),
                sup.source,
                sup.every.len(),
                sup.begin.len(),
                per_dump.join(", ")
            ));
        }
        Ok(notes)
    }

    /// For each node, the isolated dump that measures its local error: among the dumps that fed
    /// the reference's tensor at some edge upstream of it (`extra.fed`; not at the node itself),
    /// the one whose fed edge is nearest (latest in graph order); steps the dump's own token
    /// stream makes incomparable (`comparable_up_to[k]`) are skipped.
    pub fn choose_isolated(&mut self, g: &CheckpointGraph, comparable_up_to: &[Option<Step>]) {
        let nodes = g.nodes();
        let mut best: Vec<Option<(usize, usize)>> = vec![None; nodes.len()];
        for (k, d) in self.isolated.iter().enumerate() {
            let fed = fed_names(d);
            if fed.is_empty() {
                continue;
            }
            let is_fed = |i: usize| fed.iter().any(|f| f == &nodes[i].name);
            // Latest fed ancestor of every node, in topological order.
            let mut near: Vec<Option<usize>> = vec![None; nodes.len()];
            for i in 0..nodes.len() {
                near[i] = nodes[i]
                    .upstream
                    .iter()
                    .map(|&u| if is_fed(u) { Some(u) } else { near[u] })
                    .max()
                    .flatten();
                let ok = comparable_up_to
                    .get(k)
                    .copied()
                    .flatten()
                    .is_none_or(|s| nodes[i].step <= s);
                if let (Some(f), false, true) = (near[i], is_fed(i), ok) {
                    if best[i].is_none_or(|(bf, _)| f > bf) {
                        best[i] = Some((f, k));
                    }
                }
            }
        }
        self.isolated_for = best
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.map(|(_, k)| ((nodes[i].name.clone(), nodes[i].step), k)))
            .collect();
    }

    fn isolated_of(&self, name: &str, step: Step) -> Option<usize> {
        self.isolated_for
            .get(&(name.to_string(), step))
            .copied()
            .or_else(|| self.isolated.iter().position(|d| fed_names(d).is_empty()))
    }

    fn side(
        &self,
        d: &'a Dump,
        side: usize,
        name: &str,
        step: Step,
    ) -> Option<Result<ArrayViewD<'_, f32>, String>> {
        if let Some(c) = self.converted.get(&(name.to_string(), step, side)) {
            return Some(c.as_ref().map(|a| a.view()).map_err(|e| e.clone()));
        }
        d.get(name, step).map(|t| Ok(t.view()))
    }
}

impl PairSource for DumpPairs<'_> {
    fn pair(&self, name: &str, step: Step) -> Pair<'_> {
        let spec = self.contract.get(name);
        let layout = spec.map_or(Layout::Plain, |s| s.layout);
        let r = match self.reference_for.get(&(name.to_string(), step, 1)) {
            Some(v) => Some(v.as_ref().map(|a| a.view()).map_err(|e| e.clone())),
            None => self.side(self.reference, 0, name, step),
        };
        let x = self.side(self.runtime, 1, name, step);
        let meta_of = |a: &ArrayViewD<f32>| PairMeta {
            shape: a.shape().to_vec(),
            dtype: Dtype::F32,
            layout,
            // The contract's own axis names when they fit, else the layout's defaults.
            axis_names: match spec {
                Some(s) if s.axes.len() == a.ndim() => s.axes.clone(),
                _ => layout_axis_names(layout, a.ndim()),
            },
        };
        match (r, x) {
            (None, None) => Pair::Unobserved {
                meta: None,
                note: "absent from both dumps".into(),
            },
            (None, Some(_)) => Pair::NotInReference {
                note: format!(
                    "in {} but absent from the reference dump {}",
                    self.runtime.dir.display(),
                    self.reference.dir.display()
                ),
            },
            (Some(Ok(r)), None) => Pair::Unobserved {
                meta: Some(meta_of(&r)),
                note: "absent from the dump under test".into(),
            },
            (Some(Err(e)), _) | (_, Some(Err(e))) => Pair::AlignmentFault {
                meta: None,
                note: e,
                shapes: None,
            },
            (Some(Ok(r)), Some(Ok(x))) => {
                if r.shape() != x.shape() {
                    return Pair::AlignmentFault {
                        meta: Some(meta_of(&r)),
                        note: format!(
                            "shape {:?} (runtime) vs {:?} (reference): a data-dependent shape divergence or a layout the contract does not declare",
                            x.shape(),
                            r.shape()
                        ),
                        shapes: Some((r.shape().to_vec(), x.shape().to_vec())),
                    };
                }
                let isolated = self
                    .isolated_of(name, step)
                    .and_then(|k| self.side(self.isolated[k], 2 + k, name, step))
                    .and_then(|v| v.ok())
                    .filter(|v| v.shape() == r.shape());
                Pair::Tensors {
                    meta: meta_of(&r),
                    reference: r,
                    runtime: x,
                    isolated,
                }
            }
        }
    }
}

/// Compare a runtime dump with a reference dump through the contract (one isolated-mode dump at
/// most; no token alignment or `extra.fed`: X-Ray's own runtime, teacher-forced by `xray check`;
/// see [`compare_dumps_isolated`] for other engines).
pub fn compare_dumps(
    contract: &Contract,
    reference: &Dump,
    runtime: &Dump,
    isolated: Option<&Dump>,
    opts: &CompareOptions,
) -> Result<Comparison, Error> {
    let g = graph_for(contract, reference)?;
    let pairs = DumpPairs::new(contract, reference, runtime, isolated);
    compare_graph(&g, &pairs, opts)
}

/// A logits value at or below this is a suppressed id (engines write `-inf`, `f32::MIN`
/// (-3.4e38) or a large negative constant).
pub const SUPPRESSED: f32 = -1e30;

/// The token ids a Whisper generation config suppresses: `suppress_tokens` at every step,
/// `begin_suppress_tokens` at the first generated position (the row step 0's last position
/// predicts), as transformers' `SuppressTokensLogitsProcessor` and
/// `SuppressTokensAtBeginLogitsProcessor` apply them in `generate`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Suppression {
    /// `suppress_tokens`.
    pub every: Vec<usize>,
    /// `begin_suppress_tokens`.
    pub begin: Vec<usize>,
    /// Where the lists come from (for messages).
    pub source: String,
}

impl Suppression {
    /// The lists of a generation config (or config.json) object; `Ok(None)` when it has neither
    /// key, an error naming the key when one is not a list of non-negative integers.
    pub fn from_config(v: &serde_json::Value, source: &str) -> Result<Option<Suppression>, String> {
        let list = |key: &str| -> Result<Option<Vec<usize>>, String> {
            match v.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::Array(a)) => a
                    .iter()
                    .map(|x| {
                        x.as_u64()
                            .filter(|&n| n <= 1 << 24)
                            .map(|n| n as usize)
                            .ok_or_else(|| format!("{source}: {key} holds {x}, not a token id"))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Some),
                Some(other) => Err(format!(
                    "{source}: {key} is {other}, not a list of token ids"
                )),
            }
        };
        let (every, begin) = (list("suppress_tokens")?, list("begin_suppress_tokens")?);
        if every.is_none() && begin.is_none() {
            return Ok(None);
        }
        Ok(Some(Suppression {
            every: every.unwrap_or_default(),
            begin: begin.unwrap_or_default(),
            source: source.to_string(),
        }))
    }

    /// The suppression the reference's manifest records: `extra.generation_config` (what `xray
    /// oracle` writes), else `extra.config`'s lists.
    pub fn of_dump(d: &Dump) -> Result<Option<Suppression>, Error> {
        let err = |reason: String| Error::Manifest {
            dump: d.dir.display().to_string(),
            reason,
        };
        for key in ["generation_config", "config"] {
            if let Some(v) = d.manifest.extra.get(key) {
                if let Some(s) =
                    Suppression::from_config(v, &format!("extra.{key}")).map_err(err)?
                {
                    return Ok(Some(s));
                }
            }
        }
        Ok(None)
    }

    /// The ids suppressed at `step`, ascending.
    pub fn ids_at(&self, step: Step) -> Vec<usize> {
        let mut v = self.every.clone();
        if step == 0 {
            v.extend(&self.begin);
        }
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// The checkpoint names a dump's engine was fed with the reference's tensor (`extra.fed` keys,
/// `tokens` excluded).
pub fn fed_names(d: &Dump) -> Vec<String> {
    d.manifest
        .extra
        .get("fed")
        .and_then(|v| v.as_object())
        .map(|m| m.keys().filter(|k| *k != "tokens").cloned().collect())
        .unwrap_or_default()
}

/// The fed edges a dump records (`extra.fed`), checked: every key must be a checkpoint of the
/// contract or `tokens`, every value an object.
pub fn fed_edges(contract: &Contract, d: &Dump) -> Result<Vec<FedEdge>, Error> {
    let err = |reason: String| Error::Manifest {
        dump: d.dir.display().to_string(),
        reason,
    };
    let Some(v) = d.manifest.extra.get("fed") else {
        return Ok(vec![]);
    };
    let m = v
        .as_object()
        .ok_or_else(|| err("extra.fed is not an object".into()))?;
    let mut out = Vec::new();
    for (k, e) in m {
        if k != "tokens" && contract.get(k).is_none() {
            return Err(err(format!(
                "extra.fed names {k:?}, which is neither a checkpoint of the {} contract nor \"tokens\"",
                d.manifest.family
            )));
        }
        let e = e
            .as_object()
            .ok_or_else(|| err(format!("extra.fed.{k} is not an object")))?;
        // `from` (the reference dump as given to the engine) and `into` (the API that took it)
        // are free text, but text: anything else is refused, naming the key.
        for key in ["from", "into"] {
            if let Some(v) = e.get(key).filter(|v| !v.is_string()) {
                return Err(err(format!(
                    "extra.fed.{k}.{key} is {v}, expected a string (from: the reference dump's path as given; into: the engine API that took the tensor)"
                )));
            }
        }
        let text = |key: &str| e.get(key).and_then(|x| x.as_str()).map(str::to_string);
        out.push(FedEdge {
            checkpoint: k.clone(),
            dump: d.dir.display().to_string(),
            from: text("from"),
            into: text("into"),
        });
    }
    Ok(out)
}

/// How `got`'s token stream lines up with `reference`'s (`None` when the family does not decode
/// step by step or the reference records no tokens). Step K's output token is
/// `tokens[prefix + K]`, `prefix = len(reference tokens) - reference steps`. Free-running: the
/// first differing token's step parts the streams (steps after it ran on other tokens).
/// Teacher-forced (`extra.fed.tokens`): every step saw the reference's tokens; the engine's own
/// per-step argmax (`extra.step_argmax`, required) says where its choice parts.
pub fn token_alignment(
    contract: &Contract,
    reference: &Dump,
    got: &Dump,
) -> Result<Option<TokenAlignment>, Error> {
    let stepwise = contract
        .checkpoints
        .iter()
        .any(|c| matches!(c.steps, xray_core::contract::Steps::Every));
    let rt = &reference.manifest.tokens;
    if !stepwise || rt.is_empty() {
        return Ok(None);
    }
    let steps = reference
        .manifest
        .checkpoints
        .iter()
        .map(|e| e.step + 1)
        .max()
        .unwrap_or(0);
    let Some(prefix) = rt.len().checked_sub(steps).filter(|p| *p > 0) else {
        return Err(Error::Manifest {
            dump: reference.dir.display().to_string(),
            reason: format!(
                "{} tokens for {steps} decoder steps: no forced prefix before step 0's output",
                rt.len()
            ),
        });
    };
    let teacher_forced = got
        .manifest
        .extra
        .get("fed")
        .and_then(|f| f.get("tokens"))
        .is_some();
    let own: Vec<i64> = if teacher_forced {
        let v = got.manifest.extra.get("step_argmax").ok_or_else(|| Error::Manifest {
            dump: got.dir.display().to_string(),
            reason: "teacher-forced (extra.fed.tokens) but no extra.step_argmax: its own choices are unknown".into(),
        })?;
        serde_json::from_value(v.clone()).map_err(|e| Error::Manifest {
            dump: got.dir.display().to_string(),
            reason: format!("extra.step_argmax: {e}"),
        })?
    } else {
        got.manifest.tokens.clone()
    };
    let (theirs, ours): (&[i64], &[i64]) = if teacher_forced {
        (&rt[prefix..], &own)
    } else {
        (rt, &own)
    };
    let part = theirs
        .iter()
        .zip(ours)
        .position(|(a, b)| a != b)
        .or((theirs.len() != ours.len()).then(|| theirs.len().min(ours.len())));
    let offset = if teacher_forced { 0 } else { prefix };
    let parted_at_step = part.map(|p| p.saturating_sub(offset));
    let last = steps.saturating_sub(1);
    Ok(Some(TokenAlignment {
        teacher_forced,
        prefix,
        parted_at_step,
        reference_token: part.and_then(|p| theirs.get(p).copied()),
        candidate_token: part.and_then(|p| ours.get(p).copied()),
        not_comparable_steps: match parted_at_step {
            Some(k) if !teacher_forced && k < last => {
                Some(int_ranges(&((k + 1)..=last).collect::<Vec<_>>()))
            }
            _ => None,
        },
    }))
}

/// The last step comparable under an alignment (`None`: every step).
pub fn comparable_up_to(a: Option<&TokenAlignment>) -> Option<Step> {
    a.filter(|a| !a.teacher_forced)
        .and_then(|a| a.parted_at_step)
}

/// What [`compare_dumps_isolated`] returns: the comparison, the fed edges of every dump, the
/// token alignment, and one note per declaration kind applied.
pub type IsolatedComparison = (
    Comparison,
    Vec<FedEdge>,
    Option<TokenAlignment>,
    Vec<String>,
);

/// Compare a dump under test with a reference dump through the contract, with any number of
/// isolated dumps (X-Ray's isolated mode, or an outside engine's runs fed with the reference's
/// tensors: each checkpoint's local error comes from the run fed nearest upstream of it).
/// Reads the dump under test's `extra.fed` (its fed checkpoints count as passing for their
/// consumers) and lines its tokens up with the reference's (steps after the streams part are
/// `not_comparable`). Applies the entries' declarations ([`DumpPairs::apply_declarations`]) and
/// names undeclared suppression at a divergent logits checkpoint (signature `logits_processed`).
/// Returns the comparison, the fed edges of every dump, the alignment and one note per
/// declaration kind applied.
/// Zero observed checkpoints is an error naming both dumps.
pub fn compare_dumps_isolated(
    contract: &Contract,
    reference: &Dump,
    runtime: &Dump,
    isolated: Vec<&Dump>,
    opts: &CompareOptions,
) -> Result<IsolatedComparison, Error> {
    let g = graph_for(contract, reference)?;
    let mut fed = fed_edges(contract, runtime)?;
    let alignment = token_alignment(contract, reference, runtime)?;
    let mut iso_up_to = Vec::new();
    for d in &isolated {
        fed.extend(fed_edges(contract, d)?);
        iso_up_to.push(comparable_up_to(
            token_alignment(contract, reference, d)?.as_ref(),
        ));
    }
    let mut opts = opts.clone();
    opts.fed.extend(fed_names(runtime));
    opts.comparable_up_to_step = opts
        .comparable_up_to_step
        .or(comparable_up_to(alignment.as_ref()));
    let mut pairs = DumpPairs::with_isolated(contract, reference, runtime, isolated);
    let notes = pairs.apply_declarations(opts.suppression.as_ref())?;
    pairs.choose_isolated(&g, &iso_up_to);
    let mut c = compare_graph(&g, &pairs, &opts)?;
    if !c.checkpoints.iter().any(|c| c.status.is_observed()) {
        return Err(Error::NothingObserved {
            reference: reference.dir.display().to_string(),
            got: runtime.dir.display().to_string(),
        });
    }
    if let Some(sup) = opts.suppression.as_ref() {
        let found = pairs.undeclared_suppression(sup);
        for fd in c
            .first_divergence
            .iter_mut()
            .chain(c.independent.iter_mut())
        {
            if let Some(x) = found
                .iter()
                .find(|x| x.checkpoint == fd.checkpoint && x.step == fd.step)
            {
                fd.explanation = Some(x.explanation());
            }
        }
    }
    Ok((c, fed, alignment, notes))
}

/// Logits of the dump under test holding suppressed values (<= [`SUPPRESSED`]) where the
/// reference is finite, with no `logits_processed` declared: at one (checkpoint, step), the ids
/// so set and the ids the generation config suppresses there.
#[derive(Debug, Clone, PartialEq)]
pub struct SuppressionFound {
    /// The logits checkpoint.
    pub checkpoint: String,
    /// Its step.
    pub step: Step,
    /// Ids the engine set to a suppressed value (in any row), ascending.
    pub ids: Vec<usize>,
    /// The ids the generation config suppresses at this step.
    pub config_ids: Vec<usize>,
    /// Where the lists come from.
    pub source: String,
    /// The vocabulary size.
    pub vocab: usize,
    /// The entry declares `logits_processed: suppression` (its ids inside the config's lists
    /// were compared away; `ids` are then the ones outside them).
    pub declared: bool,
    /// The generation config's `begin_suppress_tokens` (to name them when suppressed at a step
    /// other than 0).
    pub begin: Vec<usize>,
}

impl SuppressionFound {
    /// Whether every suppressed id is one the config suppresses.
    pub fn explained(&self) -> bool {
        self.ids
            .iter()
            .all(|i| self.config_ids.binary_search(i).is_ok())
    }

    /// The mechanism, as a signature (`logits_processed`) when the ids are the config's.
    pub fn explanation(&self) -> Explanation {
        let outside: Vec<usize> = self
            .ids
            .iter()
            .copied()
            .filter(|i| self.config_ids.binary_search(i).is_err())
            .collect();
        let begin_late: Vec<usize> = if self.step > 0 {
            outside
                .iter()
                .copied()
                .filter(|i| self.begin.contains(i))
                .collect()
        } else {
            vec![]
        };
        let list = |v: &[usize]| {
            let mut t = v[..v.len().min(8)]
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            if v.len() > 8 {
                t.push_str(", ...");
            }
            t
        };
        let (signature, detail) = if self.declared || !begin_late.is_empty() {
            (
                SignatureKind::LogitsProcessed,
                format!(
                    "logits processed: suppression at ids {} does not suppress at step {}: {}{}",
                    self.source,
                    self.step,
                    list(&outside),
                    if begin_late.len() == outside.len() {
                        " (its begin_suppress_tokens, which apply at the first generated position only, step 0: the engine suppresses them at a later step, e.g. the first position after a forced prefix)".to_string()
                    } else if !begin_late.is_empty() {
                        format!(
                            " ({} of them begin_suppress_tokens, which apply at step 0 only)",
                            begin_late.len()
                        )
                    } else {
                        String::new()
                    }
                ),
            )
        } else if outside.is_empty() {
            let how = if self.ids.len() == self.config_ids.len() {
                "exactly the".to_string()
            } else {
                format!("{} of the {}", self.ids.len(), self.config_ids.len())
            };
            (
                SignatureKind::LogitsProcessed,
                format!(
                    "logits processed: suppression: the {} of {} ids the engine sets to <= -1e30 are {how} ids {} suppresses at step {} (suppress_tokens{}); the reference's logits are raw proj_out outputs. Declare \"logits_processed\": \"suppression\" on these entries (docs/dump-format.md) to compare them outside the suppressed ids",
                    self.ids.len(),
                    self.vocab,
                    self.source,
                    self.step,
                    if self.step == 0 { ", begin_suppress_tokens" } else { "" }
                ),
            )
        } else {
            (
                SignatureKind::None,
                format!(
                    "{} of {} ids are set to <= -1e30 where the reference is finite; {} of them are not in {}'s suppress lists (first: {}), so suppression does not explain them",
                    self.ids.len(),
                    self.vocab,
                    outside.len(),
                    self.source,
                    list(&outside)
                ),
            )
        };
        Explanation {
            signature,
            detail,
            evidence: serde_json::json!({
                "suppressed_ids": self.ids.len(),
                "config_ids": self.config_ids.len(),
                "outside_config": outside.len(),
                "source": self.source,
            }),
        }
    }
}

impl DumpPairs<'_> {
    /// Every logits entry of the dump under test that declares no `logits_processed` and holds
    /// suppressed values where the reference is finite ([`SuppressionFound`]).
    pub fn undeclared_suppression(&self, sup: &Suppression) -> Vec<SuppressionFound> {
        let mut out = Vec::new();
        for e in &self.runtime.manifest.checkpoints {
            let logits = self
                .contract
                .get(&e.name)
                .is_some_and(|s| s.kind.as_deref() == Some("logits"));
            if !logits {
                continue;
            }
            let declared = e.logits_processed.is_some();
            let Pair::Tensors {
                reference, runtime, ..
            } = self.pair(&e.name, e.step)
            else {
                continue;
            };
            let Some(vocab) = reference.shape().last().copied().filter(|&v| v > 0) else {
                continue;
            };
            let mut hit = vec![false; vocab];
            for (i, (r, x)) in reference.iter().zip(runtime.iter()).enumerate() {
                if *x <= SUPPRESSED && r.is_finite() {
                    hit[i % vocab] = true;
                }
            }
            // A declared entry's suppressed ids inside the lists were replaced by the
            // reference's values: what is left is suppressed outside them.
            let ids: Vec<usize> = (0..vocab).filter(|&i| hit[i]).collect();
            if !ids.is_empty() {
                out.push(SuppressionFound {
                    checkpoint: e.name.clone(),
                    step: e.step,
                    ids,
                    config_ids: sup.ids_at(e.step),
                    source: sup.source.clone(),
                    vocab,
                    declared,
                    begin: sup.begin.clone(),
                });
            }
        }
        out
    }
}

/// One side of a statistics comparison: the summary of `name@step` in the contract's canonical
/// layout (computed from the tensor for a full dump, read from the manifest for a stats-only one).
struct SideSummary {
    stats: Stats,
    content_sha256: String,
    shape: Vec<usize>,
    layout: Layout,
}

fn side_summary(
    contract: &Contract,
    d: &Dump,
    name: &str,
    step: Step,
) -> Option<Result<SideSummary, String>> {
    let e = d.entry(name, step)?;
    if let (Some(s), Some(h)) = (&e.stats, &e.content_sha256) {
        return Some(Ok(SideSummary {
            stats: s.clone(),
            content_sha256: h.clone(),
            shape: e.shape.clone(),
            layout: e.layout,
        }));
    }
    let t = d.get(name, step)?;
    let (t, layout) = match contract.get(name) {
        Some(spec) if spec.layout != e.layout => {
            match to_canonical(
                t,
                e.layout,
                spec.layout,
                contract.dims.get("heads").copied(),
            ) {
                Ok(c) => (c, spec.layout),
                Err(err) => return Some(Err(err)),
            }
        }
        _ => (t.clone(), e.layout),
    };
    let std = t.as_standard_layout();
    let sl = std.as_slice()?;
    Some(Ok(SideSummary {
        stats: Stats::of(sl),
        content_sha256: content_sha256(sl),
        shape: t.shape().to_vec(),
        layout,
    }))
}

/// The outcome of comparing two summaries of one checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsVerdict {
    /// Whether it passes.
    pub pass: bool,
    /// Estimated `rel_l2` (see [`stats_rel_l2`]).
    pub rel_l2: f64,
    /// The bound it was held to.
    pub bound: f64,
    /// One sentence for the evidence note.
    pub note: String,
}

/// Estimated `rel_l2 = ||x - y|| / ||y||` of a tensor `x` against its reference `y` from their
/// summaries: the larger of the sketch estimate `sqrt(mean_k (sketch_k(x) - sketch_k(y))^2) /
/// rms(y)` (unbiased in the square; a relative spread of ~sqrt(2/32) = 25 %) and the exact lower
/// bound `max(|rms(x) - rms(y)|, |mean(x) - mean(y)|) / rms(y)` (triangle and Cauchy-Schwarz
/// inequalities). Returns `(estimate, lower_bound)`; `None` when a side lacks a sketch.
pub fn stats_rel_l2(reference: &Stats, got: &Stats) -> Option<(f64, f64)> {
    let (a, b) = (reference.sketch.as_ref()?, got.sketch.as_ref()?);
    if a.len() != b.len() || a.is_empty() {
        return None;
    }
    let scale = reference.rms.max(f64::MIN_POSITIVE);
    let ms = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>() / a.len() as f64;
    let lower = (reference.rms - got.rms)
        .abs()
        .max((reference.mean - got.mean).abs())
        / scale;
    Some((ms.sqrt() / scale, lower))
}

/// Judges one checkpoint from summaries under `tol`: inconsistent statistics ([`Stats::check`]),
/// any non-finite value, a count mismatch or a missing sketch fail; then identical content hashes
/// pass; otherwise the estimated `rel_l2`
/// (the larger of [`stats_rel_l2`]'s two) must be within `tol.max_rel_l2`, or, when the tolerance
/// sets none, within `rtol + atol / rms(ref)` (the largest `rel_l2` of a tensor whose every
/// element is within `atol + rtol * |ref|`).
pub fn judge_stats(
    reference: &Stats,
    ref_hash: &str,
    got: &Stats,
    got_hash: &str,
    tol: &crate::tolerance::Tolerance,
) -> StatsVerdict {
    let bound = tol
        .max_rel_l2
        .unwrap_or(tol.rtol + tol.atol / reference.rms.max(f64::MIN_POSITIVE));
    let fail = |note: String| StatsVerdict {
        pass: false,
        rel_l2: 0.0,
        bound,
        note,
    };
    // Never the content-hash shortcut on statistics no tensor can have (compare_stats_dumps
    // refuses them as an input error before judging).
    for (side, st) in [("the reference's", reference), ("the", got)] {
        if let Err(why) = st.check() {
            return fail(format!(
                "stats-only: {side} statistics are inconsistent: {why}"
            ));
        }
    }
    if reference.nan + reference.inf > 0 {
        return fail(format!(
            "stats-only: the reference holds {} NaN and {} Inf values; a non-finite reference cannot be compared",
            reference.nan, reference.inf
        ));
    }
    if got.nan + got.inf > 0 {
        return fail(format!(
            "stats-only: {} NaN and {} Inf values where the reference is finite",
            got.nan, got.inf
        ));
    }
    if reference.count != got.count {
        return fail(format!(
            "stats-only: {} elements vs {} in the reference",
            got.count, reference.count
        ));
    }
    if ref_hash == got_hash {
        return StatsVerdict {
            pass: true,
            rel_l2: 0.0,
            bound,
            note: "stats-only: identical content (same sha256)".into(),
        };
    }
    let Some((est, lower)) = stats_rel_l2(reference, got) else {
        return fail("stats-only: a side has no order-sensitive sketch".into());
    };
    let rel = est.max(lower);
    let pass = rel <= bound;
    let mut note = format!(
        "stats-only: rel_l2 ~ {rel:.2e} (sketch estimate {est:.2e}, lower bound from mean/rms {lower:.2e}), bound {bound:.2e}"
    );
    if !pass && lower <= bound {
        let (r, g) = (reference, got);
        let scale = r.rms.max(f64::MIN_POSITIVE);
        if ((r.min - g.min).abs().max((r.max - g.max).abs())) / scale <= bound {
            note.push_str(": the same mean, rms and range in another order (a permutation, shift or transposition)");
        }
    }
    StatsVerdict {
        pass,
        rel_l2: rel,
        bound,
        note,
    }
}

/// Compares two dumps when either is stats-only: each checkpoint is judged from its summaries
/// ([`judge_stats`], tolerances from `opts.policy`), then localized along the contract's graph like
/// the full comparison, so the evidence has the same form (metrics `null`, the estimate in the
/// checkpoint's `note`).
pub fn compare_stats_dumps(
    contract: &Contract,
    reference: &Dump,
    got: &Dump,
    opts: &CompareOptions,
) -> Result<Comparison, Error> {
    let g = graph_for(contract, reference)?;
    let mut observed = Vec::with_capacity(g.len());
    let mut partial = Vec::with_capacity(g.len());
    for node in g.nodes() {
        let step = node.step;
        let r = side_summary(contract, reference, &node.name, step);
        let x = side_summary(contract, got, &node.name, step);
        let tol = opts.policy.resolve(
            &node.name,
            node.step,
            Dtype::F32,
            opts.floors.get(&(node.name.clone(), node.step)),
        );
        let unobserved = if opts.require_all {
            Observed::Missing
        } else {
            Observed::Unobserved
        };
        // Statistics no tensor can have are an input error before anything is judged (the
        // content-hash shortcut would pass them unread); so is a non-finite reference, as in
        // the full comparison.
        for (side, d) in [(&r, reference), (&x, got)] {
            if let Some(Ok(s)) = side {
                s.stats.check().map_err(|reason| Error::InconsistentStats {
                    dump: d.dir.display().to_string(),
                    checkpoint: node.id(),
                    reason,
                })?;
            }
        }
        if let (Some(Ok(rs)), Some(Ok(_))) = (&r, &x) {
            if rs.stats.nan + rs.stats.inf > 0 {
                return Err(Error::NonFiniteReferenceStats {
                    checkpoint: node.id(),
                    nan: rs.stats.nan,
                    inf: rs.stats.inf,
                });
            }
        }
        let (obs, note, meta) = match (r, x) {
            (None, None) => (unobserved, "absent from both dumps".to_string(), None),
            (None, Some(_)) => {
                return Err(Error::NotInReference {
                    checkpoint: node.id(),
                    note: format!(
                        "in {} but absent from the reference dump {}",
                        got.dir.display(),
                        reference.dir.display()
                    ),
                })
            }
            (Some(Ok(r)), None) => (
                unobserved,
                "absent from the dump under test".into(),
                Some(r),
            ),
            (Some(Err(e)), _) | (_, Some(Err(e))) => (Observed::AlignmentFault, e, None),
            (Some(Ok(r)), Some(Ok(x))) => {
                if r.layout != x.layout {
                    (
                        Observed::AlignmentFault,
                        format!(
                            "layout {} vs {} (reference); stats-only summaries cannot be re-laid out",
                            x.layout, r.layout
                        ),
                        Some(r),
                    )
                } else if r.shape != x.shape {
                    (
                        Observed::AlignmentFault,
                        format!("shape {:?} vs {:?} (reference)", x.shape, r.shape),
                        Some(r),
                    )
                } else {
                    let v = judge_stats(
                        &r.stats,
                        &r.content_sha256,
                        &x.stats,
                        &x.content_sha256,
                        &tol.tolerance,
                    );
                    (
                        if v.pass {
                            Observed::Pass
                        } else {
                            Observed::Fail
                        },
                        v.note,
                        Some(r),
                    )
                }
            }
        };
        observed.push(obs);
        partial.push(CheckpointEvidence {
            name: node.name.clone(),
            step: node.step,
            producer: node.producer.clone(),
            consumers: node.consumers.clone(),
            shape: meta.as_ref().map(|m| m.shape.clone()).unwrap_or_default(),
            dtype: Dtype::F32.as_str().into(),
            layout: meta
                .as_ref()
                .map(|m| m.layout.to_string())
                .unwrap_or_default(),
            metrics: None,
            local_metrics: None,
            tolerance: ToleranceEvidence::from(&tol),
            status: Status::Pass,
            propagated_from: vec![],
            note: Some(note),
        });
    }
    let loc = localize(&g, &observed)?;
    let nodes = g.nodes();
    for (i, c) in partial.iter_mut().enumerate() {
        c.status = loc.status[i];
        c.propagated_from = loc.propagated_from[i]
            .iter()
            .map(|&u| nodes[u].id())
            .collect();
    }
    if !observed
        .iter()
        .any(|o| !matches!(o, Observed::Unobserved | Observed::NotComparable))
    {
        return Err(Error::NothingObserved {
            reference: reference.dir.display().to_string(),
            got: got.dir.display().to_string(),
        });
    }
    let profile = error_profile(&g, &vec![None; g.len()], &loc.status)?;
    let first_divergence = loc.origin.map(|o| {
        let node = &nodes[o];
        FirstDivergence {
            kind: match observed[o] {
                Observed::AlignmentFault => DivergenceKind::Shape,
                Observed::Missing => DivergenceKind::Missing,
                _ => DivergenceKind::Values,
            },
            region: None,
            suspects: vec![node.producer.clone()],
            op: None,
            checkpoint: node.name.clone(),
            step: node.step,
            producer: node.producer.clone(),
            inputs: node
                .upstream
                .iter()
                .map(|&u| InputEvidence {
                    checkpoint: nodes[u].name.clone(),
                    step: nodes[u].step,
                    status: loc.status[u],
                })
                .collect(),
            explanation: Some(Explanation {
                signature: SignatureKind::None,
                detail: format!(
                    "{}; re-tap with `xray run --only '{}'` (full tensors) for a signature",
                    partial[o].note.clone().unwrap_or_default(),
                    node.name
                ),
                evidence: serde_json::json!({"stats_only": true}),
            }),
        }
    });
    Ok(Comparison {
        checkpoints: partial,
        first_divergence,
        independent: vec![],
        error_profile: profile,
        first_divergent_token_step: None,
        drill_down: None,
        localization: loc,
        fed_nodes: vec![false; g.len()],
        graph: g,
    })
}
