"""run_whisper on the real tiny.en and both random fixtures: tokens, transcripts, every contract
checkpoint at the right steps with the right shapes, and the HF facts the contract relies on."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import AUDIO, EDGE_AUDIO, EXPECTED_WORDS, RAND_A, RAND_B, TINY_EN, resolved_contract

from xray_oracle import run_whisper
from xray_oracle.errors import CaptureError, OracleInputError

SOT, NOTS, EOT = 50257, 50362, 50256
MIN_MARGIN = 0.05  # greedy top-1 minus top-2 logit, every step of every committed clip

_cache: dict = {}


def run(model, clip, **kw):
    key = (str(model), str(clip), json.dumps(kw, sort_keys=True))
    if key not in _cache:
        _cache[key] = run_whisper(str(model), str(clip), resolved_contract(model), **kw)
    return _cache[key]


def expected_shapes(config: dict, tokens_at_step) -> dict:
    """Independent of xray_oracle.contract: the contract's shapes written out by hand."""
    d, h = config["d_model"], config["decoder_attention_heads"]
    mel, src, V = config["num_mel_bins"], config["max_source_positions"], config["vocab_size"]
    once = {"audio.frontend.mel": [mel, 2 * src], "audio.encoder.conv1.out": [d, 2 * src],
            "audio.encoder.conv2.out": [d, src], "audio.encoder.memory": [src, d]}
    for i in range(config["encoder_layers"]):
        once[f"audio.encoder.layer.{i}.out"] = [src, d]
    prefill, every = {}, {}
    for i in range(config["decoder_layers"]):
        p = f"audio.decoder.layer.{i}"
        prefill[f"{p}.cross_k"] = prefill[f"{p}.cross_v"] = [h, src, d // h]
        # Self-attention probabilities: keys are every position so far (prefix 2 + step k).
        every[f"{p}.self_attention.probs"] = lambda T, k, h=h: [h, T, 2 + k]
        every[f"{p}.self_attention.output"] = lambda T, k: [T, d]
        every[f"{p}.cross_attention.output"] = lambda T, k, h=h: [h, T, d // h]
        every[f"{p}.cross_attention.out_proj"] = lambda T, k: [T, d]
        every[f"{p}.out"] = lambda T, k: [T, d]
    every["audio.decoder.logits"] = lambda T, k: [T, V]
    # What each step was fed: token ids and positions.
    every["audio.decoder.input_ids"] = lambda T, k: [T]
    every["audio.decoder.position_ids"] = lambda T, k: [T]
    return once, prefill, every


def check_complete(res: dict, model_dir, dtype=np.float32):
    config = json.loads((model_dir / "config.json").read_text())
    tokens = res["tokens"]
    assert tokens[:2] == [SOT, NOTS]
    steps = len(tokens) - 2  # one decoder call per generated token (the last one is not fed back)
    once, prefill, every = expected_shapes(config, None)
    got = {(c["name"], c["step"]): c for c in res["checkpoints"]}
    want = {(n, 0): s for n, s in {**once, **prefill}.items()}
    for n, f in every.items():
        for k in range(steps):
            want[(n, k)] = f(2 if k == 0 else 1, k)
    assert set(got) == set(want)
    for key, shape in want.items():
        a = got[key]["array"]
        assert list(a.shape) == shape, key
        assert a.dtype == dtype and a.flags["C_CONTIGUOUS"], key
        assert np.isfinite(a).all(), key
    assert [c["step"] for c in res["checkpoints"]] == sorted(c["step"] for c in res["checkpoints"])
    return got, steps


def check_greedy(res: dict, model_dir, got, steps):
    """The argmax of each step's last logits row (with generate's suppressions) is the next token:
    proves the step numbering and that logits are captured where generate reads them."""
    gen = json.loads((model_dir / "generation_config.json").read_text())
    margins = []
    for k in range(steps):
        row = got[("audio.decoder.logits", k)]["array"][-1].astype(np.float64)
        row[gen["suppress_tokens"]] = -np.inf
        if k == 0:
            row[gen["begin_suppress_tokens"]] = -np.inf
        top = np.argsort(row)[::-1][:2]
        assert top[0] == res["tokens"][2 + k], f"step {k}"
        margins.append(row[top[0]] - row[top[1]])
    return min(margins)


def test_tiny_en_fox_all_checkpoints():
    res = run(TINY_EN, AUDIO / "fox.wav")
    got, steps = check_complete(res, TINY_EN)
    assert res["tokens"][-1] == EOT
    assert check_greedy(res, TINY_EN, got, steps) > MIN_MARGIN
    text = res["transcript"].lower()
    for w in EXPECTED_WORDS["fox.wav"]:
        assert w in text, (w, res["transcript"])
    # (a) step 0 logits cover every prefix position; (c) cross K/V are computed at step 0 only
    assert got[("audio.decoder.logits", 0)]["array"].shape == (2, 51864)
    assert ("audio.decoder.layer.0.cross_k", 1) not in got
    # (d) self-attention probabilities: rows sum to 1; the prefill's future key is masked to exactly 0
    for k in range(steps):
        pr = got[("audio.decoder.layer.1.self_attention.probs", k)]["array"]
        assert np.allclose(pr.sum(-1), 1.0, atol=1e-5)
    assert (got[("audio.decoder.layer.0.self_attention.probs", 0)]["array"][:, 0, 1] == 0.0).all()
    assert res["step_tokens"][0] == [SOT, NOTS] and all(len(t) == 1 for t in res["step_tokens"][1:])
    assert res["tools"]["transformers"] == "5.24.0" and len(res["weights_sha256"]) == 64
    # mel is the log-mel WhisperFeatureExtractor makes: in [-1.5, 1.5] after (x + 4) / 4
    mel = got[("audio.frontend.mel", 0)]["array"]
    assert -1.5 < mel.min() and mel.max() < 2.5


@pytest.mark.parametrize("clip", ["stella.wav", "weather.wav"])
def test_tiny_en_transcripts(clip):
    res = run(TINY_EN, AUDIO / clip, only=[])
    assert res["checkpoints"] == [] and res["tokens"][:2] == [SOT, NOTS] and res["tokens"][-1] == EOT
    text = res["transcript"].lower()
    missing = [w for w in EXPECTED_WORDS[clip] if w not in text]
    assert not missing, (missing, res["transcript"])


def test_tiny_en_silence():
    res = run(TINY_EN, EDGE_AUDIO / "silence-2s.wav", only=["audio.decoder.logits"], max_new_tokens=3)
    assert 3 <= len(res["tokens"]) <= 5


@pytest.mark.parametrize("model_dir", [RAND_A, RAND_B], ids=["rand-a", "rand-b"])
def test_random_fixtures_all_checkpoints(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    margins = []
    for clip in ("fox.wav", "stella.wav", "weather.wav"):
        res = run(model_dir, AUDIO / clip)
        got, steps = check_complete(res, model_dir)
        assert steps == 12  # generation_config max_length 12 new tokens
        margins.append(check_greedy(res, model_dir, got, steps))
    assert min(margins) > MIN_MARGIN, margins
    assert res["dims"]["heads"] == config["decoder_attention_heads"]


def test_cross_k_is_k_proj_of_the_encoder_memory():
    """Hook placement and split_heads, recomputed from the weights with numpy."""
    from safetensors.numpy import load_file

    res = run(RAND_B, AUDIO / "fox.wav")
    got = {(c["name"], c["step"]): c["array"] for c in res["checkpoints"]}
    w = load_file(str(RAND_B / "model.safetensors"))
    mem = got[("audio.encoder.memory", 0)].astype(np.float64)
    for i in range(2):
        k = mem @ w[f"model.decoder.layers.{i}.encoder_attn.k_proj.weight"].T.astype(np.float64)  # no bias
        k = k.reshape(250, 3, 32).transpose(1, 0, 2)
        np.testing.assert_allclose(got[(f"audio.decoder.layer.{i}.cross_k", 0)], k, rtol=1e-4, atol=1e-4)
    # cross_attention.out_proj = out_proj(cross_attention.output merged back to [T, H*D])
    ctx = got[("audio.decoder.layer.1.cross_attention.output", 3)]
    merged = ctx.transpose(1, 0, 2).reshape(1, 96).astype(np.float64)
    p = "model.decoder.layers.1.encoder_attn.out_proj"
    np.testing.assert_allclose(got[("audio.decoder.layer.1.cross_attention.out_proj", 3)],
                               merged @ w[f"{p}.weight"].T + w[f"{p}.bias"], rtol=1e-4, atol=1e-4)


def test_float64_run_matches_float32():
    r32 = run(RAND_A, AUDIO / "fox.wav")
    r64 = run(RAND_A, AUDIO / "fox.wav", dtype="float64")
    got64, _ = check_complete(r64, RAND_A, dtype=np.float64)
    assert r64["tokens"] == r32["tokens"]
    for c in r32["checkpoints"]:
        b = got64[(c["name"], c["step"])]["array"]
        scale = max(1.0, float(np.abs(b).max()))
        assert np.abs(c["array"] - b).max() < 1e-3 * scale, c["name"]


def test_float64_log_mel_port_matches_the_feature_extractor():
    from transformers import WhisperFeatureExtractor

    from xray_oracle.audio import read_wav
    from xray_oracle.whisper import log_mel_float64

    fe = WhisperFeatureExtractor.from_pretrained(str(TINY_EN), local_files_only=True)
    a = read_wav(AUDIO / "stella.wav")
    ref = fe(a.samples, sampling_rate=16000, return_tensors="np").input_features
    ours = log_mel_float64(fe, a.samples.astype(np.float64)).numpy()
    assert ours.dtype == np.float64 and ours.shape == ref.shape == (1, 80, 3000)
    assert np.abs(ours - ref).max() < 1e-4


def test_only_and_max_new_tokens():
    res = run(RAND_A, AUDIO / "fox.wav", only=["audio.decoder.layer.{layer}.out", "audio.encoder.memory"],
              max_new_tokens=3)
    names = sorted({c["name"] for c in res["checkpoints"]})
    assert names == ["audio.decoder.layer.0.out", "audio.decoder.layer.1.out", "audio.encoder.memory"]
    assert len(res["tokens"]) == 5 and max(c["step"] for c in res["checkpoints"]) == 2
    with pytest.raises(OracleInputError, match=r"unknown checkpoint name\(s\) \['audio.nope'\]"):
        run_whisper(str(RAND_A), str(AUDIO / "fox.wav"), resolved_contract(RAND_A), only=["audio.nope"])


def test_model_dir_refusals(tmp_path):
    clip = str(AUDIO / "fox.wav")
    with pytest.raises(OracleInputError, match=r"does not exist; run `make fixtures`"):
        run_whisper(str(tmp_path / "absent"), clip, resolved_contract(RAND_A))
    d = tmp_path / "m"
    shutil.copytree(RAND_A, d)
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(OracleInputError, match=r"pickle-format weights \['pytorch_model.bin'\]"):
        run_whisper(str(d), clip, resolved_contract(d))
    (d / "pytorch_model.bin").unlink()
    (d / "model.safetensors").unlink()
    with pytest.raises(OracleInputError, match=r"has no \.safetensors weights"):
        run_whisper(str(d), clip, resolved_contract(d))
    with pytest.raises(OracleInputError, match=r"fox-stereo\.wav: 2 channels"):
        run_whisper(str(RAND_A), str(EDGE_AUDIO / "fox-stereo.wav"), resolved_contract(RAND_A))
    with pytest.raises(OracleInputError, match=r"long-35s\.wav: 35\.00 s of audio, longer than the model's 5 s window"):
        run_whisper(str(RAND_A), str(EDGE_AUDIO / "long-35s.wav"), resolved_contract(RAND_A))
    with pytest.raises(OracleInputError, match=r"44100 Hz"):
        run_whisper(str(TINY_EN), str(EDGE_AUDIO / "fox-44k.wav"), resolved_contract(TINY_EN))


def test_contract_disagreements_name_the_checkpoint():
    text = resolved_contract(RAND_A)
    data = json.loads(text)
    mem = next(c for c in data["checkpoints"] if c["name"] == "audio.encoder.memory")
    mem["shape"] = mem["shape"][::-1]
    with pytest.raises(CaptureError, match=r"audio\.encoder\.memory@step0: HF gives shape \[250, 64\], the contract says"):
        run_whisper(str(RAND_A), str(AUDIO / "fox.wav"), json.dumps(data), only=["audio.encoder.memory"], max_new_tokens=1)
    data = json.loads(text)
    ck = next(c for c in data["checkpoints"] if c["name"] == "audio.decoder.layer.0.cross_k")
    ck["steps"] = "every"
    with pytest.raises(CaptureError, match=r"audio\.decoder\.layer\.0\.cross_k .*captured at steps \[0\] of 2; missing \[1\]"):
        run_whisper(str(RAND_A), str(AUDIO / "fox.wav"), json.dumps(data), only=[ck["name"]], max_new_tokens=2)
    data = json.loads(text)
    lg = next(c for c in data["checkpoints"] if c["name"] == "audio.decoder.logits")
    lg["reference"]["module"] = "lm_head"
    from xray_oracle.errors import ContractError

    with pytest.raises(ContractError, match="module 'lm_head' does not exist"):
        run_whisper(str(RAND_A), str(AUDIO / "fox.wav"), json.dumps(data), only=["audio.decoder.logits"], max_new_tokens=1)
    # A contract as written (not resolved) is refused, with the command that resolves it.
    raw = (AUDIO.parents[1] / "core" / "contracts" / "whisper.json").read_text()
    with pytest.raises(ContractError, match=r"xray contract --model DIR"):
        run_whisper(str(RAND_A), str(AUDIO / "fox.wav"), raw)


def test_dump_cli_round_trip(tmp_path):
    from xray_oracle.__main__ import main
    from xray_oracle.dump import read_dump

    out = tmp_path / "dump"
    contract = tmp_path / "contract.json"
    contract.write_text(resolved_contract(RAND_B))
    argv = ["dump", "--model", str(RAND_B), "--audio", str(AUDIO / "weather.wav"), "--out", str(out),
            "--contract", str(contract), "--max-new-tokens", "2"]
    assert main(argv) == 0
    d = read_dump(out)
    m = d.manifest
    assert m["producer"] == "oracle" and m["family"] == "whisper" and m["tokens"][:2] == [SOT, NOTS]
    assert m["tools"]["torch"].startswith("2.11") and m["weights_sha256"] and m["audio_sha256"]
    # once + prefill (cross K/V) + 2 steps x every (ids, positions, 5 per layer, logits)
    assert len(d.checkpoints) == (4 + 3) + 2 * 2 + 2 * (2 + 5 * 2 + 1)
    assert d.get("audio.decoder.layer.1.cross_attention.output", 1).array.shape == (3, 1, 32)
    assert main(argv) == 2  # exists, no --force


def test_summarize_keeps_no_array_and_sees_what_the_full_run_captures():
    """Stats-only capture (`xray check --stats-only`): `summarize` is handed each checkpoint as it
    is captured, the entries carry its shape and the index it returned and no array, and what it
    was handed is what a full run returns, checkpoint by checkpoint."""
    from xray_oracle.dump import content_sha256

    handed = []

    def summarize(a):
        assert a.dtype == np.float32 and a.flags["C_CONTIGUOUS"]
        handed.append(content_sha256(a))
        return len(handed) - 1

    res = run_whisper(str(RAND_A), str(AUDIO / "fox.wav"), resolved_contract(RAND_A), max_new_tokens=3,
                      summarize=summarize)
    full = run(RAND_A, AUDIO / "fox.wav", max_new_tokens=3)
    assert res["tokens"] == full["tokens"]
    assert [(c["name"], c["step"]) for c in res["checkpoints"]] == [(c["name"], c["step"]) for c in full["checkpoints"]]
    assert sorted(c["summary"] for c in res["checkpoints"]) == list(range(len(handed)))
    for s, f in zip(res["checkpoints"], full["checkpoints"], strict=True):
        assert "array" not in s and s["shape"] == list(f["array"].shape)
        assert handed[s["summary"]] == content_sha256(f["array"]), (s["name"], s["step"])
    for kw in ({"dtype": "float64"}, {"ops": "all"}):
        with pytest.raises(OracleInputError, match="stats-only"):
            run_whisper(str(RAND_A), str(AUDIO / "fox.wav"), resolved_contract(RAND_A), summarize=summarize, **kw)
