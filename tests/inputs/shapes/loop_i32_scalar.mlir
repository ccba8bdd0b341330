// Synthetic test input (written for the tests): a loop whose trip count is a scalar
// `i32` argument after the tensor. One dispatch before it (x+x), a matmul in an scf.for
// run %n times, one after (exp).
#map = affine_map<(d0, d1) -> (d0, d1)>
module @loop_i32 {
  func.func @loop(%x: tensor<16x16xf32>, %n: i32) -> tensor<16x16xf32> {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %nn = arith.index_cast %n : i32 to index
    %e = tensor.empty() : tensor<16x16xf32>
    %pre = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%x : tensor<16x16xf32>) outs(%e : tensor<16x16xf32>) {
    ^bb0(%a: f32, %o: f32):
      %v = arith.addf %a, %a : f32
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
