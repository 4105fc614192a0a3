import asyncio

import pytest

from triton_qwen3_tts.serving.tts.admission import Admission, AdmissionConfig, Overloaded


def run(coro):
    return asyncio.run(coro)


def test_limit_queue_and_refusal():
    async def main():
        adm = Admission(AdmissionConfig(max_in_flight=2, max_queued=1))
        order = []
        gate = asyncio.Event()

        async def job(i):
            async with adm.slot():
                order.append(("start", i))
                await gate.wait()
                order.append(("end", i))

        t = [asyncio.create_task(job(i)) for i in range(3)]
        await asyncio.sleep(0.01)
        assert adm.in_flight == 2 and adm.queued == 1
        with pytest.raises(Overloaded, match="2 requests in flight"):
            await adm.acquire()
        assert adm.refused == 1
        gate.set()
        await asyncio.gather(*t)
        assert adm.in_flight == 0 and adm.queued == 0
        assert [o for o in order if o[0] == "start"][:2] == [("start", 0), ("start", 1)]
        assert ("start", 2) in order

    run(main())


def test_cancelled_waiter_leaves_queue_without_leaking_a_slot():
    async def main():
        adm = Admission(AdmissionConfig(max_in_flight=1, max_queued=5))
        await adm.acquire()
        w = asyncio.create_task(adm.acquire())
        await asyncio.sleep(0.01)
        assert adm.queued == 1
        w.cancel()
        with pytest.raises(asyncio.CancelledError):
            await w
        assert adm.queued == 0
        adm.release()
        assert adm.in_flight == 0
        await adm.acquire()
        assert adm.in_flight == 1

    run(main())


def test_fifo_order():
    async def main():
        adm = Admission(AdmissionConfig(max_in_flight=1, max_queued=10))
        await adm.acquire()
        got = []

        async def waiter(i):
            await adm.acquire()
            got.append(i)
            adm.release()

        tasks = [asyncio.create_task(waiter(i)) for i in range(5)]
        await asyncio.sleep(0.01)
        adm.release()
        await asyncio.gather(*tasks)
        assert got == [0, 1, 2, 3, 4] and adm.in_flight == 0

    run(main())


@pytest.mark.parametrize("kw", [dict(max_in_flight=0), dict(max_queued=-1), dict(max_in_flight=1.5)])
def test_config_validation(kw):
    with pytest.raises(ValueError):
        AdmissionConfig(**kw)
