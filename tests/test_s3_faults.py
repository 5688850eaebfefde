"""The fault-injecting S3 front (``tests/support/s3faults.py``) injects what it claims.

A raw boto3 client with botocore's retries turned off sees each fault as it is: 503 SlowDown,
500 InternalError, a delay, a reset before the store (nothing written) and a reset after it
(written, but the client got an error). ``off()`` turns faults off; a request type is
recognised for every operation sparkguard's clients use, multipart ones included.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support import s3faults, s3server
from tests.support.s3faults import Fault, Op

pytestmark = pytest.mark.s3


def _raw_client(endpoint: str) -> Any:
    import boto3
    import botocore.config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
        config=botocore.config.Config(retries={"mode": "standard", "total_max_attempts": 1}),
    )


@pytest.mark.parametrize(
    ("method", "target", "op"),
    [
        ("PUT", "/b/k", Op.PUT),
        ("GET", "/b/k", Op.GET),
        ("HEAD", "/b/k", Op.HEAD),
        ("DELETE", "/b/k", Op.DELETE),
        ("POST", "/b?delete", Op.DELETE),
        ("GET", "/b?list-type=2&prefix=t%2F&delimiter=%2F", Op.LIST),
        ("GET", "/b?uploads&prefix=t", Op.LIST),
        ("POST", "/b/k?uploads", Op.MPU_CREATE),
        ("PUT", "/b/k?partNumber=1&uploadId=u", Op.MPU_PART),
        ("POST", "/b/k?uploadId=u", Op.MPU_COMPLETE),
        ("DELETE", "/b/k?uploadId=u", Op.MPU_ABORT),
        ("PUT", "/b", Op.OTHER),
        ("GET", "/b?location", Op.OTHER),
    ],
)
def test_requests_are_classified_by_operation(method: str, target: str, op: Op) -> None:
    assert s3faults.classify(method, target, {"host": "127.0.0.1:9000"}) is op


def test_each_fault_is_what_the_client_sees(s3_server: s3server.S3Server) -> None:
    from botocore.exceptions import ClientError, ConnectionClosedError

    bucket = s3_server.create_bucket()
    with s3faults.S3FaultFront(s3_server.endpoint, seed=7, delay_s=0.3) as front:
        client = _raw_client(front.endpoint)
        expected: dict[Fault, Any] = {
            Fault.SLOWDOWN: "SlowDown",
            Fault.INTERNAL: "InternalError",
            Fault.RESET_BEFORE: ConnectionClosedError,
            Fault.RESET_AFTER: ConnectionClosedError,
        }
        for fault in Fault:
            front.burst(Op.PUT, fault, 30)
            started = time.monotonic()
            if fault is Fault.DELAY:
                client.put_object(Bucket=bucket, Key=fault.value, Body=b"x")
                assert time.monotonic() - started >= 0.3
            elif isinstance(expected[fault], str):
                with pytest.raises(ClientError, match=expected[fault]):
                    client.put_object(Bucket=bucket, Key=fault.value, Body=b"x")
            else:
                with pytest.raises(expected[fault]):
                    client.put_object(Bucket=bucket, Key=fault.value, Body=b"x")
        with front.off():  # bursts are off too: verification reads see the store as it is
            keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
        assert keys == {"delay", "reset_after"}  # applied, although one client saw an error
        assert all(front.injected[(Op.PUT, fault)] == 1 for fault in Fault), front.report()
        front.burst(Op.PUT, Fault.SLOWDOWN, 0)
        upload = client.create_multipart_upload(Bucket=bucket, Key="m")["UploadId"]
        part = client.upload_part(Bucket=bucket, Key="m", UploadId=upload, PartNumber=1, Body=b"p")
        front.burst(Op.MPU_COMPLETE, Fault.RESET_AFTER, 30)
        with pytest.raises(ConnectionClosedError):
            client.complete_multipart_upload(
                Bucket=bucket,
                Key="m",
                UploadId=upload,
                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
            )
        with front.off():
            assert client.get_object(Bucket=bucket, Key="m")["Body"].read() == b"p"
        print(front.report())


def test_a_placed_fault_meets_only_the_requests_of_its_key(s3_server: s3server.S3Server) -> None:
    from botocore.exceptions import ClientError

    bucket = s3_server.create_bucket()
    with s3faults.S3FaultFront(s3_server.endpoint, seed=7) as front:
        client = _raw_client(front.endpoint)
        front.fail_next(Op.PUT, Fault.INTERNAL, key="/b.outcome")
        front.fail_next(Op.PUT, Fault.SLOWDOWN, key="/a.inflight")
        client.put_object(Bucket=bucket, Key="other", Body=b"x")  # no key of a placed fault
        with pytest.raises(ClientError, match="InternalError"):
            client.put_object(Bucket=bucket, Key="t/b.outcome", Body=b"x")
        with pytest.raises(ClientError, match="SlowDown"):
            client.put_object(Bucket=bucket, Key="t/a.inflight", Body=b"x")
        client.put_object(Bucket=bucket, Key="t/a.inflight", Body=b"x")  # each placed once
        assert front.injected == {(Op.PUT, Fault.INTERNAL): 1, (Op.PUT, Fault.SLOWDOWN): 1}
