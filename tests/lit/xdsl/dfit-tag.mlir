// RUN: xdsl-opt -p dfit-tag %s | filecheck %s
// RUN: xdsl-opt -p dfit-tag --print-debuginfo %s | filecheck %s --check-prefix=LOC
// Re-tagging is idempotent: the same IDs, and no nested dfit NameLocs.
// RUN: xdsl-opt -p dfit-tag,dfit-tag --print-debuginfo %s | filecheck %s --check-prefix=LOC

// The module itself gets no ID (no attributes after its name).
// CHECK:     {{^}}builtin.module {{\{$}}

// A symbol's ID is its name; ops are numbered per name within their scope.
// CHECK:      func.func private @helper(%{{.*}}: f32, %{{.*}}: f32) -> f32 attributes {dfit.id = "helper", dfit.hash = "a35f54a96f76abdd"}
// CHECK-NEXT:   arith.constant {dfit.id = "helper/arith.constant#0", dfit.hash = "ca263441bfdec240"} 2.500000e+00 : f32
// CHECK-NEXT:   arith.mulf %{{.*}}, %{{.*}} {dfit.id = "helper/arith.mulf#0", dfit.hash = "959c25a262357ba4"} : f32
// CHECK-NEXT:   arith.addf %{{.*}}, %{{.*}} fastmath<fast> {dfit.id = "helper/arith.addf#0", dfit.hash = "be9ebb495a651c7f"} : f32
// CHECK-NEXT:   func.return {dfit.id = "helper/func.return#0", dfit.hash = "9a3ddf7f212f15d7"}
// LOC:        func.func private @helper
// LOC:          arith.constant {{.*}} loc("dfit:helper/arith.constant#0"("model.py":3:10))
// LOC-NOT:      "dfit:{{[^"]*}}"("dfit:
func.func private @helper(%a: f32, %b: f32) -> f32 {
  %c = arith.constant 2.5 : f32 loc("model.py":3:10)
  %m = arith.mulf %a, %c : f32
  %s = arith.addf %m, %b fastmath<fast> : f32
  return %s : f32
}

// Ops in the region of a non-symbol op are scoped under that op's ID. Constants are
// numbered by structural hash, not by printing order.
// CHECK:      func.func @loop
// CHECK-NEXT:   arith.constant {dfit.id = "loop/arith.constant#2", dfit.hash = "bfc3aeeceb53b3a7"} 0 : index
// CHECK-NEXT:   arith.constant {dfit.id = "loop/arith.constant#0", dfit.hash = "687314dc3434efa2"} 1 : index
// CHECK-NEXT:   arith.constant {dfit.id = "loop/arith.constant#1", dfit.hash = "8af2ff5b8bbc4eee"} 1.000000e+00 : f32
// CHECK-NEXT:   scf.for
// CHECK-NEXT:     func.call @helper(%{{.*}}, %{{.*}}) {dfit.id = "loop/scf.for#0/func.call#0", dfit.hash = "5e6cd2d9f34f9528"}
// CHECK-NEXT:     arith.negf %{{.*}} {dfit.id = "loop/scf.for#0/arith.negf#0", dfit.hash = "f118c1d8c4871b65"}
// CHECK-NEXT:     scf.yield {dfit.id = "loop/scf.for#0/scf.yield#0", dfit.hash = "24227a20f54400b2"}
// CHECK-NEXT:   } {dfit.id = "loop/scf.for#0", dfit.hash = "10840643afbab7f5"}
// The original location stays inside the dfit NameLoc; a stale dfit NameLoc is replaced.
// LOC:        func.func @loop
// LOC:          arith.constant {{.*}} 1.000000e+00 : f32 loc("dfit:loop/arith.constant#1"("model.py":9:12))
func.func @loop(%n: index, %init: f32) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %one = arith.constant 1.0 : f32 loc("dfit:stale/arith.constant#9"("model.py":9:12))
  %r = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %init) -> (f32) {
    %x = func.call @helper(%acc, %one) : (f32, f32) -> f32
    %y = arith.negf %x : f32
    scf.yield %y : f32
  }
  return %r : f32
}

// The same body printed in another order gets the same IDs and hashes.
// CHECK:      func.func @loop_reordered
// CHECK-NEXT:   arith.constant {dfit.id = "loop_reordered/arith.constant#1", dfit.hash = "8af2ff5b8bbc4eee"} 1.000000e+00 : f32
// CHECK-NEXT:   arith.constant {dfit.id = "loop_reordered/arith.constant#0", dfit.hash = "687314dc3434efa2"} 1 : index
// CHECK-NEXT:   arith.constant {dfit.id = "loop_reordered/arith.constant#2", dfit.hash = "bfc3aeeceb53b3a7"} 0 : index
// CHECK-NEXT:   scf.for
// CHECK-NEXT:     func.call @helper(%{{.*}}, %{{.*}}) {dfit.id = "loop_reordered/scf.for#0/func.call#0", dfit.hash = "5e6cd2d9f34f9528"}
func.func @loop_reordered(%n: index, %init: f32) -> f32 {
  %one = arith.constant 1.0 : f32
  %c1 = arith.constant 1 : index
  %c0 = arith.constant 0 : index
  %r = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %init) -> (f32) {
    %x = func.call @helper(%acc, %one) : (f32, f32) -> f32
    %y = arith.negf %x : f32
    scf.yield %y : f32
  }
  return %r : f32
}
