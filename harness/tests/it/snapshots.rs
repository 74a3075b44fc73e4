//! insta snapshots of the Markdown and of the evidence JSON (volatile fields redacted, floats
//! rounded). Review changes with `cargo insta review`; never commit `.snap.new` files.

use crate::common;

#[test]
fn tiny_evidence_json() {
    xray_snapshot!(evidence "tiny_evidence", &common::tiny_evidence());
}

#[test]
fn tiny_markdown() {
    xray_snapshot!(markdown "tiny_markdown", &common::tiny_evidence());
}

#[test]
fn whisper_fault_markdown() {
    xray_snapshot!(markdown "whisper_fault_markdown", &common::whisper_evidence(true));
}

#[test]
fn whisper_pass_markdown() {
    xray_snapshot!(markdown "whisper_pass_markdown", &common::whisper_evidence(false));
}
