//! `xray check`: runtime + oracle + compare in one process, the main job.
//!
//! 1. The HF reference runs (oracle, f32) and captures every contract checkpoint.
//! 2. The runtime runs with capture on, teacher-forced on the reference's tokens (tokens are feeds),
//!    so every decode step is comparable; its own greedy choice at each step is recorded.
//! 3. The runtime runs again with capture off: final outputs must be bit-identical (capture
//!    neutrality, a failure of its own otherwise).
//! 4. If its greedy choices departed from the reference, a free-running run gives its transcript.
//! 5. Optional: isolated mode (reference substituted at every checkpoint edge) and calibrated
//!    tolerances (oracle in f64 as the noise-floor reference).
//! 6. Compare through the family's contract, localize, explain, write evidence.
//! 7. Drill-down (unless `--no-drill`): when more than one runtime op lies between the origin's
//!    passing inputs and the origin, both engines re-run capturing only the op-level points of
//!    that region (`xray_core::ops`), and `first_divergence.op` names the first that differs.
//!
//! With `stats_only` both engines summarize each checkpoint as it is produced (`Stats::of`: the
//! moments and the order-sensitive sketch, and the content sha256; the oracle calls the same Rust
//! function through pyo3) and keep no tensor, so the peak memory is the two models plus one
//! step's activations; the comparison is `compare_stats_dumps` (each checkpoint judged by its
//! estimated rel_l2), localized along the same graph. Isolated mode, calibration and `--ops` need
//! full tensors and are refused; the drill-down still runs (it captures only the origin region's
//! op-level points, in full).
//!
//! Every reference a check reads (its own, the f64 calibration run, reference variants, the
//! drill-down's points) comes through [`References`]: from the reference cache when one is given
//! (`--reference-cache`, [`crate::refcache`]), else from the oracle, which is discovered and
//! started only on the first reference the cache does not hold. A check whose references are
//! all cached never starts Python; one that diverges starts it to replay the origin op (replay
//! re-runs an HF module on the runtime's own tensors, which no cache holds), and an `xray` built
//! without the oracle notes that replay did not run. Without the oracle, a miss is an error.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
/// The options a check records in its evidence, a part of [`CheckOptions`].
pub use xray_compare::evidence::RecordedOptions;
use xray_compare::evidence::{CacheLookup, CheckSettings, ReferenceCache};
use xray_core::dump::Dump;
use xray_core::reference::OracleRequest;
#[cfg(feature = "oracle")]
use xray_oracle::{Oracle, OracleRun};
use xray_runtime::audio::{load_wav, Audio};
use xray_runtime::faults::FaultPlan;
use xray_runtime::models::{self, Alignment, RunOptions, SpeechModel};

use xray_compare::align::to_canonical;
use xray_compare::compare::CompareOptions;
use xray_compare::compare::{compare_dumps, compare_stats_dumps, oracle_versions};
use xray_compare::evidence::{DivergenceKind, Evidence, FirstDivergence, Run, Transcript};
use xray_compare::localize::Status;
use xray_compare::metrics::compare as metrics_compare;
use xray_compare::ops::{compare_points, has_points, localize_op};
use xray_compare::tolerance::{NoiseFloor, Policy, Tolerance};
use xray_core::ops::{PointNode, PointSelect};
use xray_core::Step;

pub use crate::runs::{runtime_dump, runtime_stats_dump_audio, Capture, DumpSubstitute};
use crate::runs::{runtime_side, RuntimeSide};

/// Options of one check.
#[derive(Debug, Clone, Default)]
pub struct CheckOptions {
    /// HF model directory.
    pub model: PathBuf,
    /// 16 kHz mono WAV.
    pub audio: PathBuf,
    /// Tolerance policy.
    pub policy: Policy,
    /// Also run isolated mode.
    pub isolate: bool,
    /// Summaries instead of tensors on both sides (`--stats-only`, module docs).
    pub stats_only: bool,
    /// The options the evidence records as `run.settings` (steps, calibration, teacher forcing,
    /// op-level points, drill-down, fault names, reference variants, torch threads).
    pub recorded: RecordedOptions,
    /// The faults to plant in the runtime (`recorded.faults` names them).
    pub faults: FaultPlan,
    /// A second input to run first (stale-cache faults show only on the second input).
    pub warmup_audio: Option<PathBuf>,
    /// Read references from this cache and store the ones the oracle computes there
    /// (`--reference-cache`, [`crate::refcache`]).
    pub reference_cache: Option<PathBuf>,
}

/// Everything a check produced.
pub struct CheckOutput {
    /// The evidence.
    pub evidence: Evidence,
    /// The reference dump (in memory).
    pub reference: Dump,
    /// The runtime dump (in memory).
    pub runtime: Dump,
}

/// The reference run as an in-memory dump (stats-only when the run was: its summaries).
#[cfg(feature = "oracle")]
pub fn reference_dump(run: &OracleRun, family: &str, model_id: &str) -> Dump {
    let m = xray_core::dump::Manifest {
        schema: xray_core::dump::SCHEMA.into(),
        version: xray_core::dump::VERSION,
        family: family.into(),
        model_id: model_id.into(),
        producer: "oracle".into(),
        weights_sha256: run.weights_sha256.clone(),
        audio_sha256: run.audio_sha256.clone(),
        tools: run.tools.clone(),
        tokens: run.tokens.clone(),
        transcript: run.transcript.clone(),
        stats_only: false,
        checkpoints: vec![],
        extra: run.extra.clone(),
        engine_weights: None,
    };
    if !run.summaries.is_empty() {
        return Dump::stats_only(xray_core::dump::Manifest {
            checkpoints: run.summaries.clone(),
            ..m
        });
    }
    Dump::from_captured(m, run.checkpoints.clone())
}

/// Options a stats-only check cannot honour, refused before anything runs (one line each).
fn check_stats_only(opts: &CheckOptions, family: &str) -> anyhow::Result<()> {
    if !opts.stats_only {
        return Ok(());
    }
    for (given, flag, why) in [
        (
            opts.isolate,
            "--isolate",
            "substitutes the reference's tensors",
        ),
        (
            opts.recorded.calibrate,
            "--calibrate",
            "measures the f32-vs-f64 noise floor on full tensors",
        ),
        (
            opts.recorded.ops,
            "--ops",
            "captures op-level points in full",
        ),
        (
            !opts.recorded.reference_variants.is_empty(),
            "--reference-variant",
            "compares full tensors with a second reference",
        ),
    ] {
        if given {
            anyhow::bail!("--stats-only keeps no tensors and {flag} {why}: drop one of them");
        }
    }
    if !xray_core::family::descriptor(family)?
        .capabilities
        .stats_only
    {
        let with: Vec<&str> = xray_core::family::descriptors()?
            .iter()
            .filter(|d| d.capabilities.stats_only)
            .map(|d| d.family.as_str())
            .collect();
        anyhow::bail!("--stats-only is implemented for {}; a {family} model is checked with full capture (drop --stats-only)", with.join(", "));
    }
    Ok(())
}

/// Loads the runtime model and checks what can be checked before any run: policy rules that
/// name no checkpoint, faults that would plant nothing.
fn load_checked(
    opts: &CheckOptions,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Box<dyn SpeechModel>> {
    progress(&format!("loading runtime model {}", opts.model.display()));
    let model = models::load(&opts.model)?;
    opts.policy.check_rules_match(
        model
            .contract()
            .checkpoints
            .iter()
            .map(|c| (c.name.as_str(), None)),
    )?;
    opts.faults.validate(model.graph())?;
    check_stats_only(opts, model.family())?;
    Ok(model)
}

/// Why an `xray` built without the oracle refuses a check without a reference cache.
pub const NEEDS_CACHE: &str = "this xray is built without the oracle: `xray check` reads its references from --reference-cache DIR (filled by an xray built with the oracle, the default features)";

/// Where a check's references come from: the reference cache when one is given, and the oracle,
/// discovered on first use (finding its venv starts no Python; running it does). A check whose
/// references are all in the cache never starts the interpreter.
pub struct References {
    cache: Option<crate::refcache::Cache>,
    #[cfg(feature = "oracle")]
    oracle: std::cell::OnceCell<Oracle>,
    versions: std::cell::OnceCell<crate::refcache::Versions>,
}

/// A reference a check compares with: the request it answers, its dump, and how the cache served
/// it (`None` without a cache).
pub struct Reference {
    /// The request (the runtime side is checked against its samples; the drill-down, variants
    /// and calibration derive theirs from it).
    pub req: OracleRequest,
    /// The reference dump.
    pub dump: Dump,
    /// Its cache key and whether it was a hit.
    pub lookup: Option<CacheLookup>,
}

impl References {
    /// References from `cache` (when given) and the oracle.
    pub fn new(cache: Option<&Path>) -> anyhow::Result<References> {
        Ok(References {
            cache: cache.map(crate::refcache::Cache::open).transpose()?,
            #[cfg(feature = "oracle")]
            oracle: std::cell::OnceCell::new(),
            versions: std::cell::OnceCell::new(),
        })
    }

    /// References from an oracle already discovered, no cache (the self-test).
    #[cfg(feature = "oracle")]
    pub fn with_oracle(oracle: Oracle) -> References {
        References {
            cache: None,
            oracle: std::cell::OnceCell::from(oracle),
            versions: std::cell::OnceCell::new(),
        }
    }

    /// The oracle, discovered on the first call (no Python is started by discovering it).
    #[cfg(feature = "oracle")]
    pub fn oracle(&self) -> anyhow::Result<&Oracle> {
        if let Some(o) = self.oracle.get() {
            return Ok(o);
        }
        let o = Oracle::discover()?;
        Ok(self.oracle.get_or_init(|| o))
    }

    /// Fails now when a reference could not be computed later: without a cache the oracle must
    /// be there (discovered before the first clip; an `xray` without it cannot check at all).
    pub fn ready(&self) -> anyhow::Result<()> {
        if self.cache.is_some() {
            return Ok(());
        }
        #[cfg(feature = "oracle")]
        return self.oracle().map(drop);
        #[cfg(not(feature = "oracle"))]
        anyhow::bail!("{NEEDS_CACHE}")
    }

    /// The torch and transformers versions references are keyed by: the oracle venv's
    /// (installed), or, without the oracle, the pinned ones. With a reference cache, an oracle
    /// venv without torch or transformers (the `xray_parity` wheel installed without its
    /// `[oracle]` extra) keys by the pinned ones too, as the Python-free build does: a hit is a
    /// reference those versions computed, and a miss still needs the oracle, which then fails
    /// naming what is missing.
    fn versions(&self) -> anyhow::Result<&crate::refcache::Versions> {
        if let Some(v) = self.versions.get() {
            return Ok(v);
        }
        #[cfg(feature = "oracle")]
        let v = match crate::refcache::Versions::installed(self.oracle()?) {
            Ok(v) => v,
            Err(e) if self.cache.is_some() && !self.stack_installed() => {
                let mut v = crate::refcache::Versions::pinned()?;
                v.source = format!(
                    "as oracle/requirements.txt pins them (the oracle venv has no reference stack: {e:#})"
                );
                v
            }
            Err(e) => return Err(e),
        };
        #[cfg(not(feature = "oracle"))]
        let v = crate::refcache::Versions::pinned()?;
        Ok(self.versions.get_or_init(|| v))
    }

    /// Whether the oracle venv holds a torch or a transformers distribution at all (a broken or
    /// duplicated one is an error of [`References::versions`], never a reason to use the pins).
    #[cfg(feature = "oracle")]
    fn stack_installed(&self) -> bool {
        let Ok(o) = self.oracle() else { return false };
        let norm = |s: &str| s.to_ascii_lowercase().replace(['-', '.'], "_");
        std::fs::read_dir(&o.site_packages).is_ok_and(|rd| {
            rd.flatten().any(|e| {
                let f = norm(&e.file_name().to_string_lossy());
                f.ends_with("dist_info")
                    && (f.starts_with("torch_") || f.starts_with("transformers_"))
            })
        })
    }

    /// The reference `req` asks for (`what` names it in messages and the evidence): from the
    /// cache when it holds it (verified), else computed by the oracle (and stored when there is a
    /// cache). `model` is the runtime model checked against it (its weights' sha256 keys it).
    pub fn fetch(
        &self,
        model: &dyn SpeechModel,
        req: &OracleRequest,
        what: &str,
        progress: &dyn Fn(&str),
    ) -> anyhow::Result<(Dump, Option<CacheLookup>)> {
        let model_id = req.model_dir.display().to_string();
        let Some(cache) = &self.cache else {
            #[cfg(feature = "oracle")]
            {
                progress(&format!(
                    "running the HF {what} (oracle, {})",
                    short_dtype(&req.dtype)
                ));
                let run = self.oracle()?.run(req)?;
                return Ok((reference_dump(&run, model.family(), &model_id), None));
            }
            #[cfg(not(feature = "oracle"))]
            {
                let _ = (model, progress, model_id);
                anyhow::bail!(
                    "the {what}: this xray is built without the oracle: give --reference-cache DIR"
                );
            }
        };
        let w = model.weights();
        let material =
            crate::refcache::KeyMaterial::of(req, w.path(), w.sha256(), self.versions()?)?;
        let key = material.key();
        if let crate::refcache::Found::Hit(mut dump) = cache.lookup(&material)? {
            progress(&format!(
                "the HF {what} from the reference cache (key {})",
                &key[..12]
            ));
            // A label, not content: the model directory of this check.
            dump.manifest.model_id = model_id;
            let lookup = CacheLookup {
                what: what.into(),
                key,
                hit: true,
            };
            return Ok((*dump, Some(lookup)));
        }
        #[cfg(feature = "oracle")]
        {
            progress(&format!(
                "running the HF {what} (oracle, {}; not in the reference cache: key {})",
                short_dtype(&req.dtype),
                &key[..12]
            ));
            let oracle = self.oracle()?;
            // The key names the oracle code this xray was built with: the package imported must
            // be that code, or the entry would lie about what computed it.
            let imported = crate::refcache::oracle_sources_sha256(&oracle.package_root)?;
            if imported != crate::refcache::ORACLE_SOURCES_SHA256 {
                anyhow::bail!(
                    "--reference-cache: the oracle package {} ({}) is not the one this xray was built from (its sources' sha256 {} vs {}): its references cannot be keyed; rebuild xray from it, or drop --reference-cache",
                    oracle.package_root.join("xray_oracle").display(),
                    oracle.package_source,
                    &imported[..12],
                    &crate::refcache::ORACLE_SOURCES_SHA256[..12]
                );
            }
            let run = oracle.run(req)?;
            let dump = reference_dump(&run, model.family(), &model_id);
            cache.store(&material, &dump)?;
            let lookup = CacheLookup {
                what: what.into(),
                key,
                hit: false,
            };
            Ok((dump, Some(lookup)))
        }
        #[cfg(not(feature = "oracle"))]
        {
            let v = self.versions()?;
            anyhow::bail!(
                "reference cache miss: {} holds no {what} for this check (key {key}; torch {} and transformers {} {}); this xray is built without the oracle and cannot compute it: run the same check once with an xray built with the oracle to fill the cache",
                cache.dir().display(),
                v.torch,
                v.transformers,
                v.source
            )
        }
    }

    /// The cache directory, when there is one.
    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache.as_ref().map(|c| c.dir())
    }
}

/// `f32` / `f64` for progress lines.
#[cfg(feature = "oracle")]
fn short_dtype(dtype: &str) -> &str {
    match dtype {
        "float64" => "f64",
        "float32" => "f32",
        d => d,
    }
}

/// What [`check_corpus`] hands each clip to: the clip, its check (`None`: not checked, its
/// earlier evidence kept by `keep`), or why it failed, and seconds.
pub type ClipSink<'a> = dyn FnMut(&std::path::Path, anyhow::Result<Option<CheckOutput>>, f64) -> anyhow::Result<()>
    + 'a;

/// What [`check_corpus`] asks of each clip before any runs (`xray check --resume`): given the
/// run its evidence would describe ([`planned_run`]), whether its earlier evidence is kept (not
/// checked again). An error stops the corpus before the first clip runs.
pub type ClipKeep<'a> = dyn Fn(&std::path::Path, &Run) -> anyhow::Result<bool> + 'a;

/// A corpus in one process: the runtime model is loaded once and the oracle started once (the
/// reference model is loaded by the first clip's run and reused), then each clip of `clips` is
/// checked with `opts` (its `audio` replaced) and handed to `each` with its wall time in
/// seconds. A clip's own failure (a file the runtime refuses, a clip longer than the model's
/// window) is passed to `each`, not returned; `each` returning an error stops the corpus. With
/// `keep`, every clip is asked first (before any runs) whether its earlier evidence stands; a
/// kept clip is handed to `each` as `Ok(None)` and not checked. Returns the seconds spent
/// loading before the first clip.
pub fn check_corpus(
    opts: &CheckOptions,
    clips: &[PathBuf],
    progress: &dyn Fn(&str),
    keep: Option<&ClipKeep>,
    each: &mut ClipSink,
) -> anyhow::Result<f64> {
    let t0 = std::time::Instant::now();
    let model = load_checked(opts, progress)?;
    let refs = References::new(opts.reference_cache.as_deref())?;
    refs.ready()?;
    let mut kept = vec![false; clips.len()];
    if let Some(keep) = keep {
        for (k, clip) in kept.iter_mut().zip(clips) {
            // A clip that does not decode is checked (and fails) like any other.
            if let Ok(audio) = load_wav(clip, 16000) {
                let o = CheckOptions {
                    audio: clip.clone(),
                    ..opts.clone()
                };
                *k = keep(clip, &planned_run(model.as_ref(), &o, &audio))?;
            }
        }
    }
    let load = t0.elapsed().as_secs_f64();
    for (i, clip) in clips.iter().enumerate() {
        if kept[i] {
            progress(&format!(
                "clip {}/{}: {}: kept (its evidence is valid and of this run)",
                i + 1,
                clips.len(),
                clip.display()
            ));
            each(clip, Ok(None), 0.0)?;
            continue;
        }
        progress(&format!(
            "clip {}/{}: {}",
            i + 1,
            clips.len(),
            clip.display()
        ));
        let t = std::time::Instant::now();
        let o = CheckOptions {
            audio: clip.clone(),
            ..opts.clone()
        };
        // Read once: the same bytes are hashed, decoded and fed to both engines.
        let r = load_wav(clip, 16000)
            .map_err(anyhow::Error::from)
            .and_then(|audio| {
                let reference = fetch_reference(model.as_ref(), &refs, &o, &audio, &|_| {})?;
                check_against(model.as_ref(), &refs, &reference, &o, &audio, &|_| {})
            });
        each(clip, r.map(Some), t.elapsed().as_secs_f64())?;
    }
    Ok(load)
}

/// The whole check.
pub fn check(opts: &CheckOptions, progress: &dyn Fn(&str)) -> anyhow::Result<CheckOutput> {
    // Before the expensive runs: a policy rule naming no checkpoint of this contract is refused,
    // and a fault that would plant nothing.
    let model = load_checked(opts, progress)?;
    // The audio file is read once (a pipe or `<(...)` can be read only once) and decoded,
    // validated and converted once, before the oracle starts: a file the runtime refuses never
    // costs a reference run, and both engines get these samples.
    let audio = load_wav(&opts.audio, 16000)?;
    let refs = References::new(opts.reference_cache.as_deref())?;
    refs.ready()?;
    let reference = fetch_reference(model.as_ref(), &refs, opts, &audio, progress)?;
    check_against(model.as_ref(), &refs, &reference, opts, &audio, progress)
}

/// The check's own reference ([`reference_request`] through `refs`).
fn fetch_reference(
    model: &dyn SpeechModel,
    refs: &References,
    opts: &CheckOptions,
    audio: &Audio,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Reference> {
    let req = reference_request(model, opts, audio)?;
    let (dump, lookup) = refs.fetch(model, &req, "reference", progress)?;
    Ok(Reference { req, dump, lookup })
}

/// The oracle request a check makes: `audio` (the file `opts.audio` decoded and converted by the
/// runtime's reader, [`load_wav`]) passed to the oracle as samples.
pub fn reference_request(
    model: &dyn SpeechModel,
    opts: &CheckOptions,
    audio: &Audio,
) -> anyhow::Result<OracleRequest> {
    let mut req = OracleRequest::new(&opts.model, &opts.audio, model.contract()).with_samples(
        &audio.samples,
        &audio.sha256,
        audio.conversion.to_json(),
    );
    req.max_new_tokens = opts.recorded.max_steps;
    req.threads = opts.recorded.threads;
    req.stats_only = opts.stats_only;
    if opts.recorded.ops {
        req = req.with_ops(PointSelect::All);
    }
    Ok(req)
}

/// What a check's evidence records about the check before any reference runs: the gate's
/// identity (family, contract, the weights the runtime read, the audio file) and the settings
/// (policy and options). [`check_against`] writes its `run` from it (weights, audio and versions
/// then the reference's own); `xray check --resume` compares earlier evidence with it.
pub fn planned_run(model: &dyn SpeechModel, opts: &CheckOptions, audio: &Audio) -> Run {
    Run {
        family: model.family().into(),
        model_path: opts.model.display().to_string(),
        weights_sha256: Some(model.weights().sha256().to_string()),
        audio_sha256: Some(audio.sha256.clone()),
        runtime_version: xray_runtime::version(),
        oracle: None,
        isolated: opts.isolate,
        stats_only: opts.stats_only,
        contract_sha256: Some(model.contract().sha256()),
        dumps: None,
        engine_weights: None,
        reference_cache: None,
        settings: Some(CheckSettings {
            policy_sha256: opts.policy.sha256(),
            options: opts.recorded.clone(),
        }),
    }
}

/// The runtime side of a check against a reference that is already there (the self-test
/// reuses one reference for every planted fault), on `audio`: the decoded file the reference
/// request was made from (the file is not read again). Further references (calibration,
/// variants, the drill-down's points) come through `refs`. The stages, in order: the runtime
/// ([`crate::runs::runtime_side`]), the reference's noise floor (`--calibrate`), the comparison
/// (align, judge, localize, explain: [`compare_dumps`] / [`compare_stats_dumps`]), reference
/// variants, the drill-down to the op ([`Drill::localize`]).
pub fn check_against(
    model: &dyn SpeechModel,
    refs: &References,
    reference: &Reference,
    opts: &CheckOptions,
    audio: &Audio,
    progress: &dyn Fn(&str),
) -> anyhow::Result<CheckOutput> {
    let align = check_inputs(model, reference, opts, audio)?;
    let mut lookups: Vec<CacheLookup> = reference.lookup.iter().cloned().collect();
    let rt = runtime_side(model, &reference.dump, align, opts, audio, progress)?;
    let mut notes = check_notes(opts, align, audio);
    let copts = compare_options(
        model,
        refs,
        reference,
        opts,
        progress,
        &mut lookups,
        &mut notes,
    )?;
    progress("comparing");
    let contract = model.contract();
    let cmp = if opts.stats_only {
        compare_stats_dumps(contract, &reference.dump, &rt.dump, &copts)?
    } else {
        compare_dumps(
            contract,
            &reference.dump,
            &rt.dump,
            rt.isolated.as_ref(),
            &copts,
        )?
    };
    let mut evidence = evidence_of(model, opts, audio, &reference.dump, &rt, cmp, notes);
    for scheme in &opts.recorded.reference_variants {
        let v = compare_variant(
            model,
            refs,
            reference,
            &rt.dump,
            scheme,
            &mut evidence,
            progress,
        );
        lookups.extend(v?);
    }
    if opts.recorded.drill {
        let drill = Drill {
            model,
            refs,
            req: &reference.req,
            audio,
            run_opts: &rt.run_opts,
            opts,
        };
        drill.localize(
            &mut evidence,
            &reference.dump,
            &rt.dump,
            progress,
            &mut lookups,
        )?;
    }
    evidence.run.reference_cache = cache_record(refs, lookups);
    Ok(CheckOutput {
        evidence,
        reference: reference.dump.clone(),
        runtime: rt.dump,
    })
}

/// What must hold before the runtime runs against `reference`: the family is registered (its
/// alignment policy is returned), the oracle was fed the samples the runtime is given, the
/// faults plant something, the options suit a stats-only check, and the reference was captured
/// as the check asks (stats-only or full).
fn check_inputs(
    model: &dyn SpeechModel,
    reference: &Reference,
    opts: &CheckOptions,
    audio: &Audio,
) -> anyhow::Result<Alignment> {
    let family = model.family();
    let align = models::family(family)
        .ok_or_else(|| anyhow!("family '{family}' is not registered"))?
        .alignment();
    if reference
        .req
        .samples
        .as_deref()
        .is_some_and(|s| s != audio.samples.as_slice())
    {
        return Err(anyhow!(
            "{}: the oracle was fed other samples than the runtime is given",
            opts.audio.display()
        ));
    }
    opts.faults.validate(model.graph())?;
    check_stats_only(opts, family)?;
    let capture = |stats_only: bool| if stats_only { "stats-only" } else { "full" };
    if opts.stats_only != reference.dump.manifest.stats_only {
        return Err(anyhow!(
            "the reference run is {} but the check asks for {} capture",
            capture(reference.dump.manifest.stats_only),
            capture(opts.stats_only)
        ));
    }
    Ok(align)
}

/// The evidence notes of how the check ran: teacher forcing, the audio conversion, stats-only
/// capture, the planted faults.
fn check_notes(opts: &CheckOptions, align: Alignment, audio: &Audio) -> Vec<String> {
    let mut notes = vec![];
    if align == Alignment::ReferenceTokens {
        notes.push("runtime teacher-forced on the reference token sequence for checkpoint alignment; its own greedy choices give its transcript".into());
    } else if opts.recorded.teacher_force || opts.isolate {
        notes.push(
            "runtime teacher-forced on the reference CTC hypothesis (--teacher-force)".into(),
        );
    }
    if !audio.conversion.is_identity() {
        notes.push(format!(
            "audio converted once for both engines: {}",
            audio.conversion.to_json()
        ));
    }
    if opts.stats_only {
        notes.push("stats-only comparison: both engines kept per-checkpoint summaries (count, moments, range, the 32-projection order-sensitive sketch, content sha256), no tensors; each checkpoint is judged by its estimated rel_l2 (its note); metrics are null and the origin has no signature: re-run without --stats-only, or `xray run --only`, for full tensors".into());
    }
    if !opts.recorded.faults.is_empty() {
        notes.push(format!(
            "faults planted in the runtime: {}",
            opts.recorded.faults.join(", ")
        ));
    }
    notes
}

/// The comparison's options: the check's policy, every checkpoint required (the runtime's
/// graph declares every one: absence is a failure, not a gap) and, with `--calibrate`, the
/// reference's own noise floor per checkpoint ([`calibrate`]; its note and cache lookup joined to
/// `notes` and `lookups`).
fn compare_options(
    model: &dyn SpeechModel,
    refs: &References,
    reference: &Reference,
    opts: &CheckOptions,
    progress: &dyn Fn(&str),
    lookups: &mut Vec<CacheLookup>,
    notes: &mut Vec<String>,
) -> anyhow::Result<CompareOptions> {
    let mut copts = CompareOptions {
        policy: opts.policy.clone(),
        require_all: true,
        ..Default::default()
    };
    if opts.recorded.calibrate {
        let (floors, lookup) = calibrate(model, refs, reference, progress)?;
        lookups.extend(lookup);
        copts.floors = floors;
        if copts.policy.calibrated().is_none() {
            copts.policy = copts.policy.with_calibration(Default::default());
        }
        notes.push(format!(
            "calibrated tolerances from the oracle's f32-vs-f64 noise floor over {} checkpoints",
            copts.floors.len()
        ));
    }
    Ok(copts)
}

/// Each checkpoint's noise floor (`--calibrate`), by name and step.
type NoiseFloors = HashMap<(String, Step), NoiseFloor>;

/// The reference's own noise floor (`--calibrate`): the oracle in f64 measured against the f32
/// reference at every checkpoint of equal shape, and the cache's lookup for the f64 run.
fn calibrate(
    model: &dyn SpeechModel,
    refs: &References,
    reference: &Reference,
    progress: &dyn Fn(&str),
) -> anyhow::Result<(NoiseFloors, Option<CacheLookup>)> {
    progress("calibrating: oracle in f64 for the noise floor");
    let mut r64 = reference.req.clone();
    r64.dtype = "float64".into();
    let (f64_dump, lookup) =
        refs.fetch(model, &r64, "calibration reference (float64)", progress)?;
    let mut floors = HashMap::new();
    for ((name, step), t32) in &reference.dump.tensors {
        if let Some(t64) = f64_dump.get(name, *step) {
            if t64.shape() == t32.shape() {
                let m = metrics_compare(
                    &t64.view(),
                    &t32.view(),
                    &Tolerance::default_for(xray_compare::tolerance::Precision::F32),
                )
                .with_context(|| format!("calibrating {}", xray_core::key(name, *step)))?;
                floors.insert((name.clone(), *step), NoiseFloor::from_metrics(&m));
            }
        }
    }
    Ok((floors, lookup))
}

/// The check's evidence from the comparison: the run (its identity and settings once,
/// [`planned_run`]; the weights, audio and versions the reference itself records), the
/// transcripts, capture neutrality, the notes (and a note when the runtime read other weights
/// than the oracle), the op-level points when both dumps carry them.
fn evidence_of(
    model: &dyn SpeechModel,
    opts: &CheckOptions,
    audio: &Audio,
    reference: &Dump,
    rt: &RuntimeSide,
    cmp: xray_compare::compare::Comparison,
    mut notes: Vec<String>,
) -> Evidence {
    let ref_m = &reference.manifest;
    let run = Run {
        weights_sha256: Some(ref_m.weights_sha256.clone()),
        audio_sha256: Some(ref_m.audio_sha256.clone()),
        oracle: Some(oracle_versions(&ref_m.tools)),
        ..planned_run(model, opts, audio)
    };
    if model.weights().sha256() != ref_m.weights_sha256 {
        notes.push(format!(
            "weights differ: runtime read sha256 {}, oracle {}",
            model.weights().sha256(),
            ref_m.weights_sha256
        ));
    }
    let transcript = Transcript {
        runtime: rt.transcript.clone(),
        reference: ref_m.transcript.clone(),
        tokens_equal: rt.tokens == rt.reference_tokens,
        first_divergent_step: None,
    };
    let mut evidence = cmp.into_evidence(run, Some(transcript), Some(rt.capture_neutral), notes);
    if has_points(reference) && has_points(&rt.dump) {
        evidence.op_points = Some(compare_points(reference, &rt.dump, &opts.policy));
    }
    evidence
}

/// Reference variants: the HF model with its weights on the grid `scheme`, run like the
/// reference; the runtime is measured against both (`reference_variants`, a note). Returns the
/// cache's lookup for the variant.
fn compare_variant(
    model: &dyn SpeechModel,
    refs: &References,
    reference: &Reference,
    runtime: &Dump,
    scheme: &str,
    evidence: &mut Evidence,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Option<CacheLookup>> {
    let mut rv = reference.req.clone();
    rv.weights_variant = Some(scheme.to_string());
    rv.ops = PointSelect::None;
    let (mut variant, lookup) =
        refs.fetch(model, &rv, &format!("{scheme} reference variant"), progress)?;
    variant.dir = PathBuf::from(format!("<{scheme} reference variant>"));
    let v = xray_compare::variant::compare_variant(
        model.contract(),
        &reference.dump,
        runtime,
        &variant,
        None,
        evidence,
    )
    .with_context(|| format!("comparing with the {scheme} reference variant"))?;
    evidence.notes.push(v.summary.clone());
    evidence.reference_variants.push(v);
    Ok(lookup)
}

/// The evidence's record of the reference cache (`None` without one): the first lookup, the
/// others as `also`.
fn cache_record(refs: &References, lookups: Vec<CacheLookup>) -> Option<ReferenceCache> {
    let dir = refs.cache_dir()?;
    let mut all = lookups.into_iter();
    let first = all.next()?;
    Some(ReferenceCache {
        dir: dir.display().to_string(),
        key: first.key,
        hit: first.hit,
        also: all.collect(),
    })
}

/// `to_canonical`'s head count for a layout transform between these shapes.
fn heads_of(from: &[usize], to: &[usize]) -> Option<usize> {
    match (from.len(), to.len()) {
        (2, 3) => to.first().copied(),
        (3, 2) => from.first().copied(),
        _ => None,
    }
}

/// What a drill-down re-runs: both engines on the same input, teacher-forced and faulted alike.
struct Drill<'a> {
    model: &'a dyn SpeechModel,
    refs: &'a References,
    req: &'a OracleRequest,
    audio: &'a xray_runtime::audio::Audio,
    run_opts: &'a RunOptions,
    opts: &'a CheckOptions,
}

impl Drill<'_> {
    /// The runtime run again, faulted and fed alike, capturing only `names` (op-level points or
    /// the runtime's own edge names).
    fn runtime_only(&self, names: &[String]) -> anyhow::Result<Dump> {
        let sel = PointSelect::Only(names.iter().cloned().collect());
        let capture = Capture {
            only: Some(names),
            points: Some(&sel),
        };
        let (d, _) = runtime_dump(
            self.model,
            self.audio,
            self.run_opts,
            Some(&self.opts.faults),
            None,
            capture,
        )?;
        Ok(d)
    }

    /// When several runtime ops lie between the agreeing points and the first that differs, the
    /// layout-only ones among them (head split / merge, transposes: [`Kernel::is_layout`]) are
    /// checked on the runtime's own tensors: one more runtime run captures their edges, and an op
    /// whose output equals the declared layout transform of its input (computed by the
    /// comparison library, not the runtime) is no longer a suspect. One suspect left names the op.
    ///
    /// [`Kernel::is_layout`]: xray_runtime::graph::Kernel::is_layout
    fn exonerate_layout_ops(
        &self,
        op: &mut xray_compare::ops::OpDivergence,
    ) -> anyhow::Result<Option<String>> {
        if op.op.is_some() || op.suspects.len() < 2 {
            return Ok(None);
        }
        let lops = self.model.graph().layout_ops(&op.suspects);
        if lops.is_empty() {
            return Ok(None);
        }
        let edges: Vec<String> = lops
            .iter()
            .flat_map(|l| [l.input.clone(), l.output.clone()])
            .collect();
        let d = self.runtime_only(&edges)?;
        let step = op.step;
        let mut cleared = Vec::new();
        for l in &lops {
            let (Some(i), Some(o)) = (d.get(&l.input, step), d.get(&l.output, step)) else {
                continue;
            };
            let heads = heads_of(i.shape(), o.shape());
            if to_canonical(i, l.from, l.to, heads).is_ok_and(|t| t == *o) {
                cleared.push(l.op.clone());
            }
        }
        if cleared.is_empty() {
            return Ok(None);
        }
        op.suspects.retain(|s| !cleared.contains(s));
        if let [one] = op.suspects.as_slice() {
            op.op = Some(one.clone());
        }
        Ok(Some(format!(
            "drill-down: layout ops cleared (output = the declared layout transform of their input, bit for bit): {}",
            cleared.join(", ")
        )))
    }

    /// From the origin checkpoint to the op: when the runtime graph holds more than one op
    /// between the origin's passing inputs and the origin ([`Drill::region`]), capture the
    /// op-level points of that region on both sides (from the dumps when they already hold them,
    /// `--ops`) and set `first_divergence.op` to the first that differs ([`localize_op`]), with
    /// its signature (the reference weight of a linear op from the model's own weights), then
    /// replay it ([`Drill::replay`]). The reference cache's lookups for the region's points are
    /// added to `lookups`.
    fn localize(
        &self,
        ev: &mut Evidence,
        reference: &Dump,
        runtime: &Dump,
        progress: &dyn Fn(&str),
        lookups: &mut Vec<CacheLookup>,
    ) -> anyhow::Result<()> {
        let Some(fd) = ev.first_divergence.as_ref() else {
            return Ok(());
        };
        let Some(region) = self.region(fd)? else {
            return Ok(());
        };
        let step = region.step;
        let has = |d: &Dump| region.names.iter().all(|n| d.entry(n, step).is_some());
        let (r_ops, x_ops);
        let (r, x) = if has(reference) && has(runtime) {
            (reference, runtime)
        } else if region.names.is_empty() {
            ev.notes.push(format!(
                "drill-down: the {} runtime ops between the last good checkpoints and {} mirror no HF module (no op-level points)",
                region.ops.len(),
                region.checkpoint
            ));
            return Ok(());
        } else {
            (r_ops, x_ops) = self.capture_points(&region, reference, progress, lookups)?;
            (&r_ops, &x_ops)
        };
        // Over the points both sides hold: an op between held points and an unheld one is not
        // named on the strength of inputs nobody captured.
        let nodes =
            xray_compare::ops::held_graph(&self.model.graph().point_nodes(), r, x, region.step);
        self.locate_op(ev, &region, &nodes, r, x)?;
        self.replay(ev, &nodes, r, x, progress);
        Ok(())
    }

    /// The region a drill-down captures for origin `fd` (a values or shape divergence): the
    /// runtime ops between its passing inputs and it, and their op-level points (with the points
    /// around an attention core the origin's producer is). `None` when there is nothing to drill
    /// into: one op that mirrors no HF module, and no attention core.
    fn region(&self, fd: &FirstDivergence) -> anyhow::Result<Option<DrillRegion>> {
        if !matches!(fd.kind, DivergenceKind::Values | DivergenceKind::Shape) {
            return Ok(None);
        }
        let g = self.model.graph();
        let mut after: Vec<&str> = fd
            .inputs
            .iter()
            .filter(|i| i.status == Status::Pass)
            .map(|i| i.checkpoint.as_str())
            .collect();
        if let Some(r) = &fd.region {
            after.extend(r.after.iter().map(|i| i.checkpoint.as_str()));
        }
        let ops = g.ops_between(&after, &fd.checkpoint)?;
        // One op that mirrors an HF module is drilled into too, and an origin an attention core
        // produces is drilled into at the points around the core (its q / k / v projections'
        // outputs and its output projection's input): replay tests their mechanism.
        let attention =
            crate::replay::attention_points(g, &fd.producer, &self.model.contract().attention);
        if ops.len() < 2
            && attention.is_none()
            && !(ops.len() == 1 && crate::replay::mirrors_module(g, &ops[0]))
        {
            return Ok(None);
        }
        let mut names = g.points_between(&after, &fd.checkpoint)?;
        for n in attention.into_iter().flatten() {
            if !names.contains(&n) {
                names.push(n);
            }
        }
        Ok(Some(DrillRegion {
            checkpoint: fd.checkpoint.clone(),
            step: fd.step,
            after: after.iter().map(|a| a.to_string()).collect(),
            ops,
            names,
        }))
    }

    /// The region's op-level points on both sides: the reference's from `reference` when it
    /// holds them, else fetched (only those points, in full); the runtime's from one more run.
    fn capture_points(
        &self,
        region: &DrillRegion,
        reference: &Dump,
        progress: &dyn Fn(&str),
        lookups: &mut Vec<CacheLookup>,
    ) -> anyhow::Result<(Dump, Dump)> {
        let names = &region.names;
        progress(&format!(
            "drill-down: {} op-level points between the last good checkpoints and {}",
            names.len(),
            xray_core::key(&region.checkpoint, region.step)
        ));
        let r_ops = if names
            .iter()
            .all(|n| reference.entry(n, region.step).is_some())
        {
            reference.clone()
        } else {
            let sel = PointSelect::Only(names.iter().cloned().collect());
            let mut req = self.req.clone().with_ops(sel);
            if req.stats_only {
                // Only the region's points, in full: no contract checkpoint is captured.
                req.stats_only = false;
                req.only = Some(Vec::new());
            }
            let (d, lookup) =
                self.refs
                    .fetch(self.model, &req, "reference's drill-down points", progress)?;
            lookups.extend(lookup);
            d
        };
        Ok((r_ops, self.runtime_only(names)?))
    }

    /// `first_divergence.op`: the first op-level point of the region that differs between `r`
    /// and `x` ([`localize_op`]), narrowed by the layout ops it clears; the points' alignment
    /// (`op_points`, unless `--ops` already set it) and a note of what was found.
    fn locate_op(
        &self,
        ev: &mut Evidence,
        region: &DrillRegion,
        nodes: &[PointNode],
        r: &Dump,
        x: &Dump,
    ) -> anyhow::Result<()> {
        let weights = self.model.weights();
        let lookup = |module: &str| weights.get(&format!("{module}.weight")).cloned();
        let op = localize_op(nodes, r, x, region.step, &self.opts.policy, Some(&lookup));
        if ev.op_points.is_none() {
            // The drill-down's own points: their alignment is reported like a full `--ops` run's.
            ev.op_points = Some(compare_points(r, x, &self.opts.policy));
        }
        // The region's points that agree at the step (none when some failing id is not listed).
        let agreeing: Vec<&str> = match &ev.op_points {
            Some(p) if p.failed_count == p.failed.len() => {
                let bad = |n: &str| {
                    let id = xray_core::key(n, region.step).to_string();
                    p.failed.contains(&id)
                        || p.alignment_faults
                            .iter()
                            .any(|f| f.point == n && f.step == region.step)
                };
                let held = |n: &str| {
                    r.entry(n, region.step).is_some() && x.entry(n, region.step).is_some()
                };
                region
                    .names
                    .iter()
                    .map(String::as_str)
                    .filter(|n| held(n) && !bad(n))
                    .collect()
            }
            _ => Vec::new(),
        };
        let Some(fd) = ev.first_divergence.as_mut() else {
            return Ok(());
        };
        fd.op = op;
        if let Some(op) = fd.op.as_mut() {
            if let Some(note) = self.exonerate_layout_ops(op)? {
                ev.notes.push(note);
            }
        }
        match &fd.op {
            Some(op) => ev.notes.push(format!("drill-down: {}", op.summary())),
            None => {
                // The ops no agreeing point clears (none upstream of it) are the suspects.
                let good: Vec<&str> = region
                    .after
                    .iter()
                    .map(String::as_str)
                    .chain(agreeing)
                    .collect();
                let left = self.model.graph().ops_between(&good, &region.checkpoint)?;
                let left = if left.is_empty() {
                    region.ops.clone()
                } else {
                    left
                };
                ev.notes.push(format!("drill-down: the op-level points between the last good checkpoints and {} agree; the divergence is in ops the reference exposes no tensor of: {}", xray_core::key(&region.checkpoint, region.step), left.join(", ")));
                fd.suspects = left;
            }
        }
        Ok(())
    }

    /// Reference replay at the op-level origin: the module re-run on the runtime's own input
    /// clears or convicts the op and tests the mechanisms of its kind (a note when the oracle is
    /// unavailable, or not built in).
    fn replay(
        &self,
        ev: &mut Evidence,
        nodes: &[PointNode],
        r: &Dump,
        x: &Dump,
        progress: &dyn Fn(&str),
    ) {
        let Some(op) = ev.first_divergence.as_mut().and_then(|fd| fd.op.as_mut()) else {
            return;
        };
        progress(&format!("replay: {} on the runtime's own input", op.module));
        let mut replay = |replayer| {
            let sides = crate::replay::Sides {
                nodes,
                reference: r,
                candidate: x,
                policy: &self.opts.policy,
                replayer,
                model: Some(self.model),
                attention: &self.model.contract().attention,
            };
            crate::replay::replay_origin(op, &sides)
        };
        #[cfg(feature = "oracle")]
        let notes = match self.refs.oracle() {
            Ok(oracle) => replay(Ok(&crate::replay::OracleReplayer::new(
                oracle,
                self.model.contract(),
                &self.opts.model,
            ))),
            Err(e) => replay(Err(&format!("the oracle is unavailable: {e:#}"))),
        };
        #[cfg(not(feature = "oracle"))]
        let notes = replay(Err(crate::replay::NOT_BUILT));
        ev.notes.extend(notes);
    }
}

/// What a drill-down captures: the origin checkpoint and step, the runtime ops between its
/// passing inputs and it, their op-level points.
struct DrillRegion {
    checkpoint: String,
    step: Step,
    /// The passing checkpoints bounding it.
    after: Vec<String>,
    ops: Vec<String>,
    names: Vec<String>,
}
