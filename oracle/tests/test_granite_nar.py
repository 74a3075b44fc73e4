"""Tests of the granite_nar reference (oracle/xray_oracle/granite_nar.py) on the tiny fixture.

Run: .venv/bin/python -m pytest oracle/tests/test_granite_nar.py -q   (about half a minute)
"""

from __future__ import annotations

import importlib.util
import struct
import sys
import types
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "oracle"))

from xray_oracle import granite_nar as gn  # noqa: E402
from xray_oracle.contract import load_resolved  # noqa: E402
from xray_oracle.errors import OracleInputError  # noqa: E402
from xray_oracle.recorder import check_shapes  # noqa: E402

CLIP = ROOT / "fixtures" / "audio" / "fox.wav"


def _load_builder():
    spec = importlib.util.spec_from_file_location("make_granite_nar", ROOT / "fixtures" / "make_granite_nar.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def builder():
    return _load_builder()


@pytest.fixture(scope="session")
def model_dir(builder, tmp_path_factory):
    out = tmp_path_factory.mktemp("granite-nar-tiny")
    builder.build(out)
    return out


@pytest.fixture(scope="session")
def loaded(model_dir):
    model, frontend, _ = gn.load_granite_nar(model_dir)
    return model, frontend


@pytest.fixture(scope="session")
def contract(model_dir):
    from conftest import resolved_contract

    return resolved_contract(model_dir)


def run(model_dir, loaded, contract, **kw):
    model, frontend = loaded
    kw.setdefault("audio_path", CLIP)
    return gn.run_granite_nar(model_dir, contract_json=contract, model=model, frontend=frontend, **kw)


def arrays(result) -> dict[str, np.ndarray]:
    return {c["name"]: c["array"] for c in result["checkpoints"]}


@pytest.fixture(scope="session")
def baseline(model_dir, loaded, contract):
    return run(model_dir, loaded, contract)


# ------------------------------------------------------------------ fixture build


def test_fixture_build_is_deterministic(builder, model_dir, tmp_path):
    again = tmp_path / "again"
    builder.build(again)
    files = sorted(p.name for p in model_dir.iterdir())
    assert files == sorted(p.name for p in again.iterdir())
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "tokenizer.json"} <= set(files)
    for name in files:
        assert (model_dir / name).read_bytes() == (again / name).read_bytes(), name


def test_fixture_weights_are_f32_and_lm_head_is_tied(model_dir):
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        assert all(f.get_slice(k).get_dtype() == "F32" for k in keys)
    assert "language_model.lm_head.weight" not in keys
    assert "language_model.model.embed_tokens.weight" in keys
    assert "encoder.out_bpe.weight" in keys and "projector.window_positions" in keys


# ------------------------------------------------------------------ contract capture


def test_all_contract_checkpoints_captured_with_contract_shapes(baseline, contract, model_dir):
    resolved = load_resolved(contract)
    got = arrays(baseline)
    assert [c["name"] for c in baseline["checkpoints"]] == [c.name for c in resolved.checkpoints]
    for c, ck in zip(baseline["checkpoints"], resolved.checkpoints, strict=True):
        a = c["array"]
        assert c["step"] == 0 and c["layout"] == ck.layout
        assert a.dtype == np.float32 and a.flags["C_CONTIGUOUS"], c["name"]
        assert np.isfinite(a).all(), c["name"]
    bound = check_shapes(resolved, resolved.checkpoints, {(n, 0): a.shape for n, a in got.items()})[0]
    # The tiny fixture on fox.wav: 56503 samples -> 2 * (56503 // 320) = 352 mel frames -> 176.
    assert bound == {"enc_frames": 176, "bpe_frames": 44, "proj_tokens": 36, "n_total": 44, "n_text": 9}
    assert got["enc.mel_in"].shape == (176, 160)
    assert got["enc.cat_out"].shape == (176, 256)
    assert got["proj.qformer.out"].shape == (36, 48)
    assert got["dec.flat_embeds"].shape == (35 + 9, 64)
    assert got["dec.text_logits"].shape == (9, 128)
    assert baseline["family"] == "granite_nar"
    assert baseline["weights_sha256"] and baseline["audio_sha256"] and baseline["tools"]["transformers"]


def test_contract_resolution_edges(contract, model_dir):
    resolved = load_resolved(contract)
    names = [c.name for c in resolved.checkpoints]
    # Topological order: the self-conditioning tensors sit between blocks 1 and 2 (sc_layer = 2).
    assert names.index("enc.block.1.out") < names.index("enc.ctc_logits") < names.index("enc.block.2.out")
    assert resolved.get("enc.block.0.out").inputs == ["enc.input_linear.out"]
    assert resolved.get("enc.block.2.out").inputs == ["enc.block.1.out", "enc.ctc_logits"]
    assert resolved.get("enc.block.3.out").inputs == ["enc.block.2.out"]
    assert resolved.get("enc.cat_out").inputs == [
        "enc.block.0.out", "enc.block.1.out", "enc.block.2.out", "enc.block.3.out", "enc.ctc_logits"
    ]
    assert resolved.get("enc.ctc_bpe_logits").inputs == ["enc.block.3.out", "enc.mid_blank_probs"]
    assert resolved.get("dec.text_logits").inputs == ["dec.layer.1.out"]
    for c in resolved.checkpoints:
        for i in c.inputs:
            assert names.index(i) < names.index(c.name), (c.name, i)


def test_only_subset_and_unknown_name(model_dir, loaded, contract):
    r = run(model_dir, loaded, contract, only=["dec.text_logits", "enc.block.3.out"])
    assert [c["name"] for c in r["checkpoints"]] == ["enc.block.3.out", "dec.text_logits"]
    with pytest.raises(OracleInputError, match=r"unknown checkpoint name\(s\) \['enc.block.9.out'\]"):
        run(model_dir, loaded, contract, only=["enc.block.9.out"])
    # A template selects every layer, as for Whisper (one selection rule: `recorder.select`).
    r = run(model_dir, loaded, contract, only=["enc.block.{layer}.out"])
    assert [c["name"] for c in r["checkpoints"]] == [f"enc.block.{i}.out" for i in range(4)]


# ------------------------------------------------------------------ CTC hypothesis


@pytest.mark.parametrize("clip", ["fox.wav", "stella.wav", "weather.wav"])
def test_ctc_hypothesis_is_nonempty_and_has_comfortable_margins(model_dir, loaded, contract, clip):
    """Every pooled frame's top-1 / top-2 BPE-CTC logit margin is >= 1.0 (logits spread over
    roughly -20..30; f32 vs f64 differ by ~1e-5, bf16 by ~0.15), so the hypothesis -- and with it
    every dec.* shape -- cannot flip between two correct implementations."""
    model, _ = loaded
    r = run(model_dir, loaded, contract, audio_path=ROOT / "fixtures" / "audio" / clip, only=["enc.ctc_bpe_logits"])
    bpe = arrays(r)["enc.ctc_bpe_logits"]
    hyp = r["hypothesis"]
    assert hyp, clip
    if clip == "fox.wav":
        assert 3 <= len(hyp) <= 10 and len(set(hyp)) >= 3, hyp
    assert hyp == model.bpe_hypothesis(torch.from_numpy(bpe)[None])
    top2 = np.sort(bpe, axis=-1)[:, -2:]
    margins = top2[:, 1] - top2[:, 0]
    assert margins.min() >= 1.0, margins.min()
    blank = model.config.bpe_blank_channel
    assert (bpe.argmax(-1) != blank).sum() >= len(hyp)  # some frames are tokens, most are blank
    assert r["template"] == gn.add_insertion_slots(hyp, model.config.blank_token_id, 8)


def test_posterior_weighted_pooling_is_not_a_plain_mean(baseline):
    got = arrays(baseline)
    blank = got["enc.mid_blank_probs"]
    assert blank.min() < 0.05 and blank.max() > 0.8  # the weights really vary over the clip


# ------------------------------------------------------------------ bidirectional LM


def test_changing_a_later_text_token_changes_earlier_logits(model_dir, loaded, contract, baseline):
    hyp = baseline["hypothesis"]
    other = [t for t in range(1, 120) if t not in hyp][0]
    a = run(model_dir, loaded, contract, teacher_hypothesis=hyp, only=["dec.text_logits"])
    b = run(model_dir, loaded, contract, teacher_hypothesis=hyp[:-1] + [other], only=["dec.text_logits"])
    la, lb = arrays(a)["dec.text_logits"], arrays(b)["dec.text_logits"]
    assert np.abs(la[0] - lb[0]).max() > 1e-2  # position 0 sees the last hypothesis token
    model, _ = loaded
    model.bidirectional = False
    try:
        ca = arrays(run(model_dir, loaded, contract, teacher_hypothesis=hyp, only=["dec.text_logits"]))["dec.text_logits"]
        cb = arrays(run(model_dir, loaded, contract, teacher_hypothesis=hyp[:-1] + [other], only=["dec.text_logits"]))["dec.text_logits"]
    finally:
        model.bidirectional = True
    last = 2 * len(hyp) - 1
    np.testing.assert_allclose(ca[:last], cb[:last], atol=1e-6)  # causal: earlier rows unaffected


def test_causal_variant_changes_text_logits_only(model_dir, loaded, contract, baseline):
    model, _ = loaded
    model.bidirectional = False
    try:
        causal = arrays(run(model_dir, loaded, contract))
    finally:
        model.bidirectional = True
    ref = arrays(baseline)
    assert np.abs(causal["dec.text_logits"] - ref["dec.text_logits"]).max() > 1e-2
    for name in ("enc.cat_out", "enc.ctc_bpe_logits", "proj.out", "dec.flat_embeds"):
        np.testing.assert_array_equal(causal[name], ref[name])


def test_transformers_auto_mask_stays_causal_without_explicit_mask(loaded):
    """The forward map's warning: GraniteModel builds a causal mask itself when given none, even
    with every attention module's is_causal = False. Hence the explicit all-attend 4D mask."""
    model, _ = loaded
    lm = model.language_model.model
    assert all(not layer.self_attn.is_causal for layer in lm.layers)
    x = torch.randn(1, 6, lm.config.hidden_size, generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[0, -1] += 1.0
    with torch.no_grad():
        auto = [lm(inputs_embeds=t, use_cache=False).last_hidden_state for t in (x, y)]
        full = [lm(inputs_embeds=t, attention_mask=torch.zeros(1, 1, 6, 6), use_cache=False).last_hidden_state for t in (x, y)]
    torch.testing.assert_close(auto[0][0, :5], auto[1][0, :5])  # causal despite is_causal = False
    assert (full[0][0, 0] - full[1][0, 0]).abs().max() > 1e-3  # bidirectional with the explicit mask


# ------------------------------------------------------------------ encoder details


def test_removing_the_bypass_changes_only_blocks_after_it(model_dir, loaded, contract, baseline):
    model, _ = loaded
    sc = model.config.self_conditioning_layer
    model.encoder.use_self_conditioning = False
    try:
        nob = arrays(run(model_dir, loaded, contract))
    finally:
        model.encoder.use_self_conditioning = True
    ref = arrays(baseline)
    np.testing.assert_array_equal(nob[f"enc.block.{sc - 1}.out"], ref[f"enc.block.{sc - 1}.out"])
    np.testing.assert_array_equal(nob["enc.mid_blank_probs"], ref["enc.mid_blank_probs"])
    assert np.abs(nob[f"enc.block.{sc}.out"] - ref[f"enc.block.{sc}.out"]).max() > 1e-2


def test_cat_out_captures_the_self_conditioned_state(baseline, loaded):
    """encoder_layer_indices [1, 2, 3, -1]: slice k is block k's output, except that the
    self-conditioning block's slice is taken after `h + out_mid(softmax(out(h)))`."""
    model, _ = loaded
    got = arrays(baseline)
    h = model.config.encoder.hidden_dim
    cat = got["enc.cat_out"]
    np.testing.assert_array_equal(cat[:, 0:h], got["enc.block.0.out"])
    np.testing.assert_array_equal(cat[:, 2 * h : 3 * h], got["enc.block.2.out"])
    np.testing.assert_array_equal(cat[:, 3 * h : 4 * h], got["enc.block.3.out"])
    pre = got["enc.block.1.out"]
    assert np.abs(cat[:, h : 2 * h] - pre).max() > 1e-2
    with torch.no_grad():
        probs = torch.softmax(torch.from_numpy(got["enc.ctc_logits"]), dim=-1)
        post = torch.from_numpy(pre) + model.encoder.out_mid(probs)
    np.testing.assert_allclose(cat[:, h : 2 * h], post.numpy(), atol=1e-5)
    np.testing.assert_allclose(got["enc.mid_blank_probs"], probs[:, 0].numpy(), atol=1e-6)


def test_flat_embeds_are_scaled_audio_then_template_embeddings(baseline, loaded):
    model, _ = loaded
    got = arrays(baseline)
    n_audio = got["enc.mel_in"].shape[0] // model.config.projector.downsample_rate
    emb = model.language_model.model.embed_tokens.weight.detach().numpy()[baseline["template"]]
    flat = got["dec.flat_embeds"]
    np.testing.assert_allclose(flat[:n_audio], got["proj.out"][:n_audio] / 12.0, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(flat[n_audio:], emb)


# ------------------------------------------------------------------ teacher forcing


@pytest.mark.parametrize("teacher", [[5, 17, 17, 40, 2, 9], [33]])
def test_teacher_hypothesis_replaces_the_ctc_hypothesis(model_dir, loaded, contract, baseline, teacher):
    r = run(model_dir, loaded, contract, teacher_hypothesis=teacher)
    got, ref = arrays(r), arrays(baseline)
    blank = loaded[0].config.blank_token_id
    assert r["hypothesis"] == baseline["hypothesis"]  # still the CTC one
    assert r["template"] == gn.add_insertion_slots(teacher, blank, 8)
    assert got["dec.text_logits"].shape[0] == max(2 * len(teacher) + 1, 8)
    for name in ("enc.ctc_bpe_logits", "enc.cat_out", "proj.out"):
        np.testing.assert_array_equal(got[name], ref[name])
    with pytest.raises(gn.GraniteNarInputError, match="teacher_hypothesis"):
        run(model_dir, loaded, contract, teacher_hypothesis=[10_000])


# ------------------------------------------------------------------ host helpers


def test_ctc_decode_slots_and_pool_helpers():
    blank = 9
    logits = torch.nn.functional.one_hot(torch.tensor([3, 3, 9, 3, 4, 4, 9, 9, 5]), 10).float()
    assert gn.ctc_greedy_decode(logits, blank) == [3, 3, 4, 5]
    assert gn.add_insertion_slots([7, 8], blank=1, min_length=8) == [1, 7, 1, 8, 1, 1, 1, 1]
    assert gn.add_insertion_slots(list(range(2, 7)), blank=1, min_length=8) == [1, 2, 1, 3, 1, 4, 1, 5, 1, 6, 1]
    h = torch.arange(6, dtype=torch.float32).view(1, 6, 1)
    imp = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 3.0]])
    pooled = gn.posterior_weighted_pool(h, imp, 4)
    # tail window [4, 5] with weights 1/4, 3/4 (normalised over its own two frames)
    torch.testing.assert_close(pooled[0, :, 0], torch.tensor([1.5, 4.75]))
    assert gn.posterior_weighted_pool(h, torch.zeros(1, 6), 4).abs().max() < 1e-6  # all-blank -> ~0


def test_legacy_bpe_layout_shifts_channels():
    """bpe_output_dim = vocab_size + 1 (the forward map's 100353): channel 0 is the blank."""
    cfg = types.SimpleNamespace(bpe_output_dim=11, text=types.SimpleNamespace(vocab_size=10), blank_token_id=7)
    cfg.bpe_blank_channel = gn.GraniteNarConfig.bpe_blank_channel.fget(cfg)
    stub = types.SimpleNamespace(config=cfg)
    logits = torch.nn.functional.one_hot(torch.tensor([0, 8, 8, 0, 1, 0]), 11).float()[None]
    assert gn.GraniteNARForConditionalGeneration.bpe_hypothesis(stub, logits) == [7, 0]


# ------------------------------------------------------------------ frontend and audio


def test_nar_framing_vs_transformers_ar_extractor():
    audio, _ = gn.read_wav(CLIP)
    nar = gn.GraniteNarFrontend({"feature_extractor_type": "GraniteSpeechNarFeatureExtractor"})
    ar = gn.GraniteNarFrontend({"feature_extractor_type": "GraniteSpeechFeatureExtractor"})
    n = len(audio)
    assert (n // 160) % 2 == 1
    assert nar(audio).shape[1] == n // 320 and ar(audio).shape[1] == n // 320 + 1  # 176 vs 177
    even = audio[: (n // 320) * 320 + 100]  # n // 160 even: both keep n // 160 mel frames
    torch.testing.assert_close(nar(even), ar(even), rtol=0, atol=0)


def _write_wav(path: Path, rate=16000, channels=1, width=2, frames=1600, data: bytes | None = None):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(data if data is not None else b"\x01\x00" * channels * frames * (width // 2 or 1))
    return path


@pytest.mark.parametrize(
    "kind, match",
    [
        ("rate", "sample rate 8000"),
        ("stereo", "2 channels"),
        ("8bit", "8-bit"),
        ("24bit", "24-bit"),
        ("float", "not 16-bit integer PCM"),
        ("garbage", "not a readable WAV"),
        ("truncated", "truncated"),
        ("empty", "no samples"),
        ("missing", "does not exist"),
    ],
)
def test_bad_audio_is_refused(tmp_path, kind, match):
    p = tmp_path / f"{kind}.wav"
    if kind == "rate":
        _write_wav(p, rate=8000)
    elif kind == "stereo":
        _write_wav(p, channels=2)
    elif kind == "8bit":
        _write_wav(p, width=1, data=b"\x80" * 1600)
    elif kind == "24bit":
        _write_wav(p, width=3, data=b"\x00\x01\x00" * 1600)
    elif kind == "float":
        body = struct.pack("<4sIHHIIHH", b"fmt ", 16, 3, 1, 16000, 64000, 4, 32) + struct.pack("<4sI", b"data", 8) + b"\x00" * 8
        p.write_bytes(struct.pack("<4sI4s", b"RIFF", 4 + len(body), b"WAVE") + body)
    elif kind == "garbage":
        p.write_bytes(b"this is not a wav file at all" * 10)
    elif kind == "truncated":
        _write_wav(p, frames=1600)
        p.write_bytes(p.read_bytes()[:-1000])
    elif kind == "empty":
        _write_wav(p, data=b"")
    with pytest.raises(gn.GraniteNarInputError, match=match):
        gn.read_wav(p)


def test_too_short_audio_is_refused(model_dir, loaded, contract, tmp_path):
    p = _write_wav(tmp_path / "short.wav", frames=200)
    with pytest.raises(gn.GraniteNarInputError, match="too short"):
        run(model_dir, loaded, contract, audio_path=p)


def test_loader_rejects_mismatched_weights(model_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("config.json", "preprocessor_config.json"):
        (bad / name).write_bytes((model_dir / name).read_bytes())
    state = load_file(str(model_dir / "model.safetensors"))
    state["encoder.surprise"] = torch.zeros(1)
    del state["projector.query"]
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(gn.GraniteNarInputError, match=r"missing \['projector.query'\].*unexpected \['encoder.surprise'\]"):
        gn.load_granite_nar(bad)


# ------------------------------------------------------------------ op-level points


def test_op_points_all_change_nothing_else(model_dir, loaded, contract, baseline):
    from xray_oracle.errors import OracleInputError

    full = run(model_dir, loaded, contract, ops="all")
    assert baseline["op_points"] == []
    assert full["tokens"] == baseline["tokens"] and full["hypothesis"] == baseline["hypothesis"]
    for a, b in zip(baseline["checkpoints"], full["checkpoints"], strict=True):
        assert a["name"] == b["name"] and np.array_equal(a["array"], b["array"]), a["name"]
    model, _ = loaded
    own = [n for n, m in model.named_modules() if n and next(m.parameters(recurse=False), None) is not None]
    got = {p["name"]: p for p in full["op_points"]}
    assert set(got) == {f"{n}:{s}" for n in own for s in ("in", "out")} and len(got) == len(full["op_points"])
    assert {p["step"] for p in full["op_points"]} == {0}
    # The LM head's output is the text logits checkpoint's tensor (one forward pass).
    logits = next(c["array"] for c in baseline["checkpoints"] if c["name"] == "dec.text_logits")
    np.testing.assert_array_equal(got["language_model.lm_head:out"]["array"], logits)
    assert got["encoder.layers.0.conv.up_conv:out"]["layout"] == "channel_major"
    with pytest.raises(OracleInputError, match=r"no module 'encoder\.layers\.9\.ff1'"):
        run(model_dir, loaded, contract, ops=["encoder.layers.9.ff1:in"])
