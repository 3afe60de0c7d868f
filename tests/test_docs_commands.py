"""The README and docs/*.md show commands that work as written.

Every command in a fenced ```bash / ```sh / ```shell / ```console block (console: the lines after a `$ ` prompt;
a trailing `\\` joins lines) is either one the test runs — cheap ones: the registry listings, `retinabench
targets`, `datasets --check` on data the tests have, Snakemake dry runs (`-n`), `--help`, the raw fixtures, the
settings' drift checks — or carries the tag `# not run by tests: <reason>`. An untagged command the test would not
run fails here, so a new snippet is either exercised or says why not. The run happens in one copy of the workflow
(`dry_run_workdir`), each document's commands in order (a fixtures command before the dry runs that read them).
"""
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED, run_in_copy

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELLS = ("bash", "sh", "shell", "console")
TAG = re.compile(r"#\s*not run by tests:\s*\S")
# What the test runs: cheap, read-only (apart from a fixtures folder in the copy) and offline.
RUNNABLE = [re.compile(p) for p in (
    r"^retinabench (encoders|tasks|datasets|targets)\b",
    r"^snakemake\b.*\s(-n|--dry-run|--dryrun)(\s|$)",
    r"\s--help(\s|$)",
    r"^python -m retinabench\.testing\.raw_fixtures \S+$",
    r"^python -m retinabench\.settings (schema|docs) --check$",
)]
README_MAX_BYTES = 10 * 1024


def shell_commands(path: Path) -> list[tuple[int, str]]:
    """``(line number, command)`` of every command in the file's shell blocks, continuation lines joined."""
    out, lang, pending, start = [], None, "", 0
    for n, line in enumerate(path.read_text().splitlines(), 1):
        fence = re.match(r"^\s*```\s*(\w*)", line)
        if fence:
            lang = (fence.group(1) or "plain") if lang is None else None
            continue
        if lang not in SHELLS:
            continue
        if lang == "console":
            if not (line.startswith("$ ") or pending):
                continue  # output shown under a prompt
            line = line[2:] if line.startswith("$ ") else line
        text = line.strip()
        if not pending and (not text or text.startswith("#")):
            continue
        start = start if pending else n
        if text.endswith("\\"):
            pending += text[:-1].rstrip() + " "
            continue
        out.append((start, pending + text))
        pending = ""
    return out


def _command_part(command: str) -> str:
    """The command without its trailing comment (a `#` that starts a word, outside quotes)."""
    quote = None
    for i, ch in enumerate(command):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or command[i - 1].isspace()):
            return command[:i].strip()
    return command.strip()


def classify(command: str) -> str:
    if TAG.search(command):
        return "tagged"
    body = _command_part(command)
    return "run" if any(p.search(body) for p in RUNNABLE) else "untagged"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_shell_command_is_run_or_says_why_not(doc):
    bad = [f"{doc.name}:{n}: {c}" for n, c in shell_commands(doc) if classify(c) == "untagged"]
    assert not bad, ("commands neither run by tests/test_docs_commands.py nor tagged `# not run by tests: "
                     "<reason>`:\n  " + "\n  ".join(bad))


def test_readme_is_a_front_door():
    readme = (REPO / "README.md").read_bytes()
    assert len(readme) <= README_MAX_BYTES, f"README.md is {len(readme)} bytes (at most {README_MAX_BYTES})"
    text = readme.decode()
    setup = text[text.index("## The two set-up commands"):]
    setup = setup[:setup.index("\n## ", 1)]
    block = re.search(r"```bash\n(.*?)```", setup, re.S).group(1)
    assert len([line for line in block.splitlines() if line.strip()]) == 2
    for heading in ("## A five-minute tour", "## Where to go next"):
        assert heading in text
    for link in re.findall(r"\]\((docs/[^)#]+)", text):  # every page the README links exists
        assert (REPO / link).is_file(), link


def test_the_classifier_and_the_extractor(tmp_path):
    assert classify("retinabench encoders") == "run"
    assert classify("snakemake --profile profiles/local -n   # dry run") == "run"
    assert classify("snakemake --profile profiles/local     # dry run: -n shows it") == "untagged"
    assert classify("snakemake --profile slurm all  # not run by tests: needs a cluster") == "tagged"
    assert classify("snakemake --profile slurm all  # not run by tests:") == "untagged"  # a reason is required
    assert classify("retinabench encoders | retinabench tasks") == "run"  # a real pipe runs as one
    doc = tmp_path / "probe.md"
    doc.write_text("```bash\n# comment\nsnakemake -n \\\n  all\n```\n```console\n$ retinabench tasks\nname\n```\n"
                   "```yaml\nkey: value\n```\n")
    assert shell_commands(doc) == [(3, "snakemake -n all"), (7, "retinabench tasks")]


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_runnable_commands_work_as_written(doc, dry_run_workdir):
    commands = [(n, c) for n, c in shell_commands(doc) if classify(c) == "run"]
    if not commands:
        pytest.skip(f"{doc.name} has no command the test runs")
    shared = dry_run_workdir.parent / "shared"  # config/tvhl.yaml reads ../shared/data
    if SHARED.is_dir() and not shared.exists():
        shared.symlink_to(SHARED)
    failures = []
    for n, command in commands:
        if "config/tvhl.yaml" in command and not SHARED.is_dir():
            continue  # the real data is absent here (tests needing it skip, and fail under CI)
        proc = run_in_copy(dry_run_workdir, ["bash", "-o", "pipefail", "-c", _command_part(command)])
        if proc.returncode != 0:
            failures.append(f"{doc.name}:{n}: {command}\n  exit {proc.returncode}: "
                            + (proc.stderr or proc.stdout)[-1500:].replace("\n", "\n    "))
    assert not failures, "\n".join(failures)
