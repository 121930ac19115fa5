#!/usr/bin/env python3
"""Ahead-of-time export of FlashInfer 0.7.2.post1's CuTe DSL GDN prefill kernels
(and of quack-kernels 0.6.5's SM90 SwiGLU GEMM: quack_swiglu.py).

  python export_gdn.py --out DIR --kernel {sm90,sm90_cp,sm100,sm120,quack_swiglu_sm90} [--sm-count N] [--site-dir DIR]

`gdn-gen` runs it for each `"compiler": "cute-dsl"` unit of generator/artifacts.json,
with --site-dir pointing at the pinned wheels it unpacked (no pip, no venv).

For each variant of the kernel writes DIR/<variant>.h and DIR/<variant>.o (plain
`export_to_c`: host launch code + embedded fatbin, no TVM-FFI), DIR/<variant>.cubin
(the cubin cut out of that fatbin) and DIR/<kernel>.manifest.json (sha256 of each).
Needs a Python with nvidia-cutlass-dsl 4.8.1 (+ -libs-base/-core/-cu13,
cuda-bindings, cuda-pathfinder, protobuf, typing-extensions) and FlashInfer's
`flashinfer/gdn_kernels` sources (--flashinfer-root: the directory holding
`flashinfer/`). No GPU, driver, torch or FlashInfer package import is needed.
Geometry: head_dim 128, bf16 q/k/v/o, f32 alpha/beta/state, int64 cu_seqlens
(int32 on sm100, as FlashInfer calls it), Qwen3.5 heads Hqk 16, Hv 16/32/48.
--kernel quack_swiglu_sm90 needs quack-kernels' `quack/` and apache-tvm-ffi instead of
FlashInfer's sources; its kernel-specific code is quack_swiglu.py (beside this file),
everything after the kernel object (entry, options, export, manifest) is shared.
"""
import argparse, dataclasses, enum, hashlib, inspect, io, json, os, pickle, shutil, struct, subprocess
import sys, tempfile, types

ARCH = {"sm90": "sm_90a", "sm90_cp": "sm_90a", "sm100": "sm_100a", "sm120": "sm_120a",
        "quack_swiglu_sm90": "sm_90a"}
QUACK = "quack_swiglu_sm90"  # the one kernel of quack_swiglu.py; the others are FlashInfer's
HQK, HV = 16, (16, 32, 48)
# The CPU the objects' host code is compiled for. The DSL's default (an empty
# --host-target) is LLVM's auto-detected build host: on an AVX-512 machine the
# launch code gets zmm instructions, so the bytes depend on the build machine's
# CPU and the objects fault (SIGILL) on an x86-64 host without those features.
# The baseline x86-64 (SSE2) is what every x86-64 serving host can run; the
# launch code only marshals arguments, so nothing is lost.
HOST_TARGET = "llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=x86-64"
# Protocol of the signature pickle every object carries (see StableSignatureProcessor);
# fixed so a Python whose pickle.DEFAULT_PROTOCOL moves (3.14: 5) writes the same bytes.
SIGNATURE_PICKLE_PROTOCOL = 4


def scrubbed_rerun(args):
    """Re-run this script in a cleared environment with private HOME/TMPDIR/cwd, so
    nothing from the caller's environment, home or temp dir (DSL file cache, CUDA_HOME,
    CUTE_DSL_* settings, locale, hash seed) can reach the compiler. The DSL's target
    arch is process-global (CUTE_DSL_ARCH, else probed from GPU 0), so pin it."""
    work = tempfile.mkdtemp(prefix="gdn-dsl-")
    try:
        for d in ("home", "tmp", "cache", "stage"):
            os.mkdir(os.path.join(work, d))
        site_dir = args.site_dir and os.path.abspath(args.site_dir)
        if args.kernel == QUACK and site_dir:
            # quack must see the DSL under a /site-packages/ path (quack_swiglu.site_packages_link);
            # only for this kernel, so the FlashInfer exports run exactly as before.
            import quack_swiglu
            site_dir = quack_swiglu.site_packages_link(work, site_dir)
        env = {"PATH": "/usr/bin:/bin", "HOME": work + "/home", "TMPDIR": work + "/tmp",
               "LC_ALL": "C", "TZ": "UTC", "SOURCE_DATE_EPOCH": "0",
               "PYTHONHASHSEED": str(args.hash_seed), "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONNOUSERSITE": "1", "CUTE_DSL_ARCH": ARCH[args.kernel],
               "CUTE_DSL_DISABLE_FILE_CACHING": "1", "CUTE_DSL_CACHE_DIR": work + "/cache",
               "GDN_DSL_STAGE": work + "/stage"}
        argv = [sys.executable, "-B", "-s", os.path.abspath(__file__), "--out", os.path.abspath(args.out),
                "--kernel", args.kernel, "--sm-count", str(args.sm_count)]
        if args.flashinfer_root:
            argv += ["--flashinfer-root", os.path.abspath(args.flashinfer_root)]
        if site_dir:
            argv += ["--site-dir", site_dir]
        rc = subprocess.run(argv, env=env, cwd=work + "/tmp").returncode
        if rc == 0:  # the outputs appear only when every variant exported
            os.makedirs(args.out, exist_ok=True)
            for f in sorted(os.listdir(work + "/stage")):
                shutil.copyfile(os.path.join(work, "stage", f), os.path.join(args.out, f))
        return rc
    finally:
        shutil.rmtree(work, ignore_errors=True)


def install_stand_ins(fi_root):
    """The kernel modules import torch only for dtype tokens / annotations, and
    flashinfer.utils only for host helpers we never call. Provide stand-ins, and
    register the flashinfer packages as bare namespaces so their __init__.py (which
    imports torch and every other kernel) never runs; module names stay FlashInfer's
    own, so generated symbol names match FlashInfer's JIT builds."""
    torch = types.ModuleType("torch")

    class dtype:
        def __init__(self, name, itemsize):
            self.name, self.itemsize = name, itemsize

        def __repr__(self):
            return "torch." + self.name

    for n, b in [("float16", 2), ("bfloat16", 2), ("float32", 4), ("int8", 1), ("uint8", 1),
                 ("int32", 4), ("int64", 8), ("float8_e4m3fn", 1), ("float8_e5m2", 1)]:
        setattr(torch, n, dtype(n, b))
    torch.dtype, torch.Tensor, torch.device = dtype, type("Tensor", (), {}), type("device", (), {})
    sys.modules["torch"] = torch

    def host_only(*_a, **_k):
        raise RuntimeError("FlashInfer host helper called during AOT export")

    for name in ("flashinfer", "flashinfer.gdn_kernels", "flashinfer.gdn_kernels.delta_rule_dsl",
                 "flashinfer.gdn_kernels.blackwell"):
        m = types.ModuleType(name)
        m.__path__ = [os.path.join(fi_root, *name.split("."))]
        sys.modules[name] = m
    u = types.ModuleType("flashinfer.utils")
    for n in ("get_device_sm_count", "_get_cache_buf", "get_compute_capability", "get_device_name"):
        setattr(u, n, host_only)
    sys.modules["flashinfer.utils"] = u


def variants(kernel, sm_count):
    """Yield (name, kernel object, entry params, kernel call). Params are (name, arg):
    fake tensors (dynamic extents become C struct fields), Int32/Float32 scalars, or
    "stream". Call items are param names, None, or functions of the param dict
    (evaluated while tracing). Layouts mirror FlashInfer's from_dlpack marks."""
    import cutlass, cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor as fake
    BF, F32, I32 = cutlass.BFloat16, cutlass.Float32, cutlass.Int32
    s32, s64 = cute.sym_int32, cute.sym_int64
    k = lambda v: (lambda a: I32(v))  # constant Int32 argument
    q_tma = lambda: fake(BF, (s32(),) * 3, (s64(), 1, s64()), assumed_align=16)   # (T, D, H)
    kv_tma = lambda: fake(BF, (s32(),) * 3, (1, s64(), s64()), assumed_align=16)  # (D, T, H)
    t_tma = lambda: fake(BF, (s32(),) * 4, (s64(), 1, s64(), s64()), assumed_align=16)
    flat = lambda dt, al: fake(dt, (s32(),), (1,), assumed_align=al)
    state = lambda: fake(F32, (s32(),) * 4, (s64(), s64(), s64(), 1), assumed_align=16)
    ints = lambda *names: [(n, I32(1)) for n in names]
    heads = ints("num_q_heads", "num_k_heads", "num_v_heads", "num_sab_heads")

    if kernel in ("sm90", "sm120"):
        if kernel == "sm90":
            from flashinfer.gdn_kernels.delta_rule_dsl.delta_rule_sm90 import _FullyFusedDeltaRuleSm90 as K
        else:
            from flashinfer.gdn_kernels.delta_rule_dsl.delta_rule_sm120 import _FullyFusedDeltaRuleSm120 as K
        for init in (False, True):
            # __call__ declares grid_x as a Python int, which the C export cannot type:
            # the entry computes it (FlashInfer passes num_seqs * num_sab_heads).
            params = ([("q", q_tma()), ("k", kv_tma()), ("v", kv_tma()), ("o", kv_tma()),
                       ("alpha", flat(F32, 16)), ("beta", flat(F32, 16)), ("state", state())]
                      + ([("init_state", state())] if init else [])
                      + [("tensormaps", flat(cutlass.Uint8, 128)), ("cu_seqlens", flat(cutlass.Int64, 8)),
                         ("scale", F32(1.0))] + heads + ints("num_seqs") + [("stream", "stream")])
            call = ["q", "k", "v", "o", "alpha", "beta", "state", "init_state" if init else None,
                    None, None, None, "tensormaps", "cu_seqlens", "scale", "num_q_heads", "num_k_heads",
                    "num_v_heads", "num_sab_heads", "num_seqs", k(1), k(0),
                    lambda a: a["num_seqs"] * a["num_sab_heads"], "stream"]
            yield f"{kernel}_prefill" + ("_init" if init else ""), K(True, True, init, False, BF), params, call

    elif kernel == "sm90_cp":
        from flashinfer.gdn_kernels.delta_rule_dsl import delta_rule_cp_sm90 as m
        cu = ("cu_seqlens", flat(cutlass.Int64, 8))
        yield ("sm90cp_t", m.CPDeltaRuleTPrecomputeSm90(BF),
               [("k", kv_tma()), ("beta", flat(F32, 16)), ("t", flat(BF, 128)), cu]
               + ints("num_k_heads", "num_sab_heads", "total_t_blocks", "max_t_blocks_per_seq", "num_seqs")
               + [("stream", "stream")], None)
        yield ("sm90cp_mn", m.CPDeltaRuleMNPrecomputeSm90(BF),
               [("k", kv_tma()), ("v", kv_tma()), ("t", t_tma()), ("alpha", flat(F32, 16)),
                ("transfer", flat(F32, 16)), ("local_state", flat(F32, 16)), cu]
               + ints("chunk_len", "num_k_heads", "num_v_heads", "num_sab_heads", "total_cp_chunks",
                      "max_cp_chunks_per_seq", "num_seqs") + [("stream", "stream")], None)
        # FlashInfer picks the fixup kernel by state-head count: <=8 simt_row4,
        # <=16 simt_row8 (Qwen3.5 ratio 1), else hmma (ratios 2, 3).
        for kind, make in (("simt8", lambda i: m.CPDeltaRuleFixupSimtSm90(i, rows_per_cta=8)),
                           ("hmma", lambda i: m.CPDeltaRuleFixupHmmaSm90(i))):
            for init in (False, True):
                tma128 = lambda: fake(F32, (s32(),) * 4, (s64(), 1, s64(), s64()), assumed_align=128)
                params = ([("transfer", tma128()), ("local_state", tma128())]
                          + ([("init_state", state())] if init else [])
                          + [("fixed_state", flat(F32, 128)), cu]
                          + ints("chunk_len", "total_cp_chunks", "num_seqs", "num_heads") + [("stream", "stream")])
                call = ["transfer", "local_state", "init_state" if init else None, None, "fixed_state",
                        "cu_seqlens", "chunk_len", "total_cp_chunks", "num_seqs", "num_heads", "stream"]
                yield f"sm90cp_fixup_{kind}" + ("_init" if init else ""), make(init), params, call
        for init in (False, True):
            params = ([("q", q_tma()), ("k", kv_tma()), ("v", kv_tma()), ("t", t_tma()), ("o", kv_tma()),
                       ("alpha", flat(F32, 16)), ("state", state()), ("fixed_state", flat(F32, 16))]
                      + ([("init_state", state())] if init else [])
                      + [("tensormaps", flat(cutlass.Uint8, 128)), cu, ("scale", F32(1.0))] + heads
                      + ints("chunk_len", "total_cp_chunks", "max_cp_chunks_per_seq", "num_seqs")
                      + [("stream", "stream")])
            call = ["q", "k", "v", "t", "o", "alpha", "state", "fixed_state", "init_state" if init else None,
                    None, None, None, "tensormaps", "cu_seqlens", "scale", "num_q_heads", "num_k_heads",
                    "num_v_heads", "num_sab_heads", "chunk_len", "total_cp_chunks", "max_cp_chunks_per_seq",
                    "num_seqs", k(1), k(0), "stream"]
            yield ("sm90cp_prefill" + ("_init" if init else ""),
                   m.CPDeltaRulePrefillSm90(BF, needs_initial_state=init, store_final_state=True), params, call)

    elif kernel == QUACK:
        import quack_swiglu
        yield from quack_swiglu.variants()

    elif kernel == "sm100":
        from flashinfer.gdn_kernels.blackwell.gated_delta_net_chunked import GatedDeltaNetChunkedKernel as K
        D = 128
        for hv in HV:
            for init in (False, True):
                # Persistent kernel: head counts (static tensor extents), SM count
                # (max_active_clusters) and workspace size are baked in, as in FlashInfer.
                ho = max(HQK, hv)
                row = lambda h: fake(BF, (s32(), h, D), (h * D, D, 1), assumed_align=16)
                gb = lambda: fake(F32, (s32(), ho), (ho, 1), assumed_align=16)
                st = lambda: fake(F32, (s32(), s32(), s32(), s32(divisibility=D)),
                                  (s64(divisibility=D),) * 3 + (1,), assumed_align=16)
                ws = K.get_workspace_size(sm_count, 1, HQK, hv, True)
                params = ([("q", row(HQK)), ("k", row(HQK)), ("v", row(hv)), ("gate", gb()), ("beta", gb()),
                           ("o", row(ho)), ("cu_seqlens", flat(cutlass.Int32, 4))]
                          + ([("init_state", st())] if init else [])
                          + [("state", st()), ("scale", F32(1.0)),
                             ("workspace", fake(cutlass.Int8, (ws,), (1,), assumed_align=16)), ("stream", "stream")])
                call = ["q", "k", "v", "gate", "beta", "o", "cu_seqlens", "init_state" if init else None, "state",
                        None, None, None, k(0), "scale", "workspace", "stream"]
                obj = K(io_dtype=BF, inverse_dtype=BF, acc_dtype=F32, state_dtype=F32, mma_tiler_qk=(64, 64, 128),
                        mma_tiler_qs=(128, 64, 128), mma_tiler_qkv=(128, 64, 64), mma_tiler_kv=(128, 128, 64),
                        max_active_clusters=sm_count, num_sm=sm_count, is_GQA=HQK >= hv,
                        use_initial_state=init, store_final_state=True, enable_checkpoints=False,
                        is_persistent=True)
                yield f"sm100_sm{sm_count}_h{HQK}x{hv}" + ("_init" if init else ""), obj, params, call


def make_entry(kernel_obj, params, call, prefix):
    """A @cute.jit entry with an explicit, fully annotated signature: the C header
    generator needs `stream: cuda.CUstream` (FlashInfer leaves it unannotated) and
    cannot type Python ints; unused optional tensors are passed as None (dropped from
    the C signature). preprocess=False: the entry has no control flow to rewrite."""
    import cutlass.cute as cute, cuda.bindings.driver as cuda
    names = [n for n, _ in params]
    if call is None:
        call = names

    def entry(*args):
        a = dict(zip(names, args))
        kernel_obj(*[a[c] if isinstance(c, str) else (c(a) if callable(c) else c) for c in call])

    def annotation(v):
        if isinstance(v, str):
            return cuda.CUstream
        return cute.Tensor if hasattr(v, "dynamic_shapes_mask") else type(v)

    entry.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation(v))
         for n, v in params])
    entry.__name__ = entry.__qualname__ = prefix
    jitted = cute.jit(preprocess=False)(entry)
    # Short, stable C symbol names instead of ones mangled from the argument types.
    jitted.set_name_prefix(prefix, remove_cutlass_symbol=True, keep_mangled_name=False)
    from cutlass.runtime import make_fake_stream
    return jitted, [make_fake_stream() if isinstance(v, str) else v for _, v in params]


class _VersionIndependentPickler(pickle.Pickler):
    """Pickles enum members as `Class(value)`. How Enum pickles itself changed
    within CPython 3.11 (3.11.2: `getattr(inspect._ParameterKind,
    'POSITIONAL_OR_KEYWORD')`, 3.11.7 and 3.12/3.13: `inspect._ParameterKind(1)`);
    naming the reduction here makes the bytes the same on every interpreter, and
    both forms load everywhere. Everything else in an inspect.Signature (its own
    and Parameter's __reduce__, classes by module and qualified name, str, int,
    dict) already pickles alike from 3.10 to 3.13 at a fixed protocol."""

    def reducer_override(self, obj):
        if isinstance(obj, enum.Enum):
            return type(obj), (obj.value,)
        return NotImplemented


def install_stable_signature_pickle():
    """Each exported object carries, as the data symbol `<prefix>_args_spec`, a
    base64 pickle of the entry's inspect.Signature, written by the DSL's
    ExportProvider.signature_processor (cutlass/cute/export/export.py:
    CuteSignatureProcessor.dumps = pickle.dumps). Only the DSL's Python loader
    (cutlass.base_dsl.export.decode_metadata_from_execution_engine, used when Python
    loads an exported object back) reads it; the generated header, the C runtime
    (libcuda_dialect_runtime_static.a) and the object's own code never refer to it.
    We keep it, loadable, but written by a pickler whose bytes do not depend on the
    CPython version: the DSL's processor first (so its own annotation mapping still
    applies), then loaded back and pickled again by _VersionIndependentPickler. The
    signature processor is the DSL's own extension point for exactly this
    (ExportProvider is a dataclass; the DSL installs its provider the same way)."""
    from cutlass.cute.export.export import CuteSignatureProcessor
    from cutlass.cutlass_dsl.cuda_jit_executor import CudaDialectJitCompiledFunction as Compiled

    class StableSignatureProcessor(CuteSignatureProcessor):
        def dumps(self, signature):
            dsl_form = pickle.loads(super().dumps(signature))
            buf = io.BytesIO()
            _VersionIndependentPickler(buf, protocol=SIGNATURE_PICKLE_PROTOCOL).dump(dsl_form)
            out = buf.getvalue()
            if pickle.loads(out) != dsl_form:  # what the DSL's loader would read back
                raise RuntimeError("the version-independent signature pickle does not round-trip")
            return out

    provider = Compiled.export_provider
    if type(provider.signature_processor) is not CuteSignatureProcessor:
        raise RuntimeError(f"unexpected DSL signature processor {provider.signature_processor!r}; "
                           "check install_stable_signature_pickle against this DSL version")
    Compiled.export_provider = dataclasses.replace(provider, signature_processor=StableSignatureProcessor())


def fatbin_cubins(obj_path):
    """The object embeds the fatbin as symbol `kernels_binary` (not in .nv_fatbin,
    so cuobjdump does not see it). Read it from the ELF64 symbol table; return the
    (sm, cubin bytes) entries. Refuses PTX or compressed entries."""
    b = open(obj_path, "rb").read()
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", b, 0x3A)
    sh = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    symtab = next(s for s in sh if s[1] == 2)
    strtab = sh[symtab[6]]
    for off in range(symtab[4], symtab[4] + symtab[5], 24):
        name, _info, _oth, shndx, value, size = struct.unpack_from("<IBBHQQ", b, off)
        end = b.index(b"\0", strtab[4] + name)
        if b[strtab[4] + name:end] == b"kernels_binary":
            fb = b[sh[shndx][4] + value:sh[shndx][4] + value + size]
            break
    else:
        raise RuntimeError("no kernels_binary symbol in " + obj_path)
    magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", fb, 0)
    assert magic == 0xBA55ED50, hex(magic)
    out, pos = [], hsize
    while pos < hsize + fsize:
        kind, _v, ehs, psize = struct.unpack_from("<HHIQ", fb, pos)
        sm, = struct.unpack_from("<I", fb, pos + 28)
        payload = fb[pos + ehs:pos + ehs + psize]
        if kind != 2 or payload[:4] != b"\x7fELF":
            raise RuntimeError(f"fatbin entry kind {kind} (PTX or compressed) in {obj_path}")
        out.append((sm, payload))
        pos += ehs + psize
    return out


def export(args):
    if args.kernel == QUACK:
        import quack_swiglu
        quack_swiglu.install_stand_ins()
    else:
        install_stand_ins(args.flashinfer_root)
    import cutlass.cute as cute
    from importlib.metadata import version
    # (No RTLD_GLOBAL preload of libcute_dsl_runtime.so: with DSL 4.8.1 and this
    # entry, outputs are byte-identical without it.)
    # A launch with min_blocks_per_mp > 1 (CP T-precompute, SIMT fixup) makes the DSL
    # read GPU 0's max shared memory per SM and bake it into the kernel. Answer from
    # the target arch instead of whatever GPU (or none) this machine has.
    from cutlass.base_dsl.runtime import cuda as cuda_helpers
    smem_per_sm = {"sm_90a": 233472, "sm_100a": 233472, "sm_120a": 102400}[ARCH[args.kernel]]
    attr = cuda_helpers.cuda.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR

    def device_attribute(a, device_id=0):
        if a != attr:
            raise RuntimeError(f"export asked the GPU for {a}")
        return smem_per_sm

    cuda_helpers.get_device_attribute = device_attribute
    install_stable_signature_pickle()
    from cutlass.base_dsl.compiler import HostTarget
    stage, arch = os.environ["GDN_DSL_STAGE"], ARCH[args.kernel]
    manifest = {"kernel": args.kernel, "arch": arch, "python": sys.version.split()[0],
                "nvidia-cutlass-dsl": version("nvidia-cutlass-dsl-libs-base"), "variants": {}}
    for name, obj, params, call in variants(args.kernel, args.sm_count):
        prefix = "gdn_" + name
        fn, cargs = make_entry(obj, params, call, prefix)
        # FlashInfer's options minus EnableTVMFFI: only its sm100 path adds OptLevel(3).
        # Plus a pinned host target (HOST_TARGET), so the launch code is the same on every build machine.
        opts = ((cute.GPUArch(arch), HostTarget(HOST_TARGET))
                + ((cute.OptLevel(3),) if args.kernel == "sm100" else ()))
        if arch == "sm_120a":
            # FlashInfer's own SM12x guard: the PTX must have no cluster-scoped TMA loads.
            from flashinfer.gdn_kernels.delta_rule_dsl import custom_compile_cache as ccc
            opts = ccc._ptx_check_compile_options(opts, os.path.join(os.environ["TMPDIR"], "ptx"))
            compiled = cute.compile[opts](fn, *cargs)
            ccc._sm12x_ptx_check(compiled)
        else:
            compiled = cute.compile[opts](fn, *cargs)
        compiled.export_to_c(stage, name, prefix)
        cubins = fatbin_cubins(os.path.join(stage, name + ".o"))
        assert len(cubins) == 1 and f"sm_{cubins[0][0]}a" == arch, [c[0] for c in cubins]
        with open(os.path.join(stage, name + ".cubin"), "wb") as f:
            f.write(cubins[0][1])
        files = {}
        for ext in (".h", ".o", ".cubin"):
            data = open(os.path.join(stage, name + ext), "rb").read()
            files[name + ext] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        manifest["variants"][name] = {"entry": f"cute_dsl_{prefix}_wrapper", "files": files}
        print(f"{name}: " + ", ".join(f"{k} {v['size']} B" for k, v in files.items()), flush=True)
    with open(os.path.join(stage, args.kernel + ".manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--kernel", required=True, choices=sorted(ARCH))
    p.add_argument("--sm-count", type=int, default=148, help="baked into sm100 (B200: 148)")
    p.add_argument("--flashinfer-root", help="directory holding flashinfer/gdn_kernels")
    p.add_argument("--hash-seed", type=int, default=0, help="PYTHONHASHSEED (for determinism checks)")
    p.add_argument("--site-dir", help="a directory of unpacked wheels to import the DSL from "
                   "(gdn-gen's private site dir; its .pth files are processed, as pip's site-packages would be)")
    args = p.parse_args()
    if args.site_dir:
        import site
        site.addsitedir(os.path.abspath(args.site_dir))
    if args.flashinfer_root is None and args.kernel != QUACK:
        args.flashinfer_root = next(
            (d for d in sys.path if os.path.isdir(os.path.join(d, "flashinfer", "gdn_kernels"))), None)
        if args.flashinfer_root is None:
            p.error("no flashinfer/gdn_kernels on sys.path; pass --flashinfer-root")
    if "GDN_DSL_STAGE" not in os.environ:
        return scrubbed_rerun(args)
    return export(args)


if __name__ == "__main__":
    sys.exit(main())
