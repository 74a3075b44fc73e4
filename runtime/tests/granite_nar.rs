//! Granite Speech NAR against the PyTorch reference (oracle/xray_oracle/granite_nar.py) on the tiny
//! fixture, without Python: the reference dumps in tests/data/granite_ref/ are made by
//! tests/data/make_granite_ref.py. Tests skip with a notice when fixtures/build/granite-nar-tiny is
//! missing (`.venv/bin/python fixtures/make_granite_nar.py` builds it), and fail instead when
//! `XRAY_REQUIRE_FIXTURES` is set (`make test` sets it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod whisper_support;

use xray_runtime::capture::Recorder;
use xray_runtime::dump::Dump;
use xray_runtime::faults::{catalogue, FaultKind, FaultPlan, ParamFault, Planted};
use xray_runtime::graph::Tensor;
use xray_runtime::models::granite_nar::graph::names;
use xray_runtime::models::granite_nar::GraniteNarModel;
use xray_runtime::models::{RunHooks, RunOptions, RunOutput, SpeechModel};

/// Largest `max|runtime - reference| / max|reference|` accepted per checkpoint (f32 vs f32 with
/// different summation orders and an f64 STFT; observed <= 2e-5).
const REL_TOL: f64 = 1e-4;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The tiny fixture, or `None` (skip with a notice); a missing fixture fails the test when
/// `XRAY_REQUIRE_FIXTURES` is set (`make test`).
fn model() -> Option<GraniteNarModel> {
    let weights = whisper_support::fixture(GRANITE_WEIGHTS)?;
    let dir = weights.parent()?;
    Some(GraniteNarModel::load(dir).expect("the tiny fixture loads"))
}

/// The fixture's weights (`.venv/bin/python fixtures/make_granite_nar.py` builds it).
const GRANITE_WEIGHTS: &str = "fixtures/build/granite-nar-tiny/model.safetensors";

#[test]
#[should_panic(expected = "XRAY_REQUIRE_FIXTURES is set")]
fn a_missing_fixture_fails_when_fixtures_are_required() {
    let missing = root().join("fixtures/build/no-such-granite/model.safetensors");
    xray_core::testing::require_all_at(&[missing], xray_core::testing::MAKE_FIXTURES, true);
}

fn reference(name: &str) -> Dump {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/granite_ref")
        .join(name);
    Dump::load(&dir).expect("committed reference dump (tests/data/make_granite_ref.py)")
}

fn fox() -> xray_runtime::audio::Audio {
    xray_runtime::audio::load_wav(&root().join("fixtures/audio/fox.wav"), 16000).expect("fox.wav")
}

fn run(
    m: &GraniteNarModel,
    opts: &RunOptions,
    faults: Option<&FaultPlan>,
) -> (RunOutput, BTreeMap<String, Tensor>) {
    let mut rec = Recorder::new();
    let out = m
        .run(
            &fox(),
            opts,
            &mut RunHooks {
                observer: Some(&mut rec),
                faults,
                ..Default::default()
            },
        )
        .expect("run");
    let caps = rec.captured.into_iter().map(|c| (c.name, c.data)).collect();
    (out, caps)
}

fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| (*x as f64 - *y as f64).abs())
        .fold(0.0, f64::max)
}

fn scale(a: &Tensor) -> f64 {
    a.iter()
        .map(|x| x.abs() as f64)
        .fold(0.0, f64::max)
        .max(1e-6)
}

fn ids(v: &serde_json::Value) -> Vec<i64> {
    serde_json::from_value(v.clone()).expect("id list")
}

fn same_weights(m: &GraniteNarModel, r: &Dump) {
    assert_eq!(
        m.weights().sha256(),
        r.manifest.weights_sha256,
        "the fixture's weights differ from the ones the reference dump was made with: rebuild the dump \
         (PYTHONPATH=oracle .venv/bin/python runtime/tests/data/make_granite_ref.py)"
    );
}

/// Compare every checkpoint of a reference dump; returns (name, max_abs, relative) rows.
fn compare(r: &Dump, caps: &BTreeMap<String, Tensor>) -> Vec<(String, f64, f64)> {
    let mut rows = Vec::new();
    for e in &r.manifest.checkpoints {
        let want = r.get(&e.name, 0).expect("reference tensor");
        let got = caps
            .get(&e.name)
            .unwrap_or_else(|| panic!("runtime did not produce {}", e.name));
        assert_eq!(got.shape(), want.shape(), "{}: shape", e.name);
        let d = max_abs(got, want);
        rows.push((e.name.clone(), d, d / scale(want)));
    }
    for (n, d, rel) in &rows {
        eprintln!("{n:24} max_abs {d:.3e}  rel {rel:.3e}");
    }
    for (n, d, rel) in &rows {
        assert!(
            *rel < REL_TOL,
            "{n}: max_abs {d:.3e} is {rel:.3e} of the reference's scale (tolerance {REL_TOL:.0e})"
        );
    }
    rows
}

#[test]
fn granite_contract_checkpoints_label_their_producers() {
    let Some(m) = model() else { return };
    let g = m.graph();
    let c = m.contract();
    assert!(!c.checkpoints.is_empty());
    for cp in &c.checkpoints {
        let e = g
            .checkpoint_edge(&cp.name)
            .unwrap_or_else(|| panic!("{} is not labelled", cp.name));
        assert_eq!(
            g.producer_name(e),
            Some(cp.producer.as_str()),
            "{}: producer",
            cp.name
        );
        assert_eq!(g.edges()[e].layout, cp.layout, "{}: layout", cp.name);
    }
    assert_eq!(
        g.checkpoints().len(),
        c.checkpoints.len(),
        "the graph labels exactly the contract's checkpoints"
    );
    // The contract order is the graph's topological order.
    let order: Vec<String> = g.checkpoints().into_iter().map(|(n, _)| n).collect();
    let want: Vec<String> = c.checkpoints.iter().map(|c| c.name.clone()).collect();
    assert_eq!(order, want);
}

#[test]
fn granite_every_checkpoint_matches_the_reference_on_fox() {
    let Some(m) = model() else { return };
    let r = reference("fox");
    same_weights(&m, &r);
    let (out, caps) = run(&m, &RunOptions::default(), None);
    assert_eq!(
        caps.len(),
        m.contract().checkpoints.len(),
        "one capture per contract checkpoint"
    );
    let rows = compare(&r, &caps);
    assert_eq!(
        rows.len(),
        m.contract().checkpoints.len(),
        "the reference covers every checkpoint"
    );
    assert_eq!(out.tokens, r.manifest.tokens, "final tokens");
    assert_eq!(out.predicted, out.tokens);
    assert_eq!(out.transcript, r.manifest.transcript);
    assert_eq!(
        ids(&out.extra["own_hypothesis"]),
        ids(&r.manifest.extra["hypothesis"]),
        "CTC hypothesis"
    );
    assert_eq!(
        ids(&out.extra["hypothesis"]),
        ids(&r.manifest.extra["hypothesis"])
    );
    assert_eq!(
        ids(&out.extra["template"]),
        ids(&r.manifest.extra["template"])
    );
    assert_eq!(out.outputs.len(), 1);
    assert_eq!(Some(&out.outputs[0]), caps.get("dec.text_logits"));
}

#[test]
fn granite_capture_is_neutral() {
    let Some(m) = model() else { return };
    let plain = m
        .run(&fox(), &RunOptions::default(), &mut RunHooks::default())
        .expect("run");
    let (observed, _) = run(&m, &RunOptions::default(), None);
    assert_eq!(plain.outputs, observed.outputs);
    assert_eq!(plain.tokens, observed.tokens);
}

#[test]
fn granite_causal_decoder_is_caught_at_the_first_decoder_layer() {
    let Some(m) = model() else { return };
    let r = reference("fox");
    let (_, base) = run(&m, &RunOptions::default(), None);
    let plan = FaultPlan {
        planted: vec![Planted {
            name: "causal_decoder".into(),
            kind: FaultKind::Param(ParamFault::Causal(true)),
            target: "dec.layer.*.attn".into(),
            step: None,
            hits: Default::default(),
        }],
    };
    let (_, bad) = run(&m, &RunOptions::default(), Some(&plan));
    for (name, t) in &base {
        if name.starts_with("enc.") || name.starts_with("proj.") || name == "dec.flat_embeds" {
            assert_eq!(
                Some(t),
                bad.get(name),
                "{name} must not change under a decoder mask fault"
            );
        }
    }
    let first = "dec.layer.0.out";
    let want = r.get(first, 0).expect("reference");
    let d = max_abs(&bad[first], want) / scale(want);
    assert!(
        d > 100.0 * REL_TOL,
        "a causal decoder must move {first} well beyond tolerance (got {d:.3e})"
    );
    assert!(max_abs(&base[first], want) / scale(want) < REL_TOL);
}

#[test]
fn granite_removing_the_bypass_is_localised_between_blocks() {
    let Some(m) = model() else { return };
    let sc = m.derived().sc_layer;
    let (_, base) = run(&m, &RunOptions::default(), None);
    let plan = FaultPlan {
        planted: vec![Planted {
            name: "no_bypass".into(),
            kind: FaultKind::Param(ParamFault::SkipBranch),
            target: names::BYPASS_OP.into(),
            step: None,
            hits: Default::default(),
        }],
    };
    let (_, bad) = run(&m, &RunOptions::default(), Some(&plan));
    let before = format!("enc.block.{}.out", sc - 1);
    let after = format!("enc.block.{sc}.out");
    for n in [before.as_str(), "enc.ctc_logits", "enc.mid_blank_probs"] {
        assert_eq!(base[n], bad[n], "{n} is upstream of the bypass");
    }
    let d = max_abs(&base[&after], &bad[&after]) / scale(&base[&after]);
    assert!(
        d > 100.0 * REL_TOL,
        "{after} must change without the bypass (moved {d:.3e})"
    );
}

#[test]
fn granite_teacher_forcing_replaces_the_hypothesis_and_the_template() {
    let Some(m) = model() else { return };
    let r = reference("fox_teacher");
    same_weights(&m, &r);
    let teacher = ids(&r.manifest.extra["teacher_hypothesis"]);
    let ctc = ids(&r.manifest.extra["hypothesis"]);
    assert_ne!(
        teacher.len(),
        ctc.len(),
        "the committed teacher hypothesis changes the template length"
    );
    let opts = RunOptions {
        teacher_tokens: Some(teacher.clone()),
        ..Default::default()
    };
    let (out, caps) = run(&m, &opts, None);
    assert_eq!(ids(&out.extra["hypothesis"]), teacher);
    assert_eq!(
        ids(&out.extra["own_hypothesis"]),
        ctc,
        "the runtime's own CTC hypothesis is still reported"
    );
    let template = ids(&out.extra["template"]);
    assert_eq!(template, ids(&r.manifest.extra["template"]));
    assert_eq!(
        template.len(),
        (2 * teacher.len() + 1).max(m.config().min_edit_sequence_length)
    );
    assert_eq!(caps["dec.text_logits"].shape()[0], template.len());
    compare(&r, &caps);
    assert_eq!(out.tokens, r.manifest.tokens);
}

#[test]
fn granite_bad_inputs_are_errors_not_panics() {
    let Some(m) = model() else { return };
    let opts = RunOptions {
        teacher_tokens: Some(vec![3, 100_000]),
        ..Default::default()
    };
    let e = m
        .run(&fox(), &opts, &mut RunHooks::default())
        .expect_err("out-of-vocabulary teacher id");
    assert!(e.to_string().contains("100000"), "{e}");
    let mut short = fox();
    short.samples.truncate(200);
    let e = m
        .run(&short, &RunOptions::default(), &mut RunHooks::default())
        .expect_err("too short");
    assert!(e.to_string().contains("samples"), "{e}");
    // The shortest accepted clips: one encoder frame (no audio row for the LM), then a few.
    for n in [320usize, 1000, 2500] {
        let mut clip = fox();
        clip.samples.truncate(n);
        let out = m
            .run(&clip, &RunOptions::default(), &mut RunHooks::default())
            .expect("short clip runs");
        let template = ids(&out.extra["template"]);
        assert_eq!(
            out.outputs[0].shape(),
            [template.len(), m.config().text_config.vocab_size]
        );
    }
    let e = m.decode_text(&[-1]).expect_err("negative id");
    assert!(e.to_string().contains("-1"), "{e}");
}

#[test]
fn granite_config_faults_fail_closed() {
    let Some(_) = model() else { return };
    let src = root().join("fixtures/build/granite-nar-tiny");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).expect("config"))
            .expect("json");
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "num_encoder_layers",
            Box::new(|c| c["encoder_layer_indices"] = serde_json::json!([1, 2, -1])),
        ),
        (
            "dim_head",
            Box::new(|c| {
                c["encoder_config"]
                    .as_object_mut()
                    .expect("obj")
                    .remove("dim_head");
            }),
        ),
        (
            "tie_word_embeddings",
            Box::new(|c| c["text_config"]["tie_word_embeddings"] = false.into()),
        ),
        (
            "self_conditioning_layer",
            Box::new(|c| c["encoder_config"]["self_conditioning_layer"] = 9.into()),
        ),
        (
            "missing weight",
            Box::new(|c| c["text_config"]["attention_bias"] = true.into()),
        ),
        (
            "unused",
            Box::new(|c| c["text_config"]["num_hidden_layers"] = 1.into()),
        ),
    ];
    for (want, edit) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        for f in [
            "model.safetensors",
            "preprocessor_config.json",
            "tokenizer.json",
        ] {
            std::fs::copy(src.join(f), dir.path().join(f)).expect("copy");
        }
        let mut c = cfg.clone();
        edit(&mut c);
        std::fs::write(dir.path().join("config.json"), c.to_string()).expect("write");
        let e = GraniteNarModel::load(dir.path())
            .expect_err(want)
            .to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
}

#[test]
fn granite_fault_catalogue_entries_surface_at_their_expected_origin() {
    let Some(m) = model() else { return };
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("fixtures/build/granite-nar-tiny/config.json"))
            .expect("config"),
    )
    .expect("json");
    let order: Vec<String> = m
        .contract()
        .checkpoints
        .iter()
        .map(|c| c.name.clone())
        .collect();
    let (_, base) = run(&m, &RunOptions::default(), None);
    let entries: Vec<_> = catalogue()
        .into_iter()
        .filter(|e| e.family == "granite_nar")
        .collect();
    assert!(!entries.is_empty());
    for e in entries {
        let plan = FaultPlan {
            planted: vec![Planted {
                name: e.name.into(),
                kind: e.kind(&cfg).expect("fault for the tiny config"),
                target: e.default_target.into(),
                step: e.step,
                hits: Default::default(),
            }],
        };
        if let FaultKind::Param(p) = e.kind(&cfg).expect("fault for the tiny config") {
            let hits: Vec<&str> = m
                .graph()
                .ops()
                .iter()
                .filter(|op| plan.patch_kernel(op).is_some())
                .map(|op| op.name.as_str())
                .collect();
            assert!(
                !hits.is_empty(),
                "{}: {p:?} at '{}' patches no op of the graph",
                e.name,
                e.default_target
            );
        }
        let (_, bad) = run(&m, &RunOptions::default(), Some(&plan));
        // Upstream of the origin nothing changes (bit for bit); at the origin the change is well
        // beyond the parity tolerance, so the harness reports it there.
        let first = order.iter().find(|n| base[n.as_str()] != bad[n.as_str()]);
        let want = m
            .contract()
            .expand_name(e.expected_origin.0)
            .expect("expected origin names a checkpoint");
        assert_eq!(first, Some(&want), "{}: first changed checkpoint", e.name);
        let moved = max_abs(&bad[&want], &base[&want]) / scale(&base[&want]);
        assert!(
            moved > 10.0 * REL_TOL,
            "{}: {want} moved only {moved:.3e}",
            e.name
        );
        eprintln!("{:20} {want:18} moved {moved:.3e} of its scale", e.name);
    }
}
