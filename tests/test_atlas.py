"""Head atlases: assembled from bench folders, saved whole, read back checked, queried, compared."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from small import SMALL_EMBEDDING, write_task_dir

from site_lens.atlas import Atlas, AtlasError, assemble_atlas, compare_atlases, load_atlas
from site_lens.atlas.build import _head_rows
from site_lens.atlas.store import HEADS, MANIFEST, SCHEMA_VERSION, TENSORS
from site_lens.config import EvalConfig, SelectionConfig, SiteConfig

CFG = SiteConfig(embedding=SMALL_EMBEDDING, selection=SelectionConfig(steps=6, eval_every=3, max_valid=4),
                 eval=EvalConfig(max_test=3, max_new_tokens=3))  # fmt: skip


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny model, its task folder, a bench folder (2 tasks x 2 seeds) and the atlas assembled from it."""
    from helpers import char_tokenizer

    from site_lens.experiments import bench
    from site_lens.models.engines import HOOKED
    from site_lens.models.tiny import tiny_bridge

    root = tmp_path_factory.mktemp("atlas")
    data = write_task_dir(root / "data")
    if HOOKED is None:  # TransformerLens 4: the bridge engine
        model = tiny_bridge("llama", char_tokenizer(), name="tiny", max_position_embeddings=256)
    else:
        from helpers import tiny

        model = tiny(n_ctx=256)
    out = root / "bench"
    rows = bench.run_bench(model, ["upper", "lower"], ["zero_shot", "icl", "site"], [0, 1], out, data_dir=data, cfg=CFG)
    seen = []
    atlas = assemble_atlas(model, [out], data_dir=data, command="test", progress=seen.append)
    return {"model": model, "data": data, "bench": out, "rows": rows, "atlas": atlas, "progress": seen, "root": root}


def test_assembled_atlas_holds_every_task_and_seed_as_tidy_tables(made):
    atlas, model = made["atlas"], made["model"]
    n = model.cfg.n_layers * model.cfg.n_heads
    assert atlas.tasks == ["lower", "upper"] and atlas.seeds == [0, 1] and len(made["progress"]) == 4
    assert len(atlas.heads) == 4 * n and set(atlas.t) == {"lower/seed0", "lower/seed1", "upper/seed0", "upper/seed1"}
    one = atlas.heads[(atlas.heads.task == "upper") & (atlas.heads.seed == 1)]
    assert torch.allclose(torch.tensor(one.alpha.to_numpy()), torch.sigmoid(torch.tensor(one.theta.to_numpy())))
    assert sorted(one.alpha_rank) == list(range(1, n + 1))
    assert one.sort_values("alpha_rank").alpha.is_monotonic_decreasing
    assert set(atlas.scores.method) == {"zero_shot", "icl", "site"}
    assert atlas.manifest["tasks"]["upper"]["family"] == "upper" and atlas.manifest["schema_version"] == SCHEMA_VERSION


def test_t_kept_by_bench_is_stage_1s_and_a_stopped_assembly_resumes(made, tmp_path, monkeypatch):
    import dataclasses
    import shutil

    from site_lens.experiments import kept_t as kept_mod
    from site_lens.experiments.bench import T_FILE, keep_t, kept_t, t_label, t_path
    from site_lens.models import model_identity
    from site_lens.stages.embeddings import task_embedding
    from site_lens.tasks import load_task

    model, atlas = made["model"], made["atlas"]
    assert all("t as kept beside the rows" in p for p in made["progress"])
    for name, seed in (("upper", 0), ("lower", 1)):
        again = task_embedding(model, load_task(name, data_dir=made["data"]), CFG.embedding, seed).float()
        assert torch.equal(atlas.t[f"{name}/seed{seed}"], again)
    bench = tmp_path / "bench"
    shutil.copytree(made["bench"], bench)
    upper = load_task("upper", data_dir=made["data"])
    name, dtype = model_identity(model)["name"], str(model.cfg.dtype)
    assert kept_t(bench, "upper", 0, t_label(name, dtype, CFG.embedding, upper)) is not None
    other = SiteConfig.from_dict({**CFG.to_dict(), "embedding": {**CFG.embedding.to_dict(), "batch_size": 1}})
    moved = dataclasses.replace(upper, train=upper.train[1:])  # the same name over other data
    for label in (t_label(name, dtype, other.embedding, upper), t_label(name, dtype, CFG.embedding, moved),
                  t_label(name, "bfloat16", CFG.embedding, upper), t_label("other", dtype, CFG.embedding, upper)):
        assert kept_t(bench, "upper", 0, label) is None  # made otherwise: not taken
    t_path(bench, "upper", 0).unlink()
    t_path(bench, "lower", 1).write_bytes(b"truncated")
    seen = []
    again = assemble_atlas(model, [bench], data_dir=made["data"], command="test", progress=seen.append)
    assert sum("t recomputed" in p for p in seen) == 2 and len(seen) == 4
    assert all(torch.equal(again.t[k], atlas.t[k]) for k in atlas.t)
    assert len(list(bench.glob(f"rows/*/seed*/{T_FILE}"))) == 4  # kept again: a third assembly computes nothing
    seen.clear()
    assemble_atlas(model, [bench], data_dir=made["data"], command="test", progress=seen.append)
    assert not any("t recomputed" in p for p in seen)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kept_mod, "write_bytes_atomic", full)
    assert keep_t(bench, "upper", 0, atlas.t["upper/seed0"], t_label(name, dtype, CFG.embedding, upper)) is False
    t_path(bench, "upper", 0).unlink()
    again = assemble_atlas(model, [bench], data_dir=made["data"], command="test")  # a folder it cannot write: built
    assert torch.equal(again.t["upper/seed0"], atlas.t["upper/seed0"]) and not t_path(bench, "upper", 0).exists()


def test_the_adapter_from_the_atlas_gives_the_bench_rows_scores_exactly(made):
    from site_lens.experiments.run import evaluate
    from site_lens.tasks import load_task

    atlas, model = made["atlas"], made["model"]
    for row in (r for r in made["rows"] if r["method"] == "site"):
        adapter = atlas.adapter(row["task"], row["seed"])
        got = evaluate(model, load_task(row["task"], data_dir=made["data"]), "site", adapter, CFG.eval, seed=row["seed"])
        for k in ("first_token_acc", "exact_match", "strict_match", "n_test"):
            assert got[k] == row[k], (row["task"], row["seed"], k)


def test_save_and_load_round_trip_byte_identical(made, tmp_path):
    atlas = made["atlas"]
    a = atlas.save(tmp_path / "a")
    back = load_atlas(a)
    b = back.save(tmp_path / "b")
    for f in sorted(p.name for p in a.iterdir()):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    pd.testing.assert_frame_equal(back.heads, atlas.heads.reset_index(drop=True))
    assert all(torch.equal(back.t[k], atlas.t[k]) for k in atlas.t)
    card = (a / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: site-lens\n") and "- site-lens" in card


def test_damaged_newer_or_foreign_atlases_are_refused_in_one_line(made, tmp_path):
    from site_lens.adapter import AdapterError
    from site_lens.models import model_identity

    folder = made["atlas"].save(tmp_path / "a")
    raw = (folder / HEADS).read_bytes()
    (folder / HEADS).write_bytes(raw[:-7] + bytes([raw[-7] ^ 1]) + raw[-6:])
    with pytest.raises(AtlasError, match="do not match the SHA-256") as e:
        load_atlas(folder)
    assert "\n" not in str(e.value)
    (folder / HEADS).write_bytes(raw)
    t = (folder / TENSORS).read_bytes()
    (folder / TENSORS).write_bytes(t[: len(t) // 2])
    with pytest.raises(AtlasError, match="truncated or edited"):
        load_atlas(folder)
    (folder / TENSORS).write_bytes(t)
    manifest = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps({**manifest, "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(AtlasError, match="newer than this site-lens reads"):
        load_atlas(folder)
    with pytest.raises(AtlasError, match="no such atlas folder"):
        load_atlas(tmp_path / "nowhere" / "deeper" / "still")
    other = {**model_identity(made["model"]), "n_heads": 99}
    with pytest.raises(AtlasError, match="atlas was made for model"):
        made["atlas"].check_model(other)
    with pytest.raises(AdapterError):
        made["atlas"].adapter("upper", 0).check_model(other)
    made["atlas"].check_model(model_identity(made["model"]))  # its own model passes
    assert not list(tmp_path.glob(".a.tmp*"))  # nothing left half-written


def test_queries_name_heads_and_tasks(made):
    atlas = made["atlas"]
    top = atlas.top_heads("upper", k=3, seed=0)
    assert len(top) == 3 and top.alpha.is_monotonic_decreasing and top.label.str.match(r"L\d+H\d+").all()
    layer, head = int(top["layer"][0]), int(top["head"][0])
    assert "upper" in set(atlas.tasks_selecting(layer, head, k=3, seed=0).task)
    near = atlas.nearest("upper", n=1)
    assert list(near.task) == ["lower"] and 0 <= near.jaccard[0] <= 1
    with pytest.raises(AtlasError, match="task 'nope' is not in this atlas"):
        atlas.top_heads("nope")
    with pytest.raises(AtlasError, match="no head L99H0"):
        atlas.tasks_selecting(99, 0)
    with pytest.raises(AtlasError, match="seed 7 is not in this atlas"):
        atlas.map("upper", 7)


def synthetic(groups: dict[str, int], n_layers=6, n_heads=4, seed=0, base=None) -> Atlas:
    """An atlas (no t) whose tasks of one group share their high heads: group g lifts heads g*3 .. g*3+2."""
    g = torch.Generator().manual_seed(seed)
    frames = []
    for task, grp in groups.items():
        theta = torch.randn(n_layers * n_heads, generator=g) * 0.3 if base is None else base.clone()
        theta[grp * 3 : grp * 3 + 3] += 3.0
        frames.append(_head_rows(task, 0, theta.reshape(n_layers, n_heads)))
    ident = {"name": "syn", "n_layers": n_layers, "n_heads": n_heads, "d_head": 2}
    manifest = {"schema_version": SCHEMA_VERSION, "model": ident, "tasks": {t: {"category": "x"} for t in groups}}
    return Atlas(manifest=manifest, heads=pd.concat(frames, ignore_index=True), scores=pd.DataFrame(), t={})


def test_mantel_comparison_finds_shared_task_structure_and_only_that():
    tasks = [f"t{i}" for i in range(12)]
    a = synthetic({t: i // 2 for i, t in enumerate(tasks)}, seed=0)
    same = synthetic({t: i // 2 for i, t in enumerate(tasks)}, seed=1)  # the same pairs share heads, other noise
    other = synthetic({t: [0, 3, 1, 5, 2, 4, 0, 2, 1, 5, 3, 4][i] for i, t in enumerate(tasks)}, seed=2)
    r = compare_atlases(a, same, k=(3, 3), n_perm=999)
    assert r["spearman"] > 0.5 and r["p_value"] <= 0.01 and r["tasks"] == 12 and r["pairs"] == 66
    assert (r["p_floor"], r["sided"]) == (1 / 1000, "greater")
    null = compare_atlases(a, other, k=(3, 3), n_perm=999)
    assert null["p_value"] > 0.05  # pairs that share heads in one atlas do not in the other
    with pytest.raises(AtlasError, match="share 2 tasks"):
        compare_atlases(a, synthetic({"t0": 0, "t1": 1, "z": 2}), n_perm=10)


def test_the_page_embeds_the_atlas_and_needs_nothing_from_the_network(made, tmp_path):
    import re

    from site_lens.atlas.page import DIGITS, page_data

    atlas = made["atlas"]
    path = atlas.write_page(tmp_path / "atlas.html")
    text = path.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # no CDN, no remote file
    data = json.loads(re.search(r'<script id="atlas-data" type="application/json">(.*?)</script>', text, re.DOTALL).group(1))
    assert data == json.loads(json.dumps(page_data(atlas)))
    assert data["tasks"] == sorted(atlas.tasks, key=lambda t: (atlas.category(t), t)) and data["seeds"] == atlas.seeds
    for task in atlas.tasks:
        for seed in atlas.seeds:
            want = atlas.map(task, seed).flatten().tolist()
            assert data["maps"]["alpha"][task][str(seed)] == pytest.approx(want, abs=0.6 * 10**-DIGITS)
    site = atlas.scores[(atlas.scores.method == "site") & (atlas.scores.task == "upper") & (atlas.scores.seed == 1)]
    assert data["prefix"]["upper"]["site"]["1"] == pytest.approx(float(site.exact_match.iloc[0]))


def chromium() -> str | None:
    import os
    import shutil

    return os.environ.get("BROWSER_PATH") or next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
    )


@pytest.mark.skipif(chromium() is None, reason="no Chromium here (make chromium, or BROWSER_PATH): the page's data test above still runs")
def test_the_page_works_in_a_real_headless_browser(made, tmp_path):
    result = run_page_selftest(made["atlas"].write_page(tmp_path / "atlas.html"))
    assert result["errors"] == [] and result["taskMapChanged"] and result["headListsTask"], result
    evil = "<img src=x onerror=\"window.pageErrors.push('injected')\">"  # a task name is data, never markup
    hostile = synthetic({evil: 0, "t1": 0, "t2": 1, "t3": 1})
    hostile.manifest["tasks"][evil]["category"] = "<b>x</b>"
    result = run_page_selftest(hostile.write_page(tmp_path / "hostile.html"))
    assert result["errors"] == [] and result["headListsTask"], result  # listed as text, nothing injected


def run_page_selftest(path) -> dict:
    """The page's own #selftest in headless Chromium: its result attribute, after no console line."""
    import html
    import re
    import subprocess

    done = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--virtual-time-budget=5000",
         "--dump-dom", f"file://{path}#selftest"], capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line]
    assert not console, console  # the page logs nothing: no error, no warning
    found = re.search(r'data-selftest="([^"]*)"', done.stdout)
    assert found, f"the page's self-test did not run: {done.stderr[-500:]}"
    return json.loads(html.unescape(found.group(1)))


PULL = """
import json, sys
from site_lens.atlas import load_atlas
from site_lens.atlas.hub import pull
from site_lens.atlas.store import load_folder
for repo, revision, cache in json.loads(sys.argv[1]):
    try:
        path = pull(repo, revision, cache_dir=cache)
        atlas = load_atlas(repo, revision) if cache is None else load_folder(path)  # None: HF_HUB_CACHE's, as a user's
        print(json.dumps({"path": str(path), "tasks": atlas.tasks}))
    except Exception as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
"""


def pulls_in_subprocess(hub_url: str, cache, jobs: list[tuple[str, str | None, str | None]]) -> list[dict]:
    """Pulls (repo, revision, cache folder or None for ``cache``) through huggingface_hub in one fresh interpreter,
    with HF_ENDPOINT at the loopback server (read when the library loads); one result per pull."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_ENDPOINT": hub_url, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(cache),
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": ""}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", PULL, json.dumps(jobs)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = [json.loads(line) for line in done.stdout.strip().splitlines() if line.startswith("{")]
    assert len(out) == len(jobs), done.stdout
    return out


def test_pull_from_a_loopback_hub_is_byte_identical_and_errors_are_one_line(made, tmp_path):
    from hub_server import HubServer

    from site_lens.atlas.hub import FILES

    folder = made["atlas"].save(tmp_path / "a")
    files = {f: (folder / f).read_bytes() for f in FILES}
    missing = (("lab/nothing-here", None, "no atlas 'lab/nothing-here' on the Hub"),
               ("lab/tiny-atlas", "v9", "has no revision 'v9'"))  # fmt: skip
    with HubServer() as hub:
        v1 = hub.repos.add("lab/tiny-atlas", files, ref="v1")
        hub.repos.add("lab/tiny-atlas", {**files, "README.md": b"changed"}, ref="main")  # main moved on: damaged
        jobs = [
            ("lab/tiny-atlas", "v1", None),
            ("lab/tiny-atlas", v1, str(tmp_path / "cache2")),  # a commit pins it too
            ("lab/tiny-atlas", None, str(tmp_path / "cache3")),
            *((repo, rev, str(tmp_path / "cache4")) for repo, rev, _ in missing),
        ]
        got, pinned, damaged, *errors = pulls_in_subprocess(hub.url, tmp_path / "cache", jobs)
    assert got.get("tasks") == made["atlas"].tasks, got
    for f in FILES:
        assert (tmp_path / "cache").joinpath(got["path"], f).read_bytes() == files[f], f
    assert pinned.get("tasks") == made["atlas"].tasks, pinned
    assert Path(pinned["path"]).is_relative_to(tmp_path / "cache2")
    assert damaged["error"] == "AtlasError" and "do not match the SHA-256" in damaged["message"]
    for r, (_, _, words) in zip(errors, missing, strict=True):
        assert r["error"] == "AtlasError" and words in r["message"] and "\n" not in r["message"], r


def test_push_uploads_the_atlas_files_and_its_card(made, tmp_path, monkeypatch):
    import huggingface_hub

    from site_lens.atlas import push_to_hub
    from site_lens.atlas.hub import FILES

    calls = []

    class Api:
        def create_repo(self, repo_id, **kw):
            calls.append(("create", repo_id, kw))

        def upload_folder(self, **kw):
            calls.append(("upload", kw["repo_id"], kw))
            return type("Info", (), {"commit_url": "http://127.0.0.1/commit/1"})()

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    folder = made["atlas"].save(tmp_path / "a")
    (folder / "notes.txt").write_text("not part of the atlas")
    assert push_to_hub(folder, "lab/tiny-atlas") == "http://127.0.0.1/commit/1"
    (_, repo, kw), = [c for c in calls if c[0] == "upload"]
    assert repo == "lab/tiny-atlas" and kw["repo_type"] == "model" and sorted(kw["allow_patterns"]) == sorted(FILES)
    assert "notes.txt" not in kw["allow_patterns"]
    (folder / "heads.parquet").write_bytes(b"damaged")
    with pytest.raises(AtlasError, match="do not match"):
        push_to_hub(folder, "lab/tiny-atlas")  # only a whole atlas leaves the machine


def test_mantel_comparison_is_not_fooled_by_task_families():
    tasks = [f"f{i}_{n}" for i in range(8) for n in (3, 5)]  # eight families of two list lengths
    # within each atlas a family's two tasks share heads; beyond that the atlases have nothing in common
    a = synthetic({t: i // 2 for i, t in enumerate(tasks)}, n_layers=8, seed=0)
    b = synthetic({t: [3, 7, 1, 5, 0, 6, 2, 4][i // 2] for i, t in enumerate(tasks)}, n_layers=8, seed=5)
    r = compare_atlases(a, b, k=(5, 5), n_perm=999)  # top 5: the family's 3 heads and 2 of the noise
    assert r["spearman"] > 0.1  # the family pairs agree in both...
    assert r["p_value"] > 0.05 and r["p_excl"] > 0.05  # ...but whole-family shuffles keep them: no evidence
    assert r["pairs_excl"] == r["pairs"] - 8


def test_scores_come_from_the_row_file_of_the_theta_where_rows_csv_holds_another_run(made, tmp_path):
    import csv
    import shutil

    bench = tmp_path / "bench"
    shutil.copytree(made["bench"], bench)
    with open(bench / "rows.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        if (r["task"], r["method"], r["seed"]) in (("upper", "site", "0"), ("lower", "icl", "1")):
            r["strict_match"] = "0.123"  # an older run's row kept in the table
    with open(bench / "rows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    def strict(atlas, task, method, seed):
        s = atlas.scores
        return s[(s.task == task) & (s.method == method) & (s.seed == seed)].strict_match.item()

    files = {(r["task"], r["method"], r["seed"]): r for r in made["rows"]}
    atlas = assemble_atlas(made["model"], [bench], data_dir=made["data"], command="test")
    assert strict(atlas, "upper", "site", 0) == files["upper", "site", 0]["strict_match"]
    assert strict(atlas, "lower", "icl", 1) == files["lower", "icl", 1]["strict_match"]
    (bench / "rows" / "lower" / "seed1" / "icl.json").unlink()  # no row file: the table's row stands
    assert strict(assemble_atlas(made["model"], [bench], data_dir=made["data"], command="test"), "lower", "icl", 1) == 0.123


@pytest.mark.parametrize("name, heads", [("smollm2-135m", 270), ("gemma-3-270m", 72)])
def test_the_shipped_atlases_load_whole(name, heads):
    """Each committed atlas passes its digests and holds the 45 FV tasks x seeds 0-2 of its model, t included."""
    from pathlib import Path

    atlas = load_atlas(Path(__file__).resolve().parents[1] / "atlases" / name)
    assert atlas.model["name"] == name and len(atlas.tasks) == 45 and atlas.seeds == [0, 1, 2]
    assert len(atlas.heads) == 45 * 3 * heads and len(atlas.t) == 45 * 3
    site = atlas.scores[atlas.scores.method == "site"]
    assert len(site) == 45 * 3 and site.exact_match.between(0, 1).all()


def test_bench_rows_of_sparse_site_are_refused(made, tmp_path):
    """An atlas holds SITE's dense gates: a bench folder made with --sparse-* is refused, naming it."""
    import json
    import shutil

    from site_lens.atlas import AtlasError

    bench = tmp_path / "bench"
    shutil.copytree(made["bench"], bench)
    spec = json.loads((bench / "bench.json").read_text())
    spec["config"]["sparsity"] = {"penalty": "l0", "weight": 0.03, "threshold": 0.5, "beta": 2 / 3}
    (bench / "bench.json").write_text(json.dumps(spec))
    with pytest.raises(AtlasError, match="sparse SITE rows") as e:
        assemble_atlas(made["model"], [bench], data_dir=made["data"], command="test")
    assert len(str(e.value).splitlines()) == 1
