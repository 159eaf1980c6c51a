"""Local search MCP server: BM25 over a JSONL corpus, for search-QA tasks without a web index.

The corpus is one JSON object per line with string fields `id`, `title` and `text` (more fields
are ignored); title and text are indexed together. Scoring is BM25 from `bm25s` (numpy only):
lower-cased word tokens, English stopwords removed, and a light plural folding ("rivers" ->
"river") instead of a full stemmer, which would need a C extension. The index lives in memory
and is built once at startup (0.3 s for the ~350-passage example corpus, a query well under
1 ms); corpora of a few hundred thousand short passages stay practical.

Tool `search(query, top_k=3)` returns a numbered list a model can read at a glance,

    1. [city-035] Humaim: Humaim is the capital of Saeneixa on the banks of ...

plus the same hits as structured content (`{"query", "results": [{rank, id, title, snippet,
score}]}`). Only passages that share a term with the query are listed, so a result may have
fewer than `top_k` lines; an empty query is a tool error the model sees.

Run: `python -m envs.servers.search --corpus examples/search_qa/corpus.jsonl` (stdio), or with
`--transport streamable-http --port 8000` (URL `/mcp`). The corpus may also come from
`$RL_FACTORY_SEARCH_CORPUS`; a relative path that does not exist from the working directory is
tried against the project root, so the shipped manifest works from anywhere.
"""

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field

from envs.servers.stdio import serve

CORPUS_ENV = "RL_FACTORY_SEARCH_CORPUS"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MAX_TOP_K = 10
DEFAULT_SNIPPET_CHARS = 240


class CorpusError(ValueError):
    """The corpus file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


class Hit(BaseModel):
    rank: int
    id: str
    title: str
    snippet: str
    score: float


class SearchResults(BaseModel):
    query: str
    results: list[Hit]


def load_corpus(path: str | os.PathLike) -> list[Passage]:
    """Read a JSONL corpus; raises CorpusError naming the line of the first bad record."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"search corpus not found: {path} (looked at {Path(path).resolve()})")
    passages, seen = [], set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise CorpusError(f"{path}:{number}: not valid JSON: {err}") from None
        missing = [k for k in ("id", "title", "text")
                   if not isinstance(record, dict) or not isinstance(record.get(k), str)]
        if missing:
            raise CorpusError(f"{path}:{number}: needs string fields id, title, text; bad or "
                              f"missing: {', '.join(missing)}")
        if record["id"] in seen:
            raise CorpusError(f"{path}:{number}: duplicate id {record['id']!r}")
        seen.add(record["id"])
        passages.append(Passage(record["id"], record["title"], record["text"]))
    if not passages:
        raise CorpusError(f"{path}: the corpus has no passages")
    return passages


def _fold_plural(word: str) -> str:
    # Enough to match "rivers"/"river" and "cities"/"city" without a real stemmer.
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _tokenize(texts: list[str]) -> Any:
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", show_progress=False,
                          stemmer=lambda words: [_fold_plural(w) for w in words])


class SearchIndex:
    """BM25 over the passages; `search` returns (passage, score) pairs, best first."""

    def __init__(self, passages: list[Passage]):
        import bm25s

        self.passages = passages
        self._bm25 = bm25s.BM25()
        self._bm25.index(_tokenize([f"{p.title}. {p.text}" for p in passages]), show_progress=False)

    def search(self, query: str, top_k: int) -> list[tuple[Passage, float]]:
        k = min(top_k, len(self.passages))  # bm25s refuses k larger than the corpus
        docs, scores = self._bm25.retrieve(_tokenize([query]), k=k, show_progress=False)
        # Zero means no query term occurs in the passage: listing it would only be noise.
        return [(self.passages[int(d)], float(s)) for d, s in zip(docs[0], scores[0]) if s > 0]


def snippet(text: str, max_chars: int) -> str:
    """The passage text, cut at a word boundary with an ellipsis when longer than max_chars."""
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    cut = text[:max_chars].rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:") + " ..."


def format_results(query: str, hits: list[Hit]) -> str:
    if not hits:
        return f"No results for {query!r}. Try other keywords."
    return "\n".join(f"{h.rank}. [{h.id}] {h.title}: {h.snippet}" for h in hits)


def build_server(index: SearchIndex, max_top_k: int = DEFAULT_MAX_TOP_K,
                 snippet_chars: int = DEFAULT_SNIPPET_CHARS):
    """The MCP server object; `max_top_k` becomes the schema's maximum for `top_k`."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import CallToolResult, TextContent

    server = MCPServer("search", log_level="WARNING",
                       instructions=f"Keyword (BM25) search over {len(index.passages)} passages.")
    TopK = Annotated[int, Field(ge=1, le=max_top_k, description="how many passages to return")]

    @server.tool()
    async def search(query: str, top_k: TopK = 3) -> Annotated[CallToolResult, SearchResults]:
        """Search the document collection by keywords; returns the best passages with their ids."""
        if not query.strip():
            raise ToolError("empty query: give a few keywords, e.g. 'capital of Saeneixa'")
        hits = [Hit(rank=i, id=p.id, title=p.title, snippet=snippet(p.text, snippet_chars),
                    score=round(score, 4))
                for i, (p, score) in enumerate(index.search(query, top_k), start=1)]
        results = SearchResults(query=query, results=hits)
        return CallToolResult(content=[TextContent(type="text", text=format_results(query, hits))],
                              structured_content=results.model_dump())

    return server


def resolve_corpus(path: str | None) -> Path:
    """The corpus path from the flag or the environment; relative paths fall back to the project root."""
    path = path or os.environ.get(CORPUS_ENV)
    if not path:
        raise CorpusError(f"no corpus: pass --corpus PATH or set {CORPUS_ENV}")
    candidate = Path(path)
    if not candidate.is_absolute() and not candidate.exists() and (PROJECT_ROOT / candidate).exists():
        return PROJECT_ROOT / candidate
    return candidate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="BM25 search MCP server over a JSONL corpus.")
    parser.add_argument("--corpus", default=None, help=f"JSONL with id, title, text (or ${CORPUS_ENV})")
    parser.add_argument("--max-top-k", type=int, default=DEFAULT_MAX_TOP_K)
    parser.add_argument("--snippet-chars", type=int, default=DEFAULT_SNIPPET_CHARS)
    parser.add_argument("--transport", choices=["stdio", "streamable-http", "sse"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    try:
        index = SearchIndex(load_corpus(resolve_corpus(args.corpus)))
    except CorpusError as err:
        parser.exit(2, f"search server: {err}\n")  # one line on stderr, quoted by the client
    server = build_server(index, args.max_top_k, args.snippet_chars)
    serve(server, args.transport, args.host, args.port)


if __name__ == "__main__":
    main()
