#!/usr/bin/env bash
# Reproduce alice_in_wonderland.txt from the PyPI sdist of brotli 1.2.1,
# which ships the Canterbury-corpus file tests/testdata/alice29.txt
# (Lewis Carroll, "Alice's Adventures in Wonderland", Project Gutenberg
# "Millennium Fulcrum Edition 2.9" text, without any Gutenberg header/footer).
#
# Steps: download sdist -> verify sha256 -> extract the one file ->
# CRLF->LF, drop the trailing DOS EOF (^Z) -> strip leading/trailing blank
# lines -> keep Chapters I-IX (cut before the last CHAPTER heading that starts
# at or before 120000 bytes, i.e. before CHAPTER X) -> verify sha256.
#
# Usage: bash fetch.sh [OUTPUT]   (default: alice_in_wonderland.txt next to this script)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:-$HERE/alice_in_wonderland.txt}"
SDIST_SHA256=02b2f7b5a83485efe448a44ddf7983def05c3bb1dcf917d4f7154070260e13de
TEXT_SHA256=2e904e5a332a1a13559761dac393e29e7a8f3a2d0d50d9e8e672cc042ab56493

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

python3 -m pip download --no-deps --no-binary :all: brotli==1.2.1 -d "$TMP"
echo "$SDIST_SHA256  $TMP/brotli-1.2.1.tar.gz" | sha256sum -c -
tar -xzf "$TMP/brotli-1.2.1.tar.gz" -C "$TMP" brotli-1.2.1/tests/testdata/alice29.txt

python3 - "$TMP/brotli-1.2.1/tests/testdata/alice29.txt" "$OUT" <<'PY'
import re, sys
src, dst = sys.argv[1], sys.argv[2]
MAX_BYTES = 120000
raw = open(src, "rb").read().decode("ascii")
text = raw.replace("\r\n", "\n").replace("\r", "\n").replace("\x1a", "")
text = text.lstrip("\n").rstrip() + "\n"
# Cut at a chapter boundary (which is also a paragraph boundary).
starts = [m.start() for m in re.finditer(r"(?m)^ +CHAPTER [IVXL]+\s*$", text)]
cut = max(s for s in starts if s <= MAX_BYTES)
if len(text.encode()) > MAX_BYTES:
    text = text[:cut].rstrip() + "\n"
open(dst, "w", encoding="utf-8", newline="\n").write(text)
PY

echo "$TEXT_SHA256  $OUT" | sha256sum -c -
ls -l "$OUT"
