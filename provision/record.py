"""One run's record, the same for every command that writes one (apply, plan, rollback, retire, verify, capacity, diag,
bench): `<runs-dir>/<UTC timestamp>-<command>/`.

    with RunRecord(runs_dir, "verify", inv) as rec:
        run = run_playbook(..., record=rec)       # keeps runner's artifacts under rec.path/artifacts
        rec.write_json("verify.json", report)
        rec.write_summary({"command": "verify", ...})

The record owns the directory (created on entry, 0700), the secret set of provision/secrets.py for that
inventory and the redactor built from it, the summary (whose `warnings` start with the inventory's) and the
files commands add. Everything written through
it is scrubbed as it is written, and on exit, whatever happened (a crash half-way through included), every
file under the directory is scrubbed again; a command that ended in an error before writing its summary gets
one saying so.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from provision import secrets
from provision.errors import ProvisionError, UsageError, one_line

SUMMARY = "summary.json"
# where run records go unless the caller says (the CLI: --runs-dir, else $PROVISION_RUNS_DIR, else this)
DEFAULT_RUNS_DIR = Path(".provision/runs")


def _new_dir(runs_dir: Path, kind: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    try:
        runs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for n in range(1000):
            candidate = runs_dir / (f"{stamp}-{kind}" + (f"-{n}" if n else ""))
            try:
                candidate.mkdir(mode=0o700)
                return candidate
            except FileExistsError:
                continue
    except OSError as exc:  # a file, a dangling link, no permission: say so before any host is touched
        raise UsageError(f"--runs-dir {runs_dir}: cannot create a run record there: {exc.strerror or exc}") from None
    raise ProvisionError(f"{runs_dir}: cannot create a run record directory")


class RunRecord:
    """A run record directory and the one redactor everything in it goes through (module doc)."""

    def __init__(self, runs_dir: Path, kind: str, inv: Any = None, *, redactor: secrets.Redactor | None = None):
        self.runs_dir = Path(runs_dir)
        self.kind = kind
        self.redactor = redactor if redactor is not None else secrets.Redactor(secrets.values(inv))
        # the inventory's warnings (a secret in plain text, TLS not verified): every summary carries them
        self.warnings: list[str] = list(getattr(inv, "warnings", None) or [])
        self.path = Path()
        self._summary_written = False
        self._discarded = False

    def __enter__(self) -> RunRecord:
        self.path = _new_dir(self.runs_dir, self.kind)
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if self._discarded:
            return
        if exc is not None and not self._summary_written:
            error = one_line(f"{type(exc).__name__}: {exc}")
            self.write_summary({"command": self.kind, "status": "error", "error": error})
        self.redactor.tree(self.path)

    @property
    def name(self) -> str:
        return self.path.name

    def child(self, name: str) -> RunRecord:
        """A sub-directory for another playbook run of the same command (reboot/, unlock/), same secrets."""
        sub = RunRecord(self.runs_dir, self.kind, redactor=self.redactor)
        sub.path = self.path / name
        sub.path.mkdir(mode=0o700, exist_ok=True)
        return sub

    def discard(self) -> None:
        """Nothing ran (another run holds the inventory): leave no record."""
        shutil.rmtree(self.path, ignore_errors=True)
        self._discarded = True

    def redact(self, value: Any) -> Any:
        """A JSON-able value, or a string, with every secret replaced (strings only: numbers stay numbers)."""
        return self.redactor.obj(value)

    def write_json(self, name: str, data: Any) -> Path:
        """`name` under the record, atomically, scrubbed."""
        path = self.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.redact(data), indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, path)
        return path

    def write_summary(self, summary: dict[str, Any]) -> Path:
        """summary.json, its `warnings` the inventory's and the run's; then every file of the record is scrubbed
        (what the command wrote itself too)."""
        warnings = list(dict.fromkeys([*self.warnings, *(summary.get("warnings") or [])]))
        path = self.write_json(SUMMARY, {**summary, "warnings": warnings})
        self._summary_written = True
        self.redactor.tree(self.path)
        return path

    def keep_artifacts(self, artifact_root: Path) -> None:
        """Copy runner's artifacts into the record, scrubbed; its `command` file (runner writes the whole
        environment there) is reduced to the command line and working directory."""
        dest = self.path / "artifacts"
        for ident_dir in artifact_root.iterdir() if artifact_root.is_dir() else ():
            target = dest / ident_dir.name
            shutil.copytree(ident_dir, target, ignore=shutil.ignore_patterns("fact_cache", "command"))
            command = ident_dir / "command"
            if command.is_file():
                try:
                    data = json.loads(command.read_text())
                    kept = {"command": data.get("command"), "cwd": data.get("cwd")}
                    (target / "command").write_text(json.dumps(kept))
                except (OSError, ValueError):
                    pass
        self.redactor.tree(dest)
