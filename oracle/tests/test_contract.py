"""xray_oracle.contract reads contracts resolved by xray-core (`xray contract`): it evaluates
nothing and refuses anything that is not a complete resolved contract."""
from __future__ import annotations

import json

import pytest
from conftest import RAND_B, REPO, TINY_EN, resolved_contract

from xray_oracle.contract import load_resolved
from xray_oracle.errors import ContractError


def test_tiny_en_resolved():
    c = load_resolved(resolved_contract(TINY_EN), "whisper")
    assert c.dims == {"mel_bins": 80, "mel_frames": 3000, "enc_tokens": 1500, "d_model": 384, "heads": 6,
                      "head_dim": 64, "vocab": 51864}
    assert c.hf_class == "WhisperForConditionalGeneration" and len(c.sha256) == 64
    names = [x.name for x in c.checkpoints]
    # once: mel, conv1, conv2, memory; 4 encoder layers; the fed ids and positions; 7 per decoder
    # layer; logits
    assert len(names) == 4 + 4 + 2 + 7 * 4 + 1
    assert names[8:10] == ["audio.decoder.input_ids", "audio.decoder.position_ids"]
    # Consecutive templates over the same repeat expand layer-major: layer 0's seven, then layer 1's.
    assert all(".layer.0." in n for n in names[10:17]) and all(".layer.1." in n for n in names[17:24])
    assert names[10] == "audio.decoder.layer.0.self_attention.probs" and names[-1] == "audio.decoder.logits"
    pos = c.by_name()["audio.decoder.position_ids"]
    assert pos.reference.module == "model.decoder.embed_positions" and pos.reference.kwarg == "position_ids"
    ck = c.by_name()["audio.decoder.layer.3.cross_attention.output"]
    assert ck.shape == [6, "tokens", 64] and ck.layout == "head_major" and ck.steps == "every"
    assert ck.template == "audio.decoder.layer.{layer}.cross_attention.output" and ck.layer == 3
    assert ck.reference.module == "model.decoder.layers.3.encoder_attn.out_proj" and ck.reference.hook == "pre"
    assert ck.reference.transform == ["squeeze_batch", "split_heads"]
    assert "audio.decoder.layer.3.cross_k@prefill" in ck.inputs


def test_rand_b_uses_decoder_heads():
    c = load_resolved(resolved_contract(RAND_B))
    assert c.dims["heads"] == 3 and c.dims["head_dim"] == 32  # encoder has 6 heads; the contract's are the decoder's
    assert c.repeats == {"encoder_layers": 3, "decoder_layers": 2}


def test_granite_nar_extensions_arrive_resolved():
    c = load_resolved(resolved_contract(REPO / "fixtures" / "build" / "granite-nar-tiny"), "granite_nar")
    assert c.symbols and c.lists["captures"]
    assert c.get("enc.cat_out").inputs[-1] == "enc.ctc_logits"
    assert c.get("dec.flat_embeds").reference.kwarg == "inputs_embeds"
    assert c.get("proj.qformer.out").reference.transform == [{"flatten_windows": {"per_window": "n_query"}}]


def test_anything_but_a_complete_resolved_contract_is_refused(tmp_path):
    good = json.loads(resolved_contract(TINY_EN))

    def refused(edit, match):
        data = json.loads(json.dumps(good))
        edit(data)
        with pytest.raises(ContractError, match=match):
            load_resolved(json.dumps(data))

    raw = (REPO / "core" / "contracts" / "whisper.json").read_text()
    with pytest.raises(ContractError, match=r"not resolved: make it with `xray contract --model DIR`"):
        load_resolved(raw)
    with pytest.raises(ContractError, match="not JSON"):
        load_resolved("{not json")
    with pytest.raises(ContractError, match="does not exist"):
        load_resolved(tmp_path / "absent.json")
    with pytest.raises(ContractError, match="for family 'whisper', not 'granite_nar'"):
        load_resolved(json.dumps(good), "granite_nar")
    refused(lambda d: d["checkpoints"][0].pop("reference"), "no 'reference'")
    refused(lambda d: d["checkpoints"][0]["reference"].update(hook="backward"), "hook 'backward'")
    refused(lambda d: d["checkpoints"][0]["reference"].update(transform=["transpose"]), "transform 'transpose'")
    refused(lambda d: d["checkpoints"][0].update(steps="sometimes"), "steps 'sometimes'")
    refused(lambda d: d["checkpoints"][0].update(shape=["d_model", 1.5]), "not a number or a symbol")
    refused(lambda d: d["checkpoints"][1].update(inputs=["audio.frontend.mel"]), "not \\[name, step reference\\]")
    refused(lambda d: d["checkpoints"].append(d["checkpoints"][0]), "duplicate")
    refused(lambda d: d["dims"].update(heads="6"), "'dims' is not a map of integers")


def test_the_vocabulary_is_read_from_the_resolved_contract():
    good = json.loads(resolved_contract(TINY_EN))
    c = load_resolved(good)
    v = good["vocabulary"]
    assert c.vocabulary.layouts == tuple(v["layouts"]) and "head_major" in c.vocabulary.layouts
    assert c.vocabulary.hooks == tuple(v["hooks"]) and c.vocabulary.sides == tuple(v["sides"])
    assert set(c.vocabulary.transforms) == {"squeeze_batch", "split_heads", "crop", "flatten_windows"}

    def edited(edit):
        data = json.loads(json.dumps(good))
        edit(data)
        return json.dumps(data)

    # A name core's vocabulary gains is accepted without a Python edit: nothing here types them.
    grown = edited(lambda d: (d["vocabulary"]["steps"].append("sometimes"), d["checkpoints"][0].update(steps="sometimes")))
    assert load_resolved(grown).checkpoints[0].steps == "sometimes"
    # ...and a name it drops is refused.
    for edit, match in (
        (lambda d: d.pop("vocabulary"), "no 'vocabulary'"),
        (lambda d: d["vocabulary"].pop("sides"), "vocabulary: no 'sides'"),
        (lambda d: d["vocabulary"].update(steps=[]), "'steps' \\[\\] is not a non-empty list of distinct names"),
        (lambda d: d["vocabulary"]["layouts"].remove("head_major"), "layout 'head_major' is not one of"),
        (lambda d: d["vocabulary"]["transforms"].remove("split_heads"), "unknown reference transform 'split_heads'"),
        (lambda d: d["vocabulary"]["transforms"].append("transpose"),
         "declares transform\\(s\\) \\['transpose'\\] that this oracle does not implement"),
    ):
        with pytest.raises(ContractError, match=match):
            load_resolved(edited(edit))
