"""Import paths for export_swiglu.py, under $QUACK_PROBE (made by probe.sh)."""
import os, site, sys, types

ROOT = os.environ["QUACK_PROBE"]
REPO = os.environ["REPO"]
sys.path.insert(0, os.path.join(ROOT, "stub"))  # torch stand-in (torch_stub.py as torch/)
# Through a path that contains /site-packages/: quack treats only such code as external when it
# fingerprints its epilogue functions (gemm_runtime/identity.py:151); imported from gdn-gen's
# dsl-site/<hash> directly, epilogue/library.py fails on a ContextVar.
site.addsitedir(os.path.join(ROOT, "py/lib/site-packages/dsl"))
sys.path.insert(0, os.path.join(ROOT, "deps"))  # apache-tvm-ffi, einops
sys.path.insert(0, os.path.join(REPO, "generator/cute_dsl"))  # export_gdn (HOST_TARGET, fatbin_cubins)
# quack as a bare namespace package: its __init__ imports torch-heavy modules.
m = types.ModuleType("quack")
m.__path__ = [os.path.join(ROOT, "src", "quack")]
sys.modules["quack"] = m
