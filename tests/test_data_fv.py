"""``site-lens data fv``: the FV tasks from the SITE release, checked, atomic and resumable (offline).

A fake release is written into tmp_path in the release's layout and read as a folder, as a
file:// URL and over a loopback HTTP server; its item counts are the test's own (``expected``,
or ``fv.RELEASE`` patched for the command line). With the reference copy of the 45 tasks
present, that copy is served as the source and the output must equal it file by file.
"""

from __future__ import annotations

import errno
import hashlib
import http.server
import json
import os
import re
import socket
import threading
import urllib.error
import urllib.parse
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import FV_DIR

import site_lens
from site_lens.cli import main
from site_lens.locks import owner_tag
from site_lens.sources import SourceError, fetch, fv
from site_lens.tasks import ABSTRACTIVE, EXTRACTIVE, SPLITS, load_task

# task -> items per split; word_length's outputs are numbers, as in the real task
COUNTS = {"antonym": (6, 2, 3), "choose_first_of_3": (5, 1, 2), "word_length": (4, 2, 2)}
APACHE = "                                 Apache License\n                           Version 2.0, January 2004\n"
MIT = "MIT License\n\nCopyright (c) 2023 someone\n"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No proxy, and no test reaches the internet: the licences' own URLs (``fv.RAW``) point at a closed
    loopback port unless a test serves them."""
    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(fv, "RAW", f"http://127.0.0.1:{_closed_port()}")


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The waits between tries, recorded instead of slept."""
    waited: list[float] = []
    monkeypatch.setattr(fetch.time, "sleep", waited.append)
    return waited


def items(task: str, split: str, n: int) -> list[dict]:
    if task == "word_length":
        return [{"input": "x" * (i + 1), "output": i + 1} for i in range(n)]
    return [{"input": f"{task} {split} {i}", "output": f"out{i}"} for i in range(n)]


def make_release(root: Path, counts=COUNTS, licences: bool = True) -> dict[str, tuple]:
    """A fake release under ``root``; the expectations (counts and sha256 prefixes) of its files."""
    expected = {}
    for task, ns in counts.items():
        digests = []
        for split, n in zip(SPLITS, ns):
            path = root / "dataset" / task / f"{split}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(items(task, split, n), indent=2))
            digests.append(hashlib.sha256(path.read_bytes()).hexdigest()[:16])
        expected[task] = (*ns, *digests)
    if licences:
        (root / "LICENSE").write_text(APACHE)
        (root / "function_vectors").mkdir()
        (root / "function_vectors" / "LICENSE").write_text(MIT)
    return expected


@pytest.fixture
def serve():
    """start(root) -> (base URL, state): an HTTP server on 127.0.0.1 serving ``root``; state.requests lists the
    paths asked for, state.fail[path] the answers to give first (a status code, or (code, Retry-After)),
    state.truncate the paths cut short, state.stall[path] the seconds to wait before answering nothing,
    state.drop[path] how many times to close the connection without an answer."""
    servers = []

    def start(root: Path):
        state = SimpleNamespace(requests=[], fail={}, truncate=set(), stall={}, drop={})

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **k):
                super().__init__(*a, directory=str(root), **k)

            def log_message(self, *a):
                pass

            def do_GET(self):
                path = urllib.parse.unquote(self.path)
                state.requests.append(path)
                if state.fail.get(path):
                    answer = state.fail[path].pop(0)
                    code, after = answer if isinstance(answer, tuple) else (answer, None)
                    self.send_response(code)
                    if after is not None:
                        self.send_header("Retry-After", after)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif state.stall.get(path):
                    threading.Event().wait(state.stall[path])  # not time.sleep, which tests replace
                elif state.drop.get(path):
                    state.drop[path] -= 1  # closes the connection without an answer
                elif path in state.truncate:
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(b'[{"input": ')
                else:
                    super().do_GET()

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}", state

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("."))


def check_output(out: Path, release: Path, counts=COUNTS) -> None:
    for task, ns in counts.items():
        folder = out / task
        for split, n in zip(SPLITS, ns):
            assert (folder / f"{split}.json").read_bytes() == (
                release / "dataset" / task / f"{split}.json"
            ).read_bytes()
        meta = json.loads((folder / "meta.json").read_text())
        assert meta["category"] == ("abstractive" if task in ABSTRACTIVE else "extractive")
        assert meta["sizes"] == dict(zip(SPLITS, ns))
        assert meta["source"].endswith(f"/SNU-DRL/Soft_Injection/tree/{fv.RELEASE_COMMIT}/dataset/{task}")
        assert meta["task_data"].endswith(f"/dataset_files/{meta['category']}/{task}.json")
        assert {lic["spdx"] for lic in meta["licences"]} == {"Apache-2.0", "MIT"}
        for split in SPLITS:
            assert meta["sha256"][split] == hashlib.sha256((folder / f"{split}.json").read_bytes()).hexdigest()
            assert meta["files"][split].endswith(f"dataset/{task}/{split}.json")
        task_obj = load_task(task, data_dir=out)
        assert len(task_obj.test) == ns[2] and task_obj.meta["category"] == meta["category"]
    assert (out / "LICENSE-soft-injection.txt").read_text() == APACHE
    assert (out / "LICENSE-function-vectors.txt").read_text() == MIT
    readme = (out / "README.md").read_text()
    for task, (ntr, nva, nte) in counts.items():
        assert f"| {task} | " in readme and f" | {ntr} | {nva} | {nte} | " in readme
    assert "LICENSE-soft-injection.txt" in readme and "LICENSE-function-vectors.txt" in readme
    assert "Apache-2.0" in readme and "MIT" in readme and fv.RELEASE_COMMIT in readme
    assert leftovers(out) == []


# ---------------------------------------------------------------- sources


@pytest.mark.parametrize("kind", ["folder", "file-url"])
def test_local_mirror(kind, tmp_path):
    release = tmp_path / "release"
    expected = make_release(release)
    source = str(release) if kind == "folder" else release.as_uri()
    rows = fv.build_fv(tmp_path / "out", source=source, expected=expected)
    assert [r["status"] for r in rows] == ["downloaded"] * 3
    assert [r["task"] for r in rows] == sorted(COUNTS)
    check_output(tmp_path / "out", release)
    assert site_lens.load_task("word_length", data_dir=tmp_path / "out").test[0] == ("x", "1")  # numbers as text


def test_http_mirror_and_resume(tmp_path, serve, caplog):
    release = tmp_path / "release"
    expected = make_release(release)
    url, state = serve(release)
    out = tmp_path / "out"
    fv.build_fv(out, source=url + "/", expected=expected)
    check_output(out, release)
    assert len(state.requests) == 3 * len(COUNTS) + 2  # the splits and the two licences
    assert (
        json.loads((out / "antonym" / "meta.json").read_text())["files"]["test"] == f"{url}/dataset/antonym/test.json"
    )

    state.requests.clear()
    with caplog.at_level("INFO", logger="site_lens.sources.fv"):
        rows = fv.build_fv(out, source=url, expected=expected)
    assert state.requests == []  # nothing downloaded again
    assert [r["status"] for r in rows] == ["present"] * 3
    assert "antonym: already complete" in caplog.text
    check_output(out, release)


def test_a_server_error_is_retried(tmp_path, serve, sleeps):
    release = tmp_path / "release"
    expected = make_release(release, {"antonym": COUNTS["antonym"]})
    url, state = serve(release)
    state.fail["/dataset/antonym/valid.json"] = [503]
    fv.build_fv(tmp_path / "out", source=url, expected=expected)
    assert state.requests.count("/dataset/antonym/valid.json") == 2 and sleeps == [1]
    state.fail["/dataset/antonym/valid.json"] = [500] * fetch.ATTEMPTS
    with pytest.raises(SourceError, match=r"task antonym, valid.json: HTTP 500") as e:
        fv.build_fv(tmp_path / "out2", source=url, expected=expected)
    assert "\n" not in str(e.value) and sleeps == [1, 1, 2]
    assert list((tmp_path / "out2").iterdir()) == []  # no partial task folder, no temp


def test_retry_after_is_honoured_and_capped(tmp_path, serve, sleeps):
    release = tmp_path / "release"
    expected = make_release(release, {"antonym": COUNTS["antonym"]})
    url, state = serve(release)
    state.fail["/dataset/antonym/train.json"] = [(429, "0"), (503, "3600")]
    rows = fv.build_fv(tmp_path / "out", source=url, expected=expected)
    assert rows[0]["status"] == "downloaded" and sleeps == [0, fetch.RETRY_AFTER_MAX_S]
    assert state.requests.count("/dataset/antonym/train.json") == 3
    check_output(tmp_path / "out", release, {"antonym": COUNTS["antonym"]})


def test_a_client_error_is_not_retried(tmp_path, serve, sleeps, monkeypatch, capsys):
    release = tmp_path / "release"
    monkeypatch.setattr(fv, "RELEASE", make_release(release))
    url, state = serve(release)
    state.fail["/dataset/antonym/train.json"] = [403]
    out = tmp_path / "out"
    assert main(["data", "fv", "--out", str(out), "--tasks", "antonym", "--source", url]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == f"site-lens: error: task antonym, train.json: HTTP 403 Forbidden from {url}/dataset/antonym/train.json"
    )
    assert state.requests == ["/dataset/antonym/train.json"] and sleeps == []
    assert not out.exists()  # no empty folder left behind


def test_a_stalled_server_fails_after_the_tries(tmp_path, serve, sleeps):
    release = tmp_path / "release"
    expected = make_release(release, {"antonym": COUNTS["antonym"]})
    url, state = serve(release)
    state.stall["/dataset/antonym/train.json"] = 2.0
    out = tmp_path / "out"
    with pytest.raises(SourceError) as e:
        fv.build_fv(out, source=url, expected=expected, timeout=0.2)
    assert str(e.value) == (
        f"task antonym, train.json: reading {url}/dataset/antonym/train.json failed (no answer in 0.2 s, "
        f"{fetch.ATTEMPTS} tries); run the command again to resume"
    )
    assert state.requests == ["/dataset/antonym/train.json"] * fetch.ATTEMPTS and sleeps == [1, 2]
    assert list(out.iterdir()) == []


def test_a_dropped_connection_is_retried(tmp_path, serve, sleeps):
    release = tmp_path / "release"
    expected = make_release(release, {"antonym": COUNTS["antonym"]})
    url, state = serve(release)
    state.drop["/dataset/antonym/test.json"] = 1
    fv.build_fv(tmp_path / "out", source=url, expected=expected)
    assert state.requests.count("/dataset/antonym/test.json") == 2 and sleeps == [1]
    check_output(tmp_path / "out", release, {"antonym": COUNTS["antonym"]})


@pytest.mark.parametrize(
    ("reason", "tries"),
    [
        (TimeoutError("timed out"), fetch.ATTEMPTS),  # a connect timeout
        (ConnectionResetError(104, "Connection reset by peer"), fetch.ATTEMPTS),
        (ConnectionRefusedError(111, "Connection refused"), 1),  # nothing listens there: at once
        (socket.gaierror(-2, "Name or service not known"), 1),  # offline: at once
    ],
)
def test_which_connection_failures_are_retried(reason, tries, tmp_path, monkeypatch, sleeps):
    asked = []

    def failing(request, timeout):
        asked.append(request.full_url)
        raise urllib.error.URLError(reason)

    monkeypatch.setattr(fetch.urllib.request, "urlopen", failing)
    release = tmp_path / "release"
    expected = make_release(release, {"antonym": COUNTS["antonym"]})
    with pytest.raises(SourceError, match=r"^cannot reach example\.org \(.+\); connect to the internet"):
        fv.build_fv(tmp_path / "out", source="https://example.org/mirror", expected=expected)
    assert len(asked) == tries and len(sleeps) == tries - 1


def test_an_oversized_answer_is_refused(tmp_path, serve, monkeypatch):
    monkeypatch.setattr(fetch, "MAX_BYTES", 40)
    release = tmp_path / "release"
    expected = make_release(release, {"antonym": COUNTS["antonym"]})
    url, _ = serve(release)
    with pytest.raises(SourceError, match=r"task antonym, train.json: .*/train.json is over .*, not a data file"):
        fv.build_fv(tmp_path / "out", source=url, expected=expected)


def test_missing_licences_are_named_not_fatal(tmp_path, caplog):
    release = tmp_path / "release"
    expected = make_release(release, licences=False)
    with caplog.at_level("WARNING", logger="site_lens.sources.fv"):
        fv.build_fv(tmp_path / "out", source=release, expected=expected)
    readme = (tmp_path / "out" / "README.md").read_text()
    assert not (tmp_path / "out" / "LICENSE-soft-injection.txt").exists()
    assert (
        "github.com/SNU-DRL/Soft_Injection/blob/" in readme and "github.com/ericwtodd/function_vectors/blob/" in readme
    )
    for name in ("LICENSE-soft-injection.txt", "LICENSE-function-vectors.txt"):  # the mirror, then the licence's URL
        assert f"{name} not written (cannot reach 127.0.0.1:" in caplog.text


def test_a_clone_of_the_release_gets_the_function_vectors_licence_from_its_repository(tmp_path, serve, monkeypatch):
    release = tmp_path / "release"
    expected = make_release(release)
    (release / "function_vectors" / "LICENSE").unlink()  # a clone of the release has LICENSE only
    (release / "function_vectors").rmdir()
    licences = tmp_path / "raw" / fv.FV_REPO / fv.FV_COMMIT
    licences.mkdir(parents=True)
    (licences / "LICENSE").write_text(MIT)
    url, state = serve(tmp_path / "raw")
    monkeypatch.setattr(fv, "RAW", url)
    fv.build_fv(tmp_path / "out", source=release, expected=expected)
    check_output(tmp_path / "out", release)
    assert state.requests == [f"/{fv.FV_REPO}/{fv.FV_COMMIT}/LICENSE"]


# ---------------------------------------------------------------- atomic, checked


def test_a_source_failing_mid_task_leaves_no_partial_folder(tmp_path, serve, sleeps):
    release = tmp_path / "release"
    expected = make_release(release)
    url, state = serve(release)
    state.truncate.add("/dataset/choose_first_of_3/test.json")  # its train and valid arrive first
    out = tmp_path / "out"
    with pytest.raises(
        SourceError, match=r"task choose_first_of_3, test.json: reading .* failed \(IncompleteRead"
    ) as e:
        fv.build_fv(out, source=url, expected=expected)
    assert "\n" not in str(e.value) and state.requests.count("/dataset/choose_first_of_3/test.json") == fetch.ATTEMPTS
    assert sorted(p.name for p in out.iterdir()) == ["antonym"]  # the task before it is complete; nothing else
    assert "/dataset/choose_first_of_3/train.json" in state.requests

    state.truncate.clear()
    state.requests.clear()
    rows = fv.build_fv(out, source=url, expected=expected)  # resumes
    assert [r["status"] for r in rows] == ["present", "downloaded", "downloaded"]
    assert not any(r.startswith("/dataset/antonym/") for r in state.requests)
    check_output(out, release)


def _corrupt(path: Path, kind: str) -> None:
    data = json.loads(path.read_text())
    if kind == "count":
        data = data[:-1]
    elif kind == "not a list":
        data = {"items": data}
    elif kind == "missing key":
        del data[1]["output"]
    elif kind == "sha256":
        data[0]["output"] = "changed"
    elif kind == "json":
        path.write_text(json.dumps(data)[:-3])
        return
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("count", "task antonym, valid.json: 1 items, expected 2"),
        ("not a list", 'task antonym, valid.json: expected a JSON list of {"input", "output"} objects, got dict'),
        ("missing key", "task antonym, valid.json: item 1 lacks key(s) ['output']"),
        ("json", "task antonym, valid.json: invalid JSON"),
        ("sha256", "task antonym, valid.json: sha256 "),
    ],
)
def test_a_bad_file_is_a_one_line_error(kind, message, tmp_path):
    release = tmp_path / "release"
    expected = make_release(release)
    _corrupt(release / "dataset" / "antonym" / "valid.json", kind)
    out = tmp_path / "out"
    with pytest.raises(SourceError) as e:
        fv.build_fv(out, source=release, expected=expected)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert leftovers(out) == [] and not (out / "antonym").exists()


def test_a_bad_file_through_the_command_line(tmp_path, monkeypatch, capsys):
    release = tmp_path / "release"
    make_release(release)
    monkeypatch.setattr(fv, "RELEASE", {"antonym": (6, 3, 3)})  # the release says 3 valid items, the mirror has 2
    rc = main(["data", "fv", "--out", str(tmp_path / "out"), "--tasks", "antonym", "--source", str(release)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("site-lens: error: task antonym, valid.json: 2 items, expected 3"), err
    assert len(err.splitlines()) == 1 and not (tmp_path / "out" / "antonym").exists()


def test_the_command_line(tmp_path, monkeypatch, capsys):
    release = tmp_path / "release"
    monkeypatch.setattr(fv, "RELEASE", make_release(release))
    argv = ["data", "fv", "--out", str(tmp_path / "out"), "--tasks", "antonym,word_length", "--source", str(release)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "antonym" in out and "downloaded" in out and "2 task folders downloaded, 0 already there" in out
    assert main(argv) == 0
    assert "0 task folders downloaded, 2 already there" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_dir()) == ["antonym", "word_length"]


# ---------------------------------------------------------------- offline


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_source_is_one_line(tmp_path, capsys):
    port = _closed_port()
    out = tmp_path / "out"
    rc = main(["data", "fv", "--out", str(out), "--tasks", "antonym", "--source", f"http://127.0.0.1:{port}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"site-lens: error: cannot reach 127.0.0.1:{port} (")
    assert err.endswith("connect to the internet or pass --source (a mirror: URL or folder)")
    assert not out.exists()  # no empty folder left behind


def test_the_default_source_is_the_pinned_release(tmp_path, monkeypatch, capsys):
    asked = []

    def offline(request, timeout):
        asked.append((request.full_url, timeout))
        raise urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution"))

    monkeypatch.setattr(fetch.urllib.request, "urlopen", offline)
    assert main(["data", "fv", "--out", str(tmp_path / "out" / "fv"), "--tasks", "country-capital"]) == 2
    assert not (tmp_path / "out").exists()
    err = capsys.readouterr().err.strip()
    assert err == (
        "site-lens: error: cannot reach raw.githubusercontent.com (Temporary failure in name resolution); "
        "connect to the internet or pass --source (a mirror: URL or folder)"
    )
    assert asked == [
        (
            f"https://raw.githubusercontent.com/SNU-DRL/Soft_Injection/{fv.RELEASE_COMMIT}/dataset/country-capital/train.json",
            fetch.TIMEOUT_S,
        )
    ]


# ---------------------------------------------------------------- folders already there


def test_a_foreign_folder_needs_overwrite(tmp_path):
    release = tmp_path / "release"
    expected = make_release(release, {"antonym": COUNTS["antonym"]})
    out = tmp_path / "out"
    (out / "antonym").mkdir(parents=True)
    (out / "antonym" / "train.json").write_text('[{"input": "a", "output": "b"}]')
    with pytest.raises(SourceError, match=r"antonym exists and is not the release's antonym .*--overwrite"):
        fv.build_fv(out, source=release, expected=expected)
    assert (out / "antonym" / "train.json").read_text() == '[{"input": "a", "output": "b"}]'
    rows = fv.build_fv(out, source=release, expected=expected, overwrite=True)
    assert rows[0]["status"] == "downloaded" and leftovers(out) == []
    check_output(out, release, {"antonym": COUNTS["antonym"]})


def test_release_files_without_meta_get_one(tmp_path, serve):
    release = tmp_path / "release"
    expected = make_release(release, {"antonym": COUNTS["antonym"]})
    url, state = serve(release)
    out = tmp_path / "out"
    (out / "antonym").mkdir(parents=True)
    for split in SPLITS:
        (out / "antonym" / f"{split}.json").write_bytes(
            (release / "dataset" / "antonym" / f"{split}.json").read_bytes()
        )
    rows = fv.build_fv(out, source=url, expected=expected)
    assert rows[0]["status"] == "meta.json written"
    assert not any(r.startswith("/dataset/") for r in state.requests)
    check_output(out, release, {"antonym": COUNTS["antonym"]})


HOST = owner_tag().rsplit(".", 1)[0]
DEAD = f"{HOST}.99999999"  # the owner tag of a process of this host that is gone (no such pid)
LIVE = f"{HOST}.{os.getppid()}"  # another live process's: the one that started the tests


def test_a_killed_runs_temp_folder_is_removed(tmp_path):
    release = tmp_path / "release"
    expected = make_release(release, {"antonym": COUNTS["antonym"]})
    out = tmp_path / "out"
    dead = [out / f".antonym.{DEAD}.fv.tmp", out / f".antonym.{DEAD}.old-fv.tmp", out / f".README.md.{DEAD}.fv.tmp"]
    live = [out / f".word_length.{LIVE}.fv.tmp", out / f".README.md.{LIVE}.fv.tmp"]  # still being written
    for d in dead[:2] + live[:1]:
        d.mkdir(parents=True, exist_ok=True)
    for f in dead[2:] + live[1:]:
        f.write_text("partial")
    fv.build_fv(out, source=release, expected=expected)
    assert not any(d.exists() for d in dead) and all(p.exists() for p in live)


def test_temp_files_inside_task_folders_are_swept(tmp_path):
    release = tmp_path / "release"
    expected = make_release(release, {"antonym": COUNTS["antonym"]})
    out = tmp_path / "out"
    fv.build_fv(out, source=release, expected=expected)
    dead, live = out / "antonym" / f".meta.json.{DEAD}.fv.tmp", out / "antonym" / f".meta.json.{LIVE}.fv.tmp"
    for f in (dead, live):
        f.write_text("{")
    assert fv.build_fv(out, source=release, expected=expected)[0]["status"] == "present"
    assert not dead.exists() and live.exists()


def test_a_users_meta_json_is_kept_without_overwrite(tmp_path):
    release = tmp_path / "release"
    expected = make_release(release, {"antonym": COUNTS["antonym"]})
    out = tmp_path / "out"
    (out / "antonym").mkdir(parents=True)
    for split in SPLITS:
        (out / "antonym" / f"{split}.json").write_bytes(
            (release / "dataset" / "antonym" / f"{split}.json").read_bytes()
        )
    mine = '{"category": "abstractive", "note": "mine"}'
    (out / "antonym" / "meta.json").write_text(mine)
    assert fv.build_fv(out, source=release, expected=expected)[0]["status"] == "present"
    assert (out / "antonym" / "meta.json").read_text() == mine
    rows = fv.build_fv(out, source=release, expected=expected, overwrite=True)
    assert rows[0]["status"] == "meta.json written"
    check_output(out, release, {"antonym": COUNTS["antonym"]})


def test_overwrite_replaces_a_file_where_the_task_folder_goes(tmp_path):
    release = tmp_path / "release"
    expected = make_release(release, {"antonym": COUNTS["antonym"]})
    out = tmp_path / "out"
    out.mkdir()
    (out / "antonym").write_text("not a folder")
    with pytest.raises(SourceError, match="not a folder"):
        fv.build_fv(out, source=release, expected=expected)
    assert fv.build_fv(out, source=release, expected=expected, overwrite=True)[0]["status"] == "downloaded"
    check_output(out, release, {"antonym": COUNTS["antonym"]})  # no .old-fv.tmp left


def test_a_folder_mirror_is_recorded_as_given(tmp_path, monkeypatch):
    release = tmp_path / "release"
    expected = make_release(release, {"antonym": COUNTS["antonym"]})
    monkeypatch.chdir(tmp_path)
    fv.build_fv(Path("out"), source="release/", expected=expected)
    text = (tmp_path / "out" / "antonym" / "meta.json").read_text()
    meta = json.loads(text)
    assert meta["fetched_from"] == "release" and meta["files"]["test"] == "release/dataset/antonym/test.json"
    assert str(tmp_path) not in text and str(tmp_path) not in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.parametrize("failure", ["no space for a task", "no space for a licence", "read-only folder"])
def test_a_write_error_is_one_line(failure, tmp_path, monkeypatch):
    release = tmp_path / "release"
    expected = make_release(release, {"antonym": COUNTS["antonym"]})
    out = tmp_path / "out"
    out.mkdir()
    at = re.escape(str(out))

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if failure == "no space for a task":
        monkeypatch.setattr(Path, "write_bytes", no_space)
        match = rf"^cannot write {at}/\.antonym\..*\.fv\.tmp/train\.json \(No space left on device\)$"
    elif failure == "no space for a licence":
        monkeypatch.setattr(fv.os, "replace", no_space)
        match = rf"^cannot write {at}/LICENSE-soft-injection\.txt \(No space left on device\)$"
    else:
        out.chmod(0o500)
        if os.geteuid() == 0:  # a mode does not stop root: the folder's refusal is raised where it would come
            mkdir = os.mkdir

            def refused(path, *args, **kwargs):
                if Path(path).parent == out:
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
                return mkdir(path, *args, **kwargs)

            monkeypatch.setattr(os, "mkdir", refused)
        match = rf"^cannot write {at}/\.antonym\..*\.fv\.tmp \(Permission denied\)$"
    try:
        with pytest.raises(SourceError, match=match) as e:
            fv.build_fv(out, source=release, expected=expected)
    finally:
        out.chmod(0o700)
    assert "\n" not in str(e.value)
    if failure == "no space for a licence":  # the task went in whole before the licence failed
        assert [p.name for p in out.iterdir()] == ["antonym"]
    else:
        assert list(out.iterdir()) == []


def test_a_bad_request_makes_no_folder(tmp_path, capsys):
    release = tmp_path / "release"
    make_release(release)
    out = tmp_path / "out"
    assert main(["data", "fv", "--out", str(out), "--tasks", "nope", "--source", str(release)]) == 2
    assert "unknown FV task(s) nope" in capsys.readouterr().err
    assert main(["data", "fv", "--out", str(out), "--source", str(tmp_path / "missing")]) == 2
    assert "no dataset/ folder" in capsys.readouterr().err
    assert not out.exists()


def test_bad_requests(tmp_path):
    release = tmp_path / "release"
    expected = make_release(release, {"antonym": COUNTS["antonym"]})
    with pytest.raises(SourceError, match="unknown FV task"):
        fv.build_fv(tmp_path / "out", tasks=["antonym", "nope"], source=release, expected=expected)
    with pytest.raises(SourceError, match="no FV task named"):
        fv.build_fv(tmp_path / "out", tasks=[], source=release, expected=expected)
    with pytest.raises(SourceError, match="no dataset/ folder"):
        fv.build_fv(tmp_path / "out", source=tmp_path, expected=expected)
    with pytest.raises(SourceError, match="give an http"):
        fv.build_fv(tmp_path / "out", source="ftp://example.org/x", expected=expected)
    with pytest.raises(SourceError, match="unknown FV task.*known: adjective_v_verb_3"):
        fv.build_fv(tmp_path / "out", tasks=["synonym"], source=release)  # in the release, not in the 45


def test_help_has_an_example(capsys):
    with pytest.raises(SystemExit):
        main(["data", "fv", "--help"])
    text = capsys.readouterr().out
    assert "site-lens data fv --out data/fv" in text and "--source" in text


# ---------------------------------------------------------------- the real 45


def test_release_table_covers_the_45_tasks():
    assert set(fv.RELEASE) == ABSTRACTIVE | EXTRACTIVE and len(fv.RELEASE) == 45


@pytest.mark.skipif(not FV_DIR.is_dir(), reason="the reference copy of the FV tasks is not present")
def test_the_reference_copy_served_as_the_release(tmp_path, serve):
    mirror = tmp_path / "mirror"
    (mirror / "function_vectors").mkdir(parents=True)
    os.symlink(FV_DIR, mirror / "dataset")
    os.symlink(FV_DIR / "LICENSE-soft-injection.txt", mirror / "LICENSE")
    os.symlink(FV_DIR / "LICENSE-function-vectors.txt", mirror / "function_vectors" / "LICENSE")
    for task, spec in fv.RELEASE.items():  # the embedded facts are the reference copy's
        for i, split in enumerate(SPLITS):
            data = (FV_DIR / task / f"{split}.json").read_bytes()
            assert len(json.loads(data)) == spec[i], (task, split)
            assert hashlib.sha256(data).hexdigest().startswith(spec[3 + i]), (task, split)
    url, state = serve(mirror)
    out = tmp_path / "out"
    rows = fv.build_fv(out, source=url)
    assert len(rows) == 45 and len(state.requests) == 3 * 45 + 2
    for task in fv.RELEASE:
        for split in SPLITS:
            assert (out / task / f"{split}.json").read_bytes() == (FV_DIR / task / f"{split}.json").read_bytes()
    for name in ("LICENSE-soft-injection.txt", "LICENSE-function-vectors.txt"):
        assert (out / name).read_bytes() == (FV_DIR / name).read_bytes()
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(p.name for p in FV_DIR.iterdir() if p.is_dir())
    assert leftovers(out) == []
    assert len(load_task("antonym", data_dir=out).train) == fv.RELEASE["antonym"][0]
