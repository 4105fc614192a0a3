import numpy as np
import pytest

from triton_qwen3_tts.serving.codec.batch import bucket, check_codes, decode_batched

SPF = 4  # small samples-per-frame for the fake decoder


def causal_fake_decode(codes):
    """A strictly causal stand-in: sample j of frame t = cumulative sum of codes[:t+1] + j."""
    b, t, _ = codes.shape
    cum = np.cumsum(codes.sum(-1), axis=1).astype(np.float32)  # [B, T]
    return (np.repeat(cum, SPF, axis=1) + np.tile(np.arange(SPF, dtype=np.float32), t)).reshape(b, t * SPF)


@pytest.mark.parametrize("buckets,max_batch", [(None, None), ((8, 16, 32), None), ((8, 16, 32), 2)])
def test_batched_equals_single(buckets, max_batch):
    rng = np.random.default_rng(0)
    reqs = [rng.integers(0, 2048, size=(b, t, 16)) for b, t in [(1, 3), (2, 9), (1, 1), (1, 14)]]
    calls = []

    def dec(x):
        calls.append(x.shape)
        return causal_fake_decode(x)

    out = decode_batched(reqs, dec, samples_per_frame=SPF, frame_buckets=buckets, max_batch=max_batch)
    for req, o in zip(reqs, out):
        assert o.shape == (req.shape[0], req.shape[1] * SPF)
        np.testing.assert_array_equal(o, causal_fake_decode(req))
    if max_batch is None:
        assert len(calls) == 1 and calls[0][0] == 5
        assert calls[0][1] == (16 if buckets else 14)
    else:
        assert all(c[0] <= 2 for c in calls)


def test_bucket():
    assert bucket(5, (8, 16)) == 8 and bucket(16, (8, 16)) == 16 and bucket(17, (8, 16)) == 17
    assert bucket(5, None) == 5


@pytest.mark.parametrize(
    "codes,msg",
    [
        (np.zeros((1, 3), np.int64), "shape"),
        (np.zeros((1, 3, 8), np.int64), "shape"),
        (np.zeros((0, 3, 16), np.int64), "at least one"),
        (np.zeros((1, 3, 16), np.float32), "integers"),
        (np.full((1, 3, 16), 2048, np.int64), "values must be in"),
        (np.full((1, 3, 16), -1, np.int64), "values must be in"),
        (np.zeros((1, 30, 16), np.int64), "limit is 20"),
    ],
)
def test_check_codes(codes, msg):
    with pytest.raises(ValueError, match=msg):
        check_codes(codes, max_frames=20)
