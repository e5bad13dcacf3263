"""Atlases on the Hugging Face Hub: a model repository holding the atlas folder as it is on disk.

    push_to_hub(atlas_folder, "user/smollm2-135m-site-atlas")     # uploads the folder's files
    pull("user/smollm2-135m-site-atlas", revision="v1")           # a local copy, then load_folder

Both go through ``huggingface_hub`` (``HF_ENDPOINT`` points it at another server; ``HF_TOKEN``
or ``huggingface-cli login`` authenticates a push). A pulled copy is checked as a folder is
(every file's digest against the manifest).
"""

from __future__ import annotations

from pathlib import Path

from .store import DATA_FILES, MANIFEST, AtlasError

HUB_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$"
FILES = (MANIFEST, *DATA_FILES)


def push_to_hub(folder: str | Path, repo_id: str, private: bool = False, message: str | None = None) -> str:
    """Upload an atlas folder's files to a Hub model repository (created if absent); returns the commit's URL."""
    from huggingface_hub import HfApi

    from .store import load_folder

    folder = Path(folder)
    atlas = load_folder(folder)  # only a whole, undamaged atlas leaves the machine
    api = HfApi()
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    info = api.upload_folder(
        folder_path=str(folder), repo_id=repo_id, repo_type="model", allow_patterns=list(FILES),
        commit_message=message or f"site-lens atlas of {atlas.model.get('name')}, {len(atlas.tasks)} tasks",
    )  # fmt: skip
    return str(getattr(info, "commit_url", info))


def pull(repo_id: str, revision: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """A local copy of an atlas on the Hub (``revision``: a branch, tag or commit); one-line errors."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        path = snapshot_download(repo_id, repo_type="model", revision=revision, allow_patterns=list(FILES),
                                 cache_dir=None if cache_dir is None else str(cache_dir))  # fmt: skip
    except RepositoryNotFoundError:
        raise AtlasError(f"no atlas '{repo_id}' on the Hub (repository not found, or private without a token)") from None
    except RevisionNotFoundError:
        raise AtlasError(f"atlas '{repo_id}' has no revision '{revision}'") from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise AtlasError(f"could not pull atlas '{repo_id}': {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if not (Path(path) / MANIFEST).is_file():
        raise AtlasError(f"'{repo_id}' on the Hub holds no {MANIFEST}: not a site-lens atlas")
    return Path(path)
