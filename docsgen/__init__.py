"""Pages of the docs site generated at build time from the code and data they describe (mkdocs-gen-files runs
docsgen/gen_pages.py), so that they cannot drift from it: the config reference, the backend capability table
and the benchmark results."""

# Pages that exist only in the built site (docs/<page> is never on disk): links to them are links to docs/.
GENERATED_PAGES = ("reference/config.md", "reference/capabilities.md", "benchmarks.md")
