"""Put the repository root on ``sys.path`` once for every unit test: the tests import the repo-root
``localcloud`` package (moto patches, quotas, the IMDS emulator) however pytest is started."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
