//! One module per subcommand, each with `Args` (clap) and `run(Args) -> anyhow::Result<ExitCode>`.

use std::process::ExitCode;

pub mod bench_compare;
pub mod gate;
pub mod report;

/// Exit code for a divergence or gate failure.
pub fn exit_fail() -> ExitCode {
    ExitCode::from(1)
}

/// Exit code for a usage or input error.
pub fn exit_usage() -> ExitCode {
    ExitCode::from(2)
}

/// Writes `text` to stdout; a closed pipe (`xray ... | head`) is not an error.
pub fn say(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    match o.write_all(text.as_bytes()).and_then(|_| o.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// Writes a line to stderr, ignoring failures (progress and diagnostics only).
pub fn note(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{text}");
}

#[cfg(feature = "oracle")]
pub mod bench;
pub mod check;
pub mod compare;
pub mod contract;
#[cfg(feature = "oracle")]
pub mod doctor;
pub mod faults;
pub mod list;
#[cfg(feature = "oracle")]
pub mod oracle;
pub mod replay;
pub mod repro;
pub mod run;
#[cfg(feature = "oracle")]
pub mod selftest;
pub mod summarize;
pub mod weights;

/// Peak resident set size of this process so far, in bytes (`VmHWM` of /proc/self/status, what
/// getrusage's `ru_maxrss` reports, read without unsafe code); `None` off Linux.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `p` as an absolute path (resolved against the working directory; symbolic links kept), as
/// text; `p` itself when that fails.
pub fn absolute(p: &std::path::Path) -> String {
    std::path::absolute(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

/// A model directory's config.json as JSON.
pub fn read_config(dir: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    let p = dir.join("config.json");
    let text = std::fs::read_to_string(&p).map_err(|e| {
        anyhow::anyhow!(
            "{}: {e} (run `make fixtures` for the bundled models)",
            p.display()
        )
    })?;
    serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
}

/// The family's contract resolved against `config` (read from `dir`/config.json), an error
/// naming that file (core bounds every number it reads: a hostile count is refused, not sized).
pub fn contract_for(
    family: &str,
    dir: &std::path::Path,
    config: &serde_json::Value,
) -> anyhow::Result<xray_core::contract::Contract> {
    use anyhow::Context;
    xray_core::contract::Contract::for_family(family, config)
        .with_context(|| format!("{}", dir.join("config.json").display()))
}

// The console summary (`xray: verdict ...` and the lines after it) is the comparison library's,
// so the Python bindings print the same text.
pub use xray_compare::report::summary;

/// Output locations of one command, checked before any expensive work ([`Outputs::check`]) and
/// written in order afterwards ([`Outputs::write_file`]): a failed write does not stop the
/// others, and each failure is named ([`Outputs::finish`]). The command's inputs are planned
/// too ([`Outputs::input`]): an output never replaces one.
#[derive(Debug, Default)]
pub struct Outputs {
    files: Vec<(String, std::path::PathBuf)>,
    dumps: Vec<(String, std::path::PathBuf, bool)>,
    inputs: Vec<(String, std::path::PathBuf)>,
    failed: Vec<String>,
}

/// Where a path leads: its canonical form ([`xray_compare::corpus::canonical_path`], symbolic
/// links resolved) and, for an existing file on Unix, its identity (device, inode), which hard
/// links share.
#[derive(Debug, Clone, PartialEq)]
struct Place {
    path: std::path::PathBuf,
    id: Option<(u64, u64)>,
}

impl Place {
    fn of(p: &std::path::Path) -> Place {
        #[cfg(unix)]
        let id = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
        };
        #[cfg(not(unix))]
        let id = None;
        Place {
            path: xray_compare::corpus::canonical_path(p),
            id,
        }
    }

    fn same(&self, other: &Place) -> bool {
        self.path == other.path || (self.id.is_some() && self.id == other.id)
    }
}

/// Every file under `dir` (not following linked directories; at most 100000 entries), then
/// `dir` itself.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if out.len() >= 100_000 {
                break;
            }
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                _ => out.push(p),
            }
        }
    }
    out.push(dir.to_path_buf());
    out
}

impl Outputs {
    /// Plans an output file (`what` names it in messages: `evidence`, `report`, ...).
    pub fn file(&mut self, what: &str, path: &std::path::Path) -> &mut Self {
        self.files.push((what.to_string(), path.to_path_buf()));
        self
    }

    /// Plans an output dump directory; an existing dump is replaced only with `force`.
    pub fn dump(&mut self, what: &str, dir: &std::path::Path, force: bool) -> &mut Self {
        self.dumps
            .push((what.to_string(), dir.to_path_buf(), force));
        self
    }

    /// [`Outputs::file`] when the output was asked for (`None`: nothing planned).
    pub fn file_if(&mut self, what: &str, path: Option<&std::path::Path>) -> &mut Self {
        match path {
            Some(p) => self.file(what, p),
            None => self,
        }
    }

    /// Declares an input the command reads (`what` names it: `evidence`, `model directory`,
    /// ...): a file, or a directory and every file under it. [`Outputs::check`] refuses an
    /// output that is one of them, by path or through a symbolic or hard link.
    pub fn input(&mut self, what: &str, path: &std::path::Path) -> &mut Self {
        self.inputs.push((what.to_string(), path.to_path_buf()));
        self
    }

    /// [`Outputs::input`] when the input was given (`None`: nothing declared).
    pub fn input_if(&mut self, what: &str, path: Option<&std::path::Path>) -> &mut Self {
        match path {
            Some(p) => self.input(what, p),
            None => self,
        }
    }

    /// Checks every planned location before anything runs: no output is an input (the same
    /// canonical path or the same file), a file must not be a directory, two outputs must not
    /// share a place, a dump directory must be new, empty or (with `--force`) an X-Ray dump
    /// holding no input, and the nearest existing ancestor of each must be a directory this
    /// process can write in (probed by creating and removing a temporary file). Missing folders
    /// below that ancestor are created when writing. The error names the option and the path.
    /// Cheap: it may be called again after more inputs are declared.
    pub fn check(&self) -> anyhow::Result<()> {
        let mut inputs: Vec<(&str, std::path::PathBuf, Place)> = Vec::new();
        for (what, p) in &self.inputs {
            if p.is_dir() {
                for f in files_under(p) {
                    let place = Place::of(&f);
                    inputs.push((what, f, place));
                }
            } else {
                inputs.push((what, p.clone(), Place::of(p)));
            }
        }
        let input_at = |place: &Place, inside: bool| {
            inputs
                .iter()
                .find(|(_, _, i)| i.same(place) || (inside && i.path.starts_with(&place.path)))
        };
        let mut seen: Vec<(&std::path::Path, Place)> = Vec::new();
        let all = self
            .files
            .iter()
            .map(|(w, p)| (w, p, false))
            .chain(self.dumps.iter().map(|(w, p, _)| (w, p, true)));
        for (what, p, dump) in all {
            let place = Place::of(p);
            if let Some((in_what, in_path, _)) = input_at(&place, dump) {
                anyhow::bail!(
                    "--{what} {}: {} the {in_what} {}, an input of this command; an output never replaces what it reads, give another path",
                    p.display(),
                    if dump { "holds" } else { "is" },
                    in_path.display()
                );
            }
            if let Some((other, _)) = seen.iter().find(|(_, s)| s.same(&place)) {
                anyhow::bail!(
                    "--{what} {}: the same path is given for two outputs ({} and {})",
                    p.display(),
                    other.display(),
                    p.display()
                );
            }
            seen.push((p, place));
        }
        for (what, p) in &self.files {
            if p.is_dir() {
                anyhow::bail!("--{what} {}: is a directory; give a file path", p.display());
            }
            writable_ancestor(what, p)?;
        }
        for (what, d, force) in &self.dumps {
            xray_core::dump::check_dump_target(d, *force)
                .map_err(|e| anyhow::anyhow!("--{what}: {e}"))?;
            writable_ancestor(what, d)?;
        }
        Ok(())
    }

    /// Writes one planned file atomically (creating missing folders); on failure records it,
    /// says so on stderr and returns false, so the next outputs are still written.
    pub fn write_file(&mut self, what: &str, path: &std::path::Path, bytes: &[u8]) -> bool {
        let r = (|| -> anyhow::Result<()> {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", parent.display()))?;
            }
            xray_compare::evidence::write_atomic(path, bytes)?;
            Ok(())
        })();
        match r {
            Ok(()) => true,
            Err(e) => self.failed(format!(
                "could not write the {what} {}: {e:#}",
                path.display()
            )),
        }
    }

    /// Records a failed write (said now, named again by [`Outputs::finish`]); false.
    fn failed(&mut self, msg: String) -> bool {
        note(&format!("xray: error: {msg}"));
        self.failed.push(msg);
        false
    }

    /// Writes a dump (see [`xray_core::dump::DumpWriter::write_to`]); on failure records it
    /// like [`Outputs::write_file`].
    pub fn write_dump(
        &mut self,
        what: &str,
        dir: &std::path::Path,
        w: &xray_core::dump::DumpWriter,
        force: bool,
    ) -> bool {
        match w.write_to(dir, force) {
            Ok(()) => true,
            Err(e) => self.failed(format!(
                "could not write the {what} dump {}: {e}",
                dir.display()
            )),
        }
    }

    /// Writes the evidence; when its path fails, saves it under the system temporary directory
    /// instead, in a file of its own (`xray-<name>-<random>.evidence.json`: two clips whose
    /// writes fail never share one), so the computed result is not lost, and says where.
    pub fn write_evidence(&mut self, path: &std::path::Path, json: &str) -> bool {
        if self.write_file("evidence", path, json.as_bytes()) {
            return true;
        }
        let name = path
            .file_name()
            .map(|f| f.to_string_lossy().to_string())
            .unwrap_or_default();
        let stem = name
            .strip_suffix(".evidence.json")
            .or_else(|| name.strip_suffix(".json"))
            .unwrap_or(&name);
        let stem: String = stem.chars().take(64).collect();
        let saved = (|| -> std::io::Result<std::path::PathBuf> {
            use std::io::Write;
            let mut t = tempfile::Builder::new()
                .prefix(&format!("xray-{stem}-"))
                .suffix(".evidence.json")
                .tempfile_in(std::env::temp_dir())?;
            t.write_all(json.as_bytes())?;
            t.as_file().sync_all()?;
            let (_, p) = t.keep().map_err(|e| e.error)?;
            Ok(p)
        })();
        match saved {
            Ok(p) => note(&format!(
                "xray: the evidence was saved to {} instead",
                p.display()
            )),
            Err(e) => note(&format!(
                "xray: error: the evidence could not be saved elsewhere either: {e}"
            )),
        }
        false
    }

    /// `Ok` when every write succeeded, else an error listing the outputs that failed (exit 2).
    pub fn finish(self) -> anyhow::Result<()> {
        if self.failed.is_empty() {
            Ok(())
        } else {
            Err(anyhow::anyhow!("{}", self.failed.join("; ")))
        }
    }
}

/// `dir` (or, when it does not exist yet, its nearest existing ancestor) must be a directory
/// this process can create files in: checked before anything runs for a directory written into
/// later (`--reference-cache`, which only an xray with the oracle writes to).
#[cfg(feature = "oracle")]
pub fn writable_dir(what: &str, dir: &std::path::Path) -> anyhow::Result<()> {
    if dir.exists() && !dir.is_dir() {
        anyhow::bail!("--{what} {}: exists and is not a directory", dir.display());
    }
    writable_ancestor(what, &dir.join(".xray-probe"))
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().replace("/.xray-probe", "")))
}

/// The nearest existing ancestor of `p` must be a directory this process can create files in.
fn writable_ancestor(what: &str, p: &std::path::Path) -> anyhow::Result<()> {
    let mut a = p.parent();
    loop {
        let dir = match a {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {
                return tempfile::Builder::new()
                    .prefix(".xray-probe-")
                    .tempfile_in(dir)
                    .map(drop)
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "--{what} {}: cannot create files in {}: {e}",
                            p.display(),
                            dir.display()
                        )
                    });
            }
            Ok(_) => anyhow::bail!(
                "--{what} {}: {} is not a directory",
                p.display(),
                dir.display()
            ),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) && dir != std::path::Path::new(".") =>
            {
                a = dir.parent()
            }
            Err(e) => anyhow::bail!("--{what} {}: {}: {e}", p.display(), dir.display()),
        }
    }
}

/// Each `--only` pattern must select at least one checkpoint of the contract: a glob over the
/// expanded names, or (`templates`) an exact name or contract template (the oracle's spelling).
/// Checked before anything runs; the error names the pattern and some valid names.
pub fn check_only(
    patterns: &[String],
    contract: &xray_core::contract::Contract,
    templates: bool,
) -> anyhow::Result<()> {
    for pat in patterns {
        let hit = if templates {
            contract
                .checkpoints
                .iter()
                .any(|c| &c.name == pat || &c.template == pat)
        } else {
            let g = globset::Glob::new(pat)
                .map_err(|e| anyhow::anyhow!("--only '{pat}': {e}"))?
                .compile_matcher();
            contract.checkpoints.iter().any(|c| g.is_match(&c.name))
        };
        if !hit {
            let some: Vec<&str> = contract
                .checkpoints
                .iter()
                .take(3)
                .map(|c| c.name.as_str())
                .collect();
            anyhow::bail!(
                "--only '{pat}' matches no checkpoint of the {} contract (e.g. {}; `xray list --model DIR` lists them{})",
                contract.family,
                some.join(", "),
                if templates { "; the oracle takes exact names or templates such as audio.decoder.layer.{layer}.out" } else { "" }
            );
        }
    }
    Ok(())
}

/// `--model DIR --audio WAV`: the model and the clip of a one-clip command (`xray run`, `xray
/// oracle`, `xray bench`), flattened into its arguments.
#[derive(Debug, clap::Args)]
pub struct Clip {
    /// HF model directory.
    #[arg(long, value_name = "DIR")]
    pub model: std::path::PathBuf,
    /// WAV file (any common rate, mono or stereo: converted once to 16 kHz mono for both engines).
    #[arg(long, value_name = "WAV")]
    pub audio: std::path::PathBuf,
}

/// `--model DIR --audio WAV --out DIR [--force] [--ops]`: a one-clip run written as a dump
/// (`xray run`, `xray oracle`).
#[derive(Debug, clap::Args)]
pub struct ClipDump {
    #[command(flatten)]
    pub clip: Clip,
    /// Dump directory to write (atomically): new or empty, or an existing X-Ray dump with --force.
    #[arg(long, value_name = "DIR")]
    pub out: std::path::PathBuf,
    /// Replace an existing X-Ray dump at --out (only a directory holding nothing but a dump).
    #[arg(long)]
    pub force: bool,
    /// Also capture every op-level point (`{hf_module}:in` / `:out`, docs/dump-format.md).
    #[arg(long)]
    pub ops: bool,
}

impl ClipDump {
    /// Writes `w` to --out and finishes `outputs` (every planned output named on failure), then
    /// says how many `entries` (`checkpoints`, `checkpoint summaries`) went where and prints
    /// the transcript on stdout.
    pub fn write(
        &self,
        mut outputs: Outputs,
        w: &xray_core::dump::DumpWriter,
        entries: &str,
        transcript: &str,
    ) -> anyhow::Result<ExitCode> {
        outputs.write_dump("out", &self.out, w, self.force);
        outputs.finish()?;
        note(&format!(
            "xray: {} {entries} -> {}",
            w.manifest.checkpoints.len(),
            self.out.display()
        ));
        say(&format!("{transcript}\n"))?;
        Ok(ExitCode::SUCCESS)
    }
}

/// `--max-steps N`: the cap on generated tokens of a command that runs a model.
#[derive(Debug, clap::Args)]
pub struct MaxSteps {
    /// Cap on generated tokens (at least 1).
    #[arg(long, value_name = "N", value_parser = positive)]
    pub max_steps: Option<usize>,
}

/// `--report FILE.html --markdown FILE.md --json`: the renderings of a command's evidence (`xray
/// check`, `xray compare`).
#[derive(Debug, clap::Args)]
pub struct Renderings {
    /// Write the self-contained HTML report here.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<std::path::PathBuf>,
    /// Write the Markdown summary here.
    #[arg(long, value_name = "FILE.md")]
    pub markdown: Option<std::path::PathBuf>,
    /// Print the evidence JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// A rendering of the evidence (HTML report, Markdown summary).
type Render = fn(&xray_compare::evidence::Evidence) -> String;

impl Renderings {
    /// Plans the renderings asked for among `outputs` (checked before anything runs).
    pub fn plan(&self, outputs: &mut Outputs) {
        for (what, p, _) in self.asked() {
            outputs.file(what, p);
        }
    }

    /// Writes the renderings of `ev` asked for (a failed write recorded in `outputs`).
    pub fn write(&self, outputs: &mut Outputs, ev: &xray_compare::evidence::Evidence) {
        for (what, p, render) in self.asked() {
            outputs.write_file(what, p, render(ev).as_bytes());
        }
    }

    /// `(what, path, renderer)` of each rendering asked for, the report first.
    fn asked(&self) -> impl Iterator<Item = (&'static str, &std::path::Path, Render)> {
        [
            ("report", &self.report, xray_compare::report::html as Render),
            ("markdown", &self.markdown, xray_compare::report::markdown),
        ]
        .into_iter()
        .filter_map(|(what, p, render)| Some((what, p.as_deref()?, render)))
    }
}

/// clap value parser for counts that must be at least 1 (`--max-steps`, `--threads`).
pub fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a positive integer: {e}")),
    }
}

/// `xray: corpus: 33 clips: 33 pass; token mismatches 0; worst margin 0.47 (...)`.
pub fn corpus_line(s: &xray_compare::corpus::Summary) -> String {
    let verdicts: Vec<String> = s
        .counts
        .verdicts
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect();
    let mut line = format!(
        "xray: corpus: {} clips: {}; token mismatches {}",
        s.counts.clips,
        verdicts.join(", "),
        s.counts.token_mismatches
    );
    if let Some(w) = &s.worst {
        line.push_str(&format!(
            "; worst margin {:.3} ({} at {} on {})",
            w.margin.margin, w.margin.criterion, w.margin.checkpoint, w.clip
        ));
    }
    line
}

/// 0 when every clip passed, 2 when any could not be checked (or there are none), else 1.
pub fn corpus_exit(s: &xray_compare::corpus::Summary) -> ExitCode {
    if s.clips.is_empty()
        || s.clips
            .iter()
            .any(|c| c.verdict == xray_compare::evidence::Verdict::Error)
    {
        exit_usage()
    } else if s.all_pass() {
        ExitCode::SUCCESS
    } else {
        exit_fail()
    }
}
