"""Progress bars for tuning runs: tqdm's (counts, rate, time left) on stderr; plain lines where tqdm is missing."""
from __future__ import annotations

import sys
import time
from typing import Any


class Bar:
    """A progress bar of ``total`` steps; silent when not ``enabled``."""

    def __init__(self, total: int, desc: str, unit: str, enabled: bool = True) -> None:
        self._bar: Any = None
        self._plain = False
        self.desc, self.total, self.count = desc, total, 0
        self._t0 = time.monotonic()
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:   # tqdm is in install_requires; a bare environment still gets its steps, as lines
            self._plain = True
            return
        self._bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=True)

    def update(self, steps: int = 1, note: str | None = None) -> None:
        self.count += steps
        if self._bar is not None:
            if note is not None:
                self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(steps)
        elif self._plain and (self.count >= self.total or self.count * 10 // max(self.total, 1)
                              > (self.count - steps) * 10 // max(self.total, 1)):   # a line per tenth
            print(f"[gemmgen] {self.desc}: {self.count}/{self.total} ({time.monotonic() - self._t0:.1f} s)"
                  + (f" {note}" if note else ""), file=sys.stderr, flush=True)

    def set_total(self, total: int) -> None:
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def write(self, message: str) -> None:
        """A line above the bar (or on stderr)."""
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
        elif self._plain:
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
