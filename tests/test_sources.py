"""Task folders from other sources: BBH-style tasks from a (fake) bigbench sdist, the generators, hub datasets."""

import io
import json
import re
import tarfile

import pytest

from site_lens.cli import main
from site_lens.sources import SourceError, split_items
from site_lens.sources.bbh import build_bbh, read_task_files
from site_lens.sources.generated import generate
from site_lens.sources.hub import convert_dataset
from site_lens.tasks import SPLITS, load_task

TOP = "bigbench-1.0.0/bigbench/benchmark_tasks/"


def _mc(n, options, correct=0, prefix=""):
    """n items whose first option (or ``correct``) is right, BIG-bench style."""
    return {
        "task_prefix": prefix,
        "examples": [
            {"input": f"question {i}?", "target_scores": {o: int(j == correct) for j, o in enumerate(options)}}
            for i in range(n)
        ],
    }


def _fake_sdist(tmp_path):
    specs = {
        "navigate": _mc(30, ["True", "False"], prefix="Do you return to the start?"),
        "date_understanding": _mc(40, ["01/02/2020", "03/04/2021", "05/06/2022", "07/08/2023"]),
        "object_counting": {
            "examples": [{"input": f"I have {i} cats. How many?", "target": [f"w{i}", str(i)]} for i in range(30)]
        },
        "dyck_languages": {
            "examples": [
                {"input": f"( [ {'< ' * (i % 3)}{i}", "target_scores": {") ]": int(i % 2 == 0), "] )": int(i % 2 == 1)}}
                for i in range(30)
            ]
        },
        "logical_deduction/three_objects": {
            "examples": [  # ten scenes, three questions each (other options); five items with two correct options
                {"input": f"scene {i // 3}", "target_scores": {f"a{i}": 1, f"b{i}": int(i < 5), f"c{i}": 0}}
                for i in range(30)
            ]
            + [{"input": "scene 9", "target_scores": {"a29": 1, "b29": 0, "c29": 0}}]  # a repeat: kept once
            + [{"input": "scene 8", "target_scores": {"a26": 0, "b26": 1, "c26": 0}}]  # another answer: both go
        },
    }
    path = tmp_path / "bigbench-1.0.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, spec in {**specs, "other_task": {"examples": []}}.items():
            data = json.dumps(spec).encode()
            info = tarfile.TarInfo(f"{TOP}{name}/task.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


TASKS = [
    "navigate",
    "date_understanding",
    "object_counting",
    "dyck_languages",
    "logical_deduction_three_objects",
    "boolean_expressions",
    "web_of_lies",
]


def test_bbh_build_writes_loadable_tasks_with_options_splits_and_readme(tmp_path):
    out = tmp_path / "bbh"
    rows = build_bbh(out, sdist=_fake_sdist(tmp_path), tasks=TASKS, seed=0)
    assert [r["task"] for r in rows] == TASKS
    for name in TASKS:
        task = load_task(out / name)
        inputs = [x for s in SPLITS for x, _ in task.split(s)]
        assert len(inputs) == len(set(inputs)) and min(len(task.split(s)) for s in SPLITS) >= 1
        meta = json.loads((out / name / "meta.json").read_text())
        assert meta["sizes"] == {s: len(task.split(s)) for s in SPLITS} and meta["seed"] == 0

    date = load_task(out / "date_understanding")
    golds = []
    for (x, y), c in zip(date.train, date.split_choices("train")):
        assert c.options == ("(A)", "(B)", "(C)", "(D)") and y in c.options
        line = next(ln for ln in x.splitlines() if ln.startswith(y))
        assert line == f"{y} 01/02/2020"  # the letter names the correct option's line
        golds.append(y)
    assert len(set(golds)) == 4  # options shuffled: the correct one is not always (A)
    assert json.loads((out / "date_understanding" / "meta.json").read_text())["chance"] == 0.25

    nav = load_task(out / "navigate")
    assert all(x.startswith("Do you return to the start?\n") for x, _ in nav.train)  # the task prefix
    assert {y for _, y in nav.train} == {"True"} and nav.split_choices("test")[0].options == ("True", "False")

    count = load_task(out / "object_counting")
    (x, y), c = count.test[0], count.split_choices("test")[0]
    assert y.isdigit() and set(c.answers) == {y, f"w{y}"} and c.options == ()  # digits output, words accepted
    assert json.loads((out / "object_counting" / "meta.json").read_text())["chance"] is None

    dyck = load_task(out / "dyck_languages")
    assert all(y == (") ]" if int(x.split()[-1]) % 2 == 0 else "] )") for x, y in dyck.train)

    meta = json.loads((out / "logical_deduction_three_objects" / "meta.json").read_text())
    assert meta["items_dropped"] == 5  # two correct options: dropped, not guessed
    assert meta["items_repeated"] == 3 and sum(meta["sizes"].values()) == 30 - 5 - 1
    logic = load_task(out / "logical_deduction_three_objects")
    scenes = {s: {x.split("\n")[0] for x, _ in logic.split(s)} for s in SPLITS}
    assert not (scenes["train"] & scenes["test"]) and not (scenes["train"] & scenes["valid"])  # a scene in one split
    readme = (out / "README.md").read_text()
    assert all(f"| {t} |" in readme for t in TASKS) and "bigbench==1.0.0" in readme


def test_sdist_members_named_from_dot_slash_are_read(tmp_path):
    """Tarballs written as ``tar -czf x.tar.gz ./bigbench-1.0.0`` name their members ``./bigbench-1.0.0/...``."""
    path = tmp_path / "dot.tar.gz"
    data = json.dumps(_mc(3, ["True", "False"])).encode()
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(f"./{TOP}navigate/task.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert len(read_task_files(path, {"navigate"})["navigate"]["examples"]) == 3


def test_bbh_build_is_seeded(tmp_path):
    sdist = _fake_sdist(tmp_path)
    for d, s in [("a", 0), ("b", 0), ("c", 1)]:
        build_bbh(tmp_path / d, sdist=sdist, tasks=["date_understanding"], seed=s)
    read = lambda d: (tmp_path / d / "date_understanding" / "test.json").read_text()
    assert read("a") == read("b") and read("a") != read("c")


def test_bbh_refusals_leave_nothing_half_written(tmp_path, capsys):
    sdist, out = _fake_sdist(tmp_path), tmp_path / "bbh"
    with pytest.raises(SourceError, match="snarks"):
        build_bbh(out, sdist=sdist, tasks=["navigate", "snarks"])  # snarks is not in the fake sdist
    assert not out.exists() or not any(out.iterdir())
    with pytest.raises(SourceError, match="unknown BBH task"):
        build_bbh(out, sdist=sdist, tasks=["nope"])
    assert main(["data", "bbh", "--sdist", str(sdist), "--tasks", "navigate", "--out", str(out)]) == 0
    assert "navigate" in capsys.readouterr().out
    before = (out / "navigate" / "test.json").read_text()
    assert main(["data", "bbh", "--sdist", str(sdist), "--tasks", "navigate", "--out", str(out), "--seed", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("site-lens: error:") and "--overwrite" in err and len(err.splitlines()) == 1
    assert (out / "navigate" / "test.json").read_text() == before
    assert (
        main(
            [
                "data",
                "bbh",
                "--sdist",
                str(sdist),
                "--tasks",
                "navigate",
                "--out",
                str(out),
                "--seed",
                "3",
                "--overwrite",
            ]
        )
        == 0
    )
    assert (out / "navigate" / "test.json").read_text() != before
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "navigate"]  # no temp folder left
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(SourceError, match="cannot read"):
        read_task_files(bad, {"navigate"})


def test_generated_tasks_are_correct_and_distinct():
    arith = generate("multistep_arithmetic_two", 200, 0)
    assert all(str(eval(x["input"].removesuffix(" ="))) == x["output"] for x in arith)
    boolean = generate("boolean_expressions", 200, 0)
    assert all(str(eval(x["input"].removesuffix(" is"))) == x["output"] for x in boolean)
    assert {x["output"] for x in boolean} == {"True", "False"}
    lies = generate("web_of_lies", 200, 0)
    for item in lies:  # an independent reading: a speaker tells the truth iff what they say is so
        first, *claims = re.findall(r"(\w+) (says \w+ )?(tells the truth|lies)\.", item["input"])
        truth = {first[0]: first[2] == "tells the truth"}
        for speaker, says, verdict in claims:
            target = says.split()[1]
            truth[speaker] = truth[target] == (verdict == "tells the truth")
        asked = re.search(r"Does (\w+) tell the truth\?", item["input"]).group(1)
        assert item["output"] == ("Yes" if truth[asked] else "No")
    assert len({x["input"] for x in lies}) == 200 and {x["output"] for x in lies} == {"Yes", "No"}
    assert generate("web_of_lies", 50, 0) == lies[:50] and generate("web_of_lies", 50, 1) != lies[:50]


def test_split_items_sizes():
    parts = split_items([{"input": str(i), "output": "x"} for i in range(1000)], seed=0)
    assert [len(parts[s]) for s in SPLITS] == [700, 50, 250]
    parts = split_items([{"input": str(i), "output": "x"} for i in range(20)], seed=0)
    assert [len(parts[s]) for s in SPLITS] == [10, 2, 8]
    with pytest.raises(SourceError, match="too few"):
        split_items([{"input": "a", "output": "b"}] * 5, seed=0)


# ---------------------------------------------------------------- Hugging Face datasets

datasets = pytest.importorskip("datasets")


def _anli():
    features = datasets.Features(
        {
            "premise": datasets.Value("string"),
            "hypothesis": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["entailment", "neutral", "contradiction"]),
        }
    )

    def rows(n, tag):
        return {
            "premise": [f"{tag} premise {i}" for i in range(n)],
            "hypothesis": [f"hypothesis {i}" for i in range(n)],
            "label": [i % 3 for i in range(n)],
        }

    return datasets.DatasetDict(
        {
            s: datasets.Dataset.from_dict(rows(n, s), features=features)
            for s, n in [("train_r1", 30), ("dev_r1", 6), ("test_r1", 9)]
        }
    )


def test_hub_anli_labels_become_named_options(tmp_path):
    (path,) = convert_dataset(
        _anli(),
        tmp_path,
        "anli_r1",
        input="Premise: {premise}\nHypothesis: {hypothesis}",
        output="label",
        splits={"train": "train_r1", "valid": "dev_r1", "test": "test_r1"},
    )
    task = load_task(path)
    assert [len(task.split(s)) for s in SPLITS] == [30, 6, 9]
    assert task.test[1] == ("Premise: test_r1 premise 1\nHypothesis: hypothesis 1", "neutral")
    assert task.split_choices("test")[0].options == ("entailment", "neutral", "contradiction")


def test_hub_mmlu_pro_letters_and_one_task_per_group(tmp_path):
    n = 40
    ds = datasets.DatasetDict(
        {
            "test": datasets.Dataset.from_dict(
                {
                    "question": [f"q{i}" for i in range(n)],
                    "options": [[f"o{i}{j}" for j in range(4 + i % 2)] for i in range(n)],
                    "answer_index": [i % 4 for i in range(n)],
                    "category": ["law" if i % 2 else "Computer Science" for i in range(n)],
                }
            )
        }
    )
    paths = convert_dataset(
        ds,
        tmp_path,
        "mmlu_pro",
        input="question",
        output="answer_index",
        options="options",
        group_by="category",
        splits={"test": "test"},
    )
    assert [p.name for p in paths] == ["mmlu_pro_computer_science", "mmlu_pro_law"]
    task = load_task(paths[1])
    assert sum(len(task.split(s)) for s in SPLITS) == 20  # the one split divided into three
    x, y = task.test[0]
    i = int(x.split("\n")[0][1:])
    assert y == "(" + "ABCD"[i % 4] + ")" and f"{y} o{i}{i % 4}" in x.splitlines()


def test_hub_refusals_name_the_problem(tmp_path, monkeypatch, capsys):
    with pytest.raises(SourceError, match="all of train/valid/test"):
        convert_dataset(
            _anli(), tmp_path, "x", input="premise", output="label", splits={"train": "train_r1", "test": "test_r1"}
        )
    with pytest.raises(SourceError, match="group-by field"):
        convert_dataset(
            _anli(), tmp_path, "x", input="premise", output="label", splits={"test": "train_r1"}, group_by="subject"
        )
    with pytest.raises(SourceError, match="no split"):
        convert_dataset(_anli(), tmp_path, "x", input="premise", output="label", splits={"test": "test"})
    with pytest.raises(SourceError, match="missing field"):
        convert_dataset(_anli(), tmp_path, "x", input="{nope}", output="label", splits={"test": "test_r1"})
    with pytest.raises(SourceError, match="no output field"):
        convert_dataset(_anli(), tmp_path, "x", input="premise", output="gold", splits={"test": "test_r1"})
    assert not (tmp_path / "x").exists()
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None: _anli())
    args = ["data", "hf", "facebook/anli", "--out", str(tmp_path), "--input", "{premise}\\n{hypothesis}"]
    assert main([*args, "--output", "label", "--splits", "train=train_r1,valid=dev_r1,test=test_r1"]) == 0
    assert load_task(tmp_path / "anli").test[0][0] == "test_r1 premise 0\nhypothesis 0"
    assert main([*args, "--output", "label", "--splits", "test=train_r1", "--task-name", "one"]) == 0
    assert sum(len(load_task(tmp_path / "one").split(s)) for s in SPLITS) == 30
    with pytest.raises(SystemExit):
        main([*args, "--output", "label", "--splits", "dev=dev_r1"])
    assert "train/valid/test" in capsys.readouterr().err
