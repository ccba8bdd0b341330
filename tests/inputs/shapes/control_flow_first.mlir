// Synthetic test input (written for the tests): public functions whose every
// command-buffer execution sits under control flow (nothing runs on the device in their
// entry blocks), so --repeat N must split invocations without an entry-block anchor.
// Host-side call counters (mutable util.globals) make the work differ from call to call
// with the same inputs: invocation k (warm-up included, from 0) of
//   @loop_first(n, x)    runs its matmul n + k times, then one exp;
//   @while_first(x, s, t) doubles x while s < t, s being sum(x) after each doubling (a
//                        device reduction read back each trip: a data-dependent trip
//                        count; s starts as the given s), then one exp;
//   @if_first(p, x)      runs two matmuls when p + k is odd, one exp when it is even;
//   @loop_only(n, x)     runs its matmul n * k times and nothing else (k = 0 issues no work).
#map = affine_map<(d0, d1) -> (d0, d1)>
#vec = affine_map<(d0) -> (d0)>
#sum = affine_map<(d0) -> ()>
module @control_flow_first {
  util.global private mutable @loop_calls = 0 : index
  util.global private mutable @if_calls = 0 : i32
  util.global private mutable @only_calls = 0 : index

  func.func @loop_first(%n: index, %x: tensor<16x16xf32>) -> tensor<16x16xf32> {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %calls = util.global.load @loop_calls : index
    %next = arith.addi %calls, %c1 : index
    util.global.store %next, @loop_calls : index
    %trips = arith.addi %n, %calls : index
    %e = tensor.empty() : tensor<16x16xf32>
    %r = scf.for %i = %c0 to %trips step %c1 iter_args(%acc = %x) -> tensor<16x16xf32> {
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

  func.func @while_first(%x: tensor<16xf32>, %s0: f32, %limit: f32) -> tensor<16xf32> {
    %zero = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<16xf32>
    %r:2 = scf.while (%v = %x, %s = %s0) : (tensor<16xf32>, f32) -> (tensor<16xf32>, f32) {
      %go = arith.cmpf olt, %s, %limit : f32
      scf.condition(%go) %v, %s : tensor<16xf32>, f32
    } do {
    ^bb0(%v: tensor<16xf32>, %s: f32):
      %d = linalg.generic {indexing_maps = [#vec, #vec], iterator_types = ["parallel"]} ins(%v : tensor<16xf32>) outs(%e : tensor<16xf32>) {
      ^bb0(%a: f32, %o: f32):
        %t = arith.addf %a, %a : f32
        linalg.yield %t : f32
      } -> tensor<16xf32>
      %init = tensor.empty() : tensor<f32>
      %z = linalg.fill ins(%zero : f32) outs(%init : tensor<f32>) -> tensor<f32>
      %sum = linalg.generic {indexing_maps = [#vec, #sum], iterator_types = ["reduction"]} ins(%d : tensor<16xf32>) outs(%z : tensor<f32>) {
      ^bb0(%a: f32, %acc: f32):
        %t = arith.addf %a, %acc : f32
        linalg.yield %t : f32
      } -> tensor<f32>
      %sv = tensor.extract %sum[] : tensor<f32>
      scf.yield %d, %sv : tensor<16xf32>, f32
    }
    %post = linalg.generic {indexing_maps = [#vec, #vec], iterator_types = ["parallel"]} ins(%r#0 : tensor<16xf32>) outs(%e : tensor<16xf32>) {
    ^bb0(%a: f32, %o: f32):
      %t = math.exp %a : f32
      linalg.yield %t : f32
    } -> tensor<16xf32>
    return %post : tensor<16xf32>
  }

  func.func @if_first(%p: i32, %x: tensor<16x16xf32>) -> tensor<16x16xf32> {
    %c1 = arith.constant 1 : i32
    %c2 = arith.constant 2 : i32
    %c0 = arith.constant 0 : i32
    %calls = util.global.load @if_calls : i32
    %next = arith.addi %calls, %c1 : i32
    util.global.store %next, @if_calls : i32
    %sum = arith.addi %p, %calls : i32
    %parity = arith.remui %sum, %c2 : i32
    %odd = arith.cmpi ne, %parity, %c0 : i32
    %e = tensor.empty() : tensor<16x16xf32>
    %r = scf.if %odd -> tensor<16x16xf32> {
      %zero = arith.constant 0.0 : f32
      %f = linalg.fill ins(%zero : f32) outs(%e : tensor<16x16xf32>) -> tensor<16x16xf32>
      %m = linalg.matmul ins(%x, %x : tensor<16x16xf32>, tensor<16x16xf32>) outs(%f : tensor<16x16xf32>) -> tensor<16x16xf32>
      %m2 = linalg.matmul ins(%m, %x : tensor<16x16xf32>, tensor<16x16xf32>) outs(%f : tensor<16x16xf32>) -> tensor<16x16xf32>
      scf.yield %m2 : tensor<16x16xf32>
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

  func.func @loop_only(%n: index, %x: tensor<16x16xf32>) -> tensor<16x16xf32> {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %calls = util.global.load @only_calls : index
    %next = arith.addi %calls, %c1 : index
    util.global.store %next, @only_calls : index
    %trips = arith.muli %n, %calls : index
    %e = tensor.empty() : tensor<16x16xf32>
    %r = scf.for %i = %c0 to %trips step %c1 iter_args(%acc = %x) -> tensor<16x16xf32> {
      %zero = arith.constant 0.0 : f32
      %f = linalg.fill ins(%zero : f32) outs(%e : tensor<16x16xf32>) -> tensor<16x16xf32>
      %m = linalg.matmul ins(%acc, %x : tensor<16x16xf32>, tensor<16x16xf32>) outs(%f : tensor<16x16xf32>) -> tensor<16x16xf32>
      scf.yield %m : tensor<16x16xf32>
    }
    return %r : tensor<16x16xf32>
  }
}
