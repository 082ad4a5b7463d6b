"""aotkit_analysis: the functionalized metadata pass and input/output analysis."""

from ._collect_metadata import collect_metadata as collect_metadata
from ._collect_metadata import input_alias_info as input_alias_info
from ._collect_metadata import tangent_like as tangent_like
from ._collect_metadata import tangent_strides_follow_output as tangent_strides_follow_output
from ._input_layout import AliasedMember as AliasedMember
from ._input_layout import InputLayout as InputLayout
from ._input_layout import MemberEffects as MemberEffects
from ._input_layout import SyntheticBaseGroup as SyntheticBaseGroup
from ._input_layout import compute_input_layout as compute_input_layout
from ._input_layout import may_overlap as may_overlap

__all__ = [
    "AliasedMember",
    "InputLayout",
    "MemberEffects",
    "SyntheticBaseGroup",
    "collect_metadata",
    "compute_input_layout",
    "input_alias_info",
    "may_overlap",
    "tangent_like",
    "tangent_strides_follow_output",
]
