//! Helpers shared by compare's integration tests (`mod common;` in each).
#![allow(dead_code)]

use xray_compare::signatures::Explanation;
use xray_core::SignatureKind;

/// Asserts `x` is a `kind` explanation whose detail says each of `says` (the detail shown when
/// it is not).
pub fn assert_explained(x: &Explanation, kind: SignatureKind, says: &[&str]) {
    assert_eq!(x.signature, kind, "{}", x.detail);
    for s in says {
        assert!(x.detail.contains(s), "{}", x.detail);
    }
}
