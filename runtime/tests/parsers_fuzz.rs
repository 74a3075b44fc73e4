//! Property tests (proptest) for the parsers that read untrusted files: WAV (`audio`),
//! safetensors (`weights`), config.json (`models::load`) and the config numbers core's contract
//! resolver reads (`Contract::for_family`). For any mutation of a valid file, and for random
//! bytes: no panic, every failure an error naming the file (or the config key), and no single
//! allocation beyond a small multiple of the input's size or a fixed bound (a header's claims
//! never size a buffer). A few seconds each, so they run in `make test`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};

use proptest::prelude::*;

/// Records the largest single allocation made on this thread while tracking is on.
struct Tracking;

thread_local! {
    static TRACK: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

#[allow(unsafe_code)] // a counting allocator that forwards to the system one
                      // SAFETY: every method forwards to `System` with its own arguments; `note` only records sizes.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        live(-(l.size() as i64));
        System.dealloc(p, l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new);
        live(-(l.size() as i64));
        System.realloc(p, l, new)
    }
}

fn note(size: usize) {
    let _ = TRACK.try_with(|t| {
        if t.get() {
            let _ = LARGEST.try_with(|m| m.set(m.get().max(size)));
        }
    });
    live(size as i64);
}

/// Bytes allocated and not yet freed on this thread while tracking is on, and their peak.
fn live(delta: i64) {
    let _ = TRACK.try_with(|t| {
        if t.get() {
            let _ = LIVE.try_with(|l| {
                l.set(l.get() + delta);
                let _ = PEAK.try_with(|p| p.set(p.get().max(l.get())));
            });
        }
    });
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// Run `f` and return its result with the largest single allocation it made.
fn largest_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let (r, largest, _) = allocations(f);
    (r, largest)
}

/// Run `f` and return its result, the largest single allocation and the peak of the bytes it
/// held allocated at once.
fn allocations<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    LARGEST.with(|m| m.set(0));
    LIVE.with(|m| m.set(0));
    PEAK.with(|m| m.set(0));
    TRACK.with(|t| t.set(true));
    let r = f();
    TRACK.with(|t| t.set(false));
    (
        r,
        LARGEST.with(|m| m.get()),
        PEAK.with(|m| m.get()).max(0) as usize,
    )
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
        // No keys (the fixture is missing: the test skips on it): nothing to edit.
        if keys.is_empty() {
            return v;
        }
        if let Some(o) = v.as_object_mut() {
            for (k, val, drop) in edits {
                let key = &keys[k % keys.len()];
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
    xray_core::testing::require_fixture(d.join("config.json")).map(|_| d)
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

/// A valid config of `family` holding only what its contract reads, and those keys (dotted paths
/// into nested objects; `encoder_layer_indices` is granite's list).
fn contract_config(family: &str) -> (serde_json::Value, Vec<&'static str>) {
    match family {
        "whisper" => (
            serde_json::json!({
                "num_mel_bins": 80, "max_source_positions": 1500, "d_model": 384,
                "decoder_attention_heads": 6, "vocab_size": 51864, "encoder_layers": 4,
                "decoder_layers": 4
            }),
            vec![
                "num_mel_bins",
                "max_source_positions",
                "d_model",
                "decoder_attention_heads",
                "vocab_size",
                "encoder_layers",
                "decoder_layers",
            ],
        ),
        _ => (
            serde_json::json!({
                "encoder_config": {"input_dim": 160, "hidden_dim": 64, "output_dim": 24,
                                   "bpe_output_dim": 128, "bpe_pooling_window": 4,
                                   "self_conditioning_layer": 2, "num_layers": 4},
                "projector_config": {"num_encoder_layers": 4, "encoder_dim": 64, "hidden_size": 48,
                                     "block_size": 15, "downsample_rate": 5},
                "text_config": {"hidden_size": 64, "vocab_size": 128, "num_attention_heads": 4,
                                "num_hidden_layers": 2},
                "encoder_layer_indices": [1, 2, 3, -1]
            }),
            vec![
                "encoder_config.input_dim",
                "encoder_config.hidden_dim",
                "encoder_config.output_dim",
                "encoder_config.bpe_output_dim",
                "encoder_config.bpe_pooling_window",
                "encoder_config.self_conditioning_layer",
                "encoder_config.num_layers",
                "projector_config.num_encoder_layers",
                "projector_config.encoder_dim",
                "projector_config.hidden_size",
                "projector_config.block_size",
                "projector_config.downsample_rate",
                "text_config.hidden_size",
                "text_config.vocab_size",
                "text_config.num_attention_heads",
                "text_config.num_hidden_layers",
                "encoder_layer_indices",
            ],
        ),
    }
}

/// Set a dotted key, making the objects on its way.
fn set_key(config: &mut serde_json::Value, key: &str, v: serde_json::Value) {
    let mut at = config;
    let parts: Vec<&str> = key.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        if !at.get(*p).is_some_and(|x| x.is_object()) {
            at[*p] = serde_json::json!({});
        }
        at = &mut at[*p];
    }
    at[parts[parts.len() - 1]] = v;
}

/// Arbitrary JSON where a config number belongs: integers of every size and sign (around the
/// bounds too), fractions, strings, nulls, booleans, lists (some longer than core's bound), objects.
fn config_number() -> impl Strategy<Value = serde_json::Value> {
    use xray_runtime::contract::{MAX_CONFIG_INT, MAX_LIST_LEN, MAX_REPEAT};
    let r = MAX_REPEAT as u64;
    prop_oneof![
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        (0u64..=2 * r + 2).prop_map(serde_json::Value::from),
        (r - 2..=r + 2).prop_map(serde_json::Value::from),
        (MAX_CONFIG_INT - 2..=MAX_CONFIG_INT + 2).prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        (0u32..2000).prop_map(|n| serde_json::json!(n as f64 + 0.5)),
        "[0-9a-z. -]{0,8}".prop_map(serde_json::Value::from),
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        proptest::collection::vec(-3000i64..3000, 0..8).prop_map(serde_json::Value::from),
        (MAX_LIST_LEN - 1..MAX_LIST_LEN + 2).prop_map(|n| serde_json::json!(vec![-1; n])),
        Just(serde_json::json!({"x": 1})),
    ]
}

/// The largest single allocation while resolving a contract (and writing the JSON the oracle
/// receives) from any config: core bounds every count it reads.
const CONTRACT_LARGEST_ALLOC: usize = 64 << 20;

/// The most bytes the resolver holds at once for any config (the largest contract: 45 MB).
const CONTRACT_PEAK: usize = 128 << 20;

fn contract_case(family: &str, config: &serde_json::Value) -> Result<(), TestCaseError> {
    let (r, largest, peak) = allocations(|| {
        xray_runtime::contract::Contract::for_family(family, config)
            .map(|c| (c.checkpoints.len(), c.resolved_json().to_string().len()))
    });
    prop_assert!(
        largest <= CONTRACT_LARGEST_ALLOC,
        "largest allocation {largest} > {CONTRACT_LARGEST_ALLOC}"
    );
    prop_assert!(peak <= CONTRACT_PEAK, "peak {peak} > {CONTRACT_PEAK}");
    match r {
        Ok((n, _)) => {
            // At most every template expanded over the largest repeat.
            prop_assert!(
                n <= 64 * xray_runtime::contract::MAX_REPEAT,
                "{n} checkpoints"
            )
        }
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(!msg.contains('\n'), "more than one line: {msg}");
            prop_assert!(msg.starts_with(&format!("contract {family}: ")), "{msg}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Issue 24 item 2: `decoder_layers: 1e9` aborted `xray contract` (a 16 GB allocation in
    /// `layers_of`), `d_model: "64"` said "not a known dim".
    #[test]
    fn contract_resolver_never_panics_and_allocates_within_a_bound(
        family in proptest::sample::select(vec!["whisper", "granite_nar"]),
        edits in proptest::collection::vec((0usize..64, config_number()), 1..5),
    ) {
        let (mut config, keys) = contract_config(family);
        for (k, v) in edits {
            set_key(&mut config, keys[k % keys.len()], v);
        }
        contract_case(family, &config)?;
    }
}

/// A bad value for each key the contracts read is refused naming the key and what it holds.
#[test]
fn every_config_key_a_contract_reads_is_checked_by_name() {
    for family in ["whisper", "granite_nar"] {
        let (base, keys) = contract_config(family);
        assert!(xray_runtime::contract::Contract::for_family(family, &base).is_ok());
        for key in keys {
            let mut c = base.clone();
            set_key(&mut c, key, serde_json::json!("64"));
            let e = xray_runtime::contract::Contract::for_family(family, &c)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("config.json key '{key}' is a string \"64\"")),
                "{family} {key}: {e}"
            );
        }
    }
}

/// The largest contract a config can make (every repeat at the bound, granite's list at its
/// bound): what the resolver allocates for it, printed for the record (`--nocapture`).
#[test]
fn the_largest_contract_a_config_can_make_is_bounded() {
    use xray_runtime::contract::{MAX_LIST_LEN, MAX_REPEAT};
    let (mut w, _) = contract_config("whisper");
    w["encoder_layers"] = MAX_REPEAT.into();
    w["decoder_layers"] = MAX_REPEAT.into();
    let (mut g, _) = contract_config("granite_nar");
    set_key(&mut g, "encoder_config.num_layers", MAX_REPEAT.into());
    set_key(&mut g, "text_config.num_hidden_layers", MAX_REPEAT.into());
    set_key(&mut g, "encoder_config.self_conditioning_layer", 512.into());
    let list: Vec<i64> = (0..MAX_LIST_LEN as i64)
        .map(|i| i % MAX_REPEAT as i64 + 1)
        .collect();
    set_key(&mut g, "encoder_layer_indices", list.into());
    set_key(
        &mut g,
        "projector_config.num_encoder_layers",
        MAX_LIST_LEN.into(),
    );
    for (family, config) in [("whisper", w), ("granite_nar", g)] {
        let (r, largest, peak) = allocations(|| {
            xray_runtime::contract::Contract::for_family(family, &config)
                .map(|c| (c.checkpoints.len(), c.resolved_json().to_string().len()))
        });
        let (n, json) = r.unwrap_or_else(|e| panic!("{family}: {e}"));
        eprintln!(
            "{family} at the bound: {n} checkpoints, resolved JSON {json} bytes, largest allocation {largest} bytes, peak {peak} bytes held at once"
        );
        assert!(largest <= CONTRACT_LARGEST_ALLOC, "{family}: {largest}");
        assert!(peak <= CONTRACT_PEAK, "{family}: {peak}");
        let mut over = config.clone();
        let key = if family == "whisper" {
            "decoder_layers"
        } else {
            "text_config.num_hidden_layers"
        };
        set_key(&mut over, key, (MAX_REPEAT + 1).into());
        assert!(xray_runtime::contract::Contract::for_family(family, &over).is_err());
    }
}
