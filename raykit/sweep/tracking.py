"""``--tracking mlflow``: each run's parameters, metrics and artifacts in MLflow (the ``mlflow`` extra).

One MLflow experiment per SPEC (``raykit sweep <spec stem>``); one MLflow run per sweep run, tagged
with its identity (``raykit.run_id``) and OUT (``raykit.out``), so that a rerun of the sweep logs only
the runs not logged before. Parameters: capture, config name, seed, fingerprints and every config
field; metrics: every number of the row (evaluation figures, steps, times, rays/s, memory, loader
wait); artifacts: the row as ``results.json``, the run's ``eval.json`` and its export when there is
one. At the end a ``sweep`` run holds ``report.md``, ``report.html``, ``results.parquet`` and
``results.csv``. ``--tracking-uri``: a tracking server (``http://host:5000``) or a local store (default:
``sqlite:///OUT/mlflow.db``, artifacts in ``OUT/mlartifacts``). Logging never stops the sweep: a
failure is one warning line; a server that does not answer within seconds, or answers an error
(a 503), is an error before any capture is converted; MLflow's own retries are bounded (``HTTP_LIMITS``).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raykit.errors import ConfigError
from raykit.sweep.runs import RunTask
from raykit.sweep.spec import SweepSpec

__all__ = ["MlflowTracker", "check_tracking"]

PARAM_MAX = 6000
_PARAM_COLUMNS = (
    "capture",
    "config",
    "seed",
    "store_fingerprint",
    "source_fingerprint",
    "config_hash",
    "raykit_version",
    "run_id",
)


PROBE_SECONDS = 5.0  # how long the tracking server is given to answer, before any conversion
# MLflow's own HTTP retries (default: 7 with exponential backoff, 120 s timeouts: minutes of silence
# per call to a failing server), unless the environment sets them.
HTTP_LIMITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


def check_tracking(uri: str | None, timeout: float = PROBE_SECONDS) -> None:
    """Refuse ``--tracking mlflow`` without mlflow installed, or with a tracking server (``http(s)://``)
    whose health or REST API does not answer within ``timeout`` seconds, or answers an error (a 503).
    """
    try:
        import mlflow.tracking  # noqa: F401 - only whether it imports
    except ImportError as exc:
        raise ConfigError(
            "--tracking mlflow: mlflow is not installed (pip install 'raykit[mlflow]')"
        ) from exc
    if uri is None or not uri.startswith(("http://", "https://")):
        return
    query = urllib.parse.urlencode({"experiment_name": "raykit sweep probe"})
    for path in ("/health", f"/api/2.0/mlflow/experiments/get-by-name?{query}"):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + path, timeout=timeout) as reply:
                reply.read(1 << 16)
        except urllib.error.HTTPError as exc:
            if exc.code < 500 and path != "/health":  # 404: no such experiment, the API answers
                continue
            raise ConfigError(
                f"--tracking-uri {uri}: tracking server not reachable (HTTP {exc.code} {exc.reason} "
                f"for {path.split('?')[0]})"
            ) from None
        except (OSError, ValueError) as exc:  # refused, timed out, not HTTP
            reason = getattr(exc, "reason", None) or exc
            raise ConfigError(f"--tracking-uri {uri}: tracking server not reachable ({reason})") from None


class MlflowTracker:
    """Logs a sweep's runs to MLflow (see the module)."""

    def __init__(self, uri: str | None, out: Path, spec: SweepSpec) -> None:
        check_tracking(uri)
        from mlflow.tracking import MlflowClient

        self.out = out.resolve()
        self.local = uri is None
        self.uri = uri or f"sqlite:///{self.out / 'mlflow.db'}"
        for name, value in HTTP_LIMITS.items():  # a server failing later costs seconds, not minutes
            os.environ.setdefault(name, value)
        self.out.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.lock = threading.Lock()
        name = f"raykit sweep {Path(spec.path).stem}"
        try:
            experiment = self.client.get_experiment_by_name(name)
            if experiment is None:
                location = (self.out / "mlartifacts").as_uri() if self.local else None
                self.experiment_id = self.client.create_experiment(name, artifact_location=location)
            else:
                self.experiment_id = experiment.experiment_id
        except Exception as exc:  # mlflow raises its own exception types for a store it cannot use
            raise ConfigError(
                f"--tracking-uri {self.uri}: {type(exc).__name__}: {exc}".splitlines()[0]
            ) from exc

    def _logged(self, key: str, value: str) -> bool:
        found = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`raykit.{key}` = '{value}' and tags.`raykit.out` = '{self.out}'",
            max_results=1,
        )
        return bool(found)

    def _log(
        self,
        name: str,
        tags: dict[str, str],
        params: dict[str, Any],
        metrics: dict[str, float],
        artifacts: Sequence[tuple[Path, str | None]],
        status: str,
    ) -> None:
        from mlflow.entities import Metric, Param, RunTag

        run = self.client.create_run(
            self.experiment_id, run_name=name, tags={**tags, "raykit.out": str(self.out)}
        )
        run_id = run.info.run_id
        now = int(time.time() * 1000)
        param_list = [Param(k, str(v)[:PARAM_MAX]) for k, v in params.items() if v is not None]
        metric_list = [Metric(k, float(v), now, 0) for k, v in metrics.items()]
        for start in range(0, max(len(param_list), len(metric_list)), 100):
            self.client.log_batch(
                run_id,
                metrics=metric_list[start : start + 100],
                params=param_list[start : start + 100],
                tags=[RunTag("raykit.logged", "1")],
            )
        for path, folder in artifacts:
            if path.is_dir():
                self.client.log_artifacts(run_id, str(path), folder)
            elif path.is_file():
                self.client.log_artifact(run_id, str(path), folder)
        self.client.set_terminated(run_id, status=status)

    def log_run(self, task: RunTask, row: dict[str, Any]) -> None:
        """Log one finished (or failed) run, unless this OUT logged it before."""
        with self.lock:
            try:
                if self._logged("run_id", task.run_id):
                    return
                params = {k: row.get(k) for k in _PARAM_COLUMNS}
                params.update({k: v for k, v in row.items() if k.startswith("config.")})
                metrics = {
                    k: v
                    for k, v in row.items()
                    if isinstance(v, int | float)
                    and not isinstance(v, bool)
                    and k not in _PARAM_COLUMNS
                    and not k.startswith("config.")
                }
                run_dir = Path(task.run_dir)
                with tempfile.TemporaryDirectory() as tmp:
                    results = Path(tmp) / "results.json"
                    results.write_text(json.dumps(row, indent=2, sort_keys=True) + "\n")
                    artifacts: list[tuple[Path, str | None]] = [
                        (results, None),
                        (run_dir / "train" / "eval.json", None),
                        (run_dir / "export", "export"),
                    ]
                    self._log(
                        task.label,
                        {"raykit.run_id": task.run_id, "raykit.status": str(row.get("status"))},
                        params,
                        metrics,
                        artifacts,
                        "FINISHED" if row.get("status") == "done" else "FAILED",
                    )
            except Exception as exc:  # tracking never stops the sweep
                print(
                    f"raykit: warning: tracking: {task.label}: {type(exc).__name__}: {exc}".splitlines()[0],
                    flush=True,
                )

    def log_sweep(self, out: Path, tasks: Sequence[RunTask], rows: dict[str, dict[str, Any]]) -> None:
        """The report and the results as one ``sweep`` run (again after every invocation)."""
        with self.lock:
            try:
                done = sum(1 for r in rows.values() if r.get("status") == "done")
                artifacts: list[tuple[Path, str | None]] = [
                    (out / name, None)
                    for name in ("report.md", "report.html", "results.parquet", "results.csv")
                ]
                artifacts.append((out / "figures", "figures"))
                self._log(
                    "sweep",
                    {"raykit.kind": "sweep"},
                    {"runs": len(tasks)},
                    {"runs_done": done, "runs_failed": len(rows) - done},
                    artifacts,
                    "FINISHED",
                )
            except Exception as exc:  # tracking never stops the sweep
                print(
                    f"raykit: warning: tracking: sweep: {type(exc).__name__}: {exc}".splitlines()[0],
                    flush=True,
                )
