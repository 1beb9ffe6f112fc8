"""The lab: what the scripts and the tests use to measure the product, never the product itself.

- ``results``: the stored result folders of docs/results (runs packed per folder, tables, checks);
- ``stats``: the intervals a learning number carries;
- ``faults``: faults injected into a live run (an actor's process found, throttled);
- ``bench``: what every benchmark in scripts/bench/ shares (the checkout, ``--out``, the commit);
- ``random_model``: random models of SmolLM2's shapes, and a one-rank learner on them;
- ``checkout``: where the checkout is and the commit it is at.

Installed with the project (``lab`` maps to ``scripts/lab`` in pyproject.toml); no module of
pipeline/, actors/ or envs/ imports it, so its extra (``lab``: scipy) stays out of ``make train``.
"""
