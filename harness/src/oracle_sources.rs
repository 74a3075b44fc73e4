// Shared by the build script (`include!`) and the library (`refcache`): what identifies the
// oracle package's code, so both hash one thing.

/// The bytes whose sha256 identifies the oracle package's code: every `*.py` file directly in
/// `dir` (the `xray_oracle/` folder), in name order, each as its name, a NUL, its length in
/// decimal, a NUL, then its bytes. The build script hashes the sources `xray` is built from
/// (`XRAY_ORACLE_SOURCES_SHA256`); an `xray` with the oracle hashes the package it imports.
pub fn oracle_sources_material(dir: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let mut files: Vec<(String, std::path::PathBuf)> = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().to_string();
        if name.ends_with(".py") && e.file_type()?.is_file() {
            files.push((name, e.path()));
        }
    }
    if files.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{}: no *.py files (not the xray_oracle package)", dir.display()),
        ));
    }
    files.sort();
    let mut out = Vec::new();
    for (name, path) in files {
        let bytes = std::fs::read(&path)?;
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(bytes.len().to_string().as_bytes());
        out.push(0);
        out.extend_from_slice(&bytes);
    }
    Ok(out)
}
