"""Record what a vLLM release's source has of the adapter's contract, for a release with no CPU build.

    python scripts/vllm_static_table.py [RELEASE]      (default: the newest in contract.STATIC)

Fetches the release's x86_64 wheel once into .cache/vllm-wheel (``pip download --no-deps --only-binary
:all:``, ~340 MB: the sdist cannot be fetched by pip without preparing its metadata, which needs the
release's build environment), reads its Python files with ``contract.SourceTree`` (``ast``, nothing
imported) and writes ``tests/vllm/data/vllm-static-<release>.json``: per contract entry whether the
source has it, and a method's parameters; with the wheel's name and sha256.
``tests/vllm/test_vllm_contract.py`` checks the contract against that record (CI never downloads the wheel).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from otel_llm.instrumentation.vllm import contract  # noqa: E402

CACHE = os.path.join(ROOT, ".cache", "vllm-wheel")
DATA = os.path.join(ROOT, "tests", "vllm", "data")


def wheel(release: str, fetch: bool = True) -> str | None:
    """The cached x86_64 wheel of ``release`` (fetched first if absent and ``fetch``)."""
    pattern = os.path.join(CACHE, f"vllm-{release}-*x86_64.whl")
    if not glob.glob(pattern) and fetch:
        os.makedirs(CACHE, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", f"vllm=={release}", "--no-deps",
                        "--only-binary", ":all:", "--platform", "manylinux_2_28_x86_64", "--python-version",
                        "3.11", "-d", CACHE], check=True)
    found = glob.glob(pattern)
    return found[0] if found else None


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def extract_python(path: str, into: str) -> str:
    """The wheel's ``vllm/**.py`` under ``into``, the folder it returns (holding the ``vllm`` package)."""
    with zipfile.ZipFile(path) as z:
        z.extractall(into, [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")])
    return into


def table(root: str) -> dict[str, dict]:
    tree = contract.SourceTree(root)
    out = {}
    for e in contract.ENTRIES:
        why = tree.missing(e)
        row: dict = {"present": why is None}
        if why:
            row["why"] = why
        if e.params:
            row["signature"] = tree.signature(e)
        out[e.key] = row
    return out


def main(release: str) -> int:
    path = wheel(release)
    if path is None:
        print(f"no wheel of vllm {release}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        rows = table(extract_python(path, tmp))
    record = {"release": release, "wheel": os.path.basename(path), "sha256": sha256(path), "entries": rows}
    os.makedirs(DATA, exist_ok=True)
    out = os.path.join(DATA, f"vllm-static-{release}.json")
    with open(out, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    missing = {k: r["why"] for k, r in rows.items() if not r["present"]}
    print(f"{out}: {len(rows)} entries, missing {missing or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else contract.STATIC[-1]))
