import json
import random

import pytest

from site_lens.tasks import (
    ABSTRACTIVE,
    EXTRACTIVE,
    TaskError,
    build_prompt,
    builtin_tasks,
    detect_case_sensitive,
    format_demo,
    format_query,
    load_task,
    load_task_file,
    sample_icl_prompts,
    split_indices,
    zero_shot_prompts,
)


def test_prompt_format():
    assert format_demo("hot", "cold") == "Q: hot\nA: cold\n\n"
    assert format_query("big") == "Q: big\nA:"
    assert build_prompt([("hot", "cold"), ("up", "down")], "big") == "Q: hot\nA: cold\n\nQ: up\nA: down\n\nQ: big\nA:"
    assert zero_shot_prompts([("a", "b")]) == [("Q: a\nA:", "b")]


def test_icl_prompts_have_n_shots_and_a_distinct_query():
    pool = [(f"x{i}", f"y{i}") for i in range(20)]
    for p, a in sample_icl_prompts(pool, 5, 10, random.Random(0)):
        assert p.count("Q: ") == 11 and p.endswith("\nA:")
        q = p.rsplit("Q: ", 1)[1].split("\n")[0]
        assert a == "y" + q[1:] and f"Q: {q}\nA: " not in p
    out = sample_icl_prompts(pool, 0, 3, random.Random(0), queries=[("q", "r")])
    assert len(out) == 1 and out[0][1] == "r" and out[0][0].count("Q: ") == 4


def test_builtin_tasks_load_and_split():
    names = builtin_tasks()
    assert {"opposites", "past-tense", "capital-cities", "to-french", "uppercase"} <= set(names)
    for n in names:
        t = load_task(n)
        total = len(t.train) + len(t.valid) + len(t.test)
        assert total >= 50 and len(t.train) == round(0.7 * total)
        assert not set(t.train) & set(t.test)
    assert load_task("uppercase").case_sensitive and not load_task("opposites").case_sensitive


def test_no_builtin_task_has_an_fv_task_name():
    """`site-lens tasks` and load_task(name) without a data folder never shadow one of the 45 FV tasks."""
    assert len(ABSTRACTIVE | EXTRACTIVE) == 45
    for name in builtin_tasks():
        assert name not in ABSTRACTIVE | EXTRACTIVE, name


@pytest.mark.parametrize("name", ["antonym", "country-capital", "english-french", "present-past", "squad_val"])
def test_an_fv_name_without_a_data_folder_says_where_to_get_it(name):
    with pytest.raises(TaskError) as e:
        load_task(name)
    msg = str(e.value)
    assert "\n" not in msg and f"'{name}' is a function-vector task, not built in" in msg
    assert "site-lens data fv --out data/fv" in msg and f"load_task('{name}', data_dir='data/fv')" in msg
    assert "--data data/fv" in msg


def test_split_is_seeded_and_complete(tmp_path):
    a, b = split_indices(100), split_indices(100)
    assert a == b and sorted(sum(a, [])) == list(range(100)) and [len(s) for s in a] == [70, 9, 21]
    assert split_indices(100, seed=1) != a
    pairs = [(str(i), str(i)) for i in range(100)]
    task = load_task_file(_write(tmp_path, [{"input": x, "output": y} for x, y in pairs]))
    assert [task.train, task.valid, task.test] == [[pairs[i] for i in part] for part in a]


def test_case_detection():
    assert detect_case_sensitive([("apple", "Apple"), ("dog", "Dog")])
    assert not detect_case_sensitive([("France", "Paris"), ("Peru", "Lima")])
    assert not detect_case_sensitive([("a, B, c", "B"), ("x, y, z", "y")])


def _write(tmp_path, obj, name="t.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "invalid JSON"),
        ("{not json", "invalid JSON"),
        ({"input": "a"}, "expected a JSON list"),
        ([], "empty"),
        ([{"input": "a"}], "lacks key"),
        ([{"in": "a", "out": "b"}], "lacks key"),
        ([["a", "b"]], "expected an object"),
        ([{"input": "a", "output": ""}], "empty 'output'"),
        ([{"input": "  ", "output": "b"}], "empty 'input'"),
        ([{"input": "a", "output": None}], "string or number"),
        ([{"input": "a", "output": "b\nc"}], "newline"),
        ([{"input": "a", "output": "b"}], "at least 3"),
    ],
)
def test_bad_task_files_give_one_line_errors(tmp_path, content, message):
    p = _write(tmp_path, content)
    with pytest.raises(TaskError, match=message) as e:
        load_task(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


def test_numbers_become_strings(tmp_path):
    p = _write(tmp_path, [{"input": "abc", "output": 3}] * 10)
    t = load_task(p)
    assert t.train[0] == ("abc", "3")


def test_folder_layout_and_missing_split(tmp_path):
    d = tmp_path / "mytask"
    d.mkdir()
    for s in ("train", "valid"):
        _write(d, [{"input": "a", "output": "b"}], f"{s}.json")
    with pytest.raises(TaskError, match="test.json: file not found"):
        load_task("mytask", data_dir=tmp_path)
    _write(d, [{"input": "c", "output": "d"}], "test.json")
    assert load_task("mytask", data_dir=tmp_path).test == [("c", "d")]


def test_unknown_task_lists_choices(tmp_path):
    with pytest.raises(TaskError, match="built-in tasks are"):
        load_task("no-such-task")
    with pytest.raises(TaskError, match="available"):
        load_task("no-such-task", data_dir=tmp_path)


def test_too_few_examples_for_shots():
    pool = [("a", "b")] * 5
    with pytest.raises(TaskError, match="has 5 examples; 11 are needed"):
        sample_icl_prompts(pool, 1, 10, random.Random(0))


def test_fv_folder_loads(fv_dir):
    t = load_task("antonym", data_dir=fv_dir)
    assert len(t.train) > 1000 and len(t.valid) > 100 and len(t.test) > 300
    assert load_task("capitalize", data_dir=fv_dir).case_sensitive
    assert not load_task("country-capital", data_dir=fv_dir).case_sensitive


def test_generated_builtin_tasks_match_their_generator():
    """uppercase, first-letter and next-number are exactly what scripts/make_builtin_tasks.py writes."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "scripts/make_builtin_tasks.py", "--check"], check=False, cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for name in ("uppercase", "first-letter", "next-number"):
        task = load_task(name)
        assert len(task.test) == 101 and len({x for x, _ in task.train + task.valid + task.test}) == 480
