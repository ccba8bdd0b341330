// Synthetic test input (written for the tests): four identical matmul+relu blocks, so
// that IREE deduplicates their executables into one export serving four call sites.
#map = affine_map<(d0, d1) -> (d0, d1)>
module @repeated {
  func.func @main(%x: tensor<8x64xf32>, %w: tensor<64x64xf32>) -> tensor<8x64xf32> {
    %zero = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<8x64xf32>
    %f = linalg.fill ins(%zero : f32) outs(%e : tensor<8x64xf32>) -> tensor<8x64xf32>
    %m0 = linalg.matmul ins(%x, %w : tensor<8x64xf32>, tensor<64x64xf32>) outs(%f : tensor<8x64xf32>) -> tensor<8x64xf32> loc("block0"("blocks.py":3:1))
    %r0 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%m0 : tensor<8x64xf32>) outs(%e : tensor<8x64xf32>) {
    ^bb0(%a: f32, %o: f32):
      %v = arith.maximumf %a, %zero : f32
      linalg.yield %v : f32
    } -> tensor<8x64xf32> loc("relu0"("blocks.py":4:1))
    %m1 = linalg.matmul ins(%r0, %w : tensor<8x64xf32>, tensor<64x64xf32>) outs(%f : tensor<8x64xf32>) -> tensor<8x64xf32> loc("block1"("blocks.py":3:1))
    %r1 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%m1 : tensor<8x64xf32>) outs(%e : tensor<8x64xf32>) {
    ^bb0(%a: f32, %o: f32):
      %v = arith.maximumf %a, %zero : f32
      linalg.yield %v : f32
    } -> tensor<8x64xf32> loc("relu1"("blocks.py":4:1))
    %m2 = linalg.matmul ins(%r1, %w : tensor<8x64xf32>, tensor<64x64xf32>) outs(%f : tensor<8x64xf32>) -> tensor<8x64xf32> loc("block2"("blocks.py":3:1))
    %r2 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%m2 : tensor<8x64xf32>) outs(%e : tensor<8x64xf32>) {
    ^bb0(%a: f32, %o: f32):
      %v = arith.maximumf %a, %zero : f32
      linalg.yield %v : f32
    } -> tensor<8x64xf32> loc("relu2"("blocks.py":4:1))
    %m3 = linalg.matmul ins(%r2, %w : tensor<8x64xf32>, tensor<64x64xf32>) outs(%f : tensor<8x64xf32>) -> tensor<8x64xf32> loc("block3"("blocks.py":3:1))
    %r3 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%m3 : tensor<8x64xf32>) outs(%e : tensor<8x64xf32>) {
    ^bb0(%a: f32, %o: f32):
      %v = arith.maximumf %a, %zero : f32
      linalg.yield %v : f32
    } -> tensor<8x64xf32> loc("relu3"("blocks.py":4:1))
    return %r3 : tensor<8x64xf32>
  }
}
