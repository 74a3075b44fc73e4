//! Property tests (proptest) for the parsers that read untrusted files: WAV (`audio`),
//! safetensors (`weights`) and config.json (`models::load`). For any mutation of a valid file,
//! and for random bytes: no panic, every failure an error naming the file, and no single
//! allocation beyond a small multiple of the input's size (a header's claims never size a
//! buffer). A few seconds each, so they run in `make test`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};

use proptest::prelude::*;

/// Records the largest single allocation made on this thread while tracking is on.
struct Tracking;

thread_local! {
    static TRACK: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

#[allow(unsafe_code)] // a counting allocator that forwards to the system one
                      // SAFETY: every method forwards to `System` with its own arguments; `note` only records sizes.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new);
        System.realloc(p, l, new)
    }
}

fn note(size: usize) {
    let _ = TRACK.try_with(|t| {
        if t.get() {
            let _ = LARGEST.try_with(|m| m.set(m.get().max(size)));
        }
    });
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// Run `f` and return its result with the largest single allocation it made.
fn largest_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|m| m.set(0));
    TRACK.with(|t| t.set(true));
    let r = f();
    TRACK.with(|t| t.set(false));
    (r, LARGEST.with(|m| m.get()))
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn wav_bytes(rate: u32, channels: u16, bits: u16, float: bool, n: usize) -> Vec<u8> {
    let spec = hound::WavSpec {
        channels,
        sample_rate: rate,
        bits_per_sample: bits,
        sample_format: if float {
            hound::SampleFormat::Float
        } else {
            hound::SampleFormat::Int
        },
    };
    let mut cur = std::io::Cursor::new(Vec::new());
    {
        let mut w = hound::WavWriter::new(&mut cur, spec).unwrap();
        for i in 0..n * channels as usize {
            let x = ((i as f64) * 0.05).sin() * 0.5;
            if float {
                w.write_sample(x as f32).unwrap();
            } else {
                let v = (x * ((1i64 << (bits - 1)) - 1) as f64) as i32;
                w.write_sample(v).unwrap();
            }
        }
        w.finalize().unwrap();
    }
    cur.into_inner()
}

/// A mutation of `base`: byte overwrites, a 32-bit field overwrite, and a truncation.
fn mutate(base: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = base.len();
    (
        proptest::collection::vec((0..len, any::<u8>()), 0..6),
        proptest::option::of((0..len.saturating_sub(4).max(1), any::<u32>())),
        proptest::option::of(0..=len),
    )
        .prop_map(move |(bytes, field, cut)| {
            let mut b = base.clone();
            for (i, v) in bytes {
                b[i] = v;
            }
            if let Some((i, v)) = field {
                if i + 4 <= b.len() {
                    b[i..i + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
            if let Some(c) = cut {
                b.truncate(c);
            }
            b
        })
}

fn wav_inputs() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        mutate(wav_bytes(16000, 1, 16, false, 400)),
        mutate(wav_bytes(44100, 2, 16, false, 300)),
        mutate(wav_bytes(8000, 1, 8, false, 300)),
        mutate(wav_bytes(48000, 1, 24, false, 300)),
        mutate(wav_bytes(22050, 2, 32, true, 300)),
        proptest::collection::vec(any::<u8>(), 0..200),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(|t| {
            let mut b = b"RIFF\xff\xff\xff\xffWAVE".to_vec();
            b.extend(t);
            b
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn wav_parser_never_panics_names_the_file_and_allocates_by_the_file(bytes in wav_inputs()) {
        let path = Path::new("fuzz/clip-under-test.wav");
        let (r, largest) = largest_alloc(|| xray_runtime::audio::decode_wav(path, &bytes, 16000));
        // f64 working copies of the samples (8 bytes per 1-byte sample), x2 for 8 kHz -> 16 kHz,
        // plus the resampler's fixed FFT scratch.
        let bound = 32 * bytes.len() + (1 << 20);
        prop_assert!(largest <= bound, "largest allocation {largest} > {bound} for a {}-byte file", bytes.len());
        match r {
            Ok(a) => {
                prop_assert!(!a.samples.is_empty());
                prop_assert!(a.samples.iter().all(|s| s.is_finite()));
            }
            Err(e) => prop_assert!(e.to_string().contains("clip-under-test.wav"), "{e}"),
        }
    }
}

/// A small valid safetensors file: two f32 tensors and one f16.
fn safetensors_bytes() -> Vec<u8> {
    let header = r#"{"a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b.bias":{"dtype":"F16","shape":[4],"data_offsets":[24,32]},"__metadata__":{"format":"pt"}}"#;
    let mut h = header.as_bytes().to_vec();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut b = (h.len() as u64).to_le_bytes().to_vec();
    b.extend(h);
    for i in 0..6 {
        b.extend((i as f32 * 0.5).to_le_bytes());
    }
    for _ in 0..4 {
        b.extend(half_one());
    }
    b
}

fn half_one() -> [u8; 2] {
    0x3c00u16.to_le_bytes()
}

fn safetensors_inputs() -> impl Strategy<Value = Vec<u8>> {
    let base = safetensors_bytes();
    let header_end = 8 + u64::from_le_bytes(base[..8].try_into().unwrap()) as usize;
    prop_oneof![
        mutate(base.clone()),
        // Digits and shapes inside the header: the fields a hostile file would inflate.
        (
            8..header_end,
            proptest::sample::select(vec![b'0', b'9', b'"', b',', b']', b'-', b'}'])
        )
            .prop_map(move |(i, c)| {
                let mut b = base.clone();
                b[i] = c;
                b
            }),
        proptest::collection::vec(any::<u8>(), 0..100),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn safetensors_loader_never_panics_names_the_file_and_allocates_by_the_file(bytes in safetensors_inputs()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        std::fs::write(&path, &bytes).unwrap();
        let (r, largest) = largest_alloc(|| xray_runtime::weights::Weights::load(&path));
        // f16 widened to f32 doubles a tensor; the rest is bookkeeping.
        let bound = 4 * bytes.len() + (64 << 10);
        prop_assert!(largest <= bound, "largest allocation {largest} > {bound} for a {}-byte file", bytes.len());
        if let Err(e) = r {
            prop_assert!(e.to_string().contains("model.safetensors"), "{e}");
        }
    }
}

/// Mutations of a real config.json: numbers replaced by extreme values, keys dropped, values
/// turned into the wrong JSON type.
fn config_inputs(base: serde_json::Value) -> impl Strategy<Value = serde_json::Value> {
    let keys: Vec<String> = base
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    let n = keys.len().max(1);
    proptest::collection::vec(
        (
            0..n,
            prop_oneof![
                Just(serde_json::json!(0)),
                Just(serde_json::json!(-1)),
                Just(serde_json::json!(1)),
                Just(serde_json::json!(3)),
                Just(serde_json::json!(1u64 << 40)),
                Just(serde_json::json!(u64::MAX)),
                Just(serde_json::json!(1e300)),
                Just(serde_json::json!("x")),
                Just(serde_json::json!(null)),
                Just(serde_json::json!([1, 2])),
                Just(serde_json::Value::Bool(true)),
            ],
            any::<bool>(),
        ),
        1..4,
    )
    .prop_map(move |edits| {
        let mut v = base.clone();
        if let Some(o) = v.as_object_mut() {
            for (k, val, drop) in edits {
                let key = &keys[k % keys.len().max(1)];
                if drop {
                    o.remove(key);
                } else {
                    o.insert(key.clone(), val);
                }
            }
        }
        v
    })
}

fn fixture(name: &str) -> Option<PathBuf> {
    let d = root().join("fixtures/build").join(name);
    if d.join("config.json").is_file() {
        Some(d)
    } else {
        assert!(
            std::env::var_os("XRAY_REQUIRE_FIXTURES").is_none(),
            "{} missing (run `make fixtures`)",
            d.display()
        );
        None
    }
}

/// A model directory with a mutated config.json and links to the fixture's other files.
fn with_config(src: &Path, config: &serde_json::Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(src).unwrap() {
        let f = f.unwrap().path();
        let name = f.file_name().unwrap().to_owned();
        if name != "config.json" {
            std::os::unix::fs::symlink(&f, dir.path().join(name)).unwrap();
        }
    }
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_vec(config).unwrap(),
    )
    .unwrap();
    dir
}

fn config_case(src: &Path, config: &serde_json::Value) -> Result<(), TestCaseError> {
    let dir = with_config(src, config);
    let files: usize = std::fs::read_dir(src)
        .unwrap()
        .map(|f| f.unwrap().metadata().map(|m| m.len() as usize).unwrap_or(0))
        .sum();
    let (r, largest) = largest_alloc(|| xray_runtime::models::load(dir.path()));
    // Weights widened to f32 plus exact f16 mirrors: a few times the files on disk.
    let bound = 4 * files + (16 << 20);
    prop_assert!(largest <= bound, "largest allocation {largest} > {bound}");
    if let Err(e) = r {
        let msg = e.to_string();
        prop_assert!(
            msg.contains(&dir.path().display().to_string()),
            "error does not name the file: {msg}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn granite_config_never_panics_and_errors_name_the_file(
        cfg in config_inputs(serde_json::from_str(&std::fs::read_to_string(root().join("fixtures/build/granite-nar-tiny/config.json")).unwrap_or_else(|_| "{}".into())).unwrap())
    ) {
        if let Some(src) = fixture("granite-nar-tiny") {
            config_case(&src, &cfg)?;
        }
    }

    #[test]
    fn whisper_config_never_panics_and_errors_name_the_file(
        cfg in config_inputs(serde_json::from_str(&std::fs::read_to_string(root().join("fixtures/build/whisper-rand-a/config.json")).unwrap_or_else(|_| "{}".into())).unwrap())
    ) {
        if let Some(src) = fixture("whisper-rand-a") {
            config_case(&src, &cfg)?;
        }
    }
}

#[test]
fn the_allocation_tracker_sees_a_large_allocation() {
    let (v, largest) = largest_alloc(|| vec![1u8; 3 << 20]);
    assert_eq!(v.len(), 3 << 20);
    assert!(largest >= 3 << 20, "{largest}");
}
