//! The align stage: each checkpoint's two tensors, side by side in the contract's canonical
//! layout. [`Pair`] is what a [`PairSource`] has for one `(name, step)`: in memory
//! ([`MemorySource`]) or from dumps ([`DumpPairs`]: the layout transforms the contract declares,
//! the entries' declarations, the isolated run that measures each node's local error). A dump
//! under test also says what it was fed (`extra.fed`: [`fed_edges`]) and how its token stream
//! lines up with the reference's ([`token_alignment`]); [`align_dumps`] gathers all of it for
//! [`crate::compare::compare_dumps_isolated`]. Anything the contract does not allow is an
//! alignment fault of that edge, never a reshape.

use std::collections::HashMap;
use xray_core::Step;

use ndarray::{ArrayD, ArrayViewD, IxDyn};
use xray_core::contract::Contract;
use xray_core::dump::{content_sha256, Dump, Entry, LogitsProcessed, Stats, TokenPositions};
use xray_core::Layout;

use crate::compare::CompareOptions;
use crate::evidence::{int_ranges, FedEdge, TokenAlignment};
use crate::localize::CheckpointGraph;
use crate::suppression::{Suppressed, Suppression, SuppressionFound, SUPPRESSED};
use crate::tolerance::Precision;
use crate::Error;

/// Description of a checkpoint's tensors (as recorded in the evidence).
#[derive(Debug, Clone, PartialEq)]
pub struct PairMeta {
    /// Canonical shape.
    pub shape: Vec<usize>,
    /// The precision the runtime tensor is judged at (its tolerance's).
    pub dtype: Precision,
    /// Canonical layout.
    pub layout: Layout,
    /// Axis names for signature wording; empty = derived from the layout.
    pub axis_names: Vec<String>,
}

/// What a [`PairSource`] has for one `(name, step)`.
// Returned by value once per node; boxing the views would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Pair<'a> {
    /// Both tensors, aligned to the canonical shape.
    Tensors {
        /// Metadata.
        meta: PairMeta,
        /// Reference tensor.
        reference: ArrayViewD<'a, f32>,
        /// Runtime tensor (cumulative run).
        runtime: ArrayViewD<'a, f32>,
        /// Runtime tensor from isolated mode (reference substituted upstream), if it ran.
        isolated: Option<ArrayViewD<'a, f32>>,
    },
    /// Absent from a side that must have it (a failure).
    Missing {
        /// Metadata, if one side has the tensor.
        meta: Option<PairMeta>,
        /// Which side lacks it and why.
        note: String,
    },
    /// Absent from the side under test, which need not expose it (partial coverage): neither a
    /// pass nor a failure, unless [`CompareOptions::require_all`].
    Unobserved {
        /// Metadata of the reference side, if it has the tensor.
        meta: Option<PairMeta>,
        /// Which side lacks it.
        note: String,
    },
    /// Present on the side under test but absent from the reference: the reference must cover
    /// what is compared, so this is an error.
    NotInReference {
        /// Which side lacks it.
        note: String,
    },
    /// Present on both sides but not alignable (shape or layout).
    AlignmentFault {
        /// Metadata of the reference side, if known.
        meta: Option<PairMeta>,
        /// Why it could not be aligned.
        note: String,
        /// `(reference, runtime)` shapes when the tensors were read but their shapes differ.
        shapes: Option<(Vec<usize>, Vec<usize>)>,
    },
}

/// Supplies tensors by checkpoint name and step.
pub trait PairSource {
    /// The pair for `name@stepK`.
    fn pair(&self, name: &str, step: Step) -> Pair<'_>;
}

/// In-memory [`PairSource`] (tests, small runs).
#[derive(Debug, Default)]
pub struct MemorySource {
    entries: HashMap<(String, Step), MemoryEntry>,
}

#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum MemoryEntry {
    Tensors {
        meta: PairMeta,
        reference: ndarray::ArrayD<f32>,
        runtime: ndarray::ArrayD<f32>,
        isolated: Option<ndarray::ArrayD<f32>>,
    },
    AlignmentFault(String),
    Unobserved,
}

impl MemorySource {
    /// Adds both tensors of a checkpoint (the layout is recorded as given).
    pub fn insert(
        &mut self,
        name: &str,
        step: Step,
        layout: Layout,
        reference: ndarray::ArrayD<f32>,
        runtime: ndarray::ArrayD<f32>,
    ) {
        let meta = PairMeta {
            shape: reference.shape().to_vec(),
            dtype: Precision::F32,
            layout,
            axis_names: vec![],
        };
        self.entries.insert(
            (name.into(), step),
            MemoryEntry::Tensors {
                meta,
                reference,
                runtime,
                isolated: None,
            },
        );
    }

    /// Sets the isolated-mode runtime tensor of an inserted checkpoint.
    pub fn set_isolated(&mut self, name: &str, step: Step, isolated: ndarray::ArrayD<f32>) {
        if let Some(MemoryEntry::Tensors { isolated: i, .. }) =
            self.entries.get_mut(&(name.to_string(), step))
        {
            *i = Some(isolated);
        }
    }

    /// Sets the axis names of an inserted checkpoint (the contract's, for signature wording).
    pub fn set_axes(&mut self, name: &str, step: Step, axes: &[&str]) {
        if let Some(MemoryEntry::Tensors { meta, .. }) =
            self.entries.get_mut(&(name.to_string(), step))
        {
            meta.axis_names = axes.iter().map(|a| a.to_string()).collect();
        }
    }

    /// Marks a checkpoint as absent from the side under test (partial coverage).
    pub fn insert_unobserved(&mut self, name: &str, step: Step) {
        self.entries
            .insert((name.into(), step), MemoryEntry::Unobserved);
    }

    /// Marks a checkpoint as an alignment fault.
    pub fn insert_fault(&mut self, name: &str, step: Step, note: &str) {
        self.entries.insert(
            (name.into(), step),
            MemoryEntry::AlignmentFault(note.into()),
        );
    }
}

impl PairSource for MemorySource {
    fn pair(&self, name: &str, step: Step) -> Pair<'_> {
        match self.entries.get(&(name.to_string(), step)) {
            None => Pair::Missing {
                meta: None,
                note: "absent from both sides".into(),
            },
            Some(MemoryEntry::Unobserved) => Pair::Unobserved {
                meta: None,
                note: "absent from the dump under test".into(),
            },
            Some(MemoryEntry::AlignmentFault(n)) => Pair::AlignmentFault {
                meta: None,
                note: n.clone(),
                shapes: None,
            },
            Some(MemoryEntry::Tensors {
                meta,
                reference,
                runtime,
                isolated,
            }) => Pair::Tensors {
                meta: meta.clone(),
                reference: reference.view(),
                runtime: runtime.view(),
                isolated: isolated.as_ref().map(|a| a.view()),
            },
        }
    }
}

/// A checkpoint's reference and the side under test as they are compared, after the dump
/// entries' declarations.
type Declared = (ArrayD<f32>, ArrayD<f32>);

/// Default axis names for a layout and rank.
pub fn layout_axis_names(layout: Layout, rank: usize) -> Vec<String> {
    let names: &[&str] = match (layout, rank) {
        (Layout::HeadMajor, 3) => &["heads", "tokens", "head_dim"],
        (Layout::TokenMajor, 2) => &["tokens", "features"],
        (Layout::ChannelMajor, 2) => &["channels", "frames"],
        _ => &[],
    };
    names.iter().map(|s| s.to_string()).collect()
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
        let mut processed: Vec<Suppressed> = Vec::new();
        let sides: Vec<&'a Dump> = std::iter::once(self.runtime)
            .chain(self.isolated.iter().copied())
            .collect();
        for (k, d) in sides.into_iter().enumerate() {
            let side = 1 + k;
            for e in &d.manifest.checkpoints {
                if e.token_positions.is_none() && e.logits_processed.is_none() {
                    continue;
                }
                let Some((r, g)) =
                    self.declared(d, side, e, suppression, &mut last_rows, &mut processed)?
                else {
                    continue;
                };
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
            notes.push(sup.note(&processed, &dirs));
        }
        Ok(notes)
    }

    /// One entry's declarations applied ([`Declared`]): the reference and the side under test as they are
    /// compared (`None`: a side lacks the tensor, or the reference's `tokens` axis is empty).
    /// The entry's name joins `last_rows` when it declares `token_positions: last`, its counts
    /// join `processed` when suppressed ids were compared away.
    fn declared(
        &self,
        d: &Dump,
        side: usize,
        e: &Entry,
        suppression: Option<&Suppression>,
        last_rows: &mut Vec<String>,
        processed: &mut Vec<Suppressed>,
    ) -> Result<Option<Declared>, Error> {
        let id = xray_core::key(&e.name, e.step).to_string();
        let err = |reason: String| Error::Manifest {
            dump: d.dir.display().to_string(),
            reason: format!("{id}: {reason}"),
        };
        let Some(spec) = self.contract.get(&e.name) else {
            return Err(err(
                "declares token_positions/logits_processed but is no checkpoint of the contract"
                    .into(),
            ));
        };
        // Absent from the reference: reported as such by `pair`.
        let Some(Ok(r)) = self.side(self.reference, 0, &e.name, e.step) else {
            return Ok(None);
        };
        let Some(Ok(g)) = self.side(d, side, &e.name, e.step) else {
            return Ok(None);
        };
        let (mut r, mut g) = (r.to_owned(), g.to_owned());
        if let Some(TokenPositions::Last) = e.token_positions {
            let Some(last) = last_position(&spec.axes, &r, &g).map_err(err)? else {
                return Ok(None);
            };
            r = last;
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
            if let Some((held, of)) = sup.compare_outside(&r, &mut g, e.step).map_err(err)? {
                processed.push(Suppressed {
                    name: e.name.clone(),
                    step: e.step,
                    held,
                    of,
                    side,
                });
            }
        }
        Ok(Some((r, g)))
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

/// The reference's last position along the contract's `tokens` axis (`axes`), for an entry
/// declaring `token_positions: last` (its own `tokens` axis holds that one position); `None`
/// when the reference holds no position. An error says why the declaration cannot be honoured.
fn last_position(
    axes: &[String],
    r: &ArrayD<f32>,
    g: &ArrayD<f32>,
) -> Result<Option<ArrayD<f32>>, String> {
    let Some(ax) = axes.iter().position(|a| a == "tokens") else {
        return Err(format!(
            "declares token_positions: last, but the contract's shape {axes:?} has no 'tokens' axis"
        ));
    };
    if ax >= r.ndim() || g.ndim() != r.ndim() || g.shape()[ax] != 1 {
        return Err(format!(
            "declares token_positions: last, so its 'tokens' axis must hold 1 position; it holds shape {:?} (reference {:?})",
            g.shape(),
            r.shape()
        ));
    }
    let n = r.shape()[ax];
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(
        r.slice_axis(ndarray::Axis(ax), ndarray::Slice::from(n - 1..n))
            .to_owned(),
    ))
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
            dtype: Precision::F32,
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
pub(crate) struct SideSummary {
    pub(crate) stats: Stats,
    pub(crate) content_sha256: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) layout: Layout,
}

/// [`SideSummary`] of `name@step` in `d` (`None`: absent; an error: no layout transform).
pub(crate) fn side_summary(
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

/// Two dumps aligned through the contract for the full comparison: the pairs (declarations
/// applied, each node's isolated run chosen), the options as the dump under test amends them
/// (its fed checkpoints, the last comparable step), and what the evidence reports of it.
pub struct Aligned<'a> {
    /// The tensor pairs.
    pub pairs: DumpPairs<'a>,
    /// The caller's options with the fed checkpoints and the last comparable step added.
    pub opts: CompareOptions,
    /// The fed edges of the dump under test and of every isolated run (`extra.fed`).
    pub fed: Vec<FedEdge>,
    /// How the dump under test's tokens line up with the reference's.
    pub tokens: Option<TokenAlignment>,
    /// One note per declaration kind applied.
    pub notes: Vec<String>,
}

/// The align stage of [`crate::compare::compare_dumps_isolated`]: reads the fed edges and the
/// token alignment of `runtime` and of every isolated run (steps after a stream parts from the
/// reference's are not comparable), applies the entries' declarations
/// ([`DumpPairs::apply_declarations`]) and chooses each node's isolated run
/// ([`DumpPairs::choose_isolated`]) over `g`.
pub fn align_dumps<'a>(
    contract: &'a Contract,
    g: &CheckpointGraph,
    reference: &'a Dump,
    runtime: &'a Dump,
    isolated: Vec<&'a Dump>,
    opts: &CompareOptions,
) -> Result<Aligned<'a>, Error> {
    let mut fed = fed_edges(contract, runtime)?;
    let tokens = token_alignment(contract, reference, runtime)?;
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
        .or(comparable_up_to(tokens.as_ref()));
    let mut pairs = DumpPairs::with_isolated(contract, reference, runtime, isolated);
    let notes = pairs.apply_declarations(opts.suppression.as_ref())?;
    pairs.choose_isolated(g, &iso_up_to);
    Ok(Aligned {
        pairs,
        opts,
        fed,
        tokens,
        notes,
    })
}
