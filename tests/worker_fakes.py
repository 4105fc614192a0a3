"""Stand-ins for the engine worker process (serving/talker/worker.py ``worker_main``), for
tests/test_worker.py: they speak the worker's pipe protocol without an engine, so the tts's side
(``ProcessTalker``) is tested on its own. Module-level functions, so a spawned process can import
them.

``scripted_worker`` answers a stream by its text input:
* ``"ok N"``: N items ``[i, i]`` (float32), then the end;
* ``"bad"``: an INVALID_ARG end naming ``max_frames``;
* ``"hang"``: no item and no end until it is cancelled or aborted; each ``cancel`` and ``abort``
  it gets is counted, and the counts go out in every snapshot;
* ``"die"``: one item, then the process exits at once (a crash);
* ``"deaf S"``: stops reading the pipe for S seconds (a stalled worker: the tts's sends then
  fill the pipe), then answers every stream it finds as ``"ok 1"`` would.
"""

import time

import os
import threading

import numpy as np


def _text(inputs):
    return inputs["text"][0].decode()


def scripted_worker(conn, cfg, name, gpu=0):
    from triton_qwen3_tts.serving.stub_procs import WORKER_COMM_PREFIX
    from triton_qwen3_tts.serving.talker.worker import _name_process

    _name_process(f"{WORKER_COMM_PREFIX}{gpu}")  # as the real worker names itself
    lock = threading.Lock()
    counts = {"cancel": 0, "abort": 0, "streams": 0}
    hanging = set()

    def send(msg):
        with lock:
            conn.send(msg)

    def snapshot():
        send(("snapshot", {"counts": dict(counts), "live": len(hanging), "stats": {"name": name}, "observations": []}))

    snapshot()
    send(("ready", {"device": getattr(cfg, "device", "cpu"), "load_s": 0.0}))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        kind = msg[0]
        if kind == "stream":
            rid, text = msg[1], _text(msg[2])
            counts["streams"] += 1
            if text.startswith("ok") or (text.startswith("big") and msg[2].get("ref_audio") is not None):
                for i in range(int(text.split()[1])):
                    send(("item", rid, np.full(2, i, np.float32)))
                send(("end", rid, None))
            elif text == "bad":
                send(("end", rid, "[INVALID_ARG] max_frames: must be <= 10, got 99"))
            elif text == "hang":
                hanging.add(rid)
            elif text == "die":
                send(("item", rid, np.zeros(2, np.float32)))
                os._exit(3)
            elif text.startswith("deaf"):
                time.sleep(float(text.split()[1]))
                send(("item", rid, np.zeros(2, np.float32)))
                send(("end", rid, None))
        elif kind == "cancel":
            counts["cancel"] += 1
            hanging.discard(msg[1])
        elif kind == "abort":
            counts["abort"] += 1
            was = msg[1] in hanging
            hanging.discard(msg[1])
            if was:
                send(("end", msg[1], f"[CANCELLED] request {msg[1]} was aborted"))
            send(("aborted", msg[1], was))
        elif kind == "stop":
            return
        snapshot()


def failing_worker(conn, cfg, name, gpu=0):
    conn.send(("failed", f"{name}: RuntimeError: no such checkpoint"))


def crashing_worker(conn, cfg, name, gpu=0):
    os._exit(5)
