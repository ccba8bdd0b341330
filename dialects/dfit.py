from xdsl.ir import Dialect
DFIT = Dialect("dfit", [], [])
