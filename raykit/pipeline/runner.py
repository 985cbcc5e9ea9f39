"""Run stages like make: skip what is up to date, redo what changed, retry what the machine broke.

A :class:`Stage` names its inputs (options and the fingerprints of upstream outputs); its fingerprint
is theirs. A stage whose record is ``done`` with the same fingerprint is skipped; one whose record has
the same fingerprint but did not finish (interrupted, killed, failed) resumes in place (training
continues from its newest checkpoint); one whose fingerprint changed starts over, its outputs removed.
Failures of the machine (a process killed by a signal, ``MemoryError``, ``OSError``, a loader worker
that died) are retried up to ``retries`` times; bad input (any other :class:`RaykitError`) fails at
once with the stage's own message.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raykit.errors import ConfigError, RaykitError, WorkerError
from raykit.fileio import UntrustedFileError, check_relative, json_safe
from raykit.pipeline.records import Meter, Records, fingerprint, stage_record

__all__ = ["Attempt", "Stage", "StageError", "StageRunner", "WarmStarter", "kill_children", "run_process"]


class StageError(RaykitError, RuntimeError):
    """A stage failed: a subprocess's bad-input error (``machine`` False) or a machine fault that
    outlasted the retries (``machine`` True)."""

    def __init__(self, message: str, *, machine: bool) -> None:
        super().__init__(message)
        self.machine = machine


@dataclass
class Attempt:
    """What a running stage may use: its number, its log file, whether it resumes, and where to put the
    child's pid and resource usage."""

    number: int
    log: Path
    resume: bool
    meter: Meter
    on_pid: Callable[[int], None]


@dataclass(frozen=True)
class Stage:
    """One step of the pipeline.

    Attributes:
        name: unique within the pipeline (``train-occupancy``).
        inputs: JSON-able options and upstream fingerprints; the stage's fingerprint is theirs.
        run: does the work; returns the JSON-able result (with an ``output`` fingerprint for downstream).
        command: the exact command that reproduces the stage.
        outputs: paths removed before a stage whose inputs changed starts over.
        resumable: an interrupted attempt continues in place (else its outputs are removed first).
    """

    name: str
    inputs: Mapping[str, Any]
    run: Callable[[Attempt], dict[str, Any]]
    command: Sequence[str]
    outputs: Sequence[Path] = field(default_factory=tuple)
    resumable: bool = True


def machine_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is the machine's fault (retried) rather than the input's (never retried)."""
    if isinstance(exc, StageError):
        return exc.machine
    if isinstance(exc, WorkerError | MemoryError):
        return True
    return isinstance(exc, OSError) and not isinstance(exc, RaykitError)


def portable(obj: Any, root: str) -> Any:
    """``obj`` with every absolute path inside folder ``root`` (as given or resolved; a command's
    ``--flag=PATH`` too) written ``./<relative path>``: what the records hold, so that a folder moved or
    copied is rerun where it now is (:func:`located`)."""
    roots = {os.path.abspath(root), os.path.realpath(root)}

    def relative(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: relative(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [relative(v) for v in value]
        if isinstance(value, str):
            flag, _, rest = value.rpartition("=") if value.startswith("--") else ("", "", value)
            if os.path.isabs(rest):
                path = os.path.normpath(rest)
                for base in roots:
                    if path == base or path.startswith(base.rstrip(os.sep) + os.sep):
                        rel = os.path.relpath(path, base).replace(os.sep, "/")
                        return f"{flag}{'=' if flag else ''}./{rel}"
        return value

    return relative(obj)


def located(obj: Any, root: str, where: str) -> Any:
    """``obj`` read from the records of folder ``root`` (``where``), its ``./`` paths made absolute
    there; such a path must be plain (no ``..``: ``fileio.check_relative``), or ConfigError names it."""
    if isinstance(obj, dict):
        return {k: located(v, root, where) for k, v in obj.items()}
    if isinstance(obj, list):
        return [located(v, root, where) for v in obj]
    if isinstance(obj, str) and obj.startswith("./"):
        if obj == "./.":
            return root
        try:
            parts = check_relative(obj[2:], where)
        except UntrustedFileError as exc:
            raise ConfigError(str(exc)) from None
        return os.path.join(root, *parts)
    return obj


class StageRunner:
    """Executes stages in order against ``OUT/pipeline.json`` (see the module).

    Paths inside ``root`` (default ``out``; a sweep's runs: the sweep's folder) are recorded relative
    to it (:func:`portable`), in fingerprints and results alike: a folder moved or copied resumes and
    skips as it would have where it was. Records written before (absolute paths) are still up to date
    where they were written.
    """

    def __init__(
        self, out: Path, retries: int = 0, echo: Callable[[str], None] = print, root: Path | None = None
    ) -> None:
        self.out, self.retries, self.echo = out, retries, echo
        self.root = os.path.abspath(root if root is not None else out)
        self.records = Records(out)
        self.ran: list[str] = []  # stages run by this invocation
        self.seen: list[str] = []  # stages executed or found up to date

    def result(self, name: str) -> dict[str, Any]:
        record = self.records.get(name)
        if record is None or record.get("status") != "done":
            raise KeyError(name)
        result = record.get("result")
        if not isinstance(result, dict):
            raise ConfigError(
                f"{self.records.path}: stage {name!r}: expected a result object, got {result!r}"[:300]
            )
        located_result: dict[str, Any] = located(result, self.root, f"{self.records.path}: stage {name!r}")
        return located_result

    def execute(self, stage: Stage) -> dict[str, Any]:
        """Run ``stage`` unless it is up to date; return its result."""
        inputs = portable(dict(stage.inputs), self.root)
        fp = fingerprint(inputs)
        self.seen.append(stage.name)
        old = self.records.get(stage.name)
        # A record from before relative paths: its fingerprint is of the absolute inputs.
        same = old is not None and old.get("fingerprint") in (fp, fingerprint(dict(stage.inputs)))
        if old is not None and same and old.get("status") == "done":
            self.echo(f"==> {stage.name}: up to date")
            return self.result(stage.name)
        resume = stage.resumable and same
        if not resume:
            for path in stage.outputs:
                _remove(path)
        record = stage_record(stage.name, fp, inputs, portable(list(stage.command), self.root))
        attempts = old.get("attempts") if resume and old else None
        record["attempts"] = (
            [a for a in attempts if isinstance(a, dict)] if isinstance(attempts, list) else []
        )
        self.echo(f"==> {stage.name}" + (" (resuming)" if resume and old else ""))
        for number in range(1, self.retries + 2):
            if number > 1 and not stage.resumable:
                for path in stage.outputs:
                    _remove(path)
            outcome = self._attempt(stage, record, number, resume or number > 1)
            if outcome is None:
                self.ran.append(stage.name)
                return self.result(stage.name)
            if not machine_fault(outcome) or number > self.retries:
                raise outcome
            self.echo(f"    {stage.name}: attempt {number} failed ({outcome}); retrying")
        raise AssertionError("unreachable")  # pragma: no cover

    def _attempt(
        self, stage: Stage, record: dict[str, Any], number: int, resume: bool
    ) -> BaseException | None:
        logs = self.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        entry: dict[str, Any] = {
            "attempt": len(record["attempts"]) + 1,
            "started": time.time(),
            "resume": resume,
            "status": "running",
            "log": f"logs/{stage.name}.{len(record['attempts']) + 1}.log",
        }
        record["attempts"].append(entry)
        record["status"] = "running"
        self.records.put(stage.name, record)

        def on_pid(pid: int) -> None:
            entry["pid"] = pid
            self.records.put(stage.name, record)

        attempt = Attempt(number, self.out / entry["log"], resume, Meter(), on_pid)
        try:
            with attempt.meter.measure():
                result = stage.run(attempt)
        except KeyboardInterrupt:
            self._finish(stage, record, entry, attempt, "interrupted", "interrupted (Ctrl-C)")
            raise
        except BaseException as exc:  # recorded, then retried or raised by the caller
            if not attempt.log.exists():
                attempt.log.write_text("".join(traceback.format_exception(exc)))
            self._finish(stage, record, entry, attempt, "failed", f"{type(exc).__name__}: {exc}")
            return exc
        record["result"] = portable(json_safe(result), self.root)
        self._finish(stage, record, entry, attempt, "done", None)
        self.echo(f"    done in {attempt.meter.wall_s:.1f} s")
        return None

    def _finish(
        self,
        stage: Stage,
        record: dict[str, Any],
        entry: dict[str, Any],
        attempt: Attempt,
        status: str,
        error: str | None,
    ) -> None:
        measured = attempt.meter.to_dict()
        entry.update(measured, status=status, error=error, exit_status=attempt.meter.child.get("exit_status"))
        record.update(measured, status=status)
        self.records.put(stage.name, record)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


# Process groups of the children running now (each child leads its own session): killed with the
# caller's interruption (``kill_children``), since a child in its own session misses the terminal's Ctrl-C.
_CHILDREN: set[int] = set()


def kill_children(sig: int = signal.SIGINT) -> None:
    """Send ``sig`` to the process group of every child running now (a sweep interrupted while its runs
    train: their trainers, and whatever those started, stop with it)."""
    for pgid in list(_CHILDREN):
        with contextlib.suppress(OSError):
            os.killpg(pgid, sig)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: the child gets SIGKILL when its parent dies (no orphan trainer holding the run)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _watch_owner(owner: int) -> None:  # pragma: no cover - runs in the child
    """Kill this child's process group the moment process ``owner`` (the sweep or pipeline that started
    it, not the fork server it was forked from) ends, however it ends (SIGKILL included): a thread
    waits on the owner's pidfd (Linux >= 5.3), else polls it every second."""
    import select
    import threading

    def kill_group() -> None:
        os.killpg(os.getpgid(0), signal.SIGKILL)

    try:
        pidfd = os.pidfd_open(owner)
    except ProcessLookupError:  # the owner ended before the child started
        kill_group()
        return
    except (OSError, AttributeError):  # an older kernel, or not Linux
        pidfd = -1

    def watch() -> None:
        if pidfd >= 0:
            select.select([pidfd], [], [])
        else:
            while True:
                try:
                    os.kill(owner, 0)
                except ProcessLookupError:
                    break
                except PermissionError:
                    pass
                time.sleep(1.0)
        kill_group()

    threading.Thread(target=watch, name="raykit-owner-watch", daemon=True).start()


def run_process(argv: Sequence[str], attempt: Attempt, env: Mapping[str, str] | None = None) -> None:
    """Run ``argv`` with its output in the attempt's log; raise :class:`StageError` when it fails.

    Exit status 2 (raykit's bad input) is not retried and carries the child's ``raykit: error:`` lines;
    a signal, or status 1 with ``MemoryError``/``OSError``/"out of memory" in the log, is the machine's.
    """
    with open(attempt.log, "wb") as log:
        proc = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env or os.environ),
            start_new_session=True,  # its own process group: killed as one (kill_children)
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        _CHILDREN.add(proc.pid)
        attempt.on_pid(proc.pid)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except KeyboardInterrupt:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGINT)
            attempt.meter.child = {"exit_status": proc.wait()}
            raise
        finally:
            _CHILDREN.discard(proc.pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
    attempt.meter.child = {"exit_status": proc.returncode, "peak_rss_mb": usage.ru_maxrss / 1e3}
    _judge(argv[0], proc.returncode, attempt)


def _judge(name: str, code: int, attempt: Attempt) -> None:
    """Raise :class:`StageError` for a child's failure (see :func:`run_process`)."""
    if code == 0:
        return
    text = attempt.log.read_text(errors="replace")
    errors = [
        line.removeprefix("raykit: error: ")
        for line in text.splitlines()
        if line.startswith("raykit: error:")
    ]
    if code < 0:
        raise StageError(f"{name} killed by signal {-code} ({signal.Signals(-code).name})", machine=True)
    if code == 2 and errors:
        raise StageError("\n".join(errors), machine=False)
    machine = any(word in text for word in ("MemoryError", "OSError", "out of memory", "Signal", "SIGKILL"))
    tail = "\n".join(text.splitlines()[-5:])
    raise StageError(f"exit status {code} (log {attempt.log}):\n{tail}", machine=machine)


class WarmStarter:
    """Children forked from a server that imported ``preload`` once (torch, the trainer), instead of
    fresh interpreters that each import them again (seconds per child: ``raykit sweep``'s runs).

    ``run(module, args, attempt)`` is ``run_process([python, -m, module, *args], attempt)`` with the same
    log, exit status, peak RSS and failure rules; the child is a separate process (a kill of it, or of
    this process, is survived as before: it dies with its parent, and ``--resume`` continues). Where
    this process may not have children of its own (a daemonic process, as a Dask worker may be), it
    falls back to :func:`run_process`.
    """

    def __init__(self, preload: Sequence[str]) -> None:
        import multiprocessing

        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(list(preload))

    def start(self) -> None:
        """Start the server now: its imports overlap whatever the caller does next."""
        from multiprocessing import forkserver

        with contextlib.suppress(OSError, AssertionError):
            forkserver.ensure_running()

    def run(self, module: str, args: Sequence[str], attempt: Attempt) -> None:
        argv = [sys.executable, "-m", module, *args]
        usage = attempt.log.with_name(attempt.log.name + ".rusage")
        attempt.log.write_bytes(b"")
        process = self.context.Process(
            target=_warm_child, args=(module, list(args), str(attempt.log), str(usage), os.getpid())
        )
        try:
            process.start()
        except AssertionError:  # daemonic processes are not allowed to have children
            run_process(argv, attempt)
            return
        assert process.pid is not None
        _CHILDREN.add(process.pid)
        attempt.on_pid(process.pid)
        try:
            process.join()
        except KeyboardInterrupt:
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGINT)
            process.join()
            attempt.meter.child = {"exit_status": process.exitcode or 0}
            raise
        finally:
            _CHILDREN.discard(process.pid)
        code = process.exitcode if process.exitcode is not None else 1
        attempt.meter.child = {"exit_status": code}
        with contextlib.suppress(OSError, ValueError):
            attempt.meter.child["peak_rss_mb"] = float(usage.read_text())
            usage.unlink()
        _judge(argv[0], code, attempt)


def _warm_child(
    module: str, args: list[str], log: str, usage: str, owner: int
) -> None:  # pragma: no cover - runs in the child
    """A :class:`WarmStarter` child: ``python -m module *args`` with its output in ``log``, leading its
    own process group, and killed with it when process ``owner`` ends. Its parent is the fork server,
    which outlives a SIGKILLed owner while any child holds the server's "alive" pipe: the parent's death
    signal alone would leave the child running."""
    import importlib
    import resource

    os.setsid()
    _die_with_parent()
    _watch_owner(owner)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own streams
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.argv = [f"python -m {module}", *args]
    code: Any = 1
    try:
        code = importlib.import_module(f"{module}.__main__").main()
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
        with contextlib.suppress(OSError):
            Path(usage).write_text(f"{peak}")
    sys.exit(code if isinstance(code, int) else 0 if code is None else 1)
