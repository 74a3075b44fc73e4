"""`python -m xray_oracle` (run with PYTHONPATH=oracle, or from the oracle/ folder).

    dump    --model DIR --audio WAV --contract FILE --out DIR [--max-new-tokens N]
            [--dtype float32|float64] [--only NAME ...] [--ops | --ops-only POINT[,POINT]]
            [--stats-only] [--force]
    run     --model DIR --audio WAV [...]      print tokens, transcript and checkpoint shapes
    verify  DIR                                load a dump with every check, print a summary

--contract is the resolved contract: `xray contract --model DIR --out FILE` makes it (Python evaluates
no contract expressions). Exit status: 0 on success, 2 on an oracle error (the message says what to fix), 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import OracleError


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="HF Whisper directory (e.g. fixtures/whisper-tiny-en)")
    p.add_argument("--audio", required=True, help="16 kHz mono 16-bit PCM WAV")
    p.add_argument("--contract", required=True,
                   help="resolved contract JSON (make it with `xray contract --model DIR --out FILE`)")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--attn", choices=["eager", "sdpa"], default="eager", help="attention implementation")
    p.add_argument("--only", nargs="+", default=None, help="capture only these checkpoints (names or templates)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: host-independent, see run_whisper)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--ops", action="store_true",
                   help="also capture every op-level point (both sides of every module with its own weights)")
    g.add_argument("--ops-only", metavar="POINT[,POINT]", action="append", default=None,
                   help="also capture these op-level points, e.g. model.encoder.layers.3.fc2:out (repeatable)")


def _run(args) -> dict:
    from .whisper import run_whisper

    contract = Path(args.contract)
    if not contract.is_file():
        from .errors import OracleInputError

        raise OracleInputError(f"contract file {contract} does not exist (make it with `xray contract --model {args.model} --out {contract}`)")
    return run_whisper(
        args.model,
        args.audio,
        contract,
        max_new_tokens=args.max_new_tokens,
        dtype=args.dtype,
        only=args.only,
        attn_implementation=args.attn,
        threads=args.threads,
        ops=_ops(args),
    )


def _ops(args):
    """--ops -> "all"; --ops-only A,B --ops-only C -> [A, B, C]; neither -> None."""
    if args.ops:
        return "all"
    if args.ops_only:
        names = [n.strip() for arg in args.ops_only for n in arg.split(",")]
        if not all(names):
            from .errors import OracleInputError

            raise OracleInputError(f"--ops-only {','.join(args.ops_only)!r}: an empty point name")
        return names
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m xray_oracle", description="X-Ray HF reference oracle")
    sub = ap.add_subparsers(dest="cmd", required=True)
    pd = sub.add_parser("dump", help="run the reference and write an xray.dump directory")
    _add_run_args(pd)
    pd.add_argument("--out", required=True, help="dump directory to create")
    pd.add_argument("--stats-only", action="store_true", help="write stats instead of .npy files")
    pd.add_argument("--force", action="store_true", help="replace an existing --out")
    pr = sub.add_parser("run", help="run the reference and print a summary")
    _add_run_args(pr)
    pr.add_argument("--json", action="store_true", help="print the summary as JSON")
    pv = sub.add_parser("verify", help="load a dump with every check")
    pv.add_argument("dir")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "verify":
            from .dump import read_dump

            d = read_dump(args.dir)
            m = d.manifest
            print(f"{d.path}: {m['family']} dump by {m['producer']}, {len(d.checkpoints)} checkpoint entries, OK")
            for f in d.unlisted:
                print(f"  not in the manifest (ignored): {f}")
            return 0
        res = _run(args)
        if args.cmd == "run":
            summary = {
                "tokens": res["tokens"],
                "transcript": res["transcript"],
                "steps": 1 + max(c["step"] for c in res["checkpoints"]) if res["checkpoints"] else 0,
                "checkpoints": [[c["name"], c["step"], list(c["array"].shape)] for c in res["checkpoints"]],
                "op_points": [[c["name"], c["step"], list(c["array"].shape)] for c in res["op_points"]],
            }
            if args.json:
                print(json.dumps(summary))
            else:
                print(f"tokens: {summary['tokens']}")
                print(f"transcript: {summary['transcript']!r}")
                print(f"checkpoints: {len(summary['checkpoints'])} captured over {summary['steps']} steps")
                if summary["op_points"]:
                    print(f"op-level points: {len(summary['op_points'])} captured")
            return 0
        from .dump import write_dump

        out = write_dump(
            args.out,
            # The contract's checkpoints, then the op-level points in firing order.
            res["checkpoints"] + res["op_points"],
            family=res["family"],
            model_id=args.model,
            producer="oracle",
            weights_sha256=res["weights_sha256"],
            audio_sha256=res["audio_sha256"],
            tools=res["tools"],
            tokens=res["tokens"],
            transcript=res["transcript"],
            stats_only=args.stats_only,
            overwrite=args.force,
        )
        points = f" + {len(res['op_points'])} op-level points" if res["op_points"] else ""
        print(f"{out}: {len(res['checkpoints'])} checkpoint entries{points}, transcript {res['transcript']!r}")
        return 0
    except OracleError as e:
        print(f"xray_oracle: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
