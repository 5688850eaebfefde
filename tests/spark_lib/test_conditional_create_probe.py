"""A store that ignores ``If-None-Match: *`` is refused at its first create, not trusted.

On such a store (older MinIO and Ceph RGW releases, some appliances) a second create of a key
silently replaces the first: put-if-absent, and with it exactly-once, would not hold. The S3
test server ignores the header in buckets made for that (tests/support/moto_conditional.py,
"Ignored conditions"), beside the session's ordinary buckets.
"""

from __future__ import annotations

from typing import Any

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.filemanager import direct_put
from tests.spark_lib.test_rollback import _start
from tests.support import s3server


def _keys(server: s3server.S3Server, bucket: str) -> list[str]:
    listed = server.client().list_objects_v2(Bucket=bucket)
    return [entry["Key"] for entry in listed.get("Contents", [])]


def test_a_store_ignoring_if_none_match_is_refused_at_first_use(
    s3_server: s3server.S3Server,
) -> None:
    bucket = s3_server.create_bucket(ignores_if_none_match=True)
    options: dict[str, Any] = s3_server.storage_options
    manager, path = filemanager.resolve(f"s3://{bucket}/t", storage_options=options)
    for _ in range(2):  # the answer is cached per process: the same refusal, no new probe
        with pytest.raises(errors.UnsupportedStoreError) as refused:
            manager.put_if_absent(f"{path}/a.json", b"{}")
        message = str(refused.value)
        assert "\n" not in message
        assert s3_server.endpoint in message  # the store
        assert repr(bucket) in message  # the bucket
        assert "createMode=check-then-put" in message  # the choices
        assert "honours conditional writes" in message
    assert _keys(s3_server, bucket) == []  # neither the file nor the probe key
    # The racy opt-in still works there (one writer per path).
    racy, _ = filemanager.resolve(
        f"s3://{bucket}/t", storage_options=options, create_mode="check-then-put"
    )
    racy.put_if_absent(f"{path}/a.json", b"{}")
    assert _keys(s3_server, bucket) == ["t/a.json"]


def test_the_writer_refuses_it_before_writing_anything(
    s3_server: s3server.S3Server,
) -> None:
    bucket = s3_server.create_bucket(ignores_if_none_match=True)
    options = s3_server.storage_options
    with pytest.raises(errors.UnsupportedStoreError, match=f"bucket {bucket!r}"):
        _start(f"s3://{bucket}/t", f"s3://{bucket}/journal", options, "probe-1")
    assert _keys(s3_server, bucket) == []


def test_a_store_honouring_it_is_probed_once_and_left_clean(
    s3_server: s3server.S3Server,
) -> None:
    bucket = s3_server.create_bucket()
    manager, path = filemanager.resolve(
        f"s3://{bucket}/t", storage_options=s3_server.storage_options
    )
    assert manager.put_if_absent(f"{path}/a.json", b"{}")
    assert not manager.put_if_absent(f"{path}/a.json", b"{}")
    assert _keys(s3_server, bucket) == ["t/a.json"]  # the probe key is gone
    assert any(store[2] == bucket for store in direct_put._CONDITIONAL_CREATE)


def test_a_probe_key_deleted_between_its_puts_does_not_make_the_store_refused(
    s3_server: s3server.S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollback lists a marker directory while a process probes there and deletes the probe
    key with the markers (R7): the probe's second put then succeeds although the store honours
    the condition. One such answer must not refuse the store for the whole process."""
    bucket = s3_server.create_bucket()
    manager, path = filemanager.resolve(
        f"s3://{bucket}/t", storage_options=s3_server.storage_options
    )
    assert isinstance(manager, filemanager.DirectPutFileManager)
    call_s3 = manager.fs.call_s3
    puts: list[str] = []

    def a_rollback_deletes_the_first_probe(method: str, **kwargs: Any) -> Any:
        answer = call_s3(method, **kwargs)
        key = kwargs.get("Key", "")
        if method == "put_object" and filemanager.CREATE_PROBE_PREFIX in key:
            puts.append(key)
            if len(puts) == 1:
                call_s3("delete_object", Bucket=kwargs["Bucket"], Key=key)
        return answer

    monkeypatch.setattr(manager.fs, "call_s3", a_rollback_deletes_the_first_probe)
    assert manager.put_if_absent(f"{path}/a.json", b"{}")
    assert len(set(puts)) == 2  # a second probe, with a fresh key, answered
    assert not manager.put_if_absent(f"{path}/a.json", b"{}")
    assert _keys(s3_server, bucket) == ["t/a.json"]


def test_commands_take_the_racy_choice_from_the_environment(
    s3_server: s3server.S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI, the sidecar and the rollback initContainer take no Spark conf: on such a store
    they work with SPARKGUARD_CREATE_MODE=check-then-put, as the writer with createMode."""
    bucket = s3_server.create_bucket(ignores_if_none_match=True)
    monkeypatch.setenv(filemanager.registry.CREATE_MODE_ENV, "check-then-put")
    manager, path = filemanager.resolve(
        f"s3://{bucket}/j", storage_options=s3_server.storage_options
    )
    assert manager.put_if_absent(f"{path}/a.json", b"{}")
    assert not manager.put_if_absent(f"{path}/a.json", b"{}")  # the check still sees it
    monkeypatch.setenv(filemanager.registry.CREATE_MODE_ENV, "sometimes")
    with pytest.raises(errors.ConfigError, match="SPARKGUARD_CREATE_MODE='sometimes'"):
        filemanager.resolve(f"s3://{bucket}/j", storage_options=s3_server.storage_options)
