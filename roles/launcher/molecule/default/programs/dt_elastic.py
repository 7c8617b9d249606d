"""Molecule stand-in for the training helper API."""
