"""What the Vulkan delegate's preprocess does to constants, for host verification.

Host verification interprets a delegate's graph as the partitioner left it
(``LoweredBackendModule.original_module``) and reads every constant back from
the bytes the ``.pte`` carries (the delegate's named data, keyed by the sha256
of the stored bytes). executorch's Vulkan preprocess changes some constants
before it stores them, so the stored bytes of those constants are not the
bytes of the graph's tensors:

- a batch norm whose input is a convolution (or linear) with constant weights
  is folded into that op: the named data holds the folded weight and bias,
  none of the batch norm's tensors, and not the unfolded weight;
- a linear whose weight is ``dequantize_per_channel(int8 weight, scales,
  zero points)`` becomes one weight-only quantized op: with all-zero zero
  points (symmetric quantization) the zero points are not stored at all, and
  a weight whose values fit in 4 bits is stored packed, two values per byte;
- a linear whose weight is torchao's ``dequantize_affine(int8 weight, [1, group],
  scales, zero points)`` (the ``w4-g32`` source transform) becomes
  ``et_vk.linear_q4gsw``: the weight packed two values a byte, the scales
  transposed to ``[groups, N]``, no zero points.

``VulkanConstants`` mirrors those rules: it folds each such batch norm
into a copy of the graph only where the named data holds the folded tensors,
reads 4-bit weights back from their packed bytes, and accepts a missing zero
point only when the program's own value is all zeros and the quantized
weight is one the preprocess treats as symmetric. Anything else still fails
loud: a constant is never read as zeros because it is missing.
"""

from __future__ import annotations

import copy
import operator
from collections import Counter
from typing import Any, Optional

import torch
from torch.fx import Node

from edgeplug.plugin import aten_overload

#: the batch norm ops the preprocess folds
_BATCH_NORMS = ("_native_batch_norm_legit_no_training.default", "native_batch_norm.default")


def _op(node: Any) -> str:
    # "aten.linear.default", for aten and edge ops alike
    if not (isinstance(node, Node) and node.op == "call_function"):
        return ""
    return str(aten_overload(node.target))  # an edge op wraps its aten overload


def _is_linear(node: Any) -> bool:
    return _op(node) == "aten.linear.default"


def _is_conv(node: Any) -> bool:
    return _op(node) == "aten.convolution.default"


def _is_batch_norm(node: Any) -> bool:
    return _op(node) in {f"aten.{t}" for t in _BATCH_NORMS}


def _is_dequant_per_channel(node: Any) -> bool:
    return _op(node) == "quantized_decomposed.dequantize_per_channel.default"


def _is_torchao_dequant(node: Any) -> bool:
    return _op(node) == "torchao.dequantize_affine.default"


def _is_dequant_per_tensor(node: Any) -> bool:
    return _op(node).startswith("quantized_decomposed.dequantize_per_tensor.")


def _weight_of_linear(weight: Node, user: Node) -> bool:
    """Whether ``user`` uses ``weight`` as the weight of a linear whose input is float."""
    if _is_linear(user):
        return len(user.args) > 1 and user.args[1] is weight and not _is_dequant_per_tensor(user.args[0])
    if _op(user) == "aten.permute_copy.default" and list(user.args[1]) == [1, 0] and user.users:
        for mm in user.users:
            if _op(mm) == "aten.addmm.default" and len(mm.args) > 2 and mm.args[2] is user:
                activations = [mm.args[1]]
            elif _op(mm) == "aten.mm.default" and mm.args[1] is user:
                activations = [mm.args[0]]
            elif _op(mm) == "aten.expand_copy.default" and mm.users:
                # a linear of a 3-d input exported as matmul: permute, expand to batch 1, bmm (Mamba's x_proj);
                # the preprocess matches a bmm of batch 1 too
                bmms = list(mm.users)
                if not all(_op(b) == "aten.bmm.default" and b.args[1] is mm and _batch(b) == 1 for b in bmms):
                    return False
                activations = [b.args[0] for b in bmms]
            else:
                return False
            if any(_is_dequant_per_tensor(a) for a in activations):
                return False
        return True
    return False


def _batch(node: Node) -> Optional[int]:
    """The leading size of ``node``'s output (None where the graph does not say)."""
    val = node.meta.get("val")
    return int(val.shape[0]) if isinstance(val, torch.Tensor) and val.dim() else None


def pack_int4(weight: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7] of shape (M, K) -> uint8 (M, ceil(K / 2)): value + 8, even columns high."""
    w = weight.reshape(weight.shape[0], -1) if weight.dim() != 2 else weight
    if w.shape[1] % 2:
        w = torch.nn.functional.pad(w, (0, 1))
    u = (w.to(torch.int16) + 8).to(torch.uint8)
    return (u[:, 0::2] << 4) | u[:, 1::2]


def unpack_int4(packed: torch.Tensor, columns: int) -> torch.Tensor:
    """The inverse of ``pack_int4``: the first ``columns`` int8 values of each row."""
    high = (packed >> 4).to(torch.int16) - 8
    low = (packed & 0xF).to(torch.int16) - 8
    both = torch.stack((high, low), dim=-1).reshape(packed.shape[0], -1)
    return both[:, :columns].to(torch.int8)


def storage_dtypes(compile_specs: Any) -> dict[torch.dtype, torch.dtype]:
    """dtype -> the dtype the Vulkan delegate holds it in, under ``compile_specs``.

    The rule is executorch's own: its compile-spec parser and
    ``VkGraphBuilder.get_effective_dtype`` (64-bit values held as 32-bit unless
    ``downcast_64_bit`` is off, fp32 as fp16 with ``force_fp16``), with the
    defaults ``vulkan_preprocess`` applies.
    """
    from types import SimpleNamespace

    from executorch.backends.vulkan.serialization.vulkan_graph_builder import VkGraphBuilder
    from executorch.backends.vulkan.vulkan_preprocess import parse_compile_spec

    options = parse_compile_spec(list(compile_specs or ()))
    flags = SimpleNamespace(
        downcast_64_bit=options.get("downcast_64_bit", True), force_fp16=options.get("force_fp16", False)
    )
    out = {}
    for dtype in (torch.int64, torch.float64, torch.float32):
        held = VkGraphBuilder.get_effective_dtype(flags, dtype)
        if held != dtype:
            out[dtype] = held
    return out


class VulkanConstants:
    """One Vulkan delegate's constants as its preprocess stores them.

    ``storage_dtypes(compile_specs)`` gives host verification the dtypes the
    delegate computes in (``int64`` as ``int32`` by default).
    """

    storage_dtypes = staticmethod(storage_dtypes)

    def __init__(self, original: Any, named: Any) -> None:
        self.original = original
        self.named = named
        self.counts: Counter = Counter()
        #: constants read back from the named data by these rules
        self.read = 0
        self.graph_module = self._fold_batch_norms()

    # batch norm ---------------------------------------------------------------------
    def _constant(self, node: Any) -> Optional[torch.Tensor]:
        if not isinstance(node, Node) or node.op != "placeholder":
            return None
        for spec in self.original.graph_signature.input_specs:
            if spec.arg.name == node.name and spec.kind.name in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
                ep = self.original
                return ep.state_dict.get(spec.target, ep.constants.get(spec.target))
        return None

    def _fold_batch_norms(self) -> torch.fx.GraphModule:
        gm = self.original.graph_module
        plans = []
        for node in gm.graph.nodes:
            if not (_is_conv(node) or _is_linear(node)) or len(node.users) != 1:
                continue
            bn = next(iter(node.users))
            if not _is_batch_norm(bn) or bn.args[0] is not node:
                continue
            if any(u.target is not operator.getitem or u.args[1] != 0 for u in bn.users):
                continue
            weight = self._constant(node.args[1])
            bias_arg = node.args[2] if len(node.args) > 2 else None
            bias = self._constant(bias_arg) if bias_arg is not None else None
            if weight is None or (bias_arg is not None and bias is None):
                continue
            params = [self._constant(a) for a in bn.args[1:5]]  # weight, bias, running mean, running var
            if any(p is None for p in params):
                continue
            if _is_conv(node):
                rank = getattr(node.args[0].meta.get("val"), "dim", lambda: 0)()
                if rank not in (3, 4):
                    continue
            folded = self._folded(node, bn, weight, bias, params)
            if folded is not None:
                plans.append((node, bn, folded))
        if not plans:
            return gm
        gm = copy.deepcopy(gm)
        by_name = {n.name: n for n in gm.graph.nodes}
        for i, (node, bn, (w, b, _wkey, _bkey)) in enumerate(plans):
            op, norm = by_name[node.name], by_name[bn.name]
            attrs = []
            for t, what in ((w, "weight"), (b, "bias")):
                attr = f"_edgeplug_bn_folded_{what}_{i}"
                setattr(gm, attr, t)
                with gm.graph.inserting_before(op):
                    attrs.append(gm.graph.get_attr(attr))
            args = list(op.args)
            args[1] = attrs[0]
            if len(args) > 2:
                args[2] = attrs[1]
            else:
                args.append(attrs[1])
            op.args = tuple(args)
            for user in list(norm.users):
                user.replace_all_uses_with(op)
                gm.graph.erase_node(user)
            gm.graph.erase_node(norm)
            self.counts["batch norms folded into their op"] += 1
        gm.graph.lint()
        gm.recompile()
        return gm

    def _folded(self, node: Node, bn: Node, weight, bias, params) -> Optional[tuple]:
        """(weight, bias, keys) read back from the named data, or None where it lacks them."""
        from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights

        bn_w, bn_b, mean, var = params
        eps = bn.args[-1]
        with torch.no_grad():
            if _is_conv(node):
                fw, fb = fuse_conv_bn_weights(weight, bias, mean, var, eps, bn_w, bn_b, bool(node.args[6]))
            else:
                fw, fb = fuse_linear_bn_weights(weight, bias, mean, var, eps, bn_w, bn_b)
        fw_found, fb_found = self.named.resolve(fw.detach()), self.named.resolve(fb.detach())
        if fw_found is None or fb_found is None:
            return None
        (wkey, w), (bkey, b) = fw_found, fb_found
        self.read += 2
        return w, b, wkey, bkey

    # weight-only quantized linear ------------------------------------------------------
    def _symmetric_weight_dequants(self, placeholder: Node, position: int) -> list[Node]:
        """The dequantize_per_channel nodes that take ``placeholder`` at ``position`` and are the int8
        weight of a linear with a float (not dequantized) input: the preprocess's weight-only pattern.

        The linear may appear as ``linear(x, w)`` or, decomposed, as ``addmm(b, x, permute(w))`` /
        ``mm(x, permute(w))``, which the preprocess turns back into a linear first."""
        users = list(placeholder.users)
        if not users or not all(_is_dequant_per_channel(u) and len(u.args) > position and u.args[position] is placeholder for u in users):
            return []
        for dq in users:
            weight = self._constant(dq.args[0])
            if weight is None or weight.dtype != torch.int8 or not dq.users:
                return []
            if not all(_weight_of_linear(dq, u) for u in dq.users):
                return []
        return users
    def resolve(self, placeholder_name: str, tensor: torch.Tensor) -> Optional[tuple[Optional[str], torch.Tensor, str]]:
        """(named-data key or None, value, what rule) for a constant the named data lacks as it is."""
        node = next((n for n in self.original.graph_module.graph.nodes if n.op == "placeholder" and n.name == placeholder_name), None)
        if node is None:
            return None
        # all-zero zero points of a symmetric weight: the quantized op implies them, nothing is stored
        dqs = self._symmetric_weight_dequants(node, 2)
        if dqs and tensor.numel() and not bool(tensor.any()):
            self.counts["all-zero weight zero points implied (symmetric)"] += 1
            return None, tensor.detach(), "zero point"
        # a 4-bit weight: stored packed, two values per byte
        dqs = self._symmetric_weight_dequants(node, 0)
        if dqs and tensor.dtype == torch.int8 and tensor.dim() == 2 and tensor.numel():
            if int(tensor.min()) >= -8 and int(tensor.max()) <= 7:
                found = self.named.resolve(pack_int4(tensor.detach()))
                if found is not None:
                    key, packed = found
                    self.counts["4-bit weights read from their packed bytes"] += 1
                    return key, unpack_int4(packed, tensor.shape[1]), "packed int4"
        return self._torchao_int4(node, tensor)

    # torchao's grouped int4 weight (a source-transform scheme) -------------------------
    def _torchao_weight_dequants(self, placeholder: Node, position: int) -> list[Node]:
        """The ``torchao.dequantize_affine`` nodes taking ``placeholder`` at ``position`` (0 weight, 2 scales,
        3 zero points) whose int8 weight, grouped along its rows (block ``[1, group]``), is a linear's weight
        with a float input: what the preprocess turns into ``et_vk.linear_q4gsw``."""
        users = list(placeholder.users)
        if not users or not all(_is_torchao_dequant(u) and len(u.args) > 3 and u.args[position] is placeholder for u in users):
            return []
        for dq in users:
            weight = self._constant(dq.args[0])
            block = list(dq.args[1])
            if weight is None or weight.dtype != torch.int8 or weight.dim() != 2 or len(block) != 2 or block[0] != 1:
                return []
            if not dq.users or not all(_weight_of_linear(dq, u) for u in dq.users):
                return []
        return users

    def _torchao_int4(self, node: Node, tensor: torch.Tensor) -> Optional[tuple[Optional[str], torch.Tensor, str]]:
        """How the preprocess stores torchao's int4 linear: the weight packed two values a byte (rows padded to
        a multiple of 8 values), the scales transposed to [groups, N] (N padded to a multiple of 4), no zero
        points (the op implies zeros: accepted only where the program's are all zeros)."""
        from executorch.backends.vulkan.patterns.weight_packing_utils import pack_4bit_weight_tensor

        t = tensor.detach()
        if self._torchao_weight_dequants(node, 3):
            if t.numel() and not bool(t.any()):
                self.counts["all-zero weight zero points implied (torchao int4)"] += 1
                return None, t, "zero point"
            return None
        if self._torchao_weight_dequants(node, 0) and t.dtype == torch.int8 and t.numel():
            if int(t.min()) < -8 or int(t.max()) > 7:
                return None
            found = self.named.resolve(pack_4bit_weight_tensor(t))
            if found is None:
                return None
            key, packed = found
            pairs = packed.to(torch.int16)
            values = torch.stack(((pairs & 0xF) - 8, (pairs >> 4) - 8), dim=-1).reshape(packed.shape[0], -1)
            self.counts["torchao int4 weights read from their packed bytes"] += 1
            return key, values[:, : t.shape[1]].to(torch.int8), "packed int4 (torchao)"
        if self._torchao_weight_dequants(node, 2) and t.dim() == 2 and t.numel():
            scales = t.transpose(0, 1).contiguous()
            if scales.shape[-1] % 4:
                scales = torch.nn.functional.pad(scales, (0, 4 - scales.shape[-1] % 4))
            found = self.named.resolve(scales)
            if found is None:
                return None
            key, stored = found
            self.counts["torchao int4 scales read transposed"] += 1
            return key, stored[:, : t.shape[0]].transpose(0, 1).contiguous(), "transposed scales (torchao)"
        return None

    def note(self) -> str:
        return ", ".join(f"{n} {what}" for what, n in sorted(self.counts.items()))
