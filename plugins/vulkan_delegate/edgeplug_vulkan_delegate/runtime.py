"""ExecuTorch's own GPU runtimes, driven from Python: the real runtimes a device runs, built on this host
from ExecuTorch's source. Two are built here, both reading the Vulkan delegate's serialization:

- the Vulkan runtime (``tools/vulkan-runtime/build.sh``; docs/vulkan-runtime.md): ``edgeplug-vulkan-runner``;
- the WebGPU runtime on wgpu-native (``tools/webgpu-runtime/build.sh``; docs/webgpu-runtime.md):
  ``edgeplug-webgpu-runner``.

Each build yields a small program of ours (tools/runtime-runner, one source for both) linked with ExecuTorch's
runtime, its portable and quantized CPU kernels and one GPU backend. It loads one ``.pte`` and runs its method on
request over a pipe, keeping the method's state (mutable buffers: a KV cache) between requests, so a prefill and
its decode steps run as they would on a device. ``RuntimeKind`` names what differs between the two (``VULKAN``,
``WEBGPU``).

Where a runner is found, in order: its variable (``EDGEPLUG_VULKAN_RUNNER``, ``EDGEPLUG_WEBGPU_RUNNER``: the
runner's path), then the newest build in the cache folder its ``build.sh`` writes to (``$EDGEPLUG_CACHE_DIR`` or
``$XDG_CACHE_HOME/edgeplug`` or ``~/.cache/edgeplug``, then ``vulkan-runtime/<commit>/bin`` or
``webgpu-runtime/<commit>/bin``). The variable set to ``off`` turns that runtime off (verification then uses the
host emulation).

This module needs only torch and the standard library: it also runs on a machine without executorch
(the H200 benchmarks drive it with ``.pte`` files made elsewhere).
"""

from __future__ import annotations

import json
import math
import os
import select
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch


@dataclass(frozen=True)
class RuntimeKind:
    """One of ExecuTorch's GPU runtimes built here: its API (its name in reports), the variable that points at
    (or turns off) its runner, the runner's file name, its cache folder, and how to build it."""

    api: str
    variable: str
    runner: str
    folder: str
    script: str
    doc: str

    @property
    def label(self) -> str:
        return f"ExecuTorch {self.api} runtime"

    @property
    def build_hint(self) -> str:
        return (f"build it with {self.script} EXECUTORCH_SRC ({self.doc}), "
                f"or point {self.variable} at a built {self.runner}")


VULKAN = RuntimeKind("Vulkan", "EDGEPLUG_VULKAN_RUNNER", "edgeplug-vulkan-runner", "vulkan-runtime",
                     "tools/vulkan-runtime/build.sh", "docs/vulkan-runtime.md")
WEBGPU = RuntimeKind("WebGPU", "EDGEPLUG_WEBGPU_RUNNER", "edgeplug-webgpu-runner", "webgpu-runtime",
                     "tools/webgpu-runtime/build.sh", "docs/webgpu-runtime.md")
RUNNER_VARIABLE = VULKAN.variable
RUNNER_NAME = VULKAN.runner
BUILD_HINT = VULKAN.build_hint

# ExecuTorch's ScalarType codes (the same numbering as torch's), for the dtypes a program's inputs take
_DTYPES = {
    torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.float16: 5,
    torch.float32: 6, torch.float64: 7, torch.bool: 11, torch.bfloat16: 15,
}
_FROM_CODE = {code: dtype for dtype, code in _DTYPES.items()}


#: seconds the runner may take to answer: its greeting (the program loaded, its shaders built) and each
#: request; ``EDGEPLUG_RUNNER_TIMEOUT`` (seconds) replaces both for a slower device
GREETING_SECONDS = 120.0
ANSWER_SECONDS = 300.0
TIMEOUT_VARIABLE = "EDGEPLUG_RUNNER_TIMEOUT"
#: the longest line of the runner's protocol (a JSON header) taken: a runner writing without end is stopped there
MAX_LINE_BYTES = 1 << 20


def _seconds(default: float) -> float:
    given = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not given:
        return default
    try:
        value = float(given)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise RunnerError(f"{TIMEOUT_VARIABLE}={given!r} is not a number of seconds > 0: set it to one, or unset it")
    return value


class _Stalled(Exception):
    """The runner sent nothing more before the deadline, or a line longer than the protocol has."""


class _Pipe:
    """The runner's stdout read with a deadline and a bound: a line of at most ``MAX_LINE_BYTES``, or
    exactly ``n`` bytes, by ``deadline`` (``time.monotonic()``), else ``_Stalled`` saying which."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()

    def _more(self, deadline: float, waiting_for: str) -> bool:
        left = deadline - time.monotonic()
        ready = select.select([self.fd], [], [], max(left, 0))[0] if left > 0 else []
        if not ready:
            raise _Stalled(f"did not answer {waiting_for} within the time it is given")
        chunk = os.read(self.fd, 1 << 16)
        self.buf += chunk
        return bool(chunk)

    def line(self, deadline: float, waiting_for: str) -> bytes:
        while True:
            end = self.buf.find(b"\n", 0, MAX_LINE_BYTES + 1)
            if end >= 0:
                out = bytes(self.buf[: end + 1])
                del self.buf[: end + 1]
                return out
            if len(self.buf) > MAX_LINE_BYTES:
                raise _Stalled(f"sent a line of more than {MAX_LINE_BYTES >> 20} MiB without an end ({waiting_for}), "
                               "which no answer of the runner's protocol is")
            if not self._more(deadline, waiting_for):  # the runner closed its output
                out = bytes(self.buf)
                self.buf.clear()
                return out

    def exactly(self, n: int, deadline: float, waiting_for: str) -> bytes:
        while len(self.buf) < n:
            if not self._more(deadline, waiting_for):
                break
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


class RunnerNotFound(Exception):
    """No built runner on this machine; the message says where it looked and how to build one."""


class RunnerError(RuntimeError):
    """The runtime refused to load or run the program; the message is the runtime's own, with its log."""


def cache_dir(kind: RuntimeKind = VULKAN) -> Path:
    root = os.environ.get("EDGEPLUG_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "edgeplug"
    )
    return Path(root) / kind.folder


@dataclass(frozen=True)
class RunnerBuild:
    """A built runner: where it is, which runtime, and which ExecuTorch commit it was built from."""

    path: Path
    commit: str
    built_seconds: Optional[int] = None
    jobs: Optional[int] = None
    kind: RuntimeKind = VULKAN

    @property
    def name(self) -> str:
        return f"{self.kind.label} {self.commit[:7]}"


def _build_of(path: Path, kind: RuntimeKind = VULKAN) -> RunnerBuild:
    meta: dict[str, Any] = {}
    info = path.parent / "runtime.json"
    if info.is_file():
        try:
            meta = json.loads(info.read_text())
        except ValueError:
            meta = {}
    commit = str(meta.get("executorch_commit") or path.parent.parent.name or "unknown")
    return RunnerBuild(path, commit, meta.get("built_seconds"), meta.get("jobs"), kind)


def find_runner(kind: RuntimeKind = VULKAN) -> RunnerBuild:
    """The runner of ``kind`` to use, or ``RunnerNotFound`` saying where it looked and what to do."""
    given = os.environ.get(kind.variable, "").strip()
    if given.lower() in ("off", "0", "no", "none"):
        raise RunnerNotFound(f"{kind.variable}={given} turns ExecuTorch's {kind.api} runtime off")
    if given:
        path = Path(given)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise RunnerNotFound(f"{kind.variable}={given} is not an executable file; {kind.build_hint}")
        return _build_of(path, kind)
    folder = cache_dir(kind)
    found = sorted(folder.glob(f"*/bin/{kind.runner}"), key=lambda p: p.stat().st_mtime, reverse=True)
    # a --profile build (<commit>-profile) times every shader: it is used only where named
    found = [p for p in found if os.access(p, os.X_OK) and not p.parent.parent.name.endswith("-profile")]
    if not found:
        raise RunnerNotFound(f"no {kind.runner} in {folder} and {kind.variable} is not set; {kind.build_hint}")
    return _build_of(found[0], kind)


def _describe(value: Any) -> tuple[dict[str, Any], bytes]:
    if isinstance(value, torch.Tensor):
        if value.dtype not in _DTYPES:
            raise RunnerError(f"an input of dtype {value.dtype} cannot be passed to the runtime")
        t = value.detach().contiguous().cpu()
        data = t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
        return {"kind": "tensor", "dtype": _DTYPES[t.dtype], "sizes": list(t.shape), "nbytes": len(data)}, data
    if value is None:
        return {"kind": "none"}, b""
    if isinstance(value, bool):
        return {"kind": "bool", "value": value}, b""
    if isinstance(value, int):
        return {"kind": "int", "value": value}, b""
    if isinstance(value, float):
        return {"kind": "double", "value": value}, b""
    raise RunnerError(f"an input of type {type(value).__name__} cannot be passed to the runtime")


class RunnerSession:
    """One ``.pte`` loaded in the runner: ``run(inputs)`` calls its method, state kept between calls.

    ``adapter`` is the device ExecuTorch's backend opened (e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"; the WebGPU
    runtime adds the API wgpu-native drives it through and wgpu-native's version: "... via Vulkan, wgpu-native
    29.0.1.1").
    Use as a context manager; the process ends on exit.
    """

    def __init__(self, pte: bytes | str | os.PathLike, data: Optional[bytes] = None, *,
                 build: Optional[RunnerBuild] = None, method: str = "forward", env: Optional[dict] = None):
        self.build = build or find_runner()
        self._tmp = tempfile.TemporaryDirectory(prefix="edgeplug-runner-")
        if isinstance(pte, (bytes, bytearray, memoryview)):
            path = Path(self._tmp.name) / "program.pte"
            path.write_bytes(bytes(pte))
        else:
            path = Path(pte)
        argv = [str(self.build.path), str(path)]
        if data is not None:
            ptd = Path(self._tmp.name) / "program.ptd"
            ptd.write_bytes(bytes(data))
            argv.append(str(ptd))
        argv.append(f"--method={method}")
        self._log: list[str] = []
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})},
        )
        self._stderr = threading.Thread(target=self._drain, daemon=True)
        self._stderr.start()
        assert self._proc.stdout is not None
        self._pipe = _Pipe(self._proc.stdout.fileno())
        try:  # whatever stops the greeting (a deadline, a runner that floods, SIGTERM or ^C), the runner ends too
            hello = self._answer("its greeting (loading the program)", GREETING_SECONDS)
        except BaseException:
            self._end()
            self._tmp.cleanup()
            raise
        if not hello.get("ok"):
            self.close()
            raise RunnerError(self._with_log(hello.get("error", "the runner did not start")))
        self.adapter: str = hello.get("adapter", "")
        self.inputs: list[dict] = hello.get("inputs", [])
        #: a runner of ``build.sh --profile``: ``etdump(path)`` writes what every run recorded
        self.profiling: bool = bool(hello.get("etdump", False))

    def _drain(self) -> None:
        assert self._proc.stderr is not None
        for raw in self._proc.stderr:
            self._log.append(raw.decode("utf-8", "replace").rstrip())
            del self._log[:-200]

    def _with_log(self, message: str, died: bool = False) -> str:
        # ExecuTorch's own log lines say which op or check refused (its 'E 00:00:00.375 executorch:...]'
        # lines); a runtime that died (an abort from a failed check) said why in its last lines
        lines = [ln for ln in self._log
                 if ln.startswith(("E ", "F ")) or " E " in ln[:40] or "rror" in ln or (died and ln.strip())]
        tail = "; ".join(x.split("] ", 1)[-1] for x in lines[-3:])
        return message + (f" (runtime log: {tail})" if tail else "")

    def _answer(self, waiting_for: str = "a request", seconds: float = ANSWER_SECONDS) -> dict:
        """The runner's next answer (one JSON line), by its deadline; a runner that misses it, floods or
        answers outside the protocol is ended, and the ``RunnerError`` says which."""
        limit = _seconds(seconds)
        try:
            line = self._pipe.line(time.monotonic() + limit, waiting_for)
        except _Stalled as exc:
            self._end()
            hint = f" (set {TIMEOUT_VARIABLE}=SECONDS for a slower device)" if "within" in str(exc) else ""
            raise RunnerError(self._with_log(f"the runtime {str(exc).replace('the time it is given', f'{limit:g} s')}{hint}; it was stopped")) from None
        if not line:
            try:
                code: int | str = self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._end()
                code = "unknown (it closed its output and was stopped)"
            self._stderr.join(timeout=5)
            raise RunnerError(self._with_log(f"the runtime exited with status {code} without answering", died=True))
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self._end()
            shown = line[:80].decode("utf-8", "backslashreplace").rstrip()
            raise RunnerError(f"the runtime answered {waiting_for} with {shown!r}, which is not the runner's protocol; it was stopped")
        return answer

    def _read_tensor(self, out: dict) -> bytes:
        """A tensor output's bytes: as many as its dtype and sizes need (a count that disagrees is refused)."""
        dtype = _FROM_CODE.get(out.get("dtype"))
        sizes = out.get("sizes")
        if dtype is None or not isinstance(sizes, list) or not all(isinstance(d, int) and d >= 0 for d in sizes):
            self._end()
            raise RunnerError(f"the runtime described an output as {out!r}, which is not the runner's protocol; it was stopped")
        need = math.prod(sizes) * torch.empty(0, dtype=dtype).element_size()
        if out.get("nbytes") != need:
            self._end()
            raise RunnerError(
                f"the runtime said an output of {dtype} {sizes} holds {out.get('nbytes')!r} bytes, not {need}; it was stopped"
            )
        try:
            return self._pipe.exactly(need, time.monotonic() + _seconds(ANSWER_SECONDS), "with an output's bytes")
        except _Stalled as exc:
            self._end()
            raise RunnerError(self._with_log(f"the runtime {exc}; it was stopped")) from None

    def _end(self) -> None:
        """Stop the runner now (it is not answering as it should, or edgeplug is stopping)."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def run(self, inputs: Sequence[Any], repeat: int = 1) -> tuple[list[Any], list[float]]:
        """Call the method on ``inputs`` (flat, in the program's order) ``repeat`` times; the outputs of
        the last call and each call's time in microseconds."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        heads, blobs = zip(*(_describe(v) for v in inputs)) if inputs else ((), ())
        request = json.dumps({"cmd": "run", "repeat": int(repeat), "inputs": list(heads)}).encode() + b"\n"
        try:
            self._proc.stdin.write(request + b"".join(blobs))
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise RunnerError(self._with_log("the runtime exited before taking the inputs")) from None
        ans = self._answer("a run of the method")
        if not ans.get("ok"):
            raise RunnerError(self._with_log(ans.get("error", "the run failed")))
        outputs: list[Any] = []
        for out in ans["outputs"]:
            if out["kind"] != "tensor":
                outputs.append(out.get("value"))
                continue
            raw = self._read_tensor(out)
            dtype = _FROM_CODE[out["dtype"]]
            if dtype == torch.bfloat16:
                t = torch.frombuffer(bytearray(raw), dtype=torch.int16).view(torch.bfloat16)
            else:
                t = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
            outputs.append(t.reshape(out["sizes"]).clone())
        return outputs, list(ans.get("times_us", []))

    def reset(self) -> None:
        """Load the method again: its buffers start afresh."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(b'{"cmd": "reset"}\n')
        self._proc.stdin.flush()
        ans = self._answer("a reset")
        if not ans.get("ok"):
            raise RunnerError(self._with_log(ans.get("error", "the reset failed")))

    def etdump(self, path: str | os.PathLike) -> int:
        """Write the ETDump of every run so far to ``path`` (a ``build.sh --profile`` runner only); the
        runner exits after it. Returns its size in bytes."""
        if not self.profiling:
            raise RunnerError("this runner was built without ExecuTorch's event tracer: build it with build.sh --profile")
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"cmd": "etdump", "path": os.fspath(path)}).encode() + b"\n")
        self._proc.stdin.flush()
        ans = self._answer("an ETDump request")
        if not ans.get("ok"):
            raise RunnerError(self._with_log(ans.get("error", "the ETDump was not written")))
        return int(ans["nbytes"])

    def close(self) -> None:
        try:
            if self._proc.poll() is None:
                try:
                    assert self._proc.stdin is not None
                    self._proc.stdin.write(b'{"cmd": "quit"}\n')
                    self._proc.stdin.close()
                    self._proc.wait(timeout=10)
                except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                    pass
        finally:  # a runner that does not quit, or a signal while it is asked to: it ends all the same
            self._end()
            self._tmp.cleanup()

    def __enter__(self) -> "RunnerSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class DelegateRuntime:
    """``BackendSpec.device_runtime``'s answer for a backend on the Vulkan delegate: a found runner build
    (ExecuTorch's Vulkan runtime for vulkan, its WebGPU runtime for webgpu)."""

    def __init__(self, build: RunnerBuild):
        self.build = build
        self.name = build.name

    def run(self, pte: bytes, data: Optional[bytes], calls: Sequence[Sequence[Any]]) -> tuple[list[list[Any]], str]:
        """Load ``pte`` once and call its method on each of ``calls``: each call's outputs, and the adapter."""
        with self.open(pte, data) as program:
            return [program.run(call) for call in calls], program.adapter

    def open(self, pte: bytes, data: Optional[bytes] = None) -> "OpenProgram":
        """Load ``pte`` (and its ``.ptd`` bytes) once; the answer's ``run(inputs)`` calls its method, the
        program's buffers kept between calls (greedy generation feeds each call the last one's token)."""
        return OpenProgram(self, pte, data)

    def refused(self, exc: RunnerError, done: int) -> Exception:
        from edgeplug.plugin import RuntimeRefusedError

        return RuntimeRefusedError(
            f"{self.name} could not run the .pte: {exc}"
            + (f" (it ran {done} calls before this one)" if done else "")
            + ". This is the runtime's refusal, not a lowering error; lower without --verify to write the "
            f".pte anyway, or set {self.build.kind.variable}=off to verify on the host emulation"
        )


class OpenProgram:
    """One ``.pte`` loaded in one of ExecuTorch's runtimes (``DelegateRuntime.open``): ``run(inputs)`` -> the
    outputs of one call, ``adapter``, ``close()``; the runtime's refusals are ``RuntimeRefusedError``."""

    def __init__(self, runtime: DelegateRuntime, pte: bytes, data: Optional[bytes]) -> None:
        self.runtime = runtime
        self.calls = 0
        try:
            self.session = RunnerSession(pte, data, build=runtime.build)
        except RunnerError as exc:
            raise runtime.refused(exc, 0) from exc
        self.adapter = self.session.adapter

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        try:
            outputs = self.session.run(inputs)[0]
        except RunnerError as exc:
            raise self.runtime.refused(exc, self.calls) from exc
        self.calls += 1
        return outputs

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> "OpenProgram":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _device_runtime(kind: RuntimeKind) -> DelegateRuntime:
    from edgeplug.plugin import RuntimeNotFound

    try:
        return DelegateRuntime(find_runner(kind))
    except RunnerNotFound as exc:
        raise RuntimeNotFound(f"ExecuTorch's {kind.api} runtime not found: {exc}") from None


def device_runtime() -> DelegateRuntime:
    """The vulkan backend's ``BackendSpec.device_runtime``: ExecuTorch's Vulkan runtime, if built here."""
    return _device_runtime(VULKAN)


def webgpu_device_runtime() -> DelegateRuntime:
    """The webgpu backend's ``BackendSpec.device_runtime``: ExecuTorch's WebGPU runtime on wgpu-native, if built
    here."""
    return _device_runtime(WEBGPU)
