"""quack-kernels 0.6.5's SM90 GEMM with a fused SwiGLU epilogue, for export_gdn.py.

export_gdn.py (the entry point gdn-gen runs) imports this module only for
`--kernel quack_swiglu_sm90` (unit `dsl_quack_sm90` of generator/artifacts.json);
the FlashInfer kernels never load it. It provides what that kernel needs besides
export_gdn's common path (make_entry, the pinned HOST_TARGET, the stable signature
pickle, fatbin_cubins, the manifest):

- site_packages_link: the DSL site reached through a path containing /site-packages/
  (quack's epilogue fingerprint treats only such code as external);
- install_stand_ins: a permissive torch stand-in and quack as a bare namespace package;
- fingerprint_generated_epilogues_by_source: the kernel's name (part of the cubin) the
  same on every CPython version;
- variants: the kernel object, built as quack's gemm_act(activation="swiglu") builds it
  on SM90, and the entry's parameters, in export_gdn's variants() protocol.

The kernel: out[M, N/2] = silu(g) * u with (g, u) = x[M, K] @ w[N, K]^T, where w is
one [W_gate; W_up] tensor (rows 0..N/2-1 gate, N/2..N-1 up; concat_layout ("B",):
quack pairs gate and up columns by layout at trace time, no copy), bf16 in and out,
fp32 accumulator, the activation on the fp32 accumulator. Tile 128 x 192, cluster
2 x 1 x 1, pingpong, persistent (quack's SM90 default config). M, N and K are run-time
values. The probe this follows, and the H200 run of its output:
docs/swiglu-gemm-groundwork.md, docs/results/quack-probe-2026-12-01/.
"""
import os, sys, types

KERNEL = "quack_swiglu_sm90"
ARCH = "sm_90a"
TILE = (128, 192)
CLUSTER = (2, 1, 1)
PINGPONG = True
CONCAT_LAYOUT = ("B",)
# Programmatic dependent launch: quack's SM90 default (GemmSm90(use_pdl=True),
# gemm_sm90.py:164), kept. The exported host code launches the kernel itself
# (`.launch(..., use_pdl=self.use_pdl)`, gemm_sm90.py:868), so the launch attribute
# (programmatic stream serialization) is set by the .o's wrapper, not by our
# callers; the kernel's producer warp waits (griddepcontrol.wait, gemm_sm90.py:1039)
# before its first TMA load, and nothing of its reads or writes comes before that
# point, so it is correct after any kernel, PDL-aware or not (after a kernel that
# never triggers early, the wait returns once that kernel has finished, as a plain
# launch would). Its early trigger (griddepcontrol.launch_dependents) only matters
# to a next kernel launched with the attribute. The probe's kernel, run on the H200
# (cubin 426cc67e...), had it on too: the same code as this unit's cubin, which differs
# only in the digest inside the kernel's name (fingerprint_generated_epilogues_by_source).
USE_PDL = True
# The compile-time value of the run-time max_active_clusters argument (the probe's;
# the kernel reads the argument, not this).
MAX_ACTIVE_CLUSTERS_EXAMPLE = 132
# Where the DSL site is reached from in the driver's private work dir (see
# site_packages_link).
SITE_LINK = ("py", "lib", "site-packages", "dsl")


def site_packages_link(work, site_dir):
    """Make `<work>/py/lib/site-packages/dsl`, a symlink to the unpacked DSL site, and
    return it: the driver's re-run imports everything (the DSL, quack) through it.

    Why: quack fingerprints epilogue functions at import and trace
    (gemm_runtime/identity.py:_is_extern_function): functions outside the quack package
    count as external (fingerprinted by qualified name) only when their code's file
    path contains /site-packages/ or /dist-packages/ or lies under the stdlib;
    anything else is fingerprinted by source and globals, and cutlass's functions
    reach a ContextVar (_LOC_TRANSFORMS) that has no semantic key, so importing
    quack.epilogue.library from gdn-gen's dsl-site/<key>/ fails with `TypeError:
    epilogue fn depends on <ContextVar ...>`. A path of the link's form is what a pip
    install gives; the link lives in the scrubbed run's temp dir, so its (random)
    path is never part of an output (the outputs are the same from any directory)."""
    parent = os.path.join(work, *SITE_LINK[:-1])
    os.makedirs(parent)
    link = os.path.join(parent, SITE_LINK[-1])
    os.symlink(os.path.abspath(site_dir), link)
    return link


def install_stand_ins():
    """quack imports torch at module level (host-side helpers, dtype maps, custom-op
    registration, torch.compile decorators); nothing of it runs for an export, and the
    fingerprinted epilogue code refers to no torch object. So: a permissive stand-in
    (any other attribute is a callable, attribute-permissive dummy; decorators pass
    their function through), a superset of export_gdn's minimal one, which quack's
    imports outgrow. And quack as a bare namespace package: its __init__.py imports
    the torch-facing modules (gemm_interface, linear, ...). Module names stay quack's
    own, so generated names match quack's JIT builds."""
    import builtins

    def in_torch(cls):
        cls.__module__ = "torch"  # identity.py keys torch dtypes by module and name
        cls.__qualname__ = cls.__name__
        return cls

    @in_torch
    class dtype:
        def __init__(self, name, itemsize, is_floating_point=True):
            self.name, self.itemsize, self.is_floating_point = name, itemsize, is_floating_point

        def __repr__(self):
            return "torch." + self.name

        def __reduce__(self):
            return (getattr, (sys.modules["torch"], self.name))

    class Dummy:
        """Anything else: callable (as a decorator: passes the function through),
        attribute-permissive, falsy, empty when iterated, usable as a base class."""

        def __init__(self, name):
            self._name = name

        def __call__(self, *a, **k):
            if len(a) == 1 and callable(a[0]) and not k:
                return a[0]
            return Dummy(self._name + "()")

        def __getattr__(self, n):
            if n.startswith("__"):
                raise AttributeError(n)
            return Dummy(self._name + "." + n)

        def __repr__(self):
            return f"<torch stand-in {self._name}>"

        def __bool__(self):
            return False

        def __iter__(self):
            return iter(())

        def __mro_entries__(self, bases):
            return (object,)

    class StubModule(types.ModuleType):
        def __getattr__(self, n):
            if n.startswith("__"):
                raise AttributeError(n)
            return Dummy(self.__name__ + "." + n)

    torch = StubModule("torch")
    torch.__version__ = "0.0.0+stand-in"
    torch.dtype = dtype
    for n, size, fp in [("float16", 2, 1), ("bfloat16", 2, 1), ("float32", 4, 1), ("float64", 8, 1),
                        ("int8", 1, 0), ("uint8", 1, 0), ("int16", 2, 0), ("int32", 4, 0), ("int64", 8, 0),
                        ("bool", 1, 0), ("float8_e4m3fn", 1, 1), ("float8_e5m2", 1, 1),
                        ("float8_e8m0fnu", 1, 1), ("float4_e2m1fn_x2", 1, 1), ("uint32", 4, 0)]:
        setattr(torch, n, dtype(n, size, builtins.bool(fp)))
    torch.half, torch.float, torch.long, torch.int = torch.float16, torch.float32, torch.int64, torch.int32

    @in_torch
    class device:
        def __init__(self, *_a, **_k):
            pass

    torch.device = device
    for n, bases in [("Tensor", ()), ("Size", (tuple,)), ("Generator", ()), ("SymInt", ())]:
        setattr(torch, n, in_torch(type(n, bases, {})))

    def compile(fn=None, *, dynamic=None, recompile_limit=None, **_kw):
        # recompile_limit in the signature: quack/blockscaled/quantize.py picks its
        # torch.compile arguments by it (else it reads torch._dynamo.config).
        return fn if fn is not None else (lambda f: f)

    def no_grad(*a, **_k):
        return a[0] if a and callable(a[0]) else (lambda f: f)

    torch.compile, torch.no_grad = compile, no_grad
    sys.modules["torch"] = torch
    for sub in ("nn", "library", "cuda", "compiler", "autograd", "distributed", "_dynamo", "fx",
                "utils", "utils._pytree", "amp", "_library", "_C", "nn.functional", "_inductor",
                "overrides", "types", "_subclasses", "_subclasses.fake_tensor", "testing"):
        m = StubModule("torch." + sub)
        sys.modules["torch." + sub] = m
        parent, _, leaf = ("torch." + sub).rpartition(".")
        setattr(sys.modules[parent], leaf, m)
    torch.cuda.is_available = lambda: False
    torch.compiler.is_compiling = lambda: False

    root = next((d for d in sys.path if os.path.isfile(os.path.join(d, "quack", "gemm_sm90.py"))), None)
    if root is None:
        raise RuntimeError("no quack/ (quack-kernels) on sys.path; check --site-dir and the table's "
                           "dsl.kernel_source_members")
    if f"{os.sep}site-packages{os.sep}" not in os.path.join(os.path.abspath(root), ""):
        raise RuntimeError(f"quack is imported from {root}, a path without /site-packages/: its epilogue "
                           "fingerprint would fail (see site_packages_link)")
    quack = types.ModuleType("quack")
    quack.__path__ = [os.path.join(root, "quack")]
    sys.modules["quack"] = quack


def fingerprint_generated_epilogues_by_source(library):
    """Make quack fingerprint its generated epilogue functions by their source text, as
    it does every epilogue function written in a file, instead of by CPython bytecode.

    Why: the class quack mints is named after a digest of the epilogue's semantic key
    (epilogue/frontend.py: `_ident = f"{fn.__name__}_{semantic_digest[:16]}"`), and that
    name is the kernel's symbol name in the cubin
    (kernel_cutlass_kernel_quackepiloguefrontendGemmMod_linear_act_epi_<digest>_...).
    linear_act_mod's function is generated (epilogue/library.py:_gen_epi_fn: compile + exec
    under the file name `<quack-epilogue:TAG>`), so inspect.getsource fails on it and
    identity.function_semantic_key falls back to `co_code + repr(co_consts)`, which differ
    between CPython 3.11 and 3.12: the same kernel got digest 09a23a1700ff08b2 under 3.11
    and ee8d483c9adb3cd3 under 3.12, so cubins differing in those 16 characters. With the
    generated source registered in linecache (the standard place for source without a
    file: inspect.getsource reads it there), the key hashes the source text, the same on
    every interpreter. The kernel's code is unaffected; only the name's digest moves.

    The source is rebuilt here as _gen_epi_fn builds it, and refused unless it compiles to
    the very code object quack made, so a quack that generates differently fails here."""
    import __future__, inspect, linecache
    generate = library._gen_epi_fn

    def gen_epi_fn(fname, tag, params, body, ns):
        fn = generate(fname, tag, params, body, ns)
        filename = fn.__code__.co_filename
        lines = ([f"def {fname}({', '.join(['acc', *params])}):", f'    """generated epilogue [{tag}]"""']
                 + [f"    {ln}" for ln in body])
        src = "\n".join(lines) + "\n"
        # With the __future__ flags quack's compile() inherited (library.py has `annotations`).
        future = fn.__code__.co_flags & sum(getattr(__future__, f).compiler_flag for f in __future__.all_feature_names)
        module = compile(src, filename, "exec", flags=future, dont_inherit=True)
        code = next(c for c in module.co_consts if isinstance(c, types.CodeType))
        if code != fn.__code__:
            raise RuntimeError(f"quack's generated epilogue {fname} [{tag}] is not the source rebuilt in "
                               "quack_swiglu.py; check fingerprint_generated_epilogues_by_source against quack")
        linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
        if inspect.getsource(fn) != src:
            raise RuntimeError(f"inspect.getsource does not read {filename} from linecache")
        return fn

    library._gen_epi_fn = gen_epi_fn


def variants():
    """Yield the one variant (name, kernel object, entry params, kernel call) in
    export_gdn.variants()'s protocol. Entry: (x, w, out, max_active_clusters, stream)."""
    import cutlass.cute as cute
    from cutlass import BFloat16, Int32
    from cutlass.cute.runtime import make_fake_tensor as fake
    import quack.gemm_runtime.host as host
    import quack.gemm_tvm_ffi_utils as gtf
    import quack.epilogue.library as library
    from quack.rounding import RoundingMode
    from quack.tile_scheduler import TileSchedulerOptions

    fingerprint_generated_epilogues_by_source(library)

    # 1. The class quack's gemm_act(activation="swiglu") mints on SM90 (gated, no C,
    #    no row/column vector, round-to-nearest; gemm_interface.py, epilogue/frontend.py).
    mod = library.linear_act_mod("swiglu", gated=True, has_c=False, has_rowvec=False, has_colvec=False)
    mint_key = ((), 9, True, False, (), RoundingMode.RN, (), False)
    gemm_cls = mod._mint(*mint_key)

    # 2. The kernel object exactly as quack configures it (host._compile_gemm_epi ->
    #    gemm_tvm_ffi_utils.compile_gemm_kernel), captured at its cute.compile call
    #    instead of compiled with --enable-tvm-ffi. __wrapped__: past quack's compile cache.
    captured = {}

    class CuteProxy:
        def __getattr__(self, n):
            return getattr(cute, n)

        def compile(self, obj, *args, **kw):
            captured["obj"] = obj

    gtf.cute = CuteProxy()
    try:
        host._compile_gemm_epi.__wrapped__(
            mod._class_ref(mint_key), (9, 0), BFloat16, BFloat16, None, None,  # no D, no C
            "k", "k", None, None, TILE, CLUSTER, PINGPONG, True, False,  # A, B K-major; persistent
            False, False, False, False,  # varlen_m, gather_A, batched, b_kn
            (("mAuxOut", (BFloat16, "n")),),  # the SwiGLU output: bf16, N-major
            concat_layout=CONCAT_LAYOUT)
    finally:
        gtf.cute = cute
    gemm_obj = captured["obj"]
    if (gemm_obj.pingpong, gemm_obj.use_pdl) != (PINGPONG, USE_PDL):
        raise RuntimeError(f"quack configured pingpong={gemm_obj.pingpong} use_pdl={gemm_obj.use_pdl}; "
                           "check quack_swiglu.py against this quack version")

    # 3. Entry parameters: x (M, K), w (N, K) and out (M, N/2), all row-major (K or N/2
    #    contiguous) with 16-byte aligned rows; N even (gate/up pairs), K a multiple of 8
    #    (TMA: 16-byte row strides). Made after the capture, as in the probe.
    s32, s64 = cute.sym_int32, cute.sym_int64
    m, n, k = s32(), s32(divisibility=2), s32(divisibility=8)
    x = fake(BFloat16, (m, k), (s64(divisibility=8), 1), assumed_align=16)
    w = fake(BFloat16, (n, k), (s64(divisibility=8), 1), assumed_align=16)
    out = fake(BFloat16, (m, s32(divisibility=8)), (s64(divisibility=8), 1), assumed_align=16)
    params = [("x", x), ("w", w), ("out", out),
              ("max_active_clusters", Int32(MAX_ACTIVE_CLUSTERS_EXAMPLE)), ("stream", "stream")]
    # GemmSm90.__call__(mA, mB, mD, mC, epilogue_args, scheduler_args, varlen_args, stream,
    # mSFA, mSFB); max_swizzle_size 8 is quack's default.
    call = ["x", "w", None, None,
            lambda a: gemm_cls.EpilogueArguments(mAuxOut=a["out"]),
            lambda a: TileSchedulerOptions(max_active_clusters=a["max_active_clusters"],
                                           max_swizzle_size=Int32(8)),
            None, "stream", None, None]
    yield KERNEL, gemm_obj, params, call
