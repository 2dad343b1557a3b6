"""``python -m gpugap.web.vendor``: fetch the page's charting library from the npm registry
into gpugap/web/static/vendor/ (the built, minified file and its licence), pinned by version
and by the registry's integrity hash, so the files in the package can be rebuilt and checked.
Needs ``npm`` (nothing of it is needed to run the page)."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "chart.js"
VERSION = "4.6.1"
INTEGRITY = (  # `npm view chart.js@4.6.1 dist.integrity`
    "sha512-hJyniucsFmq//EvXYvJ6c6mahPoI3kaxdjVH8awTaJ/"
    "fDNWeSqqqArixMJWkWNN6fcYvPU3HneSANFNYtRi61g=="
)
FILES = {"package/dist/chart.umd.min.js": "chart.umd.min.js", "package/LICENSE.md": "LICENSE.md"}
DEST = Path(__file__).parent / "static" / "vendor"


def fetch(dest: Path = DEST) -> list[Path]:
    """Download the pinned tarball with ``npm pack``, check its integrity, extract FILES."""
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("npm is needed to fetch the charting library (apt-get install npm)")
    with tempfile.TemporaryDirectory(prefix="gpugap-vendor-") as tmp:
        out = subprocess.run(
            [npm, "pack", f"{PACKAGE}@{VERSION}", "--json", "--pack-destination", tmp],
            check=True, capture_output=True, text=True, cwd=tmp,
        ).stdout  # fmt: skip
        info = json.loads(out)[0]
        tarball = Path(tmp) / info["filename"]
        digest = base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
        if f"sha512-{digest}" != INTEGRITY:
            raise SystemExit(f"{tarball.name}: integrity sha512-{digest} is not the pinned one")
        dest.mkdir(parents=True, exist_ok=True)
        written = []
        with tarfile.open(tarball) as tar:
            for member, name in FILES.items():
                src = tar.extractfile(member)
                if src is None:
                    raise SystemExit(f"{tarball.name} has no {member}")
                (dest / name).write_bytes(src.read())
                written.append(dest / name)
    return written


if __name__ == "__main__":
    for path in fetch(Path(sys.argv[1]) if len(sys.argv) > 1 else DEST):
        print(path)
