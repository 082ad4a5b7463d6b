"""What the compile pipeline logs: graph dumps, the partition report, structured traces.

See Note [aotkit loggers] in aotkit_schemas for the logger names and ``AOTKIT_LOGS``.

# Note [Structured trace artifacts]
# Like torch's AOTAutograd, every compilation emits its graphs to torch's structured trace
# (``torch._logging.trace_structured``, written to ``TORCH_TRACE=dir``, read by ``tlparse``)
# under torch's own artifact names, so tlparse's report shows aotkit's graphs where it
# shows torch's:
#     aot_joint_graph, aot_forward_graph, aot_backward_graph, aot_inference_graph
# plus two named ``artifact`` entries: ``aot_forward_graph_fw_metadata`` (the
# ViewAndMutationMeta, as torch) and ``aotkit_partition_report`` (PartitionReport.format()).
# Payloads are built lazily: nothing is formatted unless a trace or log is enabled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch.fx
from aotkit_partitioners import partition_report
from aotkit_schemas import ViewAndMutationMeta, artifact_enabled, get_logger, log_artifact
from torch._logging._internal import getArtifactLogger, trace_structured

capture_log = get_logger("capture")
partition_log = get_logger("partition")


def readable(gm: torch.fx.GraphModule, title: str) -> str:
    """The graph as Python code, each node preceded by the source line that made it
    (its ``stack_trace`` meta), with strides and devices, as torch's ``aot_graphs``."""
    code = gm.print_readable(
        print_output=False, include_stride=True, include_device=True, expanded_def=True
    )
    return f"TRACED GRAPH\n ===== {title} ===== \n{code}"


def _string_payload(gm: torch.fx.GraphModule) -> Callable[[], str]:
    return lambda: gm.print_readable(
        print_output=False, include_stride=True, include_device=True, expanded_def=True
    )


def log_joint(joint: torch.fx.GraphModule, *, single_pass: bool) -> None:
    """The joint graph: the ``joint`` artifact and ``aot_joint_graph``."""
    if capture_log.isEnabledFor(logging.INFO):
        n = sum(1 for node in joint.graph.nodes if node.op == "call_function")
        capture_log.info("traced the joint graph: %d ops (single pass: %s)", n, single_pass)
    if artifact_enabled("joint"):
        log_artifact("joint", "%s", readable(joint, "Joint graph"))
    trace_structured("aot_joint_graph", payload_fn=_string_payload(joint))


def log_inference(gm: torch.fx.GraphModule, meta: ViewAndMutationMeta) -> None:
    """The inference graph: the ``graphs`` artifact and ``aot_inference_graph``."""
    if artifact_enabled("graphs"):
        log_artifact("graphs", "%s", readable(gm, "Inference graph"))
    _log_meta(meta)
    trace_structured("aot_inference_graph", payload_fn=_string_payload(gm))


# torch's logger of the same records: See Note [torch's aot_graphs metadata line]
_TORCH_GRAPHS_LOG = getArtifactLogger("torch._functorch._aot_autograd.graph_compile", "aot_graphs")

# Note [torch's aot_graphs metadata line]
# Before the forward and backward graphs, torch's ``aot_graphs`` artifact logs one line
# with the compilation's metadata, ``aot_config id: N, fw_metadata=ViewAndMutationMeta(...),
# inner_meta=...`` (``bw_donated_idxs=[...]`` included: Note [Donated buffers]), on the
# artifact logger of ``torch._functorch._aot_autograd.graph_compile``. aotkit emits the
# same line on the same logger, so ``TORCH_LOGS=aot_graphs`` and anything listening on
# torch's logger (``assertLogs``) see it from aotkit's compilations too; the ``graphs``
# artifact of aotkit's own loggers gets it as well when asked for by ``AOTKIT_LOGS``.
# aotkit's metadata has no separate inner (subclass-free) form: ``inner_meta`` repeats it.
# A training compilation restored from the disk cache logs the line too, from the stored
# metadata (``bw_donated_idxs`` is part of the entry), so a warm process logs what a cold
# one does.
_META_LINE = "aot_config id: %s, fw_metadata=%s, inner_meta=%s"


def log_metadata(meta: ViewAndMutationMeta, aot_id: int | None) -> None:
    """The metadata line of torch's ``aot_graphs`` artifact. See Note [torch's aot_graphs
    metadata line]."""
    if _TORCH_GRAPHS_LOG.isEnabledFor(logging.INFO):
        _TORCH_GRAPHS_LOG.info(_META_LINE, aot_id, meta, meta)
    own = get_logger("graphs")
    if own.isEnabledFor(logging.INFO):
        own.info(_META_LINE, aot_id, meta, meta)


def _log_meta(meta: ViewAndMutationMeta) -> None:
    trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": "aot_forward_graph_fw_metadata", "encoding": "string"},
        payload_fn=lambda: repr(meta),
    )


def log_restored_partition(
    fw_module: torch.fx.GraphModule,
    bw_module: torch.fx.GraphModule,
    meta: ViewAndMutationMeta,
    aot_id: int | None,
) -> None:
    """What a disk-cache hit logs in place of ``log_partition``: the metadata line (the
    stored ``bw_donated_idxs`` included) and the restored graphs; there is no joint graph
    to report on. See Note [torch's aot_graphs metadata line]."""
    log_metadata(meta, aot_id)
    if artifact_enabled("graphs"):
        log_artifact("graphs", "%s", readable(fw_module, "Forward graph"))
        log_artifact("graphs", "%s", readable(bw_module, "Backward graph"))


def log_partition(
    joint: torch.fx.GraphModule,
    fw_module: torch.fx.GraphModule,
    bw_module: torch.fx.GraphModule,
    num_fwd_outputs: int,
    meta: ViewAndMutationMeta,
    partitioner: str,
    aot_id: int | None = None,
) -> None:
    """The forward and backward graphs and the partition report. See Note [Structured
    trace artifacts]."""
    log_metadata(meta, aot_id)
    if artifact_enabled("graphs"):
        log_artifact("graphs", "%s", readable(fw_module, "Forward graph"))
        log_artifact("graphs", "%s", readable(bw_module, "Backward graph"))
    report_text: list[str] = []

    def report() -> str:
        if not report_text:
            r = partition_report(fw_module, bw_module, num_fwd_outputs, joint)
            report_text.append(f"partitioner {partitioner}: {r.format()}")
        return report_text[0]

    if partition_log.isEnabledFor(logging.INFO):
        partition_log.info("%s", report())
    _log_meta(meta)
    trace_structured("aot_forward_graph", payload_fn=_string_payload(fw_module))
    trace_structured("aot_backward_graph", payload_fn=_string_payload(bw_module))
    trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": "aotkit_partition_report", "encoding": "string"},
        payload_fn=report,
    )
