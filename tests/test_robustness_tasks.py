"""Robustness of task loading and prompt building (issue 6).

Every input gives either a usable task whose prompts have the documented
shape, or exactly one ``TaskError`` whose one-line message names the file and
the problem. ``BAD_FILES`` lists the hand-picked bad inputs (one case each);
the hypothesis tests throw arbitrary JSON, Unicode and bytes at the same
functions.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from site_lens.tasks import (
    SPLITS,
    TaskError,
    build_prompt,
    format_demo,
    format_query,
    load_task,
    sample_icl_prompts,
    zero_shot_prompts,
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

GOOD = [{"input": f"in{i}", "output": f"out{i}"} for i in range(10)]


def _item(i: int, **kw) -> list[dict]:
    """GOOD with item ``i`` replaced by ``kw`` (keys set to ... are dropped)."""
    items = [dict(x) for x in GOOD]
    items[i] = {k: v for k, v in {**items[i], **kw}.items() if v is not ...}
    return items


def _dump(obj) -> str:
    return obj if isinstance(obj, str) else json.dumps(obj)


# (case id, file content (str, bytes, or a JSON value), expected message fragment)
BAD_FILES = [
    ("empty-file", "", "invalid JSON"),
    ("whitespace-file", "  \n\t ", "invalid JSON"),
    ("truncated-json", _dump(GOOD)[:-7], "invalid JSON"),
    ("trailing-garbage", _dump(GOOD) + "]", "invalid JSON"),
    ("single-quotes", "[{'input': 'a', 'output': 'b'}]", "invalid JSON"),
    ("comment", "// tasks\n" + _dump(GOOD), "invalid JSON"),
    ("deep-nesting", "[" * 100_000 + "]" * 100_000, "invalid JSON"),
    ("huge-integer", '[{"input": "a", "output": ' + "9" * 5000 + "}]", "invalid JSON"),
    ("not-utf8", b'[{"input": "caf\xe9", "output": "b"}]', "cannot read"),
    ("utf16", _dump(GOOD).encode("utf-16"), "cannot read"),
    ("top-object", {"input": "a", "output": "b"}, "expected a JSON list"),
    ("top-string", '"antonym"', "expected a JSON list"),
    ("top-number", "42", "expected a JSON list"),
    ("top-null", "null", "expected a JSON list"),
    ("top-true", "true", "expected a JSON list"),
    ("empty-list", [], "empty"),
    ("item-list", [["a", "b"]] * 5, "expected an object"),
    ("item-string", ["a -> b"] * 5, "expected an object"),
    ("item-null", [None] * 5, "expected an object"),
    ("item-number", [1, 2, 3], "expected an object"),
    ("mixed-items", GOOD + ["x"], "item 10 is a str"),
    ("missing-output", _item(3, output=...), "lacks key"),
    ("missing-input", _item(0, input=...), "lacks key"),
    ("wrong-keys", [{"in": "a", "out": "b"}] * 5, "lacks key"),
    ("key-case", [{"Input": "a", "Output": "b"}] * 5, "lacks key"),
    ("empty-input", _item(2, input=""), "empty 'input'"),
    ("empty-output", _item(9, output=""), "empty 'output'"),
    ("space-output", _item(1, output="   "), "empty 'output'"),
    ("tabs-newlines-input", _item(1, input="\t\n \r"), "empty 'input'"),
    ("unicode-space-output", _item(4, output="\u3000\u2003\u00a0"), "empty 'output'"),
    ("null-output", _item(5, output=None), "string or number"),
    ("bool-input", _item(5, input=True), "string or number"),
    ("list-output", _item(6, output=["a", "b"]), "string or number"),
    ("dict-input", _item(7, input={"text": "a"}), "string or number"),
    ("nan-output", '[{"input": "a", "output": NaN}]', "not a finite number"),
    ("infinity-input", '[{"input": Infinity, "output": "b"}]', "not a finite number"),
    ("overflow-float", '[{"input": 1e400, "output": "b"}]', "not a finite number"),
    ("lone-surrogate", '[{"input": "a\\ud800b", "output": "b"}]', "not valid Unicode"),
    ("newline-output", _item(8, output="two\nlines"), "newline"),
    ("one-example", GOOD[:1], "at least 3"),
    ("two-examples", GOOD[:2], "at least 3"),
]


def _write(path: Path, content) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(_dump(content), encoding="utf-8")
    return path


def assert_one_clear_error(e: TaskError, where: Path | str) -> None:
    """One line, names the file, no chained traceback behind it."""
    msg = str(e)
    assert msg and "\n" not in msg, msg
    assert str(where) in msg, msg
    assert e.__cause__ is None and (e.__context__ is None or e.__suppress_context__)


@pytest.mark.parametrize("content, message", [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_bad_task_file(tmp_path, content, message):
    p = _write(tmp_path / "task.json", content)
    with pytest.raises(TaskError, match=message) as e:
        load_task(p)
    assert_one_clear_error(e.value, p)


BAD_FOLDERS = [
    ("missing-test", {"train": GOOD, "valid": GOOD}, "test.json: file not found"),
    ("missing-all", {}, "train.json: file not found"),
    ("bad-valid-json", {"train": GOOD, "valid": "{", "test": GOOD}, "valid.json: invalid JSON"),
    ("empty-test", {"train": GOOD, "valid": GOOD, "test": []}, "test.json: the list of examples is empty"),
    ("object-train", {"train": {"a": "b"}, "valid": GOOD, "test": GOOD}, "train.json: expected a JSON list"),
    ("split-is-folder", {"train": GOOD, "valid": GOOD, "test": None}, "test.json: cannot read"),
]


@pytest.mark.parametrize("splits, message", [c[1:] for c in BAD_FOLDERS], ids=[c[0] for c in BAD_FOLDERS])
def test_bad_task_folder(tmp_path, splits, message):
    d = tmp_path / "mytask"
    d.mkdir()
    for s, content in splits.items():
        if content is None:
            (d / f"{s}.json").mkdir()
        else:
            _write(d / f"{s}.json", content)
    for how in ({"name_or_path": d}, {"name_or_path": "mytask", "data_dir": tmp_path}):
        with pytest.raises(TaskError, match=message) as e:
            load_task(**how)
        assert_one_clear_error(e.value, d)


def test_bad_names_and_data_dirs(tmp_path):
    cases = [
        ({"name_or_path": "no-such-task"}, "no-such-task"),
        ({"name_or_path": tmp_path / "missing.json"}, "missing.json"),
        ({"name_or_path": "antonym", "data_dir": tmp_path / "nowhere"}, "nowhere"),
        ({"name_or_path": "a\x00b"}, "a\x00b"),
        ({"name_or_path": "x", "data_dir": tmp_path}, str(tmp_path)),
    ]
    for kw, where in cases:
        with pytest.raises(TaskError) as e:
            load_task(**kw)
        assert_one_clear_error(e.value, where)


def test_accepted_oddities(tmp_path):
    """Inputs that are odd but usable load, with documented normalisation."""
    bom = _write(tmp_path / "bom.json", "\ufeff" + _dump(GOOD))
    assert load_task(bom).train  # a byte-order mark is tolerated
    nums = _write(tmp_path / "nums.json", [{"input": i, "output": i * 0.5} for i in range(10)])
    assert all(isinstance(x, str) and isinstance(y, str) for x, y in load_task(nums).train)
    dup = _write(tmp_path / "dup.json", [{"input": "a", "output": "b"}] * 10)
    t = load_task(dup)  # duplicates are kept as given (the FV data has none)
    assert set(t.train + t.valid + t.test) == {("a", "b")}
    p, a = sample_icl_prompts(t.train, 1, 3, random.Random(0))[0]
    assert p == build_prompt([("a", "b")] * 3, "a") and a == "b"
    pad = _write(tmp_path / "pad.json", [{"input": "  x ", "output": "\ty\n", "extra": [1]}] * 3)
    assert load_task(pad).train == [("x", "y")]  # stripped; extra keys ignored
    long = _write(tmp_path / "long.json", [{"input": "w" * 200_000, "output": "v"}] * 4)
    assert len(load_task(long).train[0][0]) == 200_000  # too long for a model: PromptTooLongError later


# ---------------------------------------------------------------- property-based

ANY_CHAR = st.characters(exclude_categories=())  # includes surrogates and control characters
TEXT = st.text(ANY_CHAR, max_size=12) | st.sampled_from(["", " ", "\n", "\t ", "Q:", "A: x\n\n", "\u200b"])
NUMBER = st.integers() | st.floats(allow_nan=True, allow_infinity=True)
SCALAR = TEXT | NUMBER | st.booleans() | st.none()
JSON = st.recursive(SCALAR, lambda c: st.lists(c, max_size=3) | st.dictionaries(TEXT, c, max_size=3), max_leaves=6)
ITEM = st.fixed_dictionaries({"input": SCALAR, "output": SCALAR}, optional={"extra": JSON}) | JSON
PLAIN = st.text(st.sampled_from(string.ascii_letters + " "), min_size=1, max_size=6)
GOOD_ITEM = st.fixed_dictionaries({"input": PLAIN, "output": PLAIN | st.integers(0, 99)})
TOP = st.lists(GOOD_ITEM, min_size=3, max_size=10) | st.lists(ITEM | GOOD_ITEM, max_size=10) | JSON


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _check_prompts(task, n_shots: int) -> None:
    """A loaded task's prompts: 'Q: x\\nA:' queries after n demonstrations, all encodable."""
    for split in SPLITS:
        pairs = task.split(split)
        assert pairs and all(isinstance(x, str) and isinstance(y, str) for x, y in pairs)
        assert all(x == x.strip() and y == y.strip() and x and y and "\n" not in y for x, y in pairs)
    for (p, a), (x, y) in zip(zero_shot_prompts(task.test), task.test):
        assert p == format_query(x) and a == y and _encodable(p)
    if len(task.train) <= n_shots:
        with pytest.raises(TaskError, match="needed"):
            sample_icl_prompts(task.train, 2, n_shots, random.Random(0))
        return
    demos = {format_demo(x, y) for x, y in task.train}
    for p, a in sample_icl_prompts(task.train, 2, n_shots, random.Random(0)):
        assert p.endswith("\nA:") and _encodable(p)
        query = [x for x, y in task.train if y == a and p.endswith(format_query(x))]
        assert query, (p, a)
        assert _splits_into(p[: -len(format_query(query[0]))], demos, n_shots)
    for p, a in sample_icl_prompts(task.train, 0, n_shots, random.Random(1), queries=task.test):
        assert p.endswith("\nA:") and _encodable(p)


def _splits_into(s: str, parts: set[str], n: int) -> bool:
    """Whether ``s`` is the concatenation of exactly ``n`` members of ``parts``."""
    if n == 0:
        return s == ""
    return any(s.startswith(d) and _splits_into(s[len(d) :], parts, n - 1) for d in parts)


@FAST
@given(content=TOP, n_shots=st.integers(0, 4), ascii_only=st.booleans())
def test_any_json_file_loads_or_raises_one_task_error(tmp_path, content, n_shots, ascii_only):
    p = tmp_path / "prop.json"
    text = json.dumps(content, ensure_ascii=ascii_only)
    if not _encodable(text):  # lone surrogates can only be written escaped
        text = json.dumps(content)
    p.write_text(text, encoding="utf-8")
    try:
        task = load_task(p)
    except TaskError as e:
        assert_one_clear_error(e, p)
        return
    _check_prompts(task, n_shots)


@FAST
@given(
    content=st.binary(max_size=64) | st.text(ANY_CHAR, max_size=40).map(lambda s: s.encode("utf-8", "surrogatepass"))
)
def test_any_bytes_load_or_raise_one_task_error(tmp_path, content):
    p = tmp_path / "bytes.json"
    p.write_bytes(content)
    try:
        _check_prompts(load_task(p), 1)
    except TaskError as e:
        assert_one_clear_error(e, p)


SPLIT_CONTENT = (
    st.sampled_from(["missing", "folder", "{", "[]", "{}"]) | st.lists(GOOD_ITEM, min_size=1, max_size=5) | TOP
)


@FAST
@given(splits=st.tuples(SPLIT_CONTENT, SPLIT_CONTENT, SPLIT_CONTENT))
def test_any_task_folder_loads_or_raises_one_task_error(tmp_path_factory, splits):
    d = tmp_path_factory.mktemp("data") / "folder_task"
    d.mkdir()
    for s, content in zip(SPLITS, splits):
        if content == "folder":
            (d / f"{s}.json").mkdir()
        elif content != "missing":
            (d / f"{s}.json").write_text(content if isinstance(content, str) else json.dumps(content))
    try:
        task = load_task("folder_task", data_dir=d.parent)
    except TaskError as e:
        assert_one_clear_error(e, d)
        return
    _check_prompts(task, 2)


PAIR = st.tuples(TEXT, TEXT)


@FAST
@given(demos=st.lists(PAIR, max_size=5), query=TEXT)
def test_build_prompt_is_demos_then_query(demos, query):
    p = build_prompt(demos, query)
    sep = {True: "", False: " "}  # no space before an answer that starts with a digit
    assert p == "".join(f"Q: {x}\nA:{sep[y[:1].isdigit()]}{y}\n\n" for x, y in demos) + f"Q: {query}\nA:"
    assert zero_shot_prompts([(query, "y")]) == [(f"Q: {query}\nA:", "y")]


@FAST
@given(pool=st.lists(PAIR, max_size=8), n_prompts=st.integers(-1, 4), n_shots=st.integers(-2, 6), seed=st.integers())
def test_sample_icl_prompts_shape_or_task_error(pool, n_prompts, n_shots, seed):
    try:
        out = sample_icl_prompts(pool, n_prompts, n_shots, random.Random(seed))
    except TaskError as e:
        assert "\n" not in str(e)
        assert n_shots < 0 or len(pool) < n_shots + 1
        return
    assert len(out) == max(0, n_prompts)
    demos = {format_demo(x, y) for x, y in pool}
    for p, a in out:
        query = [x for x, y in pool if y == a and p.endswith(format_query(x))]
        assert any(_splits_into(p[: -len(format_query(q))], demos, n_shots) for q in query)
    queries = pool[:3]
    try:
        out = sample_icl_prompts(pool, 99, n_shots, random.Random(seed), queries=queries)
    except TaskError:
        assert n_shots < 0 or len(pool) < n_shots
        return
    assert [a for _, a in out] == [y for _, y in queries]
    assert all(p.endswith(format_query(x)) for (p, _), (x, _) in zip(out, queries))
