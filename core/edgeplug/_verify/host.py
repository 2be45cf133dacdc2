"""Host verification: execute a lowered program on this machine, delegates with plugin kernels.

``run_lowered(result, backend)`` interprets the top-level graph of the
lowered edge program with torch. At each ``executorch_call_delegate`` it
interprets the delegate's partition (``LoweredBackendModule.original_module``):

- constants come through the delegate's named data, under the keys the
  ``.pte`` stores them by (the Vulkan serializer's sha256 of the bytes); a
  constant the named data lacks fails loud instead of computing with zeros.
  0-d constants, which the Vulkan serializer turns into scalar values rather
  than named data, are taken from the program and counted in the note;
- where the backend's ``BackendSpec.delegate_constants`` says how its
  delegate's preprocess changes constants before storing them (the vulkan
  plugin's: batch norms folded into their convolution, 4-bit weights packed,
  all-zero zero points of symmetric weights dropped), constants are looked
  for as that preprocess stores them; the note counts each;
- where the backend's preprocess mirror also says which dtypes its delegate
  holds values in (``storage_dtypes(compile_specs)``: the Vulkan delegate
  holds int64 as int32 and fp64 as fp32), every value entering the delegate
  and every op's result in it is cast to that dtype, so the ops compute as
  the delegate's runtime does (int32 products wrap), and the delegate's
  outputs are cast back to the graph's dtypes, as the runtime's staging copy
  does. An op the host cannot compute in that dtype fails verification,
  saying so, rather than computing in the wider one;
- each op the backend has a kernel for runs that kernel (on the wgpu adapter
  for ``device="wgpu"`` kernels), after the kernel's ``checks(OpCall)``, which
  holds the backend runtime's contract (e.g. Vulkan's prepacked weight);
- every other op runs with torch (the reference).

With no usable adapter, ops that have a wgpu kernel run with torch after
their checks, and the note says so. Imports executorch (via the result's
objects only).
"""

from __future__ import annotations

import ctypes
import hashlib
import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import torch
import torch.utils._pytree as pytree
from torch.fx import Interpreter, Node

from edgeplug._errors import EdgeplugError, KernelError, VerificationError
from edgeplug._backend import given_backend
from edgeplug._graph.ops import dtype_name, op_name
from edgeplug._inputs import ExampleInputs, runtime_inputs
from edgeplug._runtime.device import GpuDevice, NoAdapterError
from edgeplug._runtime.process import gpu_device  # the process's device (edgeplug.plugin.gpu_device is this one)


@dataclass(frozen=True)
class OpCall:
    """One op about to run in host verification; what a ``Kernel.checks`` receives."""

    backend: str
    op: str
    #: the node's name in the delegate's graph
    node: str
    #: evaluated positional and keyword arguments
    args: tuple
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: the delegate (lowered module) the node belongs to
    delegate: str = ""
    #: positional argument index -> name of the program constant it is (parameter, buffer, lifted constant)
    constants: Mapping[int, str] = field(default_factory=dict)
    #: positional argument index -> name of the node that produced it
    sources: Mapping[int, str] = field(default_factory=dict)


@dataclass
class LoweredRun:
    """What ``run_lowered`` returns to ``verify``."""

    outputs: list[torch.Tensor]
    adapter: str
    note: str
    #: "where" -> op -> count, where is "adapter", "torch (reference)", "top-level (torch)"
    placements: dict[str, Counter] = field(default_factory=dict)
    constants_from_named_data: int = 0
    #: buffer name -> its value after the run, for buffers a delegate owns and updates (KV caches, counters)
    mutated_buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    scalar_constants_inline: int = 0
    #: the user outputs of each further call (``calls``), the buffers carried from the call before
    steps: list[list[torch.Tensor]] = field(default_factory=list)


def _top_ops(counter: Counter, limit: int = 4) -> str:
    parts = [f"{op} x{n}" for op, n in counter.most_common(limit)]
    rest = len(counter) - limit
    return ", ".join(parts) + (f", ... ({rest} more op kinds)" if rest > 0 else "")


def _storage_bytes(t: torch.Tensor) -> bytes:
    # what executorch's Vulkan serializer hashes and stores: the whole storage of the contiguous tensor
    s = t.untyped_storage()
    return ctypes.string_at(s.data_ptr(), s.nbytes()) if s.nbytes() else b""


def _dtype_variants(dtype: torch.dtype) -> list[torch.dtype]:
    # the serializer may store 64-bit types as 32-bit, and fp32 as fp16 (force_fp16)
    extra = {torch.int64: [torch.int32], torch.float64: [torch.float32], torch.float32: [torch.float16]}
    return [dtype, *extra.get(dtype, [])]


class _NamedData:
    """One delegate's named data: key -> bytes."""

    def __init__(self, lowered: Any) -> None:
        out = getattr(lowered, "named_data_store_output", None)
        # external weights: what the delegate stored goes to the .ptd (external_data), read the same way
        external = (getattr(out, "external_data", None) or {}).values()
        self.entries: dict[str, Any] = {**(getattr(out, "pte_data", None) or {}), **{k: e for d in external for k, e in d.items()}}
        self.buffers = list(getattr(out, "buffers", None) or [])

    def get(self, key: str) -> Optional[bytes]:
        entry = self.entries.get(key)
        if entry is None:
            return None
        buf = self.buffers[entry.buffer_index]
        return buf if isinstance(buf, bytes) else buf.to_bytes()

    def resolve(self, tensor: torch.Tensor) -> Optional[tuple[str, torch.Tensor]]:
        """(key, tensor decoded from the stored bytes) or None when the named data lacks it."""
        t = tensor.detach().to("cpu")
        for dt in _dtype_variants(t.dtype):
            stored = t.to(dt).contiguous()
            key = hashlib.sha256(_storage_bytes(stored)).hexdigest()
            data = self.get(key)
            if data is None:
                continue
            nbytes = stored.numel() * stored.element_size()
            if len(data) < nbytes:
                raise VerificationError(f"named data {key[:12]}... holds {len(data)} bytes, the constant needs {nbytes}")
            # the runtime copies the tensor's bytes from the start of the entry
            decoded = torch.frombuffer(bytearray(data[:nbytes]), dtype=dt) if nbytes else torch.empty(0, dtype=dt)
            return key, decoded.reshape(stored.shape).to(t.dtype)
        return None


def _program_constant(ep: Any, spec: Any) -> torch.Tensor:
    target = spec.target
    if target in ep.state_dict:
        return ep.state_dict[target]
    if target in ep.constants:
        return ep.constants[target]
    raise VerificationError(f"input {spec.arg.name!r} ({spec.kind.name}) names {target!r}, which the program does not hold")


class _Session:
    def __init__(self, backend: Any, state: Optional[Mapping[str, torch.Tensor]] = None) -> None:
        self.op_name = op_name
        self.backend = backend
        #: buffer name -> its value left by the call before (the program's state between calls)
        self.state: Mapping[str, torch.Tensor] = state or {}
        self.placements: dict[str, Counter] = {"adapter": Counter(), "torch (reference)": Counter(), "top-level (torch)": Counter()}
        self.named = 0
        self.inline = 0
        self.device: Optional[GpuDevice] = None
        self.no_device: Optional[str] = None
        self.fell_back: Counter = Counter()
        self.mutated_buffers: dict[str, torch.Tensor] = {}
        #: what the backend's preprocess did to constants that verification followed (BackendSpec.delegate_constants)
        self.preprocess: Counter = Counter()
        #: "int64 as int32" -> how many values the delegate's dtype rules narrowed
        self.narrowed: Counter = Counter()
        #: op -> how often torch could not take its narrowed inputs and got them cast back (same values)
        self.widened: Counter = Counter()

    def gpu(self) -> Optional[GpuDevice]:
        if self.device is None and self.no_device is None:
            try:
                self.device = gpu_device()
            except NoAdapterError as exc:
                self.no_device = str(exc)
        return self.device

    # delegates ----------------------------------------------------------------
    def run_delegate(self, name: str, lowered: Any, inputs: tuple) -> tuple:
        oe = lowered.original_module
        named = _NamedData(lowered)
        gm, preprocess = oe.graph_module, None
        rules = self.backend.spec.delegate_constants
        if rules is not None:  # constants as the delegate's preprocess stores them
            preprocess = rules(oe, named)
            gm = preprocess.graph_module
        # inputs the graph no longer reads (a folded batch norm's tensors) need no bytes
        unread = {n.name for n in gm.graph.nodes if n.op == "placeholder" and not n.users}
        values: list[Any] = []
        constants: dict[str, str] = {}  # placeholder name -> constant's target
        keys: dict[str, str] = {}  # placeholder name -> named-data key
        user = list(inputs)
        for spec in oe.graph_signature.input_specs:
            kind = spec.kind.name
            if kind == "USER_INPUT":
                if not user:
                    raise VerificationError(f"delegate {name!r} expects more inputs than the call passes")
                values.append(user.pop(0))
                continue
            if kind not in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
                raise VerificationError(f"delegate {name!r}: input {spec.arg.name!r} of kind {kind} cannot run on the host")
            value = self._constant(name, lowered, spec, named, preprocess, unread, keys)
            constants[spec.arg.name] = spec.target
            values.append(value)
        if user:
            taken = len(inputs) - len(user)
            raise VerificationError(f"delegate {name!r} takes {taken} runtime inputs; the call passed {len(inputs)}")
        if preprocess is not None:
            self.preprocess.update(preprocess.counts)
            self.named += preprocess.read
        storage = _storage_dtypes(preprocess, lowered)
        values = [self.narrow(v, storage) for v in values]
        interp = _DelegateInterpreter(self, name, gm, constants, keys, storage)
        with torch.no_grad():
            out = interp.run(*values, enable_io_processing=False)
        out = tuple(out) if isinstance(out, (list, tuple)) else (out,)
        if storage:  # the runtime's staging copy gives outputs back in the graph's dtypes
            out = tuple(_widen(o, want) for o, want in zip(out, _output_dtypes(gm)))
        specs = oe.graph_signature.output_specs
        if len(specs) != len(out):
            return out
        # a buffer the delegate owns stays inside it (the runtime keeps its state): the call returns only
        # the other outputs, as the getitem indices of the top-level graph count them
        for value, spec in zip(out, specs):
            if spec.kind.name == "BUFFER_MUTATION":
                self.mutated_buffers[str(spec.target)] = value
        return tuple(o for o, spec in zip(out, specs) if spec.kind.name != "BUFFER_MUTATION")

    def narrow(self, value: Any, storage: Mapping[torch.dtype, torch.dtype]) -> Any:
        """``value`` as the delegate holds it (tensors of a dtype ``storage`` narrows, cast)."""
        if isinstance(value, torch.Tensor) and value.dtype in storage:
            held = storage[value.dtype]
            self.narrowed[f"{dtype_name(value.dtype)} as {dtype_name(held)}"] += 1
            return value.to(held)
        if isinstance(value, (tuple, list)):
            return type(value)(self.narrow(v, storage) for v in value)
        return value

    def _constant(self, name: str, lowered: Any, spec: Any, named: _NamedData, preprocess: Any, unread: set, keys: dict) -> Any:
        """One constant input of a delegate, read back from what the .pte stores (never zeros for a missing one)."""
        if spec.kind.name == "BUFFER" and str(spec.target) in self.state:
            # a buffer the delegate owns and a call before wrote: the runtime keeps its value inside the delegate
            return self.state[str(spec.target)].clone()
        tensor = _program_constant(lowered.original_module, spec)
        found = named.resolve(tensor)
        if found is not None:
            keys[spec.arg.name], value = found
            self.named += 1
            return value
        if spec.arg.name in unread:
            return None  # never read: nothing to check
        rule = preprocess.resolve(spec.arg.name, tensor) if preprocess is not None else None
        if rule is not None:
            key, value, _ = rule
            if key is not None:
                keys[spec.arg.name] = key
                self.named += 1
            return value
        if tensor.dim() == 0:
            self.inline += 1
            return tensor.detach()  # serialized as a scalar value, not as named data
        raise VerificationError(
            f"delegate {name!r} ({lowered.backend_id}): constant {spec.arg.name!r} ({spec.target}, shape "
            f"{tuple(tensor.shape)}, {str(tensor.dtype).replace('torch.', '')}) is not in the delegate's named "
            f"data ({len(named.entries)} entries), so the .pte carries no bytes for it and the runtime "
            "would compute with missing data. Check the backend's serializer (constants must be stored "
            "under the sha256 of their bytes)"
        )

    def run_op(self, delegate: str, node: Node, args: tuple, kwargs: dict, constants: Mapping[str, str], keys: Mapping[str, str]) -> Any:
        op = self.op_name(node.target)
        kernel = self.backend.kernel(op)
        if kernel is None:
            self.placements["torch (reference)"][op] += 1
            return node.target(*args, **kwargs)
        const_args = {i: constants[a.name] for i, a in enumerate(node.args) if isinstance(a, Node) and a.name in constants}
        sources = {i: a.name for i, a in enumerate(node.args) if isinstance(a, Node)}
        call = OpCall(
            backend=self.backend.name, op=op, node=node.name, args=tuple(args), kwargs=dict(kwargs),
            delegate=delegate, constants=const_args, sources=sources,
        )
        if kernel.checks is not None:
            kernel.checks(call)
        if kernel.device == "cpu":
            self.placements["adapter"][op] += 1
            return kernel.impl(*args, **kwargs)
        dev = self.gpu()
        if dev is None:
            self.fell_back[op] += 1
            self.placements["torch (reference)"][op] += 1
            return node.target(*args, **kwargs)
        cache = {i: keys[a.name] for i, a in enumerate(node.args) if isinstance(a, Node) and a.name in keys}
        try:
            out = kernel.impl(*args, **kwargs, device=dev, cache_keys=cache)
        except KernelError as exc:
            raise KernelError(f"delegate {delegate!r}, node {node.name!r}: {exc}") from exc
        self.placements["adapter"][op] += 1
        return out


def _storage_dtypes(preprocess: Any, lowered: Any) -> dict[torch.dtype, torch.dtype]:
    """The dtypes the backend's delegate holds values in, from its preprocess mirror (empty: as the graph says)."""
    rule = getattr(preprocess, "storage_dtypes", None)
    if rule is None:
        return {}
    try:
        return dict(rule(getattr(lowered, "compile_specs", None) or ()))
    except Exception as exc:
        raise VerificationError(
            f"the backend's storage_dtypes rule failed ({type(exc).__name__}: {exc}): verification cannot follow "
            "the dtypes the delegate computes in, so it does not claim a pass"
        ) from exc


def _output_dtypes(gm: torch.fx.GraphModule) -> list[Optional[torch.dtype]]:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    items = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    vals = [i.meta.get("val") if isinstance(i, Node) else None for i in items]
    return [v.dtype if isinstance(v, torch.Tensor) else None for v in vals]


def _widen(value: Any, dtype: Optional[torch.dtype]) -> Any:
    if isinstance(value, torch.Tensor) and dtype is not None and value.dtype != dtype:
        return value.to(dtype)
    return value


class _DelegateInterpreter(Interpreter):
    def __init__(
        self, session: _Session, name: str, gm: torch.fx.GraphModule, constants: Mapping[str, str],
        keys: Mapping[str, str], storage: Optional[Mapping[torch.dtype, torch.dtype]] = None,
    ) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.extra_traceback = False  # our errors already name the node
        self.session, self.name, self.constants, self.keys = session, name, constants, keys
        self.storage = dict(storage or {})

    def _widened_retry(self, n: Node, args: tuple, kwargs: dict) -> Any:
        """The op on its (already narrowed) inputs cast back to the graph's dtypes, or None if that fails too."""
        back = {held: wide for wide, held in self.storage.items()}

        def widen(v: Any) -> Any:
            return v.to(back[v.dtype]) if isinstance(v, torch.Tensor) and v.dtype in back else v

        try:
            return self.session.run_op(
                self.name, n, pytree.tree_map(widen, args), pytree.tree_map(widen, kwargs), self.constants, self.keys
            )
        except Exception:
            return None

    def run_node(self, n: Node) -> Any:
        if n.op != "call_function" or n.target is operator.getitem:
            return super().run_node(n)
        with self._set_current_node(n):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            try:
                out = self.session.run_op(self.name, n, args, kwargs, self.constants, self.keys)
            except EdgeplugError:
                raise
            except Exception as exc:
                op = self.session.op_name(n.target)
                held = ", ".join(f"{dtype_name(a)} as {dtype_name(b)}" for a, b in self.storage.items())
                widened = self._widened_retry(n, args, kwargs) if held else None
                if widened is not None:  # e.g. gather: torch wants int64 indices; the values are the narrowed ones
                    self.session.widened[op] += 1
                    return self.session.narrow(widened, self.storage)
                if held:
                    raise VerificationError(
                        f"delegate {self.name!r}, node {n.name!r} ({op}) failed on the host in the dtypes the "
                        f"delegate computes in ({held}): {type(exc).__name__}: {exc}. Verification cannot follow "
                        "the delegate's dtype rules here, so it does not claim a pass"
                    ) from exc
                raise VerificationError(f"delegate {self.name!r}, node {n.name!r} ({op}) failed on the host: {type(exc).__name__}: {exc}") from exc
            return self.session.narrow(out, self.storage) if self.storage else out


def _functional_of(target: Any) -> Any:
    """The functional overload of an out variant (``op.out`` -> ``op.default``, ``op.dtype_out`` -> ``op.dtype``)."""
    name = getattr(target, "_overloadname", None)
    functional = {"out": "default", "dtype_out": "dtype"}.get(name or "")
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, functional, None) if functional and packet is not None else None


class _TopInterpreter(Interpreter):
    def __init__(self, session: _Session, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.extra_traceback = False
        self.session = session

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if "executorch_call_delegate" in str(target):
            lowered, *inputs = args
            ref = self.current.args[0]
            name = ref.target if isinstance(ref, Node) else "delegate"
            return self.session.run_delegate(str(name), lowered, tuple(inputs))
        if target is not operator.getitem:
            self.session.placements["top-level (torch)"][self.session.op_name(target)] += 1
        try:
            return super().call_function(target, args, kwargs)
        except NotImplementedError:
            functional = _functional_of(target)
            if functional is None or "out" not in kwargs:
                raise
        # an out variant to_executorch chose whose kernel only executorch's runtime links (executorch's quantized
        # embedding, embedding_byte.out): its functional form, written into the out tensor as the kernel would
        out = kwargs["out"]
        value = functional(*args, **{k: v for k, v in kwargs.items() if k != "out"})
        out.resize_(value.shape).copy_(value)
        return out

    def run_node(self, n: Node) -> Any:
        self.current = n
        return super().run_node(n)


def run_lowered(result: Any, backend: Any, calls: Sequence[ExampleInputs] = ()) -> LoweredRun:
    """Execute ``result`` (a LoweringResult) on the host; delegates' ops with ``backend``'s kernels.

    ``backend`` is the ``Backend`` ``edgeplug.verify`` was given. The example inputs' call runs
    first, then each of ``calls`` (decode steps), with the program's state carried between calls as
    executorch's runtime keeps it: each buffer the program writes back (a ``BUFFER_MUTATION`` output of
    the top-level graph) and each buffer a delegate owns and updates take the value the call before
    left. ``LoweredRun.steps`` holds each further call's outputs; the note and placements are the first
    call's.
    """
    backend = given_backend(backend, "edgeplug._verify.host.run_lowered")
    if result.edge is None:
        raise VerificationError("the lowering result holds no edge program to run")
    ep = result.lowered_program()
    state: dict[str, torch.Tensor] = {}
    session, outputs = _call(ep, backend, ExampleInputs(result.args, result.kwargs), state, "")
    first_writes = dict(session.mutated_buffers)
    steps: list[list[torch.Tensor]] = []
    for i, call in enumerate(calls, start=1):
        steps.append(_call(ep, backend, call, state, f"decode step {i} ({call.describe()}): ")[1])

    session.gpu()  # name the adapter even when no op needed it
    adapter = session.device.summary if session.device is not None else f"none ({session.no_device})"
    if not session.placements["adapter"] and not session.fell_back:  # the headline names what ran: torch, not an adapter that ran nothing
        adapter = f"the host CPU with torch (no delegate op has a {backend.name} kernel; the adapter {adapter} ran nothing)"
    return LoweredRun(
        outputs=outputs,
        adapter=adapter,
        note=_describe_run(session, backend.name),
        placements=session.placements,
        constants_from_named_data=session.named,
        scalar_constants_inline=session.inline,
        mutated_buffers=first_writes,
        steps=steps,
    )


class HostProgram:
    """``result``'s program on the host, ``backend``'s kernels running its delegates, called one call at a time
    (``program(inputs)`` -> its user outputs), its state carried from each call to the next as ``run_lowered``
    carries it: what greedy generation runs, whose next input is the last call's token."""

    def __init__(self, result: Any, backend: Any) -> None:
        if result.edge is None:
            raise VerificationError("the lowering result holds no edge program to run")
        self._ep = result.lowered_program()
        self._backend = backend
        self._state: dict[str, torch.Tensor] = {}
        self.calls = 0
        session = _Session(backend, self._state)
        session.gpu()  # the adapter the delegates' kernels run on
        self.adapter = session.device.summary if session.device is not None else f"none ({session.no_device})"

    def __call__(self, inputs: ExampleInputs) -> list[torch.Tensor]:
        where = f"call {self.calls + 1} ({inputs.describe()}): " if self.calls else ""
        outputs = _call(self._ep, self._backend, inputs, self._state, where)[1]
        self.calls += 1
        return outputs


def _call(
    ep: Any, backend: Any, inputs: ExampleInputs, state: dict[str, torch.Tensor], where: str,
) -> tuple[_Session, list[torch.Tensor]]:
    """One call of the program on ``inputs``, its buffers from ``state`` (else the program's values);
    ``state`` then holds every buffer the call wrote. Returns the call's session and its user outputs."""
    session = _Session(backend, state)
    # every leaf, None and scalars included, in the program's input order (keywords by its in-spec)
    user_inputs = runtime_inputs(ep, inputs)
    values: list[Any] = []
    fed: dict[str, torch.Tensor] = {}  # buffer name -> the tensor this call holds it in
    for spec in ep.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            if not user_inputs:
                raise VerificationError(f"{where}the lowered program takes more inputs than the example inputs give")
            values.append(user_inputs.pop(0))
        elif spec.kind.name == "BUFFER":  # a copy: the program may write it (to_executorch's write-back copy_)
            held = state.get(str(spec.target))
            fed[str(spec.target)] = (held if held is not None else _program_constant(ep, spec)).clone()
            values.append(fed[str(spec.target)])
        else:
            values.append(_program_constant(ep, spec))
    try:
        with torch.no_grad():
            outs = _TopInterpreter(session, ep.graph_module).run(*values, enable_io_processing=False)
    except EdgeplugError as exc:
        if not where:
            raise
        try:
            named = type(exc)(f"{where}{exc}")
        except Exception:
            named = VerificationError(f"{where}{exc}")
        raise named from exc
    except Exception as exc:
        raise VerificationError(f"{where}host execution of the lowered program failed: {type(exc).__name__}: {exc}") from exc
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    specs = ep.graph_signature.output_specs
    returned: dict[str, torch.Tensor] = {}
    if len(specs) == len(outs):
        returned = {str(s.target): o for o, s in zip(outs, specs) if s.kind.name == "BUFFER_MUTATION"}
        outs = [o for o, s in zip(outs, specs) if s.kind.name == "USER_OUTPUT"]
    # the runtime's write-back: a buffer the program mutates takes the value the graph returns for it, or,
    # once to_executorch has made the write-back an in-place write (its copy_, index_put_), the buffer's own
    # memory as the call left it
    for name in map(str, ep.graph_signature.buffers_to_mutate.values()):
        value = returned.get(name, fed.get(name))
        if isinstance(value, torch.Tensor):
            state[name] = value
    state.update(session.mutated_buffers)
    return session, [t for t in pytree.tree_leaves(outs) if isinstance(t, torch.Tensor)]


def _describe_run(session: _Session, backend: str) -> str:
    """The verification note: where each op ran and where the constants came from."""
    on_adapter = session.placements["adapter"]
    reference = session.placements["torch (reference)"]
    top = session.placements["top-level (torch)"]
    parts = []
    if on_adapter:
        parts.append(f"{backend} kernels ran {_top_ops(on_adapter)} on the adapter")
    else:
        parts.append(f"no delegate op has a {backend} kernel, nothing ran on the adapter")
    if session.fell_back:
        parts.append(f"no wgpu adapter ({session.no_device}): {_top_ops(session.fell_back)} ran with torch reference kernels instead")
    if reference:
        parts.append(f"torch reference ran {sum(reference.values())} delegate ops ({_top_ops(reference)})")
    if top:
        parts.append(f"{sum(top.values())} top-level CPU ops ran with torch")
    parts.append(f"{session.named} constants read from named data" + (f", {session.inline} 0-d constants inline" if session.inline else ""))
    if session.narrowed:
        parts.append(
            f"as the {backend} delegate holds values: " + ", ".join(f"{what} ({n} values)" for what, n in sorted(session.narrowed.items()))
        )
    if session.widened:
        parts.append(
            f"torch took the narrowed inputs of {_top_ops(session.widened)} only cast back to the graph's dtypes "
            "(same values; the result narrowed again)"
        )
    if session.preprocess:
        parts.append(f"as the {backend} delegate's preprocess stores them: " + ", ".join(f"{n} {what}" for what, n in sorted(session.preprocess.items())))
    return "; ".join(parts)
