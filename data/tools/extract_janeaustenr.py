#!/usr/bin/env python3
"""Extract Jane Austen's novels from Debian's r-cran-janeaustenr package as plain UTF-8 text.

The package stores each novel as an R character vector (one element per line) inside an R
lazy-load database (data/Rdata.rdx + data/Rdata.rdb). This script reads that database with a
minimal reader for R's XDR serialization format (only the types the package uses), so neither R
nor any third-party Python package is needed.

Usage (what produced data/austen/, see data/SOURCE.md):
    cd /tmp && apt-get download r-cran-janeaustenr
    dpkg-deb -x r-cran-janeaustenr_1.0.0-1_all.deb pkg
    python3 extract_janeaustenr.py pkg/usr/lib/R/site-library/janeaustenr/data OUT_DIR
"""
import gzip
import os
import struct
import sys
import zlib

# Which novels to write, and their file names. Mansfield Park is left out to keep the corpus
# near 3 MB (the project aims for 1-4 MB).
NOVELS = {
    "emma": "emma.txt",
    "northangerabbey": "northanger_abbey.txt",
    "persuasion": "persuasion.txt",
    "prideprejudice": "pride_and_prejudice.txt",
    "sensesensibility": "sense_and_sensibility.txt",
}


class RReader:
    """Reads R's serialization format (XDR, versions 2 and 3) for the SEXP types used here."""

    NILVALUE, REFSXP, SYMSXP, LISTSXP, CHARSXP = 254, 255, 1, 2, 9
    LGLSXP, INTSXP, REALSXP, STRSXP, VECSXP = 10, 13, 14, 16, 19

    def __init__(self, data):
        self.b, self.p, self.refs = data, 0, []

    def int32(self):
        (v,) = struct.unpack(">i", self.b[self.p:self.p + 4])
        self.p += 4
        return v

    def header(self):
        if self.b[:2] != b"X\n":
            raise ValueError("not an XDR R serialization stream")
        self.p = 2
        version = self.int32()
        self.int32()  # writer R version
        self.int32()  # minimal reader R version
        if version == 3:
            n = self.int32()  # native encoding name
            self.p += n

    def item(self):
        flags = self.int32()
        t = flags & 0xFF
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if t == self.NILVALUE:
            return None
        if t == self.REFSXP:
            return self.refs[(flags >> 8) - 1]
        if t == self.SYMSXP:
            sym = ("sym", self.item())
            self.refs.append(sym)
            return sym
        if t == self.LISTSXP:
            if has_attr:
                self.item()
            tag = self.item() if has_tag else None
            car, cdr = self.item(), self.item()
            return [(tag[1] if tag else None, car)] + (cdr if isinstance(cdr, list) else [])
        if t == self.CHARSXP:
            n = self.int32()
            if n == -1:
                return None
            raw = self.b[self.p:self.p + n]
            self.p += n
            latin1 = (flags >> 12) & (1 << 2)
            return raw.decode("latin-1" if latin1 else "utf-8")
        n = self.int32()
        if t in (self.STRSXP, self.VECSXP):
            values = [self.item() for _ in range(n)]
        elif t in (self.INTSXP, self.LGLSXP):
            values = [self.int32() for _ in range(n)]
        elif t == self.REALSXP:
            values = list(struct.unpack(">%dd" % n, self.b[self.p:self.p + 8 * n]))
            self.p += 8 * n
        else:
            raise ValueError("unsupported R type %d at byte %d" % (t, self.p))
        attrs = dict(self.item()) if has_attr else {}
        return {"type": t, "values": values, "attrs": attrs}


def names_of(obj):
    return obj["attrs"]["names"]["values"]


def load_lazy_db(data_dir):
    with open(os.path.join(data_dir, "Rdata.rdx"), "rb") as f:
        rdx = f.read()
    index_reader = RReader(gzip.decompress(rdx) if rdx[:2] == b"\x1f\x8b" else zlib.decompress(rdx[4:]))
    index_reader.header()
    index = index_reader.item()
    variables = index["values"][names_of(index).index("variables")]
    with open(os.path.join(data_dir, "Rdata.rdb"), "rb") as f:
        db = f.read()
    out = {}
    for name, entry in zip(names_of(variables), variables["values"]):
        offset, length = entry["values"]
        blob = db[offset:offset + length]
        # Each entry: 4-byte big-endian uncompressed length, then a zlib stream.
        reader = RReader(zlib.decompress(blob[4:]))
        reader.header()
        out[name] = reader.item()
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    data_dir, out_dir = sys.argv[1], sys.argv[2]
    novels = load_lazy_db(data_dir)
    os.makedirs(out_dir, exist_ok=True)
    for key, file_name in NOVELS.items():
        lines = [line if line is not None else "" for line in novels[key]["values"]]
        text = "\n".join(lines).strip("\n") + "\n"
        with open(os.path.join(out_dir, file_name), "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        print("%-28s %9d bytes" % (file_name, len(text.encode("utf-8"))))


if __name__ == "__main__":
    main()
