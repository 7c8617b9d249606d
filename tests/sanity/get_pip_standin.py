# Local stand-in for ansible-test's get-pip bootstrap (no access to ci-files.testing.ansible.com here):
# install the bundled pip with ensurepip, then let pip install the requested packages from the index.
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)
