import json

import pytest

from site_lens.cli import main


def _err(capsys):
    err = capsys.readouterr().err.strip()
    return err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--task", "no-such-task"], "unknown task"),
        (["run", "--task", "antonym", "--data", "/no/such/dir"], "data folder not found"),
        (["run", "--task", "antonym", "--model", "no-such-model"], "unknown model 'no-such-model'"),
        (["run", "--task", "antonym", "--shots", "200"], "examples; 201 are needed"),
        (["run", "--task", "antonym", "--steps", "-1"], "steps must be >= 0"),
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
    assert main(["run", "--task", "antonym", "--out", str(blocker / "sub")]) == 2
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
    assert "antonym" in capsys.readouterr().out


def test_write_json_atomic_leaves_no_temp(tmp_path):
    from site_lens.io import write_json_atomic

    write_json_atomic(tmp_path / "r.json", {"a": 1})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_every_config_field_is_a_flag_of_run_and_bench_with_its_comment_as_help():
    from dataclasses import fields

    from site_lens.cli import build_parser
    from site_lens.config import EmbeddingConfig, EvalConfig, SelectionConfig, SiteConfig, field_help

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    for command in ("run", "bench"):
        actions = {a.dest: a for a in sub[command]._actions}
        for cls in (SiteConfig, EmbeddingConfig, SelectionConfig, EvalConfig):
            helps = field_help(cls)
            for f in fields(cls):
                if f.name in ("embedding", "selection", "eval"):
                    continue
                action = actions[f"{cls.__name__}.{f.name}"]
                assert helps[f.name] and action.help.startswith(helps[f.name]), (command, f.name)
    args = parser.parse_args(["bench", "--steps", "7", "--no-keep-best", "--backend", "hooked", "--shots", "3"])
    from site_lens.config import site_config_from_args

    cfg = site_config_from_args(args)
    assert (cfg.selection.steps, cfg.selection.keep_best, cfg.selection.backend, cfg.embedding.n_shots) == (7, False, "hooked", 3)
    assert cfg.eval.max_test == 100  # bench's own default; run's is every test item
    assert site_config_from_args(parser.parse_args(["run", "--task", "x"])).eval.max_test is None
