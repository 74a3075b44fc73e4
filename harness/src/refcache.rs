//! The reference cache (`xray check --reference-cache DIR`, `docs/reference-cache.md`): a
//! reference dump stored under a content key and reused when the key matches, so a check whose
//! references are all cached runs without the oracle (no Python started, no torch imported),
//! in an `xray` built without Python too.
//!
//! The key is the sha256 of a [`KeyMaterial`]: everything the reference dump depends on, by
//! content (never a path): the weights' and the other model files' sha256, the audio file's and
//! the converted samples' sha256, the resolved contract's sha256, the oracle package's sources,
//! the torch and transformers versions, and every field of the request (dtype, max steps, op
//! points, checkpoint selection, stats-only, reference variant, threads, teacher ids).
//!
//! An entry is `DIR/<key>/`: `entry.json` (the key, its material, the dump manifest's sha256)
//! and `dump/` (an `xray.dump`). It is written into a fresh temporary sibling and renamed into
//! place once complete, so a reader sees a whole entry or none. Reading verifies everything: the
//! entry's material hashes to its name and equals the check's, the manifest's sha256, every
//! tensor's sha256 ([`Dump::load`]), no file the entry does not list, and the manifest's own
//! facts against the key (family, weights, audio, samples, versions). A failure is an error
//! naming the file, never a miss: X-Ray deletes nothing in the cache but its own temporary
//! directories.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};
use xray_core::dump::Dump;
use xray_core::ops::PointSelect;
use xray_core::reference::OracleRequest;
use xray_core::sha256_hex;

include!("oracle_sources.rs");

/// `schema` of an entry's `entry.json`.
pub const ENTRY_SCHEMA: &str = "xray.reference-cache/v1";
/// `schema` of a [`KeyMaterial`].
pub const KEY_SCHEMA: &str = "xray.reference-key/v1";
/// sha256 of the oracle package's sources this `xray` was built from (`build.rs`).
pub const ORACLE_SOURCES_SHA256: &str = env!("XRAY_ORACLE_SOURCES_SHA256");

/// The torch and transformers versions a reference is keyed by, and where they were read.
#[derive(Debug, Clone, PartialEq)]
pub struct Versions {
    /// torch's public version (`2.11.0`; a local label such as `+cpu` is not part of it).
    pub torch: String,
    /// transformers' public version.
    pub transformers: String,
    /// Where they come from (for messages).
    pub source: String,
}

/// A version without its local label (`2.11.0+cu130` -> `2.11.0`): the release, as a pin names
/// it.
pub fn public_version(v: &str) -> &str {
    v.split('+').next().unwrap_or(v).trim()
}

impl Versions {
    /// What `oracle/requirements.txt` pins (`torch==X`, `transformers==Y`), embedded when this
    /// `xray` was built: the reference stack an `xray` without Python keys references by (the
    /// one `make venv` installs).
    pub fn pinned() -> anyhow::Result<Versions> {
        let text = include_str!("../../oracle/requirements.txt");
        let pin = |name: &str| {
            text.lines()
                .map(|l| l.split('#').next().unwrap_or("").trim())
                .find_map(|l| {
                    l.strip_prefix(name)?
                        .trim()
                        .strip_prefix("==")
                        .map(str::trim)
                })
                .filter(|v| !v.is_empty())
                .map(str::to_string)
                .ok_or_else(|| {
                    anyhow!("oracle/requirements.txt (built in) pins no {name}==VERSION")
                })
        };
        Ok(Versions {
            torch: pin("torch")?,
            transformers: pin("transformers")?,
            source: "as oracle/requirements.txt pins them (this xray has no Python)".into(),
        })
    }

    /// The versions installed in the oracle's venv (their `dist-info`, read without starting
    /// Python).
    #[cfg(feature = "oracle")]
    pub fn installed(oracle: &xray_oracle::Oracle) -> anyhow::Result<Versions> {
        let v = |name: &str| -> anyhow::Result<String> {
            Ok(public_version(&oracle.distribution_version(name)?).to_string())
        };
        Ok(Versions {
            torch: v("torch")?,
            transformers: v("transformers")?,
            source: format!("as installed in {}", oracle.site_packages.display()),
        })
    }
}

/// Everything a reference dump depends on, by content; its sha256 is the cache key
/// ([`KeyMaterial::key`]). Field order is the serialization order, so the key is stable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyMaterial {
    /// [`KEY_SCHEMA`].
    pub schema: String,
    /// Model family.
    pub family: String,
    /// sha256 of the weights file the runtime read (the reference's `weights_sha256`).
    pub weights_sha256: String,
    /// sha256 of every other regular, non-hidden file at the top of the model directory, by
    /// name (config.json, generation_config.json, preprocessor_config.json, the tokenizer...):
    /// what the reference reads besides the weights.
    pub model_files: BTreeMap<String, String>,
    /// sha256 of the audio file's bytes (the dump's `audio_sha256`).
    pub audio_sha256: String,
    /// sha256 of the 16 kHz mono samples after conversion: what the reference computes on.
    pub samples_sha256: String,
    /// sha256 of the contract resolved against the model's config (what the oracle is sent).
    pub contract_sha256: String,
    /// sha256 of the oracle package's sources ([`ORACLE_SOURCES_SHA256`]).
    pub oracle_sha256: String,
    /// torch's public version.
    pub torch: String,
    /// transformers' public version.
    pub transformers: String,
    /// `float32` or `float64` (calibration).
    pub dtype: String,
    /// The cap on generated tokens (`--max-steps`).
    pub max_new_tokens: Option<usize>,
    /// Teacher ids the reference was forced on.
    pub teacher: Option<Vec<i64>>,
    /// The checkpoint selection (`None`: every checkpoint of the contract).
    pub only: Option<Vec<String>>,
    /// The op-level points: `"none"`, `"all"`, or the sorted names.
    pub ops: serde_json::Value,
    /// Summaries instead of tensors.
    pub stats_only: bool,
    /// The reference variant (`int8`, ...), `None` for the reference itself.
    pub weights_variant: Option<String>,
    /// torch threads.
    pub threads: Option<usize>,
}

impl KeyMaterial {
    /// The material of `req` for a model whose weights file (`weights`, as the runtime read it)
    /// has sha256 `weights_sha256`. The request must carry the decoded samples' hashes
    /// ([`OracleRequest::with_samples`]): a reference keyed by a path would be a guess.
    pub fn of(
        req: &OracleRequest,
        weights: &Path,
        weights_sha256: &str,
        versions: &Versions,
    ) -> anyhow::Result<KeyMaterial> {
        let audio_sha256 = req.audio_sha256.clone().ok_or_else(|| {
            anyhow!(
                "{}: the reference cache keys the audio by content, and this request carries no audio sha256",
                req.audio.display()
            )
        })?;
        let samples_sha256 = req
            .audio_conversion
            .as_ref()
            .and_then(|c| c.get("samples_sha256"))
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .ok_or_else(|| {
                anyhow!(
                    "{}: the reference cache keys the converted samples, and this request carries no samples_sha256",
                    req.audio.display()
                )
            })?;
        if weights_sha256.is_empty() {
            bail!(
                "{}: the weights have no sha256 (an in-memory table): nothing to key a reference by",
                weights.display()
            );
        }
        let ops = match &req.ops {
            s if s.is_none() => serde_json::json!("none"),
            PointSelect::All => serde_json::json!("all"),
            PointSelect::Only(names) => serde_json::json!(names),
            PointSelect::None => serde_json::json!("none"),
        };
        Ok(KeyMaterial {
            schema: KEY_SCHEMA.into(),
            family: req.family.clone(),
            weights_sha256: weights_sha256.into(),
            model_files: model_files(&req.model_dir, weights)?,
            audio_sha256,
            samples_sha256,
            contract_sha256: req.contract.resolved_sha256(),
            oracle_sha256: ORACLE_SOURCES_SHA256.into(),
            torch: versions.torch.clone(),
            transformers: versions.transformers.clone(),
            dtype: req.dtype.clone(),
            max_new_tokens: req.max_new_tokens,
            teacher: req.teacher.clone(),
            only: req.only.clone(),
            ops,
            stats_only: req.stats_only,
            weights_variant: req.weights_variant.clone(),
            threads: req.threads,
        })
    }

    /// The key: sha256 of the material's JSON (64 hex digits).
    pub fn key(&self) -> String {
        // Strings, numbers and maps with string keys: serialization cannot fail.
        sha256_hex(serde_json::to_string(self).unwrap_or_default().as_bytes())
    }

    /// The fields where `other` differs, as `name: this vs other`.
    fn differences(&self, other: &KeyMaterial) -> Vec<String> {
        let (a, b) = (serde_json::json!(self), serde_json::json!(other));
        let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
            return vec![];
        };
        a.iter()
            .filter(|(k, v)| b.get(*k) != Some(*v))
            .map(|(k, v)| {
                format!(
                    "{k}: {v} vs {}",
                    b.get(k).unwrap_or(&serde_json::Value::Null)
                )
            })
            .collect()
    }

    /// The dump manifest's own facts must be the key's: an entry whose dump describes another
    /// model, audio, reference stack or capture is corrupt (`what` names it in the error).
    fn check_manifest(&self, m: &xray_core::dump::Manifest, what: &str) -> anyhow::Result<()> {
        let mut bad: Vec<String> = Vec::new();
        let mut eq = |field: &str, got: Option<&str>, want: &str| {
            if got != Some(want) {
                bad.push(format!(
                    "{field} {} (the key says {want})",
                    got.unwrap_or("absent")
                ));
            }
        };
        eq("producer", Some(&m.producer), "oracle");
        eq("family", Some(&m.family), &self.family);
        eq(
            "weights_sha256",
            Some(&m.weights_sha256),
            &self.weights_sha256,
        );
        eq("audio_sha256", Some(&m.audio_sha256), &self.audio_sha256);
        let audio = m.extra.get("audio");
        for field in ["samples_sha256", "oracle_samples_sha256"] {
            eq(
                &format!("extra.audio.{field}"),
                audio.and_then(|a| a.get(field)).and_then(|v| v.as_str()),
                &self.samples_sha256,
            );
        }
        eq(
            "tools.torch",
            m.tools.get("torch").map(|v| public_version(v)),
            &self.torch,
        );
        eq(
            "tools.transformers",
            m.tools.get("transformers").map(|v| public_version(v)),
            &self.transformers,
        );
        let scheme = m
            .extra
            .get("reference_variant")
            .and_then(|v| v.get("scheme"))
            .and_then(|v| v.as_str());
        if scheme != self.weights_variant.as_deref() {
            bad.push(format!(
                "extra.reference_variant.scheme {} (the key says {})",
                scheme.unwrap_or("absent"),
                self.weights_variant.as_deref().unwrap_or("none")
            ));
        }
        if m.stats_only != self.stats_only {
            bad.push(format!(
                "stats_only {} (the key says {})",
                m.stats_only, self.stats_only
            ));
        }
        if bad.is_empty() {
            Ok(())
        } else {
            bail!("{what}: {}", bad.join("; "))
        }
    }
}

/// sha256 of every regular, non-hidden file at the top of `dir` except `weights` (hashed on its
/// own by the runtime), by name. Symbolic links are followed (their target's content counts).
fn model_files(dir: &Path, weights: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let weights = weights.canonicalize().ok();
    let mut out = BTreeMap::new();
    let rd =
        std::fs::read_dir(dir).with_context(|| format!("model directory {}", dir.display()))?;
    for e in rd {
        let e = e.with_context(|| format!("model directory {}", dir.display()))?;
        let name = e.file_name().to_string_lossy().to_string();
        let p = e.path();
        if name.starts_with('.') || !p.is_file() {
            continue;
        }
        if weights.is_some() && p.canonicalize().ok() == weights {
            continue;
        }
        let bytes = std::fs::read(&p).with_context(|| format!("{}", p.display()))?;
        out.insert(name, sha256_hex(&bytes));
    }
    Ok(out)
}

/// `entry.json` of a cache entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryFile {
    /// [`ENTRY_SCHEMA`].
    schema: String,
    /// The key (the entry directory's name).
    key: String,
    /// What the key is the sha256 of.
    material: KeyMaterial,
    /// sha256 of `dump/manifest.json`'s bytes.
    manifest_sha256: String,
    /// The `xray` that wrote it.
    written_by: String,
}

/// A reference cache directory.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
}

/// What a cache lookup found.
pub enum Found {
    /// A verified entry: its dump.
    Hit(Box<Dump>),
    /// No entry under this key.
    Miss,
}

impl Cache {
    /// The cache at `dir`: an existing directory, or a path whose nearest existing ancestor is
    /// one (the directory is created by the first entry stored).
    pub fn open(dir: &Path) -> anyhow::Result<Cache> {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => bail!(
                "--reference-cache {}: exists and is not a directory",
                dir.display()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => bail!("--reference-cache {}: {e}", dir.display()),
        }
        Ok(Cache {
            dir: dir.to_path_buf(),
        })
    }

    /// The cache directory as given.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry directory of `key`.
    pub fn entry_dir(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    /// The entry under `m`'s key, verified (module docs), or [`Found::Miss`]. An entry that
    /// exists and does not verify is an error naming the file: never a miss, never replaced.
    pub fn lookup(&self, m: &KeyMaterial) -> anyhow::Result<Found> {
        let key = m.key();
        let d = self.entry_dir(&key);
        let remove = format!(
            "remove {} to compute it again (X-Ray deletes nothing in a cache but its own temporary directories)",
            d.display()
        );
        match std::fs::symlink_metadata(&d) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Miss),
            Err(e) => bail!("reference cache entry {}: {e}", d.display()),
            Ok(meta) if !meta.is_dir() => bail!(
                "reference cache entry {}: not a directory (not written by X-Ray); {remove}",
                d.display()
            ),
            Ok(_) => {}
        }
        let corrupt = |file: &Path, why: String| {
            anyhow!(
                "reference cache entry {}: {why} (corrupt or tampered); {remove}",
                file.display()
            )
        };
        for e in std::fs::read_dir(&d).with_context(|| format!("{}", d.display()))? {
            let e = e.with_context(|| format!("{}", d.display()))?;
            let name = e.file_name().to_string_lossy().to_string();
            if name != "entry.json" && name != "dump" {
                return Err(corrupt(&e.path(), "a file the entry does not list".into()));
            }
        }
        let ep = d.join("entry.json");
        let text = std::fs::read_to_string(&ep).map_err(|e| corrupt(&ep, e.to_string()))?;
        let entry: EntryFile = serde_json::from_str(&text)
            .map_err(|e| corrupt(&ep, format!("does not parse: {e}")))?;
        if entry.schema != ENTRY_SCHEMA {
            return Err(corrupt(
                &ep,
                format!("schema {:?}, expected {ENTRY_SCHEMA:?}", entry.schema),
            ));
        }
        let recorded = entry.material.key();
        if entry.key != key || recorded != key {
            return Err(corrupt(
                &ep,
                format!(
                    "its key {} and its material's sha256 {recorded} must both be the entry's name {key}",
                    entry.key
                ),
            ));
        }
        if entry.material != *m {
            // Equal hashes of unequal material: the file was edited around its key.
            return Err(corrupt(
                &ep,
                format!(
                    "material differs from the check's: {}",
                    entry.material.differences(m).join("; ")
                ),
            ));
        }
        let dump_dir = d.join("dump");
        let mp = dump_dir.join("manifest.json");
        let bytes = std::fs::read(&mp).map_err(|e| corrupt(&mp, e.to_string()))?;
        let got = sha256_hex(&bytes);
        if got != entry.manifest_sha256 {
            return Err(corrupt(
                &mp,
                format!(
                    "sha256 {got}, {} records {}",
                    ep.display(),
                    entry.manifest_sha256
                ),
            ));
        }
        let dump = Dump::load(&dump_dir)
            .map_err(|e| anyhow!("reference cache entry corrupt or tampered: {e}; {remove}"))?;
        if let Some(f) = dump.unlisted.first() {
            return Err(corrupt(
                &dump_dir.join(f),
                "a file the dump's manifest does not list".into(),
            ));
        }
        m.check_manifest(&dump.manifest, &mp.display().to_string())
            .map_err(|e| anyhow!("reference cache entry {e} (corrupt or tampered); {remove}"))?;
        Ok(Found::Hit(Box::new(dump)))
    }

    /// Stores `dump` (the reference the oracle computed for `m`) under `m`'s key: its manifest
    /// checked against the key first, then written into a fresh temporary directory in the cache
    /// and renamed into place. An entry already there (another process stored it meanwhile) is
    /// verified instead ([`Cache::lookup`]) and kept.
    pub fn store(&self, m: &KeyMaterial, dump: &Dump) -> anyhow::Result<()> {
        let key = m.key();
        m.check_manifest(
            &dump.manifest,
            &format!("the reference computed for key {key}"),
        )
        .context("not cached")?;
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("--reference-cache {}", self.dir.display()))?;
        let fin = self.entry_dir(&key);
        if fin.symlink_metadata().is_ok() {
            return self.lookup(m).map(drop);
        }
        let tmp = fresh_tmp(&self.dir, &key)?;
        let r = (|| -> anyhow::Result<bool> {
            let dump_dir = tmp.join("dump");
            dump.to_writer().write_to(&dump_dir, false)?;
            let mp = dump_dir.join("manifest.json");
            let manifest_sha256 =
                sha256_hex(&std::fs::read(&mp).with_context(|| format!("{}", mp.display()))?);
            let entry = EntryFile {
                schema: ENTRY_SCHEMA.into(),
                key: key.clone(),
                material: m.clone(),
                manifest_sha256,
                written_by: format!("xray {}", env!("CARGO_PKG_VERSION")),
            };
            let ep = tmp.join("entry.json");
            let text = serde_json::to_string_pretty(&entry)? + "\n";
            {
                use std::io::Write;
                let mut f =
                    std::fs::File::create_new(&ep).with_context(|| format!("{}", ep.display()))?;
                f.write_all(text.as_bytes())
                    .and_then(|_| f.sync_all())
                    .with_context(|| format!("{}", ep.display()))?;
            }
            sync_dir(&tmp);
            match std::fs::rename(&tmp, &fin) {
                Ok(()) => {
                    sync_dir(&self.dir);
                    Ok(true)
                }
                // Another process stored the same key first: keep its entry (verified below).
                Err(_) if fin.symlink_metadata().is_ok() => Ok(false),
                Err(e) => Err(anyhow!("{} -> {}: {e}", tmp.display(), fin.display())),
            }
        })();
        if !matches!(r, Ok(true)) && tmp.exists() {
            // Our own fresh directory: nothing but what this call wrote is in it.
            let _ = std::fs::remove_dir_all(&tmp);
        }
        match r {
            Ok(true) => Ok(()),
            Ok(false) => self.lookup(m).map(drop),
            Err(e) => Err(e.context(format!(
                "storing the reference in the cache {}",
                self.dir.display()
            ))),
        }
    }
}

/// A fresh, uniquely named hidden directory in `dir` for one entry being written.
fn fresh_tmp(dir: &Path, key: &str) -> anyhow::Result<PathBuf> {
    for n in 0..10_000u32 {
        let p = dir.join(format!(
            ".xray-entry-{}-{}-{n}.tmp",
            &key[..16.min(key.len())],
            std::process::id()
        ));
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => bail!("{}: {e}", p.display()),
        }
    }
    bail!(
        "{}: could not create a fresh temporary directory",
        dir.display()
    )
}

/// fsync of a directory, best effort (some filesystems refuse it).
fn sync_dir(d: &Path) {
    if let Ok(f) = std::fs::File::open(d) {
        let _ = f.sync_all();
    }
}

/// sha256 of the oracle package's sources under `package_root` (the folder holding
/// `xray_oracle/`), hashed as the build script hashed the ones `xray` was built from.
pub fn oracle_sources_sha256(package_root: &Path) -> anyhow::Result<String> {
    let dir = package_root.join("xray_oracle");
    let material = oracle_sources_material(&dir)
        .with_context(|| format!("the oracle package {}", dir.display()))?;
    Ok(sha256_hex(&material))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_and_public_versions() {
        let v = Versions::pinned().unwrap();
        assert!(!v.torch.is_empty() && !v.transformers.is_empty(), "{v:?}");
        assert!(v.torch.chars().next().unwrap().is_ascii_digit(), "{v:?}");
        assert_eq!(public_version("2.11.0+cu130"), "2.11.0");
        assert_eq!(public_version("5.24.0"), "5.24.0");
    }

    /// Every input of a reference changes its key: each request field, each content hash, a
    /// model file, the versions; the paths do not.
    #[test]
    fn every_input_of_the_reference_is_in_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m");
        std::fs::create_dir_all(&model).unwrap();
        let cfg = serde_json::json!({
            "num_mel_bins": 80, "max_source_positions": 1500, "d_model": 384,
            "decoder_attention_heads": 6, "vocab_size": 51864,
            "encoder_layers": 1, "decoder_layers": 1
        });
        std::fs::write(model.join("config.json"), cfg.to_string()).unwrap();
        std::fs::write(model.join("generation_config.json"), "{}").unwrap();
        std::fs::write(model.join(".hidden"), "not read").unwrap();
        let weights = model.join("model.safetensors");
        std::fs::write(&weights, "weights").unwrap();
        let contract = xray_core::contract::Contract::for_family("whisper", &cfg).unwrap();
        let conv = serde_json::json!({"samples_sha256": "11".repeat(32)});
        let req = OracleRequest::new(&model, Path::new("a.wav"), &contract).with_samples(
            &[0.0],
            &"22".repeat(32),
            conv,
        );
        let v = Versions {
            torch: "2.11.0".into(),
            transformers: "5.24.0".into(),
            source: "test".into(),
        };
        let key = |r: &OracleRequest, w: &str, v: &Versions| {
            KeyMaterial::of(r, &weights, w, v).unwrap().key()
        };
        let base = key(&req, "ab", &v);
        assert_eq!(base, key(&req, "ab", &v), "deterministic");
        let m = KeyMaterial::of(&req, &weights, "ab", &v).unwrap();
        assert_eq!(
            m.model_files.keys().collect::<Vec<_>>(),
            ["config.json", "generation_config.json"],
            "the weights and hidden files are not model files"
        );
        // Paths are not content.
        let mut moved = req.clone();
        moved.audio = "elsewhere/b.wav".into();
        assert_eq!(key(&moved, "ab", &v), base);
        let with = |f: &dyn Fn(&mut OracleRequest)| {
            let mut r = req.clone();
            f(&mut r);
            key(&r, "ab", &v)
        };
        let mut keys = vec![
            base.clone(),
            key(&req, "cd", &v),
            key(
                &req,
                "ab",
                &Versions {
                    torch: "2.10.0".into(),
                    ..v.clone()
                },
            ),
            key(
                &req,
                "ab",
                &Versions {
                    transformers: "5.23.0".into(),
                    ..v.clone()
                },
            ),
            with(&|r| r.dtype = "float64".into()),
            with(&|r| r.max_new_tokens = Some(3)),
            with(&|r| r.teacher = Some(vec![1, 2])),
            with(&|r| r.only = Some(vec![])),
            with(&|r| r.threads = Some(2)),
            with(&|r| r.ops = PointSelect::All),
            with(&|r| r.ops = PointSelect::Only(["x:out".to_string()].into())),
            with(&|r| r.stats_only = true),
            with(&|r| r.weights_variant = Some("int8".into())),
            with(&|r| r.audio_sha256 = Some("33".repeat(32))),
            with(&|r| {
                r.audio_conversion = Some(serde_json::json!({"samples_sha256": "44".repeat(32)}))
            }),
        ];
        std::fs::write(model.join("generation_config.json"), "{\"x\": 1}").unwrap();
        keys.push(key(&req, "ab", &v));
        let n = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), n, "every change gives another key");
        // No samples, no key.
        let mut bare = req.clone();
        bare.audio_conversion = None;
        assert!(KeyMaterial::of(&bare, &weights, "ab", &v).is_err());
    }

    #[test]
    fn the_build_hashed_these_oracle_sources() {
        let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../oracle");
        assert_eq!(oracle_sources_sha256(&here).unwrap(), ORACLE_SOURCES_SHA256);
    }
}
