"""`python -m xray_parity ARGS`: the `xray` CLI (see `_cli`)."""
from ._cli import main

main()
