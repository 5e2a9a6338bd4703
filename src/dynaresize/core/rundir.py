"""The run directory (design §5): metrics.jsonl, events.jsonl, samples.jsonl, summary.json.

Each JSON Lines file is appended and flushed line by line, so a run that stops early keeps
everything it finished.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

METRIC_KEYS = ("step", "reward_mean", "rollout_s", "train_s", "step_s", "num_rollout_devices",
               "num_train_devices", "num_resizes", "tokens", "policy_version", "train_device_s")
EVENT_KEYS = ("t_start", "t_end", "device", "kind", "critical", "bytes")
SAMPLE_KEYS = ("step", "prompt", "sample", "version", "device", "response_tokens",
               "tokens_sha256")
SUMMARY_KEYS = ("wall_s", "steps", "samples_per_s", "tokens_per_s", "bubble_fraction",
                "num_resizes", "final_reward", "param_sum", "param_sha256")


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, I/O error): names the file; the run
    stops (exit 2) and every checkpoint that was complete before stays as it was
    (`orchestrator.checkpoint`)."""


class RunDir:
    """Append-only writer of one run's records. `path=None` keeps records in memory only."""

    def __init__(self, path: str | Path | None, resume_step: int | None = None) -> None:
        """`resume_step=K`: continue an existing run directory from step K: metrics and
        samples of steps >= K (written after the checkpoint) are dropped, events are kept, and
        new events are shifted past the old ones (`t_offset_s`) so the timeline stays ordered."""
        self.path = Path(path) if path is not None else None
        self.metrics: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.num_samples = 0
        self.resumed_samples: list[dict[str, Any]] = []
        """On resume, the sample records kept (steps < K): what later steps may plan from."""
        self.t_offset_s = 0.0
        self.node_of: dict[int, str] = {}
        """Device index → Ray node id: events carry their device's `node` (`place`)."""
        self._files: dict[str, TextIO] = {}
        self.sinks: list[Any] = []
        """Extra metric sinks (metric_sinks: TensorBoard, W&B); each gets every record."""
        if self.path is not None:
            self.path.mkdir(parents=True, exist_ok=True)
            if resume_step is not None:
                self._truncate(resume_step)
            mode = "w" if resume_step is None else "a"
            for name in ("metrics", "events", "samples"):
                self._files[name] = open(self.path / f"{name}.jsonl", mode)  # noqa: SIM115

    def place(self, node_of: dict[int, str]) -> None:
        """Where the devices run (device index → Ray node id), for the events' `node`."""
        self.node_of = node_of  # the pool's own map: a repaired device's new node shows

    def add_sinks(self, sinks: list[Any]) -> None:
        """Extra metric sinks (TensorBoard, W&B): each gets every record from now on."""
        self.sinks.extend(sinks)

    def _truncate(self, resume_step: int) -> None:
        """Keep what the checkpoint covers: metrics and samples of steps < `resume_step`, each
        once (a record written twice is dropped), and events; a last line cut by a killed
        driver is dropped. Each file is replaced atomically (a kill now loses nothing)."""
        assert self.path is not None
        keys = {"metrics": ("step",), "samples": ("step", "prompt", "sample")}
        self.dropped_on_resume: dict[str, int] = {}
        for name in ("metrics", "samples", "events"):
            file = self.path / f"{name}.jsonl"
            records = read_jsonl(file, allow_cut_last_line=True) if file.exists() else []
            kept, seen = [], set()
            for r in records:
                key = tuple(r.get(k) for k in keys.get(name, ()))
                if name in keys and (r.get("step", 0) >= resume_step or key in seen):
                    continue
                seen.add(key)
                kept.append(r)
            self.dropped_on_resume[name] = len(records) - len(kept)
            tmp = file.with_name(file.name + ".tmp")
            tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in kept))
            os.replace(tmp, file)
            if name == "metrics":
                self.metrics = kept
            elif name == "samples":
                self.num_samples, self.resumed_samples = len(kept), kept
            else:
                self.t_offset_s = max((e["t_end"] for e in kept), default=0.0)

    def _write(self, name: str, record: dict[str, Any]) -> None:
        f = self._files.get(name)
        if f is not None:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")
            f.flush()

    def metric(self, record: dict[str, Any]) -> None:
        missing = [k for k in METRIC_KEYS if k not in record]
        assert not missing, f"metric record lacks {missing}"
        self.metrics.append(record)
        self._write("metrics", record)
        for sink in self.sinks:
            sink.write(record)

    def event(self, t_start: float, t_end: float, device: int, kind: str,
              critical: bool = True, num_bytes: int = 0, **extra: Any) -> None:
        record = {"t_start": round(t_start, 6), "t_end": round(t_end, 6), "device": device,
                  "kind": kind, "critical": critical, "bytes": num_bytes, **extra}
        if device in self.node_of:
            record["node"] = self.node_of[device]
        self.events.append(record)
        if self.t_offset_s:
            record = {**record, "t_start": round(t_start + self.t_offset_s, 6),
                      "t_end": round(t_end + self.t_offset_s, 6)}
        self._write("events", record)

    def samples(self, records: Sequence[dict[str, Any]]) -> None:
        if "samples" in self._files:  # in memory: only counted (records may be built lazily)
            for record in records:
                self._write("samples", record)
        self.num_samples += len(records)

    def summary(self, record: dict[str, Any]) -> None:
        if self.path is not None:
            (self.path / "summary.json").write_text(json.dumps(record, indent=2) + "\n")

    def write_config(self, text: str) -> None:
        if self.path is not None:
            (self.path / "config.toml").write_text(text)

    def eval_result(self, record: dict[str, Any]) -> None:
        """A full evaluation result (with decoded examples) into eval.jsonl."""
        if self.path is not None:
            with open(self.path / "eval.jsonl", "a") as f:
                f.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        for sink in self.sinks:
            sink.close()
        self.sinks.clear()


def read_jsonl(path: str | Path, allow_cut_last_line: bool = False) -> list[dict[str, Any]]:
    """Read a JSON Lines file; a bad line raises ValueError naming the file and line.
    `allow_cut_last_line`: a last line without its newline that does not parse (a writer
    killed mid-line) is skipped."""
    out = []
    with open(path) as f:
        lines = f.readlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if allow_cut_last_line and lineno == len(lines) and not line.endswith("\n"):
                break
            raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object")
        out.append(obj)
    return out
