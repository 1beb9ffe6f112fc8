"""privy-rl's pipeline, one folder per role (imports only go down this list):

- ``core``: the records that flow rollout -> scorer -> learner, the typed config, hardware facts.
- ``algorithm``: pure numerics: losses, advantages, log-probs, retirement.
- ``context``: privileged context (skills, feedback, hints) and the teacher prompts built from it.
- ``methods``: parts and the presets composed from them (``method=`` in Hydra).
- ``distributed``: placement groups and weight sync.
- ``orchestration``: buffer, controller, batches, checkpoints, the run assembly.
- ``models``: model preparation without the hub.
- ``tools``: CLI, sweep summaries, plots, metric sinks, feedback selection.
"""
