"""The training processes' interpreter (roles/launcher/templates/dt-train-python.j2; issue 40): on the master
the launcher user reaches the training user through sudo, which replaces PATH (secure_path) and drops LD_* and
PYTHONHOME among others (env_delete) even with -E. The wrapper carries the names a job's dt_train_env may set
across and puts them back. Run here with stand-ins for `id` and `sudo` that do what the real ones do to the
environment: the wrapper itself is the rendered template, run by /bin/sh."""
from __future__ import annotations

import os
import shlex
import stat
import subprocess

import jinja2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TEMPLATE = os.path.join(ROOT, "roles", "launcher", "templates", "dt-train-python.j2")
# What sudo's default env_delete removes, of the names a training job may set (sudo's env.c badenv table).
SUDO_DROPS = ["LD_LIBRARY_PATH", "LD_PRELOAD", "LD_BIND_NOW", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONPATH"]


def executable(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def install(tmp_path):
    """The rendered wrapper, the `python` it ends in (prints its environment and arguments), and a bin folder
    with `id` (the user is $FAKE_USER) and `sudo` (the target user's identity, a secure_path, env_delete)."""
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    wrapper = str(tmp_path / "dt-train-python")
    # a shell stand-in: a real Python would not start with the test's PYTHONHOME
    python = executable(tmp_path / "python", '#!/bin/sh\nenv -0\nprintf "\\001%s" "$@"\n')
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["quote"] = shlex.quote
    text = env.from_string(open(TEMPLATE, encoding="utf-8").read()).render(
        ansible_managed="test", launcher_train_user="dynatrain-train", launcher_user="dynatrain-launcher",
        launcher_train_python=wrapper, launcher_python=python)
    executable(wrapper, text)
    executable(fakebin / "id", '#!/bin/sh\necho "$FAKE_USER"\n')
    unset = " ".join("-u %s" % name for name in SUDO_DROPS)
    executable(fakebin / "sudo", '#!/bin/sh\n'
               '# sudo -n -E -u USER -- PROG ARGS...\n'
               'while [ "$1" != "--" ]; do if [ "$1" = "-u" ]; then shift; target=$1; fi; shift; done; shift\n'
               'exec env %s FAKE_USER="$target" PATH=%s:/usr/sbin:/usr/bin:/sbin:/bin "$@"\n' % (unset, fakebin))
    return wrapper, str(fakebin)


def run(wrapper, env):
    out = subprocess.run([wrapper, "train.py", "--flag=a b"], env=env, capture_output=True, text=True, timeout=30,
                         check=True)
    env_part, *args = out.stdout.split("\x01")
    return {"env": dict(item.split("=", 1) for item in env_part.split("\0") if item), "argv": args}


def test_the_launcher_users_environment_reaches_the_training_process(tmp_path):
    wrapper, fakebin = install(tmp_path)
    job = {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64", "LD_PRELOAD": "/usr/lib/libjemalloc.so.2",
           "LD_BIND_NOW": "1", "PYTHONPATH": "/opt/job/lib", "PYTHONHOME": "/opt/py",
           "PYTHONUSERBASE": "/opt/job/user", "MY_SECRET": "s3cr3t"}
    path = "%s:/opt/job/bin:/usr/bin:/bin" % fakebin
    seen = run(wrapper, dict(job, PATH=path, FAKE_USER="dynatrain-launcher"))
    got = seen["env"]
    assert {name: got.get(name) for name in job} == job
    assert got["PATH"] == path and got["USER"] == got["LOGNAME"] == "dynatrain-train"
    assert not [name for name in got if name.startswith("DT_TRAIN_")], got
    assert seen["argv"] == ["train.py", "--flag=a b"]


def test_unset_names_stay_unset_and_a_session_of_the_training_user_is_left_as_it_is(tmp_path):
    wrapper, fakebin = install(tmp_path)
    seen = run(wrapper, {"PATH": "%s:/usr/bin:/bin" % fakebin, "FAKE_USER": "dynatrain-launcher"})
    assert not [name for name in SUDO_DROPS if name in seen["env"]], seen["env"]
    # over SSH the session is the training user's: no sudo, the environment as it came
    seen = run(wrapper, {"PATH": "%s:/usr/bin:/bin" % fakebin, "FAKE_USER": "dynatrain-train",
                         "LD_PRELOAD": "/usr/lib/libtcmalloc.so"})
    assert seen["env"]["LD_PRELOAD"] == "/usr/lib/libtcmalloc.so" and seen["env"]["USER"] == "dynatrain-train"


def test_a_value_is_carried_as_data_never_run(tmp_path):
    wrapper, fakebin = install(tmp_path)
    marker = tmp_path / "ran"
    hostile = "$(touch %s)`touch %s`;touch %s" % (marker, marker, marker)
    seen = run(wrapper, {"PATH": "%s:/usr/bin:/bin" % fakebin, "FAKE_USER": "dynatrain-launcher",
                         "PYTHONPATH": hostile})
    assert seen["env"]["PYTHONPATH"] == hostile and not marker.exists()
