"""Live progress display: a rewritten status line on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Progress:
    def __init__(self, total_steps: int, mode: str = "auto", stream: TextIO | None = None
                 ) -> None:
        self.stream = stream or sys.stdout
        self.total_steps = total_steps
        is_tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.live = mode == "live" or (mode == "auto" and is_tty)
        self._t0 = time.monotonic()
        self._status = ""

    def _emit_line(self, text: str) -> None:
        if self.live:
            self.stream.write("\r\x1b[2K" + text + "\n")
            if self._status:
                self.stream.write(self._status)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def status(self, text: str) -> None:
        """Transient status (live mode only): what the run is doing right now."""
        if not self.live:
            return
        elapsed = time.monotonic() - self._t0
        self._status = f"[{elapsed:6.1f}s] {text}"
        self.stream.write("\r\x1b[2K" + self._status)
        self.stream.flush()

    def message(self, text: str) -> None:
        self._emit_line(text)

    def step(self, m: dict[str, Any]) -> None:
        elapsed = time.monotonic() - self._t0
        line = (f"step {m['step'] + 1:>3}/{self.total_steps}  reward {m['reward_mean']:.3f}  "
                f"rollout {m['rollout_s']:6.2f}s  train-wait {m['train_s']:6.2f}s  "
                f"step {m['step_s']:6.2f}s  tokens {m['tokens']:>6}  "
                f"alloc {m['num_rollout_devices']}R/{m['num_train_devices']}T  "
                f"resizes {m['num_resizes']}  v{m['policy_version']}  [{elapsed:.0f}s]")
        if "eval_accuracy" in m:
            line += (f"  eval(v{m['eval_version']}) accuracy {m['eval_accuracy']:.3f} "
                     f"reward {m['eval_reward']:.3f}")
        self._status = f"[{elapsed:6.1f}s] step {m['step'] + 2}/{self.total_steps} running…" \
            if m["step"] + 1 < self.total_steps else ""
        self._emit_line(line)

    def close(self) -> None:
        if self.live:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
