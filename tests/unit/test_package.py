"""The package imports and reports a version that matches its metadata."""

import configparser
from pathlib import Path

import dslide


def test_version_matches_setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    assert dslide.__version__ == cfg["metadata"]["version"]
