"""Generated docs (flags.md; architecture.md's signal and sample tables) must match what the code says."""

import dataclasses
import importlib.util
import os

from sf_core.config import Config
from tests.conftest import REPO

FLAGS_MD = os.path.join(REPO, "docs", "flags.md")


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_docs", os.path.join(REPO, "scripts", "gen_docs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_flags_md() -> str:
    with open(FLAGS_MD, encoding="utf-8") as f:
        return f.read()


def test_flags_doc_is_up_to_date():
    assert read_flags_md() == load_generator().render(), (
        "docs/flags.md is out of date: run `python scripts/gen_docs.py`"
    )


def test_architecture_tables_match_signals_and_sample_schema():
    generator = load_generator()
    with open(generator.ARCHITECTURE, encoding="utf-8") as f:
        current = f.read()
    assert current == generator.render_architecture(current), (
        "docs/architecture.md's signal or sample table is out of date: run `python scripts/gen_docs.py`")


def test_every_flag_is_documented():
    text = read_flags_md()
    missing = [f.name for f in dataclasses.fields(Config) if f.metadata.get("cli", True) and f"`--{f.name}`" not in text]
    assert not missing, f"flags missing from docs/flags.md: {missing}"
