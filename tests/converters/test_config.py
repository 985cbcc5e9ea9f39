"""``ConvertConfig``: the convert command's flags come from its fields and map onto ``convert``."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

from raykit.converters import convert
from raykit.converters.config import ConvertConfig, add_arguments, from_args


def _parse(argv: list[str]) -> ConvertConfig:
    parser = argparse.ArgumentParser(prog="raykit convert")
    add_arguments(parser)
    return from_args(parser.parse_args(argv))


def test_every_convert_keyword_is_a_field_and_defaults_match() -> None:
    keywords = {
        name: p.default
        for name, p in inspect.signature(convert).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
        and name not in ("poses", "allow_outside")  # flags of their own
    }
    config = ConvertConfig()
    options = config.convert_options()
    assert set(options) == set(keywords)
    differ = {k for k in keywords if options[k] != keywords[k]}
    # The command shows progress bars and passes its split rule as text; the library is quiet by default.
    assert differ == {"progress", "split"} and config.split == "auto"


def test_flags_round_trip() -> None:
    config = _parse(
        ["cap", "out", "--from", "blender", "--format", "wds", "--downscale", "2", "--workers", "3",
         "--skip-missing", "--near", "0.5", "--rgba-codec", "zstd", "--no-progress", "--profile"]
    )  # fmt: skip
    assert config == ConvertConfig(
        src="cap", dst="out", source="blender", backend="wds", downscale=2, workers=3, skip_missing=True,
        near=0.5, rgba_codec="zstd", progress=False, profile=True,
    )  # fmt: skip
    assert _parse(["cap", "out"]) == ConvertConfig(src="cap", dst="out")
    fields = {f.name for f in dataclasses.fields(ConvertConfig)}
    assert {"src", "dst", "profile"} <= fields


@pytest.mark.parametrize(
    "argv", [["a", "b", "--workers", "2", "--scheduler", "tcp://x:1"], ["a", "b", "--format", "tar"]]
)
def test_invalid_combinations_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(argv)
