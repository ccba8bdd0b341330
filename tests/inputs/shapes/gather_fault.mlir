// Synthetic test input (written for the tests): a gather whose index comes from the
// input, unchecked, as an embedding lookup is. An index far outside the 8-row table
// reads unmapped memory: the module faults (SIGSEGV) — dfit must report it, not die.
#map = affine_map<(d0) -> (d0)>
module @gather_fault {
  func.func @main(%table: tensor<8xf32>, %index: tensor<4xi64>) -> tensor<4xf32> {
    %e = tensor.empty() : tensor<4xf32>
    %g = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]} ins(%index : tensor<4xi64>) outs(%e : tensor<4xf32>) {
    ^bb0(%i: i64, %o: f32):
      %ix = arith.index_cast %i : i64 to index
      %v = tensor.extract %table[%ix] : tensor<8xf32>
      linalg.yield %v : f32
    } -> tensor<4xf32>
    return %g : tensor<4xf32>
  }
}
