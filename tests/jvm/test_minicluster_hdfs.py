"""The HDFS tier's own ground (tests/support/hdfs.py): the minicluster listens on 127.0.0.1
only, and the tests' Python client of it (WebHDFS, registered for ``hdfs://``) keeps HDFS's
answers: a rename onto an existing file is refused, a delete of a missing file is an error.
The rollback counts what it deleted and the file manager publishes by rename through them."""

from __future__ import annotations

import fsspec
import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors
from tests.support import hdfs

pytestmark = pytest.mark.hdfs


def test_the_cluster_is_on_loopback_and_python_reaches_it_by_its_hdfs_url(
    hdfs_cluster: hdfs.MiniHdfs,
) -> None:
    assert hdfs_cluster.uri.startswith("hdfs://127.0.0.1:")
    base = hdfs_cluster.fresh_dir()
    fs, path = fsspec.core.url_to_fs(base, **hdfs_cluster.storage_options)
    assert isinstance(fs, hdfs.HdfsOverWebHdfs)
    assert path == base.split(hdfs_cluster.uri, 1)[1]
    fs.pipe_file(f"{path}/a", b"first")
    fs.pipe_file(f"{path}/b", b"second")
    with pytest.raises(FileExistsError):
        fs.mv(f"{path}/b", f"{path}/a")
    assert fs.cat_file(f"{path}/a") == b"first"
    fs.rm_file(f"{path}/b")
    with pytest.raises(FileNotFoundError):
        fs.rm_file(f"{path}/b")


def test_the_rename_file_manager_publishes_once_on_the_namenode(
    hdfs_cluster: hdfs.MiniHdfs,
) -> None:
    url = f"{hdfs_cluster.fresh_dir()}/once"
    manager, path = filemanager.resolve(url, storage_options=hdfs_cluster.storage_options)
    assert manager.kind is filemanager.Kind.RENAME
    with manager.create_atomic(path) as stream:
        stream.write(b"winner")
    with pytest.raises(errors.AlreadyExistsError), manager.create_atomic(path) as stream:
        stream.write(b"loser")
    assert manager.read_bytes(path) == b"winner"
    assert manager.delete_existing([path, f"{path}-missing"]) == {path}
