//! `xray replay CASE --got OUT.npy` / `xray replay CASE --runtime [--inject FAULT]`: judge one
//! output of a repro case's op (`xray.case/v1`, made by `xray repro`) against the case's reference
//! output with the case's tolerance. `--got` takes any engine's output for the case's inputs and
//! weights; `--runtime` computes it with X-Ray's own kernel for the op (the op of the model's
//! runtime graph, run alone on the case's inputs and weights: `Graph::run_op`), with or without a
//! planted fault. Exit 0 pass, 1 fail, 2 bad input; one line on stdout.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, bail};
use xray_compare::case::{self, judge, LoadedCase};
use xray_runtime::weights::Weights;

/// Arguments of `xray replay`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The case directory (from `xray repro`).
    pub case: PathBuf,
    /// An engine's output for the case's op (`.npy`, the shape and layout of the case's
    /// reference.npy).
    #[arg(
        long,
        value_name = "OUT.npy",
        conflicts_with = "runtime",
        required_unless_present = "runtime"
    )]
    pub got: Option<PathBuf>,
    /// Compute the output with X-Ray's own kernel for the op.
    #[arg(long)]
    pub runtime: bool,
    /// With --runtime: plant a deliberate fault (see `xray faults`): NAME or NAME@TARGET.
    /// Repeatable.
    #[arg(long, value_name = "FAULT", requires = "runtime")]
    pub inject: Vec<String>,
    /// With --runtime: the model directory whose runtime graph holds the op (default: the one the
    /// case was cut from, its `source.model`).
    #[arg(long, value_name = "DIR", requires = "runtime")]
    pub model: Option<PathBuf>,
    /// Print the judgement (metrics, pass, failed criteria) as JSON on stdout instead of the line.
    #[arg(long)]
    pub json: bool,
}

/// X-Ray's kernel for the case's op on the case's inputs and weights.
fn runtime_output(c: &LoadedCase, a: &Args) -> anyhow::Result<(xray_core::Tensor, String)> {
    let model_dir = a
        .model
        .clone()
        .unwrap_or_else(|| PathBuf::from(&c.case.source.model));
    let model = xray_runtime::models::load(&model_dir)
        .map_err(|e| anyhow!("--model {}: {e}", model_dir.display()))?;
    let mp = c.dir.join(case::MANIFEST);
    if model.family() != c.case.family {
        bail!(
            "--model {}: a {} model, the case is {}",
            model_dir.display(),
            model.family(),
            c.case.family
        );
    }
    let g = model.graph();
    let module_case = c.case.op.kind == xray_runtime::replay::MODULE_KIND;
    // A module case: the ops the graph computes between the case's input points and its output
    // point (which must be the case's ops); one op: the op by name.
    let spec = if module_case {
        let ins: Vec<String> = c.case.inputs.iter().map(|i| i.point.clone()).collect();
        g.module_spec(&c.case.op.name, &ins, &c.case.point)
    } else {
        g.op_spec(&c.case.op.name)
    }
    .map_err(|e| {
        anyhow!(
            "{}: op {}: {e} (--model {})",
            mp.display(),
            c.case.op.name,
            model_dir.display()
        )
    })?;
    let ops: Vec<String> = if module_case {
        spec.params["ops"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    } else {
        vec![c.case.op.name.clone()]
    };
    // The op the graph holds must be the case's: same kernel and parameters, weight roles and
    // keys, ports and output edge (the case's tensors are that op's).
    let graph_keys: Vec<(&str, &str)> = spec
        .weights
        .iter()
        .map(|w| (w.role.as_str(), w.key.as_str()))
        .collect();
    let case_keys: Vec<(&str, &str)> = c
        .case
        .weights
        .iter()
        .map(|w| (w.role.as_str(), w.key.as_str()))
        .collect();
    let differs = if spec.kind != c.case.op.kind {
        Some(format!(
            "kernel {} (the case: {})",
            spec.kind, c.case.op.kind
        ))
    } else if spec.params != c.case.op.params {
        Some(format!(
            "parameters {} (the case: {})",
            spec.params, c.case.op.params
        ))
    } else if graph_keys != case_keys {
        Some("other weight roles or keys".to_string())
    } else if spec.inputs.len() != c.case.inputs.len() {
        Some(format!(
            "{} inputs (the case: {})",
            spec.inputs.len(),
            c.case.inputs.len()
        ))
    } else if !spec.outputs.iter().any(|o| o.edge == c.case.op.output_edge) {
        Some(format!("no output edge {}", c.case.op.output_edge))
    } else {
        None
    };
    if let Some(d) = differs {
        bail!(
            "{}: op {} of the runtime graph of {} has {d}: not the case's op",
            mp.display(),
            c.case.op.name,
            model_dir.display()
        );
    }
    let (plan, names) = super::faults::plan(&a.inject, &model_dir)?;
    plan.validate(g)?;
    if !names.is_empty() {
        let touches: Vec<String> = plan
            .planted
            .iter()
            .filter(|p| !p.ops(g).iter().any(|o| ops.contains(o)))
            .map(|p| p.spec())
            .collect();
        if !touches.is_empty() {
            bail!(
                "--inject {}: does not change op {} (it plants on other ops of the graph; target {}: NAME@{})",
                touches.join(", "),
                c.case.op.name,
                if module_case { "one of the module's ops" } else { "the case's op" },
                if module_case { &ops[0] } else { &c.case.op.name }
            );
        }
    }
    let table: HashMap<String, xray_core::Tensor> = c.weights.iter().cloned().collect();
    let weights = Weights::from_map(&c.dir.join(case::WEIGHTS_DIR).display().to_string(), table);
    plan.reset_hits();
    let out = if module_case {
        g.run_module(&spec, &c.inputs, &weights, c.case.step, Some(&plan))?
    } else {
        let outs = g.run_op(
            &c.case.op.name,
            &c.inputs,
            &weights,
            c.case.step,
            Some(&plan),
        )?;
        let i = spec
            .outputs
            .iter()
            .position(|o| o.edge == c.case.op.output_edge)
            .unwrap_or(0);
        outs.into_iter()
            .nth(i)
            .ok_or_else(|| anyhow!("op {}: no output {i}", c.case.op.name))?
    };
    plan.confirm_fired()?;
    let kernel = if module_case {
        format!("X-Ray's {} kernels", ops.len())
    } else {
        "X-Ray's kernel".to_string()
    };
    let what = if names.is_empty() {
        kernel
    } else {
        format!("{kernel} with {}", names.join(", "))
    };
    Ok((out, what))
}

/// Replays the case. Exit 0 pass, 1 fail, 2 bad input.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let c = case::load(&a.case)?;
    let (got, what) = match &a.got {
        Some(p) => (
            case::read_npy(p).map_err(|e| anyhow!("--got {e}"))?,
            format!("--got {}", p.display()),
        ),
        None => runtime_output(&c, &a)?,
    };
    let j = judge(&c, &got, &what).map_err(|e| anyhow!("{e}"))?;
    if a.json {
        super::say(&format!("{}\n", serde_json::to_string_pretty(&j)?))?;
    } else {
        super::say(&format!("{}\n", j.summary(&c.case, &what)))?;
    }
    Ok(if j.passes {
        ExitCode::SUCCESS
    } else {
        super::exit_fail()
    })
}
