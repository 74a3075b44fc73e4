//! The dump format's untrusted-input parsers (`.npy`, `manifest.json`) under property tests, and
//! the dump writer's refusal to replace anything that is not an X-Ray dump.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use proptest::prelude::*;
use xray_core::dump::{
    check_dump_target, npy_bytes, parse_npy, Dump, DumpTarget, DumpWriter, Manifest, Stats, SCHEMA,
    SKETCH_LEN, VERSION,
};
use xray_core::Layout;

fn manifest(stats_only: bool) -> Manifest {
    Manifest {
        schema: SCHEMA.into(),
        version: VERSION,
        family: "whisper".into(),
        model_id: "m".into(),
        producer: "test".into(),
        weights_sha256: "w".into(),
        audio_sha256: "a".into(),
        tools: BTreeMap::new(),
        tokens: vec![],
        transcript: String::new(),
        stats_only,
        checkpoints: vec![],
        extra: BTreeMap::new(),
        engine_weights: None,
    }
}

fn tensor(shape: &[usize]) -> ArrayD<f32> {
    let n: usize = shape.iter().product();
    let v = (0..n).map(|i| ((i * 7 % 11) as f32) * 0.5 - 1.0).collect();
    ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
}

fn small_dump(dir: &Path) {
    let mut w = DumpWriter::new(manifest(false));
    w.add("a.b", 0, Layout::Plain, &tensor(&[2, 3]));
    w.write(dir).unwrap();
}

/// A stats-only dump `dir/s` holding `x@step0` (4x5): the dump.
fn stats_only_dump(dir: &Path) -> PathBuf {
    let d = dir.join("s");
    let mut w = DumpWriter::new(manifest(true));
    w.add("x", 0, Layout::Plain, &tensor(&[4, 5]));
    w.write(&d).unwrap();
    d
}

/// The JSON at `p`.
fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// `.npy` bytes with a hand-written header (padded as NumPy pads it).
fn npy_with_header(header: &str, payload: &[u8]) -> Vec<u8> {
    let mut h = header.to_string();
    let pad = (64 - (10 + h.len() + 1) % 64) % 64;
    h.push_str(&" ".repeat(pad));
    h.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(payload);
    out
}

// ----------------------------------------------------------------------------------------------
// .npy

#[test]
fn npy_key_inside_a_string_is_not_the_key() {
    // The old scan took the first `'shape'` it found, here inside another key's string, and read
    // this 2-element file as shape [1].
    let p = Path::new("dir/x.npy");
    let bytes = npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'note': \"'shape': (1,)\", 'shape': (2,), }",
        &[0u8; 4],
    );
    match parse_npy(p, &bytes) {
        Ok((t, _)) => assert_ne!(t.shape(), &[1], "read the shape from inside a string"),
        Err(e) => assert!(e.to_string().contains("dir/x.npy"), "{e}"),
    }
    // A well-formed header whose descr string mentions another key parses by its real keys.
    let bytes = npy_with_header(
        "{'fortran_order': False, 'shape': (2,), 'descr': '<f4', }",
        &[0u8; 8],
    );
    let (t, dtype) = parse_npy(p, &bytes).unwrap();
    assert_eq!((t.shape(), dtype.as_str()), (&[2usize][..], "f32"));
}

#[test]
fn npy_element_count_overflow_is_an_error_naming_the_file() {
    // 2^62 f32 elements need 2^64 bytes: the unchecked product wrapped to 0 and matched an empty
    // payload.
    let p = Path::new("dir/huge.npy");
    let bytes = npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904,), }",
        &[],
    );
    let e = parse_npy(p, &bytes).unwrap_err().to_string();
    assert!(e.contains("dir/huge.npy") && e.contains("overflow"), "{e}");
    let bytes = npy_with_header(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }",
        &[0u8; 16],
    );
    let e = parse_npy(p, &bytes).unwrap_err().to_string();
    assert!(e.contains("dir/huge.npy") && e.contains("overflow"), "{e}");
}

#[test]
fn npy_roundtrip_of_the_writer() {
    let t = tensor(&[3, 1, 4]);
    let (back, dtype) = parse_npy(Path::new("x.npy"), &npy_bytes(&t).unwrap()).unwrap();
    assert_eq!((back, dtype.as_str()), (t, "f32"));
}

fn header_text() -> impl Strategy<Value = String> {
    // Fragments of real headers, recombined: exercises the dict parser's every branch.
    let frag = prop::sample::select(vec![
        "{",
        "}",
        "(",
        ")",
        ",",
        ":",
        " ",
        "'",
        "\"",
        "\\",
        "'descr'",
        "'shape'",
        "'fortran_order'",
        "'<f4'",
        "'<f8'",
        "'<i8'",
        "'>f4'",
        "True",
        "False",
        "0",
        "7",
        "18446744073709551615",
        "99999999999999999999",
        "Tru",
        "\n",
        "é",
    ]);
    prop::collection::vec(frag, 0..24).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Arbitrary bytes: never a panic; every failure names the file.
    #[test]
    fn npy_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let p = Path::new("fuzz/a.npy");
        if let Err(e) = parse_npy(p, &bytes) {
            prop_assert!(e.to_string().contains("fuzz/a.npy"), "{}", e);
        }
    }

    /// Header-shaped text and a payload of any length: never a panic, every failure names the
    /// file, and a success holds exactly the payload's elements (nothing allocated beyond it).
    #[test]
    fn npy_header_fragments(header in header_text(), payload in prop::collection::vec(any::<u8>(), 0..64)) {
        let p = Path::new("fuzz/h.npy");
        let bytes = npy_with_header(&header, &payload);
        match parse_npy(p, &bytes) {
            Ok((t, dtype)) => {
                let item = match dtype.as_str() { "f32" | "i32" => 4, "f16" => 2, _ => 8 };
                prop_assert_eq!(t.len() * item, payload.len());
            }
            Err(e) => prop_assert!(e.to_string().contains("fuzz/h.npy"), "{}", e),
        }
    }

    /// Valid headers with random shapes (some huge) against random payloads.
    #[test]
    fn npy_shapes(dims in prop::collection::vec(prop_oneof![0usize..5, Just(usize::MAX), Just(1usize << 40)], 0..5),
                  payload_len in 0usize..80) {
        let shape = match dims.len() {
            1 => format!("({},)", dims[0]),
            _ => format!("({})", dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
        };
        let header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
        let bytes = npy_with_header(&header, &vec![0u8; payload_len]);
        let p = Path::new("fuzz/s.npy");
        match parse_npy(p, &bytes) {
            Ok((t, _)) => prop_assert_eq!(t.len() * 4, payload_len),
            Err(e) => prop_assert!(e.to_string().contains("fuzz/s.npy"), "{}", e),
        }
    }
}

// ----------------------------------------------------------------------------------------------
// manifest.json (Dump::load)

fn entry_json() -> impl Strategy<Value = serde_json::Value> {
    (
        prop::sample::select(vec!["a.b", "x", "../up", "a/b", ""]),
        prop_oneof![Just(0u64), Just(1), Just(u64::MAX)],
        prop::collection::vec(prop_oneof![0u64..4, Just(1u64 << 62), Just(u64::MAX)], 0..4),
        prop::sample::select(vec!["f32", "f64", "i64", "bf16"]),
        prop::sample::select(vec!["plain", "head_major", "sideways"]),
        prop::option::of(prop::sample::select(vec![
            "a.b@step0.npy",
            "../x.npy",
            "nope.npy",
            "manifest.json",
        ])),
        prop::option::of(0u64..8),
        prop::option::of(prop::collection::vec(-1e3f64..1e3, 0..40)),
    )
        .prop_map(|(name, step, shape, dtype, layout, file, count, sketch)| {
            let mut e = serde_json::json!({
                "name": name, "step": step, "shape": shape, "dtype": dtype, "layout": layout,
                "content_sha256": "00",
                "sha256": "00",
            });
            if let Some(f) = file {
                e["file"] = serde_json::json!(f);
            }
            if let Some(c) = count {
                e["stats"] = serde_json::json!({
                    "count": c, "min": 0.0, "max": 1.0, "mean": 0.5, "rms": 0.6, "nan": 0, "inf": 0,
                    "sketch": sketch,
                });
            }
            e
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Structured manifests with hostile entries next to a real `.npy`: never a panic; a failure
    /// names a file of the dump.
    #[test]
    fn manifest_entries(stats_only in any::<bool>(), entries in prop::collection::vec(entry_json(), 0..4)) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("d");
        small_dump(&d);
        let m = serde_json::json!({
            "schema": SCHEMA, "version": VERSION, "family": "whisper", "model_id": "m",
            "producer": "p", "weights_sha256": "w", "audio_sha256": "a",
            "stats_only": stats_only, "checkpoints": entries,
        });
        std::fs::write(d.join("manifest.json"), m.to_string()).unwrap();
        if let Err(e) = Dump::load(&d) {
            prop_assert!(e.to_string().contains(d.to_str().unwrap()), "{}", e);
        }
    }

    /// Arbitrary bytes as manifest.json: an error naming it, never a panic.
    #[test]
    fn manifest_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("manifest.json"), &bytes).unwrap();
        match Dump::load(dir.path()) {
            Ok(d) => prop_assert!(d.manifest.checkpoints.is_empty()),
            Err(e) => prop_assert!(e.to_string().contains("manifest.json"), "{}", e),
        }
    }
}

#[test]
fn stats_only_entries_need_an_order_sensitive_sketch() {
    let dir = tempfile::tempdir().unwrap();
    let d = stats_only_dump(dir.path());
    let l = Dump::load(&d).unwrap();
    let s = l.entry("x", 0).unwrap().stats.clone().unwrap();
    assert_eq!(s.sketch.as_ref().map(|k| k.len()), Some(SKETCH_LEN));
    // An entry without it (an older writer) is refused, naming the entry.
    let mp = d.join("manifest.json");
    let mut m = read_json(&mp);
    m["checkpoints"][0]["stats"]
        .as_object_mut()
        .unwrap()
        .remove("sketch");
    std::fs::write(&mp, m.to_string()).unwrap();
    let e = Dump::load(&d).unwrap_err().to_string();
    assert!(e.contains("x@step0") && e.contains("sketch"), "{e}");
}

#[test]
fn the_sketch_sees_order() {
    let t = tensor(&[6, 7]);
    let data: Vec<f32> = t.iter().copied().collect();
    let mut rev = data.clone();
    rev.reverse();
    let (a, b) = (Stats::of(&data), Stats::of(&rev));
    // Same values: the order-blind statistics agree exactly; the sketch does not.
    assert_eq!((a.mean, a.rms, a.min, a.max), (b.mean, b.rms, b.min, b.max));
    let (ka, kb) = (a.sketch.unwrap(), b.sketch.unwrap());
    let d2: f64 = ka
        .iter()
        .zip(&kb)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f64>()
        / ka.len() as f64;
    assert!(
        d2.sqrt() > 0.1 * a.rms,
        "sketch distance {} vs rms {}",
        d2.sqrt(),
        a.rms
    );
}

#[test]
fn unlisted_files_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    small_dump(&d);
    std::fs::write(d.join("extra@step0.npy"), b"x").unwrap();
    let l = Dump::load(&d).unwrap();
    assert_eq!(l.unlisted, vec!["extra@step0.npy".to_string()]);
}

// ----------------------------------------------------------------------------------------------
// The writer never deletes what X-Ray did not write.

#[test]
fn writer_refuses_a_directory_that_is_not_a_dump() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("mine");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("thesis.txt"), b"years of work").unwrap();
    let mut w = DumpWriter::new(manifest(false));
    w.add("a.b", 0, Layout::Plain, &tensor(&[2]));
    for force in [false, true] {
        let e = w.write_to(&d, force).unwrap_err().to_string();
        assert!(e.contains("mine") && e.contains("not an X-Ray dump"), "{e}");
        assert_eq!(
            std::fs::read(d.join("thesis.txt")).unwrap(),
            b"years of work"
        );
    }
    // Nothing left beside it.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("mine")]);
    // A file, or a symbolic link, is refused too.
    let f = dir.path().join("file");
    std::fs::write(&f, b"f").unwrap();
    assert!(w.write_to(&f, true).is_err());
    assert_eq!(std::fs::read(&f).unwrap(), b"f");
    #[cfg(unix)]
    {
        let l = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &l).unwrap();
        let e = w.write_to(&l, true).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
    }
}

#[test]
fn writer_replaces_a_dump_only_with_force_and_only_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("dump");
    // An empty directory is fine.
    std::fs::create_dir(&d).unwrap();
    assert_eq!(check_dump_target(&d, false).unwrap(), DumpTarget::Empty);
    small_dump(&d);
    let mut w = DumpWriter::new(manifest(false));
    w.add("c.d", 1, Layout::Plain, &tensor(&[3]));
    let e = w.write(&d).unwrap_err().to_string();
    assert!(e.contains("--force"), "{e}");
    assert!(Dump::load(&d).unwrap().get("a.b", 0).is_some());
    w.write_to(&d, true).unwrap();
    let l = Dump::load(&d).unwrap();
    assert!(l.get("a.b", 0).is_none() && l.get("c.d", 1).is_some());
    assert!(l.unlisted.is_empty());
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("dump")],
        "no temporary or old sibling left"
    );
    // A dump that also holds something its manifest does not list is not X-Ray's to replace.
    std::fs::write(d.join("notes.txt"), b"mine").unwrap();
    let e = w.write_to(&d, true).unwrap_err().to_string();
    assert!(e.contains("notes.txt"), "{e}");
    assert_eq!(std::fs::read(d.join("notes.txt")).unwrap(), b"mine");
}

#[test]
fn writer_checks_the_parent() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("plain-file");
    std::fs::write(&f, b"x").unwrap();
    let e = check_dump_target(&f.join("sub").join("dump"), false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("plain-file") && e.contains("not a directory"),
        "{e}"
    );
}

// ----------------------------------------------------------------------------------------------
// Stats consistency (issue 24 item 9)

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// What `Stats::of` computes always passes `Stats::check` (no false refusal from rounding),
    /// for any values: huge, tiny, constant, NaN and Inf mixed in.
    #[test]
    fn stats_of_any_tensor_are_consistent(
        data in prop::collection::vec(
            prop_oneof![
                any::<f32>(),
                Just(f32::MAX),
                Just(-f32::MAX),
                Just(1e-30f32),
                Just(3.0f32),
                Just(f32::NAN),
                Just(f32::INFINITY),
            ],
            0..300,
        )
    ) {
        let s = Stats::of(&data);
        prop_assert!(s.check().is_ok(), "{:?}: {:?}", s, s.check());
        let constant = vec![0.1f32; data.len()];
        let c = Stats::of(&constant);
        prop_assert!(c.check().is_ok(), "{:?}: {:?}", c, c.check());
    }
}

/// A stats-only entry whose statistics no tensor can have is refused when the dump loads, naming
/// the checkpoint: its content hash (matching the reference's, say) is never the only thing read.
#[test]
fn impossible_statistics_are_refused_naming_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let d = stats_only_dump(dir.path());
    let mp = d.join("manifest.json");
    let good = read_json(&mp);
    type Edit = fn(&mut serde_json::Value);
    let cases: [(Edit, &str); 7] = [
        (
            |s| {
                s["min"] = 5.0.into();
                s["max"] = (-5.0).into();
                s["mean"] = 1e30.into();
            },
            "min 5 > max -5",
        ),
        (
            |s| s["mean"] = 1e30.into(),
            "mean 1000000000000000000000000000000 outside",
        ),
        (|s| s["rms"] = 0.0.into(), "rms 0 < |mean|"),
        (
            |s| s["rms"] = 1e9.into(),
            "rms 1000000000 > max(|min|, |max|)",
        ),
        (
            |s| s["nan"] = 21.into(),
            "21 NaN + 0 Inf values in a count of 20",
        ),
        (
            |s| s["sketch"][3] = 1e6.into(),
            "sketch element 1000000 above",
        ),
        (
            |s| {
                s["inf"] = 20.into();
            },
            "no finite value",
        ),
    ];
    for (edit, says) in cases {
        let mut m = good.clone();
        edit(&mut m["checkpoints"][0]["stats"]);
        std::fs::write(&mp, m.to_string()).unwrap();
        let e = Dump::load(&d).unwrap_err().to_string();
        assert!(
            e.contains("x@step0") && e.contains("inconsistent statistics") && e.contains(says),
            "{says}: {e}"
        );
        assert!(e.contains(mp.to_str().unwrap()), "{e}");
    }
}
