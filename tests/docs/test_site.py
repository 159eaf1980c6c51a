"""The docs site builds with `mkdocs build --strict` (every link and anchor resolves), its generated pages say
what the code and data say, and it renders in a headless browser offline: no console error, search works."""
from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from docsgen import GENERATED_PAGES, benchmarks_page
from docsgen.config_reference import FILES, leaf_paths
from tests.browser import chromium
from tests.docs.markdown import REPO, links

pytestmark = pytest.mark.slow  # builds the site (mkdocs --strict) and drives chromium

pytest.importorskip("mkdocs", reason="the docs site needs .[docs] (bash setup.sh --dev)")

MKDOCS_ENV = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}  # a plugin's banner, not ours


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=REPO,
                          env={**os.environ, **MKDOCS_ENV}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "WARNING" not in done.stderr, done.stderr[-4000:]
    return out


def text_of(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text()


def test_the_search_index_is_built(site):
    index = json.loads((site / "search" / "search_index.json").read_text())
    locations = {d["location"].split("#")[0] for d in index["docs"]}
    assert {"", "quickstart/", "reference/config/", "benchmarks/", "reference/api/envs/"} <= locations


def test_the_config_reference_has_every_key_of_every_config_file(site):
    html = text_of(site, "reference/config")
    for name in FILES:
        keys = leaf_paths(yaml.safe_load((REPO / name).read_text()))
        missing = [k for k in keys if f"<code>{k}</code>" not in html]
        assert keys and missing == [], f"{name}: {missing}"
    # a comment reaches the page with its text (pipes and angle brackets escaped, not eaten by Markdown)
    assert "auto (cuda if available, else cpu) | cpu | cuda | cuda:N" in html
    assert "outputs/&lt;experiment_name&gt;" in html


def test_the_capability_page_is_generated_from_the_code(site):
    html = text_of(site, "reference/capabilities")
    try:
        from rl_factory.capabilities_page import render_markdown
    except ImportError:
        assert "rl_factory/capabilities.py" in html
        return
    first_row = next(line for line in render_markdown().splitlines() if line.startswith("|"))
    cells = [c.strip().strip("`") for c in first_row.strip("|").split("|") if c.strip()]
    assert all(c in html for c in cells[:3]), cells


def test_the_benchmarks_page_shows_the_newest_record_of_each_command(site):
    html = text_of(site, "benchmarks")
    records = benchmarks_page.load(REPO / "benchmarks" / "results")
    assert records, "no records in benchmarks/results/"
    for name, rows in records.items():
        assert f'id="{name}"' in html
        for r in benchmarks_page.current(rows):
            assert r["commit"][:12] in html and str(r["date"])[:10] in html


def test_the_api_pages_carry_the_docstrings(site):
    envs = text_of(site, "reference/api/envs")
    assert "call_batch" in envs and "ToolResult" in envs
    assert "compute_advantages" in text_of(site, "reference/api/advantages")
    assert "run_tournament" in text_of(site, "reference/api/arena")
    assert "load_reward" in text_of(site, "reference/api/rewards")
    assert "Trajectory" in text_of(site, "reference/api/types")


def test_the_readmes_links_resolve():
    """The site checks its own links (strict build); the README's relative links must name files that exist."""
    generated = {f"docs/{page}" for page in GENERATED_PAGES}
    readme = (REPO / "README.md").read_text()
    broken = [f"README.md:{n}: {t}" for n, t in links(readme) if not re.match(r"^(https?:|mailto:|#)", t)
              and not (REPO / t.split("#")[0]).exists() and t.split("#")[0] not in generated]
    assert broken == []


@pytest.fixture(scope="module")
def served(site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # a line per request would bury a failure's output
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:
        yield browser


@pytest.mark.parametrize("page_path", ["", "guides/tools/", "guides/rewards/", "reference/config/"])
def test_a_page_renders_offline_without_console_errors(served, browser, page_path):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    outside: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    # the site must not need the network: anything not from the local server is refused and listed
    page.route(re.compile(r"^(?!" + re.escape(served) + ").*"), lambda route: (outside.append(route.request.url),
                                                                                route.abort()))
    page.goto(served + page_path, wait_until="networkidle")
    assert page.locator("article h1").count() >= 1
    assert page.locator(".md-nav__link").count() > 10
    assert errors == [] and outside == [], (errors, outside)
    page.close()


def test_search_finds_a_config_key(served, browser):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page = browser.new_page(viewport={"width": 1400, "height": 1000})  # wide: the search box is in the header
    page.goto(served, wait_until="networkidle")
    page.locator("input.md-search__input").click()
    page.keyboard.type("micro_batch_tokens", delay=10)  # the search listens to key events
    page.wait_for_selector(".md-search-result__item", timeout=15000)
    # the results are re-rendered as the search catches up with the typing: read them in one snapshot, once the
    # list holds the hit or 15 s have passed (a handle taken before a re-render waits on an element that is gone)
    links = ".md-search-result__item a"
    hit = f"() => [...document.querySelectorAll('{links}')].some(a => a.href.includes('reference/config/'))"
    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function(hit, timeout=15000)
    hrefs = page.eval_on_selector_all(links, "els => els.map(a => a.getAttribute('href'))")
    assert any("reference/config/" in h for h in hrefs), hrefs
    page.close()


def test_generated_pages_are_not_written_by_hand():
    """docs/<page> on disk would be silently replaced at build time, and its edits lost."""
    assert [p for p in GENERATED_PAGES if (REPO / "docs" / p).exists()] == []


def test_the_readmes_links_into_the_docs_land_on_an_anchor_that_exists(site):
    """README links such as docs/guides/evaluation.md#run-report: the page's built HTML has that id."""
    missing = []
    for number, target in links((REPO / "README.md").read_text()):
        if not target.startswith("docs/") or "#" not in target:
            continue
        page, anchor = target.removeprefix("docs/").split("#", 1)
        built = site / page.removesuffix(".md").removesuffix("index") / "index.html"
        if f'id="{anchor}"' not in built.read_text():
            missing.append(f"README.md:{number}: {target}")
    assert missing == []
