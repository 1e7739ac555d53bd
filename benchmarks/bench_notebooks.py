"""How long each course notebook takes to run top to bottom, against the 60-second budget.

The rule: every notebook in notebooks/ and solutions/ runs, from a fresh kernel, in under
`--limit` seconds (60) on a 2-core CPU. Each notebook is executed as a learner's "Run All"
would (nbclient, a new python3 kernel, in the notebook's own folder; the kernel's start is
counted), one after another, and nothing is written back. Printed per notebook: the wall
time, the slowest cell and its share, and "met" or "NOT met"; a notebook that raises is NOT
met. Because a slower CPU stretches every notebook alike, the run also times the bundled
target's plain greedy decoding (ms per token, float32, one thread) before and after the
notebooks: that figure says how fast this host was, so runs on two hosts can be compared.

    python benchmarks/bench_notebooks.py [NOTEBOOK ...] [--limit 60] [--out FILE]

Without NOTEBOOK arguments: notebooks/*.ipynb and solutions/*.ipynb. Writes
benchmarks/results/notebooks_cpu.json unless --out names another file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from specref.models.pair import heldout_prompts, load_pair
from specref.perf.machine import machine_name
from specref.perf.measure import plain_time

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 60.0


def cell_seconds(cell: nbformat.NotebookNode) -> float | None:
    """A code cell's execution time from the timestamps nbclient records in its metadata (None if absent)."""
    ex = cell.get("metadata", {}).get("execution", {})
    start, end = ex.get("iopub.execute_input"), ex.get("shell.execute_reply")
    if not (start and end):
        return None
    parse = datetime.datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds()


def run_notebook(path: Path, cell_timeout: int) -> dict:
    """Execute one notebook in a fresh kernel; its wall time, slowest cell, and the error if one cell raised."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", record_timing=True,
                            extra_arguments=["--IPKernelApp.log_level=ERROR"],  # not its TCP warning per notebook
                            resources={"metadata": {"path": str(path.parent)}})
    error = None
    t0 = time.perf_counter()
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
        error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    seconds = time.perf_counter() - t0
    code = list(enumerate(c for c in nb.cells if c.cell_type == "code"))  # numbered as nbval numbers them
    timed = [(i, s) for i, s in ((i, cell_seconds(c)) for i, c in code) if s is not None]
    slow_i, slow_s = max(timed, key=lambda t: t[1]) if timed else (None, None)
    return {"notebook": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path), "seconds": seconds,
            "code_cells": len(code), "slowest_cell": slow_i, "slowest_cell_seconds": slow_s, "error": error}


def verdict(row: dict, limit: float) -> bool:
    """Met: the notebook ran without an error in under `limit` seconds."""
    return row["error"] is None and row["seconds"] < limit


def host_speed(n_new: int = 64) -> float:
    """The bundled target's plain greedy decoding on this host, in ms per token (float32, one thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target, _, _ = load_pair()
        prompts = [torch.tensor([p]) for p in heldout_prompts(n=3, n_tokens=32)]
        plain_time(target, prompts[:1], 8)  # warm-up
        return 1e3 * plain_time(target, prompts, n_new) / (len(prompts) * n_new)
    finally:
        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb solutions/*.ipynb")
    ap.add_argument("--limit", type=float, default=LIMIT_S, help="seconds a notebook may take (default 60)")
    ap.add_argument("--cell-timeout", type=int, default=180, help="seconds one cell may take before it is stopped")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "notebooks_cpu.json")
    args = ap.parse_args(argv)
    if args.limit <= 0:
        ap.error(f"--limit must be > 0 seconds, got {args.limit}")
    paths = [p.resolve() for p in args.notebooks] or sorted((ROOT / "notebooks").glob("*.ipynb")) + \
        sorted((ROOT / "solutions").glob("*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        ap.error(f"no such notebook: {', '.join(missing)}")
    t_start = time.perf_counter()
    speed_before = host_speed()
    print(f"machine: {machine_name()}; {os.cpu_count()} CPUs; torch {torch.__version__}; python "
          f"{platform.python_version()}; load average {os.getloadavg()[0]:.2f}")
    print(f"host speed before: bundled target, plain greedy, {speed_before:.2f} ms per token (1 thread)")
    print(f"\n{'notebook':44s} {'seconds':>8s}  {'slowest cell':>14s}  verdict (under {args.limit:g} s)")
    rows = []
    for path in paths:
        row = run_notebook(path, args.cell_timeout)
        row["met"] = verdict(row, args.limit)
        rows.append(row)
        slow = "-" if row["slowest_cell"] is None else \
            f"{row['slowest_cell']:2d}: {row['slowest_cell_seconds']:5.1f} s"
        print(f"{row['notebook']:44s} {row['seconds']:8.1f}  {slow:>14s}  {'met' if row['met'] else 'NOT met'}"
              + (f"  ({row['error']})" if row["error"] else ""), flush=True)
    speed_after = host_speed()
    print(f"host speed after: {speed_after:.2f} ms per token")
    worst = max(rows, key=lambda r: r["seconds"])
    all_met = all(r["met"] for r in rows)
    print(f"\ngoal: every notebook under {args.limit:g} s: {'met' if all_met else 'NOT met'} "
          f"(slowest {worst['notebook']}, {worst['seconds']:.1f} s; {sum(r['met'] for r in rows)} of {len(rows)} met)")
    command = "python benchmarks/bench_notebooks.py " + " ".join(sys.argv[1:] if argv is None else argv)
    result = {"machine": machine_name(), "cpus": os.cpu_count(), "torch": torch.__version__,
              "python": platform.python_version(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": command.strip(), "limit_s": args.limit, "host_ms_per_token": [speed_before, speed_after],
              "notebooks": rows, "all_met": all_met, "wall_seconds": time.perf_counter() - t_start}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
