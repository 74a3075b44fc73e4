//! The checkpoint id, `{name}@step{step}`: formatted and parsed here and nowhere else in Rust
//! (Python's one spelling is `xray_oracle.dump.checkpoint_key`). A dump's file name is the id plus `.npy`.

use std::fmt;
use std::str::FromStr;

/// A decode step: 0 is the prefill (or the one pass of a non-autoregressive model), K the K-th
/// generated token. The one integer type of a step, in the dump, the graph and the evidence.
pub type Step = usize;

const AT_STEP: &str = "@step";

/// A checkpoint (or op-level point) at a step. Displays as `{name}@step{step}`; [`FromStr`]
/// reads the same spelling back.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CheckpointKey {
    /// The checkpoint's (or point's) name.
    pub name: String,
    /// Its step.
    pub step: Step,
}

impl CheckpointKey {
    /// The key of `name` at `step`.
    pub fn new(name: impl Into<String>, step: Step) -> Self {
        CheckpointKey {
            name: name.into(),
            step,
        }
    }
}

/// The id of `name` at `step`, borrowed: `format!("{}", key(name, step))` is `name@stepK`
/// without building a [`CheckpointKey`].
pub fn key(name: &str, step: Step) -> KeyRef<'_> {
    KeyRef { name, step }
}

/// One checkpoint at several steps, `name@step2..11`: `steps` is the steps' text (ranges and
/// lists, as the evidence writes them).
pub fn key_steps(name: &str, steps: &str) -> String {
    format!("{name}{AT_STEP}{steps}")
}

/// A borrowed [`CheckpointKey`] (see [`key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRef<'a> {
    /// The name.
    pub name: &'a str,
    /// The step.
    pub step: Step,
}

impl fmt::Display for KeyRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{AT_STEP}{}", self.name, self.step)
    }
}

impl fmt::Display for CheckpointKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        key(&self.name, self.step).fmt(f)
    }
}

/// Why a string is not a checkpoint id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a checkpoint id (`name@stepK`, K a step number)")]
pub struct KeyError(pub String);

impl FromStr for CheckpointKey {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, KeyError> {
        let bad = || KeyError(s.to_string());
        let (name, step) = s.rsplit_once(AT_STEP).ok_or_else(bad)?;
        if name.is_empty() || step.is_empty() || !step.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        Ok(CheckpointKey::new(name, step.parse().map_err(|_| bad())?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_reads_back_as_the_key_it_was_made_from() {
        let k = CheckpointKey::new("audio.decoder.layer.3.cross_attention.output", 12);
        assert_eq!(
            k.to_string(),
            "audio.decoder.layer.3.cross_attention.output@step12"
        );
        assert_eq!(k.to_string().parse::<CheckpointKey>().unwrap(), k);
        assert_eq!(key("a:out", 0).to_string(), "a:out@step0");
        // A name may hold '@' (a point of a module named so); the last `@step` splits.
        let odd: CheckpointKey = "x@stepper@step3".parse().unwrap();
        assert_eq!((odd.name.as_str(), odd.step), ("x@stepper", 3));
    }

    #[test]
    fn malformed_ids_are_refused_by_name() {
        for s in [
            "a",
            "a@step",
            "@step1",
            "a@step-1",
            "a@step+1",
            "a@step1x",
            "a@step99999999999999999999999",
        ] {
            let e = s.parse::<CheckpointKey>().unwrap_err();
            assert!(e.to_string().contains(&format!("'{s}'")), "{s}: {e}");
        }
    }
}
