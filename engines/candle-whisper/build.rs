//! Records the resolved candle-transformers version (from the workspace Cargo.lock) so the dump's
//! `tools` names the exact engine release that ran.

fn main() {
    let lock = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    let text = std::fs::read_to_string(&lock).unwrap_or_default();
    let mut version = None;
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l.trim() == "name = \"candle-transformers\"" {
            version = lines
                .next()
                .and_then(|v| v.trim().strip_prefix("version = \""))
                .and_then(|v| v.strip_suffix('"'))
                .map(str::to_string);
            break;
        }
    }
    match version {
        Some(v) => println!("cargo:rustc-env=XRAY_CANDLE_VERSION={v}"),
        None => panic!(
            "{}: no candle-transformers entry; build inside the X-Ray workspace",
            lock.display()
        ),
    }
}
