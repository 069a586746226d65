"""`MediaPath` and `open_folder`: a task reads only below the media roots, follows no link,
and a walk stops at its bounds (tasks/media.py)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from lumastra import config
from tasks import MediaPath, MediaPathError, PermanentError, open_folder
from tasks.definitions.demo import HashFolderInput, SlowProgressInput

PROJECT = Path(__file__).resolve().parents[2]


class Folder(BaseModel):
    path: MediaPath


@pytest.fixture
def root(settings: Any, tmp_path: Path) -> Path:
    """The one media root of the test; `outside` beside it is not one."""
    media = tmp_path / "media"
    (media / "shows" / "pilot").mkdir(parents=True)
    (media / "shows" / "pilot" / "episode-01.ts").write_bytes(b"episode")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_bytes(b"secret")
    settings.CONFIG = dataclasses.replace(settings.CONFIG, media_roots=(media,))
    return media


def refusal(path: object) -> dict[str, Any]:
    with pytest.raises(ValidationError) as caught:
        Folder.model_validate({"path": path})
    (error,) = caught.value.errors()
    assert error["loc"] == ("path",)
    return dict(error)


# --- at start: validation ---------------------------------------------------------------


def test_a_path_inside_a_root_is_accepted_resolved(root: Path) -> None:
    assert Folder.model_validate({"path": str(root / "shows")}).path == root / "shows"
    # `..` that stays inside is fine, and stored without it.
    dotted = f"{root}/shows/pilot/../pilot"
    assert Folder.model_validate({"path": dotted}).path == root / "shows" / "pilot"
    assert Folder.model_validate({"path": str(root)}).path == root


def test_a_link_inside_a_root_to_etc_is_refused(root: Path) -> None:
    (root / "etc").symlink_to("/etc")

    error = refusal(str(root / "etc"))

    assert error["type"] == "outside_media_roots"
    assert error["msg"] == f"resolves outside the media roots ({root})"
    assert refusal(str(root / "etc" / "passwd"))["type"] == "outside_media_roots"


def test_dot_dot_out_of_a_root_is_refused(root: Path) -> None:
    assert refusal(f"{root}/../outside")["type"] == "outside_media_roots"
    assert refusal(f"{root}/shows/../../outside/secret.txt")["type"] == "outside_media_roots"


def test_a_root_only_folder_outside_the_roots_is_refused(root: Path, tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)

    assert refusal(str(private))["type"] == "outside_media_roots"
    assert refusal("/root")["type"] == "outside_media_roots"


def test_a_sibling_whose_name_starts_like_a_root_is_outside_it(root: Path) -> None:
    (root.parent / "media-other").mkdir()

    assert refusal(str(root.parent / "media-other"))["type"] == "outside_media_roots"


def test_relative_and_unresolvable_paths_are_refused(root: Path) -> None:
    assert refusal("shows")["type"] == "media_path_relative"
    assert refusal(f"{root}/a\x00b")["type"] == "media_path_unresolvable"


def test_the_default_roots_keep_out_the_project_and_its_git(settings: Any) -> None:
    defaults = config.load({}).media_roots
    settings.CONFIG = dataclasses.replace(settings.CONFIG, media_roots=defaults)

    assert defaults == (PROJECT / ".demo" / "media",)
    for path in (PROJECT / ".git", PROJECT, PROJECT / ".demo" / "media" / ".." / ".." / ".git"):
        assert refusal(str(path))["type"] == "outside_media_roots"


def test_without_roots_every_path_is_refused(settings: Any) -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, media_roots=())

    assert refusal("/srv/media")["msg"] == "resolves outside the media roots (none configured)"


def test_media_roots_are_colon_separated_and_relative_ones_start_at_the_project() -> None:
    loaded = config.load({"LUMASTRA_MEDIA_ROOTS": " /srv/media : :/mnt/a,b/../c :media"})

    assert loaded.media_roots == (Path("/srv/media"), Path("/mnt/c"), PROJECT / "media")
    assert config.load({"LUMASTRA_MEDIA_ROOTS": ""}).media_roots == ()


# --- in the worker: reading ---------------------------------------------------------------


def test_a_folder_replaced_by_a_link_after_validation_is_refused_at_read_time(
    root: Path, tmp_path: Path
) -> None:
    params = Folder.model_validate({"path": str(root / "shows")})
    shutil.rmtree(root / "shows")
    (root / "shows").symlink_to(tmp_path / "outside")

    with pytest.raises(MediaPathError) as caught:
        open_folder(params.path)

    assert isinstance(caught.value, PermanentError)
    assert str(caught.value) == f"{root / 'shows'} is, or passes through, a symbolic link"


def test_a_parent_replaced_by_a_link_after_validation_is_refused_at_read_time(
    root: Path, tmp_path: Path
) -> None:
    params = Folder.model_validate({"path": str(root / "shows" / "pilot")})
    shutil.rmtree(root / "shows")
    (tmp_path / "outside" / "pilot").mkdir()
    (root / "shows").symlink_to(tmp_path / "outside")

    with pytest.raises(MediaPathError, match="symbolic link"):
        open_folder(params.path)


def test_open_folder_refuses_paths_outside_the_roots_even_unvalidated(
    root: Path, tmp_path: Path
) -> None:
    for path in (tmp_path / "outside", root / ".." / "outside", Path("/etc")):
        with pytest.raises(MediaPathError):
            open_folder(path)


def test_the_walk_follows_no_link_to_a_folder_or_a_file(root: Path, tmp_path: Path) -> None:
    (root / "shows" / "etc").symlink_to("/etc")
    (root / "shows" / "outside").symlink_to(tmp_path / "outside")
    (root / "shows" / "secret.txt").symlink_to(tmp_path / "outside" / "secret.txt")
    # A link to a file inside the roots is not followed either: the walk never follows one.
    (root / "shows" / "again.ts").symlink_to(root / "shows" / "pilot" / "episode-01.ts")

    with open_folder(root / "shows") as folder:
        found = list(folder.walk(limit=100, max_depth=8, max_entries=1_000))
        with folder.open(found[0]) as handle:
            content = handle.read()

    assert found == [PurePosixPath("pilot/episode-01.ts")]
    assert content == b"episode"
    assert folder.stats.skipped_links == 4
    assert not folder.stats.truncated


def test_a_file_replaced_by_a_link_before_it_is_read_is_refused(root: Path, tmp_path: Path) -> None:
    episode = root / "shows" / "pilot" / "episode-01.ts"
    with open_folder(root / "shows") as folder:
        (relative,) = folder.walk(limit=10, max_depth=8, max_entries=100)
        episode.unlink()
        episode.symlink_to(tmp_path / "outside" / "secret.txt")

        with pytest.raises(MediaPathError, match="symbolic link"):
            folder.open(relative)
        with pytest.raises(MediaPathError, match="not a path below"):
            folder.open(PurePosixPath("../outside/secret.txt"))


def test_the_walk_stops_as_soon_as_it_has_max_files(root: Path) -> None:
    for d in range(50):
        folder_path = root / "many" / f"d{d:02}"
        folder_path.mkdir(parents=True)
        for f in range(20):
            (folder_path / f"f{f:02}.bin").write_bytes(b"x")

    with open_folder(root / "many") as folder:
        found = list(folder.walk(limit=5, max_depth=8, max_entries=100_000))

    assert len(found) == 5
    assert folder.stats.truncated
    # 1,050 entries below the folder; the walk looked at one folder and five files.
    assert folder.stats.visited == 6


def test_the_walk_is_lazy_and_closes_what_it_opened(root: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    with open_folder(root) as folder:
        walk = folder.walk(limit=10, max_depth=8, max_entries=100)
        assert next(walk) == PurePosixPath("shows/pilot/episode-01.ts")
        assert folder.stats.visited == 3
        walk.close()

    assert len(os.listdir("/proc/self/fd")) == before


def test_the_walk_stays_above_max_depth_and_within_max_entries(root: Path) -> None:
    deep = root / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (root / "a" / "top.txt").write_bytes(b"1")
    (deep / "deep.txt").write_bytes(b"2")

    with open_folder(root / "a") as folder:
        shallow = list(folder.walk(limit=100, max_depth=1, max_entries=100))
    with open_folder(root / "a") as bounded:
        few = list(bounded.walk(limit=100, max_depth=8, max_entries=1))

    assert shallow == [PurePosixPath("top.txt")]
    assert folder.stats.too_deep == 1
    assert len(few) <= 1 and bounded.stats.visited == 1 and bounded.stats.truncated


# --- the demo's bounds ---------------------------------------------------------------------


def test_the_demo_inputs_have_demo_sized_bounds(root: Path) -> None:
    assert SlowProgressInput.model_validate({"steps": 100, "step_seconds": 5}).steps == 100
    for too_much in ({"steps": 101}, {"step_seconds": 5.1}, {"steps": 10_000}):
        with pytest.raises(ValidationError):
            SlowProgressInput.model_validate(too_much)
    with pytest.raises(ValidationError):
        HashFolderInput.model_validate({"path": str(root), "max_files": 10_001})
