// RUN: xdsl-opt %s --verify-diagnostics | filecheck %s

// The verifier rejects a probe kind other than "begin" / "end".
// CHECK: kind must be "begin" or "end", got "middle"
dfit.probe "middle" "probes/linalg.matmul#0"
