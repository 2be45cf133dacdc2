"""What ExecuTorch's WebGPU runtime implements, as the webgpu backend's support check sees it.

The WebGPU runtime is its own program (``backends/webgpu/runtime``): it reads the Vulkan delegate's
serialization but registers a smaller set of operators than the Vulkan runtime. ``VulkanPartitioner``
(which ``WebGPUPartitioner`` wraps) knows only the Vulkan runtime's, so, left alone, it delegates ops
the WebGPU runtime would refuse when it loads the program. The backend therefore:

- builds its partitioner as ExecuTorch's own WebGPU flow does: the runtime's op list as the
  ``operator_allowlist`` and bool tensors left on the CPU (``partitioner_options``);
- refuses every other op in its support check (``support_check``, the first part of the core's one
  predicate), so an op outside the list is neither kept whole nor delegated, and the report says why.

Which list (``targeted_list``), decided once per lowering, when its partitioner is made:

- where a WebGPU runtime build is found (the lookup ``--verify`` uses: ``EDGEPLUG_WEBGPU_RUNNER``, else the newest
  build in the cache folder), the ops that runtime registers, which its ``build.sh`` records beside the runner
  (``registered_ops.json``, from the sources it compiled: tools/webgpu-runtime/registered_ops.py). A list file
  that cannot be read is refused (``OpListError``), naming it and how to write it again;
- otherwise (no build, the variable ``off``, or a build older than the list file, which the note says),
  ExecuTorch's own list for its WebGPU test flow (``edgeplug_webgpu._executorch.release_op_list``).

The report says which list decided (``support_note``, a report note), and so does ``edgeplug backends``.
Names are compared as the runtime looks an op up: the name the Vulkan serialization writes for a node (its
target's ``__name__``: ``aten.mm.default``; ``sdpa_with_kv_cache.default`` for ``llama::sdpa_with_kv_cache``).
"""

from __future__ import annotations

import functools
import json
import re
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from edgeplug.plugin import BackendUnavailableError

#: the file tools/webgpu-runtime/build.sh writes beside the runner (tools/webgpu-runtime/registered_ops.py)
LIST_FILE = "registered_ops.json"
LIST_FORMAT = 1
_OP = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_REWRITE = ("rebuild it (tools/webgpu-runtime/build.sh EXECUTORCH_SRC, docs/webgpu-runtime.md) or write the list "
            "again (python tools/webgpu-runtime/registered_ops.py {folder}); EDGEPLUG_WEBGPU_RUNNER=off lowers "
            "against ExecuTorch's release list instead")


class OpListError(BackendUnavailableError):
    """A WebGPU runtime build's op list that cannot be read: its file, what is wrong, and how to write it again."""


@dataclass(frozen=True)
class OpList:
    """The ops the WebGPU runtime a lowering targets implements: ``names`` as the runtime looks them up, ``note``
    (the report's sentence saying which list this is), and the build's ``file`` (None: ExecuTorch's release list)."""

    names: frozenset[str]
    note: str
    file: Optional[Path] = None
    commit: str = ""

    def refusal(self, op: str, key: str) -> str:
        if self.file is None:
            return (f"ExecuTorch's WebGPU runtime does not implement {op} (not in ExecuTorch's list of the ops that "
                    "runtime implements, WEBGPU_SUPPORTED_OPS of executorch.backends.webgpu.test.tester)")
        return (f"ExecuTorch's WebGPU runtime does not implement {op} (the runtime built at {self.file.parent.parent} "
                f"from ExecuTorch {self.commit[:7]} registers no {key}: {self.file})")


def runtime_key(target: Any) -> str:
    """The name the Vulkan serialization writes for a node of ``target``, which the runtime looks the op up by."""
    name = getattr(target, "__name__", None)
    if isinstance(name, str) and name:
        return name
    from edgeplug.plugin import op_name

    return op_name(target)


@functools.lru_cache(maxsize=1)
def _release_names() -> frozenset[str]:
    from edgeplug_webgpu._executorch import release_op_list

    return frozenset(runtime_key(op) for op in release_op_list())


def _executorch_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("executorch")
    except PackageNotFoundError:
        return "?"


def release_list(why: str) -> OpList:
    """ExecuTorch's own list; ``why`` says why no runtime build's list is used."""
    return OpList(_release_names(), _release_note(why))


def _release_note(why: str) -> str:
    return (f"webgpu delegates only the ops in ExecuTorch {_executorch_version()}'s list of what its WebGPU runtime "
            f"implements (WEBGPU_SUPPORTED_OPS of executorch.backends.webgpu.test.tester): {why}")


def read_list_file(file: Path, commit: str) -> OpList:
    """A build's op list, checked; ``OpListError`` naming the file, what is wrong and what to do."""
    folder = file.parent.parent

    def bad(what: str) -> OpListError:
        return OpListError(f"the op list of ExecuTorch's WebGPU runtime build {file} {what}: "
                           + _REWRITE.format(folder=folder))

    try:
        data = json.loads(file.read_text())
    except OSError as exc:
        raise bad(f"cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise bad(f"is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise bad(f"holds a JSON {type(data).__name__}, not the object tools/webgpu-runtime/registered_ops.py writes")
    if data.get("format") != LIST_FORMAT:
        raise bad(f"is in format {data.get('format')!r}; this edgeplug reads format {LIST_FORMAT}")
    ops = data.get("ops")
    if not isinstance(ops, list) or not ops or not all(isinstance(o, str) and _OP.match(o) for o in ops):
        shown = [o for o in ops if not (isinstance(o, str) and _OP.match(o))][:3] if isinstance(ops, list) else ops
        raise bad(f"has no list of op names under 'ops' (found {shown!r:.120})")
    listed = data.get("executorch_commit")
    if not isinstance(listed, str) or not listed:
        raise bad("names no executorch_commit")
    if commit and commit != "unknown" and not (listed.startswith(commit) or commit.startswith(listed)):
        raise bad(f"was recorded for ExecuTorch {listed[:12]}, but the runtime there is built from {commit[:12]}")
    names = frozenset(ops)
    note = (f"webgpu delegates only the ops ExecuTorch's WebGPU runtime registers: the {len(names)} its build at "
            f"{folder} (ExecuTorch {listed[:7]}) recorded in {file.name}, the runtime --verify runs here")
    return OpList(names, note, file, listed)


def _build_list() -> tuple[Optional[OpList], str]:
    """(the found build's list, '') or (None, why no build's list is used); ``OpListError`` for a bad list file."""
    from edgeplug_vulkan_delegate.runtime import WEBGPU, RunnerNotFound, find_runner

    try:
        build = find_runner(WEBGPU)
    except RunnerNotFound as exc:
        return None, f"no WebGPU runtime build is found here ({str(exc).split('; build it with')[0]})"
    file = build.path.parent / LIST_FILE
    if not file.exists():
        return None, (f"the WebGPU runtime build at {build.path.parent.parent} records no op list ({file} is missing: "
                      "it was built before build.sh recorded one; " + _REWRITE.format(folder=build.path.parent.parent)
                      + ")")
    return read_list_file(file, build.commit), ""


def targeted_list() -> OpList:
    """The list of the runtime a lowering now targets (module docstring); ``OpListError`` for a bad list file."""
    found, why = _build_list()
    return found if found is not None else release_list(why)


def list_file_problem() -> str:
    """What is wrong with the found build's op list file ('' when nothing is), without importing ExecuTorch:
    the backend's availability check (``edgeplug backends``; every lowering, before any work)."""
    try:
        _build_list()
    except OpListError as exc:
        return str(exc)
    return ""


# the list each partitioner the backend made was given: the support check and the report's note read it there,
# so one lowering decides once
_DECIDED: "weakref.WeakKeyDictionary[Any, OpList]" = weakref.WeakKeyDictionary()


def remember(partitioner: Any, ops: OpList) -> Any:
    _DECIDED[partitioner] = ops
    return partitioner


def decided(partitioner: Any) -> OpList:
    """The list ``partitioner`` was made with (a partitioner made elsewhere: the list a lowering would use now)."""
    try:
        return _DECIDED[partitioner]
    except (KeyError, TypeError):
        return targeted_list()


def support_note(partitioner: Optional[Any]) -> str:
    """``BackendSpec.support_note``: which list decides, for a lowering's partitioner (the report's note) or, given
    None, for a lowering made now (``edgeplug backends``, which must not import ExecuTorch: the release list's
    note is written without reading it)."""
    if partitioner is not None:
        return decided(partitioner).note
    try:
        found, why = _build_list()
    except OpListError as exc:
        return f"webgpu refuses to lower: {exc}"
    return found.note if found is not None else _release_note(why)


def partitioner_options(ops: OpList) -> tuple[dict[str, Any], list[Any]]:
    """``WebGPUPartitioner``'s compile options and operator allowlist, as ExecuTorch's WebGPU test flow gives them:
    bool tensors left on the CPU, and only the ops of ``ops``."""
    from edgeplug_webgpu._executorch import release_op_list, vulkan_registry_ops

    if ops.file is None:
        return {"skip_bool_tensors": True}, release_op_list()
    return {"skip_bool_tensors": True}, [op for op in vulkan_registry_ops() if runtime_key(op) in ops.names]


def support_check(partitioner: Any, gm: Optional[Any] = None) -> Callable[[Any], Any]:
    """The webgpu backend's ``BackendSpec.support_check``: an op outside the targeted runtime's list is refused,
    saying so and which list; any other node is judged by the Vulkan delegate's check
    (``edgeplug_vulkan_delegate.support``)."""
    from edgeplug.plugin import op_name, qualified_name, refuse

    from edgeplug_vulkan_delegate.support import support_check as vulkan_support_check

    vulkan = vulkan_support_check(partitioner, gm)
    ops = decided(partitioner)

    def check(node: Any) -> Any:
        if node.op == "call_function" and qualified_name(node.target):  # an op, not getitem or a higher-order op
            key = runtime_key(node.target)
            if key not in ops.names:
                return refuse(ops.refusal(op_name(node.target), key))
        return vulkan(node)

    return check
