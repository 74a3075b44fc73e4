//! `xray bench --model DIR --audio WAV [--threads N] [--json]`: the runtime against the anchors
//! users pick, all on the same weights, f32, the same thread count and the same log-mel,
//! interleaved repetition by repetition in one process so every side sees the same machine noise.
//! A benchmark, not a timed test.
//!
//! Anchors: transformers with its default attention (SDPA; the headline `encoder_ratio` and
//! `decode_step_ratio`), transformers with eager attention (reported), and CTranslate2 (the engine
//! behind faster-whisper; `encoder_ratio_ct2`, `decode_step_ratio_ct2`) on the CTranslate2 weights
//! the model directory was converted from. When CTranslate2 or those weights are absent the bench
//! says why (`ct2_absent`) and reports the rest; its ratios are then null.
//!
//! - encoder: one encoder forward on the padded window (runtime: the encoder formula fed with the
//!   log-mel; torch: `model.model.encoder(input_features)`; CTranslate2: `Whisper.encode`).
//! - decode step: `(t(generate N) - t(generate 1)) / (tokens(N) - tokens(1))` on every side, on
//!   precomputed encoder output (torch: `generate(encoder_outputs=...)`; CTranslate2: `generate`
//!   on the encoded features; runtime: a decoder session with the memory installed), so the
//!   encoder's noise does not swamp the per-token time.
//! - capture overhead: runtime full run with every checkpoint captured vs capture off, four of
//!   each per repetition in the order off, on, on, off, off, on, on, off; the median over
//!   repetitions of `sum(on) / sum(off) - 1` (paired, so drift between repetitions cancels).
//! - corpus (`--corpus`): wall seconds of one `xray check` process over every clip against one
//!   process for the first clip alone (the per-clip cost a CI job pays either way).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{anyhow, Context};
use xray_core::capture::Recorder;
use xray_oracle::{Oracle, TorchBench};
use xray_runtime::audio::load_wav;
use xray_runtime::graph::{Feeds, RunCtx};
use xray_runtime::models::{self, RunHooks, RunOptions};

/// Arguments of `xray bench` (its model: a Whisper model directory).
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub clip: super::Clip,
    /// Repetitions per measurement (medians are reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Print the ratios as JSON.
    #[arg(long)]
    pub json: bool,
    /// Threads for every side (runtime kernels, torch intra-op, CTranslate2 intra_threads).
    /// Default: env `XRAY_THREADS`, else the available cores.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: Option<u32>,
    /// Also time `xray check` in corpus mode over these clips (WAVs or a directory of WAVs) against
    /// one `xray check` process for the first clip: each a fresh `xray check` process, wall time
    /// (JSON key `corpus`).
    #[arg(long, value_name = "WAV|DIR", num_args = 1..)]
    pub corpus: Vec<PathBuf>,
    /// Also time every op of `--reps` runtime encoder runs and greedy decodes: wall time per op
    /// kind, per encoder forward and per decode step, and GFLOP/s per GEMM shape (JSON key
    /// `profile`).
    #[arg(long)]
    pub profile: bool,
}

/// The CPU this bench ran on: vendor and model from /proc/cpuinfo, the SIMD level the runtime's
/// kernels dispatch to, and the GEMM path the encoder's linears take.
fn cpu_info() -> serde_json::Value {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |k: &str| {
        info.lines()
            .find(|l| l.split(':').next().map(str::trim) == Some(k))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    serde_json::json!({
        "vendor": field("vendor_id"),
        "model": field("model name"),
        "isa": xray_runtime::kernels::isa(),
        "gemm_path": xray_runtime::kernels::gemm_path(),
    })
}

/// Floating-point work of one op run where its kind has a closed form (linear: `2 m k n`;
/// attention: `4 H Tq Tk d`, scores and context); `None` elsewhere.
fn op_flops(r: &xray_runtime::graph::OpRun) -> Option<f64> {
    match r.kind {
        "linear" => {
            let (x, w) = (r.inputs.first()?, r.weights.first()?);
            let m: usize = x[..x.len().checked_sub(1)?].iter().product();
            Some(2.0 * m as f64 * *w.get(1)? as f64 * *w.first()? as f64)
        }
        "attention" => {
            // q, k token-major `[T, H * D]`, `[S, H * D]` or head-major `[H, T, D]`, `[H, S, D]`.
            let (q, k) = (r.inputs.first()?, r.inputs.get(1)?);
            match (q.as_slice(), k.as_slice()) {
                ([t, hd], [s, _]) => Some(4.0 * (t * s) as f64 * *hd as f64),
                ([h, t, d], [_, s, _]) => Some(4.0 * (h * t * s) as f64 * *d as f64),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The per-op profile of `runs` runs (encoder forwards, or decode steps): ms per run by op kind
/// (with GFLOP/s where the kind has a closed form) and by linear shape.
fn profile_report(p: &xray_runtime::graph::OpProfile, runs: usize) -> serde_json::Value {
    use std::collections::BTreeMap;
    let per = runs.max(1) as f64;
    let mut kinds: BTreeMap<&str, (f64, f64, usize)> = BTreeMap::new();
    let mut shapes: BTreeMap<String, (f64, f64, usize)> = BTreeMap::new();
    let mut total = 0.0;
    for r in &p.runs {
        total += r.seconds;
        let f = op_flops(r).unwrap_or(0.0);
        let e = kinds.entry(r.kind).or_default();
        e.0 += r.seconds;
        e.1 += f;
        e.2 += 1;
        if let (true, Some(x), Some([n, k])) = (
            r.kind == "linear",
            r.inputs.first().filter(|x| !x.is_empty()),
            r.weights.first().map(|w| w.as_slice()),
        ) {
            let m: usize = x[..x.len() - 1].iter().product();
            let e = shapes.entry(format!("{m}x{k}x{n}")).or_default();
            e.0 += r.seconds;
            e.1 += f;
            e.2 += 1;
        }
    }
    let row = |(s, f, n): (f64, f64, usize)| {
        serde_json::json!({
            "ms_per_run": s * 1e3 / per,
            "share": if total > 0.0 { s / total } else { 0.0 },
            "ops_per_run": n as f64 / per,
            "gflops": (f > 0.0 && s > 0.0).then(|| f / s / 1e9),
        })
    };
    serde_json::json!({
        "runs": runs,
        "ms_per_run": total * 1e3 / per,
        "by_kind": kinds.into_iter().map(|(k, v)| (k.to_string(), row(v))).collect::<serde_json::Map<_, _>>(),
        "linear_by_shape_mxkxn": shapes.into_iter().map(|(k, v)| (k, row(v))).collect::<serde_json::Map<_, _>>(),
    })
}

/// The profile as text lines.
fn profile_text(what: &str, p: &serde_json::Value) -> String {
    let mut out = format!(
        "{what} profile ({} runs, {:.2} ms per run inside the ops)\n",
        p["runs"],
        p["ms_per_run"].as_f64().unwrap_or(f64::NAN)
    );
    for (title, key) in [
        ("op kind", "by_kind"),
        ("linear m x k x n", "linear_by_shape_mxkxn"),
    ] {
        if let Some(m) = p[key].as_object() {
            let mut rows: Vec<_> = m.iter().collect();
            rows.sort_by(|a, b| {
                b.1["ms_per_run"]
                    .as_f64()
                    .unwrap_or(0.0)
                    .total_cmp(&a.1["ms_per_run"].as_f64().unwrap_or(0.0))
            });
            for (k, v) in rows {
                out.push_str(&format!(
                    "  {title:<16} {k:<22} {:>8.2} ms {:>5.1} %  x{:<4}{}\n",
                    v["ms_per_run"].as_f64().unwrap_or(0.0),
                    100.0 * v["share"].as_f64().unwrap_or(0.0),
                    v["ops_per_run"].as_f64().unwrap_or(0.0),
                    v["gflops"]
                        .as_f64()
                        .map_or(String::new(), |g| format!(" {g:>6.1} GFLOP/s")),
                ));
            }
        }
    }
    out
}

/// `--corpus`: one `xray check` process over every clip (`--evidence-dir`) against one process
/// for a single clip, both at `threads`, in a scratch directory removed afterwards. Wall seconds
/// of each process (start-up, imports and model loads included, as a user or a CI job pays
/// them), and what the corpus run's summary.json says it spent loading and per clip.
fn corpus_timing(a: &Args, threads: usize) -> anyhow::Result<serde_json::Value> {
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().context("locating the xray binary")?;
    let tmp = std::env::temp_dir().join(format!("xray-bench-corpus-{}", std::process::id()));
    if tmp.exists() {
        return Err(anyhow!("{} already exists", tmp.display()));
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let check = |extra: &[std::ffi::OsString]| -> anyhow::Result<f64> {
        let mut cmd = Command::new(&exe);
        cmd.arg("check")
            .arg("--model")
            .arg(&a.clip.model)
            .arg("--threads")
            .arg(threads.to_string())
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let t0 = Instant::now();
        let st = cmd.status().context("starting xray check")?;
        let dt = t0.elapsed().as_secs_f64();
        // 0: all pass, 1: a divergence (a finding, timed all the same); anything else failed.
        match st.code() {
            Some(0 | 1) => Ok(dt),
            _ => Err(anyhow!("xray check {extra:?} failed ({st})")),
        }
    };
    let result = (|| -> anyhow::Result<serde_json::Value> {
        let out = tmp.join("corpus");
        let mut args: Vec<std::ffi::OsString> = vec!["--audio".into()];
        args.extend(a.corpus.iter().map(|p| p.as_os_str().to_owned()));
        args.push("--evidence-dir".into());
        args.push(out.as_os_str().to_owned());
        super::note("xray bench: corpus mode (one xray check over every clip)");
        let corpus_wall = check(&args)?;
        let summary_path = out.join("summary.json");
        let summary: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&summary_path)
                .with_context(|| format!("reading {}", summary_path.display()))?,
        )
        .with_context(|| format!("parsing {}", summary_path.display()))?;
        let clips = summary
            .get("clips")
            .and_then(|c| c.as_array())
            .with_context(|| format!("{} has no clips", summary_path.display()))?;
        let first = clips
            .first()
            .and_then(|c| c.get("audio"))
            .and_then(|v| v.as_str())
            .with_context(|| format!("{}: no first clip", summary_path.display()))?
            .to_string();
        let clip_seconds: Vec<f64> = clips
            .iter()
            .filter_map(|c| c.get("seconds").and_then(|v| v.as_f64()))
            .collect();
        super::note(&format!("xray bench: one xray check for {first}"));
        let single = check(&[
            "--audio".into(),
            first.clone().into(),
            "--evidence".into(),
            tmp.join("single.json").into_os_string(),
        ])?;
        let n = clips.len();
        let per_clip = corpus_wall / n.max(1) as f64;
        Ok(serde_json::json!({
            "clips": n,
            "single_clip": first,
            "single_check_seconds": single,
            "corpus_wall_seconds": corpus_wall,
            "corpus_per_clip_seconds": per_clip,
            "corpus_load_seconds": summary.get("load_seconds"),
            "corpus_clip_seconds_median": (!clip_seconds.is_empty()).then(|| median(clip_seconds)),
            "per_clip_speedup": single / per_clip,
        }))
    })();
    let cleanup = std::fs::remove_dir_all(&tmp);
    let v = result?;
    cleanup.with_context(|| format!("removing {}", tmp.display()))?;
    Ok(v)
}

/// `a / b` when both exist.
fn ratio(a: f64, b: Option<f64>) -> Option<f64> {
    b.map(|b| a / b)
}

/// Per-token seconds by the (N, 1) difference: `(t(N) - t(1)) / (tokens(N) - tokens(1))`.
fn per_token(t1: Vec<f64>, tn: Vec<f64>, tok: (usize, usize)) -> f64 {
    (median(tn) - median(t1)) / (tok.1 as f64 - tok.0 as f64).max(1.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
}

/// Runs the benchmark.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if let Some(n) = a.threads {
        xray_runtime::kernels::set_threads(n as usize).map_err(|e| anyhow!("--threads: {e}"))?;
    }
    let threads = xray_runtime::kernels::threads();
    let model = models::load(&a.clip.model)?;
    if !xray_core::family::descriptor(model.family())?
        .capabilities
        .bench
    {
        return Err(anyhow!(
            "xray bench does not measure the {} family (its descriptor's capabilities.bench); {} is one",
            model.family(),
            a.clip.model.display(),
        ));
    }
    let audio = load_wav(&a.clip.audio, 16000)?;
    let oracle = Oracle::discover()?;
    super::note(&format!(
        "xray bench: loading torch and CTranslate2 (threads {threads})"
    ));
    let torch = TorchBench::whisper(
        &oracle,
        &a.clip.model,
        &a.clip.audio,
        &audio.samples,
        threads,
    )?;

    // The runtime's log-mel of this input, then the encoder formula fed with it.
    let mut rec =
        Recorder::only(&["audio.frontend.mel".to_string()]).map_err(|e| anyhow!("{e}"))?;
    model.run(
        &audio,
        &RunOptions::capped(1),
        &mut RunHooks {
            observer: Some(&mut rec),
            ..Default::default()
        },
    )?;
    let mel = rec
        .captured
        .pop()
        .context("the run captured no audio.frontend.mel")?
        .data;
    let g = model.graph();
    let mel_edge = g
        .checkpoint_edge("audio.frontend.mel")
        .context("no mel edge")?;
    let mem_edge = g
        .checkpoint_edge("audio.encoder.memory")
        .context("no memory edge")?;
    let mel_name = g.edges()[mel_edge].name.clone();
    let rt_encoder = || -> anyhow::Result<f64> {
        let feeds: Feeds = [(mel_name.clone(), mel.clone())].into_iter().collect();
        let t0 = Instant::now();
        g.run(model.weights(), feeds, &[mem_edge], &mut RunCtx::default())?;
        Ok(t0.elapsed().as_secs_f64())
    };
    let wm = xray_runtime::models::whisper::WhisperModel::load(&a.clip.model)?;
    let memory = wm.encode_mel(mel.clone(), &mut RunCtx::default())?;
    let rt_decode = |cap: usize| -> anyhow::Result<(f64, usize)> {
        let mut sess = xray_runtime::models::whisper::decode::DecoderSession::new();
        sess.install_memory(memory.clone(), None);
        let t0 = Instant::now();
        let out = wm.generate(
            &mut sess,
            &RunOptions::capped(cap),
            &mut RunHooks::default(),
        )?;
        Ok((t0.elapsed().as_secs_f64(), out.predicted.len()))
    };
    // One capture session across repetitions, as a long-lived harness would hold it.
    let session = std::cell::RefCell::new(Recorder::new());
    let rt_generate = |cap: Option<usize>, capture: bool| -> anyhow::Result<(f64, usize)> {
        let mut rec = session.borrow_mut();
        rec.reset();
        let mut hooks = RunHooks::default();
        if capture {
            hooks.observer = Some(&mut *rec);
        }
        let t0 = Instant::now();
        let out = model.run(
            &audio,
            &RunOptions {
                max_new_tokens: cap,
                teacher_tokens: None,
            },
            &mut hooks,
        )?;
        Ok((t0.elapsed().as_secs_f64(), out.predicted.len()))
    };
    let info: serde_json::Value =
        serde_json::from_str(&torch.info()?).context("the bench's anchor info is not JSON")?;
    let ct2_absent = info
        .get("ct2_absent")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    if let Some(why) = &ct2_absent {
        super::note(&format!("xray bench: no CTranslate2 anchor: {why}"));
    }
    let has_ct2 = ct2_absent.is_none();
    // Warm-up every side once.
    for anchor in ["sdpa", "eager", "ct2"] {
        torch.encoder(anchor)?;
    }
    rt_encoder()?;
    let (_, n_full) = torch
        .decode(400, "sdpa")?
        .context("the torch anchor returned no decode timing")?;
    if has_ct2 {
        torch.decode(n_full, "ct2")?;
    }
    // Encoder seconds per side: runtime, sdpa, eager, ct2.
    let mut enc: [Vec<f64>; 4] = Default::default();
    // (generate 1, generate N) per side: runtime, torch (sdpa), ct2.
    let mut dec: [(Vec<f64>, Vec<f64>); 3] = Default::default();
    let mut tok = [(0usize, 0usize); 3];
    let (mut con, mut coff) = (vec![], vec![]);
    // Per repetition: sum(on) / sum(off) of the same repetition.
    let mut cpair: Vec<f64> = Vec::new();
    let anchor_decode = |n: usize, anchor: &str| -> anyhow::Result<Option<(f64, usize)>> {
        torch.decode(n, anchor).map_err(anyhow::Error::from)
    };
    for rep in 0..a.reps {
        super::note(&format!("xray bench: repetition {}/{}", rep + 1, a.reps));
        // Encoders, the runtime between the anchors.
        if let Some(s) = torch.encoder("sdpa")? {
            enc[1].push(s);
        }
        enc[0].push(rt_encoder()?);
        if let Some(s) = torch.encoder("ct2")? {
            enc[3].push(s);
        }
        if let Some(s) = torch.encoder("eager")? {
            enc[2].push(s);
        }
        // Decode: generate 1 then generate N on each side.
        for (side, cap) in [
            (0, 1),
            (1, 1),
            (2, 1),
            (0, n_full),
            (1, n_full),
            (2, n_full),
        ] {
            let got = match side {
                0 => Some(rt_decode(cap)?),
                1 => anchor_decode(cap, "sdpa")?,
                _ => anchor_decode(cap, "ct2")?,
            };
            if let Some((s, n)) = got {
                if cap == 1 {
                    dec[side].0.push(s);
                    tok[side].0 = n;
                } else {
                    dec[side].1.push(s);
                    tok[side].1 = n;
                }
            }
        }
        // Off, on, on, off (twice): a drift within the repetition weighs on both sides alike.
        let (mut on_rep, mut off_rep) = (0.0, 0.0);
        for capture in [false, true, true, false, false, true, true, false] {
            let (s, _) = rt_generate(None, capture)?;
            if capture {
                con.push(s);
                on_rep += s;
            } else {
                coff.push(s);
                off_rep += s;
            }
        }
        cpair.push(on_rep / off_rep);
    }
    let [e_rt, e_sdpa, e_eager, e_ct2] = enc;
    let med = |v: Vec<f64>| (!v.is_empty()).then(|| median(v));
    let (e_rt, e_sdpa, e_eager, e_ct2) = (median(e_rt), med(e_sdpa), med(e_eager), med(e_ct2));
    let [(r1, rn), (t1, tn), (c1, cn)] = dec;
    let d_rt = per_token(r1, rn, tok[0]);
    let d_torch = (!t1.is_empty()).then(|| per_token(t1, tn, tok[1]));
    let d_ct2 = (!c1.is_empty()).then(|| per_token(c1, cn, tok[2]));
    let (con, coff) = (median(con), median(coff));
    // The overhead is the median of the per-repetition ratios: each ratio compares runs made
    // seconds apart, so machine drift between repetitions cancels (the ratio of the two medians
    // is printed alongside).
    let overhead = median(cpair) - 1.0;
    let profile = if a.profile {
        let mut prof = xray_runtime::graph::OpProfile::default();
        for _ in 0..a.reps.max(1) {
            let feeds: Feeds = [(mel_name.clone(), mel.clone())].into_iter().collect();
            let mut ctx = RunCtx {
                profile: Some(&mut prof),
                ..Default::default()
            };
            g.run(model.weights(), feeds, &[mem_edge], &mut ctx)?;
        }
        // The decoder: `n_full` greedy steps on the installed memory, every op timed (the
        // prefill step included; the report is per step).
        let mut dprof = xray_runtime::graph::OpProfile::default();
        let mut steps = 0;
        for _ in 0..a.reps.max(1) {
            let mut sess = xray_runtime::models::whisper::decode::DecoderSession::new();
            sess.install_memory(memory.clone(), None);
            let out = wm.generate(
                &mut sess,
                &RunOptions::capped(n_full),
                &mut RunHooks {
                    profile: Some(&mut dprof),
                    ..Default::default()
                },
            )?;
            steps += out.predicted.len();
        }
        serde_json::json!({
            "encoder": profile_report(&prof, a.reps.max(1)),
            "decode_step": profile_report(&dprof, steps),
        })
    } else {
        serde_json::Value::Null
    };
    let corpus = if a.corpus.is_empty() {
        serde_json::Value::Null
    } else {
        corpus_timing(&a, threads)?
    };
    let report = serde_json::json!({
        "model": a.clip.model.display().to_string(),
        "threads": threads,
        "cpu_model": info.get("cpu_model"),
        "cpu": cpu_info(),
        "reps": a.reps,
        "versions": {"torch": info.get("torch"), "transformers": info.get("transformers"),
                     "ctranslate2": info.get("ctranslate2")},
        "ct2_absent": ct2_absent,
        "encoder_seconds": {"runtime": e_rt, "torch": e_sdpa, "torch_eager": e_eager, "ct2": e_ct2},
        "decode_step_seconds": {"runtime": d_rt, "torch": d_torch, "ct2": d_ct2},
        "decode_tokens": {"runtime": tok[0], "torch": tok[1], "ct2": has_ct2.then_some(tok[2])},
        "full_run_seconds": {"capture_on": con, "capture_off": coff},
        "encoder_ratio": ratio(e_rt, e_sdpa),
        "encoder_ratio_eager": ratio(e_rt, e_eager),
        "encoder_ratio_ct2": ratio(e_rt, e_ct2),
        "decode_step_ratio": ratio(d_rt, d_torch),
        "decode_step_ratio_ct2": ratio(d_rt, d_ct2),
        "capture_overhead": overhead,
        "capture_overhead_of_medians": con / coff - 1.0,
        "peak_rss_bytes": super::peak_rss_bytes(),
        "corpus": corpus,
        "profile": profile,
        "targets": {"encoder_ratio": 0.8, "encoder_ratio_ct2": 0.8, "decode_step_ratio": 0.3,
                    "decode_step_ratio_ct2": 0.5, "capture_overhead": 0.05},
    });
    if a.json {
        super::say(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
    } else {
        let ms = |v: Option<f64>, p: usize| {
            v.map_or("   absent".to_string(), |s| format!("{:>9.p$}", s * 1e3))
        };
        let r = |v: Option<f64>| v.map_or("  -  ".to_string(), |x| format!("{x:.3}"));
        let mut text = format!(
            "threads {threads}, {} reps, medians ({})\n\
             encoder (30 s window) ms   runtime {:>9.1}   torch {}   torch eager {}   ct2 {}\n\
             \x20 ratio runtime/torch {} (target <= 0.8), /eager {}, /ct2 {} (target <= 0.8)\n\
             decode per token ms       runtime {:>9.2}   torch {}   ct2 {}\n\
             \x20 ratio runtime/torch {} (target <= 0.3), /ct2 {} (target <= 0.5)\n\
             full run capture on/off {:>8.1} ms / {:>8.1} ms        overhead {:+.3} (target <= 0.05; paired per repetition, ratio of medians {:+.3})\n",
            a.reps,
            info.get("cpu_model").and_then(|v| v.as_str()).unwrap_or("unknown CPU"),
            e_rt * 1e3,
            ms(e_sdpa, 1),
            ms(e_eager, 1),
            ms(e_ct2, 1),
            r(ratio(e_rt, e_sdpa)),
            r(ratio(e_rt, e_eager)),
            r(ratio(e_rt, e_ct2)),
            d_rt * 1e3,
            ms(d_torch, 2),
            ms(d_ct2, 2),
            r(ratio(d_rt, d_torch)),
            r(ratio(d_rt, d_ct2)),
            con * 1e3,
            coff * 1e3,
            overhead,
            con / coff - 1.0
        );
        if let Some(why) = &ct2_absent {
            text.push_str(&format!("CTranslate2 absent: {why}\n"));
        }
        let num = |k: &str| corpus.get(k).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
        if !corpus.is_null() {
            text.push_str(&format!(
                "xray check, {} clips in one process: {:.1} s per clip ({:.1} s in all, {:.1} s loading); one clip alone: {:.1} s ({:.1}x per clip)\n",
                num("clips"),
                num("corpus_per_clip_seconds"),
                num("corpus_wall_seconds"),
                num("corpus_load_seconds"),
                num("single_check_seconds"),
                num("per_clip_speedup"),
            ));
        }
        if !profile.is_null() {
            text.push_str(&profile_text("encoder", &profile["encoder"]));
            text.push_str(&profile_text("decode step", &profile["decode_step"]));
        }
        super::say(&text)?;
    }
    Ok(ExitCode::SUCCESS)
}
