# lit configuration for dfit-mlir's golden IR tests: `// RUN:` lines run `dfit opt`,
# `dfit compile`, `xdsl-opt` and `filecheck` from the virtual environment lit runs in.
import os
import shutil
import sys

import lit.formats

config.name = "dfit-mlir"
config.test_format = lit.formats.ShTest()
config.suffixes = [".mlir", ".py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(os.path.dirname(__file__), "Output")
config.excludes = ["lit.cfg.py", "Output"]

bin_dir = os.path.dirname(sys.executable)
config.environment["PATH"] = os.pathsep.join([bin_dir, config.environment.get("PATH", os.environ.get("PATH", ""))])
config.substitutions.append(("%PYTHON", sys.executable))

for tool in ("dfit", "filecheck", "xdsl-opt"):
    if shutil.which(tool, path=config.environment["PATH"]):
        config.available_features.add(tool)
    else:
        lit_config.warning(f"{tool} not found next to {sys.executable}; tests that need it are unsupported")
