//! `xray repro EVIDENCE --out CASE/`: cut the op-level origin of a divergence
//! (`first_divergence.op`) out of its run as a self-contained repro case (`xray.case/v1`,
//! `xray_compare::case`): the op's reference inputs, only the weights it reads, the reference and
//! engine outputs, the tolerance, and the upstream code it mirrors. `xray replay` judges it.
//!
//! The tensors come from the run's two dumps (the evidence's `run.dumps`, written by `xray check
//! --dumps DIR` and `xray compare`, or `--reference`/`--got`), which must hold the op-level points
//! (`--ops`); the op, its edges and its weight keys from the runtime graph of the model directory
//! (the evidence's `run.model_path`, or `--model`), and the weights from that model. Everything is
//! checked before the case is written: the output directory, the evidence, the dumps and the
//! model must describe one run (family, weights, audio).

use std::path::PathBuf;
use std::process::ExitCode;
use xray_core::Step;

use anyhow::{anyhow, bail};
use xray_compare::align::to_canonical;
use xray_compare::case::{
    self, check_case_target, weight_file, Case, CaseDivergence, CaseEngine, CaseFiles, CaseInput,
    CaseOp, CaseSource, CaseWeight, Upstream,
};
use xray_compare::evidence::{Evidence, RunDumps};
use xray_core::dump::Dump;
use xray_core::{Layout, Tensor};
use xray_runtime::replay::OpSpec;

/// Arguments of `xray repro`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Evidence JSON with an op-level origin (`first_divergence.op`), from `xray check` or `xray
    /// compare`.
    pub evidence: PathBuf,
    /// The case directory to write (new or empty; an earlier case is replaced with --force).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Reference dump with op-level points (default: the evidence's `run.dumps.reference`).
    #[arg(long, value_name = "DUMP")]
    pub reference: Option<PathBuf>,
    /// Dump of the engine under test with op-level points (default: the evidence's
    /// `run.dumps.got`).
    #[arg(long, value_name = "DUMP")]
    pub got: Option<PathBuf>,
    /// Model directory X-Ray's runtime loads: the op's graph and weights (default: the evidence's
    /// `run.model_path`).
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// Replace an earlier case at --out.
    #[arg(long)]
    pub force: bool,
}

/// `to_canonical`'s head count for a layout transform between these shapes.
fn heads_for(t: &Tensor, from: Layout, to: Layout, declared: &[String]) -> Option<usize> {
    match (from, to) {
        (Layout::HeadMajor, Layout::TokenMajor) => t.shape().first().copied(),
        (Layout::TokenMajor, Layout::HeadMajor) => declared.first().and_then(|d| d.parse().ok()),
        _ => None,
    }
}

/// `point@step` of `d`, in the edge's layout `to`; an error names the dump and what is missing.
fn point_tensor(
    d: &Dump,
    what: &str,
    point: &str,
    step: Step,
    to: Layout,
    declared: &[String],
) -> anyhow::Result<Tensor> {
    let (Some(e), Some(t)) = (d.entry(point, step), d.get(point, step)) else {
        let n = xray_compare::ops::dump_points(d, step).len();
        bail!("the {what} dump {} holds no {} ({}): a case needs the op-level points on both sides; re-make the dumps with --ops (`xray check --ops --dumps DIR`, `xray oracle --ops`, `xray run --ops`)", d.dir.display(), xray_core::key(point, step), if n == 0 {
                format!("it holds no op-level point at step {step}")
            } else {
                format!("it holds {n} other op-level points at step {step}")
            });
    };
    if e.layout == to {
        return Ok(t.clone());
    }
    to_canonical(t, e.layout, to, heads_for(t, e.layout, to, declared)).map_err(|r| {
        anyhow!(
            "the {what} dump {}: {} is {} {:?}, the runtime edge is {to}: {r}",
            d.dir.display(),
            xray_core::key(point, step),
            e.layout,
            t.shape()
        )
    })
}

/// What the upstream code of the op is, and what each fact is known from.
fn upstream(
    spec: &OpSpec,
    point: &str,
    config: &serde_json::Value,
    model_class: Option<&str>,
    reference: &Dump,
    replayed_class: Option<&str>,
) -> Upstream {
    let mut known = Vec::new();
    let class = match spec.kind.as_str() {
        "linear" => Some("nn.Linear"),
        "layer_norm" => Some("nn.LayerNorm"),
        "conv1d" => Some("nn.Conv1d"),
        "embedding" => Some("nn.Embedding"),
        xray_runtime::replay::MODULE_KIND => replayed_class,
        _ => None,
    };
    match class {
        Some(c) if spec.kind == xray_runtime::replay::MODULE_KIND => known.push(format!(
            "class: {c}, the class the reference replay of the module reported (first_divergence.op.replay.class); the case's ops are the runtime graph's {} ops between the module's boundary points",
            spec.params["ops"].as_array().map_or(0, Vec::len)
        )),
        None if spec.kind == xray_runtime::replay::MODULE_KIND => known.push(
            "class: not known; the module was not replayed (the evidence has no first_divergence.op.replay)".to_string(),
        ),
        Some(c) => known.push(format!(
            "class: X-Ray's kernel '{}' declares that it computes what the module computes (Kernel::points), torch's {c}; the reference dump does not record the module's class, so it may be a subclass of it (HF's positional embeddings subclass nn.Embedding)",
            spec.kind
        )),
        None => known.push(format!(
            "class: not known; X-Ray's kernel '{}' mirrors no torch module class it can name, and the reference dump does not record classes",
            spec.kind
        )),
    }
    let module = spec.module.clone();
    match &module {
        Some(m) if spec.kind == xray_runtime::replay::MODULE_KIND => known.push(format!(
            "module: the contract's points rules declare {m}'s boundaries the same tensors as the points the evidence compared (same_as), and every weight its ops read is under {m}"
        )),
        Some(m) => known.push(format!(
            "module: the op's safetensors keys ({}) name {m}, the module the reference hooked for {point}",
            spec.weights
                .iter()
                .map(|w| w.key.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        None => known.push(format!(
            "module: the op reads no weights of one module; HF runs it inside a module it exposes no tensor of, and its output is observed as {point}"
        )),
    }
    let auto_map = config.get("auto_map").and_then(|m| m.as_object());
    let model_type = config.get("model_type").and_then(|m| m.as_str());
    let file = match (auto_map, model_type) {
        (Some(m), _) => {
            let f = m
                .values()
                .filter_map(|v| v.as_str())
                .find_map(|v| v.rsplit_once('.').map(|(f, _)| format!("{f}.py")));
            known.push(format!(
                "file: config.json's auto_map (the model directory's own code, not transformers'): {}",
                f.as_deref().unwrap_or("no module named")
            ));
            f
        }
        (None, Some(mt)) if mt.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => {
            known.push(format!(
                "file: config.json's model_type '{mt}' and transformers' layout (a model type's modules are built in models/<model_type>/modeling_<model_type>.py){}; the file that builds and calls the module, not the module class's own file",
                model_class
                    .map(|c| format!(", for the contract's hf_class {c}"))
                    .unwrap_or_default()
            ));
            Some(format!("transformers/models/{mt}/modeling_{mt}.py"))
        }
        _ => {
            known.push("file: not known (config.json names no model_type)".into());
            None
        }
    };
    let transformers = reference.manifest.tools.get("transformers").cloned();
    if let Some(v) = &transformers {
        known.push(format!(
            "transformers: {v}, the version the reference dump records (tools.transformers)"
        ));
    }
    Upstream {
        file,
        class: class.map(str::to_string),
        module,
        model_class: model_class.map(str::to_string),
        transformers,
        known_from: known,
    }
}

/// The one runtime op computing the op-level origin's point, checked to be the op the evidence
/// names.
fn one_op_spec(
    g: &xray_runtime::graph::Graph,
    op: &xray_compare::ops::OpDivergence,
    op_name: &str,
    e_path: &str,
    model_dir: &std::path::Path,
) -> anyhow::Result<OpSpec> {
    let Some(producer) = g.producer_of_point(&op.point) else {
        bail!(
            "{e_path}: {} is no op-level point of the runtime graph of {} (`xray list --model DIR --json` lists its points)",
            op.point,
            model_dir.display()
        );
    };
    let spec = g.op_spec(producer)?;
    // An evidence from the runtime graph names the op; one from the reference's firing order
    // names the module (`xray compare` without --model).
    if op_name != spec.name && Some(op_name) != spec.module.as_deref() {
        bail!(
            "{e_path}: the op-level origin names {op_name}, but {} is computed by op {} ({}) in the runtime graph of {}",
            op.point,
            spec.name,
            spec.module.as_deref().unwrap_or("no HF module"),
            model_dir.display()
        );
    }
    Ok(spec)
}

/// Writes the case. Exit 0 written, 2 anything refused.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    // The output first: nothing is read or loaded for a case that could not be written.
    check_case_target(&a.out, a.force).map_err(|e| anyhow!("--out: {e}"))?;
    let ev = Evidence::load(&a.evidence)?;
    let e_path = a.evidence.display().to_string();
    let Some(fd) = &ev.first_divergence else {
        bail!(
            "{e_path}: no first divergence (verdict {}): there is nothing to cut out",
            ev.verdict.as_str()
        );
    };
    let Some(op) = &fd.op else {
        bail!("{e_path}: the evidence has no op-level origin (first_divergence.op) behind {}: both dumps need op-level points for one (`xray check` drills down by itself; an engine's dump needs {{module}}:in/out points, --ops), and a drill-down needs more than one runtime op in the origin's region", xray_core::key(&fd.checkpoint, fd.step));
    };
    let module_case = op.op.is_none() && op.boundary;
    let Some(op_name) = op.op.as_ref().or(module_case.then_some(&op.module)) else {
        bail!("{e_path}: the op-level origin {} lies behind {} ops ({}), not one: a case cuts out one op", xray_core::key(&op.point, op.step), op.suspects.len(), op.suspects.join(", "));
    };
    if let Some((r, x)) = &op.shapes {
        bail!("{e_path}: the op-level origin {} is a shape divergence (reference {r:?}, engine {x:?}): no output of the reference's shape to judge against it", xray_core::key(&op.point, op.step));
    }
    let dumps = ev.run.dumps.as_ref();
    let pick = |given: &Option<PathBuf>, recorded: Option<&String>, flag: &str| {
        given
            .clone()
            .or_else(|| recorded.map(PathBuf::from))
            .ok_or_else(|| {
                anyhow!(
                    "{e_path}: the evidence names no dumps (run.dumps: written by `xray check --ops --dumps DIR` and `xray compare`); pass {flag} DUMP"
                )
            })
    };
    let ref_dir = pick(&a.reference, dumps.map(|d| &d.reference), "--reference")?;
    let got_dir = pick(&a.got, dumps.map(|d| &d.got), "--got")?;
    let model_dir = a
        .model
        .clone()
        .unwrap_or_else(|| PathBuf::from(&ev.run.model_path));
    let reference = Dump::load(&ref_dir)?;
    let got = Dump::load(&got_dir)?;
    for (what, d) in [("reference", &reference), ("got", &got)] {
        if d.manifest.family != ev.run.family {
            bail!(
                "the {what} dump {} is of family {}, the evidence's run is {}",
                d.dir.display(),
                d.manifest.family,
                ev.run.family
            );
        }
        if d.manifest.stats_only {
            bail!(
                "the {what} dump {} is stats-only: a case needs the tensors (re-make it without --stats-only, with --ops)",
                d.dir.display()
            );
        }
        // The dump under test may declare other weights than the reference's (a converted or
        // edited copy, said in the compare's note): the evidence records which.
        let weights = match (what, ev.run.dumps.as_ref()) {
            (
                "got",
                Some(RunDumps {
                    got_weights_sha256: Some(w),
                    ..
                }),
            ) => Some(w),
            _ => ev.run.weights_sha256.as_ref(),
        };
        for (fact, mine, theirs) in [
            ("weights", &d.manifest.weights_sha256, weights),
            (
                "audio",
                &d.manifest.audio_sha256,
                ev.run.audio_sha256.as_ref(),
            ),
        ] {
            if theirs.is_some_and(|t| t != mine) {
                bail!(
                    "the {what} dump {} was made on other {fact} than the evidence's run (sha256 {mine}, the evidence {}): not the run the evidence describes",
                    d.dir.display(),
                    theirs.map_or("", |t| t.as_str())
                );
            }
        }
    }
    let model = xray_runtime::models::load(&model_dir)
        .map_err(|e| anyhow!("--model {}: {e}", model_dir.display()))?;
    if model.family() != ev.run.family {
        bail!(
            "--model {}: a {} model, the evidence's run is {}",
            model_dir.display(),
            model.family(),
            ev.run.family
        );
    }
    if let Some(w) = ev
        .run
        .weights_sha256
        .as_ref()
        .filter(|w| *w != model.weights().sha256())
    {
        bail!(
            "--model {}: its weights (sha256 {}) are not the evidence's run's ({w})",
            model_dir.display(),
            model.weights().sha256()
        );
    }
    let g = model.graph();
    // A module's whole computation (`first_divergence.op.boundary`): every runtime op from its
    // agreeing input points to the failing one, checked to be the ops the evidence named.
    let spec = if module_case {
        let ins: Vec<String> = op.inputs.iter().map(|i| i.point.clone()).collect();
        let spec = g.module_spec(&op.module, &ins, &op.point).map_err(|e| {
            anyhow!(
                "{e_path}: the op-level origin {}: {e} (--model {})",
                op.module,
                model_dir.display()
            )
        })?;
        if spec.params["ops"] != serde_json::json!(op.suspects) {
            bail!(
                "{e_path}: the op-level origin {} names {} ops between {} and {}, the runtime graph of {} computes it with {}: not the run the evidence describes",
                op.module,
                op.suspects.len(),
                ins.join(", "),
                op.point,
                model_dir.display(),
                spec.params["ops"].as_array().map_or(0, Vec::len)
            );
        }
        spec
    } else {
        one_op_spec(g, op, op_name, &e_path, &model_dir)?
    };
    let Some(out_port) = spec.outputs.iter().find(|o| o.points.contains(&op.point)) else {
        bail!("op {}: no output carries {}", spec.name, op.point);
    };
    let step = op.step;
    let mut files = CaseFiles::default();
    let case_err = |e: case::CaseError| anyhow!("--out {}: {e}", a.out.display());
    let mut inputs = Vec::new();
    for (i, port) in spec.inputs.iter().enumerate() {
        let Some(point) = port
            .points
            .iter()
            .find(|p| reference.entry(p, step).is_some())
            .or(port.points.first())
        else {
            bail!(
                "op {}: its input '{}' (edge {}) carries no op-level point: HF exposes no tensor there, so the case would have no reference input for it",
                spec.name,
                port.port,
                port.edge
            );
        };
        let t = point_tensor(
            &reference,
            "reference",
            point,
            step,
            port.layout,
            &port.shape,
        )?;
        let tensor = files
            .add(&format!("input.{i}.npy"), &t, Some(port.layout))
            .map_err(case_err)?;
        inputs.push(CaseInput {
            port: port.port.clone(),
            edge: port.edge.clone(),
            point: point.clone(),
            tensor,
        });
    }
    let mut weights = Vec::new();
    for w in &spec.weights {
        let t = model.weights().get(&w.key).ok_or_else(|| {
            anyhow!(
                "--model {}: no weight {} (op {} reads it)",
                model_dir.display(),
                w.key,
                spec.name
            )
        })?;
        let tensor = files
            .add(&weight_file(&w.key).map_err(case_err)?, t, None)
            .map_err(case_err)?;
        weights.push(CaseWeight {
            role: w.role.clone(),
            key: w.key.clone(),
            tensor,
        });
    }
    let out_layout = out_port.layout;
    let r = point_tensor(
        &reference,
        "reference",
        &op.point,
        step,
        out_layout,
        &out_port.shape,
    )?;
    let x = point_tensor(&got, "got", &op.point, step, out_layout, &out_port.shape)?;
    if r.shape() != x.shape() {
        bail!(
            "{}: the reference is {:?}, the engine {:?}: no case of one output shape",
            xray_core::key(&op.point, step),
            r.shape(),
            x.shape()
        );
    }
    let tol = op.tolerance.bounds;
    let m = xray_compare::metrics::compare(&r.view(), &x.view(), &tol)
        .map_err(|e| anyhow!("{}: {e}", xray_core::key(&op.point, step)))?;
    let passes = m.passes(&tol);
    let reference_t = files
        .add("reference.npy", &r, Some(out_layout))
        .map_err(case_err)?;
    let engine_t = files
        .add("engine.npy", &x, Some(out_layout))
        .map_err(case_err)?;
    let config = super::read_config(&model_dir)?;
    let c = Case {
        schema: case::SCHEMA.into(),
        family: ev.run.family.clone(),
        step,
        point: op.point.clone(),
        op: CaseOp {
            name: spec.name.clone(),
            kind: spec.kind.clone(),
            params: spec.params.clone(),
            module: spec.module.clone(),
            output_edge: out_port.edge.clone(),
            output_checkpoint: out_port.checkpoint.clone(),
            output_points: out_port.points.clone(),
        },
        upstream: upstream(
            &spec,
            &op.point,
            &config,
            model.contract().hf_class.as_deref(),
            &reference,
            op.replay.as_ref().map(|r| r.class.as_str()),
        ),
        inputs,
        weights,
        reference: reference_t,
        engine: CaseEngine {
            producer: got.manifest.producer.clone(),
            tensor: engine_t,
            metrics: m,
            passes,
        },
        tolerance: op.tolerance.clone(),
        divergence: CaseDivergence {
            checkpoint: xray_core::key(&fd.checkpoint, fd.step).to_string(),
            signature: op.explanation.as_ref().map(|e| e.signature),
            detail: op.explanation.as_ref().map(|e| e.detail.clone()),
        },
        source: CaseSource {
            evidence: super::absolute(&a.evidence),
            reference_dump: super::absolute(&ref_dir),
            engine_dump: super::absolute(&got_dir),
            model: super::absolute(&model_dir),
            weights_sha256: Some(model.weights().sha256().to_string()),
            audio_sha256: Some(reference.manifest.audio_sha256.clone()),
            written_by: xray_runtime::version(),
        },
        config: module_case.then(|| config.clone()),
    };
    case::write_case(&c, &files, &a.out, a.force).map_err(case_err)?;
    let n_bytes: u64 = c
        .files()
        .iter()
        .filter_map(|f| std::fs::metadata(a.out.join(f)).ok())
        .map(|m| m.len())
        .sum();
    super::note(&format!("xray: case {}: op {} ({}{}) at {}: {} input(s), {} weight(s), {:.1} kB; the {} output {} the reference (rel_l2 {:.3e}){}", a.out.display(), c.op.name, c.op.kind, c.upstream
            .module
            .as_ref()
            .map(|m| format!(", {} at {m}", c.upstream.class.as_deref().unwrap_or("module")))
            .unwrap_or_default(), xray_core::key(&c.point, step), c.inputs.len(), c.weights.len(), n_bytes as f64 / 1e3, c.engine.producer, if passes { "passes against" } else { "fails against" }, c.engine.metrics.rel_l2, if passes {
            " (the case does not reproduce a failure at this tolerance)"
        } else {
            ""
        }));
    Ok(ExitCode::SUCCESS)
}
