// Golden test: function-boundary probes. Every function with a body calls the optional
// import @dfit.probe(site, edge) on entry (edge 0) and before each return (edge 1); the
// in-module fallback keeps the vmfb runnable without dfit's hook module.
// RUN: dfit opt %s --pass-pipeline='builtin.module(dfit-tag,dfit-strip,dfit-probes)' --no-debuginfo | filecheck %s
// RUN: dfit opt %s --pass-pipeline='builtin.module(dfit-probes,dfit-probes)' --no-debuginfo | filecheck %s --check-prefix=ONCE

// CHECK: func.func private @dfit.probe(i32, i32) attributes {vm.fallback = @dfit_probe_fallback}
// CHECK: func.func private @dfit_probe_fallback(%{{.*}}: i32, %{{.*}}: i32)
// CHECK-NEXT: util.optimization_barrier

// CHECK-LABEL: func.func @main
// CHECK: %[[SITE0:.+]] = arith.constant 0 : i32
// CHECK: %[[BEGIN:.+]] = arith.constant 0 : i32
// CHECK: call @dfit.probe(%[[SITE0]], %[[BEGIN]])
// CHECK: call @helper
// CHECK: %[[SITE1:.+]] = arith.constant 1 : i32
// CHECK: %[[END:.+]] = arith.constant 1 : i32
// CHECK: call @dfit.probe(%[[SITE1]], %[[END]])
// CHECK-NEXT: return

// Two returns, two end probes (sites 3 and 4 after helper's begin at 2).
// CHECK-LABEL: func.func private @helper
// CHECK: arith.constant 2 : i32
// CHECK: call @dfit.probe
// CHECK: cf.cond_br
// CHECK: arith.constant 3 : i32
// CHECK: call @dfit.probe
// CHECK-NEXT: return
// CHECK: arith.constant 4 : i32
// CHECK: call @dfit.probe
// CHECK-NEXT: return

// Declarations are not probed, and a second run adds nothing.
// CHECK-NOT: call @dfit.probe
// ONCE-COUNT-5: call @dfit.probe(
// ONCE-NOT: call @dfit.probe(

func.func @main(%a: f32, %c: i1) -> f32 {
  %0 = call @helper(%a, %c) : (f32, i1) -> f32
  return %0 : f32
}

func.func private @helper(%a: f32, %c: i1) -> f32 {
  cf.cond_br %c, ^neg, ^pos
^neg:
  %n = arith.negf %a : f32
  return %n : f32
^pos:
  return %a : f32
}

func.func private @external(f32) -> f32
