// The CLI's entry, shared by the `xray` binary (main.rs) and the Python-free `xray-nopy`
// (nopy.rs): each root declares `mod cli;` and includes this file.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// X-Ray: compare a speech-model runtime with its reference, checkpoint by checkpoint.
#[derive(Debug, Parser)]
#[command(name = "xray", version, about)]
struct Cli {
    /// Show the Python traceback behind an oracle error (also: XRAY_TRACEBACK=1).
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the runtime and the HF reference on one input, compare, localize, write evidence.
    // Built without the oracle: the reference from --reference-cache only.
    Check(cli::check::Args),
    /// Run the runtime and write its dump.
    Run(cli::run::Args),
    #[cfg(feature = "oracle")]
    /// Run the HF reference and write its dump.
    Oracle(cli::oracle::Args),
    /// Compare two dumps offline (no Python).
    Compare(cli::compare::Args),
    /// List a model's checkpoints (or its whole graph with --json).
    List(cli::list::Args),
    /// Print a model's checkpoint contract resolved against its config (what the oracle reads).
    Contract(cli::contract::Args),
    /// List the deliberate-fault catalogue.
    Faults(cli::faults::Args),
    #[cfg(feature = "oracle")]
    /// Benchmark the runtime against torch (SDPA and eager) and CTranslate2, interleaved.
    Bench(cli::bench::Args),
    #[cfg(feature = "oracle")]
    /// Plant every catalogue fault on the bundled fixtures and check the reported origins.
    Selftest(cli::selftest::Args),
    /// Render evidence as a self-contained HTML page and/or Markdown.
    Report(cli::report::Args),
    /// Compare new evidence with a baseline; fail when it got worse.
    Gate(cli::gate::Args),
    /// Cut the op-level origin of a divergence out as a self-contained repro case.
    Repro(cli::repro::Args),
    /// Judge an output of a repro case's op (another engine's, or X-Ray's kernel) against it.
    Replay(cli::replay::Args),
    /// Merge corpus evidence directories (shards) into one summary.
    Summarize(cli::summarize::Args),
    /// Compare two safetensors weight tables tensor by tensor, naming each difference.
    Weights(cli::weights::Args),
    /// Measure the comparison throughput (GB/s per core).
    BenchCompare(cli::bench_compare::Args),
    #[cfg(feature = "oracle")]
    /// Where the oracle's Python environment and package come from, and their versions.
    Doctor(cli::doctor::Args),
}

/// `xray --version`: the version and where the oracle environment is (no Python started).
#[cfg(feature = "oracle")]
fn long_version() -> String {
    let env = match xray_oracle::Oracle::discover() {
        Ok(o) => o.describe(),
        Err(e) => format!("oracle environment: not found: {e}"),
    };
    format!("{}\n{env}", env!("CARGO_PKG_VERSION"))
}

/// `xray --version` of a build without the oracle feature.
#[cfg(not(feature = "oracle"))]
fn long_version() -> String {
    format!(
        "{}\nbuilt without the oracle feature: compare, gate, report, list, faults, run, and check from a reference cache (--reference-cache) only (no Python)",
        env!("CARGO_PKG_VERSION")
    )
}

fn main() -> ExitCode {
    let mut cmd = Cli::command();
    if std::env::args_os().any(|a| a == "--version") {
        // Leaked once per process: clap keeps a `&'static str` (no "string" feature).
        cmd = cmd.long_version(&*Box::leak(long_version().into_boxed_str()));
    }
    let parsed = cmd
        .try_get_matches()
        .and_then(|mut m| Cli::from_arg_matches_mut(&mut m));
    let cli = match parsed {
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
    // The environment variables X-Ray reads are checked like arguments: a set but empty or
    // malformed value is refused, never taken as "unset" or as the working directory
    // (XRAY_VENV / XRAY_ORACLE_PATH: `Oracle::discover`).
    if let Some(v) = std::env::var_os("XRAY_THREADS") {
        let ok = v
            .to_str()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .is_some_and(|n| n > 0);
        if !ok {
            cli::note(&format!(
                "xray: error: XRAY_THREADS={v:?} is not a positive integer (the runtime's kernel threads); set a count or unset it"
            ));
            return cli::exit_usage();
        }
    }
    let result = match cli.command {
        Command::Check(a) => cli::check::run(a),
        Command::Run(a) => cli::run::run(a),
        #[cfg(feature = "oracle")]
        Command::Oracle(a) => cli::oracle::run(a),
        Command::Compare(a) => cli::compare::run(a),
        Command::List(a) => cli::list::run(a),
        Command::Contract(a) => cli::contract::run(a),
        Command::Summarize(a) => cli::summarize::run(a),
        Command::Weights(a) => cli::weights::run(a),
        Command::Repro(a) => cli::repro::run(a),
        Command::Replay(a) => cli::replay::run(a),
        Command::Faults(a) => cli::faults::run(a),
        #[cfg(feature = "oracle")]
        Command::Selftest(a) => cli::selftest::run(a),
        #[cfg(feature = "oracle")]
        Command::Bench(a) => cli::bench::run(a),
        Command::Report(a) => cli::report::run(a),
        Command::Gate(a) => cli::gate::run(a),
        Command::BenchCompare(a) => cli::bench_compare::run(a),
        #[cfg(feature = "oracle")]
        Command::Doctor(a) => cli::doctor::run(a),
    };
    #[cfg(feature = "oracle")]
    let verbose = cli.verbose
        || std::env::var_os("XRAY_TRACEBACK").is_some_and(|v| !v.is_empty() && v != "0");
    #[cfg(not(feature = "oracle"))]
    let _ = cli.verbose;
    result.unwrap_or_else(|e| {
        #[cfg(feature = "oracle")]
        if verbose {
            if let Some(tb) = e
                .chain()
                .find_map(|c| c.downcast_ref::<xray_oracle::OracleError>())
                .and_then(|o| o.traceback())
            {
                cli::note(tb.trim_end());
            }
        }
        cli::note(&format!("xray: error: {e:#}"));
        cli::exit_usage()
    })
}
