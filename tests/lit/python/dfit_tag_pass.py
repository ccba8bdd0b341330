# RUN: %PYTHON %s | filecheck %s
# The dfit-tag pass as a Python-defined pass in the PassManager of the MLIR bindings
# bundled with iree.compiler, one @run case per feature; no context outlives its case.

import gc

from iree.compiler import ir, passmanager

from dfit_mlir.passes.mlir_engine import dfit_tag_pass


def run(case):
    print(f"TEST: {case.__name__}")
    case()
    gc.collect()
    assert ir.Context._get_live_count() == 0, "a context outlived its case"
    return case


def run_pipeline(module, *passes):
    """dfit-tag as a Python-defined pass, then the named registered passes."""
    pm = passmanager.PassManager("builtin.module")
    pm.add(dfit_tag_pass, name="DfitTag", argument="dfit-tag")
    for name in passes:
        pm.add(name)
    pm.run(module.operation)


MODULE = """
func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %a : tensor<4xf32> loc("f.py":3:5)
  %1 = math.exp %0 : tensor<4xf32> loc(callsite("f.py":4:5 at "main.py":9:1))
  return %1 : tensor<4xf32>
}
"""


# CHECK-LABEL: TEST: python_pass_in_pipeline
@run
def python_pass_in_pipeline():
    with ir.Context():
        module = ir.Module.parse(MODULE)
        run_pipeline(module, "canonicalize")
        # CHECK: arith.addf {{.*}}dfit.id = "f/arith.addf#0"
        # CHECK: math.exp {{.*}}dfit.id = "f/math.exp#0"
        print(module.operation.get_asm(enable_debug_info=False))


# CHECK-LABEL: TEST: locations_wrap_the_original
@run
def locations_wrap_the_original():
    with ir.Context():
        module = ir.Module.parse(MODULE)
        run_pipeline(module)
        body = module.body.operations[0].regions[0].blocks[0]
        for op in body.operations:
            # CHECK: loc("dfit:f/arith.addf#0"("f.py":3:5))
            # CHECK: loc("dfit:f/math.exp#0"(callsite("f.py":4:5 at "main.py":9:1)))
            print(op.location)


# CHECK-LABEL: TEST: running_twice_is_idempotent
@run
def running_twice_is_idempotent():
    with ir.Context():
        module = ir.Module.parse(MODULE)
        run_pipeline(module)
        once = module.operation.get_asm(enable_debug_info=True)
        run_pipeline(module)
        # CHECK: idempotent: True
        print("idempotent:", once == module.operation.get_asm(enable_debug_info=True))
