"""Every Hugging Face hub call of the load and lock paths runs inside :func:`hub_errors`: a hub failure becomes one
message naming the encoder (registry name and hub id) and what to do, instead of the hub client's raw error.

* a gated repository (``GatedRepoError``): accept the model's licence on its page (``https://huggingface.co/<hub
  id>``) and give the process a token (``HF_TOKEN``, or ``hf auth login`` / ``huggingface-cli login``);
* a missing repository (``RepositoryNotFoundError``; the hub answers so for a private repo without a token too),
  revision or file: the entry's ``hub_id`` and its record in the lock file (``retinabench lock-encoders``);
* a file neither in the local cache nor reachable (``HF_HUB_OFFLINE=1``, no network): where the cache is and how
  to fill it.

The calls: :func:`retinabench.models._checkpoints.hub_files` (every pretrained hub load: timm, open_clip and
transformers entries, dual encoders, MLLMs), :func:`retinabench.models.lock.lock_entry` (``model_info`` and the
downloads it hashes), open_clip's hub tokenizers (:func:`retinabench.models._open_clip.load_open_clip_model`) and
the architectures' ``create_model`` of timm and open_clip (an ``hf-hub:`` architecture name reads its config from
the hub). Everything else loads from the verified local files (``from_pretrained(..., local_files_only=True)``,
timm and open_clip built with ``pretrained=False``), so no other call reaches the hub.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from retinabench.models.strict import WeightsError
from retinabench.registry.lockfile import lock_name

TOKEN_HINT = "set HF_TOKEN to a token of that account, or run `hf auth login` (`huggingface-cli login`) once"
LOCK_FILE = "the lock file beside its encoder registry (config/encoders.lock.yaml for config/encoders.yaml)"


def licence_page(hub_id: str | None) -> str:
    return f"https://huggingface.co/{hub_id}"


def _model(entry: dict) -> str:
    return f"encoder {entry['name']!r} (hub id {entry.get('hub_id')!r})"


def _first_line(err: BaseException) -> str:
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return f"{type(err).__name__}: {text[:300]}"


def hub_message(entry: dict, err: BaseException, revision: str | None = None) -> str | None:
    """The project's message for a hub error raised while fetching ``entry``'s files (None: not a hub error)."""
    from huggingface_hub.errors import (DisabledRepoError, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        OfflineModeIsEnabled, RemoteEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)
    hub_id = entry.get("hub_id")
    what, at = _model(entry), f"{hub_id}@{revision}" if revision else str(hub_id)
    relock = f"relock it with `retinabench lock-encoders {lock_name(entry)}` (its record: {LOCK_FILE})"
    raw = f" [hub: {_first_line(err)}]"
    if isinstance(err, GatedRepoError):  # before RepositoryNotFoundError, its base class
        return (f"{what} is a gated model: accept its licence at {licence_page(hub_id)} while logged in to Hugging "
                f"Face, then {TOKEN_HINT}" + raw)
    if isinstance(err, (RepositoryNotFoundError, DisabledRepoError)):
        return (f"{what}: the hub has no repository {hub_id!r} (or it is private or gated and no token was sent: "
                f"{TOKEN_HINT}); check the entry's hub_id in the encoder registry and its lock record in "
                f"{LOCK_FILE}" + raw)
    if isinstance(err, RevisionNotFoundError):
        return (f"{what}: {hub_id} has no revision {revision!r}, the one its lock record pins (the repository's "
                f"history was rewritten or the record is wrong): {relock}" + raw)
    if isinstance(err, RemoteEntryNotFoundError):
        return f"{what}: {at} lacks a file its lock record names: {relock}" + raw
    if isinstance(err, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
        return (f"{what}: the files of {at} are not in the local Hugging Face cache and the hub cannot be reached "
                f"(HF_HUB_OFFLINE=1 or no network): fetch them once where the hub is reachable (the cache: HF_HOME / "
                f"HF_HUB_CACHE); a gated model needs its licence accepted at {licence_page(hub_id)} and a token "
                f"first" + raw)
    if isinstance(err, HfHubHTTPError):
        return (f"{what}: the hub refused {at}; a gated or private model needs its licence accepted at "
                f"{licence_page(hub_id)} and a token ({TOKEN_HINT})" + raw)
    return None


@contextmanager
def hub_errors(entry: dict, revision: str | None = None,
               error: type[Exception] = WeightsError) -> Iterator[None]:
    """Run hub calls for ``entry``: a hub error is re-raised as ``error`` (a :class:`WeightsError` when loading, a
    :class:`~retinabench.registry.lockfile.LockError` when locking) with :func:`hub_message`, chained to the hub's
    own error; any other error passes unchanged."""
    try:
        yield
    except Exception as err:
        message = hub_message(entry, err, revision)
        if message is None:
            raise
        raise error(message) from err
