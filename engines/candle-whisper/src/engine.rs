//! candle's own Whisper pipeline, unpatched, through its public API only:
//! `whisper::audio::pcm_to_mel` (with the checkpoint's HF filter bank), `AudioEncoder::forward`,
//! `TextDecoder::forward` (its cross-attention K/V cache, flushed at the prefill) and
//! `TextDecoder::final_linear`, decoded greedily with the suppression HF's `generate` applies.
//!
//! candle's decoder has no self-attention cache: like candle's own example, each step feeds the
//! whole token sequence so far and reads the last position. Step 0 is the prefill over the prompt
//! (every prompt position's logits are kept, as the oracle's step 0); step K >= 1 keeps the last
//! position's.

use std::collections::HashMap;

use candle_core::{DType, Device, IndexOp, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::whisper::{audio, model::Whisper};

use crate::inputs::{Generation, ModelDir};
use crate::{melbank, Error};

/// A dense f32 tensor in row-major order.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense {
    /// Shape.
    pub shape: Vec<usize>,
    /// Values.
    pub data: Vec<f32>,
}

impl Dense {
    fn of(t: &Tensor) -> Result<Dense, Error> {
        Ok(Dense {
            shape: t.dims().to_vec(),
            data: t.flatten_all()?.to_vec1::<f32>()?,
        })
    }

    fn tensor(&self, dev: &Device) -> Result<Tensor, Error> {
        Ok(Tensor::from_vec(
            self.data.clone(),
            self.shape.as_slice(),
            dev,
        )?)
    }
}

/// Tensors taken from a reference dump and fed into candle at an observed edge (isolation).
#[derive(Debug, Clone, Default)]
pub struct Feeds {
    /// The reference log-mel `[mel_bins, frames]`, fed into `AudioEncoder::forward`.
    pub mel: Option<Dense>,
    /// The reference encoder memory `[enc_tokens, d_model]`, fed into `TextDecoder::forward`.
    pub memory: Option<Dense>,
    /// The reference's generated tokens (after the prompt, including the final EOS): step K is fed
    /// the prompt plus the first K of them (teacher forcing).
    pub tokens: Option<Vec<u32>>,
}

/// One decoder step.
#[derive(Debug, Clone)]
pub struct Step {
    /// `[tokens, vocab]`: every prompt position at step 0, the new position after.
    pub logits: Dense,
    /// candle's greedy choice at this step (after suppression).
    pub argmax: u32,
    /// The token ids of the kept rows (`audio.decoder.input_ids`): the prompt at step 0, the
    /// newest token after (candle re-runs the whole sequence; the other rows are dropped).
    pub ids: Vec<u32>,
    /// Their positions (`audio.decoder.position_ids`): `0 .. prompt` at step 0, `len - 1` after.
    pub positions: Vec<u32>,
}

/// What candle computed.
#[derive(Debug, Clone)]
pub struct Observations {
    /// candle's own log-mel `[mel_bins, frames]` (the first window of `pcm_to_mel`'s output).
    pub mel: Dense,
    /// `AudioEncoder::forward`'s output `[enc_tokens, d_model]` (from the fed mel when fed).
    pub memory: Dense,
    /// Decoder steps (teacher-forced when `Feeds::tokens` is set).
    pub steps: Vec<Step>,
    /// candle's own greedy sequence: prompt + generated (including EOS when it stopped on it);
    /// from a free run when teacher forcing parted from it.
    pub tokens: Vec<u32>,
}

/// The HF-convention limit on the whole sequence.
pub fn length_limit(g: &Generation, max_new_tokens: Option<usize>) -> usize {
    match max_new_tokens {
        Some(n) => g.max_length.min(g.prefix.len() + n),
        None => g.max_length,
    }
}

/// Loads the safetensors weights (each file's bytes, already hashed by the caller).
pub fn load_model(md: &ModelDir, files: &[Vec<u8>]) -> Result<Whisper, Error> {
    let dev = Device::Cpu;
    let mut all: HashMap<String, Tensor> = HashMap::new();
    for bytes in files {
        all.extend(candle_core::safetensors::load_buffer(bytes, &dev)?);
    }
    let vb = VarBuilder::from_tensors(all, DType::F32, &dev);
    Ok(Whisper::load(&vb, md.config.clone())?)
}

/// candle's log-mel of the samples: `pcm_to_mel` pads to whole half-windows plus one, the first
/// window (`frames` frames, what candle's example feeds the encoder first) is kept.
pub fn log_mel(md: &ModelDir, samples: &[f32]) -> Result<Dense, Error> {
    let p = &md.preprocessor;
    let filters = melbank::candle_filters(p.n_fft, p.feature_size, p.sampling_rate)?;
    let mel = audio::pcm_to_mel(&md.config, samples, &filters);
    let n_mel = p.feature_size;
    let n_len = mel.len() / n_mel;
    let frames = p.frames();
    if mel.len() % n_mel != 0 || n_len < frames {
        return Err(Error::Engine(format!(
            "pcm_to_mel returned {} values for {n_mel} bins, fewer than {frames} frames",
            mel.len()
        )));
    }
    let mut data = Vec::with_capacity(n_mel * frames);
    for j in 0..n_mel {
        data.extend_from_slice(&mel[j * n_len..j * n_len + frames]);
    }
    Ok(Dense {
        shape: vec![n_mel, frames],
        data,
    })
}

fn argmax_suppressed(row: &[f32], suppress: &[u32], begin: Option<&[u32]>) -> Result<u32, Error> {
    let mut scores = row.to_vec();
    for &t in suppress.iter().chain(begin.unwrap_or(&[])) {
        if let Some(s) = scores.get_mut(t as usize) {
            *s = f32::NEG_INFINITY;
        }
    }
    // torch.argmax: the first maximum; a NaN counts as the maximum.
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in scores.iter().enumerate() {
        if v.is_nan() {
            best = Some((i, v));
            break;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    match best {
        Some((i, _)) => u32::try_from(i).map_err(|_| Error::Engine("vocabulary too large".into())),
        None => Err(Error::Engine("empty logits row".into())),
    }
}

/// Greedy (or teacher-forced) decoding with candle's decoder. Returns the steps (logits kept only
/// when `keep` is set) and candle's choice at each step.
pub fn decode(
    model: &mut Whisper,
    memory: &Tensor,
    g: &Generation,
    teacher: Option<&[u32]>,
    limit: usize,
    keep: bool,
) -> Result<Vec<Step>, Error> {
    let dev = Device::Cpu;
    let mut history = g.prefix.clone();
    let mut steps = vec![];
    for k in 0.. {
        let ids = Tensor::new(history.as_slice(), &dev)?.unsqueeze(0)?;
        let hidden = model.decoder.forward(&ids, memory, k == 0)?;
        let len = history.len();
        let rows = if k == 0 {
            hidden
        } else {
            hidden.narrow(1, len - 1, 1)?
        };
        let logits = model.decoder.final_linear(&rows)?.i(0)?;
        let n = logits.dim(0)?;
        let last = logits.i(n - 1)?.to_vec1::<f32>()?;
        let begin = (k == 0).then_some(g.begin_suppress.as_slice());
        let choice = argmax_suppressed(&last, &g.suppress, begin)?;
        steps.push(Step {
            logits: if keep {
                Dense::of(&logits)?
            } else {
                Dense {
                    shape: vec![],
                    data: vec![],
                }
            },
            argmax: choice,
            ids: history[len - n..].to_vec(),
            positions: (len - n..len).map(|p| p as u32).collect(),
        });
        match teacher {
            Some(t) => {
                if k + 1 >= t.len() {
                    break;
                }
                history.push(t[k]);
            }
            None => {
                history.push(choice);
                if choice == g.eos || history.len() >= limit {
                    break;
                }
            }
        }
    }
    Ok(steps)
}

/// The whole pipeline: candle's mel, encoder and decoder, with the reference's tensors fed in
/// where `feeds` says. `weights` are the safetensors files' bytes.
pub fn run(
    md: &ModelDir,
    samples: &[f32],
    weights: &[Vec<u8>],
    feeds: &Feeds,
    max_new_tokens: Option<usize>,
) -> Result<Observations, Error> {
    let dev = Device::Cpu;
    let g = &md.generation;
    let limit = length_limit(g, max_new_tokens);
    let mel = log_mel(md, samples)?;
    let mut model = load_model(md, weights)?;
    let enc_in = feeds
        .mel
        .as_ref()
        .unwrap_or(&mel)
        .tensor(&dev)?
        .unsqueeze(0)?;
    let memory_t = model.encoder.forward(&enc_in, true)?;
    let memory = Dense::of(&memory_t.i(0)?)?;
    let dec_mem = match &feeds.memory {
        Some(m) => m.tensor(&dev)?.unsqueeze(0)?,
        None => memory_t,
    };
    let steps = decode(
        &mut model,
        &dec_mem,
        g,
        feeds.tokens.as_deref(),
        limit,
        true,
    )?;
    let choices: Vec<u32> = steps.iter().map(|s| s.argmax).collect();
    let tokens = match &feeds.tokens {
        Some(t) if t.as_slice() != choices.as_slice() => {
            // Teacher forcing parted from candle's own choices: its own transcript needs a free run.
            let free = decode(&mut model, &dec_mem, g, None, limit, false)?;
            g.prefix
                .iter()
                .copied()
                .chain(free.iter().map(|s| s.argmax))
                .collect()
        }
        _ => g.prefix.iter().copied().chain(choices).collect(),
    };
    Ok(Observations {
        mel,
        memory,
        steps,
        tokens,
    })
}

/// The transcript of a token sequence (special tokens skipped, as the oracle decodes).
pub fn transcript(md: &ModelDir, tokens: &[u32]) -> Result<String, Error> {
    let tok = tokenizers::Tokenizer::from_file(&md.tokenizer)
        .map_err(|e| Error::Input(format!("{}: {e}", md.tokenizer.display())))?;
    tok.decode(tokens, true)
        .map_err(|e| Error::Engine(format!("decoding tokens: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suppression_and_first_maximum() {
        let row = [0.0, 5.0, 5.0, 1.0];
        assert_eq!(argmax_suppressed(&row, &[], None).unwrap(), 1);
        assert_eq!(argmax_suppressed(&row, &[1], None).unwrap(), 2);
        assert_eq!(argmax_suppressed(&row, &[1], Some(&[2])).unwrap(), 3);
        assert_eq!(argmax_suppressed(&[1.0, f32::NAN], &[], None).unwrap(), 1);
    }
}
