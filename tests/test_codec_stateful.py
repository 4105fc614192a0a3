"""Stateful streaming codec decoder: chunked stateful decode == whole-utterance decode.

The tiny decoder has 2 attention layers (reach 2 * 71 = 142 frames), so 200-frame utterances
exercise the KV shift buffer past its wrap and past the full attention reach.
"""

import re
import time
from pathlib import Path

import pytest
import torch

from triton_qwen3_tts.model import presets
from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights
from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder, bench_modes
from triton_qwen3_tts.model.config import CodecDecoderConfig

SPF = 1920
ATOL = 1e-5
FRAMES = 200
DOC = Path(__file__).resolve().parents[1] / "docs" / "design" / "stateful-codec.md"


def cfg(preset):
    return CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(preset)["decoder_config"])


def codes(b, t, seed=0):
    return torch.randint(0, 2048, (b, t, 16), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def dec():
    return init_random_codec_weights(CodecDecoder(cfg("tiny")), 0).eval()


@pytest.fixture(scope="module")
def sd(dec):
    return StatefulCodecDecoder(dec)


@pytest.fixture(scope="module")
def utt(dec):
    c = codes(2, FRAMES, seed=1)
    with torch.no_grad():
        return c, dec.decode(c)


def _fill(pattern, total):
    out = []
    while sum(out) < total:
        for p in pattern:
            out.append(min(p, total - sum(out)))
            if sum(out) == total:
                break
    return out


SCHEDULES = {
    # single-frame steps through the KV fill and shift (pos 0..89), and past the 142-frame reach;
    # the pure [1] * 200 schedule runs under -m slow (200 steps: ~10-50 s on the shared CPU)
    "ones": [1] * 90 + [FRAMES - 90],
    "ones_late": [150] + [1] * 20 + [FRAMES - 170],
    "twos": [2] * (FRAMES // 2),
    "fours": [4] * (FRAMES // 4),
    "eights": [8] * (FRAMES // 8),
    "25s": [25] * (FRAMES // 25),
    "mixed": _fill([2, 4, 8, 16, 25], FRAMES),
    "mixed_odd": _fill([1, 3, 70, 71, 72, 5, 13], FRAMES),
    "whole": [FRAMES],
}


def test_shares_weights_no_copies(dec, sd):
    ours = {id(p) for p in sd.parameters()}
    assert ours == {id(p) for p in dec.parameters()}
    assert sd.decoder is dec


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_chunked_equals_whole(sd, utt, name):
    c, full = utt
    sched = SCHEDULES[name]
    assert sum(sched) == FRAMES
    out = sd.decode_chunks(c, sched)
    assert out.shape == full.shape
    err = (out - full).abs().max().item()
    assert err <= ATOL, f"{name}: max |diff| {err:.3e}"


@pytest.mark.parametrize("name", ["ones", "mixed", "mixed_odd", "whole"])
def test_channels_last_vocoder_chunked_equals_whole(dec, utt, name):
    """codec_channels_last: the vocoder on [B, C, 1, L] channels-last tensors decodes the same
    audio as the whole decode, chunk by chunk."""
    c, full = utt
    out = StatefulCodecDecoder(dec, channels_last=True).decode_chunks(c, SCHEDULES[name])
    err = (out - full).abs().max().item()
    assert err <= ATOL, f"{name}: max |diff| {err:.3e}"


def test_channels_last_state_is_the_reference_state(dec, sd):
    """The channels-last vocoder hands on the same state (names, shapes, values), and each layout
    continues the other's state."""
    cl = StatefulCodecDecoder(dec, channels_last=True)
    first, second = codes(3, 7, seed=5), codes(3, 5, seed=6)
    with torch.no_grad():
        a1, sa = sd.step(first, sd.init_state(3))
        b1, sb = cl.step(first, cl.init_state(3))
        assert list(sb) == list(sa)
        for n in sa:
            assert sb[n].shape == sa[n].shape, n
            assert (sb[n] - sa[n]).abs().max().item() <= ATOL, n
        assert (b1 - a1).abs().max().item() <= ATOL
        a2, _ = sd.step(second, sb)  # the reference layout continues the channels-last state
        b2, _ = cl.step(second, sa)
        assert (b2 - a2).abs().max().item() <= ATOL


def test_windowed_decode_is_not_exact(dec, utt):
    """Sanity: the comparison above is sensitive; a 72-frame window is NOT exact past the window."""
    c, full = utt
    with torch.no_grad():
        win = dec.decode_window(c[:, FRAMES - 25 - 72 :], 72)
    assert (win - full[:, (FRAMES - 25) * SPF :]).abs().max().item() > 1e-4


def test_dropping_kv_state_breaks_exactness(sd, utt):
    """Sanity: the carried KV state matters (zeroing it mid-stream changes the audio)."""
    c, full = utt
    with torch.no_grad():
        _, st = sd.step(c[:, :100], sd.init_state(2))
        for k in st:
            if k.startswith("attn."):
                st[k] = torch.zeros_like(st[k])
        a, _ = sd.step(c[:, 100:125], st)
    assert (a - full[:, 100 * SPF : 125 * SPF]).abs().max().item() > 1e-4


def test_initial_state_is_zeros_with_fixed_shapes(sd, utt):
    c, _ = utt
    st = sd.init_state(3)
    assert list(st) == sd.state_names()
    assert all(bool((t == 0).all()) for t in st.values())
    assert st["pos"].dtype == torch.int64
    assert all(t.dtype == torch.float32 for n, t in st.items() if n != "pos")
    shapes = {n: tuple(t.shape) for n, t in st.items()}
    assert shapes == dict(sd.state_shapes(3))
    before = {n: t.clone() for n, t in st.items()}
    with torch.no_grad():
        for t in (1, 7, 80):
            _, new = sd.step(codes(3, t, seed=t), st)
            assert {n: tuple(x.shape) for n, x in new.items()} == shapes  # fixed, not data dependent
            assert list(new) == sd.state_names()
            st = new
    assert st["pos"].tolist() == [88, 88, 88]
    assert all(torch.equal(before[n], sd.init_state(3)[n]) for n in before)  # step does not mutate


def test_batch8_rows_at_different_positions_are_independent(dec, sd):
    """8 streams, each advanced solo to a different position with its own chunk schedule, then
    batched together for one step: each row equals its solo step and its whole-utterance decode."""
    b, new_t = 8, 5
    positions = [0, 1, 30, 70, 71, 72, 143, 190]
    schedules = [[], [1], [7, 23], [70], [25, 25, 21], [2, 4, 8, 16, 25, 17], [100, 43], [25] * 7 + [15]]
    allc = codes(b, max(positions) + new_t, seed=5)
    solo_states, solo_out, ref = [], [], []
    with torch.no_grad():
        for r in range(b):
            p = positions[r]
            assert sum(schedules[r]) == p
            st, start = sd.init_state(1), 0
            for ch in schedules[r]:
                _, st = sd.step(allc[r : r + 1, start : start + ch], st)
                start += ch
            solo_states.append(st)
            a, _ = sd.step(allc[r : r + 1, p : p + new_t], st)
            solo_out.append(a[0])
            ref.append(dec.decode(allc[r : r + 1, : p + new_t])[0, p * SPF :])
        batched = sd.unflatten_state([torch.cat(ts, 0) for ts in zip(*(sd.flatten_state(s) for s in solo_states))])
        new_codes = torch.stack([allc[r, positions[r] : positions[r] + new_t] for r in range(b)])
        out, new_state = sd.step(new_codes, batched)
    assert out.shape == (b, new_t * SPF)
    assert new_state["pos"].tolist() == [p + new_t for p in positions]
    for r in range(b):
        assert (out[r] - solo_out[r]).abs().max().item() <= ATOL, f"row {r} vs solo"
        assert (out[r] - ref[r]).abs().max().item() <= ATOL, f"row {r} vs whole decode"


def test_flatten_unflatten_and_onnx_names(sd):
    st = sd.init_state(2)
    flat = sd.flatten_state(st)
    assert len(flat) == len(sd.state_names())
    back = sd.unflatten_state(flat)
    assert list(back) == list(st) and all(back[n] is st[n] for n in st)
    ins, outs = sd.onnx_state_names()
    assert len(set(ins)) == len(ins) == len(flat) and len(set(outs)) == len(outs)
    assert all(re.fullmatch(r"state_in_[A-Za-z0-9_]+", n) for n in ins)
    assert [n[len("state_in_") :] for n in ins] == [n[len("state_out_") :] for n in outs]
    with pytest.raises(ValueError):
        sd.unflatten_state(flat[:-1])


def test_flat_forward_matches_step(sd):
    c = codes(2, 9, seed=3)
    st = sd.init_state(2)
    with torch.no_grad():
        a1, s1 = sd.step(c, st)
        outs = sd(c, *sd.flatten_state(st))
    assert torch.equal(outs[0], a1)
    assert all(torch.equal(x, y) for x, y in zip(outs[1:], sd.flatten_state(s1)))


def _doc_bytes(preset_label):
    text = DOC.read_text()
    m = re.search(rf"^\|\s*{preset_label}\s*\|[^\n]*?\|\s*([\d,]+)\s*\|", text, re.M)
    assert m, f"no '{preset_label}' row in the size table of {DOC}"
    return int(m.group(1).replace(",", ""))


def test_state_size_matches_doc(sd):
    assert sd.state_bytes_per_stream(torch.float32) == _doc_bytes("tiny")
    with torch.device("meta"):
        real = StatefulCodecDecoder(CodecDecoder(cfg("1.7b-customvoice")))
    assert real.state_bytes_per_stream(torch.float32) == _doc_bytes("real")
    # accounting matches the tensors actually allocated
    st = sd.init_state(1)
    assert sum(t.numel() * t.element_size() for t in st.values()) == sd.state_bytes_per_stream()


def test_bench_modes_smoke(dec):
    r = bench_modes(dec, [1], chunk=2, context=3, warmup=0, iters=1)
    assert set(r) == {1}
    for k in ("windowed_audio_s_per_s", "stateful_audio_s_per_s", "windowed_ms", "stateful_ms", "speedup"):
        assert r[1][k] > 0


@pytest.mark.slow
def test_all_single_frame_steps(sd, utt):
    c, full = utt
    out = sd.decode_chunks(c, [1] * FRAMES)
    assert (out - full).abs().max().item() <= ATOL


@pytest.mark.slow
def test_real_size_chunked_equals_whole():
    """Real-size (114M) decoder: 100 frames (past the 72 window), 25-frame and mixed chunks."""
    d = init_random_codec_weights(CodecDecoder(cfg("1.7b-customvoice")), 0).eval()
    s = StatefulCodecDecoder(d)
    c = codes(1, 100, seed=2)
    t0 = time.time()
    with torch.no_grad():
        full = d.decode(c)
    t_full = time.time() - t0
    for sched in ([25] * 4, [1, 2, 4, 8, 16, 25, 44]):
        t0 = time.time()
        out = s.decode_chunks(c, sched)
        err = (out - full).abs().max().item()
        print(f"real size {sched}: max|diff| {err:.3e}, {time.time() - t0:.1f}s (whole {t_full:.1f}s)")
        assert err <= ATOL, f"{sched}: {err:.3e}"


def test_onnx_export_parity_tiny(dec, tmp_path):
    """CPU ONNX export of the stateful step: state carried through onnxruntime == PyTorch whole decode."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    import importlib.util

    p = Path(__file__).resolve().parents[1] / "export" / "export_codec_stateful_onnx.py"
    spec = importlib.util.spec_from_file_location("_export_codec_stateful_onnx", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = mod.export_stateful_onnx(dec, str(tmp_path / "stateful.onnx"))
    import onnx

    m = onnx.load(path)
    sd = StatefulCodecDecoder(dec)
    ins, outs = mod.io_names(sd)
    assert [i.name for i in m.graph.input] == ins and [o.name for o in m.graph.output] == outs
    for i in m.graph.input[1:]:
        assert i.type.tensor_type.shape.dim[0].dim_param == "batch"
    r = mod.check_stateful_parity(dec, path)
    assert r["stream_max_abs"] <= 1e-4 and r["rows_max_abs"] <= 1e-4, r
