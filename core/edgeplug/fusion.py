"""Applies pattern matches under a backend's FusionPolicy.

``fuse_program(ep, backend)`` asks ``match_rms_norm`` about every node and
turns each match into the backend's fused op (``aten.rms_norm(x, [D], w,
eps)`` or ``et_vk.rms_norm(x, w, eps)``):

* a weight the policy accepts as it is (a leaf constant of shape ``[D]`` in
  the norm's dtype) becomes the fused op's weight;
* a constant weight that is computed (``1 + w``, a static view, a cast) is
  folded at AOT into a new constant of shape ``[D]`` first;
* a weight known only at runtime leaves its multiply in place after a norm
  fused with a unit weight;
* an fp32 upcast around the math stays outside the fused op unless the
  policy guarantees fp32 accumulation;
* eps is always explicit.

Every match, fused or refused, yields a ``FusionRecord``.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator, Optional, Union

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, TensorArgument

from edgeplug.backend import Backend
from edgeplug.errors import EdgeplugError
from edgeplug.graph import analyze_constants, fold_constant, fold_constants, reserve_node_names
from edgeplug.patterns import RmsNormMatch, match_rms_norm
from edgeplug.patterns.base import dtype, dtype_name, is_qdq, shape
from edgeplug.records import FusionPolicy, FusionRecord

Node = torch.fx.Node

#: fused ops the core can emit, by the name a FusionPolicy gives
RMS_NORM_TARGETS = ("aten.rms_norm", "et_vk.rms_norm")


def fuse_program(ep: ExportedProgram, backend: Backend) -> tuple[ExportedProgram, list[FusionRecord]]:
    """Fuse every RMSNorm of ``ep`` under ``backend``'s policy.

    Returns a new program (``ep`` is left as it was) and one record per
    match. A backend without an rms_norm policy gets ``ep`` back unchanged.
    """
    policy = backend.fusion_policy("rms_norm")
    if policy is None:
        return ep, []
    if policy.target not in RMS_NORM_TARGETS:
        raise EdgeplugError(
            f"the rms_norm fusion policy of backend {backend.name!r} names target {policy.target!r}; "
            f"the core can emit {', '.join(RMS_NORM_TARGETS)}. Fix the plugin's edgeplug_fusion_policies."
        )
    ep = _copy_program(ep)
    records = _RmsNormFuser(ep, policy).run()
    ep.graph_module.graph.lint()
    ep.graph_module.recompile()
    return ep, records


def _copy_program(ep: ExportedProgram) -> ExportedProgram:
    """A copy whose graph, signature and constant tables can change; tensors are shared."""
    gm = torch.fx.GraphModule(ep.graph_module, copy.deepcopy(ep.graph_module.graph))
    gm.meta.update(ep.graph_module.meta)
    return ep._update(
        gm,
        copy.deepcopy(ep.graph_signature),
        state_dict=dict(ep.state_dict),
        constants=dict(ep.constants),
    )


class _Ops:
    """The ops fusion creates, in the program's dialect."""

    def __init__(self, ep: ExportedProgram, target: str) -> None:
        self.edge = ep.dialect == "EDGE"
        if target == "et_vk.rms_norm":
            import executorch.backends.vulkan.custom_ops_lib  # noqa: F401  (registers et_vk ops)
        if self.edge:
            from executorch.exir.dialects._ops import ops as exir_ops

            ns = exir_ops.edge
        else:
            ns = torch.ops
        name_space, name = target.split(".")
        self.rms_norm = getattr(getattr(ns, name_space), name).default
        self.mul = ns.aten.mul.Tensor
        self.view = ns.aten.view_copy.default
        self.full = ns.aten.full.default
        self.cast = ns.dim_order_ops._to_dim_order_copy.default if self.edge else ns.aten._to_copy.default

    def cast_kwargs(self, node: Node, to: torch.dtype) -> dict[str, Any]:
        if self.edge:
            return {"dtype": to, "dim_order": list(range(len(shape(node) or ())))}
        return {"dtype": to}


class _RmsNormFuser:
    def __init__(self, ep: ExportedProgram, policy: FusionPolicy) -> None:
        self.ep = ep
        self.policy = policy
        self.graph = ep.graph_module.graph
        self.ops = _Ops(ep, policy.target)
        self.takes_shape = policy.target == "aten.rms_norm"
        self.units: dict[tuple[int, torch.dtype], Node] = {}
        #: anchor -> the constant its weight was folded into, or why folding it failed
        self.folded: dict[Node, Union[Node, ValueError]] = {}
        self.fake_mode = _fake_mode(self.graph)

    def run(self) -> list[FusionRecord]:
        reserve_node_names(self.ep.graph_module)
        # match everything against one analysis of the input, then rewrite
        analysis = analyze_constants(self.ep)
        found: list[Union[FusionRecord, RmsNormMatch]] = []
        for node in self.graph.nodes:
            m = match_rms_norm(node, self.ep, analysis=analysis)
            if m:
                found.append(m)
            elif m.candidate:
                found.append(FusionRecord(pattern="rms_norm", anchor=node.name, outcome="rejected", reason=m.reason))
        self._fold_weights([m for m in found if isinstance(m, RmsNormMatch)])
        records: list[FusionRecord] = []
        for item in found:
            if isinstance(item, RmsNormMatch):
                alive = set(self.graph.nodes)
                if any(n is not None and n not in alive for n in (*item.nodes, item.input, item.weight)):
                    # an earlier rewrite changed a node this match shares (a folded weight): match again
                    again = match_rms_norm(item.anchor, self.ep) if item.anchor in alive else None
                    if not again:
                        if again is not None and again.candidate:
                            records.append(
                                FusionRecord(pattern="rms_norm", anchor=item.anchor.name, outcome="rejected", reason=again.reason)
                            )
                        continue
                    item = again
                item = self._fuse(item)
            records.append(item)
        return records

    # folding, all matches at once ---------------------------------------------------
    def _fold_weights(self, matches: list[RmsNormMatch]) -> None:
        """Fold every weight the matches need folded, and the unit weights they need, in one batch.

        Decides each match as ``_fuse`` will, in the same order, so the new
        constants are named and ordered as folding one match at a time would
        make them. What cannot be folded is left as it was and recorded; a
        unit weight only a failed fold needs is made later, by ``_unit_weight``.
        """
        batch: list[Node] = []
        hints: list[str] = []
        owners: list[tuple[Union[Node, tuple], list[Node]]] = []  # anchor (or unit weight key), nodes added
        sharers: list[tuple[Node, int]] = []  # anchor, index of the weight it shares in the batch
        unit_keys: set[tuple[int, Optional[torch.dtype]]] = set()
        for m in matches:
            _, dt = self._norm_input(m)
            if m.weight is not None and not _rounds_before_weight(m) and not (
                m.weight_source in self.policy.weight_sources and self._usable(m.weight, m.dim, dt)
            ):
                target, added, _ = self._fold_target(m, dt)
                if target is None:
                    needs_unit = self.policy.unit_weight_fallback
                elif target in batch:
                    sharers.append((m.anchor, batch.index(target)))
                    continue
                else:
                    batch.append(target)
                    hints.append(self._weight_name(m.weight))
                    owners.append((m.anchor, added))
                    continue
            else:
                needs_unit = m.weight is None or bool(_rounds_before_weight(m))
            key = (m.dim, dt)
            if needs_unit and not self.takes_shape and key not in self.units and key not in unit_keys:
                unit_keys.add(key)
                batch.append(self._unit_weight_node(m.dim, dt))
                hints.append(_unit_weight_name(m.dim, dt))
                owners.append((key, []))
        if not batch:
            return
        results = fold_constants(self.ep, batch, hints, errors="return")
        for (owner, added), result in zip(owners, results):
            if isinstance(owner, tuple):
                if isinstance(result, Node):
                    self.units[owner] = result
                continue
            if isinstance(result, ValueError):
                for n in reversed(added):
                    self.graph.erase_node(n)
            self.folded[owner] = result
        for anchor, i in sharers:
            # a weight two norms share: when it became a new constant the later norm is matched
            # again and finds it (a leaf now); when it stayed as it was, the later norm fares as the first
            if isinstance(results[i], ValueError) or results[i] is batch[i]:
                self.folded[anchor] = results[i]

    # one match ------------------------------------------------------------------
    def _norm_input(self, m: RmsNormMatch) -> tuple[Node, Optional[torch.dtype]]:
        """The fused op's input and dtype: an fp32 upcast stays outside unless the kernel accumulates in fp32 anyway."""
        absorb = self.policy.fp32_accumulation and m.upcast is not None and m.cast_back is not None
        x = m.upcast.args[0] if absorb else m.input
        return x, dtype(x)

    def _fuse(self, m: RmsNormMatch) -> FusionRecord:
        p = self.policy
        anchor_name = m.anchor.name
        absorb = p.fp32_accumulation and m.upcast is not None and m.cast_back is not None
        x, dt = self._norm_input(m)
        note = ""
        keep_mul = False
        folded = self.folded.get(m.anchor)
        if m.weight is None:
            weight, outcome = None, "fused"
        elif _rounds_before_weight(m):
            # quantize/dequantize (or a narrower cast) round and clamp the norm's output before
            # the multiply: folding the weight across them would change the result
            weight, outcome, keep_mul = None, "fused_unit_weight", True
            note = (
                f"{_rounds_before_weight(m)} between the norm and the weight multiply rounds the norm's "
                "output; it and the multiply stay"
            )
        elif isinstance(folded, Node):  # folded by _fold_weights (matched again if that replaced its weight)
            weight, outcome = folded, "folded_weight"
        elif isinstance(folded, ValueError):
            weight, outcome, note = None, "fused_unit_weight", _fold_failed(m.weight, folded)
        elif m.weight_source in p.weight_sources and self._usable(m.weight, m.dim, dt):
            weight, outcome = m.weight, "fused"
        else:
            weight, outcome, note = self._fold(m, dt)
            if weight is None:
                if not p.unit_weight_fallback:
                    reason = (
                        f"weight {m.weight.name!r} is {m.weight_source} ({note or 'not usable as it is'}) and the "
                        f"{p.backend} policy neither folds it nor fuses with a unit weight"
                    )
                    return FusionRecord(pattern="rms_norm", anchor=anchor_name, outcome="rejected", reason=reason)
                keep_mul, outcome = True, "fused_unit_weight"

        if keep_mul or m.weight is None:
            # the norm alone: its casts and any multiply after it stay as they are
            replaced = m.cast_back if absorb else m.anchor
        else:
            replaced = m.output
        if weight is None and not self.takes_shape:
            weight = self._unit_weight(m.dim, dt)

        with self.graph.inserting_before(replaced):
            args = (x, [m.dim], weight, m.eps) if self.takes_shape else (x, weight, m.eps)
            # the fused op's output is its input's shape and dtype (computed from metadata: its
            # composite implementation cannot run on dynamic-shaped fake tensors)
            fused = self._call(self.ops.rms_norm, args, like=m.anchor, val=_like(x))
            out = fused
            if keep_mul and m.weight_in_op:
                out = self._call(self.ops.mul, (out, m.weight), like=m.anchor)
            if dtype(out) != dtype(replaced):
                out = self._call(self.ops.cast, (out,), self.ops.cast_kwargs(out, dtype(replaced)), like=m.anchor)
        self._take_over(replaced, out)
        self._erase_unused(m)
        reason = note if outcome == "fused_unit_weight" else ""
        if outcome == "fused_unit_weight" and not reason:
            reason = f"weight {m.weight.name!r} is known only at runtime: its multiply stays after the norm"
        return FusionRecord(
            pattern="rms_norm",
            anchor=anchor_name,
            outcome=outcome,
            reason=reason,
            eps=m.eps,
            weight=weight.name if isinstance(weight, Node) else None,
        )

    def _usable(self, w: Node, dim: int, dt: Optional[torch.dtype]) -> bool:
        """The weight can be the fused op's weight as it is."""
        if shape(w) != (dim,) or dtype(w) != dt:
            return False
        # et_vk prepacks its weight: it must be a constant tensor of the program itself
        return self.takes_shape or w.op in ("placeholder", "get_attr")

    def _fold(self, m: RmsNormMatch, dt: Optional[torch.dtype]) -> tuple[Optional[Node], str, str]:
        """Fold the weight (viewed to ``[D]``, cast to ``dt``) into a new constant now.

        Only for a match ``_fold_weights`` did not plan (matched again after an
        earlier rewrite changed it); the others were folded in one batch.
        """
        node, added, note = self._fold_target(m, dt)
        if node is None:
            return None, "fused_unit_weight", note
        try:
            folded = fold_constant(self.ep, node, name_hint=self._weight_name(m.weight))
        except ValueError as exc:
            for n in reversed(added):
                self.graph.erase_node(n)
            return None, "fused_unit_weight", _fold_failed(m.weight, exc)
        return folded, "folded_weight", ""

    def _fold_target(self, m: RmsNormMatch, dt: Optional[torch.dtype]) -> tuple[Optional[Node], list[Node], str]:
        """The node to fold (the weight, viewed to ``[D]`` and cast to ``dt`` by nodes added here), or why none."""
        w = m.weight
        if m.weight_source == "runtime":
            return None, [], ""
        if not self.policy.fold_computed_constants:
            return None, [], f"weight {w.name!r} is {m.weight_source}; the policy does not fold"
        node = w
        added: list[Node] = []
        with self.graph.inserting_after(w):
            if shape(node) != (m.dim,):
                node = self._call(self.ops.view, (node, [m.dim]), like=w)
                added.append(node)
        if dtype(node) != dt:
            with self.graph.inserting_after(node):
                node = self._call(self.ops.cast, (node,), self.ops.cast_kwargs(node, dt), like=w)
                added.append(node)
        return node, added, ""

    def _weight_name(self, w: Node) -> str:
        """``blocks.0.norm.weight_rms_norm``: named after the parameter the weight comes from."""
        specs = {s.arg.name: s for s in self.ep.graph_signature.input_specs if s.target}
        found: list = []
        stack, seen = [w], set()
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n.op == "placeholder" and n.name in specs:
                found.append(specs[n.name])
            stack.extend(n.all_input_nodes)
        found.sort(key=lambda spec: spec.kind != InputKind.PARAMETER)  # a parameter names it best
        return f"{found[0].target}_rms_norm" if found else f"{w.name}_rms_norm"

    def _unit_weight(self, dim: int, dt: Optional[torch.dtype]) -> Node:
        """The constant ``ones([dim])`` (usually made by ``_fold_weights``; here only if a failed fold needs it)."""
        key = (dim, dt)
        if key not in self.units:
            self.units[key] = fold_constant(self.ep, self._unit_weight_node(dim, dt), name_hint=_unit_weight_name(dim, dt))
        return self.units[key]

    def _unit_weight_node(self, dim: int, dt: Optional[torch.dtype]) -> Node:
        first = next(n for n in self.graph.nodes if n.op != "placeholder")
        with self.graph.inserting_before(first):
            return self._call(self.ops.full, ([dim], 1.0), {"dtype": dt}, like=None)

    # graph surgery --------------------------------------------------------------
    def _call(
        self, target: Any, args: tuple, kwargs: Optional[dict] = None, *, like: Optional[Node], val: Any = None
    ) -> Node:
        kwargs = kwargs or {}
        node = self.graph.call_function(target, args, kwargs)
        node.meta["val"] = val if val is not None else _fake_eval(target, args, kwargs, self.fake_mode)
        if like is not None:
            for key in ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node", "debug_handle"):
                if key in like.meta:
                    node.meta[key] = like.meta[key]
        return node

    def _take_over(self, old: Node, new: Node) -> None:
        """Every use of ``old`` reads ``new``, program outputs included."""
        old.replace_all_uses_with(new)
        sig = self.ep.graph_signature
        for i, spec in enumerate(sig.output_specs):
            if isinstance(spec.arg, TensorArgument) and spec.arg.name == old.name:
                sig.output_specs[i] = type(spec)(kind=spec.kind, arg=TensorArgument(name=new.name), target=spec.target)

    def _erase_unused(self, m: RmsNormMatch) -> None:
        """Erase what the match covered and no longer feeds anything, with constants only it read."""
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        candidates = set(m.nodes)
        for n in m.nodes:
            candidates.update(a for a in n.all_input_nodes if a.op in ("placeholder", "call_function"))
        sig = self.ep.graph_signature
        constant_specs = {
            s.arg.name: s
            for s in sig.input_specs
            if s.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
            and isinstance(s.arg, TensorArgument)
        }
        mutated = {s.target for s in sig.output_specs if s.kind.name.endswith("MUTATION")}
        for n in sorted((c for c in candidates if c in order), key=order.__getitem__, reverse=True):
            if n.users or n.graph is not self.graph:
                continue
            if n.op == "call_function" and n in m.nodes:
                self.graph.erase_node(n)
            elif n.op == "call_function" and _is_pure(n):
                self.graph.erase_node(n)  # an eps wrapper (clone, _to_copy) nothing else reads
            elif n.op == "placeholder" and n.name in constant_specs:
                spec = constant_specs[n.name]
                if spec.target in mutated:
                    continue
                self.graph.erase_node(n)
                sig.input_specs.remove(spec)
                if not any(s.target == spec.target for s in sig.input_specs):
                    self.ep.state_dict.pop(spec.target, None)
                    self.ep.constants.pop(spec.target, None)


def _unit_weight_name(dim: int, dt: Optional[torch.dtype]) -> str:
    return f"rms_norm_unit_weight_{dim}_{dtype_name(dt)}"


def _fold_failed(w: Node, exc: ValueError) -> str:
    return f"weight {w.name!r} could not be folded ({exc}): its multiply stays"


def _rounds_before_weight(m: RmsNormMatch) -> str:
    """The op between the norm and its weight multiply that loses precision, named ("" if none)."""
    final = dtype(m.output)
    for n in m.between:
        if is_qdq(n):
            return f"{n.name!r} (quantize/dequantize)"
        narrow = dtype(n)
        if final is not None and narrow is not None and torch.promote_types(narrow, final) != narrow:
            return f"{n.name!r} (a cast to {dtype_name(narrow)})"
    return ""


def _is_pure(node: Node) -> bool:
    from edgeplug.graph.ops import op_schema

    schema = op_schema(node.target)
    return schema is not None and not schema.is_mutable


def _fake_eval(target: Any, args: tuple, kwargs: dict, mode: Any) -> Any:
    """The output metadata of ``target(*args)``, computed on the inputs' fake tensors."""

    def meta(a: Any) -> Any:
        return a.meta.get("val") if isinstance(a, Node) else a

    with mode:
        return target(*torch.fx.node.map_aggregate(args, meta), **torch.fx.node.map_aggregate(kwargs, meta))


def _like(node: Node) -> Any:
    """A fake tensor of ``node``'s shape, dtype and device (contiguous)."""
    v = node.meta["val"]
    with v.fake_mode:
        return torch.empty_like(v, memory_format=torch.contiguous_format)


def _fake_mode(graph: torch.fx.Graph) -> Any:
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode([n.meta.get("val") for n in graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)])
    if mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode()
    return mode


@contextlib.contextmanager
def without_executorch_vulkan_pattern(name: str = "rms_norm") -> Iterator[None]:
    """Keep one of executorch's own Vulkan fusion patterns out of a lowering.

    For the backends that serialize through executorch's Vulkan delegate
    (vulkan, webgpu; their ``BackendSpec.lowering_context``).
    ``VulkanPartitioner`` and ``vulkan_preprocess`` fuse RMSNorm again with
    the ``"rms_norm"`` entry of executorch's pattern registry, which folds
    ``1 + w``, runtime scales, graph-input gammas and weights of shape (1,) or
    (4, D) into ``et_vk.rms_norm`` as a weight the runtime cannot prepack.
    The core has fused what is safe already (and said why it refused the
    rest); the entry is restored on exit, errors included.
    """
    from executorch.backends.vulkan.patterns import fusable_patterns

    entry = fusable_patterns.pop(name, None)
    try:
        yield
    finally:
        if entry is not None:
            fusable_patterns[name] = entry
