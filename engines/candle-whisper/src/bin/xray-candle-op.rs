//! `xray-candle-op CASE --out OUT.npy`: candle's own kernel for the op of an X-Ray repro case
//! (`xray repro`, `xray.case/v1`), run on the case's reference input and weights, its output
//! written as `.npy` for `xray replay CASE --got OUT.npy`: the unit test an engine team keeps
//! after the bring-up, here for the candle-transformers Whisper this crate runs.
//!
//! The kernels are the ones candle-transformers' `whisper/model.rs` builds for these modules:
//! `candle_nn::LayerNorm::new(weight, bias, 1e-5)` (its `layer_norm`, epsilon hard-coded as
//! candle does) and the linear of `with_tracing::linear` (`candle_nn::Linear`, bias when the case
//! has one), on the batch of one candle runs (`[1, rows, features]`). A module case (kind
//! `module`) of `model.encoder` runs candle's `AudioEncoder::forward` on the case's log-mel:
//! candle-transformers builds its encoder only through `Whisper::load` (`AudioEncoder::load` is
//! private), which builds the decoder too, so the decoder's weights, which the case does not hold
//! and the encoder never reads, are zeros; every encoder weight comes from the case, and a key
//! candle asks for that the case lacks is an error. Other kinds and modules are refused (exit 2).
//! Exit 0 written, 1 candle failed, 2 bad input.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{LayerNorm, Linear, Module, VarBuilder};
use candle_transformers::models::whisper::{model::Whisper, Config};
use clap::Parser;
use serde_json::Value;
use xray_core::dump::{npy_bytes, parse_npy};

/// candle's kernel for a repro case's op.
#[derive(Debug, Parser)]
#[command(name = "xray-candle-op", version)]
struct Args {
    /// The case directory (`xray repro EVIDENCE --out CASE`).
    case: PathBuf,
    /// Where to write candle's output (a new file).
    #[arg(long, value_name = "OUT.npy")]
    out: PathBuf,
}

/// A bad input (exit 2) or a candle failure (exit 1), one line.
enum Fail {
    Input(String),
    Candle(String),
}

impl From<candle_core::Error> for Fail {
    fn from(e: candle_core::Error) -> Fail {
        Fail::Candle(e.to_string().lines().next().unwrap_or_default().to_string())
    }
}

fn input(m: impl Into<String>) -> Fail {
    Fail::Input(m.into())
}

/// `CASE/<file>` as a candle f32 tensor on the CPU.
fn load(case: &Path, entry: &Value, what: &str) -> Result<Tensor, Fail> {
    let file = entry
        .get("file")
        .and_then(Value::as_str)
        .filter(|f| !f.contains("..") && !f.starts_with('/'))
        .ok_or_else(|| {
            input(format!(
                "{}: case.json: {what} has no plain file",
                case.display()
            ))
        })?;
    let p = case.join(file);
    let bytes = std::fs::read(&p).map_err(|e| input(format!("{}: {e}", p.display())))?;
    let (t, _) = parse_npy(&p, &bytes).map_err(|e| input(e.to_string()))?;
    let shape = t.shape().to_vec();
    let data: Vec<f32> = t.iter().copied().collect();
    Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
}

/// The case's weights by safetensors key; keys under `zeros` (the decoder a whole-model loader
/// builds beside the module) are zeros of the shape asked for.
struct CaseWeights {
    by_key: HashMap<String, Tensor>,
    zeros: &'static str,
}

impl SimpleBackend for CaseWeights {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        match self.by_key.get(name) {
            Some(t) if t.shape() == &s => t.to_dtype(dtype)?.to_device(dev),
            Some(t) => Err(candle_core::Error::Msg(format!(
                "the case's weight {name} is {:?}, candle asks for {:?}",
                t.dims(),
                s.dims()
            ))),
            None if name.starts_with(self.zeros) => Tensor::zeros(s, dtype, dev),
            None => Err(candle_core::Error::Msg(format!(
                "candle reads weight {name}, which the case does not hold"
            ))),
        }
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        match self.by_key.get(name) {
            Some(t) => t.to_dtype(dtype)?.to_device(dev),
            None => Err(candle_core::Error::Msg(format!(
                "candle reads weight {name}, which the case does not hold"
            ))),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.by_key.contains_key(name) || name.starts_with(self.zeros)
    }
}

/// candle's `AudioEncoder::forward` on `x` (`[1, mel_bins, frames]`), built by `Whisper::load`
/// from the case's weights and config.
fn encoder(case: &Path, c: &Value, x: &Tensor) -> Result<Tensor, Fail> {
    let mp = case.join("case.json");
    let cfg: Config = serde_json::from_value(c["config"].clone()).map_err(|e| {
        input(format!(
            "{}: config (the model's config.json, which a module case holds): {e}",
            mp.display()
        ))
    })?;
    let mut by_key = HashMap::new();
    for w in c["weights"].as_array().into_iter().flatten() {
        let key = w["key"]
            .as_str()
            .ok_or_else(|| input(format!("{}: a weight without a key", mp.display())))?;
        by_key.insert(key.to_string(), load(case, w, key)?);
    }
    let backend = CaseWeights {
        by_key,
        zeros: "model.decoder.",
    };
    let vb = VarBuilder::from_backend(Box::new(backend), DType::F32, Device::Cpu);
    let mut m = Whisper::load(&vb, cfg)
        .map_err(|e| input(format!("{}: candle's Whisper::load: {e}", mp.display())))?;
    Ok(m.encoder.forward(x, true)?)
}

fn run(a: &Args) -> Result<String, Fail> {
    let mp = a.case.join("case.json");
    let text = std::fs::read_to_string(&mp).map_err(|e| input(format!("{}: {e}", mp.display())))?;
    let c: Value = serde_json::from_str(&text)
        .map_err(|e| input(format!("{}: invalid JSON: {e}", mp.display())))?;
    if c.get("schema").and_then(Value::as_str) != Some("xray.case/v1") {
        return Err(input(format!(
            "{}: schema {}, expected \"xray.case/v1\"",
            mp.display(),
            c.get("schema").unwrap_or(&Value::Null)
        )));
    }
    if a.out.exists() {
        return Err(input(format!(
            "--out {}: exists; give a new file",
            a.out.display()
        )));
    }
    let kind = c["op"]["kind"].as_str().unwrap_or_default();
    let inputs = c["inputs"].as_array().cloned().unwrap_or_default();
    let [x] = inputs.as_slice() else {
        return Err(input(format!(
            "{}: {} inputs; candle's layer norm, linear and encoder take one",
            mp.display(),
            inputs.len()
        )));
    };
    let weight = |role: &str| -> Result<Option<Tensor>, Fail> {
        c["weights"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|w| w["role"] == role)
            .map(|w| load(&a.case, w, role))
            .transpose()
    };
    // candle runs every module on a batch of one.
    let x = load(&a.case, x, "input 0")?.unsqueeze(0)?;
    let need = |role: &str| {
        weight(role)?.ok_or_else(|| input(format!("{}: no {role} weight", mp.display())))
    };
    let (y, how) = match kind {
        "layer_norm" => (
            LayerNorm::new(need("weight")?, need("bias")?, 1e-5).forward(&x)?,
            "candle_nn::LayerNorm (eps 1e-5, as candle-transformers' whisper builds it)",
        ),
        "linear" => (
            Linear::new(need("weight")?, weight("bias")?).forward(&x)?,
            "candle_nn::Linear",
        ),
        "module" if c["op"]["module"] == "model.encoder" => (
            encoder(&a.case, &c, &x)?,
            "candle-transformers' AudioEncoder::forward (built by Whisper::load from the case's weights; the decoder, never run, on zeros)",
        ),
        other => {
            return Err(input(format!(
                "{}: op kind '{other}' ({}): this tool runs candle's layer_norm, linear and the whole model.encoder module only",
                mp.display(),
                c["op"]["module"].as_str().unwrap_or("no module")
            )))
        }
    };
    let y = y.squeeze(0)?.to_dtype(DType::F32)?;
    let shape = y.dims().to_vec();
    let data = y.flatten_all()?.to_vec1::<f32>()?;
    let t =
        ndarray::ArrayD::from_shape_vec(shape, data).map_err(|e| Fail::Candle(e.to_string()))?;
    let bytes = npy_bytes(&t).map_err(|e| Fail::Candle(e.to_string()))?;
    // Beside, then renamed: a reader never sees a part.
    let tmp = a.out.with_extension("npy.xray-tmp");
    std::fs::write(&tmp, bytes)
        .and_then(|_| std::fs::rename(&tmp, &a.out))
        .map_err(|e| input(format!("--out {}: {e}", a.out.display())))?;
    Ok(format!(
        "{} ({}) on the case's input -> {}",
        how,
        c["op"]["name"].as_str().unwrap_or("?"),
        a.out.display()
    ))
}

fn main() -> ExitCode {
    let a = Args::parse();
    match run(&a) {
        Ok(m) => {
            eprintln!("xray-candle-op: {m}");
            ExitCode::SUCCESS
        }
        Err(Fail::Input(m)) => {
            eprintln!("xray-candle-op: error: {m}");
            ExitCode::from(2)
        }
        Err(Fail::Candle(m)) => {
            eprintln!("xray-candle-op: candle: {m}");
            ExitCode::from(1)
        }
    }
}
