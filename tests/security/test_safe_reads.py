"""``raykit.fileio``'s readers of received folders: names stay inside, only regular files of the
recorded size are read, JSON records are bounded; every refusal names the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raykit.fileio import UntrustedFileError, loads_json, open_regular, read_bounded, read_json, safe_path

pytestmark = pytest.mark.timeout(10, func_only=True)  # each case; not the shared fixtures


@pytest.mark.parametrize(
    "name", ["", ".", "..", "../x", "a/../../x", "/etc/passwd", "a//b", "a\\b", "a\x00", 5, None]
)
def test_names_that_are_not_plain_paths_inside(tmp_path: Path, name: object) -> None:
    with pytest.raises(UntrustedFileError, match=str(tmp_path)):
        safe_path(tmp_path, name)


def test_symlinks_are_followed_only_inside(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "real").write_bytes(b"x")
    (tmp_path / "outside").write_bytes(b"y")
    os.symlink(folder / "sub" / "real", folder / "inside-link")
    os.symlink(tmp_path / "outside", folder / "out-link")
    os.symlink(tmp_path, folder / "sub" / "dir-out")
    os.symlink("loop", folder / "loop")
    assert safe_path(folder, "inside-link") == folder.resolve() / "inside-link"
    assert safe_path(folder, "sub/real").read_bytes() == b"x"
    for name in ("out-link", "sub/dir-out/outside"):
        with pytest.raises(UntrustedFileError, match="leads outside the folder"):
            safe_path(folder, name)
    with pytest.raises(UntrustedFileError):
        safe_path(folder, "loop")


def test_only_regular_files_are_opened_and_a_fifo_does_not_block(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    for path, words in (
        (tmp_path / "fifo", "a FIFO"),
        ("/dev/zero", "a character device"),
        (tmp_path, "a directory"),
    ):
        with pytest.raises(UntrustedFileError, match=words):
            open_regular(path)
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "missing")


def test_the_size_is_checked_before_reading_and_never_read_past(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    assert read_bounded(path, size=10) == b"0123456789"
    assert read_bounded(path, limit=10) == b"0123456789"
    with pytest.raises(UntrustedFileError, match="10 bytes, expected 4 as recorded"):
        read_bounded(path, size=4)
    with pytest.raises(UntrustedFileError, match="more than the 4 accepted"):
        read_bounded(path, limit=4)
    with open_regular(path, size=10) as handle:  # grows after the check: the reader stops at the record
        with open(path, "ab") as grow:
            grow.write(b"more")
        assert handle.read(10) == b"0123456789"


@pytest.mark.parametrize(
    "text, words",
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deep"),
        ("[" * 65 + "]" * 65, "nested more than 64 deep"),
        ("1" * 100_000, "a number of 100000 characters"),
        ("1." + "5" * 500, "a number of 502 characters"),
        ('{"a": NaN}', "NaN is not JSON"),
        ('{"a": ', "not valid JSON"),
        (b"\xff\xfe{", "not valid JSON"),
    ],
)
def test_json_records_are_bounded_and_name_the_file(text: str | bytes, words: str) -> None:
    with pytest.raises(UntrustedFileError, match=f"^rec.json: .*{words}"):
        loads_json(text, "rec.json")


def test_json_within_bounds_parses_and_read_json_names_the_file(tmp_path: Path) -> None:
    assert loads_json('{"a": [1, 2.5, -3e2, "x"], "b": null}', "r") == {"a": [1, 2.5, -300.0, "x"], "b": None}
    (tmp_path / "r.json").write_text("[" * 70 + "]" * 70)
    with pytest.raises(UntrustedFileError, match=f"^{tmp_path / 'r.json'}: "):
        read_json(tmp_path / "r.json")
    with pytest.raises(UntrustedFileError, match="more than the 8 accepted"):
        read_json(tmp_path / "r.json", limit=8)
