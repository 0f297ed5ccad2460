"""Safe file writing: every write is atomic (temporary file in the same folder, fsync, rename),
so a crash or a kill never leaves a half-written file where a good one was.

Model folders are written whole: :func:`new_folder` builds the new folder beside the target
(``.NAME.tmp-PID@HOST-XXXX``) and swaps it in with two renames (old -> ``.NAME.old-PID@HOST-XXXX``,
new -> NAME), so that at any instant NAME is the complete old folder or the complete new one. A
kill between the two renames leaves NAME missing; :func:`recover_folder`, called before any
command reads or writes NAME, puts the old folder back and removes what a killed writer left.

Several hosts may share one file system (a multi-node run's folder): a writer on this host is
judged dead by its pid, its start time and the boot it ran in (all three in the name: a pid
reused by another process since, or one from before a reboot, is a dead writer, never a live
one), one on another host, whose pid cannot be checked from here, only by an expired lease:
while it works, a writer touches its temporary every ``HEARTBEAT_S`` seconds, and one whose
temporary has not been touched for ``LEASE_S`` seconds is dead. (Hosts' clocks must agree to
well within ``LEASE_S``; a name from before start times were recorded is judged by its pid and
its time: a process that started after the leftover was last touched did not write it.)

Output paths are checked before the work that produces them (:func:`check_output_file`,
:func:`check_output_folder`), and a failed write (full disk, read-only place) is a
:class:`~aiayn.errors.OutputError` naming the path; a full disk says so ("disk full while
writing FILE (N of M bytes written)", :func:`write_all`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from aiayn.errors import ConfigError, OutputError

log = logging.getLogger(__name__)

# What a writer leaves beside its target while it works: atomic_path's file, new_folder's folder
# and the old folder new_folder moves aside, named .NAME.tmp-PID.START.BOOT@HOST-XXXX. The
# writer's pid, its start time (clock ticks after boot, /proc/PID/stat field 22), the boot id
# (/proc/sys/kernel/random/boot_id, 8 hex digits) and the host tell a live writer from a dead one
# (START.BOOT is absent from names written before it was recorded, the host from older ones).
_TEMP = re.compile(
    r"^\.(?P<name>.+)\.(?P<what>tmp|old)-(?P<pid>\d+)(?:\.(?P<start>\d+)\.(?P<boot>[0-9a-f]+))?"
    r"(?:@(?P<host>[A-Za-z0-9._-]+))?-[A-Za-z0-9_]+$"
)
_HOST = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "localhost"
# A writer touches its temporary every HEARTBEAT_S seconds; another host's temporary untouched
# for LEASE_S seconds was left by a dead writer.
HEARTBEAT_S = 60.0
LEASE_S = 600.0


def _read_boot_id() -> str:
    try:
        text = Path("/proc/sys/kernel/random/boot_id").read_text()
    except OSError:
        return ""
    return re.sub(r"[^0-9a-f]", "", text.lower())[:8]


_BOOT = _read_boot_id()  # "" where /proc does not tell it (then pids alone judge)


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, /proc/PID/stat field 22), None when
    it does not exist or /proc does not tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:  # the fields after the command name, which may hold spaces and parentheses
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def _started_after(pid: int, when: float) -> bool:
    """Whether process ``pid`` started more than a second after ``when`` (epoch seconds), so
    that it cannot have written a file last touched then; False when /proc does not tell."""
    start = start_time(pid)
    try:
        stat = Path("/proc/stat").read_text()
        boot = float(next(ln.split()[1] for ln in stat.splitlines() if ln.startswith("btime ")))
    except (OSError, StopIteration, ValueError, IndexError):
        return False
    return start is not None and boot + start / os.sysconf("SC_CLK_TCK") > when + 1.0


def _writer_tag(pid: int | None = None) -> str:
    """PID.START.BOOT of this process (PID alone where /proc does not tell the rest)."""
    pid = os.getpid() if pid is None else pid
    start = start_time(pid)
    return f"{pid}.{start}.{_BOOT}" if start is not None and _BOOT else str(pid)


def _temp_prefix(name: str, what: str = "tmp") -> str:
    return f".{name}.{what}-{_writer_tag()}@{_HOST}-"


@contextlib.contextmanager
def _lease(path: str | os.PathLike) -> Iterator[None]:
    """Touch ``path`` every HEARTBEAT_S seconds while the block runs: the lease by which another
    host sharing the file system sees that this writer is alive."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(path)

    thread = threading.Thread(target=beat, name="aiayn-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success fsync it and rename it onto ``path``.

    The temporary file is removed on any failure; an OSError (a full disk, a read-only place)
    becomes an OutputError that names ``path``."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path.name), dir=path.parent)
        os.close(fd)
        with _lease(tmp):
            yield Path(tmp)
        # mkstemp makes 0600, and some writers (safetensors) create the file anew: give the file
        # the mode of any other file, once it is written
        os.chmod(tmp, 0o666 & ~_umask())
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OutputError as err:  # name the file asked for, not the temporary
        raise _renamed(err, str(tmp), path) from None
    except OSError as err:
        raise write_error(path, err) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _renamed(err: OutputError, tmp: str, path: str | os.PathLike) -> OutputError:
    """``err`` naming ``path`` where it named the temporary ``tmp`` (its errno kept)."""
    renamed = OutputError(str(err).replace(tmp, str(path)))
    renamed.errno = err.errno
    return renamed


def disk_full(err: BaseException) -> bool:
    """Whether ``err`` says the disk (or the user's quota) is full."""
    return isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)


def write_error(
    path: str | os.PathLike, err: OSError, written: int | None = None, total: int | None = None
) -> OutputError:
    """The one-line error for a failed write of ``path``; a full disk is named as such, with
    ``written`` of ``total`` bytes when the writer counted them."""
    if disk_full(err):
        counts = f" ({written} of {total} bytes written)" if total is not None else ""
        error = OutputError(f"disk full while writing {path}{counts}")
    else:
        reason = err.strerror or str(err) or type(err).__name__
        error = OutputError(f"{path}: cannot write ({reason})")
    error.errno = err.errno  # the message stays one line; callers can still ask disk_full()
    return error


def write_all(fd: int, data: Any, path: str | os.PathLike, offset: int = 0) -> int:
    """Write all of ``data`` (bytes or a contiguous array) to the file descriptor ``fd`` of
    ``path``, which holds ``offset`` bytes before it; returns the bytes written. A short write
    that makes no progress, or ENOSPC, is an OutputError: "disk full while writing PATH (N of M
    bytes written)", counting the whole file."""
    view = memoryview(data).cast("B")
    done, total = 0, len(view)
    while done < total:
        try:
            n = os.write(fd, view[done:])
        except OSError as err:
            raise write_error(path, err, offset + done, offset + total) from None
        if n <= 0:  # no room for one more byte, without an error code
            full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            raise write_error(path, full, offset + done, offset + total)
        done += n
    return total


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
        try:
            write_all(fd, data, tmp)
        finally:
            os.close(fd)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_section(
    path: str | os.PathLike, begin: str, end: str, section: str, new_file: str = ""
) -> None:
    """Replace the text between the ``begin`` and ``end`` markers of a markdown file with
    ``section`` (markers kept), or append it when the markers are absent; a missing file starts as
    ``new_file``. How the benchmark and results scripts keep their tables in hand-written docs."""
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.exists() else new_file
    block = f"{begin}\n{section.strip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    write_text(path, text)


# ---- leftovers of killed writers ---------------------------------------------------------------
def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by another user
    return True


def _writer_dead(entry: Path, match: re.Match[str]) -> bool:
    """Whether the writer that left ``entry`` is dead: on this host (or when the name records no
    host) by its pid, start time and boot (a live pid that started at another time, or in
    another boot, is another process: the writer is dead), by its lease (the entry's mtime) on
    another."""
    if match["host"] in (None, _HOST):
        pid = int(match["pid"])
        if match["start"] is not None and _BOOT:
            if match["boot"] != _BOOT:
                return True  # written before this host last booted
            if pid != os.getpid() and start_time(pid) != int(match["start"]):
                return True  # the pid is gone, or now another process's
        elif pid != os.getpid():  # a name from before start times: the file's time tells
            try:
                if _started_after(pid, entry.lstat().st_mtime):
                    return True  # the pid's process started after the writer last touched it
            except OSError:
                return False  # gone meanwhile: its writer finished
        return not _alive(pid)
    try:
        return time.time() - entry.lstat().st_mtime > LEASE_S
    except OSError:
        return False  # gone meanwhile: its writer finished


def live_writers(path: str | os.PathLike) -> list[tuple[Path, str, str]]:
    """(entry, "tmp"|"old", "pid P on HOST") of what live writers of ``path`` leave beside it,
    old folders first: why ``path`` may be missing for now (a writer is swapping it in)."""
    path = Path(path)
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return []
    found = []
    for entry in entries:
        m = _TEMP.match(entry.name)
        if m and m["name"] == path.name and not _writer_dead(entry, m):
            found.append((entry, m["what"], f"pid {m['pid']} on {m['host'] or _HOST}"))
    return sorted(found, key=lambda f: (f[1] != "old", str(f[0])))


def _leftovers(folder: Path, name: str | None = None) -> list[tuple[Path, str]]:
    """(path, "tmp"|"old") of what dead writers left in ``folder`` (for target ``name`` only)."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    found = []
    for entry in entries:
        m = _TEMP.match(entry.name)
        if m and (name is None or m["name"] == name) and _writer_dead(entry, m):
            found.append((entry, m["what"]))
    return found


def _remove(path: Path) -> None:
    """Remove a leftover; a failure (a read-only copy of a folder) is logged, never raised: the
    readers that tidy up on the way must still read."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        path.unlink(missing_ok=True)
    except OSError as err:
        log.warning("%s: left in place (%s)", path, err.strerror or err)


def recover_folder(path: str | os.PathLike) -> None:
    """Resolve what a killed :func:`new_folder` or :func:`atomic_path` left around ``path``: the
    old folder goes back to ``path`` when ``path`` is missing (a kill between the two renames of
    the swap); other temporaries (half-built folders, half-written files) are removed."""
    path = Path(path)
    left = _leftovers(path.parent, path.name)
    olds = sorted((p for p, what in left if what == "old"), key=lambda p: p.stat().st_mtime)
    if olds and not path.exists():
        try:
            os.rename(olds[-1], path)
            log.warning(
                "%s: restored from %s (a writer was killed while replacing it)", path, olds[-1]
            )
        except OSError as err:  # another reader restored it first, or a read-only file system
            if not path.exists():
                log.warning("%s: could not restore it from %s (%s)", path, olds[-1], err)
        olds = olds[:-1]
    for leftover in olds + [p for p, what in left if what == "tmp"]:
        _remove(leftover)
    if path.is_dir():
        remove_temp_files(path)


def remove_temp_files(folder: str | os.PathLike) -> int:
    """Remove the temporary files and folders that killed writers left in ``folder`` (and its
    sub-folders one level down); returns how many."""
    folder = Path(folder)
    left = _leftovers(folder)
    for sub in folder.iterdir() if folder.is_dir() else []:
        if sub.is_dir() and not sub.name.startswith("."):
            left += _leftovers(sub)
    for leftover, _ in left:
        _remove(leftover)
    if left:
        log.info(
            "%s: removed %d temporary file(s) left by an interrupted writer", folder, len(left)
        )
    return len(left)


# ---- whole folders -----------------------------------------------------------------------------
def is_empty_folder(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


@contextlib.contextmanager
def new_folder(path: str | os.PathLike, overwrite: bool = False, flag: str = "--overwrite"):
    """Yield an empty temporary folder beside ``path``; when the block succeeds, swap it in as
    ``path`` (the old folder, if any, is removed after the swap). An existing non-empty ``path``
    is refused unless ``overwrite``. On any failure the temporary folder is removed and ``path``
    is left as it was."""
    path = Path(path)
    check_output_folder(path, overwrite=overwrite, flag=flag)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path.name), dir=path.parent))
        os.chmod(tmp, 0o777 & ~_umask())
    except OSError as err:
        raise write_error(path, err) from None
    try:
        try:
            with _lease(tmp):
                yield tmp
        except OutputError as err:  # name the folder the user asked for, not the temporary one
            raise _renamed(err, str(tmp), path) from None
        swap_in(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def swap_in(new: Path, path: Path) -> None:
    """Replace the folder ``path`` by the complete folder ``new`` with two renames."""
    try:
        for file in new.rglob("*"):
            if file.is_file():
                with open(file, "rb") as f:
                    os.fsync(f.fileno())
        if path.exists():
            old = path.parent / new.name.replace(".tmp-", ".old-", 1)
            os.utime(path)  # moved aside, it holds a fresh lease: no other host restores it now
            os.rename(path, old)
            os.rename(new, path)
            _fsync_dir(path.parent)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(new, path)
            _fsync_dir(path.parent)
    except OSError as err:
        raise write_error(path, err) from None


# ---- output checks, before any work ------------------------------------------------------------
def _existing_ancestor(path: Path) -> Path:
    """The nearest existing ancestor of ``path`` (``path`` itself excluded); ConfigError when it
    is a file."""
    parent = path.parent if str(path.parent) else Path(".")
    while not parent.exists():
        if parent.is_symlink():
            break  # a dangling link: let the write report it
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{path}: {parent} is a file, not a folder")
    return parent


def _probe_writable(path: Path, folder: Path) -> None:
    """Create and remove a file in ``folder``: the only check that tells a read-only mount or a
    missing permission apart for every user (root included)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=_temp_prefix("aiayn-write-test"), dir=folder)
    except OSError as err:
        if disk_full(err):
            raise ConfigError(f"disk full while writing {path} (no room in {folder})") from None
        raise ConfigError(f"{path}: cannot write in {folder} ({err.strerror or err})") from None
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: str | os.PathLike | None, flag: str = "--output") -> None:
    """Refuse, before any work, an output file that cannot be written: a folder, a path under a
    file, an unwritable place. Also removes the temporaries a killed writer left beside it."""
    if path is None or str(path) == "-":
        return
    if str(path).endswith(os.sep):
        raise ConfigError(f"{flag} {path}: names a folder; give a file name")
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder; give a file name")
    try:
        _probe_writable(path, _existing_ancestor(path))
    except ConfigError as err:
        raise ConfigError(f"{flag} {err}") from None
    for leftover, _ in _leftovers(path.parent, path.name) if path.parent.is_dir() else []:
        _remove(leftover)


def check_output_folder(
    path: str | os.PathLike, overwrite: bool = False, flag: str = "--overwrite"
) -> None:
    """Refuse, before any work, an output folder that cannot be written (a file, a path under a
    file, an unwritable place) or that already holds something (unless ``overwrite``). Resolves
    the leftovers of a killed writer first (:func:`recover_folder`)."""
    path = Path(path)
    recover_folder(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path}: is a file, not a folder")
    if path.is_dir() and not overwrite and not is_empty_folder(path):
        raise ConfigError(
            f"{path}: already exists and holds {describe_folder(path)}; pass {flag} to replace "
            "it, or choose another folder"
        )
    _probe_writable(path, path if path.is_dir() else _existing_ancestor(path))


def check_not_input(
    out: str | os.PathLike,
    inputs: Iterable[str | os.PathLike],
    flag: str = "-o",
    file: bool = False,
) -> None:
    """Refuse an output that would destroy what the command reads, before any work: the one check
    of every command that writes (translate, evaluate, data tokenizer, plot, export, average,
    train, import). Symbolic links are followed, and a hard link is the file it links.

    An output folder may not be, hold or lie inside one of the command's ``inputs`` (model
    folders, run folders, data and config files): replacing it with ``--overwrite`` would delete
    them. An output ``file`` may not be one of the inputs, nor a part of a model folder (a file
    that folder holds now, or one it is read by: config.json, tokenizer.json, the weights), any
    model folder, not only an input: the folder would no longer load; its score files
    (``eval_*.json``, what `aiayn evaluate` keeps there) aside."""
    target = Path(out).resolve()
    for given in inputs:
        if str(given) == "-":  # stdin
            continue
        source = Path(given).resolve()
        if target == source or _same_file(target, source):
            relation, given = "is", f"{given} itself"
        elif file:
            continue
        elif target in source.parents:
            relation = "holds"
        elif source in target.parents:
            relation = "lies inside"
        else:
            continue
        what = "file" if file else "folder"
        raise ConfigError(
            f"{flag} {out}: {relation} {given}, which this command reads; choose another {what}"
        )
    folder = model_folder_of(target) if file else None
    if folder is not None and not SCORE_FILE.match(target.name):
        raise ConfigError(
            f"{flag} {out}: is a part of the model folder {folder} ({target.name}), and writing "
            "it would break that folder; choose a file outside it"
        )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False  # one of them does not exist (yet)


# What a model folder is read by (beside what it holds now), and the score files `aiayn evaluate`
# writes there, which are not parts of the model.
MODEL_FOLDER_PARTS = ("config.json", "tokenizer.json", "model.safetensors")
SCORE_FILE = re.compile(r"^eval_.*\.json$")


def model_folder_of(path: Path) -> Path | None:
    """The model folder (or run folder) that the file ``path`` (resolved) is a part of: a folder
    above it holding config.json beside weights or a tokenizer, where ``path`` exists or is a
    name the folder is read by; None when it is no such part."""
    for folder in path.parents:
        if (folder / "config.json").is_file() and (
            (folder / "tokenizer.json").is_file()
            or (folder / STATE_FILE).is_file()
            or any(folder.glob("*.safetensors"))
        ):
            if path.exists() or (path.parent == folder and path.name in MODEL_FOLDER_PARTS):
                return folder
            return None
    return None


# ---- what a folder holds, in the words of what replacing it would lose -------------------------
# The run folder's layout (aiayn.train.run_folder reads these names from here).
STATE_FILE = "trainer_state.pt"
CHECKPOINT_DIR = "checkpoints"
SNAPSHOT = re.compile(r"^step_(\d+)\.safetensors$")


def snapshot_steps(run: Path) -> list[int]:
    """Steps of the weight snapshots in the run folder ``run``, oldest first."""
    try:
        names = [p.name for p in (run / CHECKPOINT_DIR).iterdir()]
    except OSError:
        return []
    return sorted(int(m[1]) for name in names if (m := SNAPSHOT.match(name)))


def list_steps(steps: list[int]) -> str:
    """``4, 5, 6`` (or ``1000, 2000, …, 9000, 10000`` for a long list)."""
    shown = (
        [str(s) for s in steps]
        if len(steps) <= 6
        else [*map(str, steps[:2]), "…", *map(str, steps[-2:])]
    )
    return ", ".join(shown)


def describe_folder(path: Path) -> str:
    """What the folder ``path`` holds: a training run (its checkpoints), a model folder (its
    files) or other files, for the messages that refuse to replace it."""
    entries = sorted(p.name for p in path.iterdir())
    if not entries:
        return "nothing (an empty folder)"
    steps = snapshot_steps(path)
    if (path / STATE_FILE).is_file() or steps:
        n = len(steps)
        what = f"a training run with {n} checkpoint{'s' if n != 1 else ''}"
        what += f" (step{'s' if n != 1 else ''} {list_steps(steps)})" if steps else ""
        return what if (path / STATE_FILE).is_file() else f"{what} and no {STATE_FILE}"
    shown = ", ".join(entries[:4]) + (", …" if len(entries) > 4 else "")
    if (path / "config.json").is_file():
        return f"a model folder ({shown})"
    return f"a folder of {len(entries)} entr{'ies' if len(entries) != 1 else 'y'} ({shown})"
