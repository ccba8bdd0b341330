// Synthetic test input (written for the tests): loop.mlir with exp before and after the
// loop, so IREE deduplicates both into one export recorded in two command buffers (which
// local-sync, numbering no commands, tells apart only by the buffers' creation order).
#map = affine_map<(d0, d1) -> (d0, d1)>
module @loop_shared_export {
  func.func @main(%x: tensor<16x16xf32>, %n: tensor<i32>) -> tensor<16x16xf32> {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %ni = tensor.extract %n[] : tensor<i32>
    %nn = arith.index_cast %ni : i32 to index
    %e = tensor.empty() : tensor<16x16xf32>
    %pre = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%x : tensor<16x16xf32>) outs(%e : tensor<16x16xf32>) {
    ^bb0(%a: f32, %o: f32):
      %v = math.exp %a : f32
      linalg.yield %v : f32
    } -> tensor<16x16xf32>
    %r = scf.for %i = %c0 to %nn step %c1 iter_args(%acc = %pre) -> tensor<16x16xf32> {
      %zero = arith.constant 0.0 : f32
      %f = linalg.fill ins(%zero : f32) outs(%e : tensor<16x16xf32>) -> tensor<16x16xf32>
      %m = linalg.matmul ins(%acc, %x : tensor<16x16xf32>, tensor<16x16xf32>) outs(%f : tensor<16x16xf32>) -> tensor<16x16xf32>
      scf.yield %m : tensor<16x16xf32>
    }
    %post = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%r : tensor<16x16xf32>) outs(%e : tensor<16x16xf32>) {
    ^bb0(%a: f32, %o: f32):
      %v = math.exp %a : f32
      linalg.yield %v : f32
    } -> tensor<16x16xf32>
    return %post : tensor<16x16xf32>
  }
}
