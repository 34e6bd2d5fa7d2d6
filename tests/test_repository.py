"""The repository stands alone: a user who clones it has no folder beside it, so no tracked file
may send a reader to one (the developers' shared notes lived in a folder beside it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = "../" + "shared"  # spelled in two parts so this file does not name it itself


def test_no_tracked_file_points_outside_the_repository():
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "README.md" in tracked
    pointing = []
    for name in tracked:
        path = ROOT / name
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        pointing += [
            f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1) if OUTSIDE in line
        ]
    assert pointing == [], "files that point outside the repository: " + ", ".join(pointing)


def test_licence_citation_and_changelog_agree_with_the_package():
    import tomllib

    import yaml

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    licence = (ROOT / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    assert "END OF TERMS AND CONDITIONS" in licence
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["license"] == project["license"]
    assert citation["version"] == project["version"]
    import robusttune

    assert robusttune.__version__ == project["version"]
    assert {"title", "authors", "message"} <= set(citation)
    assert all(r["title"] and r["authors"] for r in citation["references"])
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"({project['version']})" in changelog or f"[{project['version']}]" in changelog
