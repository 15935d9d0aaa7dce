"""The repository's two distributions, as the packaging tests see them: what each declares, what its code
imports, its wheel, and a clean virtual environment with exactly that wheel and what it declares.

Offline and deterministic: the wheels are built without build isolation (no download of setuptools), and
the clean venvs get their third-party dependencies from a wheelhouse repacked from the distributions
installed in the running environment, resolved by pip from the declared requirements with ``--no-index``.
So a venv holds the declared dependencies and their own requirements, at the versions the suite runs
against, and nothing else (no vLLM, no test helpers).
"""

from __future__ import annotations

import ast
import base64
import hashlib
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Dist:
    """One distribution of this repository: where its pyproject.toml is and which package it ships."""

    name: str  # the distribution name, canonical
    project: Path  # the folder with pyproject.toml
    package: str  # the one import package it ships

    @property
    def pyproject(self) -> dict:
        return tomllib.loads((self.project / "pyproject.toml").read_text())

    def requirements(self) -> list[Requirement]:
        return [Requirement(r) for r in self.pyproject["project"].get("dependencies", [])]

    def extras(self) -> dict[str, list[Requirement]]:
        extras = self.pyproject["project"].get("optional-dependencies", {})
        return {name: [Requirement(r) for r in reqs] for name, reqs in extras.items()}

    def sources(self) -> list[Path]:
        return sorted((self.project / self.package).rglob("*.py"))

    def module_of(self, path: Path) -> str:
        rel = path.relative_to(self.project).with_suffix("")
        return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)

    def imports(self) -> dict[str, list["Import"]]:
        """module -> its import statements, relative ones made absolute."""
        return {self.module_of(p): imports(p, self.module_of(p), p.name == "__init__.py") for p in self.sources()}


SDK = Dist("otel-llm", ROOT, "otel_llm")
COLLECTOR = Dist("otel-llm-collector", ROOT / "collector", "otel_llm_collector")
FIRST_PARTY = {d.package: d.name for d in (SDK, COLLECTOR)}


@dataclass(frozen=True)
class Import:
    module: str  # the dotted name as written, made absolute (``from a.b import c`` -> ``a.b``)
    names: tuple[str, ...]  # ``from a.b import c, d`` -> ("c", "d"): names in a.b, or its submodules
    path: Path
    line: int
    top_level: bool  # runs when the module is imported (not inside a function, try or TYPE_CHECKING block)

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def candidates(self) -> set[str]:
        """The modules this statement may import: the one named, and ``a.b.c`` for ``from a.b import c``."""
        return {self.module, *(f"{self.module}.{n}" for n in self.names)}


def imports(path: Path, module: str = "", is_package: bool = False) -> list[Import]:
    """Every import statement in one file (``module``, its dotted name, resolves relative ones)."""
    out: list[Import] = []
    package = module.split(".") if is_package else module.split(".")[:-1]

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = top
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Try)):
                inner = False
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                inner = False
            if isinstance(child, ast.Import):
                out.extend(Import(a.name, (), path, child.lineno, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = package[: len(package) - child.level + 1] if child.level else []
                name = ".".join([*base, *([child.module] if child.module else [])])
                if name:
                    out.append(Import(name, tuple(a.name for a in child.names), path, child.lineno, top))
            visit(child, inner)

    visit(ast.parse(path.read_text(), filename=str(path)), True)
    return out


def third_party(module: str) -> bool:
    top = module.split(".")[0]
    return top not in sys.stdlib_module_names and top != "__future__"


class Owners:
    """Which installed distribution provides a module, found by file: ``opentelemetry`` and ``google`` are
    namespace packages that several distributions share, so the top-level name alone cannot tell."""

    def __init__(self) -> None:
        self._by_stem: dict[str, str] = {}  # "a/b/c" (module a.b.c: a .py, a package, an extension) -> dist
        for dist in md.distributions():
            name = canonicalize_name(dist.metadata["Name"])
            for f in dist.files or ():
                rel = f.as_posix()
                if rel.startswith("..") or f.suffix not in (".py", ".so", ".pyd"):
                    continue
                if f.name == "__init__.py":
                    stem = rel.rsplit("/", 1)[0]
                else:  # c.py, c.cpython-311-x86_64-linux-gnu.so, c.abi3.so
                    stem = rel[: len(rel) - len(f.name)] + f.name.split(".")[0]
                self._by_stem.setdefault(stem, name)

    def owner(self, module: str) -> str | None:
        """The distribution of the longest prefix of ``module`` that is a module or package on file
        (``from a.b import c`` names ``a.b``; ``import a.b.c`` may name a module of a namespace package)."""
        top = module.split(".")[0]
        if top in FIRST_PARTY:
            return FIRST_PARTY[top]
        parts = module.split(".")
        while parts:
            found = self._by_stem.get("/".join(parts))
            if found:
                return found
            parts.pop()
        return None


def build_wheel(dist: Dist, out: Path, scratch: Path) -> Path:
    """``pip wheel`` of a copy of the project (the build writes ``*.egg-info`` and ``build/`` beside it)."""
    src = scratch / dist.name
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "setup.py", "long_description.py", "MANIFEST.in", "LICENSE"):
        if (dist.project / name).exists():
            shutil.copy(dist.project / name, src / name)
    shutil.copytree(dist.project / dist.package, src / dist.package,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    before = set(out.glob("*.whl"))
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(out), str(src)])
    (wheel,) = set(out.glob("*.whl")) - before
    return wheel


def closure(requirements: list[Requirement]) -> dict[str, md.Distribution]:
    """The installed distributions that ``requirements`` pull in, transitively, with their extras and
    markers evaluated as pip would on this interpreter."""
    found: dict[str, md.Distribution] = {}
    todo = [(r, "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name in FIRST_PARTY.values():
            continue  # built from this checkout, not repacked
        if name not in found:
            found[name] = md.distribution(name)
            todo.extend((Requirement(r), "") for r in found[name].requires or ())
        for wanted in req.extras:
            todo.extend((Requirement(r), wanted) for r in found[name].requires or ())
    return found


_INSTALLER_FILES = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def repack(dist: md.Distribution, out: Path) -> Path:
    """A wheel made from an installed distribution's files (its RECORD), so pip can install it offline.
    Console scripts are left out (pip writes them again from entry_points.txt); so are byte-code caches."""
    tags = [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")]
    py, abi, plat = (".".join(sorted({t.split("-")[i] for t in tags})) for i in range(3))
    name = canonicalize_name(dist.metadata["Name"]).replace("-", "_")
    wheel = out / f"{name}-{dist.version}-{py}-{abi}-{plat}.whl"
    records: list[str] = []
    info_dir = None
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for f in dist.files or ():
            rel = f.as_posix()
            if rel.startswith("..") or "__pycache__" in rel or rel.endswith(".pyc"):
                continue
            if rel.split("/")[0].endswith(".dist-info"):
                info_dir = rel.split("/")[0]
                if f.name in _INSTALLER_FILES:
                    continue
            data = Path(dist.locate_file(f)).read_bytes()
            zf.writestr(rel, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{rel},sha256={digest},{len(data)}")
        assert info_dir is not None, f"{dist.metadata['Name']}: no .dist-info in its RECORD"
        records.append(f"{info_dir}/RECORD,,")
        zf.writestr(f"{info_dir}/RECORD", "\n".join(records) + "\n")
    return wheel


def clean_env() -> dict[str, str]:
    """The environment for pip and the venv's programs: no PYTHONPATH (the checkout must not leak in), no
    pip configuration (this machine's points at local indexes)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def run(cmd: list[str], timeout: float = 300, **kw) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=kw.pop("env", clean_env()), timeout=timeout,
                          **kw)
    assert proc.returncode == 0, (f"{' '.join(cmd)} exited {proc.returncode}:\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def make_venv(where: Path, wheels: list[Path], wheelhouse: Path) -> Path:
    """A fresh venv (no pip of its own, no system site-packages) with ``wheels`` installed by this
    environment's pip, dependencies from ``wheelhouse`` only; returns its python."""
    venv.EnvBuilder(with_pip=False, clear=True, symlinks=True).create(where)
    python = where / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "--no-cache-dir", "-q",
         "--find-links", str(wheelhouse), *map(str, wheels)], timeout=600)
    return python
