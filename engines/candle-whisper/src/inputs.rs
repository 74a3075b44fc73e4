//! Everything read before the expensive work, validated fail-closed: the model directory
//! (safetensors only, no pickles, no remote code), config.json as candle's `Config`,
//! generation_config.json (the prompt and the suppression HF's `generate` applies),
//! preprocessor_config.json (the feature extractor's numbers, checked against candle's constants),
//! and the WAV file (16 kHz mono 16-bit PCM, within the model's window).

use std::path::{Path, PathBuf};

use candle_transformers::models::whisper as cw;
use serde_json::Value;

use crate::Error;

const PICKLE_SUFFIXES: [&str; 6] = ["bin", "pt", "pth", "pkl", "pickle", "ckpt"];

fn input(msg: impl Into<String>) -> Error {
    Error::Input(msg.into())
}

fn read_json(p: &Path) -> Result<Value, Error> {
    let text = std::fs::read_to_string(p).map_err(|e| input(format!("{}: {e}", p.display())))?;
    serde_json::from_str(&text).map_err(|e| input(format!("{} does not parse: {e}", p.display())))
}

fn uint(v: &Value, file: &Path, key: &str) -> Result<Option<u64>, Error> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_u64().map(Some).ok_or_else(|| {
            input(format!(
                "{}: '{key}' is {x}, expected a non-negative integer",
                file.display()
            ))
        }),
    }
}

fn required_uint(v: &Value, file: &Path, key: &str) -> Result<u64, Error> {
    uint(v, file, key)?.ok_or_else(|| input(format!("{}: '{key}' is missing", file.display())))
}

fn id_list(v: &Value, file: &Path, key: &str) -> Result<Vec<u32>, Error> {
    xray_core::engine::token_ids(v, file, key).map_err(Error::Input)
}

/// The decoding set-up HF's Whisper `generate` derives from generation_config.json (greedy,
/// short-form, no timestamps).
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The forced prompt: `decoder_start_token_id`, then `no_timestamps_token_id`.
    pub prefix: Vec<u32>,
    /// Generation stops on this token (kept in the sequence).
    pub eos: u32,
    /// Suppressed at every step (`SuppressTokensLogitsProcessor`).
    pub suppress: Vec<u32>,
    /// Suppressed at the first generated position only (`SuppressTokensAtBeginLogitsProcessor`,
    /// `begin_index` = the prompt length).
    pub begin_suppress: Vec<u32>,
    /// Cap on the whole sequence (prompt + generated), `max_length`.
    pub max_length: usize,
}

impl Generation {
    /// Reads generation_config.json; refuses the set-ups this engine does not reproduce (language
    /// detection, forced_decoder_ids, timestamps) instead of decoding with another prompt.
    pub fn from_json(v: &Value, file: &Path) -> Result<Generation, Error> {
        let start = required_uint(v, file, "decoder_start_token_id")?;
        let eos = required_uint(v, file, "eos_token_id")?;
        let max_length = required_uint(v, file, "max_length")?;
        if v.get("forced_decoder_ids").is_some_and(|x| !x.is_null()) {
            return Err(input(format!(
                "{}: 'forced_decoder_ids' is set; this engine builds the prompt of English-only \
                 checkpoints only (decoder_start_token_id, no_timestamps_token_id)",
                file.display()
            )));
        }
        if v.get("is_multilingual").and_then(Value::as_bool) == Some(true)
            || v.get("lang_to_id").is_some_and(|x| !x.is_null())
        {
            return Err(input(format!(
                "{}: a multilingual checkpoint (is_multilingual / lang_to_id); HF's generate would \
                 detect the language first, which this engine does not reproduce",
                file.display()
            )));
        }
        if v.get("return_timestamps").and_then(Value::as_bool) == Some(true) {
            return Err(input(format!(
                "{}: 'return_timestamps' is true; this engine decodes without timestamps",
                file.display()
            )));
        }
        let no_ts = required_uint(v, file, "no_timestamps_token_id")?;
        let to_u32 = |n: u64, key: &str| {
            u32::try_from(n)
                .map_err(|_| input(format!("{}: '{key}' {n} is out of range", file.display())))
        };
        let prefix = vec![
            to_u32(start, "decoder_start_token_id")?,
            to_u32(no_ts, "no_timestamps_token_id")?,
        ];
        let max_length = usize::try_from(max_length)
            .map_err(|_| input(format!("{}: 'max_length' is out of range", file.display())))?;
        if max_length <= prefix.len() {
            return Err(input(format!(
                "{}: 'max_length' {max_length} leaves no room after the {}-token prompt",
                file.display(),
                prefix.len()
            )));
        }
        Ok(Generation {
            prefix,
            eos: to_u32(eos, "eos_token_id")?,
            suppress: id_list(v, file, "suppress_tokens")?,
            begin_suppress: id_list(v, file, "begin_suppress_tokens")?,
            max_length,
        })
    }
}

/// The feature extractor's numbers (preprocessor_config.json).
#[derive(Debug, Clone, PartialEq)]
pub struct Preprocessor {
    /// Mel bins.
    pub feature_size: usize,
    /// Hz.
    pub sampling_rate: usize,
    /// STFT size.
    pub n_fft: usize,
    /// STFT hop.
    pub hop_length: usize,
    /// Window in seconds.
    pub chunk_length: usize,
}

impl Preprocessor {
    /// Frames in the model's window (`chunk_length * sampling_rate / hop_length`).
    pub fn frames(&self) -> usize {
        self.chunk_length * self.sampling_rate / self.hop_length
    }

    /// Reads preprocessor_config.json and checks it against what candle's `pcm_to_mel` hard-codes
    /// (N_FFT, HOP_LENGTH, SAMPLE_RATE): a checkpoint asking for other numbers is refused, not
    /// silently run with candle's.
    pub fn from_json(v: &Value, file: &Path) -> Result<Preprocessor, Error> {
        if let Some(t) = v.get("feature_extractor_type").and_then(Value::as_str) {
            if t != "WhisperFeatureExtractor" {
                return Err(input(format!(
                    "{}: feature_extractor_type is {t}, expected WhisperFeatureExtractor",
                    file.display()
                )));
            }
        }
        let get = |k: &str| -> Result<usize, Error> {
            let n = required_uint(v, file, k)?;
            usize::try_from(n)
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| input(format!("{}: '{k}' must be positive", file.display())))
        };
        let p = Preprocessor {
            feature_size: get("feature_size")?,
            sampling_rate: get("sampling_rate")?,
            n_fft: get("n_fft")?,
            hop_length: get("hop_length")?,
            chunk_length: get("chunk_length")?,
        };
        if let Some(d) = v.get("dither").and_then(Value::as_f64) {
            if d != 0.0 {
                return Err(input(format!(
                    "{}: dither {d} (random noise in the reference's log-mel); candle adds none",
                    file.display()
                )));
            }
        }
        for (key, got, candle) in [
            ("n_fft", p.n_fft, cw::N_FFT),
            ("hop_length", p.hop_length, cw::HOP_LENGTH),
            ("sampling_rate", p.sampling_rate, cw::SAMPLE_RATE),
        ] {
            if got != candle {
                return Err(input(format!(
                    "{}: '{key}' is {got}; candle-transformers' pcm_to_mel hard-codes {candle}",
                    file.display()
                )));
            }
        }
        Ok(p)
    }
}

/// A validated HF Whisper directory.
#[derive(Debug, Clone)]
pub struct ModelDir {
    /// The directory.
    pub dir: PathBuf,
    /// config.json as read (recorded in the dump's `extra.config`).
    pub config_json: Value,
    /// config.json as candle's `Config`.
    pub config: cw::Config,
    /// The `.safetensors` files, sorted by name.
    pub weights: Vec<PathBuf>,
    /// generation_config.json.
    pub generation: Generation,
    /// preprocessor_config.json.
    pub preprocessor: Preprocessor,
    /// tokenizer.json.
    pub tokenizer: PathBuf,
}

impl ModelDir {
    /// Validates a local HF Whisper directory without reading the weights.
    pub fn open(dir: &Path) -> Result<ModelDir, Error> {
        if !dir.is_dir() {
            return Err(input(format!(
                "model directory {} does not exist",
                dir.display()
            )));
        }
        let rd = std::fs::read_dir(dir).map_err(|e| input(format!("{}: {e}", dir.display())))?;
        let mut weights = vec![];
        let mut pickles = vec![];
        for e in rd.flatten() {
            let p = e.path();
            match p.extension().and_then(|x| x.to_str()) {
                Some("safetensors") => weights.push(p),
                Some(x) if PICKLE_SUFFIXES.contains(&x) => pickles.push(p),
                _ => {}
            }
        }
        if !pickles.is_empty() {
            pickles.sort();
            return Err(input(format!(
                "{} contains pickle-format weights {:?}; this engine loads safetensors only and never unpickles",
                dir.display(),
                pickles
            )));
        }
        if weights.is_empty() {
            return Err(input(format!(
                "{} has no .safetensors weights",
                dir.display()
            )));
        }
        weights.sort();
        let cfg_path = dir.join("config.json");
        let config_json = read_json(&cfg_path)?;
        if config_json.get("model_type").and_then(Value::as_str) != Some("whisper") {
            return Err(input(format!(
                "{}: model_type is {}, expected \"whisper\"",
                cfg_path.display(),
                config_json.get("model_type").unwrap_or(&Value::Null)
            )));
        }
        if config_json.get("auto_map").is_some() {
            return Err(input(format!(
                "{} has an auto_map (remote code); never run",
                cfg_path.display()
            )));
        }
        let config: cw::Config = serde_json::from_value(config_json.clone())
            .map_err(|e| input(format!("{}: {e}", cfg_path.display())))?;
        let gen_path = dir.join("generation_config.json");
        let generation = Generation::from_json(&read_json(&gen_path)?, &gen_path)?;
        let pre_path = dir.join("preprocessor_config.json");
        let preprocessor = Preprocessor::from_json(&read_json(&pre_path)?, &pre_path)?;
        if preprocessor.feature_size != config.num_mel_bins {
            return Err(input(format!(
                "{}: feature_size {} but config.json's num_mel_bins is {}",
                pre_path.display(),
                preprocessor.feature_size,
                config.num_mel_bins
            )));
        }
        if preprocessor.frames() != 2 * config.max_source_positions {
            return Err(input(format!(
                "{}: the window makes {} mel frames, config.json's max_source_positions {} needs {}",
                pre_path.display(),
                preprocessor.frames(),
                config.max_source_positions,
                2 * config.max_source_positions
            )));
        }
        if generation.max_length > config.max_target_positions {
            return Err(input(format!(
                "{}: max_length {} exceeds config.json's max_target_positions {}",
                gen_path.display(),
                generation.max_length,
                config.max_target_positions
            )));
        }
        // Every id the decoder is fed or stops on is an id of the vocabulary (candle's
        // embedding lookup of another is an error with a backtrace, mid-run).
        for (key, id) in [
            ("decoder_start_token_id", generation.prefix[0]),
            ("no_timestamps_token_id", generation.prefix[1]),
            ("eos_token_id", generation.eos),
        ] {
            if id as usize >= config.vocab_size {
                return Err(input(format!(
                    "{}: '{key}' {id} is not an id of config.json's vocabulary (vocab_size {})",
                    gen_path.display(),
                    config.vocab_size
                )));
            }
        }
        let tokenizer = dir.join("tokenizer.json");
        if !tokenizer.is_file() {
            return Err(input(format!("{} is missing", tokenizer.display())));
        }
        Ok(ModelDir {
            dir: dir.to_path_buf(),
            config_json,
            config,
            weights,
            generation,
            preprocessor,
            tokenizer,
        })
    }
}

/// A WAV file as read.
#[derive(Debug, Clone)]
pub struct Audio {
    /// The file's bytes (hashed for the manifest).
    pub bytes: Vec<u8>,
    /// Samples as f32, `int16 / 32768` (what the HF pipelines feed the feature extractor).
    pub samples: Vec<f32>,
}

/// Reads a 16 kHz mono 16-bit PCM WAV no longer than `max_seconds`; anything else is refused with
/// the sox command that fixes it.
pub fn read_wav(path: &Path, rate: usize, max_seconds: usize) -> Result<Audio, Error> {
    let bytes =
        std::fs::read(path).map_err(|e| input(format!("audio file {}: {e}", path.display())))?;
    let fix = path.with_extension("16k-mono.wav");
    let reader = hound::WavReader::new(std::io::Cursor::new(&bytes))
        .map_err(|e| input(format!("{}: not a readable WAV file ({e})", path.display())))?;
    let spec = reader.spec();
    if spec.sample_format != hound::SampleFormat::Int || spec.bits_per_sample != 16 {
        return Err(input(format!(
            "{}: {}-bit {:?} samples, this engine reads 16-bit PCM only; convert with `sox {} -e signed-integer -b 16 {}`",
            path.display(),
            spec.bits_per_sample,
            spec.sample_format,
            path.display(),
            fix.display()
        )));
    }
    if spec.channels != 1 {
        return Err(input(format!(
            "{}: {} channels, mono only; downmix with `sox {} -c 1 {}`",
            path.display(),
            spec.channels,
            path.display(),
            fix.display()
        )));
    }
    if spec.sample_rate as usize != rate {
        return Err(input(format!(
            "{}: sample rate {} Hz, the feature extractor needs {rate} Hz; resample with `sox {} -r {rate} {}`",
            path.display(),
            spec.sample_rate,
            path.display(),
            fix.display()
        )));
    }
    let samples = reader
        .into_samples::<i16>()
        .map(|s| s.map(|v| v as f32 / 32768.0))
        .collect::<Result<Vec<f32>, _>>()
        .map_err(|e| {
            input(format!(
                "{}: corrupt or truncated WAV file ({e})",
                path.display()
            ))
        })?;
    if samples.is_empty() {
        return Err(input(format!(
            "{}: the WAV file holds no samples",
            path.display()
        )));
    }
    if samples.len() > max_seconds * rate {
        return Err(input(format!(
            "{}: {:.2} s of audio, longer than the model's {max_seconds} s window; cut it with `sox {} {} trim 0 {max_seconds}`",
            path.display(),
            samples.len() as f64 / rate as f64,
            path.display(),
            fix.display()
        )));
    }
    Ok(Audio { bytes, samples })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prompt_and_suppression_from_generation_config() {
        let v = json!({"decoder_start_token_id": 50257, "eos_token_id": 50256, "max_length": 448,
                       "no_timestamps_token_id": 50362, "suppress_tokens": [1, 2],
                       "begin_suppress_tokens": [220, 50256]});
        let g = Generation::from_json(&v, Path::new("g.json")).unwrap();
        assert_eq!(g.prefix, vec![50257, 50362]);
        assert_eq!(g.suppress, vec![1, 2]);
        assert_eq!(g.begin_suppress, vec![220, 50256]);
    }

    #[test]
    fn missing_keys_and_unsupported_setups_are_refused() {
        let base = json!({"decoder_start_token_id": 50257, "eos_token_id": 50256, "max_length": 448,
                          "no_timestamps_token_id": 50362});
        for (key, val) in [
            ("no_timestamps_token_id", Value::Null),
            ("is_multilingual", json!(true)),
            ("forced_decoder_ids", json!([[1, 50259]])),
            ("return_timestamps", json!(true)),
            ("suppress_tokens", json!("x")),
        ] {
            let mut v = base.clone();
            v[key] = val;
            let e = Generation::from_json(&v, Path::new("g.json")).unwrap_err();
            assert!(e.to_string().contains(key), "{key}: {e}");
        }
    }

    #[test]
    fn preprocessor_other_than_candles_constants_is_refused() {
        let v = json!({"feature_size": 80, "sampling_rate": 16000, "n_fft": 512, "hop_length": 160,
                       "chunk_length": 30});
        let e = Preprocessor::from_json(&v, Path::new("p.json")).unwrap_err();
        assert!(e.to_string().contains("n_fft"), "{e}");
    }
}
