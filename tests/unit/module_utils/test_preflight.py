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
