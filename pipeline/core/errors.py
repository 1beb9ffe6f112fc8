"""The errors a run's parts raise to each other, and what a one-line report says of an exception.

The actor errors live here, at the bottom of the layers, because both sides name them: the actor
handles (``actors/handles.py``) raise them and the controller's objects
(``pipeline/orchestration/``) catch them, and orchestration never imports ``actors/`` (only
``launch.py`` does).
"""

from __future__ import annotations


def first_line(err: BaseException) -> str:
    """The first line of the message, or the exception's type when it has none."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class ActorDied(RuntimeError):
    """The process of a restartable actor died while a call was in flight (``cluster.max_restarts``:
    Ray starts a new one). ``generation`` is the handle's at the call's start: ``revive`` restores
    the actor once per death, however many callers saw it."""

    def __init__(self, handle, generation: int, cause: BaseException):
        super().__init__(f"{handle.name} died ({type(cause).__name__}: {first_line(cause)})")
        self.handle, self.generation, self.cause = handle, generation, cause


class LearnerHung(RuntimeError):
    """A learner call (a training step, a publish, a checkpoint save) got no answer within
    ``learner.call_timeout_s``: the message names who did not answer."""


class LearnerLost(RuntimeError):
    """A learner rank's process died (alone, or with its node): its weights and optimizer state
    are gone, so the run stops; the controller adds where to resume from."""


class WeightsLost(RuntimeError):
    """Raised by a consumer asked to work with weights older than the last published ones: a
    process Ray restarted while it was idle (no call in flight saw the death) holds the initial
    weights. Treated as a death: revived, then the work is done again."""


class NonFiniteWeights(LearnerLost):
    """The learner's weights hold NaN or inf after an update whose loss and gradients were finite
    (e.g. an optimizer state damaged before it was loaded). Found at the weight sync and at the
    save, before either sends or writes them: such weights are never published, saved or marked
    latest, so the run stops like a lost learner, naming the last checkpoint to resume from."""
