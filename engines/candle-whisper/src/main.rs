//! `xray-candle-whisper --model DIR --audio WAV --out DIR [--max-new-tokens N]
//! [--mel-from REF] [--memory-from REF] [--tokens-from REF] [--ops] [--force]`: run candle-transformers' Whisper on
//! one WAV and write an X-Ray dump (`xray.dump` v1) for `xray compare`.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use xray_candle_whisper::emit::{self, Provenance, Reference};
use xray_candle_whisper::engine::{self, Feeds};
use xray_candle_whisper::inputs::{read_wav, ModelDir};
use xray_candle_whisper::Error;
use xray_core::engine::{fed as fed_from, fed_tokens, RunIdentity};

/// candle-transformers' Whisper (CPU, f32) writing an X-Ray dump.
#[derive(Debug, Parser)]
#[command(name = "xray-candle-whisper", version)]
struct Args {
    /// HF Whisper directory (safetensors, config.json, generation_config.json,
    /// preprocessor_config.json, tokenizer.json).
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// 16 kHz mono 16-bit PCM WAV within the model's window.
    #[arg(long, value_name = "WAV")]
    audio: PathBuf,
    /// Dump directory to write (atomically).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Cap on generated tokens (default: the generation config's max_length).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_new_tokens: Option<u64>,
    /// Feed this reference dump's audio.frontend.mel into candle's encoder (isolates the
    /// encoder; candle's own log-mel is still recorded).
    #[arg(long, value_name = "REF_DUMP")]
    mel_from: Option<PathBuf>,
    /// Feed this reference dump's audio.encoder.memory into candle's decoder (isolates the
    /// decoder; candle's own memory is still recorded).
    #[arg(long, value_name = "REF_DUMP")]
    memory_from: Option<PathBuf>,
    /// Teacher forcing: feed this reference dump's tokens to candle's decoder, step by step;
    /// candle's own argmax per step goes to extra.step_argmax, its free-running tokens to tokens.
    #[arg(long, value_name = "REF_DUMP")]
    tokens_from: Option<PathBuf>,
    /// Replace the X-Ray dump already at --out (only a dump: any other directory is refused).
    #[arg(long)]
    force: bool,
    /// Also write each checkpoint under the op-level points the Whisper contract declares it is
    /// (`model.encoder.conv1:in`, `model.encoder:in`, `model.encoder:out`, `proj_out:out`, ...),
    /// so `xray compare --model DIR` drills down and replays (on a fed edge the input points hold
    /// the fed tensor, what the encoder took).
    #[arg(long)]
    ops: bool,
}

fn note(msg: &str) {
    eprintln!("xray-candle-whisper: {msg}");
}

fn run(a: &Args) -> Result<(), Error> {
    // Everything that can be refused is checked before the weights are read.
    let md = ModelDir::open(&a.model)?;
    let p = &md.preprocessor;
    let audio = read_wav(&a.audio, p.sampling_rate, p.chunk_length)?;
    if a.out.exists() && !a.out.join("manifest.json").is_file() {
        return Err(Error::Input(format!(
            "{} exists and is not a dump directory; refusing to replace it",
            a.out.display()
        )));
    }
    if a.out.exists() && !a.force {
        return Err(Error::Input(format!(
            "{} already holds an X-Ray dump; pass --force to replace it",
            a.out.display()
        )));
    }
    let mut weights = vec![];
    for f in &md.weights {
        let bytes = std::fs::read(f).map_err(|e| Error::Input(format!("{}: {e}", f.display())))?;
        weights.push((f.clone(), bytes));
    }
    let id = RunIdentity {
        model_id: a.model.display().to_string(),
        weights_sha256: emit::weights_sha256(&weights),
        audio_sha256: emit::audio_sha256(&audio.bytes),
    };
    let max_new = a
        .max_new_tokens
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX));

    let mut feeds = Feeds::default();
    let mut fed = BTreeMap::new();
    let open = |d: &Path| Reference::open(d, &id);
    if let Some(d) = &a.mel_from {
        let r = open(d)?;
        let shape = [p.feature_size, p.frames()];
        feeds.mel = Some(r.mel(&shape)?);
        fed.insert(emit::MEL.to_string(), fed_from(d, "AudioEncoder::forward"));
    }
    if let Some(d) = &a.memory_from {
        let r = open(d)?;
        let shape = [md.config.max_source_positions, md.config.d_model];
        feeds.memory = Some(r.memory(&shape)?);
        let into = "TextDecoder::forward (cross-attention)";
        fed.insert(emit::MEMORY.to_string(), fed_from(d, into));
    }
    if let Some(d) = &a.tokens_from {
        let r = open(d)?;
        let mut t = r.generated_tokens(&md.generation.prefix, md.config.vocab_size)?;
        let limit = engine::length_limit(&md.generation, max_new);
        t.truncate(limit - md.generation.prefix.len());
        let all = [md.generation.prefix.as_slice(), &t].concat();
        let into = "TextDecoder::forward (teacher forcing)";
        fed.insert("tokens".to_string(), fed_tokens(d, into, &all));
        feeds.tokens = Some(t);
    }

    let bytes: Vec<Vec<u8>> = weights.into_iter().map(|(_, b)| b).collect();
    let obs = engine::run(&md, &audio.samples, &bytes, &feeds, max_new)?;
    let text = engine::transcript(&md, &obs.tokens)?;
    let prov = Provenance {
        id,
        fed,
        ops: a.ops,
    };
    let w = emit::dump(&md, &prov, &obs, feeds.mel.as_ref(), &text)?;
    emit::write(&w, &a.out, a.force)?;
    note(&format!(
        "{} checkpoints ({} decoder steps) -> {}",
        w.manifest.checkpoints.len(),
        obs.steps.len(),
        a.out.display()
    ));
    println!("{text}");
    Ok(())
}

fn main() -> ExitCode {
    xray_core::engine::exit("xray-candle-whisper", run(&Args::parse()), Error::exit_code)
}
