// Synthetic test input (written for the tests): an initializer that dispatches (f16 -> f32
// weights, as TFLite models get), then main uses the global. Compile with
// --iree-opt-const-eval=false, or IREE evaluates the initializer at compile time.
#map = affine_map<(d0, d1) -> (d0, d1)>
module @init {
  util.global private mutable @src = dense<1.5> : tensor<64x64xf16>
  util.global private mutable @w : tensor<64x64xf32>
  util.initializer {
    %c = util.global.load @src : tensor<64x64xf16>
    %e = tensor.empty() : tensor<64x64xf32>
    %g = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%c : tensor<64x64xf16>) outs(%e : tensor<64x64xf32>) {
    ^bb0(%a: f16, %o: f32):
      %v = arith.extf %a : f16 to f32
      linalg.yield %v : f32
    } -> tensor<64x64xf32>
    util.global.store %g, @w : tensor<64x64xf32>
    util.return
  }
  func.func @main(%x: tensor<8x64xf32>) -> tensor<8x64xf32> {
    %w = util.global.load @w : tensor<64x64xf32>
    %zero = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<8x64xf32>
    %f = linalg.fill ins(%zero : f32) outs(%e : tensor<8x64xf32>) -> tensor<8x64xf32>
    %m = linalg.matmul ins(%x, %w : tensor<8x64xf32>, tensor<64x64xf32>) outs(%f : tensor<8x64xf32>) -> tensor<8x64xf32>
    return %m : tensor<8x64xf32>
  }
}
