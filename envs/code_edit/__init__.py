"""``code_edit``: generated mini-repositories edited through JSON tool calls, tests in a sandbox.

Modules: ``tasks`` (repositories, task families, reference solutions), ``tools`` (tool-call
parsing and the working copy), ``sandbox`` (the contained test runner), ``rubric`` (criteria,
feedback, reward), ``env`` (``CodeEditEnv``, registered as ``code_edit``). The example episode is
in ``env``'s docstring and in ``docs/envs_code_edit.md``.
"""

from envs.code_edit.env import CodeEditEnv, CodeEditOptions

__all__ = ["CodeEditEnv", "CodeEditOptions"]
