"""Atomic writes with a temporary name of their own: every writer of the package writes beside its destination,
then renames over it (``os.replace``, atomic within one file system), so a reader sees the old file or the new one,
never half of either.

The temporary name is unique per writer: ``<destination>.<host>.<pid>.<random>.tmp``, in the destination's folder.
Two writers of one destination (two jobs, or two checkouts on one results folder; issue 23, fault 3) never write
into, rename or delete each other's temporary file. Who removes what:

* a writer that fails removes its own temporary file (:func:`atomic_path`, :func:`atomic_folder`);
* a writer that is killed (SIGKILL, a node lost) leaves it. :func:`temp_files` lists a destination's temporary
  files with their writer; the stage runner (``retinabench.pipeline.job.remove_leftovers``) removes those of the
  job's own process and of writers known to be gone (this host, pid no longer running) and names the others (a
  live writer here, or another host: nothing here can tell whether that one still writes), never removing them.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from glob import escape
from pathlib import Path

TEMP_SUFFIX = ".tmp"
_TEMP_NAME = re.compile(r"^(?P<dest>.+)\.(?P<host>[A-Za-z0-9_-]+)\.(?P<pid>\d+)\.(?P<token>[0-9a-f]{8})\.tmp$")


def host_name() -> str:
    """This machine's short host name, reduced to ``[A-Za-z0-9_-]`` (it is part of a file name)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0]) or "host"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (a process of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def temp_path(dest: str | os.PathLike) -> Path:
    """A temporary name for ``dest`` that no other writer uses: ``<dest>.<host>.<pid>.<random>.tmp``."""
    dest = Path(dest)
    return dest.with_name(f"{dest.name}.{host_name()}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


@contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``dest`` to write; renamed over ``dest`` when the block ends, removed when it
    fails (a killed writer never leaves a half-written file under the final name)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(dest)
    try:
        yield tmp
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(dest: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """``write(tmp)``, then rename over ``dest`` (see :func:`atomic_path`)."""
    with atomic_path(dest) as tmp:
        write(tmp)
    return Path(dest)


def write_text_atomic(dest: str | os.PathLike, text: str) -> Path:
    return atomic_write(dest, lambda tmp: tmp.write_text(text))


@contextmanager
def atomic_folder(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder beside ``dest`` to fill; it replaces ``dest`` when the block ends (an old ``dest``
    is removed just before the rename) and is removed when the block fails."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(dest)
    tmp.mkdir()
    try:
        yield tmp
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@dataclass(frozen=True)
class TempFile:
    """A temporary file (or folder) of :func:`temp_path` and the writer its name records."""
    path: Path
    host: str
    pid: int

    def mine(self) -> bool:
        return self.host == host_name() and self.pid == os.getpid()

    def writer_gone(self) -> bool:
        """Written on this host by a process that no longer runs (killed): nobody will rename it."""
        return self.host == host_name() and not pid_alive(self.pid)

    def writer(self) -> str:
        return f"pid {self.pid} on {self.host}"

    def remove(self) -> None:
        if self.path.is_dir():
            shutil.rmtree(self.path)
        else:
            self.path.unlink(missing_ok=True)


def temp_files(dest: str | os.PathLike) -> list[TempFile]:
    """The temporary files of ``dest`` in its folder, whoever wrote them."""
    dest = Path(dest)
    out = []
    for p in sorted(dest.parent.glob(f"{escape(dest.name)}.*{TEMP_SUFFIX}")):
        m = _TEMP_NAME.match(p.name)
        if m and m["dest"] == dest.name:
            out.append(TempFile(p, m["host"], int(m["pid"])))
    return out
