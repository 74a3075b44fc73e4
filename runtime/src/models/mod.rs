//! Model families. Each family lives in its own folder (config + constants in `mod.rs`, graph
//! builder, frontend, fault catalogue), registers one [`Family`] in [`families`], and loads into
//! a [`SpeechModel`], the only interface the harness uses. Adding a family: a folder under
//! `models/`, a contract `core/contracts/<name>.json` (embedded by core's build script), one
//! line in [`families`] (and the oracle's Python module for the reference).

pub mod common;
pub mod granite_nar;
pub mod whisper;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use xray_core::Step;

use crate::audio::Audio;
use crate::capture::{Observer, Substitute};
use crate::contract::Contract;
use crate::error::{Result, RuntimeError};
use crate::faults::FaultPlan;
use crate::graph::{EdgeId, Feeds, Graph, RunCtx, Tensor};
use crate::weights::Weights;

/// Per-run hooks: capture, isolation, faults. All optional; none changes the spec.
#[derive(Default)]
pub struct RunHooks<'a> {
    /// Receives every checkpoint tensor.
    pub observer: Option<&'a mut dyn Observer>,
    /// Substitutes reference tensors at checkpoint edges (isolation).
    pub substitute: Option<&'a dyn Substitute>,
    /// Deliberate faults.
    pub faults: Option<&'a FaultPlan>,
    /// Op-level points to capture ([`xray_core::ops`]); none by default.
    pub points: Option<&'a xray_core::ops::PointSelect>,
    /// Times every op run (`xray bench --profile`); none by default.
    pub profile: Option<&'a mut crate::graph::OpProfile>,
}

impl RunHooks<'_> {
    /// A [`RunCtx`] for one formula run at `step`, reborrowing these hooks.
    pub fn ctx(&mut self, step: Step) -> RunCtx<'_> {
        RunCtx {
            step,
            observer: match self.observer.as_mut() {
                Some(o) => Some(&mut **o),
                None => None,
            },
            substitute: self.substitute,
            faults: self.faults,
            points: self.points,
            profile: self.profile.as_deref_mut(),
        }
    }
}

/// Per-run options.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Cap on generated tokens (generative families).
    pub max_new_tokens: Option<usize>,
    /// Teacher forcing: the token sequence to feed (Whisper: the full decoder sequence including
    /// the forced prefix; Granite NAR: the CTC hypothesis ids).
    pub teacher_tokens: Option<Vec<i64>>,
}

impl RunOptions {
    /// A free run of at most `max_new_tokens` generated tokens.
    pub fn capped(max_new_tokens: usize) -> RunOptions {
        RunOptions {
            max_new_tokens: Some(max_new_tokens),
            teacher_tokens: None,
        }
    }
}

/// What a run produced.
#[derive(Debug, Clone, Default)]
pub struct RunOutput {
    /// The token sequence that was fed/produced (Whisper: prefix + generated incl. EOS).
    pub tokens: Vec<i64>,
    /// The runtime's own choice at each position (Whisper: greedy argmax per step after
    /// suppression; equals `tokens[prefix..]` when not teacher-forced).
    pub predicted: Vec<i64>,
    /// Decoded text of `predicted` (the runtime's transcript).
    pub transcript: String,
    /// Final outputs for capture-neutrality checks (e.g. logits of every step), in order.
    pub outputs: Vec<Tensor>,
    /// Family-specific extras recorded in dumps/evidence (e.g. the CTC hypothesis).
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// What every loaded model holds: its family, directory, graph (spec), weights (state) and
/// contract.
#[derive(Debug)]
pub struct Loaded {
    /// The family's name.
    pub family: &'static str,
    /// The model directory.
    pub dir: PathBuf,
    /// The graph (spec).
    pub graph: Graph,
    /// The weight table (state).
    pub weights: Weights,
    /// The checkpoint contract resolved against the model's config.
    pub contract: Contract,
}

impl Loaded {
    /// Check `weights` against `graph` (missing, mismatched and unused keys are errors), resolve
    /// the `family`'s checkpoint contract against config.json and check it against the graph.
    pub fn check(
        dir: &Path,
        family: &'static str,
        graph: Graph,
        weights: Weights,
        config_json: &serde_json::Value,
    ) -> Result<Loaded> {
        graph.check_weights(&weights)?;
        let contract = Contract::for_family(family, config_json)?;
        graph.verify_contract(&contract)?;
        Ok(Loaded {
            family,
            dir: dir.to_path_buf(),
            graph,
            weights,
            contract,
        })
    }

    /// Run the graph on its own weights: the edges `want` from `feeds` (see [`Graph::run`]).
    pub fn run(&self, feeds: Feeds, want: &[EdgeId], ctx: &mut RunCtx) -> Result<Vec<Tensor>> {
        self.graph.run(&self.weights, feeds, want, ctx)
    }

    /// [`Loaded::run`] for the one edge `want`: its tensor.
    pub fn run_one(&self, feeds: Feeds, want: EdgeId, ctx: &mut RunCtx) -> Result<Tensor> {
        self.run(feeds, &[want], ctx)?
            .into_iter()
            .next()
            .ok_or_else(|| RuntimeError::Graph("formula returned nothing".into()))
    }
}

/// A loaded speech model: spec (graph), state (weights), contract.
pub trait SpeechModel {
    /// Its family, directory, graph, weights and contract.
    fn loaded(&self) -> &Loaded;
    /// Family name (`whisper`, `granite_nar`).
    fn family(&self) -> &'static str {
        self.loaded().family
    }
    /// The model directory.
    fn model_dir(&self) -> &Path {
        &self.loaded().dir
    }
    /// The graph (spec).
    fn graph(&self) -> &Graph {
        &self.loaded().graph
    }
    /// The weight table (state).
    fn weights(&self) -> &Weights {
        &self.loaded().weights
    }
    /// The checkpoint contract resolved against this model's config.
    fn contract(&self) -> &Contract {
        &self.loaded().contract
    }
    /// Run on one input.
    fn run(&self, audio: &Audio, opts: &RunOptions, hooks: &mut RunHooks) -> Result<RunOutput>;
    /// Decode token ids to text.
    fn decode_text(&self, ids: &[i64]) -> Result<String>;
}

/// How a family's runtime run is aligned with the reference's: its teacher-forcing and
/// transcript policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alignment {
    /// Autoregressive decoding: the runtime is always teacher-forced on the reference's whole
    /// token sequence (tokens are feeds), so every step is comparable; its own greedy choices give
    /// its transcript (a free run when they depart from the reference's).
    ReferenceTokens,
    /// The runtime runs free; teacher forcing (asked for, or implied by isolation) feeds it the
    /// reference run's `extra[extra_key]` ids (Granite NAR: the CTC hypothesis).
    OnRequest {
        /// Key of the ids in the reference run's extras.
        extra_key: &'static str,
    },
}

/// A model family: what X-Ray needs to know about it beyond its graph.
pub trait Family: Sync {
    /// The family's name (its contract's `family`, dumps' and evidence's `family`).
    fn name(&self) -> &'static str;
    /// Its descriptor (`core/families/<name>.json`: model types, files, capabilities, ...).
    fn descriptor(&self) -> Result<&'static xray_core::family::Descriptor> {
        Ok(xray_core::family::descriptor(self.name())?)
    }
    /// Load a model directory.
    fn load(&self, dir: &Path) -> Result<Box<dyn SpeechModel>>;
    /// Its fault catalogue.
    fn catalogue(&self) -> Vec<crate::faults::CatalogueEntry>;
    /// Its teacher-forcing and transcript policy.
    fn alignment(&self) -> Alignment;
}

/// A family's registration as data: what its [`Family`] answers (each family's `FAMILY`).
pub struct Registration {
    /// [`Family::name`].
    pub name: &'static str,
    /// [`Family::load`].
    pub load: fn(&Path) -> Result<Box<dyn SpeechModel>>,
    /// [`Family::catalogue`].
    pub catalogue: fn() -> Vec<crate::faults::CatalogueEntry>,
    /// [`Family::alignment`].
    pub alignment: Alignment,
}

impl Family for Registration {
    fn name(&self) -> &'static str {
        self.name
    }
    fn load(&self, dir: &Path) -> Result<Box<dyn SpeechModel>> {
        (self.load)(dir)
    }
    fn catalogue(&self) -> Vec<crate::faults::CatalogueEntry> {
        (self.catalogue)()
    }
    fn alignment(&self) -> Alignment {
        self.alignment
    }
}

/// Every registered family (the one place a family is added).
pub fn families() -> &'static [&'static dyn Family] {
    &[&whisper::FAMILY, &granite_nar::FAMILY]
}

/// A registered family by name.
pub fn family(name: &str) -> Option<&'static dyn Family> {
    families().iter().copied().find(|f| f.name() == name)
}

/// Detect the family of a model directory from its config.json.
pub fn detect_family(dir: &Path) -> Result<&'static str> {
    detect(dir).map(|f| f.name())
}

/// The registered family of a model directory, from its config.json `model_type`.
pub fn detect(dir: &Path) -> Result<&'static dyn Family> {
    let p = dir.join("config.json");
    let text = std::fs::read_to_string(&p).map_err(|e| RuntimeError::File {
        path: p.clone(),
        reason: format!(
            "{e} (is this a HF model directory? run `make fixtures` for the bundled ones)"
        ),
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| RuntimeError::Config {
        path: p.clone(),
        reason: e.to_string(),
    })?;
    let Some(mt) = v.get("model_type").and_then(|m| m.as_str()) else {
        return Err(RuntimeError::Config {
            path: p,
            reason: "no model_type".into(),
        });
    };
    let mut known: Vec<&str> = Vec::new();
    for f in families() {
        let types = &f.descriptor()?.model_types;
        if types.iter().any(|t| t == mt) {
            return Ok(*f);
        }
        known.extend(types.iter().map(String::as_str));
    }
    Err(RuntimeError::Config {
        path: p,
        reason: format!(
            "model_type '{mt}' is not a supported family (known: {})",
            known.join(", ")
        ),
    })
}

/// Load any supported model directory.
pub fn load(dir: &Path) -> Result<Box<dyn SpeechModel>> {
    detect(dir)?.load(dir)
}
