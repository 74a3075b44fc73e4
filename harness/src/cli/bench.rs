//! `xray bench --model DIR --audio WAV [--json]`: the runtime against PyTorch eager
//! (transformers, same weights, f32, same thread count), interleaved repetition by repetition in
//! one process so both sides see the same machine noise. A benchmark, not a timed test.
//!
//! - encoder: one encoder forward on the padded window (runtime: the encoder formula fed with the
//!   log-mel; torch: `model.model.encoder(input_features)`).
//! - decode step: `(t(generate N) - t(generate 1)) / (tokens(N) - tokens(1))` on both sides, on
//!   precomputed encoder output (torch: `generate(encoder_outputs=...)`; runtime: a decoder session
//!   with the memory installed), so the encoder's noise does not swamp the per-token time.
//! - capture overhead: runtime full run with every checkpoint captured vs capture off, four of
//!   each per repetition in the order off, on, on, off, off, on, on, off; the median over
//!   repetitions of `sum(on) / sum(off) - 1` (paired, so drift between repetitions cancels).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{anyhow, Context};
use xray_core::capture::Recorder;
use xray_oracle::{Oracle, TorchBench};
use xray_runtime::audio::load_wav;
use xray_runtime::graph::{Feeds, RunCtx};
use xray_runtime::models::{self, RunHooks, RunOptions};

/// Arguments of `xray bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// HF Whisper model directory.
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// 16 kHz mono WAV.
    #[arg(long, value_name = "WAV")]
    pub audio: PathBuf,
    /// Repetitions per measurement (medians are reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Print the ratios as JSON.
    #[arg(long)]
    pub json: bool,
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
    let threads = xray_runtime::kernels::threads();
    let model = models::load(&a.model)?;
    if model.family() != "whisper" {
        return Err(anyhow!(
            "xray bench measures the Whisper family; {} is {}",
            a.model.display(),
            model.family()
        ));
    }
    let audio = load_wav(&a.audio, 16000)?;
    let oracle = Oracle::discover()?;
    super::note(&format!("xray bench: loading torch (threads {threads})"));
    let torch = TorchBench::whisper(&oracle, &a.model, &a.audio, &audio.samples, threads)?;

    // The runtime's log-mel of this input, then the encoder formula fed with it.
    let mut rec =
        Recorder::only(&["audio.frontend.mel".to_string()]).map_err(|e| anyhow!("{e}"))?;
    model.run(
        &audio,
        &RunOptions {
            max_new_tokens: Some(1),
            teacher_tokens: None,
        },
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
    let wm = xray_runtime::models::whisper::WhisperModel::load(&a.model)?;
    let memory = wm.encode_mel(mel.clone(), &mut RunCtx::default())?;
    let rt_decode = |cap: usize| -> anyhow::Result<(f64, usize)> {
        let mut sess = xray_runtime::models::whisper::decode::DecoderSession::new();
        sess.install_memory(memory.clone(), None);
        let t0 = Instant::now();
        let out = wm.generate(
            &mut sess,
            &RunOptions {
                max_new_tokens: Some(cap),
                teacher_tokens: None,
            },
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
    // Warm-up both sides once.
    torch.encoder()?;
    rt_encoder()?;
    let (_, n_full) = torch.decode(400)?;
    let (mut te, mut re, mut t1, mut r1, mut tn, mut rn, mut con, mut coff) = (
        vec![],
        vec![],
        vec![],
        vec![],
        vec![],
        vec![],
        vec![],
        vec![],
    );
    let (mut tok_t, mut tok_r) = ((0, 0), (0, 0));
    // Per repetition: sum(on) / sum(off) of the same repetition.
    let mut cpair: Vec<f64> = Vec::new();
    for rep in 0..a.reps {
        super::note(&format!("xray bench: repetition {}/{}", rep + 1, a.reps));
        te.push(torch.encoder()?);
        re.push(rt_encoder()?);
        let (s, n) = torch.decode(1)?;
        t1.push(s);
        tok_t.0 = n;
        let (s, n) = rt_decode(1)?;
        r1.push(s);
        tok_r.0 = n;
        let (s, n) = torch.decode(n_full)?;
        tn.push(s);
        tok_t.1 = n;
        let (s, n) = rt_decode(n_full)?;
        rn.push(s);
        tok_r.1 = n;
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
    let (te, re) = (median(te), median(re));
    // torch's generate output includes the prefix; the runtime counts generated tokens.
    let dt_t = (median(tn) - median(t1)) / (tok_t.1 as f64 - tok_t.0 as f64).max(1.0);
    let dt_r = (median(rn) - median(r1)) / (tok_r.1 as f64 - tok_r.0 as f64).max(1.0);
    let (con, coff) = (median(con), median(coff));
    // The overhead is the median of the per-repetition ratios: each ratio compares runs made
    // seconds apart, so machine drift between repetitions cancels (the ratio of the two medians
    // is printed alongside).
    let overhead = median(cpair) - 1.0;
    let report = serde_json::json!({
        "threads": threads,
        "reps": a.reps,
        "encoder_seconds": {"runtime": re, "torch": te},
        "decode_step_seconds": {"runtime": dt_r, "torch": dt_t},
        "full_run_seconds": {"capture_on": con, "capture_off": coff},
        "encoder_ratio": re / te,
        "decode_step_ratio": dt_r / dt_t,
        "capture_overhead": overhead,
        "capture_overhead_of_medians": con / coff - 1.0,
        "targets": {"encoder_ratio": 1.0, "decode_step_ratio": 0.3, "capture_overhead": 0.05},
    });
    if a.json {
        super::say(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
    } else {
        super::say(&format!(
            "threads {threads}, {} reps, medians\n\
             encoder (30 s window)   runtime {:>8.1} ms   torch {:>8.1} ms   ratio {:.3} (target <= 1.0)\n\
             decode per token        runtime {:>8.2} ms   torch {:>8.2} ms   ratio {:.3} (target <= 0.3)\n\
             full run capture on/off {:>8.1} ms / {:>8.1} ms        overhead {:+.3} (target <= 0.05; paired per repetition, ratio of medians {:+.3})\n",
            a.reps,
            re * 1e3,
            te * 1e3,
            re / te,
            dt_r * 1e3,
            dt_t * 1e3,
            dt_r / dt_t,
            con * 1e3,
            coff * 1e3,
            overhead,
            con / coff - 1.0
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}
