//! `xray check --model DIR --audio WAV`: runtime + oracle + compare in one process (built
//! without the oracle: the reference from `--reference-cache` only).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use xray_compare::corpus;
use xray_compare::evidence::{Evidence, Run, Verdict};
use xray_compare::tolerance::Policy;
use xray_harness::check::{check, check_corpus, CheckOptions, RecordedOptions};

/// Arguments of `xray check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// HF model directory (config.json, model.safetensors, tokenizer.json, ...).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// WAV file (any common rate, mono or stereo: converted once to 16 kHz mono for both engines).
    /// Several files, or a directory of WAVs, run a corpus in one process (needs --evidence-dir).
    #[arg(long, value_name = "WAV", num_args = 1.., required = true)]
    pub audio: Vec<PathBuf>,
    /// Corpus mode: one evidence file per clip here, plus summary.json and summary.md (a new or
    /// empty directory, or one holding only X-Ray's corpus files, recognized by content,
    /// replaced with --force).
    #[arg(long, value_name = "DIR")]
    pub evidence_dir: Option<PathBuf>,
    /// Corpus mode: run only shard K of N (1-based; clips sorted by path, every N-th from the
    /// K-th), so a CI matrix or a job array splits a corpus; `xray summarize` merges the shards.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<String>,
    /// Write the evidence JSON here (default: reports/<model>.<audio>.evidence.json).
    #[arg(long, value_name = "FILE")]
    pub evidence: Option<PathBuf>,
    #[command(flatten)]
    pub renderings: super::Renderings,
    /// Tolerance policy (JSON; docs/tolerances.md).
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    #[command(flatten)]
    pub steps: super::MaxSteps,
    /// Also measure each checkpoint's local error with the reference substituted upstream.
    #[arg(long)]
    pub isolate: bool,
    /// Gate at a multiple of each checkpoint's noise floor (oracle f32 vs f64).
    #[arg(long)]
    pub calibrate: bool,
    /// Feed the reference's CTC hypothesis to the runtime (non-autoregressive families).
    #[arg(long)]
    pub teacher_force: bool,
    /// Plant a deliberate fault (see `xray faults`): NAME or NAME@TARGET. Repeatable.
    #[arg(long, value_name = "FAULT")]
    pub inject: Vec<String>,
    /// Also write both dumps under this directory (reference/, runtime/; each new, empty, or an
    /// X-Ray dump replaced with --force).
    #[arg(long, value_name = "DIR")]
    pub dumps: Option<PathBuf>,
    /// Replace existing X-Ray dumps under --dumps, or an earlier (or unfinished) corpus run
    /// under --evidence-dir (its evidence this run does not rewrite is removed).
    #[arg(long)]
    pub force: bool,
    /// Corpus mode: continue an earlier run in --evidence-dir (killed, or with clips that could
    /// not be checked): a clip whose evidence there is valid and of this run (family, contract,
    /// weights and audio, as `xray gate` identifies evidence, and the same policy and options)
    /// is kept, the others are checked; evidence of another run is refused (exit 2).
    #[arg(long)]
    pub resume: bool,
    /// Read the reference from this directory when it holds one under the check's content key
    /// (weights, model files, audio samples, resolved contract, oracle code, torch and
    /// transformers versions, dtype, op points, max steps, ...), else compute it and store it
    /// there: a check whose references are cached runs without the oracle (no torch import).
    /// An xray built without the oracle needs it and refuses a miss (docs/reference-cache.md).
    #[arg(long, value_name = "DIR")]
    pub reference_cache: Option<PathBuf>,
    /// torch threads for the oracle (default 1: deterministic and immune to oversubscription).
    #[arg(long, value_parser = super::positive)]
    pub threads: Option<usize>,
    /// Capture every op-level point on both sides from the start (`{hf_module}:in` / `:out`).
    #[arg(long)]
    pub ops: bool,
    /// Stop at the origin checkpoint: no re-run capturing the op-level points of its region.
    #[arg(long)]
    pub no_drill: bool,
    /// Also run a reference variant, the HF model with its weights on a named grid (`int8`:
    /// per-row symmetric, as CTranslate2 quantizes; `int8_conv`, `int8_w8a8`, `f16`, `bf16`), and
    /// measure the runtime against both references (`reference_variants` in the evidence: how much
    /// of a divergence the grid explains). Repeatable. Whisper.
    #[arg(long, value_name = "SCHEME", value_parser = ["int8", "int8_conv", "int8_w8a8", "f16", "bf16"])]
    pub reference_variant: Vec<String>,
    /// Keep per-checkpoint summaries (moments, order-sensitive sketch, content hash) instead of
    /// tensors on both sides, for models whose full capture does not fit in memory; checkpoints
    /// are judged by their estimated rel_l2. Not with --isolate, --calibrate or --ops; --dumps
    /// writes stats-only dumps.
    #[arg(long)]
    pub stats_only: bool,
}

/// Runs the check. Exit 0 pass, 1 divergence, 2 input error.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    #[cfg(not(feature = "oracle"))]
    if a.reference_cache.is_none() {
        anyhow::bail!("{}", xray_harness::check::NEEDS_CACHE);
    }
    if let Some(c) = &a.reference_cache {
        // A reference the oracle computes is stored there: checked before anything runs (an
        // xray without the oracle only reads it).
        #[cfg(feature = "oracle")]
        super::writable_dir("reference-cache", c)?;
        // The cache is written into: never the model directory or inside it.
        let (c, m) = (corpus::canonical_path(c), corpus::canonical_path(&a.model));
        if c.starts_with(&m) {
            anyhow::bail!(
                "--reference-cache {}: is inside the model directory {}, an input of this command; give another directory",
                c.display(),
                m.display()
            );
        }
    }
    let corpus = a.audio.len() > 1
        || a.audio.iter().any(|p| p.is_dir())
        || a.evidence_dir.is_some()
        || a.shard.is_some();
    if a.resume && !corpus {
        anyhow::bail!(
            "--resume continues a corpus run: give --evidence-dir DIR (the run's directory)"
        );
    }
    if corpus {
        return run_corpus(a);
    }
    let audio = a.audio[0].clone();
    let evidence_path = a
        .evidence
        .clone()
        .unwrap_or_else(|| default_evidence_path(&a));
    // Every output location is checked before anything runs.
    let mut outputs = super::Outputs::default();
    outputs.file("evidence", &evidence_path);
    a.renderings.plan(&mut outputs);
    if let Some(d) = &a.dumps {
        if d.exists() && !d.is_dir() {
            anyhow::bail!("--dumps {}: exists and is not a directory", d.display());
        }
        outputs.dump("dumps", &d.join("reference"), a.force);
        outputs.dump("dumps", &d.join("runtime"), a.force);
    }
    plan_inputs(&mut outputs, &a, &a.audio);
    outputs.check()?;
    let opts = check_options(&a, audio)?;
    let t0 = std::time::Instant::now();
    let mut out = check(&opts, &|m| {
        super::note(&format!("xray: {m} [{:.1}s]", t0.elapsed().as_secs_f64()))
    })?;
    if let Some(d) = &a.dumps {
        // Where `xray repro` finds the tensors of this run.
        out.evidence.run.dumps = Some(xray_compare::evidence::RunDumps {
            got_weights_sha256: None,
            reference: super::absolute(&d.join("reference")),
            got: super::absolute(&d.join("runtime")),
        });
    }
    let ev = &out.evidence;
    // The evidence first, then the reports, then the dumps; a failed write does not stop the rest.
    outputs.write_evidence(&evidence_path, &ev.to_json()?);
    a.renderings.write(&mut outputs, ev);
    if let Some(d) = &a.dumps {
        outputs.write_dump(
            "dumps",
            &d.join("reference"),
            &out.reference.to_writer(),
            a.force,
        );
        outputs.write_dump(
            "dumps",
            &d.join("runtime"),
            &out.runtime.to_writer(),
            a.force,
        );
    }
    if a.renderings.json {
        super::say(&ev.to_json()?)?;
    }
    super::note(&super::summary(ev));
    super::note(&format!("xray: evidence {}", evidence_path.display()));
    if let Some(b) = super::peak_rss_bytes() {
        // Both models and the oracle live in this process: the whole check's footprint.
        super::note(&format!("xray: peak RSS {:.0} MB (VmHWM)", b as f64 / 1e6));
    }
    if let Some(p) = &a.renderings.report {
        super::note(&format!("xray: report {}", p.display()));
    }
    outputs.finish()?;
    Ok(match ev.verdict {
        Verdict::Pass => ExitCode::SUCCESS,
        _ => super::exit_fail(),
    })
}

/// The check's options for `audio` (a corpus sets each clip's): the policy loaded and the
/// faults planned (after the outputs are checked).
fn check_options(a: &Args, audio: PathBuf) -> anyhow::Result<CheckOptions> {
    let policy = match &a.policy {
        Some(p) => Policy::load(p)?,
        None => Policy::default(),
    };
    let (faults, fault_names) = super::faults::plan(&a.inject, &a.model)?;
    Ok(CheckOptions {
        model: a.model.clone(),
        audio,
        policy,
        isolate: a.isolate,
        stats_only: a.stats_only,
        recorded: RecordedOptions {
            max_steps: a.steps.max_steps,
            calibrate: a.calibrate,
            teacher_force: a.teacher_force,
            ops: a.ops,
            drill: !a.no_drill,
            faults: fault_names,
            reference_variants: a.reference_variant.clone(),
            threads: Some(a.threads.unwrap_or(1)),
        },
        faults,
        warmup_audio: None,
        reference_cache: a.reference_cache.clone(),
    })
}

/// The files a check reads: the model directory, the audio and the policy (no output may be one).
fn plan_inputs(outputs: &mut super::Outputs, a: &Args, clips: &[PathBuf]) {
    outputs.input("model directory", &a.model);
    for c in clips {
        outputs.input("audio", c);
    }
    outputs.input_if("policy", a.policy.as_deref());
}

/// `reports/<model>.<audio>.evidence.json` (the `reports/` folder is created when writing).
fn default_evidence_path(a: &Args) -> PathBuf {
    let name = |p: Option<&std::ffi::OsStr>| {
        p.map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default()
    };
    PathBuf::from("reports").join(format!(
        "{}.{}.evidence.json",
        name(a.model.file_name()),
        name(a.audio[0].file_stem())
    ))
}

/// The clips of a corpus: files as given, directories expanded to their `*.wav` files (sorted),
/// then the shard. Every clip must decode (checked before anything runs) and have a distinct
/// file stem (it names the clip's evidence file).
fn corpus_clips(a: &Args) -> anyhow::Result<Vec<PathBuf>> {
    let mut clips = Vec::new();
    for p in &a.audio {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = Vec::new();
            for e in
                std::fs::read_dir(p).map_err(|e| anyhow::anyhow!("--audio {}: {e}", p.display()))?
            {
                let f = e
                    .map_err(|e| anyhow::anyhow!("--audio {}: {e}", p.display()))?
                    .path();
                if !f.extension().is_some_and(|x| x.eq_ignore_ascii_case("wav")) {
                    continue;
                }
                // A .wav entry that is not a readable regular file is refused by name, never
                // skipped: a dangling link or a link loop would otherwise shrink the corpus.
                match std::fs::metadata(&f) {
                    Ok(m) if m.is_file() => found.push(f),
                    Ok(_) => anyhow::bail!(
                        "--audio {}: not a regular file; a clip must be a .wav file",
                        f.display()
                    ),
                    Err(e) => {
                        let link = std::fs::read_link(&f).ok();
                        anyhow::bail!(
                            "--audio {}: {}",
                            f.display(),
                            match link {
                                Some(t) if e.kind() == std::io::ErrorKind::NotFound => format!(
                                    "a dangling symbolic link (its target {} does not exist)",
                                    t.display()
                                ),
                                Some(_) => format!("a symbolic link that cannot be followed ({e})"),
                                None => e.to_string(),
                            }
                        )
                    }
                }
            }
            if found.is_empty() {
                anyhow::bail!("--audio {}: the directory has no .wav files", p.display());
            }
            found.sort();
            clips.extend(found);
        } else {
            clips.push(p.clone());
        }
    }
    if let Some(s) = &a.shard {
        let (k, n) = corpus::parse_shard(s).map_err(|e| anyhow::anyhow!("--shard: {e}"))?;
        clips = corpus::shard(&clips, k, n);
        if clips.is_empty() {
            anyhow::bail!("--shard {s}: this shard has no clips");
        }
    }
    let mut stems = std::collections::BTreeMap::new();
    for c in &clips {
        let stem = clip_stem(c);
        if let Some(other) = stems.insert(stem.clone(), c.clone()) {
            anyhow::bail!(
                "--audio: {} and {} would both write {stem}.evidence.json; rename one",
                other.display(),
                c.display()
            );
        }
        xray_runtime::audio::load_wav(c, 16000)?;
    }
    Ok(clips)
}

fn clip_stem(p: &std::path::Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default()
}

/// The X-Ray evidence files an existing `--evidence-dir` holds.
///
/// The directory must be new, empty, or (with --force) an earlier corpus directory: every entry
/// recognized by content as X-Ray's own (`summary.json` of the corpus-summary schema,
/// `summary.md` of its rendering, `*.evidence.json` of the evidence schema; leftovers of an
/// interrupted atomic write, `.xray-*.tmp`, are left alone). A run killed before its summary
/// (no `summary.json`, evidence files only) is X-Ray's too. Anything else is named and refused,
/// with or without --force: X-Ray never replaces what it did not write.
fn check_corpus_dir(dir: &std::path::Path, force: bool) -> anyhow::Result<Vec<PathBuf>> {
    if !dir.exists() && dir.symlink_metadata().is_err() {
        return Ok(vec![]);
    }
    if !dir.is_dir() {
        anyhow::bail!(
            "--evidence-dir {}: exists and is not a directory",
            dir.display()
        );
    }
    let mut evidence = Vec::new();
    let mut summary = false;
    let mut any = false;
    for e in std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("--evidence-dir {}: {e}", dir.display()))?
    {
        let e = e.map_err(|e| anyhow::anyhow!("--evidence-dir {}: {e}", dir.display()))?;
        let (path, name) = (e.path(), e.file_name().to_string_lossy().to_string());
        if name.starts_with(".xray-") && name.ends_with(".tmp") {
            continue;
        }
        any = true;
        let regular = e.file_type().is_ok_and(|t| t.is_file());
        let ours = regular
            && match name.as_str() {
                "summary.json" => {
                    summary = json_schema_is(&path, corpus::SUMMARY_SCHEMA);
                    summary
                }
                "summary.md" => {
                    std::fs::read(&path).is_ok_and(|b| b.starts_with(b"# X-Ray corpus: "))
                }
                n if n.ends_with(".evidence.json") => {
                    let ok = json_schema_is(&path, xray_compare::evidence::SCHEMA);
                    if ok {
                        evidence.push(path.clone());
                    }
                    ok
                }
                _ => false,
            };
        if !ours {
            anyhow::bail!(
                "--evidence-dir {}: holds {name}, which is not an output of X-Ray (recognized by content); X-Ray replaces only its own files: move it away or give a new or empty directory",
                dir.display()
            );
        }
    }
    if any && !force {
        anyhow::bail!(
            "--evidence-dir {}: holds an earlier corpus run ({}{} evidence file(s)); pass --force to replace it",
            dir.display(),
            if summary { "summary.json, " } else { "unfinished: no summary.json, " },
            evidence.len()
        );
    }
    Ok(evidence)
}

/// Whether `path` is a JSON object whose `schema` is `schema` (the whole file parsed).
fn json_schema_is(path: &std::path::Path, schema: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Marker {
        schema: String,
    }
    std::fs::File::open(path)
        .ok()
        .and_then(|f| serde_json::from_reader::<_, Marker>(std::io::BufReader::new(f)).ok())
        .is_some_and(|m| m.schema == schema)
}

/// Corpus mode: one process, every clip, one evidence file each, summary.json; exit 1 if any
/// clip diverges, 2 if any could not be checked.
fn run_corpus(a: Args) -> anyhow::Result<ExitCode> {
    let Some(dir) = a.evidence_dir.clone() else {
        anyhow::bail!("several clips (or a directory) need --evidence-dir DIR: one evidence file per clip and summary.json are written there");
    };
    for (given, flag) in [
        (a.evidence.is_some(), "--evidence"),
        (a.renderings.report.is_some(), "--report"),
        (a.renderings.markdown.is_some(), "--markdown"),
        (a.dumps.is_some(), "--dumps"),
        (a.renderings.json, "--json"),
    ] {
        if given {
            anyhow::bail!("{flag} is for one clip; a corpus writes DIR/<clip>.evidence.json and DIR/summary.json|md");
        }
    }
    if a.resume && a.force {
        anyhow::bail!("--resume keeps an earlier run's valid evidence and --force replaces the run: give one of them");
    }
    let earlier = check_corpus_dir(&dir, a.force || a.resume)?;
    let clips = corpus_clips(&a)?;
    let resumed = if a.resume {
        Resume::read(&dir, &clips, &earlier)?
    } else {
        Resume::default()
    };
    // Every output of the run, each clip's evidence included, is checked before it starts.
    let mut outputs = super::Outputs::default();
    outputs.file("evidence-dir", &dir.join("summary.json"));
    outputs.file("evidence-dir", &dir.join("summary.md"));
    for c in &clips {
        outputs.file(
            "evidence-dir",
            &dir.join(format!("{}.evidence.json", clip_stem(c))),
        );
    }
    plan_inputs(&mut outputs, &a, &clips);
    outputs.check()?;
    let opts = check_options(&a, PathBuf::new())?;
    let t0 = std::time::Instant::now();
    let progress =
        |m: &str| super::note(&format!("xray: {m} [{:.1}s]", t0.elapsed().as_secs_f64()));
    let mut rows = Vec::new();
    let mut written: Vec<PathBuf> = Vec::new();
    let keep = |clip: &Path, planned: &Run| resumed.keep(&dir, clip, planned);
    let load = check_corpus(
        &opts,
        &clips,
        &progress,
        a.resume.then_some(&keep as &xray_harness::check::ClipKeep),
        &mut |clip, r, secs| {
            let shown = clip.display().to_string();
            let name = format!("{}.evidence.json", clip_stem(clip));
            let row = match r {
                Ok(None) => match resumed.evidence.get(&dir.join(&name)) {
                    Some(e) => {
                        written.push(dir.join(&name));
                        corpus::ClipSummary {
                            resumed: true,
                            ..corpus::ClipSummary::of(
                                &shown,
                                &name,
                                e,
                                resumed.seconds.get(&name).copied().unwrap_or(0.0),
                            )
                        }
                    }
                    None => corpus::ClipSummary::failed(
                        &shown,
                        &format!("kept by --resume, but {name} was not read"),
                        secs,
                    ),
                },
                Ok(Some(out)) => {
                    if outputs.write_evidence(&dir.join(&name), &out.evidence.to_json()?) {
                        written.push(dir.join(&name));
                        corpus::ClipSummary::of(&shown, &name, &out.evidence, secs)
                    } else {
                        // The summary never names a file that does not hold this run's evidence.
                        corpus::ClipSummary::failed(
                            &shown,
                            &format!(
                                "its evidence (verdict {}) could not be written to {}",
                                out.evidence.effective_verdict().as_str(),
                                dir.join(&name).display()
                            ),
                            secs,
                        )
                    }
                }
                Err(e) => corpus::ClipSummary::failed(&shown, &format!("{e:#}"), secs),
            };
            super::note(&format!(
                "xray:   {} {}{}{}",
                row.verdict.as_str(),
                shown,
                row.origin
                    .as_deref()
                    .or(row.error.as_deref())
                    .map(|o| format!(" ({o})"))
                    .unwrap_or_default(),
                if row.resumed {
                    " (kept: earlier evidence)"
                } else {
                    ""
                }
            ));
            rows.push(row);
            Ok(())
        },
    )?;
    let summary = corpus::Summary::new(
        &a.model.display().to_string(),
        a.shard.clone(),
        Some(load),
        rows,
    );
    outputs.write_file(
        "evidence-dir",
        &dir.join("summary.md"),
        summary.markdown().as_bytes(),
    );
    outputs.write_file(
        "evidence-dir",
        &dir.join("summary.json"),
        format!("{}\n", serde_json::to_string_pretty(&summary)?).as_bytes(),
    );
    // The earlier run's evidence this run did not replace (clips no longer in the corpus, or
    // that could not be checked now) would sit beside a summary that does not list it: removed,
    // if it is still X-Ray's evidence.
    let stale: Vec<&PathBuf> = earlier
        .iter()
        .filter(|p| !written.contains(p) && json_schema_is(p, xray_compare::evidence::SCHEMA))
        .collect();
    let mut removed = Vec::new();
    for p in stale {
        match std::fs::remove_file(p) {
            Ok(()) => removed.push(
                p.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .to_string(),
            ),
            Err(e) => super::note(&format!(
                "xray: error: could not remove {} of the earlier run: {e}",
                p.display()
            )),
        }
    }
    if !removed.is_empty() {
        super::note(&format!(
            "xray: removed the earlier run's evidence not in this one: {}",
            removed.join(", ")
        ));
    }
    super::note(&super::corpus_line(&summary));
    super::note(&format!(
        "xray: summary {}",
        dir.join("summary.json").display()
    ));
    outputs.finish()?;
    Ok(super::corpus_exit(&summary))
}

/// What `--resume` reads of the earlier run before anything runs: each clip's evidence that
/// loads (schema, verdict consistent with its checkpoints: `Evidence::load`), and the seconds
/// its summary recorded, when the run got that far.
#[derive(Default)]
struct Resume {
    evidence: HashMap<PathBuf, Evidence>,
    seconds: HashMap<String, f64>,
}

impl Resume {
    /// The earlier run in `dir`, whose evidence files are `earlier` (X-Ray's, by content). An
    /// evidence file of a clip not in `clips` is refused (another corpus or shard: keeping it
    /// would mix runs, removing it would lose it); one that does not load is checked again.
    fn read(dir: &Path, clips: &[PathBuf], earlier: &[PathBuf]) -> anyhow::Result<Resume> {
        let ours: Vec<PathBuf> = clips
            .iter()
            .map(|c| dir.join(format!("{}.evidence.json", clip_stem(c))))
            .collect();
        if let Some(stray) = earlier.iter().find(|p| !ours.contains(p)) {
            anyhow::bail!(
                "--resume: {} is the evidence of a clip this corpus does not have (another corpus or shard?): give the same clips, a new directory, or --force to replace the run",
                stray.display()
            );
        }
        let mut r = Resume::default();
        for p in earlier {
            match Evidence::load(p) {
                Ok(e) => {
                    r.evidence.insert(p.clone(), e);
                }
                Err(e) => super::note(&format!("xray: --resume: {e}; its clip is checked again")),
            }
        }
        let sp = dir.join("summary.json");
        if let Ok(text) = std::fs::read_to_string(&sp) {
            if let Ok(s) = corpus::Summary::from_json(&text, &sp.display().to_string()) {
                r.seconds = s
                    .clips
                    .into_iter()
                    .filter(|c| !c.evidence.is_empty())
                    .map(|c| (c.evidence, c.seconds))
                    .collect();
            }
        }
        Ok(r)
    }

    /// Whether `clip`'s earlier evidence is kept: it loaded, and it is evidence of the run
    /// `planned` describes (`xray_compare::gate::run_differences`: the gate's identity, then the
    /// policy and options); evidence of another run is an error naming the file.
    fn keep(&self, dir: &Path, clip: &Path, planned: &Run) -> anyhow::Result<bool> {
        let p = dir.join(format!("{}.evidence.json", clip_stem(clip)));
        let Some(e) = self.evidence.get(&p) else {
            return Ok(false);
        };
        let why = xray_compare::gate::run_differences(planned, &e.run);
        if why.is_empty() {
            return Ok(true);
        }
        anyhow::bail!(
            "--resume: {} is evidence of another run ({}); a corpus directory holds one model, contract, policy and set of options: give the same ones, a new directory, or --force to replace the run",
            p.display(),
            why.join("; ")
        )
    }
}
