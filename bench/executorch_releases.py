"""The version table: edgeplug on each installed ExecuTorch release, beside stock's flow on the same release.

For each Python given (a venv with one ExecuTorch release, edgeplug and its plugins installed: ``make setup`` and
``make setup EXECUTORCH=1.4.1``), runs ``edgeplug zoo --compare-stock`` over the same models and backends (float,
verified where the backend runs here), one process per cell, then prints one Markdown table: release x model x
backend, whether edgeplug lowers and verifies, its partitions and CPU nodes, and stock's on the same release; and
a second table of every cell whose partitions or CPU nodes differ between releases.

    python bench/executorch_releases.py --python .venv/bin/python --python .venv-et1.4.1/bin/python \\
        --models handwritten-llama-decoder,llama,qwen3 --backends xnnpack,vulkan --json out/releases.json

Cells already in ``out/releases-<release>.jsonl`` are not run again (``--resume`` of the zoo).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path


def release_of(python: str) -> str:
    code = "from importlib.metadata import version; print(version('executorch'))"
    return subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def run_zoo(python: str, release: str, args: argparse.Namespace) -> Path:
    cells = Path(args.out_dir) / f"releases-{release}.jsonl"
    cells.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        python, "-m", "edgeplug._cli", "zoo", "--models", args.models, "--backends", args.backends,
        "--schemes", "float", "--compare-stock", "--layers", str(args.layers), "--jobs", str(args.jobs),
        "--out", str(cells), "-q",
    ]
    if cells.exists():
        cmd.append("--resume")
    print(f"executorch {release}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    env = dict(os.environ, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))
    subprocess.run(cmd, check=False, env=env, stdout=subprocess.DEVNULL)
    return cells


def side(cell: dict, name: str) -> dict:
    s = cell.get(name) or {}
    cpu = sum((s.get("cpu_ops") or {}).values())
    return {
        "ok": bool(s.get("ok")), "verified": s.get("verify_passed"), "partitions": s.get("partitions"),
        "cpu_nodes": cpu if s.get("ok") else None, "max_abs_diff": s.get("max_abs_diff"),
        # a path of this machine says nothing to a reader: each keeps its last part
        "error": re.sub(r"(?:/[\w.+-]+)+/([\w.+-]+)", r"\1", s.get("error") or s.get("stage") or "")[:140],
    }


def read(cells: Path, release: str) -> list[dict]:
    rows = []
    for line in cells.read_text().splitlines() if cells.exists() else []:
        cell = json.loads(line)
        rows.append({
            "release": release, "model": cell["model"], "backend": cell["backend"], "dry_run": cell.get("dry_run"),
            "edgeplug": side(cell, "edgeplug"), "stock": side(cell, "stock"), "stock_absent": cell.get("stock_absent", ""),
        })
    return rows


def _cell(s: dict) -> str:
    if not s["ok"]:
        return f"fails: {s['error']}" if s["error"] else "fails"
    return f"{s['partitions']} / {s['cpu_nodes']}"


def _verified(row: dict) -> str:
    e = row["edgeplug"]
    if not e["ok"]:
        return "-"
    if row["dry_run"]:
        return "dry run"
    if e["verified"] is None:
        return "not run here"
    return f"yes ({e['max_abs_diff']:.1e})" if e["verified"] else "NO"


def markdown(rows: list[dict]) -> str:
    out = [
        "| release | model | backend | lowers | verifies (max abs diff) | partitions / CPU nodes | stock: partitions / CPU nodes |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(rows, key=lambda r: (r["model"], r["backend"], r["release"])):
        stock = r["stock_absent"] or _cell(r["stock"])
        out.append(
            f"| {r['release']} | {r['model']} | {r['backend']} | {'yes' if r['edgeplug']['ok'] else 'no'} | "
            f"{_verified(r)} | {_cell(r['edgeplug'])} | {stock} |"
        )
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["backend"]), {})[r["release"]] = r
    diffs = []
    for (model, backend), per in sorted(by.items()):
        seen = {(v["edgeplug"]["partitions"], v["edgeplug"]["cpu_nodes"]) for v in per.values()}
        if len(per) > 1 and len(seen) > 1:
            diffs.append(f"| {model} | {backend} | " + "; ".join(f"{rel}: {_cell(v['edgeplug'])}" for rel, v in sorted(per.items())) + " |")
    out += ["", "Cells whose edgeplug partitions or CPU nodes differ between releases:", ""]
    out += ["| model | backend | per release |", "| --- | --- | --- |", *diffs] if diffs else ["none."]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", action="append", required=True, help="a venv's python, one per ExecuTorch release")
    p.add_argument("--models", default="handwritten-llama-decoder,llama,qwen3")
    p.add_argument("--backends", default="xnnpack,vulkan")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out-dir", default="out")
    p.add_argument("--json", help="write every row here")
    args = p.parse_args(argv)
    rows = []
    for python in args.python:
        release = release_of(python)
        rows += read(run_zoo(python, release, args), release)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
