"""Reference pages generated from the code: ``python -m docs_gen`` writes them into docs/reference/."""
