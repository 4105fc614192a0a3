"""stub_procs: parsing a Python-backend stub's command line, liveness, and StubWatch's report of
stubs that died (with injected process lists; the real /proc is read for the current process)."""

import os

from triton_qwen3_tts.serving.stub_procs import (
    Stub,
    StubWatch,
    find_stubs,
    find_stubs_and_workers,
    find_workers,
    is_alive,
    parse_stub_cmdline,
)


def _cmdline(model="talker", instance="talker_0_0", parent=123):
    argv = [
        "/opt/tritonserver/backends/python/triton_python_backend_stub",
        f"/repo/{model}/1/model.py",
        "triton_python_backend_shm_region_x",
        "1048576",
        "1048576",
        str(parent),
        "/opt/py",
        "12345",
        instance,
        "/repo/backends/python",
    ]
    return "\0".join(argv).encode() + b"\0"


def test_parse_stub_cmdline():
    s = parse_stub_cmdline(77, _cmdline())
    assert s == Stub(pid=77, model="talker", instance="talker_0_0", parent_pid=123)
    assert parse_stub_cmdline(1, b"python3\0-m\0pytest\0") is None
    assert parse_stub_cmdline(1, _cmdline()[:40]) is None
    # the config auto-complete stub is named after the model, not an instance: never watched
    assert parse_stub_cmdline(1, _cmdline(instance="talker")) is None


def test_is_alive_reads_proc():
    assert is_alive(os.getpid())
    assert not is_alive(2**22 + 12345)  # beyond pid_max: never a process


def test_find_stubs_in_a_fake_proc(tmp_path):
    procs = {
        10: ("talker", "talker_0_0", 5, "S"),
        11: ("tts", "tts_0_0", 5, "S"),
        12: ("talker", "talker_0_0", 6, "S"),
        13: ("talker", "talker_1_0", 5, "Z"),
    }
    for pid, (model, inst, parent, state) in procs.items():
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "cmdline").write_bytes(_cmdline(model, inst, parent))
        (d / "stat").write_text(f"{pid} (triton_python_b) {state} {parent} 1 1")
    (tmp_path / "self").mkdir()
    # 11: another model; 12: another server's; 13: a zombie (died, not reaped)
    assert find_stubs(5, ["talker"], proc=str(tmp_path)) == [Stub(10, "talker", "talker_0_0", 5)]
    assert [s.pid for s in find_stubs(None, None, proc=str(tmp_path))] == [10, 12, 11]


def test_find_stubs_skips_processes_a_stub_forked(tmp_path):
    """A process forked by a stub (vLLM, torch, multiprocessing) has the stub's command line until
    it execs: only the server's own child is the stub, so the fork's exit is not the stub's death."""
    procs = {
        10: 5,  # the talker stub, started by the server (pid 5)
        30: 10,  # forked by the stub
        31: 30,  # forked by that fork
        32: 1,  # a fork whose parent exited: reparented to init
    }
    for pid, ppid in procs.items():
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "cmdline").write_bytes(_cmdline("talker", "talker_0_0", 5))
        (d / "stat").write_text(f"{pid} (triton_python_b) S {ppid} 1 1")
    assert find_stubs(5, ["talker"], proc=str(tmp_path)) == [Stub(10, "talker", "talker_0_0", 5)]
    assert find_stubs(None, None, proc=str(tmp_path)) == [Stub(10, "talker", "talker_0_0", 5)]
    w = StubWatch(5, ["talker"], find=lambda parent, models: find_stubs(parent, models, proc=str(tmp_path)))
    w.poll()
    (tmp_path / "30" / "stat").write_text("30 (triton_python_b) Z 10 1 1")  # the fork exits
    assert w.poll() == [] and set(w.seen) == {10}


def test_stub_watch_reports_each_death_once():
    alive = {1: True, 2: True}
    stubs = [Stub(1, "talker", "talker_0_0", 9), Stub(2, "codec_decoder", "codec_decoder_0_0", 9)]

    def find(parent, models):
        return [s for s in stubs if alive[s.pid] and (models is None or s.model in models)]

    w = StubWatch(9, ["talker", "codec_decoder"], find=find, alive=lambda pid: alive[pid])
    assert w.poll() == [] and set(w.seen) == {1, 2}
    alive[1] = False
    assert [s.instance for s in w.poll()] == ["talker_0_0"]
    assert w.poll() == []  # once
    stubs.append(Stub(3, "talker", "talker_0_0", 9))  # restarted: watched from now on
    alive[3] = True
    assert w.poll() == [] and set(w.seen) == {2, 3}


def test_find_workers_in_a_fake_proc(tmp_path):
    """The tts's engine workers: children of a stub named qwen3tts-gpuN; others are not."""
    stub = Stub(11, "tts", "tts_0_0", 5)
    d = tmp_path / "11"
    d.mkdir()
    (d / "cmdline").write_bytes(_cmdline("tts", "tts_0_0", 5))
    (d / "stat").write_text("11 (triton_python_b) S 5 1 1")
    procs = {
        20: ("qwen3tts-gpu0", "S", 11),
        21: ("qwen3tts-gpu1", "S", 11),
        22: ("qwen3tts-gpu2", "Z", 11),  # died, not reaped
        23: ("python3", "S", 11),  # the stub's other child (multiprocessing's resource tracker)
        24: ("qwen3tts-gpu0", "S", 99),  # another process's
    }
    for pid, (comm, state, parent) in procs.items():
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} ({comm}) {state} {parent} 1 1")
    assert find_workers([stub], proc=str(tmp_path)) == [
        Stub(20, "tts", "tts_0_0 gpu 0 engine", 11),
        Stub(21, "tts", "tts_0_0 gpu 1 engine", 11),
    ]
    assert find_workers([], proc=str(tmp_path)) == []
    assert [s.pid for s in find_stubs_and_workers(5, None, proc=str(tmp_path))] == [11, 20, 21]
