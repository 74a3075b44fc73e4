//! The comparison paths, each a short sequence of named stages called once in order:
//! **align** ([`crate::align`]: each checkpoint's two tensors in the contract's layout),
//! **judge** ([`crate::judge`]: metrics and tolerance per node), **localize**
//! ([`crate::localize`]: statuses, origin, error profile, token drill-down) and **explain**
//! ([`crate::explain`]: the origin's inputs, region, suspects and signature).
//!
//! - [`compare_graph`]: tensors from any [`PairSource`] over a checkpoint graph (judge,
//!   localize, explain);
//! - [`compare_dumps`]: X-Ray's own runtime dump against the reference (`xray check`);
//! - [`compare_dumps_isolated`]: any engine's dump, its fed edges, token alignment, declarations
//!   and isolated runs (`xray compare`);
//! - [`compare_stats_dumps`]: stats-only dumps, each checkpoint judged from its summaries.
//!
//! A [`Comparison`]'s parts go straight into [`crate::evidence::Evidence`]
//! ([`Comparison::into_evidence`]).

use std::collections::HashMap;
use xray_core::contract::Contract;
use xray_core::dump::Dump;
use xray_core::Step;

use crate::align::{align_dumps, DumpPairs, PairSource};
use crate::evidence::{
    coverage_of, CheckpointEvidence, Evidence, FedEdge, FirstDivergence, OracleVersions, Run,
    TokenAlignment, Transcript, Verdict, SCHEMA,
};
use crate::explain::{divergences, fallback_divergence, name_suppression, stats_divergence};
use crate::judge::{judge_graph, judge_stats_graph, Judged};
use crate::localize::{graph_for, locate, CheckpointGraph, DrillDown, ErrorProfile, Localization};
use crate::suppression::Suppression;
use crate::tolerance::{NoiseFloor, Policy};
use crate::Error;

/// Options of [`compare_graph`].
#[derive(Debug, Clone, Default)]
pub struct CompareOptions {
    /// Tolerance policy.
    pub policy: Policy,
    /// Noise floors per `(name, step)` for calibrated mode.
    pub floors: HashMap<(String, Step), NoiseFloor>,
    /// A checkpoint absent from the side under test is a failure (`missing`) instead of
    /// `unobserved` (`xray check`, whose runtime graph declares every checkpoint;
    /// `xray compare --require-all`).
    pub require_all: bool,
    /// Checkpoints the side under test was fed with the reference's tensor (`extra.fed`): their
    /// consumers' errors are local.
    pub fed: Vec<String>,
    /// Steps after this one are `not_comparable` (the token streams parted there).
    pub comparable_up_to_step: Option<Step>,
    /// The ids the reference's generation config suppresses (for entries declaring
    /// `logits_processed: suppression`, and to name undeclared suppression).
    pub suppression: Option<Suppression>,
}

/// Result of [`compare_graph`].
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Per-checkpoint evidence in topological order.
    pub checkpoints: Vec<CheckpointEvidence>,
    /// Raw localization (indices into the graph).
    pub localization: Localization,
    /// The origin with its inputs and signature.
    pub first_divergence: Option<FirstDivergence>,
    /// The independent failures (`fail`: their observed inputs pass or were fed), described
    /// like the origin: in a run fed the reference's tensor, the fed stage's own divergence.
    pub independent: Vec<FirstDivergence>,
    /// Error along depth.
    pub error_profile: ErrorProfile,
    /// First step whose logits disagree in argmax.
    pub first_divergent_token_step: Option<Step>,
    /// Drill-down from that step.
    pub drill_down: Option<DrillDown>,
    /// The checkpoint graph compared (for [`Comparison::into_evidence`]'s regions).
    pub graph: CheckpointGraph,
    /// Substituted nodes, indexed like the graph.
    pub fed_nodes: Vec<bool>,
}

impl Comparison {
    /// The comparison's parts: the judged nodes with the localization's statuses, the located
    /// facts, the explained divergences.
    fn of(
        graph: &CheckpointGraph,
        mut judged: Judged,
        located: crate::localize::Located,
        fed_nodes: Vec<bool>,
        (first_divergence, independent): (Option<FirstDivergence>, Vec<FirstDivergence>),
    ) -> Comparison {
        judged.localized(graph, &located.localization);
        Comparison {
            checkpoints: judged.checkpoints,
            first_divergence,
            independent,
            error_profile: located.error_profile,
            first_divergent_token_step: located.first_divergent_token_step,
            drill_down: located.drill_down,
            localization: located.localization,
            graph: graph.clone(),
            fed_nodes,
        }
    }
}

/// Compares every node of `graph` with tensors from `src`: judge, localize, explain.
pub fn compare_graph(
    graph: &CheckpointGraph,
    src: &dyn PairSource,
    opts: &CompareOptions,
) -> Result<Comparison, Error> {
    let fed: Vec<bool> = graph
        .nodes()
        .iter()
        .map(|n| opts.fed.contains(&n.name))
        .collect();
    let judged = judge_graph(graph, src, opts)?;
    let located = locate(
        graph,
        &judged.observed,
        &judged.errors,
        &judged.logits_steps,
        &fed,
    )?;
    let explained = divergences(graph, src, &judged, &located.localization, &fed);
    Ok(Comparison::of(graph, judged, located, fed, explained))
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
/// Aligns them ([`align_dumps`]: the dump under test's fed checkpoints count as passing for
/// their consumers, steps after the token streams part are `not_comparable`, the entries'
/// declarations applied), compares ([`compare_graph`]) and names undeclared suppression at a
/// divergent logits checkpoint (signature `logits_processed`). Returns the comparison, the fed
/// edges of every dump, the alignment and one note per declaration kind applied.
/// Zero observed checkpoints is an error naming both dumps.
pub fn compare_dumps_isolated(
    contract: &Contract,
    reference: &Dump,
    runtime: &Dump,
    isolated: Vec<&Dump>,
    opts: &CompareOptions,
) -> Result<IsolatedComparison, Error> {
    let g = graph_for(contract, reference)?;
    let aligned = align_dumps(contract, &g, reference, runtime, isolated, opts)?;
    let mut c = compare_graph(&g, &aligned.pairs, &aligned.opts)?;
    if !c.checkpoints.iter().any(|c| c.status.is_observed()) {
        return Err(Error::NothingObserved {
            reference: reference.dir.display().to_string(),
            got: runtime.dir.display().to_string(),
        });
    }
    if let Some(sup) = aligned.opts.suppression.as_ref() {
        let found = aligned.pairs.undeclared_suppression(sup);
        let all = c
            .first_divergence
            .iter_mut()
            .chain(c.independent.iter_mut());
        name_suppression(all, &found);
    }
    Ok((c, aligned.fed, aligned.tokens, aligned.notes))
}

/// Compares two dumps when either is stats-only: each checkpoint is judged from its summaries
/// ([`crate::judge::judge_stats`], tolerances from `opts.policy`), then localized along the
/// contract's graph like the full comparison, so the evidence has the same form (metrics `null`,
/// the estimate in the checkpoint's `note`; the origin's explanation says how to get a
/// signature). Zero observed checkpoints is an error naming both dumps.
pub fn compare_stats_dumps(
    contract: &Contract,
    reference: &Dump,
    got: &Dump,
    opts: &CompareOptions,
) -> Result<Comparison, Error> {
    let g = graph_for(contract, reference)?;
    let judged = judge_stats_graph(&g, contract, reference, got, opts)?;
    let fed = vec![false; g.len()];
    let located = locate(&g, &judged.observed, &judged.errors, &[], &fed)?;
    if !judged.any_observed() {
        return Err(Error::NothingObserved {
            reference: reference.dir.display().to_string(),
            got: got.dir.display().to_string(),
        });
    }
    let origin = stats_divergence(&g, &judged, &located.localization);
    Ok(Comparison::of(&g, judged, located, fed, (origin, vec![])))
}

/// Tool versions of an oracle dump's manifest.
pub fn oracle_versions(tools: &std::collections::BTreeMap<String, String>) -> OracleVersions {
    OracleVersions {
        python: tools.get("python").cloned(),
        torch: tools.get("torch").cloned(),
        transformers: tools.get("transformers").cloned(),
    }
}

impl Comparison {
    /// Assembles the evidence document; the verdict is derived from the content
    /// ([`Evidence::derive_verdict`]). `transcript.first_divergent_step` is filled from the logits
    /// when the caller left it `None`.
    pub fn into_evidence(
        self,
        run: Run,
        transcript: Option<Transcript>,
        capture_neutral: Option<bool>,
        notes: Vec<String>,
    ) -> Evidence {
        self.into_evidence_with(run, transcript, capture_neutral, notes, vec![], None)
    }

    /// [`Comparison::into_evidence`] with the fed edges and the token alignment of an outside
    /// engine. Adds the coverage block, and when the verdict is `diverged` with no origin among
    /// the checkpoints (the tokens part while every observed checkpoint passes, or capture is
    /// not neutral), a `first_divergence` of kind `tokens` / `capture` at the logits of the
    /// parting step (or the last logits), with the unobserved region before it: a divergence is
    /// never reported without a place to start.
    pub fn into_evidence_with(
        self,
        run: Run,
        mut transcript: Option<Transcript>,
        capture_neutral: Option<bool>,
        notes: Vec<String>,
        fed: Vec<FedEdge>,
        tokens: Option<TokenAlignment>,
    ) -> Evidence {
        if let Some(t) = transcript.as_mut() {
            t.first_divergent_step = t
                .first_divergent_step
                .or(tokens.as_ref().and_then(|a| a.parted_at_step))
                .or(self.first_divergent_token_step);
        }
        let coverage = coverage_of(&self.checkpoints);
        let mut e = Evidence {
            schema: SCHEMA.into(),
            verdict: Verdict::Pass,
            run,
            checkpoints: self.checkpoints,
            first_divergence: self.first_divergence,
            independent: self.independent,
            error_profile: self.error_profile,
            drill_down: self.drill_down,
            capture_neutral,
            transcript,
            notes,
            coverage: Some(coverage),
            fed,
            tokens,
            op_points: None,
            reference_variants: vec![],
            precision: None,
            local_errors: None,
        };
        e.verdict = e.derive_verdict();
        if e.verdict == Verdict::Diverged && e.first_divergence.is_none() {
            e.first_divergence = fallback_divergence(&e, &self.graph, &self.fed_nodes);
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::align::MemorySource;
    use crate::evidence::DivergenceKind;
    use crate::explain::shape_explanation;
    use crate::localize::tests::spec;
    use crate::localize::{build_graph, CheckpointSpec, Status, StepRef, Steps};
    use ndarray::{ArrayD, IxDyn};
    use xray_core::{Layout, SignatureKind};

    fn ramp(shape: &[usize], k: f32) -> ArrayD<f32> {
        let n: usize = shape.iter().product();
        ArrayD::from_shape_vec(
            IxDyn(shape),
            (0..n).map(|i| ((i as f32) * k).sin()).collect(),
        )
        .unwrap()
    }

    fn specs() -> Vec<CheckpointSpec> {
        let s = |name: &str, steps, inputs, logits| spec(name, steps, inputs, logits, None);
        vec![
            s("mem", Steps::Once, vec![], false),
            s("k", Steps::Prefill, vec![("mem", StepRef::Same)], false),
            s("attn", Steps::Every, vec![("k", StepRef::Prefill)], false),
            s("logits", Steps::Every, vec![("attn", StepRef::Same)], true),
        ]
    }

    #[test]
    fn pipeline_localizes_and_explains_a_transposed_cache() {
        let g = build_graph(&specs(), &[0, 1]).unwrap();
        let mut src = MemorySource::default();
        let mem = ramp(&[8, 12], 0.37);
        src.insert("mem", 0, Layout::TokenMajor, mem.clone(), mem.clone());
        let k = ramp(&[3, 8, 4], 0.11);
        let bad_k = ArrayD::from_shape_vec(
            IxDyn(&[3, 8, 4]),
            k.view()
                .permuted_axes(IxDyn(&[1, 0, 2]))
                .iter()
                .copied()
                .collect(),
        )
        .unwrap();
        src.insert("k", 0, Layout::HeadMajor, k.clone(), bad_k);
        for step in 0..2 {
            let a = ramp(&[2, 5], 0.5 + step as f32);
            src.insert("attn", step, Layout::TokenMajor, a.clone(), &a + 0.3f32);
            let l = ramp(&[2, 7], 1.3);
            let mut lx = l.clone();
            if step == 1 {
                lx[[0, 0]] = 5.0;
            }
            src.insert("logits", step, Layout::TokenMajor, l, lx);
        }
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        let fd = c.first_divergence.as_ref().unwrap();
        assert_eq!((fd.checkpoint.as_str(), fd.step), ("k", 0));
        assert_eq!(fd.inputs[0].status, Status::Pass);
        let ex = fd.explanation.as_ref().unwrap();
        assert_eq!(ex.signature, SignatureKind::Permutation);
        assert!(
            ex.detail.contains("tokens, heads, head_dim"),
            "{}",
            ex.detail
        );
        let st: Vec<Status> = c.checkpoints.iter().map(|c| c.status).collect();
        assert_eq!(st[0], Status::Pass);
        assert!(st[2..]
            .iter()
            .all(|s| *s == Status::Propagated || *s == Status::Pass));
        assert_eq!(c.first_divergent_token_step, Some(1));
        assert_eq!(
            c.drill_down.as_ref().unwrap().cause_up_to_step.as_deref(),
            Some("k@step0")
        );
        let e = c.into_evidence(Run::default(), None, Some(true), vec![]);
        assert_eq!(e.verdict, Verdict::Diverged);
    }

    #[test]
    fn missing_fault_and_isolation() {
        let g = build_graph(&specs()[..2], &[0]).unwrap();
        let mut src = MemorySource::default();
        let mem = ramp(&[4, 4], 0.2);
        src.insert("mem", 0, Layout::TokenMajor, mem.clone(), mem.clone());
        src.set_isolated("mem", 0, &mem + 1.0f32);
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        assert_eq!(c.checkpoints[1].status, Status::Missing);
        assert!(c.checkpoints[0].local_metrics.as_ref().unwrap().max_abs > 0.9);
        // The first alignment fault is the origin (it keeps its status); before issue 12 item 3
        // `first_divergence` was empty here.
        src.insert_fault("k", 0, "layout plain has no transform to head_major");
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        assert_eq!(c.checkpoints[1].status, Status::AlignmentFault);
        let fd = c.first_divergence.as_ref().unwrap();
        assert_eq!(
            (fd.checkpoint.as_str(), fd.kind),
            ("k", DivergenceKind::Shape)
        );
        assert_eq!(
            fd.explanation.as_ref().unwrap().signature,
            SignatureKind::Layout
        );
        // A shape disagreement inside a pair is an alignment fault too, not an error.
        src.insert(
            "k",
            0,
            Layout::HeadMajor,
            ramp(&[2, 3], 1.0),
            ramp(&[3, 2], 1.0),
        );
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        assert_eq!(c.checkpoints[1].status, Status::AlignmentFault);
        assert!(c.checkpoints[1].note.as_deref().unwrap().contains("[2, 3]"));
    }

    /// A chain mel -> conv -> layer -> mem -> logits@0..2 (logits read the previous step too).
    fn chain() -> CheckpointGraph {
        let s = |name: &str, steps, inputs, logits| spec(name, steps, inputs, logits, None);
        build_graph(
            &[
                s("mel", Steps::Once, vec![], false),
                s("conv", Steps::Once, vec![("mel", StepRef::Same)], false),
                s(
                    "layer.0.out",
                    Steps::Once,
                    vec![("conv", StepRef::Same)],
                    false,
                ),
                s(
                    "layer.1.out",
                    Steps::Once,
                    vec![("layer.0.out", StepRef::Same)],
                    false,
                ),
                s(
                    "mem",
                    Steps::Once,
                    vec![("layer.1.out", StepRef::Same)],
                    false,
                ),
                s(
                    "logits",
                    Steps::Every,
                    vec![("mem", StepRef::Same), ("logits", StepRef::Previous)],
                    true,
                ),
            ],
            &[0, 1, 2],
        )
        .unwrap()
    }

    /// Every tensor equal; `diff` lists the `(name, step)` whose runtime side is off by 0.5.
    fn chain_source(unobserved: &[&str], diff: &[(&str, Step)]) -> MemorySource {
        let g = chain();
        let mut src = MemorySource::default();
        for n in g.nodes() {
            if unobserved.contains(&n.name.as_str()) {
                src.insert_unobserved(&n.name, n.step);
                continue;
            }
            let r = ramp(&[3, 8], 0.3 + n.step as f32);
            let mut x = r.clone();
            if diff.contains(&(n.name.as_str(), n.step)) {
                x += 0.5;
            }
            src.insert(&n.name, n.step, Layout::TokenMajor, r, x);
        }
        src
    }

    #[test]
    fn partial_coverage_names_the_region_and_its_suspects() {
        let g = chain();
        let gap = ["conv", "layer.0.out", "layer.1.out"];
        let src = chain_source(
            &gap,
            &[("mem", 0), ("logits", 0), ("logits", 1), ("logits", 2)],
        );
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        let fd = c.first_divergence.clone().unwrap();
        assert_eq!(
            (fd.checkpoint.as_str(), fd.kind),
            ("mem", DivergenceKind::Values)
        );
        let r = fd.region.as_ref().unwrap();
        assert_eq!(r.summary, "between mel@0 (pass) and mem@0 (fail)");
        assert_eq!(r.unobserved, ["conv", "layer.0..1.out"]);
        assert_eq!(r.unobserved_count, 3);
        assert_eq!(
            fd.suspects,
            ["op.conv", "op.layer.0.out", "op.layer.1.out", "op.mem"]
        );
        let e = c.into_evidence(Run::default(), None, None, vec![]);
        assert_eq!(e.verdict, Verdict::Diverged);
        let cov = e.coverage.unwrap();
        assert_eq!((cov.observed, cov.unobserved), (5, 3));
        assert_eq!(cov.unobserved_names, ["conv", "layer.0..1.out"]);
        // Every observed checkpoint passes: a pass, over what was observed.
        let c = compare_graph(&g, &chain_source(&gap, &[]), &CompareOptions::default()).unwrap();
        let e = c.into_evidence(Run::default(), None, None, vec![]);
        assert_eq!(e.verdict, Verdict::Pass);
        assert!(e
            .checkpoints
            .iter()
            .filter(|c| gap.contains(&c.name.as_str()))
            .all(|c| c.status == Status::Unobserved));
        // --require-all: absence is a failure, the first absent checkpoint the origin.
        let opts = CompareOptions {
            require_all: true,
            ..Default::default()
        };
        let c = compare_graph(&g, &chain_source(&gap, &[]), &opts).unwrap();
        assert_eq!(c.checkpoints[1].status, Status::Missing);
        let fd = c.first_divergence.as_ref().unwrap();
        assert_eq!(
            (fd.checkpoint.as_str(), fd.kind),
            ("conv", DivergenceKind::Missing)
        );
    }

    #[test]
    fn steps_after_the_parting_are_not_comparable_and_fed_edges_isolate() {
        let g = chain();
        let src = chain_source(&[], &[("logits", 1), ("logits", 2)]);
        let opts = CompareOptions {
            comparable_up_to_step: Some(1),
            ..Default::default()
        };
        let c = compare_graph(&g, &src, &opts).unwrap();
        let st: Vec<(String, Status)> = c.checkpoints.iter().map(|c| (c.id(), c.status)).collect();
        assert!(
            st.contains(&("logits@step1".into(), Status::Origin)),
            "{st:?}"
        );
        assert!(
            st.contains(&("logits@step2".into(), Status::NotComparable)),
            "{st:?}"
        );
        // The mel differs but the reference's mel was fed downstream: conv's error is its own.
        let src = chain_source(&[], &[("mel", 0), ("conv", 0)]);
        let opts = CompareOptions {
            fed: vec!["mel".into()],
            ..Default::default()
        };
        let c = compare_graph(&g, &src, &opts).unwrap();
        assert_eq!(c.checkpoints[0].status, Status::Origin);
        assert_eq!(c.checkpoints[1].status, Status::Fail);
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        assert_eq!(c.checkpoints[1].status, Status::Propagated);
    }

    #[test]
    fn shape_divergence_is_named_in_the_contracts_axes() {
        let axes: Vec<String> = ["heads", "tokens", "past+tokens"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let e = shape_explanation(&axes, &[6, 1, 5], &[6, 1, 4]);
        assert_eq!(e.signature, SignatureKind::Shape);
        assert_eq!(
            e.detail,
            "one key fewer along past+tokens (4 vs 5 in the reference): the cache lost a position"
        );
        let e = shape_explanation(&axes, &[6, 1, 5], &[6, 3, 5]);
        assert_eq!(
            e.detail,
            "2 entries more along tokens (3 vs 1 in the reference)"
        );
        let e = shape_explanation(&axes, &[6, 2, 5], &[5, 2, 6]);
        assert!(e.detail.contains("another axis order"), "{}", e.detail);
        // Through the pipeline: a cache one position short is the origin, its consumer inherits.
        let g = build_graph(&specs(), &[0, 1]).unwrap();
        let mut src = MemorySource::default();
        let mem = ramp(&[8, 12], 0.37);
        src.insert("mem", 0, Layout::TokenMajor, mem.clone(), mem);
        let k = ramp(&[3, 5, 4], 0.11);
        let short = k.slice(ndarray::s![.., ..4, ..]).to_owned().into_dyn();
        src.insert("k", 0, Layout::HeadMajor, k, short);
        src.set_axes("k", 0, &["heads", "past+tokens", "head_dim"]);
        for step in 0..2 {
            let a = ramp(&[2, 5], 0.5);
            src.insert("attn", step, Layout::TokenMajor, a.clone(), &a + 1.0f32);
            let l = ramp(&[2, 7], 1.3);
            src.insert("logits", step, Layout::TokenMajor, l.clone(), l);
        }
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        let fd = c.first_divergence.as_ref().unwrap();
        assert_eq!(
            (fd.checkpoint.as_str(), fd.kind),
            ("k", DivergenceKind::Shape)
        );
        assert!(fd
            .explanation
            .as_ref()
            .unwrap()
            .detail
            .starts_with("one key fewer along past+tokens"));
        assert_eq!(c.checkpoints[2].status, Status::Propagated);
    }

    /// Whatever makes the verdict `diverged`, `first_divergence` names a place to start.
    #[test]
    fn first_divergence_is_never_empty_when_diverged() {
        let g = chain();
        let transcript = |equal: bool| Transcript {
            runtime: "a".into(),
            reference: "b".into(),
            tokens_equal: equal,
            first_divergent_step: None,
        };
        let tokens = |k: Step| TokenAlignment {
            teacher_forced: false,
            prefix: 2,
            parted_at_step: Some(k),
            reference_token: Some(1),
            candidate_token: Some(2),
            not_comparable_steps: None,
        };
        let run = |src: &MemorySource,
                   opts: &CompareOptions,
                   t: Option<Transcript>,
                   neutral: Option<bool>,
                   a: Option<TokenAlignment>| {
            compare_graph(&g, src, opts).unwrap().into_evidence_with(
                Run::default(),
                t,
                neutral,
                vec![],
                vec![],
                a,
            )
        };
        let plain = CompareOptions::default();
        let mut shape = chain_source(&[], &[]);
        shape.insert(
            "conv",
            0,
            Layout::TokenMajor,
            ramp(&[3, 8], 0.3),
            ramp(&[3, 7], 0.3),
        );
        let mut fault = chain_source(&[], &[]);
        fault.insert_fault("layer.0.out", 0, "no transform");
        let mut missing = chain_source(&[], &[]);
        missing.insert_unobserved("mem", 0);
        let require = CompareOptions {
            require_all: true,
            ..Default::default()
        };
        let gap = chain_source(&["mem", "layer.1.out"], &[]);
        let cases: Vec<(&str, Evidence, DivergenceKind, &str)> = vec![
            (
                "values",
                run(&chain_source(&[], &[("conv", 0)]), &plain, None, None, None),
                DivergenceKind::Values,
                "conv",
            ),
            (
                "shape",
                run(&shape, &plain, None, None, None),
                DivergenceKind::Shape,
                "conv",
            ),
            (
                "alignment fault",
                run(&fault, &plain, None, None, None),
                DivergenceKind::Shape,
                "layer.0.out",
            ),
            (
                "missing under --require-all",
                run(&missing, &require, None, None, None),
                DivergenceKind::Missing,
                "mem",
            ),
            (
                "tokens part, every observed checkpoint passes",
                run(
                    &chain_source(&[], &[]),
                    &plain,
                    Some(transcript(false)),
                    None,
                    Some(tokens(1)),
                ),
                DivergenceKind::Tokens,
                "logits",
            ),
            (
                "tokens part behind unobserved checkpoints",
                run(&gap, &plain, Some(transcript(false)), None, Some(tokens(0))),
                DivergenceKind::Tokens,
                "logits",
            ),
            (
                "capture not neutral",
                run(
                    &chain_source(&[], &[]),
                    &plain,
                    Some(transcript(true)),
                    Some(false),
                    None,
                ),
                DivergenceKind::Capture,
                "logits",
            ),
        ];
        for (what, e, kind, at) in cases {
            assert_eq!(e.verdict, Verdict::Diverged, "{what}");
            let fd = e
                .first_divergence
                .as_ref()
                .unwrap_or_else(|| panic!("{what}: empty"));
            assert_eq!((fd.kind, fd.checkpoint.as_str()), (kind, at), "{what}");
            assert!(!fd.suspects.is_empty(), "{what}");
        }
        // The tokens part at step 1: the logits of step 1 are the place; behind a gap, the region.
        let e = run(
            &chain_source(&[], &[]),
            &plain,
            Some(transcript(false)),
            None,
            Some(tokens(1)),
        );
        assert_eq!(e.first_divergence.as_ref().unwrap().step, 1);
        let e = run(&gap, &plain, Some(transcript(false)), None, Some(tokens(0)));
        let r = e.first_divergence.unwrap().region.unwrap();
        assert_eq!(
            r.summary,
            "between layer.0.out@0 (pass) and logits@0 (tokens differ)"
        );
    }
}
