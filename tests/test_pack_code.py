"""``trainctl submit``'s code archive (``code_archive.pack_code``): what goes in, what never does, what it refuses."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from trainctl.cluster import JobError
from trainctl.code_archive import pack_code


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def members(archive: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def pack(directory: Path) -> bytes:
    """The archive pack_code writes; the names it returns are exactly its members (submit checks the script
    against them)."""
    out = io.BytesIO()
    names = pack_code(directory, out)
    assert sorted(names) == sorted(members(out.getvalue()))
    return out.getvalue()


SOURCES = {
    "train.py": "print('train')\n",
    "pkg/__init__.py": "",
    "pkg/model.py": "MODEL = 1\n",
    "configs/base.yaml": "lr: 0.1\n",
}


def test_the_archive_holds_the_regular_files_by_relative_path_and_nothing_else(tmp_path: Path) -> None:
    write(tmp_path, SOURCES)
    write(
        tmp_path,
        {  # always left out, with or without a .gitignore, at any depth
            ".git/config": "[core]\n",
            "pkg/.git/HEAD": "ref: refs/heads/main\n",
            ".venv/bin/activate": "# venv\n",
            "node_modules/left-pad/index.js": "module.exports = 1\n",
            "pkg/__pycache__/model.cpython-311.pyc": "bytecode",
            "stale.pyc": "bytecode",
        },
    )
    (tmp_path / "link.py").symlink_to(tmp_path / "train.py")  # symlinks: neither a file link nor a folder link
    (tmp_path / "linked-pkg").symlink_to(tmp_path / "pkg", target_is_directory=True)
    found = members(pack(tmp_path))
    assert sorted(found) == sorted(SOURCES)
    assert all(m.isfile() for m in found.values())
    with tarfile.open(fileobj=io.BytesIO(pack(tmp_path)), mode="r:gz") as tar:
        extracted = tar.extractfile("pkg/model.py")
        assert extracted is not None and extracted.read().decode() == SOURCES["pkg/model.py"]


def test_gitignore_patterns_leave_out_files_and_folders_as_git_does(tmp_path: Path) -> None:
    write(tmp_path, SOURCES)
    write(
        tmp_path,
        {
            ".gitignore": "# outputs\n\n*.log\ndata/  \n/build\nconfigs/secret.yaml\ndocs/*.md\n",
            "run.log": "loss 1\n",
            "pkg/debug.log": "loss 2\n",
            "data/train.csv": "1,2\n",
            "pkg/data/val.csv": "3,4\n",
            "build/out.bin": "x",
            "configs/secret.yaml": "key: x\n",
            "docs/index.md": "# docs\n",
        },
    )
    # What git keeps although a line seems to name it: "/build" is anchored (not pkg/build), "data/" names
    # folders only (not a file called data), "docs/*.md" does not reach into docs/api/.
    kept = {"pkg/build/gen.py": "x = 1\n", "configs/data": "a file\n", "docs/api/ref.md": "# ref\n"}
    write(tmp_path, kept)
    assert sorted(members(pack(tmp_path))) == sorted([*SOURCES, ".gitignore", *kept])


def test_a_negated_pattern_brings_a_file_back_but_never_an_always_skipped_one(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            **SOURCES,
            ".gitignore": "*.log\n!keep.log\n!*.pyc\n",
            "keep.log": "kept\n",
            "drop.log": "dropped\n",
            "stale.pyc": "bytecode",
        },
    )
    assert sorted(members(pack(tmp_path))) == sorted([*SOURCES, ".gitignore", "keep.log"])


def test_a_negated_pattern_reaches_into_folders_its_patterns_exclude(tmp_path: Path) -> None:
    """git keeps sub/a.py with "*", "!*/", "!*.py" (only Python files) and foo/keep with "foo/**", "!foo/keep": the
    archive too: a folder the spec matches is not skipped whole, or the job would run without those files."""
    write(
        tmp_path,
        {
            ".gitignore": "\ufeff*\n!*/\n!*.py\nfoo/**\n!foo/keep\n",  # and a BOM, which git skips
            "a.py": "",
            "b.txt": "",
            "sub/a.py": "",
            "sub/b.txt": "",
            "foo/keep": "",
            "foo/drop": "",
        },
    )
    assert sorted(members(pack(tmp_path))) == ["a.py", "foo/keep", "sub/a.py"]


def test_a_missing_code_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(JobError) as refused:
        pack_code(tmp_path / "nowhere", io.BytesIO())
    assert (
        str(refused.value)
        == f"code directory {tmp_path / 'nowhere'} does not exist; give the folder that holds the training script"
    )


def test_a_code_path_that_is_a_file_is_refused_as_one(tmp_path: Path) -> None:
    """A file given as --code is named a file, not said not to exist."""
    (tmp_path / "train.py").write_text("print('training')\n")
    with pytest.raises(JobError) as refused:
        pack_code(tmp_path / "train.py", io.BytesIO())
    assert str(refused.value) == (
        f"code directory {tmp_path / 'train.py'} is a file, not a directory; give the folder that holds the training "
        "script"
    )
