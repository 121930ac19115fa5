"""CPU-only AOT export of quack 0.6.5's SM90 GEMM+SwiGLU epilogue, following
generator/cute_dsl/export_gdn.py (plain export_to_c, no TVM-FFI)."""
import env, os, sys, time, inspect, hashlib
sys.dont_write_bytecode = True
import cutlass, cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import BFloat16, Int32, Float32
from cutlass.cute.runtime import make_fake_tensor as fake
import quack.gemm_runtime.host as host
import quack.gemm_tvm_ffi_utils as gtf
from quack.epilogue.library import linear_act_mod
from quack.rounding import RoundingMode
from quack.tile_scheduler import TileSchedulerOptions
import export_gdn as eg  # generator/cute_dsl/export_gdn.py, on the path by env.py

OUT = sys.argv[1]
TILE = (128, 192); CLUSTER = (2, 1, 1); PINGPONG = True
K_STATIC = int(os.environ.get("K_STATIC", "0"))   # 0: K symbolic

# 1. Mint the same kernel class quack's gemm_act(activation="swiglu") mints on SM90.
mod = linear_act_mod("swiglu", gated=True, has_c=False, has_rowvec=False, has_colvec=False)
mint_key = ((), 9, True, False, (), RoundingMode.RN, (), False)
GemmCls = mod._mint(*mint_key)

# 2. Let quack build the kernel object exactly as compile_gemm_kernel does, but capture it
#    instead of compiling with --enable-tvm-ffi.
captured = {}
class _CuteProxy:
    def __getattr__(self, n): return getattr(cute, n)
    def compile(self, obj, *args, **kw):
        captured["obj"], captured["args"], captured["kw"] = obj, args, kw
        return None
gtf.cute = _CuteProxy()
host._compile_gemm_epi.__wrapped__(
    mod._class_ref(mint_key), (9, 0), BFloat16, BFloat16, None, None,
    "k", "k", None, None, TILE, CLUSTER, PINGPONG, True, False,
    False, False, False, False, (("mAuxOut", (BFloat16, "n")),), concat_layout=tuple(os.environ.get("CONCAT","").split(",")) if os.environ.get("CONCAT") else ())
gtf.cute = cute
gemm_obj = captured["obj"]
print("gemm object:", type(gemm_obj).__name__, "pingpong", gemm_obj.pingpong,
      "tile", TILE, "cluster", CLUSTER)

# 3. Flat C-typable entry: x (M,K) row-major, w (N,K) row-major [nn.Linear weight, gate/up
#    rows interleaved], out (M,N/2) row-major; max_active_clusters runtime Int32.
s32, s64 = cute.sym_int32, cute.sym_int64
M, N = s32(), s32(divisibility=2)
Kd = K_STATIC if K_STATIC else s32(divisibility=8)
x = fake(BFloat16, (M, Kd), (s64(divisibility=8), 1), assumed_align=16)
w = fake(BFloat16, (N, Kd), (s64(divisibility=8), 1), assumed_align=16)
o = fake(BFloat16, (M, s32(divisibility=8)), (s64(divisibility=8), 1), assumed_align=16)

def entry(x: cute.Tensor, w: cute.Tensor, out: cute.Tensor, max_active_clusters: Int32,
          stream: cuda.CUstream):
    epi = GemmCls.EpilogueArguments(mAuxOut=out)
    sched = TileSchedulerOptions(max_active_clusters=max_active_clusters, max_swizzle_size=Int32(8))
    gemm_obj(x, w, None, None, epi, sched, None, stream, None, None)

entry.__name__ = entry.__qualname__ = "quack_swiglu_sm90"
jitted = cute.jit(preprocess=False)(entry)
jitted.set_name_prefix("quack_swiglu_sm90", remove_cutlass_symbol=True, keep_mangled_name=False)
from cutlass.runtime import make_fake_stream
from cutlass.base_dsl.compiler import HostTarget
opts = (cute.GPUArch("sm_90a"), HostTarget(eg.HOST_TARGET))
t = time.time()
compiled = cute.compile[opts](jitted, x, w, o, Int32(132), make_fake_stream())
print("compiled in %.1fs" % (time.time() - t))
os.makedirs(OUT, exist_ok=True)
name = "quack_swiglu_sm90" + ("_concatB" if os.environ.get("CONCAT") else "") + (f"_k{K_STATIC}" if K_STATIC else "")
compiled.export_to_c(OUT, name, "quack_swiglu_sm90")
cubins = eg.fatbin_cubins(os.path.join(OUT, name + ".o"))
for sm, data in cubins:
    p = os.path.join(OUT, f"{name}.sm{sm}.cubin")
    open(p, "wb").write(data)
    print(f"cubin sm_{sm}: {len(data)} B sha256 {hashlib.sha256(data).hexdigest()[:16]} -> {p}")
for ext in (".h", ".o"):
    print(ext, os.path.getsize(os.path.join(OUT, name + ext)), "B")
