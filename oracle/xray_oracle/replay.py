"""Reference replay: one HF module of the family's reference model re-run on tensors X-Ray hands it
(the engine's own input at that op, its `{module}:in` point), with the model's own parameters or a
named counterfactual (`xray_core::replay::Counterfactual`, passed as JSON: `{"kind": "eps",
"value": 1e-5}`).

What it answers: had the reference module been fed exactly what the engine's op was fed, what
would it have produced; and what would it have produced had it been wrong in this specific way
(its weight transposed, its bias dropped, another key of the weight table, a norm's epsilon, a
conv's padding). X-Ray compares those with the engine's own output (`xray_compare::mechanism`).

Rules:
- the model is loaded once per process, by the family's own loader (its module's `load_reference`:
  `from_pretrained(local_files_only=True)` / safetensors, never
  `trust_remote_code`, never a pickle), cached by model directory, weights sha256 and dtype;
- every tensor replay receives or returns is an op-level point, in the layout and form the
  family contract's `points` rules declare for it (`contract.Contract.point_rule`, the rules the
  recorder `xray_oracle.ops` brings the reference's points to the engine's form by): an input
  arrives in its rule's layout (another layout is refused, naming the point) and is brought back
  to the form the module takes by undoing its rule's transforms (`transforms.undo`, the one
  implementation: the batch axis re-added, a Q-Former's windows restored); the output is brought
  to the engine's form by its own point's rule (`transforms.apply`) and returned in its layout.
  A point no rule declares is an error naming it, never a guessed layout. Which points: a
  module's `{module}:in` and `{module}:out` (an embedding fed rows: its `:out` both ways); an
  attention core's queries, keys, values and output, the points (or chunks of points) the
  contract's `attention` rule for its module declares (`contract.AttentionRule`): a module no
  rule declares is never replayed as a core;
- a crop the input's rule declares (the reference padded that axis) is undone as the engine's
  entries only, so it is replayed only for a module that maps those entries one by one (a
  linear or a norm over the last axis); the crop's symbol is bound to the engine tensor's length
  there, and the output's rule crops to it;
- an embedding's ids are `ids` (token ids or positions, any float holding integers), or, with
  `ids_from_rows`, recovered from rows of the table (the reference's own output at the point:
  every row is looked up in the table exactly);
- the clean replay calls the module itself; a counterfactual replaces parameters through
  `torch.func.functional_call` (nothing in the model is mutated) or a scalar setting for the call
  (restored in `finally`), or recomputes the module's formula where no setting expresses it
  (unbiased variance, batch statistics, asymmetric padding);
- the kind comes from the module's class (`nn.Linear`, `nn.Conv1d`, `nn.LayerNorm`,
  `nn.BatchNorm1d`, `nn.Embedding` and their subclasses; an RMSNorm by `nn.RMSNorm` or a class
  named `*RMSNorm` with a weight and an epsilon), never from a fault's name; any other module
  (a whole `WhisperEncoder`, whose boundary points the contract declares `same_as` its first and
  last modules' points) is kind `other`: replayed clean only (its output element 0, as the
  recorder takes it), no counterfactual applies.
"""
from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any, Optional

import numpy as np

from . import transforms
from .errors import ContractError, OracleInputError

_models: dict[tuple, Any] = {}
_row_index: dict[tuple, dict] = {}

KINDS = ("linear", "conv1d", "layer_norm", "rms_norm", "batch_norm", "embedding", "attention", "other")
SAME_SHAPE_MAX = 12


class ReplayError(OracleInputError):
    """A replay the module cannot do (a counterfactual of another kind, a shape that does not fit):
    one line naming the module and the reason."""


def load_model(family: str, model_dir: str, dtype: str = "float32"):
    """The family's reference model (eval mode), loaded once per (directory, weights, dtype)."""
    from .modeldir import check_model_dir

    if dtype not in ("float32", "float64"):
        raise OracleInputError(f"dtype {dtype!r} is not 'float32' or 'float64'")
    check_model_dir(model_dir, family)
    import transformers

    # The console is X-Ray's: no load progress bar or warnings of transformers' own on it.
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    from .families import module

    key, load = module(family).load_reference(Path(model_dir), dtype)
    key = (family, *key)
    if key not in _models:
        _models[key] = load()
    if len(_models) > 2:
        _models.pop(next(iter(_models)))
    return _models[key]


def module_kind(module) -> str:
    """The module's kind from its class (see the module docstring)."""
    from torch import nn

    if isinstance(module, nn.Linear):
        return "linear"
    if isinstance(module, nn.Conv1d):
        return "conv1d"
    if isinstance(module, nn.LayerNorm):
        return "layer_norm"
    if isinstance(module, nn.BatchNorm1d):
        return "batch_norm"
    if isinstance(module, nn.Embedding):
        return "embedding"
    rms = getattr(nn, "RMSNorm", None)
    if rms is not None and isinstance(module, rms):
        return "rms_norm"
    if type(module).__name__.endswith("RMSNorm") and hasattr(module, "weight") and _eps_attr(module):
        return "rms_norm"
    return "other"


def _attention_setup(model, path: str, module) -> dict:
    """What the attention core of `module` (a module the contract's `attention` rules declare)
    does: its softmax scale, whether it is causal, whether it applies rotary positions (and the
    model's rotary table) or Shaw relative positions (and the encoder's distance table), its head
    size, and its attention function (the module file's own `eager_attention_forward`)."""
    import sys

    cls = type(module).__name__
    if cls == "GraniteSpeechConformerAttention":
        # The core pads the engine's rows to whole context blocks itself: HF pads the normed
        # input before to_q / to_kv, which have no bias, so the padded rows are zeros there.
        if module.to_q.bias is not None or module.to_kv.bias is not None:
            raise ReplayError(f"replay {path}: a {cls} with biased to_q / to_kv: its padded rows are not zeros")
        return {"scaling": float(module.scale), "causal": False, "rope": None, "shaw": _distances(model, path),
                "head_dim": int(module.dim_head), "pads": True}
    fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if fn is None:
        raise ReplayError(f"replay {path}: {cls}'s module has no eager_attention_forward")
    if cls == "WhisperAttention":
        cross = ".encoder_attn" in f".{path}" or path.endswith("encoder_attn")
        return {"scaling": float(module.scaling), "causal": bool(module.is_causal) and not cross, "rope": None,
                "shaw": None, "head_dim": int(module.head_dim), "pads": False, "prescale": True, "fn": fn}
    if cls == "GraniteAttention":
        rope = model.get_submodule("language_model.model.rotary_emb")
        return {"scaling": float(module.scaling), "causal": bool(module.is_causal), "rope": rope,
                "shaw": None, "head_dim": int(module.head_dim), "pads": False, "prescale": False, "fn": fn}
    raise ReplayError(f"replay {path}: the attention core of a {cls} is not implemented (Whisper's, the Granite "
                      "LM's and Granite's conformer attention are)")


def _distances(model, path: str):
    """The Shaw distance table (`attention_dists`, ids into `rel_pos_emb`) of the conformer
    encoder holding attention module `path`: the nearest enclosing module's buffer."""
    parts = path.split(".")
    for n in range(len(parts) - 1, -1, -1):
        d = getattr(model.get_submodule(".".join(parts[:n])), "attention_dists", None)
        if d is not None:
            return d
    raise ReplayError(f"replay {path}: no enclosing module holds the conformer's attention_dists")


def _shaw_call(module, setup: dict, q, k, v, kind: str, cf: dict):
    """GraniteSpeechConformerAttention.forward's core, from `to_q` and `to_kv`'s outputs
    (`[1, T, inner]`, the engine's T rows) to `to_out`'s input: block-local attention over
    `context_size` frames with Shaw relative positions, HF's own operations in its order."""
    import math

    import torch
    import torch.nn.functional as F

    scale, dists = setup["scaling"], setup["shaw"]
    pos_scale = scale
    if kind == "kv_swapped":
        k, v = v, k
    elif kind == "attention_scale":
        scale = float(cf["value"])
    elif kind == "distance_mirrored":
        dists = dists.transpose(0, 1)
    elif kind == "relative_scale":
        pos_scale = float(cf["value"])
    elif kind not in ("none", "output_scale", "relative_positions_dropped"):
        raise ReplayError(f"counterfactual {kind!r} does not apply to a Shaw attention core")
    c, t = int(module.context_size), q.shape[1]
    blocks, remainder = math.ceil(t / c), t % c
    q, k, v = (F.pad(x, (0, 0, 0, blocks * c - t)) for x in (q, k, v))
    qs, ks, vs = (x.reshape(blocks, c, module.num_heads, -1).transpose(1, 2) for x in (q, k, v))
    rel = module.rel_pos_emb(dists)
    pos = torch.einsum("b h c d, c r d -> b h c r", qs, rel) * pos_scale
    if kind == "relative_positions_dropped":
        pos = torch.zeros_like(pos)
    if remainder > 0:
        mask = torch.ones(c, c, dtype=bool)
        mask[:remainder, :remainder] = 0
        pos[blocks - 1: pos.shape[0]: blocks].masked_fill_(mask, -torch.finfo(pos.dtype).max)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=pos, scale=scale)
    out = out.transpose(1, 2).reshape(1, blocks * c, -1)[:, :t]
    return out * float(cf["factor"]) if kind == "output_scale" else out


def _attention_call(path: str, module, setup: dict, q, k, v, cf: dict):
    """The weightless core of an attention module from its projections' outputs (`[1, T, D]`
    each, as the module computes them) to its output projection's input (`[1, T, D]`), under
    counterfactual `cf`, with its `setup` ([`_attention_setup`])."""
    import torch

    kind = cf.get("kind", "none")
    if not (q.dim() == k.dim() == v.dim() == 3 and q.shape[0] == k.shape[0] == v.shape[0] == 1):
        raise ReplayError(f"replay {path}: the attention core takes [1, T, D] projections, got "
                          f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    if setup["shaw"] is not None:
        try:
            return _shaw_call(module, setup, q, k, v, kind, cf)
        except ReplayError as e:
            raise ReplayError(f"replay {path}: {e}") from None
    scale, causal = setup["scaling"], setup["causal"]
    if kind == "kv_swapped":
        k, v = v, k
    elif kind == "keys_padded":
        # Zero keys and values appended, no mask hiding them (a K/V buffer padded to a block
        # size and attended whole: ggml's flash attention over GGML_PAD(n, 256) rows).
        if causal:
            raise ReplayError(f"replay {path}: keys_padded is tried on a non-causal attention only")
        rows = int(cf["rows"])
        k = torch.cat([k, k.new_zeros(k.shape[0], rows, k.shape[2])], dim=1)
        v = torch.cat([v, v.new_zeros(v.shape[0], rows, v.shape[2])], dim=1)
    elif kind == "attention_scale":
        scale = float(cf["value"])
    elif kind == "causal_mask":
        causal = bool(cf["on"])
    elif kind == "rope_offset":
        if setup["rope"] is None:
            raise ReplayError(f"replay {path}: no rotary positions to shift")
    elif kind == "output_scale":
        pass
    elif kind != "none":
        raise ReplayError(f"replay {path}: counterfactual {kind!r} does not apply to an attention core")
    hd = setup["head_dim"]
    tq, tk = q.shape[1], k.shape[1]
    qs = q.reshape(1, tq, -1, hd).transpose(1, 2)
    ks = k.reshape(1, tk, -1, hd).transpose(1, 2)
    vs = v.reshape(1, tk, -1, hd).transpose(1, 2)
    if setup["rope"] is not None:
        from transformers.models.granite.modeling_granite import apply_rotary_pos_emb

        # Keys at 0..tk, queries at the last tq of them; a rope_offset shifts the queries
        # against the keys (shifting both would change nothing: RoPE sees only the difference).
        kpos = torch.arange(tk)[None]
        qpos = kpos[:, tk - tq:] + (int(cf["by"]) if kind == "rope_offset" else 0)
        cos_k, sin_k = setup["rope"](vs, position_ids=kpos)
        cos_q, sin_q = setup["rope"](vs, position_ids=qpos)
        qs, _ = apply_rotary_pos_emb(qs, qs, cos_q, sin_q)
        _, ks = apply_rotary_pos_emb(ks, ks, cos_k, sin_k)
    mask = None
    if causal:
        i = torch.arange(tq)[:, None] + (tk - tq)
        j = torch.arange(tk)[None, :]
        mask = torch.zeros(tq, tk, dtype=qs.dtype).masked_fill(j > i, torch.finfo(qs.dtype).min)[None, None]
    if setup["prescale"]:
        qs, scale = qs * scale, 1.0
    out, _ = setup["fn"](module, qs.contiguous(), ks.contiguous(), vs.contiguous(), mask, scaling=scale, dropout=0.0)
    out = out.reshape(1, tq, -1)
    if kind == "output_scale":
        out = out * float(cf["factor"])
    return out


def _eps_attr(module) -> Optional[str]:
    for a in ("eps", "variance_epsilon", "epsilon"):
        if isinstance(getattr(module, a, None), (int, float)):
            return a
    return None


def _norm_key(key: str) -> str:
    return re.sub(r"\.\d+\.", ".#.", key)


def _same_shape(model, key: str, shape, limit: int = SAME_SHAPE_MAX) -> list[str]:
    """Other state-dict keys of this shape: the same role in other layers first (the key with its
    layer indices blanked is the same), then the same parameter name in the same parent (a sibling
    projection), then any other."""
    sd = model.state_dict()
    role = key.rsplit(".", 1)[-1]
    parent = key.rsplit(".", 2)[0] if key.count(".") >= 2 else ""
    same = [k for k, v in sd.items() if k != key and tuple(v.shape) == tuple(shape)]
    # Tied weights are one tensor under two keys: they read the same values.
    own = sd[key] if key in sd else None
    if own is not None:
        same = [k for k in same if sd[k].data_ptr() != own.data_ptr()]

    def rank(k: str) -> tuple:
        if _norm_key(k) == _norm_key(key):
            return (0, k)
        if k.rsplit(".", 1)[-1] == role and parent and k.startswith(parent + "."):
            return (1, k)
        if k.rsplit(".", 1)[-1] == role:
            return (2, k)
        return (3, k)

    return sorted(same, key=rank)[:limit]


def module_info(model, path: str, module, kind: Optional[str] = None) -> dict:
    """`xray_core::replay::ModuleInfo` as a dict; `kind` when the contract says (an attention
    core), otherwise [`module_kind`]."""
    kind = kind or module_kind(module)
    params = []
    for role, p in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
        if p is None or not p.is_floating_point():
            continue
        key = f"{path}.{role}" if path else role
        params.append({"role": role, "key": key, "shape": list(p.shape),
                       "same_shape": _same_shape(model, key, p.shape) if role in ("weight", "bias") else []})
    settings: dict[str, Any] = {}
    eps = _eps_attr(module)
    if eps is not None:
        settings["eps"] = float(getattr(module, eps))
    for a in ("stride", "padding", "kernel_size", "dilation", "groups"):
        v = getattr(module, a, None)
        if isinstance(v, (tuple, list)) and all(isinstance(x, int) for x in v):
            settings[a] = list(v)
        elif isinstance(v, int):
            settings[a] = v
    if kind in ("linear", "conv1d", "layer_norm", "batch_norm"):
        settings["has_bias"] = getattr(module, "bias", None) is not None
    if kind == "embedding":
        settings["num_embeddings"] = int(module.weight.shape[0])
    if kind == "attention":
        try:
            setup = _attention_setup(model, path, module)
            settings.update(scaling=setup["scaling"], causal=setup["causal"], rope=setup["rope"] is not None,
                            relative=setup["shaw"] is not None, head_dim=setup["head_dim"])
        except ReplayError:
            pass
    return {"module": path, "class": type(module).__name__, "kind": kind, "params": params, "settings": settings}


# Kinds that map every entry along all but the last axis independently: replaying one on the
# entries the engine holds of a cropped (reference-padded) axis gives what it computed for them.
_ROW_WISE = ("linear", "layer_norm", "rms_norm")

_contracts: dict[str, Any] = {}


def _contract(family: str, contract):
    """The resolved contract (`contract.Contract`, or its JSON text / dict / path), loaded once per
    text and checked to be `family`'s."""
    from .contract import Contract, load_resolved
    from .errors import ContractError

    if isinstance(contract, Contract):
        if contract.family != family:
            raise ReplayError(f"replay: the resolved contract is for family {contract.family!r}, not {family!r}")
        return contract
    if contract is None:
        raise ReplayError("replay: no resolved contract (its op-level point rules declare every tensor's layout)")
    key = contract if isinstance(contract, str) else json.dumps(contract, sort_keys=True, default=str)
    if key not in _contracts:
        if len(_contracts) > 4:
            _contracts.pop(next(iter(_contracts)))
        try:
            _contracts[key] = load_resolved(contract, family)
        except ContractError as e:
            raise ReplayError(f"replay: {e}") from None
    return _contracts[key]


def _rule(contract, point: str):
    from .errors import ContractError

    try:
        return contract.point_rule(point)
    except ContractError as e:
        raise ReplayError(f"replay: {e}") from None


def _to_module(contract, point: str, array, layout: str, symbols: dict, kind: str, pads: bool = False) -> np.ndarray:
    """Engine point `point` (in `layout`) in the form the reference module takes it: its rule's
    layout required, its transforms undone. `pads`: the module pads a cropped axis back itself
    (an attention core whose padded rows are zeros)."""
    from .errors import CaptureError, ContractError

    rule = _rule(contract, point)
    if layout != rule.layout:
        raise ReplayError(f"replay: op-level point {point} arrives {layout}; the contract's points rule "
                          f"{rule.module!r} declares it {rule.layout}")
    crops = [t for t in rule.transform if isinstance(t, dict) and "crop" in t]
    if crops and kind not in _ROW_WISE and not pads:
        raise ReplayError(f"replay: op-level point {point}: the reference pads it ({transforms.describe(crops[0])}) "
                          f"and a {kind} mixes entries along it; its padded input is not the engine's")
    where = f"replay: op-level point {point} (rule {rule.module!r})"
    try:
        return transforms.undo(np.asarray(array), rule.transform, where, contract.dims, symbols)
    except (CaptureError, ContractError) as e:
        raise ReplayError(str(e)) from None


def _to_engine(contract, point: str, array: np.ndarray, symbols: dict) -> tuple[np.ndarray, str]:
    """The module's output (as it computed it) in engine point `point`'s form, and its layout."""
    from .errors import CaptureError, ContractError

    rule = _rule(contract, point)
    where = f"replay: op-level point {point} (rule {rule.module!r})"
    try:
        return transforms.apply(array, rule.transform, where, contract.dims, symbols), rule.layout
    except (CaptureError, ContractError) as e:
        raise ReplayError(str(e)) from None


def _tensor(module, a: np.ndarray):
    import torch

    p = next(module.parameters(), None)
    dt = p.dtype if p is not None else torch.float32
    return torch.from_numpy(np.ascontiguousarray(a)).to(dt)


def _ids(module, path: str, array: np.ndarray, from_rows: bool):
    """An embedding's ids: the given integers, or each row looked up in the table."""
    import torch

    w = module.weight.detach()
    if from_rows:
        key = (id(module), w.data_ptr(), tuple(w.shape))
        if key not in _row_index:
            table = np.ascontiguousarray(w.to(torch.float32).cpu().numpy())
            index: dict = {}
            for i in range(table.shape[0] - 1, -1, -1):  # the first of equal rows wins
                index[table[i].tobytes()] = i
            _row_index.clear()
            _row_index[key] = index
        index = _row_index[key]
        rows = np.ascontiguousarray(np.asarray(array, dtype=np.float32).reshape(-1, w.shape[1]))
        ids = [index.get(r.tobytes(), -1) for r in rows]
        missing = [i for i, v in enumerate(ids) if v < 0]
        if missing:
            raise ReplayError(f"replay {path}: {len(missing)} of {len(ids)} rows (first {missing[0]}) are no row of "
                              f"its table {list(w.shape)}")
        return torch.tensor(ids, dtype=torch.long).reshape(np.asarray(array).shape[:-1])
    a = np.asarray(array, dtype=np.float64)
    if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
        raise ReplayError(f"replay {path}: the embedding's input holds values that are not integer ids")
    return torch.from_numpy(a.astype(np.int64))


def _round(t, fmt: str):
    import torch

    if fmt == "f16":
        return t.to(torch.float16).to(t.dtype)
    if fmt == "bf16":
        return t.to(torch.bfloat16).to(t.dtype)
    if fmt in ("bf16_truncated", "bf16_ties_away"):
        # A converter's bfloat16 on the f32 bits (xray-core's RoundFormat::round): the low 16
        # bits dropped, or rounded half away from zero first; NaN and infinities kept.
        a = t.detach().to(torch.float32).cpu().numpy()
        bits = np.ascontiguousarray(a).view(np.uint32).astype(np.uint64)
        if fmt == "bf16_ties_away":
            bits = bits + 0x8000
        r = (bits & 0xFFFF0000).astype(np.uint32).view(np.float32)
        r = np.where(np.isfinite(a), r, a)
        return torch.from_numpy(r).to(t.dtype).to(t.device)
    raise ReplayError(f"unknown rounding format {fmt!r}")


def _grid(w, bits: int, granularity: str):
    import torch

    if not 2 <= int(bits) <= 16:
        raise ReplayError(f"grid bits {bits} outside 2..16")
    q = 2 ** (int(bits) - 1) - 1
    flat = w.reshape(w.shape[0], -1) if granularity == "per_row" else w.reshape(1, -1)
    s = flat.abs().amax(dim=1, keepdim=True) / q
    s = torch.where(s > 0, s, torch.ones_like(s))
    return (torch.round(flat / s) * s).reshape(w.shape)


@contextlib.contextmanager
def _setting(module, **attrs):
    old = {k: getattr(module, k) for k in attrs}
    try:
        for k, v in attrs.items():
            setattr(module, k, v)
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)


def _need(cond: bool, path: str, kind: str, cf: dict, why: str):
    if not cond:
        raise ReplayError(f"replay {path} ({kind}): counterfactual {cf.get('kind')!r} {why}")


def _call(model, path: str, module, kind: str, x, cf: dict):
    """The module's output on `x` (batched) under counterfactual `cf`."""
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call

    k = cf.get("kind", "none")
    w = getattr(module, "weight", None)
    b = getattr(module, "bias", None)
    weighted = kind in ("linear", "conv1d")

    def with_params(**params):
        return functional_call(module, params, (x,))

    if k == "none":
        return module(x)
    if k == "output_scale":
        return module(x) * float(cf["factor"])
    if k == "input_rounded":
        return module(_round(x, cf["format"]))
    if k == "other_key":
        role, key = cf["role"], cf["key"]
        sd = model.state_dict()
        _need(key in sd, path, kind, cf, f"names {key!r}, which is not a key of the model's weight table")
        own = dict(module.named_parameters(recurse=False)) | dict(module.named_buffers(recurse=False))
        _need(role in own and own[role] is not None, path, kind, cf, f"names the parameter {role!r}, which it lacks")
        _need(tuple(sd[key].shape) == tuple(own[role].shape), path, kind, cf,
              f"reads {key} {list(sd[key].shape)} for {role} {list(own[role].shape)}")
        return with_params(**{role: sd[key]})
    if k == "other_module":
        # Every parameter and buffer from another module of the same structure (another layer's).
        other, sd = cf["module"], model.state_dict()
        own = dict(module.named_parameters(recurse=False)) | dict(module.named_buffers(recurse=False))
        params = {}
        for role, p in own.items():
            if p is None or not p.is_floating_point():
                continue
            key = f"{other}.{role}"
            _need(key in sd and tuple(sd[key].shape) == tuple(p.shape), path, kind, cf,
                  f"needs {key} of shape {list(p.shape)}")
            params[role] = sd[key]
        return with_params(**params)
    if weighted:
        if k == "transpose_weight":
            _need(kind == "linear" and w.shape[0] == w.shape[1], path, kind, cf, "needs a square linear weight")
            return with_params(weight=w.t())
        if k == "weight_reinterpreted":
            if kind == "linear":
                _need(w.shape[0] != w.shape[1], path, kind, cf, "is transpose_weight for a square weight")
                return with_params(weight=w.reshape(w.shape[1], w.shape[0]).t())
            o, i, kk = w.shape
            _need(kk > 1, path, kind, cf, "needs a kernel wider than one")
            return with_params(weight=w.reshape(o, kk, i).permute(0, 2, 1))
        if k == "kernel_flipped":
            _need(kind == "conv1d" and w.shape[-1] > 1, path, kind, cf, "needs a conv kernel wider than one")
            return with_params(weight=w.flip(-1))
        if k in ("bias_missing", "bias_doubled"):
            _need(b is not None, path, kind, cf, "needs a bias")
            return with_params(bias=torch.zeros_like(b) if k == "bias_missing" else 2 * b)
        if k == "weight_missing":
            return with_params(weight=torch.zeros_like(w))
        if k == "halves_swapped":
            _need(w.shape[0] % 2 == 0, path, kind, cf, "needs an even number of output rows")
            h = w.shape[0] // 2
            params = {"weight": torch.cat([w[h:], w[:h]])}
            if b is not None:
                params["bias"] = torch.cat([b[h:], b[:h]])
            return with_params(**params)
        if k == "weight_rounded":
            return with_params(weight=_round(w, cf["format"]))
        if k == "computed_in":
            # A half-precision matmul: weight and input rounded, products summed in f32 (the
            # module's own dtype), the bias as it is.
            return functional_call(module, {"weight": _round(w, cf["format"])}, (_round(x, cf["format"]),))
        if k == "weight_grid":
            return with_params(weight=_grid(w, cf["bits"], cf["granularity"]))
    if kind == "conv1d":
        if k == "padding":
            left, right = int(cf["left"]), int(cf["right"])
            _need(module.padding_mode == "zeros", path, kind, cf, "needs zero padding")
            with _setting(module, padding=(0,)):
                return module(F.pad(x, (left, right)))
        if k == "stride":
            with _setting(module, stride=(int(cf["value"]),)):
                return module(x)
    if kind in ("layer_norm", "rms_norm", "batch_norm"):
        eps_attr = _eps_attr(module)
        if k == "eps":
            with _setting(module, **{eps_attr: float(cf["value"])}):
                return module(x)
        if k in ("unbiased_variance", "not_centered"):
            # LayerNorm's statistics computed otherwise: over n - 1, or without the mean.
            _need(kind == "layer_norm", path, kind, cf, "applies to a LayerNorm")
            dims = tuple(range(-len(module.normalized_shape), 0))
            if k == "unbiased_variance":
                x = x - x.mean(dim=dims, keepdim=True)
                var = x.var(dim=dims, keepdim=True, unbiased=True)
            else:
                var = x.pow(2).mean(dim=dims, keepdim=True)
            y = x / torch.sqrt(var + module.eps)
            if w is not None:
                y = y * w
            if b is not None:
                y = y + b
            return y
        if k == "batch_statistics":
            _need(kind == "batch_norm", path, kind, cf, "applies to a BatchNorm")
            return F.batch_norm(x, None, None, w, b, True, 0.0, module.eps)
        if k in ("running_var_power", "running_mean_missing"):
            # The running statistics read otherwise: the variance as a standard deviation (or the
            # other way), the mean left out.
            _need(kind == "batch_norm", path, kind, cf, "applies to a BatchNorm")
            mean, var = module.running_mean, module.running_var
            if k == "running_var_power":
                var = var.pow(float(cf["value"]))
            else:
                mean = torch.zeros_like(mean)
            return F.batch_norm(x, mean, var, w, b, False, 0.0, module.eps)
        if k == "weight_plus_one":
            _need(kind == "rms_norm", path, kind, cf, "applies to an RMSNorm")
            return with_params(weight=1 + w)
        if k == "affine_swapped":
            _need(w is not None and b is not None, path, kind, cf, "needs a weight and a bias")
            return with_params(weight=b, bias=w)
        if k in ("affine_missing", "norm_weight_missing", "norm_bias_missing"):
            params = {}
            if k in ("affine_missing", "norm_weight_missing"):
                _need(w is not None, path, kind, cf, "needs a weight")
                params["weight"] = torch.ones_like(w)
            if k in ("affine_missing", "norm_bias_missing"):
                if b is not None:
                    params["bias"] = torch.zeros_like(b)
                else:
                    _need(k == "affine_missing", path, kind, cf, "needs a bias")
            return with_params(**params)
    raise ReplayError(f"replay {path}: counterfactual {k!r} does not apply to a {kind} ({type(module).__name__})")


def _embedding_call(model, path: str, module, ids, cf: dict):
    import torch.nn.functional as F

    k = cf.get("kind", "none")
    w = module.weight
    if k == "other_key":
        sd = model.state_dict()
        key = cf["key"]
        if key not in sd or tuple(sd[key].shape) != tuple(w.shape) or cf.get("role") != "weight":
            raise ReplayError(f"replay {path}: {key!r} is not a table of the shape {list(w.shape)}")
        w = sd[key]
    elif k == "id_offset":
        ids = (ids + int(cf["by"])).clamp(0, w.shape[0] - 1)
    elif k == "weight_rounded":
        w = _round(w, cf["format"])
    elif k not in ("none", "output_scale"):
        raise ReplayError(f"replay {path}: counterfactual {k!r} does not apply to an embedding")
    out = F.embedding(ids, w)
    if k == "output_scale":
        out = out * float(cf["factor"])
    return out


def _points(module: str, rule, ids_from_rows: bool) -> tuple[dict, str]:
    """The op-level points a replay of `module` receives (by role: `input`, an attention core's
    `input` (queries), `key`, `value`, as its contract rule `rule` declares them) and the one it
    returns."""
    if rule is not None:
        return ({role: f"{module}.{o.point}" for role, o in (("input", rule.queries), ("key", rule.keys),
                                                             ("value", rule.values))},
                f"{module}.{rule.output}")
    return {"input": f"{module}:out" if ids_from_rows else f"{module}:in"}, f"{module}:out"


def replay(family: str, model_dir: str, module: str, array, layout: str, counterfactual="{}", *,
           contract=None, dtype: str = "float32", ids_from_rows: bool = False, counterfactuals=None,
           extra=None) -> dict:
    """Run module `module` (dotted path) of the reference on `array` (the engine's op-level point,
    in `layout`) under `counterfactual` (JSON text or dict; `{"kind": "none"}` by default).
    `contract` is the family's resolved contract (`xray.contract.resolved/v1`: JSON text, dict,
    path or `contract.Contract`): its `points` rules declare the layout and form of every tensor
    in and out (module docstring).

    Returns `{"info": ModuleInfo dict, "output": float32 array, "layout": str, "points": {"inputs":
    [...], "output": name}}`, the output in its point's declared form and layout; with
    `counterfactuals` (a list of JSON texts or dicts) also `"outputs"`: one array per entry, or a
    one-line string saying why that counterfactual does not apply. The core of an attention module
    the contract's `attention` rules declare is replayed from its projections' outputs: `array` is
    the queries' point (`q_proj:out`), `extra` maps `key` and `value` to `(array, layout)` of the
    keys' and values' points (`k_proj:out`, `v_proj:out`, every step's rows up to this one for a
    decoder's self-attention; Granite's conformer: `to_kv:out` for both, chunked as declared); the
    output is the rule's `output` point (`out_proj:in`)."""
    import torch

    model = load_model(family, model_dir, dtype)
    c = _contract(family, contract)
    try:
        mod = model.get_submodule(module)
    except AttributeError:
        from .ops import _nearby

        raise ReplayError(f"replay: the {type(model).__name__} has no module {module!r}{_nearby(model, module)}") from None
    rule = c.attention_rule(module)
    kind = "attention" if rule is not None else module_kind(mod)
    info = module_info(model, module, mod, kind)
    if ids_from_rows and kind != "embedding":
        raise ReplayError(f"replay {module}: ids_from_rows is for an embedding; this is a {kind} ({type(mod).__name__})")
    ins, out_point = _points(module, rule, ids_from_rows)
    # The core's setup, found once for every counterfactual of the call.
    setup = _attention_setup(model, module, mod) if rule is not None else None
    pads = setup is not None and setup["pads"]
    given = {"input": (array, layout)}
    if kind == "attention":
        if not extra or "key" not in extra or "value" not in extra:
            raise ReplayError(f"replay {module}: an attention core needs extra 'key' and 'value' besides the queries")
        for name in ("key", "value"):
            v = extra[name]
            if not (isinstance(v, (tuple, list)) and len(v) == 2 and isinstance(v[1], str)):
                raise ReplayError(f"replay {module}: extra {name!r} is not (array, layout)")
            given[name] = (v[0], v[1])
    symbols: dict = {}
    x = {role: _to_module(c, ins[role], *given[role], symbols, kind, pads) for role in ins}

    def parse(cf):
        if isinstance(cf, str):
            cf = json.loads(cf or "{}")
        if not isinstance(cf, dict):
            raise ReplayError(f"replay {module}: a counterfactual is a JSON object, got {type(cf).__name__}")
        return cf or {"kind": "none"}

    if kind == "embedding":
        ids = _ids(mod, module, x["input"], ids_from_rows)
    else:
        t = {role: _tensor(mod, a) for role, a in x.items()}
        if rule is not None:
            try:
                t = {role: o.take(t[role]) for role, o in (("input", rule.queries), ("key", rule.keys),
                                                           ("value", rule.values))}
            except ContractError as e:
                raise ReplayError(f"replay {module}: {e}") from None

    def one(cf):
        with torch.no_grad():
            if kind == "attention":
                out = _attention_call(module, mod, setup, t["input"], t["key"], t["value"], cf)
            elif kind == "embedding":
                out = _embedding_call(model, module, mod, ids, cf)
            else:
                out = _call(model, module, mod, kind, t["input"], cf)
        if isinstance(out, (tuple, list)):
            out = out[0]
        elif not torch.is_tensor(out) and hasattr(out, "to_tuple"):
            # A transformers ModelOutput (a whole encoder's): its element 0, as the recorder
            # takes a module's output.
            out = out.to_tuple()[0]
        a = np.ascontiguousarray(out.detach().to(torch.float32).cpu().numpy())
        return _to_engine(c, out_point, a, symbols)

    first, out_layout = one(parse(counterfactual))
    res = {"info": info, "output": first, "layout": out_layout,
           "points": {"inputs": [ins[r] for r in ins], "output": out_point}}
    if counterfactuals is not None:
        outs = []
        for cf in counterfactuals:
            try:
                outs.append(one(parse(cf))[0])
            except (ReplayError, RuntimeError, ValueError) as e:
                outs.append(" ".join(str(e).split()))
        res["outputs"] = outs
    return res
