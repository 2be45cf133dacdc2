"""The partitioned graph for Google's Model Explorer, with edgeplug's node data as overlays.

``write_explorer(report, out_dir)`` writes, with Model Explorer's own builders
(the optional extra ``edgeplug[explorer]``, package ``ai-edge-model-explorer``):

- ``graph.json``: ``report.graph`` as a Model Explorer graph collection (node ids
  are the edge graph's node names; namespaces follow the module path, so layers
  fold; each node's attributes hold its op, shape, dtype, partition, CPU reason
  and fusion);
- ``partition.json``: an overlay on every node, coloured by partition (value: the
  partition's index from 1; 0 on the CPU; -1 inputs, weights and outputs);
- ``cpu.json``: 1 on each call node left on the CPU, 0 on the delegated ones;
- ``fusion.json``: 1 on each node a fusion or transform made or touched.

``model-explorer DIR/graph.json --node_data_paths=DIR/partition.json,DIR/cpu.json,DIR/fusion.json`` opens it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from edgeplug._errors import EdgeplugError
from edgeplug._outputs import Data, PathArg, write_files
from edgeplug._report.records import LoweringReport

INSTALL_HINT = "pip install 'edgeplug[explorer]' (Google's ai-edge-model-explorer)"
_PALETTE = ["#9fd4a3", "#a5c8f0", "#f5d38c", "#c9b3ea", "#8fd6d0", "#f3b4c9", "#d8d88f", "#b7c4cf"]
_CPU, _OTHER = "#ffb3ab", "#e8eaed"
OVERLAYS = ("partition.json", "cpu.json", "fusion.json")


def _model_explorer():
    try:  # an optional dependency: Model Explorer's package, for --explore
        from model_explorer import graph_builder, node_data_builder
    except ImportError as exc:
        raise EdgeplugError(f"--explore needs Model Explorer's Python package, which is not installed ({exc}): {INSTALL_HINT}") from exc
    return graph_builder, node_data_builder


def write_explorer(report: LoweringReport, out_dir: str | os.PathLike) -> list[Path]:
    """Write the graph and its overlays into ``out_dir`` (created if missing); return the paths written."""
    gb, nd = _model_explorer()
    if not report.graph:
        raise EdgeplugError("this report holds no graph (it was written before edgeplug recorded one): lower the model again")
    graph_id = f"{report.model} ({report.backend})"
    tags = {p.tag: i for i, p in enumerate(report.partitions)}
    nodes = []
    for n in report.graph:
        attrs = [gb.KeyValue(key=k, value=str(v)) for k, v in (
            ("op", n.op), ("shape", n.shape), ("dtype", n.dtype), ("module", n.module),
            ("partition", n.partition or ("CPU" if n.op not in ("input", "weight", "output") else "")),
            ("cpu_reason", n.reason), ("fusion", n.fusion),
        ) if v]
        label = n.op.split(".")[-2] if n.op.count(".") >= 2 else n.op
        nodes.append(gb.GraphNode(
            id=n.name, label=label, namespace=n.module.replace(".", "/"), attrs=attrs,
            incomingEdges=[gb.IncomingEdge(sourceNodeId=i) for i in n.inputs],
        ))
    collection = gb.GraphCollection(label=f"edgeplug {report.backend}", graphs=[gb.Graph(id=graph_id, nodes=nodes)])

    def overlay(name: str, values: dict) -> str:
        results = {k: nd.NodeDataResult(value=v, bgColor=c) for k, (v, c) in values.items()}
        return nd.ModelNodeData(graphsData={graph_id: nd.GraphNodeData(name=name, results=results)}).to_json_string(indent=1)

    partition, cpu, fusion = {}, {}, {}
    for n in report.graph:
        call = n.op not in ("input", "weight", "output")
        if not call:
            partition[n.name] = (-1, _OTHER)
        elif n.partition:
            i = tags.get(n.partition, 0)
            partition[n.name] = (i + 1, _PALETTE[i % len(_PALETTE)])
        else:
            partition[n.name] = (0, _CPU)
        if call:
            cpu[n.name] = (0, None) if n.partition else (1, _CPU)
        if n.fusion:
            fusion[n.name] = (1, "#c9b3ea")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[PathArg, Data] = {
        out / "graph.json": json.dumps(dataclasses.asdict(collection), indent=1),
        out / "partition.json": overlay("edgeplug partition", partition),
        out / "cpu.json": overlay("edgeplug: left on the CPU", cpu),
        out / "fusion.json": overlay("edgeplug: made by a fusion or transform", fusion),
    }
    write_files(files)
    return [Path(p) for p in files]


def explorer_command(paths: list[Path]) -> str:
    graph, *overlays = paths
    return f"model-explorer {graph} --node_data_paths={','.join(str(p) for p in overlays)}"
