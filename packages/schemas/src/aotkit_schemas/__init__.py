"""aotkit_schemas: the typed data and Protocols every aotkit package speaks."""

from ._alias_info import InputAliasInfo as InputAliasInfo
from ._alias_info import MutationType as MutationType
from ._alias_info import OutputAliasInfo as OutputAliasInfo
from ._alias_info import OutputType as OutputType
from ._alias_info import mutation_can_stay_in_graph as mutation_can_stay_in_graph
from ._artifact_keys import ARTIFACT_KEY_META as ARTIFACT_KEY_META
from ._artifact_keys import ARTIFACT_KEY_PATTERN as ARTIFACT_KEY_PATTERN
from ._artifact_keys import artifact_key as artifact_key
from ._artifact_keys import on_artifact_key as on_artifact_key
from ._artifact_keys import record_artifact_key as record_artifact_key
from ._compile_cache import CacheSidecar as CacheSidecar
from ._compile_cache import CompileCache as CompileCache
from ._compile_cache import Uncacheable as Uncacheable
from ._compile_cache import cache_counters as cache_counters
from ._config import AOTConfig as AOTConfig
from ._config import JointPassError as JointPassError
from ._config import active_joint_passes as active_joint_passes
from ._descriptor_names import grouped_input_lines as grouped_input_lines
from ._descriptor_names import input_name as input_name
from ._descriptors import DESCRIPTOR_CLASSES as DESCRIPTOR_CLASSES
from ._descriptors import AOTInput as AOTInput
from ._descriptors import AOTOutput as AOTOutput
from ._descriptors import BackwardTokenAOTInput as BackwardTokenAOTInput
from ._descriptors import BackwardTokenAOTOutput as BackwardTokenAOTOutput
from ._descriptors import BufferAOTInput as BufferAOTInput
from ._descriptors import DifferentiableAOTInput as DifferentiableAOTInput
from ._descriptors import DifferentiableAOTOutput as DifferentiableAOTOutput
from ._descriptors import DummyAOTInput as DummyAOTInput
from ._descriptors import DummyAOTOutput as DummyAOTOutput
from ._descriptors import ForwardTokenAOTInput as ForwardTokenAOTInput
from ._descriptors import ForwardTokenAOTOutput as ForwardTokenAOTOutput
from ._descriptors import GradAOTOutput as GradAOTOutput
from ._descriptors import InputMutationAOTOutput as InputMutationAOTOutput
from ._descriptors import IntermediateBaseAOTOutput as IntermediateBaseAOTOutput
from ._descriptors import MetadataMutationAOTOutput as MetadataMutationAOTOutput
from ._descriptors import ParamAOTInput as ParamAOTInput
from ._descriptors import PhiloxBackwardBaseOffsetAOTInput as PhiloxBackwardBaseOffsetAOTInput
from ._descriptors import PhiloxBackwardSeedAOTInput as PhiloxBackwardSeedAOTInput
from ._descriptors import PhiloxForwardBaseOffsetAOTInput as PhiloxForwardBaseOffsetAOTInput
from ._descriptors import PhiloxForwardSeedAOTInput as PhiloxForwardSeedAOTInput
from ._descriptors import (
    PhiloxUpdatedBackwardOffsetAOTOutput as PhiloxUpdatedBackwardOffsetAOTOutput,
)
from ._descriptors import PhiloxUpdatedForwardOffsetAOTOutput as PhiloxUpdatedForwardOffsetAOTOutput
from ._descriptors import PlainAOTInput as PlainAOTInput
from ._descriptors import PlainAOTOutput as PlainAOTOutput
from ._descriptors import SavedForBackwardsAOTOutput as SavedForBackwardsAOTOutput
from ._descriptors import SavedForBackwardsNoVcCheckAOTOutput as SavedForBackwardsNoVcCheckAOTOutput
from ._descriptors import SubclassGetAttrAOTInput as SubclassGetAttrAOTInput
from ._descriptors import SubclassGetAttrAOTOutput as SubclassGetAttrAOTOutput
from ._descriptors import SubclassSizeAOTInput as SubclassSizeAOTInput
from ._descriptors import SubclassSizeAOTOutput as SubclassSizeAOTOutput
from ._descriptors import SubclassStrideAOTInput as SubclassStrideAOTInput
from ._descriptors import SubclassStrideAOTOutput as SubclassStrideAOTOutput
from ._descriptors import SyntheticBaseAOTInput as SyntheticBaseAOTInput
from ._descriptors import TangentAOTInput as TangentAOTInput
from ._descriptors import ViewBaseAOTInput as ViewBaseAOTInput
from ._descriptors import descriptor_from_json as descriptor_from_json
from ._descriptors import descriptor_to_json as descriptor_to_json
from ._disk_cache_config import DiskCacheConfig as DiskCacheConfig
from ._disk_cache_config import disk_cache_config as disk_cache_config
from ._disk_cache_config import disk_cache_dir as disk_cache_dir
from ._disk_cache_config import disk_cache_enabled as disk_cache_enabled
from ._donated_inputs import DONATED_BUFFER_KEEP_GRAPH_ERROR as DONATED_BUFFER_KEEP_GRAPH_ERROR
from ._donated_inputs import DONATED_INPUTS_KEY as DONATED_INPUTS_KEY
from ._donated_inputs import DonatedInputs as DonatedInputs
from ._donated_inputs import mark_uses_donated_inputs as mark_uses_donated_inputs
from ._donated_inputs import uses_donated_inputs as uses_donated_inputs
from ._json import JSON_SCHEMA_VERSION as JSON_SCHEMA_VERSION
from ._json import TensorSpec as TensorSpec
from ._json import compiler_cache_key as compiler_cache_key
from ._json import mark_cache_key as mark_cache_key
from ._json import meta_from_json as meta_from_json
from ._json import meta_to_json as meta_to_json
from ._json import raw_type_serializable as raw_type_serializable
from ._json_basics import CacheFormatError as CacheFormatError
from ._json_basics import dtype_from_name as dtype_from_name
from ._json_basics import dtype_name as dtype_name
from ._logging import LogSettings as LogSettings
from ._logging import LogSpecError as LogSpecError
from ._logging import artifact_enabled as artifact_enabled
from ._logging import get_logger as get_logger
from ._logging import log_artifact as log_artifact
from ._logging import parse_log_spec as parse_log_spec
from ._logging import set_logs as set_logs
from ._node_values import StaticSpec as StaticSpec
from ._node_values import dense_and_non_overlapping as dense_and_non_overlapping
from ._node_values import static_value_spec as static_value_spec
from ._node_values import tensor_static_spec as tensor_static_spec
from ._op_aliases import ALIASES_DESPITE_SCHEMA as ALIASES_DESPITE_SCHEMA
from ._op_aliases import aliases_despite_schema as aliases_despite_schema
from ._protocols import RUNTIME_MUTATED_INPUT_KEY as RUNTIME_MUTATED_INPUT_KEY
from ._protocols import CompiledGraph as CompiledGraph
from ._protocols import Compiler as Compiler
from ._protocols import DecompositionTable as DecompositionTable
from ._protocols import Partitioner as Partitioner
from ._protocols import PartitionResult as PartitionResult
from ._protocols import example_inputs_unused as example_inputs_unused
from ._protocols import graph_outputs as graph_outputs
from ._protocols import is_boxed as is_boxed
from ._protocols import is_sym_node as is_sym_node
from ._protocols import mark_example_inputs_unused as mark_example_inputs_unused
from ._protocols import mark_graph_reader as mark_graph_reader
from ._protocols import mark_lazy_unboxed_entry as mark_lazy_unboxed_entry
from ._protocols import mark_stealing_entry as mark_stealing_entry
from ._protocols import mark_unboxed_entry as mark_unboxed_entry
from ._protocols import output_node as output_node
from ._protocols import reads_graph_only as reads_graph_only
from ._protocols import stealing_entry as stealing_entry
from ._protocols import unboxed_entry as unboxed_entry
from ._rng import functionalize_rng as functionalize_rng
from ._rng import functionalize_rng_enabled as functionalize_rng_enabled
from ._rng import set_functionalize_rng as set_functionalize_rng
from ._signatures import FQN as FQN
from ._signatures import BackwardSignature as BackwardSignature
from ._signatures import GraphInputName as GraphInputName
from ._signatures import GraphOutputName as GraphOutputName
from ._signatures import GraphSignature as GraphSignature
from ._subclass_meta import OpaqueMeta as OpaqueMeta
from ._subclass_meta import PlainTensorMeta as PlainTensorMeta
from ._subclass_meta import SubclassCreationMeta as SubclassCreationMeta
from ._subclass_meta import SubclassOrPlainMeta as SubclassOrPlainMeta
from ._subclass_meta import SymbolicOuter as SymbolicOuter
from ._subclass_meta import has_subclass as has_subclass
from ._subclass_meta import num_unwrapped as num_unwrapped
from ._view_and_mutation_meta import ViewAndMutationMeta as ViewAndMutationMeta

__all__ = [
    "descriptor_from_json",
    "descriptor_to_json",
    "grouped_input_lines",
    "input_name",
    "AOTInput",
    "DifferentiableAOTInput",
    "AOTOutput",
    "DifferentiableAOTOutput",
    "ParamAOTInput",
    "BufferAOTInput",
    "DummyAOTInput",
    "PlainAOTInput",
    "SubclassGetAttrAOTInput",
    "SubclassSizeAOTInput",
    "SubclassStrideAOTInput",
    "ViewBaseAOTInput",
    "SyntheticBaseAOTInput",
    "PhiloxForwardSeedAOTInput",
    "PhiloxForwardBaseOffsetAOTInput",
    "PhiloxBackwardSeedAOTInput",
    "PhiloxBackwardBaseOffsetAOTInput",
    "ForwardTokenAOTInput",
    "BackwardTokenAOTInput",
    "TangentAOTInput",
    "PlainAOTOutput",
    "InputMutationAOTOutput",
    "IntermediateBaseAOTOutput",
    "MetadataMutationAOTOutput",
    "GradAOTOutput",
    "PhiloxUpdatedForwardOffsetAOTOutput",
    "PhiloxUpdatedBackwardOffsetAOTOutput",
    "ForwardTokenAOTOutput",
    "BackwardTokenAOTOutput",
    "SubclassGetAttrAOTOutput",
    "SubclassSizeAOTOutput",
    "SubclassStrideAOTOutput",
    "DummyAOTOutput",
    "SavedForBackwardsAOTOutput",
    "SavedForBackwardsNoVcCheckAOTOutput",
    "DESCRIPTOR_CLASSES",
    "JointPassError",
    "active_joint_passes",
    "CacheSidecar",
    "CompileCache",
    "Uncacheable",
    "cache_counters",
    "DiskCacheConfig",
    "disk_cache_config",
    "disk_cache_dir",
    "disk_cache_enabled",
    "JSON_SCHEMA_VERSION",
    "CacheFormatError",
    "TensorSpec",
    "compiler_cache_key",
    "ARTIFACT_KEY_META",
    "ARTIFACT_KEY_PATTERN",
    "artifact_key",
    "on_artifact_key",
    "record_artifact_key",
    "dtype_from_name",
    "dtype_name",
    "mark_cache_key",
    "meta_from_json",
    "meta_to_json",
    "raw_type_serializable",
    "AOTConfig",
    "BackwardSignature",
    "CompiledGraph",
    "Compiler",
    "DecompositionTable",
    "FQN",
    "GraphInputName",
    "GraphOutputName",
    "GraphSignature",
    "InputAliasInfo",
    "LogSettings",
    "LogSpecError",
    "MutationType",
    "OpaqueMeta",
    "OutputAliasInfo",
    "OutputType",
    "PartitionResult",
    "PlainTensorMeta",
    "SubclassCreationMeta",
    "SymbolicOuter",
    "SubclassOrPlainMeta",
    "Partitioner",
    "RUNTIME_MUTATED_INPUT_KEY",
    "ViewAndMutationMeta",
    "functionalize_rng",
    "functionalize_rng_enabled",
    "artifact_enabled",
    "get_logger",
    "graph_outputs",
    "has_subclass",
    "StaticSpec",
    "dense_and_non_overlapping",
    "ALIASES_DESPITE_SCHEMA",
    "aliases_despite_schema",
    "static_value_spec",
    "tensor_static_spec",
    "is_boxed",
    "is_sym_node",
    "log_artifact",
    "example_inputs_unused",
    "mark_example_inputs_unused",
    "mark_graph_reader",
    "mark_lazy_unboxed_entry",
    "mark_stealing_entry",
    "mark_uses_donated_inputs",
    "DONATED_BUFFER_KEEP_GRAPH_ERROR",
    "DONATED_INPUTS_KEY",
    "DonatedInputs",
    "mark_unboxed_entry",
    "mutation_can_stay_in_graph",
    "num_unwrapped",
    "output_node",
    "parse_log_spec",
    "reads_graph_only",
    "set_functionalize_rng",
    "set_logs",
    "stealing_entry",
    "unboxed_entry",
    "uses_donated_inputs",
]
