"""The thread count fits what other work leaves free: the choice, its inputs and the user's override,
tested on given readings (nothing here is timed)."""

import os
import subprocess
import sys

import pytest
import torch
from conftest import write_tiny_checkpoint

from mtkit.engines.threads import (
    BUSY_SHARE,
    LoadProbe,
    Sample,
    ThreadPolicy,
    cgroup_quota,
    choose_threads,
    machine_busy_seconds,
    serving_choice,
    since_start,
    usable_cpus,
    user_threads,
)


def test_one_thread_per_cpu_that_other_work_leaves_free():
    assert choose_threads(2, 0.0)[0] == 2  # a quiet machine: every CPU
    assert choose_threads(2, BUSY_SHARE - 0.05)[0] == 2  # background noise takes no CPU
    assert choose_threads(2, 0.6)[0] == 1  # a CPU-bound neighbour our own threads crowd
    assert choose_threads(2, 1.0)[0] == 1
    assert choose_threads(2, 2.0)[0] == 1  # never fewer than one
    assert choose_threads(8, 3.0)[0] == 5
    assert choose_threads(4, None) == (4, "4 usable CPUs")  # no reading: every usable CPU
    n, why = choose_threads(2, 1.0)
    assert why == "2 usable CPUs, 1.0 busy with other work"


def test_the_users_count_always_wins():
    assert user_threads(3, {"OMP_NUM_THREADS": "5"}) == (3, "set by --threads")
    assert user_threads(0, {"OMP_NUM_THREADS": "5"}) == (5, "set by OMP_NUM_THREADS")
    assert user_threads(0, {"OMP_NUM_THREADS": ""}) is None
    assert user_threads(0, {"OMP_NUM_THREADS": "0"}) is None
    assert user_threads(0, {"OMP_NUM_THREADS": "two"}) is None
    assert user_threads(0, {}) is None
    assert choose_threads(2, 2.0, (5, "set by OMP_NUM_THREADS")) == (5, "set by OMP_NUM_THREADS")


def test_usable_cpus_are_the_affinity_capped_by_the_cgroup_quota(tmp_path):
    assert usable_cpus(affinity=8, quota=2.5) == 3  # a quota of 2.5 CPUs lets 3 threads run
    assert usable_cpus(affinity=2, quota=16.0) == 2
    assert usable_cpus(affinity=4, quota=0.5) == 1
    assert 1 <= usable_cpus() <= (os.cpu_count() or 1)
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(v2) is None
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert cgroup_quota(v2) == 1.5
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(v1) is None
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    assert cgroup_quota(v1) == 3.0
    assert cgroup_quota(tmp_path / "none") is None


def test_the_machines_busy_time_is_proc_stat_less_idle_and_iowait():
    hz = os.sysconf("SC_CLK_TCK")
    line = "cpu  100 20 30 5000 70 4 6 10 0 0\n"  # user nice system idle iowait irq softirq steal guest
    assert machine_busy_seconds(line) == (100 + 20 + 30 + 4 + 6 + 10) / hz
    assert machine_busy_seconds("intr 1 2 3") is None
    assert machine_busy_seconds() is None or machine_busy_seconds() > 0


def test_other_work_is_the_machines_busy_time_less_our_own():
    probe = LoadProbe(Sample(wall=0.0, machine=100.0, own=10.0))
    # 10 s of wall time; the machine spent 18 CPU-seconds busy, we 8 of them: others kept 1 CPU busy.
    assert probe.others(Sample(wall=10.0, machine=118.0, own=18.0)) == 1.0
    assert probe.others(Sample(wall=20.0, machine=128.0, own=28.0)) == 0.0  # only us since
    assert probe.others(Sample(wall=20.0, machine=128.0, own=28.0)) is None  # no time has passed
    assert probe.others(None) is None  # no /proc/stat


def test_a_policy_sets_the_count_when_it_changes_and_says_why():
    calls = []
    probe = LoadProbe(Sample(0.0, 0.0, 0.0))
    policy = ThreadPolicy(calls.append, usable=2, probe=probe)
    assert policy.check(Sample(5.0, 5.0, 5.0)) == "threads: 2 (2 usable CPUs, 0.0 busy with other work)"
    assert policy.check(Sample(10.0, 10.0, 10.0)) is None  # unchanged: nothing set, nothing said
    assert policy.check(Sample(15.0, 19.5, 14.5)) == "threads: 1 (2 usable CPUs, 1.0 busy with other work)"
    assert policy.check(Sample(20.0, 24.5, 19.5)) == "threads: 2 (2 usable CPUs, 0.0 busy with other work)"
    assert calls == [2, 1, 2]
    fixed = ThreadPolicy(calls.append, user=(3, "set by OMP_NUM_THREADS"), usable=2, probe=probe)
    assert fixed.check(Sample(30.0, 50.0, 20.0)) == "threads: 3 (set by OMP_NUM_THREADS)"
    assert fixed.check(Sample(40.0, 70.0, 20.0)) is None
    assert calls == [2, 1, 2, 3]


def test_a_policy_reads_the_load_again_only_after_its_interval():
    calls = []
    policy = ThreadPolicy(calls.append, usable=2, probe=LoadProbe(Sample(0.0, 0.0, 0.0)), min_interval=5.0)
    assert policy.check(Sample(1.0, 1.0, 1.0)) == "threads: 2 (2 usable CPUs, 0.0 busy with other work)"
    # 3 s later another process has kept a CPU busy, but the interval has not passed: no new reading
    assert policy.check(Sample(4.0, 7.0, 4.0)) is None and policy.probe.last.wall == 1.0
    # past it: the reading spans the whole 6 s since the last one (other work kept one CPU busy)
    assert policy.check(Sample(7.0, 13.0, 7.0)) == "threads: 1 (2 usable CPUs, 1.0 busy with other work)"
    assert calls == [2, 1]


def test_fit_applies_the_count_in_each_thread_that_differs():
    """torch keeps a thread count per thread: each of a server's decoding threads applies the choice itself."""
    per_thread = {"a": 2, "b": 2}
    me = {"name": "a"}

    def set_threads(n):
        per_thread[me["name"]] = n

    busy = Sample(10.0, 20.0, 10.0)  # 10 s, of which other work kept one CPU busy
    policy = ThreadPolicy(set_threads, usable=2, probe=LoadProbe(Sample(0.0, 0.0, 0.0)),
                          get_threads=lambda: per_thread[me["name"]])
    assert policy.check(busy) == "threads: 1 (2 usable CPUs, 1.0 busy with other work)"
    assert per_thread == {"a": 1, "b": 2}
    policy.probe.others = lambda now="now": 1.0  # the load as it was
    me["name"] = "b"
    assert policy.fit() is None  # no change to say, but thread b takes the count
    assert per_thread == {"a": 1, "b": 1}


def test_a_choice_can_be_left_to_the_caller_to_apply():
    calls = []
    policy = ThreadPolicy(calls.append, user=(3, "set by --threads"), usable=2)
    assert policy.check(apply=False) == "threads: 3 (set by --threads)" and policy.current == 3 and calls == []


def test_a_servers_decoding_threads_share_the_free_cpus_but_one():
    choose = serving_choice(2)
    assert choose(2, 0.0)[0] == 1 and choose(2, 1.0)[0] == 1
    assert choose(16, 0.0)[0] == 7 and choose(16, 8.0)[0] == 3  # 15 free of which 1 for HTTP; 8 free
    assert choose(16, None)[0] == 7
    assert choose(16, 8.0, (5, "set by OMP_NUM_THREADS")) == (5, "set by OMP_NUM_THREADS")


def test_the_first_reading_spans_the_process_start(monkeypatch):
    from mtkit.engines import threads

    started = Sample(100.0, 50.0, 1.0)
    monkeypatch.setattr(threads, "STARTED", started)
    monkeypatch.setattr(threads.time, "monotonic", lambda: 130.0)
    assert since_start(max_age=60.0).last is started
    monkeypatch.setattr(threads.time, "monotonic", lambda: 200.0)
    assert since_start(max_age=60.0).last is not started  # too old to say anything of now


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny untrained mtkit checkpoint with a real SentencePiece model."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny.pt")


def test_translate_takes_fewer_threads_only_when_other_work_holds_cpus(checkpoint, monkeypatch, capsys):
    """The torch engine's threads: torch's own count on a quiet machine, one fewer per CPU other work holds,
    and the user's OMP_NUM_THREADS untouched (no reading taken); the count and why said on stderr."""
    from mtkit.engines import threads
    from mtkit.engines.factory import LoadOptions, build_translator
    from mtkit.logs import to_stderr

    options = LoadOptions(device="cpu", threads=0, any_target=False)  # the CLI's choice (the API's: None)

    to_stderr()  # what the library says, on stderr, as the CLI has it
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    from mtkit.engines import factory

    monkeypatch.setattr(factory, "usable_cpus", lambda: 2)
    busy = {"others": 1.0}
    monkeypatch.setattr(threads.LoadProbe, "others", lambda self, now="now": busy["others"])
    try:
        torch.set_num_threads(2)
        translator = build_translator([checkpoint], options)
        assert torch.get_num_threads() == 1
        assert "threads: 1 (2 usable CPUs, 1.0 busy with other work)" in capsys.readouterr().err
        # between batches the engine chooses again (here at once: no interval), in the thread that decodes
        busy["others"] = 0.0
        translator.threads.min_interval = 0.0
        translator.translate_text(["a b c", "d e"])
        assert torch.get_num_threads() == 2
        assert "threads: 2 (2 usable CPUs, 0.0 busy with other work)" in capsys.readouterr().err
        busy["others"] = 0.1
        torch.set_num_threads(2)
        build_translator([checkpoint], options)
        assert torch.get_num_threads() == 2
        assert "threads: 2 (2 usable CPUs, 0.1 busy with other work)" in capsys.readouterr().err
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        busy["others"] = 2.0
        translator = build_translator([checkpoint], options)
        assert torch.get_num_threads() == 2 and "threads: 2 (set by OMP_NUM_THREADS)" in capsys.readouterr().err
        assert translator.threads is None  # nothing chosen between batches either
    finally:
        torch.set_num_threads(before)


def test_the_start_reading_is_taken_when_the_program_asks_never_at_import():
    """Importing the module takes no reading (a library sets no state unless asked); mark_start, which the
    CLI calls first, takes the one since_start reads from; without it a probe reads from its making."""
    code = ("import mtkit.engines.threads as t\n"
            "print(t.STARTED is None, t.since_start().last is not None)\n"
            "t.mark_start()\n"
            "print(t.since_start().last is t.STARTED is not None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True"]
