"""Analysis tools over the normalized semantic model: the API (:mod:`.api`), the model a
tool sees (:mod:`.model`), the session that drives them (:mod:`.session`), the registry
with its ``dfit.tools`` entry points (:mod:`.registry`) and the built-in tools
(:mod:`.builtin`)."""

from dfit_mlir.analysis.model import Operator, Partition, SemanticModel
from dfit_mlir.analysis.tools.api import HOOKS, Tool, ToolContext
from dfit_mlir.analysis.tools.session import Session, analyze

__all__ = ["HOOKS", "Operator", "Partition", "SemanticModel", "Session", "Tool", "ToolContext", "analyze"]
