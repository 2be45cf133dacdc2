"""Pass ordering: one backend's passes in run order, from their before/after constraints and ``order``."""

from __future__ import annotations

import difflib

from edgeplug._registry.info import Contribution, who

def order_passes(passes: list[Contribution]) -> list[Contribution]:
    """Passes of one backend in run order: every before/after constraint holds, then (order, as yielded).

    Raises ``ValueError`` naming the passes and plugins for a constraint that
    names no pass, one across stages, or a cycle.
    """
    by_name = {c.record.name: c for c in passes}
    after: dict[str, set[str]] = {name: set() for name in by_name}
    for c in passes:
        p = c.record
        for other, edge in [(o, (o, p.name)) for o in p.after] + [(o, (p.name, o)) for o in p.before]:
            target = by_name.get(other)
            if target is None:
                close = difflib.get_close_matches(other, list(by_name), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(
                    f"pass {p.name!r} from {who(c.plugin)} must run "
                    f"{'after' if other in p.after else 'before'} {other!r}, which is no pass of "
                    f"backend {p.backend!r}{hint}; its passes: {', '.join(sorted(by_name))}"
                )
            if target.record.stage != p.stage:
                raise ValueError(
                    f"pass {p.name!r} ({p.stage} stage, from {who(c.plugin)}) is constrained against "
                    f"{other!r}, which runs in the {target.record.stage} stage; constraints order passes "
                    "of one stage"
                )
            first, then = edge
            after[then].add(first)
    index = {c.record.name: i for i, c in enumerate(passes)}
    done: list[Contribution] = []
    placed: set[str] = set()
    while len(done) < len(passes):
        ready = [n for n in by_name if n not in placed and after[n] <= placed]
        if not ready:
            left = sorted(n for n in by_name if n not in placed)
            cycle = _a_cycle({n: after[n] - placed for n in left})
            raise ValueError(
                f"the before/after constraints of backend {passes[0].record.backend!r} form a cycle: "
                + " -> ".join(f"{n!r} ({who(by_name[n].plugin)})" for n in cycle)
                + "; drop one of these constraints"
            )
        name = min(ready, key=lambda n: (by_name[n].record.order, index[n]))
        placed.add(name)
        done.append(by_name[name])
    return done


def _a_cycle(needs: dict[str, set[str]]) -> list[str]:
    """One cycle in a graph where every node still needs another (name -> names before it)."""
    node = next(iter(needs))
    path: list[str] = []
    while node not in path:
        path.append(node)
        node = sorted(needs[node])[0]
    cycle = path[path.index(node):]
    return [*reversed(cycle), cycle[-1]]


