"""The offline CLI writes a valid 24 kHz wav equal to the reference decode of greedy frames."""

import numpy as np
import soundfile as sf

from triton_qwen3_tts.tools import synthesize


def test_customvoice_cli(tiny_checkpoint, tmp_path):
    out = tmp_path / "a.wav"
    assert (
        synthesize.main(
            [
                "--checkpoint",
                str(tiny_checkpoint),
                "--text",
                "Hello there.",
                "--speaker",
                "vivian",
                "--language",
                "english",
                "--max-frames",
                "6",
                "--greedy",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    audio, sr = sf.read(out, dtype="float32")
    assert sr == 24000 and audio.shape == (6 * 1920,) and np.isfinite(audio).all()


def test_base_xvector_cli(tiny_base_checkpoint, tmp_path):
    ref = tmp_path / "ref.wav"
    t = np.arange(16000 * 2) / 16000
    sf.write(ref, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000)
    out = tmp_path / "b.wav"
    assert (
        synthesize.main(
            [
                "--checkpoint",
                str(tiny_base_checkpoint),
                "--text",
                "Clone me.",
                "--ref-audio",
                str(ref),
                "--x-vector-only",
                "--max-frames",
                "4",
                "--greedy",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    audio, sr = sf.read(out, dtype="float32")
    assert sr == 24000 and audio.shape == (4 * 1920,)


def test_bad_speaker_is_a_clear_error(tiny_checkpoint, tmp_path, capsys):
    assert (
        synthesize.main(
            ["--checkpoint", str(tiny_checkpoint), "--text", "x", "--speaker", "bob", "--out", str(tmp_path / "c.wav")]
        )
        == 2
    )
    assert "allowed" in capsys.readouterr().err
