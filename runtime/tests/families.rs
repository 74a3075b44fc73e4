//! A family is one folder per language plus one registration line each (docs/architecture.md,
//! "Adding a family"): these tests hold that list to the code. Every registered family has a
//! contract, a descriptor, an oracle module with the two entries the dispatch calls, a fixture
//! recipe and committed clips for its self-test; and no source file outside its folders names it
//! in a string literal (its descriptor is where the facts about it are written).

use std::path::{Path, PathBuf};

use xray_runtime::models::families;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("runtime/ has a parent")
        .to_path_buf()
}

#[test]
fn every_family_has_its_contract_descriptor_oracle_module_and_fixture() {
    let root = repo();
    // The fixture recipes: fixtures/build.py and the builders it runs (fixtures/make_*.py).
    let mut recipe = String::new();
    for e in std::fs::read_dir(root.join("fixtures")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "py") {
            recipe.push_str(&std::fs::read_to_string(&p).unwrap());
        }
    }
    for f in families() {
        let name = f.name();
        let d = f.descriptor().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            xray_core::contract::contract_text(name).is_some(),
            "{name}: no core/contracts/{name}.json"
        );
        let module = root.join(format!("oracle/xray_oracle/{}.py", d.oracle_module));
        let text = std::fs::read_to_string(&module)
            .unwrap_or_else(|e| panic!("{name}: {}: {e}", module.display()));
        for entry in ["def run_reference(", "def load_reference("] {
            assert!(
                text.contains(entry),
                "{name}: {} has no `{entry}` (xray_oracle.run / replay call it)",
                module.display()
            );
        }
        let fixture = Path::new(&d.selftest.model)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap();
        assert!(
            recipe.contains(fixture),
            "{name}: no fixtures/*.py builds its self-test fixture {fixture}"
        );
        for clip in [&d.selftest.audio, &d.selftest.second_audio] {
            assert!(
                root.join(clip).is_file(),
                "{name}: self-test clip {clip} is not committed"
            );
        }
    }
}

/// The source files outside any family's folders: every `.rs` and `.py` under the shared crates
/// and the oracle package, with test code cut off (`tests/` folders are not walked; a Rust file's
/// text from its `#[cfg(test)]` on is its unit tests) and Python's docstrings blanked.
fn shared_sources(root: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = [
        "core/src",
        "compare/src",
        "harness/src",
        "runtime/src",
        "oracle/src",
        "oracle/xray_oracle",
        "bindings/python/src",
        "bindings/python/python/xray_parity",
    ]
    .iter()
    .map(|d| root.join(d))
    .collect();
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "__pycache__") {
                    stack.push(p);
                }
                continue;
            }
            let ext = p.extension().and_then(|x| x.to_str());
            if !matches!(ext, Some("rs" | "py")) {
                continue;
            }
            let mut text = std::fs::read_to_string(&p).unwrap();
            if let Some(at) = text.find("#[cfg(test)]") {
                text.truncate(at);
            }
            if ext == Some("py") {
                // Docstrings are documentation (an example may show a family's dump); the code
                // between them is what is held. Line numbers are kept: a docstring's lines become
                // empty ones.
                text = text
                    .split("\"\"\"")
                    .enumerate()
                    .map(|(i, part)| {
                        if i % 2 == 0 {
                            part.to_string()
                        } else {
                            "\n".repeat(part.matches('\n').count())
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("");
            }
            out.push((p, text));
        }
    }
    out
}

#[test]
fn no_shared_source_names_a_family_in_a_string_literal() {
    let root = repo();
    let mut found = Vec::new();
    for f in families() {
        let d = f.descriptor().unwrap();
        let own_rust = root.join("runtime/src/models").join(f.name());
        let own_python = root.join(format!("oracle/xray_oracle/{}.py", d.oracle_module));
        let mut words: Vec<&str> = std::iter::once(f.name())
            .chain(d.model_types.iter().map(String::as_str))
            .collect();
        words.sort_unstable();
        words.dedup();
        for (path, text) in shared_sources(&root) {
            if path.starts_with(&own_rust) || path == own_python {
                continue;
            }
            for w in &words {
                for q in ['"', '\''] {
                    let lit = format!("{q}{w}{q}");
                    if let Some(at) = text.find(&lit) {
                        let line = text[..at].lines().count().max(1);
                        found.push(format!(
                            "{}:{line}: {lit}",
                            path.strip_prefix(&root).unwrap().display()
                        ));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "family names outside their folders (read the descriptor instead, core/families/):\n{}",
        found.join("\n")
    );
}
