"""aotkit_functional: helpers around functionalization and alias regeneration."""

from ._alias_regeneration import as_plain_tensor as as_plain_tensor
from ._alias_regeneration import regenerate_alias as regenerate_alias
from ._bindings import apply_view_meta_sequence as apply_view_meta_sequence
from ._eager_checks import EagerInplaceChecks as EagerInplaceChecks
from ._eager_checks import has_internal_overlap as has_internal_overlap
from ._eager_checks import (
    needs_python_functionalization as needs_python_functionalization,
)
from ._eager_checks import overlaps_itself as overlaps_itself
from ._eager_checks import python_mode_reason as python_mode_reason
from ._graph_checks import assert_functional_graph as assert_functional_graph
from ._graph_checks import mutable_ops_in_graph as mutable_ops_in_graph
from ._wrap import from_functional as from_functional
from ._wrap import from_native_functional as from_native_functional
from ._wrap import functionalized as functionalized
from ._wrap import has_data_mutation as has_data_mutation
from ._wrap import has_metadata_mutation as has_metadata_mutation
from ._wrap import has_storage_mutation as has_storage_mutation
from ._wrap import input_was_changed as input_was_changed
from ._wrap import is_functional as is_functional
from ._wrap import is_leaf_input as is_leaf_input
from ._wrap import is_multi_output_view as is_multi_output_view
from ._wrap import leaf_inputs as leaf_inputs
from ._wrap import leaf_policy as leaf_policy
from ._wrap import mutation_count as mutation_count
from ._wrap import mutations_hidden_from_autograd as mutations_hidden_from_autograd
from ._wrap import (
    mutations_under_no_grad_or_inference_mode as mutations_under_no_grad_or_inference_mode,
)
from ._wrap import natively_functionalized as natively_functionalized
from ._wrap import recorded_view_chain as recorded_view_chain
from ._wrap import storage_ref as storage_ref
from ._wrap import storage_was_changed as storage_was_changed
from ._wrap import to_functional as to_functional
from ._wrap import to_native_functional as to_native_functional

__all__ = [
    "EagerInplaceChecks",
    "apply_view_meta_sequence",
    "as_plain_tensor",
    "assert_functional_graph",
    "from_functional",
    "from_native_functional",
    "functionalized",
    "has_data_mutation",
    "has_internal_overlap",
    "overlaps_itself",
    "has_metadata_mutation",
    "has_storage_mutation",
    "input_was_changed",
    "is_functional",
    "is_leaf_input",
    "is_multi_output_view",
    "leaf_inputs",
    "leaf_policy",
    "mutable_ops_in_graph",
    "mutation_count",
    "mutations_hidden_from_autograd",
    "mutations_under_no_grad_or_inference_mode",
    "natively_functionalized",
    "needs_python_functionalization",
    "python_mode_reason",
    "recorded_view_chain",
    "regenerate_alias",
    "storage_ref",
    "storage_was_changed",
    "to_functional",
    "to_native_functional",
]
