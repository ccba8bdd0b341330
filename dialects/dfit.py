"""The ``dfit`` dialect for xDSL: probes that mark runtime boundary points, and typed
views of the on-IR encoding (``dfit.id`` / ``dfit.hash`` and ``dfit:<id>`` NameLocs).

```mlir
dfit.probe "begin" "main/linalg.matmul#0"
dfit.probe "end" "main/linalg.matmul#0" region "dispatch_0"
%t2 = dfit.probe_tensor %t {id = "main/linalg.matmul#0"} : tensor<4x16xf32>
```

The probe fields are attributes, not properties, so that MLIR (which has no ``dfit``
dialect) reads the generic form ``"dfit.probe"() {id = ..., kind = ...}`` as plain
attributes of an unregistered op.
"""

from __future__ import annotations

from typing import ClassVar, Final

from xdsl.dialects.builtin import StringAttr, TensorType
from xdsl.ir import Attribute, Dialect, Operation, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    VarConstraint,
    attr_def,
    base,
    irdl_op_definition,
    operand_def,
    opt_attr_def,
    result_def,
)
from xdsl.utils.exceptions import VerifyException

from dfit_mlir.core import ids, locations

BEGIN: Final = "begin"
END: Final = "end"


@irdl_op_definition
class ProbeOp(IRDLOperation):
    """A runtime boundary point: where the op (or region) with dfit ID ``id`` begins or
    ends."""

    name = "dfit.probe"

    id = attr_def(StringAttr)
    kind = attr_def(StringAttr)
    region = opt_attr_def(StringAttr)

    assembly_format = "$kind $id (`region` $region^)? attr-dict"

    def verify_(self) -> None:
        # IRDL's AnyOf refuses two constraints on the same base (StringAttr), so the
        # enumeration is checked here.
        if self.kind.data not in (BEGIN, END):
            raise VerifyException(f'kind must be "{BEGIN}" or "{END}", got "{self.kind.data}"')

    def __init__(self, kind: str, id: str, region: str | None = None):
        super().__init__(
            attributes={
                "kind": StringAttr(kind),
                "id": StringAttr(id),
                "region": StringAttr(region) if region is not None else None,
            }
        )


@irdl_op_definition
class ProbeTensorOp(IRDLOperation):
    """Traces a tensor value: returns ``input`` unchanged, so that a runtime hook can
    see the value of the op with dfit ID ``id``."""

    name = "dfit.probe_tensor"

    T: ClassVar = VarConstraint("T", base(TensorType))

    input = operand_def(T)
    id = attr_def(StringAttr)
    output = result_def(T)

    assembly_format = "$input attr-dict `:` type($input)"

    def __init__(self, input: SSAValue, id: str):
        super().__init__(
            operands=[input], result_types=[input.type], attributes={"id": StringAttr(id)}
        )


DFIT = Dialect("dfit", [ProbeOp, ProbeTensorOp], [])


def op_id(op: Operation) -> str | None:
    """The op's dfit ID: its ``dfit.id`` attribute, else the ID in its location (the IDs
    stay in locations when the attributes are stripped)."""
    attr = op.attributes.get(ids.ID_ATTR)
    if isinstance(attr, StringAttr):
        return attr.data
    found = dfit_ids_of_location(op.location)
    return found[0] if found else None


def op_hash(op: Operation) -> str | None:
    """The op's structural hash (``dfit.hash``), if it was tagged and not stripped."""
    attr = op.attributes.get(ids.HASH_ATTR)
    return attr.data if isinstance(attr, StringAttr) else None


def dfit_ids_of_location(location: Attribute) -> tuple[str, ...]:
    """Every dfit ID an xDSL location carries (fused and call-site locations included)."""
    from dfit_mlir.passes.xdsl_engine import to_loc

    return locations.dfit_ids(to_loc(location))
