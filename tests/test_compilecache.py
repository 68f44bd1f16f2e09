"""The persistent compilation cache (fxformer/compilecache.py): a second process reads the first
one's programs back (counted by JAX's own cache events, not timed), two processes can fill one
folder at once, and a folder other users could write code into is refused in one sentence."""

import json
import os
import subprocess
import sys

import pytest
from conftest import env_with_devices

from fxformer import compilecache
from fxformer.errors import UserError

# A run loaded and used as a notebook would: its programs (restore, beam search, scores) compiled,
# with JAX's cache events counted from the start; the counts, entries and output printed.
LOAD_AND_TRANSLATE = """import json, sys
from fxformer import compilecache
compilecache.enable(sys.argv[2])
counts = compilecache.Counts()
import fxformer
run = fxformer.load(sys.argv[1])
out = run.translate(["The old teacher has helped the boy.", "My mother sees the dog."], beam_size=2)
scores = run.score(["The dog sleeps."], ["Der Hund schläft."])
print(json.dumps({"hits": counts.hits, "misses": counts.misses, "out": out, "score": scores[0].log_prob}))
"""


def started(workdir, cache):
    env = env_with_devices(1)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the folder given is the one used,
    env.pop("JAX_COMPILATION_CACHE_MAX_SIZE", None)  # with the commands' size limit and its file lock
    return subprocess.Popen(
        [sys.executable, "-c", LOAD_AND_TRANSLATE, str(workdir), str(cache)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(process) -> dict:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    assert "compilation cache" not in err, err[-3000:]  # no entry failed to load or to be written
    return json.loads(out.splitlines()[-1])


@pytest.mark.slow  # three processes load a run and translate
def test_a_second_process_reuses_the_programs_two_processes_wrote_at_once(tiny_run, tmp_path):
    workdir = tiny_run(tmp_path / "w", 2)
    cache = tmp_path / "cache"
    first = [started(workdir, cache) for _ in range(2)]  # two at once, on an empty folder
    a, b = (finished(p) for p in first)
    assert a["out"] == b["out"] and a["score"] == b["score"]
    assert a["misses"] + b["misses"] > 0  # an empty folder: at least one of them compiled
    entries, size = compilecache.size(cache)
    assert entries > 0 and size > 0
    again = finished(started(workdir, cache))
    assert again["out"] == a["out"] and again["score"] == a["score"]
    assert again["misses"] == 0 and again["hits"] >= a["misses"]  # every program read back, none compiled
    assert compilecache.size(cache)[0] == entries  # and nothing new written


def test_the_folder_is_made_private_and_one_others_can_write_is_refused(tmp_path):
    made = compilecache.checked_folder(str(tmp_path / "new" / "cache"))
    assert made.is_dir() and made.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(UserError, match="can be written by other users") as refused:
        compilecache.settings(str(shared))
    assert f"chmod 700 {shared}" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(UserError, match="give a local folder"):
        compilecache.settings("gs://bucket/cache")
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="is not a folder"):
        compilecache.settings(str(tmp_path / "file"))
    assert compilecache.settings("off") == {"jax_enable_compilation_cache": False}
    on = compilecache.settings(str(made))
    assert on["jax_compilation_cache_dir"] == str(made)
    assert on["jax_persistent_cache_min_compile_time_secs"] == compilecache.MIN_COMPILE_S
    assert on["jax_compilation_cache_max_size"] == compilecache.MAX_BYTES


def test_the_default_folder_is_the_users_own_unless_named(monkeypatch, tmp_path):
    for name in (compilecache.ENV, "JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert compilecache.default_folder() == str(tmp_path / ".cache" / "fxformer" / "jax")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compilecache.default_folder() == str(tmp_path / "xdg" / "fxformer" / "jax")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/j")
    monkeypatch.setenv(compilecache.ENV, "/f")
    assert compilecache.default_folder() == "/f"


def test_every_compiling_command_takes_the_flag_and_off_turns_it_off(tmp_path):
    helped = subprocess.run(
        [sys.executable, "-m", "fxformer.translate", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--compilation_cache" in helped
    code = (
        "import sys, jax; from fxformer import inferflags; "
        "inferflags.parse(inferflags.parser('', 'x'), ['--workdir=w', '--compilation_cache=off']); "
        "print(jax.config.jax_enable_compilation_cache)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_with_devices(1))
    assert done.stdout.strip() == "False", done.stderr[-2000:]
