// Golden test: lineage through IREE's phases on a matmul + bias + relu that IREE fuses
// into one dispatch. The dispatch's root is the matmul; the bias-add/relu generic is
// fused into it; every phase snapshot is listed.
// RUN: dfit compile %s --dfit-tag --mode full -o %t.vmfb > %t.log
// RUN: dfit show %t.manifest.json | filecheck %s

// CHECK: per-stage attribution ({{[0-9]+}} source ops, mode full):
// CHECK-NEXT: stage
// CHECK-NEXT: source
// CHECK-NEXT: input
// CHECK-NEXT: abi
// CHECK-NEXT: preprocessing
// CHECK-NEXT: global-optimization
// CHECK-NEXT: dispatch-creation
// CHECK-NEXT: flow
// CHECK-NEXT: stream
// CHECK-NEXT: executable-sources
// CHECK-NEXT: executable-configurations
// CHECK-NEXT: executable-targets
// CHECK-NEXT: hal
// CHECK-NEXT: vm
// CHECK-NEXT: dispatches: 1/1 call sites and 1/1 exports attributed to source IDs
// CHECK-NEXT: dispatch call sites in program order:
// CHECK-NEXT: #0 dense_dispatch_0_matmul_4x32x16_f32 {{ *}} root dense/linalg.matmul#0; fused: dense/linalg.fill#0, dense/linalg.generic#0{{$}}

#map = affine_map<(d0, d1) -> (d0, d1)>
#bias = affine_map<(d0, d1) -> (d1)>
func.func @dense(%x: tensor<4x16xf32>) -> tensor<4x32xf32> {
  %w = arith.constant dense<0.5> : tensor<16x32xf32>
  %b = arith.constant dense<0.25> : tensor<32xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x32xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x32xf32>) -> tensor<4x32xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<4x16xf32>, tensor<16x32xf32>) outs(%f : tensor<4x32xf32>) -> tensor<4x32xf32> loc("dense.py":5:9)
  %r = linalg.generic {indexing_maps = [#map, #bias, #map], iterator_types = ["parallel", "parallel"]} ins(%mm, %b : tensor<4x32xf32>, tensor<32xf32>) outs(%e : tensor<4x32xf32>) {
  ^bb0(%a: f32, %bb: f32, %o: f32):
    %s = arith.addf %a, %bb : f32
    %m = arith.maximumf %s, %zero : f32
    linalg.yield %m : f32
  } -> tensor<4x32xf32> loc("dense.py":6:9)
  return %r : tensor<4x32xf32>
}
