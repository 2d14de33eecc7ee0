"""Screenshots of the documentation site in headless Chromium, to look at tables, formulas and figures as a reader.

Builds the site (``mkdocs build --strict``) into a temporary folder, or takes one already built (``--site``), serves
it on 127.0.0.1 and writes one PNG per page into OUT. Needs Debian's Chromium (``apt-get install chromium``).
Example:

    .venv/bin/python -m scripts.docs_screenshots shots/ --pages running threat_model papers/vfl --height 3000
"""
from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the pages with the most tables, commands in tables, formulas and figures
PAGES = ("running", "benchmarks", "threat_model", "papers/vfl", "papers/robust_fedrec", "papers/gossip",
         "papers/async_linucb", "papers/recsys_kit")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars")


def build_site(out: Path) -> None:
    """``mkdocs build --strict`` into ``out``; raises with mkdocs' output when the build fails."""
    mkdocs = Path(sys.executable).parent / "mkdocs"
    proc = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(out)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}")


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


def screenshot(chromium: str, url: str, png: Path, width: int, height: int) -> None:
    """One page at ``width`` × ``height`` CSS pixels; the virtual-time budget lets MathJax typeset first."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                        "--virtual-time-budget=10000", f"--screenshot={png}", url],
                       check=True, capture_output=True, timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the PNGs (created)")
    parser.add_argument("--pages", nargs="+", default=list(PAGES), help="page paths without index.html")
    parser.add_argument("--site", type=Path, help="an already built site (default: build one)")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=2400)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("error: chromium is not installed (Debian: apt-get install -y chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site or Path(tmp) / "site"
        if args.site is None:
            build_site(site)
        server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            for page in args.pages:
                path = page.strip("/").removesuffix("index").strip("/")
                png = args.out / f"{path.replace('/', '_') or 'index'}.png"
                url = f"http://127.0.0.1:{server.server_port}/{path}{'/' if path else ''}"
                screenshot(chromium, url, png, args.width, args.height)
                print(png)
        finally:
            server.shutdown()


if __name__ == "__main__":
    main()
