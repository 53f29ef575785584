"""Executes the notebooks here against a running Mink node and fails on the first error.

    python notebooks/run.py [--write] [NOTEBOOK ...]

MINK_FLIGHT and MINK_SQL name the node's endpoints (default: what `mink dev` serves).
--write saves each executed notebook with its outputs (how the committed outputs were made).
"""

import argparse
import pathlib
import sys

import nbformat
from nbclient import NotebookClient

here = pathlib.Path(__file__).resolve().parent
parser = argparse.ArgumentParser()
parser.add_argument("--write", action="store_true", help="save the outputs into the notebooks")
parser.add_argument("notebooks", nargs="*", type=pathlib.Path)
args = parser.parse_args()
paths = args.notebooks or sorted(here.glob("*.ipynb"))
for path in paths:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(here)}})
    try:
        client.execute()
    except Exception as e:  # noqa: BLE001 - reported with the notebook's name
        print(f"{path.name}: {e}", file=sys.stderr)
        sys.exit(1)
    if args.write:
        nbformat.write(nb, path)
    print(f"{path.name}: ok")
