"""The README is a front door and the docs a site that builds: sizes, links, generated pages, strict build."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 450


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move explanations into docs/"


def test_readme_links_resolve():
    """Every relative link of the README names a file of the repository (mkdocs checks the docs' own)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert targets
    missing = [t for t in targets if "://" not in t and not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_docs_home_is_generated_from_the_readme():
    assert _script("docs_index").main(["--check"]) == 0, "run python scripts/docs_index.py"


def test_docs_home_generator_rejects_a_readme_without_its_section():
    with pytest.raises(ValueError, match="Read on"):
        _script("docs_index").index("# otel-llm\n\nno list of pages\n")


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail("mkdocs is not installed: it is in the test extra (pip install -e '.[test]')")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=config.parent, capture_output=True, text=True, timeout=300)


def test_docs_build_strictly(tmp_path):
    done = _mkdocs(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "architecture" / "index.html").exists()


def test_a_broken_link_fails_the_build(tmp_path):
    """The strict build can fail: the same site with one link to a page that does not exist."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "costs.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [nowhere](no-such-page.md).\n", encoding="utf-8")
    done = _mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr


def test_architecture_page_matches_the_imports():
    assert _script("architecture").main(["--check"]) == 0, "run python scripts/architecture.py"


def test_architecture_flow_follows_the_imports(monkeypatch):
    """A stage pair neither of whose modules imports the other is refused, naming them."""
    architecture = _script("architecture")
    stages = (architecture.Stage("otel_llm.views.cli", "a"), architecture.Stage("otel_llm.core.clock", "b"))
    monkeypatch.setattr(architecture, "FLOW", stages)
    with pytest.raises(SystemExit, match="otel_llm.views.cli nor otel_llm.core.clock"):
        architecture.graphs()


def test_architecture_rooms_are_drawn_from_imports(tmp_path, monkeypatch):
    """A made-up package: its folders become rooms, its imports arrows (relative ones included)."""
    architecture = _script("architecture")
    base = tmp_path / "pkg"
    (base / "low").mkdir(parents=True)
    (base / "__init__.py").write_text("")
    (base / "low" / "__init__.py").write_text("")
    (base / "low" / "thing.py").write_text("X = 1\n")
    (base / "top.py").write_text("from .low import thing\n\ndef f():\n    import pkg.low.thing\n")
    monkeypatch.setattr(architecture, "PACKAGES", {"pkg": base})
    monkeypatch.setattr(architecture, "FLOW", ())
    known = architecture.modules()
    assert architecture.imports("pkg.top", known["pkg.top"], known) == {"pkg.low.thing"}
    assert "pkg --> pkg_low" in architecture.graphs()


# paths the docs name that are not files of this repository, on purpose
NOT_OURS = {
    "benchmarks/FILE.py",                        # a placeholder in a command line
    "benchmarks/results/device_roofline.json",   # what the GPU run of scripts/device/roofline_check.py writes
    "tests/bindings/test_executor_bindings.py",  # TensorRT-LLM's own test, where its JSON keys were read
}
REPO_PATH = re.compile(r"(?<![\w/.-])((?:tests|otel_llm|benchmarks|collector|scripts|examples|dashboards|docs)/[\w./-]*\w)")


def test_paths_the_docs_name_exist():
    """A file the README or a docs page names (``tests/...``, ``otel_llm/...``) exists: a moved module or
    test makes this fail instead of leaving the docs pointing at nothing."""
    pages = [ROOT / "README.md", ROOT / "collector" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    stale = [f"{page.relative_to(ROOT)}: {path}" for page in pages
             for path in REPO_PATH.findall(page.read_text(encoding="utf-8"))
             if path not in NOT_OURS and not (ROOT / path).exists()]
    assert not stale, "paths that do not exist:\n" + "\n".join(stale)
