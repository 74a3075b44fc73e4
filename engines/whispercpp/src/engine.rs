//! whisper.cpp's own pipeline through its C API: `whisper_pcm_to_mel` (or `whisper_set_mel` with a
//! fed log-mel), `whisper_encode` (conv, encoder blocks, cross K/V), then `whisper_decode` per
//! step (the prompt at once, then one token per call, with whisper.cpp's own KV cache), decoded
//! greedily with the suppression HF's `generate` applies (or teacher-forced on fed tokens).
//!
//! Capture happens in [`crate::ffi`] while these calls run; this module sets the step and the
//! decode call's shape before each call so the recognizer knows what to expect.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::ffi::{self, Captured, Context, GraphRecord, Session};
use crate::graph::Dims;

/// An error: input (exit 2) or engine (exit 1).
#[derive(Debug)]
pub enum Error {
    /// Bad input.
    Input(String),
    /// The engine failed or its graph did not match.
    Engine(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Input(m) | Error::Engine(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// Process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Input(_) => 2,
            Error::Engine(_) => 1,
        }
    }
}

fn input(m: impl Into<String>) -> Error {
    Error::Input(m.into())
}

/// The HF model directory's configs (what the dump's contract and the prompt need).
#[derive(Debug, Clone)]
pub struct ModelDir {
    /// Directory.
    pub dir: PathBuf,
    /// config.json as read.
    pub config: Value,
    /// Dimensions.
    pub dims: Dims,
    /// The forced prompt (decoder_start_token_id, no_timestamps_token_id).
    pub prefix: Vec<i32>,
    /// End of text.
    pub eos: i32,
    /// Suppressed at every step.
    pub suppress: Vec<i32>,
    /// Suppressed at the first generated position.
    pub begin_suppress: Vec<i32>,
    /// Cap on the whole sequence.
    pub max_length: usize,
    /// The single safetensors file (its sha256 is the dump's weights identity).
    pub safetensors: PathBuf,
}

fn read_json(p: &Path) -> Result<Value, Error> {
    let text = std::fs::read_to_string(p).map_err(|e| input(format!("{}: {e}", p.display())))?;
    serde_json::from_str(&text).map_err(|e| input(format!("{} does not parse: {e}", p.display())))
}

fn uint(v: &Value, file: &Path, key: &str) -> Result<u64, Error> {
    v.get(key)
        .and_then(Value::as_u64)
        .filter(|&n| n <= 1 << 24)
        .ok_or_else(|| {
            input(format!(
                "{}: '{key}' is missing or not an integer in 0..2^24",
                file.display()
            ))
        })
}

fn ids(v: &Value, file: &Path, key: &str) -> Result<Vec<i32>, Error> {
    xray_core::engine::token_ids(v, file, key).map_err(Error::Input)
}

impl ModelDir {
    /// Reads config.json and generation_config.json of an English-only Whisper checkpoint.
    pub fn open(dir: &Path) -> Result<ModelDir, Error> {
        if !dir.is_dir() {
            return Err(input(format!("{}: not a model directory", dir.display())));
        }
        let cf = dir.join("config.json");
        let c = read_json(&cf)?;
        if c.get("model_type").and_then(Value::as_str) != Some("whisper") {
            return Err(input(format!(
                "{}: model_type is not whisper",
                cf.display()
            )));
        }
        let g = |k| uint(&c, &cf, k).map(|n| n as i64);
        let n_audio_ctx = g("max_source_positions")?;
        let dims = Dims {
            n_mels: g("num_mel_bins")?,
            frames: 2 * n_audio_ctx,
            n_audio_ctx,
            d_model: g("d_model")?,
            enc_heads: g("encoder_attention_heads")?,
            dec_heads: g("decoder_attention_heads")?,
            enc_layers: g("encoder_layers")? as usize,
            dec_layers: g("decoder_layers")? as usize,
            enc_ffn: g("encoder_ffn_dim")?,
            dec_ffn: g("decoder_ffn_dim")?,
            vocab: g("vocab_size")?,
        };
        let gf = dir.join("generation_config.json");
        let gc = read_json(&gf)?;
        if gc.get("forced_decoder_ids").is_some_and(|x| !x.is_null())
            || gc.get("is_multilingual").and_then(Value::as_bool) == Some(true)
        {
            return Err(input(format!(
                "{}: a multilingual checkpoint or forced_decoder_ids; this engine builds the English-only prompt only",
                gf.display()
            )));
        }
        let to_i32 = |n: u64| {
            i32::try_from(n).map_err(|_| input(format!("{}: id out of range", gf.display())))
        };
        let prefix = vec![
            to_i32(uint(&gc, &gf, "decoder_start_token_id")?)?,
            to_i32(uint(&gc, &gf, "no_timestamps_token_id")?)?,
        ];
        let safetensors = dir.join("model.safetensors");
        if !safetensors.is_file() {
            return Err(input(format!(
                "{}: missing (the weights the ggml file was converted from)",
                safetensors.display()
            )));
        }
        Ok(ModelDir {
            dir: dir.to_path_buf(),
            dims,
            prefix,
            eos: to_i32(uint(&gc, &gf, "eos_token_id")?)?,
            suppress: ids(&gc, &gf, "suppress_tokens")?,
            begin_suppress: ids(&gc, &gf, "begin_suppress_tokens")?,
            max_length: uint(&gc, &gf, "max_length")? as usize,
            config: c,
            safetensors,
        })
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The ggml model file.
    pub ggml: PathBuf,
    /// Flash attention on.
    pub flash: bool,
    /// Capture on (off: the neutrality run).
    pub taps: bool,
    /// Capture op-level points too.
    pub ops: bool,
    /// Threads.
    pub threads: i32,
    /// A fed log-mel `[n_mels, frames]` (row-major), replacing whisper.cpp's own.
    pub mel: Option<Vec<f32>>,
    /// Fed tokens after the prompt (teacher forcing).
    pub tokens: Option<Vec<i32>>,
    /// Cap on generated tokens.
    pub max_new_tokens: Option<usize>,
    /// Let an f32 model's conv graph run (a shape-only f16 stand-in kernel for IM2COL:
    /// `ffi::im2col_stub`); off, whisper.cpp would abort there and the run is refused.
    pub im2col_stub: bool,
}

/// What one run produced.
#[derive(Debug)]
pub struct Run {
    /// Captured tensors (the engine's own mel first when a mel was fed).
    pub captured: Vec<Captured>,
    /// Graphs computed.
    pub graphs: Vec<GraphRecord>,
    /// whisper.cpp's greedy sequence (prompt + generated, EOS included).
    pub tokens: Vec<i32>,
    /// whisper.cpp's choice at each step (differs from the fed token when teacher-forced).
    pub step_argmax: Vec<i32>,
    /// Text of the generated tokens (special tokens skipped).
    pub transcript: String,
    /// Row 0 of `whisper_get_logits` after the prefill (what a reader of the first row gets).
    pub prefill_first_row: Vec<f32>,
    /// The last row after the prefill (the prompt's last position).
    pub prefill_last_row: Vec<f32>,
    /// IM2COL nodes given the stand-in kernel (0 unless `Plan::im2col_stub` was needed).
    pub stubbed: usize,
}

fn argmax_suppressed(row: &[f32], suppress: &[i32], begin: &[i32]) -> i32 {
    let mut best = (0usize, f32::NEG_INFINITY);
    for (i, &v) in row.iter().enumerate() {
        let id = i as i32;
        if suppress.contains(&id) || begin.contains(&id) {
            continue;
        }
        if v.is_nan() {
            return id;
        }
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0 as i32
}

fn session_error() -> Option<String> {
    ffi::with(|s| s.error.clone()).flatten()
}

fn check(r: Result<(), String>) -> Result<(), Error> {
    if let Some(e) = session_error() {
        return Err(Error::Engine(e));
    }
    r.map_err(Error::Engine)
}

/// One run at a time per process: the capture session the wrapper reads is process-wide (ggml's
/// scheduler calls back into a C function with no state of ours to carry).
static RUNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs whisper.cpp once.
pub fn run(md: &ModelDir, samples: &[f32], plan: &Plan) -> Result<Run, Error> {
    let _one = RUNS.lock().unwrap_or_else(|e| e.into_inner());
    run_locked(md, samples, plan)
}

fn run_locked(md: &ModelDir, samples: &[f32], plan: &Plan) -> Result<Run, Error> {
    let ctx = Context::load(&plan.ggml, plan.flash).map_err(Error::Engine)?;
    let d = &md.dims;
    let mut session = Session::new(d.clone(), plan.flash, plan.ops, plan.taps);
    session.im2col_stub = plan.im2col_stub;
    ffi::install(Some(session));
    let result = (|| {
        let mut own_mel = None;
        if let Some(mel) = &plan.mel {
            // The engine's own log-mel is still recorded at the fed edge: compute it, capture only
            // the conv graph's mel input, then encode the fed one.
            if plan.taps {
                ffi::with(|s| s.only = Some(vec!["audio.frontend.mel".into()]));
                check(ctx.pcm_to_mel(samples, plan.threads))?;
                check(ctx.encode(plan.threads))?;
                own_mel = ffi::with(|s| {
                    s.only = None;
                    s.graphs.clear();
                    std::mem::take(&mut s.captured)
                });
            }
            let n = (d.n_mels * d.frames) as usize;
            if mel.len() != n {
                return Err(input(format!(
                    "fed log-mel has {} values, expected {n}",
                    mel.len()
                )));
            }
            check(ctx.set_mel(mel, d.frames as i32, d.n_mels as i32))?;
        } else {
            check(ctx.pcm_to_mel(samples, plan.threads))?;
        }
        check(ctx.encode(plan.threads))?;
        if let Some(own) = own_mel {
            // Replace the fed mel's capture with the engine's own.
            ffi::with(|s| {
                s.captured.retain(|c| c.name != "audio.frontend.mel");
                let mut all = own;
                all.append(&mut s.captured);
                s.captured = all;
            });
        }
        let vocab = d.vocab as usize;
        let limit = match plan.max_new_tokens {
            Some(n) => md.max_length.min(md.prefix.len() + n),
            None => md.max_length,
        };
        let mut history: Vec<i32> = md.prefix.clone();
        let mut step_argmax = vec![];
        let (mut first_row, mut last_row) = (vec![], vec![]);
        for k in 0.. {
            let (feed, past) = if k == 0 {
                (history.clone(), 0)
            } else {
                (vec![*history.last().unwrap_or(&0)], history.len() - 1)
            };
            ffi::with(|s| {
                s.step = k;
                s.decode = Some((feed.len(), past));
            });
            let (last, first) = ctx
                .decode(&feed, past as i32, plan.threads, vocab)
                .map_err(Error::Engine)?;
            check(Ok(()))?;
            if k == 0 {
                first_row = first;
                last_row = last.clone();
            }
            let begin: &[i32] = if k == 0 { &md.begin_suppress } else { &[] };
            let choice = argmax_suppressed(&last, &md.suppress, begin);
            step_argmax.push(choice);
            let next = match &plan.tokens {
                Some(t) => match t.get(k) {
                    Some(&x) => x,
                    None => break,
                },
                None => choice,
            };
            history.push(next);
            let done = match &plan.tokens {
                Some(t) => k + 1 >= t.len(),
                None => next == md.eos,
            };
            if done || history.len() >= limit {
                break;
            }
        }
        let (captured, graphs, stubbed) = ffi::with(|s| {
            (
                std::mem::take(&mut s.captured),
                std::mem::take(&mut s.graphs),
                s.stubbed,
            )
        })
        .unwrap_or_default();
        // Teacher-forced: whisper.cpp's own sequence is the fed one only where every choice
        // matched it; otherwise it needs a free run.
        let tokens = match &plan.tokens {
            None => Some(history),
            Some(t) if step_argmax.len() == t.len() && step_argmax == *t => Some(history),
            Some(_) => None,
        };
        Ok((
            captured,
            graphs,
            tokens,
            step_argmax,
            first_row,
            last_row,
            stubbed,
        ))
    })();
    ffi::install(None);
    let (captured, graphs, tokens, step_argmax, first_row, last_row, stubbed) = result?;
    let tokens = match tokens {
        Some(t) => t,
        None => {
            drop(ctx);
            let free = Plan {
                taps: false,
                tokens: None,
                ..plan.clone()
            };
            run_locked(md, samples, &free)?.tokens
        }
    };
    let text = {
        let ctx = Context::load(&plan.ggml, plan.flash).map_err(Error::Engine)?;
        let mut bytes = vec![];
        for &t in &tokens[md.prefix.len()..] {
            if t < md.eos {
                bytes.extend(ctx.token_bytes(t));
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    };
    Ok(Run {
        captured,
        graphs,
        tokens,
        step_argmax,
        transcript: text,
        prefill_first_row: first_row,
        prefill_last_row: last_row,
        stubbed,
    })
}

/// 16 kHz mono 16-bit PCM WAV samples in [-1, 1), and the file's bytes (for its sha256).
pub fn read_wav(path: &Path, max_seconds: usize) -> Result<(Vec<f32>, Vec<u8>), Error> {
    let bytes = std::fs::read(path).map_err(|e| input(format!("{}: {e}", path.display())))?;
    let r = hound::WavReader::new(std::io::Cursor::new(&bytes))
        .map_err(|e| input(format!("{}: not a WAV file ({e})", path.display())))?;
    let s = r.spec();
    if s.channels != 1 {
        return Err(input(format!(
            "{}: {} channels, expected mono",
            path.display(),
            s.channels
        )));
    }
    if s.sample_rate != 16_000 {
        return Err(input(format!(
            "{}: sample rate {} Hz, expected 16000",
            path.display(),
            s.sample_rate
        )));
    }
    if s.sample_format != hound::SampleFormat::Int || s.bits_per_sample != 16 {
        return Err(input(format!("{}: expected 16-bit PCM", path.display())));
    }
    let samples: Vec<f32> = r
        .into_samples::<i16>()
        .map(|x| x.map(|v| f32::from(v) / 32768.0))
        .collect::<Result<_, _>>()
        .map_err(|e| input(format!("{}: {e}", path.display())))?;
    if samples.len() > max_seconds * 16_000 {
        return Err(input(format!(
            "{}: {:.1} s is longer than the model's {max_seconds} s window",
            path.display(),
            samples.len() as f64 / 16_000.0
        )));
    }
    Ok((samples, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suppression_and_first_maximum() {
        let row = [0.0, 5.0, 5.0, 1.0];
        assert_eq!(argmax_suppressed(&row, &[], &[]), 1);
        assert_eq!(argmax_suppressed(&row, &[1], &[]), 2);
        assert_eq!(argmax_suppressed(&row, &[1], &[2]), 3);
    }
}
