"""Permissive torch stand-in for CPU-only AOT tracing of quack kernels (no real torch)."""
import sys, types, builtins

class dtype:
    def __init__(self, name, itemsize, is_floating_point=True):
        self.name, self.itemsize, self.is_floating_point = name, itemsize, is_floating_point
    def __repr__(self):
        return "torch." + self.name
    def __reduce__(self):
        return (getattr, (sys.modules[__name__], self.name))

for _n, _b, _f in [("float16", 2, 1), ("bfloat16", 2, 1), ("float32", 4, 1), ("float64", 8, 1),
                   ("int8", 1, 0), ("uint8", 1, 0), ("int16", 2, 0), ("int32", 4, 0), ("int64", 8, 0),
                   ("bool", 1, 0), ("float8_e4m3fn", 1, 1), ("float8_e5m2", 1, 1),
                   ("float8_e8m0fnu", 1, 1), ("float4_e2m1fn_x2", 1, 1), ("uint32", 4, 0)]:
    globals()[_n] = dtype(_n, _b, builtins.bool(_f))
half, float, long, int = float16, float32, int64, int32

class Tensor: pass
class device:
    def __init__(self, *a, **k): pass
class Size(tuple): pass
class Generator: pass
class SymInt: pass

class _Dummy:
    """Anything else: callable (returns a pass-through decorator or itself), attribute-permissive."""
    def __init__(self, name): self._name = name
    def __call__(self, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]
        return _Dummy(self._name + "()")
    def __getattr__(self, n):
        if n.startswith("__"): raise AttributeError(n)
        return _Dummy(self._name + "." + n)
    def __repr__(self): return f"<torch stub {self._name}>"
    def __bool__(self): return False
    def __iter__(self): return iter(())
    def __mro_entries__(self, bases): return (object,)

class _StubModule(types.ModuleType):
    def __getattr__(self, n):
        if n.startswith("__"): raise AttributeError(n)
        return _Dummy("torch." + n)

sys.modules[__name__].__class__ = _StubModule
for _sub in ("nn", "library", "cuda", "compiler", "autograd", "distributed", "_dynamo", "fx",
             "utils", "utils._pytree", "amp", "_library", "_C", "nn.functional", "_inductor",
             "overrides", "types", "_subclasses", "_subclasses.fake_tensor", "testing"):
    _m = _StubModule("torch." + _sub)
    sys.modules["torch." + _sub] = _m
    _parent = sys.modules["torch." + _sub.rsplit(".", 1)[0]] if "." in _sub else sys.modules[__name__]
    setattr(_parent, _sub.rsplit(".", 1)[-1], _m)
cuda.is_available = lambda: False
compiler.is_compiling = lambda: False
__version__ = "0.0.0+stub"
def compile(fn=None, *, dynamic=None, recompile_limit=None, **kw):
    return fn if fn is not None else (lambda f: f)
def no_grad(*a, **k):
    return a[0] if a and callable(a[0]) else (lambda f: f)
