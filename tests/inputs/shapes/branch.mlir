// Synthetic test input (written for the tests): an scf.if on input %p picks either a
// matmul (p != 0) or an exp (p == 0); the other branch's dispatch never runs.
#map = affine_map<(d0, d1) -> (d0, d1)>
module @branch {
  func.func @main(%x: tensor<16x16xf32>, %p: tensor<i32>) -> tensor<16x16xf32> {
    %c0 = arith.constant 0 : i32
    %pv = tensor.extract %p[] : tensor<i32>
    %cond = arith.cmpi ne, %pv, %c0 : i32
    %e = tensor.empty() : tensor<16x16xf32>
    %r = scf.if %cond -> tensor<16x16xf32> {
      %zero = arith.constant 0.0 : f32
      %f = linalg.fill ins(%zero : f32) outs(%e : tensor<16x16xf32>) -> tensor<16x16xf32>
      %m = linalg.matmul ins(%x, %x : tensor<16x16xf32>, tensor<16x16xf32>) outs(%f : tensor<16x16xf32>) -> tensor<16x16xf32>
      scf.yield %m : tensor<16x16xf32>
    } else {
      %g = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%x : tensor<16x16xf32>) outs(%e : tensor<16x16xf32>) {
      ^bb0(%a: f32, %o: f32):
        %v = math.exp %a : f32
        linalg.yield %v : f32
      } -> tensor<16x16xf32>
      scf.yield %g : tensor<16x16xf32>
    }
    return %r : tensor<16x16xf32>
  }
}
