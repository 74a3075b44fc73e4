"""xray_oracle.contract: the same expression rules as runtime/src/contract.rs."""
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
    assert len(names) == 4 + 4 + 6 * 4 + 1  # once: mel, conv1, conv2, memory; 4 encoder layers; 6 per decoder layer; logits
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
