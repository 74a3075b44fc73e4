//! `xray-whispercpp --model HF_DIR --ggml MODEL.bin --audio WAV --out DIR [--flash-attn]
//! [--ops] [--mel-from REF] [--tokens-from REF] [--max-new-tokens N] [--threads N]
//! [--no-neutrality] [--force]`: run whisper.cpp on one WAV and write an X-Ray dump.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use xray_core::engine::{fed as fed_from, fed_tokens, RunIdentity};
use xray_whispercpp::emit::{self, Provenance, Reference};
use xray_whispercpp::engine::{self, Error, ModelDir, Plan};

/// whisper.cpp (ggml, CPU) writing an X-Ray dump through ggml's scheduler eval callback.
#[derive(Debug, Parser)]
#[command(name = "xray-whispercpp", version)]
struct Args {
    /// The HF Whisper directory the ggml file was converted from (config.json,
    /// generation_config.json, model.safetensors: the dump's contract and weights identity).
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// The ggml model file (fixtures/make_ggml.py), with its sidecar MODEL.bin.json.
    #[arg(long, value_name = "FILE")]
    ggml: PathBuf,
    /// 16 kHz mono 16-bit PCM WAV within the model's window.
    #[arg(long, value_name = "WAV")]
    audio: PathBuf,
    /// Dump directory to write (atomically).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// whisper.cpp's flash attention on (off by default: the attention probabilities exist).
    #[arg(long)]
    flash_attn: bool,
    /// Also capture the op-level points (`{hf_module}:in|out`) the recognizer names.
    #[arg(long)]
    ops: bool,
    /// Feed this reference dump's audio.frontend.mel into whisper.cpp (whisper_set_mel);
    /// whisper.cpp's own log-mel is still recorded.
    #[arg(long, value_name = "REF_DUMP")]
    mel_from: Option<PathBuf>,
    /// Teacher forcing: feed this reference dump's tokens (whisper_decode), step by step;
    /// whisper.cpp's own argmax per step goes to extra.step_argmax.
    #[arg(long, value_name = "REF_DUMP")]
    tokens_from: Option<PathBuf>,
    /// Cap on generated tokens.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_new_tokens: Option<u64>,
    /// ggml threads.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(i32).range(1..64))]
    threads: i32,
    /// Run an f32 model although whisper.cpp 1.8.3 aborts on one (its f16 IM2COL asserts an f16
    /// kernel): the conv's IM2COL gets a shape-only f16 stand-in for its f32 kernel, which it
    /// reads only for the type check and the shape (recorded in extra.ggml.graph_edits).
    #[arg(long)]
    im2col_stub: bool,
    /// Skip the capture-off run (capture neutrality: the same tokens with taps on and off).
    #[arg(long)]
    no_neutrality: bool,
    /// Replace the X-Ray dump already at --out.
    #[arg(long)]
    force: bool,
}

fn note(msg: &str) {
    eprintln!("xray-whispercpp: {msg}");
}

fn run(a: &Args) -> Result<(), Error> {
    let md = ModelDir::open(&a.model)?;
    let (samples, wav) = engine::read_wav(&a.audio, (md.dims.frames as usize) / 100)?;
    xray_core::dump::check_dump_target(&a.out, a.force)
        .map_err(|e| Error::Input(format!("{e} (--force replaces an X-Ray dump)")))?;
    let (ggml_model, weights_sha256) = emit::ggml_identity(&a.ggml, &md)?;
    let id = RunIdentity {
        model_id: a.model.display().to_string(),
        weights_sha256,
        audio_sha256: emit::sha256_file(&a.audio)?,
    };
    let _ = wav;
    let mut plan = Plan {
        ggml: a.ggml.clone(),
        flash: a.flash_attn,
        taps: true,
        ops: a.ops,
        threads: a.threads,
        mel: None,
        tokens: None,
        max_new_tokens: a.max_new_tokens.map(|n| n as usize),
        im2col_stub: a.im2col_stub,
    };
    let mut fed = BTreeMap::new();
    if let Some(d) = &a.mel_from {
        let r = Reference::open(d, &id)?;
        plan.mel = Some(r.mel(md.dims.n_mels as usize, md.dims.frames as usize)?);
        fed.insert(
            "audio.frontend.mel".to_string(),
            fed_from(d, "whisper_set_mel"),
        );
    }
    if let Some(d) = &a.tokens_from {
        let r = Reference::open(d, &id)?;
        let t = r.generated(&md.prefix, md.dims.vocab)?;
        let all = [md.prefix.as_slice(), &t].concat();
        let into = "whisper_decode (teacher forcing)";
        fed.insert("tokens".to_string(), fed_tokens(d, into, &all));
        plan.tokens = Some(t);
    }
    let run = engine::run(&md, &samples, &plan)?;
    let taps_off_tokens = if a.no_neutrality {
        None
    } else {
        let off = Plan {
            taps: false,
            ..plan.clone()
        };
        Some(engine::run(&md, &samples, &off)?.tokens)
    };
    if let Some(t) = &taps_off_tokens {
        if *t != run.tokens {
            note(&format!(
                "capture is NOT neutral: tokens with taps {:?}, without {:?}",
                run.tokens, t
            ));
        }
    }
    let prov = Provenance {
        id,
        ggml_model,
        flash: a.flash_attn,
        fed,
        taps_off_tokens,
    };
    let w = emit::dump(&md, &prov, &run)?;
    w.write_to(&a.out, a.force)
        .map_err(|e| Error::Engine(format!("writing {}: {e}", a.out.display())))?;
    note(&format!(
        "{} tensors, {} graphs -> {}",
        w.manifest.checkpoints.len(),
        run.graphs.len(),
        a.out.display()
    ));
    println!("{}", run.transcript);
    Ok(())
}

fn main() -> ExitCode {
    xray_core::engine::exit("xray-whispercpp", run(&Args::parse()), Error::exit_code)
}
