"""Op-level points (xray_oracle.ops): capture changes nothing else, points sit where HF computes
them (checked against arithmetic redone here), the step rules, selection errors, the layout and
batch rules on small torch modules, and the `--ops` dump loading in the Rust harness."""
from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest
import torch
from conftest import AUDIO, RAND_A, REPO, XRAY_BINS, resolved_contract

from xray_oracle import run_whisper
from xray_oracle.contract import Contract, PointRule
from xray_oracle.errors import CaptureError, ContractError, OracleInputError
from xray_oracle.ops import OpRecorder, parse_ops

_cache: dict = {}


def run(**kw):
    key = json.dumps(kw, sort_keys=True)
    if key not in _cache:
        _cache[key] = run_whisper(str(RAND_A), str(AUDIO / "fox.wav"), resolved_contract(RAND_A), **kw)
    return _cache[key]


def points(res) -> dict:
    return {(p["name"], p["step"]): p for p in res["op_points"]}


def test_all_points_change_nothing_else():
    plain, full = run(), run(ops="all")
    assert plain["op_points"] == []
    assert full["tokens"] == plain["tokens"] and full["step_tokens"] == plain["step_tokens"]
    assert len(full["checkpoints"]) == len(plain["checkpoints"])
    for a, b in zip(plain["checkpoints"], full["checkpoints"], strict=True):
        assert (a["name"], a["step"], a["layout"]) == (b["name"], b["step"], b["layout"])
        assert np.array_equal(a["array"], b["array"]), a["name"]
    # Every module with weights of its own, both sides; Whisper's are all called.
    config = json.loads((RAND_A / "config.json").read_text())
    names = {p["name"] for p in full["op_points"]}
    per_enc, per_dec = 8, 13  # q,k,v,out, 2 norms, fc1, fc2; + cross q,k,v,out, norm
    n_modules = (2 + 1 + per_enc * config["encoder_layers"] + 1) + (2 + per_dec * config["decoder_layers"] + 1) + 1
    # Plus each decoder self-attention's cache after the call, keys and values (the contract
    # declares them): the state carried between steps.
    caches = {n for n in names if n.endswith((":keys", ":values"))}
    assert caches == {f"model.decoder.layers.{i}.self_attn:{s}" for i in range(config["decoder_layers"])
                      for s in ("keys", "values")}
    assert len(names) == 2 * n_modules + len(caches)
    assert all(n.endswith((":in", ":out")) for n in names - caches)
    steps = [p["step"] for p in full["op_points"]]
    assert steps == sorted(steps)


def test_points_are_where_hf_computes_them():
    res = run(ops="all")
    got = points(res)
    config = json.loads((RAND_A / "config.json").read_text())
    enc_tokens, ffn = config["max_source_positions"], config["encoder_ffn_dim"]
    p = "model.encoder.layers.0"
    fc1 = got[(f"{p}.fc1:out", 0)]
    assert fc1["array"].shape == (enc_tokens, ffn) and fc1["layout"] == "token_major"
    assert not any(n == f"{p}.fc1:out" and s > 0 for n, s in got)
    # fc2's input is the exact (erf) GELU of fc1's output, recomputed in float64 here.
    x = fc1["array"].astype(np.float64)
    gelu = 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    assert np.abs(got[(f"{p}.fc2:in", 0)]["array"] - gelu).max() < 1e-6
    # The residual sum the layer computes is the next norm's input ...
    layer_in = got[(f"{p}.self_attn_layer_norm:in", 0)]["array"]
    residual = layer_in + got[(f"{p}.self_attn.out_proj:out", 0)]["array"]
    norm_in = got[(f"{p}.final_layer_norm:in", 0)]["array"]
    np.testing.assert_allclose(norm_in, residual, rtol=0, atol=1e-5)
    # ... and the layer's output (layer 1's input) adds fc2: not the same tensor.
    layer_out = got[("model.encoder.layers.1.self_attn_layer_norm:in", 0)]["array"]
    np.testing.assert_allclose(layer_out, norm_in + got[(f"{p}.fc2:out", 0)]["array"], rtol=0, atol=1e-5)
    assert np.abs(layer_out - norm_in).max() > 1e-3
    assert np.array_equal(got[(f"{p}.fc1:in", 0)]["array"], got[(f"{p}.final_layer_norm:out", 0)]["array"])
    # The conv layout and the mel as conv1's input.
    conv1 = got[("model.encoder.conv1:in", 0)]
    assert conv1["layout"] == "channel_major" and conv1["array"].shape == (config["num_mel_bins"], 2 * enc_tokens)
    mel = next(c for c in res["checkpoints"] if c["name"] == "audio.frontend.mel")["array"]
    assert np.array_equal(conv1["array"], mel)


def test_decoder_points_at_every_step_and_cross_kv_once():
    res = run(ops="all")
    got = points(res)
    steps = len(res["tokens"]) - 2
    q = "model.decoder.layers.0.self_attn.q_proj:out"
    assert sorted(s for n, s in got if n == q) == list(range(steps))
    assert got[(q, 0)]["array"].shape[0] == 2
    assert all(got[(q, s)]["array"].shape[0] == 1 for s in range(1, steps))
    for side in ("k_proj", "v_proj"):
        assert [s for n, s in got if n == f"model.decoder.layers.1.encoder_attn.{side}:out"] == [0]
    # Token ids (integers in HF) become float32; they are what each step was fed.
    for s in range(steps):
        ids = got[("model.decoder.embed_tokens:in", s)]["array"]
        assert ids.dtype == np.float32 and ids.tolist() == res["step_tokens"][s]
    # The positional lookup's `in` is the keyword its rule names (`position_ids`), the positions
    # each step reads, not its first input (the token ids): the checkpoint of the same hook.
    positions = {c["step"]: c["array"] for c in res["checkpoints"] if c["name"] == "audio.decoder.position_ids"}
    for s in range(steps):
        pos = got[("model.decoder.embed_positions:in", s)]["array"]
        assert np.array_equal(pos, positions[s]) and pos.tolist() != got[("model.decoder.embed_tokens:in", s)]["array"].tolist()
    # The logits point is the contract's logits checkpoint.
    logits = {c["step"]: c["array"] for c in res["checkpoints"] if c["name"] == "audio.decoder.logits"}
    assert all(np.array_equal(got[("proj_out:out", s)]["array"], logits[s]) for s in range(steps))
    # Each self-attention's cache after the call, head-major [heads, past+tokens, head_dim]: the
    # rows of the step before, then this step's keys / values (the projection split into heads).
    heads = json.loads((RAND_A / "config.json").read_text())["decoder_attention_heads"]
    for side, proj in (("keys", "k_proj"), ("values", "v_proj")):
        name = f"model.decoder.layers.1.self_attn:{side}"
        for s in range(steps):
            cache = got[(name, s)]
            new = got[(f"model.decoder.layers.1.self_attn.{proj}:out", s)]["array"]
            t, d = new.shape
            assert cache["layout"] == "head_major" and cache["array"].shape[1] == len(res["step_tokens"][0]) + s
            np.testing.assert_array_equal(cache["array"][:, -t:], new.reshape(t, heads, d // heads).transpose(1, 0, 2))
            if s:
                np.testing.assert_array_equal(cache["array"][:, :-t], got[(name, s - 1)]["array"])


def test_explicit_list_is_exactly_those_points():
    want = ["model.encoder.layers.1.fc2:in", "proj_out:out"]
    res = run(ops=want, max_new_tokens=3)
    assert [(p["name"], p["step"]) for p in res["op_points"]] == [
        ("model.encoder.layers.1.fc2:in", 0), ("proj_out:out", 0), ("proj_out:out", 1), ("proj_out:out", 2)]
    np.testing.assert_array_equal(points(res)[("model.encoder.layers.1.fc2:in", 0)]["array"],
                                  points(run(ops="all"))[("model.encoder.layers.1.fc2:in", 0)]["array"])


def test_selection_errors_name_the_point_before_generate_runs():
    run()  # the model is loaded and cached
    from xray_oracle import whisper

    (_, _, model), = [v for k, v in whisper._loaded.items() if k[0] == str(RAND_A.resolve()) and k[2] == "float32"]
    calls = []
    h = model.model.encoder.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        with pytest.raises(OracleInputError, match=r"model\.encoder\.layers\.7\.fc1:out: .*no module 'model\.encoder\.layers\.7\.fc1'"):
            run_whisper(str(RAND_A), str(AUDIO / "fox.wav"), resolved_contract(RAND_A), ops=["model.encoder.layers.7.fc1:out"])
        with pytest.raises(OracleInputError, match=r"'proj_out:mid': not '\{module\}:in'"):
            run_whisper(str(RAND_A), str(AUDIO / "fox.wav"), resolved_contract(RAND_A), ops=["proj_out:mid"])
        assert calls == []
    finally:
        h.remove()
    # A module HF calls with keyword arguments only has no `in`.
    with pytest.raises(CaptureError, match=r"model\.decoder:in: model\.decoder was called with no positional input"):
        run_whisper(str(RAND_A), str(AUDIO / "fox.wav"), resolved_contract(RAND_A), ops=["model.decoder:in"],
                    max_new_tokens=1)
    for bad in ("everything", 3, ["fc1"], [":out"], [None]):
        with pytest.raises(OracleInputError):
            parse_ops(bad)
    assert parse_ops([]) is None and parse_ops(["a:in", "a:in"]) == ["a:in"]


class Twice(torch.nn.Module):
    """A real module graph with a layer used twice, one never used, and a conv."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv1d(3, 4, 3, padding=1)
        self.norm = torch.nn.BatchNorm1d(4)
        self.lin = torch.nn.Linear(5, 5)
        self.unused = torch.nn.Linear(5, 5)
        self.emb = torch.nn.Embedding(10, 5)

    def forward(self, x, ids, twice=False):
        h = self.norm(self.conv(x)).transpose(1, 2)  # [1, T, 4]
        e = self.emb(ids)  # ids without a batch axis: [T] -> [T, 5]
        y = self.lin(torch.cat([h, h[..., :1]], -1) + e)
        return self.lin(y) if twice else y


def _rules(*rules) -> Contract:
    return Contract(family="toy", hf_class=None, dims={"five": 5}, repeats={},
                    points=[PointRule(m, list(sides), layout, list(tr)) for m, sides, layout, tr in rules])


TOY = _rules(
    ("conv", ("in", "out"), "channel_major", ["squeeze_batch"]),
    ("norm", ("in", "out"), "channel_major", ["squeeze_batch"]),
    ("emb", ("in", "out"), "plain", []),  # ids without a batch axis: [T] -> [T, 5]
    ("lin", ("in", "out"), "token_major", ["squeeze_batch", {"crop": {"axis": 0, "to": "frames"}}]),
)


def test_recorder_rules_on_a_small_module():
    m = Twice().eval()
    x, ids = torch.randn(1, 3, 6), torch.arange(6) % 10
    with OpRecorder(m, "all", TOY, symbols=lambda: {"frames": 4}) as rec:
        m(x, ids)
    got = {p["name"]: p for p in rec.points()}
    assert "unused:in" not in got and len(got) == 8  # conv, norm, lin, emb; unused never ran
    assert got["conv:in"]["layout"] == "channel_major" and got["conv:in"]["array"].shape == (3, 6)
    assert got["norm:out"]["layout"] == "channel_major"
    # The declared crop keeps the first `frames` rows: [1, 6, 5] -> [4, 5].
    assert got["lin:out"]["layout"] == "token_major" and got["lin:out"]["array"].shape == (4, 5)
    assert got["emb:in"]["array"].dtype == np.float32 and got["emb:in"]["array"].tolist() == list(range(6))
    assert got["emb:out"]["array"].shape == (6, 5)  # the rule declares no batch axis: kept whole
    with pytest.raises(CaptureError, match=r"op-level point\(s\) \['unused:out'\] never fired"):
        with OpRecorder(m, ["lin:out", "unused:out"], TOY) as rec:
            m(x, ids)
        rec.points()
    with pytest.raises(CaptureError, match=r"lin:in: lin ran twice at step 0"):
        with OpRecorder(m, ["lin:in"], TOY):
            m(x, ids, twice=True)
    steps = iter(range(10))
    with OpRecorder(m, ["lin:in"], TOY, step=lambda: next(steps), symbols=lambda: {"frames": 6}) as rec:
        m(x, ids, twice=True)
    assert [(p["name"], p["step"]) for p in rec.points()] == [("lin:in", 0), ("lin:in", 1)]
    assert not m.lin._forward_hooks and not m.lin._forward_pre_hooks  # removed


def test_points_without_a_rule_or_that_a_rule_does_not_fit_are_refused():
    m = Twice().eval()
    x, ids = torch.randn(1, 3, 6), torch.arange(6) % 10
    partial = _rules(("conv", ("in", "out"), "channel_major", ["squeeze_batch"]))
    with OpRecorder(m, ["conv:out", "lin:out"], partial) as rec:
        m(x, ids)
    with pytest.raises(ContractError, match=r"op-level point 'lin:out': no rule of the contract's 'points'"):
        rec.points()
    # A batch axis the rule does not declare is not dropped by guess: emb's [T] is refused.
    bad = _rules(("emb", ("out",), "token_major", ["squeeze_batch"]))
    with OpRecorder(m, ["emb:out"], bad) as rec:
        m(x, ids)
    with pytest.raises(CaptureError, match=r"emb:out@step0 .*squeeze_batch needs a leading batch axis of 1"):
        rec.points()
    # A crop longer than the tensor, or to a symbol the run did not bind.
    for symbols, msg in (({"frames": 7}, r"crop axis 0 to frames = 7"), ({}, r"crop to 'frames', which this run did not bind")):
        with OpRecorder(m, ["lin:out"], TOY, symbols=lambda s=symbols: s) as rec:
            m(x, ids)
        with pytest.raises(CaptureError, match=msg):
            rec.points()


def test_rule_globs_match_segments():
    r = PointRule("encoder.layers.*.attn.to_q", ["in", "out"], "token_major", [])
    assert r.matches("encoder.layers.3.attn.to_q:in") and r.matches("encoder.layers.10.attn.to_q:out")
    assert not r.matches("encoder.layers.3.x.attn.to_q:in") and not r.matches("encoder.layers.3.attn.to_qq:in")
    assert not r.matches("encoder.layers.3.attn.to_q")
    r = PointRule("projector.qformer.**", ["out"], "token_major", [])
    assert r.matches("projector.qformer.layers.0.mlp.fc1:out") and not r.matches("projector.qformer.layers.0.mlp.fc1:in")
    assert not r.matches("projector.qformer:out")
    assert PointRule("**", ["in"], "plain", []).matches("proj_out:in")


def test_dump_cli_ops_loads_in_the_rust_harness(tmp_path):
    from xray_oracle.__main__ import main
    from xray_oracle.dump import read_dump

    contract = tmp_path / "contract.json"
    contract.write_text(resolved_contract(RAND_A))
    base = ["dump", "--model", str(RAND_A), "--audio", str(AUDIO / "fox.wav"), "--contract", str(contract),
            "--max-new-tokens", "2"]
    assert main(base + ["--out", str(tmp_path / "plain")]) == 0
    assert main(base + ["--out", str(tmp_path / "ops"), "--ops"]) == 0
    assert main(base + ["--out", str(tmp_path / "few"), "--ops-only", "proj_out:in,model.encoder.conv2:out"]) == 0
    assert main(base + ["--out", str(tmp_path / "bad"), "--ops-only", "proj_out:sideways"]) == 2
    plain, ops, few = (read_dump(tmp_path / n) for n in ("plain", "ops", "few"))
    n = len(plain.checkpoints)
    # The contract's checkpoints first, unchanged; then the points.
    assert [e["sha256"] for e in ops.manifest["checkpoints"][:n]] == [e["sha256"] for e in plain.manifest["checkpoints"]]
    assert all(":" in c.name for c in ops.checkpoints[n:]) and len(ops.checkpoints) > 2 * n
    assert (tmp_path / "ops" / "model.encoder.layers.0.fc2:out@step0.npy").is_file()
    assert [(c.name, c.step) for c in few.checkpoints[n:]] == [
        ("model.encoder.conv2:out", 0), ("proj_out:in", 0), ("proj_out:in", 1)]
    built = [p for p in XRAY_BINS if p.is_file()]
    exe = max(built, key=lambda p: p.stat().st_mtime)
    r = subprocess.run([str(exe), "compare", str(tmp_path / "ops"), str(tmp_path / "ops"), "--model", str(RAND_A)],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and "verdict pass" in r.stderr, r.stderr
