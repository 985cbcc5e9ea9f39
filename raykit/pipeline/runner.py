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
import math
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
from raykit.pipeline.records import Meter, Records, fingerprint, stage_record

__all__ = ["Attempt", "Stage", "StageError", "StageRunner", "WarmStarter", "run_process"]


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


class StageRunner:
    """Executes stages in order against ``OUT/pipeline.json`` (see the module)."""

    def __init__(self, out: Path, retries: int = 0, echo: Callable[[str], None] = print) -> None:
        self.out, self.retries, self.echo = out, retries, echo
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
        return result

    def execute(self, stage: Stage) -> dict[str, Any]:
        """Run ``stage`` unless it is up to date; return its result."""
        fp = fingerprint(dict(stage.inputs))
        self.seen.append(stage.name)
        old = self.records.get(stage.name)
        if old is not None and old.get("fingerprint") == fp and old.get("status") == "done":
            self.echo(f"==> {stage.name}: up to date")
            return self.result(stage.name)
        resume = stage.resumable and old is not None and old.get("fingerprint") == fp
        if not resume:
            for path in stage.outputs:
                _remove(path)
        record = stage_record(stage.name, fp, stage.inputs, list(stage.command))
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
        record["result"] = _finite(result)
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


def _finite(obj: Any) -> Any:
    """``obj`` with NaN and infinities as None (pipeline.json is strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "item") and callable(obj.item):
        return _finite(obj.item())
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: the child gets SIGKILL when the pipeline dies (no orphan trainer holding the run)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


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
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        attempt.on_pid(proc.pid)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            attempt.meter.child = {"exit_status": proc.wait()}
            raise
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
            target=_warm_child, args=(module, list(args), str(attempt.log), str(usage))
        )
        try:
            process.start()
        except AssertionError:  # daemonic processes are not allowed to have children
            run_process(argv, attempt)
            return
        assert process.pid is not None
        attempt.on_pid(process.pid)
        try:
            process.join()
        except KeyboardInterrupt:
            os.kill(process.pid, signal.SIGINT)
            process.join()
            attempt.meter.child = {"exit_status": process.exitcode or 0}
            raise
        code = process.exitcode if process.exitcode is not None else 1
        attempt.meter.child = {"exit_status": code}
        with contextlib.suppress(OSError, ValueError):
            attempt.meter.child["peak_rss_mb"] = float(usage.read_text())
            usage.unlink()
        _judge(argv[0], code, attempt)


def _warm_child(module: str, args: list[str], log: str, usage: str) -> None:  # pragma: no cover - child
    """A :class:`WarmStarter` child: ``python -m module *args`` with its output in ``log``."""
    import importlib
    import resource

    _die_with_parent()
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
