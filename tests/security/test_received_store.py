"""A received store cannot make raykit read outside it, hang, or grow past what it records.

Names in ``manifest.json`` (file records, split names, the points' path) must be plain paths inside
the store; files are read only when they are regular files of their recorded size (never a FIFO, a
device or a symlink leading out); JSON records are bounded. Each case: one line naming the file.
"""

from __future__ import annotations

import json
import os
import resource

import pytest

from raykit.cli import main
from raykit.errors import StoreCorruptError
from raykit.store import open_store
from raykit.store.validate import validate_store

from .conftest import payload_files, replace_with, resign, secret_digest

pytestmark = pytest.mark.timeout(10, func_only=True)  # each case; not the shared fixtures


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, [line for line in (captured.out + captured.err).splitlines() if line.strip()]


@pytest.mark.parametrize("name", ["../secret", "/etc/passwd", "a/../../secret", "wds\\..\\x", "a\x00b"])
def test_manifest_names_outside_the_store_are_refused(received, name: str, capsys) -> None:
    store = received()
    rel = payload_files(store)[0]
    resign(store, lambda m: m["files"].__setitem__(name, m["files"].pop(rel)))
    with pytest.raises(StoreCorruptError, match=r"manifest.json: file name .* not a plain path"):
        open_store(store)
    code, lines = _cli(["validate", str(store)], capsys)
    assert code == 1 and len(lines) == 2 and "not a plain path inside the folder" in lines[0]
    assert secret_digest()[:12] not in "\n".join(lines)


@pytest.mark.parametrize("where", ["key", "record"])
def test_a_split_name_leading_out_is_refused(received, where: str) -> None:
    store = received("wds")
    if where == "key":
        resign(store, lambda m: m["splits"].__setitem__("../../x", m["splits"].pop("test")))
    else:
        resign(store, lambda m: m["splits"]["test"].__setitem__("name", "../../x"))
    with pytest.raises(StoreCorruptError, match="not a plain"):
        open_store(store)


@pytest.mark.parametrize("backend", ["zarr", "wds", "images"])
@pytest.mark.parametrize("kind", ["link-out", "fifo", "zero"])
def test_a_payload_file_replaced_by_a_link_fifo_or_device(received, backend: str, kind: str, capsys) -> None:
    """validate (plain and deep) and the reader refuse it at once; nothing outside is read."""
    store = received(backend)
    rel = payload_files(store)[0]
    replace_with(store / rel, kind, store.parent / "secret")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for deep in (False, True):
        problems = validate_store(store, deep=deep)
        assert any(rel in p for p in problems), problems
        assert secret_digest()[:12] not in "\n".join(problems)
    split = "train" if "train" in rel else "test"
    reader = open_store(store)
    with pytest.raises(StoreCorruptError, match=r"leads outside|FIFO|regular file"):
        if backend == "images":
            for name in reader.images(split):
                reader.read_image(name)
        for index in range(reader.splits[split].n_chunks):
            reader.read_chunk(split, index)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: no /dev/zero slurp


@pytest.mark.parametrize("what", ["manifest", "index"])
def test_metadata_as_fifo_or_device_is_refused(received, what: str) -> None:
    store = received()
    rel = "manifest.json" if what == "manifest" else "index.json"
    for kind in ("fifo", "zero"):
        if (store / rel).exists() or (store / rel).is_symlink():
            (store / rel).unlink()
        (store / rel).write_bytes(b"{}")
        replace_with(store / rel, kind, store.parent / "secret")
        with pytest.raises(StoreCorruptError):
            open_store(store)


@pytest.mark.parametrize("backend", ["zarr", "wds", "images"])
def test_deleted_chunk_with_its_entry_removed_fails_plain_validate(received, backend: str, capsys) -> None:
    store = received(backend)
    rel = payload_files(store)[0 if backend == "images" else -1]  # a file the split index names
    (store / rel).unlink()
    resign(store, lambda m: m["files"].pop(rel))
    problems = validate_store(store)
    assert problems and all(rel in p for p in problems), problems
    assert "expected an entry for" in problems[0]
    code, lines = _cli(["validate", str(store)], capsys)
    assert code == 1 and lines[0].startswith("FAIL ") and "expected an entry for" in lines[0]


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda m: m["files"]["index.json"].__setitem__("size", "big"), "expected a size in bytes"),
        (lambda m: m["files"]["index.json"].__setitem__("sha256", 5), "expected a hex sha256"),
        (lambda m: m.__setitem__("files", []), "expected 'files'"),
    ],
)
def test_malformed_file_records_give_one_line(received, edit, words: str, capsys) -> None:
    store = received()
    resign(store, edit)
    code, lines = _cli(["info", str(store)], capsys)
    assert code == 2 and len(lines) == 1 and words in lines[0] and "manifest.json" in lines[0], lines


def test_deep_nesting_and_huge_numbers_name_the_manifest(received, capsys) -> None:
    store = received()
    for text in ("[" * 100_000 + "]" * 100_000, '{"format": ' + "1" * 100_000 + "}"):
        (store / "manifest.json").write_text(text)
        code, lines = _cli(["info", str(store)], capsys)
        assert code == 2 and len(lines) == 1, lines
        assert "manifest.json: not valid JSON" in lines[0] and len(lines[0]) < 300


@pytest.mark.parametrize("backend", ["zarr", "wds", "images"])
def test_an_intact_store_still_validates(received, backend: str) -> None:
    assert validate_store(received(backend), deep=True) == []


def test_a_symlink_inside_the_store_pointing_inside_is_followed(received) -> None:
    store = received()
    rel = payload_files(store)[0]
    moved = store / "moved.bin"
    os.rename(store / rel, moved)
    os.symlink(moved, store / rel)
    assert validate_store(store) == []
    assert json.loads((store / "manifest.json").read_text())["files"][rel]


def test_a_store_being_written_is_named_by_its_writer(tmp_path, capsys) -> None:
    """While a writer holds ``DST.lock``: "being written by pid N", not "an interrupted write"."""
    from raykit.locks import store_lock

    dst = tmp_path / "store"
    (tmp_path / "store.partial").mkdir()
    with store_lock(dst):
        code, lines = _cli(["info", str(dst)], capsys)
        assert code == 2 and len(lines) == 1, lines
        assert f"being written by pid {os.getpid()}" in lines[0] and "interrupted" not in lines[0]
    code, lines = _cli(["info", str(dst)], capsys)
    assert code == 2 and "an interrupted write; rerun it to resume" in lines[0]
