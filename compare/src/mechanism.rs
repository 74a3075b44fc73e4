//! Reference replay at the op-level origin: local errors from the outside and the mechanism
//! behind a divergence.
//!
//! The drill-down ([`crate::ops::localize_op`]) names the first op-level point that differs while
//! its inputs agree. Below that point a signature can only guess from two tensors. Replay asks the
//! reference itself: the HF module is re-run on the **engine's own input** at that op (its
//! `{module}:in` point) through a [`Replayer`] (the oracle's `xray_oracle.replay`; this crate
//! never links Python), and
//!
//! 1. **local error**: `engine_out` against `HF_module(engine_in)` for every module of the region
//!    whose input and output the engine dump holds: an op whose replayed output matches the
//!    engine's within the point's tolerance is *cleared* (it computes what the module computes on
//!    what it was given), one that does not is *convicted*. An engine that cannot be fed gets its
//!    per-op local errors this way;
//! 2. **mechanism** at the convicted origin: the counterfactuals bring-up people actually make,
//!    chosen by the module's kind (from its HF class and the engine kernel, never from a fault's
//!    name), each replayed through the reference and scored by its residual against the engine's
//!    output; scalars are solved (an output scale by least squares, a norm's epsilon by a search
//!    over decades refined by golden section). A counterfactual that reproduces the engine's
//!    output within the point's tolerance, at a tenth of the clean replay's residual or less,
//!    becomes the mechanism; otherwise the evidence lists what was tried, each with its residual.
//!
//! | kind | hypotheses |
//! |---|---|
//! | every module whose input has its output's shape | skipped (the input passed through) |
//! | linear | weight transposed (square) or its buffer read in the other layout (non-square); bias missing / doubled; weight scaled with the bias kept (solved); weight missing; halves of the output rows swapped (a fused K\|V, gate\|up split); another key of the same shape (other layers' same-role modules first, then siblings); weight on an f16 / bf16 grid or a symmetric int-k grid (k = 2..8, per row / per tensor); input rounded to f16 / bf16; output scale (solved) |
//! | conv1d | kernel flipped; weight buffer read channels-last; padding (every split that gives the engine's length); stride; bias missing / doubled; weight grids and rounding; another key; input rounded to f16 / bf16; output scale |
//! | layer_norm, rms_norm, batch_norm | epsilon (tried 1e-12..1, then solved); unbiased variance, mean not subtracted (LayerNorm); weight and bias swapped; affine missing, weight missing, bias missing; `1 + weight` (RMSNorm); batch statistics (BatchNorm); another key; input rounded; output scale |
//! | embedding | scale (solved); ids shifted by +-1; another table of the same shape; table rounded to f16 / bf16 |
//! | attention core (weightless) | softmax scale (solved); causal mask added / dropped; keys and values swapped; another layer's or step's K/V; rotary position offset |
//! | residual add (weightless; the reference's coefficients fitted on its own tensors) | an input dropped; an input's multiplier (solved) |
//! | elementwise (weightless, one observed input; the reference's activation identified on its own tensors) | another activation (erf / tanh / quick GELU, SiLU, ReLU); output scale; output rounded |
//! | inline (ops the reference computes with no HF module around them, replayed through X-Ray's kernels once they reproduce the reference's own point: [`KernelReplayer`]) | a positional table read rows off (+-1, +-2), a table never added or scaled (solved); output shifted, scaled, rounded, features permuted |

use ndarray::ArrayD;
use serde::{Deserialize, Serialize};
use xray_core::contract::{core_of, AttentionRule, Operand};
use xray_core::dump::Dump;
use xray_core::ops::{parse_point, PointNode, Side};
use xray_core::replay::{
    Activation, Counterfactual, GridGranularity, ModuleInfo, ModuleKind, RoundFormat,
};
use xray_core::Layout;
use xray_core::Step;

use crate::align::to_canonical;
use crate::metrics::compare;
use crate::ops::OpDivergence;
use crate::tolerance::Tolerance;

/// One module input handed to a [`Replayer`].
#[derive(Debug, Clone)]
pub struct ReplayInput<'a> {
    /// The tensor, as its op-level point holds it (the form the contract's point rules declare).
    pub array: &'a ArrayD<f32>,
    /// Its layout.
    pub layout: Layout,
    /// An embedding's input given as rows of its table (ids looked up), not ids.
    pub ids_from_rows: bool,
    /// More named inputs with their layouts (an attention core's `key` and `value`).
    pub extra: Vec<(String, ArrayD<f32>, Layout)>,
}

/// What one replay call returns: the module's description and one output per counterfactual
/// (or why it does not apply), each with its layout.
pub type ReplayBatch = (
    ModuleInfo,
    Vec<std::result::Result<(ArrayD<f32>, Layout), String>>,
);

/// Re-runs one module of the reference model (the oracle implements it through pyo3).
pub trait Replayer {
    /// Module `module` on `input` under each of `cfs` (in order). `Err` when the module cannot be
    /// replayed at all (unknown module, input of the wrong kind).
    fn replay(
        &self,
        module: &str,
        input: &ReplayInput<'_>,
        cfs: &[Counterfactual],
    ) -> std::result::Result<ReplayBatch, String>;
}

/// What one run of engine ops through X-Ray's kernels returns ([`KernelReplayer::run`]).
#[derive(Debug, Clone)]
pub struct KernelRun {
    /// The output point's tensor.
    pub array: ArrayD<f32>,
    /// Its layout.
    pub layout: Layout,
    /// Rows the counterfactual leaves undefined (`(axis, first, end)` of `array`: a table read
    /// past its end), which take the engine's values so they are not judged.
    pub unjudged: Option<(usize, usize, usize)>,
}

/// One run of a region's ops through X-Ray's kernels ([`KernelReplayer::run`]).
#[derive(Debug, Clone)]
pub struct KernelRequest<'a> {
    /// The ops, in graph order.
    pub ops: &'a [String],
    /// `(point, tensor, layout)`, one per observed input of the region.
    pub inputs: &'a [Held<'a>],
    /// The output point.
    pub output: &'a str,
    /// The step.
    pub step: Step,
    /// A counterfactual applied to one of the ops (`(op, counterfactual)`).
    pub cf: Option<(&'a str, &'a Counterfactual)>,
}

/// Runs a run of the family's declared ops through X-Ray's own kernels, with the reference
/// model's weights (the harness implements it with the runtime graph): the replay of a region
/// the reference computes inline, where no HF module can be re-run. Trusted only where it
/// reproduces the reference's own tensors (the replay floor).
pub trait KernelReplayer {
    /// Runs `req`.
    fn run(&self, req: &KernelRequest<'_>) -> std::result::Result<KernelRun, String>;
    /// The counterfactuals [`KernelReplayer::run`] can apply to op `op` (by its kernel's kind).
    fn counterfactuals(&self, op: &str) -> Vec<Counterfactual>;
}

/// Whether replay clears or convicts an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayVerdict {
    /// The module replayed on the engine's input reproduces the engine's output within the
    /// point's tolerance: the op computes correctly on what it was given.
    Cleared,
    /// It does not: the op itself computes something else.
    Convicted,
}

/// The local error of one op: the engine's output against the reference module replayed on the
/// engine's own input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalError {
    /// The HF module replayed.
    pub module: String,
    /// The engine op that mirrors it, when the engine graph is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// The engine's points fed to the replay (its `{module}:in`, or the alias it was held under;
    /// an embedding's ids as recovered from the reference's rows).
    pub inputs: Vec<String>,
    /// The engine point compared (`{module}:out`).
    pub output: String,
    /// `||engine - replay|| / ||replay||`; null when the shapes differ.
    pub rel_l2: Option<f64>,
    /// `max |engine - replay|`; null when the shapes differ.
    pub max_abs: Option<f64>,
    /// Whether it is within the point's tolerance.
    pub passes: bool,
    /// Cleared or convicted.
    pub verdict: ReplayVerdict,
    /// Shapes when they differ (`[replay, engine]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shapes: Option<(Vec<usize>, Vec<usize>)>,
}

/// One module's local error at one step, from [`ReplayContext::sweep`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweptError {
    /// The step.
    pub step: Step,
    /// The precision the engine declares for the op (`f16`, `bf16`: its error there is
    /// expected), or none: an op the engine says it computes in f32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<String>,
    /// The module replayed on the engine's own input, against the engine's output.
    #[serde(flatten)]
    pub local_error: LocalError,
    /// The declared precision replayed (an op declared below f32): whether it accounts for the
    /// error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<DeclaredReplay>,
    /// The counterfactual that reproduces the engine's output there (searched at each module's
    /// worst step not accounted for, for the first [`LocalErrors::EXPLAINED`] such modules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<Mechanism>,
}

impl SweptError {
    /// No declaration accounts for this conviction: the engine declares no reduced precision for
    /// the op, its output has another shape than the module's (no precision explains that), or
    /// its declared precision, replayed, does not reproduce it. (A declared op whose precision
    /// could not be replayed is excused: its `precision` says why.)
    pub fn unaccounted(&self) -> bool {
        self.declared.is_none()
            || self.local_error.rel_l2.is_none()
            || self
                .precision
                .as_ref()
                .is_some_and(|p| p.residual.is_some() && !p.accounts)
    }
}

/// An op's declared precision replayed: the module computed the way the engine says it computes
/// it ([`Counterfactual::ComputedIn`]: weight and input rounded to the declared format, products
/// accumulated in f32), on the engine's own input, against the engine's output. Within the
/// point's f32 bounds, the declaration accounts for the op's error; beyond them, the op makes an
/// error its precision does not explain (a logic bug, or a coarser rounding than it declares).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeclaredReplay {
    /// The computation replayed.
    pub counterfactual: Counterfactual,
    /// `||engine - replay|| / ||replay||`; null when it could not be replayed (`why`).
    pub residual: Option<f64>,
    /// Whether the engine's output is within the point's f32 bounds of that replay.
    pub accounts: bool,
    /// Why it could not be replayed (a module kind the format's replay does not apply to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// Every module's local error (`--local-errors`): each module whose `:out` the engine's dump holds,
/// at every step, re-run on the engine's own input and judged at the point's f32 bounds. An op
/// convicted there that the engine declares no reduced precision for makes an error of its own,
/// whatever the checkpoints downstream say (a policy's accepted precision cannot hide it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LocalErrors {
    /// Module-steps replayed.
    pub replayed: u64,
    /// Module-steps that could not be replayed alone (no input point, a module the replay does
    /// not re-run alone, a replay error).
    pub skipped: u64,
    /// The convicted ones, in step and dump order.
    pub convicted: Vec<SweptError>,
}

impl LocalErrors {
    /// How many modules convicted and not accounted for get a mechanism search (each a few dozen
    /// replays).
    pub const EXPLAINED: usize = 8;

    /// The convicted module-steps no declaration accounts for ([`SweptError::unaccounted`]).
    pub fn unaccounted(&self) -> impl Iterator<Item = &SweptError> {
        self.convicted.iter().filter(|s| s.unaccounted())
    }

    /// One line: the counts (the declared ones: how many their precision accounts for, how many
    /// it could not be replayed for), then each module convicted that no declaration accounts for
    /// (its worst local error, first step and steps counted, and the mechanism found), e.g.
    /// `local errors: 619 module-steps replayed (0 skipped), 1 convicted at f32 bounds, 0 of them
    /// declared below f32; not accounted for: encoder.layer.2.fc1 (model.encoder.layers.2.fc1)
    /// rel_l2 4.8e-4 from step 0 (1 step): runtime == model.encoder.layers.2.fc1 with its weight
    /// rounded to bf16 (residual 9.5e-8)`.
    pub fn summary(&self) -> String {
        let declared: Vec<&SweptError> = self
            .convicted
            .iter()
            .filter(|e| e.declared.is_some())
            .collect();
        let mut s = format!(
            "local errors: {} module-steps replayed ({} skipped), {} convicted at f32 bounds, {} of them declared below f32",
            self.replayed,
            self.skipped,
            self.convicted.len(),
            declared.len()
        );
        if !declared.is_empty() {
            let count = |f: &dyn Fn(&DeclaredReplay) -> bool| {
                declared
                    .iter()
                    .filter(|e| e.precision.as_ref().is_some_and(f))
                    .count()
            };
            s.push_str(&format!(
                " ({} accounted for by their declared precision replayed, {} not, {} not replayable)",
                count(&|p| p.accounts),
                count(&|p| p.residual.is_some() && !p.accounts),
                declared.len() - count(&|p| p.residual.is_some())
            ));
        }
        // Per module: its first convicted entry, its worst rel_l2, its steps.
        let mut by: Vec<(&SweptError, Option<f64>, usize)> = Vec::new();
        for e in self.unaccounted() {
            let r = e.local_error.rel_l2;
            match by
                .iter_mut()
                .find(|(f, _, _)| f.local_error.module == e.local_error.module)
            {
                Some((_, worst, n)) => {
                    *n += 1;
                    if r.is_some_and(|r| worst.is_none_or(|w| r > w)) {
                        *worst = r;
                    }
                }
                None => by.push((e, r, 1)),
            }
        }
        if by.is_empty() {
            s.push_str("; every convicted op accounted for");
            return s;
        }
        let named: Vec<String> = by
            .iter()
            .map(|(f, worst, n)| {
                let op = f.local_error.op.as_deref().unwrap_or("?");
                let r = worst.map_or("shapes differ".into(), |r| format!("rel_l2 {r:.1e}"));
                let m = self
                    .unaccounted()
                    .filter(|e| e.local_error.module == f.local_error.module)
                    .find_map(|e| e.mechanism.as_ref())
                    .map_or(String::new(), |m| format!(": {}", m.summary));
                let d = match (&f.declared, &f.precision) {
                    (Some(d), Some(p)) => format!(
                        ", declared {d}: computed in {d} leaves {}",
                        p.residual.map_or("?".into(), |r| format!("{r:.1e}"))
                    ),
                    _ => String::new(),
                };
                format!(
                    "{op} ({}) {r} from step {} ({n} step{}{d}){m}",
                    f.local_error.module,
                    f.step,
                    if *n == 1 { "" } else { "s" }
                )
            })
            .collect();
        s.push_str(&format!("; not accounted for: {}", named.join(", ")));
        s
    }
}

/// The roundings a weight is tried at: the two formats, and the two shortcuts converters take to
/// bfloat16 (truncation, ties away from zero).
const WEIGHT_ROUNDINGS: [RoundFormat; 4] = [
    RoundFormat::F16,
    RoundFormat::Bf16,
    RoundFormat::Bf16Truncated,
    RoundFormat::Bf16TiesAway,
];

/// A counterfactual and how well it reproduces the engine's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tried {
    /// The hypothesis.
    pub counterfactual: Counterfactual,
    /// `||engine - replay_cf|| / ||replay_cf||`; null when it did not apply (`skipped`) or the
    /// shapes differ.
    pub residual: Option<f64>,
    /// Why it was not scored (does not apply, other shape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// The counterfactual that reproduces the engine's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mechanism {
    /// What the engine computes, as a change to the reference module.
    pub counterfactual: Counterfactual,
    /// Its residual (`||engine - replay_cf|| / ||replay_cf||`).
    pub residual: f64,
    /// Its largest absolute difference.
    pub max_abs: f64,
    /// The clean replay's residual it is set against (the op's local error).
    pub clean_residual: Option<f64>,
    /// A number the solved scalar matches (`1/sqrt(64)`, `sqrt(384)`), or null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// One line: `runtime == model.encoder.layers.0.fc1 without its bias (residual 2.1e-08)`.
    pub summary: String,
    /// Other counterfactuals that also reproduce it (equivalent readings), by residual.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<Counterfactual>,
}

/// Replay evidence of an op-level origin (`first_divergence.op.replay`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayEvidence {
    /// The origin's module.
    pub module: String,
    /// Its HF class.
    pub class: String,
    /// Its kind (from the class).
    pub kind: ModuleKind,
    /// The engine kernel of the op (`linear`, `layer_norm`), when the engine graph is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// The state-dict keys the module read.
    pub params: Vec<String>,
    /// The origin op's local error.
    pub local_error: LocalError,
    /// The reference module replayed on the reference's own input against the reference's own
    /// output (`rel_l2`): the replay's noise floor (0 when bit-exact); null when not measured.
    #[serde(default)]
    pub replay_floor: Option<f64>,
    /// The mechanism, when a counterfactual reproduces the engine's output.
    pub mechanism: Option<Mechanism>,
    /// Every counterfactual tried at the origin, in the order tried.
    pub tried: Vec<Tried>,
    /// Local errors of the other ops of the region (neighbours of the origin), in graph order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub neighbours: Vec<LocalError>,
    /// The engine ops the replayed computation covers (the module's op; a weightless step's
    /// ops: the attention core with its head split and merge): what a clearing clears.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub covers: Vec<String>,
    /// The one engine op among `covers` the mechanism implicates (an attention core's kernel for
    /// a mechanism inside it: its keys and values, mask or scale), named as the op-level origin's
    /// op when the region left several suspects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub implicates: Option<String>,
}

impl ReplayEvidence {
    /// One console line: `replay: model.encoder.layers.0.fc1 (Linear) local error rel_l2 3.1e-1
    /// (convicted): runtime == fc1 without its bias (residual 2.1e-08)`.
    pub fn summary(&self) -> String {
        let le = &self.local_error;
        let err = match le.rel_l2 {
            Some(r) => format!("local error rel_l2 {r:.2e}"),
            None => "local error: other shape".into(),
        };
        let verdict = match le.verdict {
            ReplayVerdict::Cleared => "cleared",
            ReplayVerdict::Convicted => "convicted",
        };
        let mech = match &self.mechanism {
            Some(m) => m.summary.clone(),
            None if le.verdict == ReplayVerdict::Cleared => {
                "computes what the module computes on its input".into()
            }
            None => format!(
                "no counterfactual reproduces it ({} tried, best {})",
                self.tried.len(),
                best_tried(&self.tried)
            ),
        };
        format!(
            "replay: {} ({}) {err} ({verdict}): {mech}",
            self.module, self.class
        )
    }
}

fn best_tried(t: &[Tried]) -> String {
    t.iter()
        .filter_map(|t| t.residual.map(|r| (r, t)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(r, t)| format!("{} at {r:.2e}", t.counterfactual.phrase()))
        .unwrap_or_else(|| "none scored".into())
}

/// What the caller knows of the engine op behind a module.
#[derive(Debug, Clone, Default)]
pub struct EngineOp {
    /// Its name.
    pub op: Option<String>,
    /// Its kernel kind.
    pub kernel: Option<String>,
}

/// Counterfactuals scored against the engine's output: `(counterfactual, residual, max_abs,
/// passes)`.
type Scored = Vec<(Counterfactual, f64, f64, bool)>;

/// A point as one dump holds it: (name, tensor, layout).
pub type Held<'a> = (&'a str, &'a ArrayD<f32>, Layout);

/// The first alias of a point node held by `d` at `step`.
fn held<'a>(d: &'a Dump, names: &[String], step: Step) -> Option<Held<'a>> {
    names.iter().find_map(|n| {
        let e = d.entry(n, step)?;
        let t = d.get(n, step)?;
        Some((e.name.as_str(), t, e.layout))
    })
}

/// An attention core's input: its queries, with its keys and values as the extra inputs (all
/// token-major).
fn qkv_input(q: &ArrayD<f32>, k: ArrayD<f32>, v: ArrayD<f32>) -> ReplayInput<'_> {
    ReplayInput {
        array: q,
        layout: Layout::TokenMajor,
        ids_from_rows: false,
        extra: vec![
            ("key".into(), k, Layout::TokenMajor),
            ("value".into(), v, Layout::TokenMajor),
        ],
    }
}

/// The aliases of point `name` (every name of the node carrying it), or just it.
fn aliases(nodes: &[PointNode], name: &str) -> Vec<String> {
    nodes
        .iter()
        .find(|n| n.names.iter().any(|p| p == name))
        .map(|n| n.names.clone())
        .unwrap_or_else(|| vec![name.to_string()])
}

/// `t` in layout `to` (a no-op when it is already).
fn in_layout(t: &ArrayD<f32>, from: Layout, to: Layout) -> Option<ArrayD<f32>> {
    if from == to {
        return Some(t.clone());
    }
    to_canonical(t, from, to, None).ok()
}

/// How a replayed tensor compares with the engine's: rel_l2 over the replay, max abs, passes.
fn score(
    replayed: &ArrayD<f32>,
    engine: &ArrayD<f32>,
    tol: &Tolerance,
) -> Option<(f64, f64, bool)> {
    if replayed.shape() != engine.shape() {
        return None;
    }
    match compare(&replayed.view(), &engine.view(), tol) {
        Ok(m) => Some((m.rel_l2, m.max_abs, m.passes(tol))),
        // A replay holding a NaN or Inf: no agreement can be claimed.
        Err(_) => Some((f64::MAX, f64::MAX, false)),
    }
}

impl LocalError {
    /// The local error of a replay scored against the engine's output as [`score`] scores it
    /// (`sc`: none when the shapes, `[replay, engine]`, differ).
    fn scored(
        module: String,
        op: Option<String>,
        inputs: Vec<String>,
        output: String,
        sc: Option<(f64, f64, bool)>,
        shapes: [&[usize]; 2],
    ) -> Self {
        let passes = sc.is_some_and(|x| x.2);
        LocalError {
            module,
            op,
            inputs,
            output,
            rel_l2: sc.map(|x| x.0),
            max_abs: sc.map(|x| x.1),
            passes,
            verdict: if passes {
                ReplayVerdict::Cleared
            } else {
                ReplayVerdict::Convicted
            },
            shapes: sc
                .is_none()
                .then(|| (shapes[0].to_vec(), shapes[1].to_vec())),
        }
    }
}

impl ReplayEvidence {
    /// The evidence of `local_error`'s module before anything is tried: no kernel, params,
    /// replay floor, neighbours or covered ops yet.
    fn of(local_error: LocalError, class: String, kind: ModuleKind) -> Self {
        ReplayEvidence {
            module: local_error.module.clone(),
            class,
            kind,
            kernel: None,
            params: vec![],
            local_error,
            replay_floor: None,
            mechanism: None,
            tried: vec![],
            neighbours: vec![],
            covers: vec![],
            implicates: None,
        }
    }
}

/// Inputs gathered for replaying one module.
struct Site<'a> {
    module: String,
    input_name: String,
    input: std::borrow::Cow<'a, ArrayD<f32>>,
    input_layout: Layout,
    ids_from_rows: bool,
    out_name: String,
    engine_out: &'a ArrayD<f32>,
    engine_layout: Layout,
    /// The reference's own input and output (for the replay floor).
    reference: Option<(&'a ArrayD<f32>, Layout, &'a ArrayD<f32>)>,
}

/// The engine's input and output of `module` at `step`: its `:in` (under any alias) and `:out`
/// points. An embedding whose ids the engine does not emit is fed the reference's output rows
/// (ids are feeds: both engines read the same). An engine input held in another layout than the
/// reference's point (the contract's declared one) is converted between the two declared
/// layouts, as the comparison does; the replay refuses any other.
fn site<'a>(
    nodes: &[PointNode],
    reference: &'a Dump,
    candidate: &'a Dump,
    module: &str,
    step: Step,
    kernel: Option<&str>,
) -> Option<Site<'a>> {
    let out = format!("{module}:out");
    let inp = format!("{module}:in");
    let (out_name, engine_out, engine_layout) = held(candidate, &aliases(nodes, &out), step)?;
    let r_out = held(reference, &aliases(nodes, &out), step);
    let (input_name, input, input_layout, ids_from_rows) =
        match held(candidate, &aliases(nodes, &inp), step) {
            Some((n, t, l)) => (n.to_string(), t, l, false),
            // No input point: an embedding (the engine emits only its output), when the
            // engine's kernel is one or unknown (the replay refuses rows for anything else).
            None if kernel.is_none_or(|k| k == "embedding") => {
                let (n, t, l) = r_out?;
                (format!("{n} (reference rows: ids)"), t, l, true)
            }
            None => return None,
        };
    let r_in = held(reference, &aliases(nodes, &inp), step);
    // No transform between the two: handed over as held, for the replay to refuse by name.
    let (input, input_layout) = match r_in
        .filter(|&(_, _, rl)| !ids_from_rows && rl != input_layout)
        .and_then(|(_, _, rl)| Some((in_layout(input, input_layout, rl)?, rl)))
    {
        Some((converted, rl)) => (std::borrow::Cow::Owned(converted), rl),
        None => (std::borrow::Cow::Borrowed(input), input_layout),
    };
    let reference = match (r_in, r_out) {
        (Some((_, ri, rl)), Some((_, ro, _))) if !ids_from_rows => Some((ri, rl, ro)),
        _ => None,
    };
    Some(Site {
        module: module.to_string(),
        input_name,
        input,
        input_layout,
        ids_from_rows,
        out_name: out_name.to_string(),
        engine_out,
        engine_layout,
        reference,
    })
}

/// Why `module` is not replayed at `step`: no input and output points to replay it on.
fn no_site(module: &str, step: Step) -> String {
    format!("the engine dump holds no {module}:in and :out at step {step} to replay")
}

/// Local error of one site from its clean replay (output, layout).
fn local_error(
    s: &Site<'_>,
    clean: &(ArrayD<f32>, Layout),
    tol: &Tolerance,
    eop: &EngineOp,
) -> (LocalError, Option<ArrayD<f32>>) {
    let engine = in_layout(s.engine_out, s.engine_layout, clean.1);
    let sc = engine.as_ref().and_then(|e| score(&clean.0, e, tol));
    let le = LocalError::scored(
        s.module.clone(),
        eop.op.clone(),
        vec![s.input_name.clone()],
        s.out_name.clone(),
        sc,
        [clean.0.shape(), s.engine_out.shape()],
    );
    (le, engine)
}

/// The hypotheses for a module of this kind, in the order they are tried (most plausible first).
/// `engine_len` is the engine output's time length (a conv's last axis), for padding and stride.
pub fn hypotheses(
    info: &ModuleInfo,
    engine_shape: &[usize],
    input_len: usize,
) -> Vec<Counterfactual> {
    use Counterfactual as C;
    let mut v = Vec::new();
    let w = info.param("weight");
    let has_bias = info.param("bias").is_some();
    let other_keys = |v: &mut Vec<C>, roles: &[(&str, usize)]| {
        for (role, n) in roles {
            if let Some(p) = info.param(role) {
                for k in p.same_shape.iter().take(*n) {
                    v.push(C::OtherKey {
                        role: role.to_string(),
                        key: k.clone(),
                    });
                }
            }
        }
    };
    // The same module of other layers (a path differing only in numeric segments), from the
    // weight's same-shape keys: every parameter read from there at once.
    let other_modules = |v: &mut Vec<C>, n: usize| {
        let own: Vec<&str> = info.module.split('.').collect();
        let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let same_structure = |m: &str| {
            let segs: Vec<&str> = m.split('.').collect();
            segs.len() == own.len()
                && m != info.module
                && segs
                    .iter()
                    .zip(&own)
                    .all(|(a, b)| a == b || (numeric(a) && numeric(b)))
        };
        if info.params.len() < 2 {
            return; // one parameter: OtherKey says it
        }
        let Some(w) = w else { return };
        for m in w
            .same_shape
            .iter()
            .filter_map(|k| k.strip_suffix(".weight"))
            .filter(|m| same_structure(m))
            .take(n)
        {
            v.push(C::OtherModule { module: m.into() });
        }
    };
    let grids = |v: &mut Vec<C>| {
        for format in WEIGHT_ROUNDINGS {
            v.push(C::WeightRounded { format });
        }
        for bits in (2..=8).rev() {
            for granularity in [GridGranularity::PerRow, GridGranularity::PerTensor] {
                v.push(C::WeightGrid { bits, granularity });
            }
        }
    };
    let inputs_rounded = |v: &mut Vec<C>| {
        for format in [RoundFormat::F16, RoundFormat::Bf16] {
            v.push(C::InputRounded { format });
        }
    };
    match info.kind {
        ModuleKind::Linear => {
            if let Some(w) = w {
                if w.shape.len() == 2 && w.shape[0] == w.shape[1] {
                    v.push(C::TransposeWeight);
                } else {
                    v.push(C::WeightReinterpreted);
                }
            }
            if has_bias {
                v.push(C::BiasMissing);
                v.push(C::BiasDoubled);
            }
            v.push(C::WeightMissing);
            if w.is_some_and(|w| w.shape.first().is_some_and(|n| n % 2 == 0)) {
                v.push(C::HalvesSwapped);
            }
            other_keys(&mut v, &[("weight", 8), ("bias", 4)]);
            other_modules(&mut v, 4);
            grids(&mut v);
            inputs_rounded(&mut v);
        }
        ModuleKind::Conv1d => {
            let k = info.ints("kernel_size").first().copied().unwrap_or(1);
            let stride = info.ints("stride").first().copied().unwrap_or(1).max(1);
            let pad = info.ints("padding").first().copied().unwrap_or(0);
            let dil = info.ints("dilation").first().copied().unwrap_or(1);
            if k > 1 {
                v.push(C::KernelFlipped);
                v.push(C::WeightReinterpreted);
            }
            let span = dil * (k - 1) + 1;
            let out_len = |l: usize, r: usize, s: usize| {
                (input_len + l + r).checked_sub(span).map(|n| n / s + 1)
            };
            let want = engine_shape.last().copied();
            for l in 0..=k {
                for r in 0..=k {
                    if (l, r) != (pad, pad) && out_len(l, r, stride) == want {
                        v.push(C::Padding { left: l, right: r });
                    }
                }
            }
            for s in 1..=4 {
                if s != stride && out_len(pad, pad, s) == want {
                    v.push(C::Stride { value: s });
                }
            }
            if has_bias {
                v.push(C::BiasMissing);
                v.push(C::BiasDoubled);
            }
            other_keys(&mut v, &[("weight", 6), ("bias", 4)]);
            other_modules(&mut v, 4);
            inputs_rounded(&mut v);
            grids(&mut v);
        }
        ModuleKind::LayerNorm | ModuleKind::RmsNorm | ModuleKind::BatchNorm => {
            if info.kind == ModuleKind::LayerNorm {
                v.push(C::UnbiasedVariance);
                v.push(C::NotCentered);
            }
            if info.kind == ModuleKind::BatchNorm {
                v.push(C::BatchStatistics);
                v.push(C::RunningVarPower { value: 0.5 });
                v.push(C::RunningVarPower { value: 2.0 });
                v.push(C::RunningMeanMissing);
            }
            if w.is_some() && has_bias {
                v.push(C::AffineSwapped);
            }
            if w.is_some() {
                v.push(C::AffineMissing);
                if has_bias {
                    v.push(C::NormWeightMissing);
                    v.push(C::NormBiasMissing);
                }
            }
            if info.kind == ModuleKind::RmsNorm {
                v.push(C::WeightPlusOne);
            }
            other_keys(&mut v, &[("weight", 6), ("bias", 4)]);
            other_modules(&mut v, 4);
            inputs_rounded(&mut v);
        }
        ModuleKind::Embedding => {
            v.push(C::IdOffset { by: 1 });
            v.push(C::IdOffset { by: -1 });
            other_keys(&mut v, &[("weight", 4)]);
            for format in WEIGHT_ROUNDINGS {
                v.push(C::WeightRounded { format });
            }
        }
        ModuleKind::ResidualAdd
        | ModuleKind::Attention
        | ModuleKind::Elementwise
        | ModuleKind::Inline
        | ModuleKind::Other => {}
    }
    v
}

/// The hypotheses computed on the clean replay itself, without another replay: an output scale
/// (least squares) and the output rounded to f16 / bf16. Appended to `ev.tried` and `scored`.
fn output_hypotheses(
    ev: &mut ReplayEvidence,
    scored: &mut Vec<(Counterfactual, f64, f64, bool)>,
    clean: &ArrayD<f32>,
    layout: Layout,
    engine: &ArrayD<f32>,
    tol: &Tolerance,
) {
    let mut cands: Vec<(Counterfactual, ArrayD<f32>)> = Vec::new();
    if let Some(c) = features_permuted(clean, layout, engine) {
        cands.push(c);
    }
    if let Some(axis) = time_axis(clean, layout) {
        for by in [1i64, -1, 2, -2] {
            if let Some(c) = shifted(clean, engine, axis, by) {
                cands.push((Counterfactual::OutputShifted { by }, c));
            }
        }
    }
    if let Some(f) = solve_scale(clean, engine).filter(|f| (f - 1.0).abs() > 1e-4) {
        cands.push((
            Counterfactual::OutputScale { factor: f },
            clean.mapv(|v| (v as f64 * f) as f32),
        ));
    }
    cands.push((
        Counterfactual::OutputRounded {
            format: RoundFormat::F16,
        },
        clean.mapv(|v| half::f16::from_f32(v).to_f32()),
    ));
    cands.push((
        Counterfactual::OutputRounded {
            format: RoundFormat::Bf16,
        },
        clean.mapv(|v| half::bf16::from_f32(v).to_f32()),
    ));
    judge(ev, scored, cands, engine, tol);
}

/// Scores candidate outputs computed without a replay against the engine's: each is recorded in
/// `ev.tried`, and the scored ones appended to `scored`.
fn judge(
    ev: &mut ReplayEvidence,
    scored: &mut Vec<(Counterfactual, f64, f64, bool)>,
    cands: Vec<(Counterfactual, ArrayD<f32>)>,
    engine: &ArrayD<f32>,
    tol: &Tolerance,
) {
    for (cf, c) in cands {
        let sc = score(&c, engine, tol);
        ev.tried.push(Tried {
            counterfactual: cf.clone(),
            residual: sc.map(|x| x.0),
            skipped: sc.is_none().then(|| "other shape".to_string()),
        });
        if let Some(sc) = sc {
            scored.push((cf, sc.0, sc.1, sc.2));
        }
    }
}

/// The time axis of a rank-2 tensor in `layout`: a token-major one's rows, a channel-major
/// one's columns; none for any other (its axes are not known to be time).
fn time_axis(t: &ArrayD<f32>, layout: Layout) -> Option<usize> {
    match (t.ndim(), layout) {
        (2, Layout::TokenMajor) => Some(0),
        (2, Layout::ChannelMajor) => Some(1),
        _ => None,
    }
}

/// `clean` shifted by `by` frames along `axis` (the engine's frame `t` is the reference's
/// `t - by`); the `|by|` frames shifted in take the engine's own values, so they are not judged.
/// `None` when the shapes differ or the axis is too short for the shift to leave a frame.
fn shifted(clean: &ArrayD<f32>, engine: &ArrayD<f32>, axis: usize, by: i64) -> Option<ArrayD<f32>> {
    use ndarray::{Axis, Slice};
    let n = clean.len_of(Axis(axis));
    let k = by.unsigned_abs() as usize;
    if clean.shape() != engine.shape() || k == 0 || k >= n / 2 {
        return None;
    }
    let mut out = engine.clone();
    let (dst, src) = if by > 0 {
        (k..n, 0..n - k)
    } else {
        (0..n - k, k..n)
    };
    out.slice_axis_mut(Axis(axis), Slice::from(dst))
        .assign(&clean.slice_axis(Axis(axis), Slice::from(src)));
    Some(out)
}

/// At most this many rows (frames) are used to match features; the match is then judged on
/// the whole tensor.
const MATCH_ROWS: usize = 64;

/// Outputs with more features than this are not matched (the matching compares every pair: a
/// vocabulary-wide logits row would take seconds).
const MATCH_FEATURES: usize = 4096;

/// The features of a rank-2 output (a token-major one's columns, a channel-major one's rows) in
/// another order: each engine feature matched to the reference feature it is nearest (squared
/// difference over the first [`MATCH_ROWS`] frames). `None` when every feature is its own, the
/// shapes differ, or the matching is not a permutation.
fn features_permuted(
    clean: &ArrayD<f32>,
    layout: Layout,
    engine: &ArrayD<f32>,
) -> Option<(Counterfactual, ArrayD<f32>)> {
    use ndarray::Axis;
    if clean.shape() != engine.shape() || clean.ndim() != 2 {
        return None;
    }
    let feat = match layout {
        Layout::TokenMajor => 1,
        Layout::ChannelMajor => 0,
        _ => return None,
    };
    let n = clean.len_of(Axis(feat));
    if !(2..=MATCH_FEATURES).contains(&n) {
        return None;
    }
    let rows = clean.len_of(Axis(1 - feat)).min(MATCH_ROWS);
    let column = |t: &ArrayD<f32>, i: usize| -> Vec<f64> {
        let c = t.index_axis(Axis(feat), i);
        c.iter().take(rows).map(|&v| v as f64).collect()
    };
    let cols: Vec<Vec<f64>> = (0..n).map(|i| column(clean, i)).collect();
    let mut slots = Vec::with_capacity(n);
    let mut seen = vec![false; n];
    for i in 0..n {
        let e = column(engine, i);
        let (best, _) = cols
            .iter()
            .enumerate()
            .map(|(h, c)| {
                let d: f64 = c.iter().zip(&e).map(|(a, b)| (a - b).powi(2)).sum();
                (h, d)
            })
            .filter(|(_, d)| d.is_finite())
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        if std::mem::replace(&mut seen[best], true) {
            return None;
        }
        slots.push(best);
    }
    if slots.iter().enumerate().all(|(i, h)| i == *h) {
        return None;
    }
    let mut out = clean.clone();
    for (i, &h) in slots.iter().enumerate() {
        out.index_axis_mut(Axis(feat), i)
            .assign(&clean.index_axis(Axis(feat), h));
    }
    Some((Counterfactual::FeaturesPermuted { slots }, out))
}

/// The heads of an attention core's output (`[T, H * head_dim]` token-major, or `[H, T,
/// head_dim]` head-major) in another order: each engine slot matched to the reference head it is
/// nearest (squared difference). `None` when every slot holds its own head, the shapes differ,
/// or the matching is not a permutation.
fn heads_permuted(
    clean: &ArrayD<f32>,
    layout: Layout,
    engine: &ArrayD<f32>,
    head_dim: usize,
) -> Option<(Counterfactual, ArrayD<f32>)> {
    use ndarray::{Axis, Slice};
    if clean.shape() != engine.shape() || head_dim == 0 {
        return None;
    }
    let (axis, width) = match (clean.ndim(), layout) {
        (2, Layout::TokenMajor) => (1, head_dim),
        (3, Layout::HeadMajor) => (0, 1),
        _ => return None,
    };
    let n = clean.len_of(Axis(axis));
    if !n.is_multiple_of(width) || n / width < 2 {
        return None;
    }
    let heads = n / width;
    let block = |t: &ArrayD<f32>, h: usize| {
        t.slice_axis(Axis(axis), Slice::from(h * width..(h + 1) * width))
            .to_owned()
    };
    let mut slots = Vec::with_capacity(heads);
    for i in 0..heads {
        let e = block(engine, i);
        let best = (0..heads)
            .map(|h| {
                let d: f64 = block(clean, h)
                    .iter()
                    .zip(e.iter())
                    .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
                    .sum();
                (h, d)
            })
            .filter(|(_, d)| d.is_finite())
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        slots.push(best.0);
    }
    let mut seen = vec![false; heads];
    for &h in &slots {
        if std::mem::replace(&mut seen[h], true) {
            return None;
        }
    }
    if slots.iter().enumerate().all(|(i, h)| i == *h) {
        return None;
    }
    let mut out = clean.clone();
    for (i, &h) in slots.iter().enumerate() {
        out.slice_axis_mut(Axis(axis), Slice::from(i * width..(i + 1) * width))
            .assign(&block(clean, h));
    }
    Some((Counterfactual::HeadsPermuted { slots }, out))
}

/// Least-squares `s` with `engine ~ s * replay`.
fn solve_scale(replay: &ArrayD<f32>, engine: &ArrayD<f32>) -> Option<f64> {
    if replay.shape() != engine.shape() {
        return None;
    }
    let (mut xy, mut yy) = (0f64, 0f64);
    for (&y, &x) in replay.iter().zip(engine.iter()) {
        if x.is_finite() && y.is_finite() {
            xy += x as f64 * y as f64;
            yy += y as f64 * y as f64;
        }
    }
    (yy > 0.0).then(|| xy / yy)
}

/// A simple number `s` is close to: `sqrt(n)`, `1/sqrt(n)`, `n`, `1/n` for a dimension `n`.
fn scale_hint(s: f64, dims: &[usize]) -> Option<String> {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-3 * b.abs();
    for &n in dims.iter().filter(|&&n| n > 1) {
        let r = (n as f64).sqrt();
        for (v, name) in [
            (r, format!("sqrt({n})")),
            (1.0 / r, format!("1/sqrt({n})")),
            (n as f64, format!("{n}")),
            (1.0 / n as f64, format!("1/{n}")),
        ] {
            if close(s, v) {
                return Some(name);
            }
        }
    }
    for (v, name) in [(2.0, "2"), (0.5, "1/2"), (-1.0, "-1")] {
        if close(s, v) {
            return Some(name.to_string());
        }
    }
    None
}

/// A "round" epsilon near `e` (mantissa 1, 2 or 5), if within 5 %.
fn round_eps(e: f64) -> Option<f64> {
    if e <= 0.0 {
        return None;
    }
    let k = e.log10().floor();
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * 10f64.powf(k))
        .find(|v| (v - e).abs() <= 0.05 * e)
}

/// Replays the origin op's module and its neighbours, and searches the mechanism at the origin.
pub struct ReplayContext<'a> {
    /// The points' graph (aliases, upstream nodes).
    pub nodes: &'a [PointNode],
    /// The reference dump (its points at the step).
    pub reference: &'a Dump,
    /// The engine's dump (its points at the step).
    pub candidate: &'a Dump,
    /// The replayer, or why there is none (no oracle: the replays that re-run no HF module,
    /// a residual add, an elementwise step, an inline region, still run).
    pub replayer: std::result::Result<&'a dyn Replayer, &'a str>,
    /// The engine op (name, kernel) of a module, when the engine graph is known.
    pub engine_op: &'a dyn Fn(&str) -> EngineOp,
    /// Tolerance of a point (the policy's).
    pub tolerance: &'a dyn Fn(&str) -> Tolerance,
    /// At most this many neighbours replayed.
    pub max_neighbours: usize,
    /// The kernel kind of an engine op, by op name, when the engine graph is known.
    pub op_kernel: &'a dyn Fn(&str) -> Option<String>,
    /// X-Ray's kernels for the family's declared ops, when the engine graph is known: the
    /// replay of a region the reference computes inline ([`ModuleKind::Inline`]).
    pub kernels: Option<&'a dyn KernelReplayer>,
    /// The contract's attention rules: which points feed and leave each attention core
    /// ([`AttentionRule`]); a core no rule declares is not replayed as one.
    pub attention: &'a [AttentionRule],
}

/// The modules of the region around the origin: those whose `:out` point the engine dump holds
/// at `step` among the points it holds, nearest to the origin (in graph order) first.
fn region_modules(cx: &ReplayContext<'_>, origin: &str, step: Step) -> Vec<String> {
    let mut mods: Vec<(usize, String)> = Vec::new();
    let pos = cx.nodes.iter().position(|n| {
        n.names
            .iter()
            .any(|p| parse_point(p).is_some_and(|(m, _)| m == origin))
    });
    for (i, n) in cx.nodes.iter().enumerate() {
        for p in &n.names {
            let Some((m, Side::Out)) = parse_point(p) else {
                continue;
            };
            if m == origin || mods.iter().any(|(_, x)| x == m) {
                continue;
            }
            if cx.candidate.entry(p, step).is_none() && held(cx.candidate, &n.names, step).is_none()
            {
                continue;
            }
            let d = pos.map_or(i, |o| o.abs_diff(i));
            mods.push((d, m.to_string()));
        }
    }
    mods.sort();
    mods.truncate(cx.max_neighbours);
    // Back to graph order.
    let order = |m: &str| {
        cx.nodes
            .iter()
            .position(|n| n.names.iter().any(|p| p == &format!("{m}:out")))
            .unwrap_or(usize::MAX)
    };
    let mut v: Vec<String> = mods.into_iter().map(|(_, m)| m).collect();
    v.sort_by_key(|m| order(m));
    v
}

impl<'a> ReplayContext<'a> {
    /// [`Replayer::replay`] through the replayer, or why there is none.
    fn rerun(
        &self,
        module: &str,
        input: &ReplayInput<'_>,
        cfs: &[Counterfactual],
    ) -> std::result::Result<ReplayBatch, String> {
        match self.replayer {
            Ok(r) => r.replay(module, input, cfs),
            Err(why) => Err(why.to_string()),
        }
    }

    /// The first alias of a point node held at `step` by the engine's dump and the reference's
    /// (each its own first).
    fn held_both(&self, names: &[String], step: Step) -> Option<(Held<'a>, Held<'a>)> {
        Some((
            held(self.candidate, names, step)?,
            held(self.reference, names, step)?,
        ))
    }

    /// The engine's input and output of `module` at `step` (see [`site`]).
    fn site(&self, module: &str, step: Step, eop: &EngineOp) -> Option<Site<'a>> {
        site(
            self.nodes,
            self.reference,
            self.candidate,
            module,
            step,
            eop.kernel.as_deref(),
        )
    }

    fn input<'b>(&self, s: &'b Site<'_>) -> ReplayInput<'b> {
        ReplayInput {
            array: &s.input,
            layout: s.input_layout,
            ids_from_rows: s.ids_from_rows,
            extra: Vec::new(),
        }
    }

    /// The local error of `module` at `step` (one clean replay), with its site.
    fn local(
        &self,
        module: &str,
        step: Step,
        declared: &dyn Fn(&str) -> Option<RoundFormat>,
    ) -> Option<(LocalError, Option<DeclaredReplay>)> {
        let eop = (self.engine_op)(module);
        let s = self.site(module, step, &eop)?;
        // An op declared below f32: the computation it declares, in the same replay call.
        let format = eop.op.as_deref().and_then(declared);
        let mut cfs = vec![Counterfactual::None];
        cfs.extend(format.map(|format| Counterfactual::ComputedIn { format }));
        let (_, outs) = self.rerun(module, &self.input(&s), &cfs).ok()?;
        let mut outs = outs.into_iter();
        let clean = outs.next()?.ok()?;
        let tol = (self.tolerance)(&s.out_name);
        let (le, engine) = local_error(&s, &clean, &tol, &eop);
        let precision = cfs.get(1).map(|cf| {
            let (residual, accounts, why) = match outs.next() {
                Some(Ok((y, _))) => match engine.as_ref().and_then(|e| score(&y, e, &tol)) {
                    Some((r, _, passes)) => (Some(r), passes, None),
                    None => (None, false, Some("shapes differ".to_string())),
                },
                Some(Err(why)) => (None, false, Some(why)),
                None => (None, false, Some("the replay returned nothing".into())),
            };
            DeclaredReplay {
                counterfactual: cf.clone(),
                residual,
                accounts,
                why,
            }
        });
        Some((le, precision))
    }

    /// The local error of every module whose `:out` point the engine's dump holds at `step` (in
    /// the dump's order): each re-run on the engine's own input (the same clean replay as the
    /// origin's), which tells the error an op makes from the error it is handed; for an op the
    /// engine declares below f32 (`declared`: its format by engine op), also the computation it
    /// declares ([`DeclaredReplay`]). Returns them and how many modules could not be replayed
    /// (no input point, a module the replay does not re-run alone, a replay error).
    pub fn sweep(
        &self,
        step: Step,
        declared: &dyn Fn(&str) -> Option<RoundFormat>,
    ) -> (Vec<(LocalError, Option<DeclaredReplay>)>, u64) {
        let mut done: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let (mut out, mut skipped) = (Vec::new(), 0u64);
        for e in self
            .candidate
            .manifest
            .checkpoints
            .iter()
            .filter(|e| e.step == step)
        {
            let Some((module, Side::Out)) = parse_point(&e.name) else {
                continue;
            };
            if !done.insert(module) {
                continue;
            }
            match self.local(module, step, declared) {
                Some(le) => out.push(le),
                None => skipped += 1,
            }
        }
        (out, skipped)
    }

    /// Replay evidence for the op-level origin `op` (its module's `:out` point), or why there is
    /// none (the origin is a module input, no input point, the replay failed).
    pub fn origin(&self, op: &OpDivergence) -> std::result::Result<ReplayEvidence, String> {
        let step = op.step;
        let module = op.module.as_str();
        let eop = (self.engine_op)(module);
        let Some(s) = self.site(module, step, &eop) else {
            // No input point to re-run the module on (its wrapper pads first): the region's ops
            // from their observed inputs, through X-Ray's kernels.
            let why = no_site(module, step);
            let node = self
                .nodes
                .iter()
                .find(|n| n.names.iter().any(|p| p == &op.point))
                .ok_or(why.clone())?;
            return self.inline_or(op, node, why);
        };
        self.at_site(module, step, &eop, &s, true)
    }

    /// Replay evidence for `module` at `step` on its site: the clean replay, the replay floor,
    /// (with `neighbours`) the region's local errors, and the mechanism search when convicted.
    pub fn module_evidence(
        &self,
        module: &str,
        step: Step,
    ) -> std::result::Result<ReplayEvidence, String> {
        let eop = (self.engine_op)(module);
        let s = self
            .site(module, step, &eop)
            .ok_or_else(|| no_site(module, step))?;
        self.at_site(module, step, &eop, &s, false)
    }

    fn at_site(
        &self,
        module: &str,
        step: Step,
        eop: &EngineOp,
        s: &Site<'_>,
        neighbours: bool,
    ) -> std::result::Result<ReplayEvidence, String> {
        let tol = (self.tolerance)(&s.out_name);
        let input = self.input(s);
        let (info, outs) = self.rerun(module, &input, &[Counterfactual::None])?;
        let clean = outs
            .into_iter()
            .next()
            .ok_or("the replay returned nothing")??;
        let (local, engine) = local_error(s, &clean, &tol, eop);
        let replay_floor = s.reference.and_then(|(ri, rl, ro)| {
            let inp = ReplayInput {
                array: ri,
                layout: rl,
                ids_from_rows: false,
                extra: Vec::new(),
            };
            let (_, o) = self.rerun(module, &inp, &[Counterfactual::None]).ok()?;
            let (r, l) = o.into_iter().next()?.ok()?;
            let ro = in_layout(ro, s.engine_layout, l)?;
            score(&r, &ro, &tol).map(|x| x.0)
        });
        let neighbours = if neighbours {
            region_modules(self, module, step)
                .into_iter()
                .filter_map(|m| self.local(&m, step, &|_| None).map(|(le, _)| le))
                .collect()
        } else {
            vec![]
        };
        let mut ev = ReplayEvidence {
            kernel: eop.kernel.clone(),
            params: info.params.iter().map(|p| p.key.clone()).collect(),
            replay_floor,
            neighbours,
            covers: eop.op.iter().cloned().collect(),
            ..ReplayEvidence::of(local.clone(), info.class.clone(), info.kind)
        };
        if local.verdict == ReplayVerdict::Cleared {
            return Ok(ev);
        }
        // The engine's output in the replay's layout (shape may differ: padding, stride).
        let engine = match engine {
            Some(e) => e,
            None => s.engine_out.clone(),
        };
        self.search(&mut ev, &info, s, &clean, &engine, &tol);
        Ok(ev)
    }

    /// Scores `cfs` against the engine's output, appending to `ev.tried`; returns the scored
    /// (counterfactual, residual, max_abs, passes).
    /// The module replayed on `input` (other inputs than the engine's, e.g. another layer's
    /// keys), scored against the engine's output and recorded as the counterfactual `label`.
    fn try_input(
        &self,
        ev: &mut ReplayEvidence,
        module: &str,
        input: &ReplayInput<'_>,
        label: Counterfactual,
        engine: &ArrayD<f32>,
        tol: &Tolerance,
    ) -> Option<(Counterfactual, f64, f64, bool)> {
        let out = self
            .rerun(module, input, &[Counterfactual::None])
            .and_then(|(_, o)| {
                o.into_iter()
                    .next()
                    .ok_or("the replay returned nothing".into())
            })
            .and_then(|o| o);
        let (res, skipped, hit) = match out {
            Err(why) => (None, Some(why), None),
            Ok((out, _)) => match score(&out, engine, tol) {
                Some(sc) => (Some(sc.0), None, Some((label.clone(), sc.0, sc.1, sc.2))),
                None => (
                    None,
                    Some(format!(
                        "other shape: {:?} vs the engine's {:?}",
                        out.shape(),
                        engine.shape()
                    )),
                    None,
                ),
            },
        };
        ev.tried.push(Tried {
            counterfactual: label,
            residual: res,
            skipped,
        });
        hit
    }

    fn try_all(
        &self,
        ev: &mut ReplayEvidence,
        module: &str,
        input: &ReplayInput<'_>,
        cfs: &[Counterfactual],
        engine: &ArrayD<f32>,
        tol: &Tolerance,
    ) -> Vec<(Counterfactual, f64, f64, bool)> {
        let mut scored = Vec::new();
        if cfs.is_empty() {
            return scored;
        }
        let outs = match self.rerun(module, input, cfs) {
            Ok((_, o)) => o,
            Err(e) => {
                for c in cfs {
                    ev.tried.push(Tried {
                        counterfactual: c.clone(),
                        residual: None,
                        skipped: Some(e.clone()),
                    });
                }
                return scored;
            }
        };
        for (c, o) in cfs.iter().zip(outs) {
            let (res, skipped) = match o {
                Err(why) => (None, Some(why)),
                // Every output of one module has the clean replay's layout, as `engine` has.
                Ok((out, _)) => {
                    let e = engine;
                    match score(&out, e, tol) {
                        Some(sc) => {
                            scored.push((c.clone(), sc.0, sc.1, sc.2));
                            (Some(sc.0), None)
                        }
                        None => (
                            None,
                            Some(format!(
                                "other shape: {:?} vs the engine's {:?}",
                                out.shape(),
                                e.shape()
                            )),
                        ),
                    }
                }
            };
            ev.tried.push(Tried {
                counterfactual: c.clone(),
                residual: res.filter(|r| r.is_finite() && *r < f64::MAX),
                skipped,
            });
        }
        scored
    }

    /// The hypotheses of the module's kind, the solved scalars, and the best that reproduces the
    /// engine's output.
    fn search(
        &self,
        ev: &mut ReplayEvidence,
        info: &ModuleInfo,
        s: &Site<'_>,
        clean: &(ArrayD<f32>, Layout),
        engine: &ArrayD<f32>,
        tol: &Tolerance,
    ) {
        let input_len = if s.input.ndim() == 2 {
            // A conv's time axis: the last of a channel-major input, the first of a token-major.
            match s.input_layout {
                Layout::TokenMajor => s.input.shape()[0],
                _ => s.input.shape()[1],
            }
        } else {
            s.input.shape().last().copied().unwrap_or(0)
        };
        let input = self.input(s);
        let mut scored = self.try_all(
            ev,
            &s.module,
            &input,
            &hypotheses(info, engine.shape(), input_len),
            engine,
            tol,
        );
        // Scalars: an output scale by least squares on the clean replay; the output rounded.
        output_hypotheses(ev, &mut scored, &clean.0, clean.1, engine, tol);
        // The module skipped: its input passed through (a final norm forgotten).
        if let Some(x) = in_layout(&s.input, s.input_layout, clean.1)
            .filter(|x| x.shape() == engine.shape() && !s.ids_from_rows)
        {
            judge(
                ev,
                &mut scored,
                vec![(Counterfactual::Skipped, x)],
                engine,
                tol,
            );
        }
        // The weight scaled with the bias kept: `engine - b ~ f·(W x)`, where `W x` is the
        // replay without the bias and `b` its difference from the clean one.
        if matches!(info.kind, ModuleKind::Linear | ModuleKind::Conv1d)
            && info.params.iter().any(|p| p.role == "bias")
        {
            let no_bias = self
                .rerun(&s.module, &input, &[Counterfactual::BiasMissing])
                .ok()
                .and_then(|(_, o)| o.into_iter().next()?.ok())
                .map(|(y, _)| y)
                .filter(|y| y.shape() == clean.0.shape() && y.shape() == engine.shape());
            if let Some(wx) = no_bias {
                let bias = &clean.0 - &wx;
                if let Some(f) =
                    solve_scale(&wx, &(engine - &bias)).filter(|f| (f - 1.0).abs() > 1e-4)
                {
                    let cand = wx.mapv(|v| (v as f64 * f) as f32) + &bias;
                    judge(
                        ev,
                        &mut scored,
                        vec![(Counterfactual::WeightScaled { factor: f }, cand)],
                        engine,
                        tol,
                    );
                }
            }
        }
        // A norm's weight offset and scale, solved on the normalized input `x_hat` (the replay
        // without the affine): `engine ~ clean + c·x_hat` is the weight plus `c` (a `(1 + w)`
        // convention read the other way), `engine - b ~ f·(clean - b)` the weight times `f`, `b`
        // the bias's share (the replay with the weight alone left out, less `x_hat`).
        if matches!(info.kind, ModuleKind::LayerNorm | ModuleKind::RmsNorm)
            && info.params.iter().any(|p| p.role == "weight")
        {
            let replay = |cf: Counterfactual| {
                self.rerun(&s.module, &input, &[cf])
                    .ok()
                    .and_then(|(_, o)| o.into_iter().next()?.ok())
                    .map(|(y, _)| y)
                    .filter(|y| y.shape() == clean.0.shape() && y.shape() == engine.shape())
            };
            if let Some(x_hat) = replay(Counterfactual::AffineMissing) {
                let bias = if info.params.iter().any(|p| p.role == "bias") {
                    replay(Counterfactual::NormWeightMissing).map(|y| y - &x_hat)
                } else {
                    Some(ArrayD::zeros(x_hat.shape()))
                };
                let mut cands = Vec::new();
                if let Some(c) =
                    solve_scale(&x_hat, &(engine - &clean.0)).filter(|c| c.abs() > 1e-4)
                {
                    let cand = &clean.0 + &x_hat.mapv(|v| (v as f64 * c) as f32);
                    cands.push((Counterfactual::WeightOffset { value: c }, cand));
                }
                if let Some(b) = bias {
                    let wx = &clean.0 - &b;
                    if let Some(f) =
                        solve_scale(&wx, &(engine - &b)).filter(|f| (f - 1.0).abs() > 1e-4)
                    {
                        let cand = wx.mapv(|v| (v as f64 * f) as f32) + &b;
                        cands.push((Counterfactual::WeightScaled { factor: f }, cand));
                    }
                }
                judge(ev, &mut scored, cands, engine, tol);
            }
        }
        // A norm's epsilon: every decade, then golden section around the best.
        if info.kind.is_norm() {
            let own = info.float("eps").unwrap_or(-1.0);
            let decades: Vec<Counterfactual> =
                [0.0, 1e-12, 1e-8, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0]
                    .into_iter()
                    .filter(|e| (e - own).abs() > 1e-3 * own.abs().max(1e-30))
                    .map(|value| Counterfactual::Eps { value })
                    .collect();
            let got = self.try_all(ev, &s.module, &input, &decades, engine, tol);
            let best = got
                .iter()
                .filter_map(|(c, r, ..)| match c {
                    Counterfactual::Eps { value } if *value > 0.0 => Some((*value, *r)),
                    _ => None,
                })
                .min_by(|a, b| a.1.total_cmp(&b.1));
            scored.extend(got);
            if let Some((e0, r0)) = best {
                let make = |value: f64| Counterfactual::Eps { value };
                if let Some(found) =
                    self.golden(&s.module, &input, engine, tol, e0, r0, &make, &round_eps)
                {
                    let cf = Counterfactual::Eps { value: found };
                    scored.extend(self.try_all(ev, &s.module, &input, &[cf], engine, tol));
                }
            }
        }
        choose(ev, &s.module, &scored, &|cf| match cf {
            Counterfactual::OutputScale { factor } | Counterfactual::WeightScaled { factor } => {
                scale_hint(*factor, engine.shape())
            }
            Counterfactual::Eps { .. } => info
                .float("eps")
                .map(|own| format!("the module's eps is {own:e}")),
            _ => None,
        });
    }

    /// Golden-section search of `log10(x)` within a decade of `x0` (residual `r0`) for the
    /// counterfactual `make(x)`; `snap(x)`, a simpler value nearby, is preferred when it is as
    /// good. `None` when nothing beats `r0`.
    #[allow(clippy::too_many_arguments)]
    fn golden(
        &self,
        module: &str,
        input: &ReplayInput<'_>,
        engine: &ArrayD<f32>,
        tol: &Tolerance,
        x0: f64,
        r0: f64,
        make: &dyn Fn(f64) -> Counterfactual,
        snap: &dyn Fn(f64) -> Option<f64>,
    ) -> Option<f64> {
        let f = |le: f64| -> f64 {
            match self.rerun(module, input, &[make(10f64.powf(le))]) {
                Ok((_, o)) => match o.into_iter().next() {
                    Some(Ok((out, _))) => score(&out, engine, tol).map_or(f64::MAX, |x| x.0),
                    _ => f64::MAX,
                },
                Err(_) => f64::MAX,
            }
        };
        let g = (5f64.sqrt() - 1.0) / 2.0;
        let (mut a, mut b) = (x0.log10() - 1.0, x0.log10() + 1.0);
        let mut c = b - g * (b - a);
        let mut d = a + g * (b - a);
        let (mut fc, mut fd) = (f(c), f(d));
        for _ in 0..22 {
            if fc < fd {
                b = d;
                d = c;
                fd = fc;
                c = b - g * (b - a);
                fc = f(c);
            } else {
                a = c;
                c = d;
                fc = fd;
                d = a + g * (b - a);
                fd = f(d);
            }
        }
        let (le, fr) = if fc < fd { (c, fc) } else { (d, fd) };
        if fr >= r0 {
            return None;
        }
        let x = 10f64.powf(le);
        match snap(x) {
            Some(v) if f(v.log10()) <= 1.5 * fr.max(1e-12) => Some(v),
            _ => Some(x),
        }
    }
}

/// The best scored counterfactual that reproduces the engine's output (within the tolerance, at
/// most a tenth of the clean replay's residual) becomes `ev.mechanism`.
fn choose(
    ev: &mut ReplayEvidence,
    module: &str,
    scored: &[(Counterfactual, f64, f64, bool)],
    hint_of: &dyn Fn(&Counterfactual) -> Option<String>,
) {
    {
        let clean_res = ev.local_error.rel_l2;
        let mut ok: Vec<&(Counterfactual, f64, f64, bool)> = scored
            .iter()
            .filter(|(_, r, _, passes)| *passes && clean_res.is_none_or(|c| *r <= 0.1 * c))
            .collect();
        ok.sort_by(|a, b| a.1.total_cmp(&b.1));
        let Some((cf, res, max_abs, _)) = ok.first().map(|x| (*x).clone()) else {
            return;
        };
        let hint = hint_of(&cf);
        let also: Vec<Counterfactual> = ok
            .iter()
            .skip(1)
            .filter(|x| x.1 <= 10.0 * res.max(1e-9))
            .map(|x| x.0.clone())
            .take(4)
            .collect();
        ev.mechanism = Some(Mechanism {
            summary: format!(
                "runtime == {module} {} (residual {res:.1e}{})",
                cf.phrase(),
                hint.as_deref()
                    .filter(|_| !matches!(cf, Counterfactual::Eps { .. }))
                    .map(|h| format!("; {h}"))
                    .unwrap_or_default()
            ),
            counterfactual: cf,
            residual: res,
            max_abs,
            clean_residual: clean_res,
            hint,
            also,
        });
    }
}

/// `y ~ a·u + b·v` by least squares (f64): `(a, b, ||y - a·u - b·v|| / ||y||)`.
fn fit2(u: &ArrayD<f32>, v: &ArrayD<f32>, y: &ArrayD<f32>) -> Option<(f64, f64, f64)> {
    let (mut uu, mut uv, mut vv, mut uy, mut vy, mut yy) = (0f64, 0f64, 0f64, 0f64, 0f64, 0f64);
    for ((&p, &q), &r) in u.iter().zip(v.iter()).zip(y.iter()) {
        let (p, q, r) = (p as f64, q as f64, r as f64);
        if !(p.is_finite() && q.is_finite() && r.is_finite()) {
            return None;
        }
        uu += p * p;
        uv += p * q;
        vv += q * q;
        uy += p * r;
        vy += q * r;
        yy += r * r;
    }
    let det = uu * vv - uv * uv;
    if det.abs() <= 1e-12 * (uu * vv).max(1e-300) || yy == 0.0 {
        return None;
    }
    let a = (uy * vv - vy * uv) / det;
    let b = (vy * uu - uy * uv) / det;
    let mut rr = 0f64;
    for ((&p, &q), &r) in u.iter().zip(v.iter()).zip(y.iter()) {
        let d = r as f64 - a * p as f64 - b * q as f64;
        rr += d * d;
    }
    Some((a, b, (rr / yy).sqrt()))
}

fn combine(u: &ArrayD<f32>, a: f64, v: &ArrayD<f32>, b: f64) -> ArrayD<f32> {
    let mut out = u.clone();
    for ((o, &p), &q) in out.iter_mut().zip(u.iter()).zip(v.iter()) {
        *o = (a * p as f64 + b * q as f64) as f32;
    }
    out
}

impl ReplayContext<'_> {
    /// Replay of a weightless origin: a point that is a module's input, produced by one residual
    /// add of two observed points. The reference's own combination (`R = a·U + b·V`, fitted on its
    /// tensors, exact for an add) is applied to the engine's inputs; the engine's output is then
    /// tested against an input dropped or scaled (solved).
    pub fn weightless(&self, op: &OpDivergence) -> std::result::Result<ReplayEvidence, String> {
        let step = op.step;
        let node = self
            .nodes
            .iter()
            .find(|n| n.names.iter().any(|p| p == &op.point))
            .ok_or_else(|| format!("{} is in no node of the points' graph", op.point))?;
        let kernels: Vec<Option<String>> = node.ops.iter().map(|o| (self.op_kernel)(o)).collect();
        let attention_kernel = kernels
            .iter()
            .any(|k| k.as_deref().is_some_and(|k| k.contains("attention")));
        if let Some((rule, parent)) = core_of(self.attention, &op.point) {
            if attention_kernel || kernels.iter().all(Option::is_none) {
                let core = self.attention(op, &node.ops, rule, parent);
                // Convicted with no mechanism of the core's own: the tables the region reads,
                // through X-Ray's kernels (a relative-position table read a row off).
                if let (Ok(ev), Some(k)) = (&core, self.kernels) {
                    if ev.local_error.verdict == ReplayVerdict::Convicted && ev.mechanism.is_none()
                    {
                        if let Ok(inline) = self.inline(op, node, k) {
                            if inline.mechanism.is_some() {
                                return Ok(inline);
                            }
                        }
                    }
                }
                return core;
            }
        }
        let adds = kernels
            .iter()
            .filter(|k| k.as_deref() == Some("add"))
            .count();
        let unknown = kernels.iter().all(Option::is_none);
        if node.ops.len() == 1 && node.inputs.len() == 1 && adds == 0 {
            return self
                .elementwise(op, node, kernels.first().cloned().flatten())
                .or_else(|why| self.inline_or(op, node, why));
        }
        if node.ops.len() != 1 || (adds != 1 && !unknown) {
            return self.inline_or(
                op,
                node,
                format!(
                    "the weightless step before {} ({}) is neither one residual add, one elementwise op of one observed input, nor an attention core",
                    op.point,
                    node.ops.join(", ")
                ),
            );
        }
        let [u, v] = node.inputs.as_slice() else {
            return Err(format!(
                "{} has {} observed inputs, not two",
                op.point,
                node.inputs.len()
            ));
        };
        let both = |i: usize| self.held_both(&self.nodes[i].names, step);
        let (Some(((un, ue, ul), (ur, _, url))), Some(((vn, ve, vl), (vr, _, vrl)))) =
            (both(*u), both(*v))
        else {
            return Err(format!(
                "the inputs of {} are not held by both dumps",
                op.point
            ));
        };
        let ((xn, xe, xl), (_, xr, xrl)) = self
            .held_both(&node.names, step)
            .ok_or_else(|| format!("{} is not held by both dumps", op.point))?;
        let to = |t: &ArrayD<f32>, l: Layout| in_layout(t, l, xrl).ok_or("layouts do not align");
        let (ue, ve, xe) = (to(ue, ul)?, to(ve, vl)?, to(xe, xl)?);
        let (ur_t, vr_t) = (
            to(self.reference.get(ur, step).ok_or("no tensor")?, url)?,
            to(self.reference.get(vr, step).ok_or("no tensor")?, vrl)?,
        );
        if [ue.shape(), ve.shape(), ur_t.shape(), vr_t.shape()]
            .iter()
            .any(|s| *s != xr.shape())
            || xe.shape() != xr.shape()
        {
            return Err(format!(
                "the inputs of {} have other shapes than it",
                op.point
            ));
        }
        let (a, b, fit) = fit2(&ur_t, &vr_t, xr).ok_or("the reference's inputs are degenerate")?;
        if fit > 1e-5 {
            return Err(format!(
                "the reference's {} is no sum of its observed inputs (residual {fit:.1e})",
                op.point
            ));
        }
        let tol = (self.tolerance)(xn);
        let clean = combine(&ue, a, &ve, b);
        let sc = score(&clean, &xe, &tol);
        let local = LocalError::scored(
            op.point.clone(),
            node.ops.first().cloned(),
            vec![un.to_string(), vn.to_string()],
            xn.to_string(),
            sc,
            [clean.shape(), xe.shape()],
        );
        let class = format!("add ({a:.4}·{un} + {b:.4}·{vn})");
        let mut ev = ReplayEvidence {
            kernel: kernels.first().cloned().flatten(),
            replay_floor: Some(fit),
            covers: node.ops.clone(),
            ..ReplayEvidence::of(local.clone(), class, ModuleKind::ResidualAdd)
        };
        if local.verdict == ReplayVerdict::Cleared {
            return Ok(ev);
        }
        let mut scored = Vec::new();
        let mut push = |ev: &mut ReplayEvidence, cf: Counterfactual, c: ArrayD<f32>| {
            let sc = score(&c, &xe, &tol);
            ev.tried.push(Tried {
                counterfactual: cf.clone(),
                residual: sc.map(|x| x.0),
                skipped: None,
            });
            if let Some(sc) = sc {
                scored.push((cf, sc.0, sc.1, sc.2));
            }
        };
        let zero = ue.mapv(|_| 0.0);
        push(
            &mut ev,
            Counterfactual::InputDropped {
                input: un.to_string(),
            },
            combine(&zero, 0.0, &ve, b),
        );
        push(
            &mut ev,
            Counterfactual::InputDropped {
                input: vn.to_string(),
            },
            combine(&ue, a, &zero, 0.0),
        );
        // One input's coefficient solved, the other kept: X - b·V = s·(a·U).
        for (name, keep, kc, scale, c) in [(un, &ve, b, &ue, a), (vn, &ue, a, &ve, b)] {
            let rest = combine(&xe, 1.0, keep, -kc);
            let part = scale.mapv(|p| (p as f64 * c) as f32);
            if let Some(f) = solve_scale(&part, &rest).filter(|f| (f - 1.0).abs() > 1e-4) {
                push(
                    &mut ev,
                    Counterfactual::InputScaled {
                        input: name.to_string(),
                        factor: f,
                    },
                    combine(keep, kc, scale, c * f),
                );
            }
        }
        choose(&mut ev, &op.point, &scored, &|cf| match cf {
            Counterfactual::InputScaled { factor, .. } => scale_hint(*factor, &[]),
            _ => None,
        });
        Ok(ev)
    }

    /// The inline replay of `node` ([`ReplayContext::inline`]) when X-Ray's kernels are at
    /// hand, else (or when it fails too) `why` the other replays refused it.
    fn inline_or(
        &self,
        op: &OpDivergence,
        node: &PointNode,
        why: String,
    ) -> std::result::Result<ReplayEvidence, String> {
        match self.kernels {
            Some(k) => self
                .inline(op, node, k)
                .map_err(|e| format!("{why}; through X-Ray's kernels: {e}")),
            None => Err(why),
        }
    }

    /// Replay of a region the reference computes inline (no HF module to re-run): the ops the
    /// points' graph puts between the origin point and its observed inputs, run through X-Ray's
    /// kernels for them with the reference's weights. The run is trusted only when it
    /// reproduces the reference's point from the reference's own inputs (the replay floor);
    /// then, on the engine's inputs, it gives the region's local error, and when convicted the
    /// counterfactuals of each op's kind (a table read rows off, or never added) and of the
    /// output (shifted, scaled, rounded, permuted) are tried; a mechanism of one op implicates
    /// it.
    fn inline(
        &self,
        op: &OpDivergence,
        node: &PointNode,
        k: &dyn KernelReplayer,
    ) -> std::result::Result<ReplayEvidence, String> {
        let step = op.step;
        let mut eng_in = Vec::new();
        let mut ref_in = Vec::new();
        for &u in &node.inputs {
            let (e, r) = self.held_both(&self.nodes[u].names, step).ok_or_else(|| {
                format!(
                    "input {} of {} is not held by both dumps",
                    self.nodes[u].names[0], op.point
                )
            })?;
            eng_in.push(e);
            ref_in.push(r);
        }
        let ((xn, xe, xl), (_, xr, xrl)) = self
            .held_both(&node.names, step)
            .ok_or_else(|| format!("{} is not held by both dumps", op.point))?;
        let tol = (self.tolerance)(xn);
        let run = |inputs: &[Held<'_>], cf: Option<(&str, &Counterfactual)>| {
            let req = KernelRequest {
                ops: &node.ops,
                inputs,
                output: xn,
                step,
                cf,
            };
            k.run(&req).and_then(|r| {
                let a = in_layout(&r.array, r.layout, xrl)
                    .ok_or("the kernels' output does not convert to the point's layout")?;
                Ok((a, r.unjudged))
            })
        };
        let (floor_out, _) = run(&ref_in, None)?;
        let floor = score(&floor_out, xr, &tol).ok_or_else(|| {
            format!(
                "X-Ray's kernels give {} the shape {:?}, the reference {:?}",
                op.point,
                floor_out.shape(),
                xr.shape()
            )
        })?;
        if !floor.2 {
            return Err(format!(
                "X-Ray's kernels ({}) do not reproduce the reference's {} from its own inputs (rel_l2 {:.1e})",
                node.ops.join(", "),
                op.point,
                floor.0
            ));
        }
        let xe = in_layout(xe, xl, xrl).ok_or("layouts do not align")?;
        let (clean, _) = run(&eng_in, None)?;
        let sc = score(&clean, &xe, &tol);
        let local = LocalError::scored(
            op.point.clone(),
            None,
            eng_in.iter().map(|(n, _, _)| n.to_string()).collect(),
            xn.to_string(),
            sc,
            [clean.shape(), xe.shape()],
        );
        let mut ev = ReplayEvidence {
            replay_floor: Some(floor.0),
            covers: node.ops.clone(),
            ..ReplayEvidence::of(
                local.clone(),
                format!("inline ({})", node.ops.join(", ")),
                ModuleKind::Inline,
            )
        };
        if local.verdict == ReplayVerdict::Cleared {
            return Ok(ev);
        }
        // Each op's counterfactuals, then the output's; the best reproduction names its op.
        // A run is judged with the rows it leaves undefined taken from the engine.
        let attempt =
            |ev: &mut ReplayEvidence, o: &str, cf: Counterfactual, scored: &mut Scored| {
                let out = run(&eng_in, Some((o, &cf))).map(|(mut c, unjudged)| {
                    if let Some((axis, a, b)) = unjudged {
                        use ndarray::{Axis, Slice};
                        // Within the output (a run's claim is checked, never trusted).
                        let fits = axis < c.ndim() && a <= b && b <= c.len_of(Axis(axis));
                        if c.shape() == xe.shape() && fits {
                            c.slice_axis_mut(Axis(axis), Slice::from(a..b))
                                .assign(&xe.slice_axis(Axis(axis), Slice::from(a..b)));
                        }
                    }
                    c
                });
                let sc = out.as_ref().ok().and_then(|c| score(c, &xe, &tol));
                ev.tried.push(Tried {
                    counterfactual: cf.clone(),
                    residual: sc.map(|x| x.0),
                    skipped: match &out {
                        Err(why) => Some(format!("{o}: {why}")),
                        Ok(_) if sc.is_none() => Some("other shape".into()),
                        Ok(_) => None,
                    },
                });
                if let Some(sc) = sc {
                    scored.push((cf, sc.0, sc.1, sc.2));
                }
                out.ok()
            };
        let mut groups: Vec<(Option<&String>, Scored)> = Vec::new();
        for o in &node.ops {
            let mut scored = Vec::new();
            for cf in k.counterfactuals(o) {
                let missing = cf == Counterfactual::WeightMissing;
                let out = attempt(&mut ev, o, cf, &mut scored);
                // A table the engine adds scaled: `engine - y0 ~ f·(clean - y0)`, `y0` the
                // run without it; the scaled table is then run.
                if let Some(y0) = out.filter(|y| missing && y.shape() == clean.shape()) {
                    if let Some(f) = solve_scale(&(&clean - &y0), &(&xe - &y0))
                        .filter(|f| (f - 1.0).abs() > 1e-4)
                    {
                        attempt(
                            &mut ev,
                            o,
                            Counterfactual::WeightScaled { factor: f },
                            &mut scored,
                        );
                    }
                }
            }
            groups.push((Some(o), scored));
        }
        let mut scored = Vec::new();
        output_hypotheses(&mut ev, &mut scored, &clean, xrl, &xe, &tol);
        groups.push((None, scored));
        let mut best: Option<(Mechanism, Option<&String>)> = None;
        for (owner, scored) in groups {
            let mut trial = ev.clone();
            choose(
                &mut trial,
                owner.map_or(&op.point, |o| o),
                &scored,
                &|cf| match cf {
                    Counterfactual::OutputScale { factor }
                    | Counterfactual::WeightScaled { factor } => scale_hint(*factor, xe.shape()),
                    _ => None,
                },
            );
            if let Some(m) = trial.mechanism {
                if best.as_ref().is_none_or(|(b, _)| m.residual < b.residual) {
                    best = Some((m, owner));
                }
            }
        }
        if let Some((m, owner)) = best {
            ev.mechanism = Some(m);
            ev.implicates = owner.cloned();
        }
        Ok(ev)
    }

    /// Replay of a weightless elementwise step: a point that is a module's input, produced by one
    /// op from one observed point (an activation between two linears). The reference's function is
    /// identified on its own tensors (`R = f(U)` for one of [`Activation::ALL`], within the
    /// point's tolerance: the replay floor) and applied to the engine's input; the other
    /// activations are the counterfactuals. A reference step that is no known function of its
    /// input is not replayed (an error, a note).
    fn elementwise(
        &self,
        op: &OpDivergence,
        node: &PointNode,
        kernel: Option<String>,
    ) -> std::result::Result<ReplayEvidence, String> {
        let step = op.step;
        let u = node.inputs[0];
        let names = &self.nodes[u].names;
        let ((un, ue, ul), (_, ur, url)) = self
            .held_both(names, step)
            .ok_or_else(|| format!("the input of {} is not held by both dumps", op.point))?;
        let ((xn, xe, xl), (_, xr, xrl)) = self
            .held_both(&node.names, step)
            .ok_or_else(|| format!("{} is not held by both dumps", op.point))?;
        let to = |t: &ArrayD<f32>, l: Layout| in_layout(t, l, xrl).ok_or("layouts do not align");
        let (ue, ur, xe) = (to(ue, ul)?, to(ur, url)?, to(xe, xl)?);
        if ue.shape() != xr.shape() || ur.shape() != xr.shape() || xe.shape() != xr.shape() {
            return Err(format!(
                "{} and its input {un} have other shapes: not an elementwise step",
                op.point
            ));
        }
        let apply = |f: Activation, t: &ArrayD<f32>| t.mapv(|v| f.apply(v as f64) as f32);
        let tol = (self.tolerance)(xn);
        let fits: Vec<(Activation, f64)> = Activation::ALL
            .into_iter()
            .filter_map(|f| score(&apply(f, &ur), xr, &tol).map(|sc| (f, sc.0, sc.2)))
            .filter(|(_, _, passes)| *passes)
            .map(|(f, r, _)| (f, r))
            .collect();
        let Some(&(f, floor)) = fits.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else {
            return Err(format!(
                "the reference's {} is no known elementwise function of {un} ({} tried)",
                op.point,
                Activation::ALL.map(Activation::name).join(", ")
            ));
        };
        let clean = apply(f, &ue);
        let sc = score(&clean, &xe, &tol);
        let passes = sc.is_some_and(|x| x.2);
        let local = LocalError::scored(
            op.point.clone(),
            node.ops.first().cloned(),
            vec![un.to_string()],
            xn.to_string(),
            sc,
            [clean.shape(), xe.shape()],
        );
        let class = format!("elementwise ({} of {un})", f.name());
        let mut ev = ReplayEvidence {
            kernel,
            replay_floor: Some(floor),
            covers: node.ops.clone(),
            ..ReplayEvidence::of(local, class, ModuleKind::Elementwise)
        };
        if passes {
            return Ok(ev);
        }
        let mut scored = Vec::new();
        // Another function, or any function (the reference's too) through a half-precision
        // lookup table: the input rounded, the table's value rounded (a precision, not a logic,
        // departure when the function is the reference's).
        let rounded = |t: &ArrayD<f32>, fmt: RoundFormat| t.mapv(|v| fmt.round(v));
        let mut cands: Vec<(Counterfactual, ArrayD<f32>)> = Activation::ALL
            .into_iter()
            .filter(|g| *g != f)
            .map(|g| {
                (
                    Counterfactual::Activation {
                        function: g,
                        table: None,
                    },
                    apply(g, &ue),
                )
            })
            .collect();
        for fmt in [RoundFormat::F16, RoundFormat::Bf16] {
            for g in Activation::ALL {
                let y = rounded(&apply(g, &rounded(&ue, fmt)), fmt);
                cands.push((
                    Counterfactual::Activation {
                        function: g,
                        table: Some(fmt),
                    },
                    y,
                ));
            }
        }
        judge(&mut ev, &mut scored, cands, &xe, &tol);
        output_hypotheses(&mut ev, &mut scored, &clean, xrl, &xe, &tol);
        choose(&mut ev, &op.point, &scored, &|_| None);
        Ok(ev)
    }

    /// Token-major rows of point `name` (under any alias) at steps `steps`, stacked in step
    /// order (a decoder's self-attention keys over its cache).
    fn rows(
        &self,
        d: &Dump,
        name: &str,
        steps: std::ops::RangeInclusive<Step>,
    ) -> Option<ArrayD<f32>> {
        let names = aliases(self.nodes, name);
        let parts: Vec<ArrayD<f32>> = steps
            .filter_map(|s| {
                let (_, t, l) = held(d, &names, s)?;
                in_layout(t, l, Layout::TokenMajor)
            })
            .collect();
        if parts.is_empty() || parts.iter().any(|p| p.ndim() != 2) {
            return None;
        }
        let views: Vec<_> = parts.iter().map(|p| p.view()).collect();
        ndarray::concatenate(ndarray::Axis(0), &views).ok()
    }

    /// The points `rule` declares for the queries, keys and values of attention module `parent`
    /// at `step` in `d`, each whole (a chunk is the replay's to take; keys and values: every
    /// step's rows up to this one that the dump holds).
    fn qkv(
        &self,
        d: &Dump,
        rule: &AttentionRule,
        parent: &str,
        step: Step,
    ) -> Option<[ArrayD<f32>; 3]> {
        let p = |o: &Operand| format!("{parent}.{}", o.point);
        Some([
            self.rows(d, &p(&rule.queries), step..=step)?,
            self.rows(d, &p(&rule.keys), 0..=step)?,
            self.rows(d, &p(&rule.values), 0..=step)?,
        ])
    }

    /// Replay of the core of attention module `parent` (its contract `rule`): from the queries',
    /// keys' and values' points (the engine's own) to the core's output point, through the
    /// reference's attention computation; convicted, its mask, key/value order, rotary offset,
    /// relative distances and softmax scale (solved) are tried.
    fn attention(
        &self,
        op: &OpDivergence,
        ops: &[String],
        rule: &AttentionRule,
        parent: &str,
    ) -> std::result::Result<ReplayEvidence, String> {
        let step = op.step;
        let [q, k, v] = self
            .qkv(self.candidate, rule, parent, step)
            .ok_or_else(|| {
                format!(
                    "the engine dump holds no {} of {parent}",
                    rule.operands().map(|o| o.point.as_str()).join(" / ")
                )
            })?;
        let tk = k.shape()[0];
        let (k_shape, v_shape) = (k.shape().to_vec(), v.shape().to_vec());
        let x = self
            .rows(self.candidate, &op.point, step..=step)
            .ok_or_else(|| format!("the engine dump holds no {}", op.point))?;
        let input = qkv_input(&q, k, v);
        let (info, outs) = self.rerun(parent, &input, &[Counterfactual::None])?;
        let (clean, layout) = outs
            .into_iter()
            .next()
            .ok_or("the replay returned nothing")??;
        // The engine's rows in the layout the replay returns (its point rule's).
        let x = in_layout(&x, Layout::TokenMajor, layout)
            .ok_or_else(|| format!("{} has no {layout} form", op.point))?;
        let tol = (self.tolerance)(&op.point);
        let sc = score(&clean, &x, &tol);
        let replay_floor = (|| {
            let [rq, rk, rv] = self.qkv(self.reference, rule, parent, step)?;
            let rx = self.rows(self.reference, &op.point, step..=step)?;
            let inp = qkv_input(&rq, rk, rv);
            let (_, o) = self.rerun(parent, &inp, &[Counterfactual::None]).ok()?;
            let (r, l) = o.into_iter().next()?.ok()?;
            score(&r, &in_layout(&rx, Layout::TokenMajor, l)?, &tol).map(|x| x.0)
        })();
        let passes = sc.is_some_and(|x| x.2);
        let local = LocalError::scored(
            parent.to_string(),
            ops.first().cloned(),
            {
                // A fused projection (keys and values chunks of one point) is one input.
                let mut v: Vec<String> = rule
                    .operands()
                    .iter()
                    .map(|o| format!("{parent}.{}", o.point))
                    .collect();
                v.dedup();
                v
            },
            op.point.clone(),
            sc,
            [clean.shape(), x.shape()],
        );
        let mut ev = ReplayEvidence {
            kernel: ops
                .iter()
                .find_map(|o| (self.op_kernel)(o).filter(|k| k.contains("attention"))),
            replay_floor,
            covers: ops.to_vec(),
            ..ReplayEvidence::of(local, info.class.clone(), info.kind)
        };
        if passes {
            return Ok(ev);
        }
        let causal = info.flag("causal");
        let own = info.float("scaling").unwrap_or(1.0);
        let hd = info.ints("head_dim").first().copied().unwrap_or(1).max(1) as f64;
        let relative = info.flag("relative");
        let mut cfs = vec![Counterfactual::KvSwapped];
        if relative {
            // Block-local attention with Shaw relative positions: no causal mask or key padding
            // to get wrong; its distance lookup instead.
            cfs.extend([
                Counterfactual::DistanceMirrored,
                Counterfactual::RelativePositionsDropped,
                Counterfactual::RelativeScale { value: 1.0 },
                Counterfactual::RelativeScale { value: own * own },
            ]);
        } else {
            cfs.insert(0, Counterfactual::CausalMask { on: !causal });
        }
        if !causal && !relative {
            // The keys padded to a block size and attended whole.
            let mut pads: Vec<usize> = [32usize, 64, 128, 256, 512]
                .iter()
                .map(|b| tk.div_ceil(*b) * b - tk)
                .filter(|r| *r > 0)
                .collect();
            pads.dedup();
            cfs.extend(
                pads.into_iter()
                    .map(|rows| Counterfactual::KeysPadded { rows }),
            );
        }
        if info.flag("rope") {
            cfs.push(Counterfactual::RopeOffset { by: 1 });
            cfs.push(Counterfactual::RopeOffset { by: -1 });
        }
        let mut simple: Vec<f64> = vec![
            1.0,
            own * own,
            own.sqrt(),
            1.0 / hd.sqrt(),
            1.0 / hd,
            hd.sqrt(),
        ];
        simple.retain(|c| (c - own).abs() > 1e-9 * own.abs().max(1e-30));
        simple.dedup_by(|a, b| (*a - *b).abs() <= 1e-9 * b.abs());
        cfs.extend(
            simple
                .iter()
                .map(|&value| Counterfactual::AttentionScale { value }),
        );
        let mut scored = self.try_all(&mut ev, parent, &input, &cfs, &x, &tol);
        let best = scored
            .iter()
            .filter_map(|(c, r, ..)| match c {
                Counterfactual::AttentionScale { value } => Some((*value, *r)),
                _ => None,
            })
            .chain(std::iter::once((own, sc.map_or(f64::MAX, |x| x.0))))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((x0, r0)) = best {
            let make = |value: f64| Counterfactual::AttentionScale { value };
            let snap = |v: f64| {
                simple
                    .iter()
                    .chain(std::iter::once(&own))
                    .copied()
                    .find(|c| (c - v).abs() <= 0.01 * c.abs())
            };
            if let Some(found) = self.golden(parent, &input, &x, &tol, x0, r0, &make, &snap) {
                let cf = Counterfactual::AttentionScale { value: found };
                scored.extend(self.try_all(&mut ev, parent, &input, &[cf], &x, &tol));
            }
        }
        // A K/V cache of another layer: this module replayed on its own queries and another
        // layer's keys and values (the engine's own projections there).
        let held_at = |p: &str| self.rows(self.candidate, p, 0..=step).is_some();
        let keys = format!(".{}", rule.keys.point);
        for (layer, other) in other_layers(&held_at, parent, &keys) {
            let Some([_, kj, vj]) = self.qkv(self.candidate, rule, &other, step) else {
                continue;
            };
            if kj.shape() != k_shape.as_slice() || vj.shape() != v_shape.as_slice() {
                continue;
            }
            let inp = qkv_input(&q, kj, vj);
            let cf = Counterfactual::KvOtherLayer { layer };
            scored.extend(self.try_input(&mut ev, parent, &inp, cf, &x, &tol));
        }
        let heads = heads_permuted(&clean, layout, &x, hd as usize);
        judge(&mut ev, &mut scored, heads.into_iter().collect(), &x, &tol);
        output_hypotheses(&mut ev, &mut scored, &clean, layout, &x, &tol);
        choose(&mut ev, parent, &scored, &|cf| match cf {
            Counterfactual::AttentionScale { value } => Some(format!(
                "the module's scale is {own:.6}; this is {:.6} times it{}",
                value / own,
                scale_hint(*value, &[hd as usize])
                    .map(|h| format!(", = {h} (head_dim {hd})"))
                    .unwrap_or_default()
            )),
            Counterfactual::OutputScale { factor } => scale_hint(*factor, &[]),
            _ => None,
        });
        // A mechanism inside the core (what it attends to, its mask or scale) implicates the
        // attention kernel itself, not the head split or merge around it.
        let inside = ev.mechanism.as_ref().is_some_and(|m| {
            matches!(
                m.counterfactual,
                Counterfactual::KvOtherLayer { .. }
                    | Counterfactual::KvSwapped
                    | Counterfactual::DistanceMirrored
                    | Counterfactual::RelativePositionsDropped
                    | Counterfactual::RelativeScale { .. }
                    | Counterfactual::CausalMask { .. }
                    | Counterfactual::KeysPadded { .. }
                    | Counterfactual::AttentionScale { .. }
                    | Counterfactual::RopeOffset { .. }
            )
        });
        if inside {
            // The attention kernel nearest the output point: the last of the region's suspects
            // in graph order (the region may reach further upstream, through points the dumps do
            // not hold, and cross other layers' cores).
            ev.implicates = op
                .suspects
                .iter()
                .rev()
                .find(|o| {
                    ops.contains(o) && (self.op_kernel)(o).is_some_and(|k| k.contains("attention"))
                })
                .cloned();
        }
        Ok(ev)
    }
}

/// The same attention module in the other layers whose keys' point (`keys`, `.k_proj:out`) the
/// engine dump holds (`held_at`) (`model.decoder.layers.1.encoder_attn` -> layer 0's, 2's, ..):
/// `(layer, module)`, found by the module path's first numeric segment and the points held,
/// never by a count.
fn other_layers(held_at: &dyn Fn(&str) -> bool, parent: &str, keys: &str) -> Vec<(usize, String)> {
    let segs: Vec<&str> = parent.split('.').collect();
    let Some(i) = segs
        .iter()
        .position(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
    else {
        return vec![];
    };
    let own: usize = segs[i].parse().unwrap_or(usize::MAX);
    let mut out = Vec::new();
    for j in 0usize.. {
        let mut m = segs.clone();
        let js = j.to_string();
        m[i] = &js;
        let module = m.join(".");
        if !held_at(&format!("{module}{keys}")) {
            break;
        }
        if j != own {
            out.push((j, module));
        }
    }
    out
}

/// Applies replay evidence to an op-level origin: a cleared op is no longer named (a note says
/// why), a convicted one stays; returns the console line.
pub fn apply(op: &mut OpDivergence, ev: ReplayEvidence) -> String {
    let line = ev.summary();
    if ev.local_error.verdict == ReplayVerdict::Cleared {
        if op
            .op
            .as_ref()
            .is_some_and(|o| ev.covers.is_empty() || ev.covers.contains(o))
        {
            if let Some(name) = op.op.take() {
                op.suspects.retain(|s| s != &name);
            }
        }
        op.suspects.retain(|s| !ev.covers.contains(s));
    } else if op.op.is_none() {
        op.op = ev.implicates.clone();
    }
    op.replay = Some(ev);
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, IxDyn};
    use xray_core::replay::ParamInfo;

    /// A linear module `y = x W^T + b` replayed in Rust, with the counterfactuals this test needs.
    struct Lin {
        w: Array2<f32>,
        b: Vec<f32>,
    }

    impl Lin {
        fn run(&self, x: &ArrayD<f32>, cf: &Counterfactual) -> Result<ArrayD<f32>, String> {
            let x2 = x.view().into_dimensionality::<ndarray::Ix2>().unwrap();
            let (w, b) = match cf {
                Counterfactual::None => (self.w.clone(), self.b.clone()),
                Counterfactual::BiasMissing => (self.w.clone(), vec![0.0; self.b.len()]),
                Counterfactual::BiasDoubled => {
                    (self.w.clone(), self.b.iter().map(|v| 2.0 * v).collect())
                }
                Counterfactual::TransposeWeight => (self.w.t().to_owned(), self.b.clone()),
                _ => return Err("not in this test".into()),
            };
            let mut y = x2.dot(&w.t());
            for mut r in y.rows_mut() {
                for (v, bb) in r.iter_mut().zip(&b) {
                    *v += bb;
                }
            }
            Ok(y.into_dyn())
        }
    }

    impl Replayer for Lin {
        fn replay(
            &self,
            module: &str,
            input: &ReplayInput<'_>,
            cfs: &[Counterfactual],
        ) -> Result<ReplayBatch, String> {
            let n = self.w.shape()[0];
            let info = ModuleInfo {
                module: module.into(),
                class: "Linear".into(),
                kind: ModuleKind::Linear,
                params: vec![
                    ParamInfo {
                        role: "weight".into(),
                        key: format!("{module}.weight"),
                        shape: vec![n, n],
                        same_shape: vec![],
                    },
                    ParamInfo {
                        role: "bias".into(),
                        key: format!("{module}.bias"),
                        shape: vec![n],
                        same_shape: vec![],
                    },
                ],
                settings: Default::default(),
            };
            let outs = cfs
                .iter()
                .map(|c| self.run(input.array, c).map(|y| (y, Layout::TokenMajor)))
                .collect();
            Ok((info, outs))
        }
    }

    fn dump(entries: Vec<(&str, ArrayD<f32>)>) -> Dump {
        use xray_core::capture::Captured;
        let m = xray_core::dump::Manifest::empty("whisper", "t", "test");
        Dump::from_captured(
            m,
            entries
                .into_iter()
                .map(|(n, a)| Captured {
                    name: n.into(),
                    step: 0,
                    layout: Layout::TokenMajor,
                    data: a,
                })
                .collect(),
        )
    }

    fn setup(bug: &Counterfactual) -> (Lin, Dump, Dump, Vec<PointNode>) {
        let n = 6;
        let w = Array2::from_shape_fn((n, n), |(i, j)| ((i * 7 + j * 3) as f32 * 0.37).sin());
        let b: Vec<f32> = (0..n).map(|i| 0.5 + i as f32 * 0.1).collect();
        let lin = Lin { w, b };
        let x = ArrayD::from_shape_fn(IxDyn(&[5, n]), |d| ((d[0] * 5 + d[1]) as f32 * 0.21).cos());
        let r_out = lin.run(&x, &Counterfactual::None).unwrap();
        let x_out = lin.run(&x, bug).unwrap();
        let r = dump(vec![("m.fc:in", x.clone()), ("m.fc:out", r_out)]);
        let c = dump(vec![("m.fc:in", x), ("m.fc:out", x_out)]);
        let nodes = vec![
            PointNode {
                names: vec!["m.fc:in".into()],
                inputs: vec![],
                ops: vec![],
            },
            PointNode {
                names: vec!["m.fc:out".into()],
                inputs: vec![0],
                ops: vec!["fc".into()],
            },
        ];
        (lin, r, c, nodes)
    }

    fn origin(bug: &Counterfactual) -> ReplayEvidence {
        let (lin, r, c, nodes) = setup(bug);
        let eop = |_: &str| EngineOp {
            op: Some("fc".into()),
            kernel: Some("linear".into()),
        };
        let tol = |_: &str| Tolerance::default_f32();
        let cx = ReplayContext {
            nodes: &nodes,
            reference: &r,
            candidate: &c,
            replayer: Ok(&lin),
            engine_op: &eop,
            tolerance: &tol,
            max_neighbours: 4,
            op_kernel: &|_| Some("linear".into()),
            kernels: None,
            attention: &[],
        };
        let op = crate::ops::localize_op(
            &nodes,
            &r,
            &c,
            0,
            &crate::tolerance::Policy::default(),
            None,
        );
        match op {
            Some(op) => cx.origin(&op).unwrap(),
            None => {
                // A clean engine: the origin is asked for anyway.
                let fake = OpDivergence {
                    point: "m.fc:out".into(),
                    module: "m.fc".into(),
                    side: Side::Out,
                    step: 0,
                    op: Some("fc".into()),
                    suspects: vec!["fc".into()],
                    boundary: false,
                    inputs: vec![],
                    status: crate::localize::Status::Fail,
                    metrics: None,
                    tolerance: crate::evidence::ToleranceEvidence {
                        bounds: Tolerance::default_f32(),
                        source: "t".into(),
                    },
                    shapes: None,
                    explanation: None,
                    compared: 1,
                    replay: None,
                };
                cx.origin(&fake).unwrap()
            }
        }
    }

    #[test]
    fn a_dropped_bias_is_named_and_the_others_are_tried() {
        let ev = origin(&Counterfactual::BiasMissing);
        assert_eq!(ev.local_error.verdict, ReplayVerdict::Convicted);
        let m = ev.mechanism.expect("mechanism");
        assert_eq!(m.counterfactual, Counterfactual::BiasMissing);
        assert!(m.residual < 1e-6, "{m:?}");
        assert!(m.summary.contains("without its bias"), "{}", m.summary);
        assert!(ev.tried.len() > 3);
        assert_eq!(ev.replay_floor, Some(0.0));
    }

    #[test]
    fn a_transposed_weight_is_named() {
        let ev = origin(&Counterfactual::TransposeWeight);
        let m = ev.mechanism.expect("mechanism");
        assert_eq!(m.counterfactual, Counterfactual::TransposeWeight);
    }

    #[test]
    fn a_correct_op_is_cleared() {
        let ev = origin(&Counterfactual::None);
        assert_eq!(ev.local_error.verdict, ReplayVerdict::Cleared);
        assert!(ev.mechanism.is_none() && ev.tried.is_empty());
    }

    /// A deterministic tensor with no two equal blocks.
    fn ramp(shape: &[usize]) -> ArrayD<f32> {
        let n: usize = shape.iter().product();
        ArrayD::from_shape_vec(
            ndarray::IxDyn(shape),
            (0..n)
                .map(|i| ((i * 7919) % 101) as f32 / 17.0 - 2.5)
                .collect(),
        )
        .unwrap()
    }

    /// A matrix of `clean`'s shape whose element `[i, j]` is read from `clean` where `from(i, j)`
    /// says, and is 42 where it says nothing.
    fn read_from(
        clean: &ArrayD<f32>,
        from: impl Fn(usize, usize) -> Option<[usize; 2]>,
    ) -> ArrayD<f32> {
        ArrayD::from_shape_fn(clean.raw_dim(), |ix| {
            from(ix[0], ix[1]).map_or(42.0, |p| clean[p])
        })
    }

    #[test]
    fn heads_in_another_order_are_solved_slot_by_slot() {
        // [T = 5, H = 3 x head_dim 4], token-major: slots 0 and 2 exchanged.
        let clean = ramp(&[5, 12]);
        let engine = read_from(&clean, |t, d| {
            Some([
                t,
                match d / 4 {
                    0 => d + 8,
                    2 => d - 8,
                    _ => d,
                },
            ])
        });
        let (cf, out) = heads_permuted(&clean, Layout::TokenMajor, &engine, 4).expect("solved");
        assert_eq!(
            cf,
            Counterfactual::HeadsPermuted {
                slots: vec![2, 1, 0]
            }
        );
        assert_eq!(out, engine);
        assert!(cf
            .phrase()
            .contains("slot 0 holds head 2, slot 2 holds head 0"));
        // Every slot holding its own head is no permutation; nor is a head read twice.
        assert!(heads_permuted(&clean, Layout::TokenMajor, &clean, 4).is_none());
        let twice = read_from(&clean, |t, d| Some([t, if d / 4 == 1 { d - 4 } else { d }]));
        assert!(heads_permuted(&clean, Layout::TokenMajor, &twice, 4).is_none());
        // A layout whose heads are not known is not tried.
        assert!(heads_permuted(&clean, Layout::ChannelMajor, &engine, 4).is_none());
    }

    #[test]
    fn features_in_another_order_are_matched_one_by_one() {
        // Token-major [T = 6, D = 5]: features 1 and 3 exchanged, 4 moved to 0 and 0 to 4.
        let clean = ramp(&[6, 5]);
        let order = [4usize, 3, 2, 1, 0];
        let engine = read_from(&clean, |t, i| Some([t, order[i]]));
        let (cf, out) = features_permuted(&clean, Layout::TokenMajor, &engine).expect("solved");
        assert_eq!(
            cf,
            Counterfactual::FeaturesPermuted {
                slots: order.to_vec()
            }
        );
        assert_eq!(out, engine);
        assert!(cf.phrase().contains("4 of 5 moved"), "{}", cf.phrase());
        assert!(features_permuted(&clean, Layout::TokenMajor, &clean).is_none());
        // Channel-major: the features are the rows.
        let t = clean.t().to_owned().into_dyn();
        let e = engine.t().to_owned().into_dyn();
        assert!(features_permuted(&t, Layout::ChannelMajor, &e).is_some());
        // Too wide to match every pair (a vocabulary-wide row): not tried.
        let wide = ramp(&[2, MATCH_FEATURES + 1]);
        let mut flipped = wide.clone();
        flipped.swap([0, 0], [0, 1]);
        flipped.swap([1, 0], [1, 1]);
        assert!(features_permuted(&wide, Layout::TokenMajor, &flipped).is_none());
    }

    #[test]
    fn a_shift_in_time_leaves_the_frames_shifted_in_unjudged() {
        // Channel-major [C = 3, T = 8]: the engine one frame late, frame 0 its own.
        let clean = ramp(&[3, 8]);
        let engine = read_from(&clean, |c, t| t.checked_sub(1).map(|s| [c, s]));
        let axis = time_axis(&clean, Layout::ChannelMajor).unwrap();
        assert_eq!(axis, 1);
        assert_eq!(shifted(&clean, &engine, axis, 1).unwrap(), engine);
        assert_ne!(shifted(&clean, &engine, axis, -1).unwrap(), engine);
        // Token-major: time is the rows; a shift that leaves less than half is not tried.
        assert_eq!(time_axis(&clean, Layout::TokenMajor), Some(0));
        assert!(shifted(&clean, &engine, 1, 4).is_none());
        assert_eq!(time_axis(&ramp(&[2, 3, 4]), Layout::HeadMajor), None);
    }

    #[test]
    fn scalars_and_hints() {
        assert_eq!(scale_hint(8.0, &[64]), Some("sqrt(64)".into()));
        assert_eq!(scale_hint(0.125, &[64]), Some("1/sqrt(64)".into()));
        assert_eq!(round_eps(0.1004), Some(0.1));
        assert!(round_eps(0.13).is_none());
    }
}
