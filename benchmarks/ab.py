"""A/B of any benchmark: this working tree against another commit, in interleaved rounds.

    .venv/bin/python benchmarks/ab.py --base main [--rounds 5] [--keys REGEX] [--out FILE] \
        "benchmarks/core_costs.py --only verdict" "benchmarks/decode_detail.py --requests 8"

Each side is a tree of its own in a temporary directory: the base is ``git archive REF``, this side a
copy of the working tree's tracked and untracked (not ignored) files, so uncommitted changes are
measured and the recorded results in ``benchmarks/results/`` are left alone. Both get this tree's
``benchmarks/`` (the same method measures both codes) and their C extensions built in place
(``setup.py build_ext --inplace``; a side whose build fails runs its pure-Python paths, as an install
without a compiler does). A side runs on the current interpreter with ``PYTHONPATH`` naming its tree and
its collector, which Python searches before the editable install of the venv: the venv's packages
(vLLM, torch, OpenTelemetry) are shared, the code measured is the side's.

A round runs every BENCH once on each side, the sides in alternating order (base first in even rounds),
so a machine that slows down during the run slows both. A benchmark reports by writing JSON under its
tree's ``benchmarks/results/``; every number in what a run wrote is one key (``file:path.to.value``; a
list element is named by its ``name``/``mode``/``shape``/``path`` fields where it has them). Printed per
key: each side's median and spread (min-max) over the rounds, and the median of the per-round ratios
this/base, which cancels what a round's machine state did to both, with those ratios' quartiles (in the
JSON also their min-max, the ratios themselves and a 95 % interval for their median): a ratio whose
quartiles straddle 1 is not resolved by the run, and a change is resolved only beyond the interval. ``--keys`` selects keys by regex
(default: every key outside ``raw``, ``machine`` and ``loadavg`` entries).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABEL_FIELDS = ("name", "mode", "shape", "path", "kind", "tokens", "batch")
DEFAULT_SKIP = re.compile(r"(^|[.:\[])(raw|machine|loadavg\w*|load_average\w*|started|date|code|commit)\b")


@dataclass
class Side:
    """One tree under test: where it lives and the numbers its runs wrote, per key, per round."""

    name: str
    ref: str
    tree: Path
    values: dict[str, list[float]] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        paths = [str(self.tree), str(self.tree / "collector")]
        old = os.environ.get("PYTHONPATH")
        return {**os.environ, "PYTHONPATH": os.pathsep.join(paths + ([old] if old else []))}


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def export_ref(ref: str, dest: Path) -> None:
    """``git archive REF`` unpacked into ``dest`` (a clean tree of that commit)."""
    archive = subprocess.run(["git", "archive", "--format=tar", ref], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def copy_working_tree(dest: Path) -> None:
    """The working tree's tracked and untracked, not ignored, files (what a commit of it would hold)."""
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def build(tree: Path) -> str:
    """Build the optional C extensions in place; returns what happened (a failed build is not fatal)."""
    notes = []
    for where in (tree, tree / "collector"):
        if not (where / "setup.py").exists():
            continue
        done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=where,
                              capture_output=True, text=True)
        notes.append(f"{where.relative_to(tree) or '.'}: {'built' if done.returncode == 0 else 'not built'}")
    return ", ".join(notes)


def install_method(tree: Path) -> None:
    """This tree's benchmark scripts in the side's tree, so both sides run the same measurement."""
    dest = tree / "benchmarks"
    dest.mkdir(exist_ok=True)
    for script in (ROOT / "benchmarks").glob("*.py"):
        shutil.copy2(script, dest / script.name)
    (dest / "results").mkdir(exist_ok=True)


def label(item: object, index: int) -> str:
    if isinstance(item, dict):
        named = [f"{k}={item[k]}" for k in LABEL_FIELDS if isinstance(item.get(k), (str, int)) and k in item]
        if named:
            return ",".join(named)
    return str(index)


def numbers(value: object, prefix: str) -> dict[str, float]:
    """Every number in a JSON value, keyed by its path."""
    if isinstance(value, bool):
        return {}
    if isinstance(value, (int, float)):
        return {prefix: float(value)}
    out: dict[str, float] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(numbers(v, f"{prefix}.{k}" if prefix[-1:] != ":" else f"{prefix}{k}"))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.update(numbers(v, f"{prefix}[{label(v, i)}]"))
    return out


def run_once(side: Side, bench: list[str], timeout: float) -> None:
    results = side.tree / "benchmarks" / "results"
    before = {p: p.stat().st_mtime_ns for p in results.rglob("*.json")}
    script, *args = bench
    done = subprocess.run([sys.executable, str(side.tree / script), *args], cwd=side.tree, env=side.env(),
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{side.name} ({side.ref}): {' '.join(bench)} exited {done.returncode}\n{done.stderr[-4000:]}")
    written = [p for p in results.rglob("*.json") if before.get(p) != p.stat().st_mtime_ns]
    if not written:
        raise SystemExit(f"{' '.join(bench)} wrote no JSON under benchmarks/results/: nothing to compare")
    for path in written:
        for key, v in numbers(json.loads(path.read_text()), f"{path.stem}:").items():
            side.values.setdefault(key, []).append(v)


def spread(values: list[float]) -> str:
    return f"{min(values):.4g}-{max(values):.4g}"


def _quartiles(values: list[float]) -> list[float] | None:
    """The per-round ratios' first and third quartiles: how far a round's ratio strays (the method's
    resolution; a change inside it is not resolved)."""
    if len(values) < 4:
        return None
    q = statistics.quantiles(values, n=4)
    return [q[0], q[2]]


def median_interval(values: list[float], level: float = 0.95) -> list[float] | None:
    """A distribution-free interval for the median of ``values`` (rounds are independent draws of the
    ratio): the order statistics x(j+1), x(n-j), j the largest with P(Binomial(n, 1/2) <= j) <= (1-level)/2.
    None where too few rounds give one (under 6 at 95 %)."""
    n, cum, j = len(values), 0.0, -1
    for i in range(n):
        cum += math.comb(n, i) / 2 ** n
        if cum > (1 - level) / 2:
            break
        j = i
    if j < 0:
        return None
    ordered = sorted(values)
    return [ordered[j], ordered[n - 1 - j]]


def report(base: Side, this: Side, keys: re.Pattern[str] | None) -> list[dict]:
    rows = []
    for key in sorted(set(base.values) & set(this.values)):
        if (keys is not None and not keys.search(key)) or (keys is None and DEFAULT_SKIP.search(key)):
            continue
        a, b = base.values[key], this.values[key]
        ratios = [y / x for x, y in zip(a, b) if x]
        rows.append({"key": key, "base_median": statistics.median(a), "base_spread": [min(a), max(a)],
                     "this_median": statistics.median(b), "this_spread": [min(b), max(b)],
                     "paired_ratio_median": statistics.median(ratios) if ratios else None,
                     "paired_ratio_spread": [min(ratios), max(ratios)] if ratios else None,
                     "paired_ratio_quartiles": _quartiles(ratios),
                     "paired_ratio_median_ci95": median_interval(ratios), "paired_ratios": ratios,
                     "rounds": len(a)})
    width = max([len(r["key"]) for r in rows] + [3])
    print(f"{'key':<{width}}  {'base median':>12} {'(spread)':>19}  {'this median':>12} {'(spread)':>19}  this/base"
          "  (quartiles)  [95 % interval of the median]")
    for r in rows:
        ratio = "" if r["paired_ratio_median"] is None else f"{r['paired_ratio_median']:.3f}x"
        if r["paired_ratio_quartiles"] is not None:
            ratio += " ({:.3f}-{:.3f})".format(*r["paired_ratio_quartiles"])
        if r["paired_ratio_median_ci95"] is not None:
            ratio += " [{:.3f}-{:.3f}]".format(*r["paired_ratio_median_ci95"])
        print(f"{r['key']:<{width}}  {r['base_median']:>12.4g} {spread(base.values[r['key']]):>19}  "
              f"{r['this_median']:>12.4g} {spread(this.values[r['key']]):>19}  {ratio}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the git ref to compare against (a branch, tag or commit)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--keys", default=None, help="regex: report only the keys it matches")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds one benchmark run may take")
    ap.add_argument("--out", default=None, help="also write the comparison as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the two temporary trees (their paths are printed)")
    ap.add_argument("bench", nargs="+", help='a benchmark script with its arguments, e.g. "benchmarks/x.py --rounds 3"')
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    benches = [shlex.split(b) for b in args.bench]
    for bench in benches:
        script = Path(bench[0])
        if script.is_absolute() or not (ROOT / script).is_file() or script.parts[0] != "benchmarks":
            ap.error(f"{bench[0]}: not a script under benchmarks/ of this tree (give the path from the repository root)")
    try:
        base_commit = git("rev-parse", "--verify", f"{args.base}^{{commit}}").strip()
    except subprocess.CalledProcessError:
        ap.error(f"--base {args.base}: not a commit of this repository")
    keys = re.compile(args.keys) if args.keys else None

    scratch = Path(tempfile.mkdtemp(prefix="otel-llm-ab-"))
    try:
        base = Side("base", f"{args.base} ({base_commit[:9]})", scratch / "base")
        this = Side("this", f"working tree on {git('rev-parse', '--short', 'HEAD').strip()}", scratch / "this")
        base.tree.mkdir()
        this.tree.mkdir()
        export_ref(base_commit, base.tree)
        copy_working_tree(this.tree)
        for side in (base, this):
            install_method(side.tree)
            print(f"{side.name}: {side.ref}: {build(side.tree)}", flush=True)
        date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        load_start = os.getloadavg()
        for r in range(args.rounds):
            order = (base, this) if r % 2 == 0 else (this, base)
            for bench in benches:
                for side in order:
                    started = time.monotonic()
                    run_once(side, bench, args.timeout)
                    print(f"round {r + 1}/{args.rounds} {side.name} {bench[0]}: {time.monotonic() - started:.0f} s",
                          flush=True)
        load_end = os.getloadavg()
        print(f"\nbase = {base.ref}; this = {this.ref}; {args.rounds} rounds; "
              f"load average {load_start[0]:.1f} -> {load_end[0]:.1f} on {os.cpu_count()} CPUs\n")
        rows = report(base, this, keys)
        if args.out:
            Path(args.out).write_text(json.dumps({
                "date": date, "base": base.ref, "this": this.ref, "benchmarks": args.bench, "rounds": args.rounds,
                "machine": {"cpus": os.cpu_count(), "loadavg_at_start": load_start, "loadavg_at_end": load_end},
                "rows": rows}, indent=2) + "\n")
    finally:
        if args.keep:
            print(f"trees kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
