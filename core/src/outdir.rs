//! Output directories X-Ray writes whole (a dump, a repro case): where one may be written, and
//! writing one so that no reader ever sees half of it and nothing X-Ray did not write is deleted.
//! The dump writer ([`crate::dump::DumpWriter`]) and the compare crate's case writer both go
//! through here; a [`Kind`] says how each names itself and recognises its manifest.

use std::path::{Path, PathBuf};

/// A kind of output directory: how messages name it and how its manifest is recognised.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    /// What messages call it: `dump`, `case`.
    pub noun: &'static str,
    /// Its manifest's file name.
    pub manifest: &'static str,
    /// The manifest's `schema` value.
    pub schema: &'static str,
    /// The files a parsed manifest lists, the manifest itself included: relative paths, at most
    /// one directory deep (`weights/w0.npy`).
    pub listed: fn(&serde_json::Value) -> Vec<String>,
}

/// An output directory refused, or a failure writing one: the path at fault and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct Refused {
    /// The file or directory at fault.
    pub path: PathBuf,
    /// Why.
    pub reason: String,
}

fn refused(path: &Path, reason: impl Into<String>) -> Refused {
    Refused {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Refused + '_ {
    move |e| refused(path, e.to_string())
}

/// What an output directory holds now.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// Nothing there yet (the nearest existing ancestor is a directory).
    Absent,
    /// An empty directory.
    Empty,
    /// One of X-Ray's, of this kind, holding nothing its manifest does not list.
    Existing {
        /// The listed files present there (what replacing it removes).
        files: Vec<String>,
    },
}

/// Nothing there: not found, or a path component is a file (then an ancestor check names it).
fn absent(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

/// `(name, is a regular file, is a directory)` of every entry of directory `d`; a symbolic link is
/// neither (its type, not its target's).
fn entries(d: &Path) -> Result<Vec<(String, bool, bool)>, Refused> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(d).map_err(io(d))? {
        let e = e.map_err(io(d))?;
        let t = e.file_type().map_err(io(d))?;
        v.push((
            e.file_name().to_string_lossy().to_string(),
            t.is_file(),
            t.is_dir(),
        ));
    }
    Ok(v)
}

/// Checks that an output of `kind` may be written to `dir` (run it before the expensive work;
/// [`write_whole`] runs it again): absent, empty, or (only with `replace`) an X-Ray output of
/// this kind holding nothing its manifest does not list. A file, a symbolic link, a non-empty
/// directory that is not such an output, one holding other files, or an ancestor that is not a
/// directory is refused, naming it.
pub fn check_target(dir: &Path, kind: &Kind, replace: bool) -> Result<Target, Refused> {
    let noun = kind.noun;
    let meta = match std::fs::symlink_metadata(dir) {
        Err(e) if absent(&e) => {
            let mut a = dir.parent();
            while let Some(p) = a.filter(|p| !p.as_os_str().is_empty()) {
                match std::fs::metadata(p) {
                    Ok(m) if m.is_dir() => return Ok(Target::Absent),
                    Ok(_) => {
                        let why = format!("is not a directory (needed as a parent of the {noun})");
                        return Err(refused(p, why));
                    }
                    Err(e) if absent(&e) => a = p.parent(),
                    Err(e) => return Err(refused(p, e.to_string())),
                }
            }
            return Ok(Target::Absent);
        }
        Err(e) => return Err(refused(dir, e.to_string())),
        Ok(m) => m,
    };
    if meta.file_type().is_symlink() {
        let why = format!(
            "is a symbolic link; give the real directory (a {noun} is replaced by renaming)"
        );
        return Err(refused(dir, why));
    }
    if !meta.is_dir() {
        return Err(refused(dir, "exists and is not a directory"));
    }
    let top = entries(dir)?;
    if top.is_empty() {
        return Ok(Target::Empty);
    }
    let (manifest, schema) = (kind.manifest, kind.schema);
    let not_ours = || {
        refused(
            dir,
            format!("is not empty and is not an X-Ray {noun} (no {schema} {manifest}); refusing to write there, choose a new or empty directory"),
        )
    };
    let text = std::fs::read_to_string(dir.join(manifest)).map_err(|_| not_ours())?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|_| not_ours())?;
    if v.get("schema").and_then(|s| s.as_str()) != Some(schema) {
        return Err(not_ours());
    }
    let mut files = (kind.listed)(&v);
    // What is there, one directory deep where the manifest lists files in that directory (a real
    // directory: a link to one is foreign, so replacing never deletes through it).
    let mut present = Vec::new();
    for (name, is_file, is_dir) in top {
        let prefix = format!("{name}/");
        if is_dir && files.iter().any(|f| f.starts_with(&prefix)) {
            for (f, sub_is_file, _) in entries(&dir.join(&name))? {
                present.push((format!("{prefix}{f}"), sub_is_file));
            }
        } else {
            present.push((name, is_file));
        }
    }
    let foreign: Vec<&str> = present
        .iter()
        .filter(|(n, is_file)| !is_file || !files.contains(n))
        .map(|(n, _)| n.as_str())
        .collect();
    if !foreign.is_empty() {
        return Err(refused(
            dir,
            format!(
                "is an X-Ray {noun} but also holds what its {manifest} does not list ({}); move those away or choose another directory",
                foreign.join(", ")
            ),
        ));
    }
    if !replace {
        let why = format!("already holds an X-Ray {noun}; pass --force to replace it");
        return Err(refused(dir, why));
    }
    files.retain(|f| present.iter().any(|(n, _)| n == f));
    Ok(Target::Existing { files })
}

/// Creates a fresh, uniquely named hidden sibling directory `.{base}.xray-{tag}-{pid}-{n}`.
fn fresh_sibling(parent: &Path, base: &str, tag: &str) -> Result<PathBuf, Refused> {
    for n in 0..10_000u32 {
        let p = parent.join(format!(".{base}.xray-{tag}-{}-{n}", std::process::id()));
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(refused(&p, e.to_string())),
        }
    }
    Err(refused(
        parent,
        "could not create a fresh temporary directory",
    ))
}

/// Writes an output of `kind` into `dir` atomically: `fill` writes everything into a fresh
/// temporary sibling directory, which is renamed into place once complete. `dir` may be absent or
/// empty; an existing output of this kind is replaced only when `replace` is true (`--force`), and
/// then only after the new one is complete, removing only the files its manifest listed. Anything
/// else at `dir` is refused ([`check_target`]); nothing X-Ray did not write is deleted. On a
/// failure the temporary directory (X-Ray's own) is removed.
pub fn write_whole<E: From<Refused>>(
    dir: &Path,
    kind: &Kind,
    replace: bool,
    fill: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<(), E> {
    let target = check_target(dir, kind, replace)?;
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let base = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(kind.noun);
    let tmp = fresh_sibling(parent, base, "tmp")?;
    let result = fill(&tmp).and_then(|()| {
        put_in_place(&tmp, dir, &target, (parent, base), kind.noun).map_err(E::from)
    });
    if result.is_err() && tmp.exists() {
        // Our own fresh directory: nothing else can be in it.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Renames the complete `tmp` to `dir`, over what `target` found there.
fn put_in_place(
    tmp: &Path,
    dir: &Path,
    target: &Target,
    (parent, base): (&Path, &str),
    noun: &str,
) -> Result<(), Refused> {
    match target {
        Target::Absent => std::fs::rename(tmp, dir).map_err(io(dir)),
        Target::Empty => {
            // remove_dir only removes an empty directory.
            std::fs::remove_dir(dir).map_err(io(dir))?;
            std::fs::rename(tmp, dir).map_err(io(dir))
        }
        Target::Existing { files } => {
            let old = fresh_sibling(parent, base, "old")?;
            std::fs::remove_dir(&old).map_err(io(&old))?;
            std::fs::rename(dir, &old).map_err(io(dir))?;
            if let Err(e) = std::fs::rename(tmp, dir) {
                let _ = std::fs::rename(&old, dir);
                return Err(refused(dir, e.to_string()));
            }
            // The new output is in place; remove only what the old manifest listed, then the
            // directories those files were in.
            for f in files {
                let _ = std::fs::remove_file(old.join(f));
            }
            for f in files {
                if let Some((sub, _)) = f.split_once('/') {
                    let _ = std::fs::remove_dir(old.join(sub));
                }
            }
            std::fs::remove_dir(&old).map_err(|e| {
                refused(
                    &old,
                    format!("the new {noun} is complete at {}, but the previous one could not be removed: {e}", dir.display()),
                )
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kind whose manifest lists `files` (paths) beside itself.
    const KIND: Kind = Kind {
        noun: "thing",
        manifest: "thing.json",
        schema: "xray.thing",
        listed: |v| {
            let mut out = vec!["thing.json".to_string()];
            for f in v["files"].as_array().into_iter().flatten() {
                out.extend(f.as_str().map(str::to_string));
            }
            out
        },
    };

    fn write(dir: &Path, files: &[&str]) -> Result<(), Refused> {
        write_whole(dir, &KIND, true, |tmp| {
            for f in files {
                let p = tmp.join(f);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, f).unwrap();
            }
            let m = serde_json::json!({"schema": "xray.thing", "files": files});
            std::fs::write(tmp.join("thing.json"), m.to_string()).map_err(io(tmp))
        })
    }

    #[test]
    fn replacing_removes_only_what_the_manifest_listed_one_directory_deep() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("out");
        write(&d, &["a.npy", "w/b.npy"]).unwrap();
        assert_eq!(
            check_target(&d, &KIND, true).unwrap(),
            Target::Existing {
                files: vec!["thing.json".into(), "a.npy".into(), "w/b.npy".into()]
            }
        );
        write(&d, &["c.npy"]).unwrap();
        let mut names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["c.npy", "thing.json"]);
        // Nothing of the old output is left beside it.
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 1);
        // A file the manifest does not list makes it not X-Ray's to replace.
        std::fs::write(d.join("notes.txt"), "mine").unwrap();
        let e = check_target(&d, &KIND, true).unwrap_err();
        assert!(e.reason.contains("does not list (notes.txt)"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn a_listed_directory_that_is_a_link_is_foreign_and_nothing_behind_it_is_deleted() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("b.npy"), "not X-Ray's").unwrap();
        let d = t.path().join("out");
        write(&d, &["a.npy", "w/b.npy"]).unwrap();
        std::fs::remove_dir_all(d.join("w")).unwrap();
        std::os::unix::fs::symlink(&outside, d.join("w")).unwrap();
        let e = check_target(&d, &KIND, true).unwrap_err();
        assert!(e.reason.contains("does not list (w)"), "{e}");
        assert!(write(&d, &["c.npy"]).is_err());
        assert_eq!(
            std::fs::read_to_string(outside.join("b.npy")).unwrap(),
            "not X-Ray's"
        );
    }
}
