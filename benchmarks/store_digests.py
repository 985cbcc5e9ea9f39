"""Digest of every file of stores converted from the benchmark captures: run it with two checkouts on
``PYTHONPATH`` (or two thread counts) and compare the output to check that a change keeps store bytes.

    PYTHONPATH=. python benchmarks/store_digests.py --threads 1,2 > after.json
    PYTHONPATH=../base python benchmarks/store_digests.py --threads 1,2 > before.json

Captures: those ``bench_convert.py`` (``convert-realistic-0``, its ``-photo2`` variant) and
``bench_layouts.py`` (``images-realistic-jpeg``) leave under ``benchmarks/data``; a missing one is
skipped (``--size small``: the same captures of the ``small`` scene). Each case is converted into a
temporary folder; its digest is the SHA-256 of the sorted (path, file SHA-256) list of the whole store.
``COPIES`` are ``raykit copy`` runs from the first thread count's stores into another backend or
layout, digested the same way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data"
NGP = {"split": "every:8", "near": 0.5, "far": 8.0}
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("photo-rays-zarr", "convert-realistic-0-photo2", {"layout": "rays", "backend": "zarr"}),
    ("photo-rays-wds", "convert-realistic-0-photo2", {"layout": "rays", "backend": "wds"}),
    ("rgba-rays-zarr", "convert-realistic-0", {"layout": "rays", "backend": "zarr"}),
    ("jpeg-rays-zarr", "images-realistic-jpeg", {"layout": "rays", "backend": "zarr", **NGP}),
    ("jpeg-images-zarr", "images-realistic-jpeg", {"layout": "images", "backend": "zarr", **NGP}),
    ("jpeg-images-wds", "images-realistic-jpeg", {"layout": "images", "backend": "wds", **NGP}),
    ("png-images-zarr", "convert-realistic-0", {"layout": "images", "backend": "zarr"}),
]

# (name, converted case, backend, layout): ``copy_store`` of that case's store
COPIES: list[tuple[str, str, str, str]] = [
    ("photo-rays-zarr-to-wds", "photo-rays-zarr", "wds", "rays"),
    ("photo-rays-zarr-to-images", "photo-rays-zarr", "zarr", "images"),
    ("jpeg-images-zarr-to-wds", "jpeg-images-zarr", "wds", "images"),
    ("jpeg-images-wds-to-rays", "jpeg-images-wds", "zarr", "rays"),
]


def store_digest(root: Path) -> str:
    files = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="threads of the one worker, one conversion each")
    parser.add_argument("--size", default="realistic", help="the captures' scene size (their names' part)")
    args = parser.parse_args()
    import importlib

    import raykit
    from raykit.converters import convert

    try:
        from raykit.store import copy_store
    except ImportError:  # a checkout from before the store's one public face (issue 43)
        copy_store = importlib.import_module("raykit.store." + "writer").copy_store

    out: dict[str, Any] = {"raykit": raykit.__file__}
    with tempfile.TemporaryDirectory(prefix="store-digests-") as tmp:
        for name, capture, options in CASES:
            capture = capture.replace("realistic", args.size)
            if not (DATA / capture).exists():
                continue
            for i, threads in enumerate(int(t) for t in args.threads.split(",")):
                dst = Path(tmp) / f"{name}-{threads}"
                convert(DATA / capture, dst, threads=threads, **options)
                out[f"{name}-{threads}"] = store_digest(dst)
                if i:
                    shutil.rmtree(dst)
                else:
                    shutil.move(dst, Path(tmp) / name)
        for name, case, backend, layout in COPIES:
            if (Path(tmp) / case).exists():
                copy_store(Path(tmp) / case, Path(tmp) / name, backend=backend, layout=layout)
                out[f"copy-{name}"] = store_digest(Path(tmp) / name)
                shutil.rmtree(Path(tmp) / name)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
