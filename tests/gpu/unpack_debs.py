#!/usr/bin/env python3
"""Unpacks Debian packages (.deb) into a prefix, like `dpkg -x`, for machines
without dpkg: a .deb is an ar archive whose data.tar.{xz,gz,bz2} member holds
the files. Nothing is installed or configured; scripts are ignored.

    unpack_debs.py PREFIX DEB...
"""
import io
import os
import sys
import tarfile


def members(path):
    """(name, bytes) of each member of the ar archive at `path`."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise ValueError(f"{path}: not an ar archive (.deb)")
        while True:
            header = f.read(60)
            if len(header) < 60:
                return
            name = header[:16].decode().strip().rstrip("/")
            size = int(header[48:58].decode().strip())
            data = f.read(size)
            if size % 2:
                f.read(1)
            yield name, data


def unpack(deb, prefix):
    for name, data in members(deb):
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
                tar.extractall(prefix, filter="tar" if hasattr(tarfile, "tar_filter") else None)
            return
    raise ValueError(f"{deb}: no data.tar member")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    prefix = sys.argv[1]
    os.makedirs(prefix, exist_ok=True)
    for deb in sys.argv[2:]:
        unpack(deb, prefix)


if __name__ == "__main__":
    main()
