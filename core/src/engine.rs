//! What an engine that writes X-Ray dumps shares, whatever it computes with: its run's identity
//! (the manifest's identity fields, and the check that a reference dump it is fed was made from
//! the same weights and audio) and the record of what it was fed (`extra.fed`,
//! docs/dump-format.md).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use crate::dump::Manifest;

/// The identity of one engine run: what its dump's manifest says it ran, and what a reference
/// dump fed to it must have been made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunIdentity {
    /// Model directory as given.
    pub model_id: String,
    /// sha256 of the HF weights (for an engine on converted weights, of the HF weights they were
    /// converted from).
    pub weights_sha256: String,
    /// sha256 of the input audio file.
    pub audio_sha256: String,
}

impl RunIdentity {
    /// A full (not stats-only) manifest of `family` by `producer` for this run, with nothing
    /// recorded yet but the run's tools, tokens and transcript (no checkpoints, extras or engine
    /// weights).
    pub fn manifest(
        &self,
        family: &str,
        producer: &str,
        tools: BTreeMap<String, String>,
        tokens: Vec<i64>,
        transcript: String,
    ) -> Manifest {
        Manifest {
            weights_sha256: self.weights_sha256.clone(),
            audio_sha256: self.audio_sha256.clone(),
            tools,
            tokens,
            transcript,
            ..Manifest::empty(family, &self.model_id, producer)
        }
    }

    /// Refuses a reference dump (at `dir`, manifest `m`) made from other weights or audio than
    /// this run: the error names the dump, what differs and both hashes.
    pub fn check_reference(&self, dir: &Path, m: &Manifest) -> Result<(), String> {
        for (what, theirs, ours) in [
            ("weights", &m.weights_sha256, &self.weights_sha256),
            ("audio", &m.audio_sha256, &self.audio_sha256),
        ] {
            if theirs != ours {
                return Err(format!(
                    "{}: made from other {what} (sha256 {theirs}, this run's is {ours})",
                    dir.display()
                ));
            }
        }
        Ok(())
    }
}

/// The token-id list `key` of a generation_config.json (`file`, parsed as `v`): empty when the key
/// is absent or null (HF's `generate` applies no such processor); an error naming the file, the
/// key and the value when it is not a list of ids that fit `T`.
pub fn token_ids<T: TryFrom<u64>>(v: &Value, file: &Path, key: &str) -> Result<Vec<T>, String> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_u64().and_then(|n| T::try_from(n).ok()).ok_or_else(|| {
                    format!("{}: '{key}' holds {x}, expected token ids", file.display())
                })
            })
            .collect(),
        Some(x) => Err(format!(
            "{}: '{key}' is {x}, expected a list of token ids",
            file.display()
        )),
    }
}

/// An engine binary's exit: success, or its error said on stderr as `{tool}: error: {e}` and its
/// own exit `code`.
pub fn exit<E: std::fmt::Display>(
    tool: &str,
    result: Result<(), E>,
    code: impl Fn(&E) -> u8,
) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{tool}: error: {e}");
            std::process::ExitCode::from(code(&e))
        }
    }
}

/// One `extra.fed` record: the reference dump at `dir` fed `into` the engine's function `into`.
pub fn fed(dir: &Path, into: &str) -> Value {
    json!({"from": dir.display().to_string(), "into": into})
}

/// One `extra.fed` record of teacher forcing: [`fed`] with the whole `tokens` sequence the
/// decoder was given (prompt and fed tokens).
pub fn fed_tokens<T: serde::Serialize>(dir: &Path, into: &str, tokens: &[T]) -> Value {
    let mut v = fed(dir, into);
    v["tokens"] = json!(tokens);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> RunIdentity {
        RunIdentity {
            model_id: "m".into(),
            weights_sha256: "w".into(),
            audio_sha256: "a".into(),
        }
    }

    #[test]
    fn a_reference_of_other_weights_or_audio_is_refused_by_name() {
        let dir = Path::new("ref");
        let same = id().manifest("whisper", "oracle", BTreeMap::new(), vec![1], "x".into());
        assert_eq!(same.model_id, "m");
        assert!(!same.stats_only && same.checkpoints.is_empty());
        assert_eq!(id().check_reference(dir, &same), Ok(()));
        let other = Manifest {
            audio_sha256: "b".into(),
            ..same.clone()
        };
        let e = id().check_reference(dir, &other).unwrap_err();
        assert_eq!(e, "ref: made from other audio (sha256 b, this run's is a)");
        let other = Manifest {
            weights_sha256: "v".into(),
            ..same
        };
        assert!(id()
            .check_reference(dir, &other)
            .unwrap_err()
            .contains("other weights"));
    }

    #[test]
    fn token_ids_are_a_list_of_ids_or_nothing() {
        let v = json!({"a": [1, 2], "n": null, "neg": [-1], "s": "x"});
        let f = Path::new("g.json");
        assert_eq!(token_ids::<u32>(&v, f, "a"), Ok(vec![1, 2]));
        assert_eq!(token_ids::<i32>(&v, f, "n"), Ok(vec![]));
        assert_eq!(token_ids::<i32>(&v, f, "absent"), Ok(vec![]));
        assert_eq!(
            token_ids::<u32>(&v, f, "neg"),
            Err("g.json: 'neg' holds -1, expected token ids".into())
        );
        assert_eq!(
            token_ids::<u32>(&v, f, "s"),
            Err("g.json: 's' is \"x\", expected a list of token ids".into())
        );
    }

    #[test]
    fn fed_records_say_from_where_into_what() {
        let v = fed_tokens(Path::new("r"), "decode", &[1u32, 2]);
        assert_eq!(v, json!({"from": "r", "into": "decode", "tokens": [1, 2]}));
    }
}
