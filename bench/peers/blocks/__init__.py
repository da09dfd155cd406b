"""One module per rlpt block compared by scripts/bench-peers (see bench/peers/README.md).

Each module defines, for the harness (bench/peers/harness.py):
  TITLE, RUNNERS (the C++ targets it needs), COMMAND (how to run only this block),
  cases(ctx) -> list[core.Case], report(ctx, results) -> dict(tables=..., targets=..., notes=...)
and, for the peer worker (bench/peers/worker.py):
  make_peer(name, params, dir) -> worker.Peer
"""
