"""Reference replay (xray_oracle.replay): a module replayed on the reference's own input gives
back its output, each counterfactual changes the output the way it says (checked against the
arithmetic redone here), the kind comes from the class, and the refusals are one line."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import RAND_A, REPO, require_fixture, resolved_contract

from xray_oracle import replay as rp
from xray_oracle.contract import load_resolved
from xray_oracle.errors import OracleInputError
from xray_oracle.ops import OpRecorder

GRANITE = REPO / "fixtures" / "build" / "granite-nar-tiny"

_points: dict = {}
FRAMES = 43


def whisper_points() -> dict:
    """Every op-level point of one encoder + decoder-prefill pass of whisper-rand-a on seeded
    features (the recorder of the real oracle, not the contract run)."""
    if "w" not in _points:
        require_fixture(RAND_A)
        m = rp.load_model("whisper", str(RAND_A))
        g = torch.Generator().manual_seed(0)
        feats = torch.randn(1, m.config.num_mel_bins, 2 * m.config.max_source_positions, generator=g)
        ids = torch.tensor([[m.config.decoder_start_token_id, 5, 7]])
        rec = OpRecorder(m, "all", load_resolved(resolved_contract(RAND_A), "whisper"))
        with rec, torch.no_grad():
            m(input_features=feats, decoder_input_ids=ids)
        _points["w"] = {p["name"]: p for p in rec.points()}
    return _points["w"]


def granite_points() -> dict:
    if "g" not in _points:
        require_fixture(GRANITE)
        m = rp.load_model("granite_nar", str(GRANITE))
        g = torch.Generator().manual_seed(0)
        # 43 frames: no whole number of the conformer's context blocks (10) or projector windows (15),
        # so the reference pads both.
        feats = torch.randn(1, FRAMES, m.config.encoder.input_dim, generator=g)
        contract = load_resolved(resolved_contract(GRANITE), "granite_nar")
        rec = OpRecorder(m, "all", contract, symbols=lambda: {"enc_frames": int(feats.shape[1])})
        with rec, torch.no_grad():
            m(feats)
        _points["g"] = {p["name"]: p for p in rec.points()}
    return _points["g"]


def replay_w(module: str, cf=None, **kw):
    pts = whisper_points()
    p = pts[f"{module}:in"]
    return rp.replay("whisper", str(RAND_A), module, p["array"], p["layout"], json.dumps(cf or {}),
                     contract=resolved_contract(RAND_A), **kw)


def replay_g(module: str, array, layout: str, cf=None, **kw):
    kw.setdefault("contract", resolved_contract(GRANITE))
    return rp.replay("granite_nar", str(GRANITE), module, array, layout, json.dumps(cf or {}), **kw)


def test_every_module_replays_its_own_output_exactly():
    pts = whisper_points()
    # Every module with an input and an output (a self-attention's cache points are no module's
    # input or output).
    modules = sorted({n.rsplit(":", 1)[0] for n in pts if n.endswith((":in", ":out"))})
    assert len(modules) > 30
    for mod in modules:
        out = pts[f"{mod}:out"]
        c = resolved_contract(RAND_A)
        if mod.endswith("embed_positions") or mod.endswith("embed_tokens"):
            r = rp.replay("whisper", str(RAND_A), mod, out["array"], out["layout"], ids_from_rows=True, contract=c)
        else:
            inp = pts[f"{mod}:in"]
            r = rp.replay("whisper", str(RAND_A), mod, inp["array"], inp["layout"], contract=c)
        assert r["layout"] == out["layout"], mod
        assert r["output"].shape == out["array"].shape, mod
        assert np.abs(r["output"] - out["array"]).max() <= 1e-6, mod


def test_granite_modules_replay_their_own_output():
    pts = granite_points()
    checked = set()
    for name in pts:
        mod, side = name.rsplit(":", 1)
        if side != "out" or f"{mod}:in" not in pts:
            continue
        m = rp.load_model("granite_nar", str(GRANITE)).get_submodule(mod)
        kind = rp.module_kind(m)
        if kind == "embedding":
            continue  # the relative-position table: its ids are distances
        inp = pts[f"{mod}:in"]
        r = replay_g(mod, inp["array"], inp["layout"])
        assert r["layout"] == pts[name]["layout"], mod
        assert r["output"].shape == pts[name]["array"].shape, mod
        assert np.abs(r["output"] - pts[name]["array"]).max() <= 1e-6, mod
        checked.add(kind)
    # Conformer linears and convs, its LayerNorms and BatchNorm, the LM's RMSNorms.
    assert {"linear", "conv1d", "layer_norm", "batch_norm", "rms_norm"} <= checked, checked


def test_kind_class_params_and_same_shape_keys():
    r = replay_w("model.encoder.layers.0.self_attn.q_proj")
    info = r["info"]
    assert info["class"] == "Linear" and info["kind"] == "linear"
    w = next(p for p in info["params"] if p["role"] == "weight")
    assert w["key"] == "model.encoder.layers.0.self_attn.q_proj.weight"
    # Other layers' same-role module first, then the siblings of the same layer.
    assert w["same_shape"][0] == "model.encoder.layers.1.self_attn.q_proj.weight"
    assert "model.encoder.layers.0.self_attn.k_proj.weight" in w["same_shape"]
    ln = replay_w("model.encoder.layers.0.self_attn_layer_norm")["info"]
    assert ln["kind"] == "layer_norm" and ln["settings"]["eps"] == 1e-5
    conv = replay_w("model.encoder.conv2")["info"]
    assert conv["kind"] == "conv1d" and conv["settings"]["stride"] == [2] and conv["settings"]["padding"] == [1]
    g = rp.load_model("granite_nar", str(require_fixture(GRANITE)))
    norm = g.get_submodule("language_model.model.norm")
    assert rp.module_kind(norm) == "rms_norm"


def test_linear_counterfactuals_do_what_they_say():
    mod = "model.encoder.layers.0.self_attn.q_proj"
    m = rp.load_model("whisper", str(RAND_A)).get_submodule(mod)
    x = torch.from_numpy(whisper_points()[f"{mod}:in"]["array"])
    w, b = m.weight.detach(), m.bias.detach()

    def check(cf, want):
        got = replay_w(mod, cf)["output"]
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
        assert np.abs(got - replay_w(mod)["output"]).max() > 1e-4, cf

    check({"kind": "transpose_weight"}, x @ w + b)
    check({"kind": "bias_missing"}, x @ w.T)
    check({"kind": "bias_doubled"}, x @ w.T + 2 * b)
    check({"kind": "weight_missing"}, b.expand(x.shape[0], -1))
    h = w.shape[0] // 2
    check({"kind": "halves_swapped"}, x @ torch.cat([w[h:], w[:h]]).T + torch.cat([b[h:], b[:h]]))
    sd = rp.load_model("whisper", str(RAND_A)).state_dict()
    other = "model.encoder.layers.1.self_attn.q_proj.weight"
    check({"kind": "other_key", "role": "weight", "key": other}, x @ sd[other].T + b)
    check({"kind": "weight_rounded", "format": "bf16"}, x @ w.to(torch.bfloat16).float().T + b)
    s = w.abs().amax(dim=1, keepdim=True) / 127
    check({"kind": "weight_grid", "bits": 8, "granularity": "per_row"}, x @ (torch.round(w / s) * s).T + b)
    check({"kind": "output_scale", "factor": 0.5}, 0.5 * (x @ w.T + b))
    fc1 = "model.encoder.layers.0.fc1"
    f = rp.load_model("whisper", str(RAND_A)).get_submodule(fc1)
    x1 = torch.from_numpy(whisper_points()[f"{fc1}:in"]["array"])
    o, i = f.weight.shape
    want = x1 @ f.weight.detach().reshape(i, o) + f.bias.detach()
    np.testing.assert_allclose(replay_w(fc1, {"kind": "weight_reinterpreted"})["output"], want.numpy(), rtol=1e-5, atol=1e-5)


def test_norm_counterfactuals_do_what_they_say():
    mod = "model.encoder.layers.0.final_layer_norm"
    m = rp.load_model("whisper", str(RAND_A)).get_submodule(mod)
    x = torch.from_numpy(whisper_points()[f"{mod}:in"]["array"]).double()
    w, b = m.weight.detach().double(), m.bias.detach().double()
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)

    def ln(v, eps, ww, bb):
        return ((x - mean) / torch.sqrt(v + eps) * ww + bb).float().numpy()

    for cf, want in [
        ({"kind": "eps", "value": 0.1}, ln(var, 0.1, w, b)),
        ({"kind": "unbiased_variance"}, ln(x.var(-1, keepdim=True, unbiased=True), 1e-5, w, b)),
        ({"kind": "not_centered"}, (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w + b).float().numpy()),
        ({"kind": "affine_swapped"}, ln(var, 1e-5, b, w)),
        ({"kind": "affine_missing"}, ln(var, 1e-5, 1.0, 0.0)),
        ({"kind": "norm_weight_missing"}, ln(var, 1e-5, 1.0, b)),
        ({"kind": "norm_bias_missing"}, ln(var, 1e-5, w, 0.0)),
    ]:
        np.testing.assert_allclose(replay_w(mod, cf)["output"], want, rtol=1e-4, atol=1e-5, err_msg=str(cf))
    # The module itself is untouched afterwards.
    assert m.eps == 1e-5
    inp = whisper_points()[f"{mod}:in"]
    assert np.abs(replay_w(mod)["output"] - whisper_points()[f"{mod}:out"]["array"]).max() <= 1e-6
    assert inp["layout"] == "token_major"


def test_rms_and_batch_norm_counterfactuals():
    pts = granite_points()
    g = rp.load_model("granite_nar", str(GRANITE))
    rms = next(n.rsplit(":", 1)[0] for n in pts if n.endswith("input_layernorm:in"))
    m = g.get_submodule(rms)
    x = torch.from_numpy(pts[f"{rms}:in"]["array"])
    r = lambda cf: replay_g(rms, x.numpy(), "token_major", cf)["output"]  # noqa: E731
    norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon)
    np.testing.assert_allclose(r({"kind": "weight_plus_one"}), ((1 + m.weight.detach()) * norm).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r({"kind": "affine_missing"}), norm.numpy(), rtol=1e-5, atol=1e-6)
    e = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 0.5)
    np.testing.assert_allclose(r({"kind": "eps", "value": 0.5}), (m.weight.detach() * e).numpy(), rtol=1e-5, atol=1e-6)
    bn = next(n.rsplit(":", 1)[0] for n in pts if n.endswith("batch_norm:in"))
    b = g.get_submodule(bn)
    xb = pts[f"{bn}:in"]
    assert xb["layout"] == "channel_major"
    got = replay_g(bn, xb["array"], "channel_major", {"kind": "batch_statistics"})["output"]
    t = torch.from_numpy(xb["array"])
    want = (t - t.mean(1, keepdim=True)) / torch.sqrt(t.var(1, keepdim=True, unbiased=False) + b.eps)
    want = want * b.weight.detach()[:, None] + b.bias.detach()[:, None]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
    mean, var, wb = b.running_mean.detach()[:, None], b.running_var.detach()[:, None], (b.weight.detach()[:, None], b.bias.detach()[:, None])
    for cf, m_, v_ in [({"kind": "running_var_power", "value": 0.5}, mean, var.sqrt()),
                       ({"kind": "running_var_power", "value": 2.0}, mean, var * var),
                       ({"kind": "running_mean_missing"}, 0 * mean, var)]:
        got = replay_g(bn, xb["array"], "channel_major", cf)["output"]
        want = (t - m_) / torch.sqrt(v_ + b.eps) * wb[0] + wb[1]
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5, err_msg=str(cf))
    # The contract declares the point channel-major: a token-major tensor is refused, naming it,
    # never transposed on a guess.
    with pytest.raises(OracleInputError, match=rf"{bn}:in arrives token_major; .* declares it channel_major"):
        replay_g(bn, xb["array"].T.copy(), "token_major")


def test_conv_counterfactuals_do_what_they_say():
    import torch.nn.functional as F

    mod = "model.encoder.conv1"
    m = rp.load_model("whisper", str(RAND_A)).get_submodule(mod)
    x = torch.from_numpy(whisper_points()[f"{mod}:in"]["array"])[None]
    w, b = m.weight.detach(), m.bias.detach()
    for cf, want in [
        ({"kind": "padding", "left": 2, "right": 0}, F.conv1d(F.pad(x, (2, 0)), w, b)),
        ({"kind": "stride", "value": 2}, F.conv1d(x, w, b, stride=2, padding=1)),
        ({"kind": "kernel_flipped"}, F.conv1d(x, w.flip(-1), b, padding=1)),
        ({"kind": "input_rounded", "format": "f16"}, F.conv1d(x.half().float(), w, b, padding=1)),
        ({"kind": "bias_missing"}, F.conv1d(x, w, None, padding=1)),
    ]:
        np.testing.assert_allclose(replay_w(mod, cf)["output"], want[0].numpy(), rtol=1e-5, atol=1e-5, err_msg=str(cf))
    assert m.padding == (1,) and m.stride == (1,)


def test_embedding_ids_from_rows_and_offset():
    pts = whisper_points()
    mod = "model.decoder.embed_tokens"
    out = pts[f"{mod}:out"]
    ids = pts[f"{mod}:in"]["array"]
    table = rp.load_model("whisper", str(RAND_A)).get_submodule(mod).weight.detach().numpy()
    c = resolved_contract(RAND_A)
    a = rp.replay("whisper", str(RAND_A), mod, out["array"], out["layout"], ids_from_rows=True, contract=c)
    b = rp.replay("whisper", str(RAND_A), mod, ids, "plain", contract=c)
    assert np.array_equal(a["output"], out["array"]) and np.array_equal(b["output"], out["array"])
    assert a["points"] == {"inputs": [f"{mod}:out"], "output": f"{mod}:out"}
    assert b["points"] == {"inputs": [f"{mod}:in"], "output": f"{mod}:out"}
    sh = rp.replay("whisper", str(RAND_A), mod, ids, "plain", '{"kind": "id_offset", "by": 1}', contract=c)["output"]
    assert np.array_equal(sh, table[ids.astype(int) + 1])


def test_many_counterfactuals_in_one_call_and_refusals():
    mod = "model.encoder.layers.0.self_attn.k_proj"  # no bias
    r = replay_w(mod, counterfactuals=[{"kind": "bias_missing"}, {"kind": "transpose_weight"}, {"kind": "eps", "value": 1}])
    assert isinstance(r["outputs"][0], str) and "needs a bias" in r["outputs"][0]
    assert isinstance(r["outputs"][1], np.ndarray)
    assert "does not apply" in r["outputs"][2]
    with pytest.raises(OracleInputError, match="has no module"):
        rp.replay("whisper", str(RAND_A), "model.encoder.layers.9.fc1", np.zeros((2, 64), np.float32), "token_major",
                  contract=resolved_contract(RAND_A))
    with pytest.raises(OracleInputError, match="not a key"):
        replay_w(mod, {"kind": "other_key", "role": "weight", "key": "nope.weight"})


def _core(family, model_dir, pts, parent, cf=None):
    o = "o_proj" if f"{parent}.o_proj:in" in pts else "out_proj"
    q, k, v = (pts[f"{parent}.{p}:out"]["array"] for p in ("q_proj", "k_proj", "v_proj"))
    r = rp.replay(family, str(model_dir), parent, q, "token_major", json.dumps(cf or {}),
                  extra={"key": (k, "token_major"), "value": (v, "token_major")}, contract=resolved_contract(model_dir))
    assert r["points"] == {"inputs": [f"{parent}.{p}:out" for p in ("q_proj", "k_proj", "v_proj")],
                           "output": f"{parent}.{o}:in"}
    assert r["layout"] == pts[f"{parent}.{o}:in"]["layout"]
    return r, pts[f"{parent}.{o}:in"]["array"]


def test_attention_cores_replay_their_own_output():
    pts = whisper_points()
    for parent in ("model.encoder.layers.0.self_attn", "model.decoder.layers.0.self_attn",
                   "model.decoder.layers.1.encoder_attn"):
        r, want = _core("whisper", RAND_A, pts, parent)
        assert r["info"]["kind"] == "attention", parent
        assert np.abs(r["output"] - want).max() <= 1e-6, parent
    dec = _core("whisper", RAND_A, pts, "model.decoder.layers.0.self_attn")[0]["info"]["settings"]
    enc = _core("whisper", RAND_A, pts, "model.encoder.layers.0.self_attn")[0]["info"]["settings"]
    assert dec["causal"] and not enc["causal"] and enc["scaling"] == 0.25
    g = granite_points()
    parent = next(n.rsplit(".", 1)[0] for n in g if n.endswith("self_attn.q_proj:out"))
    r, want = _core("granite_nar", GRANITE, g, parent)
    assert r["info"]["settings"]["rope"] and not r["info"]["settings"]["causal"]
    assert np.abs(r["output"] - want).max() <= 1e-6


def test_attention_counterfactuals_change_the_output():
    pts = whisper_points()
    parent = "model.encoder.layers.0.self_attn"
    clean, _ = _core("whisper", RAND_A, pts, parent)
    q, k, v = (torch.from_numpy(pts[f"{parent}.{p}:out"]["array"]) for p in ("q_proj", "k_proj", "v_proj"))
    h, hd = 4, q.shape[1] // 4
    heads = lambda t: t.reshape(t.shape[0], h, hd).transpose(0, 1)  # noqa: E731

    def attn(qq, kk, vv, scale, causal):
        s = heads(qq) @ heads(kk).transpose(1, 2) * scale
        if causal:
            s = s.masked_fill(torch.ones_like(s[0], dtype=torch.bool).triu(1), float("-inf"))
        return (s.softmax(-1) @ heads(vv)).transpose(0, 1).reshape(qq.shape[0], -1).numpy()

    for cf, want in [
        ({"kind": "attention_scale", "value": 1.0}, attn(q, k, v, 1.0, False)),
        ({"kind": "causal_mask", "on": True}, attn(q, k, v, 0.25, True)),
        ({"kind": "kv_swapped"}, attn(q, v, k, 0.25, False)),
        ({"kind": "keys_padded", "rows": 5},
         attn(q, torch.cat([k, torch.zeros(5, k.shape[1])]), torch.cat([v, torch.zeros(5, v.shape[1])]), 0.25, False)),
    ]:
        got = _core("whisper", RAND_A, pts, parent, cf)[0]["output"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=str(cf))
        assert np.abs(got - clean["output"]).max() > 1e-4, cf
    g = granite_points()
    gp = next(n.rsplit(".", 1)[0] for n in g if n.endswith("self_attn.q_proj:out"))
    base = _core("granite_nar", GRANITE, g, gp)[0]["output"]
    shifted = _core("granite_nar", GRANITE, g, gp, {"kind": "rope_offset", "by": 1})[0]["output"]
    assert np.abs(shifted - base).max() > 1e-5


def _shaw(parent: str, cf=None) -> tuple[dict, np.ndarray]:
    """The conformer attention core of `parent` replayed from the reference's own to_q:out and
    to_kv:out (keys and values: its halves, as the contract's attention rule declares), and the
    reference's to_out:in."""
    g = granite_points()
    q, kv = g[f"{parent}.to_q:out"], g[f"{parent}.to_kv:out"]
    r = rp.replay("granite_nar", str(GRANITE), parent, q["array"], q["layout"], json.dumps(cf or {}),
                  extra={"key": (kv["array"], kv["layout"]), "value": (kv["array"], kv["layout"])},
                  contract=resolved_contract(GRANITE))
    assert r["points"] == {"inputs": [f"{parent}.to_q:out", f"{parent}.to_kv:out", f"{parent}.to_kv:out"],
                           "output": f"{parent}.to_out:in"}
    return r, g[f"{parent}.to_out:in"]["array"]


def test_the_conformer_attention_core_replays_by_its_declared_points():
    # 43 frames: the core pads the last of its 10-frame blocks, as HF does.
    for parent in ("encoder.layers.0.attn", "encoder.layers.1.attn"):
        r, want = _shaw(parent)
        assert r["info"]["kind"] == "attention" and r["info"]["settings"]["relative"], r["info"]
        assert r["output"].shape == want.shape == (FRAMES, want.shape[1])
        assert np.abs(r["output"] - want).max() <= 1e-6, parent
    parent = "encoder.layers.0.attn"
    clean = _shaw(parent)[0]["output"]
    # Mirrored distances are the table stored reversed (the clamp is symmetric): the clean
    # core of a model whose rel_pos_emb is reversed, computed by HF's own forward.
    m = rp.load_model("granite_nar", str(GRANITE))
    table = m.get_submodule(f"{parent}.rel_pos_emb").weight
    own = table.detach().clone()
    try:
        with torch.no_grad():
            table.copy_(own.flip(0))
        reversed_table = _shaw(parent)[0]["output"]
    finally:
        with torch.no_grad():
            table.copy_(own)
    mirrored = _shaw(parent, {"kind": "distance_mirrored"})[0]["output"]
    assert np.abs(mirrored - reversed_table).max() <= 1e-6
    assert np.abs(mirrored - clean).max() > 1e-3
    # Keys and values swapped: the halves of to_kv:out the other way round.
    g = granite_points()
    kv = g[f"{parent}.to_kv:out"]["array"]
    half = kv.shape[1] // 2
    swapped = np.ascontiguousarray(np.concatenate([kv[:, half:], kv[:, :half]], axis=1))
    q = g[f"{parent}.to_q:out"]
    by_input = rp.replay("granite_nar", str(GRANITE), parent, q["array"], q["layout"],
                         extra={"key": (swapped, "token_major"), "value": (swapped, "token_major")},
                         contract=resolved_contract(GRANITE))["output"]
    np.testing.assert_allclose(_shaw(parent, {"kind": "kv_swapped"})[0]["output"], by_input, rtol=0, atol=1e-6)
    dropped = _shaw(parent, {"kind": "relative_positions_dropped"})[0]["output"]
    assert np.abs(dropped - clean).max() > 1e-3
    # The positional scores at the module's own scale are the clean core; at 0, no positions.
    own = _shaw(parent)[0]["info"]["settings"]["scaling"]
    np.testing.assert_array_equal(_shaw(parent, {"kind": "relative_scale", "value": own})[0]["output"], clean)
    np.testing.assert_array_equal(_shaw(parent, {"kind": "relative_scale", "value": 0.0})[0]["output"], dropped)
    with pytest.raises(rp.ReplayError, match="causal_mask.*does not apply to a Shaw attention core"):
        _shaw(parent, {"kind": "causal_mask", "on": True})


def test_an_attention_module_no_rule_declares_is_not_a_core():
    # The rules gone: Whisper's attention is a module of kind `other` (replayed whole, never
    # from q / k / v by a guess at its sub-modules' names).
    d = json.loads(resolved_contract(RAND_A))
    d["attention"] = []
    mod = "model.encoder.layers.0.self_attn"
    # What the module takes: its layer's self_attn_layer_norm output.
    p = whisper_points()["model.encoder.layers.0.self_attn_layer_norm:out"]
    r = rp.replay("whisper", str(RAND_A), mod, p["array"], p["layout"], contract=d)
    assert r["info"]["kind"] == "other" and r["points"] == {"inputs": [f"{mod}:in"], "output": f"{mod}:out"}
    assert rp.module_kind(rp.load_model("whisper", str(RAND_A)).get_submodule(mod)) == "other"


def _contract_with(model_dir, points) -> dict:
    """The model's resolved contract with its point rules replaced by `points` (a function of
    the resolved rules)."""
    d = json.loads(resolved_contract(model_dir))
    d["points"] = points(d["points"])
    return d


def test_a_point_no_rule_declares_is_refused_naming_it():
    mod = "model.encoder.layers.0.fc1"
    p = whisper_points()[f"{mod}:in"]
    run = lambda c: rp.replay("whisper", str(RAND_A), mod, p["array"], p["layout"], contract=c)  # noqa: E731
    # Without the catch-all rule nothing declares a linear's points: its input is named.
    bare = _contract_with(RAND_A, lambda rules: [r for r in rules if r["module"] != "**"])
    with pytest.raises(OracleInputError, match=rf"op-level point '{mod}:in': no rule of the contract's 'points'"):
        run(bare)
    # Only its input declared: its output is named.
    only_in = _contract_with(RAND_A, lambda rules: [
        {"module": mod, "sides": ["in"], "layout": "token_major", "transform": ["squeeze_batch"]}])
    with pytest.raises(OracleInputError, match=rf"op-level point '{mod}:out': no rule"):
        run(only_in)
    # An attention core whose keys' point is undeclared (declared, the same contract replays it).
    parent = "model.encoder.layers.0.self_attn"
    pts = whisper_points()

    def attention_rules(k_sides):
        rule = lambda m, sides: {"module": f"{parent}.{m}", "sides": sides, "layout": "token_major",  # noqa: E731
                                 "transform": ["squeeze_batch"]}
        return _contract_with(RAND_A, lambda _: [rule("q_proj", ["out"]), rule("k_proj", k_sides),
                                                 rule("v_proj", ["out"]), rule("out_proj", ["in"])])

    q, k, v = (pts[f"{parent}.{x}:out"]["array"] for x in ("q_proj", "k_proj", "v_proj"))
    extra = {"key": (k, "token_major"), "value": (v, "token_major")}
    core = lambda c: rp.replay("whisper", str(RAND_A), parent, q, "token_major", extra=extra, contract=c)  # noqa: E731
    assert np.abs(core(attention_rules(["out"]))["output"] - pts[f"{parent}.out_proj:in"]["array"]).max() <= 1e-6
    with pytest.raises(OracleInputError, match=rf"op-level point '{parent}.k_proj:out': no rule"):
        core(attention_rules(["in"]))
    # Every replay needs the contract: no default, no guess.
    with pytest.raises(OracleInputError, match="no resolved contract"):
        rp.replay("whisper", str(RAND_A), mod, p["array"], p["layout"])
    with pytest.raises(OracleInputError, match="is for family 'whisper', not 'granite_nar'"):
        rp.replay("granite_nar", str(require_fixture(GRANITE)), mod, p["array"], p["layout"],
                  contract=resolved_contract(RAND_A))


def _seen(module_path: str, model_dir, family: str, fn):
    """What `fn()` makes module `module_path` of the cached reference receive: the shape of its
    first positional input."""
    m = rp.load_model(family, str(model_dir)).get_submodule(module_path)
    seen = []
    h = m.register_forward_pre_hook(lambda _m, args: seen.append(tuple(args[0].shape)))
    try:
        out = fn()
    finally:
        h.remove()
    return seen, out


def _hf_input_shape(module_path: str) -> tuple:
    """The shape the granite reference's own forward pass feeds `module_path` (before any rule)."""
    m = rp.load_model("granite_nar", str(GRANITE))
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(1, FRAMES, m.config.encoder.input_dim, generator=g)
    with torch.no_grad():
        seen, _ = _seen(module_path, GRANITE, "granite_nar", lambda: m(feats))
    return seen[0]


def test_granite_inputs_are_brought_to_the_module_by_their_declared_rules():
    pts = granite_points()
    # A conformer attention projection: the reference pads its input to whole context blocks; the
    # engine's point is the frames. Replayed on the frames (batch axis re-added), cropped back.
    to_q = "encoder.layers.0.attn.to_q"
    assert _hf_input_shape(to_q) == (1, 50, 64), "the reference pads 43 frames to 5 blocks of 10"
    inp, out = pts[f"{to_q}:in"], pts[f"{to_q}:out"]
    assert inp["array"].shape == (FRAMES, 64)
    seen, r = _seen(to_q, GRANITE, "granite_nar", lambda: replay_g(to_q, inp["array"], inp["layout"]))
    assert seen == [(1, FRAMES, 64)]
    assert r["output"].shape == out["array"].shape and np.abs(r["output"] - out["array"]).max() <= 1e-6
    # Q-Former points: windows restored by each rule's per_window, the keys' from the encoder
    # states' windows (proj_block = 15 rows), the queries' n_query = 3.
    for mod, rows in [("projector.qformer.layers.0.cross_attention.k_proj", 15),
                      ("projector.qformer.layers.1.cross_attention.q_proj", 3),
                      ("projector.qformer.layers.0.mlp.fc1", 3)]:
        hf = _hf_input_shape(mod)
        assert hf == (3, rows, 48), (mod, hf)
        inp, out = pts[f"{mod}:in"], pts[f"{mod}:out"]
        assert inp["array"].shape == (3 * rows, 48), mod
        seen, r = _seen(mod, GRANITE, "granite_nar", lambda mod=mod, inp=inp: replay_g(mod, inp["array"], inp["layout"]))
        assert seen == [hf], mod
        assert r["output"].shape == out["array"].shape and np.abs(r["output"] - out["array"]).max() <= 1e-6, mod
    # The declaration, not the tensor, decides: read with the queries' rule the keys' 45 rows are
    # windows of 3 (not what the module saw), and the queries' 9 rows are no windows of 15.
    k_proj = "projector.qformer.layers.0.cross_attention.k_proj"
    as_queries = _contract_with(GRANITE, lambda rules: [r for r in rules if not r["module"].endswith(".k_proj")])
    seen, _ = _seen(k_proj, GRANITE, "granite_nar",
                    lambda: replay_g(k_proj, pts[f"{k_proj}:in"]["array"], "token_major", contract=as_queries))
    assert seen == [(15, 3, 48)]
    q_proj = "projector.qformer.layers.0.cross_attention.q_proj"
    as_keys = _contract_with(GRANITE, lambda rules: [
        {**r, "transform": [{"flatten_windows": {"per_window": "proj_block"}}]} if r["module"] == "projector.qformer.**"
        else r for r in rules])
    with pytest.raises(OracleInputError, match=rf"op-level point {q_proj}:in .*flatten_windows expects "
                                               r"\[windows \* proj_block = 15, d\], got shape \[9, 48\]"):
        replay_g(q_proj, pts[f"{q_proj}:in"]["array"], "token_major", contract=as_keys)
    # A crop is undone only for a module that maps the cropped entries one by one.
    conv = "encoder.layers.0.conv.depth_conv.conv"
    padded_conv = _contract_with(GRANITE, lambda rules: [
        {**r, "transform": ["squeeze_batch", {"crop": {"axis": 1, "to": "enc_frames"}}]}
        if r["module"] == "encoder.layers.*.conv.depth_conv.conv" else r for r in rules])
    with pytest.raises(OracleInputError, match=rf"op-level point {conv}:in: the reference pads it "
                                               r"\(crop\(axis 1 to enc_frames\)\) and a conv1d mixes"):
        replay_g(conv, pts[f"{conv}:in"]["array"], "channel_major", contract=padded_conv)


def test_a_whole_encoder_is_replayed_by_its_declared_boundaries():
    """`model.encoder` (a WhisperEncoder, no parameters of its own, never hooked): its boundary
    points are declared `same_as` conv1's input and the final norm's output, so replaying it on
    conv1's input gives back layer_norm's output exactly; its kind is `other` and no
    counterfactual of another kind applies."""
    pts = whisper_points()
    x = pts["model.encoder.conv1:in"]
    r = rp.replay("whisper", str(RAND_A), "model.encoder", x["array"], x["layout"], "{}",
                  contract=resolved_contract(RAND_A), counterfactuals=[{"kind": "bias_missing"}])
    assert r["info"]["class"] == "WhisperEncoder" and r["info"]["kind"] == "other"
    assert r["points"] == {"inputs": ["model.encoder:in"], "output": "model.encoder:out"}
    assert r["layout"] == "token_major"
    np.testing.assert_array_equal(r["output"], pts["model.encoder.layer_norm:out"]["array"])
    assert isinstance(r["outputs"][0], str) and "does not apply" in r["outputs"][0]


def test_converter_bf16_roundings_match_the_rust_ones():
    """`bf16_truncated` drops the low 16 bits, `bf16_ties_away` rounds half away from zero (the
    bit patterns of xray-core's RoundFormat::round test); NaN and infinities are kept."""
    bits = np.array([0x3F80C000, 0xBF80C000, 0x3F808000, 0xBF808000], dtype=np.uint32)
    t = torch.from_numpy(bits.view(np.float32).copy())
    out = lambda fmt: rp._round(t, fmt).numpy().view(np.uint32).tolist()  # noqa: E731
    assert out("bf16_truncated") == [0x3F800000, 0xBF800000, 0x3F800000, 0xBF800000]
    assert out("bf16_ties_away") == [0x3F810000, 0xBF810000, 0x3F810000, 0xBF810000]
    assert out("bf16") == [0x3F810000, 0xBF810000, 0x3F800000, 0xBF800000]
    special = torch.tensor([float("nan"), float("inf"), -float("inf")])
    r = rp._round(special, "bf16_ties_away")
    assert torch.isnan(r[0]) and r[1] == float("inf") and r[2] == -float("inf")
