"""privy-rl's pipeline, one folder per role. Imports only go down this list (``tests/unit/test_layout.py``
enforces it); ``envs`` (the tasks) sits beside it and imports only the records of ``core``:

- ``core``: the records that flow rollout -> scorer -> learner, the typed config, hardware facts.
- ``models``: model preparation without the hub.
- ``algorithm``: pure numerics: losses, advantages, log-probs, retirement.
- ``context``: privileged context (skills and their banks' retrieval, feedback, hints) and the
  teacher prompts built from it.
- ``distributed``: placement groups and weight sync.
- ``methods``: parts and the presets composed from them (``method=`` in Hydra); below ``core``,
  ``algorithm`` and ``context`` only.
- (``actors``, the Ray actors' plain classes, sit here: they import the folders above and ``envs``.)
- ``orchestration``: launch, buffer, controller, batches, checkpoints, the run.
- ``tools``: CLI, sweep summaries, plots, metric sinks, feedback selection.
"""
