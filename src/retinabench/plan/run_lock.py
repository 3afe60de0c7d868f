"""One writer per results folder (issue 23, fault 3): the run lock lives in the results folder itself.

Snakemake's own lock is in the checkout's ``.snakemake/`` (per working directory, and per output file): a second
checkout, or another host, pointed at the same ``results:`` does not see it, and its jobs delete and rewrite the
first run's outputs. ``<results>/.retinabench.lock`` is seen by every checkout and every host sharing the file
system. It is created atomically (``O_CREAT | O_EXCL``) and records who holds it: host, pid, checkout, start time
and command.

* Taken by the Snakefile's ``onstart`` handler: only the main Snakemake process of a run that executes jobs calls it.
  Remote / Slurm jobs (spawned with ``--no-hooks --nolock``), dry runs (``-n``: Snakemake takes no lock either),
  ``--lint``, ``--report``, listing commands and a run with nothing to do take no lock; a dry run on a locked
  folder prints who holds it. ``--nolock`` skips it, as it skips Snakemake's lock.
* Released by ``onsuccess`` and ``onerror``, and at interpreter exit as the fallback (an exception before the
  scheduler reports); only by the process that took it.
* A killed run leaves it. The next run is refused with the holder named: on this host with its pid gone, the lock
  is said to be stale; from another host nothing here can tell, and the host is named. ``snakemake --unlock``
  (same ``--configfile``) removes it together with Snakemake's own lock.
"""
from __future__ import annotations

import atexit
import datetime as _dt
import json
import os
import secrets
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from retinabench.atomic import host_name, pid_alive

LOCK_NAME = ".retinabench.lock"
UNLOCK_FLAG = "--unlock"
UNLOCK_HINT = "`snakemake --unlock` (with the same --configfile)"


class RunLockError(RuntimeError):
    """The results folder is locked by another run (the message names the holder and how to clear a stale lock)."""


def process_start(pid: int) -> str | None:
    """When process ``pid`` started, in clock ticks since boot (Linux ``/proc``; None elsewhere): a pid reused by
    another process after a reboot or a wrap-around has another start."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22 (starttime); fields after the command start at 3


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    checkout: str
    since: str
    command: str
    token: str
    process_start: str | None = None

    @classmethod
    def read(cls, path: Path) -> Holder | None:
        """The lock's record; None when the file is empty or unreadable (being written this instant, or its writer
        was killed while writing)."""
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def state(self) -> str:
        """``running`` (this host, the process runs), ``stale`` (this host, it does not) or ``unknown`` (another
        host)."""
        if self.host != host_name():
            return "unknown"
        if not pid_alive(self.pid):
            return "stale"
        start = process_start(self.pid)
        return "stale" if self.process_start and start and start != self.process_start else "running"

    def describe(self) -> str:
        return (f"pid {self.pid} on host {self.host}, checkout {self.checkout}, since {self.since}, "
                f"command: {self.command}")


class RunLock:
    """The run lock of one results folder."""

    def __init__(self, results: str | os.PathLike):
        self.results = Path(os.path.abspath(results))
        self.path = self.results / LOCK_NAME
        self._token: str | None = None

    def holder(self) -> Holder | None:
        return Holder.read(self.path) if self.path.exists() else None

    def refusal(self, holder: Holder | None) -> str:
        """Why a run cannot start: who holds the lock and what to do (Snakemake's --unlock wording)."""
        head = (f"Error: the results folder {self.results} cannot be locked: another retinabench run is writing to "
                f"it (lock file {self.path}).")
        clear = (f"If you are sure that no other run uses this results folder, the remaining lock was likely caused "
                 f"by a kill signal or a power loss. It can be removed with {UNLOCK_HINT}.")
        if holder is None:
            return f"{head}\nThe lock file holds no record (written this instant, or its writer was killed).\n{clear}"
        state = holder.state()
        if state == "running":
            return (f"{head}\nHeld by {holder.describe()}.\nThat process is running on this host: wait for it to "
                    f"finish, or stop it (kill {holder.pid}), then run again. Only if pid {holder.pid} is not that "
                    f"run (a reused pid) remove the lock with {UNLOCK_HINT}.")
        elif state == "stale":
            why = (f"The lock is stale: pid {holder.pid} no longer runs on this host (killed, or the machine "
                   f"restarted). Remove it with {UNLOCK_HINT}.")
        else:
            why = (f"It was taken on another host ({holder.host}): this host ({host_name()}) cannot tell whether "
                   f"that run is still going. Check there; if it is not running, remove the lock with "
                   f"{UNLOCK_HINT}.")
        return f"{head}\nHeld by {holder.describe()}.\n{why}\n{clear}"

    def acquire(self, *, checkout: str | os.PathLike | None = None, command: str | None = None) -> Holder:
        """Take the lock or raise :class:`RunLockError` naming its holder. Released by :meth:`release`, at the
        latest when this interpreter exits."""
        self.results.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        holder = Holder(host=host_name(), pid=pid, checkout=str(os.path.abspath(checkout or os.getcwd())),
                        since=_dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                        command=command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                        token=secrets.token_hex(8), process_start=process_start(pid))
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            raise RunLockError(self.refusal(self.holder())) from None
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(asdict(holder), indent=1))
        self._token = holder.token
        atexit.register(self.release)
        return holder

    def release(self) -> bool:
        """Remove the lock if this process took it (another run's lock, or one already removed, is left)."""
        holder = self.holder()
        if self._token is None or holder is None or (holder.token, holder.pid) != (self._token, os.getpid()):
            return False
        self.path.unlink(missing_ok=True)
        self._token = None
        return True

    def clear(self) -> Holder | None:
        """``snakemake --unlock``: remove the lock whoever holds it; returns the record removed (None: no lock)."""
        if not self.path.exists():
            return None
        holder = self.holder()
        self.path.unlink(missing_ok=True)
        return holder

    def at_parse(self, argv: list[str], *, log=None) -> bool:
        """What the main process does when it reads the Snakefile: ``snakemake --unlock`` removes this lock too
        (returns True: nothing else to do); otherwise a held lock is announced (a dry run goes on: it writes no
        output; a run is refused by :meth:`acquire` once Snakemake starts executing)."""
        log = log or (lambda text: print(text, file=sys.stderr))
        if UNLOCK_FLAG in argv:
            removed = self.clear()
            log(f"retinabench: removed the run lock {self.path} (held by {removed.describe()})" if removed else
                f"retinabench: no run lock in {self.results}")
            return True
        if self.path.exists():
            holder = self.holder()
            who = holder.describe() if holder else "a writer whose record is not readable"
            log(f"retinabench: the results folder {self.results} is locked by another run ({who}); a dry run "
                f"only reads it, a run would be refused")
        return False
