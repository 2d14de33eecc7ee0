"""Dataset downloads against a local HTTP server on 127.0.0.1 that serves archives the tests build, from the
command line and by a run that needs a missing dataset (``download_data=true``)."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig

from fedrec.app.build import RunDataset, run_dataset
from fedrec.data import download as dl
from fedrec.data import read_ratings
from fedrec.data.__main__ import main
from fedrec.errors import ConfigError, DatasetNotFoundError

ROOT = Path(__file__).resolve().parents[1]
U_DATA = "1\t10\t5\t881250949\n1\t20\t3\t881250950\n2\t10\t4\t881250951\n2\t30\t1\t881250952\n"
U_ITEM = "10|A (1995)|\n20|B (1995)|\n30|C (1995)|\n"
U_USER = "1|24|M|technician|85711\n2|53|F|other|94043\n"


def make_zip(members: dict[str, str]) -> bytes:
    """A zip archive holding ``members`` (path inside the archive -> text)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, text in members.items():
            archive.writestr(path, text)
    return buffer.getvalue()


ML100K_ZIP = make_zip(
    {"ml-100k/u.data": U_DATA, "ml-100k/u.item": U_ITEM, "ml-100k/u.user": U_USER, "ml-100k/README": "test\n"}
)


class Server:
    """Serves ``routes[path] = (status, body, bytes actually sent)`` and counts the requests."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, bytes, int]] = {}
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests += 1
                status, body, sent = server.routes.get(self.path, (404, b"not found", len(b"not found")))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[:sent])
                self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def serve(self, path: str, body: bytes, status: int = 200, sent: int | None = None) -> str:
        """Serve ``body`` at ``path`` (only its first ``sent`` bytes, if given) and return the URL."""
        self.routes[path] = (status, body, len(body) if sent is None else sent)
        return self.base + path


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    srv = Server()
    thread = threading.Thread(target=srv.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()
    thread.join()


def point_registry(monkeypatch: pytest.MonkeyPatch, name: str, url: str, body: bytes | None) -> None:
    """Make the registry entry ``name`` fetch ``url`` and expect the SHA-256 of ``body`` (None = unrecorded)."""
    sha = None if body is None else hashlib.sha256(body).hexdigest()
    monkeypatch.setitem(dl.REGISTRY, name, dataclasses.replace(dl.REGISTRY[name], url=url, sha256=sha))


def assert_untouched(data_dir: Path, *expected: str) -> None:
    """``data_dir`` holds exactly ``expected``: nothing half-installed and no temporary files."""
    assert sorted(p.name for p in data_dir.iterdir()) == sorted(expected)


def test_download_installs_the_folder_the_loader_reads(
    server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    point_registry(monkeypatch, "ml-100k", server.serve("/ml-100k.zip", ML100K_ZIP), ML100K_ZIP)
    data_dir = tmp_path / "data"

    folder = dl.download_dataset("ml-100k", data_dir, progress=False)

    assert folder == data_dir / "ml-100k"
    assert (folder / "u.data").read_text() == U_DATA
    assert_untouched(data_dir, "ml-100k")
    assert len(read_ratings("ml-100k", data_dir)) == 4
    assert dl.download_dataset("ml-100k", data_dir, progress=False) == folder  # installed: no second request
    assert server.requests == 1


@pytest.mark.parametrize(
    ("name", "members"),
    [
        ("lastfm", {"user_artists.dat": "a\n", "user_taggedartists.dat": "b\n", "readme.txt": "r\n"}),
        ("diabetes", {"dataset_diabetes/diabetic_data.csv": "x\n", "dataset_diabetes/IDs_mapping.csv": "y\n"}),
        ("diabetes", {"diabetic_data.csv": "x\n", "__MACOSX/._diabetic_data.csv": "mac\n"}),
    ],
)
def test_any_archive_layout_lands_in_the_expected_folder(
    server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, members: dict[str, str]
) -> None:
    body = make_zip(members)
    point_registry(monkeypatch, name, server.serve("/archive.zip", body), body)

    folder = dl.download_dataset(name, tmp_path, progress=False)

    assert folder == tmp_path / dl.REGISTRY[name].folder
    assert not dl.missing_files(name, tmp_path)
    assert_untouched(tmp_path, folder.name)


def test_wrong_checksum_is_refused(server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    url = server.serve("/ml-100k.zip", ML100K_ZIP)
    point_registry(monkeypatch, "ml-100k", url, b"other bytes")
    expected = hashlib.sha256(b"other bytes").hexdigest()

    with pytest.raises(dl.DownloadError, match="checksum mismatch") as error:
        dl.download_dataset("ml-100k", tmp_path, progress=False)

    assert expected in str(error.value) and hashlib.sha256(ML100K_ZIP).hexdigest() in str(error.value)
    assert_untouched(tmp_path)


@pytest.mark.parametrize("verify", [True, False])
def test_interrupted_download_is_refused(
    server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, verify: bool
) -> None:
    url = server.serve("/ml-100k.zip", ML100K_ZIP, sent=len(ML100K_ZIP) // 2)
    point_registry(monkeypatch, "ml-100k", url, ML100K_ZIP if verify else None)

    with pytest.raises(dl.DownloadError, match=f"interrupted: got {len(ML100K_ZIP) // 2} of {len(ML100K_ZIP)} bytes"):
        dl.download_dataset("ml-100k", tmp_path, verify=verify, progress=False)

    assert_untouched(tmp_path)


@pytest.mark.parametrize("status", [404, 500])
def test_server_error_is_reported(server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, status: int) -> None:
    point_registry(monkeypatch, "ml-100k", server.serve("/ml-100k.zip", b"oops", status=status), ML100K_ZIP)

    with pytest.raises(dl.DownloadError, match=f"HTTP {status} "):
        dl.download_dataset("ml-100k", tmp_path, progress=False)

    assert_untouched(tmp_path)


def test_unreachable_server_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    srv = Server()  # bound but never serving, then closed: nothing listens on its port
    srv.httpd.server_close()
    point_registry(monkeypatch, "ml-100k", srv.base + "/ml-100k.zip", ML100K_ZIP)

    with pytest.raises(dl.DownloadError, match="failed after 0 bytes"):
        dl.download_dataset("ml-100k", tmp_path, progress=False)

    assert_untouched(tmp_path)


def test_unrecorded_checksum_needs_no_verify(server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    point_registry(monkeypatch, "ml-100k", server.serve("/ml-100k.zip", ML100K_ZIP), None)

    with pytest.raises(dl.DownloadError, match="--no-verify"):
        dl.download_dataset("ml-100k", tmp_path, progress=False)
    assert server.requests == 0  # refused before fetching anything

    dl.download_dataset("ml-100k", tmp_path, verify=False, progress=False)
    assert not dl.missing_files("ml-100k", tmp_path)


@pytest.mark.parametrize(
    "body",
    [b"this is not a zip archive", make_zip({"ml-100k/u.item": U_ITEM}), make_zip({"ml-100k/u.data": U_DATA})],
    ids=["not-a-zip", "no-u.data", "no-u.item"],
)
def test_unusable_archive_is_refused(
    server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, body: bytes
) -> None:
    point_registry(monkeypatch, "ml-100k", server.serve("/ml-100k.zip", body), None)

    with pytest.raises(dl.DownloadError, match="nothing was installed"):
        dl.download_dataset("ml-100k", tmp_path, verify=False, progress=False)

    assert_untouched(tmp_path)


def test_incomplete_folder_is_left_alone(server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    point_registry(monkeypatch, "ml-100k", server.serve("/ml-100k.zip", ML100K_ZIP), ML100K_ZIP)
    (tmp_path / "ml-100k").mkdir()
    (tmp_path / "ml-100k" / "u.data").write_text(U_DATA)

    with pytest.raises(dl.DownloadError, match="lacks u.item"):
        dl.download_dataset("ml-100k", tmp_path, progress=False)

    assert [p.name for p in (tmp_path / "ml-100k").iterdir()] == ["u.data"]
    assert server.requests == 0


def test_ensure_dataset(server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    point_registry(monkeypatch, "ml-100k", server.serve("/ml-100k.zip", ML100K_ZIP), ML100K_ZIP)

    with pytest.raises(DatasetNotFoundError, match=re.escape(f"-m fedrec.data download ml-100k --data-dir {tmp_path}")):
        dl.ensure_dataset("ml-100k", tmp_path, download=False)
    assert server.requests == 0

    assert dl.ensure_dataset("ml-100k", tmp_path, download=True) == tmp_path / "ml-100k"
    assert dl.ensure_dataset("ml-100k", tmp_path, download=False) == tmp_path / "ml-100k"
    assert server.requests == 1


def test_unknown_name_lists_the_known_ones(tmp_path: Path) -> None:
    known = r"dataset must be one of \['ml-100k', 'ml-1m', 'lastfm', 'filmtrust', 'diabetes', "
    with pytest.raises(ConfigError, match=known):
        dl.download_dataset("ml-10m", tmp_path)


def test_cli_list_and_unknown_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "filmtrust").mkdir()
    (tmp_path / "filmtrust" / "ratings.txt").write_text("1 1 4\n")

    assert main(["list", "--data-dir", str(tmp_path)]) == 0
    rows = {line.split()[0]: line.split()[2:] for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["filmtrust"] == ["present", "none"]
    assert rows["ml-100k"] == ["missing", "recorded"]
    assert set(rows) == set(dl.REGISTRY)

    assert main(["download", "nope", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: dataset must be one of {list(dl.REGISTRY)}, got 'nope'\n"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m fedrec.data ARGS`` in a subprocess, without proxies, so it reaches the local server."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run(
        [sys.executable, "-m", "fedrec.data", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_cli_download(server: Server, tmp_path: Path) -> None:
    url = server.serve("/ml-100k.zip", ML100K_ZIP)
    bad = server.serve("/missing.zip", b"gone", status=404)

    # the real registry entry: the test archive cannot match GroupLens' checksum
    refused = run_cli("download", "ml-100k", "--data-dir", str(tmp_path), "--url", url)
    assert refused.returncode == 2, refused.stderr
    error = refused.stderr.strip().splitlines()[-1]
    assert error.startswith("error: checksum mismatch")
    assert dl.REGISTRY["ml-100k"].sha256 in error and hashlib.sha256(ML100K_ZIP).hexdigest() in error
    assert_untouched(tmp_path)

    failed = run_cli("download", "ml-100k", "--data-dir", str(tmp_path), "--url", bad)
    assert failed.returncode == 2
    assert failed.stderr.strip().splitlines()[-1].startswith(f"error: {bad}: HTTP 404 ")
    assert_untouched(tmp_path)

    done = run_cli("download", "ml-100k", "--data-dir", str(tmp_path), "--url", url, "--no-verify")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"ml-100k installed in {tmp_path / 'ml-100k'}"
    assert (tmp_path / "ml-100k" / "u.data").read_text() == U_DATA
    assert_untouched(tmp_path, "ml-100k")


# ------------------------------------------------------------------------------------------------ a run's dataset
def run_args(data_dir: Path, out: Path, *extra: str) -> list[str]:
    """``train.py`` arguments of a two-round FedGNN run on the ML-100K in ``data_dir``."""
    return ["+experiment=fedgnn_ml100k", "task.rounds=2", f"data_dir={data_dir}", f"hydra.run.dir={out}",
            "logger.tensorboard=false", "plots=false", *extra]


def test_run_downloads_its_missing_dataset_with_download_data(
    server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, train_py: Callable[..., Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = server.serve("/ml-100k.zip", ML100K_ZIP)
    point_registry(monkeypatch, "ml-100k", url, ML100K_ZIP)
    data_dir = tmp_path / "data"

    train_py(*run_args(data_dir, tmp_path / "run", "download_data=true"))

    err = capsys.readouterr().err
    assert f"Downloading ml-100k from {url} into {data_dir / 'ml-100k'}" in err
    assert "ml-100k: 100%" in err  # the progress bar
    assert (data_dir / "ml-100k" / "u.data").read_text() == U_DATA
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dataset"] == "ml-100k" and summary["rounds_run"] == 2
    assert server.requests == 1

    train_py(*run_args(data_dir, tmp_path / "again", "download_data=true"))  # installed: no second download
    assert server.requests == 1 and "Downloading" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "status", "recorded", "needle"),
    [
        ((), 200, ML100K_ZIP, "-m fedrec.data download ml-100k --data-dir {data_dir}"),
        (("download_data=true",), 404, ML100K_ZIP, "HTTP 404"),
        (("download_data=true",), 200, b"another archive", "checksum mismatch"),
    ],
    ids=["flag_off", "http_error", "bad_checksum"],
)
def test_run_without_its_dataset_is_one_error_line(
    server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, train_py: Callable[..., Any],
    capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], status: int, recorded: bytes, needle: str,
) -> None:
    point_registry(monkeypatch, "ml-100k", server.serve("/ml-100k.zip", ML100K_ZIP, status=status), recorded)
    data_dir = tmp_path / "data"

    with pytest.raises(SystemExit) as info:
        train_py(*run_args(data_dir, tmp_path / "run", *extra))

    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]  # after a download's progress bar
    assert len(lines) == 1 and lines[0].startswith("error: data: ") and needle.format(data_dir=data_dir) in lines[0]
    if not extra:
        assert "download_data=true" in lines[0] and server.requests == 0
    assert not (data_dir / "ml-100k").exists()
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.parametrize(
    ("experiment", "dataset"),
    [
        ("fedgnn_filmtrust", ("data", "filmtrust")),
        ("bgtplanner_ml1m", ("data", "ml-1m")),
        ("async_linucb_lastfm", ("env", "lastfm")),
        ("async_linucb_movielens", ("env", "ml-100k")),
        ("vfl_movielens", ("env", "ml-100k")),
        ("gossip_diabetes", ("env", "diabetes")),
        ("quickstart", None),
        ("vfl_criteo", None),
    ],
)
def test_a_run_knows_the_dataset_it_reads(tmp_path: Path, experiment: str, dataset: tuple[str, str] | None,
                                          compose_cfg: Callable[..., DictConfig]) -> None:
    cfg = compose_cfg(f"+experiment={experiment}", f"data_dir={tmp_path}")
    assert run_dataset(cfg) == (None if dataset is None else RunDataset(*dataset, tmp_path))
