#!/usr/bin/env python3
"""Molecule stand-in for the training script: records its arguments and its user in a drop box, sleeps."""
import json
import os
import pwd
import sys
import time

# results/ is a drop box: the training user may write there, not at the volume's root (issue 40).
# Written aside and renamed: the verify polls this record and must never read it half-written.
record = os.path.join(os.environ["EFS_MOUNT"], "results", "train_started")
with open(record + ".tmp", "w") as f:
    json.dump({"argv": sys.argv[1:], "user": pwd.getpwuid(os.getuid()).pw_name, "home": os.environ.get("HOME")}, f)
os.replace(record + ".tmp", record)
time.sleep(3600)
