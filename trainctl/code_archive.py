"""The code archive of a job: a gzipped tarball of the code directory, minus what its ``.gitignore`` leaves out."""

from __future__ import annotations

import os
import posixpath
import tarfile
from pathlib import Path
from typing import IO, Optional

import pathspec

from trainctl.cluster import JobError

ALWAYS_SKIPPED = (".git", "__pycache__", "*.pyc", ".venv", "node_modules")


def pack_code(directory: Path, out: IO[bytes]) -> list[str]:
    """Write to ``out`` a gzipped tarball of ``directory`` (relative paths, regular files only), minus what its
    ``.gitignore`` leaves out (git's rules, by pathspec; nested ``.gitignore`` files are not read) and
    ``ALWAYS_SKIPPED``; returns the members' names. A file that cannot be read is a one-line :class:`JobError`
    naming it.
    """
    if not directory.is_dir():
        what = "is a file, not a directory" if directory.exists() else "does not exist"
        raise JobError(f"code directory {directory} {what}; give the folder that holds the training script")
    try:
        return _pack(directory, out)
    except UnicodeDecodeError as exc:
        raise JobError(f"{directory / '.gitignore'}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise JobError(f"{exc.filename}: cannot read it for the code archive ({exc.strerror})") from None


def _pack(directory: Path, out: IO[bytes]) -> list[str]:
    always = pathspec.GitIgnoreSpec.from_lines(ALWAYS_SKIPPED)  # a "!" line of the .gitignore cannot bring them back
    gitignore = directory / ".gitignore"
    ignored = pathspec.GitIgnoreSpec.from_lines(
        gitignore.read_text(encoding="utf-8-sig").splitlines() if gitignore.is_file() else []  # git skips a BOM
    )
    # A folder is skipped whole only when no "!" line could bring back a file in it; otherwise each of its files
    # is matched on its own (git itself keeps out a file whose folder is excluded: then this archive holds more).
    negated = any(pattern.include is False for pattern in ignored.patterns)

    def left_out(rel: str) -> bool:
        return always.match_file(rel) or ignored.match_file(rel)

    def skipped_folder(rel: str) -> bool:
        return always.match_file(rel) or (not negated and ignored.match_file(rel))

    names: list[str] = []
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for root, dirs, files in os.walk(directory):
            rel_root = Path(root).relative_to(directory).as_posix()
            prefix = "" if rel_root == "." else rel_root + "/"
            dirs[:] = sorted(d for d in dirs if not skipped_folder(f"{prefix}{d}/"))
            for name in sorted(files):
                path = Path(root) / name
                if path.is_file() and not path.is_symlink() and not left_out(prefix + name):
                    tar.add(path, arcname=prefix + name, recursive=False)
                    names.append(prefix + name)
    return names


NOT_PACKED = "not there, left out by .gitignore or always skipped, or a symbolic link: links are left out"


class NotInArchive(JobError):
    """A script the job runs is not in its code archive; ``key``: the job's key that names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def check_script(argv: list[str], names: list[str], directory: Path) -> None:
    """A one-line :class:`NotInArchive` unless the command's script (``argv[0]``, the parsed command; a ``-m``
    module is not checked) is a member of the code archive: else a billed node would boot only to fail."""
    if argv[0] == "-m":
        return
    if posixpath.normpath(argv[0]) not in names:
        raise NotInArchive(
            "command", f"the command's script {argv[0]} is not in the code archive of {directory} ({NOT_PACKED})"
        )


def check_setup(setup: Optional[str], names: list[str], directory: Path) -> None:
    """A one-line :class:`NotInArchive` unless the job's setup script (if any) is a member of the code archive:
    else every node would boot only to fail its setup."""
    if setup is not None and posixpath.normpath(setup) not in names:
        raise NotInArchive(
            "setup", f"setup: {setup} is not in the code archive of {directory} ({NOT_PACKED}); add it or fix the path"
        )
