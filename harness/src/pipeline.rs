//! Glue between the runtime's contracts and dumps and the comparison core: the checkpoint graph
//! comes from the family's contract (so a foreign engine's dump localizes the same way), tensor
//! pairs come from two dumps, aligned by canonical name and step with the layout transforms the
//! contract allows; anything else is an alignment fault of that edge.

use std::collections::HashMap;

use ndarray::{ArrayD, ArrayViewD, IxDyn};
use xray_runtime::contract::{Contract, StepRef as CStep, Steps as CSteps};
use xray_runtime::dump::Dump;
use xray_runtime::Layout;

use crate::compare::{
    compare_graph, layout_axis_names, CompareOptions, Comparison, Pair, PairMeta, PairSource,
};
use crate::evidence::OracleVersions;
use crate::localize::{build_graph, CheckpointGraph, CheckpointSpec, StepRef, Steps};
use crate::tolerance::Dtype;
use crate::Error;

/// The contract's checkpoints as localization specs.
pub fn specs_from_contract(c: &Contract) -> Vec<CheckpointSpec> {
    c.checkpoints
        .iter()
        .map(|s| CheckpointSpec {
            name: s.name.clone(),
            producer: s.producer.clone(),
            steps: match s.steps {
                CSteps::Once => Steps::Once,
                CSteps::Prefill => Steps::Prefill,
                CSteps::Every => Steps::Every,
            },
            inputs: s
                .inputs
                .iter()
                .map(|(n, r)| {
                    (
                        n.clone(),
                        match r {
                            CStep::Same => StepRef::Same,
                            CStep::Prefill => StepRef::Prefill,
                            CStep::Previous => StepRef::Previous,
                        },
                    )
                })
                .collect(),
            layer: s
                .layer
                .map(|l| (s.repeat.clone().unwrap_or_default(), l as u32)),
            logits: s.kind.as_deref() == Some("logits"),
        })
        .collect()
}

/// The checkpoint graph of a contract over the steps present in the reference dump.
pub fn graph_for(c: &Contract, reference: &Dump) -> Result<CheckpointGraph, Error> {
    let mut steps: Vec<u32> = reference
        .manifest
        .checkpoints
        .iter()
        .map(|e| e.step as u32)
        .collect();
    steps.push(0);
    steps.sort_unstable();
    steps.dedup();
    build_graph(&specs_from_contract(c), &steps)
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

/// Tensor pairs from a reference dump and a runtime dump (and optionally an isolated-mode dump),
/// aligned to the contract.
pub struct DumpPairs<'a> {
    contract: &'a Contract,
    reference: &'a Dump,
    runtime: &'a Dump,
    isolated: Option<&'a Dump>,
    converted: HashMap<(String, usize, u8), Result<ArrayD<f32>, String>>,
}

impl<'a> DumpPairs<'a> {
    /// Prepare pairs; layout conversions are done once here.
    pub fn new(
        contract: &'a Contract,
        reference: &'a Dump,
        runtime: &'a Dump,
        isolated: Option<&'a Dump>,
    ) -> Self {
        let heads = contract.dims.get("heads").copied();
        let mut converted = HashMap::new();
        for (side, d) in [(0u8, Some(reference)), (1, Some(runtime)), (2, isolated)] {
            let Some(d) = d else { continue };
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
            converted,
        }
    }

    fn side(
        &self,
        d: &'a Dump,
        side: u8,
        name: &str,
        step: usize,
    ) -> Option<Result<ArrayViewD<'_, f32>, String>> {
        if let Some(c) = self.converted.get(&(name.to_string(), step, side)) {
            return Some(c.as_ref().map(|a| a.view()).map_err(|e| e.clone()));
        }
        d.get(name, step).map(|t| Ok(t.view()))
    }
}

impl PairSource for DumpPairs<'_> {
    fn pair(&self, name: &str, step: u32) -> Pair<'_> {
        let step_u = step as usize;
        let spec = self.contract.get(name);
        let layout = spec
            .map(|s| s.layout.to_string())
            .unwrap_or_else(|| "plain".into());
        let r = self.side(self.reference, 0, name, step_u);
        let x = self.side(self.runtime, 1, name, step_u);
        let meta_of = |a: &ArrayViewD<f32>| PairMeta {
            shape: a.shape().to_vec(),
            dtype: Dtype::F32,
            layout: layout.clone(),
            // The contract's own axis names when they fit, else the layout's defaults.
            axis_names: match spec {
                Some(s) if s.axes.len() == a.ndim() => s.axes.clone(),
                _ => layout_axis_names(&layout, a.ndim()),
            },
        };
        match (r, x) {
            (None, None) => Pair::Missing {
                meta: None,
                note: "absent from both dumps".into(),
            },
            (None, Some(_)) => Pair::Missing {
                meta: None,
                note: "absent from the reference dump".into(),
            },
            (Some(Ok(r)), None) => Pair::Missing {
                meta: Some(meta_of(&r)),
                note: "absent from the runtime dump".into(),
            },
            (Some(Err(e)), _) | (_, Some(Err(e))) => Pair::AlignmentFault {
                meta: None,
                note: e,
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
                    };
                }
                let isolated = self
                    .isolated
                    .and_then(|d| self.side(d, 2, name, step_u))
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

/// Compare a runtime dump with a reference dump through the contract.
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

/// One row of a statistics comparison (stats-only dumps).
#[derive(Debug, Clone, serde::Serialize)]
pub struct StatsRow {
    /// Checkpoint.
    pub name: String,
    /// Step.
    pub step: usize,
    /// `identical` (same content hash), `close`, `differs`, or `missing`.
    pub status: String,
    /// Largest relative difference over mean, rms, min, max (relative to the reference rms).
    pub max_rel_delta: f64,
}

fn summary_of(d: &Dump, name: &str, step: usize) -> Option<(xray_runtime::dump::Stats, String)> {
    if let Some(e) = d.entry(name, step) {
        if let (Some(s), Some(h)) = (&e.stats, &e.content_sha256) {
            return Some((s.clone(), h.clone()));
        }
    }
    let t = d.get(name, step)?;
    let std = t.as_standard_layout();
    let sl = std.as_slice()?;
    Some((
        xray_runtime::dump::Stats::of(sl),
        xray_runtime::dump::content_sha256(sl),
    ))
}

/// Compare two dumps by content hash and summary statistics, in contract order (works when either
/// side is stats-only). `rel` is the relative tolerance on each statistic.
pub fn compare_stats(contract: &Contract, reference: &Dump, got: &Dump, rel: f64) -> Vec<StatsRow> {
    let mut keys: Vec<(usize, usize, String)> = reference
        .manifest
        .checkpoints
        .iter()
        .map(|e| {
            (
                e.step,
                contract.get(&e.name).map(|s| s.order).unwrap_or(usize::MAX),
                e.name.clone(),
            )
        })
        .collect();
    keys.sort();
    keys.into_iter()
        .map(|(step, _, name)| {
            let (status, delta) = match (
                summary_of(reference, &name, step),
                summary_of(got, &name, step),
            ) {
                (Some((a, ha)), Some((b, hb))) => {
                    if ha == hb {
                        ("identical", 0.0)
                    } else {
                        let scale = a.rms.max(1e-30);
                        let d = [
                            (a.mean, b.mean),
                            (a.rms, b.rms),
                            (a.min, b.min),
                            (a.max, b.max),
                        ]
                        .iter()
                        .map(|(x, y)| (x - y).abs() / scale)
                        .fold(0.0f64, f64::max);
                        let nonfinite = a.nan != b.nan || a.inf != b.inf || a.count != b.count;
                        (
                            if nonfinite || d > rel {
                                "differs"
                            } else {
                                "close"
                            },
                            d,
                        )
                    }
                }
                _ => ("missing", f64::NAN),
            };
            StatsRow {
                name,
                step,
                status: status.into(),
                max_rel_delta: delta,
            }
        })
        .collect()
}
