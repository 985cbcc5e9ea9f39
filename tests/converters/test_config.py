"""``ConvertConfig``: the convert command's flags come from its fields and map onto ``convert``."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from pathlib import Path

import pytest

from raykit.converters import convert
from raykit.converters.config import ConvertConfig
from raykit.options import add_arguments, from_args
from raykit.store import StoreSpec


def _parse(argv: list[str]) -> ConvertConfig:
    parser = argparse.ArgumentParser(prog="raykit convert")
    add_arguments(parser, ConvertConfig)
    config: ConvertConfig = from_args(ConvertConfig, parser.parse_args(argv))
    return config


def test_convert_takes_the_config_fields_as_keywords(tmp_path: Path) -> None:
    """One way to pass options: ``convert``'s keywords are ``ConvertConfig``'s fields with its defaults
    (but ``progress``), not listed again in its signature; a config runs as
    ``**config.convert_options()``; a keyword that is no field is refused, and so is a config given as
    a third positional argument."""
    from raykit.testing import render_scene, write_blender

    write_blender(render_scene("tiny", seed=0), tmp_path / "cap")
    config = ConvertConfig(backend="wds", chunk_rays=512, progress=False)
    by_config = convert(tmp_path / "cap", tmp_path / "a", **config.convert_options())
    by_keywords = convert(tmp_path / "cap", tmp_path / "b", backend="wds", chunk_rays=512)
    assert by_config.fingerprint == by_keywords.fingerprint and by_config.backend == "wds"
    assert by_config.manifest["layout"]["chunk_rays"] == 512
    with pytest.raises(TypeError, match="chunk_size"):
        convert(tmp_path / "cap", tmp_path / "c", chunk_size=512)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="positional"):
        convert(tmp_path / "cap", tmp_path / "c", config)  # type: ignore[misc]
    with pytest.raises(TypeError, match="profile"):
        convert(tmp_path / "cap", tmp_path / "c", profile=True)  # the command's, not convert()'s
    # Each option is written once, in ConvertConfig: convert() names none of them again.
    named = set(inspect.signature(convert).parameters)
    assert named == {"src", "dst", "poses", "allow_outside", "options"}
    assert not (named & {f.name for f in dataclasses.fields(ConvertConfig)} - {"src", "dst"})


def test_store_options_carry_the_codec_in_every_layout() -> None:
    options = ConvertConfig(layout="images", rgba_codec="zstd").store_options()
    assert options["layout"] == "images" and options["rgba_codec"] == "zstd"
    options, spec = ConvertConfig().store_options(), StoreSpec()  # one default for each option
    assert options == {"layout": spec.kind, **{k: getattr(spec, k) for k in options if k != "layout"}}


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
