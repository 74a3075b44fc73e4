//! `xray`: numerical parity harness CLI. This file only parses and dispatches; each subcommand
//! lives in `cli/<name>.rs` with one entry function.
//!
//! Exit codes: 0 pass, 1 divergence or gate failure, 2 usage or input error.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

/// X-Ray: compare a speech-model runtime with its reference, checkpoint by checkpoint.
#[derive(Debug, Parser)]
#[command(name = "xray", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Render evidence as a self-contained HTML page and/or Markdown.
    Report(cli::report::Args),
    /// Compare new evidence with a baseline; fail when it got worse.
    Gate(cli::gate::Args),
    /// Measure the comparison throughput (GB/s per core).
    BenchCompare(cli::bench_compare::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                cli::exit_usage()
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let result = match cli.command {
        Command::Report(a) => cli::report::run(a),
        Command::Gate(a) => cli::gate::run(a),
        Command::BenchCompare(a) => cli::bench_compare::run(a),
    };
    result.unwrap_or_else(|e| {
        cli::note(&format!("xray: error: {e:#}"));
        cli::exit_usage()
    })
}
