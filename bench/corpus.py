"""A corpus of real published models, as users export them: each one exported, saved, loaded back through the
upload loader, imported and built untuned, and checked against torch.

    python -m bench.corpus                               # every model
    python -m bench.corpus --models gpt_block,resnet18   # some
    python -m bench.corpus --list                        # the names

    CORPUS[name]() -> (module, args, kwargs)             # a fresh module in eval mode, random weights
    export(name) -> torch.export.ExportedProgram

The corpus is `bench.corpus_models` (torch and torchvision only, its docstring says what is in it), re-exported
here.

`main` prints, per model, how long export and load+import took, how many tasks the import made and whether the
untuned build matches `reference_outputs`; a failing step is recorded in its row and the run goes on (`--budget`
is unused: the corpus' models are tuned and timed against torch, ONNX Runtime and MetaSchedule by `bench.models`).

Layering: bench may import everything below it (`compiler`); nothing imports bench.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.corpus_models import (CORPUS, PYTREE_MODELS, TRANSFORMERS, Factory, Pair, export, flat_inputs,
                                 import_torchvision)
from compiler.target import resolve_target
from compiler.workloads import model as M
from compiler.workloads.pt2 import DEFAULT_MAX_FILE_BYTES, load_exported_program, short_error

# the corpus' definitions live in bench.corpus_models (torch only: a torch timing child builds them without TVM)
__all__ = ["CORPUS", "HEADER", "PYTREE_MODELS", "TRANSFORMERS", "Factory", "Pair", "Row", "check_model", "export",
           "flat_inputs", "import_torchvision", "main"]


# ---------------------------------------------------------------------------
# The table


@dataclass
class Row:
    """One model's run: seconds per step (None: not reached), the task count, and what failed where."""

    name: str
    export_s: float | None = None
    load_import_s: float | None = None
    tasks: int | None = None
    build_s: float | None = None
    matches: bool | None = None
    failed: str = ""  # "export", "load", "import", "build", "match"
    error: str = ""

    def line(self) -> str:
        def s(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"

        match = {None: "-", True: "yes", False: "NO"}[self.matches]
        tasks = "-" if self.tasks is None else str(self.tasks)
        return (f"{self.name:32} {s(self.export_s):>8} {s(self.load_import_s):>8} {tasks:>5} {s(self.build_s):>8} "
                f"{match:>5}  {self.failed + ': ' + self.error if self.failed else ''}")


HEADER = f"{'model':32} {'export s':>8} {'load+imp':>8} {'tasks':>5} {'build s':>8} {'match':>5}  failure"


def check_model(name: str, target: object, workdir: Path, *, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Row:
    """Exports `name`, saves it, loads it with the upload loader (files up to `max_bytes`, the service's upload
    limit by default), imports it (blocked layouts), builds it untuned and compares its outputs with the
    exported program's; the first failing step ends the row."""
    row, step = Row(name), "export"
    try:
        start = time.perf_counter()
        ep = export(name)
        row.export_s = time.perf_counter() - start
        inputs = flat_inputs(ep)
        path = workdir / f"{name}.pt2"
        torch.export.save(ep, path)
        step = "load"
        start = time.perf_counter()
        loaded = load_exported_program(path, max_bytes=max_bytes)
        step = "import"
        model = M.import_model(loaded, layout="blocked", target=target)
        row.load_import_s = time.perf_counter() - start
        row.tasks = len(model.tasks)
        step = "build"
        start = time.perf_counter()
        built = M.build_model(model, target)
        outs = M.run_model(built, inputs, target)
        row.build_s = time.perf_counter() - start
        step = "match"
        problem = M.compare_outputs(outs, M.reference_outputs(loaded, inputs), **M.tolerance(model))
        row.matches = problem is None
        if problem:
            row.failed, row.error = step, short_error(problem, 200)
    except Exception as e:  # noqa: BLE001 - a corpus run records every failure and goes on
        row.failed, row.error = step, short_error(f"{type(e).__name__}: {e}", 300)
        if step not in ("load", "import", "export"):
            traceback.print_exc(file=sys.stderr)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.corpus", description=__doc__.split("\n")[0])
    parser.add_argument("--models", help="comma-separated corpus names (default: all)")
    parser.add_argument("--skip", help="comma-separated names to leave out")
    parser.add_argument("--budget", type=int, default=0, help="tuning trials per model (0: untuned; tuning is "
                                                             "not driven from here yet)")
    parser.add_argument("--target", default="host")
    parser.add_argument("--max-file-gib", type=float, default=DEFAULT_MAX_FILE_BYTES / (1 << 30),
                        help="the largest file the loader takes (default: the service's upload limit); "
                             "vit_l_16, vit_l_32, vit_h_14 and regnet_y_128gf are over 1 GiB")
    parser.add_argument("--list", action="store_true", help="print the corpus' names and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(CORPUS))
        return 0
    names = args.models.split(",") if args.models else list(CORPUS)
    unknown = [n for n in names if n not in CORPUS]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")
    skip = set(args.skip.split(",")) if args.skip else set()
    target = resolve_target(args.target)
    print(HEADER, flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="altune-corpus-") as tmp:
        for name in names:
            if name in skip:
                continue
            rows.append(check_model(name, target, Path(tmp), max_bytes=int(args.max_file_gib * (1 << 30))))
            print(rows[-1].line(), flush=True)
            (Path(tmp) / f"{name}.pt2").unlink(missing_ok=True)
    bad = [r for r in rows if not r.matches]
    print(f"\n{len(rows) - len(bad)}/{len(rows)} models match torch untuned; failed: "
          f"{', '.join(f'{r.name} ({r.failed})' for r in bad) or 'none'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
