"""CPU-only AOT export of quack-kernels 0.6.5's plain SM90 GEMM (D = A @ B^T, bf16 in and
out, fp32 accumulator, GemmDefaultSm90 with every epilogue op absent: what
gemm_interface.gemm / gemm_out(A, W.T) compile on SM90 for 2-D operands, alpha = beta = 1,
no C, no bias). Usage: export_gemm.py OUT_DIR VARIANT, VARIANT one of VARIANTS below.
Entry (x [M, K], w [N, K], d [M, N], all row-major; max_active_clusters: Int32; stream),
M, N, K run-time values (N, K multiples of 8). Follows ../quack-probe-2026-12-01/export_swiglu.py."""
import os, sys, time, hashlib
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.environ["REPO"], "docs/results/quack-probe-2026-12-01"))
import env  # noqa: F401  (the 2026-12-01 probe's import paths: torch stand-in, DSL site, quack)
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import BFloat16, Int32
from cutlass.cute.runtime import make_fake_tensor as fake
import quack.gemm as qgemm
import quack.gemm_tvm_ffi_utils as gtf
from quack.gemm_default_epi import GemmDefaultSm90
from quack.rounding import RoundingMode
from quack.gemm_config import SplitKMode
from quack.tile_scheduler import TileSchedulerOptions
import export_gdn as eg  # generator/cute_dsl/export_gdn.py (HOST_TARGET, fatbin_cubins)

# name -> (tile_mn, cluster_mnk, pingpong); all from quack's SM90 config space
# (gemm_config.py _get_sm90_configs; clusters there are (1,2) and (2,1), (1,1) is commented out).
VARIANTS = {
    "quack_gemm_sm90_128x192_c2x1_pp":   ((128, 192), (2, 1, 1), True),   # quack's SM90 default
    "quack_gemm_sm90_128x256_c2x1_coop": ((128, 256), (2, 1, 1), False),
    "quack_gemm_sm90_128x128_c2x1_pp":   ((128, 128), (2, 1, 1), True),
    "quack_gemm_sm90_256x128_c2x1_coop": ((256, 128), (2, 1, 1), False),
}
OUT, NAME = sys.argv[1], sys.argv[2]
TILE, CLUSTER, PINGPONG = VARIANTS[NAME]

# 1. The kernel object exactly as quack's gemm() builds it for this call (gemm.py
#    _build_gemm_plan -> _compile_gemm -> gemm_tvm_ffi_utils.compile_gemm_kernel), captured at
#    its cute.compile call (compiled there with --enable-tvm-ffi). __wrapped__: past jit_cache.
captured = {}
class _CuteProxy:
    def __getattr__(self, n): return getattr(cute, n)
    def compile(self, obj, *args, **kw): captured["obj"] = obj
gtf.cute = _CuteProxy()
try:
    qgemm._compile_gemm.__wrapped__(
        BFloat16, BFloat16, BFloat16, None,   # a, b, d dtypes; no C
        "k", "k", "n", None,                  # A, B K-major (nn.Linear), D row-major
        TILE, CLUSTER, PINGPONG, True, False,  # persistent, static scheduler (SM90 default)
        None, None, 0,                        # no row/col vector
        0, 0, False, (),                      # alpha, beta absent; no add_to_output; no concat
        False, False, False, False, False,    # varlen_m/k, gather_A, tma gather, batch_idx_permute
        (9, 0), RoundingMode.RN, 0, None,     # device capacity, rounding, sr_seed, num_warps
        None, None, 1, SplitKMode.SERIAL,     # no SF, split_k 1
        False, False)                         # batched=False (2-D operands), b_kn=False
finally:
    gtf.cute = cute
gemm_obj = captured["obj"]
assert type(gemm_obj) is GemmDefaultSm90, type(gemm_obj)
print(f"{NAME}: {type(gemm_obj).__name__} tile {TILE} cluster {CLUSTER} pingpong {gemm_obj.pingpong} "
      f"use_pdl {gemm_obj.use_pdl}", flush=True)
assert gemm_obj.pingpong == PINGPONG

# 2. Flat C-typable entry, explicit signature (export_gdn.make_entry), own symbol prefix.
s32, s64 = cute.sym_int32, cute.sym_int64
M, N, K = s32(), s32(divisibility=8), s32(divisibility=8)
x = fake(BFloat16, (M, K), (s64(divisibility=8), 1), assumed_align=16)
w = fake(BFloat16, (N, K), (s64(divisibility=8), 1), assumed_align=16)
d = fake(BFloat16, (M, N), (s64(divisibility=8), 1), assumed_align=16)
params = [("x", x), ("w", w), ("d", d), ("max_active_clusters", Int32(132)), ("stream", "stream")]
# GemmSm90.__call__(mA, mB, mD, mC, epilogue_args, scheduler_args, varlen_args, stream, mSFA, mSFB)
call = ["x", "w", "d", None,
        lambda a: GemmDefaultSm90.EpilogueArguments(),  # alpha/beta/bias absent, RN
        lambda a: TileSchedulerOptions(max_active_clusters=a["max_active_clusters"],
                                       max_swizzle_size=Int32(8)),
        None, "stream", None, None]
jitted, args = eg.make_entry(gemm_obj, params, call, NAME)
from cutlass.base_dsl.compiler import HostTarget
t = time.time()
compiled = cute.compile[(cute.GPUArch("sm_90a"), HostTarget(eg.HOST_TARGET))](jitted, *args)
print("compiled in %.1fs" % (time.time() - t))
os.makedirs(OUT, exist_ok=True)
compiled.export_to_c(OUT, NAME, NAME)
for sm, data in eg.fatbin_cubins(os.path.join(OUT, NAME + ".o")):
    p = os.path.join(OUT, f"{NAME}.sm{sm}.cubin")
    open(p, "wb").write(data)
    print(f"cubin sm_{sm}: {len(data)} B sha256 {hashlib.sha256(data).hexdigest()[:16]} -> {p}")
for ext in (".h", ".o"):
    print(ext, os.path.getsize(os.path.join(OUT, NAME + ext)), "B")
