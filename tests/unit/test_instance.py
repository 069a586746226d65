"""A process's instance id: made once, and new in a forked child (a prefork pool child is an
instance of its own, whose claims must not carry its parent's name)."""

from __future__ import annotations

import os

from orchestrator.cluster.instance import instance_id


def test_the_id_names_this_process_and_stays_the_same() -> None:
    first = instance_id()

    assert first == instance_id()
    assert first.split(":")[1] == str(os.getpid())


def test_a_forked_child_has_an_id_of_its_own() -> None:
    parent = instance_id()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its id and leave at once
        os.write(write_end, instance_id().encode())
        os._exit(0)
    os.close(write_end)
    child = os.read(read_end, 200).decode()
    os.close(read_end)
    os.waitpid(pid, 0)

    assert child != parent
    assert child.split(":")[1] == str(pid)
    assert instance_id() == parent
