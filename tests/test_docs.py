"""Generated docs (flags.md; architecture.md's signal and sample tables) must match what the code says, and
no doc may name a flag, module or file that does not exist."""

import argparse
import ast
import dataclasses
import glob
import importlib
import importlib.util
import os
import re
import sys
from unittest import mock

from sf_core.cli.arguments import build_parser
from sf_core.cli.parser import _Parser
from sf_core.cli.their_names import THEIR_NAMES
from sf_core.config import Config
from tests.conftest import REPO
from tests.layout import source_base

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


# --------------------------------------------------------------- names a doc mentions must exist
#
# A doc that names a flag, a module or a file sends its reader somewhere: when the thing is renamed
# or moved, the doc goes on sending them there. These checks find every such name in README.md and
# docs/*.md and fail on the ones the code no longer has.

DOCS = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))

# Entry points with parsers of their own (the trainer's flags are Config's fields).
TOOL_MODULES = ("sf_core.cli.enjoy", "sf_core.cli.evaluate", "sf_core.cli.export", "sf_core.cli.env_server",
                "sf_core.cli.fleet", "sf_core.cli.plot", "sf_core.cli.push_to_hub", "sf_core.cli.load_from_hub")
# Scripts whose command lines the docs quote. scripts/sf_launcher.py is left out: its flags are Sample Factory's.
TOOL_SCRIPTS = ("scripts/benchmark.py", "scripts/bench_env_service.py", "scripts/bench_learner.py",
                "scripts/bench_graph_overlap.py", "scripts/bench_offload.py", "scripts/bench_ray_calls.py",
                "scripts/bench_ray_return.py", "scripts/bench_sgd_step.py", "scripts/exploration_benchmark.py",
                "scripts/gen_docs.py", "scripts/memory_soak.py", "scripts/teacher_benchmark.py",
                "scripts/reproduce.py", "scripts/time_to_solve.py", "scripts/visualize_dfg.py",
                "scripts/worker_recovery.py", "scripts/chaos_soak.py", "tests/ray_cluster.py")

# Flags of other programs that the docs quote on purpose, by program. A flag of ours that a doc gets
# wrong is fixed in the doc, never added here.
OTHER_PROGRAMS = {
    # the cluster setup in README.md and docs/distributed.md
    "ray start": {"head", "address", "num-cpus", "num-gpus", "object-store-memory", "resources"},
    # README.md's quick start
    "tensorboard": {"logdir"},
    # docs/performance.md's baselines: `git worktree add --detach ../base COMMIT`
    "git worktree": {"detach"},
    # docs/multi_policy.md's table of Sample Factory 2's PBT flags that sf_core replaces
    "Sample Factory": {"pbt_mix_policies_in_one_env", "pbt_optimize_gamma", "pbt_replace_reward_gap_absolute"},
    # the README's and docs/flags.md's examples of the names the trainer answers with its own
    # (sf_core/cli/their_names.py), as Stable-Baselines3, CleanRL and RL-Zoo spell them
    "other trainers": {*THEIR_NAMES, *(name.replace("_", "-") for name in THEIR_NAMES)},
}
# A path given to these flags names a file the command writes, so it need not exist beforehand.
OUTPUT_FLAG = re.compile(r"--(?:output|plot)=$")

ROOTS = ("sf_core", "algo", "envs")  # algo and envs: the folders' names, never a module's (tests/layout.py)
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`\n]+(?:\n(?!\s*\n)[^`\n]*)*`")  # may wrap onto the next line of a paragraph
FLAG = re.compile(r"(?<![\w-])--([A-Za-z][\w-]*\w)")
MODULE_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(ROOTS)})(?:\.[A-Za-z_]\w*)+)")
FILE_PATH = re.compile(r"(?<![\w./-])((?:sf_core|algo|envs|scripts|tests|docs)/[\w./-]*)(?![\w./-])([*{<]?)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


class _Parsed(BaseException):
    """Raised in place of parsing: a BaseException, so a main() that turns errors into exit codes lets it by."""

    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__()
        self.parser = parser


def _parser_of(module) -> argparse.ArgumentParser:
    """The parser a tool parses its command line with: build_parser() where it has one, else the one its
    main() builds, taken from main() as it starts to parse (so nothing else of main() runs)."""
    if hasattr(module, "build_parser"):
        return module.build_parser()

    def stop(self, args=None, namespace=None):
        raise _Parsed(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_known_args", stop), \
            mock.patch.object(sys, "argv", [module.__name__]):
        try:
            module.main()
        except _Parsed as parsed:
            return parsed.parser
    raise AssertionError(f"{module.__name__}.main() returned without parsing a command line")


def _load_script(path: str):
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(f"_doc_check_{name}", os.path.join(REPO, path))
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    sys.modules[spec.name] = module  # a script's dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved  # scripts put their own folders first on the path; that must not outlive the load
        del sys.modules[spec.name]
    return module


def known_flags() -> set[str]:
    parsers = [build_parser()]
    parsers += [_parser_of(importlib.import_module(name)) for name in TOOL_MODULES]
    parsers += [_parser_of(_load_script(path)) for path in TOOL_SCRIPTS]
    names = {f.name for f in dataclasses.fields(Config)}
    names |= {flag for flags in OTHER_PROGRAMS.values() for flag in flags}
    for parser in parsers:
        flags = {option[2:] for action in parser._actions for option in action.option_strings
                 if option.startswith("--")}
        dashed = {f.replace("_", "-") for f in flags} if isinstance(parser, _Parser) else set()  # parse as the flag
        names |= flags | dashed
    return names


def resolves(dotted: str) -> bool:
    """A module, or an attribute reached from the longest prefix that is one (sf_core.algo.registry.register_algorithm)."""
    parts = dotted.split(".")
    if parts[0] != "sf_core":  # `algo.model` is the module sf_core.algo.model; from the repository root it
        return False           # would import as a second copy, which no user has
    try:
        for i in range(len(parts), 0, -1):
            try:
                found = importlib.util.find_spec(".".join(parts[:i])) is not None
            except ModuleNotFoundError as exc:
                if exc.name and exc.name.split(".")[0] in ROOTS:
                    continue  # a prefix is a module, not a package, so the longer name is no module
                raise
            if not found:
                continue
            target = importlib.import_module(".".join(parts[:i]))
            for attr in parts[i:]:
                if not hasattr(target, attr):
                    return False
                target = getattr(target, attr)
            return True
        return False
    except ImportError:  # an optional extra is not installed here: the source still says what a module defines
        return _defined_in_source(parts)


def _defined_in_source(parts: list[str]) -> bool:
    for i in range(len(parts), 0, -1):
        base = str(source_base(".".join(parts[:i])))
        for path in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(path):
                return i == len(parts) or parts[i] in _top_level_names(path)
    return False


def _top_level_names(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def _code_regions(text: str) -> list[tuple[int, str]]:
    """(offset, text) of every fenced block's body and every inline code span outside them."""
    regions, prose, fence_start, offset = [], [], None, 0
    for line in text.splitlines(keepends=True):
        if FENCE.match(line):
            if fence_start is None:
                fence_start = offset + len(line)
            else:
                regions.append((fence_start, text[fence_start:offset]))
                fence_start = None
        elif fence_start is None:
            prose.append((offset, line))
        offset += len(line)
    # spans are searched over the prose with fenced blocks blanked out, so offsets stay those of the doc
    blanked = [" "] * len(text)
    for start, line in prose:
        blanked[start:start + len(line)] = line
    for m in CODE_SPAN.finditer("".join(blanked)):
        regions.append((m.start(), m.group()))
    return regions


def _is_path(name: str, in_code: bool) -> bool:
    """In prose a word pair such as `envs/worker` (a table's "envs per worker") is no path; in code, or with a
    file extension or more than one folder, it is."""
    return in_code or "." in os.path.basename(name) or name.count("/") > 1 or name.endswith("/")


def doc_offenders(path: str, flags: set[str], env_ids: set[str]) -> list[str]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    rel = os.path.relpath(path, REPO)
    found = set()
    in_code = bytearray(len(text))

    def line_of(offset: int) -> int:
        return text.count("\n", 0, offset) + 1

    for start, region in _code_regions(text):
        in_code[start:start + len(region)] = b"\1" * len(region)
        for m in FLAG.finditer(region):
            if m.group(1) not in flags:
                found.add((line_of(start + m.start()), f"flag --{m.group(1)}"))
    for m in MODULE_PATH.finditer(text):
        if m.group(1) in ("algo.py", "envs.py"):  # a user's own file of that name, which ours never shadow
            continue
        if not resolves(m.group(1)):
            found.add((line_of(m.start()), f"module {m.group(1)}"))
    for m in FILE_PATH.finditer(text):
        name = m.group(1).rstrip(".-")
        if m.group(2) or name in env_ids or OUTPUT_FLAG.search(text, max(0, m.start() - 10), m.start()):
            continue  # a pattern (tests/test_*.py), an env id (sf_core/MemoryCue-v0), or a command's output
        if _is_path(name, bool(in_code[m.start()])) and not os.path.exists(os.path.join(REPO, name)):
            found.add((line_of(m.start()), f"file {name}"))
    for m in LINK.finditer(text):
        target = m.group(1).split("#")[0]
        if target and "://" not in target and not target.startswith("mailto:") \
                and not os.path.exists(os.path.join(os.path.dirname(path), target)):
            found.add((line_of(m.start()), f"link {m.group(1)}"))
    return [f"{rel}:{line} {what}" for line, what in sorted(found)]


def test_docs_name_only_what_exists():
    import sf_core.envs  # noqa: F401  (registers the built-in envs, whose ids look like paths: sf_core/MemoryCue-v0)
    import gymnasium

    flags = known_flags()
    offenders = [o for path in DOCS for o in doc_offenders(path, flags, set(gymnasium.registry))]
    assert not offenders, "the docs name flags, modules or files that do not exist:\n" + "\n".join(offenders)
