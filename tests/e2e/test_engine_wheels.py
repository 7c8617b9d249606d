"""Issue 43, "the first hour": an engine whose node wheels the controller lacks is refused before any
resource exists (where they can be built, they are made ready: test_torch_engine.py starts from the same
wheelhouse and its bootstrap builds PyTorch's wheels on demand).

test_missing_engine_wheel_refused_before_any_resource: on a wheelhouse as `make setup` leaves it (the
conftest's setup_wheelhouse), `bootstrap.yml -e dt_engine=torch` with on-demand building off
(dt_wheelhouse_build=false, as where no builder is at hand) is refused with the command that builds the
wheels, and the local cloud holds exactly the resources it held before (no bootstrap runs).

Its loopback network (127.84.0.0/16), apart from the other e2e modules'."""
import pytest

from conftest import demo, playbook

pytestmark = pytest.mark.e2e

NET = {"dt_vpc_cidr": "127.84.0.0/16", "dt_subnet_cidr": "127.84.1.0/24", "dt_checkpoint_s3": False}


def _cloud(env):
    """A demo.Demo without a cluster of its own: its boto clients on the local cloud of ``env``."""
    job = demo.Demo.__new__(demo.Demo)
    job.env = env
    return job


def _resources(env):
    """What a bootstrap creates, counted across the local cloud."""
    job = _cloud(env)
    ec2, efs, iam = job.boto("ec2"), job.boto("efs"), job.boto("iam")
    live = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] not in ("terminated", "shutting-down")]
    return {
        "instances": len(live),
        "vpcs": len(ec2.describe_vpcs()["Vpcs"]),
        "subnets": len(ec2.describe_subnets()["Subnets"]),
        "security_groups": len(ec2.describe_security_groups()["SecurityGroups"]),
        "key_pairs": len(ec2.describe_key_pairs()["KeyPairs"]),
        "launch_templates": len(ec2.describe_launch_templates()["LaunchTemplates"]),
        "file_systems": len(efs.describe_file_systems()["FileSystems"]),
        "roles": len(iam.list_roles()["Roles"]),
    }


def test_missing_engine_wheel_refused_before_any_resource(cloud, setup_wheelhouse):
    before = _resources(cloud)
    rc, out = playbook(cloud, "bootstrap", dict(NET, dt_cluster_name="e2ewheels", dt_engine="torch",
                                                dt_wheelhouse_controller_dir=str(setup_wheelhouse),
                                                dt_wheelhouse_build=False))
    assert rc != 0, out[-3000:]
    text = " ".join(out.split())
    assert "lacks torch==2.13.0+cpu" in text, text[-3000:]
    assert "-m localcloud wheelhouse --engine torch --dest %s" % setup_wheelhouse in text
    assert "Nothing was created" in text
    assert _resources(cloud) == before
    assert not list(setup_wheelhouse.glob("torch-*.whl"))
