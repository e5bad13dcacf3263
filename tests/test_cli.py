import json

import pytest
import torch

from site_lens.cli import main


def _err(capsys):
    err = capsys.readouterr().err.strip()
    return err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--task", "no-such-task"], "unknown task"),
        (["run", "--task", "antonym", "--data", "/no/such/dir"], "data folder not found"),
        (["run", "--task", "opposites", "--model", "no-such-model"], "unknown model 'no-such-model'"),
        (["run", "--task", "opposites", "--shots", "200"], "examples; 201 are needed"),
        (["run", "--task", "opposites", "--steps", "-1"], "steps must be >= 0"),
        (["run", "--task", "antonym"], "'antonym' is a function-vector task, not built in"),
        (["demo", "--tasks", "uppercase,country-capital"], "site-lens data fv --out data/fv"),
        (["bench", "--tasks", "antonym"], "load_task('antonym', data_dir='data/fv') (CLI: --data data/fv)"),
        (["sparsify", "--tasks", "squad_val"], "'squad_val' is a function-vector task"),
    ],
)
def test_bad_input_is_one_line_error_exit_2(capsys, argv, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = _err(capsys)
    assert err.startswith("site-lens: error:") and message in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_bad_task_file(tmp_path, capsys):
    (tmp_path / "bad.json").write_text('[{"input": "a"}]')
    assert main(["run", "--task", str(tmp_path / "bad.json")]) == 2
    assert "lacks key" in _err(capsys)


def test_unwritable_output_fails_before_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["run", "--task", "opposites", "--out", str(blocker / "sub")]) == 2
    assert "not writable" in _err(capsys)


@pytest.mark.parametrize("cmd", [[], ["run"], ["demo"], ["tasks"]])
def test_help_works(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main(cmd + ["--help"])
    assert e.value.code == 0
    assert "usage" in capsys.readouterr().out


def test_usage_error_exit_code(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run"])  # --task is required
    assert e.value.code == 2


def test_tasks_lists_builtins(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert "opposites" in out and "uppercase" in out and "antonym" not in out
    assert out.splitlines()[-1].startswith("test: the split's size; run and bench score its first 100 items")


def test_write_json_atomic_leaves_no_temp(tmp_path):
    from site_lens.files import write_json_atomic

    write_json_atomic(tmp_path / "r.json", {"a": 1})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_every_config_field_is_a_flag_of_run_and_bench_with_its_comment_as_help():
    from dataclasses import MISSING, fields

    from site_lens.cli import build_parser
    from site_lens.cli.args import field_help
    from site_lens.config import SiteConfig

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    parts = {f.name: f.default_factory for f in fields(SiteConfig) if f.default_factory is not MISSING}
    parts |= {f.name: f.metadata["config"] for f in fields(SiteConfig) if "config" in f.metadata}  # optional parts
    assert set(parts) == {"embedding", "selection", "eval", "engine", "sparsity"}
    for command in ("run", "bench"):
        actions = {a.dest: a for a in sub[command]._actions}
        for cls in (SiteConfig, *parts.values()):
            helps = field_help(cls)
            for f in fields(cls):
                if f.name in parts:
                    continue
                action = actions[f"{cls.__name__}.{f.name}"]
                assert helps[f.name] and action.help.startswith(helps[f.name]), (command, f.name)
    args = parser.parse_args(["bench", "--steps", "7", "--no-keep-best", "--backend", "hooked", "--shots", "3"])
    from site_lens.cli.args import site_config_from_args

    cfg = site_config_from_args(args)
    assert (cfg.selection.steps, cfg.selection.keep_best, cfg.engine.backend, cfg.embedding.n_shots) == (7, False, "hooked", 3)
    assert cfg.eval.max_test == 100  # one default for every subcommand
    assert site_config_from_args(parser.parse_args(["run", "--task", "x"])).eval.max_test == 100
    assert site_config_from_args(parser.parse_args(["run", "--task", "x", "--max-test", "all"])).eval.max_test is None
    assert getattr(parser.parse_args(["analyse", "--runs", "r"]), "AnalyseConfig.max_test") == 100


def test_version_and_verbose_after_the_subcommand(capsys):
    from site_lens import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"site-lens {__version__}"
    from site_lens.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["tasks", "-v"]).verbose is True
    assert parser.parse_args(["-v", "tasks"]).verbose is True  # not reset by the subcommand's default
    assert parser.parse_args(["tasks"]).verbose is False


def test_every_option_has_help_and_every_subcommand_examples():
    from site_lens.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    for name, p in sub.items():
        assert p.epilog and "examples:" in p.epilog and f"site-lens {name}" in p.epilog, name
        for a in p._actions:
            assert a.help, (name, a.dest)


def test_multi_value_flags_take_comma_lists():
    from site_lens.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["demo", "--tasks", "opposites, uppercase"]).tasks == ["opposites", "uppercase"]
    assert parser.parse_args(["bench", "--seeds", "3,1,3"]).seeds == [3, 1]
    assert parser.parse_args(["figures", "--bench", "a,b"]).bench == ["a", "b"]


def test_tasks_lists_json_list_tasks_under_data(tmp_path, capsys):
    (tmp_path / "folder_task").mkdir()
    for split in ("train", "valid", "test"):
        (tmp_path / "folder_task" / f"{split}.json").write_text('[{"input": "a", "output": "b"}]')
    (tmp_path / "list_task.json").write_text(json.dumps([{"input": str(i), "output": str(i)} for i in range(10)]))
    assert main(["tasks", "--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "folder_task" in out and "list_task" in out


def test_run_then_predict_with_the_saved_adapter(tmp_path, monkeypatch, capsys):
    """`run` writes an adapter; `predict --adapter` applies it to lines from a file and from stdin."""
    import io

    from helpers import tiny

    import site_lens.models

    model = tiny()
    monkeypatch.setattr(site_lens.models, "load_model", lambda *a, **k: model)
    task = tmp_path / "t.json"
    task.write_text(json.dumps([{"input": c, "output": c.upper()} for c in "abcdefghijklmnop"]))
    out = tmp_path / "run"
    argv = ["run", "--task", str(task), "--steps", "3", "--prompts", "2", "--shots", "2", "--max-test", "3", "--out", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "SITE" in table and "[" in table  # scores with their interval
    assert "a row stops at its first newline" in table  # the legend says what the columns are
    res = json.loads((out / "results.json").read_text())
    assert res["n_test"] == 3 and res["site"]["n_test"] == 3
    inputs = tmp_path / "in.txt"
    inputs.write_text("a\n\nb\n")
    assert main(["predict", "--adapter", str(out / "adapter"), "--input", str(inputs), "--max-new-tokens", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2  # the blank line is skipped
    import site_lens as sl
    from site_lens.config import EvalConfig

    adapter, cfg = sl.load_adapter(out / "adapter"), EvalConfig(max_new_tokens=2)
    answers = sl.predict(model, ["a", "b"], adapter, cfg)  # raw inputs, as the command reads them
    assert answers == lines and all(isinstance(a, str) for a in answers)
    prompts = [sl.format_query("a"), sl.format_query("b")]
    assert sl.predict(model, prompts, adapter, cfg, formatted=True) == lines
    gens, logits = sl.predict_with_logits(model, prompts, adapter, cfg)
    assert [g.strip().split("\n")[0].strip() for g in gens] == lines and logits.shape[0] == 2
    argv = ["predict", "--adapter", str(out / "adapter"), "--input", str(inputs), "--max-new-tokens", "2"]
    assert main([*argv, "--zero-shot"]) == 0
    assert capsys.readouterr().out.splitlines() == sl.predict(model, ["a", "b"], None, cfg)
    with pytest.raises(TypeError, match="list of inputs"):
        sl.predict(model, "a", adapter, cfg)
    assert main(["predict", "--adapter", str(out / "adapter"), "--input", str(inputs), "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("a\n"))
    dest = tmp_path / "gen.txt"
    assert main(["predict", "--adapter", str(out / "adapter"), "--max-new-tokens", "2", "--out", str(dest)]) == 0
    assert dest.read_text().splitlines() == lines[:1]


def test_sparsify_writes_resumable_folders_a_summary_and_the_shared_gate(tmp_path, monkeypatch, capsys):
    """`sparsify` on a tiny model: per (task, seed) folders, resumable, summary, shared gate, figures."""
    from helpers import tiny

    import site_lens.models

    model = tiny()
    monkeypatch.setattr(site_lens.models, "load_model", lambda *a, **k: model)
    data = tmp_path / "data"
    for name, fn in (("up", str.upper), ("rev", lambda s: s[::-1])):
        words = [a + b for a in "abcdefgh" for b in "xyz"]
        pairs = [{"input": w, "output": fn(w)} for w in words]
        (data / name).mkdir(parents=True)
        for split, part in (("train", pairs[:14]), ("valid", pairs[14:19]), ("test", pairs[19:])):
            (data / name / f"{split}.json").write_text(json.dumps(part))
    out = tmp_path / "sparse"
    argv = [
        "sparsify", "--data", str(data), "--tasks", "up,rev", "--seeds", "0,1", "--rankings-seeds", "0",
        "--steps", "4", "--eval-every", "2", "--prompts", "2", "--shots", "2", "--path-steps", "2",
        "--weights-l0", "0.01,0.1", "--weights-l1", "0.1", "--ks", "1,4", "--max-test", "4", "--score-valid", "3",
        "--shared", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "heads in the masks" in text and (out / "summary.csv").is_file() and (out / "shared" / "summary.csv").is_file()
    assert (out / "summary_average_prob.csv").is_file() and "One alpha for every task" in (out / "summary.md").read_text()
    import pandas as pd

    scores = pd.read_csv(out / "up" / "seed0" / "scores.csv")
    assert {"zero_shot", "site", "sparse_l0", "sparse_l1", "dense_alpha", "cie", "attribution", "random"} <= set(
        scores.method
    )
    from safetensors.torch import load_file

    from site_lens.analysis.attribution import attribution_scores, zero_shot_examples
    from site_lens.analysis.minimal import parse_heads
    from site_lens.experiments.sweep import ATTRIBUTION_PROMPTS
    from site_lens.tasks import load_task

    attr = load_file(str(out / "up" / "seed0" / "attribution.safetensors"))["attribution"]
    t = load_file(str(out / "up" / "seed0" / "adapter" / "adapter.safetensors"))["t"]
    up = load_task("up", str(data))
    assert torch.allclose(attr, attribution_scores(model, zero_shot_examples(model, up, "train", ATTRIBUTION_PROMPTS), t))
    best = divmod(int(attr.argmax()), attr.shape[1])  # the k = 1 set is the head attribution ranks first
    top1 = scores[(scores.method == "attribution") & (scores.k == 1) & (scores.split == "valid")]
    assert [parse_heads(h) for h in top1.heads] == [{best}]
    assert not (out / "up" / "seed1" / "attribution.safetensors").exists()
    # a folder made before attribution existed gains it on the next run, with the numbers a full run gives
    before = scores[scores.method != "attribution"]
    before.to_csv(out / "up" / "seed0" / "scores.csv", index=False)
    (out / "up" / "seed0" / "attribution.safetensors").unlink()
    smallest_full = pd.read_csv(out / "up" / "seed0" / "smallest_k.csv")
    smallest_full[smallest_full.method != "attribution"].to_csv(out / "up" / "seed0" / "smallest_k.csv", index=False)
    info = json.loads((out / "up" / "seed0" / "minimal.json").read_text())
    del info["seconds"]["attribution"]
    (out / "up" / "seed0" / "minimal.json").write_text(json.dumps(info))
    assert main(argv) == 0 and "attribution's ranking added" in capsys.readouterr().out
    again = pd.read_csv(out / "up" / "seed0" / "scores.csv")
    order = ["split", "method", "k", "draw", "weight", "mode"]
    pd.testing.assert_frame_equal(
        again.sort_values(order).reset_index(drop=True), scores.sort_values(order).reset_index(drop=True)
    )
    small_again = pd.read_csv(out / "up" / "seed0" / "smallest_k.csv")
    pd.testing.assert_frame_equal(
        small_again.sort_values(["metric", "method"]).reset_index(drop=True),
        smallest_full.sort_values(["metric", "method"]).reset_index(drop=True),
    )
    assert torch.equal(load_file(str(out / "up" / "seed0" / "attribution.safetensors"))["attribution"], attr)
    assert json.loads((out / "up" / "seed0" / "minimal.json").read_text())["seconds"]["attribution"] > 0
    assert set(pd.read_csv(out / "up" / "seed1" / "scores.csv").method) == {"zero_shot", "site", "sparse_l0", "sparse_l1"}
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary.task) == {"up", "rev"}
    assert main(argv) == 0  # resumed: nothing recomputed
    assert "done already" in capsys.readouterr().out
    changed = [*argv[: argv.index("--ks") + 1], "1,2", *argv[argv.index("--ks") + 2 :]]
    assert main(changed) == 2  # other settings than the finished folders': refused, nothing mixed
    assert "made with other ks" in capsys.readouterr().err
    done = out / "up" / "seed0" / "minimal.json"  # a folder recorded before a config field existed: its default
    info = json.loads(done.read_text())
    del info["config"]["selection"]["objective"]
    done.write_text(json.dumps(info))
    assert main(argv) == 0 and "done already" in capsys.readouterr().out
    assert main([*argv, "--penalties", "l2"]) == 2
    assert "MinimalConfig.penalties must be l0, l1 or both, got l2" in capsys.readouterr().err
    assert main(["figures", "--sparse", str(out), "--out", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig" / "minimal_k_recovery_em.html").is_file()


def test_sparsify_and_analyse_flags_are_their_configs_fields():
    """Each field of MinimalConfig / AnalyseConfig is a flag of sparsify / analyse, help and default from the class."""
    from dataclasses import fields

    from site_lens.cli import build_parser
    from site_lens.cli.args import field_help, from_args
    from site_lens.config import AnalyseConfig, MinimalConfig

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    for command, cls in (("sparsify", MinimalConfig), ("analyse", AnalyseConfig)):
        actions = {a.dest: a for a in sub[command]._actions}
        helps = field_help(cls)
        for f in fields(cls):
            action = actions[f"{cls.__name__}.{f.name}"]
            assert helps[f.name] and action.help.startswith(helps[f.name]), (command, f.name)
    args = parser.parse_args(["sparsify", "--tasks", "x", "--ks", "1,4", "--weights-l1", "0,0.5", "--shared"])
    assert from_args(MinimalConfig, args) == MinimalConfig(ks=[1, 4], weights_l1=(0.0, 0.5), shared=True)
    assert MinimalConfig(ks=[1, 4]).ks == (1, 4)  # any sequence given, a tuple kept (as the flags give)
    assert "(default: 1,2,4,8,16,32,64,128)" in actions_help(sub["sparsify"], "MinimalConfig.ks")
    assert from_args(AnalyseConfig, parser.parse_args(["analyse", "--runs", "r", "--limit", "all"])).max_test is None
    assert from_args(AnalyseConfig, parser.parse_args(["analyse", "--runs", "r"])) == AnalyseConfig()
    with pytest.raises(SystemExit):
        parser.parse_args(["sparsify", "--tasks", "x", "--ks", "1,two"])


def actions_help(parser, dest: str) -> str:
    return next(a.help for a in parser._actions if a.dest == dest)


def test_limit_is_an_alias_of_max_test():
    from site_lens.cli import build_parser
    from site_lens.cli.args import site_config_from_args

    parser = build_parser()
    for argv in (["run", "--task", "x"], ["demo"], ["bench"], ["sparsify", "--tasks", "x"]):
        assert site_config_from_args(parser.parse_args([*argv, "--limit", "7"])).eval.max_test == 7, argv
        assert site_config_from_args(parser.parse_args([*argv, "--limit", "all"])).eval.max_test is None, argv
    assert getattr(parser.parse_args(["analyse", "--runs", "r", "--limit", "5"]), "AnalyseConfig.max_test") == 5


def test_tasks_json_lists_names_categories_counts_and_sources(tmp_path, capsys):
    from site_lens.tasks import builtin_tasks

    assert main(["tasks", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [t["name"] for t in listed] == builtin_tasks()
    up = next(t for t in listed if t["name"] == "uppercase")
    assert up == {"name": "uppercase", "category": "other", "train": 336, "valid": 43, "test": 101,
                  "case_sensitive": True, "source": "builtin:uppercase"}  # fmt: skip
    (tmp_path / "antonym").mkdir()
    for split, n in (("train", 3), ("valid", 1), ("test", 2)):
        (tmp_path / "antonym" / f"{split}.json").write_text(json.dumps([{"input": "a", "output": "b"}] * n))
    assert main(["tasks", "--data", str(tmp_path), "--json"]) == 0
    (fv,) = json.loads(capsys.readouterr().out)
    assert (fv["name"], fv["category"], fv["train"], fv["valid"], fv["test"]) == ("antonym", "abstractive", 3, 1, 2)
    assert fv["source"] == str(tmp_path / "antonym")


def test_bench_methods_list_prints_each_method_and_loads_no_model(monkeypatch, capsys):
    import site_lens.models
    from site_lens.methods import METHODS

    monkeypatch.setattr(site_lens.models, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    assert main(["bench", "--methods", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(METHODS)
    assert all(len(line.split(maxsplit=1)) == 2 for line in lines)  # a description on each line
    assert any(line.startswith("site_seq") and "answer-sequence" in line for line in lines)


def test_bench_without_out_writes_under_runs_in_the_cwd_and_resumes(tmp_path, monkeypatch, capsys):
    from helpers import tiny

    import site_lens.models

    model = tiny()
    monkeypatch.setattr(site_lens.models, "load_model", lambda *a, **k: model)
    monkeypatch.chdir(tmp_path)
    argv = ["bench", "--tasks", "uppercase", "--methods", "zero_shot", "--limit", "3", "--max-new-tokens", "2"]
    assert main(argv) == 0
    out = tmp_path / "runs" / "bench" / "smollm2-135m"
    computed = "zero_shot  first-tok"  # the line bench prints for each row it computes
    assert computed in capsys.readouterr().out and (out / "summary.md").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # nothing else written in the cwd
    rows = (out / "rows.csv").read_text()
    import csv

    (row,) = csv.DictReader(rows.splitlines())
    assert (row["task"], row["method"], row["n_test"]) == ("uppercase", "zero_shot", "3")  # --limit 3
    assert main(argv) == 0  # resumed: the row is done, nothing recomputed
    assert computed not in capsys.readouterr().out and (out / "rows.csv").read_text() == rows


def test_every_help_gives_its_default_in_one_format():
    """'(default: X)' everywhere: not '(default X)', 'X (default)' or '(default)'."""
    import argparse
    import re

    from site_lens.cli import build_parser

    def parsers(p, name):
        yield name, p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for n, sp in a.choices.items():
                    yield from parsers(sp, f"{name} {n}")

    for name, p in parsers(build_parser(), "site-lens"):
        assert p.description and p.epilog and "examples:" in p.epilog, name
        for text in (p.description, p.epilog):  # examples a reader can run as written, inside the repository
            assert not re.search(r"path/to|example\.(org|com)|\.\./|/tmp/|<[a-z ]+>", text), (name, text)
        for a in p._actions:
            h = a.help or ""
            assert not re.search(r"\(default(?!: )|default\)", h), (name, a.option_strings, h)


def test_sparse_flags_make_site_config_sparsity():
    from site_lens.cli import build_parser
    from site_lens.cli.args import site_config_from_args
    from site_lens.config import SparsityConfig

    parser = build_parser()
    assert site_config_from_args(parser.parse_args(["run", "--task", "x"])).sparsity is None
    cfg = site_config_from_args(parser.parse_args(["run", "--task", "x", "--sparse-weight", "0.03"]))
    assert cfg.sparsity == SparsityConfig(weight=0.03)
    cfg = site_config_from_args(parser.parse_args(["bench", "--sparse-penalty", "l1", "--sparse-threshold", "0.2"]))
    assert cfg.sparsity == SparsityConfig(penalty="l1", threshold=0.2)
    assert "(default: l0)" in actions_help(parser._subparsers._group_actions[0].choices["run"], "SparsityConfig.penalty")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sparsify", "--tasks", "uppercase", "--sparse-weight", "0.1"], "sweeps its own penalties"),
        (["bench", "--tasks", "uppercase", "--methods", "site", "--task-batch", "2", "--sparse-weight", "0.1"], "one task at a time"),
        (["run", "--task", "uppercase", "--objective", "sequence", "--sparse-weight", "0.1"], "first answer token"),
        (["run", "--task", "uppercase", "--no-fast", "--sparse-weight", "0.1"], "fast path only"),
        (["run", "--task", "uppercase", "--sparse-threshold", "0.2"], "give --sparse-weight"),
        (["bench", "--tasks", "uppercase", "--methods", "site,site_seq", "--sparse-weight", "0.1"], "site_seq cannot take it"),
    ],
)
def test_sparse_flags_refused_where_they_cannot_apply(argv, message, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and not (tmp_path / "out").exists()
