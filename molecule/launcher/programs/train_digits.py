#!/usr/bin/env python3
"""Molecule stand-in for the training script: records its arguments, sleeps."""
import json
import os
import sys
import time

with open(os.path.join(os.environ["EFS_MOUNT"], "train_started"), "w") as f:
    json.dump(sys.argv[1:], f)
time.sleep(3600)
