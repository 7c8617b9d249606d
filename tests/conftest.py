"""Make `ansible_collections.dynatrain.elastic` importable from this checkout."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(ROOT, ".collections")
link = os.path.join(COLLECTIONS, "ansible_collections", "dynatrain", "elastic")
if not os.path.exists(link):
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(ROOT, link)
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)
