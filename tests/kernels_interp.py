"""The code predictor's Triton kernels against the torch path, in Triton's interpreter on the CPU.

Run by tests/test_kernels.py in subprocesses: ``TRITON_INTERPRET`` must be set before
``triton`` is imported, which the pytest process may already have done (vLLM imports it).
``python tests/kernels_interp.py [check_name ... | --skip check_name ...]`` runs the named checks
(all without any, all but those after ``--skip``) and prints one JSON object of measured differences; the test holds the bounds.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from triton_qwen3_tts.engines.native import kernels as nk  # noqa: E402
from triton_qwen3_tts.engines.native.config import NativeEngineConfig  # noqa: E402
from triton_qwen3_tts.engines.native.layers import CP_POSITIONS, _pre_attn, _attn_math  # noqa: E402
from triton_qwen3_tts.engines.native.model import NativeModel  # noqa: E402
from triton_qwen3_tts.model import presets  # noqa: E402
from triton_qwen3_tts.model.config import Qwen3TTSConfig  # noqa: E402
from triton_qwen3_tts.model.talker import Talker  # noqa: E402


def _maxdiff(a, b) -> float:
    """The largest absolute difference; inf where either holds a NaN or an infinity (so that
    ``max`` over several never hides one: ``max(0.0, nan)`` is 0.0)."""
    d = (a.float() - b.float()).abs()
    return float(d.max()) if bool(torch.isfinite(d).all()) else float("inf")


def check_linear(out: dict) -> None:
    out["self_test"] = nk.self_test(torch.device("cpu"), torch.float32)
    g = torch.Generator().manual_seed(0)
    for dt in (torch.float32, torch.bfloat16):
        name = str(dt).split(".")[-1]
        M, K, N = 5, 192, 40  # K not a multiple of 128, N not of the tile: the masks
        x = torch.randn(M, K, generator=g).to(dt)
        w = (torch.randn(2 * N, K, generator=g) * 0.1).to(dt)
        ln = (torch.rand(K, generator=g) + 0.5).to(dt)
        res = torch.randn(M, N, generator=g).to(dt)
        bias = torch.randn(N, generator=g).to(dt)
        hn = F.rms_norm(x.float(), (K,), ln.float(), 1e-6)
        gate, up = (hn @ w.float().T).split(N, dim=-1)
        y = nk.linear(x, nk.fold_norm(w, ln), rms=True, eps=1e-6, swiglu=True, residual=res)
        out[f"linear_rms_swiglu_res_{name}"] = _maxdiff(y, F.silu(gate) * up + res.float())
        y = nk.linear(x, nk.fold_norm(w[:N], ln), rms=True, eps=1e-6, out_dtype=torch.float32)
        out[f"linear_rms_f32out_{name}"] = _maxdiff(y, hn @ w[:N].float().T)
        table = torch.randn(11, K, generator=g).to(dt)
        rows = torch.tensor([3, 0, 10, 3, 7])
        y = nk.linear(table, w[:N], rows=rows, bias=bias)
        out[f"linear_gather_bias_{name}"] = _maxdiff(y, table[rows].float() @ w[:N].float().T + bias.float())
        for Mb in (70, 130):  # 64-row tiles, a second and a third row tile (the last partial)
            xb = torch.randn(Mb, K, generator=g).to(dt)
            rb = torch.randn(Mb, N, generator=g).to(dt)
            hb = F.rms_norm(xb.float(), (K,), ln.float(), 1e-6)
            gb, ub = (hb @ w.float().T).split(N, dim=-1)
            yb = nk.linear(xb, nk.fold_norm(w, ln), rms=True, eps=1e-6, swiglu=True, residual=rb)
            out[f"linear_rows{Mb}_{name}"] = _maxdiff(yb, F.silu(gb) * ub + rb.float())
        xs = torch.randn(M, 2, K, generator=g).to(dt)[:, 1]  # strided rows
        y = nk.linear(xs, w[:N])
        out[f"linear_strided_{name}"] = _maxdiff(y, xs.float() @ w[:N].float().T)


def check_split_k(out: dict) -> None:
    """The tiled kernel with K cut into parts (split-K: partial sums in the workspace, the
    tile's last program adds them and runs the epilogue) against one part, every epilogue,
    1, 2 and 3 row tiles, K not a multiple of the part; twice, so the tile counters reset."""
    g = torch.Generator().manual_seed(5)
    worst = {torch.float32: 0.0, torch.bfloat16: 0.0}
    for dt in worst:
        for M, K, split in ((3, 320, 3), (70, 256, 2), (130, 192, 3)):
            N = 40
            x = torch.randn(M, K, generator=g).to(dt)
            w = (torch.randn(2 * N, K, generator=g) * 0.1).to(dt)
            res = torch.randn(M, N, generator=g).to(dt)
            bias = torch.randn(N, generator=g).to(dt)
            table = torch.randn(11, K, generator=g).to(dt)
            rows = torch.randint(0, 11, (M,), generator=g)
            BM = 16 if M <= 16 else 64
            ys = []
            for cfg in ((BM, 32, 64, 4, 2, 1), (BM, 32, 64, 4, 2, split), (BM, 32, 64, 4, 2, split)):
                ys.append(
                    (
                        nk.linear(x, w, rms=True, swiglu=True, residual=res, config=cfg),
                        nk.linear(x, w[:N], rms=True, out_dtype=torch.float32, config=cfg),
                        nk.linear(table, w[:N], rows=rows, bias=bias, config=cfg),
                    )
                )
            for other in ys[1:]:
                worst[dt] = max(worst[dt], *(_maxdiff(a, b) for a, b in zip(ys[0], other)))
    ws, locks = nk._SPLIT_BUFS[("cpu", None)]
    out["split_k_maxdiff_float32"] = worst[torch.float32]
    out["split_k_maxdiff_bfloat16"] = worst[torch.bfloat16]
    out["split_k_counters_left"] = int(locks.abs().sum())
    # the default choice: the code predictor's o_proj and down at 64 rows on 132 multiprocessors
    out["split_k_default"] = [
        nk.k_splits(64, 2048, 128, 132),  # o_proj, 64 rows
        nk.k_splits(64, 3072, 256, 132),  # down, 64 rows
        nk.k_splits(32, 2048, 256, 132),  # o_proj, 8 rows
        nk.k_splits(128, 1024, 128, 132),  # q/k/v, 64 rows
        nk.k_splits(96, 1024, 128, 132),  # gate/up, 64 rows
        nk.k_splits(64, 256, 128, 132),
    ]


def check_gemv(out: dict) -> None:
    """linear on the few-row kernel (``GEMV_ROWS``: whole weight rows per program, fp32 products
    and sums) against the tiled kernel, every epilogue (norm, SwiGLU, residual, gather, bias,
    fp32 out), K a power of two and not (its padded lanes masked), 1 to 8 rows."""
    g = torch.Generator().manual_seed(11)
    worst = {torch.float32: 0.0, torch.bfloat16: 0.0}
    default = nk.GEMV_ROWS
    for dt in worst:
        for M, K in ((1, 64), (2, 96), (8, 160)):
            N = 24
            x = torch.randn(M, K, generator=g).to(dt)
            w = (torch.randn(2 * N, K, generator=g) * 0.1).to(dt)
            res = torch.randn(M, N, generator=g).to(dt)
            bias = torch.randn(N, generator=g).to(dt)
            table = torch.randn(11, K, generator=g).to(dt)
            rows = torch.randint(0, 11, (M,), generator=g)
            ys = []
            for gemv in (0, 8):
                nk.GEMV_ROWS = gemv
                ys.append(
                    (
                        nk.linear(x, w, rms=True, swiglu=True, residual=res),
                        nk.linear(x, w[:N], rms=True, out_dtype=torch.float32),
                        nk.linear(table, w[:N], rows=rows, bias=bias),
                        nk.linear(x, w[:N], residual=res),
                    )
                )
            worst[dt] = max(worst[dt], *(_maxdiff(a, b) for a, b in zip(*ys)))
    nk.GEMV_ROWS = default
    out["gemv_default_rows"] = default
    out["gemv_maxdiff_float32"] = worst[torch.float32]
    out["gemv_maxdiff_bfloat16"] = worst[torch.bfloat16]
    out["gemv_tiles"] = [
        list(nk.gemv_tiles(N, K, sw)) for N, K, sw in ((4096, 1024, False), (1024, 3072, False), (3072, 1024, True))
    ]


def check_attention(out: dict) -> None:
    """cp_attention against the torch path's blocks (_pre_attn's norms/RoPE, the reference
    attention) for the first step (2 rows at 0, 1) and a later one (1 row at 5), fp32."""
    g = torch.Generator().manual_seed(1)
    B, H, KV, hd, eps = 3, 4, 2, 32, 1e-6
    P = CP_POSITIONS
    qkv = torch.randn(B * 2, (H + 2 * KV) * hd, generator=g)
    qk_w = torch.rand(H + KV, hd, generator=g) + 0.5
    pos = torch.arange(P, dtype=torch.float32)[:, None]
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.cat([pos * inv, pos * inv], dim=-1)
    cos, sin = ang.cos(), ang.sin().clone()
    sin[:, : hd // 2].neg_()
    kc = torch.randn(B + 1, KV, P, hd, generator=g)  # one spare slot: B' > B
    vc = torch.randn(B + 1, KV, P, hd, generator=g)
    worst = 0.0
    for p0, T in ((0, 2), (5, 1)):
        x = qkv[: B * T]
        kc_ref, vc_ref = kc.clone(), vc.clone()
        # the torch path: split q/k/v of the fused projection's output, norm + RoPE as _pre_attn
        q_, k_, v_ = (
            x.view(B, T, -1)[..., : H * hd],
            x.view(B, T, -1)[..., H * hd : (H + KV) * hd],
            x.view(B, T, -1)[..., (H + KV) * hd :],
        )
        qk = torch.cat((q_, k_), -1).reshape(B, T, H + KV, hd)
        qk = F.rms_norm(qk, (hd,), None, eps) * qk_w
        c, s = cos[None, p0 : p0 + T, None], sin[None, p0 : p0 + T, None]
        qk = qk * c + torch.roll(qk, hd // 2, dims=-1) * s
        q, k = qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2)
        v = v_.reshape(B, T, KV, hd).transpose(1, 2)
        kc_ref[:B, :, p0 : p0 + T] = k
        vc_ref[:B, :, p0 : p0 + T] = v
        allowed = torch.arange(p0 + T)[None, :] <= (p0 + torch.arange(T))[:, None]
        o_ref = _attn_math(q, kc_ref[:B, :, : p0 + T], vc_ref[:B, :, : p0 + T], allowed, H, KV, hd)
        o_ref = o_ref.transpose(1, 2).reshape(B * T, H * hd)
        o = nk.cp_attention(x, qk_w, cos, sin, kc, vc, p0, T, H, KV, eps)
        worst = max(worst, _maxdiff(o, o_ref), _maxdiff(kc, kc_ref), _maxdiff(vc, vc_ref))
    out["attention_f32"] = worst
    assert _pre_attn  # the same arithmetic as the engine's block (imported to keep them together)


def _talker(name: str, talker_hidden: int, std: float) -> Talker:
    d = presets.main_config(name)
    if talker_hidden:  # a wider talker than predictor: small_to_mtp_projection is a Linear
        d["talker_config"]["hidden_size"] = talker_hidden
        d["talker_config"]["text_hidden_size"] = talker_hidden
    cfg = Qwen3TTSConfig.from_dict(d)
    torch.manual_seed(0)
    t = Talker(cfg.talker)
    with torch.no_grad():
        for pname, prm in t.named_parameters():
            if pname.endswith("norm.weight"):
                prm.uniform_(0.5, 1.5)
            elif pname.endswith(".bias"):
                prm.normal_(0.0, std)
            else:
                prm.normal_(0.0, std)
    return t.eval()


def check_code_predictor(out: dict) -> None:
    """part_code_predictor with kernels triton against torch from the same state: frames
    (greedy and sampled) and the code predictor's KV cache, fp32, both projections."""
    for label, hidden in (("identity", 0), ("projection", 128)):
        talker = _talker("tiny", hidden, 0.2)
        base = dict(max_num_seqs=6, max_model_len=32, device="cpu", dtype="float32", cuda_graphs=False)
        nk.set_pdl("off")
        target = nk.SPLIT_K_TARGET
        models = {
            k: NativeModel(talker, NativeEngineConfig(kernels=k, pdl="on", split_k=3, **base), 0)
            for k in ("torch", "triton")
        }
        out["cp_pdl_after_load"] = nk.PDL  # the kernels' model sets it from its config (a no-op here)
        out["cp_split_k_after_load"] = nk.SPLIT_K_TARGET
        nk.SPLIT_K_TARGET = target
        g = torch.Generator().manual_seed(2)
        h = torch.randn(7, models["torch"].D, generator=g)
        c0 = torch.randint(0, 64, (7,), generator=g)
        for greedy in (True, False):
            frames, caches = {}, {}
            for k, m in models.items():
                m.reset_all()
                m.h.copy_(h)
                m.c0.copy_(c0)
                m.frame_idx.fill_(3)
                m.key.copy_(torch.arange(7) * 7919 + 1)
                m.sub_greedy.fill_(greedy)
                m.sub_temp.fill_(0.9)
                m.sub_top_k.fill_(20)
                m.sub_top_p.fill_(0.8)
                m.cp_k.normal_(generator=g)
                m.cp_v.normal_(generator=g)
                with torch.inference_mode():
                    m.part_code_predictor(5, top_p=True)
                frames[k] = m.frames[:5].clone()
                out[f"cp_{label}_distinct_codes"] = int(m.frames[:5, 1:].unique().numel())
                caches[k] = (m.cp_k[:, :5].clone(), m.cp_v[:, :5].clone())
            mode = "greedy" if greedy else "sampled"
            out[f"cp_{label}_{mode}_codes_equal"] = float((frames["torch"] == frames["triton"]).float().mean())
            out[f"cp_{label}_{mode}_kv_maxdiff"] = max(
                _maxdiff(a, b) for a, b in zip(caches["torch"], caches["triton"])
            )


def check_decode_attention(out: dict) -> None:
    """decode_attention against softmax attention over each row's positions 0..pos (fp32 and
    bf16; one split, several, a split past some rows' lengths; two and three query heads per kv
    head), and the split count's rule."""
    g = torch.Generator().manual_seed(5)
    hd, C = 32, 96
    pos = torch.tensor([0, 31, 32, 95, 40])  # lengths 1, 32, 33, 96, 41: block and split edges
    B = pos.shape[0]
    worst = {}
    for H, KV in ((4, 2), (6, 2)):
        for dt in (torch.float32, torch.bfloat16):
            kc = torch.randn(B + 1, KV, 128, hd, generator=g).to(dt)  # a spare slot, M > C
            vc = torch.randn(B + 1, KV, 128, hd, generator=g).to(dt)
            q = torch.randn(B, H * hd, generator=g).to(dt)
            ref = torch.empty(B, H, hd)
            for b in range(B):
                n = int(pos[b]) + 1
                qh = q[b].float().view(KV, H // KV, hd)
                sc = torch.einsum("grd,gpd->grp", qh, kc[b, :, :n].float()) * hd**-0.5
                ref[b] = torch.einsum("grp,gpd->grd", sc.softmax(-1), vc[b, :, :n].float()).reshape(H, hd)
            for S in (1, 3, None):
                o = nk.decode_attention(q, kc, vc, pos, C, H, KV, splits=S)
                key = f"decode_attn_{str(dt).split('.')[-1]}"
                worst[key] = max(worst.get(key, 0.0), _maxdiff(o.view(B, H, hd), ref))
    out.update(worst)
    out["decode_config"] = [
        list(nk.decode_config(b, 8, c, 132))
        for b, c in ((1, 128), (1, 512), (1, 1024), (8, 1024), (32, 512), (64, 512))
    ]


def check_talker(out: dict) -> None:
    """part_talker with the Triton kernels against torch from the same state (rows at different
    positions, some with trailing text): hidden, logits and the KV caches, fp32."""
    talker = _talker("tiny", 0, 0.2)
    base = dict(
        max_num_seqs=4, max_model_len=32, device="cpu", dtype="float32", cuda_graphs=False, max_trailing_tokens=4
    )
    models = {k: NativeModel(talker, NativeEngineConfig(kernels=k, **base), 0) for k in ("torch", "triton")}
    g = torch.Generator().manual_seed(4)
    m0 = models["torch"]
    frames = torch.randint(0, 64, (4, m0.G), generator=g)
    pos = torch.tensor([3, 17, 9, 30])
    k_init, v_init = torch.randn(m0.k_cache.shape, generator=g), torch.randn(m0.v_cache.shape, generator=g)
    trailing = torch.randn(m0.trailing.shape, generator=g) * 0.1
    res = {}
    for k, m in models.items():
        m.reset_all()
        m.frames[:4].copy_(frames)
        m.pos[:4].copy_(pos)
        m.frame_idx[:4].copy_(torch.tensor([0, 2, 5, 1]))
        m.n_trailing[:4].copy_(torch.tensor([4, 1, 0, 3]))
        m.trailing.copy_(trailing)
        m.k_cache.copy_(k_init)
        m.v_cache.copy_(v_init)
        with torch.inference_mode():
            m.part_talker(4, 32)
        res[k] = (m.h_new[:4].clone(), m.logits[:4].clone(), m.k_cache.clone(), m.v_cache.clone())
    names = ("hidden", "logits", "k_cache", "v_cache")
    for n, a, b in zip(names, res["torch"], res["triton"]):
        out[f"talker_{n}_maxdiff"] = _maxdiff(a, b)
    out["talker_logits_scale"] = float(res["torch"][1].abs().max())
    out["talker_argmax_equal"] = float((res["torch"][1].argmax(-1) == res["triton"][1].argmax(-1)).float().mean())


def check_prefill(out: dict) -> None:
    """prefill_rows with the talker layers' GEMMs on the kernels (``prefill_kernel_rows``)
    against the torch blocks from the same state: two prompts of different lengths padded to one
    bucket, written into slots 2 and 0: the KV caches, the hidden rows and the first c0, fp32."""
    talker = _talker("tiny", 0, 0.2)
    base = dict(max_num_seqs=4, max_model_len=32, device="cpu", dtype="float32", cuda_graphs=False)
    models = {
        "torch": NativeModel(talker, NativeEngineConfig(kernels="torch", **base), 0),
        "triton": NativeModel(talker, NativeEngineConfig(kernels="triton", prefill_kernel_rows=256, **base), 0),
        "triton_rows0": NativeModel(talker, NativeEngineConfig(kernels="triton", prefill_kernel_rows=0, **base), 0),
    }
    g = torch.Generator().manual_seed(6)
    P, Lb = 2, 8
    m0 = models["torch"]
    x = torch.randn(P, Lb, m0.D, generator=g) * 0.3
    res = {}
    for k, m in models.items():
        m.reset_all()
        m.greedy.fill_(True)
        m.k_cache.zero_()
        m.v_cache.zero_()
        m.pf_x[: P * Lb * m.D].copy_(x.reshape(-1))
        m.pf_slots[:P].copy_(torch.tensor([2, 0]))
        m.pf_last[:P].copy_(torch.tensor([7, 4]))
        with torch.inference_mode():
            m.prefill_rows(P, Lb)
        res[k] = (m.k_cache.clone(), m.v_cache.clone(), m.h.clone(), m.c0.clone())
    for name, i in (("k_cache", 0), ("v_cache", 1), ("h", 2)):
        out[f"prefill_{name}_maxdiff"] = _maxdiff(res["torch"][i], res["triton"][i])
        out[f"prefill_rows0_{name}_maxdiff"] = _maxdiff(res["torch"][i], res["triton_rows0"][i])
    out["prefill_h_scale"] = float(res["torch"][2].abs().max())
    out["prefill_c0_equal"] = bool(torch.equal(res["torch"][3], res["triton"][3]))


def check_engine_frames(out: dict) -> None:
    """The whole engine with ``kernels="triton"`` (the decode steps on the kernels; the prefill on
    the torch blocks, and with ``prefill_kernel_rows`` on the kernels too): two greedy requests
    of different lengths, joined one step apart, give the reference ``generate_codes``'s frames
    (fp32, the projection variant)."""
    import asyncio

    import numpy as np

    from triton_qwen3_tts.engines.base import TalkerRequest
    from triton_qwen3_tts.engines.native.engine import NativeEngine
    from triton_qwen3_tts.model.generate import generate_codes
    from triton_qwen3_tts.model.sampling import SamplingParams

    talker = _talker("tiny", 128, 0.2)
    D = talker.config.hidden_size
    g = torch.Generator().manual_seed(5)
    prompts = [
        (torch.randn(L, D, generator=g) * 0.05, torch.randn(N, D, generator=g) * 0.05, mf)
        for L, N, mf in ((7, 3, 4), (4, 1, 3))
    ]
    pad = talker.embed_text(torch.tensor([151671]))[0].detach()  # the engine's tts_pad without a checkpoint
    with torch.no_grad():
        refs = [
            generate_codes(
                talker, p, t, pad, SamplingParams(do_sample=False, subtalker_dosample=False, max_new_tokens=mf + 1)
            ).numpy()
            for p, t, mf in prompts
        ]
    base = dict(
        max_num_seqs=2,
        max_model_len=32,
        device="cpu",
        dtype="float32",
        cuda_graphs=False,
        batch_buckets=(1, 2),
        ctx_buckets=(32,),
        max_trailing_tokens=4,
        kernels="triton",
    )

    async def run(cfg):
        eng = await NativeEngine.create(None, cfg, talker=talker)
        try:

            async def one(i, p, t, mf):
                while eng.steps < i:
                    await asyncio.sleep(0.001)
                chunks = [
                    c
                    async for c in eng.synthesize(
                        TalkerRequest(request_id=f"r{i}", prompt_embeds=p, trailing=t, max_frames=mf, greedy=True)
                    )
                ]
                return np.concatenate(chunks)

            return await asyncio.gather(*(one(i, *pt) for i, pt in enumerate(prompts)))
        finally:
            eng.shutdown()

    for key, rows in (("", 0), ("_prefill_kernels", 256)):
        res = asyncio.run(run(NativeEngineConfig(prefill_kernel_rows=rows, **base)))
        out[f"engine_frames_equal{key}"] = [
            bool(r.shape == w.shape and np.array_equal(r, w)) for r, w in zip(res, refs)
        ]
        out[f"engine_frames{key}"] = [int(len(r)) for r in res]


def check_bench_parity(out: dict) -> None:
    """benchmark_model.py --cp-parity's comparison on the tiny model (fp32: all codes equal)."""
    from triton_qwen3_tts.tools.bench_model import cp_parity

    talker = _talker("tiny", 128, 0.2)
    cfg = NativeEngineConfig(max_num_seqs=4, max_model_len=16, device="cpu", dtype="float32", kernels="triton")
    res = cp_parity(NativeModel(talker, cfg, 0), cfg, frames=4)
    out["bench_parity_greedy"] = res["greedy"]["identical_share"]
    out["bench_parity_sampled"] = res["sampled"]["identical_share"]
    out["bench_parity_codes"] = res["greedy"]["codes"]
    # one row per call (--cp-parity-rows 1): the code predictor's GEMMs on the few-row kernel
    res = cp_parity(NativeModel(talker, cfg, 0), cfg, frames=3, batch=1)
    out["bench_parity_one_row"] = [res["greedy"]["identical_share"], res["sampled"]["identical_share"]]
    out["bench_parity_one_row_codes"] = res["greedy"]["codes"]


CHECKS = {
    f.__name__: f
    for f in (
        check_linear,
        check_split_k,
        check_gemv,
        check_attention,
        check_decode_attention,
        check_code_predictor,
        check_talker,
        check_prefill,
        check_engine_frames,
        check_bench_parity,
    )
}


def main(argv=None) -> int:
    """Runs the checks named on the command line (all without any; ``--skip NAME ...``: all but
    those); prints their results as one JSON object."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--skip"]:
        names = [n for n in CHECKS if n not in args[1:]]
    else:
        names = args or list(CHECKS)
    out: dict = {}
    for name in names:
        CHECKS[name](out)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
