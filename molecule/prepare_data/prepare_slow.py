#!/usr/bin/env python3
"""Stand-in prepare-data script that takes too long."""
import time

time.sleep(60)
