"""The docs against the code: docs/settings.md and docs/commands.md are what `fleetpulse reference` writes from the
settings classes and the commands' parsers (every setting and flag there, none that is not), and every setting, flag,
file and function the README and the other docs name exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fleetpulse import reference
from tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
WRITTEN = {REPO / "docs" / name for name in reference.files()}
# Variables read outside the settings classes: the dev script, CI, the test suite, the benches, the broker's jar
# fetch (before any settings load), and Grafana's provisioning (Grafana reads those itself).
OUTSIDE = "\n".join(p.read_text() for p in [REPO / "dev", REPO / ".ci" / "run", REPO / "tests" / "conftest.py",
                                             REPO / "fleetpulse" / "broker.py",
                                             REPO / "compose.yaml", *(REPO / "bench").glob("*.py"),
                                             *(REPO / "deploy" / "grafana").rglob("*.yaml")])


@pytest.mark.parametrize("name", sorted(reference.files()))
def test_the_reference_docs_are_what_the_code_writes(name):
    assert (REPO / "docs" / name).read_text() == reference.files()[name], \
        f"docs/{name} is stale: run `./dev fleetpulse reference`"


def test_every_setting_is_in_the_reference():
    text = reference.files()["settings.md"]
    assert all(f"`{env}`" in text for env in reference.env_names() if env.startswith("FLEETPULSE_"))


@pytest.mark.parametrize("doc", [d for d in DOCS if d not in WRITTEN], ids=lambda d: d.name)
def test_every_setting_a_doc_names_exists(doc):
    known = reference.env_names()
    named = set(re.findall(r"\bFLEETPULSE_[A-Z0-9_]*[A-Z0-9]\b", doc.read_text()))
    missing = {n for n in named if n not in known and not re.search(rf"\b{n}\b", OUTSIDE)}
    assert not missing, f"{doc.name} names settings the code does not read: {sorted(missing)}"


@pytest.mark.parametrize("doc", [d for d in DOCS if d not in WRITTEN], ids=lambda d: d.name)
def test_every_flag_a_doc_gives_a_command_exists(doc):
    flags = reference.flags()
    wrong = []
    for cmd, rest in re.findall(r"(?:\./dev|fleetpulse) ([a-z]+)((?: [^`\n|]*)?)", doc.read_text()):
        if cmd not in flags:
            continue  # `./dev test` (pytest's flags), prose ("fleetpulse reads ...")
        wrong += [f"fleetpulse {cmd} {f}" for f in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest)
                  if f not in flags[cmd]]
    assert not wrong, f"{doc.name} gives flags the commands do not take: {sorted(set(wrong))}"


# A path in the tree, as the docs write them (`streams/runtime/lane.py`, streams/lifecycle/, bench/fleet_scale.py);
# what the benches write under bench/results/ is not in a clean clone.
PATH = re.compile(r"(?<![\w/.-])((?:agents|streams|sinks|schemas|bots|core|fleetpulse|tests|bench|deploy|docs|\.ci)"
                  r"/[\w./-]*[\w/])")
# A function or class in a module: `streams/runtime/lane.py: run_step`, `sinks/store.py: Store.insert`.
DEFINED = re.compile(r"`([\w/]+\.py): ([A-Za-z_][\w.]*)`")


def defined(module: Path, dotted: str) -> bool:
    """Whether `dotted` (a name, or Class.member) is defined at the top of `module` (a def, class or assignment)."""
    body = ast.parse(module.read_text()).body
    for part in dotted.split("."):
        found = None
        for node in body:
            names = ([node.name] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else
                     [t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)])
            if part in names:
                found = node
                break
        if found is None:
            return False
        body = getattr(found, "body", [])
    return True


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_file_and_function_a_doc_names_exists(doc):
    text = doc.read_text()
    missing = sorted({p for p in PATH.findall(text)
                      if not p.startswith("bench/results/") and not (REPO / p.rstrip("/")).exists()})
    assert not missing, f"{doc.name} names files that are not in the tree: {missing}"
    undefined = sorted({f"{path}: {name}" for path, name in DEFINED.findall(text)
                        if not (REPO / path).is_file() or not defined(REPO / path, name)})
    assert not undefined, f"{doc.name} names functions or classes its module does not define: {undefined}"
