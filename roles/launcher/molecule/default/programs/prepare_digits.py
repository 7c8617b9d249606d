#!/usr/bin/env python3
"""Molecule stand-in for the example prepare-data script."""
