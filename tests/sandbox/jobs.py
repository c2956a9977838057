"""A sandbox job for the pool's tests (loaded from its file in the worker process: standard library only)."""

from __future__ import annotations

import os
import time
from typing import Any


class Handler:
    def __init__(self, init: dict[str, Any]) -> None:
        self.greeting = init.get("greeting", "hi")

    def __call__(self, job: dict[str, Any]) -> Any:
        op = job["op"]
        if op == "echo":
            return {"echo": job.get("value"), "greeting": self.greeting, "pid": os.getpid()}
        if op == "sleep":  # waits without using CPU: only the wall-clock limit ends it
            time.sleep(job["s"])
            return {"slept": job["s"]}
        if op == "spin":  # uses CPU: the CPU-time limit ends it
            end = time.monotonic() + job["s"]
            while time.monotonic() < end:
                pass
            return {"spun": job["s"]}
        if op == "allocate":
            return {"bytes": len(bytearray(job["mib"] << 20))}
        if op == "deep":

            def down(n: int) -> int:
                return n if n == 0 else down(n - 1)

            return {"depth": down(job["n"])}
        raise ValueError(f"no such op {op!r}")
