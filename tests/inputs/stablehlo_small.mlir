// Synthetic test input (written for the tests): a StableHLO dot_general + tanh and a
// convolution, with JAX-style name locations, to show StableHLO input and its costs.
func.func @main(%x: tensor<2x8x16xf32>, %w: tensor<2x16x4xf32>, %img: tensor<1x8x8x3xf32>, %k: tensor<3x3x3x5xf32>) -> (tensor<2x8x4xf32>, tensor<1x6x6x5xf32>) {
  %0 = stablehlo.dot_general %x, %w, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x8x16xf32>, tensor<2x16x4xf32>) -> tensor<2x8x4xf32> loc("jit(fwd)/dense/dot_general"("model.py":3:4))
  %1 = stablehlo.tanh %0 : tensor<2x8x4xf32> loc("jit(fwd)/dense/tanh"("model.py":4:4))
  %2 = stablehlo.convolution(%img, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x8x3xf32>, tensor<3x3x3x5xf32>) -> tensor<1x6x6x5xf32> loc("jit(fwd)/Conv1/conv_general_dilated"("model.py":6:4))
  return %1, %2 : tensor<2x8x4xf32>, tensor<1x6x6x5xf32>
}
