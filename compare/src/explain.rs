//! The explain stage: each divergence the localization found, described. The origin and every
//! independent failure get their inputs, the unobserved region in front of them and its suspects,
//! and a signature ([`crate::signatures`] on the tensors; a shape disagreement in the contract's
//! axis names; a missing tensor; undeclared logits suppression). A verdict `diverged` with no
//! origin among the checkpoints (the tokens part while every observed checkpoint passes, or
//! capture is not neutral) still gets a place to start ([`fallback_divergence`]).

use xray_core::{SignatureKind, Step};

use crate::align::{layout_axis_names, Pair, PairMeta, PairSource};
use crate::evidence::{
    compress_ids, DivergenceKind, Evidence, FirstDivergence, InputEvidence, Region,
};
use crate::judge::Judged;
use crate::localize::{gap_before, CheckpointGraph, Localization, Node, Observed, Status};
use crate::signatures::{explain_with, origin_context, steps_subset, ExplainOptions, Explanation};
use crate::suppression::SuppressionFound;

/// The origin and the independent failures of `loc`, explained from `src`'s pairs (`fed`: the
/// nodes whose consumers saw the reference's tensor).
pub fn divergences(
    graph: &CheckpointGraph,
    src: &dyn PairSource,
    judged: &Judged,
    loc: &Localization,
    fed: &[bool],
) -> (Option<FirstDivergence>, Vec<FirstDivergence>) {
    let at = |o: usize| divergence(graph, src, judged, loc, fed, o);
    (
        loc.origin.map(at),
        loc.independent.iter().map(|&o| at(o)).collect(),
    )
}

/// The kind of divergence an observation at a divergent node is.
fn kind_of(observed: Observed) -> DivergenceKind {
    match observed {
        Observed::AlignmentFault => DivergenceKind::Shape,
        Observed::Missing => DivergenceKind::Missing,
        _ => DivergenceKind::Values,
    }
}

/// A node's inputs with their statuses.
fn inputs_of(nodes: &[Node], node: &Node, status: &[Status]) -> Vec<InputEvidence> {
    node.upstream
        .iter()
        .map(|&u| InputEvidence {
            checkpoint: nodes[u].name.clone(),
            step: nodes[u].step,
            status: status[u],
        })
        .collect()
}

/// Divergent node `o` described: its inputs, signature, region and suspects.
fn divergence(
    graph: &CheckpointGraph,
    src: &dyn PairSource,
    judged: &Judged,
    loc: &Localization,
    fed: &[bool],
    o: usize,
) -> FirstDivergence {
    let nodes = graph.nodes();
    let node = &nodes[o];
    let kind = kind_of(judged.observed[o]);
    let explanation = signature_at(graph, src, judged, loc, o, kind);
    let own = match kind {
        DivergenceKind::Shape => "shape",
        DivergenceKind::Missing => "missing",
        _ => "fail",
    };
    let (region, suspects) = region_and_suspects(graph, &loc.status, fed, o, own);
    FirstDivergence {
        checkpoint: node.name.clone(),
        step: node.step,
        producer: node.producer.clone(),
        inputs: inputs_of(nodes, node, &loc.status),
        explanation,
        kind,
        region,
        suspects,
        op: None,
    }
}

/// The axis names of a pair's metadata: the contract's, else the layout's defaults.
fn axis_names_of(meta: &PairMeta, rank: usize) -> Vec<String> {
    if meta.axis_names.is_empty() {
        layout_axis_names(meta.layout, rank)
    } else {
        meta.axis_names.clone()
    }
}

/// The signature of divergent node `o` of kind `kind`, from its pair.
fn signature_at(
    graph: &CheckpointGraph,
    src: &dyn PairSource,
    judged: &Judged,
    loc: &Localization,
    o: usize,
    kind: DivergenceKind,
) -> Option<Explanation> {
    let node = &graph.nodes()[o];
    match src.pair(&node.name, node.step) {
        Pair::Tensors {
            meta,
            reference,
            runtime,
            ..
        } if kind == DivergenceKind::Shape => Some(shape_explanation(
            &axis_names_of(&meta, reference.ndim()),
            reference.shape(),
            runtime.shape(),
        )),
        Pair::AlignmentFault { meta, note, shapes } => Some(match shapes {
            Some((r, x)) => {
                shape_explanation(&meta.map_or(vec![], |m| axis_names_of(&m, r.len())), &r, &x)
            }
            None => Explanation {
                signature: SignatureKind::Layout,
                detail: note,
                evidence: serde_json::json!({}),
            },
        }),
        Pair::Missing { note, .. } | Pair::Unobserved { note, .. } => Some(Explanation {
            signature: SignatureKind::Missing,
            detail: note,
            evidence: serde_json::json!({}),
        }),
        Pair::Tensors {
            meta,
            reference,
            runtime,
            ..
        } => {
            let eopts = ExplainOptions::judged_by(
                axis_names_of(&meta, reference.ndim()),
                judged.checkpoints[o].tolerance.tolerance(),
            );
            let oc = origin_context(graph, src, o);
            let mut e = explain_with(&reference, &runtime, &eopts, &oc);
            add_failing_steps(graph, loc, o, &mut e);
            Some(e)
        }
        Pair::NotInReference { .. } => None,
    }
}

/// When the checkpoint of node `o` is compared at several steps, which of them fail
/// (`failing_steps` in the signature's evidence).
fn add_failing_steps(graph: &CheckpointGraph, loc: &Localization, o: usize, e: &mut Explanation) {
    let nodes = graph.nodes();
    let per_step: Vec<(Step, bool)> = (0..nodes.len())
        .filter(|&i| nodes[i].name == nodes[o].name)
        .map(|i| (nodes[i].step, loc.status[i].is_divergent()))
        .collect();
    if per_step.len() > 1 {
        if let (Some(s), serde_json::Value::Object(m)) = (steps_subset(&per_step), &mut e.evidence)
        {
            m.insert("failing_steps".into(), serde_json::json!(s));
        }
    }
}

/// The origin of a stats-only comparison: no tensors, so no signature; its estimate (the
/// checkpoint's note) and how to get one.
pub fn stats_divergence(
    graph: &CheckpointGraph,
    judged: &Judged,
    loc: &Localization,
) -> Option<FirstDivergence> {
    let nodes = graph.nodes();
    loc.origin.map(|o| {
        let node = &nodes[o];
        FirstDivergence {
            kind: kind_of(judged.observed[o]),
            region: None,
            suspects: vec![node.producer.clone()],
            op: None,
            checkpoint: node.name.clone(),
            step: node.step,
            producer: node.producer.clone(),
            inputs: inputs_of(nodes, node, &loc.status),
            explanation: Some(Explanation {
                signature: SignatureKind::None,
                detail: format!(
                    "{}; re-tap with `xray run --only '{}'` (full tensors) for a signature",
                    judged.checkpoints[o].note.clone().unwrap_or_default(),
                    node.name
                ),
                evidence: serde_json::json!({"stats_only": true}),
            }),
        }
    })
}

/// Names undeclared suppression ([`SuppressionFound`]) as the explanation of the divergences at
/// its logits checkpoints.
pub fn name_suppression<'a>(
    divergences: impl Iterator<Item = &'a mut FirstDivergence>,
    found: &[SuppressionFound],
) {
    for fd in divergences {
        if let Some(x) = found
            .iter()
            .find(|x| x.checkpoint == fd.checkpoint && x.step == fd.step)
        {
            fd.explanation = Some(x.explanation());
        }
    }
}

/// The divergence signature of a shape disagreement, in the contract's axis names: which axes
/// differ and by how much ("one key fewer along past+tokens: the cache lost a position").
pub fn shape_explanation(
    axis_names: &[String],
    reference: &[usize],
    runtime: &[usize],
) -> Explanation {
    let axis = |i: usize| {
        axis_names
            .get(i)
            .cloned()
            .unwrap_or_else(|| format!("axis {i}"))
    };
    let mut parts = Vec::new();
    let mut axes = Vec::new();
    if reference.len() != runtime.len() {
        parts.push(format!(
            "rank {} vs {} in the reference ({runtime:?} vs {reference:?})",
            runtime.len(),
            reference.len()
        ));
    } else {
        for (i, (&r, &x)) in reference.iter().zip(runtime).enumerate() {
            if r == x {
                continue;
            }
            let name = axis(i);
            // A cache axis counts keys (positions); any other axis counts entries.
            let cache = name.contains("past");
            let unit = |n: usize| match (cache, n) {
                (true, 1) => "key",
                (true, _) => "keys",
                (false, 1) => "entry",
                (false, _) => "entries",
            };
            let d = x.abs_diff(r);
            let count = if d == 1 {
                "one".to_string()
            } else {
                d.to_string()
            };
            let dir = if x < r { "fewer" } else { "more" };
            let mut t = format!(
                "{count} {} {dir} along {name} ({x} vs {r} in the reference)",
                unit(d)
            );
            if name == "tokens" && x == 1 && r > 1 {
                t.push_str(": the last position only? An engine that returns the last row declares \"token_positions\": \"last\" on the entry (docs/dump-format.md) and it is compared with the reference's last row");
            }
            if cache {
                let what = if d == 1 { "a position" } else { "positions" };
                t.push_str(&format!(
                    ": the cache {} {what}",
                    if x < r { "lost" } else { "gained" }
                ));
            }
            axes.push(name);
            parts.push(t);
        }
        let (mut rs, mut xs) = (reference.to_vec(), runtime.to_vec());
        rs.sort_unstable();
        xs.sort_unstable();
        if rs == xs && reference != runtime {
            parts = vec![format!(
                "the same extents in another axis order ({runtime:?} vs {reference:?} over {}): a layout the contract does not declare",
                axis_names.join(", ")
            )];
        }
    }
    Explanation {
        signature: SignatureKind::Shape,
        detail: parts.join("; "),
        evidence: serde_json::json!({
            "reference_shape": reference,
            "runtime_shape": runtime,
            "axes": axis_names,
            "differing_axes": axes,
        }),
    }
}

/// The unobserved region in front of node `o` as evidence, and the suspects (producers of the
/// region's checkpoints, then `o`'s own), following the checkpoint graph.
fn region_and_suspects(
    graph: &CheckpointGraph,
    status: &[Status],
    fed: &[bool],
    o: usize,
    own_label: &str,
) -> (Option<Region>, Vec<String>) {
    let nodes = graph.nodes();
    let (region, boundary) = gap_before(graph, status, o);
    let mut suspects: Vec<String> = Vec::new();
    for &u in region.iter().chain(std::iter::once(&o)) {
        if !suspects.contains(&nodes[u].producer) {
            suspects.push(nodes[u].producer.clone());
        }
    }
    if region.is_empty() {
        return (None, suspects);
    }
    let label = |u: usize| {
        if fed.get(u).copied().unwrap_or(false) {
            "fed".to_string()
        } else {
            status[u].as_str().to_string()
        }
    };
    let short = |u: usize| format!("{}@{}", nodes[u].name, nodes[u].step);
    let before: Vec<String> = boundary
        .iter()
        .map(|&u| format!("{} ({})", short(u), label(u)))
        .collect();
    let summary = if before.is_empty() {
        format!(
            "before {} ({own_label}): nothing upstream observed",
            short(o)
        )
    } else {
        format!(
            "between {} and {} ({own_label})",
            before.join(", "),
            short(o)
        )
    };
    let all: Vec<(&str, Step)> = nodes.iter().map(|n| (n.name.as_str(), n.step)).collect();
    let sel: Vec<(&str, Step)> = region
        .iter()
        .map(|&u| (nodes[u].name.as_str(), nodes[u].step))
        .collect();
    (
        Some(Region {
            summary,
            after: boundary
                .iter()
                .map(|&u| InputEvidence {
                    checkpoint: nodes[u].name.clone(),
                    step: nodes[u].step,
                    status: status[u],
                })
                .collect(),
            unobserved: compress_ids(&all, &sel),
            unobserved_count: region.len(),
        }),
        suspects,
    )
}

/// Why the token streams part while every observed checkpoint passes, in words that hold for
/// what is known: a stream that ends (a reference dump with fewer steps, or truncated: no
/// numerical divergence), a near tie only when the logits metrics show one, and no step number
/// when none is known (e.g. a stats-only comparison without the token alignment).
fn tokens_part_detail(
    e: &Evidence,
    step: Option<Step>,
    logits: usize,
    logits_id: &str,
    status: Status,
) -> String {
    let at = step.map_or(
        "at a step not known (no logits metrics to find it)".to_string(),
        |k| format!("at step {k}"),
    );
    if let Some(t) = e.tokens.as_ref().filter(|t| t.parted_at_step.is_some()) {
        match (t.reference_token, t.candidate_token) {
            (None, Some(c)) => {
                return format!(
                    "the reference's tokens end {at} where the candidate's go on (candidate token {c}): the reference dump holds fewer steps (made with a lower --max-steps, or truncated); no numerical divergence was observed, re-make the reference with as many steps"
                )
            }
            (Some(r), None) => {
                return format!(
                    "the candidate's tokens end {at} where the reference's go on (reference token {r}): the candidate stopped early (a lower step cap, or its own end-of-text); every observed checkpoint passes"
                )
            }
            _ => {}
        }
    }
    let why = if !status.is_observed() {
        " (unobserved)".to_string()
    } else {
        match e
            .checkpoints
            .get(logits)
            .and_then(|c| c.metrics.as_ref())
            .and_then(|m| m.logits.as_ref())
        {
            Some(l) if l.argmax_near_ties > 0 => {
                " within tolerance (a near tie of the reference's top logits)".to_string()
            }
            Some(_) => " within tolerance".to_string(),
            None => " within tolerance (judged without the logits themselves)".to_string(),
        }
    };
    format!(
        "the token streams part {at} while every observed checkpoint passes: the argmax of {logits_id} differs{why}"
    )
}

/// When the verdict is `diverged` with no origin among the checkpoints, the place to start: a
/// divergence of kind `tokens` at the logits of the step where the tokens part (or the last
/// logits), or `capture` at the last logits, with the unobserved region before it (`fed`: the
/// substituted nodes). `None` when the graph has no node.
pub fn fallback_divergence(
    e: &Evidence,
    graph: &CheckpointGraph,
    fed: &[bool],
) -> Option<FirstDivergence> {
    let nodes = graph.nodes();
    let status: Vec<Status> = e.checkpoints.iter().map(|c| c.status).collect();
    let tokens_differ = e.transcript.as_ref().is_some_and(|t| !t.tokens_equal);
    let token_step = e
        .transcript
        .as_ref()
        .filter(|t| !t.tokens_equal)
        .and_then(|t| t.first_divergent_step);
    let last_logits = || (0..nodes.len()).rev().find(|&i| nodes[i].logits);
    let (kind, target) = if tokens_differ {
        let at = token_step.unwrap_or(0);
        (
            DivergenceKind::Tokens,
            (0..nodes.len())
                .find(|&i| nodes[i].logits && nodes[i].step == at)
                .or_else(last_logits),
        )
    } else {
        (DivergenceKind::Capture, last_logits())
    };
    let o = target
        .or(nodes.len().checked_sub(1))
        .filter(|&o| o < status.len())?;
    let node = &nodes[o];
    let (detail, own) = match kind {
        DivergenceKind::Tokens => (
            tokens_part_detail(e, token_step, o, &node.id(), status[o]),
            "tokens differ",
        ),
        _ => (
            "capture changed the runtime's outputs: the observers are not neutral".to_string(),
            "capture",
        ),
    };
    let (region, suspects) = region_and_suspects(graph, &status, fed, o, own);
    Some(FirstDivergence {
        checkpoint: node.name.clone(),
        step: node.step,
        producer: node.producer.clone(),
        inputs: inputs_of(nodes, node, &status),
        explanation: Some(Explanation {
            signature: match kind {
                DivergenceKind::Tokens => SignatureKind::Tokens,
                _ => SignatureKind::Capture,
            },
            detail,
            evidence: serde_json::json!({}),
        }),
        kind,
        region,
        suspects,
        op: None,
    })
}
