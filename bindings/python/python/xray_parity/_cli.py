"""The `xray` command of the wheel: runs the `xray` executable the wheel carries
(`xray_parity/bin/xray`, the CLI built from the same sources, with the oracle) in place of this
process (`os.execv`: its exit code, signals and output are the CLI's own).

The executable links the libpython of the CPython it was built for (the in-process HF reference),
so its directory (`sysconfig`'s LIBDIR of the interpreter running this script, the one the venv
was made from) is put first on LD_LIBRARY_PATH. Nothing else of the environment changes: the
executable finds the oracle's venv and package from its own location (the venv this wheel is
installed in, `xray_oracle` beside `xray_parity`; docs/architecture.md), never from the working
directory.
"""
from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path


def executable() -> Path:
    return Path(__file__).resolve().parent / "bin" / "xray"


def environment(base: dict | None = None) -> dict:
    """`base` (default: this process's environment) with this interpreter's LIBDIR first on
    LD_LIBRARY_PATH: what the bundled executable runs with."""
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir:
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = libdir + (os.pathsep + old if old else "")
    return env


def main() -> None:
    exe = executable()
    if not os.access(exe, os.X_OK):
        print(f"xray: error: {exe} is missing or not executable (a broken xray_parity install: "
              "reinstall the wheel)", file=sys.stderr)
        sys.exit(2)
    env = environment()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(exe, [str(exe), *sys.argv[1:]], env)


if __name__ == "__main__":
    main()
