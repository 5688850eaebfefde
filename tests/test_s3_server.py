"""The tests' S3 server decides conditional writes atomically, as AWS S3 does.

moto alone checks ``If-None-Match: *`` and then stores, in a threaded server: two racing creates
of one key can both succeed, and a sparkguard race test (``test_races.py``, put-if-absent across
processes) once saw two winners that S3 never allows. ``tests/support/moto_conditional.py``
makes the check and the store one step. These tests race creates of each key against the
server, with the window between moto's check and its store widened to 300 ms so that a race
is certain rather than rare, and count the winners: one with the server the tests use, several
with moto's own writes (which shows the test would catch the defect).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.support import s3server

KEYS = 3
RACERS = 4
WIDEN = ("--race-window-ms", "300")


def race_creates(server: s3server.S3Server) -> dict[str, int]:
    """``RACERS`` threads each create every one of ``KEYS`` keys with ``If-None-Match: *``,
    starting each key together; how many creates of each key the server accepted."""
    from botocore.exceptions import ClientError

    bucket = server.create_bucket()
    clients = [server.client() for _ in range(RACERS)]
    wins: dict[str, int] = {f"k{i}": 0 for i in range(KEYS)}
    lock = threading.Lock()
    barrier = threading.Barrier(RACERS)
    failures: list[str] = []

    def racer(client: Any, index: int) -> None:
        for key in wins:
            barrier.wait()
            try:
                client.put_object(Bucket=bucket, Key=key, Body=f"{index}".encode(), IfNoneMatch="*")
            except ClientError as err:
                if err.response["Error"]["Code"] != "PreconditionFailed":
                    failures.append(str(err))
                continue
            with lock:
                wins[key] += 1

    threads = [threading.Thread(target=racer, args=(c, i)) for i, c in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    return wins


@pytest.mark.parametrize("conditional_deletes", [False, True])
def test_racing_conditional_creates_have_one_winner(conditional_deletes: bool) -> None:
    with s3server.run_s3_server(conditional_deletes=conditional_deletes, server_flags=WIDEN) as s3:
        wins = race_creates(s3)
    assert wins == dict.fromkeys(wins, 1)


def test_moto_alone_lets_racing_creates_both_win() -> None:
    with s3server.run_s3_server(server_flags=(*WIDEN, "--moto-writes")) as s3:
        wins = race_creates(s3)
    assert any(count > 1 for count in wins.values()), wins
