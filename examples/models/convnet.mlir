// A small but real-shaped image classifier, written by hand in linalg/tensor/arith:
// conv 3x3 (3->8) + bias + relu, conv 3x3 (8->16) + bias + relu, 2x2 max-pool,
// flatten, dense 784->32 + relu, dense 32->10, softmax.
// Locations point at an imaginary model file so that attribution has something real-looking
// to report; the demo compiles this file with `dfit compile --dfit-tag`.
#id4 = affine_map<(n, h, w, c) -> (n, h, w, c)>
#bias4 = affine_map<(n, h, w, c) -> (c)>
#id2 = affine_map<(n, c) -> (n, c)>
#bias2 = affine_map<(n, c) -> (c)>
#row = affine_map<(n, c) -> (n)>
module @convnet {
  func.func @main(%image: tensor<1x32x32x3xf32>) -> tensor<1x10xf32> {
    %zero = arith.constant 0.0 : f32
    %ninf = arith.constant -3.40282347E+38 : f32
    // conv1
    %w1 = arith.constant dense<0.05> : tensor<3x3x3x8xf32>
    %b1 = arith.constant dense<0.1> : tensor<8xf32>
    %e1 = tensor.empty() : tensor<1x30x30x8xf32>
    %f1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<1x30x30x8xf32>) -> tensor<1x30x30x8xf32>
    %c1 = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
      ins(%image, %w1 : tensor<1x32x32x3xf32>, tensor<3x3x3x8xf32>) outs(%f1 : tensor<1x30x30x8xf32>) -> tensor<1x30x30x8xf32> loc(callsite("conv1"("convnet.py":21:16) at "convnet.py":40:12))
    %r1 = linalg.generic {indexing_maps = [#id4, #bias4, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%c1, %b1 : tensor<1x30x30x8xf32>, tensor<8xf32>) outs(%e1 : tensor<1x30x30x8xf32>) {
    ^bb0(%x: f32, %b: f32, %o: f32):
      %s = arith.addf %x, %b : f32
      %m = arith.maximumf %s, %zero : f32
      linalg.yield %m : f32
    } -> tensor<1x30x30x8xf32> loc(callsite("relu1"("convnet.py":22:16) at "convnet.py":40:12))
    // conv2
    %w2 = arith.constant dense<0.02> : tensor<3x3x8x16xf32>
    %b2 = arith.constant dense<0.1> : tensor<16xf32>
    %e2 = tensor.empty() : tensor<1x28x28x16xf32>
    %f2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<1x28x28x16xf32>) -> tensor<1x28x28x16xf32>
    %c2 = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
      ins(%r1, %w2 : tensor<1x30x30x8xf32>, tensor<3x3x8x16xf32>) outs(%f2 : tensor<1x28x28x16xf32>) -> tensor<1x28x28x16xf32> loc(callsite("conv2"("convnet.py":24:16) at "convnet.py":41:12))
    %r2 = linalg.generic {indexing_maps = [#id4, #bias4, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%c2, %b2 : tensor<1x28x28x16xf32>, tensor<16xf32>) outs(%e2 : tensor<1x28x28x16xf32>) {
    ^bb0(%x: f32, %b: f32, %o: f32):
      %s = arith.addf %x, %b : f32
      %m = arith.maximumf %s, %zero : f32
      linalg.yield %m : f32
    } -> tensor<1x28x28x16xf32> loc(callsite("relu2"("convnet.py":25:16) at "convnet.py":41:12))
    // 2x2 max-pool
    %window = tensor.empty() : tensor<2x2xf32>
    %e3 = tensor.empty() : tensor<1x14x14x16xf32>
    %f3 = linalg.fill ins(%ninf : f32) outs(%e3 : tensor<1x14x14x16xf32>) -> tensor<1x14x14x16xf32>
    %p = linalg.pooling_nhwc_max {dilations = dense<1> : tensor<2xi64>, strides = dense<2> : tensor<2xi64>}
      ins(%r2, %window : tensor<1x28x28x16xf32>, tensor<2x2xf32>) outs(%f3 : tensor<1x14x14x16xf32>) -> tensor<1x14x14x16xf32> loc("pool"("convnet.py":27:16))
    %flat = tensor.collapse_shape %p [[0], [1, 2, 3]] : tensor<1x14x14x16xf32> into tensor<1x3136xf32> loc("flatten"("convnet.py":28:16))
    // dense 3136 -> 32 + relu
    %w3 = arith.constant dense<0.001> : tensor<3136x32xf32>
    %b3 = arith.constant dense<0.1> : tensor<32xf32>
    %e4 = tensor.empty() : tensor<1x32xf32>
    %f4 = linalg.fill ins(%zero : f32) outs(%e4 : tensor<1x32xf32>) -> tensor<1x32xf32>
    %d1 = linalg.matmul ins(%flat, %w3 : tensor<1x3136xf32>, tensor<3136x32xf32>) outs(%f4 : tensor<1x32xf32>) -> tensor<1x32xf32> loc("fc1"("convnet.py":30:16))
    %r3 = linalg.generic {indexing_maps = [#id2, #bias2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%d1, %b3 : tensor<1x32xf32>, tensor<32xf32>) outs(%e4 : tensor<1x32xf32>) {
    ^bb0(%x: f32, %b: f32, %o: f32):
      %s = arith.addf %x, %b : f32
      %m = arith.maximumf %s, %zero : f32
      linalg.yield %m : f32
    } -> tensor<1x32xf32> loc("relu3"("convnet.py":31:16))
    // dense 32 -> 10
    %w4 = arith.constant dense<0.03> : tensor<32x10xf32>
    %e5 = tensor.empty() : tensor<1x10xf32>
    %f5 = linalg.fill ins(%zero : f32) outs(%e5 : tensor<1x10xf32>) -> tensor<1x10xf32>
    %logits = linalg.matmul ins(%r3, %w4 : tensor<1x32xf32>, tensor<32x10xf32>) outs(%f5 : tensor<1x10xf32>) -> tensor<1x10xf32> loc("fc2"("convnet.py":33:16))
    %probs = linalg.softmax dimension(1) ins(%logits : tensor<1x10xf32>) outs(%e5 : tensor<1x10xf32>) -> tensor<1x10xf32> loc("softmax"("convnet.py":34:16))
    return %probs : tensor<1x10xf32>
  }
}
