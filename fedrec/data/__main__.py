"""``python -m fedrec.data list|download NAME``: show and install the real datasets (see fedrec.data.download)."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from fedrec.data.download import REGISTRY, DownloadError, default_data_dir, download_dataset, missing_files
from fedrec.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    """The command line: a ``list`` and a ``download`` subcommand, both taking ``--data-dir``."""
    parser = argparse.ArgumentParser(prog="python -m fedrec.data", description="Show and install the datasets.")
    commands = parser.add_subparsers(dest="command", required=True)
    data_dir = argparse.ArgumentParser(add_help=False)
    data_dir.add_argument(
        "--data-dir", type=Path, default=default_data_dir(), help="data directory (default: $FEDREC_DATA_DIR or data)"
    )
    commands.add_parser("list", parents=[data_dir], help="each dataset's folder and whether it is installed")
    download = commands.add_parser("download", parents=[data_dir], help="fetch, verify and install one dataset")
    download.add_argument("name", help=f"one of: {', '.join(REGISTRY)}")
    download.add_argument(
        "--no-verify", action="store_true", help="skip the SHA-256 check (the only way where none is recorded; unsafe)"
    )
    download.add_argument("--url", help="fetch from this address (a mirror) instead of the official one")
    return parser


def _list(data_dir: Path) -> None:
    """Print one line per dataset: name, folder, installed or missing, checksum recorded or not."""
    names = max(len(name) for name in REGISTRY)
    width = max(len(str(data_dir / entry.folder)) for entry in REGISTRY.values())
    print(f"{'name':<{names}} {'folder':<{width}} {'status':<9} sha256")
    for name, entry in REGISTRY.items():
        status = "missing" if missing_files(name, data_dir) else "present"
        sha = "recorded" if entry.sha256 else "none"
        print(f"{name:<{names}} {str(data_dir / entry.folder):<{width}} {status:<9} {sha}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; failures print one ``error: ...`` line and return 2."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "list":
            _list(args.data_dir)
        else:
            already = not missing_files(args.name, args.data_dir)
            folder = download_dataset(args.name, args.data_dir, verify=not args.no_verify, url=args.url)
            print(f"{args.name} {'is already installed' if already else 'installed'} in {folder}")
    except (ConfigError, DownloadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; nothing was installed", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
