// Golden test: dfit-tag on the MLIR engine stamps readable IDs, structural hashes and a
// dfit NameLoc wrapping the original location, keeping file:line:col and call sites.
// RUN: dfit opt --dfit-tag %s | filecheck %s
// RUN: dfit opt --dfit-tag --no-debuginfo %s | filecheck %s --check-prefix=ATTRS

// CHECK-LABEL: func.func @mlp
// CHECK: linalg.matmul {{.*}}loc([[MM:#loc[0-9]+]])
// CHECK: linalg.generic
// CHECK: arith.maximumf {{.*}}loc([[MAX:#loc[0-9]+]])
// CHECK-DAG: [[MM]] = loc("dfit:mlp/linalg.matmul#0"([[MMSRC:#loc[0-9]+]]))
// CHECK-DAG: [[MMSRC]] = loc(callsite({{.*}} at {{.*}}))
// CHECK-DAG: [[MAX]] = loc("dfit:mlp/linalg.generic#0/arith.maximumf#0"(
// CHECK-DAG: loc("model.py":10:3)

// ATTRS: func.func @mlp{{.*}}attributes {dfit.hash = "{{[0-9a-f]+}}", dfit.id = "mlp"}
// ATTRS: linalg.matmul {dfit.hash = "{{[0-9a-f]+}}", dfit.id = "mlp/linalg.matmul#0"}
// ATTRS: dfit.id = "mlp/linalg.generic#0"
// ATTRS: arith.maximumf %{{.*}}, %{{.*}} {dfit.hash = "{{[0-9a-f]+}}", dfit.id = "mlp/linalg.generic#0/arith.maximumf#0"}
// ATTRS: return {dfit.hash = "{{[0-9a-f]+}}", dfit.id = "mlp/func.return#0"}

#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @mlp(%x: tensor<4x16xf32>, %w: tensor<16x32xf32>) -> tensor<4x32xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x32xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x32xf32>) -> tensor<4x32xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<4x16xf32>, tensor<16x32xf32>) outs(%f : tensor<4x32xf32>) -> tensor<4x32xf32> loc(callsite("model.py":10:3 at "train.py":42:7))
  %r = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%mm : tensor<4x32xf32>) outs(%e : tensor<4x32xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.maximumf %a, %zero : f32
    linalg.yield %m : f32
  } -> tensor<4x32xf32> loc("model.py":11:3)
  return %r : tensor<4x32xf32>
}
