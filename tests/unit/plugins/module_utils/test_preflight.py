"""The pure rules of playbooks/preflight.yml (plugins/module_utils/preflight.py)."""
from __future__ import annotations

import pytest

from ansible_collections.dynatrain.elastic.plugins.module_utils.preflight import admin_cidr_problem, choose_az


@pytest.mark.parametrize("cidr", ["203.0.113.7/32", "198.51.100.0/24", "10.0.0.0/16", "127.0.0.0/8", "127.77.0.0/16"])
def test_admin_cidr_accepted(cidr):
    assert admin_cidr_problem(cidr) == ""


@pytest.mark.parametrize(
    "cidr, needles",
    [
        ("203.0.113.7/0", ["whole internet", "at least /16", "-e dt_admin_cidr=203.0.113.7/32"]),
        ("0.0.0.0/0", ["whole internet", "at least /16"]),
        ("0.0.0.0/1", ["large part of the internet", "at least /16"]),
        ("10.0.0.0/8", ["16777216 addresses", "at least /16"]),
        ("10.0.0.5/24", ["host bits", "network is 10.0.0.0/24", "-e dt_admin_cidr=10.0.0.0/24", "-e dt_admin_cidr=10.0.0.5/32"]),
        ("203.0.113.7", ["no prefix length", "-e dt_admin_cidr=203.0.113.7/32"]),
        ("", ["not set", "-e dt_admin_cidr=203.0.113.7/32"]),
        (None, ["not set"]),
        ("my-office", ["not an IPv4 CIDR"]),
        ("2001:db8::/64", ["not an IPv4 CIDR"]),
        ("300.1.2.3/32", ["not an IPv4 CIDR"]),
    ],
)
def test_admin_cidr_refused_with_what_to_pass(cidr, needles):
    problem = admin_cidr_problem(cidr)
    assert problem.startswith("dt_admin_cidr")
    for needle in needles:
        assert needle in problem


ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]
OFFERS = {
    "c5.xlarge": ["us-east-1c", "us-east-1a", "us-east-1b"],
    "g4dn.xlarge": ["us-east-1b", "us-east-1c"],
    "p4d.24xlarge": ["us-east-1a"],
}


def test_choose_az_first_common_zone_by_name():
    assert choose_az(OFFERS, ["c5.xlarge"], ZONES) == "us-east-1a"
    assert choose_az(OFFERS, ["c5.xlarge", "g4dn.xlarge"], ZONES) == "us-east-1b"
    assert choose_az(OFFERS, ["g4dn.xlarge", "c5.xlarge", "c5.xlarge"], list(reversed(ZONES))) == "us-east-1b"


def test_choose_az_ignores_zones_not_available():
    assert choose_az(OFFERS, ["c5.xlarge"], ["us-east-1c", "us-east-1b"]) == "us-east-1b"


def test_choose_az_keeps_a_wanted_zone_that_offers_all():
    assert choose_az(OFFERS, ["c5.xlarge", "g4dn.xlarge"], ZONES, wanted="us-east-1c") == "us-east-1c"


def test_choose_az_type_offered_nowhere():
    with pytest.raises(ValueError, match=r"m9\.huge not offered in any availability zone in us-east-1: choose other types"):
        choose_az(OFFERS, ["c5.xlarge", "m9.huge"], ZONES, region="us-east-1")


def test_choose_az_no_common_zone():
    expected = r"no availability zone in us-east-1 offers every instance type \(g4dn.xlarge: us-east-1b, us-east-1c; p4d.24xlarge: us-east-1a\)"
    with pytest.raises(ValueError, match=expected):
        choose_az(OFFERS, ["g4dn.xlarge", "p4d.24xlarge"], ZONES, region="us-east-1")


def test_choose_az_wanted_zone_lacks_a_type():
    with pytest.raises(ValueError, match=r"g4dn.xlarge not offered in us-east-1a: use -e dt_availability_zone=us-east-1b"):
        choose_az(OFFERS, ["c5.xlarge", "g4dn.xlarge"], ZONES, wanted="us-east-1a")


def test_choose_az_wanted_zone_unknown():
    with pytest.raises(ValueError, match=r"us-east-1z is not an available zone in us-east-1 \(available: us-east-1a, us-east-1b, us-east-1c\)"):
        choose_az(OFFERS, ["c5.xlarge"], ZONES, wanted="us-east-1z", region="us-east-1")


# -- the settings a user types (settings_problems, script_args) ------------------------------------
from ansible_collections.dynatrain.elastic.plugins.module_utils import preflight as pf  # noqa: E402
from ansible_collections.dynatrain.elastic.plugins.module_utils.gpu_select import mxnet_gpu_kernels  # noqa: E402

# The local inventory's defaults (inventories/local/group_vars/all/dynatrain.yml): no problem.
DEFAULTS = {
    "dt_cluster_name": "dtdemo", "dt_train_script_args": ["--epochs", "10"], "dt_resize_at": "step",
    "dt_engine": "mxnet", "dt_master_instance_type": "c5.xlarge", "dt_worker_instance_type": "c5.xlarge",
    "dt_job_name": "job", "dt_checkpoint_bucket": "", "dt_vpc_cidr": "127.77.0.0/16",
    "dt_subnet_cidr": "127.77.1.0/24", "worker_count": 1, "min_workers": 1, "max_workers": 8,
}


def only_problem(**settings):
    problems = pf.settings_problems(dict(DEFAULTS, **settings))
    assert len(problems) == 1, problems
    return problems[0]


def test_the_defaults_and_unset_settings_pass():
    assert pf.settings_problems(DEFAULTS) == []
    assert pf.settings_problems({}) == []
    assert pf.settings_problems({name: None for name in list(DEFAULTS) + list(pf.WHOLE_NUMBERS)}) == []


@pytest.mark.parametrize("value, expected", [
    (["--epochs", "20"], ["--epochs", "20"]),                          # -e '{"dt_train_script_args": [...]}'
    (["--epochs", 20, "--lr", 0.1], ["--epochs", "20", "--lr", "0.1"]),  # YAML numbers
    ('["--epochs","20"]', ["--epochs", "20"]),                          # -e 'dt_train_script_args=["--epochs","20"]'
    (' [ "--epochs" , "20" ] ', ["--epochs", "20"]),
    ("['--epochs', '20']", ["--epochs", "20"]),                          # a Python-style list
    ("--epochs 20 --lr 0.1", ["--epochs", "20", "--lr", "0.1"]),        # a shell-like line
    ("--note 'two words' --x=\"a b\"", ["--note", "two words", "--x=a b"]),
    ("", []), (None, []), ([], []),
])
def test_script_args_in_each_form(value, expected):
    assert pf.script_args(value) == expected
    assert pf.settings_problems(dict(DEFAULTS, dt_train_script_args=value)) == []


def test_script_args_split_as_job_array_rows_are():
    from ansible_collections.dynatrain.elastic.plugins.module_utils import job_array
    line = "--epochs 3 --note 'a b'"
    rows, problems = job_array.parse_manifest(f'region,name,workers,args\nus-east-1,a,1,"{line}"\n')
    assert problems == [] and rows[0]["args"] == pf.script_args(line) == pf.split_args(line)


@pytest.mark.parametrize("options, value, expected", [
    # -e 'dt_train_script_args=--epochs 20 --lr 0.1': Ansible keeps '--epochs' (and drops the rest)
    (["dt_train_script_args=--epochs 20 --lr 0.1"], "--epochs", ["--epochs", "20", "--lr", "0.1"]),
    # ... and '--lr=0.1' would even become a variable of its own
    (["dt_train_script_args=--epochs 20 --lr=0.1"], "--epochs", ["--epochs", "20", "--lr=0.1"]),
    # -e 'dt_train_script_args=["--epochs", "20"]' (a space after the comma): Ansible keeps '["--epochs",'
    (['dt_train_script_args=["--epochs", "20"]'], '["--epochs",', ["--epochs", "20"]),
    # quoted as a whole: Ansible keeps it whole, without the quotes
    (["dt_train_script_args='--epochs 20 --note \"a b\"'"], '--epochs 20 --note "a b"',
     ["--epochs", "20", "--note", "a b"]),
    (["dt_train_script_args=--note 'a b'"], "--note", ["--note", "a b"]),
    # the last -e that sets it counts; a later JSON -e (its value is not the typed line's first word) wins
    (["dt_train_script_args=--a 1", "dt_train_script_args=--b 2"], "--b", ["--b", "2"]),
    (["dt_train_script_args=--a 1", '{"dt_train_script_args": "--c 3"}'], "--c 3", ["--c", "3"]),
    (["dt_train_script_args=--a 1"], ["--c", "3"], ["--c", "3"]),
    # other options are not its
    (["worker_count=2", "dt_job_name=x"], "--epochs 5", ["--epochs", "5"]),
])
def test_script_args_take_the_line_as_typed(options, value, expected):
    typed = pf.typed_value("dt_train_script_args", options)
    assert pf.script_args(value, typed=typed) == expected
    assert pf.settings_problems(dict(DEFAULTS, dt_train_script_args=value), options) == []


@pytest.mark.parametrize("options, needles", [
    (["dt_job_name=a b"], ["-e 'dt_job_name=a b': Ansible's key=value form ends a value at a space, so 'b' would "
                           "be dropped", "-e 'dt_job_name=\"a b\"'"]),
    (["count=2 3"], ["so '3' would be dropped", "-e 'count=\"2 3\"'"]),
    (["worker_count=1 --lr=0.1"], ["'--lr=0.1'"]),
])
def test_words_ansible_would_drop_are_refused(options, needles):
    problems = pf.settings_problems(DEFAULTS, options)
    assert len(problems) == 1, problems
    for needle in needles:
        assert needle in problems[0]


@pytest.mark.parametrize("options", [["count=2 keep_failed=true"], ['{"dt_job_name": "a b"}'], ["@vars.yml"],
                                     ["dt_train_script_args=--epochs 20 --lr 0.1"], ["dt_job_name='x'"]])
def test_words_that_are_kept(options):
    assert pf.dropped_words_problems(options, ("dt_train_script_args",)) == []


@pytest.mark.parametrize("value, needles", [
    ("[--epochs", ["dt_train_script_args=[--epochs starts with '[' but is not a JSON list",
                   "-e '{\"dt_train_script_args\": [\"--epochs\", \"20\"]}'"]),
    ('["--epochs", 20', ["is not a JSON list"]),
    ("--note 'unclosed", ["cannot be split like a shell line (No closing quotation)", "close the quote"]),
    ({"epochs": 20}, ["dt_train_script_args is {'epochs': 20} (a mapping)", "give the script's arguments as a list"]),
    (20, ["dt_train_script_args is 20 (a number)"]),
    (["--shuffle", True], ["dt_train_script_args item 1 is True (a boolean)", "quote it"]),
    (["--x", ["a"]], ["item 1 is ['a'] (a list)"]),
    ('[["a"]]', ["item 0 is ['a'] (a list)"]),
])
def test_script_args_refused_with_what_to_type(value, needles):
    with pytest.raises(ValueError) as caught:
        pf.script_args(value)
    problem = only_problem(dt_train_script_args=value)
    assert problem == str(caught.value)
    for needle in needles:
        assert needle in problem


@pytest.mark.parametrize("url", ["s3://dynatrain-checkpoints-123456789012/dtdemo/job/",
                                 "s3://my.bucket-1/e2eelastic/job", "s3://abc/C-1/run.2_b/"])
def test_resume_from_accepted(url):
    assert pf.resume_from_problem(url) == ""
    assert pf.settings_problems(dict(DEFAULTS, resume_from=url)) == []


@pytest.mark.parametrize("url, needles", [
    ("s3://bucket/cluster", ["resume_from=s3://bucket/cluster is not an S3 job prefix",
                             "-e resume_from=s3://<bucket>/<cluster>/<job>/"]),
    ("bucket/cluster/job/", ["is not an S3 job prefix"]),
    ("s3://bucket/cluster/job/extra/", ["is not an S3 job prefix"]),
    ("https://bucket.s3.amazonaws.com/c/j/", ["is not an S3 job prefix"]),
    ("s3://My_Bucket/c/job/", ["the bucket 'My_Bucket' is not valid", "lower-case letters"]),
    ("s3://ab/c/job/", ["the bucket 'ab' is not valid"]),
    ("s3://bucket/9lives/job/", ["'9lives' is not a cluster name"]),
    ("s3://bucket/c/my job/", ["'my job' is not a job name"]),
])
def test_resume_from_refused(url, needles):
    problem = only_problem(resume_from=url)
    for needle in needles:
        assert needle in problem


@pytest.mark.parametrize("bucket", ["abc", "dynatrain-checkpoints-123456789012", "my.team.bucket", "a" * 63])
def test_bucket_accepted(bucket):
    assert pf.bucket_problem(bucket) == ""


@pytest.mark.parametrize("bucket, needles", [
    ("My_Bucket", ["dt_checkpoint_bucket=My_Bucket is not a valid bucket name", "lower-case letters",
                   "-e dt_checkpoint_bucket=my-bucket", "or leave it empty"]),
    ("ab", ["3 to 63"]),
    ("a" * 64, ["3 to 63"]),
    ("-abc", ["beginning and ending"]),
    ("a..b", ["without '..'"]),
    ("192.168.5.4", ["cannot look like an IP address"]),
    ("xn--abc", ["S3 reserves the prefixes"]),
    ("sthree-abc", ["S3 reserves the prefixes"]),
    ("abc-s3alias", ["and the suffixes"]),
    ("abc--ol-s3", ["and the suffixes"]),
    ("s3://abc", ["is not a valid bucket name"]),
])
def test_bucket_refused(bucket, needles):
    problem = only_problem(dt_checkpoint_bucket=bucket)
    for needle in needles:
        assert needle in problem


@pytest.mark.parametrize("job", ["job", "run-2", "exp_1.b", "A9"])
def test_job_name_accepted(job):
    assert pf.job_name_problem(job) == ""


@pytest.mark.parametrize("job, example", [
    ("my job", "my-job"), ("run#2", "run-2"), ("a/b", "a-b"), ("", "job"), (".", "job"), ("..", "job"),
    ("résumé", "r-sum"),
])
def test_job_name_refused(job, example):
    problem = only_problem(dt_job_name=job)
    assert problem.startswith(f"dt_job_name={job!r} is not valid: use only letters, digits, '.', '_' and '-'")
    assert f"-e dt_job_name={example}." in problem


@pytest.mark.parametrize("vpc, subnet", [("10.77.0.0/16", "10.77.1.0/24"), ("127.77.0.0/16", "127.77.1.0/24"),
                                         ("10.0.0.0/28", "10.0.0.0/28"), ("172.16.0.0/20", "172.16.8.0/22")])
def test_networks_accepted(vpc, subnet):
    assert pf.networks_problem(vpc, subnet) == ""


@pytest.mark.parametrize("vpc, subnet, needle", [
    ("10.77.0.0/16", "10.88.1.0/24", "dt_subnet_cidr=10.88.1.0/24 is not inside dt_vpc_cidr=10.77.0.0/16: pass a "
                                     "subnet of it, e.g. -e dt_subnet_cidr=10.77.0.0/24."),
    ("10.77.0.5/16", "10.77.1.0/24", "dt_vpc_cidr=10.77.0.5/16 has host bits set: pass its network, -e dt_vpc_cidr=10.77.0.0/16."),
    ("10.77.0.0/16", "10.77.1.9/24", "dt_subnet_cidr=10.77.1.9/24 has host bits set: pass its network, -e dt_subnet_cidr=10.77.1.0/24."),
    ("10.0.0.0/8", "10.0.1.0/24", "dt_vpc_cidr=10.0.0.0/8 is too large: it must be an IPv4 network of /16 or smaller, "
                                  "down to /28 (AWS's limits), e.g. -e dt_vpc_cidr=10.0.0.0/16."),
    ("10.77.0.0/16", "10.77.1.0/29", "dt_subnet_cidr=10.77.1.0/29 is too small"),
    ("my-vpc", "10.77.1.0/24", "dt_vpc_cidr=my-vpc is not an IPv4 network: pass e.g. -e dt_vpc_cidr=10.77.0.0/16."),
    ("2001:db8::/56", "10.77.1.0/24", "dt_vpc_cidr=2001:db8::/56 is not an IPv4 network"),
    ("10.77.0.0", "10.77.1.0/24", "dt_vpc_cidr=10.77.0.0 has no prefix length"),
    ("10.77.0.0/16", "", "dt_subnet_cidr= is not an IPv4 network"),
])
def test_networks_refused(vpc, subnet, needle):
    assert needle in only_problem(dt_vpc_cidr=vpc, dt_subnet_cidr=subnet)


def test_job_array_networks_have_one_home():
    from ansible_collections.dynatrain.elastic.plugins.module_utils import job_array
    for vpc, subnet in [("10.77.0.0/16", "10.88.1.0/24"), ("10.77.0.0/16", "10.77.1.0/29"), ("x", "y")]:
        assert job_array.network_problem(vpc, subnet, 2) == pf.networks_problem(vpc, subnet) != ""


@pytest.mark.parametrize("value, needle", [
    ("batch", "dt_resize_at=batch is not valid: pass -e dt_resize_at=step"),
    ("Step", "dt_resize_at=Step is not valid"),
    ("", "dt_resize_at= is not valid"),
])
def test_resize_at_refused(value, needle):
    problem = only_problem(dt_resize_at=value)
    assert needle in problem and "-e dt_resize_at=epoch" in problem


def test_node_image_auto_or_plain():
    assert pf.settings_problems(dict(DEFAULTS, dt_node_image="auto")) == []
    assert pf.settings_problems(dict(DEFAULTS, dt_node_image="plain")) == []
    problem = only_problem(dt_node_image="baked")
    assert problem.startswith("dt_node_image=baked is not valid") and "-e dt_node_image=plain" in problem


def test_script_api_elastic_or_torchrun():
    assert pf.settings_problems(dict(DEFAULTS, dt_train_script_api="elastic")) == []
    assert pf.settings_problems(dict(DEFAULTS, dt_train_script_api="torchrun", dt_engine="torch")) == []
    problem = only_problem(dt_train_script_api="torchrun")                    # the default engine: mxnet
    assert "dt_engine=mxnet cannot run it" in problem and "-e dt_engine=torch" in problem
    assert "is not valid" in only_problem(dt_train_script_api="horovod", dt_engine="torch")
    # the engine of the cluster's job, unknown here: tasks/cluster_engine.yml and the launcher role check it
    assert pf.settings_problems(dict(DEFAULTS, dt_train_script_api="torchrun"), engine_from_cluster=True) == []


@pytest.mark.parametrize("engine", ["mxnet", "torch"])
def test_engines(engine):
    assert pf.settings_problems(dict(DEFAULTS, dt_engine=engine)) == []


@pytest.mark.parametrize("engine", ["tensorflow", "MXNet", "pytorch", ""])
def test_unknown_engine_refused(engine):
    assert only_problem(dt_engine=engine) == (
        f"dt_engine={engine} is not an engine: pass -e dt_engine=mxnet (Apache MXNet 1.9.1, the default) "
        "or -e dt_engine=torch (PyTorch).")


@pytest.mark.parametrize("instance_type, kernels", [
    ("c5.xlarge", True), ("m7i.large", True), ("p3.2xlarge", True), ("p3dn.24xlarge", True), ("g4dn.xlarge", True),
    ("p4d.24xlarge", True), ("p4de.24xlarge", True), ("g5.xlarge", True), ("g6.xlarge", True), ("g6e.xlarge", True),
    ("p5.48xlarge", False), ("p5e.48xlarge", False), ("p5en.48xlarge", False), ("p6-b200.48xlarge", False),
    ("p6e-gb200.36xlarge", False), ("p6-b300.48xlarge", False), ("p2.xlarge", False),
])
def test_mxnet_gpu_kernels(instance_type, kernels):
    assert mxnet_gpu_kernels(instance_type) is kernels


@pytest.mark.parametrize("setting, instance_type, gpu", [
    ("dt_worker_instance_type", "p5.48xlarge", "H100 (hopper)"),
    ("dt_master_instance_type", "p5en.48xlarge", "H200 (hopper)"),
    ("dt_worker_instance_type", "p6-b200.48xlarge", "B200 (blackwell)"),
    ("dt_bake_instance_type", "p6e-gb200.36xlarge", "a GPU newer than H100"),
])
def test_mxnet_refused_where_it_has_no_kernels(setting, instance_type, gpu):
    problem = only_problem(**{setting: instance_type})
    assert problem.startswith(f"dt_engine=mxnet cannot use {setting}={instance_type}: its GPUs are {gpu}")
    assert "kernels for sm_50/60/70/80/86 only" in problem and "pass -e dt_engine=torch" in problem
    # the default engine is MXNet: the same without dt_engine
    assert pf.settings_problems({setting: instance_type}) == [problem]
    # PyTorch runs there (on a cluster all of GPU nodes: a mixed one is refused, see below)
    alike = {"dt_master_instance_type": instance_type, "dt_worker_instance_type": instance_type, setting: instance_type}
    assert pf.settings_problems(dict(DEFAULTS, dt_engine="torch", **alike)) == []


@pytest.mark.parametrize("instance_type", ["p3.2xlarge", "p4d.24xlarge", "g5.xlarge", "g6.xlarge", "g6e.xlarge"])
def test_mxnet_accepted_on_the_gpus_it_has_kernels_for(instance_type):
    assert pf.settings_problems(dict(DEFAULTS, dt_worker_instance_type=instance_type,
                                     dt_master_instance_type=instance_type)) == []


def test_mxnet_on_kepler_asks_for_newer_gpus():
    problem = only_problem(dt_worker_instance_type="p2.xlarge")
    assert "K80 (kepler)" in problem and "-e dt_worker_instance_type=g5.xlarge" in problem
    assert "dt_engine=torch" not in problem


@pytest.mark.parametrize("name", sorted(pf.WHOLE_NUMBERS))
def test_whole_numbers_accepted(name):
    least = pf.WHOLE_NUMBERS[name][0]
    top = {"max_workers": 64}
    for value in (least, str(least), f" {least + 5} ", float(least + 1)):
        assert pf.settings_problems(dict(top, **{name: value})) == [], value


@pytest.mark.parametrize("name", sorted(pf.WHOLE_NUMBERS))
@pytest.mark.parametrize("value", ["abc", "", "1.5", "-1", "2x", True, 2.5, [3]])
def test_whole_numbers_refused_naming_the_setting_and_the_value(name, value):
    least, _meaning, example = pf.WHOLE_NUMBERS[name]
    problems = pf.settings_problems({name: value})
    assert len(problems) == 1
    assert problems[0].startswith(f"{name}={value} is not valid (")
    assert problems[0].endswith(f"give a whole number >= {least}, e.g. -e {name}={example}.")


@pytest.mark.parametrize("name", sorted(n for n, spec in pf.WHOLE_NUMBERS.items() if spec[0] > 0))
def test_whole_numbers_below_their_least(name):
    least, _meaning, example = pf.WHOLE_NUMBERS[name]
    problems = pf.settings_problems({name: least - 1})
    assert problems == [f"{name}={least - 1} is not valid ({pf.WHOLE_NUMBERS[name][1]}): "
                        f"it must be at least {least}, e.g. -e {name}={example}."]


def test_the_issue_examples():
    assert only_problem(dt_join_timeout="abc").startswith(
        "dt_join_timeout=abc is not valid (seconds to wait for the launcher's ADDED): give a whole number >= 1")
    assert only_problem(min_workers="abc").startswith("min_workers=abc is not valid")
    assert only_problem(count="0") == "count=0 is not valid (workers to add or remove): it must be at least 1, e.g. -e count=2."
    # as the e2e test's bad worker_count expects
    assert only_problem(worker_count="-1").startswith("worker_count=-1 is not valid")


@pytest.mark.parametrize("settings, needle", [
    ({"min_workers": 9}, "min_workers=9 is more than max_workers=8: pass at most -e min_workers=8"),
    ({"worker_count": 8}, "worker_count=8 is more than max_workers=8 allows (it counts the master too): "
                          "pass at most -e worker_count=7"),
    ({"dt_desired_workers": "9"}, "dt_desired_workers=9 is more than max_workers=8: pass at most -e dt_desired_workers=8"),
])
def test_bounds_between_whole_numbers(settings, needle):
    assert needle in only_problem(**settings)


def test_bounds_need_valid_numbers():
    problems = pf.settings_problems(dict(DEFAULTS, max_workers="many", worker_count=20))
    assert problems == ["max_workers=many is not valid (workers the job may have, the master counted): "
                        "give a whole number >= 1, e.g. -e max_workers=8."]


def test_cluster_name():
    assert "dt_cluster_name=9x is not valid" in only_problem(dt_cluster_name="9x")
    assert "dt_cluster_name=a_b is not valid" in only_problem(dt_cluster_name="a_b")


def test_every_problem_is_reported_at_once():
    problems = pf.settings_problems(dict(DEFAULTS, dt_join_timeout="abc", dt_job_name="a b", dt_resize_at="x",
                                         dt_engine="jax"))
    assert [p.split("=", 1)[0] for p in problems] == ["dt_join_timeout", "dt_resize_at", "dt_job_name", "dt_engine"]


def test_an_engine_taken_from_the_cluster_is_checked_later():
    # bootstrap/add_workers/train/reconcile: without -e dt_engine the cluster's job decides the engine
    settings = dict(DEFAULTS, dt_worker_instance_type="p5.48xlarge")
    assert pf.settings_problems(settings, engine_from_cluster=True) == []
    problems = pf.settings_problems(settings, typed_names=("dt_engine",), engine_from_cluster=True)
    assert len(problems) == 1 and problems[0].startswith("dt_engine=mxnet cannot use dt_worker_instance_type=p5.48xlarge")
    # the engine's name is checked in any case
    assert pf.settings_problems(dict(settings, dt_engine="jax"), engine_from_cluster=True) == [
        "dt_engine=jax is not an engine: pass -e dt_engine=mxnet (Apache MXNet 1.9.1, the default) "
        "or -e dt_engine=torch (PyTorch)."]


@pytest.mark.parametrize("port,needle", [("abc", "give a whole number >= 0"), (-1, "it must be at least 0"),
                                         (70000, "is not a port: give one of 1-65535")])
def test_a_metrics_port_that_is_no_port_is_refused(port, needle):
    problem = only_problem(dt_metrics_port=port)
    assert problem.startswith("dt_metrics_port=%s" % port) and needle in problem, problem


def test_metrics_port_zero_and_a_port_pass():
    assert pf.settings_problems(dict(DEFAULTS, dt_metrics_port=0)) == []
    assert pf.settings_problems(dict(DEFAULTS, dt_metrics_port="9110")) == []


@pytest.mark.parametrize("master,worker", [("c5.xlarge", "g5.xlarge"), ("g5.xlarge", "c5.xlarge"),
                                           ("t3.large", "p6e-gb200.36xlarge")])
def test_a_mixed_cpu_gpu_torch_cluster_is_refused(master, worker):
    # torch: one process group of gloo (CPU nodes) and NCCL (GPU nodes) processes cannot form (issue 40, item 6)
    problem = only_problem(dt_engine="torch", dt_master_instance_type=master, dt_worker_instance_type=worker)
    gpu_type, cpu_type = (worker, master) if pf.nvidia_gpus(worker) else (master, worker)
    gpu_setting = "dt_worker_instance_type" if gpu_type == worker else "dt_master_instance_type"
    cpu_setting = "dt_master_instance_type" if gpu_setting == "dt_worker_instance_type" else "dt_worker_instance_type"
    assert problem.startswith(f"dt_engine=torch cannot train on dt_master_instance_type={master} ("), problem
    assert f"{cpu_setting}={cpu_type} (no GPU)" in problem and "gloo" in problem and "NCCL" in problem
    # what to do: the same kind for both, never an explicit count as the way out
    assert f"-e {cpu_setting}={gpu_type}" in problem and f"-e {gpu_setting}={cpu_type}" in problem
    assert "does not make a mixed cluster work" in problem


@pytest.mark.parametrize("engine,master,worker", [("torch", "c5.xlarge", "m5.large"), ("torch", "g5.xlarge", "p4d.24xlarge"),
                                                  ("mxnet", "c5.xlarge", "g5.xlarge")])
def test_torch_clusters_of_one_kind_and_mxnet_pass(engine, master, worker):
    # MXNet's worker uses every GPU of its node and talks through its parameter servers: a mixed cluster works
    assert pf.settings_problems(dict(DEFAULTS, dt_engine=engine, dt_master_instance_type=master,
                                     dt_worker_instance_type=worker)) == []


def test_a_mixed_cluster_with_the_engine_from_the_cluster_is_checked_later():
    settings = dict(DEFAULTS, dt_engine="torch", dt_worker_instance_type="g5.xlarge")
    del settings["dt_resize_at"]
    assert pf.settings_problems(settings, engine_from_cluster=True) == []
    assert len(pf.settings_problems(settings, typed_names=("dt_engine",), engine_from_cluster=True)) == 1


@pytest.mark.parametrize("instance_type,gpus", [("g5.xlarge", True), ("p5.48xlarge", True), ("p6-b300.48xlarge", True),
                                                ("c5.xlarge", False), ("t3.micro", False), ("", False), (None, False)])
def test_nvidia_gpus_from_the_type_name(instance_type, gpus):
    assert pf.nvidia_gpus(instance_type) is gpus
