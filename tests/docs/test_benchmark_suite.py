"""benchmarks/ is one maintained suite plus the A/B harness: every script is in the suite, the suite names
only scripts that exist, and the harness reads what a benchmark wrote."""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
MAX_SCRIPTS = 13  # the suite and the A/B harness (helpers a benchmark imports or starts not counted)


def suite() -> list[list[str]]:
    lines = (BENCH / "suite.txt").read_text(encoding="utf-8").splitlines()
    return [shlex.split(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]


def ab():
    spec = importlib.util.spec_from_file_location("ab", BENCH / "ab.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ab"] = module
    spec.loader.exec_module(module)
    return module


def helpers() -> set[str]:
    """Modules that are parts of a benchmark (imported by it, or started by it), not benchmarks."""
    # frontend_cpu.py's and vllm_overhead.py's; core_costs.py's (its ``agent`` section)
    return {"telemetry_modes.py", "serve_with_modes.py", "agent_replay.py"}


def test_the_suite_is_every_script_but_the_harness():
    scripts = sorted(p.name for p in BENCH.glob("*.py") if p.name not in helpers())
    assert len(scripts) <= MAX_SCRIPTS, scripts
    listed = [Path(entry[0]) for entry in suite()]
    assert all(p.parent == Path("benchmarks") and (ROOT / p).is_file() for p in listed), listed
    assert sorted({p.name for p in listed} | {"ab.py"}) == scripts
    assert all((BENCH / h).is_file() for h in helpers()), "a helper is gone: update helpers()"
    assert len(listed) == len(set(listed)), "a script listed twice"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_every_benchmark_script_parses(script: str) -> None:
    # no test runs the benchmarks (they write results, they take minutes): one that no longer parsed went
    # unnoticed, so each is at least compiled here
    path = BENCH / script
    compile(path.read_text(encoding="utf-8"), str(path), "exec")


def test_result_files_are_named_by_what_they_measure():
    import re
    for path in (BENCH / "results").iterdir():
        assert not re.search(r"_(s\d+|issue\d+|run\d+|final|new\d*|old)\b", path.stem), path.name


def test_the_harness_keys_every_number_a_benchmark_wrote():
    numbers = ab().numbers({"ingest": [{"shape": 1, "us": 2.5}, {"shape": 10, "us": 1.0}], "ok": True,
                            "nested": {"a": {"b": 3}}, "raw": [4]}, "bench:")
    assert numbers == {"bench:ingest[shape=1].shape": 1.0, "bench:ingest[shape=1].us": 2.5,
                       "bench:ingest[shape=10].shape": 10.0, "bench:ingest[shape=10].us": 1.0,
                       "bench:nested.a.b": 3.0, "bench:raw[0]": 4.0}


def test_the_harness_reports_medians_spreads_and_paired_ratios(capsys):
    harness = ab()
    base = harness.Side("base", "main", Path("/nonexistent"), {"b:us": [10.0, 12.0, 11.0], "b:raw[0]": [1.0] * 3})
    this = harness.Side("this", "tree", Path("/nonexistent"), {"b:us": [5.0, 6.6, 5.5], "b:raw[0]": [1.0] * 3})
    rows = harness.report(base, this, keys=None)
    assert [r["key"] for r in rows] == ["b:us"]  # raw entries are left out by default
    assert rows[0]["base_median"] == 11.0 and rows[0]["this_median"] == 5.5
    assert rows[0]["paired_ratio_median"] == pytest.approx(0.5)
    assert "0.500x" in capsys.readouterr().out


def test_the_harness_brackets_the_median_ratio_by_order_statistics():
    interval = ab().median_interval
    assert interval([1.0] * 5) is None  # 5 rounds: even min-max covers the median only 94 % of the time
    assert interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0]) == [1.0, 6.0]
    ratios = [float(i) for i in range(1, 32)]  # 31 rounds: the 10th and 22nd of them (97 %)
    assert interval(ratios) == [10.0, 22.0]
    assert interval(ratios, level=0.5) == [14.0, 18.0]


def test_the_harness_refuses_what_it_cannot_compare():
    harness = ab()
    with pytest.raises(SystemExit):
        harness.main(["--base", "no-such-ref-anywhere", "benchmarks/core_costs.py"])
    with pytest.raises(SystemExit):
        harness.main(["--base", "HEAD", "tests/conftest.py"])
    with pytest.raises(SystemExit):
        harness.main(["--base", "HEAD", "--rounds", "0", "benchmarks/core_costs.py"])
