"""Fetch the real datasets from their official addresses into the data directory, verified and atomically.

A download streams the archive into a hidden temporary folder inside the data directory while hashing it,
refuses it if the server sent fewer bytes than it announced or if its SHA-256 differs from the one recorded in
:data:`REGISTRY`, extracts it in that same temporary folder, and only then renames the dataset folder into
place. Whatever goes wrong (HTTP error, cut connection, checksum mismatch, corrupt zip, Ctrl-C), the temporary
folder is removed and the data directory is left as it was.

The archive's layout does not matter: the dataset folder is the folder of the archive that holds the
registry entry's first file (``ml-100k.zip`` has ``ml-100k/u.data``, ``hetrec2011-lastfm-2k.zip`` has its files
at the top, UCI's zip may or may not have a ``dataset_diabetes/`` folder), renamed to the entry's ``folder``.

Plain ``urllib`` does the HTTP, not ``torch_geometric.data.download_url``: that helper shows no progress,
silently keeps a body shorter than its Content-Length, turns TLS certificate checks off and reuses any file
already at its target path. Extraction uses :mod:`zipfile` (what ``torch_geometric.data.extract_zip`` wraps).
"""
from __future__ import annotations

import hashlib
import http.client
import os
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from fedrec.data.integrity import checked_file, write_sums
from fedrec.errors import DatasetNotFoundError, check_choice
from fedrec.utils.commands import python_command


@dataclass(frozen=True)
class Source:
    """Where one dataset's archive is published and what it installs under the data directory."""

    url: str | None  # the archive; None = published as bare files only, installed by hand from ``page``
    sha256: str | None  # of the archive as published (of the one file where url is None); None = not recorded
    folder: str  # folder under the data directory that the loaders read
    files: tuple[str, ...]  # files the loaders read inside ``folder``; the first one locates it in the archive
    page: str  # the publisher's page, to download the archive (or the bare files) by hand
    lines: Mapping[str, int] = field(default_factory=dict)  # published line counts of files, checked when unlisted


#: One entry per downloadable dataset. ml-100k, ml-1m and lastfm checksums: archive SHA-256s published in
#: several unrelated public projects that verify these archives (ml-100k's together with the SHA-256 of its
#: u.data, which matches the u.data we verified). FilmTrust's and UCI Diabetes' are not recorded yet. The Monti
#: et al. matrices (douban, flixster, yahoo_music) are published as one bare ``.mat`` file each in the authors'
#: repository (fmonti/mgcnn, ``Data/<name>/``; flixster's and yahoo_music's named ``training_test_dataset_10_NNs.mat``
#: there) and, under the name the loaders read, in IGMC's (muhanzhang/IGMC, ``raw_data/<name>/``), with no archive to
#: download: they are installed by hand, and the SHA-256 recorded is that file's (the same bytes in both repositories).
REGISTRY: dict[str, Source] = {
    "ml-100k": Source(
        url="https://files.grouplens.org/datasets/movielens/ml-100k.zip",
        sha256="50d2a982c66986937beb9ffb3aa76efe955bf3d5c6b761f4e3a7cd717c6a3229",
        folder="ml-100k",
        files=("u.data", "u.item", "u.user"),
        page="https://grouplens.org/datasets/movielens/100k/",
        # its README's 100,000 ratings, 1682 items, 943 users; its canonical test sets (u1-u5: 20,000 ratings each,
        # ua/ub: 10 per user)
        lines={"u.data": 100_000, "u.item": 1682, "u.user": 943, **{f"u{k}.test": 20_000 for k in range(1, 6)},
               "ua.test": 9430, "ub.test": 9430},
    ),
    "ml-1m": Source(
        url="https://files.grouplens.org/datasets/movielens/ml-1m.zip",
        sha256="a6898adb50b9ca05aa231689da44c217cb524e7ebd39d264c56e2832f2c54e20",
        folder="ml-1m",
        files=("ratings.dat",),
        page="https://grouplens.org/datasets/movielens/1m/",
        lines={"ratings.dat": 1_000_209},  # its README's 1,000,209 ratings
    ),
    "lastfm": Source(
        url="https://files.grouplens.org/datasets/hetrec2011/hetrec2011-lastfm-2k.zip",
        sha256="6738f48195667ff03caaab4d32ca9a3133d8cc026b7c3cdaf6ce1010e913c59c",
        folder="hetrec2011-lastfm-2k",
        files=("user_artists.dat", "user_taggedartists.dat"),
        page="https://grouplens.org/datasets/hetrec-2011/",
        lines={"user_artists.dat": 92_835, "user_taggedartists.dat": 186_480},  # its readme's counts and a header
    ),
    "filmtrust": Source(
        url="https://guoguibing.github.io/librec/datasets/filmtrust.zip",
        sha256=None,
        folder="filmtrust",
        files=("ratings.txt",),
        page="https://guoguibing.github.io/librec/datasets.html",
        lines={"ratings.txt": 35_497},  # the file as its author's repository holds it (no count is published)
    ),
    "diabetes": Source(
        url="https://archive.ics.uci.edu/static/public/296/diabetes+130-us+hospitals+for+years+1999-2008.zip",
        sha256=None,
        folder="uci-diabetes-130",
        files=("diabetic_data.csv",),
        page="https://archive.ics.uci.edu/dataset/296/diabetes+130-us+hospitals+for+years+1999-2008",
        lines={"diabetic_data.csv": 101_767},  # its page's 101,766 encounters and the header
    ),
    "douban": Source(
        url=None,
        sha256="1f4476321cbfe0f606e7e35d0695ca15447a1b0b2c811df130109b6cb9a067ae",
        folder="douban",
        files=("training_test_dataset.mat",),
        page="https://github.com/muhanzhang/IGMC/tree/master/raw_data/douban",
    ),
    "flixster": Source(
        url=None,
        sha256="8b07e0387edfe7ffdccead2826bb3844ddbd9e6a8ccba264ce81a3b59b273197",
        folder="flixster",
        files=("training_test_dataset.mat",),
        page="https://github.com/muhanzhang/IGMC/tree/master/raw_data/flixster",
    ),
    "yahoo_music": Source(
        url=None,
        sha256="56a80de836537544d0d6ba36fc59937dfe87f738ac5e2a701cc8226faf4f31ec",
        folder="yahoo_music",
        files=("training_test_dataset.mat",),
        page="https://github.com/muhanzhang/IGMC/tree/master/raw_data/yahoo_music",
    ),
}

_CHUNK = 1 << 20
_TIMEOUT = 60.0  # seconds without data before a download is abandoned


class DownloadError(RuntimeError):
    """A download failed or was refused; the one-line message says why, and nothing was installed."""


def default_data_dir() -> Path:
    """The data directory the runs use: ``$FEDREC_DATA_DIR``, else ``data`` (as conf/config.yaml)."""
    return Path(os.environ.get("FEDREC_DATA_DIR") or "data")


def source(name: str) -> Source:
    """The registry entry of dataset ``name``, or a ConfigError listing the known names."""
    return REGISTRY[check_choice("dataset", name, REGISTRY)]


def missing_files(name: str, data_dir: str | Path) -> list[Path]:
    """The files of dataset ``name`` that the loaders need and ``data_dir`` lacks (empty when installed)."""
    entry = source(name)
    folder = Path(data_dir) / entry.folder
    return [folder / file for file in entry.files if not (folder / file).is_file()]


def download_command(name: str, data_dir: str | Path) -> str:
    """The shell command that installs dataset ``name`` into ``data_dir``."""
    return python_command("-m", "fedrec.data", "download", name, "--data-dir", str(data_dir))


def install_help(name: str, data_dir: str | Path) -> str:
    """How to install dataset ``name`` into ``data_dir``: the download command, or by hand from its page."""
    entry = source(name)
    if entry.url is None:
        return by_hand(name, data_dir)
    unverified = "" if entry.sha256 else " --no-verify"
    return (
        f"Install {name} with `{download_command(name, data_dir)}{unverified}`, or download it from {entry.page} "
        f"and unzip it so that {Path(data_dir) / entry.folder}/ holds {', '.join(entry.files)}."
    )


def by_hand(name: str, data_dir: str | Path) -> str:
    """How to install dataset ``name``, published without an archive (``url`` None), into ``data_dir`` by hand."""
    entry = source(name)
    digest = f" (SHA-256 {entry.sha256})" if entry.sha256 else ""
    return (
        f"{name} has no archive to download: save {', '.join(entry.files)} from {entry.page} into "
        f"{Path(data_dir) / entry.folder}/{digest}."
    )


def dataset_file(name: str, data_dir: str | Path, file: str) -> Path:
    """The path of ``file`` of dataset ``name`` under ``data_dir``: the one place the loaders locate a dataset's
    files, so a missing one is always the same DatasetNotFoundError (the file, how to install the dataset, and
    ``FEDREC_DATA_DIR``)."""
    src = source(name)
    return checked_file(Path(data_dir) / src.folder / file, install_help(name, data_dir), src.lines.get(file))


def ensure_dataset(name: str, data_dir: str | Path, download: bool) -> Path:
    """The folder of dataset ``name`` under ``data_dir``, downloaded first if missing and ``download`` is true.

    Raises DatasetNotFoundError naming the download command when the dataset is missing and ``download`` is
    false, and DownloadError when the download fails or the archive's checksum is not recorded.
    """
    missing = missing_files(name, data_dir)
    if not missing:
        return Path(data_dir) / source(name).folder
    if source(name).url is None:
        raise DatasetNotFoundError(
            f"dataset {name} is not installed: {missing[0]} is missing. {by_hand(name, data_dir)} Or point data_dir "
            "(FEDREC_DATA_DIR) at the folder that holds it."
        )
    if not download:
        raise DatasetNotFoundError(
            f"dataset {name} is not installed: {missing[0]} is missing. Install it with "
            f"`{download_command(name, data_dir)}`, run with download_data=true to fetch it when a run needs it, "
            "or point data_dir (FEDREC_DATA_DIR) at the folder that holds it."
        )
    return download_dataset(name, data_dir)


def download_dataset(
    name: str, data_dir: str | Path, verify: bool = True, url: str | None = None, progress: bool = True
) -> Path:
    """Install dataset ``name`` into ``data_dir`` from ``url`` (default: the registry's) and return its folder.

    Does nothing if it is already installed. With ``verify`` the archive's SHA-256 must equal the recorded one
    (an entry without one is refused before any download); without it the archive is installed unchecked. A
    dataset published without an archive (``url`` None) is refused with how to install it by hand.
    """
    entry = source(name)
    data_dir = Path(data_dir)
    target = data_dir / entry.folder
    missing = missing_files(name, data_dir)
    if not missing:
        return target
    if entry.url is None:
        raise DownloadError(by_hand(name, data_dir))
    if target.exists():
        raise DownloadError(f"{target} exists but lacks {missing[0].name}; move it away and download again")
    if verify and entry.sha256 is None:
        raise DownloadError(
            f"no SHA-256 is recorded for the {name} archive, so it cannot be verified; install it unverified "
            f"with `{download_command(name, data_dir)} --no-verify`"
        )
    url = url or entry.url
    data_dir.mkdir(parents=True, exist_ok=True)
    if progress:
        print(f"Downloading {name} from {url} into {target}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix=f".{entry.folder}.download-", dir=data_dir) as tmp:
        archive = Path(tmp) / "archive.zip"
        digest = _fetch(url, archive, name, progress)
        if verify and digest != entry.sha256:
            raise DownloadError(
                f"checksum mismatch for {url}: expected SHA-256 {entry.sha256}, got {digest}; nothing was installed"
            )
        extracted = Path(tmp) / "extracted"
        _extract(archive, extracted)
        root = _dataset_root(extracted, entry, url)
        write_sums(root)  # later loads check the files against it
        os.rename(root, target)
    return target


def _fetch(url: str, dest: Path, name: str, progress: bool) -> str:
    """Stream ``url`` into ``dest`` with a progress bar; return the SHA-256 of the bytes received."""
    digest = hashlib.sha256()
    received = 0
    total: int | None = None  # the announced Content-Length
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT) as response, dest.open("wb") as out:
            length = response.headers.get("Content-Length")
            total = int(length) if length else None
            bar = tqdm(total=total, desc=name, unit="B", unit_scale=True, unit_divisor=1024, disable=not progress)
            with bar:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
    except urllib.error.HTTPError as e:
        e.close()  # the error carries the open response
        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}; nothing was installed") from None
    except (OSError, http.client.HTTPException) as e:  # URLError, timeouts, resets, cut chunked bodies
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        raise DownloadError(
            f"download of {url} failed after {received} bytes: {reason}; nothing was installed"
        ) from None
    if total is not None and received != total:
        raise DownloadError(
            f"download of {url} was interrupted: got {received} of {total} bytes; nothing was installed"
        )
    return digest.hexdigest()


def _extract(archive: Path, folder: Path) -> None:
    """Unzip ``archive`` into ``folder``, raising DownloadError if it is not a sound zip (CRCs are checked)."""
    try:
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(folder)
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise DownloadError(f"the downloaded archive is not a valid zip file ({e}); nothing was installed") from None


def _dataset_root(extracted: Path, entry: Source, url: str) -> Path:
    """The one folder of the extracted archive that holds all of ``entry.files``."""
    roots = {p.parent for p in extracted.rglob(entry.files[0])}
    if len(roots) != 1:
        found = "no" if not roots else f"{len(roots)} copies of"
        raise DownloadError(f"the archive from {url} has {found} {entry.files[0]}; nothing was installed")
    root = roots.pop()
    absent = [file for file in entry.files if not (root / file).is_file()]
    if absent:
        raise DownloadError(
            f"the archive from {url} lacks {absent[0]} beside {entry.files[0]}; nothing was installed"
        )
    return root
