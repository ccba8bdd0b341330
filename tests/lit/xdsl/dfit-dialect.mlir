// RUN: xdsl-opt %s | filecheck %s
// RUN: xdsl-opt %s | xdsl-opt | filecheck %s
// RUN: xdsl-opt %s --print-op-generic | filecheck %s --check-prefix=GENERIC

// CHECK-LABEL: func.func @probes
// CHECK-NEXT:    dfit.probe "begin" "probes/linalg.matmul#0"
// CHECK-NEXT:    %{{.*}} = dfit.probe_tensor %{{.*}} {id = "probes/linalg.matmul#0"} : tensor<4x16xf32>
// CHECK-NEXT:    dfit.probe "end" "probes/linalg.matmul#0" region "dispatch_0"
// GENERIC:       "dfit.probe"() {kind = "begin", id = "probes/linalg.matmul#0"} : () -> ()
// GENERIC:       "dfit.probe_tensor"(%{{.*}}) {id = "probes/linalg.matmul#0"} : (tensor<4x16xf32>) -> tensor<4x16xf32>
// GENERIC:       "dfit.probe"() {kind = "end", id = "probes/linalg.matmul#0", region = "dispatch_0"} : () -> ()
func.func @probes(%t: tensor<4x16xf32>) -> tensor<4x16xf32> {
  dfit.probe "begin" "probes/linalg.matmul#0"
  %traced = dfit.probe_tensor %t {id = "probes/linalg.matmul#0"} : tensor<4x16xf32>
  dfit.probe "end" "probes/linalg.matmul#0" region "dispatch_0"
  func.return %traced : tensor<4x16xf32>
}
