// Synthetic test input (written for the tests): two public functions with distinct
// dispatches (and a private helper that is no entry point); each is run on its own.
#map = affine_map<(d0, d1) -> (d0, d1)>
module @two {
  func.func @first(%x: tensor<16x16xf32>) -> tensor<16x16xf32> {
    %e = tensor.empty() : tensor<16x16xf32>
    %g = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%x : tensor<16x16xf32>) outs(%e : tensor<16x16xf32>) {
    ^bb0(%a: f32, %o: f32):
      %v = math.exp %a : f32
      linalg.yield %v : f32
    } -> tensor<16x16xf32>
    return %g : tensor<16x16xf32>
  }
  func.func @second(%x: tensor<32x32xf32>) -> tensor<32x32xf32> {
    %zero = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<32x32xf32>
    %f = linalg.fill ins(%zero : f32) outs(%e : tensor<32x32xf32>) -> tensor<32x32xf32>
    %m = linalg.matmul ins(%x, %x : tensor<32x32xf32>, tensor<32x32xf32>) outs(%f : tensor<32x32xf32>) -> tensor<32x32xf32>
    %g = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%m : tensor<32x32xf32>) outs(%e : tensor<32x32xf32>) {
    ^bb0(%a: f32, %o: f32):
      %v = math.exp %a : f32
      linalg.yield %v : f32
    } -> tensor<32x32xf32>
    return %g : tensor<32x32xf32>
  }
  func.func private @helper(%x: tensor<16x16xf32>) -> tensor<16x16xf32> {
    return %x : tensor<16x16xf32>
  }
}
