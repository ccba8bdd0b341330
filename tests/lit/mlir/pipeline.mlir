// Golden test: dfit passes mix with registered MLIR/IREE passes in one textual pipeline;
// IDs are taken before canonicalize/cse and survive them in the locations.
// RUN: dfit opt %s --pass-pipeline='builtin.module(dfit-tag,dfit-strip,canonicalize,cse)' | filecheck %s
// RUN: dfit opt %s --pass-pipeline='builtin.module(dfit-tag,cse)' --no-debuginfo | filecheck %s --check-prefix=KEPT
// RUN: dfit opt %s --pass-pipeline='builtin.module(dfit-tag,dfit-strip)' --no-debuginfo | filecheck %s --check-prefix=STRIP
// RUN: dfit opt %s --pass-pipeline='builtin.module(dfit-tag,iree-util-drop-compiler-hints,func.func(canonicalize))' --no-debuginfo | filecheck %s --check-prefix=IREE
// RUN: not dfit opt %s --pass-pipeline='builtin.module(no-such-pass)' 2>&1 | filecheck %s --check-prefix=BAD

// The two identical adds were tagged separately; once the attributes are stripped CSE
// merges them, and the survivor keeps its own dfit location (the other ID is erased at
// this point, which is what lineage reports as "erased").
// CHECK-LABEL: func.func @f
// CHECK: arith.addf {{.*}}loc([[ADD:#loc[0-9]+]])
// CHECK-NOT: = arith.addf
// CHECK: [[ADD]] = loc("dfit:f/arith.addf#{{[01]}}"(

// With dfit.id attributes still on, CSE sees two different ops and keeps both: this is why
// `dfit compile` strips the attributes before IREE's pipeline runs.
// KEPT: arith.addf {{.*}}dfit.id = "f/arith.addf#{{[01]}}"
// KEPT: arith.addf {{.*}}dfit.id = "f/arith.addf#{{[01]}}"

// IREE passes and nested pipelines mix in too.
// IREE: arith.mulf {{.*}}dfit.id = "f/arith.mulf#0"

// STRIP-NOT: dfit.id
// BAD: dfit: bad pass pipeline 'no-such-pass'

func.func @f(%a: f32) -> f32 {
  %0 = arith.addf %a, %a : f32 loc("m.py":1:1)
  %1 = arith.addf %a, %a : f32 loc("m.py":2:1)
  %2 = arith.mulf %0, %1 : f32 loc("m.py":3:1)
  return %2 : f32
}
