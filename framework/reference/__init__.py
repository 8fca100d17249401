"""Pages of the manual generated from the code (`make reference`, `python -m framework.reference`).

Where the code holds a fact, the manual is written from it: every config key with the default a
run uses (docs/reference/config.md, from conf/ and the targets' signatures), the support matrix
(docs/reference/support-matrix.md, from the compatibility table, the tests that train each cell
and the GPU check's results), and the list of keys the docs' prose may name
(docs/_hooks/known_keys.json, read by the site's build to refuse a key that does not exist).
The pages are committed; tests/docs/test_reference.py fails when one is stale.
"""
