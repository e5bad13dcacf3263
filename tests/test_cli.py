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
