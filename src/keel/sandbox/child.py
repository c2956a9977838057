"""A sandbox worker process: `python -I child.py HANDLER.py`, driven over stdin / stdout by `pool.WorkerPool`.

It imports nothing of keel (importing keel loads torch): the handler module is loaded from its file, and
`-I` keeps the script's folder off sys.path. Setup first (the handler's `Handler(init)`, which may load a
tokenizer), then the address space is capped at what the process maps then plus the pool's memory limit
(RLIMIT_AS), and before each job the CPU-time limit is moved to what the process has used plus the job's
share (RLIMIT_CPU: the kernel ends the process with SIGXCPU past it). Jobs run on one thread with a large
stack: native parsers recurse with their input.

It runs at a lower scheduling priority (nice 10): a job shares the server's cores, and the engine's steps
come first. Frames on both pipes: a 4-byte big-endian length, then UTF-8 JSON. In: {"memory_mib",
"stack_mib", "nice", "init"} once, then {"job", "cpu_s"} per job. Out: {"ready": true} once, then {"ok": result},
{"error": message} (the handler refused the input) or {"memory": message} (a MemoryError) per job.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import struct
import sys
import threading
from typing import Any, BinaryIO

MAX_FRAME = 256 << 20


def read_frame(stream: BinaryIO) -> bytes | None:
    head = stream.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack(">I", head)
    return stream.read(n)


def write_frame(stream: BinaryIO, payload: bytes) -> None:
    stream.write(struct.pack(">I", len(payload)) + payload)
    stream.flush()


def _vm_bytes() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def limit_memory(extra_mib: int) -> None:
    """Cap the address space at what the process maps now plus `extra_mib` MiB (Linux; elsewhere nothing)."""
    try:
        import resource
    except ImportError:
        return
    base = _vm_bytes()
    if base:
        cap = base + extra_mib * (1 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def limit_cpu(seconds: float) -> None:
    """Let the next job use `seconds` more CPU time (all threads) than the process has used so far."""
    try:
        import resource
    except ImportError:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + seconds)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.getrlimit(resource.RLIMIT_CPU)[1]))


def load_handler(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("keel_sandbox_handler", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load a sandbox handler from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def answer(handler: Any, job: Any) -> dict[str, Any]:
    try:
        return {"ok": handler(job)}
    except MemoryError:
        return {"memory": "the job needed more memory than this worker may use"}
    except RecursionError:
        return {"error": "the input nests too deeply"}
    except Exception as exc:  # the handler's refusal of its input
        return {"error": str(exc) or type(exc).__name__}


def serve(path: str, setup: dict[str, Any], stdin: BinaryIO, stdout: BinaryIO) -> None:
    handler = load_handler(path).Handler(setup.get("init") or {})
    limit_memory(int(setup.get("memory_mib", 512)))
    write_frame(stdout, b'{"ready": true}')
    while True:
        frame = read_frame(stdin)
        if frame is None:  # the server closed the pipe: it is gone or stopping
            return
        try:
            request = json.loads(frame)
            limit_cpu(float(request.get("cpu_s", 60.0)))
            result = answer(handler, request["job"])
            payload = json.dumps(result).encode("utf-8")
        except (MemoryError, UnicodeEncodeError, ValueError) as exc:
            payload = json.dumps({"error": f"the worker could not answer: {type(exc).__name__}"}).encode()
        if len(payload) > MAX_FRAME:
            payload = b'{"error": "the answer is larger than a worker may send"}'
        write_frame(stdout, payload)


def main(argv: list[str]) -> int:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the pipe
    setup = json.loads(read_frame(stdin) or b"{}")
    threading.stack_size(int(setup.get("stack_mib", 256)) << 20)
    try:
        os.nice(int(setup.get("nice", 10)))  # the engine and the event loop win the CPU over client-chosen work
    except (OSError, AttributeError):
        pass
    failed: list[BaseException] = []

    def run() -> None:
        try:
            serve(argv[1], setup, stdin, stdout)
        except BaseException as exc:  # noqa: BLE001 - reported by the exit status
            failed.append(exc)

    worker = threading.Thread(target=run, name="keel-sandbox-job")
    worker.start()
    worker.join()
    if failed:
        print(f"keel sandbox worker: {type(failed[0]).__name__}: {failed[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
