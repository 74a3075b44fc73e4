//! `xray list --model DIR`: the checkpoints with producer, consumers, shape and layout.

use std::path::PathBuf;
use std::process::ExitCode;

use xray_runtime::models;

/// Arguments of `xray list`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// HF model directory.
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Print the whole graph (ops, edges, layouts) as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Lists checkpoints.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let model = models::load(&a.model)?;
    let g = model.graph();
    if a.json {
        super::say(&format!(
            "{}\n",
            serde_json::to_string_pretty(&g.to_json())?
        ))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = format!(
        "{:<52} {:<40} {:<16} {:<24} consumers\n",
        "checkpoint", "producer", "layout", "shape"
    );
    for (name, e) in g.checkpoints() {
        let edge = &g.edges()[e];
        out.push_str(&format!(
            "{:<52} {:<40} {:<16} {:<24} {}\n",
            name,
            g.producer_name(e).unwrap_or("(feed)"),
            edge.layout.to_string(),
            xray_runtime::graph::fmt_shape(&edge.shape),
            g.consumer_names(e).join(", ")
        ));
    }
    super::say(&out)?;
    Ok(ExitCode::SUCCESS)
}
