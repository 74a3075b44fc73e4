//! Op-level points: the tensors at the boundaries of the reference's modules, named so that any
//! engine can emit them without a contract entry.
//!
//! A point is `{module}:{side}`: `module` is the HF module's dotted path from the model's root
//! (`model.encoder.layers.3.fc2`, the prefix of its weight keys), `side` is `in` (the module's
//! first positional input, a forward pre-hook) or `out` (its output, a forward hook), or, for a
//! decoder's self-attention, `keys` / `values`: the cache it holds after the call (the past
//! positions and this step's), the state an engine carries from step to step. An engine
//! maps each op that loads weights to the module its weight keys name, and observes the op's first
//! input as `:in` and its output as `:out`; a weightless op's output is observed where the
//! reference exposes it as some module's input (an activation's output is `fc2:in`, a residual sum
//! is the next norm's `:in`).
//!
//! Points are dump entries like any checkpoint (name, step, layout); the leading batch axis of 1
//! is dropped. They are opt-in ([`PointSelect`]): a run without `--ops` emits none.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Which side of a module a point observes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    /// The module's first positional input (forward pre-hook).
    In,
    /// The module's output (forward hook).
    Out,
    /// The keys of the module's self-attention cache after the call, `[heads, past+tokens,
    /// head_dim]`: what an engine's cache append writes and carries to the next step.
    Keys,
    /// The values of that cache.
    Values,
}

impl Side {
    /// `in` or `out`.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::In => "in",
            Side::Out => "out",
            Side::Keys => "keys",
            Side::Values => "values",
        }
    }
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `model.encoder.layers.3.fc2` + [`Side::Out`] -> `model.encoder.layers.3.fc2:out`.
pub fn point_name(module: &str, side: Side) -> String {
    format!("{module}:{side}")
}

/// The module and side of a point name; `None` for a contract checkpoint name (no `:in` /
/// `:out` / `:keys` / `:values` suffix, or an empty module).
pub fn parse_point(name: &str) -> Option<(&str, Side)> {
    let (module, side) = name.rsplit_once(':')?;
    let side = match side {
        "in" => Side::In,
        "out" => Side::Out,
        "keys" => Side::Keys,
        "values" => Side::Values,
        _ => return None,
    };
    (!module.is_empty()).then_some((module, side))
}

/// Whether `name` is an op-level point (not a contract checkpoint).
pub fn is_point(name: &str) -> bool {
    parse_point(name).is_some()
}

/// The module a weight key belongs to: `model.encoder.layers.3.fc2.weight` ->
/// `model.encoder.layers.3.fc2`; `None` for a key without a dot.
pub fn module_of_weight_key(key: &str) -> Option<&str> {
    key.rsplit_once('.')
        .map(|(m, _)| m)
        .filter(|m| !m.is_empty())
}

/// Which op-level points a run emits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PointSelect {
    /// None (the default: a run emits only contract checkpoints).
    #[default]
    None,
    /// Every point the engine can name (`--ops`).
    All,
    /// Only these point names (a drill-down into one region); an engine may also take its own
    /// edge names here (X-Ray's runtime does, to check a layout op it suspects).
    Only(BTreeSet<String>),
}

impl PointSelect {
    /// Whether point `name` is wanted.
    pub fn wants(&self, name: &str) -> bool {
        match self {
            PointSelect::None => false,
            PointSelect::All => true,
            PointSelect::Only(s) => s.contains(name),
        }
    }

    /// Whether no point is wanted.
    pub fn is_none(&self) -> bool {
        match self {
            PointSelect::None => true,
            PointSelect::All => false,
            PointSelect::Only(s) => s.is_empty(),
        }
    }
}

/// One observed edge of an engine's graph, for localizing within a region: the point names it
/// carries (aliases of one tensor, e.g. `...self_attn_layer_norm:out` and `...q_proj:in`), the
/// nearest observed edges upstream, and the engine's ops between those and this one (the suspects
/// when this is the first point to differ while its inputs agree).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PointNode {
    /// Point names of the edge; the first is the one a drill-down captures.
    pub names: Vec<String>,
    /// Indices (into the same list) of the nearest observed edges upstream.
    pub inputs: Vec<usize>,
    /// The engine's ops from those edges to this one, in graph order (empty for a feed).
    pub ops: Vec<String>,
}

/// A chain of points in firing order (each point's input is the one before it): the graph a dump
/// without an engine graph implies (another engine's dump; the reference's hooks fire in execution
/// order). `ops` name the modules themselves.
pub fn chain(names: &[String]) -> Vec<PointNode> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| PointNode {
            names: vec![n.clone()],
            inputs: if i == 0 { vec![] } else { vec![i - 1] },
            ops: parse_point(n)
                .map(|(m, _)| vec![m.to_string()])
                .unwrap_or_default(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_checkpoints_are_not_points() {
        let n = point_name("model.encoder.layers.3.fc2", Side::Out);
        assert_eq!(n, "model.encoder.layers.3.fc2:out");
        assert_eq!(
            parse_point(&n),
            Some(("model.encoder.layers.3.fc2", Side::Out))
        );
        assert_eq!(parse_point("m.fc1:in"), Some(("m.fc1", Side::In)));
        for c in [
            "audio.encoder.layer.3.out",
            "enc.block.7.out",
            ":out",
            "a:b",
        ] {
            assert!(!is_point(c), "{c}");
        }
        assert_eq!(
            module_of_weight_key("model.encoder.layers.3.fc2.weight"),
            Some("model.encoder.layers.3.fc2")
        );
        assert_eq!(module_of_weight_key("weight"), None);
    }

    #[test]
    fn select() {
        assert!(!PointSelect::None.wants("a:out"));
        assert!(PointSelect::All.wants("a:out"));
        let only = PointSelect::Only(["a:out".to_string()].into());
        assert!(only.wants("a:out") && !only.wants("a:in"));
        assert!(PointSelect::Only(BTreeSet::new()).is_none());
    }
}
