#!/usr/bin/env bash
# Prepares the demo model's text (runs on the development machine, not the GPU one): the King
# James Bible from Debian's bible-kjv (public domain: its copyright file says the text's
# copyright expired), one verse a line without its number, a blank line between chapters.
# Every 40th chapter (the 20th, 60th, ... in canonical order) is held out for evaluation.
# Writes tools/demo_model/data/kjv-train.txt.gz and kjv-heldout.txt; deterministic (the
# SHA-256 of both texts is printed, and pinned in tools/demo_model/README.md).
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v bible >/dev/null 2>&1; then
  echo "prepare_text: installing bible-kjv"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends bible-kjv >/dev/null
fi


work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Genesis 1:1 to Revelation 22:21, each verse on one line (no wrapping below 100,000 columns).
bible -l100000 "gen1:1-rev22:21" >"$work/raw.txt"

# Chapter headings ("Genesis 1") start in column 1; verses are "  N text".
awk -v train="$work/train.txt" -v heldout="$work/heldout.txt" '
  /^[^ ]/ { chapter++; next }
  /^ +[0-9]+ / {
    sub(/^ +[0-9]+ /, "")
    sub(/ +$/, "")
    out = (chapter % 40 == 20) ? heldout : train
    if (out in last && last[out] != chapter) print "" > out
    last[out] = chapter
    print > out
    verses++
  }
  END {
    if (chapter != 1189 || verses != 31102) {
      printf "prepare_text: expected 1189 chapters and 31102 verses, read %d and %d\n", chapter, verses > "/dev/stderr"
      exit 1
    }
  }' "$work/raw.txt"

mkdir -p data
# gzip, not xz: every Python has zlib, not every build has lzma; -n keeps no name or time.
gzip -9 -n -c "$work/train.txt" >data/kjv-train.txt.gz
cp "$work/heldout.txt" data/kjv-heldout.txt
for f in train heldout; do
  printf "prepare_text: %-8s %9d bytes %6d lines sha256 %s\n" "$f" "$(wc -c <"$work/$f.txt")" \
    "$(wc -l <"$work/$f.txt")" "$(sha256sum "$work/$f.txt" | cut -d' ' -f1)"
done
ls -l data/
