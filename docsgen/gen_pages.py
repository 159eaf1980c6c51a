"""Run by mkdocs-gen-files at every build (mkdocs.yml): writes the generated pages into the site's docs."""
from __future__ import annotations

import sys
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from docsgen import GENERATED_PAGES, benchmarks_page, capabilities_page, config_reference  # noqa: E402

PAGES = {
    "reference/config.md": lambda: config_reference.render(ROOT),
    "reference/capabilities.md": capabilities_page.render,
    "benchmarks.md": lambda: benchmarks_page.render(ROOT),
}
assert set(PAGES) == set(GENERATED_PAGES)

for page, render in PAGES.items():
    with mkdocs_gen_files.open(page, "w") as f:
        f.write(render())
