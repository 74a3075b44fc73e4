"""xray_oracle.contract: the same expression rules as core/src/contract.rs."""
from __future__ import annotations

import json

import pytest
from conftest import CONTRACT, RAND_B, TINY_EN

from xray_oracle.contract import eval_expr, load_contract_text, resolve
from xray_oracle.errors import ContractError


def test_expressions():
    cfg = {"d_model": 384, "heads": 6, "n": {"layers": 4}}
    from xray_oracle.contract import _config_int

    v = lambda t: _config_int(cfg, t)  # noqa: E731
    assert eval_expr("d_model / heads", v) == 64
    assert eval_expr("2 * d_model", v) == 768
    assert eval_expr("n.layers / 2 - 1", v) == 1
    assert eval_expr("1 + 2 * 3 - 4", v) == 3
    with pytest.raises(ValueError, match="not divisible"):
        eval_expr("d_model / 5", v)
    with pytest.raises(ValueError, match="missing_key"):
        eval_expr("missing_key", v)
    with pytest.raises(ValueError, match="dangling"):
        eval_expr("d_model +", v)


def test_tiny_en_expansion():
    c = resolve(load_contract_text(CONTRACT.read_text()), json.loads((TINY_EN / "config.json").read_text()))
    assert c.dims == {"mel_bins": 80, "mel_frames": 3000, "enc_tokens": 1500, "d_model": 384, "heads": 6,
                      "head_dim": 64, "vocab": 51864}
    names = [x.name for x in c.checkpoints]
    assert len(names) == 4 + 4 + 7 * 4 + 1  # once: mel, conv1, conv2, memory; 4 encoder layers; 7 per decoder layer; logits
    # Consecutive templates over the same repeat expand layer-major: layer 0's seven, then layer 1's.
    assert all(".layer.0." in n for n in names[8:15]) and all(".layer.1." in n for n in names[15:22])
    assert names[8] == "audio.decoder.layer.0.self_attention.probs" and names[-1] == "audio.decoder.logits"
    assert [x.order for x in c.checkpoints] == list(range(len(names)))
    ck = c.by_name()["audio.decoder.layer.3.cross_attention.output"]
    assert ck.shape == [6, "tokens", 64] and ck.layout == "head_major" and ck.steps == "every"
    assert ck.reference.module == "model.decoder.layers.3.encoder_attn.out_proj" and ck.reference.hook == "pre"
    assert ck.reference.transform == ["squeeze_batch", "split_heads"]


def test_rand_b_uses_decoder_heads():
    c = resolve(load_contract_text(str(CONTRACT)), json.loads((RAND_B / "config.json").read_text()))
    assert c.dims["heads"] == 3 and c.dims["head_dim"] == 32  # encoder has 6 heads; the contract's are the decoder's
    assert c.repeats == {"encoder_layers": 3, "decoder_layers": 2}


def test_bad_geometry_and_bad_contracts_fail_closed():
    data = load_contract_text(CONTRACT.read_text())
    cfg = json.loads((TINY_EN / "config.json").read_text())
    with pytest.raises(ContractError, match=r"dim 'head_dim'.*not divisible"):
        resolve(data, dict(cfg, decoder_attention_heads=5))
    with pytest.raises(ContractError, match=r"dim 'mel_bins'.*num_mel_bins"):
        resolve(data, {k: v for k, v in cfg.items() if k != "num_mel_bins"})
    bad = json.loads(json.dumps(data))
    bad["checkpoints"][0]["reference"]["transform"] = ["transpose"]
    with pytest.raises(ContractError, match="unknown reference transform 'transpose'"):
        resolve(bad, cfg)
    with pytest.raises(ContractError, match="schema"):
        load_contract_text('{"schema": "other"}')
    with pytest.raises(ContractError, match="does not parse"):
        load_contract_text("{not json")


def test_one_resolver_for_granite_nar_extensions():
    """lists, range, inputs_at_first, symbols and reference.kwarg go through the same resolver."""
    from conftest import REPO

    data = load_contract_text(REPO / "core" / "contracts" / "granite_nar.json")
    cfg = json.loads((REPO / "fixtures" / "build" / "granite-nar-tiny" / "config.json").read_text())
    c = resolve(data, cfg)
    assert c.family == "granite_nar" and c.symbols and c.lists
    names = [x.name for x in c.checkpoints]
    assert len(names) == len(set(names))
    assert c.get("enc.cat_out").inputs[-1] == "enc.ctc_logits"
    assert c.get("dec.flat_embeds").reference.kwarg == "inputs_embeds"
    assert c.get("proj.qformer.out").reference.transform == ["flatten_windows"]
    bad = json.loads(json.dumps(data))
    bad["checkpoints"][-1]["inputs"] = ["enc.block.{each:nope}.out"]
    with pytest.raises(ContractError, match="unknown list 'nope'"):
        resolve(bad, cfg)
    bad = json.loads(json.dumps(data))
    first_repeated = next(x for x in bad["checkpoints"] if "inputs_at_first" in x)
    del first_repeated["inputs_at_first"]
    with pytest.raises(ContractError, match="declare inputs_at_first"):
        resolve(bad, cfg)
    bad = json.loads(json.dumps(data))
    bad["checkpoints"][0]["reference"]["kwarg"] = "x"
    bad["checkpoints"][0]["reference"]["hook"] = "forward"
    with pytest.raises(ContractError, match="kwarg needs hook 'pre'"):
        resolve(bad, cfg)


def test_expression_superset():
    v = {"a": 7, "b": 2}.get
    assert eval_expr("ceil_div(a, b)", v) == 4
    assert eval_expr("floor_div(a, b) * (b + 1)", v) == 9
    assert eval_expr("-b + max(a, 3)", v) == 5
    with pytest.raises(ValueError, match="unexpected end"):
        eval_expr("(a + b", v)
