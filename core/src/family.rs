//! Family descriptors (`core/families/<family>.json`): what X-Ray knows about a family beyond its
//! checkpoint contract, declared once and read by both languages. Rust reads them here; the
//! oracle's Python receives the same texts (`xray_oracle.families.register`, called by the oracle
//! crate before any family is dispatched), so neither side lists families.
//!
//! A descriptor says: the config.json `model_type` values the family loads, the files its
//! reference needs, its capabilities (stats-only capture, teacher forcing, reference variants,
//! `xray bench`), the extras its reference returns and their kind, the oracle's Python module
//! (a module of the `xray_oracle` package, never a path), and its self-test fixture.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::contract::{contract_text, DESCRIPTORS};
use crate::error::{CoreError, Result};

/// `schema` of a descriptor file.
pub const SCHEMA: &str = "xray.family/v1";

/// One family's descriptor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Descriptor {
    /// [`SCHEMA`].
    pub schema: String,
    /// The family's name: its file stem, its contract's `family`.
    pub family: String,
    /// One line for people.
    pub about: String,
    /// config.json `model_type` values this family loads.
    pub model_types: Vec<String>,
    /// Files the reference reads besides config.json and the weights.
    pub required_files: Vec<String>,
    /// Files only a full reference run reads (not loading the model alone).
    pub run_files: Vec<String>,
    /// What the family's runtime and reference can do.
    pub capabilities: Capabilities,
    /// Extras the reference returns (`name` -> kind), kept in the dump's `extra`.
    pub reference_extras: BTreeMap<String, ExtraKind>,
    /// The oracle's module for the family: `xray_oracle.<oracle_module>` (a name, never a path).
    pub oracle_module: String,
    /// The bundled fixture `xray selftest` plants faults on (paths relative to the repository).
    pub selftest: SelftestFixture,
}

/// A family's capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    /// `--stats-only`: per-checkpoint summaries instead of tensors on both sides.
    pub stats_only: bool,
    /// The reference can be teacher-forced with the runtime's hypothesis.
    pub teacher_forcing: bool,
    /// `--reference-variant`: a second reference with its weights on a grid.
    pub reference_variants: bool,
    /// `xray bench` measures it (against torch and CTranslate2).
    pub bench: bool,
}

/// The kind of a reference extra.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExtraKind {
    /// A list of integer token ids.
    TokenIds,
}

/// The self-test's fixture of a family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelftestFixture {
    /// The model directory.
    pub model: String,
    /// The clip faults are planted on.
    pub audio: String,
    /// A second clip (faults that need another input).
    pub second_audio: String,
}

fn ferr(family: &str, reason: String) -> CoreError {
    CoreError::Contract {
        family: family.to_string(),
        reason: format!("descriptor (core/families/{family}.json): {reason}"),
    }
}

fn parse(stem: &str, text: &str) -> Result<Descriptor> {
    let d: Descriptor = serde_json::from_str(text).map_err(|e| ferr(stem, e.to_string()))?;
    if d.schema != SCHEMA {
        return Err(ferr(
            stem,
            format!("schema is '{}', not '{SCHEMA}'", d.schema),
        ));
    }
    if d.family != stem {
        return Err(ferr(
            stem,
            format!("family is '{}', the file is {stem}.json", d.family),
        ));
    }
    if contract_text(stem).is_none() {
        return Err(ferr(
            stem,
            format!("no contract core/contracts/{stem}.json"),
        ));
    }
    if d.model_types.is_empty() {
        return Err(ferr(stem, "model_types is empty".into()));
    }
    let module_ok = !d.oracle_module.is_empty()
        && d.oracle_module
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !module_ok {
        return Err(ferr(
            stem,
            format!(
                "oracle_module '{}' is not a module name ([a-z0-9_]+)",
                d.oracle_module
            ),
        ));
    }
    Ok(d)
}

fn all() -> &'static std::result::Result<Vec<Descriptor>, String> {
    static ALL: OnceLock<std::result::Result<Vec<Descriptor>, String>> = OnceLock::new();
    ALL.get_or_init(|| {
        let ds = DESCRIPTORS
            .iter()
            .map(|(stem, text)| parse(stem, text))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| e.to_string())?;
        for (i, d) in ds.iter().enumerate() {
            for other in &ds[i + 1..] {
                if let Some(mt) = d.model_types.iter().find(|m| other.model_types.contains(m)) {
                    return Err(format!(
                        "model_type '{mt}' is claimed by families {} and {}",
                        d.family, other.family
                    ));
                }
            }
        }
        Ok(ds)
    })
}

/// Every embedded descriptor, checked (schema, name, contract, module name, no model_type
/// claimed twice).
pub fn descriptors() -> Result<&'static [Descriptor]> {
    all()
        .as_ref()
        .map(|v| v.as_slice())
        .map_err(|e| CoreError::Contract {
            family: "*".into(),
            reason: e.clone(),
        })
}

/// The descriptor of `family`, or an error naming the known families.
pub fn descriptor(family: &str) -> Result<&'static Descriptor> {
    let ds = descriptors()?;
    ds.iter().find(|d| d.family == family).ok_or_else(|| {
        let known: Vec<&str> = ds.iter().map(|d| d.family.as_str()).collect();
        ferr(
            family,
            format!("no such family (known: {})", known.join(", ")),
        )
    })
}

/// Every descriptor as one JSON object `{family: descriptor}`: what the oracle's Python is
/// handed (`xray_oracle.families.register`).
pub fn descriptors_json() -> Result<String> {
    let map: BTreeMap<&str, &Descriptor> = descriptors()?
        .iter()
        .map(|d| (d.family.as_str(), d))
        .collect();
    serde_json::to_string(&map).map_err(|e| ferr("*", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_contract_has_a_descriptor_and_back() {
        let ds = descriptors().unwrap();
        let mut names: Vec<&str> = ds.iter().map(|d| d.family.as_str()).collect();
        let mut contracts: Vec<&str> = crate::contract::families().collect();
        names.sort();
        contracts.sort();
        assert_eq!(names, contracts);
        assert!(descriptor("nope")
            .unwrap_err()
            .to_string()
            .contains("known:"));
    }

    #[test]
    fn a_malformed_descriptor_is_refused_naming_the_field() {
        let good = DESCRIPTORS[0].1;
        let stem = DESCRIPTORS[0].0;
        let mut v: serde_json::Value = serde_json::from_str(good).unwrap();
        v["oracle_module"] = "../../x".into();
        let e = parse(stem, &v.to_string()).unwrap_err().to_string();
        assert!(e.contains("oracle_module '../../x'"), "{e}");
        let mut v: serde_json::Value = serde_json::from_str(good).unwrap();
        v["capabilities"]["gpu"] = true.into();
        let e = parse(stem, &v.to_string()).unwrap_err().to_string();
        assert!(e.contains("unknown field `gpu`"), "{e}");
        let e = parse("other", good).unwrap_err().to_string();
        assert!(e.contains("the file is other.json"), "{e}");
        let mut v: serde_json::Value = serde_json::from_str(good).unwrap();
        v["reference_extras"]["x"] = "tensor".into();
        assert!(parse(stem, &v.to_string()).is_err());
    }
}
