"""The bundled search server (BM25 over examples/search_qa/corpus.jsonl) through its manifest."""
import json
import random
import re

import pytest
from mcp import Client

from envs import ToolEnv, ToolEnvError, ToolLimits
from envs.servers.search import CorpusError, SearchIndex, build_server, load_corpus, snippet
from rl_factory.types import ToolCall

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def manifest(repo_root):
    return repo_root / "configs" / "tools" / "search.yaml"


@pytest.fixture(scope="module")
def corpus(repo_root):
    return load_corpus(repo_root / "examples" / "search_qa" / "corpus.jsonl")


@pytest.fixture(scope="module")
async def env(manifest):
    async with ToolEnv.from_manifest(manifest, limits=ToolLimits(max_calls_per_turn=64)) as tool_env:
        await tool_env.list_tools()  # start now, not inside the first test
        yield tool_env


def hit_ids(text: str) -> list[str]:
    return re.findall(r"^\d+\. \[([^\]]+)\]", text, flags=re.M)


async def search(env, **arguments):
    (result,) = await env.call_batch([ToolCall("search", arguments)])
    return result


def test_shipped_corpus(repo_root, corpus):
    path = repo_root / "examples" / "search_qa" / "corpus.jsonl"
    assert 200 <= len(corpus) <= 400 and path.stat().st_size < 300_000
    assert len({p.title for p in corpus}) == len(corpus)


async def test_schema(env):
    (schema,) = env.tools
    params = schema["function"]["parameters"]
    assert params["required"] == ["query"]
    assert params["properties"]["top_k"] == {
        "default": 3, "description": "how many passages to return", "maximum": 10, "minimum": 1,
        "title": "Top K", "type": "integer"}


async def test_ranking_questions(env):
    # Named entities in a question put their passage first.
    result = await search(env, query="Who published the Caetin Atlas?")
    assert result.ok and hit_ids(result.text)[0] == "work-045"
    assert result.text.startswith('1. [work-045] The Caetin Atlas: The "Caetin Atlas" was published by '
                                  "Drinaern Drumet in 1599.")
    result = await search(env, query="capital of Saeneixa", top_k=5)
    assert hit_ids(result.text)[0] == "country-011" and "city-035" in hit_ids(result.text)
    # Second hop of "where was the publisher of the Caetin Atlas born?".
    result = await search(env, query="Drinaern Drumet born")
    assert hit_ids(result.text)[0].startswith("person-") and "Drinaern Drumet (" in result.text


async def test_each_passage_finds_itself(env, corpus):
    sample = random.Random(0).sample(corpus, 20)
    results = await env.call_batch([ToolCall("search", {"query": p.text, "top_k": 1}) for p in sample])
    assert [hit_ids(r.text) for r in results] == [[p.id] for p in sample]


async def test_plural_folding(env):
    singular, plural = await env.call_batch([ToolCall("search", {"query": "river"}),
                                             ToolCall("search", {"query": "rivers"})])
    assert hit_ids(singular.text) == hit_ids(plural.text) != []


async def test_top_k(env):
    for k in (1, 3, 10):
        result = await search(env, query="treaty signed", top_k=k)
        assert result.ok and len(hit_ids(result.text)) == k
        assert [line.split(".")[0] for line in result.text.splitlines()] == [str(i) for i in range(1, k + 1)]
    assert len(hit_ids((await search(env, query="treaty signed")).text)) == 3  # the default
    for bad in (0, 11, "3"):
        result = await search(env, query="treaty", top_k=bad)
        assert result.error_kind == "bad_arguments"


async def test_empty_and_unmatched_queries(env):
    for query in ("", "   "):
        result = await search(env, query=query)
        assert result.error_kind == "server_error" and "empty query" in result.text
    result = await search(env, query="zzyzx the of")  # unknown word + stopwords: no passage matches
    assert result.ok and result.text == "No results for 'zzyzx the of'. Try other keywords."


async def test_structured_content(corpus):
    async with Client(build_server(SearchIndex(corpus), max_top_k=5, snippet_chars=40)) as client:
        tool = (await client.list_tools()).tools[0]
        assert tool.input_schema["properties"]["top_k"]["maximum"] == 5
        assert set(tool.output_schema["properties"]) == {"query", "results"}
        result = await client.call_tool("search", {"query": "Caetin Atlas", "top_k": 2})
    data = result.structured_content
    assert data["query"] == "Caetin Atlas" and [h["rank"] for h in data["results"]] == [1, 2]
    first = data["results"][0]
    assert first["id"] == "work-045" and first["score"] > data["results"][1]["score"] > 0
    assert first["snippet"] == 'The "Caetin Atlas" was published by ...'
    assert result.content[0].text.splitlines()[0] == f"1. [work-045] The Caetin Atlas: {first['snippet']}"


def test_snippet():
    assert snippet("short  text\n", 40) == "short text"
    assert snippet("one two three four", 12) == "one two ..."


@pytest.mark.parametrize("lines, message", [
    (['{"id": "a", "title": "A", "text": "x"}', "{oops"], ":2: not valid JSON"),
    (['{"id": "a", "title": "A"}'], ":1: needs string fields id, title, text; bad or missing: text"),
    (['{"id": "a", "title": "A", "text": "x"}', '{"id": "a", "title": "B", "text": "y"}'],
     ":2: duplicate id 'a'"),
    ([""], "the corpus has no passages"),
])
def test_bad_corpus(tmp_path, lines, message):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(lines))
    with pytest.raises(CorpusError, match=re.escape(message)):
        load_corpus(path)


async def test_missing_corpus_fails_start(tmp_path, write_manifest):
    path = write_manifest(tmp_path, {"search": {
        "command": "python", "args": ["-m", "envs.servers.search", "--corpus", str(tmp_path / "nope.jsonl")]}})
    async with ToolEnv.from_manifest(path) as env:
        with pytest.raises(ToolEnvError, match="search corpus not found"):
            await env.list_tools()


async def test_corpus_from_environment(tmp_path, write_manifest):
    corpus = tmp_path / "mini.jsonl"
    corpus.write_text(json.dumps({"id": "d1", "title": "Otters", "text": "Otters hold hands."}) + "\n")
    path = write_manifest(tmp_path, {"search": {"command": "python", "args": ["-m", "envs.servers.search"],
                                                "env": {"RL_FACTORY_SEARCH_CORPUS": str(corpus)}}})
    async with ToolEnv.from_manifest(path) as env:
        result = await search(env, query="otter", top_k=10)  # top_k above the corpus size is fine
    assert result.text == "1. [d1] Otters: Otters hold hands."
