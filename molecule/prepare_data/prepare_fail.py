#!/usr/bin/env python3
"""Stand-in prepare-data script that fails."""
import sys

print("downloading...", flush=True)
sys.stderr.write("line 1 of noise\nboom: the data set could not be fetched\n")
sys.exit(3)
