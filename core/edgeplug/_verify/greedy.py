"""Token-for-token agreement, for a decoder that keeps its KV cache in buffers: greedy generation of
``N`` tokens through the lowered program loaded once (prefill on the example prompt, then one-token
decode steps, its buffers kept between calls), against the eager model doing the same (the quantized
model where the program is quantized). The program runs where verification runs it: the backend's own
runtime where one is found (ExecuTorch's Vulkan runtime, built here), else the ``.pte`` in executorch's
runtime or the delegates on the host kernels, by ``BackendSpec.verify_method``.

Each side follows its own greedy path, so the ids agree up to the first step where they differ; at that
step both sides saw the same tokens, so the difference of their logits there, and eager's margin
(top-1 minus top-2), say whether it is a near-tie broken by rounding or a wrong program. A difference
passes only as such a tie: the logits there within the verification's tolerance, and the margin no
larger than twice their largest difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.utils._pytree as pytree

from edgeplug._backend import Backend
from edgeplug._failures import first_line
from edgeplug._inputs import ExampleInputs, runtime_inputs
from edgeplug._report.records import GreedyCheck
from edgeplug._result import LoweringResult
from edgeplug._verify.compare import compare_output
from edgeplug._verify.targets import LoadedProgram, Target
from edgeplug._verify.steps import keeps_state


def _is_int(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and not x.is_floating_point() and not x.is_complex() and x.dtype != torch.bool


def _token_and_position(leaves: list[Any]) -> tuple[Optional[int], Optional[int]]:
    """The flat index of the token input (an integer [1, S] tensor) and of the positions (a 1-D integer
    tensor of consecutive values: ``cache_position``, ``input_pos``), where the program has them."""
    tokens = next((i for i, x in enumerate(leaves) if _is_int(x) and x.dim() == 2 and x.shape[0] == 1), None)
    positions = None
    for i, x in enumerate(leaves):
        if i != tokens and _is_int(x) and x.dim() == 1 and x.numel() and (x.numel() == 1 or bool((x.diff() == 1).all())):
            positions = i
            break
    return tokens, positions


def _takes_one_token(result: LoweringResult, token_index: int, prompt: int) -> bool:
    """Whether the program's token input takes a single token: its length is dynamic down to 1, or it is 1."""
    ep = result.exported_program
    names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    vals = {n.name: n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"}
    val = vals.get(names[token_index]) if token_index < len(names) else None
    size = val.shape[-1] if val is not None else prompt
    if not isinstance(size, torch.SymInt):
        return int(size) == 1
    r = ep.range_constraints.get(size.node.expr)
    try:
        return r is None or int(r.lower) <= 1
    except (TypeError, ValueError):
        return True


def _last_logits(outputs: list[torch.Tensor]) -> Optional[torch.Tensor]:
    """The logits of the last position: the first floating output of rank >= 2, its last row."""
    for t in outputs:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 2:
            return t.reshape(-1, t.shape[-1])[-1].float()
    return None


def _margin(logits: torch.Tensor) -> float:
    top = torch.topk(logits, 2).values if logits.numel() > 1 else logits
    return float(top[0] - top[1]) if top.numel() > 1 else float("inf")


def greedy_check(
    result: LoweringResult, backend: Backend, target: Target, steps: int, tolerance: Optional[float] = None,
) -> GreedyCheck:
    """Greedy generation of ``steps`` tokens through ``result``'s program, loaded once where ``target`` says
    (the backend's own runtime, executorch's runtime, or the host emulation: ``GreedyCheck.runner`` names
    it), and through its eager reference, compared."""
    check = GreedyCheck(steps=steps)
    prompt = _prompt(result, check)
    if prompt is None:
        return check
    check.reference = "the quantized model" if result.quantization is not None or result.report.quantization else "eager"
    logits = _generate(result, backend, target, prompt, check)
    if logits is not None:
        _compare_paths(check, *logits, tolerance)
    return check


@dataclass
class _Prompt:
    """The program's flat inputs on the example prompt, where its token and position inputs sit, and
    the position of the first decoded token."""

    ep: Any
    leaves: list[Any]
    tokens_at: int
    positions_at: Optional[int]
    start: int

    def step(self, token: int, k: int) -> list[Any]:
        """The flat inputs of decode step ``k`` (0 is the first after the prompt), fed ``token``."""
        flat = list(self.leaves)
        flat[self.tokens_at] = torch.tensor([[token]], dtype=self.leaves[self.tokens_at].dtype)
        if self.positions_at is not None:
            flat[self.positions_at] = torch.tensor([self.start + k], dtype=self.leaves[self.positions_at].dtype)
        return flat

    def structured(self, flat: list[Any]) -> ExampleInputs:
        args, kwargs = pytree.tree_unflatten(flat, self.ep.call_spec.in_spec)
        return ExampleInputs(tuple(args), dict(kwargs))


def _prompt(result: LoweringResult, check: GreedyCheck) -> Optional[_Prompt]:
    """The prompt to generate from, or None with ``check.reason`` saying why there is none."""
    ref = result.reference
    if ref is None or ref.model is None or result.edge is None:
        check.reason = "no eager model to generate with (the lowering holds no eager reference)"
        return None
    if not keeps_state(result.lowered_program()):
        check.reason = (
            "the program keeps no state (no buffer it writes, such as a KV cache): greedy generation needs a "
            "decoder with a cache, whose decode steps take one token each"
        )
        return None
    ep = result.exported_program
    leaves = list(runtime_inputs(ep, ExampleInputs(result.args, result.kwargs)))
    tokens_at, positions_at = _token_and_position(leaves)
    if tokens_at is None:
        check.reason = "no token input found (an integer tensor of shape [1, S]) among the program's inputs"
        return None
    check.prompt_tokens = int(leaves[tokens_at].shape[-1])
    if not _takes_one_token(result, tokens_at, check.prompt_tokens):
        check.reason = (
            f"the program's token input is fixed at {check.prompt_tokens} tokens, so a decode step cannot take "
            "one token: export it with a dynamic sequence length (dynamic_shapes, as optimum-executorch does) "
            "to check greedy generation"
        )
        return None
    start = int(leaves[positions_at][-1]) + 1 if positions_at is not None else check.prompt_tokens
    return _Prompt(ep, leaves, tokens_at, positions_at, start)


def _generate(
    result: LoweringResult, backend: Backend, target: Target, prompt: _Prompt, check: GreedyCheck
) -> Optional[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """Each side's greedy path (ids into ``check``) and its logits at each step: (lowered, eager); None
    with ``check.reason`` where a side stops."""
    eager = result.reference.model
    eager.reset()
    lowered_logits: list[torch.Tensor] = []
    eager_logits: list[torch.Tensor] = []
    side = "the lowered program"
    try:
        with LoadedProgram(result, backend, target) as program:
            check.runner = program.label
            for side, run, logits, ids in (
                ("the lowered program", program, lowered_logits, check.lowered_ids),
                ("eager", lambda flat: eager(prompt.structured(flat)).outputs, eager_logits, check.reference_ids),
            ):
                flat = prompt.leaves
                for k in range(check.steps):
                    last = _last_logits(run(flat))
                    if last is None:
                        check.reason = f"{side} returned no floating output of rank >= 2 (the logits) to take a token from"
                        return None
                    logits.append(last)
                    ids.append(int(last.argmax()))
                    flat = prompt.step(ids[-1], k)
    except Exception as exc:  # a step the runtime or the model refuses: the check says where, and fails
        done = len(check.lowered_ids) if side == "the lowered program" else len(check.reference_ids)
        check.reason = f"generation stopped at step {done} of {check.steps} in {side}: {first_line(exc)}"
        return None
    finally:
        eager.reset()
    return lowered_logits, eager_logits


def _compare_paths(
    check: GreedyCheck, lowered_logits: list[torch.Tensor], eager_logits: list[torch.Tensor], tolerance: Optional[float]
) -> None:
    """The first step where the ids part, and whether it is a near-tie (``check``'s fields, module docstring)."""
    differ = next((i for i, (a, b) in enumerate(zip(check.lowered_ids, check.reference_ids)) if a != b), None)
    check.ran = True
    if differ is None:
        return
    check.first_difference = differ
    check.margin = _margin(eager_logits[differ])
    at = compare_output(0, lowered_logits[differ], eager_logits[differ], tolerance, f"step {differ} logits")
    check.logits_max_abs_diff = at.max_abs_diff
    check.tie = at.passed and check.margin <= 2 * at.max_abs_diff


__all__ = ["greedy_check"]
