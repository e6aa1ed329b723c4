"""The host's private scratch folders (shellbolt/_host/scratch.py): each
names its owner; those whose owner is gone (killed with kill -9) are swept;
a folder for sockets keeps their paths within the kernel's limit."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from multilang.errors import MultilangError
from multilang.shellbolt._host import scratch
from multilang.shellbolt._host.pids import cmdline, start_time
from multilang.testing import Seen


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _folder(tmp, name: str, owner: str | None):
    path = tmp / name
    path.mkdir(mode=0o700)
    (path / "1-1").mkdir()  # what a run keeps there (a task's pid files)
    if owner is not None:
        (path / ".multilang-owner").write_text(owner)
    return path


def test_only_the_folders_of_owners_that_are_gone_are_swept(tmp):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    me = f"{os.getpid()} {start_time(os.getpid())}"
    dead = _folder(tmp, "multilang-pids-dead", f"{dead_pid} 1")
    reused = _folder(tmp, "multilang-state-reused", f"{os.getpid()} 1")  # this pid, another start: a reused pid
    mine = _folder(tmp, "multilang-workers-mine", me)
    unowned = _folder(tmp, "multilang-pids-unowned", None)  # being made, or by an older version
    # A container's, sharing this temporary directory: its pid is not the one seen here, dead or alive
    elsewhere = _folder(tmp, "multilang-pids-elsewhere", f"{dead_pid} 1 pid:[1]")
    other = _folder(tmp, "something-else", f"{dead_pid} 1")
    removed = [p for p in scratch.sweep() if p.startswith(str(tmp))]  # (/tmp is swept too: sockets' folders)
    assert sorted(removed) == sorted([str(dead), str(reused)])
    assert not dead.exists() and not reused.exists()
    assert mine.exists() and unowned.exists() and other.exists() and elsewhere.exists()


def test_a_folder_names_its_owner_and_is_private(tmp):
    path = scratch.make("multilang-pids-")
    assert os.path.dirname(path) == str(tmp)
    assert os.stat(path).st_mode & 0o777 == 0o700
    pid, started, namespace = open(os.path.join(path, ".multilang-owner")).read().split()
    assert int(pid) == os.getpid() and started == start_time(os.getpid())
    assert namespace == os.readlink("/proc/self/ns/pid")
    assert path not in scratch.sweep() and os.path.isdir(path)


def test_a_socket_folder_leaves_a_too_long_tmpdir_for_tmp(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    path = scratch.make("multilang-workers-", len("wmain"))
    try:
        assert os.path.dirname(path) == "/tmp"
        assert len(os.path.join(path, "wmain")) <= scratch.MAX_SOCKET_PATH
    finally:
        shutil.rmtree(path)
    assert os.path.dirname(scratch.make("multilang-pids-")) == str(deep)  # no socket: where TMPDIR says


def test_no_short_enough_temporary_directory_is_a_named_error(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    monkeypatch.setattr(scratch, "_SHORT", (str(tmp_path / "no-such-dir"),))  # a machine without /tmp
    with pytest.raises(MultilangError, match=r"too long a path for the host workers' sockets .* set TMPDIR"):
        scratch.make("multilang-workers-", len("wmain"))


_LONG = [sys.executable, "-c", "import time; time.sleep(600)", "/a/long/path" * 9, "--the-flags-at-the-end"]


@pytest.mark.parametrize("argv, said", [(["sleep", "600"], r"\(sleep 600\)"),
                                        # (a long command by its program's name and its end: script and flags)
                                        (_LONG, r"\(python[\d.]* -c import time.*\.\.\..* --the-flags-at-the-end\)")])
def test_the_sweep_ends_what_a_dead_owner_left_of_its_process_groups_and_nothing_else(tmp, caplog, argv, said):
    # A host killed with kill -9 reaps nothing: a component (here one that has
    # exited already) may leave processes of its group running. The sweep of
    # its folder ends them; a record whose pid is another process's now (this
    # one's, with another start time) is left alone.
    leader = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                               f"print(subprocess.Popen({argv!r}).pid, flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    left = int(leader.stdout.readline())
    started = start_time(leader.pid)
    leader.stdin.close()
    leader.wait()  # (gone: its child is what is left of its group)
    try:
        dead = _folder(tmp, "multilang-pids-dead", f"{leader.pid} {started}")
        scratch.note_child(str(dead / "1-1"), leader.pid, started, "component 'split' task 1")
        scratch.note_child(str(dead), os.getpid(), "1", "component 'count' task 2")
        assert str(dead) in scratch.sweep()
        deadline = time.monotonic() + 30  # (SIGKILL is sent; the kernel ends the process soon after)
        while Seen([left]).running():
            assert time.monotonic() < deadline, "what was left of the group still runs"
            time.sleep(0.01)
        assert re.search(rf"component 'split' task 1: pid {left} {said} still ran after its host process", caplog.text)
        assert "count" not in caplog.text
    finally:
        if start_time(left) is not None:
            os.kill(left, 9)


def test_a_process_started_as_its_owner_was_killed_is_found_by_the_mark_in_its_environment(tmp, caplog):
    # A trial killed hosts in the milliseconds between a spawn and the record of
    # its pid: 2 of 6 such kills left a stubborn component running. The mark is
    # written down before the spawn, and the process (and what it started in
    # turn, which inherits its environment) carries it; another mark's process
    # is left alone.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = _folder(tmp, "multilang-pids-dead", f"{int(gone.stdout)} 1")
    mark = scratch.note_spawning(str(dead / "1-1"), "component 'count' task 3")
    assert mark is not None
    started = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                                "print(subprocess.Popen(['sleep', '600']).pid, flush=True); sys.stdin.read()"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
                               env={**os.environ, scratch.CHILD_ENV: mark})
    other = subprocess.Popen(["sleep", "600"], env={**os.environ, scratch.CHILD_ENV: mark + "0"},
                             start_new_session=True)
    child = int(started.stdout.readline())
    try:
        # Popen returns once the exec has begun; the kernel gives /proc the new program's arguments and
        # environment a little later (a busy machine's sweep found the child with none, 1 run in 10)
        deadline = time.monotonic() + 30
        while cmdline(child) != "sleep 600":
            assert time.monotonic() < deadline, "the process it started in turn never showed its command line"
            time.sleep(0.001)
        assert str(dead) in scratch.sweep()
        started.wait(timeout=30)
        deadline = time.monotonic() + 30  # (SIGKILL is sent; the kernel ends the process soon after)
        while Seen([child]).running():
            assert time.monotonic() < deadline, "the process it started in turn still runs"
            time.sleep(0.01)
        assert started.returncode == -9
        assert re.search(rf"component 'count' task 3: pid {started.pid} \(.*python.*\), pid {child} \(sleep 600\) "
                         r"still ran after its host process \(pid \d+\) had gone without ending them", caplog.text)
        assert other.poll() is None
    finally:
        for proc in (started, other):
            proc.kill()
            proc.wait()
        if start_time(child) is not None:
            os.kill(child, 9)


def test_a_mark_is_forgotten_once_the_process_is_written_down_by_its_pid(tmp):
    folder = scratch.make("multilang-pids-")
    mark = scratch.note_spawning(folder, "component 'split' task 1")
    assert mark is not None and os.listdir(folder) != [".multilang-owner"]
    scratch.forget_spawning(folder, mark)
    assert os.listdir(folder) == [".multilang-owner"]
    assert scratch.note_spawning(str(tmp), "component 'split' task 1") is None  # (a folder not ours: no mark)


def test_a_folder_the_host_was_given_gets_no_record(tmp):
    given = tmp / "pids"
    given.mkdir()
    scratch.note_child(str(given), os.getpid(), start_time(os.getpid()), "component 'split' task 1")
    assert list(given.iterdir()) == []

