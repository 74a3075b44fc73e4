"""xray_oracle.recorder, the one reference recorder of every family, on a small torch model: each
hook kind, element selection, casting, one call per step, the step (`StepBy` or one pass),
stats-only summaries and the shape check. The contract's vocabulary comes from a contract resolved
by xray-core (`xray contract`), never typed here."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import RAND_A, resolved_contract

from xray_oracle.contract import load_resolved
from xray_oracle.errors import CaptureError, ContractError, OracleInputError
from xray_oracle.recorder import Recorder, StepBy, check_shapes, select


class Attn(torch.nn.Module):
    def forward(self, x):
        return x * 2, x.softmax(-1), None


class Out(torch.nn.Module):
    def forward(self, x):
        class Output(dict):
            last_hidden_state = x + 1

        return Output()


class Dec(torch.nn.Module):
    """One decode step: ids [1, T] -> embedding -> attention (a tuple) -> linear (a tensor)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.attn = Attn()
        self.lin = torch.nn.Linear(4, 4)
        self.out = Out()

    def forward(self, input_ids, twice=False):
        y, _, _ = self.attn(self.emb(input_ids))
        y = self.lin(self.lin(y) if twice else y)
        self.out(y)
        return y


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.front = torch.nn.Linear(4, 4)
        self.dec = Dec()

    def forward(self, x, steps, twice=False):
        self.front(x)
        for k in range(steps):
            self.dec(input_ids=torch.tensor([[1, 2, 3]]) if k == 0 else torch.tensor([[k]]), twice=twice)


def _ck(order, name, steps, shape, module, hook="forward", index=0, kwarg=None, transform=("squeeze_batch",),
        layout="token_major"):
    ref = {"module": module, "hook": hook, "index": index, "transform": list(transform)}
    if kwarg is not None:
        ref["kwarg"] = kwarg
    return {"name": name, "template": name, "steps": steps, "shape": shape, "layout": layout, "kind": None,
            "reference": ref, "layer": None, "order": order, "producer": "p", "inputs": []}


def toy_contract(*edits, symbols=None):
    """A resolved contract for Toy, with the vocabulary xray-core ships."""
    cks = [
        _ck(0, "front.out", "once", ["frames", 4], "front"),
        _ck(1, "ids", "every", ["tokens"], "dec.emb", hook="pre", layout="plain"),
        _ck(2, "ids_kw", "every", ["tokens"], "dec", hook="pre", kwarg="input_ids", layout="plain"),
        _ck(3, "probs", "every", ["tokens", 4], "dec.attn", index=1),
        _ck(4, "lin.out", "every", ["tokens", 4], "dec.lin"),
        _ck(5, "hidden", "every", ["tokens", 4], "dec.out"),
    ]
    data = {"schema": "xray.contract.resolved/v1", "family": "toy", "hf_class": None, "dims": {"d": 4},
            "repeats": {}, "symbols": symbols if symbols is not None else {"frames": "free"}, "checkpoints": cks,
            "points": [], "vocabulary": json.loads(resolved_contract(RAND_A))["vocabulary"]}
    for edit in edits:
        edit(data)
    return load_resolved(data)


def known(s):
    return {"tokens": 3 if s == 0 else 1}


def record(contract, steps=2, only=None, twice=False, summarize=None, step=True, dtype=torch.float32):
    m = Toy().eval().to(dtype)
    rec = Recorder(m, contract, select(contract, only), step_by=StepBy("dec") if step else None, summarize=summarize)
    with torch.inference_mode(), rec:
        m(torch.randn(1, 5, 4, dtype=dtype), steps, twice=twice)
    return m, rec


def test_every_hook_kind_and_element_at_each_step():
    c = toy_contract()
    calls = []
    m = Toy().eval()
    rec = Recorder(m, c, c.checkpoints, step_by=StepBy("dec", lambda a, k: calls.append(k["input_ids"].shape[1])))
    with torch.inference_mode(), rec:
        m(torch.randn(1, 5, 4), 3)
    assert rec.steps == 3 and calls == [3, 1, 1]
    out = rec.collect(known)
    assert [(e["name"], e["step"]) for e in out][:7] == [
        ("front.out", 0), ("ids", 0), ("ids_kw", 0), ("probs", 0), ("lin.out", 0), ("hidden", 0), ("ids", 1)]
    got = {(e["name"], e["step"]): e for e in out}
    assert len(got) == 1 + 5 * 3
    # Ids arrive as float32 (the run's dtype), from a positional input and from a keyword argument.
    for name in ("ids", "ids_kw"):
        assert got[(name, 0)]["array"].dtype == np.float32 and got[(name, 0)]["array"].tolist() == [1, 2, 3]
        assert got[(name, 2)]["array"].tolist() == [2] and got[(name, 2)]["layout"] == "plain"
    assert np.allclose(got[("probs", 1)]["array"].sum(-1), 1.0)  # index 1 of the tuple
    assert got[("front.out", 0)]["array"].shape == (5, 4)
    h, lin = got[("hidden", 1)]["array"], got[("lin.out", 1)]["array"]
    assert np.array_equal(h, lin + 1)  # the ModelOutput's last_hidden_state
    assert not m.dec._forward_pre_hooks and not m.dec.lin._forward_hooks  # removed on exit


def test_one_pass_float64_and_stats_only():
    c = toy_contract()
    _, rec = record(c, steps=1, step=False, dtype=torch.float64)
    out = rec.collect(lambda s: {"tokens": 3})
    assert rec.steps == 1 and {e["step"] for e in out} == {0}
    assert all(e["array"].dtype == np.float64 for e in out)  # ids too: the run's dtype
    seen = []
    _, rec = record(c, only=["lin.out", "front.out"], summarize=lambda a: seen.append(a.shape) or len(seen))
    out = rec.collect(known)
    assert [(e["name"], e["step"], e["shape"], e["summary"]) for e in out] == [
        ("front.out", 0, [5, 4], 1), ("lin.out", 0, [3, 4], 2), ("lin.out", 1, [1, 4], 3)]
    assert all("array" not in e for e in out)
    with pytest.raises(CaptureError, match=r"checkpoint lin.out: stats-only capture summarizes float32, got float64"):
        record(c, only=["lin.out"], summarize=len, dtype=torch.float64)


def test_refusals_name_the_checkpoint():
    def ref(name, **kw):
        return lambda d: next(x for x in d["checkpoints"] if x["name"] == name)["reference"].update(**kw)

    with pytest.raises(CaptureError, match=r"checkpoint lin.out: dec.lin ran twice at step 0; the contract expects one call"):
        record(toy_contract(), only=["lin.out"], twice=True)
    with pytest.raises(ContractError, match=r"checkpoint lin.out: contract reference module 'dec.nope' does not exist in Toy"):
        record(toy_contract(ref("lin.out", module="dec.nope")))
    with pytest.raises(ContractError, match=r"the step's module 'nope' does not exist"):
        Recorder(Toy(), toy_contract(), [], step_by=StepBy("nope")).install()
    with pytest.raises(CaptureError, match=r"checkpoint lin.out: dec.lin output is a single tensor, contract index is 1"):
        record(toy_contract(ref("lin.out", index=1)))
    with pytest.raises(CaptureError, match=r"checkpoint probs: dec.attn output has 3 elements, contract index is 5"):
        record(toy_contract(ref("probs", index=5)))
    with pytest.raises(CaptureError, match=r"checkpoint probs: dec.attn output\[2\] is None; HF returns attention"):
        record(toy_contract(ref("probs", index=2)))
    with pytest.raises(CaptureError, match=r"checkpoint hidden: dec.out output is a Output, not a tensor or tuple"):
        record(toy_contract(ref("hidden", index=1)))
    with pytest.raises(CaptureError, match=r"checkpoint ids_kw: dec was called without keyword argument 'ids'"):
        record(toy_contract(ref("ids_kw", kwarg="ids")))
    with pytest.raises(OracleInputError, match=r"unknown checkpoint name\(s\) \['nope'\]"):
        select(toy_contract(), ["nope"])
    # A hook kind core's vocabulary gains is read (the contract loads) but never installed by guess.
    grown = toy_contract(lambda d: d["vocabulary"]["hooks"].append("backward"), ref("lin.out", hook="backward"))
    with pytest.raises(ContractError, match=r"checkpoint lin.out: reference hook kind 'backward' on dec.lin is not one"):
        record(grown)


def test_collect_checks_steps_and_shapes():
    c = toy_contract()
    # A checkpoint the contract says exists at every step, captured at step 0 only.
    _, rec = record(toy_contract(lambda d: d["checkpoints"][0].update(steps="every")), steps=2)
    with pytest.raises(CaptureError, match=r"checkpoint front.out \(steps: every, hook forward on front\): "
                                           r"captured at steps \[0\] of 2; missing \[1\], unexpected \[\]"):
        rec.collect(known)
    # A step the family says has 2 tokens where HF gives 3.
    _, rec = record(c, only=["lin.out"])
    with pytest.raises(CaptureError, match=r"lin.out@step0: HF gives shape \[3, 4\], the contract says "
                                           r"\['tokens', 4\] = \[2, 4\] \(tokens = 2\)"):
        rec.collect(lambda s: {"tokens": 2})
    # A symbol the contract declares binds from the first checkpoint that has it, one value per step.
    both = toy_contract(lambda d: d["checkpoints"][4].update(shape=["frames", 4]))
    _, rec = record(both, only=["front.out", "lin.out"], steps=1)
    with pytest.raises(CaptureError, match=r"lin.out@step0: HF gives shape \[3, 4\], the contract says "
                                           r"\['frames', 4\] = \[5, 4\] \(frames = 5 from front.out\)"):
        rec.collect(known)
    # A symbol neither the contract declares nor the family binds.
    _, rec = record(toy_contract(symbols={}), only=["front.out"], steps=1)
    with pytest.raises(ContractError, match=r"checkpoint front.out: shape symbol 'frames' is neither a dim"):
        rec.collect(known)
    bound = check_shapes(c, c.checkpoints, {("front.out", 0): (5, 4), ("lin.out", 0): (3, 4), ("lin.out", 1): (1, 4)},
                         known)
    assert bound == {0: {"tokens": 3, "frames": 5}, 1: {"tokens": 1}}
