//! Embeds every `contracts/<family>.json` and `families/<family>.json` (a new family's contract
//! and descriptor are picked up by adding the files; no list to edit).

use std::fmt::Write as _;

fn main() {
    let mut out = String::new();
    embed(
        &mut out,
        "contracts",
        "CONTRACTS",
        "`(family, contract text)` of every file in core/contracts, by name.",
    );
    embed(
        &mut out,
        "families",
        "DESCRIPTORS",
        "`(family, descriptor text)` of every file in core/families, by name.",
    );
    let dest = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("contracts.rs");
    std::fs::write(&dest, out).unwrap_or_else(|e| panic!("{}: {e}", dest.display()));
}

fn embed(out: &mut String, sub: &str, konst: &str, doc: &str) {
    // Read at run time: a build script compiled for one checkout and re-run for another (a shared
    // target directory) must embed the files of the checkout being built.
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let dir = std::path::Path::new(&manifest_dir).join(sub);
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    writeln!(out, "/// {doc}\npub const {konst}: &[(&str, &str)] = &[").unwrap();
    for p in &files {
        println!("cargo:rerun-if-changed={}", p.display());
        let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        writeln!(
            out,
            "    ({stem:?}, include_str!({:?})),",
            p.display().to_string()
        )
        .unwrap();
    }
    out.push_str("];\n");
}
