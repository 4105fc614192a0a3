"""The native engine's Triton kernels (engines/native/kernels.py).

The kernels need a GPU; on the CPU they run in Triton's interpreter, in a subprocess
(tests/kernels_interp.py) because ``TRITON_INTERPRET`` must be set before ``triton`` is
imported. fp32 must agree with the torch path to rounding and give the same codes (and the
whole engine the reference's greedy frames); bf16 is bounded loosely (the kernels round once
per stored tensor, the torch path after each op). The tile choice, the switch and its refusals
are checked here directly."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from triton_qwen3_tts.engines.base import EngineError
from triton_qwen3_tts.engines.native import kernels as nk
from triton_qwen3_tts.engines.native.config import NativeEngineConfig

ROOT = Path(__file__).resolve().parents[1]
needs_triton = pytest.mark.skipif(nk.triton is None, reason="the 'triton' package is not installed")


# The interpreter's checks in two processes side by side (each about 2.5 min on the 2-core CI
# machine, about 5 in one): the whole engine's run, and every other check.
INTERP_GROUPS = (("check_engine_frames",), ("--skip", "check_engine_frames"))


@pytest.fixture(scope="module")
def interp(tmp_path_factory):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    logs = tmp_path_factory.mktemp("kernels_interp")
    procs = []
    for i, names in enumerate(INTERP_GROUPS):
        out, err = open(logs / f"{i}.out", "w+"), open(logs / f"{i}.err", "w+")
        cmd = [sys.executable, str(ROOT / "tests" / "kernels_interp.py"), *names]
        procs.append((subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, cwd=ROOT), out, err))
    result = {}
    try:
        for p, out, err in procs:
            rc = p.wait(timeout=600)
            out.seek(0)
            err.seek(0)
            assert rc == 0, err.read()[-3000:]
            result.update(json.loads(out.read().strip().splitlines()[-1]))
    finally:
        for p, out, err in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            out.close()
            err.close()
    return result


@needs_triton
def test_linear_variants_match_torch(interp):
    assert interp["self_test"] is None  # the load-time self-test passes where the kernels run
    for k in (
        "linear_rms_swiglu_res",
        "linear_rms_f32out",
        "linear_gather_bias",
        "linear_strided",
        "linear_rows70",
        "linear_rows130",
    ):
        assert interp[f"{k}_float32"] < 1e-4, (k, interp[f"{k}_float32"])
        assert interp[f"{k}_bfloat16"] < 0.1, (k, interp[f"{k}_bfloat16"])


@needs_triton
def test_split_k_matches_one_part(interp):
    # the same fp32 sums cut at part boundaries: rounding apart; bf16 outputs rounded once
    assert interp["split_k_maxdiff_float32"] < 1e-5
    assert interp["split_k_maxdiff_bfloat16"] < 0.07
    assert interp["split_k_counters_left"] == 0  # each launch leaves its tile counters at zero
    # at most one program per multiprocessor (132): 64 output tiles in 2 parts, 32 in 4 (at
    # least 2 K tiles each); 128 tiles or more, or a K of 2 tiles: none
    assert interp["split_k_default"] == [2, 2, 4, 1, 1, 1]


@needs_triton
def test_few_row_kernel_matches_the_tiled_one(interp):
    assert interp["gemv_default_rows"] == 2  # on by default up to two rows (run 36d)
    # the same sums in another order: fp32 rounding apart; bf16 outputs rounded once either way
    assert interp["gemv_maxdiff_float32"] < 1e-5
    assert interp["gemv_maxdiff_bfloat16"] < 0.07
    # whole rows: 8 of K 1024, 2 of K 3072 (padded to 4096), 4 gate + 4 up rows of K 1024
    assert interp["gemv_tiles"] == [[8, 1024, 4], [2, 4096, 4], [4, 1024, 4]]


@needs_triton
def test_attention_matches_torch_blocks(interp):
    # first step (two rows at 0, 1) and a later one: outputs and the KV-cache writes
    assert interp["attention_f32"] < 1e-4


@needs_triton
def test_decode_attention_matches_softmax_over_each_rows_positions(interp):
    # one split, three (one past the shortest rows' lengths) and the default; 2 and 3 query
    # heads per kv head
    assert interp["decode_attn_float32"] < 1e-4
    assert interp["decode_attn_bfloat16"] < 2e-2  # bf16 output rounding of values of order 1
    # (block, warps, stages, splits): one row splits its bucket into parts of at least 128
    # positions (1, 4 and 8 for buckets of 128, 512 and 1,024), blocks of 128 where a part is
    # that short; 8 rows (64 programs) 5 ways (about two programs per multiprocessor); from one
    # program per multiprocessor (32 rows of 8 kv heads) no split, 3 stages, and 2 stages from two
    assert interp["decode_config"] == [
        [128, 4, 2, 1],
        [128, 4, 2, 4],
        [128, 4, 2, 8],
        [64, 4, 3, 5],
        [64, 4, 3, 1],
        [64, 4, 2, 1],
    ]


@needs_triton
@pytest.mark.parametrize("proj", ["identity", "projection"])
def test_code_predictor_same_codes_as_torch_path(interp, proj):
    assert interp["cp_pdl_after_load"] == "on"  # NativeEngineConfig.pdl, set when the model loads
    assert interp["cp_split_k_after_load"] == 3  # NativeEngineConfig.split_k, likewise
    assert interp[f"cp_{proj}_distinct_codes"] > 10  # the codes vary: the comparison can fail
    for mode in ("greedy", "sampled"):
        assert interp[f"cp_{proj}_{mode}_codes_equal"] == 1.0
        assert interp[f"cp_{proj}_{mode}_kv_maxdiff"] < 1e-4


@needs_triton
def test_talker_layers_match_torch_path(interp):
    assert interp["talker_logits_scale"] > 0.1  # the logits are not all zero
    for n in ("hidden", "logits", "k_cache", "v_cache"):
        assert interp[f"talker_{n}_maxdiff"] < 1e-4, (n, interp[f"talker_{n}_maxdiff"])
    assert interp["talker_argmax_equal"] == 1.0


@needs_triton
def test_prefill_on_the_kernels_matches_the_torch_blocks(interp):
    assert interp["prefill_h_scale"] > 0.1  # the hidden rows are not all zero
    for n in ("k_cache", "v_cache", "h"):
        assert interp[f"prefill_{n}_maxdiff"] < 1e-4, (n, interp[f"prefill_{n}_maxdiff"])
        assert interp[f"prefill_rows0_{n}_maxdiff"] == 0.0  # prefill_kernel_rows 0: the torch blocks
    assert interp["prefill_c0_equal"]


@needs_triton
def test_engine_greedy_frames_equal_the_reference(interp):
    # decode on the kernels (the prefill on the torch blocks, then on the kernels too), two
    # requests joining a step apart
    for key in ("", "_prefill_kernels"):
        assert interp[f"engine_frames{key}"] == [4, 3]
        assert interp[f"engine_frames_equal{key}"] == [True, True]


@needs_triton
def test_benchmark_parity_counts_codes(interp):
    assert interp["bench_parity_codes"] == 4 * 15
    assert interp["bench_parity_greedy"] == 1.0 and interp["bench_parity_sampled"] == 1.0
    # one row per call: the few-row kernel's codes equal the torch path's in fp32
    assert interp["bench_parity_one_row_codes"] == 3 * 15
    assert interp["bench_parity_one_row"] == [1.0, 1.0]


SHAPES = [  # (N, K, swiglu) of the 1.7B decode GEMMs (code predictor, then talker)
    (4096, 1024, False),
    (1024, 2048, False),
    (3072, 1024, True),
    (1024, 3072, False),
    (2048, 1024, False),
    (4096, 2048, False),
    (2048, 2048, False),
    (6144, 2048, True),
    (2048, 6144, False),
    (3072, 2048, False),
]


def _smem_need(BM, BN, BK, stages, elt, swiglu):
    return stages * (BM * BK + (2 if swiglu else 1) * BK * BN) * elt


def test_tiles_cover_rows_and_split_outputs(monkeypatch):
    for M in (1, 8, 16, 17, 32, 64, 128):
        BM, BN, BK, warps, stages = nk.tiles(M, 4096, 1024)
        assert BM == (16 if M <= 16 else 64)  # one row tile up to 64 rows (no 32-row tiles)
        assert 1024 % BK == 0
    assert nk.tiles(64, 1024, 3072)[1] == 16  # narrow outputs, 64 rows: small tiles, more programs
    assert nk.tiles(1, 1024, 3072)[2] == 256  # one row tile: deep K tiles
    assert nk.tiles(1, 3072, 100)[2] == 64  # K not a multiple of 128
    # run 31b's cold-weight sweep: the talker's wide gate/up takes 64-wide N tiles at any row count
    assert nk.tiles(1, 6144, 2048, swiglu=True)[1:3] == (64, 128)
    assert nk.tiles(64, 6144, 2048, swiglu=True)[1:3] == (64, 128)
    # one row tile, large weights (the 1.7B talker's q/k/v, down, head): wide tiles, split-K
    # refills the programs (run 38i); two row tiles, or smaller weights, keep the narrow ones
    for N, K in ((4096, 2048), (2048, 6144), (3072, 2048)):
        assert nk.tiles(64, N, K) == (64, 64, 128, 4, 4), (N, K)
        assert nk.tiles(32, N, K) == (64, 64, 128, 4, 4), (N, K)
    assert nk.tiles(128, 4096, 2048)[1] == 32 and nk.tiles(128, 2048, 6144)[1] == 16
    assert nk.tiles(64, 2048, 2048)[1] == 16 and nk.tiles(64, 4096, 1024)[1] == 32
    monkeypatch.setattr(nk, "SPLIT_K_TARGET", 0)  # split-K off: the narrow tiles keep the programs
    assert nk.tiles(64, 4096, 2048)[1] == 32 and nk.tiles(64, 2048, 6144)[1] == 16
    monkeypatch.undo()
    # and the parts: 64, 32 and 48 output tiles on 132 multiprocessors
    assert [nk.k_splits(t, K, 128, 132) for t, K in ((64, 2048), (32, 6144), (48, 2048))] == [2, 4, 2]
    assert nk.tiles(64, 4096, 1024)[3] == 8  # wide outputs at 64 rows: 8 warps


@pytest.mark.parametrize("smem", [232448, 166912, 101376], ids=["h100", "a100", "sm86"])
@pytest.mark.parametrize("elt", [2, 4], ids=["bf16", "fp32"])
def test_tiles_fit_the_gpus_shared_memory(smem, elt):
    """The pipeline's buffers fit each GPU's shared memory per block in bf16 and fp32; on the
    H100 in bf16 the measured configurations (run 31b) are kept."""
    for M in (1, 64, 128):
        for N, K, swiglu in SHAPES:
            BM, BN, BK, warps, stages = nk.tiles(M, N, K, elt, swiglu, smem)
            assert _smem_need(BM, BN, BK, stages, elt, swiglu) <= smem, (M, N, K, swiglu)
            assert K % BK == 0 and stages >= 2
            if smem == 232448 and elt == 2:
                assert (BK, stages) == nk.tiles(M, N, K, swiglu=swiglu)[2:5:2]  # unbounded choice, unchanged


def test_switch_validated():
    with pytest.raises(EngineError, match="kernels.*'torch', 'triton'|kernels.*torch, triton"):
        NativeEngineConfig(device="cpu", kernels="cuda")
    assert NativeEngineConfig(device="cpu").kernels == "torch"
    with pytest.raises(EngineError, match="pdl: 'always'; allowed: off, on, prefetch, few"):
        NativeEngineConfig(device="cpu", pdl="always")
    assert NativeEngineConfig(device="cpu").pdl == "few"
    for bad in (-1, 17, 2.0, True):
        with pytest.raises(EngineError, match=r"split_k: must be an int in \[0, 16\]"):
            NativeEngineConfig(device="cpu", split_k=bad)
    assert NativeEngineConfig(device="cpu").split_k == 1


@pytest.mark.skipif(nk._INTERPRET, reason="this process runs Triton's interpreter")
def test_triton_refused_on_cpu_without_interpreter(tiny_checkpoint):
    from triton_qwen3_tts.engines.native.engine import NativeEngine

    why = nk.unavailable_reason(torch.device("cpu"))
    assert why and ("CUDA" in why or "not installed" in why)
    cfg = NativeEngineConfig(device="cpu", dtype="float32", cuda_graphs=False, max_num_seqs=2, kernels="triton")
    eng = NativeEngine(str(tiny_checkpoint), cfg)
    with pytest.raises(EngineError, match="kernels='triton'.*use kernels='torch'"):
        eng._load()


def test_a_kernel_that_fails_to_compile_fails_the_load_with_the_setting(monkeypatch):
    """A GPU whose toolchain cannot build the kernels: the engine's load fails naming the setting
    and the fallback (the self-test runs at load, not at the first request)."""

    def broken(*a, **k):
        raise RuntimeError("cc1: not found")

    monkeypatch.setattr(nk, "linear", broken)
    why = nk.self_test(torch.device("cpu"), torch.float32)
    assert why and "do not compile or run here" in why and "cc1: not found" in why


def test_pdl_modes(monkeypatch):
    """Programmatic dependent launch: a validated mode, never used off the GPU (nor in the
    interpreter), and a Triton without it (the self-test fails with it, passes without) turns it
    off instead of failing the load."""
    monkeypatch.setattr(nk, "PDL", "on")
    with pytest.raises(ValueError, match="off, on, prefetch, few"):
        nk.set_pdl("sometimes")
    nk.set_pdl("prefetch")
    assert nk.PDL == "prefetch" and nk._pdl(torch.zeros(1), 1) == "off"
    assert nk.pdl_mode(1) == nk.pdl_mode(64) == "prefetch"
    # the default: on for launches the few-row kernel takes (run 37a), off for more rows
    nk.set_pdl("few")
    assert [nk.pdl_mode(r) for r in (1, nk.GEMV_ROWS, nk.GEMV_ROWS + 1, 64)] == ["on", "on", "off", "off"]
    assert nk._pdl(torch.zeros(1), 1) == "off"  # never off the GPU
    assert nk._launch_opts("off") == {} and nk._launch_opts("on") == {"launch_pdl": True}

    def no_pdl_here(x, w, **k):  # stands in for the kernel, which runs on CPU only in the interpreter
        if nk.PDL != "off":
            raise TypeError("unexpected keyword argument 'launch_pdl'")
        return x.float() @ w.float().T

    monkeypatch.setattr(nk, "linear", no_pdl_here)
    assert nk.self_test(torch.device("cpu"), torch.float32) is None
    assert nk.PDL == "off"


def _sm90_compiler():
    pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as e:
        pytest.skip(f"this Triton has no ahead-of-time compiler API ({e})")
    return GPUTarget("cuda", 90, 32), ASTSource


@pytest.mark.parametrize("swiglu", [False, True])
def test_gpu_variants_compile_for_hopper_with_pdl(swiglu):
    """No GPU here, but Triton compiles for one: the GEMM kernel with programmatic dependent
    launch and the L2 weight prefetch compiles for sm_90 (ptxas included) and its PTX waits for
    the previous grid, releases the next one and prefetches the weight rows (twice with SwiGLU:
    gate and up)."""
    target, ASTSource = _sm90_compiler()
    ptx = _linear_ptx(target, ASTSource, swiglu, split=1, BM=16, GDC=True, PREFETCH=True, launch_pdl=True)
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
    assert ptx.count("prefetch.global.L2") == (2 if swiglu else 1)


def _linear_ptx(target, ASTSource, swiglu: bool, split: int, BM: int, GDC: bool, PREFETCH: bool, **options) -> str:
    """The tiled GEMM kernel's PTX for sm_90 (bf16, the norm, SwiGLU or a residual)."""
    sig = dict.fromkeys(("x_ptr", "idx_ptr", "w_ptr", "bias_ptr", "res_ptr", "out_ptr"), "*bf16")
    sig.update(ws_ptr="*fp32", lock_ptr="*i32", eps="fp32")
    sig.update(dict.fromkeys(("M", "N", "K", "KS", "stride_xm", "stride_rm", "stride_om"), "i32"))
    const = dict(GATHER=False, RMS=True, SWIGLU=swiglu, HAS_BIAS=False, HAS_RES=not swiglu, UPCAST=False)
    const.update(IEEE=False, BM=BM, BN=32, BK=128, SPLIT=split, GDC=GDC, PREFETCH=PREFETCH, LINE=64)
    src = ASTSource(fn=nk._linear_kernel, signature={**sig, **dict.fromkeys(const, "constexpr")}, constexprs=const)
    try:
        return nk.triton.compile(src, target=target, options={"num_warps": 4, "num_stages": 3, **options}).asm["ptx"]
    except FileNotFoundError as e:  # no ptxas in this Triton
        pytest.skip(f"no CUDA toolchain in this Triton ({e})")


@pytest.mark.parametrize("swiglu", [False, True])
def test_split_k_compiles_for_hopper(swiglu):
    """The split-K variant compiles for sm_90 (ptxas included): one acquire-release atomic add
    on the tile's counter after a block barrier (every thread's partial sums stored before it is
    released), the other parts' sums read from L2 (``.cg``) and the counter reset."""
    target, ASTSource = _sm90_compiler()
    ptx = _linear_ptx(target, ASTSource, swiglu, split=4, BM=64, GDC=False, PREFETCH=False)
    adds = [ln for ln in ptx.splitlines() if "atom." in ln and ".add" in ln]
    assert len(adds) == 1 and ".acq_rel" in adds[0] and ".gpu" in adds[0], adds
    assert "bar.sync" in ptx[: ptx.index(adds[0].strip())]
    assert "ld.global.cg" in ptx
    exch = [ln for ln in ptx.splitlines() if "atom." in ln and ".exch" in ln]
    assert len(exch) == 1 and ".relaxed" in exch[0] and ptx.index(exch[0]) > ptx.index(adds[0])


@pytest.mark.parametrize("swiglu", [False, True])
def test_few_row_kernel_compiles_for_hopper(swiglu):
    """The few-row kernel, with every epilogue and programmatic dependent launch, compiles for
    sm_90 (ptxas included) at the 1.7B code predictor's widest K (3072, padded to 4096) and its
    gate/up shape; its PTX has no tensor-core instruction (fp32 products and sums) and loads
    weights before it waits for the previous kernel."""
    target, ASTSource = _sm90_compiler()
    sig = dict.fromkeys(("x_ptr", "w_ptr", "bias_ptr", "res_ptr", "out_ptr"), "*bf16")
    sig.update(
        idx_ptr="*i64", eps="fp32", **dict.fromkeys(("M", "N", "K", "stride_xm", "stride_rm", "stride_om"), "i32")
    )
    BN, BK, warps = nk.gemv_tiles(3072, 1024, True) if swiglu else nk.gemv_tiles(1024, 3072)
    const = dict(GATHER=True, RMS=True, SWIGLU=swiglu, HAS_BIAS=True, HAS_RES=True, BN=BN, BK=BK, GDC=True)
    src = ASTSource(fn=nk._gemv_kernel, signature={**sig, **dict.fromkeys(const, "constexpr")}, constexprs=const)
    try:
        ptx = nk.triton.compile(src, target=target, options={"num_warps": warps}).asm["ptx"]
    except FileNotFoundError as e:  # no ptxas in this Triton
        pytest.skip(f"no CUDA toolchain in this Triton ({e})")
    assert "mma" not in ptx and "wgmma" not in ptx
    assert ptx.count("ld.global") >= 8  # the weight tile's vector loads (and x, bias, residual)
    # with programmatic dependent launch the weight loads come before the wait
    assert "griddepcontrol.wait" in ptx and ptx.index("ld.global") < ptx.index("griddepcontrol.wait")


@pytest.mark.parametrize("T", [1, 2])
def test_code_predictor_attention_loads_everything_before_it_stores(T):
    """The code predictor's attention kernel compiles for sm_90 (ptxas included) and issues
    every global load before its first store (the new rows' keys and values enter the attention
    from registers), so no load waits behind the cache write: one memory round trip."""
    target, ASTSource = _sm90_compiler()
    sig = dict.fromkeys(("qkv_ptr", "qkw_ptr", "cos_ptr", "sin_ptr", "kc_ptr", "vc_ptr", "o_ptr"), "*bf16")
    sig.update(dict.fromkeys(("p0", "stride_qkv", "stride_o", "stride_cb", "stride_ch", "stride_cp"), "i32"))
    sig.update(eps="fp32", scale="fp32")
    const = dict(T=T, H=16, KVH=8, HD=128, P=16, GDC=False)
    src = ASTSource(fn=nk._cp_attn_kernel, signature={**sig, **dict.fromkeys(const, "constexpr")}, constexprs=const)
    try:
        lines = nk.triton.compile(src, target=target, options={"num_warps": 4}).asm["ptx"].splitlines()
    except FileNotFoundError as e:  # no ptxas in this Triton
        pytest.skip(f"no CUDA toolchain in this Triton ({e})")
    stores = [i for i, ln in enumerate(lines) if "st.global" in ln]
    loads = [i for i, ln in enumerate(lines) if "ld.global" in ln]
    assert stores and len(loads) >= 10
    assert max(loads) < min(stores)


def test_split_k_buffers_grow_and_keep_the_old_ones(monkeypatch):
    """The split-K workspace and tile counters of a device: reused while large enough, replaced
    by larger ones when a launch needs more (the old pair kept: CUDA graphs captured with it
    still use it), counters zero on allocation."""
    monkeypatch.setattr(nk, "_SPLIT_BUFS", {})
    monkeypatch.setattr(nk, "_SPLIT_OLD", [])
    cpu = torch.device("cpu")
    ws, locks = nk._split_buffers(cpu, 100, 10)
    assert ws.numel() == 100 and ws.dtype == torch.float32
    assert locks.numel() >= 1024 and locks.dtype == torch.int32 and int(locks.abs().sum()) == 0
    assert nk._split_buffers(cpu, 50, 10)[0] is ws  # large enough: the same pair
    ws2, locks2 = nk._split_buffers(cpu, 300, 2000)
    assert ws2.numel() == 300 and locks2.numel() == 2000 and int(locks2.abs().sum()) == 0
    assert nk._SPLIT_OLD == [(ws, locks)]
    assert nk._split_buffers(cpu, 200, 10)[0] is ws2
